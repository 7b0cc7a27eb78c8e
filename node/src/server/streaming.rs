//! `/exec`, `/attach`, `/portForward` and `/run` (and their uid-qualified forms), as the
//! kubelet serves them for CRI runtimes: the pod and container are found, the runtime
//! is asked (CRI `Exec`, `Attach`, `PortForward`) for a URL of its own streaming
//! server, and the client's connection is proxied there with its upgrade
//! (`proxyStream`, the kubelet's default without `--redirect-container-streaming`).
//! The runtime's server speaks the protocols (SPDY/3.1 or WebSocket with the
//! `channel.k8s.io` sub-protocols); the node only relays bytes once both sides have
//! switched protocols.
//!
//! Authorization (`nodes/proxy`) runs before any of this, so an unauthorized request
//! is refused before an upgrade. A runtime without a streaming server (the Wasm
//! runtime) has its exec served by the node itself ([`super::remotecommand`]);
//! (and [`super::portforward`]); its attach is refused with a 500 naming the
//! runtime.
//!
//! Status codes are the kubelet's: a malformed stream selection 400; no such pod 404
//! (`pod does not exist`); a container that is not running 500 (`container not found
//! ("c")`); a runtime's NotFound 404, any other runtime error 500; a request without an
//! upgrade 500 `Upgrade request required` (the kubelet's upgrade-aware proxy answers
//! its errors with 500).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use wasmlet_runtime::{Error as RuntimeError, Runtime, SandboxState, Streams};

use super::remotecommand::Target;
use super::spdy::Session;
use super::{portforward, remotecommand, text, websocket};
use crate::router::RuntimeRouter;
use crate::status::StatusStore;

/// What the streaming endpoints read: the node's pods and the runtimes (taken from
/// the node API's state by `FromRef`).
#[derive(Clone)]
pub struct StreamingState {
    pub statuses: StatusStore,
    pub router: RuntimeRouter,
    /// `streamingConnectionIdleTimeout`, for the streams the node serves itself.
    pub idle_timeout: std::time::Duration,
}

/// The kubelet's `remotecommand.NewOptions`: `input`, `output`, `error` and `tty`
/// are on when they are `1`; with a TTY stderr is merged into stdout.
pub fn streams_of(query: &str) -> Result<Streams, String> {
    let on = |key: &str| first(query, key).as_deref() == Some("1");
    let tty = on("tty");
    let streams = Streams {
        stdin: on("input"),
        stdout: on("output"),
        stderr: on("error") && !tty,
        tty,
    };
    if !(streams.stdin || streams.stdout || streams.stderr) {
        return Err("you must specify at least 1 of stdin, stdout, stderr".into());
    }
    Ok(streams)
}

/// Every value of `key` in the query, decoded as Go's `URL.Query()` does.
pub fn values(query: &str, key: &str) -> Vec<String> {
    super::logs::query_pairs(query)
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v)
        .collect()
}

fn first(query: &str, key: &str) -> Option<String> {
    values(query, key).into_iter().next()
}

/// Why a stream cannot be set up: the status and the text the client gets.
struct Refusal(StatusCode, String);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        text(self.0, self.1)
    }
}

/// The pod named so among the node's pods, checked against `uid` when given.
fn find_pod(
    state: &StreamingState,
    namespace: &str,
    name: &str,
    uid: Option<&str>,
) -> Result<Pod, Refusal> {
    let pod = state.statuses.pods().into_iter().find(|p| {
        p.metadata.namespace.as_deref() == Some(namespace)
            && p.metadata.name.as_deref() == Some(name)
    });
    match pod {
        None => Err(Refusal(StatusCode::NOT_FOUND, "pod does not exist".into())),
        Some(p) if uid.is_some_and(|u| p.metadata.uid.as_deref() != Some(u)) => {
            Err(Refusal(StatusCode::NOT_FOUND, "pod not found".into()))
        }
        Some(p) => Ok(p),
    }
}

/// The running instance of `container` and the runtime that runs it.
async fn running_container(
    state: &StreamingState,
    pod: &Pod,
    container: &str,
) -> Result<(Arc<dyn Runtime>, String), Refusal> {
    let not_found = || {
        Refusal(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("container not found ({container:?})"),
        )
    };
    let id = pod
        .status
        .iter()
        .flat_map(|s| {
            let all = s.container_statuses.iter().flatten();
            all.chain(s.init_container_statuses.iter().flatten())
                .chain(s.ephemeral_container_statuses.iter().flatten())
        })
        .find(|cs| cs.name == container)
        .filter(|cs| cs.state.as_ref().is_some_and(|s| s.running.is_some()))
        .and_then(|cs| cs.container_id.clone())
        .ok_or_else(not_found)?;
    let id = id.split_once("://").map_or(id.as_str(), |(_, id)| id);
    for runtime in state.router.runtimes() {
        match runtime.container_status(id).await {
            Ok(_) => return Ok((runtime, id.to_owned())),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(refusal(&e)),
        }
    }
    Err(not_found())
}

/// The kubelet's `streaming.WriteError`: NotFound 404, anything else 500.
fn refusal(e: &RuntimeError) -> Refusal {
    let code = if e.is_not_found() {
        StatusCode::NOT_FOUND
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    Refusal(code, e.to_string())
}

fn runtime_error(e: &RuntimeError) -> Response {
    refusal(e).into_response()
}

/// The path parameters of a streaming request: the pod, the uid in the
/// uid-qualified forms, the container but for port-forward.
#[derive(Debug, serde::Deserialize)]
pub struct StreamPath {
    namespace: String,
    pod: String,
    uid: Option<String>,
    #[serde(default)]
    container: String,
}

/// The pod of `path` and its running container with the runtime that runs it.
async fn container_of(
    state: &StreamingState,
    path: &StreamPath,
) -> Result<(Pod, Arc<dyn Runtime>, String), Refusal> {
    let pod = find_pod(state, &path.namespace, &path.pod, path.uid.as_deref())?;
    let (runtime, id) = running_container(state, &pod, &path.container).await?;
    Ok((pod, runtime, id))
}

/// `/exec/{namespace}/{pod}[/{uid}]/{container}`.
pub async fn exec(
    State(state): State<StreamingState>,
    Path(path): Path<StreamPath>,
    req: Request,
) -> Response {
    let query = req.uri().query().unwrap_or_default().to_owned();
    let streams = match streams_of(&query) {
        Ok(s) => s,
        Err(e) => return text(StatusCode::BAD_REQUEST, e),
    };
    let command = values(&query, "command");
    let (_, runtime, id) = match container_of(&state, &path).await {
        Ok(c) => c,
        Err(r) => return r.into_response(),
    };
    match runtime.exec(&id, &command, streams).await {
        Ok(url) => proxy_stream(req, &url).await,
        Err(RuntimeError::Unsupported { .. }) => serve_itself(
            req,
            runtime,
            id,
            Target::Exec(command),
            streams,
            state.idle_timeout,
        ),
        Err(e) => runtime_error(&e),
    }
}

/// For a runtime without a streaming server (the Wasm runtime): the node upgrades
/// the connection itself (WebSocket or SPDY, as the client asks) and relays the
/// runtime's stdio session.
fn serve_itself(
    req: Request,
    runtime: Arc<dyn Runtime>,
    id: String,
    target: Target,
    streams: Streams,
    idle: std::time::Duration,
) -> Response {
    if websocket::is_websocket(&req) {
        let protocols = websocket::EXEC_PROTOCOLS;
        return websocket::upgrade(req, protocols, idle, move |ws, protocol| {
            let framing = websocket::Framing::of(&protocol);
            websocket::serve_stdio(ws, framing, runtime, id, target, streams)
        });
    }
    let protocol = match remotecommand::negotiate(&req, remotecommand::PROTOCOLS) {
        Ok(p) => p,
        Err(offered) => return remotecommand::refuse_protocols(&offered, remotecommand::PROTOCOLS),
    };
    remotecommand::upgrade(req, protocol, idle, move |session| {
        remotecommand::serve(session, runtime, id, target, streams)
    })
}

/// `POST /run/{namespace}/{pod}/{container}?cmd=...`: the kubelet's `getRun`, the
/// command (split on spaces) run to its end and its stdout and stderr answered; a
/// non-zero exit is a 500, as `RunInContainer` makes it an error.
pub async fn run(
    State(state): State<StreamingState>,
    Path(path): Path<StreamPath>,
    req: Request,
) -> Response {
    let (_, runtime, id) = match container_of(&state, &path).await {
        Ok(c) => c,
        Err(r) => return r.into_response(),
    };
    let cmd = first(req.uri().query().unwrap_or_default(), "cmd").unwrap_or_default();
    let command: Vec<String> = cmd.split(' ').map(str::to_owned).collect();
    match runtime
        .exec_sync(&id, &command, std::time::Duration::ZERO)
        .await
    {
        Ok(out) if out.exit_code == 0 => {
            let mut body = out.stdout;
            body.extend(out.stderr);
            ([(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        Ok(out) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "command {command:?} exited with {}: {}",
                out.exit_code,
                String::from_utf8_lossy(&out.stderr)
            ),
        ),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// `/attach/{namespace}/{pod}[/{uid}]/{container}`.
pub async fn attach(
    State(state): State<StreamingState>,
    Path(path): Path<StreamPath>,
    req: Request,
) -> Response {
    let mut streams = match streams_of(req.uri().query().unwrap_or_default()) {
        Ok(s) => s,
        Err(e) => return text(StatusCode::BAD_REQUEST, e),
    };
    let (pod, runtime, id) = match container_of(&state, &path).await {
        Ok(c) => c,
        Err(r) => return r.into_response(),
    };
    // Whether the process has a TTY was decided when it started: the spec's, as the
    // kubelet's GetAttach takes it.
    streams.tty =
        crate::pod::containers(&pod).any(|c| c.name == path.container && c.tty == Some(true));
    if streams.tty {
        streams.stderr = false;
    }
    match runtime.attach(&id, streams).await {
        Ok(url) => proxy_stream(req, &url).await,
        Err(RuntimeError::Unsupported { .. }) => serve_itself(
            req,
            runtime,
            id,
            Target::Attach,
            streams,
            state.idle_timeout,
        ),
        Err(e) => runtime_error(&e),
    }
}

/// `/portForward/{namespace}/{pod}[/{uid}]`.
pub async fn port_forward(
    State(state): State<StreamingState>,
    Path(StreamPath {
        namespace,
        pod,
        uid,
        ..
    }): Path<StreamPath>,
    req: Request,
) -> Response {
    let websocket = websocket::is_websocket(&req);
    let tunnel = websocket
        && websocket::choose_protocol(&req, websocket::PORT_FORWARD_OFFERS).as_deref()
            == Some(websocket::SPDY_TUNNEL_PROTOCOL);
    // A tunnelled SPDY names its ports per stream, as SPDY does.
    let ports = match ports_of(req.uri().query().unwrap_or_default(), websocket && !tunnel) {
        Ok(p) => p,
        Err(e) => return text(StatusCode::BAD_REQUEST, e),
    };
    let pod = match find_pod(&state, &namespace, &pod, uid.as_deref()) {
        Ok(p) => p,
        Err(r) => return r.into_response(),
    };
    let pod_uid = pod.metadata.uid.clone().unwrap_or_default();
    let runtime = match state.router.for_pod(&pod) {
        Ok((runtime, _)) => runtime,
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, e),
    };
    let sandbox = match runtime.list_pod_sandboxes().await {
        Ok(list) => list
            .into_iter()
            .find(|s| s.metadata.uid == pod_uid && s.state == SandboxState::Ready),
        Err(e) => return runtime_error(&e),
    };
    let Some(sandbox) = sandbox else {
        return text(
            StatusCode::NOT_FOUND,
            format!(
                "pod {:?} has no running sandbox",
                pod.metadata.name.unwrap_or_default()
            ),
        );
    };
    // A Wasm pod with a network of its own is reached inside its namespace.
    let netns = match runtime.pod_sandbox_status(&sandbox.id).await {
        Ok(status) => status.network_namespace,
        Err(e) => return runtime_error(&e),
    };
    let target = portforward::Target {
        pod: pod.metadata.name.clone().unwrap_or_default(),
        uid: pod_uid,
        ports: portforward::PodPorts { netns },
    };
    let idle = state.idle_timeout;
    match runtime.port_forward(&sandbox.id, &ports).await {
        Ok(url) if tunnel => proxy_spdy_tunnel(req, &url).await,
        Ok(url) => proxy_stream(req, &url).await,
        // No streaming server (the Wasm runtime): the node relays to the pod's
        // ports itself.
        Err(RuntimeError::Unsupported { .. }) if tunnel => {
            let protocols = [websocket::SPDY_TUNNEL_PROTOCOL];
            websocket::upgrade(req, &protocols, idle, move |ws, _| async move {
                portforward::serve(Session::start(websocket::tunnel(ws)), target).await
            })
        }
        Err(RuntimeError::Unsupported { .. }) if websocket => {
            let (pod_ports, pod_name) = (target.ports, target.pod);
            let protocols = websocket::PORT_FORWARD_PROTOCOLS;
            websocket::upgrade(req, protocols, idle, move |ws, protocol| {
                let framing = websocket::Framing::of(&protocol);
                websocket::serve_port_forward(ws, framing, pod_ports, ports, pod_name)
            })
        }
        Err(RuntimeError::Unsupported { .. }) => {
            let protocol = match remotecommand::negotiate(&req, portforward::PROTOCOLS) {
                Ok(p) => p,
                Err(offered) => {
                    return remotecommand::refuse_protocols(&offered, portforward::PROTOCOLS);
                }
            };
            remotecommand::upgrade(req, protocol, idle, move |session| {
                portforward::serve(session, target)
            })
        }
        Err(e) => runtime_error(&e),
    }
}

/// The most ports one WebSocket port-forward carries: each takes two channels, and a
/// channel is one byte (binary framing) or the ASCII character `'0' + channel`
/// (base64 framing), so 104 ports (channels 0..=207) is where both still fit.
pub const MAX_WEBSOCKET_PORTS: usize = 104;

/// The kubelet's `portforward.NewV4Options`: the `port` values (each a comma-separated
/// list) name the ports of a WebSocket request; SPDY names a port per stream, so
/// its query is not read. More than [`MAX_WEBSOCKET_PORTS`] is an error (the kubelet's
/// channel numbers would wrap and ports would share channels).
pub fn ports_of(query: &str, websocket: bool) -> Result<Vec<u16>, String> {
    if !websocket {
        return Ok(Vec::new());
    }
    let lists = values(query, "port");
    if lists.is_empty() {
        return Err("query parameter \"port\" is required".into());
    }
    let mut ports = Vec::new();
    for list in lists {
        for p in list.split(',') {
            match p.parse::<u16>() {
                Ok(0) => return Err(format!("port {list:?} must be > 0")),
                Ok(n) => ports.push(n),
                Err(e) => return Err(format!("unable to parse {list:?} as a port: {e}")),
            }
            if ports.len() > MAX_WEBSOCKET_PORTS {
                return Err(format!(
                    "too many ports: at most {MAX_WEBSOCKET_PORTS} in one port-forward"
                ));
            }
        }
    }
    Ok(ports)
}

fn proxy_error(message: impl std::fmt::Display) -> Response {
    text(StatusCode::INTERNAL_SERVER_ERROR, format!("{message}\n"))
}

/// Sends the client's upgrade request to `location` (the runtime's streaming URL),
/// answers with the runtime's response, and once both sides have switched protocols
/// relays bytes both ways until either closes.
pub async fn proxy_stream(req: Request, location: &str) -> Response {
    proxy(req, location, false).await
}

/// [`proxy_stream`] for a port-forward whose SPDY the client tunnels in a WebSocket
/// ([`websocket::SPDY_TUNNEL_PROTOCOL`]), which a runtime's streaming server does not
/// speak: the runtime is asked for a plain SPDY/3.1 `portforward.k8s.io` upgrade, the
/// client's WebSocket is accepted by the node, and the SPDY bytes are relayed
/// between the two unchanged (what kube-apiserver's tunnelling handler does).
async fn proxy_spdy_tunnel(req: Request, location: &str) -> Response {
    proxy(req, location, true).await
}

async fn proxy(mut req: Request, location: &str, tunnel: bool) -> Response {
    let handshake = if tunnel {
        match websocket::handshake(&req, &[websocket::SPDY_TUNNEL_PROTOCOL]) {
            Ok(h) => Some(h),
            Err(why) => return websocket::refuse(why),
        }
    } else {
        None
    };
    if !super::is_upgrade(req.headers()) {
        return proxy_error("Upgrade request required");
    }
    let location: Uri = match location.parse() {
        Ok(u) => u,
        Err(e) => {
            return proxy_error(format_args!(
                "the runtime's streaming URL {location:?}: {e}"
            ));
        }
    };
    if location.scheme_str() != Some("http") {
        return proxy_error(format_args!(
            "the runtime's streaming URL {location} is not http (TLS streaming is not supported)"
        ));
    }
    let Some(authority) = location.authority().cloned() else {
        return proxy_error(format_args!(
            "the runtime's streaming URL {location} has no host"
        ));
    };
    let tcp = match tokio::net::TcpStream::connect(authority.as_str()).await {
        Ok(t) => t,
        Err(e) => return proxy_error(format_args!("dialing {authority}: {e}")),
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await {
        Ok(c) => c,
        Err(e) => return proxy_error(format_args!("connecting to {authority}: {e}")),
    };
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!("streaming backend connection: {e}");
        }
    });

    let client_upgrade = hyper::upgrade::on(&mut req);
    let path = location
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let mut backend_req = axum::http::Request::builder()
        .method(req.method().clone())
        .uri(path);
    for (k, v) in req.headers() {
        let websocket_only = tunnel
            && (k.as_str().starts_with("sec-websocket-")
                || k == header::UPGRADE
                || k == header::CONNECTION);
        if k != header::HOST && !websocket_only {
            backend_req = backend_req.header(k, v);
        }
    }
    if tunnel {
        backend_req = backend_req
            .header(header::CONNECTION, "Upgrade")
            .header(header::UPGRADE, "SPDY/3.1")
            .header("x-stream-protocol-version", portforward::PROTOCOLS[0]);
    }
    if let Some(addr) = req.extensions().get::<super::https::RemoteAddr>()
        && let Ok(v) = HeaderValue::from_str(&addr.0.ip().to_string())
    {
        backend_req = backend_req.header("x-forwarded-for", v);
    }
    let backend_req = match backend_req
        .header(header::HOST, authority.as_str())
        .body(Body::empty())
    {
        Ok(r) => r,
        Err(e) => return proxy_error(e),
    };
    let mut response = match sender.send_request(backend_req).await {
        Ok(r) => r,
        Err(e) => return proxy_error(format_args!("sending to {authority}: {e}")),
    };
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        // The runtime refused (a bad token, a protocol it does not speak): its answer.
        let (parts, body) = response.into_parts();
        return Response::from_parts(parts, Body::new(body));
    }
    let backend_upgrade = hyper::upgrade::on(&mut response);
    tokio::spawn(async move {
        let (client, backend) = match tokio::join!(client_upgrade, backend_upgrade) {
            (Ok(c), Ok(b)) => (c, b),
            (c, b) => {
                tracing::debug!(
                    client = ?c.err(),
                    backend = ?b.err(),
                    "a stream's upgrade did not complete"
                );
                return;
            }
        };
        let mut backend = TokioIo::new(backend);
        let relayed = if tunnel {
            let ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
                TokioIo::new(client),
                tokio_tungstenite::tungstenite::protocol::Role::Server,
                None,
            )
            .await;
            let mut client = websocket::tunnel(ws);
            tokio::io::copy_bidirectional(&mut client, &mut backend).await
        } else {
            let mut client = TokioIo::new(client);
            tokio::io::copy_bidirectional(&mut client, &mut backend).await
        };
        if let Err(e) = relayed {
            tracing::debug!("a stream ended: {e}");
        }
    });
    if let Some((accept, protocol)) = handshake {
        return websocket::switching_protocols(&accept, &protocol);
    }
    let (parts, _) = response.into_parts();
    Response::from_parts(parts, Body::empty()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_the_kubelets_remotecommand_options() {
        let s = streams_of("command=sh&input=1&output=1&error=1").unwrap();
        assert_eq!(
            s,
            Streams {
                stdin: true,
                stdout: true,
                stderr: true,
                tty: false
            }
        );
        // A TTY merges stderr into stdout.
        let s = streams_of("output=1&error=1&tty=1").unwrap();
        assert!(s.tty && s.stdout && !s.stderr);
        // Only "1" is on.
        assert_eq!(
            streams_of("output=true&error=0").unwrap_err(),
            "you must specify at least 1 of stdin, stdout, stderr"
        );
        assert!(streams_of("tty=1&error=1").is_err());
    }

    #[test]
    fn commands_are_every_value_decoded() {
        let q = "command=sh&command=-c&command=echo+out%3B+exit+7&output=1";
        assert_eq!(values(q, "command"), ["sh", "-c", "echo out; exit 7"]);
        assert_eq!(values("port=80&port=8080", "port"), ["80", "8080"]);
        assert!(values("command=%zz", "command").is_empty());
    }

    #[test]
    fn ports_are_read_from_websocket_requests_only() {
        assert_eq!(
            ports_of("port=80,8080&port=9090", true).unwrap(),
            [80, 8080, 9090]
        );
        assert_eq!(ports_of("port=http", false).unwrap(), Vec::<u16>::new());
        assert!(
            ports_of("port=http", true)
                .unwrap_err()
                .starts_with("unable to parse \"http\" as a port")
        );
        assert_eq!(
            ports_of("port=0", true).unwrap_err(),
            "port \"0\" must be > 0"
        );
    }

    /// Found by reading for the fuzz targets: the 129th port's data channel (2 × 128)
    /// no longer fit a byte, a panic in debug builds and shared channels in release
    /// ones; past 104 ports the base64 channel digit was no longer ASCII.
    #[test]
    fn a_websocket_port_forward_has_at_most_as_many_ports_as_channels_fit() {
        let list = |n: usize| {
            let ports: Vec<String> = (1..=n).map(|p| p.to_string()).collect();
            format!("port={}", ports.join(","))
        };
        assert_eq!(
            ports_of(&list(MAX_WEBSOCKET_PORTS), true).unwrap().len(),
            104
        );
        assert_eq!(
            ports_of(&list(MAX_WEBSOCKET_PORTS + 1), true).unwrap_err(),
            "too many ports: at most 104 in one port-forward"
        );
        let highest = (2 * (MAX_WEBSOCKET_PORTS - 1) + 1) as u32;
        assert!(u32::from(b'0') + highest <= 255);
    }
}
