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

use crate::pod_state::labels;
use crate::router::RuntimeRouter;

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

/// When a relist started and how long it took.
type Relisted = (Instant, Duration);

/// When the PLEG last relisted each runtime, and how long that took, for `/healthz`.
#[derive(Clone, Default)]
pub struct RelistHealth {
    /// Per runtime (by index): its last successful relist.
    last: Arc<Mutex<Vec<Option<Relisted>>>>,
}

impl RelistHealth {
    /// Expects `n` runtimes; until each has relisted once, the PLEG counts from start.
    pub fn expect(&self, n: usize) {
        self.last.lock().unwrap().resize(n, None);
    }

    /// Records a relist of runtime `i` that started at `at` and took `took`.
    pub fn record(&self, i: usize, at: Instant, took: Duration) {
        let mut last = self.last.lock().unwrap();
        if last.len() <= i {
            last.resize(i + 1, None);
        }
        last[i] = Some((at, took));
    }

    /// The longest of the runtimes' last relists.
    pub fn latency(&self) -> Option<Duration> {
        self.last
            .lock()
            .unwrap()
            .iter()
            .flatten()
            .map(|(_, took)| *took)
            .max()
    }

    /// The oldest runtime's last relist and the longest latency, or `Err` with a reason
    /// when some runtime has not been relisted within `threshold` (the kubelet's
    /// `PLEG is not healthy`).
    pub fn check(&self, started: Instant, threshold: Duration) -> Result<String, String> {
        let last = self.last.lock().unwrap().clone();
        let oldest = if last.is_empty() || last.iter().any(Option::is_none) {
            None
        } else {
            last.iter().flatten().map(|(at, _)| *at).min()
        };
        let since = oldest.unwrap_or(started).elapsed();
        if since > threshold {
            return Err(format!(
                "pleg was last seen active {since:.0?} ago; threshold is {threshold:?}"
            ));
        }
        Ok(match (oldest, self.latency()) {
            (Some(_), Some(took)) => format!("last relist {since:.0?} ago, took {took:.1?}"),
            _ => "no relist yet".to_owned(),
        })
    }
}

/// Runs the PLEG until cancelled: per runtime, a relist on `period` and the runtime's
/// own events, each in a task of its own, so that a runtime that hangs delays no
/// other runtime's pods. Returns once every one of those tasks has ended, so a node
/// that waits for this task waits for them too.
pub async fn run(
    router: RuntimeRouter,
    period: Duration,
    health: RelistHealth,
    tx: mpsc::Sender<PodLifecycleEvent>,
    cancel: CancellationToken,
) {
    let runtimes = router.runtimes();
    health.expect(runtimes.len());
    let mut tasks = tokio::task::JoinSet::new();
    for (i, runtime) in runtimes.into_iter().enumerate() {
        tasks.spawn(forward_events(runtime.clone(), tx.clone(), cancel.clone()));
        tasks.spawn(relist_loop(
            i,
            runtime,
            period,
            health.clone(),
            tx.clone(),
            cancel.clone(),
        ));
    }
    // The sender stays open until the node stops; then each task returns.
    cancel.cancelled().await;
    drop(tx);
    while let Some(ended) = tasks.join_next().await {
        if let Err(e) = ended
            && e.is_panic()
        {
            tracing::error!("a PLEG task panicked: {e}");
        }
    }
}

/// Passes a runtime's pushed events on as lifecycle events.
async fn forward_events(
    runtime: Arc<dyn Runtime>,
    tx: mpsc::Sender<PodLifecycleEvent>,
    cancel: CancellationToken,
) {
    let mut events = runtime.subscribe();
    loop {
        let ev = tokio::select! {
            () = cancel.cancelled() => return,
            ev = events.recv() => match ev {
                Ok(ev) => ev,
                // Lagged: the relist catches whatever was missed.
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            },
        };
        let kind = match ev.kind {
            ContainerEventKind::Started => LifecycleKind::ContainerStarted,
            ContainerEventKind::Stopped => LifecycleKind::ContainerDied,
            ContainerEventKind::Deleted => LifecycleKind::ContainerRemoved,
            ContainerEventKind::Created => continue,
        };
        let event = PodLifecycleEvent {
            pod_uid: ev.pod_uid,
            container_id: ev.container_id,
            kind,
        };
        tokio::select! {
            () = cancel.cancelled() => return,
            sent = tx.send(event) => if sent.is_err() { return },
        }
    }
}

/// Relists one runtime every `period`. A runtime that cannot be listed keeps its last
/// listing, so an outage is not read as its containers being removed.
async fn relist_loop(
    i: usize,
    runtime: Arc<dyn Runtime>,
    period: Duration,
    health: RelistHealth,
    tx: mpsc::Sender<PodLifecycleEvent>,
    cancel: CancellationToken,
) {
    let mut previous = Listing::new();
    let mut failing = false;
    let mut last_start: Option<Instant> = None;
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let at = Instant::now();
        // A relist or a send that waits on a hung runtime or a full channel is given
        // up when the node stops: it changes nothing.
        let listed = tokio::select! {
            () = cancel.cancelled() => return,
            listed = relist(&*runtime) => listed,
        };
        match listed {
            Ok(current) => {
                health.record(i, at, at.elapsed());
                crate::metrics::global()
                    .relisted(at.elapsed(), last_start.map(|l| at.duration_since(l)));
                last_start = Some(at);
                if std::mem::replace(&mut failing, false) {
                    tracing::info!(runtime = runtime.name(), "PLEG relist succeeds again");
                }
                for ev in diff(&previous, &current) {
                    tokio::select! {
                        () = cancel.cancelled() => return,
                        sent = tx.send(ev) => if sent.is_err() { return },
                    }
                }
                previous = current;
            }
            Err(e) => {
                if !std::mem::replace(&mut failing, true) {
                    tracing::warn!(runtime = runtime.name(), "PLEG relist failed: {e}");
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
        health.record(0, Instant::now(), Duration::from_millis(3));
        tokio::time::advance(Duration::from_secs(179)).await;
        let ok = health.check(started, threshold).unwrap();
        assert_eq!(ok, "last relist 179s ago, took 3.0ms");
        tokio::time::advance(Duration::from_secs(2)).await;
        let err = health.check(started, threshold).unwrap_err();
        assert!(err.contains("pleg was last seen active"), "{err}");
    }

    #[tokio::test(start_paused = true)]
    async fn every_runtime_must_relist_for_the_pleg_to_be_healthy() {
        let health = RelistHealth::default();
        health.expect(2);
        let started = Instant::now();
        let threshold = Duration::from_secs(180);
        for _ in 0..4 {
            tokio::time::advance(Duration::from_secs(60)).await;
            // The Wasm runtime relists; the CRI runtime hangs.
            health.record(0, Instant::now(), Duration::from_millis(1));
        }
        let err = health.check(started, threshold).unwrap_err();
        assert!(err.contains("240s"), "{err}");
        health.record(1, Instant::now(), Duration::from_millis(40));
        assert_eq!(
            health.check(started, threshold).unwrap(),
            "last relist 0ns ago, took 40.0ms"
        );
    }

    /// The node waits for the PLEG task at shutdown: it ends once cancelled, with its
    /// per-runtime tasks, even while a relist is held by a runtime that does not answer.
    #[tokio::test]
    async fn run_ends_with_its_tasks_when_cancelled_during_a_hung_relist() {
        use wasmlet_testkit::fake_runtime::{Call, CallKind, FakeRuntime};
        let fake = Arc::new(FakeRuntime::new());
        fake.hold(CallKind::ListContainers);
        let runtime: Arc<dyn Runtime> = fake.clone();
        let router = RuntimeRouter::new(
            std::collections::BTreeMap::new(),
            std::collections::BTreeMap::from([(String::new(), runtime)]),
            "",
        );
        let (tx, _rx) = mpsc::channel(1);
        let cancel = CancellationToken::new();
        let pleg = tokio::spawn(run(
            router,
            Duration::from_millis(10),
            RelistHealth::default(),
            tx,
            cancel.clone(),
        ));
        fake.wait_for_call(|c| matches!(c, Call::ListContainers))
            .await;
        cancel.cancel();
        tokio::time::timeout(Duration::from_secs(5), pleg)
            .await
            .expect("the PLEG ends when cancelled")
            .unwrap();
        // Its relist and event tasks went with it: nothing but the test holds the
        // runtime.
        assert_eq!(
            Arc::strong_count(&fake),
            1,
            "a PLEG task still holds the runtime"
        );
    }
}
