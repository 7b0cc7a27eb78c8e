//! The node API's listener: TLS accepted here, each connection served by hyper's
//! HTTP/1 with the kubelet server's limits, the client's verified certificate handed
//! to the router's authentication as a request extension.
//!
//! Limits, so that slow or idle clients cannot exhaust the node (the kubelet's
//! `http.Server` has `MaxHeaderBytes` 1 MiB, `ReadTimeout`/`WriteTimeout` 4 h for
//! its streams, `IdleTimeout` 90 s):
//! - at most [`Limits::max_connections`] connections at once; one more is closed at
//!   once rather than queued;
//! - the TLS handshake must finish within [`Limits::handshake_timeout`];
//! - a request's headers must arrive within [`Limits::header_read_timeout`] (between
//!   requests too: an idle keep-alive connection is closed after it), and fit in
//!   [`Limits::max_header_bytes`].
//!
//! A long response (a followed log) is not cut by a timeout: it ends when its client
//! goes away or the node stops.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use super::auth::{ClientCertificate, RejectedCertificate};
use super::tls::{ClientCa, ServerTls};

/// Per-connection limits of the node API.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_connections: usize,
    pub handshake_timeout: Duration,
    pub header_read_timeout: Duration,
    pub max_header_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 1024,
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(90),
            max_header_bytes: 1 << 20,
        }
    }
}

/// The address the connection came from, for the handlers and logs.
#[derive(Clone, Copy, Debug)]
pub struct RemoteAddr(pub SocketAddr);

/// Binds `addr` and serves `router` over TLS until cancelled. A bind error is
/// returned at once; the returned task ends when the server has stopped (open
/// connections are closed with it).
pub async fn serve(
    addr: SocketAddr,
    router: Router,
    tls: Arc<ServerTls>,
    limits: Limits,
    cancel: CancellationToken,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))?;
    Ok(tokio::spawn(accept_loop(
        listener, router, tls, limits, cancel,
    )))
}

/// [`serve`] on a listener already bound (tests bind port 0).
pub async fn serve_on(
    listener: TcpListener,
    router: Router,
    tls: Arc<ServerTls>,
    limits: Limits,
    cancel: CancellationToken,
) {
    accept_loop(listener, router, tls, limits, cancel).await
}

async fn accept_loop(
    listener: TcpListener,
    router: Router,
    tls: Arc<ServerTls>,
    limits: Limits,
    cancel: CancellationToken,
) {
    let acceptor = TlsAcceptor::from(tls.config.clone());
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let (tcp, remote) = tokio::select! {
            () = cancel.cancelled() => break,
            // Reap finished connections as they end, so the set stays small.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // EMFILE and the like: say so, and let the moment pass.
                    tracing::warn!("node API: accepting a connection: {e}");
                    tokio::select! {
                        () = cancel.cancelled() => break,
                        () = tokio::time::sleep(Duration::from_millis(100)) => continue,
                    }
                }
            },
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tracing::warn!(%remote, "node API: {} connections open; closing a new one", limits.max_connections);
            drop(tcp);
            continue;
        };
        let (acceptor, router, cancel) = (acceptor.clone(), router.clone(), cancel.clone());
        let client_ca = tls.client_ca.clone();
        connections.spawn(async move {
            let _permit = permit;
            serve_connection(tcp, remote, acceptor, client_ca, router, limits, cancel).await;
        });
    }
    // Stopping: every connection goes with the server.
    connections.shutdown().await;
}

async fn serve_connection(
    tcp: tokio::net::TcpStream,
    remote: SocketAddr,
    acceptor: TlsAcceptor,
    client_ca: Option<Arc<ClientCa>>,
    router: Router,
    limits: Limits,
    cancel: CancellationToken,
) {
    let _ = tcp.set_nodelay(true);
    let tls = match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::debug!(%remote, "node API: TLS handshake failed: {e}");
            return;
        }
        Err(_) => {
            tracing::debug!(%remote, "node API: TLS handshake timed out");
            return;
        }
    };
    // The handshake checked only that the client holds the key: the chain is
    // verified against clientCAFile here, once per connection.
    let cert = match (tls.get_ref().1.peer_certificates(), &client_ca) {
        (Some(chain), Some(ca)) if !chain.is_empty() => Some(match ca.verify(chain) {
            Ok(()) => Ok(ClientCertificate(chain[0].as_ref().to_vec())),
            Err(e) => {
                tracing::debug!(%remote, "node API: a client certificate does not verify: {e}");
                Err(RejectedCertificate(e))
            }
        }),
        _ => None,
    };
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        match &cert {
            Some(Ok(cert)) => {
                req.extensions_mut().insert(cert.clone());
            }
            Some(Err(rejected)) => {
                req.extensions_mut().insert(rejected.clone());
            }
            None => {}
        }
        req.extensions_mut().insert(RemoteAddr(remote));
        router.clone().oneshot(req.map(axum::body::Body::new))
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_bytes.max(8192));
    let conn = http
        .serve_connection(TokioIo::new(tls), service)
        .with_upgrades();
    tokio::pin!(conn);
    tokio::select! {
        served = conn.as_mut() => {
            if let Err(e) = served {
                tracing::debug!(%remote, "node API connection: {e}");
            }
        }
        () = cancel.cancelled() => {
            conn.as_mut().graceful_shutdown();
            // A stream in flight (a followed log) ends with the node.
            let _ = tokio::time::timeout(Duration::from_secs(1), conn).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TlsSettings;
    use crate::server::tls::{CertSlot, server_config, serving_pair};
    use axum::routing::get;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// A CA-signed client certificate, and the CA file, made with rcgen.
    fn client_ca(dir: &std::path::Path, cn: &str) -> (std::path::PathBuf, String, String) {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.distinguished_name.push(DnType::CommonName, "test-ca");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let ca_file = dir.join("ca.crt");
        std::fs::write(&ca_file, ca_cert.pem()).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let mut leaf = CertificateParams::new(Vec::<String>::new()).unwrap();
        leaf.distinguished_name.push(DnType::CommonName, cn);
        leaf.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = leaf.signed_by(&key, &issuer).unwrap();
        (ca_file, cert.pem(), key.serialize_pem())
    }

    struct Served {
        addr: SocketAddr,
        server_chain: Vec<rustls::pki_types::CertificateDer<'static>>,
        cancel: CancellationToken,
        task: tokio::task::JoinHandle<()>,
    }

    async fn start(settings: &TlsSettings, limits: Limits) -> Served {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let pair = serving_pair(settings, "edge-1", &[]).unwrap();
        let slot = CertSlot::new(pair).unwrap();
        let server_chain = slot.chain();
        let config = Arc::new(server_config(settings, slot).unwrap());
        let router = Router::new().route(
            "/whoami",
            get(|req: axum::extract::Request| async move {
                if let Some(rejected) = req.extensions().get::<RejectedCertificate>() {
                    return format!("rejected: {}", rejected.0);
                }
                match req.extensions().get::<ClientCertificate>() {
                    Some(c) => {
                        let user = crate::server::auth::user_from_certificate(&c.0).unwrap();
                        user.name
                    }
                    None => "no certificate".to_owned(),
                }
            }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(serve_on(listener, router, config, limits, cancel.clone()));
        Served {
            addr,
            server_chain,
            cancel,
            task,
        }
    }

    /// A client trusting the node's self-signed CA, with an optional client identity.
    fn client_config(served: &Served, identity: Option<(&str, &str)>) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(served.server_chain[1].clone()).unwrap();
        let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
        Arc::new(match identity {
            Some((cert, key)) => {
                use rustls::pki_types::pem::PemObject;
                let chain = rustls::pki_types::CertificateDer::pem_slice_iter(cert.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .unwrap();
                let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
                builder.with_client_auth_cert(chain, key).unwrap()
            }
            None => builder.with_no_client_auth(),
        })
    }

    /// `GET path` over one TLS connection; the response's raw text.
    async fn get_text(
        served: &Served,
        config: Arc<rustls::ClientConfig>,
        path: &str,
    ) -> std::io::Result<String> {
        let tcp = tokio::net::TcpStream::connect(served.addr).await?;
        let name = rustls::pki_types::ServerName::try_from("edge-1").unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await?;
        tls.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: edge-1\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
        let mut out = String::new();
        tls.read_to_string(&mut out).await?;
        Ok(out)
    }

    #[tokio::test]
    async fn serves_over_tls_and_hands_the_verified_client_certificate_on() {
        let dir = tempfile::tempdir().unwrap();
        let (ca_file, cert, key) = client_ca(dir.path(), "system:node:edge-2");
        let settings = TlsSettings {
            cert_dir: dir.path().join("certs"),
            client_ca_file: Some(ca_file),
            ..TlsSettings::default()
        };
        let served = start(&settings, Limits::default()).await;

        let with_cert = get_text(
            &served,
            client_config(&served, Some((&cert, &key))),
            "/whoami",
        )
        .await
        .unwrap();
        assert!(with_cert.starts_with("HTTP/1.1 200"), "{with_cert}");
        assert!(with_cert.ends_with("system:node:edge-2"), "{with_cert}");

        let without = get_text(&served, client_config(&served, None), "/whoami")
            .await
            .unwrap();
        assert!(without.ends_with("no certificate"), "{without}");

        // A certificate from another CA is not the handshake's failure: the request
        // arrives, marked, for authentication to refuse.
        let other = tempfile::tempdir().unwrap();
        let (_, cert, key) = client_ca(other.path(), "intruder");
        let rejected = get_text(
            &served,
            client_config(&served, Some((&cert, &key))),
            "/whoami",
        )
        .await
        .unwrap();
        assert!(rejected.contains("rejected: "), "{rejected}");
        assert!(!rejected.contains("intruder"), "{rejected}");

        served.cancel.cancel();
        tokio::time::timeout(Duration::from_secs(5), served.task)
            .await
            .expect("the server stops when cancelled")
            .unwrap();
    }

    #[tokio::test]
    async fn plain_http_and_stalled_handshakes_do_not_hold_a_connection() {
        let dir = tempfile::tempdir().unwrap();
        let settings = TlsSettings {
            cert_dir: dir.path().to_owned(),
            ..TlsSettings::default()
        };
        let limits = Limits {
            max_connections: 1,
            handshake_timeout: Duration::from_millis(300),
            ..Limits::default()
        };
        let served = start(&settings, limits).await;
        // A client that connects and says nothing holds the only slot...
        let mut stalled = tokio::net::TcpStream::connect(served.addr).await.unwrap();
        // ...until its handshake times out and the server closes it.
        let mut buf = [0u8; 16];
        let n = tokio::time::timeout(Duration::from_secs(5), stalled.read(&mut buf))
            .await
            .expect("the stalled connection is closed")
            .unwrap_or(0);
        assert_eq!(n, 0);
        // Plain HTTP on the TLS port is not served.
        let mut plain = tokio::net::TcpStream::connect(served.addr).await.unwrap();
        plain
            .write_all(b"GET /whoami HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut out)).await;
        assert!(!String::from_utf8_lossy(&out).contains("no certificate"));
        drop(plain);
        // The slot is free again: a TLS client is served.
        let ok = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if let Ok(t) = get_text(&served, client_config(&served, None), "/whoami").await
                    && t.starts_with("HTTP/1.1 200")
                {
                    return t;
                }
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("a slot frees up");
        assert!(ok.ends_with("no certificate"));
        served.cancel.cancel();
    }
}
