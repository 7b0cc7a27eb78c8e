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
        match runtime.run_pod_sandbox(&config).await {
            Ok(id) => {
                st.sandbox_attempts += 1;
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
