//! `exec` and `attach` served by the node itself, for a runtime without a streaming
//! server (the Wasm runtime): the kubelet's remotecommand server over SPDY/3.1 ([`super::spdy`])
//! with the `v5.channel.k8s.io` and `v4.channel.k8s.io` sub-protocols (over SPDY the
//! two behave the same), as kubectl and the API server speak it.
//!
//! The handshake picks the first of the client's `X-Stream-Protocol-Version`s the
//! node speaks, else 403 naming both lists. The client then opens its streams (an
//! `error` stream, and `stdin`, `stdout`, `stderr`, `resize` as it asked); the node
//! waits for all of them for 30 s (the kubelet's stream creation timeout). Then the
//! runtime's stdio session (`exec_stdio`, `attach_stdio`) is relayed live: the
//! client's stdin to the process, with its half-close; the process's output as it is
//! written; resizes are read and dropped (WASI has no terminal size). The exit code
//! reaches kubectl as the kubelet sends it: a `metav1.Status` on the error stream
//! (`NonZeroExitCode` with an `ExitCode` cause); a failure to start is an
//! `InternalError` Status naming it. A client that goes away drops the runtime's
//! session, which ends the exec (or detaches). WebSocket clients are served by
//! [`super::websocket`] before they get here.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;
use serde_json::json;
use wasmlet_runtime::{Runtime, StdioSession, Streams};

use super::idle::Idle;
use super::spdy::{Session, Stream, header as spdy_header};
use super::text;

/// The sub-protocols the node's own remotecommand server speaks, preferred first.
pub const PROTOCOLS: &[&str] = &["v5.channel.k8s.io", "v4.channel.k8s.io"];

/// The kubelet's `DefaultStreamCreationTimeout`.
const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);

const PROTOCOL_HEADER: &str = "x-stream-protocol-version";

/// The first protocol the client offers (in its order) that the server speaks; else
/// what it offered.
pub fn negotiate(req: &Request, supported: &[&str]) -> Result<String, Vec<String>> {
    let offered: Vec<String> = req
        .headers()
        .get_all(PROTOCOL_HEADER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_owned())
        .filter(|p| !p.is_empty())
        .collect();
    match offered.iter().find(|p| supported.contains(&p.as_str())) {
        Some(p) => Ok(p.clone()),
        None => Err(offered),
    }
}

/// The kubelet's 403 when no protocol is shared, naming both lists.
pub fn refuse_protocols(offered: &[String], supported: &[&'static str]) -> Response {
    let mut response = text(
        StatusCode::FORBIDDEN,
        format!(
            "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, server accepts {supported:?}"
        ),
    );
    for p in supported {
        response.headers_mut().append(
            "x-accepted-stream-protocol-versions",
            HeaderValue::from_static(p),
        );
    }
    response
}

/// Whether the request is a SPDY/3.1 upgrade, as the kubelet's upgrader checks.
pub fn is_spdy_upgrade(req: &Request) -> bool {
    let has = |name: header::HeaderName, want: &str| {
        req.headers()
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.to_ascii_lowercase().contains(want))
    };
    has(header::CONNECTION, "upgrade") && has(header::UPGRADE, "spdy/3.1")
}

/// Switches `req` to SPDY with `protocol` and runs `serve` on the session once the
/// client has upgraded; the session ends once it has been idle for `idle`.
pub fn upgrade<F, Fut>(mut req: Request, protocol: String, idle: Duration, serve: F) -> Response
where
    F: FnOnce(Session) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    if !is_spdy_upgrade(&req) {
        return text(
            StatusCode::BAD_REQUEST,
            "unable to upgrade: missing upgrade headers in request (SPDY/3.1 or WebSocket)",
        );
    }
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(io) => serve(Session::start(Idle::new(TokioIo::new(io), idle))).await,
            Err(e) => tracing::debug!("a stream's upgrade did not complete: {e}"),
        }
    });
    let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let h = response.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
    if let Ok(v) = HeaderValue::from_str(&protocol) {
        h.insert(PROTOCOL_HEADER, v);
    }
    response
}

/// The client's streams of one remotecommand session.
#[derive(Default)]
struct ClientStreams {
    error: Option<Stream>,
    stdin: Option<Stream>,
    stdout: Option<Stream>,
    stderr: Option<Stream>,
    resize: Option<Stream>,
}

/// Waits for the streams `streams` says the client opens (the error stream always),
/// for [`STREAM_CREATION_TIMEOUT`].
async fn accept_streams(session: &mut Session, streams: Streams) -> Result<ClientStreams, String> {
    let expected = 1
        + usize::from(streams.stdin)
        + usize::from(streams.stdout)
        + usize::from(streams.stderr && !streams.tty)
        + usize::from(streams.tty);
    let mut got = ClientStreams::default();
    let mut count = 0;
    let deadline = tokio::time::sleep(STREAM_CREATION_TIMEOUT);
    tokio::pin!(deadline);
    while count < expected {
        let stream = tokio::select! {
            s = session.accept() => s.ok_or("the client went away before creating its streams")?,
            () = &mut deadline => return Err("timed out waiting for client to create streams".into()),
        };
        let slot = match spdy_header(&stream.headers, "streamtype") {
            Some("error") => &mut got.error,
            Some("stdin") => &mut got.stdin,
            Some("stdout") => &mut got.stdout,
            Some("stderr") => &mut got.stderr,
            Some("resize") => &mut got.resize,
            other => return Err(format!("unexpected stream type: {other:?}")),
        };
        *slot = Some(stream);
        count += 1;
    }
    Ok(got)
}

/// The kubelet's v4 status of a command that ended with `exit_code`.
pub fn exit_status(exit_code: i32) -> serde_json::Value {
    if exit_code == 0 {
        return json!({"metadata": {}, "status": "Success"});
    }
    json!({
        "metadata": {},
        "status": "Failure",
        "message": format!("command terminated with non-zero exit code: exit status {exit_code}"),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": exit_code.to_string()}]},
    })
}

/// `apierrors.NewInternalError(err).Status()`.
pub fn internal_error(message: &str) -> serde_json::Value {
    json!({
        "metadata": {},
        "status": "Failure",
        "message": format!("Internal error occurred: {message}"),
        "reason": "InternalError",
        "details": {"causes": [{"message": message}]},
        "code": 500,
    })
}

/// What a session the node serves itself runs.
#[derive(Clone, Debug)]
pub enum Target {
    /// A new process with this command.
    Exec(Vec<String>),
    /// The container's own process.
    Attach,
}

/// Opens the runtime's stdio session for `target` in container `id`.
pub async fn open(
    runtime: &Arc<dyn Runtime>,
    id: &str,
    target: &Target,
    streams: Streams,
) -> Result<StdioSession, wasmlet_runtime::Error> {
    match target {
        Target::Exec(command) => runtime.exec_stdio(id, command, streams).await,
        Target::Attach => runtime.attach_stdio(id, streams).await,
    }
}

/// The Status that ends a session: an exec's exit code as the kubelet reports it;
/// an attach that ended with its container succeeded (the kubelet's `ServeAttach`).
pub fn final_status(
    target: &Target,
    outcome: Result<i32, wasmlet_runtime::Error>,
) -> serde_json::Value {
    match (target, outcome) {
        (Target::Exec(_), Ok(code)) => exit_status(code),
        (Target::Attach, Ok(_)) => exit_status(0),
        (_, Err(e)) => internal_error(&e.to_string()),
    }
}

/// Copies `from` into `to` until either ends; `false` when `to` did.
pub async fn copy_out<F, Fut>(from: Option<Box<dyn AsyncRead + Send + Unpin>>, mut to: F)
where
    F: FnMut(Bytes) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let Some(mut from) = from else { return };
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if !to(Bytes::copy_from_slice(&buf[..n])).await {
                    return;
                }
            }
        }
    }
}

/// Serves one exec or attach in container `id` of `runtime` over `session`: the
/// runtime's stdio session relayed stream by stream, live, until the process ends
/// (then its Status on the error stream) or the client goes away (then the
/// runtime's session is dropped, which ends an exec and detaches an attach).
pub async fn serve(
    mut session: Session,
    runtime: Arc<dyn Runtime>,
    id: String,
    target: Target,
    streams: Streams,
) {
    let client = match accept_streams(&mut session, streams).await {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(container = %id, "remotecommand: {e}");
            session.go_away().await;
            return;
        }
    };
    let ClientStreams {
        error,
        stdin,
        stdout,
        stderr,
        resize,
    } = client;
    let opened = Streams {
        stdin: stdin.is_some(),
        stdout: stdout.is_some(),
        stderr: stderr.is_some(),
        ..streams
    };
    let status = match open(&runtime, &id, &target, opened).await {
        Err(e) => internal_error(&e.to_string()),
        Ok(stdio) => {
            let StdioSession {
                stdin: to_process,
                stdout: process_out,
                stderr: process_err,
                exit,
            } = stdio;
            let input = async {
                if let (Some(mut w), Some(mut s)) = (to_process, stdin) {
                    while let Some(bytes) = s.incoming.recv().await {
                        if w.write_all(&bytes).await.is_err() {
                            break;
                        }
                    }
                    // The client half-closed its stdin: so does the process's.
                    let _ = w.shutdown().await;
                }
                std::future::pending::<()>().await;
            };
            // A Wasm process has no terminal size: resizes are read and dropped.
            let resizes = async {
                if let Some(mut r) = resize {
                    while r.incoming.recv().await.is_some() {}
                }
                std::future::pending::<()>().await;
            };
            let writer = |s: &Option<Stream>| s.as_ref().map(|s| s.writer.clone());
            let (out_w, err_w) = (writer(&stdout), writer(&stderr));
            let done = async {
                let out = copy_out(process_out, |b| {
                    let w = out_w.clone();
                    async move { write_to(w.as_ref(), &b).await }
                });
                let err = copy_out(process_err, |b| {
                    let w = err_w.clone();
                    async move { write_to(w.as_ref(), &b).await }
                });
                let ((), (), outcome) = tokio::join!(out, err, exit);
                outcome
            };
            let gone = async { while session.accept().await.is_some() {} };
            tokio::select! {
                outcome = done => final_status(&target, outcome),
                () = input => unreachable!("stdin relaying never ends by itself"),
                () = resizes => unreachable!("resize draining never ends by itself"),
                () = gone => {
                    tracing::debug!(container = %id, "remotecommand: the client went away");
                    return;
                }
            }
        }
    };
    for s in [&stdout, &stderr].into_iter().flatten() {
        s.writer.close().await;
    }
    if let Some(error) = &error {
        error.writer.write(status.to_string().as_bytes()).await;
        error.writer.close().await;
    }
    session.go_away().await;
}

/// Writes to a client stream, if there is one; `false` when it is gone.
async fn write_to(w: Option<&super::spdy::StreamWriter>, bytes: &[u8]) -> bool {
    match w {
        Some(w) => w.write(bytes).await,
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(protocols: &[&str]) -> Request {
        let mut b = axum::http::Request::post("/exec/ns/p/c")
            .header(header::CONNECTION, "Upgrade")
            .header(header::UPGRADE, "SPDY/3.1");
        for p in protocols {
            b = b.header(PROTOCOL_HEADER, *p);
        }
        b.body(axum::body::Body::empty()).unwrap()
    }

    #[test]
    fn the_first_offered_protocol_the_node_speaks_is_chosen() {
        let r = req(&["v5.channel.k8s.io", "v4.channel.k8s.io", "channel.k8s.io"]);
        assert_eq!(negotiate(&r, PROTOCOLS).unwrap(), "v5.channel.k8s.io");
        let r = req(&["v3.channel.k8s.io", "v4.channel.k8s.io"]);
        assert_eq!(negotiate(&r, PROTOCOLS).unwrap(), "v4.channel.k8s.io");
        let offered = negotiate(&req(&["channel.k8s.io"]), PROTOCOLS).unwrap_err();
        assert_eq!(offered, ["channel.k8s.io"]);
        let refused = refuse_protocols(&offered, PROTOCOLS);
        assert_eq!(refused.status(), StatusCode::FORBIDDEN);
        let accepted: Vec<_> = refused
            .headers()
            .get_all("x-accepted-stream-protocol-versions")
            .iter()
            .collect();
        assert_eq!(accepted, ["v5.channel.k8s.io", "v4.channel.k8s.io"]);
        assert!(is_spdy_upgrade(&req(&[])));
    }

    #[test]
    fn statuses_are_the_kubelets() {
        assert_eq!(exit_status(0), json!({"metadata": {}, "status": "Success"}));
        let s = exit_status(7);
        assert_eq!(s["reason"], "NonZeroExitCode");
        assert_eq!(
            s["details"]["causes"][0],
            json!({"reason": "ExitCode", "message": "7"})
        );
        let e = internal_error("no module x");
        assert_eq!(e["message"], "Internal error occurred: no module x");
        assert_eq!(e["code"], 500);
    }
}
