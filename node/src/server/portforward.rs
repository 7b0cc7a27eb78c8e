//! `portForward` served by the node itself, for a runtime without a streaming server
//! (the Wasm runtime): the kubelet's SPDY port-forward (`portforward.k8s.io`). For each
//! connection the client forwards it opens an `error` and a `data` stream carrying the
//! same `requestid` and `port`; once both are there the node connects to the port on
//! the pod's network (`127.0.0.1` in a Wasm pod's network namespace, or the node's) and relays bytes both
//! ways, half-closes included. A port nothing listens on gets the kubelet's message on
//! the error stream, and the session goes on serving the other connections.

use std::collections::HashMap;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::spdy::{Session, Stream, header};

/// The port-forward sub-protocol over SPDY.
pub const PROTOCOLS: &[&str] = &["portforward.k8s.io"];

/// How long the second stream of a pair may take (the kubelet's stream creation
/// timeout).
const PAIR_TIMEOUT: Duration = Duration::from_secs(30);

/// The pod a session forwards to, for the kubelet's error messages.
#[derive(Clone, Debug)]
pub struct Target {
    pub pod: String,
    pub uid: String,
    /// Where the pod's ports are.
    pub ports: PodPorts,
}

/// How the node reaches a Wasm pod's ports: `127.0.0.1` inside the pod's network
/// namespace when it has one (as containerd dials for a container pod), else the
/// node's own `127.0.0.1` (the node's network).
#[derive(Clone, Debug, Default)]
pub struct PodPorts {
    pub netns: Option<std::path::PathBuf>,
}

/// How long a connection to a pod's port may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

impl PodPorts {
    pub async fn connect(&self, port: u16) -> std::io::Result<tokio::net::TcpStream> {
        let addr = std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port));
        match &self.netns {
            Some(netns) => {
                wasmlet_runtime_wasm::network::netns::connect(netns, addr, CONNECT_TIMEOUT).await
            }
            None => tokio::net::TcpStream::connect(addr).await,
        }
    }
}

/// Serves port-forward streams until the client ends the session.
pub async fn serve(mut session: Session, target: Target) {
    // requestid → the first stream of a pair and when it came.
    let mut pending: HashMap<String, (Stream, tokio::time::Instant)> = HashMap::new();
    while let Some(stream) = session.accept().await {
        pending.retain(|_, (_, at)| at.elapsed() < PAIR_TIMEOUT);
        let id = header(&stream.headers, "requestid")
            .map(str::to_owned)
            .unwrap_or_else(|| stream.id.to_string());
        let Some((first, _)) = pending.remove(&id) else {
            pending.insert(id, (stream, tokio::time::Instant::now()));
            continue;
        };
        let (error, data) = match header(&first.headers, "streamtype") {
            Some("error") => (first, stream),
            _ => (stream, first),
        };
        tokio::spawn(forward(error, data, target.clone()));
    }
}

/// One forwarded connection: `data` relayed to the pod's port, failures on `error`.
async fn forward(error: Stream, data: Stream, target: Target) {
    let port = header(&data.headers, "port").and_then(|p| p.parse::<u16>().ok());
    let Some(port) = port.filter(|p| *p > 0) else {
        let raw = header(&data.headers, "port").unwrap_or_default().to_owned();
        let message = format!("invalid port header {raw:?}");
        error.writer.write(message.as_bytes()).await;
        error.writer.close().await;
        data.writer.close().await;
        return;
    };
    let tcp = match target.ports.connect(port).await {
        Ok(t) => t,
        Err(e) => {
            let message = format!(
                "error forwarding port {port} to pod {}, uid {}: {e}",
                target.pod, target.uid
            );
            error.writer.write(message.as_bytes()).await;
            error.writer.close().await;
            data.writer.close().await;
            return;
        }
    };
    let (mut from_pod, mut to_pod) = tcp.into_split();
    let Stream {
        mut incoming,
        writer,
        ..
    } = data;
    let upstream = async move {
        while let Some(bytes) = incoming.recv().await {
            if to_pod.write_all(&bytes).await.is_err() {
                break;
            }
        }
        // The client half-closed: so does the connection to the pod.
        let _ = to_pod.shutdown().await;
    };
    let downstream = async {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            // A client that went away (or a session the idle timeout ended) ends the
            // connection to the pod too, even while the pod sends nothing.
            let n = tokio::select! {
                r = from_pod.read(&mut buf) => match r {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                },
                () = writer.closed() => break,
            };
            if !writer.write(&buf[..n]).await {
                break;
            }
        }
        writer.close().await;
    };
    tokio::join!(upstream, downstream);
    error.writer.close().await;
}
