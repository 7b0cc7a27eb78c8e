//! Membership of a cluster: everything the node does through the API server.
//!
//! - [`registration`] builds and registers the Node object;
//! - [`lease`] renews the node's Lease in `kube-node-lease`;
//! - [`node_status`] computes NodeStatus and writes it when it changed or is due;
//! - [`pod_source`] watches the pods bound to the node and feeds PodConfig;
//! - [`status_manager`] patches `pods/status` and finalizes deleted pods;
//! - [`mirror`] keeps a mirror pod in the API for every static pod;
//! - [`events`] records the kubelet's events;
//! - [`runtime_classes`] resolves `runtimeClassName` through the API's RuntimeClasses.
//!
//! Every request is one the Node authorizer allows `system:node:<name>`; the table is
//! in `docs/cluster.md` and the e2e test checks the node makes no other.

pub mod certificates;
pub mod events;
pub mod lease;
pub mod mirror;
pub mod node_status;
pub mod pod_source;
pub mod registration;
pub mod runtime_classes;
pub mod status_manager;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, RwLock};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::config::{KubeConfigOptions, Kubeconfig};

/// The field manager the node's writes are recorded under.
pub const FIELD_MANAGER: &str = "wasmlet";

/// The annotation that marks a mirror pod; its value is the static pod's config hash.
/// The deadline of the node's requests other than watches, as the kubelet's heartbeat
/// client has (the smaller of the status update frequency and the lease duration): a
/// connection that died silently must not hold the lease renewal.
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A client for the API server named in a kubeconfig file. `request_timeout` bounds
/// connecting, writing and each read; watches need `None`.
pub async fn client_from_kubeconfig(
    path: &Path,
    request_timeout: Option<std::time::Duration>,
) -> anyhow::Result<kube::Client> {
    let kubeconfig = Kubeconfig::read_from(path)
        .with_context(|| format!("reading kubeconfig {}", path.display()))?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .with_context(|| format!("kubeconfig {}", path.display()))?;
    if let Some(t) = request_timeout {
        config.connect_timeout = Some(t);
        config.read_timeout = Some(t);
        config.write_timeout = Some(t);
    }
    kube::Client::try_from(config).context("building the API client")
}

/// The pods in the API bound to this node (mirror pods included), by `namespace/name`,
/// as the pod source last saw them.
#[derive(Clone, Default)]
pub struct ApiPods {
    inner: Arc<RwLock<HashMap<String, Pod>>>,
}

impl ApiPods {
    pub fn key(namespace: &str, name: &str) -> String {
        format!("{namespace}/{name}")
    }

    pub fn get(&self, namespace: &str, name: &str) -> Option<Pod> {
        self.inner
            .read()
            .unwrap()
            .get(&Self::key(namespace, name))
            .cloned()
    }

    pub fn all(&self) -> Vec<Pod> {
        self.inner.read().unwrap().values().cloned().collect()
    }

    pub(crate) fn replace(&self, pods: HashMap<String, Pod>) {
        *self.inner.write().unwrap() = pods;
    }
}

/// Watches the objects `api` and `config` select until cancelled (kube-runtime's
/// watcher: it backs off and lists again after an error or a 410 Gone), and calls
/// `publish` with the whole set, by `namespace/name`, after the first complete list
/// and after every change. Errors are logged once per outage, naming `what`.
/// Returns when cancelled, when the stream ends or when `publish` returns false.
pub async fn watch_set<K>(
    api: kube::Api<K>,
    config: kube::runtime::watcher::Config,
    what: &'static str,
    cancel: tokio_util::sync::CancellationToken,
    mut publish: impl FnMut(HashMap<String, K>) -> futures::future::BoxFuture<'static, bool>,
) where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    use futures::StreamExt as _;
    use kube::runtime::WatchStreamExt as _;
    use kube::runtime::watcher::Event;
    let key = |o: &K| {
        format!(
            "{}/{}",
            o.meta().namespace.as_deref().unwrap_or(""),
            o.meta().name.as_deref().unwrap_or("")
        )
    };
    let mut stream = kube::runtime::watcher(api, config)
        .default_backoff()
        .boxed();
    let mut set: HashMap<String, K> = HashMap::new();
    let mut init: Option<HashMap<String, K>> = None;
    let mut synced = false;
    let mut failing = false;
    loop {
        let event = tokio::select! {
            () = cancel.cancelled() => return,
            e = stream.next() => match e {
                Some(e) => e,
                None => return,
            },
        };
        let changed = match event {
            Ok(Event::Init) => {
                init = Some(HashMap::new());
                false
            }
            Ok(Event::InitApply(o)) => {
                init.get_or_insert_with(HashMap::new).insert(key(&o), o);
                false
            }
            Ok(Event::InitDone) => {
                set = init.take().unwrap_or_default();
                if failing {
                    tracing::info!("watching {what} again");
                }
                failing = false;
                synced = true;
                true
            }
            Ok(Event::Apply(o)) => {
                set.insert(key(&o), o);
                true
            }
            Ok(Event::Delete(o)) => {
                set.remove(&key(&o));
                true
            }
            Err(e) => {
                // The node keeps running what it runs meanwhile.
                if !failing {
                    tracing::error!("watching {what}: {e}; retrying");
                }
                failing = true;
                false
            }
        };
        if changed && synced && !publish(set.clone()).await {
            return;
        }
    }
}

/// Deletes a pod with grace 0 if it still has `uid` (the kubelet's final delete, and
/// the removal of a mirror pod). `Ok(false)` when it is gone or is another pod now.
pub async fn delete_pod_now(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    uid: &str,
) -> kube::Result<bool> {
    let api: kube::Api<Pod> = kube::Api::namespaced(client.clone(), namespace);
    let params = kube::api::DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(kube::api::Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(true),
        Err(e) if is_not_found(&e) || is_conflict(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The Node object as last registered or written, shared by the parts that need its
/// UID (owner references) or its addresses (host IPs).
#[derive(Clone, Default)]
pub struct NodeHandle {
    inner: Arc<RwLock<Option<Node>>>,
}

impl NodeHandle {
    pub fn get(&self) -> Option<Node> {
        self.inner.read().unwrap().clone()
    }

    pub fn set(&self, node: Node) {
        *self.inner.write().unwrap() = Some(node);
    }

    /// The owner reference the node's Lease and mirror pods carry, once registered.
    pub fn owner_reference(
        &self,
    ) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
        let node = self.get()?;
        Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.metadata.name.clone()?,
                uid: node.metadata.uid.clone()?,
                controller: Some(true),
                block_owner_deletion: None,
            },
        )
    }
}

/// ConfigMaps and Secrets read from the API server (the Node authorizer allows those
/// the node's pods reference), and the Services [`watch_services`] keeps.
pub struct ApiObjects {
    pub client: kube::Client,
    pub services: ServiceCache,
}

/// Every Service of the cluster, `None` until the first list.
pub type ServiceCache = std::sync::Arc<
    std::sync::RwLock<Option<std::sync::Arc<[k8s_openapi::api::core::v1::Service]>>>,
>;

/// Watches every Service until cancelled, as the kubelet's service informer does, for
/// the service environment variables of containers.
pub async fn watch_services(
    client: kube::Client,
    cache: ServiceCache,
    cancel: tokio_util::sync::CancellationToken,
) {
    let api: kube::Api<k8s_openapi::api::core::v1::Service> = kube::Api::all(client);
    watch_set(
        api,
        kube::runtime::watcher::Config::default(),
        "Services",
        cancel,
        move |set| {
            *cache.write().unwrap() = Some(set.into_values().collect::<Vec<_>>().into());
            Box::pin(async { true })
        },
    )
    .await;
}

#[async_trait::async_trait]
impl crate::env::ObjectSource for ApiObjects {
    async fn config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<k8s_openapi::api::core::v1::ConfigMap>, String> {
        kube::Api::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(|e| format!("reading ConfigMap {namespace}/{name}: {e}"))
    }

    async fn secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<k8s_openapi::api::core::v1::Secret>, String> {
        kube::Api::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(|e| format!("reading Secret {namespace}/{name}: {e}"))
    }

    async fn services(
        &self,
    ) -> Result<std::sync::Arc<[k8s_openapi::api::core::v1::Service]>, String> {
        self.services.read().unwrap().clone().ok_or_else(|| {
            "services have not yet been read at least once, cannot construct envvars".to_owned()
        })
    }

    async fn persistent_volume_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<k8s_openapi::api::core::v1::PersistentVolumeClaim>, String> {
        kube::Api::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(|e| format!("failed to fetch PVC from API server: {e}"))
    }

    async fn persistent_volume(
        &self,
        name: &str,
    ) -> Result<Option<k8s_openapi::api::core::v1::PersistentVolume>, String> {
        kube::Api::all(self.client.clone())
            .get_opt(name)
            .await
            .map_err(|e| format!("failed to fetch PV {name} from API server: {e}"))
    }

    async fn patch_claim_status(
        &self,
        namespace: &str,
        name: &str,
        patch: serde_json::Value,
    ) -> Result<(), String> {
        let api: kube::Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
            kube::Api::namespaced(self.client.clone(), namespace);
        api.patch_status(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(patch),
        )
        .await
        .map(drop)
        .map_err(|e| {
            format!("updating the status of PersistentVolumeClaim {namespace}/{name}: {e}")
        })
    }

    async fn csi_driver(
        &self,
        name: &str,
    ) -> Result<Option<k8s_openapi::api::storage::v1::CSIDriver>, String> {
        kube::Api::all(self.client.clone())
            .get_opt(name)
            .await
            .map_err(|e| format!("reading CSIDriver {name}: {e}"))
    }

    async fn volume_attachment(
        &self,
        name: &str,
    ) -> Result<Option<k8s_openapi::api::storage::v1::VolumeAttachment>, String> {
        kube::Api::all(self.client.clone())
            .get_opt(name)
            .await
            .map_err(|e| format!("reading VolumeAttachment {name}: {e}"))
    }

    async fn service_account_token(
        &self,
        pod: &Pod,
        audiences: Vec<String>,
        expiration_seconds: i64,
    ) -> Result<(String, jiff::Timestamp), String> {
        use k8s_openapi::api::authentication::v1::{
            BoundObjectReference, TokenRequest, TokenRequestSpec,
        };
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let account = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.as_deref())
            .filter(|s| !s.is_empty())
            .unwrap_or("default");
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences,
                expiration_seconds: Some(expiration_seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: pod.metadata.name.clone(),
                    uid: pod.metadata.uid.clone(),
                }),
            },
            ..Default::default()
        };
        let api: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
            kube::Api::namespaced(self.client.clone(), namespace);
        let done = api
            .create_token_request(account, &kube::api::PostParams::default(), &request)
            .await
            .map_err(|e| {
                format!("requesting a token for ServiceAccount {namespace}/{account}: {e}")
            })?;
        let status = done
            .status
            .ok_or("the TokenRequest came back without a token")?;
        Ok((status.token, status.expiration_timestamp.0))
    }
}

/// Whether a kube error is the API's NotFound.
pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Whether a kube error is the API's AlreadyExists / Conflict (409).
pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

#[cfg(test)]
mod tests;
