//! `usageNanoCores`: the rate of a cumulative CPU counter between two readings, as
//! the kubelet's CRI stats provider computes it from its cache of the previous
//! reading per container. A reading replaces the cached one only when it is at
//! least [`MIN_WINDOW`] newer, so two scrapes a few milliseconds apart do not give
//! a rate over a window too short to mean anything; they get the last rate.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The shortest window a rate is computed over.
pub const MIN_WINDOW: Duration = Duration::from_millis(500);

#[derive(Clone, Copy, Debug)]
struct Entry {
    at: Instant,
    usage_ns: u64,
    rate: Option<u64>,
}

/// The previous CPU reading of each cgroup (keyed by its path), shared by requests.
#[derive(Debug, Default)]
pub struct CpuRates {
    entries: Mutex<HashMap<String, Entry>>,
}

impl CpuRates {
    /// Records `usage_ns` read at `at` for `key`; the rate in ns of CPU per second
    /// (nano-cores) since the cached reading, or the last rate computed when that
    /// reading is too recent; `None` on the first reading (or after a counter reset).
    pub fn observe(&self, key: &str, at: Instant, usage_ns: u64) -> Option<u64> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = Entry {
            at,
            usage_ns,
            rate: None,
        };
        let Some(prev) = entries.get(key).copied() else {
            entries.insert(key.to_owned(), fresh);
            return None;
        };
        if usage_ns < prev.usage_ns || at < prev.at {
            // A new cgroup under the same name: start over.
            entries.insert(key.to_owned(), fresh);
            return None;
        }
        let window = at - prev.at;
        if window < MIN_WINDOW {
            return prev.rate;
        }
        let rate =
            ((usage_ns - prev.usage_ns) as u128 * 1_000_000_000 / window.as_nanos().max(1)) as u64;
        entries.insert(
            key.to_owned(),
            Entry {
                rate: Some(rate),
                ..fresh
            },
        );
        Some(rate)
    }

    /// Whether `key` has a reading cached.
    pub fn has(&self, key: &str) -> bool {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(key)
    }

    /// Forgets the cgroups not in `keep` (pods that are gone).
    pub fn retain(&self, keep: &std::collections::HashSet<String>) {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| keep.contains(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_rate_is_computed_between_readings_on_the_paused_clock() {
        let rates = CpuRates::default();
        let t0 = Instant::now();
        assert_eq!(rates.observe("a", t0, 1_000_000_000), None);
        tokio::time::advance(Duration::from_secs(2)).await;
        // 1 s of CPU over 2 s: half a core.
        assert_eq!(
            rates.observe("a", Instant::now(), 2_000_000_000),
            Some(500_000_000)
        );
        // Too soon after: the last rate, and the base is kept.
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(
            rates.observe("a", Instant::now(), 2_100_000_000),
            Some(500_000_000)
        );
        tokio::time::advance(Duration::from_millis(900)).await;
        // From the 2 s reading: 0.5 s over 1 s.
        assert_eq!(
            rates.observe("a", Instant::now(), 2_500_000_000),
            Some(500_000_000)
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            rates.observe("a", Instant::now(), 4_500_000_000),
            Some(2_000_000_000)
        );
        // A counter that went back: a new cgroup, no rate yet.
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(rates.observe("a", Instant::now(), 10), None);
        let keep = std::collections::HashSet::from(["b".to_owned()]);
        rates.retain(&keep);
        assert!(!rates.has("a"));
    }
}
