//! The WebSocket side of the node's own streaming (for a runtime without a streaming
//! server, the Wasm runtime), as the kubelet's `wsstream` serves it: the handshake
//! with the sub-protocol the client offers first among the node's, then the
//! `channel.k8s.io` framing — each binary message is one channel byte and its
//! payload (exec: 0 stdin, 1 stdout, 2 stderr, 3 error, 4 resize; port-forward:
//! data `2i`, error `2i+1` for the `i`-th port, each opened with the port as two
//! little-endian bytes). Framing and the handshake's accept key are tungstenite's.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use futures::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use wasmlet_runtime::{Runtime, StdioSession, Streams};

use super::idle::Idle;
use super::remotecommand::{Target, copy_out, final_status, internal_error, open};
use super::text;

/// exec and attach: binary framing (v5 adds the close channel, 255) or base64.
pub const EXEC_PROTOCOLS: &[&str] = &[
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v4.base64.channel.k8s.io",
];
/// port-forward: binary framing or base64.
pub const PORT_FORWARD_PROTOCOLS: &[&str] = &[
    "v4.channel.k8s.io",
    "v4.base64.channel.k8s.io",
    "portforward.k8s.io",
];
/// port-forward's SPDY tunnelled in the WebSocket (KEP-4006, client-go's
/// `TunnelingConnection`): every binary message carries SPDY bytes, no channel byte.
pub const SPDY_TUNNEL_PROTOCOL: &str = "SPDY/3.1+portforward.k8s.io";
/// Every port-forward sub-protocol a WebSocket client may offer.
pub const PORT_FORWARD_OFFERS: &[&str] = &[
    SPDY_TUNNEL_PROTOCOL,
    "v4.channel.k8s.io",
    "v4.base64.channel.k8s.io",
    "portforward.k8s.io",
];

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
/// v5: `[255, channel]` closes the client's side of `channel`.
const CLOSE: u8 = 255;

/// The upgraded connection.
pub type Socket = WebSocketStream<Idle<TokioIo<hyper::upgrade::Upgraded>>>;

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

/// The handshake's answer to `req` with one of `supported`: the accept key and the
/// sub-protocol chosen; else why not (a 400, [`refuse`]).
pub fn handshake(req: &Request, supported: &[&str]) -> Result<(String, String), String> {
    let key = req
        .headers()
        .get(header::SEC_WEBSOCKET_KEY)
        .map(|k| derive_accept_key(k.as_bytes()));
    let version_ok = req
        .headers()
        .get(header::SEC_WEBSOCKET_VERSION)
        .is_some_and(|v| v == "13");
    let (Some(accept), true) = (key, version_ok) else {
        return Err(
            "unable to upgrade: a WebSocket handshake needs Sec-WebSocket-Key and Sec-WebSocket-Version: 13"
                .into(),
        );
    };
    let Some(protocol) = choose_protocol(req, supported) else {
        return Err(format!(
            "unable to upgrade: the requested protocol(s) are not supported; supports {supported:?}"
        ));
    };
    Ok((accept, protocol))
}

/// The 400 for a handshake that failed.
pub fn refuse(why: String) -> Response {
    text(StatusCode::BAD_REQUEST, why)
}

/// The 101 that completes a handshake.
pub fn switching_protocols(accept: &str, protocol: &str) -> Response {
    let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let h = response.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    if let Ok(v) = HeaderValue::from_str(accept) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    if let Ok(v) = HeaderValue::from_str(protocol) {
        h.insert(header::SEC_WEBSOCKET_PROTOCOL, v);
    }
    response
}

/// Accepts the WebSocket with one of `supported` and runs `serve` on it; the
/// connection fails once it has been idle for `idle`.
pub fn upgrade<F, Fut>(mut req: Request, supported: &[&str], idle: Duration, serve: F) -> Response
where
    F: FnOnce(Socket, String) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (accept, protocol) = match handshake(&req, supported) {
        Ok(h) => h,
        Err(why) => return refuse(why),
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    let chosen = protocol.clone();
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(io) => {
                let io = Idle::new(TokioIo::new(io), idle);
                let ws = WebSocketStream::from_raw_socket(io, Role::Server, None).await;
                serve(ws, chosen).await;
            }
            Err(e) => tracing::debug!("a WebSocket upgrade did not complete: {e}"),
        }
    });
    switching_protocols(&accept, &protocol)
}

/// The bytes a tunnelling WebSocket carries ([`SPDY_TUNNEL_PROTOCOL`]), as a byte
/// stream: each binary message the client sends is read in order, each write goes
/// out as one binary message. The stream ends when the client closes; closing (or
/// dropping) the returned end closes the WebSocket.
pub fn tunnel<S>(ws: WebSocketStream<S>) -> tokio::io::DuplexStream
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    const BUFFER: usize = 64 * 1024;
    let (ours, theirs) = tokio::io::duplex(BUFFER);
    tokio::spawn(async move {
        let (mut sink, mut source) = ws.split();
        let (mut from_peer, mut to_peer) = tokio::io::split(ours);
        let inbound = async {
            while let Some(Ok(m)) = source.next().await {
                let Message::Binary(b) = m else {
                    if m.is_close() {
                        break;
                    }
                    continue;
                };
                if to_peer.write_all(&b).await.is_err() {
                    break;
                }
            }
            let _ = to_peer.shutdown().await;
        };
        let outbound = async {
            let mut buf = vec![0u8; BUFFER];
            loop {
                match from_peer.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if sink.send(Message::binary(buf[..n].to_vec())).await.is_err() {
                            break;
                        }
                    }
                }
            }
            let _ = sink.close().await;
        };
        tokio::pin!(inbound, outbound);
        tokio::select! {
            // The client closed: the peer sees the end and ends its side too.
            () = &mut inbound => outbound.await,
            // The peer ended: the client has a while to answer the close.
            () = &mut outbound => {
                let _ = tokio::time::timeout(CLOSE_TIMEOUT, inbound).await;
            }
        }
    });
    theirs
}

/// How a sub-protocol frames a channel's bytes (wsstream's `Binary`): a binary
/// message of the channel byte and the bytes, or (`*.base64.channel.k8s.io`) a text
/// message of the channel as an ASCII digit and the bytes in standard base64.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    Binary,
    Base64,
}

/// The client closed the WebSocket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Closed;

impl Framing {
    pub fn of(protocol: &str) -> Framing {
        if protocol.contains(".base64.") {
            Framing::Base64
        } else {
            Framing::Binary
        }
    }

    fn message(self, channel: u8, data: &[u8]) -> Message {
        match self {
            Framing::Binary => {
                let mut m = Vec::with_capacity(data.len() + 1);
                m.push(channel);
                m.extend_from_slice(data);
                Message::binary(m)
            }
            Framing::Base64 => {
                let mut m = String::with_capacity(data.len() * 4 / 3 + 5);
                m.push(char::from(b'0' + channel));
                BASE64.encode_string(data, &mut m);
                Message::text(m)
            }
        }
    }

    /// The channel and bytes of a message the client sent; `None` for a message
    /// that carries none (a ping, a malformed frame), [`Closed`] once it closed.
    pub fn read(self, m: Message) -> Result<Option<(u8, Vec<u8>)>, Closed> {
        match (self, m) {
            (_, Message::Close(_)) => Err(Closed),
            (Framing::Binary, Message::Binary(b)) => {
                Ok(b.split_first().map(|(c, rest)| (*c, rest.to_vec())))
            }
            (Framing::Base64, Message::Text(t)) => {
                let t = t.as_bytes();
                let Some((c, rest)) = t.split_first() else {
                    return Ok(None);
                };
                let channel = c.wrapping_sub(b'0');
                Ok(BASE64.decode(rest).ok().map(|data| (channel, data)))
            }
            _ => Ok(None),
        }
    }
}

/// Serves one exec or attach over the WebSocket: the runtime's stdio session relayed
/// live on the channels (stdin 0, stdout 1, stderr 2; resizes on 4 are dropped, and
/// with v5 a close of channel 0 on 255 half-closes the process's stdin), then its
/// Status on the error channel and a close. A client that goes away drops the
/// runtime's session, which ends the exec (or detaches).
pub async fn serve_stdio(
    ws: Socket,
    framing: Framing,
    runtime: Arc<dyn Runtime>,
    id: String,
    target: Target,
    streams: Streams,
) {
    let (mut sink, mut source) = ws.split();
    let stdio = match open(&runtime, &id, &target, streams).await {
        Ok(s) => s,
        Err(e) => {
            let status = internal_error(&e.to_string());
            let _ = sink
                .send(framing.message(ERROR, status.to_string().as_bytes()))
                .await;
            let _ = sink.close().await;
            return;
        }
    };
    let StdioSession {
        stdin,
        stdout,
        stderr,
        exit,
    } = stdio;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Message>(64);
    let writer = async {
        while let Some(m) = rx.recv().await {
            if sink.send(m).await.is_err() {
                return false;
            }
        }
        true
    };
    let input = async {
        let mut stdin = stdin;
        while let Some(Ok(m)) = source.next().await {
            let Ok(message) = framing.read(m) else { break };
            match message {
                Some((STDIN, data)) => {
                    if let Some(w) = stdin.as_mut()
                        && w.write_all(&data).await.is_err()
                    {
                        stdin = None;
                    }
                }
                Some((CLOSE, data)) if data == [STDIN] => {
                    if let Some(mut w) = stdin.take() {
                        let _ = w.shutdown().await;
                    }
                }
                _ => {}
            }
        }
    };
    let done = async {
        let out = copy_out(stdout, |b| {
            let tx = tx.clone();
            async move { tx.send(framing.message(STDOUT, &b)).await.is_ok() }
        });
        let err = copy_out(stderr, |b| {
            let tx = tx.clone();
            async move { tx.send(framing.message(STDERR, &b)).await.is_ok() }
        });
        let ((), (), outcome) = tokio::join!(out, err, exit);
        let status = final_status(&target, outcome);
        let _ = tx
            .send(framing.message(ERROR, status.to_string().as_bytes()))
            .await;
        drop(tx);
    };
    let relayed = async {
        let ((), delivered) = tokio::join!(done, writer);
        delivered
    };
    let delivered = tokio::select! {
        delivered = relayed => delivered,
        () = input => false,
    };
    if !delivered {
        tracing::debug!(container = %id, "websocket: the client went away");
        return;
    }
    let _ = sink.close().await;
    // Read until the client's close answers ours, for a while.
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, async {
        while let Some(Ok(m)) = source.next().await {
            if m.is_close() {
                break;
            }
        }
    })
    .await;
}

/// How long the node waits for a client to answer its close.
const CLOSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Serves a WebSocket port-forward of `ports` of a pod: one TCP connection per port
/// for the session, relayed on its data channel; a failure on its error channel. The
/// session closes once every port's connection has ended.
pub async fn serve_port_forward(
    ws: Socket,
    framing: Framing,
    pod_ports: super::portforward::PodPorts,
    ports: Vec<u16>,
    pod: String,
) {
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
            let _ = tx.send(framing.message(channel, &port.to_le_bytes())).await;
        }
        match pod_ports.connect(*port).await {
            Ok(tcp) => {
                let (mut from_pod, to_pod) = tcp.into_split();
                to_pods.push(Some(to_pod));
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 32 * 1024];
                    while let Ok(n) = from_pod.read(&mut buf).await {
                        if n == 0 || tx.send(framing.message(data, &buf[..n])).await.is_err() {
                            break;
                        }
                    }
                });
            }
            Err(e) => {
                to_pods.push(None);
                let message = format!("error forwarding port {port} to pod {pod}: {e}");
                let _ = tx.send(framing.message(error, message.as_bytes())).await;
            }
        }
    }
    // Each pod connection's reader holds a sender: when the last has ended, the
    // writer closes the WebSocket, as the kubelet ends the session once every
    // port's forwarding is done.
    drop(tx);
    while let Some(Ok(m)) = source.next().await {
        let Ok(message) = framing.read(m) else { break };
        let Some((channel, payload)) = message else {
            continue;
        };
        if channel % 2 != 0 || payload.is_empty() {
            continue;
        }
        if let Some(Some(to_pod)) = to_pods.get_mut(usize::from(channel / 2))
            && to_pod.write_all(&payload).await.is_err()
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
        let r = req(&["v4.base64.channel.k8s.io"]);
        assert_eq!(
            choose_protocol(&r, EXEC_PROTOCOLS).as_deref(),
            Some("v4.base64.channel.k8s.io")
        );
    }

    #[test]
    fn channels_are_framed_as_the_protocol_says() {
        let binary = Framing::of("v5.channel.k8s.io");
        assert_eq!(binary, Framing::Binary);
        let m = binary.message(3, b"x");
        assert_eq!(m.clone().into_data().as_ref(), b"\x03x");
        assert_eq!(binary.read(m), Ok(Some((3, b"x".to_vec()))));

        let base64 = Framing::of("v4.base64.channel.k8s.io");
        assert_eq!(base64, Framing::Base64);
        let m = base64.message(1, b"out\n");
        assert_eq!(m.to_text().unwrap(), "1b3V0Cg==");
        assert_eq!(
            base64.read(Message::text("0aGk=")),
            Ok(Some((0, b"hi".to_vec())))
        );
        // A binary message on a base64 protocol carries nothing; a close ends.
        assert_eq!(base64.read(Message::binary(b"\x00hi".to_vec())), Ok(None));
        assert_eq!(base64.read(Message::text("0not base64!")), Ok(None));
        assert_eq!(binary.read(Message::Close(None)), Err(Closed));
    }
}
