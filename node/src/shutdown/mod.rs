//! Graceful node shutdown, the kubelet's node shutdown manager: the node holds a
//! systemd-logind *delay* inhibitor (`logind.rs`), and when logind announces
//! `PrepareForShutdown(true)` it
//!
//! - says it is shutting down: the Ready condition turns False with "node is
//!   shutting down", and new pods are refused with reason `NodeShutdown`;
//! - stops its active pods group by group in ascending priority, each group within
//!   its budget (`shutdownGracePeriod` less `shutdownGracePeriodCriticalPods` for the
//!   regular pods, then the critical ones; or `shutdownGracePeriodByPodPriority`), a
//!   pod with its own smaller `terminationGracePeriodSeconds` getting that; every
//!   stopped pod is Failed with reason `Terminated` and a `DisruptionTarget`
//!   condition;
//! - releases the inhibitor, so the shutdown goes on.
//!
//! `PrepareForShutdown(false)` (a cancelled shutdown) makes it ready again and takes
//! a new inhibitor. Where logind cannot be reached the node says so at start and
//! keeps trying; pods are then not stopped gracefully when the machine goes down.

mod logind;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::admission::Rejection;
use crate::cluster::events::{EventRecorder, NORMAL};
use crate::eviction::Eviction;
use crate::pod::{full_name, uid};
use crate::pod_state::KillCause;
use crate::status::StatusStore;

/// The reason a pod stopped for the node's shutdown fails with.
pub const REASON: &str = KillCause::NodeShutdown.reason();
/// Its message.
pub const MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";
/// The reason a pod is refused with while the node shuts down.
pub const NOT_ADMITTED_REASON: &str = "NodeShutdown";
const NOT_ADMITTED_MESSAGE: &str = "Pod was rejected as the node is shutting down.";
/// Why the node is not ready while it shuts down (the Ready condition's message).
pub const SHUTTING_DOWN: &str = "node is shutting down";
/// The event the node records on the announcement (and on its cancellation).
const EVENT_REASON: &str = "Shutdown";
/// The kubelet's file of the last shutdown's start and end, in the root directory.
const STATE_FILE: &str = "graceful_node_shutdown_state";
/// How soon the watch starts again after logind or the bus went away (the
/// kubelet's `dbusReconnectPeriod` is 1 s); and while logind cannot be reached.
const RECONNECT_PERIOD: Duration = Duration::from_secs(1);
const UNREACHABLE_RETRY: Duration = Duration::from_secs(10);
/// The lowest priority of a system-critical pod (`scheduling.SystemCriticalPriority`).
const SYSTEM_CRITICAL_PRIORITY: i32 = crate::eviction::rank::SYSTEM_CRITICAL_PRIORITY;

/// One group's budget: the pods of at least `priority` (up to the next group's) get
/// `grace_seconds` to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PriorityGrace {
    pub priority: i32,
    pub grace_seconds: i64,
}

/// `shutdownGracePeriod`, `shutdownGracePeriodCriticalPods` and
/// `shutdownGracePeriodByPodPriority`; all zero (the kubelet's default) turns the
/// manager off.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShutdownConfig {
    pub grace_period: Duration,
    pub grace_period_critical_pods: Duration,
    pub by_pod_priority: Vec<PriorityGrace>,
}

impl ShutdownConfig {
    /// The groups by ascending priority: `shutdownGracePeriodByPodPriority` as
    /// given, or the two periods as two groups (regular pods at priority 0 get the
    /// period less the critical pods' share; critical ones get their share), as
    /// the kubelet's `migrateConfig`.
    pub fn groups(&self) -> Vec<PriorityGrace> {
        let mut groups = if self.by_pod_priority.is_empty() {
            let total = self.grace_period.as_secs() as i64;
            let critical = self.grace_period_critical_pods.as_secs() as i64;
            if total == 0 || critical > total {
                return Vec::new();
            }
            vec![
                PriorityGrace {
                    priority: 0,
                    grace_seconds: total - critical,
                },
                PriorityGrace {
                    priority: SYSTEM_CRITICAL_PRIORITY,
                    grace_seconds: critical,
                },
            ]
        } else {
            self.by_pod_priority.clone()
        };
        groups.sort_by_key(|g| g.priority);
        groups
    }

    /// Whether the node handles shutdowns at all.
    pub fn enabled(&self) -> bool {
        !self.groups().is_empty()
    }

    /// The delay the inhibitor must be allowed: every group's budget together.
    pub fn requested_delay(&self) -> Duration {
        let seconds: i64 = self.groups().iter().map(|g| g.grace_seconds.max(0)).sum();
        Duration::from_secs(seconds as u64)
    }

    /// The kubelet's validation of the three fields.
    pub fn check(&self) -> Result<(), String> {
        let (total, critical) = (self.grace_period, self.grace_period_critical_pods);
        if critical > total {
            return Err(format!(
                "shutdownGracePeriodCriticalPods ({}) must not exceed shutdownGracePeriod ({})",
                crate::duration::format(critical),
                crate::duration::format(total)
            ));
        }
        for (name, d) in [
            ("shutdownGracePeriod", total),
            ("shutdownGracePeriodCriticalPods", critical),
        ] {
            if !d.is_zero() && d < Duration::from_secs(1) {
                return Err(format!(
                    "{name} ({}) must be either zero or at least 1s",
                    crate::duration::format(d)
                ));
            }
        }
        if !total.is_zero() && !self.by_pod_priority.is_empty() {
            return Err(
                "shutdownGracePeriodByPodPriority and shutdownGracePeriod cannot both be set"
                    .into(),
            );
        }
        if let Some(g) = self.by_pod_priority.iter().find(|g| g.grace_seconds < 0) {
            return Err(format!(
                "shutdownGracePeriodByPodPriority: priority {} has a negative shutdownGracePeriodSeconds ({})",
                g.priority, g.grace_seconds
            ));
        }
        Ok(())
    }
}

/// Places each pod in the group of the highest priority not above its own (a pod
/// below every group is in the lowest), as the kubelet's `groupByPriority`; groups
/// come out in ascending priority, empty ones included.
pub fn group_pods(groups: &[PriorityGrace], pods: Vec<Pod>) -> Vec<(PriorityGrace, Vec<Pod>)> {
    let mut out: Vec<(PriorityGrace, Vec<Pod>)> = groups.iter().map(|g| (*g, Vec::new())).collect();
    if out.is_empty() {
        return out;
    }
    for pod in pods {
        let priority = pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
        let index = out
            .iter()
            .rposition(|(g, _)| g.priority <= priority)
            .unwrap_or(0);
        out[index].1.push(pod);
    }
    out
}

/// Whether the node is shutting down: for admission, the Ready condition and the
/// manager.
#[derive(Clone)]
pub struct ShutdownState {
    shutting_down: Arc<watch::Sender<bool>>,
}

impl Default for ShutdownState {
    fn default() -> Self {
        ShutdownState {
            shutting_down: Arc::new(watch::Sender::new(false)),
        }
    }
}

impl ShutdownState {
    pub fn is_shutting_down(&self) -> bool {
        *self.shutting_down.borrow()
    }

    fn set(&self, shutting_down: bool) {
        self.shutting_down.send_replace(shutting_down);
    }

    /// Sees each change, so the node's status is written at once (the kubelet's
    /// `syncNodeStatus` on the announcement).
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.shutting_down.subscribe()
    }

    /// `Err` with the reason while the node shuts down: the Ready condition's.
    pub fn status(&self) -> Result<(), String> {
        if self.is_shutting_down() {
            Err(SHUTTING_DOWN.into())
        } else {
            Ok(())
        }
    }

    /// The kubelet's shutdown admit handler: no pod while the node shuts down.
    pub fn admit(&self, _pod: &Pod) -> Result<(), Rejection> {
        if self.is_shutting_down() {
            Err(Rejection {
                reason: NOT_ADMITTED_REASON.into(),
                message: NOT_ADMITTED_MESSAGE.into(),
            })
        } else {
            Ok(())
        }
    }
}

/// What the manager reads, and where its pod stops reach the sync loop.
pub struct ShutdownManager {
    pub config: ShutdownConfig,
    pub state: ShutdownState,
    pub statuses: StatusStore,
    /// The sync loop's eviction channel, which carries the shutdown's stops too.
    pub kills: mpsc::Sender<Eviction>,
    pub events: EventRecorder,
    pub node_name: String,
    pub root_dir: PathBuf,
}

impl ShutdownManager {
    /// Watches logind until `cancel`; nothing when no grace period is configured.
    pub async fn run(self, cancel: CancellationToken) {
        if !self.config.enabled() {
            return;
        }
        let mut said_unreachable = false;
        loop {
            let retry = match self.watch(&cancel).await {
                Ok(()) => return,
                Err(Watch::Unreachable(e)) => {
                    if !said_unreachable {
                        tracing::error!(
                            "graceful node shutdown is configured, but {e}: pods will not be stopped gracefully when the machine shuts down; retrying every {}s",
                            UNREACHABLE_RETRY.as_secs()
                        );
                        said_unreachable = true;
                    }
                    UNREACHABLE_RETRY
                }
                Err(Watch::Lost(e)) => {
                    tracing::warn!("graceful node shutdown: {e}; watching again");
                    said_unreachable = false;
                    RECONNECT_PERIOD
                }
            };
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(retry) => {}
            }
        }
    }

    /// One watch: logind reached, its delay checked, the inhibitor taken, then the
    /// announcements handled until the bus or logind goes away.
    async fn watch(&self, cancel: &CancellationToken) -> Result<(), Watch> {
        let requested = self.config.requested_delay();
        let logind = logind::Logind::connect()
            .await
            .map_err(|e| Watch::Unreachable(e.to_string()))?;
        logind
            .ensure_inhibit_delay(requested)
            .await
            .map_err(|e| Watch::Unreachable(e.to_string()))?;
        // Subscribed before the inhibitor is taken: no announcement falls between.
        let mut announcements = logind
            .announcements()
            .await
            .map_err(|e| Watch::Unreachable(e.to_string()))?;
        let mut inhibitor = Some(
            logind
                .inhibit()
                .await
                .map_err(|e| Watch::Unreachable(e.to_string()))?,
        );
        tracing::info!(
            delay = %crate::duration::format(requested),
            groups = ?self.config.groups(),
            "graceful node shutdown: holding a systemd-logind delay inhibitor"
        );
        loop {
            let start = tokio::select! {
                () = cancel.cancelled() => return Ok(()),
                a = announcements.next() => match a {
                    Some(Ok(start)) => start,
                    Some(Err(e)) => return Err(Watch::Lost(e.to_string())),
                    None => return Err(Watch::Lost("systemd-logind went away".into())),
                },
            };
            tracing::info!(
                event = if start { "shutdown" } else { "cancelled" },
                "graceful node shutdown: logind announced PrepareForShutdown({start})"
            );
            self.events.node(
                &self.node_name,
                NORMAL,
                EVENT_REASON,
                if start {
                    "Shutdown manager detected shutdown event"
                } else {
                    "Shutdown manager detected shutdown cancellation"
                },
            );
            self.state.set(start);
            if start {
                self.stop_pods(cancel).await;
                // Released: the shutdown goes on.
                drop(inhibitor.take());
                tracing::info!(
                    "graceful node shutdown: pods stopped, inhibitor released; the machine will shut down shortly"
                );
            } else if inhibitor.is_none() {
                inhibitor = Some(
                    logind
                        .inhibit()
                        .await
                        .map_err(|e| Watch::Lost(e.to_string()))?,
                );
            }
        }
    }

    /// The kubelet's `processShutdownEvent`: every active pod stopped, group by group
    /// in ascending priority, each group within its budget.
    async fn stop_pods(&self, cancel: &CancellationToken) {
        let began = SystemTime::now();
        self.write_state(began, None);
        crate::metrics::global().shutdown_started(began);
        let active: Vec<Pod> = self
            .statuses
            .pods()
            .into_iter()
            .filter(|p| {
                !matches!(
                    p.status.as_ref().and_then(|s| s.phase.as_deref()),
                    Some("Succeeded" | "Failed")
                )
            })
            .collect();
        for (group, pods) in group_pods(&self.config.groups(), active) {
            if pods.is_empty() {
                continue;
            }
            let budget = Duration::from_secs(group.grace_seconds.max(0) as u64);
            tracing::info!(
                priority = group.priority,
                budget = %crate::duration::format(budget),
                pods = %pods.iter().map(full_name).collect::<Vec<_>>().join(", "),
                "graceful node shutdown: stopping pods"
            );
            let stops = pods.iter().map(|p| {
                let grace = budget.min(crate::pod::grace_period(p));
                self.stop(p, grace, budget)
            });
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = tokio::time::timeout(budget, futures::future::join_all(stops)) => {}
            }
        }
        let ended = SystemTime::now();
        self.write_state(began, Some(ended));
        crate::metrics::global().shutdown_ended(ended);
    }

    /// Hands one pod's stop to the sync loop and waits (at most `budget`, which the
    /// caller's timeout enforces) until it is stopped.
    async fn stop(&self, pod: &Pod, grace: Duration, budget: Duration) {
        let (accepted, answer) = tokio::sync::oneshot::channel();
        let kill = Eviction {
            uid: uid(pod).to_owned(),
            grace,
            message: MESSAGE.into(),
            cause: KillCause::NodeShutdown,
            accepted,
        };
        if self.kills.send(kill).await.is_err() || answer.await != Ok(true) {
            tracing::debug!(pod = %full_name(pod), "graceful node shutdown: the pod is stopping already or gone");
            return;
        }
        tracing::info!(pod = %full_name(pod), grace = %crate::duration::format(grace), "graceful node shutdown: stopping pod");
        let deadline = Instant::now() + budget;
        while Instant::now() < deadline {
            let stopped = self
                .statuses
                .status(uid(pod))
                .is_none_or(|s| matches!(s.phase.as_deref(), Some("Failed" | "Succeeded")));
            if stopped {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `graceful_node_shutdown_state` in the root directory, as the kubelet keeps it:
    /// when the last shutdown began and ended.
    fn write_state(&self, began: SystemTime, ended: Option<SystemTime>) {
        let rfc3339 = |t: SystemTime| {
            jiff::Timestamp::try_from(t)
                .map(|t| t.to_string())
                .unwrap_or_default()
        };
        let body = serde_json::json!({
            "startTime": rfc3339(began),
            "endTime": ended.map(rfc3339).unwrap_or_else(|| "0001-01-01T00:00:00Z".into()),
        });
        let path = self.root_dir.join(STATE_FILE);
        if let Err(e) = crate::private_file::write(&path, body.to_string().as_bytes()) {
            tracing::warn!(path = %path.display(), "graceful node shutdown: writing the state: {e}");
        }
    }
}

/// Why a watch ended.
enum Watch {
    /// logind cannot be reached or refused (at start, or on each retry).
    Unreachable(String),
    /// A working watch ended (logind restarted, the bus went away).
    Lost(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;

    fn pod(name: &str, priority: Option<i32>) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.spec = Some(PodSpec {
            priority,
            ..Default::default()
        });
        p
    }

    fn names(pods: &[Pod]) -> Vec<&str> {
        pods.iter()
            .map(|p| p.metadata.name.as_deref().unwrap())
            .collect()
    }

    #[test]
    fn the_two_periods_make_a_regular_and_a_critical_group() {
        let c = ShutdownConfig {
            grace_period: Duration::from_secs(30),
            grace_period_critical_pods: Duration::from_secs(10),
            ..Default::default()
        };
        assert_eq!(
            c.groups(),
            vec![
                PriorityGrace {
                    priority: 0,
                    grace_seconds: 20
                },
                PriorityGrace {
                    priority: SYSTEM_CRITICAL_PRIORITY,
                    grace_seconds: 10
                },
            ]
        );
        assert_eq!(c.requested_delay(), Duration::from_secs(30));
        assert!(!ShutdownConfig::default().enabled());
    }

    #[test]
    fn pods_go_to_the_highest_group_not_above_their_priority() {
        let groups = [
            PriorityGrace {
                priority: 100000,
                grace_seconds: 10,
            },
            PriorityGrace {
                priority: 10,
                grace_seconds: 20,
            },
            PriorityGrace {
                priority: 0,
                grace_seconds: 5,
            },
        ];
        let c = ShutdownConfig {
            by_pod_priority: groups.to_vec(),
            ..Default::default()
        };
        let grouped = group_pods(
            &c.groups(),
            vec![
                pod("below-all", Some(-5)),
                pod("none", None),
                pod("at-10", Some(10)),
                pod("between", Some(5000)),
                pod("above-all", Some(2_000_000_000)),
            ],
        );
        let by: Vec<(i32, Vec<&str>)> = grouped
            .iter()
            .map(|(g, p)| (g.priority, names(p)))
            .collect();
        assert_eq!(
            by,
            vec![
                (0, vec!["below-all", "none"]),
                (10, vec!["at-10", "between"]),
                (100000, vec!["above-all"]),
            ]
        );
        assert_eq!(c.requested_delay(), Duration::from_secs(35));
    }

    #[test]
    fn the_kubelets_validation() {
        let secs = Duration::from_secs;
        let bad = |c: ShutdownConfig| c.check().unwrap_err();
        assert!(
            bad(ShutdownConfig {
                grace_period: secs(5),
                grace_period_critical_pods: secs(10),
                ..Default::default()
            })
            .contains("must not exceed shutdownGracePeriod")
        );
        assert!(
            bad(ShutdownConfig {
                grace_period: Duration::from_millis(500),
                ..Default::default()
            })
            .contains("either zero or at least 1s")
        );
        assert!(
            bad(ShutdownConfig {
                grace_period: secs(5),
                by_pod_priority: vec![PriorityGrace {
                    priority: 0,
                    grace_seconds: 1
                }],
                ..Default::default()
            })
            .contains("cannot both be set")
        );
        assert!(
            ShutdownConfig {
                grace_period: secs(30),
                grace_period_critical_pods: secs(10),
                ..Default::default()
            }
            .check()
            .is_ok()
        );
    }

    #[test]
    fn while_shutting_down_pods_are_refused_and_the_node_is_not_ready() {
        let state = ShutdownState::default();
        assert!(state.admit(&pod("p", None)).is_ok());
        assert!(state.status().is_ok());
        state.set(true);
        let refused = state.admit(&pod("p", None)).unwrap_err();
        assert_eq!(refused.reason, "NodeShutdown");
        assert_eq!(
            refused.message,
            "Pod was rejected as the node is shutting down."
        );
        assert_eq!(state.status().unwrap_err(), "node is shutting down");
        state.set(false);
        assert!(state.admit(&pod("p", None)).is_ok());
    }
}
