//! The node API's endpoints on `:10250`, behind authentication and authorization
//! ([`super::authz::filter`]): `/healthz` (and `/healthz/ping`, `/healthz/syncloop`),
//! `/pods`, `/runningpods/`, `/containerLogs/{ns}/{pod}/{container}` and the metrics
//! the node keeps (`/metrics/probes`, `/metrics/plugins`), the node's logs (`/logs/`:
//! [`super::node_logs`]), and the statistics
//! (`/stats/summary`, `/metrics/resource`, `/metrics/cadvisor`: [`super::stats`]).
//! Streaming (`/exec`, `/attach`, `/portForward`): [`super::streaming`]. `/spec/` is not
//! served: v1.32 has no cAdvisor JSON endpoints (they went with
//! `--enable-cadvisor-json-endpoints` in 1.21).
//!
//! Logs are the kubelet's `getContainerLogs`: the pod is found by namespace and name
//! among the node's pods; the container by name in its spec; the instance from the
//! pod status (the current one, or `lastState.terminated` with `previous=true`); its
//! log file from the runtime that runs it. A follow ends when the client goes away,
//! or, after what is left has been written, when the container stops.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use k8s_openapi::List;
use k8s_openapi::api::core::v1::{Container, ContainerStatus as ApiStatus, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use wasmlet_runtime::{ContainerEventKind, ContainerState, Runtime};

use super::authz::Guard;
use super::logs::{self, LogOptions};
use super::{Check, ServerState, not_found, prometheus_text, streaming, text};
use crate::pod_state::labels;
use crate::router::RuntimeRouter;

/// What the node API reads, on top of the read-only port's.
#[derive(Clone)]
pub struct NodeApiState {
    pub base: ServerState,
    pub router: RuntimeRouter,
    /// For `/stats/summary` and `/metrics/resource`.
    pub stats: Arc<crate::stats::StatsProvider>,
    /// The body of `/configz` (the configuration does not change while the node runs).
    pub configz: Arc<serde_json::Value>,
    /// For `kubelet_node_name`.
    pub node_name: String,
    /// `enableDebuggingHandlers`.
    pub debugging_handlers: bool,
    /// `streamingConnectionIdleTimeout`.
    pub streaming_idle_timeout: std::time::Duration,
    /// `/logs/`, unless `enableSystemLogHandler` is off.
    pub system_logs: Option<super::node_logs::NodeLogs>,
}

impl axum::extract::FromRef<NodeApiState> for super::stats::StatsState {
    fn from_ref(state: &NodeApiState) -> Self {
        super::stats::StatsState {
            stats: state.stats.clone(),
            statuses: state.base.statuses.clone(),
            router: state.router.clone(),
        }
    }
}

/// The kubelet's debugging endpoints (`InstallDebuggingHandlers`,
/// `InstallSystemLogHandler`): what `enableDebuggingHandlers: false` turns into 405s.
const DEBUGGING_PATHS: &[&str] = &[
    "/run",
    "/exec",
    "/attach",
    "/portForward",
    "/containerLogs",
    "/runningpods",
    "/debug/pprof",
    "/logs",
];

/// Every method of `path` and below it answers `code` with `message` (Go's
/// `http.Error` behind a `ServeMux` subtree pattern).
fn refuse(router: Router<NodeApiState>, path: &str, message: &'static str) -> Router<NodeApiState> {
    let answer = move || async move { text(StatusCode::METHOD_NOT_ALLOWED, message) };
    router
        .route(path, axum::routing::any(answer))
        .route(&format!("{path}/"), axum::routing::any(answer))
        .route(&format!("{path}/{{*rest}}"), axum::routing::any(answer))
}

impl axum::extract::FromRef<NodeApiState> for streaming::StreamingState {
    fn from_ref(state: &NodeApiState) -> Self {
        streaming::StreamingState {
            statuses: state.base.statuses.clone(),
            router: state.router.clone(),
            idle_timeout: state.streaming_idle_timeout,
        }
    }
}

/// The router, every route behind `guard`.
pub fn router(state: NodeApiState, guard: Arc<Guard>) -> Router {
    let mut router = Router::new()
        .route("/healthz", get(healthz))
        .route("/healthz/ping", get(|| async { "ok" }))
        .route("/healthz/{check}", get(healthz_check))
        .route("/pods", get(pods))
        .route("/metrics/probes", get(probe_metrics))
        .route("/metrics", get(agent_metrics))
        .route("/metrics/plugins", get(plugin_metrics))
        .route("/stats/summary", get(super::stats::summary))
        .route("/metrics/resource", get(super::stats::resource_metrics))
        .route("/metrics/cadvisor", get(super::stats::cadvisor_metrics));
    let mut logs = Router::new();
    if state.debugging_handlers {
        router = router
            .route("/runningpods/", get(running_pods))
            .route(
                "/containerLogs/{namespace}/{pod}/{container}",
                get(container_logs),
            )
            .route("/configz", get(configz))
            .route(
                "/exec/{namespace}/{pod}/{container}",
                get(streaming::exec).post(streaming::exec),
            )
            .route(
                "/exec/{namespace}/{pod}/{uid}/{container}",
                get(streaming::exec).post(streaming::exec),
            )
            .route(
                "/attach/{namespace}/{pod}/{container}",
                get(streaming::attach).post(streaming::attach),
            )
            .route(
                "/attach/{namespace}/{pod}/{uid}/{container}",
                get(streaming::attach).post(streaming::attach),
            )
            .route("/run/{namespace}/{pod}/{container}", post(streaming::run))
            .route(
                "/run/{namespace}/{pod}/{uid}/{container}",
                post(streaming::run),
            )
            .route(
                "/portForward/{namespace}/{pod}",
                get(streaming::port_forward).post(streaming::port_forward),
            )
            .route(
                "/portForward/{namespace}/{pod}/{uid}",
                get(streaming::port_forward).post(streaming::port_forward),
            );
        match state.system_logs.clone() {
            Some(l) => logs = super::node_logs::router(l),
            None => router = refuse(router, "/logs", "logs endpoint is disabled.\n"),
        }
    } else {
        for path in DEBUGGING_PATHS {
            router = refuse(router, path, "Debug endpoints are disabled.\n");
        }
    }
    router
        .fallback(async || not_found())
        .with_state(state)
        .merge(logs)
        .layer(axum::middleware::from_fn_with_state(
            guard,
            super::authz::filter,
        ))
}

/// `/healthz`: `ok` when every liveness check passes (the kubelet's ping, log and
/// syncloop; wasmlet's are the sync loop and the PLEG).
async fn healthz(State(state): State<NodeApiState>) -> Response {
    let failed: Vec<String> = state
        .base
        .checks
        .iter()
        .filter_map(|(name, check)| check().err().map(|e| format!("[-]{name} failed: {e}")))
        .collect();
    if failed.is_empty() {
        text(StatusCode::OK, "ok")
    } else {
        text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{}\nhealthz check failed", failed.join("\n")),
        )
    }
}

/// `/healthz/{check}`: one check by name.
async fn healthz_check(State(state): State<NodeApiState>, Path(name): Path<String>) -> Response {
    let check: Option<&Check> = state
        .base
        .checks
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, c)| c);
    match check.map(|c| c()) {
        None => not_found(),
        Some(Ok(_)) => text(StatusCode::OK, "ok"),
        Some(Err(e)) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("internal server error: {e}"),
        ),
    }
}

/// `/pods`: the pods bound to this node, with their status.
async fn pods(State(state): State<NodeApiState>) -> Response {
    axum::Json(List::<Pod> {
        items: state.base.statuses.pods(),
        metadata: Default::default(),
    })
    .into_response()
}

/// `/runningpods/`: the pods the runtimes run, as the kubelet reports them: name,
/// namespace and UID from the sandbox, a container (name, image) per running one.
async fn running_pods(State(state): State<NodeApiState>) -> Response {
    let mut pods: Vec<Pod> = Vec::new();
    for runtime in state.router.runtimes() {
        let (sandboxes, containers) =
            match tokio::try_join!(runtime.list_pod_sandboxes(), runtime.list_containers()) {
                Ok(listed) => listed,
                Err(e) => {
                    return text(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("listing the {} runtime's pods: {e}", runtime.name()),
                    );
                }
            };
        for sb in sandboxes {
            if sb.state != wasmlet_runtime::SandboxState::Ready {
                continue;
            }
            let running: Vec<Container> = containers
                .iter()
                .filter(|c| c.sandbox_id == sb.id && c.state == ContainerState::Running)
                .map(|c| Container {
                    name: c.metadata.name.clone(),
                    image: Some(c.image.clone()),
                    ..Container::default()
                })
                .collect();
            pods.push(Pod {
                metadata: ObjectMeta {
                    name: Some(sb.metadata.name.clone()),
                    namespace: Some(sb.metadata.namespace.clone()),
                    uid: Some(sb.metadata.uid.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(PodSpec {
                    containers: running,
                    ..PodSpec::default()
                }),
                status: None,
            });
        }
    }
    pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    axum::Json(List::<Pod> {
        items: pods,
        metadata: Default::default(),
    })
    .into_response()
}

/// The runtime id of the container instance whose log is asked for, or why there is
/// none, as the kubelet words it (its answer is a 400).
fn instance_id(pod: &Pod, container: &str, previous: bool) -> Result<String, String> {
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    let status = pod.status.as_ref();
    let statuses = status
        .into_iter()
        .flat_map(|s| {
            s.container_statuses
                .iter()
                .flatten()
                .chain(s.init_container_statuses.iter().flatten())
                .chain(s.ephemeral_container_statuses.iter().flatten())
        })
        .collect::<Vec<&ApiStatus>>();
    let Some(cs) = statuses.into_iter().find(|s| s.name == container) else {
        return Err(format!(
            "container {container:?} in pod {pod_name:?} is not available"
        ));
    };
    // The kubelet's `validateContainerLogStatus`, case by case.
    let last = cs
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .and_then(|t| t.container_id.clone())
        .filter(|id| !id.is_empty());
    let state = cs.state.as_ref();
    let refuse = |why: String| Err(why);
    let id = if previous {
        match last {
            Some(id) => id,
            None => {
                return refuse(format!(
                    "previous terminated container {container:?} in pod {pod_name:?} not found"
                ));
            }
        }
    } else if state.is_some_and(|s| s.running.is_some()) {
        cs.container_id.clone().unwrap_or_default()
    } else if let Some(terminated) = state.and_then(|s| s.terminated.as_ref()) {
        match terminated
            .container_id
            .clone()
            .filter(|id| !id.is_empty())
            .or(last)
        {
            Some(id) => id,
            None => {
                return refuse(format!(
                    "container {container:?} in pod {pod_name:?} is terminated"
                ));
            }
        }
    } else if cs
        .last_state
        .as_ref()
        .is_some_and(|s| s.terminated.is_some())
    {
        match last {
            Some(id) => id,
            None => {
                return refuse(format!(
                    "container {container:?} in pod {pod_name:?} is terminated"
                ));
            }
        }
    } else if let Some(waiting) = state.and_then(|s| s.waiting.as_ref()) {
        let reason = waiting.reason.as_deref().unwrap_or_default();
        let why = match reason {
            "ErrImagePull" => "image can't be pulled",
            "ImagePullBackOff" => "trying and failing to pull image",
            other => other,
        };
        return refuse(format!(
            "container {container:?} in pod {pod_name:?} is waiting to start: {why}"
        ));
    } else {
        return refuse(format!(
            "container {container:?} in pod {pod_name:?} is waiting to start - no logs yet"
        ));
    };
    // `<scheme>://<id>`.
    Ok(id
        .split_once("://")
        .map(|(_, id)| id.to_owned())
        .unwrap_or(id))
}

/// The runtime that has the container `id`, and its status.
async fn find_container(
    router: &RuntimeRouter,
    id: &str,
) -> Option<(Arc<dyn Runtime>, wasmlet_runtime::ContainerStatus)> {
    for runtime in router.runtimes() {
        match runtime.container_status(id).await {
            Ok(status) => return Some((runtime, status)),
            Err(e) if e.is_not_found() => {}
            Err(e) => tracing::debug!(
                runtime = runtime.name(),
                container = id,
                "container status for logs: {e}"
            ),
        }
    }
    None
}

/// Resolves when the container `id` is no longer running: at its runtime's stop
/// event, or at a check every few seconds (an event can be missed).
async fn stopped(runtime: Arc<dyn Runtime>, id: String) {
    let mut events = runtime.subscribe();
    loop {
        match runtime.container_status(&id).await {
            Ok(s) if s.state == ContainerState::Running => {}
            _ => return,
        }
        let wait = async {
            loop {
                match events.recv().await {
                    Ok(ev)
                        if ev.container_id == id
                            && matches!(
                                ev.kind,
                                ContainerEventKind::Stopped | ContainerEventKind::Deleted
                            ) =>
                    {
                        return;
                    }
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => return,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                        std::future::pending::<()>().await
                    }
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(5), wait).await;
    }
}

/// `/containerLogs/{namespace}/{pod}/{container}`.
async fn container_logs(
    State(state): State<NodeApiState>,
    Path((namespace, pod_name, container)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    let opts = match LogOptions::from_query(query.as_deref().unwrap_or(""), jiff::Timestamp::now())
    {
        Ok(opts) => opts,
        Err(e) => return text(e.status(), e.to_string()),
    };
    let Some(pod) = state.base.statuses.pods().into_iter().find(|p| {
        p.metadata.namespace.as_deref() == Some(namespace.as_str())
            && p.metadata.name.as_deref() == Some(pod_name.as_str())
    }) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("pod {pod_name:?} does not exist"),
        );
    };
    if !crate::pod::containers(&pod).any(|c| c.name == container) {
        return text(
            StatusCode::NOT_FOUND,
            format!("container {container:?} not found in pod {pod_name:?}"),
        );
    }
    let id = match instance_id(&pod, &container, opts.previous) {
        Ok(id) => id,
        Err(why) => return text(StatusCode::BAD_REQUEST, why),
    };
    let Some((runtime, status)) = find_container(&state.router, &id).await else {
        return text(
            StatusCode::NOT_FOUND,
            format!("container {container:?} in pod {pod_name:?}: its instance {id} is gone"),
        );
    };
    if status.labels.get(labels::POD_UID).map(String::as_str) != pod.metadata.uid.as_deref() {
        return text(
            StatusCode::NOT_FOUND,
            format!("container {container:?} in pod {pod_name:?}: instance {id} is another pod's"),
        );
    }
    let ended: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> =
        if opts.follow && status.state == ContainerState::Running {
            Box::pin(stopped(runtime, id))
        } else {
            Box::pin(async {})
        };
    match logs::open(&status.log_path, &opts, ended).await {
        Ok(stream) => (
            [(header::CONTENT_TYPE, "text/plain")],
            Body::from_stream(stream),
        )
            .into_response(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => text(
            StatusCode::NOT_FOUND,
            format!(
                "container {container:?} in pod {pod_name:?}: no log file {}",
                status.log_path.display()
            ),
        ),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("reading the log of container {container:?} in pod {pod_name:?}: {e}"),
        ),
    }
}

/// `/metrics`: the agent's own (`crate::metrics`), with the running pods and
/// containers counted from the runtimes now.
async fn agent_metrics(State(state): State<NodeApiState>) -> Response {
    let (mut pods, mut running, mut exited, mut created, mut unknown) = (0, 0, 0, 0, 0);
    for runtime in state.router.runtimes() {
        if let Ok(sandboxes) = runtime.list_pod_sandboxes().await {
            pods += sandboxes
                .iter()
                .filter(|s| s.state == wasmlet_runtime::SandboxState::Ready)
                .count() as i64;
        }
        if let Ok(containers) = runtime.list_containers().await {
            for c in containers {
                match c.state {
                    ContainerState::Running => running += 1,
                    ContainerState::Exited => exited += 1,
                    ContainerState::Created => created += 1,
                    _ => unknown += 1,
                }
            }
        }
    }
    if let Some(csi) = state.stats.csi() {
        let claims: Vec<crate::metrics::ClaimUsage> = csi
            .claim_stats()
            .await
            .into_iter()
            .filter_map(|u| {
                let (namespace, claim) = u.claim?;
                Some(crate::metrics::ClaimUsage {
                    namespace,
                    claim,
                    capacity_bytes: u.capacity_bytes,
                    available_bytes: u.available_bytes,
                    used_bytes: u.used_bytes,
                    inodes: u.inodes,
                    inodes_free: u.inodes_free,
                    inodes_used: u.inodes_used,
                })
            })
            .collect();
        crate::metrics::global().set_volume_stats(&claims);
    }
    let text = crate::metrics::global().encode(
        &state.node_name,
        pods,
        &[
            ("running", running),
            ("exited", exited),
            ("created", created),
            ("unknown", unknown),
        ],
    );
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// `/configz`.
async fn configz(State(state): State<NodeApiState>) -> Response {
    axum::Json(state.configz.as_ref().clone()).into_response()
}

async fn probe_metrics(State(state): State<NodeApiState>) -> Response {
    prometheus_text(
        state
            .base
            .probes
            .as_ref()
            .map(|p| p.metrics_text())
            .unwrap_or_default(),
    )
}

async fn plugin_metrics(State(state): State<NodeApiState>) -> Response {
    prometheus_text(
        state
            .base
            .plugins
            .as_ref()
            .map(|p| p.metrics_text())
            .unwrap_or_default(),
    )
}
