//! The node's HTTP endpoints: the node API on `:10250` (TLS, authenticated and
//! authorized: `node_api.rs` has its routes, `https.rs` its listener, `tls.rs`,
//! `auth.rs` and `authz.rs` its guard), the read-only port (`/pods`, `/healthz`,
//! `/readyz`) and the healthz port (`/healthz`, `/readyz`), both here.
//!
//! `/healthz` is the agent's liveness, as the kubelet's: the sync loop goes round and
//! the PLEG relists. `/readyz` adds whether the node can run pods: every container
//! runtime answers and reports RuntimeReady and NetworkReady. Both answer `ok`, or 500
//! with a `[-]check failed: reason` line per failing check; `?verbose` lists every
//! check with what it measured.
//!
//! The read-only port is unauthenticated by design, as the kubelet's is; it is off by
//! default (port 0) and should be bound to loopback where enabled.

pub mod auth;
pub mod authz;
pub mod configz;
pub mod https;
pub mod idle;
pub mod logs;
pub mod node_api;
pub mod node_logs;
pub mod portforward;
pub mod remotecommand;
pub mod spdy;
pub mod stats;
pub mod streaming;
pub mod tls;
pub mod websocket;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use k8s_openapi::List;
use k8s_openapi::api::core::v1::Pod;
use tokio_util::sync::CancellationToken;

use crate::status::StatusStore;

/// A named health check: `Ok` with what it saw, or `Err` with why it fails.
pub type Check = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

/// What the endpoints read.
#[derive(Clone)]
pub struct ServerState {
    pub statuses: StatusStore,
    /// For `/metrics/probes`.
    pub probes: Option<crate::prober::ProbeManager>,
    /// For `/metrics/plugins`.
    pub plugins: Option<wasmlet_plugin_host::PluginHost>,
    /// Liveness: `/healthz`.
    pub checks: Vec<(&'static str, Check)>,
    /// Readiness, on top of liveness: `/readyz`.
    pub ready_checks: Vec<(&'static str, Check)>,
}

/// Query of the health endpoints.
#[derive(Debug, Default, serde::Deserialize)]
struct HealthQuery {
    verbose: Option<String>,
}

async fn pods(State(state): State<ServerState>) -> Response {
    let list = List::<Pod> {
        items: state.statuses.pods(),
        metadata: Default::default(),
    };
    axum::Json(list).into_response()
}

fn report<'a>(checks: impl Iterator<Item = &'a (&'static str, Check)>, verbose: bool) -> Response {
    let mut lines = Vec::new();
    let mut failed = false;
    for (name, check) in checks {
        match check() {
            Ok(seen) if verbose => lines.push(format!("[+]{name} ok: {seen}")),
            Ok(_) => {}
            Err(e) => {
                failed = true;
                lines.push(format!("[-]{name} failed: {e}"));
            }
        }
    }
    let code = if failed {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::OK
    };
    if !failed && !verbose {
        return (code, "ok").into_response();
    }
    lines.push(if failed { "check failed" } else { "ok" }.to_owned());
    (code, lines.join("\n")).into_response()
}

async fn healthz(State(state): State<ServerState>, Query(q): Query<HealthQuery>) -> Response {
    report(state.checks.iter(), q.verbose.is_some())
}

async fn readyz(State(state): State<ServerState>, Query(q): Query<HealthQuery>) -> Response {
    report(
        state.checks.iter().chain(state.ready_checks.iter()),
        q.verbose.is_some(),
    )
}

/// A plain-text answer, as Go's `http.Error` / go-restful's `WriteErrorString` send it.
pub(crate) fn text(code: StatusCode, body: impl Into<String>) -> Response {
    (
        code,
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; charset=utf-8",
        )],
        body.into(),
    )
        .into_response()
}

/// Whether the request asks to switch protocols: `Connection` has the `upgrade`
/// token and `Upgrade` names a protocol.
pub(crate) fn is_upgrade(headers: &axum::http::HeaderMap) -> bool {
    use axum::http::header;
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
        && headers.contains_key(header::UPGRADE)
}

/// `wsstream.IsWebSocketRequest`: an upgrade whose `Upgrade` is `websocket`.
pub(crate) fn is_websocket(headers: &axum::http::HeaderMap) -> bool {
    is_upgrade(headers)
        && headers
            .get(axum::http::header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// The body of Go's `http.NotFound`.
pub(crate) const NOT_FOUND_TEXT: &str = "404 page not found\n";

/// Go's `http.NotFound`.
pub(crate) fn not_found() -> Response {
    text(StatusCode::NOT_FOUND, NOT_FOUND_TEXT)
}

/// Metrics in the Prometheus text format.
pub(crate) fn prometheus_text(text: String) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// `prober_probe_total`, as the kubelet serves it at `/metrics/probes`.
async fn probe_metrics(State(state): State<ServerState>) -> Response {
    prometheus_text(
        state
            .probes
            .as_ref()
            .map(|p| p.metrics_text())
            .unwrap_or_default(),
    )
}

/// Per-plugin calls, failures by kind and latency (`wasmlet_plugin_*`).
async fn plugin_metrics(State(state): State<ServerState>) -> Response {
    prometheus_text(
        state
            .plugins
            .as_ref()
            .map(|p| p.metrics_text())
            .unwrap_or_default(),
    )
}

/// The read-only router.
pub fn read_only_router(state: ServerState) -> Router {
    Router::new()
        .route("/pods", get(pods))
        .route("/metrics/probes", get(probe_metrics))
        .route("/metrics/plugins", get(plugin_metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// The healthz router.
pub fn healthz_router(state: ServerState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// Binds `addr` and serves `router` until cancelled. Binding errors are returned at once.
pub async fn serve(
    addr: SocketAddr,
    router: Router,
    cancel: CancellationToken,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))?;
    Ok(tokio::spawn(async move {
        let shutdown = async move { cancel.cancelled().await };
        if let Err(e) = axum::serve(listener, router)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::error!(%addr, "HTTP server failed: {e}");
        }
    }))
}
