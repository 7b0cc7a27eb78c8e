//! `/metrics/cadvisor`: the container metrics scrapers read most from the kubelet's
//! embedded cAdvisor (`github.com/google/cadvisor/metrics/prometheus.go`), from the
//! same cgroup readings as the Summary, in the Prometheus text format (0.0.4) through
//! prometheus-client.
//!
//! Series, one label set each, as the kubelet labels them
//! (`containerPrometheusLabelsFunc`: `container`, `id`, `image`, `name`, `namespace`,
//! `pod`, blank when unknown):
//! - the machine's root cgroup, `id="/"`;
//! - each pod cgroup, `container=""` and the pod's name and namespace;
//! - each container with figures of its own: a CRI container's cgroup (`name` its
//!   runtime id, `image` its image), and the one container of a Wasm pod, whose
//!   figures are its pod cgroup's (so its `id` is that cgroup's too).
//!
//! Metrics: cpu (`container_cpu_usage_seconds_total{cpu="total"}`, as cAdvisor
//! without per-cpu usage), memory (usage, working set, rss, cache), the spec's memory
//! limit, start time and last seen, and network per interface. Differences a scraper
//! may see: network is reported on the pod's series (`container=""`), read from the
//! pod's network namespace, not on each container that shares it; start times are the
//! container's and the pod's start, not the cgroup's creation; no sample timestamps
//! (prometheus-client's text encoder has none); disk I/O, filesystem, tasks and
//! per-cpu metrics are not served.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use super::cgroupfs::MemorySample;
use super::procfs::NetDev;

/// The kubelet's base labels of a cAdvisor series.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Labels {
    /// The Kubernetes container name; blank for a pod or the machine.
    pub container: String,
    /// The cgroup's name (its path below the hierarchy's root).
    pub id: String,
    pub image: String,
    /// The runtime's name of the container (its id).
    pub name: String,
    pub namespace: String,
    pub pod: String,
}

/// One cgroup's figures.
#[derive(Clone, Debug, Default)]
pub struct Series {
    pub labels: Labels,
    pub cpu_ns: Option<u64>,
    pub memory: Option<MemorySample>,
    pub network: Vec<NetDev>,
    /// Seconds since the epoch.
    pub start_time: Option<f64>,
}

/// `machine_*`.
#[derive(Clone, Debug, Default)]
pub struct Machine {
    pub cpu_cores: Option<u64>,
    pub memory_bytes: Option<u64>,
}

type LabelSet = Vec<(&'static str, String)>;

impl Labels {
    /// The labels and `extra`, sorted by name as client_golang prints them.
    fn with(&self, extra: Option<(&'static str, &str)>) -> LabelSet {
        let mut set: LabelSet = vec![
            ("container", self.container.clone()),
            ("id", self.id.clone()),
            ("image", self.image.clone()),
            ("name", self.name.clone()),
            ("namespace", self.namespace.clone()),
            ("pod", self.pod.clone()),
        ];
        if let Some((k, v)) = extra {
            set.push((k, v.to_owned()));
        }
        set.sort_by_key(|(k, _)| *k);
        set
    }
}

#[derive(Debug)]
struct CadvisorMetrics {
    series: Vec<Series>,
    machine: Machine,
    scrape_error: bool,
    now_secs: f64,
}

type Gauge = fn(&Series) -> Option<f64>;
type Interface = fn(&NetDev) -> u64;

fn memory(s: &Series, f: fn(&MemorySample) -> Option<u64>) -> Option<f64> {
    s.memory.as_ref().and_then(f).map(|v| v as f64)
}

const GAUGES: &[(&str, &str, Gauge)] = &[
    (
        "container_memory_cache",
        "Number of bytes of page cache memory.",
        |s| memory(s, |m| m.cache_bytes),
    ),
    ("container_memory_rss", "Size of RSS in bytes.", |s| {
        memory(s, |m| m.rss_bytes)
    }),
    (
        "container_memory_usage_bytes",
        "Current memory usage in bytes, including all memory regardless of when it was accessed",
        |s| memory(s, |m| Some(m.usage_bytes)),
    ),
    (
        "container_memory_working_set_bytes",
        "Current working set in bytes.",
        |s| memory(s, |m| Some(m.working_set_bytes)),
    ),
    (
        "container_spec_memory_limit_bytes",
        "Memory limit for the container.",
        // cAdvisor reports no limit as 0.
        |s| memory(s, |m| Some(m.limit_bytes.unwrap_or(0))),
    ),
    (
        "container_start_time_seconds",
        "Start time of the container since unix epoch in seconds.",
        |s| s.start_time,
    ),
];

/// Counters per interface; names without `_total`, which the encoder appends.
const NETWORK: &[(&str, &str, Interface)] = &[
    (
        "container_network_receive_bytes",
        "Cumulative count of bytes received",
        |d| d.rx_bytes,
    ),
    (
        "container_network_receive_errors",
        "Cumulative count of errors encountered while receiving",
        |d| d.rx_errors,
    ),
    (
        "container_network_receive_packets_dropped",
        "Cumulative count of packets dropped while receiving",
        |d| d.rx_dropped,
    ),
    (
        "container_network_receive_packets",
        "Cumulative count of packets received",
        |d| d.rx_packets,
    ),
    (
        "container_network_transmit_bytes",
        "Cumulative count of bytes transmitted",
        |d| d.tx_bytes,
    ),
    (
        "container_network_transmit_errors",
        "Cumulative count of errors encountered while transmitting",
        |d| d.tx_errors,
    ),
    (
        "container_network_transmit_packets_dropped",
        "Cumulative count of packets dropped while transmitting",
        |d| d.tx_dropped,
    ),
    (
        "container_network_transmit_packets",
        "Cumulative count of packets transmitted",
        |d| d.tx_packets,
    ),
];

impl Collector for CadvisorMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let mut e = encoder.encode_descriptor(
            "container_cpu_usage_seconds",
            "Cumulative cpu time consumed in seconds.",
            None,
            MetricType::Counter,
        )?;
        for s in &self.series {
            // cAdvisor leaves out a cgroup that has used no cpu at all.
            if let Some(ns) = s.cpu_ns.filter(|ns| *ns > 0) {
                let labels = s.labels.with(Some(("cpu", "total")));
                ConstCounter::new(ns as f64 / 1e9).encode(e.encode_family(&labels)?)?;
            }
        }
        let mut e = encoder.encode_descriptor(
            "container_last_seen",
            "Last time a container was seen by the exporter",
            None,
            MetricType::Gauge,
        )?;
        for s in &self.series {
            let labels = s.labels.with(None);
            ConstGauge::new(self.now_secs.floor()).encode(e.encode_family(&labels)?)?;
        }
        for (name, help, value) in GAUGES {
            let mut e = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for s in &self.series {
                if let Some(v) = value(s) {
                    ConstGauge::new(v).encode(e.encode_family(&s.labels.with(None))?)?;
                }
            }
        }
        for (name, help, value) in NETWORK {
            let mut e = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for s in &self.series {
                for d in &s.network {
                    let labels = s.labels.with(Some(("interface", &d.name)));
                    ConstCounter::new(value(d)).encode(e.encode_family(&labels)?)?;
                }
            }
        }
        let e = encoder.encode_descriptor(
            "container_scrape_error",
            "1 if there was an error while getting container metrics, 0 otherwise",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(i64::from(self.scrape_error)).encode(e)?;
        if let Some(n) = self.machine.cpu_cores {
            let e = encoder.encode_descriptor(
                "machine_cpu_cores",
                "Number of logical CPU cores.",
                None,
                MetricType::Gauge,
            )?;
            ConstGauge::new(n as i64).encode(e)?;
        }
        if let Some(b) = self.machine.memory_bytes {
            let e = encoder.encode_descriptor(
                "machine_memory_bytes",
                "Amount of memory installed on the machine.",
                None,
                MetricType::Gauge,
            )?;
            ConstGauge::new(b as f64).encode(e)?;
        }
        Ok(())
    }
}

/// The series as Prometheus text (0.0.4); `scrape_error` says whether some cgroup
/// could not be read, `now_secs` is `container_last_seen`.
pub fn cadvisor_text(
    series: Vec<Series>,
    machine: Machine,
    scrape_error: bool,
    now_secs: f64,
) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(CadvisorMetrics {
        series,
        machine,
        scrape_error,
        now_secs,
    }));
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, &registry);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series() -> Vec<Series> {
        let mem = MemorySample {
            usage_bytes: 3000,
            working_set_bytes: 2000,
            rss_bytes: Some(1500),
            cache_bytes: Some(700),
            limit_bytes: Some(1 << 26),
            ..MemorySample::default()
        };
        let dev = NetDev {
            name: "eth0".into(),
            rx_bytes: 10,
            rx_packets: 2,
            rx_errors: 1,
            rx_dropped: 3,
            tx_bytes: 20,
            tx_packets: 4,
            tx_errors: 5,
            tx_dropped: 6,
        };
        vec![
            Series {
                labels: Labels {
                    id: "/".into(),
                    ..Labels::default()
                },
                cpu_ns: Some(12_500_000_000),
                memory: Some(MemorySample {
                    limit_bytes: None,
                    ..mem.clone()
                }),
                ..Series::default()
            },
            Series {
                labels: Labels {
                    id: "/kubepods/burstable/podu".into(),
                    namespace: "default".into(),
                    pod: "web".into(),
                    ..Labels::default()
                },
                cpu_ns: Some(2_000_000_000),
                memory: Some(mem.clone()),
                network: vec![dev],
                start_time: Some(1_767_225_600.0),
            },
            Series {
                labels: Labels {
                    container: "app".into(),
                    id: "/kubepods/burstable/podu/abc".into(),
                    image: "busybox:1".into(),
                    name: "abc".into(),
                    namespace: "default".into(),
                    pod: "web".into(),
                },
                cpu_ns: Some(1_500_000_000),
                memory: Some(mem),
                ..Series::default()
            },
            Series {
                labels: Labels {
                    id: "/kubepods/besteffort/podidle".into(),
                    pod: "idle".into(),
                    namespace: "default".into(),
                    ..Labels::default()
                },
                cpu_ns: Some(0),
                ..Series::default()
            },
        ]
    }

    fn value(text: &str, key: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("{key} missing in\n{text}"))
            .parse()
            .unwrap()
    }

    #[test]
    fn the_text_has_cadvisors_names_labels_and_help() {
        let machine = Machine {
            cpu_cores: Some(2),
            memory_bytes: Some(1 << 30),
        };
        let text = cadvisor_text(series(), machine, false, 1_800_000_000.5);
        let ctr = r#"container="app",id="/kubepods/burstable/podu/abc",image="busybox:1",name="abc",namespace="default",pod="web""#;
        let pod = r#"container="",id="/kubepods/burstable/podu",image="",name="",namespace="default",pod="web""#;
        let root = r#"container="",id="/",image="",name="",namespace="",pod="""#;
        assert_eq!(
            value(
                &text,
                r#"container_cpu_usage_seconds_total{container="app",cpu="total",id="/kubepods/burstable/podu/abc",image="busybox:1",name="abc",namespace="default",pod="web"}"#
            ),
            1.5
        );
        assert_eq!(
            value(
                &text,
                r#"container_cpu_usage_seconds_total{container="",cpu="total",id="/",image="",name="",namespace="",pod=""}"#
            ),
            12.5
        );
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("container_cpu_usage_seconds_total{")
                    && l.contains("podidle")),
            "a cgroup that used no cpu has no cpu series\n{text}"
        );
        assert!(
            text.contains(r#"container_last_seen{container="",id="/kubepods/besteffort/podidle""#)
        );
        for (metric, want) in [
            ("container_memory_working_set_bytes", 2000.0),
            ("container_memory_usage_bytes", 3000.0),
            ("container_memory_rss", 1500.0),
            ("container_memory_cache", 700.0),
            ("container_spec_memory_limit_bytes", (1u64 << 26) as f64),
            ("container_last_seen", 1_800_000_000.0),
        ] {
            assert_eq!(
                value(&text, &format!("{metric}{{{ctr}}}")),
                want,
                "{metric}"
            );
        }
        assert_eq!(
            value(
                &text,
                &format!("container_spec_memory_limit_bytes{{{root}}}")
            ),
            0.0,
            "no limit is 0"
        );
        assert_eq!(
            value(&text, &format!("container_start_time_seconds{{{pod}}}")),
            1_767_225_600.0
        );
        let net = r#"{container="",id="/kubepods/burstable/podu",image="",interface="eth0",name="",namespace="default",pod="web"}"#;
        for (metric, want) in [
            ("container_network_receive_bytes_total", 10.0),
            ("container_network_receive_packets_total", 2.0),
            ("container_network_receive_errors_total", 1.0),
            ("container_network_receive_packets_dropped_total", 3.0),
            ("container_network_transmit_bytes_total", 20.0),
            ("container_network_transmit_packets_total", 4.0),
            ("container_network_transmit_errors_total", 5.0),
            ("container_network_transmit_packets_dropped_total", 6.0),
        ] {
            assert_eq!(value(&text, &format!("{metric}{net}")), want, "{metric}");
        }
        assert_eq!(value(&text, "container_scrape_error"), 0.0);
        assert_eq!(value(&text, "machine_cpu_cores"), 2.0);
        assert_eq!(value(&text, "machine_memory_bytes"), (1u64 << 30) as f64);
        for line in [
            "# HELP container_cpu_usage_seconds_total Cumulative cpu time consumed in seconds.",
            "# TYPE container_cpu_usage_seconds_total counter",
            "# TYPE container_memory_working_set_bytes gauge",
            "# HELP container_network_receive_bytes_total Cumulative count of bytes received",
            "# TYPE container_network_receive_bytes_total counter",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        let failed = cadvisor_text(Vec::new(), Machine::default(), true, 0.0);
        assert!(failed.contains("\ncontainer_scrape_error 1\n"), "{failed}");
    }
}
