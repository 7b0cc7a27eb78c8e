//! The node API's statistics endpoints: `/stats/summary` (the kubelet's Summary API,
//! `?only_cpu_and_memory=true` for metrics-server's subset) and `/metrics/resource`
//! (the resource metrics, in the Prometheus text format) and `/metrics/cadvisor`
//! (cAdvisor's container metrics). All are read from [`crate::stats::StatsProvider`]
//! at request time.

use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};

use super::prometheus_text;
use crate::router::RuntimeRouter;
use crate::stats::metrics::resource_metrics_text;
use crate::stats::{Detail, StatsProvider};
use crate::status::StatusStore;

/// `only_cpu_and_memory` of a query, as the kubelet reads it: Go's `ParseBool` of
/// the one value given, anything else is `false`.
pub fn only_cpu_and_memory(query: &str) -> bool {
    let values: Vec<&str> = query
        .split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .filter(|(k, _)| *k == "only_cpu_and_memory")
        .map(|(_, v)| v)
        .collect();
    matches!(
        values.as_slice(),
        ["1" | "t" | "T" | "TRUE" | "true" | "True"]
    )
}

/// `/stats/summary`.
/// What the statistics endpoints read: the provider, the node's pods and the runtimes
/// (taken from the node API's state by `FromRef`).
#[derive(Clone)]
pub struct StatsState {
    pub stats: std::sync::Arc<StatsProvider>,
    pub statuses: StatusStore,
    pub router: RuntimeRouter,
}

pub async fn summary(State(state): State<StatsState>, RawQuery(query): RawQuery) -> Response {
    let detail = if only_cpu_and_memory(query.as_deref().unwrap_or_default()) {
        Detail::CpuAndMemory
    } else {
        Detail::Full
    };
    let pods = state.statuses.pods();
    let (summary, _) = state
        .stats
        .summary(&pods, &state.router.runtimes(), detail)
        .await;
    axum::Json(summary).into_response()
}

/// `/metrics/resource`.
pub async fn resource_metrics(State(state): State<StatsState>) -> Response {
    let pods = state.statuses.pods();
    let (summary, failed) = state
        .stats
        .summary(&pods, &state.router.runtimes(), Detail::CpuAndMemory)
        .await;
    prometheus_text(resource_metrics_text(summary, failed))
}

/// `/metrics/cadvisor`.
pub async fn cadvisor_metrics(State(state): State<StatsState>) -> Response {
    let pods = state.statuses.pods();
    let (series, machine, failed) = state.stats.cadvisor(&pods).await;
    let now = jiff::Timestamp::now().as_nanosecond() as f64 / 1e9;
    prometheus_text(crate::stats::cadvisor::cadvisor_text(
        series, machine, failed, now,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_cpu_and_memory_is_go_parse_bool_of_the_one_value() {
        assert!(only_cpu_and_memory("only_cpu_and_memory=true"));
        assert!(only_cpu_and_memory("a=b&only_cpu_and_memory=1"));
        assert!(!only_cpu_and_memory(""));
        assert!(!only_cpu_and_memory("only_cpu_and_memory=false"));
        assert!(!only_cpu_and_memory("only_cpu_and_memory=yes"));
        assert!(!only_cpu_and_memory(
            "only_cpu_and_memory=true&only_cpu_and_memory=true"
        ));
    }
}
