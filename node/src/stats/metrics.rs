//! `/metrics/resource`: the kubelet's resource metrics
//! (`pkg/kubelet/metrics/collectors/resource_metrics.go`) computed from a
//! [`Summary`], in the Prometheus text format (0.0.4) through prometheus-client.
//!
//! Names, types, labels and help texts are upstream's, help prefixed with the
//! stability level as component-base prints it. Two differences a scraper cannot
//! see as wrong: prometheus-client's text encoder has no sample timestamps, so the
//! samples carry none (the kubelet stamps each with its reading's time), and
//! `scrape_error` is still emitted (upstream deprecated it in 1.29 and hides it).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use super::types::{CpuStats, MemoryStats, Summary};

/// `container`, `namespace`, `pod`: sorted by name, as client_golang prints them.
type ContainerLabels = [(&'static str, String); 3];
type PodLabels = [(&'static str, String); 2];

#[derive(Debug)]
struct ResourceMetrics {
    summary: Summary,
    scrape_error: bool,
}

fn seconds(cpu: &Option<CpuStats>) -> Option<f64> {
    cpu.as_ref()?
        .usage_core_nano_seconds
        .map(|ns| ns as f64 / 1e9)
}

fn working_set(memory: &Option<MemoryStats>) -> Option<f64> {
    memory.as_ref()?.working_set_bytes.map(|b| b as f64)
}

impl ResourceMetrics {
    fn pod_labels(&self) -> impl Iterator<Item = (&super::types::PodStats, PodLabels)> {
        self.summary.pods.iter().map(|p| {
            (
                p,
                [
                    ("namespace", p.pod_ref.namespace.clone()),
                    ("pod", p.pod_ref.name.clone()),
                ],
            )
        })
    }

    fn container_labels(
        &self,
    ) -> impl Iterator<Item = (&super::types::ContainerStats, ContainerLabels)> {
        self.summary.pods.iter().flat_map(|p| {
            p.containers.iter().map(move |c| {
                (
                    c,
                    [
                        ("container", c.name.clone()),
                        ("namespace", p.pod_ref.namespace.clone()),
                        ("pod", p.pod_ref.name.clone()),
                    ],
                )
            })
        })
    }
}

impl Collector for ResourceMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let node = &self.summary.node;
        if let Some(v) = seconds(&node.cpu) {
            let e = encoder.encode_descriptor(
                "node_cpu_usage_seconds",
                "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
                None,
                MetricType::Counter,
            )?;
            ConstCounter::new(v).encode(e)?;
        }
        if let Some(v) = working_set(&node.memory) {
            let e = encoder.encode_descriptor(
                "node_memory_working_set_bytes",
                "[STABLE] Current working set of the node in bytes",
                None,
                MetricType::Gauge,
            )?;
            ConstGauge::new(v).encode(e)?;
        }

        let mut e = encoder.encode_descriptor(
            "container_cpu_usage_seconds",
            "[STABLE] Cumulative cpu time consumed by the container in core-seconds",
            None,
            MetricType::Counter,
        )?;
        for (c, labels) in self.container_labels() {
            if let Some(v) = seconds(&c.cpu) {
                ConstCounter::new(v).encode(e.encode_family(&labels)?)?;
            }
        }
        let mut e = encoder.encode_descriptor(
            "container_memory_working_set_bytes",
            "[STABLE] Current working set of the container in bytes",
            None,
            MetricType::Gauge,
        )?;
        for (c, labels) in self.container_labels() {
            if let Some(v) = working_set(&c.memory) {
                ConstGauge::new(v).encode(e.encode_family(&labels)?)?;
            }
        }
        let mut e = encoder.encode_descriptor(
            "container_start_time_seconds",
            "[STABLE] Start time of the container since unix epoch in seconds",
            None,
            MetricType::Gauge,
        )?;
        for (c, labels) in self.container_labels() {
            if let Some(t) = c.start_time {
                let secs = t.0.as_nanosecond() as f64 / 1e9;
                ConstGauge::new(secs).encode(e.encode_family(&labels)?)?;
            }
        }

        let mut e = encoder.encode_descriptor(
            "pod_cpu_usage_seconds",
            "[STABLE] Cumulative cpu time consumed by the pod in core-seconds",
            None,
            MetricType::Counter,
        )?;
        for (p, labels) in self.pod_labels() {
            if let Some(v) = seconds(&p.cpu) {
                ConstCounter::new(v).encode(e.encode_family(&labels)?)?;
            }
        }
        let mut e = encoder.encode_descriptor(
            "pod_memory_working_set_bytes",
            "[STABLE] Current working set of the pod in bytes",
            None,
            MetricType::Gauge,
        )?;
        for (p, labels) in self.pod_labels() {
            if let Some(v) = working_set(&p.memory) {
                ConstGauge::new(v).encode(e.encode_family(&labels)?)?;
            }
        }

        let failed = i64::from(self.scrape_error);
        let e = encoder.encode_descriptor(
            "scrape_error",
            "[ALPHA] (Deprecated since 1.29.0) 1 if there was an error while getting container metrics, 0 otherwise",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(failed).encode(e)?;
        let e = encoder.encode_descriptor(
            "resource_scrape_error",
            "[STABLE] 1 if there was an error while getting container metrics, 0 otherwise",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(failed).encode(e)?;
        Ok(())
    }
}

/// The resource metrics of `summary` as Prometheus text (0.0.4); `scrape_error`
/// says whether the summary could not be read whole.
pub fn resource_metrics_text(summary: Summary, scrape_error: bool) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(ResourceMetrics {
        summary,
        scrape_error,
    }));
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, &registry);
    text
}

#[cfg(test)]
mod tests {
    use super::super::types::*;
    use super::*;

    fn summary() -> Summary {
        let t = Time("2026-01-02T03:04:05Z".parse().unwrap());
        let cpu = |ns| {
            Some(CpuStats {
                time: Some(t),
                usage_nano_cores: Some(1),
                usage_core_nano_seconds: Some(ns),
            })
        };
        let mem = |b| {
            Some(MemoryStats {
                time: Some(t),
                working_set_bytes: Some(b),
                ..MemoryStats::default()
            })
        };
        Summary {
            node: NodeStats {
                node_name: "n".into(),
                cpu: cpu(12_500_000_000),
                memory: mem(1 << 30),
                ..NodeStats::default()
            },
            pods: vec![PodStats {
                pod_ref: PodReference {
                    name: "spin".into(),
                    namespace: "default".into(),
                    uid: "u".into(),
                },
                containers: vec![ContainerStats {
                    name: "main".into(),
                    start_time: Some(t),
                    cpu: cpu(1_500_000_000),
                    memory: mem(4096),
                    ..ContainerStats::default()
                }],
                cpu: cpu(2_000_000_000),
                memory: mem(8192),
                ..PodStats::default()
            }],
        }
    }

    /// `name{labels} value` samples, and `# TYPE` lines, of the text.
    fn samples(text: &str) -> (Vec<(String, String)>, Vec<String>) {
        let mut types = Vec::new();
        let mut samples = Vec::new();
        for line in text.lines() {
            if let Some(t) = line.strip_prefix("# TYPE ") {
                types.push(t.to_owned());
            } else if !line.starts_with('#') && !line.is_empty() {
                let (k, v) = line.rsplit_once(' ').unwrap();
                samples.push((k.to_owned(), v.to_owned()));
            }
        }
        (samples, types)
    }

    #[test]
    fn the_text_has_the_kubelets_names_types_labels_and_help() {
        let text = resource_metrics_text(summary(), false);
        let (samples, types) = samples(&text);
        let get = |k: &str| {
            samples
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.parse::<f64>().unwrap())
                .unwrap_or_else(|| panic!("{k} missing in\n{text}"))
        };
        assert_eq!(get("node_cpu_usage_seconds_total"), 12.5);
        assert_eq!(get("node_memory_working_set_bytes"), (1u64 << 30) as f64);
        assert_eq!(
            get(r#"pod_cpu_usage_seconds_total{namespace="default",pod="spin"}"#),
            2.0
        );
        assert_eq!(
            get(r#"pod_memory_working_set_bytes{namespace="default",pod="spin"}"#),
            8192.0
        );
        let c = r#"{container="main",namespace="default",pod="spin"}"#;
        assert_eq!(get(&format!("container_cpu_usage_seconds_total{c}")), 1.5);
        assert_eq!(
            get(&format!("container_memory_working_set_bytes{c}")),
            4096.0
        );
        let start: jiff::Timestamp = "2026-01-02T03:04:05Z".parse().unwrap();
        assert_eq!(
            get(&format!("container_start_time_seconds{c}")),
            start.as_second() as f64
        );
        assert_eq!(get("scrape_error"), 0.0);
        assert_eq!(get("resource_scrape_error"), 0.0);
        for t in [
            "node_cpu_usage_seconds_total counter",
            "node_memory_working_set_bytes gauge",
            "container_cpu_usage_seconds_total counter",
            "container_memory_working_set_bytes gauge",
            "container_start_time_seconds gauge",
            "pod_cpu_usage_seconds_total counter",
            "pod_memory_working_set_bytes gauge",
            "scrape_error gauge",
            "resource_scrape_error gauge",
        ] {
            assert!(
                types.iter().any(|x| x == t),
                "# TYPE {t} missing in\n{text}"
            );
        }
        assert!(text.contains(
            "# HELP pod_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the pod in core-seconds\n"
        ), "{text}");
        assert!(!text.contains("# EOF"));
        let failed = resource_metrics_text(Summary::default(), true);
        assert!(failed.contains("\nresource_scrape_error 1\n"), "{failed}");
    }
}
