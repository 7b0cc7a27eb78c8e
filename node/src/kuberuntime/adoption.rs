//! Adoption: what an earlier run of the node left of a pod in the runtime is taken
//! over, found by the labels it wrote, so nothing is created twice.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use wasmlet_runtime::{ContainerState, Runtime, SandboxState};

use crate::pod::{full_name, uid};
use crate::pod_state::{PodState, SandboxRecord, labels};
use crate::sync::PodSyncer;

impl PodSyncer {
    /// Takes over what an earlier run of the node left of this pod in the runtime,
    /// found by the labels it wrote: the newest sandbox, and per container the newest
    /// instance (and the one before it, as the last termination) with its restart
    /// count. Older sandboxes and containers the spec no longer has are removed;
    /// older instances are left to container GC. Nothing is created twice after an agent restart.
    /// [`Self::adopt`] on a draft of `st`, kept only when it succeeds: an adoption
    /// that fails half-way leaves nothing behind.
    pub(crate) async fn adopt_on_draft(
        &self,
        runtime: &dyn Runtime,
        pod: &Pod,
        st: &mut PodState,
    ) -> wasmlet_runtime::Result<()> {
        let mut draft = st.clone();
        self.adopt(runtime, pod, &mut draft).await?;
        *st = draft;
        st.adopted = true;
        Ok(())
    }

    pub(crate) async fn adopt(
        &self,
        runtime: &dyn Runtime,
        pod: &Pod,
        st: &mut PodState,
    ) -> wasmlet_runtime::Result<()> {
        let id = uid(pod);
        let owned = |labels: &wasmlet_runtime::Labels| {
            labels.get(labels::POD_UID).map(String::as_str) == Some(id)
        };
        let mut sandboxes: Vec<_> = runtime
            .list_pod_sandboxes()
            .await?
            .into_iter()
            .filter(|s| owned(&s.labels))
            .collect();
        let mut containers: Vec<_> = runtime
            .list_containers()
            .await?
            .into_iter()
            .filter(|c| owned(&c.labels))
            .collect();
        if sandboxes.is_empty() && containers.is_empty() {
            return Ok(());
        }
        // Newest first: a ready sandbox wins, then the highest attempt.
        sandboxes.sort_by_key(|s| {
            std::cmp::Reverse((
                s.state == SandboxState::Ready,
                s.metadata.attempt,
                s.created_at,
            ))
        });
        let name = full_name(pod);
        let mut stale_sandboxes = Vec::new();
        if let Some((newest, older)) = sandboxes.split_first() {
            st.sandbox_attempts = newest.metadata.attempt + 1;
            // The pod started when its first surviving sandbox did, not when this run
            // of the node first saw it.
            st.start_time = Some(
                st.start_time
                    .map_or(newest.created_at, |t| t.min(newest.created_at)),
            );
            let mut config = self.sandbox_config(pod, st);
            config.metadata.attempt = newest.metadata.attempt;
            let status = match runtime.pod_sandbox_status(&newest.id).await {
                Ok(status) => Some(status),
                // Adopted without its IP; the next refresh reads it again.
                Err(e) => {
                    tracing::warn!(pod = %name, sandbox = %newest.id, error = %e, "reading the adopted sandbox's status");
                    None
                }
            };
            let ready = newest.state == SandboxState::Ready;
            tracing::info!(pod = %name, sandbox = %newest.id, ready, "adopted the pod's sandbox");
            st.sandbox = Some(SandboxRecord {
                id: newest.id.clone(),
                ready,
                ip: status.as_ref().and_then(|s| s.ip.clone()),
                additional_ips: status.map(|s| s.additional_ips).unwrap_or_default(),
                config,
            });
            stale_sandboxes.extend(older.iter().map(|s| s.id.clone()));
        }
        let wanted: std::collections::HashSet<&str> = crate::pod::containers(pod)
            .map(|c| c.name.as_str())
            .collect();
        containers.sort_by_key(|c| std::cmp::Reverse((c.metadata.attempt, c.created_at)));
        let mut stale_containers = Vec::new();
        for c in containers {
            let name_label = c
                .labels
                .get(labels::CONTAINER_NAME)
                .cloned()
                .unwrap_or_else(|| c.metadata.name.clone());
            if !wanted.contains(name_label.as_str()) {
                stale_containers.push((c.id, c.state));
                continue;
            }
            let rec = st.containers.entry(name_label.clone()).or_default();
            if rec.current.is_some() && rec.last_terminated.is_some() {
                continue; // an older dead instance: container GC's
            }
            let status = match runtime.container_status(&c.id).await {
                Ok(s) => s,
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(e),
            };
            if rec.current.is_none() {
                rec.restart_count = c
                    .annotations
                    .get(labels::CONTAINER_RESTART_COUNT)
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(c.metadata.attempt);
                tracing::info!(pod = %name, container = %name_label, id = %c.id, state = ?status.state, restarts = rec.restart_count, "adopted container");
                rec.current = Some(status);
            } else {
                rec.last_terminated = Some(status);
            }
        }
        for (cid, state) in stale_containers {
            tracing::info!(pod = %name, container = %cid, "removing a container the pod no longer has");
            if state == ContainerState::Running
                && let Err(e) = runtime.stop_container(&cid, Duration::ZERO).await
            {
                tracing::warn!(pod = %name, container = %cid, "stopping: {e}");
            }
            if let Err(e) = runtime.remove_container(&cid).await {
                tracing::warn!(pod = %name, container = %cid, "removing: {e}");
            }
        }
        for sid in stale_sandboxes {
            tracing::info!(pod = %name, sandbox = %sid, "removing an older sandbox of the pod");
            if let Err(e) = runtime.remove_pod_sandbox(&sid).await {
                tracing::warn!(pod = %name, sandbox = %sid, "removing: {e}");
            }
        }
        Ok(())
    }
}
