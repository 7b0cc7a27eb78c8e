//! Serving over TCP (plain or TLS), with a listener that a fault can close and reopen on the same
//! port, and connections that a fault drops.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use rustls::server::danger::ClientCertVerifier;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tower::ServiceExt as _;

use super::auth::Connection;
use super::lock;

/// One TCP listening address. Closing drops the socket at once, so new connections
/// are refused; reopening binds the same address again.
pub(crate) struct ListenerSlot {
    addr: SocketAddr,
    state: Mutex<SlotState>,
}

struct SlotState {
    listener: Listening,
    /// The accept loop, parked while closed.
    waker: Option<Waker>,
}

enum Listening {
    /// Bound (so the kernel queues connections) but not yet adopted by the runtime.
    Bound(std::net::TcpListener),
    Serving(tokio::net::TcpListener),
    Closed,
}

fn bind(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    // std sets SO_REUSEADDR on Unix, so the port can be bound again while old
    // connections linger in TIME_WAIT.
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

impl ListenerSlot {
    /// Binds `addr` (port 0 picks a free port).
    pub(crate) fn bind(addr: SocketAddr) -> io::Result<Arc<ListenerSlot>> {
        let listener = bind(addr)?;
        let addr = listener.local_addr()?;
        Ok(Arc::new(ListenerSlot {
            addr,
            state: Mutex::new(SlotState {
                listener: Listening::Bound(listener),
                waker: None,
            }),
        }))
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops listening now: connection attempts are refused.
    pub(crate) fn close(&self) {
        let mut state = lock(&self.state);
        state.listener = Listening::Closed;
        if let Some(waker) = state.waker.take() {
            waker.wake();
        }
    }

    /// Listens again on the same address, if closed.
    pub(crate) fn reopen(&self) {
        let mut state = lock(&self.state);
        if !matches!(state.listener, Listening::Closed) {
            return;
        }
        match bind(self.addr) {
            Ok(listener) => state.listener = Listening::Bound(listener),
            Err(err) => {
                tracing::warn!(addr = %self.addr, "test apiserver cannot listen again: {err}")
            }
        }
        if let Some(waker) = state.waker.take() {
            waker.wake();
        }
    }

    fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(TcpStream, SocketAddr)>> {
        let mut state = lock(&self.state);
        if matches!(state.listener, Listening::Bound(_)) {
            let Listening::Bound(listener) =
                std::mem::replace(&mut state.listener, Listening::Closed)
            else {
                return Poll::Pending;
            };
            match tokio::net::TcpListener::from_std(listener) {
                Ok(listener) => state.listener = Listening::Serving(listener),
                Err(err) => return Poll::Ready(Err(err)),
            }
        }
        state.waker = Some(cx.waker().clone());
        match &state.listener {
            Listening::Serving(listener) => listener.poll_accept(cx),
            Listening::Bound(_) | Listening::Closed => Poll::Pending,
        }
    }
}

/// How a listener talks: plain HTTP, or TLS with per-request client certificates.
#[derive(Clone)]
pub(crate) enum Transport {
    Plain,
    Tls {
        acceptor: tokio_rustls::TlsAcceptor,
        verifier: Arc<dyn ClientCertVerifier>,
    },
}

/// Accepts connections on `slot` for as long as the runtime runs.
pub(crate) async fn accept_loop(
    slot: Arc<ListenerSlot>,
    router: Router,
    down: watch::Receiver<bool>,
    transport: Transport,
) {
    loop {
        match std::future::poll_fn(|cx| slot.poll_accept(cx)).await {
            Ok((stream, peer)) => match &transport {
                Transport::Plain => {
                    let connection = Connection {
                        peer,
                        tls: false,
                        peer_certs: None,
                        verifier: None,
                    };
                    tokio::spawn(serve_connection(
                        stream,
                        router.clone(),
                        connection,
                        down.clone(),
                    ));
                }
                Transport::Tls { acceptor, verifier } => {
                    let (acceptor, verifier) = (acceptor.clone(), verifier.clone());
                    let (router, down) = (router.clone(), down.clone());
                    tokio::spawn(async move {
                        // No handshake timeout: it would fire under a paused clock.
                        let stream = match acceptor.accept(stream).await {
                            Ok(stream) => stream,
                            Err(err) => {
                                tracing::debug!("test apiserver: TLS handshake failed: {err}");
                                return;
                            }
                        };
                        let peer_certs = stream
                            .get_ref()
                            .1
                            .peer_certificates()
                            .filter(|certs| !certs.is_empty())
                            .map(|certs| {
                                certs
                                    .iter()
                                    .map(|c| c.clone().into_owned())
                                    .collect::<Vec<_>>()
                                    .into()
                            });
                        let connection = Connection {
                            peer,
                            tls: true,
                            peer_certs,
                            verifier: Some(verifier),
                        };
                        serve_connection(stream, router, connection, down).await;
                    });
                }
            },
            Err(err) => {
                tracing::warn!(addr = %slot.addr(), "test apiserver accept failed: {err}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Serves HTTP/1 on one connection until it ends or the server goes down, which
/// drops the connection (and any watch on it) without a response. Every request
/// carries the [`Connection`].
async fn serve_connection<T>(
    io: T,
    router: Router,
    connection: Connection,
    mut down: watch::Receiver<bool>,
) where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = router.map_request(move |mut req: axum::http::Request<Incoming>| {
        req.extensions_mut().insert(connection.clone());
        req
    });
    let service = hyper_util::service::TowerToHyperService::new(service);
    let connection = hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(io), service)
        .with_upgrades();
    let went_down = async move {
        if down.wait_for(|down| *down).await.is_err() {
            // The server is gone; the connection lives until the peer ends it.
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        biased;
        () = went_down => {}
        result = connection => {
            if let Err(err) = result {
                tracing::debug!("test apiserver connection ended: {err}");
            }
        }
    }
}
