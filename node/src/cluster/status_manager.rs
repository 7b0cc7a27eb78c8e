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
use kube::api::{Api, Patch};
use tokio_util::sync::CancellationToken;

use super::registration::patch_params;
use super::{ApiPods, NodeHandle, is_not_found};
use crate::pod::{
    CONFIG_HASH_ANNOTATION, CONFIG_SOURCE_ANNOTATION, MIRROR_ANNOTATION, annotation, full_name,
    is_mirror,
};
use crate::status::StatusStore;

/// How often every status is checked even without a change (the kubelet's 10 s).
pub const SYNC_PERIOD: Duration = Duration::from_secs(10);

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

/// Whether an API error will not go away by retrying the same request.
pub fn is_permanent(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if (400..500).contains(&s.code) && s.code != 409 && s.code != 429)
}

/// What the reconcile pass compares with the API's copy: the phase and the
/// conditions' statuses.
fn summary(s: Option<&PodStatus>) -> (Option<String>, Vec<(String, String)>) {
    let Some(s) = s else {
        return (None, Vec::new());
    };
    let mut conditions: Vec<(String, String)> = s
        .conditions
        .iter()
        .flatten()
        .filter(|c| {
            matches!(
                c.type_.as_str(),
                "PodReadyToStartContainers" | "Initialized" | "ContainersReady" | "Ready"
            )
        })
        .map(|c| (c.type_.clone(), c.status.clone()))
        .collect();
    conditions.sort();
    (s.phase.clone(), conditions)
}

/// The strategic merge patch of a pod's status. Fields the node owns that are unset
/// are sent as `null` so stale values go; pod and host IPs replace the lists (they
/// merge by `ip` otherwise); conditions merge by type, keeping other writers' ones.
pub fn status_patch(uid: &str, status: &PodStatus) -> serde_json::Value {
    use serde_json::Value;
    let mut v = serde_json::to_value(status).unwrap_or_default();
    if let Value::Object(map) = &mut v {
        for key in ["message", "reason", "podIP", "podIPs"] {
            map.entry(key).or_insert(Value::Null);
        }
        for key in ["podIPs", "hostIPs"] {
            if let Some(Value::Array(items)) = map.get_mut(key) {
                items.insert(0, serde_json::json!({ "$patch": "replace" }));
            }
        }
        if let Some(Value::Array(conditions)) = map.get_mut("conditions") {
            for c in conditions {
                if let Value::Object(c) = c {
                    c.entry("reason").or_insert(Value::Null);
                    c.entry("message").or_insert(Value::Null);
                }
            }
        }
    }
    serde_json::json!({ "metadata": { "uid": uid }, "status": v })
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

    /// Writes one pod's status if it changed since the last write, or — on a
    /// `reconcile` pass — if the API's copy drifted from it (the node lifecycle
    /// controller marks pods NotReady while the node is unreachable). `Err` is worth
    /// retrying.
    async fn write(&mut self, pod: &Pod, reconcile: bool) -> Result<(), kube::Error> {
        let Some((ns, name, uid)) = target(pod, &self.api_pods) else {
            return Ok(());
        };
        let api_copy = self.api_pods.get(&ns, &name);
        if let Some(copy) = &api_copy
            && copy.metadata.uid.as_deref() != Some(uid.as_str())
        {
            // Deleted and created again under the same name: not this pod any more.
            return Ok(());
        }
        let mut status = pod.status.clone().unwrap_or_default();
        // The API server computes qosClass at creation and never lets it change.
        status.qos_class = None;
        let ips = self.host_ips();
        if let Some(first) = ips.first() {
            status.host_ip = Some(first.clone());
            status.host_ips = Some(ips.iter().map(|ip| HostIP { ip: ip.clone() }).collect());
        }
        let drifted = reconcile
            && api_copy
                .as_ref()
                .is_some_and(|c| summary(c.status.as_ref()) != summary(Some(&status)));
        if self.sent.get(&uid) == Some(&status) && !drifted {
            return Ok(());
        }
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        match api
            .patch_status(
                &name,
                &patch_params(),
                &Patch::Strategic(status_patch(&uid, &status)),
            )
            .await
        {
            Ok(_) => {
                tracing::debug!(pod = %full_name(pod), phase = ?status.phase, "status written");
                self.sent.insert(uid, status);
                Ok(())
            }
            // Gone, or replaced by another pod of the same name: nothing to write.
            // Remembered as sent, so the passes that changes wake do not ask again.
            Err(e) if is_not_found(&e) || super::is_conflict(&e) => {
                self.sent.insert(uid, status);
                Ok(())
            }
            Err(e) if is_permanent(&e) => {
                tracing::warn!(pod = %full_name(pod), "the API server refuses the pod's status; not retrying it: {e}");
                self.sent.insert(uid, status);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Writes a finished pod's final status and, when it is being deleted, removes it.
    async fn finalize(&mut self, pod: &Pod) -> Result<(), kube::Error> {
        self.write(pod, false).await?;
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
        match super::delete_pod_now(&self.client, &ns, &name, &uid).await {
            Ok(deleted) => {
                if deleted {
                    tracing::info!(pod = %full_name(pod), "pod terminated; deleted from the API");
                }
                Ok(())
            }
            Err(e) if is_permanent(&e) => {
                tracing::warn!(pod = %full_name(pod), "the API server refuses to delete the pod; not retrying: {e}");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// One pass over every pod; `reconcile` also checks the API's copies.
    pub async fn sync(&mut self, reconcile: bool) -> Result<(), String> {
        let mut error = None;
        let mut finished = std::mem::take(&mut self.pending);
        finished.extend(self.statuses.take_finished());
        for pod in finished {
            if let Err(e) = self.finalize(&pod).await {
                error.get_or_insert_with(|| format!("{}: {e}", full_name(&pod)));
                self.pending.push(pod);
            }
        }
        let pods = self.statuses.pods();
        for pod in &pods {
            if let Err(e) = self.write(pod, reconcile).await {
                error.get_or_insert_with(|| format!("{}: {e}", full_name(pod)));
            }
        }
        if reconcile {
            // Forget what was written for pods that are gone (mirrors are recreated
            // with new UIDs, pods are deleted).
            let live: std::collections::HashSet<String> = self
                .api_pods
                .all()
                .into_iter()
                .filter_map(|p| p.metadata.uid)
                .chain(pods.iter().filter_map(|p| p.metadata.uid.clone()))
                .collect();
            self.sent.retain(|uid, _| live.contains(uid));
        }
        match error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Writes changes as they come and, every [`SYNC_PERIOD`] whatever else happens,
    /// reconciles with the API's copies. The reconcile deadline survives the passes
    /// that changes wake, so a steady stream of changes cannot starve it.
    pub async fn run(mut self, cancel: CancellationToken) {
        let mut failing = false;
        let mut next_reconcile = tokio::time::Instant::now();
        loop {
            let now = tokio::time::Instant::now();
            let reconcile = now >= next_reconcile;
            if reconcile {
                next_reconcile = now + SYNC_PERIOD;
            }
            match self.sync(reconcile).await {
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
            let wake = if failing || !self.pending.is_empty() {
                next_reconcile.min(tokio::time::Instant::now() + Duration::from_secs(1))
            } else {
                next_reconcile
            };
            tokio::select! {
                () = cancel.cancelled() => return,
                () = self.statuses.changed() => {
                    // Coalesce a burst of changes into one pass.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                () = tokio::time::sleep_until(wake) => {}
            }
        }
    }
}
