//! The status manager: writes the status the pod workers compute to `pods/status`,
//! only when it changed, coalescing bursts; and finalizes deleted pods.
//!
//! - API pods are patched under their own UID (the UID in the patch is a precondition).
//! - Static pods' statuses go to their mirror pods.
//! - A pod whose worker ended while the pod has a deletionTimestamp is deleted with
//!   grace 0 and a UID precondition, as the kubelet does once the pod is terminated.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{HostIP, Pod, PodStatus};
use kube::api::{Api, DeleteParams, Patch, Preconditions};
use tokio_util::sync::CancellationToken;

use super::registration::patch_params;
use super::{ApiPods, MIRROR_ANNOTATION, NodeHandle, is_mirror, is_not_found};
use crate::podconfig::full_name;
use crate::podconfig::static_pod::{CONFIG_HASH_ANNOTATION, CONFIG_SOURCE_ANNOTATION};
use crate::status::StatusStore;

/// How often every status is checked even without a change (the kubelet's 10 s).
pub const SYNC_PERIOD: Duration = Duration::from_secs(10);

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// Where a pod's status goes: (namespace, name, uid) of the API object.
pub fn target(pod: &Pod, api_pods: &ApiPods) -> Option<(String, String, String)> {
    let ns = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let name = pod.metadata.name.clone()?;
    match annotation(pod, CONFIG_SOURCE_ANNOTATION) {
        Some(super::pod_source::SOURCE) => {
            let uid = pod.metadata.uid.clone()?;
            Some((ns, name, uid))
        }
        _ => {
            let hash = annotation(pod, CONFIG_HASH_ANNOTATION)?;
            let mirror = api_pods.get(&ns, &name).filter(is_mirror)?;
            if annotation(&mirror, MIRROR_ANNOTATION) != Some(hash) {
                return None;
            }
            let uid = mirror.metadata.uid.clone()?;
            Some((ns, name, uid))
        }
    }
}

/// Writes pod statuses until cancelled.
pub struct StatusManager {
    client: kube::Client,
    statuses: StatusStore,
    api_pods: ApiPods,
    node: NodeHandle,
    /// API UID -> the status last written.
    sent: HashMap<String, PodStatus>,
    /// Finished pods not yet written or finalized (the API server was unreachable).
    pending: Vec<Pod>,
}

impl StatusManager {
    pub fn new(
        client: kube::Client,
        statuses: StatusStore,
        api_pods: ApiPods,
        node: NodeHandle,
    ) -> Self {
        statuses.track_finished();
        StatusManager {
            client,
            statuses,
            api_pods,
            node,
            sent: HashMap::new(),
            pending: Vec::new(),
        }
    }

    fn host_ips(&self) -> Vec<String> {
        self.node
            .get()
            .and_then(|n| n.status?.addresses)
            .unwrap_or_default()
            .into_iter()
            .filter(|a| a.type_ == "InternalIP")
            .map(|a| a.address)
            .collect()
    }

    /// Writes one pod's status if it changed. `Err` is worth retrying.
    async fn write(&mut self, pod: &Pod) -> Result<(), kube::Error> {
        let Some((ns, name, uid)) = target(pod, &self.api_pods) else {
            return Ok(());
        };
        let mut status = pod.status.clone().unwrap_or_default();
        let ips = self.host_ips();
        if let Some(first) = ips.first() {
            status.host_ip = Some(first.clone());
            status.host_ips = Some(ips.iter().map(|ip| HostIP { ip: ip.clone() }).collect());
        }
        if self.sent.get(&uid) == Some(&status) {
            return Ok(());
        }
        let patch = serde_json::json!({ "metadata": { "uid": uid }, "status": status });
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        match api
            .patch_status(&name, &patch_params(), &Patch::Strategic(patch))
            .await
        {
            Ok(_) => {
                tracing::debug!(pod = %full_name(pod), phase = ?status.phase, "status written");
                self.sent.insert(uid, status);
                Ok(())
            }
            // Gone, or replaced by another pod of the same name: nothing to write.
            Err(e) if is_not_found(&e) || super::is_conflict(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Writes a finished pod's final status and, when it is being deleted, removes it.
    async fn finalize(&mut self, pod: &Pod) -> Result<(), kube::Error> {
        self.write(pod).await?;
        if annotation(pod, CONFIG_SOURCE_ANNOTATION) != Some(super::pod_source::SOURCE) {
            return Ok(());
        }
        let ns = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let Some(name) = pod.metadata.name.clone() else {
            return Ok(());
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let deleting = pod.metadata.deletion_timestamp.is_some()
            || self.api_pods.get(&ns, &name).is_some_and(|p| {
                p.metadata.uid.as_deref() == Some(&uid) && p.metadata.deletion_timestamp.is_some()
            });
        self.sent.remove(&uid);
        if !deleting {
            return Ok(());
        }
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..Default::default()
        };
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        match api.delete(&name, &params).await {
            Ok(_) => {
                tracing::info!(pod = %full_name(pod), "pod terminated; deleted from the API");
                Ok(())
            }
            Err(e) if is_not_found(&e) || super::is_conflict(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// One pass over every pod.
    pub async fn sync(&mut self) -> Result<(), String> {
        let mut error = None;
        let mut finished = std::mem::take(&mut self.pending);
        finished.extend(self.statuses.take_finished());
        for pod in finished {
            if let Err(e) = self.finalize(&pod).await {
                error.get_or_insert_with(|| format!("{}: {e}", full_name(&pod)));
                self.pending.push(pod);
            }
        }
        for pod in self.statuses.pods() {
            if let Err(e) = self.write(&pod).await {
                error.get_or_insert_with(|| format!("{}: {e}", full_name(&pod)));
            }
        }
        match error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    pub async fn run(mut self, cancel: CancellationToken) {
        let mut failing = false;
        loop {
            match self.sync().await {
                Ok(()) => {
                    if failing {
                        tracing::info!("pod statuses are written again");
                    }
                    failing = false;
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!("cannot write pod status, will retry: {e}");
                    }
                    failing = true;
                }
            }
            let retry = if failing || !self.pending.is_empty() {
                Duration::from_secs(1)
            } else {
                SYNC_PERIOD
            };
            tokio::select! {
                () = cancel.cancelled() => return,
                () = self.statuses.changed() => {
                    // Coalesce a burst of changes into one pass.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                () = tokio::time::sleep(retry) => {}
            }
        }
    }
}
