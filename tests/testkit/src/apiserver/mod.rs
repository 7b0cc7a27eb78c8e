//! An in-process Kubernetes API server for node-agent tests.
//!
//! [`ApiServer`] keeps objects as JSON in memory and serves the parts of the
//! Kubernetes API a kubelet depends on, with the real apiserver's semantics where
//! the kubelet relies on them: resourceVersions and optimistic concurrency, watches
//! with bookmarks, selector transitions and 410 Expired, the three patch formats,
//! status subresources, graceful pod deletion and finalizers, pod defaulting,
//! service account tokens and `Status` errors. Start reading at [`ApiServer`]; the
//! storage rules are in `store.rs`, the HTTP surface in `http.rs`.
//!
//! Clients reach it in process ([`ApiServer::client`], no sockets, works with a
//! paused Tokio clock) or over TCP ([`ApiServer::serve_tcp`] and
//! [`ApiServer::write_kubeconfig`]). Every request is recorded ([`ApiServer::requests`])
//! and [`Faults`] can be injected.
//!
//! ```no_run
//! # async fn example() -> anyhow::Result<()> {
//! use k8s_openapi::api::core::v1::Node;
//! use wasmlet_testkit::apiserver::ApiServer;
//!
//! let server = ApiServer::new();
//! let client = server.client("system:node:n1");
//! let nodes: kube::Api<Node> = kube::Api::all(client);
//! assert!(nodes.list(&Default::default()).await?.items.is_empty());
//! # Ok(())
//! # }
//! ```
//!
//! Not modelled: authorization (every user may do everything), admission (no
//! service account volumes, no node restriction), server-side apply (415), `limit`
//! (lists are never paged), `dryRun`, and the shared storage of core and
//! `events.k8s.io` events (each group keeps its own).

mod errors;
mod faults;
mod http;
mod patch;
mod resources;
mod selectors;
mod store;
mod strategy;
mod tcp;
mod watch;

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tower::ServiceExt as _;

pub use self::faults::Faults;
use self::http::AuthUser;
use self::resources::ResourceType;
use self::store::{DeleteOptions, Filter, Store, Target};

impl std::fmt::Display for errors::ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({} {})", self.message, self.code, self.reason)
    }
}

impl std::error::Error for errors::ApiError {}

/// Locks a mutex, ignoring poisoning (a panicking test thread must not wedge the server).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One request the server answered, as Kubernetes authorization and audit see it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    /// The authenticated user (the bearer token, or the in-process client's user).
    pub user: String,
    /// `get list watch create update patch delete deletecollection`; for
    /// non-resource paths the lower-case HTTP method.
    pub verb: String,
    /// `""` for the core group.
    pub api_group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    pub field_selector: String,
    pub label_selector: String,
    pub content_type: String,
    /// The response status code (200 for a watch that started).
    pub status: u16,
    /// The URL path.
    pub path: String,
}

struct Inner {
    store: Arc<Mutex<Store>>,
    faults: Faults,
    requests: Mutex<Vec<Request>>,
    /// The address of the last [`ApiServer::serve_tcp`].
    tcp_addr: Mutex<Option<SocketAddr>>,
}

/// The in-memory API server. Clones share the same state.
#[derive(Clone)]
pub struct ApiServer {
    inner: Arc<Inner>,
}

impl Default for ApiServer {
    fn default() -> Self {
        ApiServer::new()
    }
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("resource_version", &lock(&self.inner.store).rv())
            .finish_non_exhaustive()
    }
}

impl ApiServer {
    /// An empty cluster with the namespaces `default`, `kube-system`, `kube-public`
    /// and `kube-node-lease`, each with its `default` service account.
    pub fn new() -> ApiServer {
        let store = Arc::new(Mutex::new(Store::new()));
        ApiServer {
            inner: Arc::new(Inner {
                faults: Faults::new(store.clone()),
                store,
                requests: Mutex::new(Vec::new()),
                tcp_addr: Mutex::new(None),
            }),
        }
    }

    /// The whole HTTP API. Requests authenticate with `Authorization: Bearer <user>`.
    pub fn router(&self) -> Router {
        Router::new()
            .fallback(http::handle)
            .with_state(self.clone())
    }

    /// A kube client that talks to this server in process (no sockets) as `user`,
    /// with default namespace `default`. Works under a paused Tokio clock; must be
    /// called inside a Tokio runtime.
    pub fn client(&self, user: &str) -> kube::Client {
        let service = InProcess {
            server: self.clone(),
            router: self.router(),
            user: Arc::from(user),
        };
        kube::Client::new(service, "default")
    }

    /// Serves the API over TCP on `127.0.0.1:port` (0 = any free port) and returns
    /// the address. [`Faults::set_down`] closes and reopens this same port.
    pub async fn serve_tcp(&self, port: u16) -> anyhow::Result<SocketAddr> {
        let slot = tcp::ListenerSlot::bind(SocketAddr::from(([127, 0, 0, 1], port)))
            .with_context(|| format!("binding the test apiserver to 127.0.0.1:{port}"))?;
        let addr = slot.addr();
        self.inner.faults.add_listener(slot.clone());
        tokio::spawn(tcp::accept_loop(
            slot,
            self.router(),
            self.inner.faults.down_signal(),
        ));
        *lock(&self.inner.tcp_addr) = Some(addr);
        Ok(addr)
    }

    /// Writes a kubeconfig for the last [`serve_tcp`](Self::serve_tcp) address that
    /// authenticates as `user` (the token is the user name), namespace `default`.
    pub fn write_kubeconfig(&self, path: &Path, user: &str) -> anyhow::Result<()> {
        let addr = lock(&self.inner.tcp_addr)
            .ok_or_else(|| anyhow!("call serve_tcp before write_kubeconfig"))?;
        // JSON strings are YAML strings, and quote user names like `system:node:n1`.
        let quoted = serde_json::to_string(user)?;
        let config = format!(
            "apiVersion: v1
kind: Config
clusters:
- name: wasmlet-test
  cluster:
    server: http://{addr}
users:
- name: {quoted}
  user:
    token: {quoted}
contexts:
- name: wasmlet-test
  context:
    cluster: wasmlet-test
    user: {quoted}
    namespace: default
current-context: wasmlet-test
"
        );
        std::fs::write(path, config)
            .with_context(|| format!("writing kubeconfig {}", path.display()))
    }

    /// Every request answered so far, in order.
    pub fn requests(&self) -> Vec<Request> {
        lock(&self.inner.requests).clone()
    }

    /// Forgets the recorded requests.
    pub fn clear_requests(&self) {
        lock(&self.inner.requests).clear();
    }

    pub(crate) fn record(&self, request: Request) {
        lock(&self.inner.requests).push(request);
    }

    /// Fault injection.
    pub fn faults(&self) -> &Faults {
        &self.inner.faults
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> String {
        lock(&self.inner.store).rv().to_string()
    }

    /// The number of open watch streams.
    pub fn open_watches(&self) -> usize {
        lock(&self.inner.store).open_watches()
    }

    /// Creates an object as an administrator would (not recorded as a request).
    /// A namespaced object without a namespace goes to `default`.
    pub fn create<K>(&self, obj: &K) -> anyhow::Result<K>
    where
        K: kube::Resource + Serialize + DeserializeOwned,
        K::DynamicType: Default,
    {
        let res = resource_of::<K>()?;
        let value = serde_json::to_value(obj)?;
        let namespace = match store::meta_str(&value, "namespace") {
            "" if res.namespaced => "default".to_string(),
            ns => ns.to_string(),
        };
        let created = lock(&self.inner.store).create(res, &namespace, value)?;
        Ok(serde_json::from_value(created)?)
    }

    /// Replaces an object, status included (not recorded). A non-empty
    /// `metadata.resourceVersion` must be current.
    pub fn replace<K>(&self, obj: &K) -> anyhow::Result<K>
    where
        K: kube::Resource + Serialize + DeserializeOwned,
        K::DynamicType: Default,
    {
        let res = resource_of::<K>()?;
        let value = serde_json::to_value(obj)?;
        let name = store::meta_str(&value, "name").to_string();
        let namespace = scope(
            res,
            Some(store::meta_str(&value, "namespace")).filter(|ns| !ns.is_empty()),
        );
        let replaced =
            lock(&self.inner.store).update(res, &namespace, &name, Target::Whole, |_| Ok(value))?;
        Ok(serde_json::from_value(replaced)?)
    }

    /// One object; `namespace` `None` means `default` for namespaced resources.
    pub fn get<K>(&self, namespace: Option<&str>, name: &str) -> Option<K>
    where
        K: kube::Resource + DeserializeOwned,
        K::DynamicType: Default,
    {
        let res = resource_of::<K>().ok()?;
        let obj = lock(&self.inner.store)
            .get(res, &scope(res, namespace), name)
            .ok()?;
        serde_json::from_value(obj).ok()
    }

    /// The objects in `namespace`, or in all namespaces for `None`.
    pub fn list<K>(&self, namespace: Option<&str>) -> Vec<K>
    where
        K: kube::Resource + DeserializeOwned,
        K::DynamicType: Default,
    {
        let Ok(res) = resource_of::<K>() else {
            return Vec::new();
        };
        let filter = Filter {
            namespace: namespace.map(str::to_string),
            ..Filter::default()
        };
        let (items, _) = lock(&self.inner.store).list(res, &filter);
        items
            .into_iter()
            .filter_map(|obj| serde_json::from_value(obj).ok())
            .collect()
    }

    /// Deletes an object as a DELETE with `gracePeriodSeconds = grace_seconds` would
    /// (graceful for scheduled pods, held by finalizers); not recorded.
    pub fn delete<K>(
        &self,
        namespace: Option<&str>,
        name: &str,
        grace_seconds: Option<i64>,
    ) -> anyhow::Result<()>
    where
        K: kube::Resource,
        K::DynamicType: Default,
    {
        let res = resource_of::<K>()?;
        let options = DeleteOptions {
            grace_seconds,
            ..DeleteOptions::default()
        };
        lock(&self.inner.store).delete(res, &scope(res, namespace), name, &options)?;
        Ok(())
    }

    /// Polls every 10 ms (Tokio time) until the object exists and `pred` holds, or
    /// fails after `timeout` with the last state seen.
    pub async fn wait_for<K, F>(
        &self,
        namespace: Option<&str>,
        name: &str,
        timeout: Duration,
        pred: F,
    ) -> anyhow::Result<K>
    where
        K: kube::Resource + DeserializeOwned + std::fmt::Debug,
        K::DynamicType: Default,
        F: Fn(&K) -> bool,
    {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let current = self.get::<K>(namespace, name);
            if current.as_ref().is_some_and(&pred)
                && let Some(obj) = current
            {
                return Ok(obj);
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("timed out after {timeout:?} waiting for {name}; last state: {current:?}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// The namespace key for `res`: `""` when cluster-scoped, else `namespace` or `default`.
fn scope(res: &ResourceType, namespace: Option<&str>) -> String {
    if res.namespaced {
        namespace.unwrap_or("default").to_string()
    } else {
        String::new()
    }
}

/// The served resource of a kube type.
fn resource_of<K>() -> anyhow::Result<&'static ResourceType>
where
    K: kube::Resource,
    K::DynamicType: Default,
{
    let dt = K::DynamicType::default();
    let (group, version, plural) = (K::group(&dt), K::version(&dt), K::plural(&dt));
    resources::find(&group, &version, &plural)
        .ok_or_else(|| anyhow!("the test apiserver does not serve {plural} in {group}/{version}"))
}

/// The in-process transport: the router as a tower service, with the client's user
/// attached and connection failures while the server is down.
#[derive(Clone)]
struct InProcess {
    server: ApiServer,
    router: Router,
    user: Arc<str>,
}

impl<B> tower::Service<axum::http::Request<B>> for InProcess
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = axum::http::Response<Body>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: axum::http::Request<B>) -> Self::Future {
        if self.server.faults().is_down() {
            let refused = std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "the test apiserver is down (connection refused)",
            );
            return Box::pin(std::future::ready(Err(refused)));
        }
        let mut request = request.map(Body::new);
        request.extensions_mut().insert(AuthUser(self.user.clone()));
        let router = self.router.clone();
        Box::pin(async move {
            match router.oneshot(request).await {
                Ok(response) => Ok(response),
                Err(never) => match never {},
            }
        })
    }
}
