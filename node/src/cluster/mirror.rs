//! Mirror pods: the API's read-only copies of the node's static pods.
//!
//! As the kubelet: every static pod has a mirror pod of the same namespace and name,
//! annotated `kubernetes.io/config.mirror: <config hash>` and owned by the Node. A
//! mirror that is deleted (or being deleted, or of an older version of the static pod)
//! is removed and created again; one whose static pod is gone is removed. Deleting a
//! mirror never touches the static pod.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use tokio_util::sync::CancellationToken;

use super::{ApiPods, NodeHandle, is_conflict};
use crate::pod::{CONFIG_HASH_ANNOTATION, MIRROR_ANNOTATION, annotation, full_name, is_mirror};
use std::sync::{Arc, RwLock};

/// How often mirror pods are reconciled (the kubelet's housekeeping period).
pub const PERIOD: Duration = Duration::from_secs(2);

/// The mirror pod of a static pod.
pub fn mirror_of(
    pod: &Pod,
    owner: k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
) -> Pod {
    let mut mirror = pod.clone();
    mirror.status = None;
    let meta = &mut mirror.metadata;
    meta.uid = None;
    meta.resource_version = None;
    meta.creation_timestamp = None;
    meta.deletion_timestamp = None;
    meta.managed_fields = None;
    let hash = annotation(pod, CONFIG_HASH_ANNOTATION)
        .unwrap_or_default()
        .to_owned();
    meta.annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(MIRROR_ANNOTATION.into(), hash);
    meta.owner_references = Some(vec![owner]);
    mirror
}

/// What to do about one static pod's mirror.
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    None,
    Create,
    /// Delete the mirror with this UID (it is stale or being deleted).
    Delete(String),
    /// A pod that is not a mirror has the name: leave it alone.
    Blocked,
}

/// Decides what to do about a static pod given what the API has under its name.
pub fn decide(static_pod: &Pod, existing: Option<&Pod>) -> Action {
    let Some(existing) = existing else {
        return Action::Create;
    };
    if !is_mirror(existing) {
        return Action::Blocked;
    }
    let stale =
        annotation(existing, MIRROR_ANNOTATION) != annotation(static_pod, CONFIG_HASH_ANNOTATION);
    if stale || existing.metadata.deletion_timestamp.is_some() {
        return Action::Delete(existing.metadata.uid.clone().unwrap_or_default());
    }
    Action::None
}

/// The static pods the node wants, as the sync loop has them, and whether every
/// source has been heard from (before that, no mirror is an orphan).
#[derive(Clone, Default)]
pub struct StaticPods {
    inner: Arc<RwLock<(bool, Vec<Pod>)>>,
}

impl StaticPods {
    pub fn set(&self, sources_ready: bool, pods: Vec<Pod>) {
        *self.inner.write().unwrap() = (sources_ready, pods);
    }

    pub fn get(&self) -> (bool, Vec<Pod>) {
        self.inner.read().unwrap().clone()
    }
}

/// Keeps mirror pods until cancelled.
pub struct MirrorManager {
    pub client: kube::Client,
    pub static_pods: StaticPods,
    pub api_pods: ApiPods,
    pub node: NodeHandle,
}

impl MirrorManager {
    async fn delete(&self, namespace: &str, name: &str, uid: String) -> kube::Result<()> {
        super::delete_pod_now(&self.client, namespace, name, &uid)
            .await
            .map(|_| ())
    }

    /// One pass.
    pub async fn reconcile(&self) -> kube::Result<()> {
        let Some(owner) = self.node.owner_reference() else {
            return Ok(()); // not registered yet
        };
        let (sources_ready, statics) = self.static_pods.get();
        let mut wanted = HashSet::new();
        for pod in &statics {
            let ns = pod
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into());
            let name = pod.metadata.name.clone().unwrap_or_default();
            wanted.insert(ApiPods::key(&ns, &name));
            match decide(pod, self.api_pods.get(&ns, &name).as_ref()) {
                Action::None => {}
                Action::Blocked => {
                    tracing::debug!(pod = %full_name(pod), "a pod that is not a mirror has the static pod's name");
                }
                Action::Create => {
                    let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
                    match api
                        .create(&PostParams::default(), &mirror_of(pod, owner.clone()))
                        .await
                    {
                        Ok(_) => tracing::info!(pod = %full_name(pod), "created the mirror pod"),
                        Err(e) if is_conflict(&e) => {} // the watch has not shown it yet
                        Err(e) => return Err(e),
                    }
                }
                Action::Delete(uid) => {
                    tracing::info!(pod = %full_name(pod), "the mirror pod is stale or being deleted; recreating it");
                    self.delete(&ns, &name, uid).await?;
                }
            }
        }
        if !sources_ready {
            // A static pod not read yet would look like an orphan.
            return Ok(());
        }
        for mirror in self.api_pods.all().into_iter().filter(is_mirror) {
            let ns = mirror
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into());
            let name = mirror.metadata.name.clone().unwrap_or_default();
            if wanted.contains(&ApiPods::key(&ns, &name)) {
                continue;
            }
            tracing::info!(pod = %full_name(&mirror), "deleting the mirror of a static pod that is gone");
            self.delete(&ns, &name, mirror.metadata.uid.clone().unwrap_or_default())
                .await?;
        }
        Ok(())
    }

    pub async fn run(self, cancel: CancellationToken) {
        let mut failing = false;
        loop {
            match self.reconcile().await {
                Ok(()) => failing = false,
                Err(e) => {
                    if !failing {
                        tracing::warn!("mirror pods: {e}; will retry");
                    }
                    failing = true;
                }
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(PERIOD) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn static_pod(hash: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("web-n1".into());
        p.metadata.namespace = Some("default".into());
        p.metadata.uid = Some(hash.into());
        p.metadata.annotations = Some(BTreeMap::from([
            (CONFIG_HASH_ANNOTATION.to_owned(), hash.to_owned()),
            (
                crate::pod::CONFIG_SOURCE_ANNOTATION.to_owned(),
                "file".to_owned(),
            ),
        ]));
        p
    }

    fn owner() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: "n1".into(),
            uid: "node-uid".into(),
            controller: Some(true),
            block_owner_deletion: None,
        }
    }

    #[test]
    fn a_mirror_carries_the_hash_and_the_node_as_owner() {
        let m = mirror_of(&static_pod("h1"), owner());
        assert_eq!(annotation(&m, MIRROR_ANNOTATION), Some("h1"));
        assert_eq!(m.metadata.uid, None);
        let o = &m.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (o.kind.as_str(), o.name.as_str(), o.uid.as_str()),
            ("Node", "n1", "node-uid")
        );
    }

    #[test]
    fn stale_or_deleted_mirrors_are_replaced() {
        let pod = static_pod("h2");
        assert_eq!(decide(&pod, None), Action::Create);
        let mut current = mirror_of(&pod, owner());
        current.metadata.uid = Some("m1".into());
        assert_eq!(decide(&pod, Some(&current)), Action::None);
        let mut old = mirror_of(&static_pod("h1"), owner());
        old.metadata.uid = Some("m0".into());
        assert_eq!(decide(&pod, Some(&old)), Action::Delete("m0".into()));
        current.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
        );
        assert_eq!(decide(&pod, Some(&current)), Action::Delete("m1".into()));
        let mut regular = Pod::default();
        regular.metadata.name = Some("web-n1".into());
        assert_eq!(decide(&pod, Some(&regular)), Action::Blocked);
    }
}
