//! Pod workers: one task per pod UID, at most one sync of a pod at a time, and a newer
//! desired state replacing one that has not been picked up yet.
//!
//! A worker's life is a small state machine, [`WorkerPhase`]: it syncs until it is
//! asked to terminate, then stops the pod within its grace period and ends. Once a UID
//! is terminating it never syncs again; a pod that comes back with the same UID waits
//! for the old worker to finish (the sync loop queues it).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::pod::{full_name, uid};
use crate::pod_state::PodState;
use crate::status::{StatusStore, pod_status};
use crate::sync::PodSyncer;

/// What a worker is asked to do next.
#[derive(Clone, Debug)]
pub enum Work {
    /// Bring the pod to its spec.
    Sync(Box<Pod>),
    /// Stop the pod within the grace period, then end.
    Terminate { pod: Box<Pod>, grace: Duration },
    /// The eviction manager's or the shutdown manager's: stop the pod within the grace
    /// period and fail it with the cause's reason and this message; the worker goes on
    /// (the pod stays known until it is deleted).
    Evict {
        pod: Box<Pod>,
        grace: Duration,
        message: String,
        cause: crate::pod_state::KillCause,
    },
}

impl Work {
    fn pod(&self) -> &Pod {
        match self {
            Work::Sync(p) | Work::Terminate { pod: p, .. } | Work::Evict { pod: p, .. } => p,
        }
    }
}

/// The phases of a pod worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerPhase {
    Syncing,
    Terminating,
    Terminated,
}

/// A move between phases the worker does not allow.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("pod worker cannot go from {from:?} to {to:?}")]
pub struct IllegalTransition {
    pub from: WorkerPhase,
    pub to: WorkerPhase,
}

impl WorkerPhase {
    /// The phase after a transition to `to`, if it is allowed.
    pub fn transition(self, to: WorkerPhase) -> Result<WorkerPhase, IllegalTransition> {
        use WorkerPhase::*;
        match (self, to) {
            (Syncing, Syncing)
            | (Syncing, Terminating)
            | (Terminating, Terminating)
            | (Terminating, Terminated) => Ok(to),
            (from, to) => Err(IllegalTransition { from, to }),
        }
    }
}

struct WorkerHandle {
    tx: watch::Sender<Work>,
    phase: WorkerPhase,
}

/// The set of pod workers.
pub struct PodWorkers {
    syncer: Arc<PodSyncer>,
    statuses: StatusStore,
    workers: HashMap<String, WorkerHandle>,
    done_tx: mpsc::UnboundedSender<String>,
    /// Every worker task, for the node's drain.
    tasks: TaskTracker,
}

impl PodWorkers {
    /// Workers report their UID on `done_tx` when they have terminated their pod.
    pub fn new(
        syncer: Arc<PodSyncer>,
        statuses: StatusStore,
        done_tx: mpsc::UnboundedSender<String>,
    ) -> Self {
        PodWorkers {
            syncer,
            statuses,
            workers: HashMap::new(),
            done_tx,
            tasks: TaskTracker::new(),
        }
    }

    /// The tracker every worker runs on: the node waits on it when it drains, so a
    /// worker finishes the sync and the status write it is in.
    pub fn tasks(&self) -> TaskTracker {
        self.tasks.clone()
    }

    /// Hands work to the pod's worker, starting one if needed. Returns `false` if the
    /// work was refused because the UID is terminating.
    pub fn update(&mut self, work: Work) -> bool {
        let id = uid(work.pod()).to_owned();
        let to = match work {
            Work::Sync(_) | Work::Evict { .. } => WorkerPhase::Syncing,
            Work::Terminate { .. } => WorkerPhase::Terminating,
        };
        match self.workers.get_mut(&id) {
            Some(w) => match w.phase.transition(to) {
                Ok(next) => {
                    w.phase = next;
                    // An eviction is not replaced by a sync the worker may not have
                    // picked it up before (once evicted, a sync does nothing).
                    let keeps_eviction = matches!(work, Work::Sync(_))
                        && matches!(*w.tx.borrow(), Work::Evict { .. });
                    if !keeps_eviction {
                        w.tx.send_replace(work);
                    }
                    true
                }
                Err(e) => {
                    tracing::debug!(pod = %full_name(work.pod()), "{e}; work dropped");
                    false
                }
            },
            None => {
                // A pod to terminate that has no worker (the node restarted, or it was
                // deleted before it started) still gets one: what the runtime runs for
                // it is adopted and stopped within the grace, then it is finished.
                let (tx, rx) = watch::channel(work);
                let task = run_worker(
                    self.syncer.clone(),
                    self.statuses.clone(),
                    rx,
                    self.done_tx.clone(),
                );
                self.tasks.spawn(task);
                self.workers.insert(id, WorkerHandle { tx, phase: to });
                true
            }
        }
    }

    /// Whether the UID has a worker that is terminating.
    pub fn is_terminating(&self, uid: &str) -> bool {
        self.workers
            .get(uid)
            .is_some_and(|w| w.phase == WorkerPhase::Terminating)
    }

    /// Whether the UID has a worker.
    pub fn contains(&self, uid: &str) -> bool {
        self.workers.contains_key(uid)
    }

    /// The UIDs that have a worker, terminating or not.
    pub fn uids(&self) -> impl Iterator<Item = String> + '_ {
        self.workers.keys().cloned()
    }

    /// Forgets a worker that reported it is done.
    pub fn finished(&mut self, uid: &str) {
        if let Some(mut w) = self.workers.remove(uid) {
            w.phase = w
                .phase
                .transition(WorkerPhase::Terminated)
                .unwrap_or(WorkerPhase::Terminated);
        }
    }

    /// Number of live workers.
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// Whether there are no workers.
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }
}

async fn run_worker(
    syncer: Arc<PodSyncer>,
    statuses: StatusStore,
    mut rx: watch::Receiver<Work>,
    done_tx: mpsc::UnboundedSender<String>,
) {
    let mut st = PodState::default();
    // For `kubelet_pod_start_duration_seconds`: when the node first saw the pod, until
    // it first runs.
    let first_seen = Instant::now();
    let mut started = false;
    let mut syncs: u64 = 0;
    // The API status: what the pod state shows, with the node's addresses.
    let status_of = |pod: &Pod, st: &PodState, previous: Option<&PodStatus>| {
        crate::status::with_host_ips(pod_status(pod, st, previous), pod, &syncer.host_ips)
    };
    loop {
        let work = rx.borrow_and_update().clone();
        let pod = work.pod().clone();
        let id = uid(&pod).to_owned();
        let span = tracing::info_span!("pod", pod = %full_name(&pod), uid = %id);
        match work {
            Work::Sync(_) | Work::Evict { .. } => {
                if let Work::Evict {
                    grace,
                    message,
                    cause,
                    ..
                } = &work
                {
                    syncer
                        .evict(&pod, &mut st, *grace, message.clone(), *cause)
                        .instrument(span.clone())
                        .await;
                }
                // As the kubelet's SyncPod sets the status before it starts anything:
                // a pod starting is Pending, and known to what reads the statuses (the
                // eviction manager ranks what runs) while its containers start.
                if syncs == 0 && statuses.status(&id).is_none() {
                    statuses.set(pod.clone(), status_of(&pod, &st, None));
                }
                let began = Instant::now();
                let outcome = syncer.sync_pod(&pod, &mut st).instrument(span).await;
                let kind = if syncs == 0 {
                    crate::metrics::SyncKind::Create
                } else {
                    crate::metrics::SyncKind::Sync
                };
                syncs += 1;
                crate::metrics::global().pod_worker(kind, began.elapsed());
                syncer.snapshot_probes(&mut st);
                let previous = statuses.status(&id);
                let status = status_of(&pod, &st, previous.as_ref());
                if previous.as_ref().and_then(|p| p.phase.as_ref()) != status.phase.as_ref() {
                    tracing::info!(pod = %full_name(&pod), phase = ?status.phase.as_deref().unwrap_or(""), "pod phase");
                }
                let finished = matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"));
                if !started && status.phase.as_deref() == Some("Running") {
                    started = true;
                    crate::metrics::global().pod_started(first_seen.elapsed());
                }
                statuses.set(pod.clone(), status);
                if !finished {
                    syncer.probe(&pod, &st);
                }
                let requeue = outcome.requeue_after.map(|d| Instant::now() + d);
                wait_for_work(&mut rx, requeue).await;
                if rx.has_changed().is_err() {
                    return;
                }
            }
            Work::Terminate { grace, .. } => {
                tracing::info!(parent: &span, grace = ?grace, "terminating pod");
                let began = Instant::now();
                syncer.kill_pod(&pod, &mut st, grace).instrument(span).await;
                crate::metrics::global()
                    .pod_worker(crate::metrics::SyncKind::Kill, began.elapsed());
                let previous = statuses.status(&id);
                let status = crate::status::terminal(status_of(&pod, &st, previous.as_ref()));
                statuses.finish(pod, status);
                let _ = done_tx.send(id);
                return;
            }
        }
    }
}

/// Waits for new work, or until `requeue` (a back-off ending) if there is one.
async fn wait_for_work(rx: &mut watch::Receiver<Work>, requeue: Option<Instant>) {
    tokio::select! {
        _ = rx.changed() => {}
        () = async {
            match requeue {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        } => {}
    }
}

#[cfg(test)]
mod tests {
    use super::WorkerPhase::*;

    #[test]
    fn phase_transitions_are_guarded() {
        assert_eq!(Syncing.transition(Terminating), Ok(Terminating));
        assert_eq!(Terminating.transition(Terminated), Ok(Terminated));
        let err = Terminating.transition(Syncing).unwrap_err();
        assert_eq!(
            err.to_string(),
            "pod worker cannot go from Terminating to Syncing"
        );
        assert!(Terminated.transition(Syncing).is_err());
        assert!(Syncing.transition(Terminated).is_err());
    }
}
