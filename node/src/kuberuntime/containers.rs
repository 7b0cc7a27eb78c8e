//! One container's effects: start (image, config, create, start, postStart),
//! resize in place, stop (preStop, then the runtime's stop).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use wasmlet_runtime::{ContainerState, ContainerStatus, Runtime};

use crate::cluster::events::{NORMAL, WARNING};
use crate::pod::full_name;
use crate::pod_state::{PodState, SandboxRecord, Waiting, labels};
use crate::podspec;
use crate::sync::{PodSyncer, StartError};

impl PodSyncer {
    pub(crate) async fn start_container(
        &self,
        runtime: &dyn Runtime,
        pod: &Pod,
        c: &Container,
        sandbox: &SandboxRecord,
        volumes: &[(String, crate::volumes::HostVolume)],
        attempt: u32,
    ) -> Result<ContainerStatus, StartError> {
        self.ensure_image(runtime, pod, c).await?;
        let caps = runtime.capabilities();
        // runAsNonRoot needs the image's user, which only container images have (see
        // docs/decisions.md for Wasm pods).
        if caps.image_user {
            let image = c.image.clone().unwrap_or_default();
            let status = match runtime.image_status(&image).await {
                Ok(status) => status,
                // Checked as an image with no user: runAsNonRoot then needs runAsUser.
                Err(e) => {
                    tracing::warn!(pod = %full_name(pod), container = %c.name, image = %image, error = %e, "reading the image's user for runAsNonRoot");
                    None
                }
            };
            let user = status
                .map(|i| (i.uid, i.username))
                .unwrap_or((None, String::new()));
            let spec = pod.spec.clone().unwrap_or_default();
            podspec::verify_run_as_non_root(&spec, c, (user.0, &user.1)).map_err(|message| {
                StartError {
                    waiting: Waiting::new("CreateContainerConfigError", message),
                    retry: self.retry_after_error,
                }
            })?;
        } else {
            // No image user: the pod's process runs as the shared runAsUser, or as
            // nobody under runAsNonRoot (`podspec::sandbox_security`); only an explicit
            // root breaks the policy.
            let spec = pod.spec.clone().unwrap_or_default();
            let nobody = (Some(podspec::NON_ROOT_DEFAULT_ID), "");
            podspec::verify_run_as_non_root(&spec, c, nobody).map_err(|message| StartError {
                waiting: Waiting::new("CreateContainerConfigError", message),
                retry: self.retry_after_error,
            })?;
        }
        let env = self
            .container_env(pod, c, sandbox)
            .await
            .map_err(|message| StartError {
                waiting: Waiting::new("CreateContainerConfigError", message),
                retry: self.retry_after_error,
            })?;
        let mut config = self
            .container_config(pod, c, attempt, env, volumes, caps.directory_mounts_only)
            .map_err(|message| StartError {
                waiting: Waiting::new("CreateContainerConfigError", message),
                retry: self.retry_after_error,
            })?;
        self.add_devices(pod, c, &mut config, caps.directory_mounts_only)
            .await
            .map_err(|message| StartError {
                waiting: Waiting::new("CreateContainerConfigError", message),
                retry: self.retry_after_error,
            })?;
        let created = match runtime
            .create_container(&sandbox.id, &config, &sandbox.config)
            .await
        {
            Ok(id) => Ok(id),
            Err(e) => {
                let message = e.to_string();
                match super::name_reserved_for(&message) {
                    Some(holder) if self.release_name(runtime, pod, c, holder).await => runtime
                        .create_container(&sandbox.id, &config, &sandbox.config)
                        .await
                        .map_err(|e| e.to_string()),
                    _ => Err(message),
                }
            }
        };
        let id = created.map_err(|message| StartError {
            waiting: Waiting::new("CreateContainerError", message),
            retry: self.retry_after_error,
        })?;
        self.events.pod(
            pod,
            Some(&c.name),
            NORMAL,
            "Created",
            format!("Created container: {}", c.name),
        );
        if let Err(e) = runtime.start_container(&id).await {
            crate::sync::remove_instance(runtime, pod, &c.name, &id).await;
            return Err(StartError {
                waiting: Waiting::new("RunContainerError", e.to_string()),
                retry: self.retry_after_error,
            });
        }
        self.events.pod(
            pod,
            Some(&c.name),
            NORMAL,
            "Started",
            format!("Started container {}", c.name),
        );
        if let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) {
            let grace = crate::pod::grace_period(pod);
            if let Err(e) =
                crate::hooks::run(hook, runtime, c, &id, sandbox.ip.as_deref(), grace).await
            {
                // As the kubelet: a failed postStart kills the container, which then
                // restarts as its policy says.
                tracing::warn!(pod = %full_name(pod), container = %c.name, "postStart hook failed: {e}");
                self.events.pod(
                    pod,
                    Some(&c.name),
                    WARNING,
                    "FailedPostStartHook",
                    e.clone(),
                );
                self.events.pod(
                    pod,
                    Some(&c.name),
                    NORMAL,
                    "Killing",
                    format!("FailedPostStartHook: stopping container {}", c.name),
                );
                if let Err(e) = runtime.stop_container(&id, grace).await {
                    tracing::warn!(pod = %full_name(pod), container = %c.name, "stopping the container after its failed postStart hook: {e}");
                }
            }
        }
        runtime.container_status(&id).await.map_err(|e| StartError {
            waiting: Waiting::new("RunContainerError", e.to_string()),
            retry: self.retry_after_error,
        })
    }

    /// Changes a running container's resources in place when its spec's differ from
    /// what it runs with (in-place pod resize): the runtime's
    /// UpdateContainerResources. Returns when to try again after a failure.
    pub(crate) async fn resize_running(
        &self,
        runtime: &dyn Runtime,
        pod: &Pod,
        c: &Container,
        container_id: &str,
        st: &mut PodState,
    ) -> Option<Duration> {
        let desired = match self.container_resources(pod, c) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(pod = %full_name(pod), container = %c.name, "resizing: {e}");
                return None;
            }
        };
        let rec = st.containers.get_mut(&c.name)?;
        if rec
            .applied
            .as_ref()
            .is_some_and(|(applied, spec)| *applied == desired && *spec == c.resources)
        {
            // What it runs with is what the spec says (again: a refused resize that
            // was reverted is no longer in progress).
            rec.resize_error = None;
            return None;
        }
        let adopted = rec.applied.is_none();
        match runtime
            .update_container_resources(container_id, &desired)
            .await
        {
            Ok(()) => {
                if !adopted {
                    tracing::info!(pod = %full_name(pod), container = %c.name, resources = ?desired, "container resized in place");
                }
                rec.applied = Some((desired, c.resources.clone()));
                rec.resize_error = None;
                None
            }
            Err(e) => {
                let message = format!("updating the resources of container {}: {e}", c.name);
                if rec.resize_error.as_deref() != Some(message.as_str()) {
                    tracing::warn!(pod = %full_name(pod), container = %c.name, "{message}");
                    self.events
                        .pod(pod, Some(&c.name), WARNING, "ResizeFailed", message.clone());
                }
                rec.resize_error = Some(message);
                Some(self.retry_after_error)
            }
        }
    }

    /// Stops the pod's running containers within `grace`: the regular containers (and
    /// init containers still running) together, then the sidecars in reverse order with
    /// what is left of the grace, as the kubelet does since sidecars.
    pub(crate) async fn stop_running(
        &self,
        pod: &Pod,
        st: &PodState,
        runtime: &dyn Runtime,
        grace: Duration,
    ) {
        let sidecars: Vec<String> = pod
            .spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten())
            .filter(|c| c.restart_policy.as_deref() == Some("Always"))
            .map(|c| c.name.clone())
            .collect();
        let running = |name: &str| {
            st.containers
                .get(name)
                .and_then(|r| r.current.as_ref())
                .filter(|cs| cs.state == ContainerState::Running)
                .map(|cs| cs.id.clone())
        };
        let kill = |name: &str| {
            self.events.pod(
                pod,
                Some(name),
                NORMAL,
                "Killing",
                format!("Stopping container {name}"),
            );
        };
        let deadline = tokio::time::Instant::now() + grace;
        let first: Vec<(String, String)> = st
            .containers
            .keys()
            .filter(|n| !sidecars.contains(n))
            .filter_map(|n| Some((n.clone(), running(n)?)))
            .collect();
        let stops = first.iter().map(|(name, id)| {
            kill(name);
            self.stop_one(pod, st, runtime, name, id, deadline)
        });
        futures::future::join_all(stops).await;
        for name in sidecars.iter().rev() {
            if let Some(id) = running(name) {
                kill(name);
                self.stop_one(pod, st, runtime, name, &id, deadline).await;
            }
        }
    }

    /// Stops one container by `deadline`: its preStop hook first (within the grace),
    /// then the runtime's stop with what is left, at least 2 s, as the kubelet does.
    pub(crate) async fn stop_one(
        &self,
        pod: &Pod,
        st: &PodState,
        runtime: &dyn Runtime,
        name: &str,
        id: &str,
        deadline: tokio::time::Instant,
    ) {
        let container = crate::pod::containers(pod).find(|c| c.name == name);
        // As the kubelet: no preStop hook without a grace period to run it in.
        if let Some(c) = container
            && let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref())
            && deadline > tokio::time::Instant::now()
        {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let ip = st.sandbox.as_ref().and_then(|s| s.ip.as_deref());
            if let Err(e) = crate::hooks::run(hook, runtime, c, id, ip, left).await {
                tracing::warn!(pod = %full_name(pod), container = %name, "preStop hook failed: {e}");
                self.events
                    .pod(pod, Some(name), WARNING, "FailedPreStopHook", e);
            }
        }
        let left = deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .max(Duration::from_secs(2));
        if let Err(e) = runtime.stop_container(id, left).await {
            tracing::warn!(pod = %full_name(pod), container = %name, "stopping container: {e}");
        }
    }
}

impl PodSyncer {
    /// What the device plugins' `Allocate` gave the container (after their
    /// `PreStartContainer`): env, mounts, device nodes, annotations and CDI devices,
    /// as the kubelet's `GenerateRunContainerOptions` adds them. A Wasm guest has no
    /// device files: its device nodes are left out (logged) and its mounts must be
    /// directories, which become preopens.
    async fn add_devices(
        &self,
        pod: &Pod,
        c: &Container,
        config: &mut wasmlet_runtime::ContainerConfig,
        directories_only: bool,
    ) -> Result<(), String> {
        let Some(devices) = &self.devices else {
            return Ok(());
        };
        let Some(run) = devices
            .run_options(crate::pod::uid(pod), &c.name)
            .await
            .map_err(|e| format!("devices: {e}"))?
        else {
            return Ok(());
        };
        // The kubelet puts device variables before the spec's: the spec wins.
        for (k, v) in run.envs {
            if !config.env.iter().any(|(name, _)| *name == k) {
                config.env.push((k, v));
            }
        }
        for m in run.mounts {
            let host = std::path::PathBuf::from(&m.host_path);
            if directories_only && !host.is_dir() {
                tracing::warn!(pod = %full_name(pod), container = %c.name, host_path = %m.host_path, "a device mount that is not a directory cannot be given to a Wasm guest; left out");
                continue;
            }
            config.mounts.push(wasmlet_runtime::Mount {
                container_path: m.container_path,
                host_path: host,
                readonly: m.read_only,
            });
        }
        if directories_only {
            if !run.devices.is_empty() {
                tracing::info!(pod = %full_name(pod), container = %c.name, devices = run.devices.len(), "device nodes are not given to Wasm guests");
            }
        } else {
            config
                .devices
                .extend(run.devices.into_iter().map(|d| wasmlet_runtime::Device {
                    container_path: d.container_path,
                    host_path: d.host_path.into(),
                    permissions: d.permissions,
                }));
        }
        for (k, v) in run.annotations {
            config.annotations.entry(k).or_insert(v);
        }
        config.cdi_devices.extend(run.cdi_devices);
        Ok(())
    }
}

impl PodSyncer {
    /// Frees a container's name that the runtime holds for an instance the node lost
    /// track of: a create the runtime carried out after its caller lost the reply (the
    /// runtime restarted under the call, the call timed out), or one whose start's
    /// reply was lost and whose removal failed. containerd's CRI plugin releases a
    /// name only when that container is removed, and every retry of the create fails
    /// on it. The kubelet moves on to the next attempt; the node stops and removes the
    /// stray instance and creates again. `true` when the name is free. A holder the
    /// runtime cannot show yet is a create still under way: left alone, the next sync
    /// tries again.
    async fn release_name(
        &self,
        runtime: &dyn Runtime,
        pod: &Pod,
        c: &Container,
        holder: &str,
    ) -> bool {
        let status = match runtime.container_status(holder).await {
            Ok(status) => status,
            Err(e) => {
                tracing::info!(pod = %full_name(pod), container = %c.name, holder, "the container's name is held by an instance the runtime cannot show (a create still under way?): {e}");
                return false;
            }
        };
        let ours = status.labels.get(labels::POD_UID).map(String::as_str)
            == pod.metadata.uid.as_deref()
            && status.metadata.name == c.name;
        if !ours {
            tracing::warn!(pod = %full_name(pod), container = %c.name, holder, "the container's name is held by another container");
            return false;
        }
        tracing::info!(pod = %full_name(pod), container = %c.name, holder, state = ?status.state, "removing an instance the node lost track of; it holds the container's name");
        // Running: started by a call whose reply was lost too (the node then failed
        // to remove it). It gets its grace period, as any container the node stops.
        if status.state == ContainerState::Running
            && let Err(e) = runtime
                .stop_container(holder, crate::pod::grace_period(pod))
                .await
            && !e.is_not_found()
        {
            tracing::warn!(pod = %full_name(pod), container = %c.name, holder, "stopping the instance that holds the container's name: {e}");
            return false;
        }
        match runtime.remove_container(holder).await {
            Ok(()) => true,
            Err(e) if e.is_not_found() => true,
            Err(e) => {
                tracing::warn!(pod = %full_name(pod), container = %c.name, holder, "removing the instance that holds the container's name: {e}");
                false
            }
        }
    }
}
