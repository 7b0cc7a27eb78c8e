//! The node's kube clients over the current client certificate: built for the
//! bootstrap, and swapped under the node's requests when a rotation issues a new one;
//! the rotation tasks.

use super::*;

/// The kube client of a kubeconfig, with the client certificate and key from
/// `identity` (one PEM file) instead of the kubeconfig's when given, and
/// `request_timeout` on connecting, writing and each read (watches need `None`).
pub async fn client_for(
    kubeconfig: &Path,
    identity: Option<&Path>,
    request_timeout: Option<Duration>,
) -> Result<kube::Client> {
    let kc_error = |m: String| Error::Kubeconfig {
        path: kubeconfig.to_owned(),
        message: m,
    };
    let file = Kubeconfig::read_from(kubeconfig).map_err(|e| kc_error(e.to_string()))?;
    let mut config = kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .map_err(|e| kc_error(e.to_string()))?;
    if let Some(identity) = identity {
        let path = identity.display().to_string();
        let auth = &mut config.auth_info;
        auth.client_certificate = Some(path.clone());
        auth.client_key = Some(path);
        auth.client_certificate_data = None;
        auth.client_key_data = None;
        auth.token = None;
        auth.token_file = None;
    }
    if let Some(t) = request_timeout {
        config.connect_timeout = Some(t);
        config.read_timeout = Some(t);
        config.write_timeout = Some(t);
    }
    kube::Client::try_from(config).map_err(|e| kc_error(format!("building the API client: {e}")))
}

/// The TLS bootstrap (`LoadClientCert`): with a valid `kubeconfig` nothing happens;
/// else a client certificate is requested with the bootstrap kubeconfig's
/// credentials and `kubeconfig` is written to use it.
pub async fn bootstrap_client(
    kubeconfig: &Path,
    bootstrap_kubeconfig: &Path,
    cert_dir: &Path,
    node_name: &str,
) -> Result<()> {
    if client_config_valid(kubeconfig) {
        tracing::info!(kubeconfig = %kubeconfig.display(), "the kubeconfig is valid; no bootstrap");
        return Ok(());
    }
    tracing::info!(
        bootstrap_kubeconfig = %bootstrap_kubeconfig.display(),
        "using the bootstrap kubeconfig to request a client certificate"
    );
    let client = client_for(bootstrap_kubeconfig, None, None).await?;
    let store = Store::new(cert_dir, Kind::Client);
    std::fs::create_dir_all(cert_dir).map_err(|e| file_error(cert_dir, e))?;
    // The key waits in a file of its own until the certificate is issued, so a node
    // restarted meanwhile asks again with the same key (and finds the same CSR).
    let key_path = cert_dir.join(BOOTSTRAP_KEY);
    let key = match std::fs::read_to_string(&key_path)
        .ok()
        .and_then(|pem| rcgen::KeyPair::from_pem(&pem).ok())
    {
        Some(key) => key,
        None => {
            let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
                .map_err(|e| Error::Generate(e.to_string()))?;
            crate::private_file::write(&key_path, key.serialize_pem().as_bytes())
                .map_err(|e| file_error(&key_path, e))?;
            key
        }
    };
    let template = Template::client(node_name);
    let request = request_for(&template, &key)?;
    // The bootstrap's usages are requestNodeCertificate's, key encipherment included.
    let usages: Vec<String> = ["digital signature", "key encipherment", "client auth"]
        .iter()
        .map(|u| u.to_string())
        .collect();
    let name = bootstrap_csr_name(&request.public_key, &template, &usages);
    let cert_pem = request_certificate(
        &client,
        CsrName::Fixed(name),
        &template,
        usages,
        &request,
        BOOTSTRAP_WAIT,
    )
    .await?;
    store.update(&cert_pem, &request.key_pem)?;
    let _ = std::fs::remove_file(&key_path);
    write_kubeconfig(bootstrap_kubeconfig, kubeconfig, &store.current_path())?;
    tracing::info!(kubeconfig = %kubeconfig.display(), cert = %store.current_path().display(), "obtained the node's client certificate");
    Ok(())
}

/// A slot holding the kube client the node's requests go through now; a client made
/// over it ([`RotatingClient::client`]) sends each request through the client in the
/// slot at that moment.
#[derive(Clone)]
pub struct RotatingClient {
    current: Arc<RwLock<kube::Client>>,
}

impl RotatingClient {
    pub fn new(client: kube::Client) -> RotatingClient {
        RotatingClient {
            current: Arc::new(RwLock::new(client)),
        }
    }

    /// A client over the slot.
    pub fn client(&self) -> kube::Client {
        let ns = self
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .default_namespace()
            .to_owned();
        kube::Client::new(self.clone(), ns)
    }

    /// New requests go through `client` from now on.
    pub fn replace(&self, client: kube::Client) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = client;
    }
}

impl tower::Service<axum::http::Request<kube::client::Body>> for RotatingClient {
    type Response = axum::http::Response<kube::client::Body>;
    type Error = kube::Error;
    type Future = BoxFuture<'static, Result<Self::Response, kube::Error>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), kube::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: axum::http::Request<kube::client::Body>) -> Self::Future {
        let client = self
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        Box::pin(async move { client.send(request).await })
    }
}

/// The node's two API clients (requests with a deadline, watches without) over
/// rotating slots, rebuilt from the kubeconfig with the cert dir's current client
/// certificate after each rotation.
#[derive(Clone)]
pub struct NodeClients {
    kubeconfig: PathBuf,
    request_timeout: Duration,
    pub requests: RotatingClient,
    pub watches: RotatingClient,
}

impl NodeClients {
    /// The clients from the kubeconfig as it is (its own credentials).
    pub async fn new(kubeconfig: &Path, request_timeout: Duration) -> Result<NodeClients> {
        Ok(NodeClients {
            kubeconfig: kubeconfig.to_owned(),
            request_timeout,
            requests: RotatingClient::new(
                client_for(kubeconfig, None, Some(request_timeout)).await?,
            ),
            watches: RotatingClient::new(client_for(kubeconfig, None, None).await?),
        })
    }

    /// Swaps in clients that present the pair in `identity`.
    pub async fn reload(&self, identity: &Path) -> Result<()> {
        let requests =
            client_for(&self.kubeconfig, Some(identity), Some(self.request_timeout)).await?;
        let watches = client_for(&self.kubeconfig, Some(identity), None).await?;
        self.requests.replace(requests);
        self.watches.replace(watches);
        Ok(())
    }
}

/// What a rotation does with a new pair: the client rotation reloads the node's
/// clients, the serving rotation swaps the node API's certificate.
pub type OnIssued =
    Box<dyn Fn(&Pair, &Path) -> BoxFuture<'static, Result<(), String>> + Send + Sync>;

/// A certificate kept fresh: requested again at every rotation deadline.
pub struct Rotation {
    pub template: Template,
    pub store: Store,
    /// The client the CSRs go through (the node's own credentials), without a read
    /// deadline: the wait for the certificate is a watch.
    pub client: kube::Client,
    /// The pair to rotate when the store has none yet (the kubeconfig's own).
    pub initial: Option<(jiff::Timestamp, jiff::Timestamp)>,
    pub on_issued: OnIssued,
}

/// Rotations built with the node, started with its cluster membership.
#[derive(Clone, Default)]
pub struct Rotations {
    inner: Arc<Mutex<Vec<Rotation>>>,
}

impl Rotations {
    pub fn push(&self, r: Rotation) {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).push(r);
    }

    pub fn take(&self) -> Vec<Rotation> {
        std::mem::take(&mut *self.inner.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Rotation {
    /// The task's name.
    pub fn name(&self) -> &'static str {
        match self.template.kind {
            Kind::Client => "client certificate rotation",
            Kind::Serving => "serving certificate rotation",
        }
    }

    /// Until cancelled: sleeps until the current certificate's rotation deadline (at
    /// once without one), requests a new one, stores it and hands it over. A failed
    /// request is retried after 2 s, doubling to 32 s (client-go's back-off, then
    /// its 32 s poll).
    pub async fn run(self, cancel: CancellationToken) {
        let kind = self.template.kind;
        let mut backoff = Duration::from_secs(2);
        loop {
            let validity = match self.store.current() {
                Ok(p) => Some((p.not_before, p.not_after)),
                Err(_) => self.initial,
            };
            let now = jiff::Timestamp::now();
            let deadline = validity
                .map(|(nb, na)| rotation_deadline(nb, na, draw()))
                .unwrap_or(now);
            let wait = Duration::try_from(deadline - now).unwrap_or(Duration::ZERO);
            if let Some((_, not_after)) = validity {
                tracing::info!(?kind, expiration = %not_after, rotation_deadline = %deadline, "waiting for the next certificate rotation");
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
            loop {
                let rotated = tokio::select! {
                    () = cancel.cancelled() => return,
                    r = self.rotate() => r,
                };
                match rotated {
                    Ok(()) => {
                        backoff = Duration::from_secs(2);
                        break;
                    }
                    Err(e) => {
                        tracing::error!(
                            ?kind,
                            "rotating the certificate: {e}; retrying in {}s",
                            backoff.as_secs()
                        );
                        tokio::select! {
                            () = cancel.cancelled() => return,
                            () = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(Duration::from_secs(32));
                    }
                }
            }
            // As client-go's loop, never twice within a second.
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    async fn rotate(&self) -> Result<(), String> {
        let request = new_request(&self.template).map_err(|e| e.to_string())?;
        let cert = request_certificate(
            &self.client,
            CsrName::Generate,
            &self.template,
            self.template.kind.usages(),
            &request,
            ROTATION_WAIT,
        )
        .await
        .map_err(|e| e.to_string())?;
        let pair = self
            .store
            .update(&cert, &request.key_pem)
            .map_err(|e| e.to_string())?;
        (self.on_issued)(&pair, &self.store.current_path()).await?;
        tracing::info!(kind = ?self.template.kind, expiration = %pair.not_after, cert = %self.store.current_path().display(), "rotated the certificate");
        Ok(())
    }
}

/// The client certificate rotation for `clients`: CSRs go through the node's own
/// request client, and each new pair is swapped into both clients.
pub fn client_rotation(
    clients: &NodeClients,
    kubeconfig: &Path,
    cert_dir: &Path,
    node_name: &str,
) -> Rotation {
    let initial = kubeconfig_client_certs(kubeconfig)
        .ok()
        .flatten()
        .and_then(|c| c.first().and_then(|c| validity(c)));
    let reload = clients.clone();
    Rotation {
        template: Template::client(node_name),
        store: Store::new(cert_dir, Kind::Client),
        client: clients.watches.client(),
        initial,
        on_issued: Box::new(move |_, path| {
            let clients = reload.clone();
            let path = path.to_owned();
            Box::pin(async move { clients.reload(&path).await.map_err(|e| e.to_string()) })
        }),
    }
}
