//! Eviction thresholds as the node is configured with them (the kubelet's
//! `eviction/api` and `ParseThresholdConfig`): `evictionHard`, `evictionSoft` with
//! `evictionSoftGracePeriod`, `evictionMinimumReclaim`, and what each signal means —
//! the resource it reclaims and the node condition it raises.
//!
//! With node allocatable enforced on pods (`enforceNodeAllocatable: [pods]`, the
//! default), every hard `memory.available` threshold is also an
//! `allocatableMemory.available` one, as the kubelet adds it.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::allocatable::{Threshold, parse_thresholds};
use crate::duration;

/// `status.reason` of an evicted pod, and of a pod admission refuses under pressure.
pub const EVICTED: &str = "Evicted";

/// The node condition memory signals raise.
pub const MEMORY_PRESSURE: &str = "MemoryPressure";
/// The node condition filesystem signals raise.
pub const DISK_PRESSURE: &str = "DiskPressure";
/// The node condition `pid.available` raises.
pub const PID_PRESSURE: &str = "PIDPressure";

/// What a signal's pressure is relieved by evicting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Resource {
    Memory,
    EphemeralStorage,
    Inodes,
    Pids,
}

impl Resource {
    /// The kubelet's name (`v1.ResourceName`, `resourceInodes`, `resourcePids`).
    pub fn name(self) -> &'static str {
        match self {
            Resource::Memory => "memory",
            Resource::EphemeralStorage => "ephemeral-storage",
            Resource::Inodes => "inodes",
            Resource::Pids => "pids",
        }
    }
}

/// The resource `signal` reclaims and the condition it raises.
pub fn signal_meaning(signal: &str) -> Option<(Resource, &'static str)> {
    Some(match signal {
        "memory.available" | "allocatableMemory.available" => (Resource::Memory, MEMORY_PRESSURE),
        "nodefs.available" | "imagefs.available" | "containerfs.available" => {
            (Resource::EphemeralStorage, DISK_PRESSURE)
        }
        "nodefs.inodesFree" | "imagefs.inodesFree" | "containerfs.inodesFree" => {
            (Resource::Inodes, DISK_PRESSURE)
        }
        "pid.available" => (Resource::Pids, PID_PRESSURE),
        _ => return None,
    })
}

/// One threshold: `signal` below `value` (an amount, or a share of the signal's
/// capacity). A hard threshold has no grace period.
#[derive(Clone, Debug, PartialEq)]
pub struct EvictionThreshold {
    pub signal: String,
    pub value: Threshold,
    /// `None`: hard, acted on at once. `Some`: soft, acted on once it has held
    /// this long.
    pub grace_period: Option<Duration>,
    /// What eviction frees beyond the threshold before it stops
    /// (`evictionMinimumReclaim`).
    pub min_reclaim: Option<Threshold>,
}

impl EvictionThreshold {
    /// Hard: no grace period, or a zero one (the kubelet's `isHardEvictionThreshold`).
    pub fn is_hard(&self) -> bool {
        self.grace_period.is_none_or(|g| g.is_zero())
    }

    /// The threshold's amount for a signal whose capacity is `capacity`.
    pub fn quantity(&self, capacity: u64) -> u64 {
        self.value.of(capacity)
    }

    /// The amount the signal must be back above while the threshold was met: the
    /// threshold plus its minimum reclaim.
    pub fn quantity_with_reclaim(&self, capacity: u64) -> u64 {
        self.quantity(capacity) + self.min_reclaim.map_or(0, |m| m.of(capacity))
    }

    /// The resource it reclaims and the condition it raises.
    pub fn meaning(&self) -> (Resource, &'static str) {
        signal_meaning(&self.signal).expect("thresholds hold known signals only")
    }
}

/// The eviction manager's configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct EvictionConfig {
    pub thresholds: Vec<EvictionThreshold>,
    /// `evictionMaxPodGracePeriod`: the most a pod evicted for a soft threshold gets
    /// (the smaller of it and the pod's own; the default zero stops it at once, as
    /// in the kubelet).
    pub max_pod_grace_period: Duration,
    /// `evictionPressureTransitionPeriod` (5 m): how long a pressure condition stays
    /// after its threshold was last met.
    pub pressure_transition_period: Duration,
    /// How often the signals are observed (the kubelet's fixed 10 s;
    /// `wasmlet.evictionMonitoringPeriod` shortens it for tests).
    pub monitoring_period: Duration,
    /// Memory cgroup threshold notifications, where the kernel has them
    /// (`kernelMemcgNotification`), so a fast allocation is seen between passes.
    pub memcg_notification: bool,
}

/// The kubelet's `evictionPressureTransitionPeriod` default.
pub const DEFAULT_TRANSITION_PERIOD: Duration = Duration::from_secs(5 * 60);
/// The kubelet's `evictionMonitoringPeriod`.
pub const DEFAULT_MONITORING_PERIOD: Duration = Duration::from_secs(10);

impl Default for EvictionConfig {
    fn default() -> Self {
        EvictionConfig {
            thresholds: hard(crate::allocatable::default_eviction_hard(), true),
            max_pod_grace_period: Duration::ZERO,
            pressure_transition_period: DEFAULT_TRANSITION_PERIOD,
            monitoring_period: DEFAULT_MONITORING_PERIOD,
            memcg_notification: true,
        }
    }
}

fn hard(map: BTreeMap<String, Threshold>, allocatable_pods: bool) -> Vec<EvictionThreshold> {
    let mut out: Vec<EvictionThreshold> = map
        .into_iter()
        .map(|(signal, value)| EvictionThreshold {
            signal,
            value,
            grace_period: None,
            min_reclaim: None,
        })
        .collect();
    if allocatable_pods {
        let allocatable: Vec<EvictionThreshold> = out
            .iter()
            .filter(|t| t.signal == "memory.available")
            .map(|t| EvictionThreshold {
                signal: "allocatableMemory.available".into(),
                ..t.clone()
            })
            .collect();
        out.extend(allocatable);
    }
    out
}

/// The file's eviction settings, as they are written.
#[derive(Debug, Default)]
pub struct EvictionFields<'a> {
    pub hard: Option<&'a BTreeMap<String, Threshold>>,
    pub soft: Option<&'a BTreeMap<String, String>>,
    pub soft_grace_period: Option<&'a BTreeMap<String, String>>,
    pub minimum_reclaim: Option<&'a BTreeMap<String, String>>,
    pub max_pod_grace_period: Option<i64>,
    pub pressure_transition_period: Option<&'a String>,
    pub monitoring_period: Option<&'a String>,
    /// `enforceNodeAllocatable` holds `pods`.
    pub allocatable_pods: bool,
}

/// The kubelet's `ParseThresholdConfig` and the timings; every problem is pushed to
/// `errors`.
pub fn eviction_config(f: EvictionFields<'_>, errors: &mut Vec<String>) -> EvictionConfig {
    let defaults = EvictionConfig::default();
    let hard_map = f
        .hard
        .cloned()
        .unwrap_or_else(crate::allocatable::default_eviction_hard);
    let mut thresholds = hard(hard_map, f.allocatable_pods);

    let soft = match f.soft {
        Some(map) => parse_thresholds("evictionSoft", map).unwrap_or_else(|e| {
            errors.extend(e);
            BTreeMap::new()
        }),
        None => BTreeMap::new(),
    };
    let graces = f.soft_grace_period.cloned().unwrap_or_default();
    for (signal, _) in graces.iter().filter(|(s, _)| !soft.contains_key(*s)) {
        errors.push(format!(
            "evictionSoftGracePeriod: {signal} has no evictionSoft threshold"
        ));
    }
    for (signal, value) in soft {
        let grace = match graces.get(&signal) {
            None => {
                errors.push(format!(
                    "evictionSoft: {signal}: a grace period must be given in evictionSoftGracePeriod"
                ));
                continue;
            }
            Some(g) => match duration::parse(g) {
                Ok(d) => d,
                Err(e) => {
                    errors.push(format!("evictionSoftGracePeriod: {signal}: {e}"));
                    continue;
                }
            },
        };
        thresholds.push(EvictionThreshold {
            signal,
            value,
            grace_period: Some(grace),
            min_reclaim: None,
        });
    }

    if let Some(map) = f.minimum_reclaim {
        match parse_thresholds("evictionMinimumReclaim", map) {
            Ok(reclaims) => {
                for (signal, reclaim) in reclaims {
                    let mut found = false;
                    for t in thresholds.iter_mut().filter(|t| {
                        t.signal == signal
                            || (signal == "memory.available"
                                && t.signal == "allocatableMemory.available")
                    }) {
                        t.min_reclaim = Some(reclaim);
                        found = true;
                    }
                    if !found {
                        errors.push(format!(
                            "evictionMinimumReclaim: {signal} has no eviction threshold"
                        ));
                    }
                }
            }
            Err(e) => errors.extend(e),
        }
    }

    let mut period = |name: &str, value: Option<&String>, default: Duration| match value {
        None => default,
        Some(s) => duration::parse(s).unwrap_or_else(|e| {
            errors.push(format!("{name}: {e}"));
            default
        }),
    };
    let pressure_transition_period = period(
        "evictionPressureTransitionPeriod",
        f.pressure_transition_period,
        defaults.pressure_transition_period,
    );
    let monitoring_period = period(
        "wasmlet.evictionMonitoringPeriod",
        f.monitoring_period,
        defaults.monitoring_period,
    );
    if monitoring_period.is_zero() {
        errors.push("wasmlet.evictionMonitoringPeriod: must be above zero".into());
    }
    let max_pod_grace_period = match f.max_pod_grace_period {
        None => Duration::ZERO,
        Some(s) if s >= 0 => Duration::from_secs(s as u64),
        Some(s) => {
            errors.push(format!("evictionMaxPodGracePeriod: {s} is negative"));
            Duration::ZERO
        }
    };
    EvictionConfig {
        thresholds,
        max_pod_grace_period,
        pressure_transition_period,
        monitoring_period: monitoring_period.max(Duration::from_millis(100)),
        memcg_notification: defaults.memcg_notification,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_defaults_are_the_kubelets_hard_thresholds_and_allocatable_memory() {
        let c = EvictionConfig::default();
        let signals: Vec<&str> = c.thresholds.iter().map(|t| t.signal.as_str()).collect();
        assert_eq!(
            signals,
            [
                "imagefs.available",
                "memory.available",
                "nodefs.available",
                "nodefs.inodesFree",
                "allocatableMemory.available"
            ]
        );
        assert!(c.thresholds.iter().all(EvictionThreshold::is_hard));
        let alloc = &c.thresholds[4];
        assert_eq!(alloc.value, Threshold::Bytes(100 << 20));
        assert_eq!(c.pressure_transition_period, Duration::from_secs(300));
        assert_eq!(c.monitoring_period, Duration::from_secs(10));
        assert_eq!(
            alloc.meaning(),
            (Resource::Memory, MEMORY_PRESSURE),
            "allocatable memory raises MemoryPressure"
        );
    }

    #[test]
    fn soft_thresholds_need_their_grace_periods_and_reclaims_apply_to_both() {
        let soft = map(&[("memory.available", "500Mi"), ("nodefs.available", "15%")]);
        let grace = map(&[("memory.available", "1m30s")]);
        let reclaim = map(&[("memory.available", "50Mi"), ("pid.available", "10")]);
        let mut errors = Vec::new();
        let c = eviction_config(
            EvictionFields {
                soft: Some(&soft),
                soft_grace_period: Some(&grace),
                minimum_reclaim: Some(&reclaim),
                pressure_transition_period: Some(&"30s".to_owned()),
                max_pod_grace_period: Some(20),
                allocatable_pods: true,
                ..Default::default()
            },
            &mut errors,
        );
        assert_eq!(
            errors,
            [
                "evictionSoft: nodefs.available: a grace period must be given in evictionSoftGracePeriod",
                "evictionMinimumReclaim: pid.available has no eviction threshold"
            ]
        );
        let memory: Vec<&EvictionThreshold> = c
            .thresholds
            .iter()
            .filter(|t| t.meaning().0 == Resource::Memory)
            .collect();
        assert_eq!(memory.len(), 3, "hard, allocatable and soft: {memory:?}");
        assert!(
            memory
                .iter()
                .all(|t| t.min_reclaim == Some(Threshold::Bytes(50 << 20)))
        );
        let soft = memory.iter().find(|t| !t.is_hard()).unwrap();
        assert_eq!(soft.grace_period, Some(Duration::from_secs(90)));
        assert_eq!(soft.quantity_with_reclaim(1 << 30), 550 << 20);
        assert_eq!(c.max_pod_grace_period, Duration::from_secs(20));
        assert_eq!(c.pressure_transition_period, Duration::from_secs(30));
    }

    #[test]
    fn zero_and_hundred_percent_set_no_threshold_and_a_zero_grace_is_hard() {
        let hard: BTreeMap<String, Threshold> = parse_thresholds(
            "evictionHard",
            &map(&[
                ("nodefs.available", "0%"),
                ("imagefs.available", "100%"),
                ("memory.available", "1Gi"),
            ]),
        )
        .unwrap();
        assert_eq!(hard.keys().collect::<Vec<_>>(), ["memory.available"]);
        let soft = map(&[("memory.available", "2Gi")]);
        let grace = map(&[("memory.available", "0s")]);
        let mut errors = Vec::new();
        let c = eviction_config(
            EvictionFields {
                hard: Some(&hard),
                soft: Some(&soft),
                soft_grace_period: Some(&grace),
                ..Default::default()
            },
            &mut errors,
        );
        assert!(errors.is_empty(), "{errors:?}");
        assert!(c.thresholds.iter().all(EvictionThreshold::is_hard));
    }

    #[test]
    fn without_allocatable_enforcement_there_is_no_allocatable_threshold() {
        let mut errors = Vec::new();
        let c = eviction_config(EvictionFields::default(), &mut errors);
        assert!(errors.is_empty());
        assert!(
            !c.thresholds
                .iter()
                .any(|t| t.signal == "allocatableMemory.available")
        );
    }
}
