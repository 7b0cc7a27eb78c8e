//! The eviction manager (the kubelet's `pkg/kubelet/eviction`): every
//! `monitoring_period` (10 s), and at once when a memory cgroup threshold
//! notification fires ([`memcg`]), it observes the signals from a Summary
//! ([`signals::observe`]), decides which thresholds are met and for how long
//! ([`signals::Tracker`]), publishes the pressure conditions ([`Pressure`], read by
//! NodeStatus and by admission), and, when a threshold has held for its grace period,
//! evicts one pod ([`rank`]): the sync loop stops it and fails it with reason
//! `Evicted` and the kubelet's message, and the manager waits for it to be stopped
//! (up to 30 s) before its next pass.
//!
//! Before thresholds, every pass enforces local ephemeral-storage limits and emptyDir
//! `sizeLimit` ([`local`]). An eviction plugin, when configured, orders the
//! candidates; the built-in ranking stands when it fails.
//!
//! For a disk signal, dead containers ([`Self::delete_all_unused_containers`]) and
//! unused images on the pressured filesystem
//! ([`crate::images::ImageGc::delete_unused_on`]) are removed first, and a pod is
//! evicted only if that was not enough.

pub mod local;
pub mod memcg;
pub mod rank;
pub mod signals;

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::admission::Rejection;
use crate::pod::{full_name, uid};
use crate::router::RuntimeRouter;
use crate::stats::{Detail, StatsProvider};
use crate::status::StatusStore;
use crate::thresholds::{EvictionConfig, EvictionThreshold, MEMORY_PRESSURE, Resource};
use signals::{Observations, Tracker, by_priority, observe};

pub use crate::thresholds::EVICTED as REASON;

/// How long the manager waits for an evicted pod to be stopped (the kubelet's
/// `podCleanupTimeout`).
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);

/// The kubelet's `immediateEvictionGracePeriodSeconds`, for hard thresholds.
const IMMEDIATE_GRACE: Duration = Duration::from_secs(1);

/// The pressure conditions the node has now, shared with NodeStatus and admission.
#[derive(Clone, Debug, Default)]
pub struct Pressure(Arc<RwLock<BTreeSet<&'static str>>>);

impl Pressure {
    /// The conditions (`MemoryPressure`, `DiskPressure`, `PIDPressure`) that hold.
    pub fn conditions(&self) -> BTreeSet<&'static str> {
        self.0.read().unwrap().clone()
    }

    fn set(&self, conditions: BTreeSet<&'static str>) {
        *self.0.write().unwrap() = conditions;
    }

    /// The kubelet's eviction admission (`Admit`): under pressure a new pod is
    /// refused with reason `Evicted`, but for critical pods and, under memory
    /// pressure alone, pods that are not BestEffort or tolerate the
    /// `node.kubernetes.io/memory-pressure` taint.
    pub fn admit(&self, pod: &Pod) -> Result<(), Rejection> {
        let conditions = self.conditions();
        if conditions.is_empty() || rank::is_critical(pod) {
            return Ok(());
        }
        if conditions.len() == 1 && conditions.contains(MEMORY_PRESSURE) {
            let best_effort = crate::qos::qos_class(pod) == "BestEffort";
            if !best_effort || tolerates_memory_pressure(pod) {
                return Ok(());
            }
        }
        let names: Vec<&str> = conditions.iter().copied().collect();
        Err(Rejection {
            reason: REASON.into(),
            message: format!("The node had condition: [{}]. ", names.join(" ")),
        })
    }
}

fn tolerates_memory_pressure(pod: &Pod) -> bool {
    const TAINT: &str = "node.kubernetes.io/memory-pressure";
    pod.spec
        .iter()
        .flat_map(|s| s.tolerations.iter().flatten())
        .any(|t| {
            let effect_ok = t
                .effect
                .as_deref()
                .is_none_or(|e| e.is_empty() || e == "NoSchedule");
            let key_ok = match t.key.as_deref() {
                None | Some("") => t.operator.as_deref() == Some("Exists"),
                Some(k) => k == TAINT,
            };
            effect_ok && key_ok
        })
}

/// An eviction for the sync loop to carry out: the pod is stopped within `grace`
/// and fails with reason `Evicted` and `message`.
#[derive(Debug)]
pub struct Eviction {
    pub uid: String,
    pub grace: Duration,
    pub message: String,
    /// Why: the eviction manager's, or the node shutting down.
    pub cause: crate::pod_state::KillCause,
    /// Whether the sync loop handed it to the pod's worker (not for a pod it no
    /// longer runs, or one already terminating): the manager moves on to the next
    /// candidate when not.
    pub accepted: tokio::sync::oneshot::Sender<bool>,
}

/// What the manager reads and where it sends its evictions.
pub struct EvictionManager {
    pub config: EvictionConfig,
    pub stats: Arc<StatsProvider>,
    pub statuses: StatusStore,
    pub router: RuntimeRouter,
    /// Node allocatable memory (capacity less the reservations), which
    /// `allocatableMemory.available` is a share of.
    pub allocatable_memory: Option<u64>,
    pub pressure: Pressure,
    pub evictions: mpsc::Sender<Eviction>,
    /// The memory cgroups whose usage thresholds are watched, by signal (the root
    /// for `memory.available`, `kubepods` for `allocatableMemory.available`).
    pub memory_cgroups: Vec<(&'static str, std::path::PathBuf)>,
    /// Whether those are cgroup v2 directories (pressure stall triggers and
    /// `memory.events` are watched there instead of usage thresholds).
    pub memory_cgroups_v2: bool,
    /// Image GC, for node-level reclaim before a disk eviction.
    pub image_gc: Option<Arc<crate::images::ImageGc>>,
    /// Container GC's policy, for the same reclaim (dead containers go first).
    pub container_gc: crate::kuberuntime::gc::ContainerGcPolicy,
    /// The node's root directory: its filesystem is nodefs.
    pub root_dir: std::path::PathBuf,
    /// The eviction plugin that orders the candidates, if one is configured.
    pub plugin: Option<(wasmlet_plugin_host::PluginHost, String)>,
    /// For the event a failing plugin gets.
    pub events: crate::cluster::events::EventRecorder,
    pub node_name: String,
}

impl EvictionManager {
    /// Observes and acts every monitoring period, and on every memory threshold
    /// notification, until cancelled.
    pub async fn run(self, cancel: CancellationToken) {
        let mut tracker = Tracker::default();
        let mut notifier = self.notifier();
        let mut tick = tokio::time::interval(self.config.monitoring_period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let notified = tokio::select! {
                () = cancel.cancelled() => return,
                _ = tick.tick() => false,
                () = memcg::notified(notifier.as_mut()) => true,
            };
            if notified {
                tracing::debug!("eviction: a memory threshold notification");
            }
            let observations = self.pass(&mut tracker, &cancel).await;
            if let (Some(n), Some(o)) = (notifier.as_mut(), observations) {
                n.update(&self.config.thresholds, &o);
            }
        }
    }

    fn notifier(&self) -> Option<memcg::Notifier> {
        if !self.config.memcg_notification {
            return None;
        }
        if self.memory_cgroups.is_empty() {
            return None;
        }
        let notifier = if self.memory_cgroups_v2 {
            memcg::Notifier::v2(self.memory_cgroups.iter().map(|(_, d)| d.clone()).collect())
        } else {
            memcg::Notifier::new(self.memory_cgroups.clone())
        };
        match notifier {
            Ok(n) => Some(n),
            Err(e) => {
                tracing::info!(
                    "eviction: no memory threshold notifications ({e}); memory is observed every {:?}",
                    self.config.monitoring_period
                );
                None
            }
        }
    }

    /// Node-level reclaim of dead containers (the kubelet's
    /// `DeleteAllUnusedContainers`): container GC's policy over every runtime, and
    /// every dead instance of a finished pod besides (the kubelet's
    /// `ShouldPodRuntimeBeRemoved`), with their logs. The number removed.
    async fn delete_all_unused_containers(&self) -> usize {
        let finished: std::collections::HashSet<String> = self
            .statuses
            .pods()
            .iter()
            .filter(|p| {
                let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                matches!(phase, Some("Succeeded" | "Failed"))
            })
            .map(|p| uid(p).to_owned())
            .collect();
        let removable = |id: &str| finished.contains(id);
        let mut removed = 0;
        for runtime in self.router.runtimes() {
            match runtime.list_containers().await {
                Ok(containers) => {
                    removed += crate::kuberuntime::gc::remove_dead_containers(
                        runtime.as_ref(),
                        &containers,
                        &self.container_gc,
                        &removable,
                    )
                    .await
                    .len();
                }
                Err(e) => {
                    tracing::warn!(
                        runtime = runtime.name(),
                        "eviction: listing containers to reclaim dead ones: {e}"
                    )
                }
            }
        }
        removed
    }

    /// The pods that may be evicted: known to the node and not finished.
    fn active_pods(&self) -> Vec<Pod> {
        self.statuses
            .pods()
            .into_iter()
            .filter(|p| {
                let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                !matches!(phase, Some("Succeeded" | "Failed"))
            })
            .collect()
    }

    /// One pass (the kubelet's `synchronize`); the observations it made.
    async fn pass(
        &self,
        tracker: &mut Tracker,
        cancel: &CancellationToken,
    ) -> Option<Observations> {
        let pods = self.active_pods();
        let runtimes = self.router.runtimes();
        let (summary, _) = self.stats.summary(&pods, &runtimes, Detail::Signals).await;
        let observations = observe(&summary, self.allocatable_memory);
        let pass = tracker.observe(
            &self.config.thresholds,
            &observations,
            self.config.pressure_transition_period,
            Instant::now(),
        );
        if pass.conditions != self.pressure.conditions() {
            tracing::info!(conditions = ?pass.conditions, "eviction: node pressure");
        }
        self.pressure.set(pass.conditions);
        let stats_of = |p: &Pod| summary.pods.iter().find(|s| s.pod_ref.uid == uid(p));
        // Local storage limits first, as the kubelet's: every pod over one goes, and
        // then nothing else this pass.
        let mut over_limits = false;
        for p in pods.iter().filter(|p| !rank::is_critical(p)) {
            if let Some(message) = stats_of(p).and_then(|s| local::violation(p, s)) {
                over_limits = true;
                self.evict(p, Duration::ZERO, message, cancel).await;
            }
        }
        if over_limits {
            return Some(observations);
        }
        let mut act_on = pass.act_on;
        if act_on.is_empty() {
            return Some(observations);
        }
        by_priority(&mut act_on);
        let threshold = &act_on[0];
        let (resource, _) = threshold.meaning();
        self.events.node(
            &self.node_name,
            crate::cluster::events::WARNING,
            "EvictionThresholdMet",
            &format!("Attempting to reclaim {}", resource.name()),
        );
        // Disk: node-level reclaim first (every unused image), and no eviction if that
        // was enough (the kubelet's reclaimNodeLevelResources). Pods are then ranked
        // on their volumes as they are now, not as last measured (within
        // volumeStatsAggPeriod): the pod that filled the disk may have done it since.
        let summary = if matches!(resource, Resource::EphemeralStorage | Resource::Inodes) {
            let containers = self.delete_all_unused_containers().await;
            if let Some(gc) = &self.image_gc {
                // nodefs: the images kept on the root directory's filesystem (the Wasm
                // store); imagefs and containerfs: the runtimes' own.
                let on = threshold
                    .signal
                    .starts_with("nodefs.")
                    .then_some(self.root_dir.as_path());
                let freed = gc.delete_unused_on(on).await;
                let (summary, _) = self
                    .stats
                    .summary(&pods, &runtimes, Detail::SignalsMeasured)
                    .await;
                let after = observe(&summary, self.allocatable_memory);
                // Relieved only when no threshold is met, minimum reclaim included (the
                // kubelet's check after reclaimNodeLevelResources).
                let still = signals::thresholds_met(&self.config.thresholds, &after, true);
                tracing::info!(containers, freed, signal = %threshold.signal, relieved = still.is_empty(), "eviction: reclaimed dead containers and unused images before evicting");
                if still.is_empty() {
                    return Some(after);
                }
                summary
            } else {
                self.stats
                    .summary(&pods, &runtimes, Detail::SignalsMeasured)
                    .await
                    .0
            }
        } else {
            summary
        };
        let stats_of = |p: &Pod| summary.pods.iter().find(|s| s.pod_ref.uid == uid(p));
        let observed = observations.get(threshold.signal.as_str()).copied();
        tracing::warn!(
            signal = %threshold.signal,
            available = ?observed.map(|o| o.available),
            "eviction: threshold met, evicting a pod to reclaim {}",
            resource.name()
        );
        let mut candidates: Vec<rank::Candidate<'_>> = pods
            .iter()
            .map(|p| rank::Candidate {
                pod: p,
                usage: stats_of(p).and_then(|s| rank::usage(s, resource)),
                request: rank::request(p, resource),
            })
            .collect();
        rank::rank(&mut candidates, resource);
        let candidates = self.plugin_order(&threshold.signal, candidates).await;
        let ranked: Vec<String> = candidates
            .iter()
            .map(|c| format!("{} ({:?} of {})", full_name(c.pod), c.usage, c.request))
            .collect();
        tracing::info!(pods = ?ranked, "eviction: pods ranked for eviction");
        let mut evicted = false;
        for c in candidates {
            if rank::is_critical(c.pod) {
                tracing::info!(pod = %full_name(c.pod), "eviction: cannot evict a critical (static, mirror or system-critical) pod");
                continue;
            }
            let quantity = observed.map(|o| (threshold.quantity(o.capacity), o.available));
            let message = rank::message(resource, quantity, c.pod, stats_of(c.pod));
            let grace = grace_period(threshold, c.pod, self.config.max_pod_grace_period);
            if self.evict(c.pod, grace, message, cancel).await {
                evicted = true;
                break;
            }
        }
        if !evicted {
            tracing::warn!(signal = %threshold.signal, "eviction: unable to evict any pod from the node");
        }
        Some(observations)
    }

    /// The eviction plugin's order of `candidates` (given in the built-in order); on
    /// any failure of the plugin the built-in order, with a warning event on the node.
    async fn plugin_order<'a>(
        &self,
        signal: &str,
        candidates: Vec<rank::Candidate<'a>>,
    ) -> Vec<rank::Candidate<'a>> {
        let Some((host, name)) = &self.plugin else {
            return candidates;
        };
        let pods: Vec<(&Pod, u64, u64)> = candidates
            .iter()
            .map(|c| (c.pod, c.usage.unwrap_or(0), c.request))
            .collect();
        match crate::plugins::rank(host, name, signal, &pods).await {
            Ok(order) => {
                let mut slots: Vec<Option<rank::Candidate<'a>>> =
                    candidates.into_iter().map(Some).collect();
                order
                    .into_iter()
                    .filter_map(|i| slots.get_mut(i)?.take())
                    .collect()
            }
            Err(e) => {
                let message =
                    format!("eviction plugin {name} failed, so the built-in ranking is used: {e}");
                tracing::warn!("{message}");
                self.events.node(
                    &self.node_name,
                    crate::cluster::events::WARNING,
                    "EvictionPluginFailed",
                    &message,
                );
                candidates
            }
        }
    }

    /// Hands the eviction to the sync loop and waits for the pod to be stopped;
    /// whether it was.
    async fn evict(
        &self,
        pod: &Pod,
        grace: Duration,
        message: String,
        cancel: &CancellationToken,
    ) -> bool {
        let id = uid(pod).to_owned();
        tracing::warn!(pod = %full_name(pod), grace = ?grace, "evicting: {message}");
        let (accepted, answer) = tokio::sync::oneshot::channel();
        let eviction = Eviction {
            uid: id.clone(),
            grace,
            message,
            cause: crate::pod_state::KillCause::Evicted,
            accepted,
        };
        if self.evictions.send(eviction).await.is_err() || answer.await != Ok(true) {
            tracing::info!(pod = %full_name(pod), "eviction: the pod is no longer run or is terminating already; the next candidate goes");
            return false;
        }
        let deadline = Instant::now() + CLEANUP_TIMEOUT + grace;
        let stopped = || {
            self.statuses
                .status(&id)
                .is_some_and(|s| s.phase.as_deref() == Some("Failed"))
        };
        // Stopped, and its volumes gone (what a disk eviction reclaims), as the
        // kubelet waits for the pod's cleanup before its next pass.
        let volumes = crate::volumes::volumes_dir(&self.root_dir.join("pods").join(&id));
        while !stopped() || volumes.exists() {
            if Instant::now() >= deadline || cancel.is_cancelled() {
                tracing::warn!(pod = %full_name(pod), "eviction: the pod was not stopped and cleaned up within {CLEANUP_TIMEOUT:?}");
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        true
    }
}

/// The grace an evicted pod gets: 1 s for a hard threshold; for a soft one the
/// smaller of `evictionMaxPodGracePeriod` and the pod's own.
fn grace_period(threshold: &EvictionThreshold, pod: &Pod, max: Duration) -> Duration {
    if threshold.is_hard() {
        IMMEDIATE_GRACE
    } else {
        max.min(crate::pod::grace_period(pod))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements, Toleration};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn pod(requests: Option<&str>) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("p".into());
        p.spec = Some(PodSpec {
            containers: vec![Container {
                name: "c".into(),
                resources: requests.map(|r| ResourceRequirements {
                    requests: Some([("memory".to_owned(), Quantity(r.into()))].into()),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        });
        p
    }

    #[test]
    fn admission_under_pressure_is_the_kubelets() {
        let pressure = Pressure::default();
        assert!(pressure.admit(&pod(None)).is_ok());

        pressure.set(BTreeSet::from([MEMORY_PRESSURE]));
        let refused = pressure.admit(&pod(None)).unwrap_err();
        assert_eq!(refused.reason, "Evicted");
        assert_eq!(
            refused.message,
            "The node had condition: [MemoryPressure]. "
        );
        assert!(pressure.admit(&pod(Some("64Mi"))).is_ok(), "not BestEffort");
        let mut tolerant = pod(None);
        tolerant.spec.as_mut().unwrap().tolerations = Some(vec![Toleration {
            key: Some("node.kubernetes.io/memory-pressure".into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        }]);
        assert!(pressure.admit(&tolerant).is_ok());

        pressure.set(BTreeSet::from([MEMORY_PRESSURE, "DiskPressure"]));
        let refused = pressure.admit(&pod(Some("64Mi"))).unwrap_err();
        assert_eq!(
            refused.message,
            "The node had condition: [DiskPressure MemoryPressure]. "
        );
        let mut critical = pod(None);
        critical.spec.as_mut().unwrap().priority = Some(rank::SYSTEM_CRITICAL_PRIORITY);
        assert!(pressure.admit(&critical).is_ok());
    }

    #[test]
    fn hard_evictions_get_a_second_soft_ones_the_smaller_grace() {
        let mut t = EvictionThreshold {
            signal: "memory.available".into(),
            value: crate::allocatable::Threshold::Bytes(1),
            grace_period: None,
            min_reclaim: None,
        };
        let mut p = pod(None);
        p.spec.as_mut().unwrap().termination_grace_period_seconds = Some(30);
        assert_eq!(
            grace_period(&t, &p, Duration::from_secs(60)),
            Duration::from_secs(1)
        );
        t.grace_period = Some(Duration::from_secs(10));
        assert_eq!(
            grace_period(&t, &p, Duration::from_secs(60)),
            Duration::from_secs(30)
        );
        assert_eq!(
            grace_period(&t, &p, Duration::from_secs(5)),
            Duration::from_secs(5)
        );
    }
}
