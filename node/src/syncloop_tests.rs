//! Unit tests of the sync loop ([`SyncLoop::run`]) and its per-pod workers over the
//! recording [`FakeRuntime`]. The clock is paused: the loop's timers never fire by
//! themselves, and a wait that never ends fails at once (virtual) instead of hanging.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use wasmlet_testkit::fake_runtime::{Call, CallKind};

use crate::pleg::{LifecycleKind, PodLifecycleEvent};
use crate::podconfig::SourceSnapshot;
use crate::status::StatusStore;
use crate::sync_tests::{Harness, harness, pod, script};
use crate::syncloop::{LoopHealth, LoopTiming, SyncLoop};

/// A sync loop running over a fake runtime, fed by the test.
struct Running {
    h: Harness,
    statuses: StatusStore,
    sources: mpsc::Sender<SourceSnapshot>,
    pleg: mpsc::Sender<PodLifecycleEvent>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

async fn start() -> Running {
    let h = harness();
    let statuses = StatusStore::default();
    let timing = LoopTiming {
        // Far beyond any wait of a test: only the test's inputs make the loop act.
        housekeeping_interval: Duration::from_secs(3600),
        sync_frequency: Duration::from_secs(3600),
    };
    let sync_loop = SyncLoop::new(
        h.syncer.clone(),
        statuses.clone(),
        timing,
        LoopHealth::default(),
    );
    // One slot: a send returns only once the loop took the snapshot before it.
    let (sources, sources_rx) = mpsc::channel(1);
    let (pleg, pleg_rx) = mpsc::channel(1);
    let cancel = CancellationToken::new();
    let task = tokio::spawn(sync_loop.run(sources_rx, pleg_rx, cancel.clone()));
    // Housekeeping's first pass lists the sandboxes at once; let it find none before
    // any pod exists, so it cannot race a pod's first sync.
    within(
        "the first housekeeping",
        h.fake.wait_for_call(|c| *c == Call::ListPodSandboxes),
    )
    .await;
    Running {
        h,
        statuses,
        sources,
        pleg,
        cancel,
        task,
    }
}

impl Running {
    async fn send(&self, pods: Vec<Pod>) {
        self.sources
            .send(SourceSnapshot {
                source: "file".into(),
                pods,
            })
            .await
            .expect("the loop runs");
    }

    /// Waits until the pod's published status satisfies `pred`.
    async fn status_until(&self, uid: &str, pred: impl Fn(&PodStatus) -> bool) -> PodStatus {
        within("the pod's status", async {
            loop {
                if let Some(s) = self.statuses.status(uid).filter(|s| pred(s)) {
                    return s;
                }
                self.statuses.changed().await;
            }
        })
        .await
    }

    async fn stop(self) {
        self.cancel.cancel();
        self.task.await.unwrap();
    }
}

/// `fut`, or a panic naming `what` if it takes over 30 s (of paused, virtual time: at
/// once in real time when nothing else can happen).
async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

fn running(name: &str) -> impl Fn(&PodStatus) -> bool + '_ {
    move |s| {
        s.container_statuses
            .iter()
            .flatten()
            .any(|c| c.name == name && c.state.as_ref().is_some_and(|st| st.running.is_some()))
    }
}

fn created_names(calls: &[Call]) -> Vec<String> {
    calls
        .iter()
        .filter_map(|c| match c {
            Call::CreateContainer { name, .. } => Some(name.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_pod_from_a_source_is_synced_and_its_containers_started() {
    let l = start().await;
    l.send(vec![pod("uid-1", "Always", &["app", "web"])]).await;
    let status = l.status_until("uid-1", running("web")).await;
    assert_eq!(status.phase.as_deref(), Some("Running"));
    assert_eq!(
        script(&l.h.fake),
        [
            "run-sandbox",
            "pull img/app:1",
            "create app#0",
            "start app",
            "pull img/web:1",
            "create web#0",
            "start web"
        ]
    );
    l.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_pod_removed_from_its_source_is_killed_within_its_grace() {
    let l = start().await;
    let mut p = pod("uid-2", "Always", &["app"]);
    p.spec.as_mut().unwrap().termination_grace_period_seconds = Some(7);
    l.send(vec![p]).await;
    l.status_until("uid-2", running("app")).await;
    let app = l.h.fake.container("app").unwrap().id;
    l.h.fake.take_calls();

    l.send(vec![]).await;
    within("the pod to be finished", async {
        while l.statuses.status("uid-2").is_some() {
            l.statuses.changed().await;
        }
    })
    .await;
    assert_eq!(script(&l.h.fake), ["stop app", "remove-sandbox"]);
    assert!(
        l.h.fake
            .calls()
            .contains(&Call::StopContainer(app, Duration::from_secs(7)))
    );
    assert!(l.h.fake.sandboxes().is_empty());
    l.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_updated_pod_replaces_the_one_queued_for_a_busy_worker() {
    let l = start().await;
    // The worker's first sync is held in the runtime while the pod changes twice.
    l.h.fake.hold(CallKind::StartContainer);
    l.send(vec![pod("uid-3", "Always", &["a"])]).await;
    within(
        "the first sync to start `a`",
        l.h.fake
            .wait_for_call(|c| matches!(c, Call::StartContainer(_))),
    )
    .await;
    l.send(vec![pod("uid-3", "Always", &["a", "b"])]).await;
    let latest = pod("uid-3", "Always", &["a", "c"]);
    l.send(vec![latest.clone()]).await;
    // With one slot, these return once the loop has taken (and so applied) the
    // updates before them; the same pod again is no update.
    l.send(vec![latest.clone()]).await;
    l.send(vec![latest]).await;
    l.h.fake.release(CallKind::StartContainer);

    l.status_until("uid-3", running("c")).await;
    assert_eq!(
        created_names(&l.h.fake.calls()),
        ["a", "c"],
        "the version with `b` was replaced before any sync picked it up"
    );
    l.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_container_death_from_the_pleg_syncs_the_pod_and_restarts_it() {
    let l = start().await;
    l.send(vec![pod("uid-4", "Always", &["app"])]).await;
    l.status_until("uid-4", running("app")).await;
    let id = l.h.fake.exit("app", 1);
    l.pleg
        .send(PodLifecycleEvent {
            pod_uid: "uid-4".into(),
            container_id: id,
            kind: LifecycleKind::ContainerDied,
        })
        .await
        .unwrap();
    let status = l
        .status_until("uid-4", |s| {
            s.container_statuses
                .iter()
                .flatten()
                .any(|c| c.restart_count == 1)
        })
        .await;
    let app = &status.container_statuses.unwrap()[0];
    assert!(app.state.as_ref().unwrap().running.is_some());
    assert_eq!(
        app.last_state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .map(|t| t.exit_code),
        Some(1)
    );
    assert_eq!(created_names(&l.h.fake.calls()), ["app", "app"]);
    l.stop().await;
}
