//! Signal observations from a Summary (the kubelet's `makeSignalObservations`), and
//! the bookkeeping of one pass over them: which thresholds are met, since when, which
//! pressure conditions hold and how long they linger (`thresholdsMet`,
//! `thresholdsFirstObservedAt`, `thresholdsMetGracePeriod`, `nodeConditions`,
//! `nodeConditionsObservedSince`).

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use tokio::time::Instant;

use crate::stats::SYSTEM_CONTAINER_PODS;
use crate::stats::types::{FsStats, Summary};
use crate::thresholds::{EvictionThreshold, signal_meaning};

/// What a signal was observed at: what is available (below zero when more than
/// the capacity is used) and the capacity it is a share of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observation {
    pub available: i64,
    pub capacity: u64,
}

/// Observations by signal name.
pub type Observations = HashMap<&'static str, Observation>;

/// The signals a Summary shows. `allocatable_memory` is the node allocatable
/// memory (capacity less the reservations), which `allocatableMemory.available` is
/// a share of.
pub fn observe(summary: &Summary, allocatable_memory: Option<u64>) -> Observations {
    let mut out = Observations::new();
    let node = &summary.node;
    if let Some(m) = &node.memory
        && let (Some(available), Some(ws)) = (m.available_bytes, m.working_set_bytes)
    {
        out.insert(
            "memory.available",
            Observation {
                available: available as i64,
                capacity: available + ws,
            },
        );
    }
    let pods_ws = node
        .system_containers
        .iter()
        .find(|c| c.name == SYSTEM_CONTAINER_PODS)
        .and_then(|c| c.memory.as_ref()?.working_set_bytes);
    if let (Some(capacity), Some(ws)) = (allocatable_memory, pods_ws) {
        out.insert(
            "allocatableMemory.available",
            Observation {
                available: capacity as i64 - ws as i64,
                capacity,
            },
        );
    }
    let mut fs = |bytes: &'static str, inodes: &'static str, f: &FsStats| {
        if let (Some(a), Some(c)) = (f.available_bytes, f.capacity_bytes) {
            out.insert(
                bytes,
                Observation {
                    available: a as i64,
                    capacity: c,
                },
            );
        }
        if let (Some(a), Some(c)) = (f.inodes_free, f.inodes) {
            out.insert(
                inodes,
                Observation {
                    available: a as i64,
                    capacity: c,
                },
            );
        }
    };
    if let Some(f) = &node.fs {
        fs("nodefs.available", "nodefs.inodesFree", f);
    }
    if let Some(runtime) = &node.runtime {
        if let Some(f) = &runtime.image_fs {
            fs("imagefs.available", "imagefs.inodesFree", f);
        }
        if let Some(f) = &runtime.container_fs {
            fs("containerfs.available", "containerfs.inodesFree", f);
        }
    }
    if let Some(r) = &node.rlimit
        && let (Some(max), Some(cur)) = (r.maxpid, r.curproc)
    {
        out.insert(
            "pid.available",
            Observation {
                available: max - cur,
                capacity: max.max(0) as u64,
            },
        );
    }
    out
}

/// The thresholds of `thresholds` that `observations` meet: what is available is
/// below the threshold (with `enforce_min_reclaim`, below the threshold plus its
/// minimum reclaim, for thresholds met before).
pub fn thresholds_met(
    thresholds: &[EvictionThreshold],
    observations: &Observations,
    enforce_min_reclaim: bool,
) -> Vec<EvictionThreshold> {
    thresholds
        .iter()
        .filter(|t| {
            observations.get(t.signal.as_str()).is_some_and(|o| {
                let quantity = if enforce_min_reclaim {
                    t.quantity_with_reclaim(o.capacity)
                } else {
                    t.quantity(o.capacity)
                };
                (quantity as i64) > o.available
            })
        })
        .cloned()
        .collect()
}

/// A threshold's identity across passes.
fn key(t: &EvictionThreshold) -> String {
    format!("{}<{:?}/{:?}", t.signal, t.value, t.grace_period)
}

/// The state of the signals between passes.
#[derive(Debug, Default)]
pub struct Tracker {
    /// Thresholds acted on in the last pass: they stay met until the minimum
    /// reclaim is freed too.
    met_last: Vec<EvictionThreshold>,
    /// When each threshold met now was first seen met.
    first_observed: HashMap<String, Instant>,
    /// When each pressure condition was last seen.
    conditions_last_observed: HashMap<&'static str, Instant>,
}

/// One pass's outcome.
#[derive(Debug, PartialEq)]
pub struct Pass {
    /// The pressure conditions the node reports (held for the transition period).
    pub conditions: BTreeSet<&'static str>,
    /// The thresholds met for their grace period: what eviction acts on.
    pub act_on: Vec<EvictionThreshold>,
}

impl Tracker {
    /// Takes `observations` at `now` against `thresholds`.
    pub fn observe(
        &mut self,
        thresholds: &[EvictionThreshold],
        observations: &Observations,
        transition_period: Duration,
        now: Instant,
    ) -> Pass {
        let mut met = thresholds_met(thresholds, observations, false);
        for again in thresholds_met(&self.met_last, observations, true) {
            if !met.iter().any(|t| key(t) == key(&again)) {
                met.push(again);
            }
        }
        let first = std::mem::take(&mut self.first_observed);
        self.first_observed = met
            .iter()
            .map(|t| {
                let k = key(t);
                let at = first.get(&k).copied().unwrap_or(now);
                (k, at)
            })
            .collect();
        for t in &met {
            self.conditions_last_observed.insert(t.meaning().1, now);
        }
        self.conditions_last_observed
            .retain(|_, at| now.saturating_duration_since(*at) < transition_period);
        let conditions = self.conditions_last_observed.keys().copied().collect();
        let act_on: Vec<EvictionThreshold> = met
            .into_iter()
            .filter(|t| {
                let since = self.first_observed[&key(t)];
                now.saturating_duration_since(since) >= t.grace_period.unwrap_or_default()
            })
            .collect();
        self.met_last = act_on.clone();
        Pass { conditions, act_on }
    }
}

/// The order thresholds are acted on (the kubelet's `byEvictionPriority`): memory
/// first, then the rest as configured.
pub fn by_priority(thresholds: &mut [EvictionThreshold]) {
    thresholds.sort_by_key(|t| {
        signal_meaning(&t.signal).map_or(1, |(r, _)| {
            if r == crate::thresholds::Resource::Memory {
                0
            } else {
                1
            }
        })
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocatable::Threshold;
    use crate::stats::types::{ContainerStats, MemoryStats, NodeStats, RlimitStats};

    fn threshold(signal: &str, bytes: u64, grace: Option<u64>) -> EvictionThreshold {
        EvictionThreshold {
            signal: signal.into(),
            value: Threshold::Bytes(bytes),
            grace_period: grace.map(Duration::from_secs),
            min_reclaim: None,
        }
    }

    fn obs(pairs: &[(&'static str, i64, u64)]) -> Observations {
        pairs
            .iter()
            .map(|(s, a, c)| {
                (
                    *s,
                    Observation {
                        available: *a,
                        capacity: *c,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn a_summary_gives_the_kubelets_signals() {
        let summary = Summary {
            node: NodeStats {
                memory: Some(MemoryStats {
                    available_bytes: Some(6 << 30),
                    working_set_bytes: Some(2 << 30),
                    ..Default::default()
                }),
                system_containers: vec![ContainerStats {
                    name: "pods".into(),
                    memory: Some(MemoryStats {
                        working_set_bytes: Some(700 << 20),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                fs: Some(FsStats {
                    available_bytes: Some(10),
                    capacity_bytes: Some(100),
                    inodes_free: Some(5),
                    inodes: Some(50),
                    ..Default::default()
                }),
                rlimit: Some(RlimitStats {
                    maxpid: Some(4096),
                    curproc: Some(96),
                    ..Default::default()
                }),
                ..Default::default()
            },
            pods: Vec::new(),
        };
        let o = observe(&summary, Some(600 << 20));
        assert_eq!(
            o["memory.available"],
            Observation {
                available: 6 << 30,
                capacity: 8 << 30
            }
        );
        assert_eq!(o["allocatableMemory.available"].available, -(100 << 20));
        assert_eq!(o["nodefs.available"].capacity, 100);
        assert_eq!(o["nodefs.inodesFree"].available, 5);
        assert_eq!(o["pid.available"].available, 4000);
        assert!(!o.contains_key("imagefs.available"));
    }

    #[test]
    fn a_hard_threshold_acts_at_once_and_its_condition_lingers() {
        let t = [threshold("memory.available", 100, None)];
        let mut tr = Tracker::default();
        let t0 = Instant::now();
        let period = Duration::from_secs(30);
        let p = tr.observe(&t, &obs(&[("memory.available", 50, 1000)]), period, t0);
        assert_eq!(p.act_on, t);
        assert_eq!(p.conditions, BTreeSet::from(["MemoryPressure"]));
        // Relieved: nothing to act on, the condition stays for the period.
        let relieved = obs(&[("memory.available", 500, 1000)]);
        let p = tr.observe(&t, &relieved, period, t0 + Duration::from_secs(10));
        assert!(p.act_on.is_empty());
        assert_eq!(p.conditions, BTreeSet::from(["MemoryPressure"]));
        let p = tr.observe(&t, &relieved, period, t0 + Duration::from_secs(30));
        assert!(p.conditions.is_empty());
    }

    #[test]
    fn a_soft_threshold_waits_its_grace_period_while_it_holds() {
        let t = [threshold("memory.available", 100, Some(60))];
        let mut tr = Tracker::default();
        let t0 = Instant::now();
        let low = obs(&[("memory.available", 50, 1000)]);
        let period = Duration::from_secs(300);
        let p = tr.observe(&t, &low, period, t0);
        assert!(p.act_on.is_empty(), "not for 60 s yet");
        assert_eq!(
            p.conditions,
            BTreeSet::from(["MemoryPressure"]),
            "pressure shows at once"
        );
        let p = tr.observe(&t, &low, period, t0 + Duration::from_secs(59));
        assert!(p.act_on.is_empty());
        let p = tr.observe(&t, &low, period, t0 + Duration::from_secs(60));
        assert_eq!(p.act_on, t);
        // Met again after a pause: the grace period starts over.
        let ok = obs(&[("memory.available", 500, 1000)]);
        tr.observe(&t, &ok, period, t0 + Duration::from_secs(70));
        let p = tr.observe(&t, &low, period, t0 + Duration::from_secs(80));
        assert!(p.act_on.is_empty());
    }

    #[test]
    fn a_threshold_acted_on_stays_met_until_its_minimum_reclaim_is_freed() {
        let mut t = threshold("pid.available", 100, None);
        t.min_reclaim = Some(Threshold::Bytes(50));
        let t = [t];
        let mut tr = Tracker::default();
        let t0 = Instant::now();
        let period = Duration::from_secs(1);
        let p = tr.observe(&t, &obs(&[("pid.available", 90, 1000)]), period, t0);
        assert_eq!(p.act_on.len(), 1);
        // Above the threshold, below threshold + reclaim: still acted on.
        let p = tr.observe(&t, &obs(&[("pid.available", 120, 1000)]), period, t0);
        assert_eq!(p.act_on.len(), 1);
        assert_eq!(p.conditions, BTreeSet::from(["PIDPressure"]));
        let p = tr.observe(&t, &obs(&[("pid.available", 150, 1000)]), period, t0);
        assert!(p.act_on.is_empty());
    }

    #[test]
    fn percentages_are_of_the_signals_capacity_and_memory_goes_first() {
        let mut ts = vec![
            EvictionThreshold {
                signal: "nodefs.available".into(),
                value: Threshold::Fraction(0.10),
                grace_period: None,
                min_reclaim: None,
            },
            threshold("allocatableMemory.available", 10, None),
        ];
        let met = thresholds_met(&ts, &obs(&[("nodefs.available", 99, 1000)]), false);
        assert_eq!(met.len(), 1, "99 < 10% of 1000");
        assert!(thresholds_met(&ts, &obs(&[("nodefs.available", 100, 1000)]), false).is_empty());
        by_priority(&mut ts);
        assert_eq!(ts[0].signal, "allocatableMemory.available");
    }
}
