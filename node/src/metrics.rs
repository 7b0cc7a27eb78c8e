//! The agent's own metrics at `/metrics`, by the kubelet's names where it has them
//! (`pkg/kubelet/metrics`): the PLEG's relists, the pod workers' syncs, pod start
//! durations, the container runtime's operations (counted, failed and timed per
//! operation by [`crate::kuberuntime::instrumented`]), and the running pods and
//! containers (counted at each scrape). Encoded
//! by prometheus-client in the OpenMetrics text format.
//!
//! One set per process ([`global`]), as the kubelet's registry is; tests make their own
//! with [`NodeMetrics::new`].

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Prometheus' default buckets (`prometheus.DefBuckets`), the kubelet's for these.
const DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// `kubelet_pod_start_duration_seconds`' buckets.
const POD_START_BUCKETS: [f64; 25] = [
    0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0,
    300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Operation {
    operation_type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ContainerState {
    container_state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Claim {
    namespace: String,
    persistentvolumeclaim: String,
}

/// A claimed volume's usage, for the `kubelet_volume_stats_*` gauges.
#[derive(Clone, Debug, Default)]
pub struct ClaimUsage {
    pub namespace: String,
    pub claim: String,
    pub capacity_bytes: Option<u64>,
    pub available_bytes: Option<u64>,
    pub used_bytes: Option<u64>,
    pub inodes: Option<u64>,
    pub inodes_free: Option<u64>,
    pub inodes_used: Option<u64>,
}

/// The `kubelet_volume_stats_*` gauges, by (namespace, persistentvolumeclaim).
struct VolumeStatsGauges([Family<Claim, Gauge>; 6]);

impl VolumeStatsGauges {
    const NAMES: [(&'static str, &'static str); 6] = [
        (
            "kubelet_volume_stats_capacity_bytes",
            "[ALPHA] Capacity in bytes of the volume",
        ),
        (
            "kubelet_volume_stats_available_bytes",
            "[ALPHA] Number of available bytes in the volume",
        ),
        (
            "kubelet_volume_stats_used_bytes",
            "[ALPHA] Number of used bytes in the volume",
        ),
        (
            "kubelet_volume_stats_inodes",
            "[ALPHA] Maximum number of inodes in the volume",
        ),
        (
            "kubelet_volume_stats_inodes_free",
            "[ALPHA] Number of free inodes in the volume",
        ),
        (
            "kubelet_volume_stats_inodes_used",
            "[ALPHA] Number of used inodes in the volume",
        ),
    ];

    fn register(registry: &mut Registry) -> Self {
        let families: [Family<Claim, Gauge>; 6] = Default::default();
        for ((name, help), f) in Self::NAMES.iter().zip(&families) {
            registry.register(*name, *help, f.clone());
        }
        VolumeStatsGauges(families)
    }

    /// Replaces every sample with those of `claims` (a claim no longer used goes).
    fn set(&self, claims: &[ClaimUsage]) {
        for f in &self.0 {
            f.clear();
        }
        for c in claims {
            let labels = Claim {
                namespace: c.namespace.clone(),
                persistentvolumeclaim: c.claim.clone(),
            };
            let values = [
                c.capacity_bytes,
                c.available_bytes,
                c.used_bytes,
                c.inodes,
                c.inodes_free,
                c.inodes_used,
            ];
            for (f, v) in self.0.iter().zip(values) {
                if let Some(v) = v {
                    f.get_or_create(&labels)
                        .set(i64::try_from(v).unwrap_or(i64::MAX));
                }
            }
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeName {
    node: String,
}

fn histogram(buckets: &'static [f64]) -> Histogram {
    Histogram::new(buckets.iter().copied())
}

fn default_histogram() -> Histogram {
    histogram(&DEFAULT_BUCKETS)
}

/// `kubelet_runtime_operations_duration_seconds`' buckets: 5ms growing by 2.5 times,
/// 14 of them (the last about 6.1 hours), as the kubelet's.
fn runtime_operation_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.5, 14))
}

/// What a pod worker did, as `kubelet_pod_worker_duration_seconds` labels it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncKind {
    /// The first sync of a pod.
    Create,
    /// A later sync.
    Sync,
    /// Terminating the pod.
    Kill,
}

impl SyncKind {
    fn label(self) -> &'static str {
        match self {
            SyncKind::Create => "create",
            SyncKind::Sync => "sync",
            SyncKind::Kill => "kill",
        }
    }
}

/// The metrics and the registry that encodes them.
pub struct NodeMetrics {
    registry: Registry,
    pleg_relist_duration: Histogram,
    pleg_relist_interval: Histogram,
    pleg_last_seen: Gauge<f64, std::sync::atomic::AtomicU64>,
    pod_worker_duration: Family<Operation, Histogram, fn() -> Histogram>,
    pod_start_duration: Histogram,
    runtime_operations: RuntimeOperations,
    running_pods: Gauge,
    running_containers: Family<ContainerState, Gauge>,
    node_name: Family<NodeName, Gauge>,
    shutdown_start: Gauge<f64, std::sync::atomic::AtomicU64>,
    shutdown_end: Gauge<f64, std::sync::atomic::AtomicU64>,
    volume_stats: VolumeStatsGauges,
}

impl Default for NodeMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl NodeMetrics {
    pub fn new() -> NodeMetrics {
        let mut registry = Registry::default();
        let pleg_relist_duration = histogram(&DEFAULT_BUCKETS);
        registry.register(
            "kubelet_pleg_relist_duration_seconds",
            "[ALPHA] Duration in seconds for relisting pods in PLEG",
            pleg_relist_duration.clone(),
        );
        let pleg_relist_interval = histogram(&DEFAULT_BUCKETS);
        registry.register(
            "kubelet_pleg_relist_interval_seconds",
            "[ALPHA] Interval in seconds between relisting in PLEG",
            pleg_relist_interval.clone(),
        );
        let pleg_last_seen = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "kubelet_pleg_last_seen_seconds",
            "[ALPHA] Timestamp in seconds when PLEG was last seen active",
            pleg_last_seen.clone(),
        );
        let pod_worker_duration =
            Family::new_with_constructor(default_histogram as fn() -> Histogram);
        registry.register(
            "kubelet_pod_worker_duration_seconds",
            "[ALPHA] Duration in seconds to sync a single pod. Broken down by operation type: create, update, or sync",
            pod_worker_duration.clone(),
        );
        let pod_start_duration = histogram(&POD_START_BUCKETS);
        registry.register(
            "kubelet_pod_start_duration_seconds",
            "[ALPHA] Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run",
            pod_start_duration.clone(),
        );
        let runtime_operations = RuntimeOperations::register(&mut registry);
        let running_pods = Gauge::default();
        registry.register(
            "kubelet_running_pods",
            "[ALPHA] Number of pods that have a running pod sandbox",
            running_pods.clone(),
        );
        let running_containers = Family::<ContainerState, Gauge>::default();
        registry.register(
            "kubelet_running_containers",
            "[ALPHA] Number of containers currently running",
            running_containers.clone(),
        );
        let node_name = Family::<NodeName, Gauge>::default();
        registry.register(
            "kubelet_node_name",
            "[ALPHA] The node's name. The count is always 1.",
            node_name.clone(),
        );
        let shutdown_start = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "kubelet_graceful_shutdown_start_time_seconds",
            "[ALPHA] Last graceful shutdown start time since unix epoch in seconds",
            shutdown_start.clone(),
        );
        let shutdown_end = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "kubelet_graceful_shutdown_end_time_seconds",
            "[ALPHA] Last graceful shutdown end time since unix epoch in seconds",
            shutdown_end.clone(),
        );
        let volume_stats = VolumeStatsGauges::register(&mut registry);
        NodeMetrics {
            volume_stats,
            registry,
            shutdown_start,
            shutdown_end,
            pleg_relist_duration,
            pleg_relist_interval,
            pleg_last_seen,
            pod_worker_duration,
            pod_start_duration,
            runtime_operations,
            running_pods,
            running_containers,
            node_name,
        }
    }

    /// The usage of the node's claimed volumes, as of now.
    pub fn set_volume_stats(&self, claims: &[ClaimUsage]) {
        self.volume_stats.set(claims);
    }

    /// A relist that took `took`, `since_last` after the previous one began.
    pub fn relisted(&self, took: Duration, since_last: Option<Duration>) {
        self.pleg_relist_duration.observe(took.as_secs_f64());
        if let Some(interval) = since_last {
            self.pleg_relist_interval.observe(interval.as_secs_f64());
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        self.pleg_last_seen.set(now.as_secs_f64());
    }

    /// A pod worker's sync or kill that took `took`.
    pub fn pod_worker(&self, kind: SyncKind, took: Duration) {
        self.pod_worker_duration
            .get_or_create(&Operation {
                operation_type: kind.label(),
            })
            .observe(took.as_secs_f64());
    }

    /// A graceful node shutdown began at `at`.
    pub fn shutdown_started(&self, at: std::time::SystemTime) {
        self.shutdown_start.set(epoch_seconds(at));
    }

    /// The graceful node shutdown ended at `at` (every group stopped or out of time).
    pub fn shutdown_ended(&self, at: std::time::SystemTime) {
        self.shutdown_end.set(epoch_seconds(at));
    }

    /// A pod that started running `took` after the node first saw it.
    pub fn pod_started(&self, took: Duration) {
        self.pod_start_duration.observe(took.as_secs_f64());
    }

    /// One call of the container runtime, `operation` by the kubelet's name for it
    /// (`run_podsandbox`, `create_container`, …), that took `took` and returned an
    /// error if `failed`. Every call is counted and timed; a failed one is also
    /// counted as an error.
    pub fn runtime_operation(&self, operation: &'static str, took: Duration, failed: bool) {
        self.runtime_operations.record(operation, took, failed);
    }

    /// The text of `/metrics`, with the running pods and containers as counted now.
    pub fn encode(
        &self,
        node: &str,
        running_pods: i64,
        containers: &[(&'static str, i64)],
    ) -> String {
        self.node_name
            .get_or_create(&NodeName {
                node: node.to_owned(),
            })
            .set(1);
        self.running_pods.set(running_pods);
        for (state, n) in containers {
            self.running_containers
                .get_or_create(&ContainerState {
                    container_state: state,
                })
                .set(*n);
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The container runtime's operations, by operation type.
struct RuntimeOperations {
    total: Family<Operation, Counter>,
    errors: Family<Operation, Counter>,
    duration: Family<Operation, Histogram, fn() -> Histogram>,
}

impl RuntimeOperations {
    /// Registers the families under the kubelet's names and HELP texts; the encoder
    /// adds the counters' `_total` suffix and the HELP text's final full stop.
    fn register(registry: &mut Registry) -> RuntimeOperations {
        let total = Family::<Operation, Counter>::default();
        registry.register(
            "kubelet_runtime_operations",
            "[ALPHA] Cumulative number of runtime operations by operation type",
            total.clone(),
        );
        let errors = Family::<Operation, Counter>::default();
        registry.register(
            "kubelet_runtime_operations_errors",
            "[ALPHA] Cumulative number of runtime operation errors by operation type",
            errors.clone(),
        );
        let duration =
            Family::new_with_constructor(runtime_operation_histogram as fn() -> Histogram);
        registry.register(
            "kubelet_runtime_operations_duration_seconds",
            "[ALPHA] Duration in seconds of runtime operations. Broken down by operation type",
            duration.clone(),
        );
        RuntimeOperations {
            total,
            errors,
            duration,
        }
    }

    fn record(&self, operation: &'static str, took: Duration, failed: bool) {
        let labels = Operation {
            operation_type: operation,
        };
        self.total.get_or_create(&labels).inc();
        self.duration
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
        if failed {
            self.errors.get_or_create(&labels).inc();
        }
    }
}

/// The process's metrics.
fn epoch_seconds(at: std::time::SystemTime) -> f64 {
    at.duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

pub fn global() -> &'static NodeMetrics {
    static METRICS: LazyLock<NodeMetrics> = LazyLock::new(NodeMetrics::new);
    &METRICS
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of a sample line `name{labels} value` in the text.
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn volume_stats_are_by_claim_and_a_claim_no_longer_used_goes() {
        let m = NodeMetrics::new();
        m.set_volume_stats(&[ClaimUsage {
            namespace: "default".into(),
            claim: "data".into(),
            capacity_bytes: Some(1 << 30),
            used_bytes: Some(4096),
            ..Default::default()
        }]);
        let text = m.encode("n1", 0, &[]);
        let series = "kubelet_volume_stats_capacity_bytes{namespace=\"default\",persistentvolumeclaim=\"data\"}";
        assert_eq!(sample(&text, series), Some((1u64 << 30) as f64), "{text}");
        assert!(text.contains(
            "# HELP kubelet_volume_stats_used_bytes [ALPHA] Number of used bytes in the volume"
        ));
        // What the driver did not report is not made up.
        assert!(!text.contains("kubelet_volume_stats_inodes{"), "{text}");
        m.set_volume_stats(&[]);
        assert_eq!(sample(&m.encode("n1", 0, &[]), series), None);
    }

    #[test]
    fn the_kubelets_names_buckets_and_labels() {
        let m = NodeMetrics::new();
        m.relisted(Duration::from_millis(3), None);
        m.relisted(Duration::from_millis(30), Some(Duration::from_secs(1)));
        m.pod_worker(SyncKind::Create, Duration::from_millis(200));
        m.pod_worker(SyncKind::Sync, Duration::from_millis(20));
        m.pod_worker(SyncKind::Sync, Duration::from_millis(2));
        m.pod_started(Duration::from_millis(1500));
        let text = m.encode("edge-1", 2, &[("running", 3), ("exited", 1)]);

        assert_eq!(
            sample(&text, "kubelet_pleg_relist_duration_seconds_count"),
            Some(2.0)
        );
        assert_eq!(
            sample(
                &text,
                "kubelet_pleg_relist_duration_seconds_bucket{le=\"0.005\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, "kubelet_pleg_relist_interval_seconds_count"),
            Some(1.0)
        );
        assert!(sample(&text, "kubelet_pleg_last_seen_seconds").unwrap() > 1.7e9);
        assert_eq!(
            sample(
                &text,
                "kubelet_pod_worker_duration_seconds_count{operation_type=\"sync\"}"
            ),
            Some(2.0)
        );
        assert_eq!(
            sample(
                &text,
                "kubelet_pod_worker_duration_seconds_bucket{le=\"0.25\",operation_type=\"create\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                "kubelet_pod_start_duration_seconds_bucket{le=\"1.0\"}"
            ),
            Some(0.0)
        );
        assert_eq!(
            sample(
                &text,
                "kubelet_pod_start_duration_seconds_bucket{le=\"2.0\"}"
            ),
            Some(1.0)
        );
        assert_eq!(sample(&text, "kubelet_running_pods"), Some(2.0));
        assert_eq!(
            sample(
                &text,
                "kubelet_running_containers{container_state=\"running\"}"
            ),
            Some(3.0)
        );
        assert_eq!(
            sample(&text, "kubelet_node_name{node=\"edge-1\"}"),
            Some(1.0)
        );
        assert!(text.contains("# TYPE kubelet_pod_worker_duration_seconds histogram"));
        assert!(text.trim_end().ends_with("# EOF"));
    }

    #[test]
    fn runtime_operations_are_counted_failed_and_timed_by_type() {
        let m = NodeMetrics::new();
        m.runtime_operation("create_container", Duration::from_millis(3), false);
        m.runtime_operation("create_container", Duration::from_millis(20), true);
        m.runtime_operation("pull_image", Duration::from_secs(2), false);
        let text = m.encode("edge-1", 0, &[]);

        let create = "{operation_type=\"create_container\"}";
        assert_eq!(
            sample(&text, &format!("kubelet_runtime_operations_total{create}")),
            Some(2.0)
        );
        assert_eq!(
            sample(
                &text,
                &format!("kubelet_runtime_operations_errors_total{create}")
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                "kubelet_runtime_operations_errors_total{operation_type=\"pull_image\"}"
            ),
            None,
            "no error series for an operation that never failed"
        );
        // The buckets: 0.005, 0.0125, 0.03125, … ×2.5 each.
        assert_eq!(
            sample(
                &text,
                "kubelet_runtime_operations_duration_seconds_bucket{le=\"0.005\",operation_type=\"create_container\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                "kubelet_runtime_operations_duration_seconds_bucket{le=\"0.03125\",operation_type=\"create_container\"}"
            ),
            Some(2.0)
        );
        assert_eq!(
            sample(
                &text,
                "kubelet_runtime_operations_duration_seconds_count{operation_type=\"pull_image\"}"
            ),
            Some(1.0)
        );
        assert!(text.contains("# TYPE kubelet_runtime_operations counter"));
        assert!(text.contains("# TYPE kubelet_runtime_operations_duration_seconds histogram"));
    }
}
