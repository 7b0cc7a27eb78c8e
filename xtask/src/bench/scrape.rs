//! The node's own Prometheus histograms, read from `/metrics` by the benches that
//! report node-side figures. The node under a bench lets anonymous requests in
//! ([`ANONYMOUS_API`]).

use std::collections::BTreeMap;

use anyhow::{Context, bail};
use wasmlet_testkit::node::{NodeApiAuth, TestNode};

/// The node API without credentials: a bench's node lets anonymous requests in.
pub(super) const ANONYMOUS_API: &str =
    "authentication:\n  anonymous:\n    enabled: true\nauthorization:\n  mode: AlwaysAllow\n";

/// The node's `/metrics` text.
pub(super) fn metrics(node: &TestNode) -> anyhow::Result<String> {
    let (code, body) = node.api_get("/metrics", NodeApiAuth::None)?;
    if code != 200 {
        bail!("/metrics answered {code}: {body}");
    }
    Ok(body)
}

/// One histogram series: its `_sum`, `_count`, and cumulative buckets by bound.
#[derive(Clone, Debug, Default)]
pub(super) struct Histogram {
    pub sum: f64,
    pub count: u64,
    /// `(le, cumulative count)`, ascending; `+Inf` last.
    pub buckets: Vec<(f64, u64)>,
}

impl Histogram {
    /// What was observed between `before` (an earlier scrape) and `self`.
    pub fn since(&self, before: &Histogram) -> Histogram {
        Histogram {
            sum: self.sum - before.sum,
            count: self.count.saturating_sub(before.count),
            buckets: self
                .buckets
                .iter()
                .map(|(le, n)| {
                    let earlier = before
                        .buckets
                        .iter()
                        .find(|(b, _)| b == le)
                        .map_or(0, |(_, n)| *n);
                    (*le, n.saturating_sub(earlier))
                })
                .collect(),
        }
    }

    /// The mean observation, in milliseconds.
    pub fn mean_ms(&self) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        self.sum * 1000.0 / self.count as f64
    }

    /// The smallest bucket bound at or above every observation, in milliseconds:
    /// an upper bound of the largest (`inf` when one fell past the last bound).
    pub fn max_bound_ms(&self) -> f64 {
        self.buckets
            .iter()
            .find(|(_, n)| *n >= self.count)
            .map_or(f64::INFINITY, |(le, _)| le * 1000.0)
    }
}

/// The histogram `name` with exactly the labels `labels` (`""` for none, else
/// `key="value",…` as the node writes them), from a `/metrics` text.
pub(super) fn histogram(text: &str, name: &str, labels: &str) -> anyhow::Result<Histogram> {
    let mut h = Histogram::default();
    let mut seen = false;
    for line in text.lines() {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (metric, series_labels) = match series.split_once('{') {
            Some((m, l)) => (m, l.strip_suffix('}').unwrap_or(l)),
            None => (series, ""),
        };
        let Some(kind) = metric.strip_prefix(name) else {
            continue;
        };
        match kind {
            "_sum" if series_labels == labels => {
                h.sum = value.parse()?;
                seen = true;
            }
            "_count" if series_labels == labels => h.count = value.parse()?,
            "_bucket" => {
                let Some((le, rest)) = split_le(series_labels) else {
                    continue;
                };
                if rest != labels {
                    continue;
                }
                let bound = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse()?
                };
                h.buckets.push((bound, value.parse()?));
            }
            _ => {}
        }
    }
    if !seen {
        bail!("no {name}{{{labels}}} in /metrics");
    }
    h.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok(h)
}

/// A bucket's labels split into its `le` bound and the others (as written, without
/// the `le`).
fn split_le(labels: &str) -> Option<(&str, String)> {
    let mut le = None;
    let mut rest = Vec::new();
    for part in labels.split(',') {
        match part.strip_prefix("le=\"").and_then(|v| v.strip_suffix('"')) {
            Some(v) => le = Some(v),
            None if !part.is_empty() => rest.push(part),
            None => {}
        }
    }
    Some((le?, rest.join(",")))
}

/// Every series of the histogram `name` labelled `operation_type="…"` (and nothing
/// else), by operation.
pub(super) fn by_operation(text: &str, name: &str) -> anyhow::Result<BTreeMap<String, Histogram>> {
    let mut ops = BTreeMap::new();
    for line in text.lines() {
        let Some(labels) = line
            .strip_prefix(name)
            .and_then(|l| l.strip_prefix("_count{"))
            .and_then(|l| l.split_once('}'))
            .map(|(labels, _)| labels)
        else {
            continue;
        };
        let Some(op) = labels
            .strip_prefix("operation_type=\"")
            .and_then(|l| l.strip_suffix('"'))
        else {
            continue;
        };
        let h =
            histogram(text, name, labels).with_context(|| format!("{name} for operation {op}"))?;
        ops.insert(op.to_owned(), h);
    }
    Ok(ops)
}

/// Per operation, how many ran between two [`by_operation`] scrapes and their mean.
pub(super) fn operations_between(
    before: &BTreeMap<String, Histogram>,
    after: &BTreeMap<String, Histogram>,
) -> Vec<(String, u64, f64)> {
    after
        .iter()
        .filter_map(|(op, h)| {
            let seen = h.since(&before.get(op).cloned().unwrap_or_default());
            (seen.count > 0).then(|| (op.clone(), seen.count, seen.mean_ms()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
# TYPE kubelet_pleg_relist_duration_seconds histogram
kubelet_pleg_relist_duration_seconds_bucket{le=\"0.005\"} 3
kubelet_pleg_relist_duration_seconds_bucket{le=\"0.01\"} 4
kubelet_pleg_relist_duration_seconds_bucket{le=\"+Inf\"} 4
kubelet_pleg_relist_duration_seconds_sum 0.012
kubelet_pleg_relist_duration_seconds_count 4
kubelet_runtime_operations_duration_seconds_bucket{operation_type=\"run_podsandbox\",le=\"0.01\"} 1
kubelet_runtime_operations_duration_seconds_bucket{operation_type=\"run_podsandbox\",le=\"+Inf\"} 2
kubelet_runtime_operations_duration_seconds_sum{operation_type=\"run_podsandbox\"} 0.03
kubelet_runtime_operations_duration_seconds_count{operation_type=\"run_podsandbox\"} 2
";

    #[test]
    fn a_histogram_without_labels_reads_its_sum_count_and_buckets() {
        let h = histogram(TEXT, "kubelet_pleg_relist_duration_seconds", "").unwrap();
        assert_eq!(h.count, 4);
        assert!((h.mean_ms() - 3.0).abs() < 1e-9);
        assert_eq!(h.max_bound_ms(), 10.0);
    }

    #[test]
    fn the_difference_of_two_scrapes_counts_only_what_came_between() {
        let before = histogram(TEXT, "kubelet_pleg_relist_duration_seconds", "").unwrap();
        let mut after = before.clone();
        after.count += 1;
        after.sum += 0.02;
        for b in &mut after.buckets {
            if b.0 > 0.01 {
                b.1 += 1;
            }
        }
        let seen = after.since(&before);
        assert_eq!(seen.count, 1);
        assert!(seen.max_bound_ms().is_infinite());
    }

    #[test]
    fn operations_are_read_by_their_label() {
        let ops = by_operation(TEXT, "kubelet_runtime_operations_duration_seconds").unwrap();
        let h = &ops["run_podsandbox"];
        assert_eq!(h.count, 2);
        assert!((h.mean_ms() - 15.0).abs() < 1e-9);
        assert_eq!(h.max_bound_ms(), f64::INFINITY);
    }
}
