//! Per-plugin call metrics, as a snapshot and as Prometheus text.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

use crate::config::World;

/// Upper bounds (seconds) of the `wasmlet_plugin_call_duration_seconds` buckets.
pub const DURATION_BUCKETS: [f64; 15] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 5.0,
];

/// What one plugin has done since it was loaded (reloads keep the counts).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PluginMetrics {
    /// Calls asked of the plugin, refused ones included.
    pub calls: u64,
    /// Failed calls by [`CallError::kind`](crate::CallError::kind).
    pub failures: BTreeMap<&'static str, u64>,
    /// Calls that ran, per bucket of [`DURATION_BUCKETS`] (not cumulative); the
    /// last entry counts calls slower than every bound.
    pub duration_buckets: [u64; DURATION_BUCKETS.len() + 1],
    /// The calls that ran, in seconds, summed.
    pub duration_sum: f64,
    /// How many calls ran.
    pub duration_count: u64,
    /// Calls that ran on an instance made ahead of them (the others instantiated
    /// their own).
    pub prepared_calls: u64,
}

impl PluginMetrics {
    pub(crate) fn observe(&mut self, took: Duration) {
        let s = took.as_secs_f64();
        let bucket = DURATION_BUCKETS
            .iter()
            .position(|b| s <= *b)
            .unwrap_or(DURATION_BUCKETS.len());
        self.duration_buckets[bucket] += 1;
        self.duration_sum += s;
        self.duration_count += 1;
    }

    pub(crate) fn fail(&mut self, kind: &'static str) {
        *self.failures.entry(kind).or_default() += 1;
    }

    /// All failures, every kind.
    pub fn failures_total(&self) -> u64 {
        self.failures.values().sum()
    }
}

/// One plugin's line in the Prometheus text.
pub(crate) struct Row<'a> {
    pub name: &'a str,
    pub world: World,
    pub disabled: bool,
    pub metrics: &'a PluginMetrics,
}

/// Writes the counter `name`, one series per plugin labelled with its world.
fn per_plugin_counter(
    out: &mut String,
    name: &str,
    help: &str,
    rows: &[Row<'_>],
    value: impl Fn(&PluginMetrics) -> u64,
) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} counter");
    for r in rows {
        let _ = writeln!(
            out,
            "{name}{{plugin=\"{}\",world=\"{}\"}} {}",
            r.name,
            r.world,
            value(r.metrics)
        );
    }
}

/// Renders the text exposition (format 0.0.4).
pub(crate) fn render(rows: &[Row<'_>]) -> String {
    let mut out = String::new();
    per_plugin_counter(
        &mut out,
        "wasmlet_plugin_calls_total",
        "Calls asked of a plugin, refused ones included.",
        rows,
        |m| m.calls,
    );
    out.push_str("# HELP wasmlet_plugin_failures_total Failed plugin calls, by kind.\n");
    out.push_str("# TYPE wasmlet_plugin_failures_total counter\n");
    for r in rows {
        for (kind, n) in &r.metrics.failures {
            let _ = writeln!(
                out,
                "wasmlet_plugin_failures_total{{plugin=\"{}\",kind=\"{kind}\"}} {n}",
                r.name
            );
        }
    }
    per_plugin_counter(
        &mut out,
        "wasmlet_plugin_prepared_calls_total",
        "Plugin calls that ran on an instance made ahead of them.",
        rows,
        |m| m.prepared_calls,
    );
    out.push_str(
        "# HELP wasmlet_plugin_disabled Whether the plugin is disabled after repeated failures.\n",
    );
    out.push_str("# TYPE wasmlet_plugin_disabled gauge\n");
    for r in rows {
        let _ = writeln!(
            out,
            "wasmlet_plugin_disabled{{plugin=\"{}\"}} {}",
            r.name,
            u8::from(r.disabled)
        );
    }
    out.push_str("# HELP wasmlet_plugin_call_duration_seconds Duration of the plugin calls that ran, instantiation included unless an instance was made ahead of the call.\n");
    out.push_str("# TYPE wasmlet_plugin_call_duration_seconds histogram\n");
    for r in rows {
        let mut cumulative = 0;
        for (i, bound) in DURATION_BUCKETS.iter().enumerate() {
            cumulative += r.metrics.duration_buckets[i];
            let _ = writeln!(
                out,
                "wasmlet_plugin_call_duration_seconds_bucket{{plugin=\"{}\",world=\"{}\",le=\"{bound}\"}} {cumulative}",
                r.name, r.world
            );
        }
        let _ = writeln!(
            out,
            "wasmlet_plugin_call_duration_seconds_bucket{{plugin=\"{}\",world=\"{}\",le=\"+Inf\"}} {}",
            r.name, r.world, r.metrics.duration_count
        );
        let _ = writeln!(
            out,
            "wasmlet_plugin_call_duration_seconds_sum{{plugin=\"{}\",world=\"{}\"}} {}",
            r.name, r.world, r.metrics.duration_sum
        );
        let _ = writeln!(
            out,
            "wasmlet_plugin_call_duration_seconds_count{{plugin=\"{}\",world=\"{}\"}} {}",
            r.name, r.world, r.metrics.duration_count
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_their_bucket_and_render_cumulatively() {
        let mut m = PluginMetrics {
            calls: 4,
            prepared_calls: 2,
            ..PluginMetrics::default()
        };
        m.observe(Duration::from_micros(40));
        m.observe(Duration::from_micros(700));
        m.observe(Duration::from_secs(9));
        m.fail("timeout");
        assert_eq!(m.duration_buckets[0], 1);
        assert_eq!(m.duration_buckets[4], 1);
        assert_eq!(m.duration_buckets[DURATION_BUCKETS.len()], 1);
        let text = render(&[Row {
            name: "p",
            world: World::Probe,
            disabled: true,
            metrics: &m,
        }]);
        for line in [
            "wasmlet_plugin_calls_total{plugin=\"p\",world=\"probe-plugin\"} 4",
            "wasmlet_plugin_failures_total{plugin=\"p\",kind=\"timeout\"} 1",
            "wasmlet_plugin_disabled{plugin=\"p\"} 1",
            "wasmlet_plugin_prepared_calls_total{plugin=\"p\",world=\"probe-plugin\"} 2",
            "wasmlet_plugin_call_duration_seconds_bucket{plugin=\"p\",world=\"probe-plugin\",le=\"0.00005\"} 1",
            "wasmlet_plugin_call_duration_seconds_bucket{plugin=\"p\",world=\"probe-plugin\",le=\"0.001\"} 2",
            "wasmlet_plugin_call_duration_seconds_bucket{plugin=\"p\",world=\"probe-plugin\",le=\"5\"} 2",
            "wasmlet_plugin_call_duration_seconds_bucket{plugin=\"p\",world=\"probe-plugin\",le=\"+Inf\"} 3",
            "wasmlet_plugin_call_duration_seconds_count{plugin=\"p\",world=\"probe-plugin\"} 3",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
    }
}
