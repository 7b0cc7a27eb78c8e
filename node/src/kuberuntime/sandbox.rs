//! The pod's sandbox and its pod cgroup.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use wasmlet_runtime::{Capabilities, PodMetadata, PodSandboxConfig, Runtime};

use crate::kuberuntime::actions::CreateSandbox;
use crate::pod::{full_name, uid};
use crate::pod_state::{PodState, SandboxRecord, labels};
use crate::podspec;
use crate::sync::{PodSyncer, SyncOutcome, pod_log_dir};

impl PodSyncer {
    /// The pod as its cgroup sizes it: a runtime whose sandbox needs memory of its own
    /// (a Wasm pod's sandbox process: the runtime, its compiled code and the pod's
    /// stores) has it charged to the pod cgroup beside the containers when the pod
    /// sets no `spec.overhead`, as a RuntimeClass's overhead would add it.
    pub(crate) fn cgroup_view(&self, pod: &Pod, caps: &Capabilities) -> Pod {
        let mut pod = pod.clone();
        if let Some(bytes) = caps.sandbox_memory_overhead
            && let Some(spec) = pod.spec.as_mut()
            && spec.overhead.is_none()
        {
            spec.overhead = Some(BTreeMap::from([(
                "memory".to_owned(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity(bytes.to_string()),
            )]));
        }
        pod
    }

    /// Creates (or updates) the pod's cgroup before its sandbox: its parent for the
    /// runtime, and the oom_score_adj of its sandbox process (Wasm: the lowest of its
    /// containers', since that process runs them all).
    pub(crate) fn pod_cgroup(
        &self,
        pod: &Pod,
        caps: &Capabilities,
    ) -> Result<(Option<String>, Option<i64>), String> {
        // The sandbox process of a Wasm pod runs all its containers: the lowest of
        // their scores.
        let oom = crate::pod::containers(pod)
            .filter_map(|c| self.oom_score_adj(pod, c))
            .min();
        let Some(cm) = &self.cgroups else {
            return Ok((None, oom));
        };
        let view = self.cgroup_view(pod, caps);
        // It also brings the burstable QoS cgroup's shares up to date when they change.
        cm.ensure_pod(&view)
            .map_err(|e| format!("pod cgroup: {e}"))?;
        let parent = cm
            .cgroup_parent(&view)
            .map_err(|e| format!("pod cgroup: {e}"))?;
        Ok((Some(parent), oom))
    }

    pub(crate) fn sandbox_config(&self, pod: &Pod, st: &PodState) -> PodSandboxConfig {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let namespace = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let spec = pod.spec.clone().unwrap_or_default();
        let mut labels = pod.metadata.labels.clone().unwrap_or_default();
        labels.insert(labels::POD_NAME.into(), name.clone());
        labels.insert(labels::POD_NAMESPACE.into(), namespace.clone());
        labels.insert(labels::POD_UID.into(), uid(pod).to_owned());
        let mut hostname = spec.hostname.clone().unwrap_or_else(|| name.clone());
        hostname.truncate(63);
        PodSandboxConfig {
            metadata: PodMetadata {
                name,
                namespace,
                uid: uid(pod).to_owned(),
                attempt: st.sandbox_attempts,
            },
            hostname,
            log_directory: pod_log_dir(&self.pod_logs_dir, pod),
            labels,
            annotations: pod.metadata.annotations.clone().unwrap_or_default(),
            runtime_handler: st.handler.clone(),
            cgroup_parent: None,
            oom_score_adj: None,
            host_network: spec.host_network.unwrap_or(false),
            host_pid: spec.host_pid.unwrap_or(false),
            host_ipc: spec.host_ipc.unwrap_or(false),
            share_process_namespace: spec.share_process_namespace.unwrap_or(false),
            dns: None,
            port_mappings: podspec::port_mappings(&spec),
            sysctls: podspec::sysctls(&spec),
            security: podspec::sandbox_security(&spec),
        }
    }

    /// Creates the pod's sandbox (after removing the dead one), in its pod cgroup.
    pub(crate) async fn create_sandbox(
        &self,
        pod: &Pod,
        st: &mut PodState,
        runtime: &dyn Runtime,
        create: &CreateSandbox,
    ) -> Result<(), SyncOutcome> {
        if let Some(old) = &create.remove {
            st.sandbox = None;
            tracing::info!(pod = %full_name(pod), sandbox = %old, "sandbox is gone; creating a new one");
            if let Err(e) = runtime.remove_pod_sandbox(old).await {
                tracing::warn!(pod = %full_name(pod), "removing dead sandbox {old}: {e}");
            }
        }
        let mut config = self.sandbox_config(pod, st);
        match self.pod_cgroup(pod, &runtime.capabilities()) {
            Ok((parent, oom)) => {
                config.cgroup_parent = parent;
                config.oom_score_adj = oom;
            }
            Err(message) => return Err(self.not_started(pod, st, message)),
        }
        match podspec::dns_config(pod, &self.dns) {
            Ok(dns) => config.dns = Some(dns),
            Err(e) => {
                let message = format!("failed to create the pod sandbox config: {e}");
                return Err(self.not_started(pod, st, message));
            }
        }
        // Runtimes write container logs under it but do not create it.
        if let Err(e) = std::fs::create_dir_all(&config.log_directory) {
            tracing::warn!(pod = %full_name(pod), "creating {}: {e}", config.log_directory.display());
        }
        let created = match runtime.run_pod_sandbox(&config).await {
            Ok(id) => Ok(id),
            Err(e) => {
                let message = e.to_string();
                match super::name_reserved_for(&message) {
                    Some(holder) => {
                        if !release_sandbox_name(runtime, pod, holder).await {
                            // The holder stays (a create still under way, or a network
                            // its runtime cannot tear down): the next attempt's name,
                            // as the kubelet would; sandbox GC takes the holder later.
                            config.metadata.attempt += 1;
                        }
                        runtime
                            .run_pod_sandbox(&config)
                            .await
                            .map_err(|e| e.to_string())
                    }
                    None => Err(message),
                }
            }
        };
        match created {
            Ok(id) => {
                st.sandbox_attempts = config.metadata.attempt + 1;
                st.sandbox_error = None;
                let (ip, additional_ips) = match runtime.pod_sandbox_status(&id).await {
                    Ok(status) => (status.ip, status.additional_ips),
                    // Without an IP until the next refresh reads it.
                    Err(e) => {
                        tracing::warn!(pod = %full_name(pod), sandbox = %id, error = %e, "reading the new sandbox's status");
                        (None, Vec::new())
                    }
                };
                st.sandbox = Some(SandboxRecord {
                    id,
                    ready: true,
                    ip,
                    additional_ips,
                    config,
                });
                Ok(())
            }
            Err(e) => {
                let message = format!("failed to create pod sandbox: {e}");
                Err(self.not_started(pod, st, message))
            }
        }
    }
}

/// Frees a pod's sandbox name that the runtime holds for a sandbox the node never
/// heard of (see [`super::name_reserved_for`]): the kubelet creates the next attempt
/// and later removes the stray one; the node removes it first, which frees the name,
/// and creates again. `true` when the name is free. A holder the runtime cannot show
/// yet (a create still under way) or cannot stop is left alone.
async fn release_sandbox_name(runtime: &dyn Runtime, pod: &Pod, holder: &str) -> bool {
    let status = match runtime.pod_sandbox_status(holder).await {
        Ok(status) => status,
        Err(e) => {
            tracing::info!(pod = %full_name(pod), holder, "the pod's sandbox name is held by a sandbox the runtime cannot show (a create still under way?): {e}");
            return false;
        }
    };
    if Some(status.metadata.uid.as_str()) != pod.metadata.uid.as_deref() {
        tracing::warn!(pod = %full_name(pod), holder, "the pod's sandbox name is held by another pod's sandbox");
        return false;
    }
    tracing::info!(pod = %full_name(pod), holder, state = ?status.state, "removing a sandbox created by a call whose reply was lost; it holds the pod's sandbox name");
    if let Err(e) = runtime.stop_pod_sandbox(holder).await
        && !e.is_not_found()
    {
        tracing::warn!(pod = %full_name(pod), holder, "stopping the sandbox that holds the pod's sandbox name: {e}");
        return false;
    }
    match runtime.remove_pod_sandbox(holder).await {
        Ok(()) => true,
        Err(e) if e.is_not_found() => true,
        Err(e) => {
            tracing::warn!(pod = %full_name(pod), holder, "removing the sandbox that holds the pod's sandbox name: {e}");
            false
        }
    }
}
