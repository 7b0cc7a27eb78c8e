//! The node's HTTP endpoints: the read-only port (`/pods`, `/healthz`) and the
//! healthz port.
//!
//! The read-only port is unauthenticated by design, as the kubelet's is; it is off by
//! default (port 0) and should be bound to loopback where enabled.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use k8s_openapi::List;
use k8s_openapi::api::core::v1::Pod;
use tokio_util::sync::CancellationToken;

use crate::status::StatusStore;

/// A named health check.
pub type Check = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// What the endpoints read.
#[derive(Clone)]
pub struct ServerState {
    pub statuses: StatusStore,
    pub checks: Vec<(&'static str, Check)>,
}

async fn pods(State(state): State<ServerState>) -> Response {
    let list = List::<Pod> {
        items: state.statuses.pods(),
        metadata: Default::default(),
    };
    axum::Json(list).into_response()
}

async fn healthz(State(state): State<ServerState>) -> Response {
    let failures: Vec<String> = state
        .checks
        .iter()
        .filter_map(|(name, check)| check().err().map(|e| format!("[-]{name} failed: {e}")))
        .collect();
    if failures.is_empty() {
        (StatusCode::OK, "ok").into_response()
    } else {
        (StatusCode::INTERNAL_SERVER_ERROR, failures.join("\n")).into_response()
    }
}

/// The read-only router.
pub fn read_only_router(state: ServerState) -> Router {
    Router::new()
        .route("/pods", get(pods))
        .route("/healthz", get(healthz))
        .with_state(state)
}

/// The healthz router.
pub fn healthz_router(state: ServerState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
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
