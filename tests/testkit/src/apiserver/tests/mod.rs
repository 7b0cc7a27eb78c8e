//! Tests of TLS serving and authentication, the review APIs, CSRs and the
//! connections to kubelets, with kube-rs, the real kubectl and a test kubelet.

mod csr;
mod kubectl;
mod proxy;
mod reviews;
mod serving;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use hyper::body::Incoming;
use serde_json::json;
use tokio::sync::Notify;
use tower::ServiceExt as _;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::{ApiServer, Credentials, tls};
use crate::pki::Ca;

/// Long enough for two busy cores.
pub(super) const WAIT: Duration = Duration::from_secs(30);

pub(super) fn install_ring() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A kube client for the server's TLS address with `credentials`; the temporary
/// directory holds the kubeconfig.
pub(super) async fn tls_client(
    server: &ApiServer,
    credentials: &Credentials,
) -> anyhow::Result<(kube::Client, tempfile::TempDir)> {
    install_ring();
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("kubeconfig");
    server.write_kubeconfig_tls(&path, credentials)?;
    let kubeconfig = kube::config::Kubeconfig::read_from(&path)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    Ok((kube::Client::try_from(config)?, dir))
}

/// A client certificate from the server's CA, as credentials.
pub(super) fn cert_credentials(
    ca: &Ca,
    cn: &str,
    orgs: &[&str],
    validity: Duration,
) -> anyhow::Result<Credentials> {
    let (cert_pem, key_pem) = ca.issue_client(cn, orgs, validity)?;
    Ok(Credentials::ClientCert { cert_pem, key_pem })
}

/// The status code of an API error.
pub(super) fn api_status<T: std::fmt::Debug>(result: kube::Result<T>) -> kube::core::Status {
    match result {
        Err(kube::Error::Api(status)) => *status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// A GET of `path` through `client`, as text.
pub(super) async fn get_text(client: &kube::Client, path: &str) -> kube::Result<String> {
    let request = axum::http::Request::get(path)
        .body(Vec::new())
        .expect("a valid request");
    client.request_text(request).await
}

/// A Node named `name` whose kubelet listens on `addr`.
pub(super) fn node_at(server: &ApiServer, name: &str, addr: SocketAddr) -> anyhow::Result<()> {
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({
        "metadata": { "name": name },
        "status": {
            "addresses": [
                { "type": "Hostname", "address": name },
                { "type": "InternalIP", "address": addr.ip().to_string() },
            ],
            "daemonEndpoints": { "kubeletEndpoint": { "Port": addr.port() } },
        },
    }))?;
    server.create(&node)?;
    Ok(())
}

/// A pod with `containers` on `node`.
pub(super) fn pod_on(
    server: &ApiServer,
    name: &str,
    node: &str,
    containers: &[&str],
) -> anyhow::Result<()> {
    let containers: Vec<_> = containers
        .iter()
        .map(|c| json!({ "name": c, "image": "example/app:1" }))
        .collect();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": "default" },
        "spec": { "nodeName": node, "containers": containers },
    }))?;
    server.create(&pod)?;
    Ok(())
}

/// A stand-in kubelet: HTTPS with a certificate from `ca`, requiring client
/// certificates from `client_ca`. It echoes each request as JSON (method, path,
/// query, the client's CN, whether an Authorization header came through, body);
/// `/containerLogs/...?follow=true` streams `line 1`, waits for [`Self::gate`],
/// then `line 2`; `/status/{code}` answers that code with body `kubelet says {code}`;
/// logs of pod `missing` are 404 and of pod `broken` 500.
pub(super) struct TestKubelet {
    pub addr: SocketAddr,
    pub gate: Arc<Notify>,
}

#[derive(Clone)]
struct PeerCn(String);

#[derive(Clone)]
struct KubeletState {
    gate: Arc<Notify>,
}

impl TestKubelet {
    pub(super) async fn start(ca: &Ca, client_ca: &Ca) -> anyhow::Result<TestKubelet> {
        install_ring();
        let (cert, key) = ca.issue_server(&["127.0.0.1"], Duration::from_secs(3600))?;
        let provider = tls::provider();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(client_ca.der().to_vec().into())?;
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()?;
        use rustls::pki_types::pem::PemObject as _;
        let certs = rustls::pki_types::CertificateDer::pem_slice_iter(cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()?;
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes())?;
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs, key)?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let gate = Arc::new(Notify::new());
        let router = Router::new()
            .fallback(echo)
            .with_state(KubeletState { gate: gate.clone() });
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (acceptor, router) = (acceptor.clone(), router.clone());
                tokio::spawn(async move {
                    let Ok(stream) = acceptor.accept(stream).await else {
                        return;
                    };
                    let cn = stream
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .and_then(|c| {
                            let (_, cert) = X509Certificate::from_der(c).ok()?;
                            let cn = cert.subject().iter_common_name().next()?;
                            cn.as_str().ok().map(str::to_string)
                        })
                        .unwrap_or_default();
                    let service = router.map_request(move |mut req: Request<Incoming>| {
                        req.extensions_mut().insert(PeerCn(cn.clone()));
                        req
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(
                            hyper_util::rt::TokioIo::new(stream),
                            hyper_util::service::TowerToHyperService::new(service),
                        )
                        .await;
                });
            }
        });
        Ok(TestKubelet { addr, gate })
    }
}

async fn echo(State(state): State<KubeletState>, req: axum::extract::Request) -> Response {
    let cn = req
        .extensions()
        .get::<PeerCn>()
        .map(|c| c.0.clone())
        .unwrap_or_default();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    if path.starts_with("/containerLogs/default/missing/") {
        return (axum::http::StatusCode::NOT_FOUND, "container not found").into_response();
    }
    if path.starts_with("/containerLogs/default/broken/") {
        return (
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "kubelet says 500",
        )
            .into_response();
    }
    if let Some(code) = path.strip_prefix("/status/") {
        let code: u16 = code.parse().unwrap_or(500);
        let status = axum::http::StatusCode::from_u16(code).unwrap_or_default();
        return (status, format!("kubelet says {code}")).into_response();
    }
    if path.starts_with("/containerLogs/") && query.contains("follow=true") {
        let gate = state.gate.clone();
        let stream = futures::stream::unfold(0u8, move |step| {
            let gate = gate.clone();
            async move {
                match step {
                    0 => Some((Ok::<_, Infallible>(Bytes::from("line 1\n")), 1)),
                    1 => {
                        gate.notified().await;
                        Some((Ok(Bytes::from("line 2\n")), 2))
                    }
                    _ => None,
                }
            }
        });
        return Body::from_stream(stream).into_response();
    }
    let method = req.method().to_string();
    let authorization = req.headers().contains_key("authorization");
    let forwarded_uri = req
        .headers()
        .get("x-forwarded-uri")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = axum::body::to_bytes(req.into_body(), 1 << 20)
        .await
        .unwrap_or_default();
    axum::Json(json!({
        "method": method,
        "path": path,
        "query": query,
        "cn": cn,
        "authorization": authorization,
        "forwardedUri": forwarded_uri,
        "body": String::from_utf8_lossy(&body),
    }))
    .into_response()
}

/// A port nothing listens on.
pub(super) async fn closed_port() -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    drop(listener);
    Ok(addr)
}

/// Runs the real kubectl with `kubeconfig` (and a private cache and HOME under
/// `scratch`), failing after a minute: (exit success, stdout, stderr).
pub(super) async fn kubectl(
    kubeconfig: &Path,
    scratch: &Path,
    args: &[&str],
) -> anyhow::Result<(bool, String, String)> {
    let cache: PathBuf = scratch.join("kube-cache");
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new("/usr/bin/kubectl")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--cache-dir")
            .arg(&cache)
            .args(args)
            .env("HOME", scratch)
            .env_remove("KUBECONFIG")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .context("kubectl did not finish within a minute")?
    .context("running /usr/bin/kubectl")?;
    Ok((
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}
