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
//! paused Tokio clock), over plain TCP ([`ApiServer::serve_tcp`] and
//! [`ApiServer::write_kubeconfig`], where a bearer token names the user) or over
//! HTTPS ([`ApiServer::serve_tls`] and [`ApiServer::write_kubeconfig_tls`]), which
//! authenticates like kube-apiserver: client certificates from [`ApiServer::ca`],
//! static and bootstrap tokens, service account tokens (`auth.rs`). Every request
//! is recorded ([`ApiServer::requests`]) and [`Faults`] can be injected.
//!
//! Also served as the real apiserver does: `TokenReview` and `SubjectAccessReview`
//! (answered by [`ApiServer::set_access_policy`], recorded, never stored),
//! CertificateSigningRequests with `/approval` and `/status` and a built-in
//! approver and signer ([`ApiServer::auto_approve_and_sign`], `csr.rs`), and the
//! connections to kubelets: `nodes/{name}/proxy/...` and `pods/{name}/log` over
//! HTTPS with an apiserver-kubelet-client certificate (`proxy.rs`). The real
//! `kubectl` works against [`ApiServer::serve_tls`].
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
//! Not modelled: authorization of the API's own requests (every user, anonymous
//! included, may do everything; only SubjectAccessReviews consult the policy),
//! admission (no service account volumes, no node restriction), server-side apply
//! (415), `limit` (lists are never paged), `dryRun`, OpenAPI documents (`kubectl`
//! needs `--validate=false` to create), aggregated discovery, upgrades through the
//! kubelet proxy (exec, attach, port-forward), and the shared storage of core and
//! `events.k8s.io` events (each group keeps its own).

mod auth;
mod b64;
mod csr;
mod errors;
mod faults;
mod http;
mod patch;
mod proxy;
mod resources;
mod selectors;
mod store;
mod strategy;
mod tcp;
#[cfg(test)]
mod tests;
mod tls;
mod watch;

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tower::ServiceExt as _;

pub use self::auth::UserInfo;
pub use self::csr::{APISERVER_CLIENT_SIGNER, KUBELET_CLIENT_SIGNER, KUBELET_SERVING_SIGNER};
pub use self::faults::Faults;
use self::http::AuthUser;
use self::resources::ResourceType;
use self::store::{DeleteOptions, Filter, Store, Target};
use crate::pki::Ca;

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
    /// The authenticated user (`""` for a request refused with 401).
    pub user: String,
    /// The user's groups (`system:authenticated` included, as authorization sees them).
    pub groups: Vec<String>,
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

/// How a kubeconfig written by [`ApiServer::write_kubeconfig_tls`] authenticates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Credentials {
    /// A client certificate and its key, PEM (e.g. from [`Ca::issue_client`]).
    ClientCert { cert_pem: String, key_pem: String },
    /// A bearer token ([`ApiServer::add_token`], a bootstrap or service account token).
    Token(String),
    /// No credentials: `system:anonymous`.
    Anonymous,
}

/// The name of the CA [`ApiServer::new`] makes.
pub const CA_NAME: &str = "wasmlet-testkit-ca";

/// How long the serving and kubelet-client certificates live.
const SERVER_CERT_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

struct Inner {
    store: Arc<Mutex<Store>>,
    faults: Faults,
    requests: Mutex<Vec<Request>>,
    /// The address of the last [`ApiServer::serve_tcp`].
    tcp_addr: Mutex<Option<SocketAddr>>,
    /// The address of the last [`ApiServer::serve_tls`].
    tls_addr: Mutex<Option<SocketAddr>>,
    /// The cluster CA: clients, serving, signed CSRs.
    ca: Ca,
    /// The TLS listeners' configuration, made by the first `serve_tls`.
    serving: OnceLock<Arc<tls::Serving>>,
    /// The apiserver-kubelet-client certificate and key.
    kubelet_client: OnceLock<(String, String)>,
    /// The CA kubelets' serving certificates are verified against, if any.
    kubelet_ca: Mutex<Option<String>>,
    auth: Mutex<auth::AuthState>,
    /// The built-in CSR approver and signer, when on.
    signer: Mutex<Option<csr::AutoSigner>>,
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
                tls_addr: Mutex::new(None),
                ca: Ca::new(CA_NAME),
                serving: OnceLock::new(),
                kubelet_client: OnceLock::new(),
                kubelet_ca: Mutex::new(None),
                auth: Mutex::new(auth::AuthState::default()),
                signer: Mutex::new(None),
            }),
        }
    }

    /// The whole HTTP API. Without TLS, requests authenticate with
    /// `Authorization: Bearer <token>`: a known token's user, else the token is the user.
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
            tcp::Transport::Plain,
        ));
        *lock(&self.inner.tcp_addr) = Some(addr);
        Ok(addr)
    }

    /// Serves the same API over HTTPS on `127.0.0.1:port` (0 = any free port) with a
    /// certificate from [`ca`](Self::ca) for `127.0.0.1` and `localhost`, asking for
    /// (not requiring) client certificates. Requests authenticate as in
    /// kube-apiserver: a client certificate from the CA is its CN in its O groups,
    /// else a bearer token; failed credentials are 401, none `system:anonymous`.
    pub async fn serve_tls(&self, port: u16) -> anyhow::Result<SocketAddr> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let serving = self.serving()?;
        let slot = tcp::ListenerSlot::bind(SocketAddr::from(([127, 0, 0, 1], port)))
            .with_context(|| format!("binding the test apiserver to 127.0.0.1:{port}"))?;
        let addr = slot.addr();
        self.inner.faults.add_listener(slot.clone());
        let transport = tcp::Transport::Tls {
            acceptor: tokio_rustls::TlsAcceptor::from(serving.config.clone()),
            verifier: serving.verifier.clone(),
        };
        tokio::spawn(tcp::accept_loop(
            slot,
            self.router(),
            self.inner.faults.down_signal(),
            transport,
        ));
        *lock(&self.inner.tls_addr) = Some(addr);
        Ok(addr)
    }

    fn serving(&self) -> anyhow::Result<Arc<tls::Serving>> {
        if let Some(serving) = self.inner.serving.get() {
            return Ok(serving.clone());
        }
        let (cert, key) = self
            .inner
            .ca
            .issue_server(&["127.0.0.1", "localhost"], SERVER_CERT_VALIDITY)?;
        let serving = Arc::new(tls::serving(&self.inner.ca, &cert, &key)?);
        Ok(self.inner.serving.get_or_init(|| serving).clone())
    }

    /// The cluster CA: it issues the serving certificate, is trusted for client
    /// certificates, and signs CSRs.
    pub fn ca(&self) -> &Ca {
        &self.inner.ca
    }

    /// Writes a kubeconfig for the last [`serve_tls`](Self::serve_tls) address
    /// (`certificate-authority-data` from [`ca`](Self::ca)) with `credentials`,
    /// namespace `default`. Both kube-rs and kubectl read it.
    pub fn write_kubeconfig_tls(
        &self,
        path: &Path,
        credentials: &Credentials,
    ) -> anyhow::Result<()> {
        let addr = lock(&self.inner.tls_addr)
            .ok_or_else(|| anyhow!("call serve_tls before write_kubeconfig_tls"))?;
        let data = |pem: &str| b64::encode(pem.as_bytes());
        let user = match credentials {
            Credentials::ClientCert { cert_pem, key_pem } => format!(
                "    client-certificate-data: {}\n    client-key-data: {}\n",
                data(cert_pem),
                data(key_pem)
            ),
            Credentials::Token(token) => format!("    token: {}\n", serde_json::to_string(token)?),
            Credentials::Anonymous => String::new(),
        };
        let user = if user.is_empty() {
            "  user: {}\n".to_string()
        } else {
            format!("  user:\n{user}")
        };
        let config = format!(
            "apiVersion: v1
kind: Config
clusters:
- name: wasmlet-test
  cluster:
    server: https://{addr}
    certificate-authority-data: {ca}
users:
- name: wasmlet-test
{user}contexts:
- name: wasmlet-test
  context:
    cluster: wasmlet-test
    user: wasmlet-test
    namespace: default
current-context: wasmlet-test
",
            ca = data(self.inner.ca.pem()),
        );
        std::fs::write(path, config)
            .with_context(|| format!("writing kubeconfig {}", path.display()))
    }

    /// The certificate and key this server presents to kubelets (CN
    /// `kube-apiserver-kubelet-client`, O `system:masters`, from [`ca`](Self::ca)).
    pub fn kubelet_client_identity(&self) -> anyhow::Result<(String, String)> {
        if let Some(identity) = self.inner.kubelet_client.get() {
            return Ok(identity.clone());
        }
        let identity = self.inner.ca.issue_client(
            proxy::KUBELET_CLIENT_CN,
            &[proxy::KUBELET_CLIENT_ORG],
            SERVER_CERT_VALIDITY,
        )?;
        Ok(self.inner.kubelet_client.get_or_init(|| identity).clone())
    }

    /// Verifies kubelets' serving certificates against `pem` from now on (as
    /// `--kubelet-certificate-authority`); without it they are not verified.
    pub fn set_kubelet_ca(&self, pem: &str) -> anyhow::Result<()> {
        anyhow::ensure!(
            !crate::pki::pem_blocks(pem.as_bytes(), "CERTIFICATE")?.is_empty(),
            "no CERTIFICATE in the kubelet CA PEM"
        );
        *lock(&self.inner.kubelet_ca) = Some(pem.to_string());
        Ok(())
    }

    /// Turns the built-in approver and signer on for `signers` (off for none): a
    /// CSR for one of them is approved (`Approved`, reason `AutoApproved`) and
    /// signed by [`ca`](Self::ca) for `validity`, or a shorter
    /// `spec.expirationSeconds` (at least 10 minutes). CSRs already waiting are
    /// handled now.
    pub fn auto_approve_and_sign(&self, signers: &[&str], validity: Duration) {
        *lock(&self.inner.signer) = (!signers.is_empty()).then(|| csr::AutoSigner {
            signers: signers.iter().map(|s| s.to_string()).collect(),
            validity,
        });
        for pending in self.list::<CertificateSigningRequest>(None) {
            if let Some(name) = pending.metadata.name {
                csr::reconcile(self, &name);
            }
        }
    }

    /// Approves CSR `name` as `kubectl certificate approve` does (condition
    /// `Approved`, reason `KubectlApprove`); with auto-signing on it is then signed.
    pub fn approve_csr(&self, name: &str) -> anyhow::Result<CertificateSigningRequest> {
        let csr = csr::decide(
            self,
            name,
            "Approved",
            "KubectlApprove",
            "This CSR was approved by kubectl certificate approve.",
        )?;
        csr::reconcile(self, name);
        match self.get::<CertificateSigningRequest>(None, name) {
            Some(current) => Ok(current),
            None => Ok(serde_json::from_value(csr)?),
        }
    }

    /// Denies CSR `name` as `kubectl certificate deny` does.
    pub fn deny_csr(&self, name: &str) -> anyhow::Result<CertificateSigningRequest> {
        let csr = csr::decide(
            self,
            name,
            "Denied",
            "KubectlDeny",
            "This CSR was denied by kubectl certificate deny.",
        )?;
        Ok(serde_json::from_value(csr)?)
    }

    /// Signs the approved CSR `name` as the built-in signer does, for `validity`
    /// (or the shorter `spec.expirationSeconds`). A kubernetes.io signer's refusal
    /// sets a `Failed` condition and is returned as the error.
    pub fn sign_csr(
        &self,
        name: &str,
        validity: Duration,
    ) -> anyhow::Result<CertificateSigningRequest> {
        let mut store = lock(&self.inner.store);
        match csr::sign(&mut store, &self.inner.ca, name, validity)? {
            csr::Signed::Issued(csr) => Ok(serde_json::from_value(csr)?),
            csr::Signed::Failed(why) => bail!("the signer refused {name}: {why}"),
        }
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
        let mut value = value;
        if res.id() == resources::csrs().id() {
            csr::prepare_create(res, &mut value, None)?;
        }
        let created = lock(&self.inner.store).create(res, &namespace, value)?;
        if res.id() == resources::csrs().id() {
            csr::reconcile(self, store::meta_str(&created, "name"));
        }
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
