//! PLEG, the pod lifecycle event generator: relists every runtime's containers on a
//! period, diffs against the previous listing and tells the sync loop which pods
//! changed. Runtime events (pushed by the Wasm runtime as they happen) wake it sooner.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use wasmlet_runtime::{ContainerEventKind, ContainerState, Runtime};

use crate::router::RuntimeRouter;
use crate::sync::labels;

/// What happened to a container of a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LifecycleKind {
    ContainerStarted,
    ContainerDied,
    ContainerRemoved,
    ContainerChanged,
}

/// One change for the sync loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodLifecycleEvent {
    pub pod_uid: String,
    pub container_id: String,
    pub kind: LifecycleKind,
}

/// When the PLEG last relisted every runtime, and how long that took, for `/healthz`.
#[derive(Clone, Default)]
pub struct RelistHealth {
    last: Arc<Mutex<Option<(Instant, Duration)>>>,
}

impl RelistHealth {
    /// Records a relist of every runtime that started at `at` and took `took`.
    pub fn record(&self, at: Instant, took: Duration) {
        *self.last.lock().unwrap() = Some((at, took));
    }

    /// How long the last complete relist took.
    pub fn latency(&self) -> Option<Duration> {
        self.last.lock().unwrap().map(|(_, took)| took)
    }

    /// The last relist and its latency, or `Err` with a reason when no relist of
    /// every runtime succeeded within `threshold` (the kubelet's `PLEG is not healthy`).
    pub fn check(&self, started: Instant, threshold: Duration) -> Result<String, String> {
        let last = *self.last.lock().unwrap();
        let since = last.map_or(started, |(at, _)| at).elapsed();
        if since > threshold {
            return Err(format!(
                "pleg was last seen active {since:.0?} ago; threshold is {threshold:?}"
            ));
        }
        Ok(match last {
            Some((_, took)) => format!("last relist {since:.0?} ago, took {took:.1?}"),
            None => "no relist yet".to_owned(),
        })
    }
}

/// Runs the PLEG until cancelled.
pub async fn run(
    router: RuntimeRouter,
    period: Duration,
    health: RelistHealth,
    tx: mpsc::Sender<PodLifecycleEvent>,
    cancel: CancellationToken,
) {
    let (push_tx, mut push_rx) = mpsc::unbounded_channel();
    for runtime in router.runtimes() {
        let mut events = runtime.subscribe();
        let push_tx = push_tx.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    ev = events.recv() => match ev {
                        Ok(ev) => { let _ = push_tx.send(ev); }
                        // Lagged: the relist catches whatever was missed.
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    },
                }
            }
        });
    }
    let runtimes = router.runtimes();
    // One listing per runtime: a runtime that cannot be listed keeps its last listing,
    // so an outage of one runtime is not read as its containers being removed, and the
    // others' pods still get their events.
    let mut previous: Vec<Listing> = vec![HashMap::new(); runtimes.len()];
    let mut failing: Vec<bool> = vec![false; runtimes.len()];
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {
                let at = Instant::now();
                let mut all_listed = true;
                for (i, runtime) in runtimes.iter().enumerate() {
                    match relist(&**runtime).await {
                        Ok(current) => {
                            if std::mem::replace(&mut failing[i], false) {
                                tracing::info!(runtime = runtime.name(), "PLEG relist succeeds again");
                            }
                            for ev in diff(&previous[i], &current) {
                                if tx.send(ev).await.is_err() {
                                    return;
                                }
                            }
                            previous[i] = current;
                        }
                        Err(e) => {
                            all_listed = false;
                            if !std::mem::replace(&mut failing[i], true) {
                                tracing::warn!(runtime = runtime.name(), "PLEG relist failed: {e}");
                            }
                        }
                    }
                }
                if all_listed {
                    health.record(at, at.elapsed());
                }
            }
            Some(ev) = push_rx.recv() => {
                let kind = match ev.kind {
                    ContainerEventKind::Started => LifecycleKind::ContainerStarted,
                    ContainerEventKind::Stopped => LifecycleKind::ContainerDied,
                    ContainerEventKind::Deleted => LifecycleKind::ContainerRemoved,
                    ContainerEventKind::Created => LifecycleKind::ContainerChanged,
                };
                if ev.kind == ContainerEventKind::Created {
                    continue;
                }
                let event = PodLifecycleEvent { pod_uid: ev.pod_uid, container_id: ev.container_id, kind };
                if tx.send(event).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Container id → (pod UID, state).
pub type Listing = HashMap<String, (String, ContainerState)>;

async fn relist(runtime: &dyn Runtime) -> Result<Listing, wasmlet_runtime::Error> {
    Ok(runtime
        .list_containers()
        .await?
        .into_iter()
        .map(|c| {
            let uid = c.labels.get(labels::POD_UID).cloned().unwrap_or_default();
            (c.id, (uid, c.state))
        })
        .collect())
}

/// The events that turn listing `old` into listing `new`.
pub fn diff(old: &Listing, new: &Listing) -> Vec<PodLifecycleEvent> {
    let mut events = Vec::new();
    for (id, (uid, state)) in new {
        let before = old.get(id).map(|(_, s)| *s);
        if before == Some(*state) {
            continue;
        }
        let kind = match state {
            ContainerState::Running => LifecycleKind::ContainerStarted,
            ContainerState::Exited => LifecycleKind::ContainerDied,
            _ => LifecycleKind::ContainerChanged,
        };
        events.push(PodLifecycleEvent {
            pod_uid: uid.clone(),
            container_id: id.clone(),
            kind,
        });
    }
    for (id, (uid, _)) in old {
        if !new.contains_key(id) {
            events.push(PodLifecycleEvent {
                pod_uid: uid.clone(),
                container_id: id.clone(),
                kind: LifecycleKind::ContainerRemoved,
            });
        }
    }
    events.sort_by(|a, b| a.container_id.cmp(&b.container_id));
    events
}

#[cfg(test)]
mod tests {
    use super::*;
    use ContainerState::*;

    fn listing(
        items: &[(&str, &str, ContainerState)],
    ) -> HashMap<String, (String, ContainerState)> {
        items
            .iter()
            .map(|(id, uid, s)| (id.to_string(), (uid.to_string(), *s)))
            .collect()
    }

    #[test]
    fn diffs_listings_into_events() {
        let old = listing(&[
            ("a", "p1", Running),
            ("b", "p1", Running),
            ("c", "p2", Exited),
        ]);
        let new = listing(&[
            ("a", "p1", Running),
            ("b", "p1", Exited),
            ("d", "p2", Running),
        ]);
        let got: Vec<_> = diff(&old, &new)
            .into_iter()
            .map(|e| (e.container_id, e.pod_uid, e.kind))
            .collect();
        assert_eq!(
            got,
            [
                ("b".into(), "p1".into(), LifecycleKind::ContainerDied),
                ("c".into(), "p2".into(), LifecycleKind::ContainerRemoved),
                ("d".into(), "p2".into(), LifecycleKind::ContainerStarted),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn health_fails_after_the_threshold_without_a_relist() {
        let health = RelistHealth::default();
        let started = Instant::now();
        let threshold = Duration::from_secs(180);
        assert_eq!(health.check(started, threshold).unwrap(), "no relist yet");
        tokio::time::advance(Duration::from_secs(170)).await;
        health.record(Instant::now(), Duration::from_millis(3));
        tokio::time::advance(Duration::from_secs(179)).await;
        let ok = health.check(started, threshold).unwrap();
        assert_eq!(ok, "last relist 179s ago, took 3.0ms");
        tokio::time::advance(Duration::from_secs(2)).await;
        let err = health.check(started, threshold).unwrap_err();
        assert!(err.contains("pleg was last seen active"), "{err}");
    }
}
