//! The WebSocket side of the node's own streaming (for a runtime without a streaming
//! server, the Wasm runtime), as the kubelet's `wsstream` serves it: the handshake
//! with the sub-protocol the client offers first among the node's, then the
//! `channel.k8s.io` framing — each binary message is one channel byte and its
//! payload (exec: 0 stdin, 1 stdout, 2 stderr, 3 error, 4 resize; port-forward:
//! data `2i`, error `2i+1` for the `i`-th port, each opened with the port as two
//! little-endian bytes). Framing and the handshake's accept key are tungstenite's.

use std::sync::Arc;

use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use wasmlet_runtime::{Runtime, Streams};

use super::remotecommand::run_exec;
use super::text;

/// exec and attach, binary framing; v5 adds the close channel (255).
pub const EXEC_PROTOCOLS: &[&str] = &["v5.channel.k8s.io", "v4.channel.k8s.io"];
/// port-forward, binary framing.
pub const PORT_FORWARD_PROTOCOLS: &[&str] = &["v4.channel.k8s.io", "portforward.k8s.io"];

const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;

/// The upgraded connection.
pub type Socket = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// Whether the request asks for a WebSocket ([`super::is_websocket`]).
pub fn is_websocket(req: &Request) -> bool {
    super::is_websocket(req.headers())
}

/// The first sub-protocol the client offers (in its order, across its
/// `Sec-WebSocket-Protocol` headers) that `supported` has.
pub fn choose_protocol(req: &Request, supported: &[&str]) -> Option<String> {
    req.headers()
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .find(|p| supported.contains(p))
        .map(str::to_owned)
}

/// Accepts the WebSocket with one of `supported` and runs `serve` on it.
pub fn upgrade<F, Fut>(mut req: Request, supported: &[&str], serve: F) -> Response
where
    F: FnOnce(Socket, String) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let key = req
        .headers()
        .get(header::SEC_WEBSOCKET_KEY)
        .map(|k| derive_accept_key(k.as_bytes()));
    let version_ok = req
        .headers()
        .get(header::SEC_WEBSOCKET_VERSION)
        .is_some_and(|v| v == "13");
    let (Some(accept), true) = (key, version_ok) else {
        return text(
            StatusCode::BAD_REQUEST,
            "unable to upgrade: a WebSocket handshake needs Sec-WebSocket-Key and Sec-WebSocket-Version: 13",
        );
    };
    let Some(protocol) = choose_protocol(&req, supported) else {
        return text(
            StatusCode::BAD_REQUEST,
            format!(
                "unable to upgrade: the requested protocol(s) are not supported; supports {supported:?}"
            ),
        );
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    let chosen = protocol.clone();
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(io) => {
                let ws =
                    WebSocketStream::from_raw_socket(TokioIo::new(io), Role::Server, None).await;
                serve(ws, chosen).await;
            }
            Err(e) => tracing::debug!("a WebSocket upgrade did not complete: {e}"),
        }
    });
    let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let h = response.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    if let Ok(v) = HeaderValue::from_str(&accept) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    if let Ok(v) = HeaderValue::from_str(&protocol) {
        h.insert(header::SEC_WEBSOCKET_PROTOCOL, v);
    }
    response
}

fn framed(channel: u8, data: &[u8]) -> Message {
    let mut m = Vec::with_capacity(data.len() + 1);
    m.push(channel);
    m.extend_from_slice(data);
    Message::binary(m)
}

/// Serves one exec over the WebSocket: its output on stdout and stderr, its Status
/// on the error channel, then a close.
pub async fn serve_exec(
    mut ws: Socket,
    runtime: Arc<dyn Runtime>,
    id: String,
    command: Vec<String>,
    streams: Streams,
) {
    let out = run_exec(&runtime, &id, &command, streams).await;
    for (channel, data) in [(STDOUT, &out.stdout), (STDERR, &out.stderr)] {
        if !data.is_empty() && ws.send(framed(channel, data)).await.is_err() {
            return;
        }
    }
    let _ = ws
        .send(framed(ERROR, out.status.to_string().as_bytes()))
        .await;
    let _ = ws.close(None).await;
    // Read until the client's close answers ours.
    while let Some(Ok(m)) = ws.next().await {
        if m.is_close() {
            break;
        }
    }
}

/// Serves a WebSocket port-forward of `ports` on `host`: one TCP connection per port
/// for the session, relayed on its data channel; a failure on its error channel. The
/// session closes once every port's connection has ended.
pub async fn serve_port_forward(ws: Socket, host: std::net::IpAddr, ports: Vec<u16>, pod: String) {
    let (mut sink, mut source) = ws.split();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Message>(64);
    let writer = tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            if sink.send(m).await.is_err() {
                break;
            }
        }
        let _ = sink.close().await;
    });
    let mut to_pods = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let (data, error) = (2 * i as u8, 2 * i as u8 + 1);
        for channel in [data, error] {
            let _ = tx.send(framed(channel, &port.to_le_bytes())).await;
        }
        match tokio::net::TcpStream::connect((host, *port)).await {
            Ok(tcp) => {
                let (mut from_pod, to_pod) = tcp.into_split();
                to_pods.push(Some(to_pod));
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 32 * 1024];
                    while let Ok(n) = from_pod.read(&mut buf).await {
                        if n == 0 || tx.send(framed(data, &buf[..n])).await.is_err() {
                            break;
                        }
                    }
                });
            }
            Err(e) => {
                to_pods.push(None);
                let message = format!("error forwarding port {port} to pod {pod}: {e}");
                let _ = tx.send(framed(error, message.as_bytes())).await;
            }
        }
    }
    // Each pod connection's reader holds a sender: when the last has ended, the
    // writer closes the WebSocket, as the kubelet ends the session once every
    // port's forwarding is done.
    drop(tx);
    while let Some(Ok(m)) = source.next().await {
        let bytes = match m {
            Message::Binary(b) => b,
            Message::Close(_) => break,
            _ => continue,
        };
        let Some((&channel, payload)) = bytes.split_first() else {
            continue;
        };
        if channel % 2 != 0 || payload.is_empty() {
            continue;
        }
        if let Some(Some(to_pod)) = to_pods.get_mut(usize::from(channel / 2))
            && to_pod.write_all(payload).await.is_err()
        {
            to_pods[usize::from(channel / 2)] = None;
        }
    }
    let _ = writer.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(protocols: &[&str]) -> Request {
        let mut b = axum::http::Request::get("/exec/ns/p/c")
            .header(header::CONNECTION, "Upgrade")
            .header(header::UPGRADE, "websocket");
        for p in protocols {
            b = b.header(header::SEC_WEBSOCKET_PROTOCOL, *p);
        }
        b.body(axum::body::Body::empty()).unwrap()
    }

    #[test]
    fn the_clients_first_supported_protocol_is_chosen() {
        assert!(is_websocket(&req(&[])));
        let r = req(&["base64.channel.k8s.io, v4.channel.k8s.io, v5.channel.k8s.io"]);
        assert_eq!(
            choose_protocol(&r, EXEC_PROTOCOLS).as_deref(),
            Some("v4.channel.k8s.io")
        );
        let r = req(&["channel.k8s.io", "v5.channel.k8s.io"]);
        assert_eq!(
            choose_protocol(&r, EXEC_PROTOCOLS).as_deref(),
            Some("v5.channel.k8s.io")
        );
        assert_eq!(
            choose_protocol(&req(&["channel.k8s.io"]), EXEC_PROTOCOLS),
            None
        );
        assert_eq!(framed(3, b"x").into_data().as_ref(), b"\x03x");
    }
}
