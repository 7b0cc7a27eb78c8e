//! Unit tests of the pod sync ([`PodSyncer::sync_pod`], [`PodSyncer::kill_pod`]) over
//! the recording [`FakeRuntime`]: what the node asks of the runtime, in which order,
//! and what it makes of the answers. No real runtime, no sleeps; files go to a tempdir.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{Container, ContainerStatus as ApiContainerStatus, Pod, PodSpec};
use wasmlet_runtime::{
    ContainerConfig, ContainerMetadata, ContainerState, Error, PodMetadata, PodSandboxConfig,
    Runtime, SandboxState,
};
use wasmlet_testkit::fake_runtime::{Call, CallKind, FakeRuntime};

use crate::pod_state::{PodState, labels};
use crate::router::RuntimeRouter;
use crate::status::{pod_status, terminal};
use crate::sync::PodSyncer;

pub(crate) const BACKOFF_INITIAL: Duration = Duration::from_secs(10);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// A fake runtime, the syncer over it (as the default runtime), and the tempdir its
/// log directories go to.
pub(crate) struct Harness {
    pub fake: Arc<FakeRuntime>,
    pub syncer: Arc<PodSyncer>,
    pub dir: tempfile::TempDir,
}

/// A syncer over `fake`, as a node (re)started with it as its only runtime.
pub(crate) fn syncer_over(fake: &Arc<FakeRuntime>, dir: &std::path::Path) -> PodSyncer {
    let runtime: Arc<dyn Runtime> = fake.clone();
    let router = RuntimeRouter::new(
        BTreeMap::new(),
        BTreeMap::from([(String::new(), runtime)]),
        "",
    );
    PodSyncer::new(router, BACKOFF_INITIAL, BACKOFF_MAX, dir.join("logs"))
}

pub(crate) fn harness() -> Harness {
    let fake = Arc::new(FakeRuntime::new());
    let dir = tempfile::tempdir().unwrap();
    let syncer = Arc::new(syncer_over(&fake, dir.path()));
    Harness { fake, syncer, dir }
}

/// A container named `name` running `img/<name>:1`.
pub(crate) fn container(name: &str) -> Container {
    Container {
        name: name.into(),
        image: Some(format!("img/{name}:1")),
        ..Default::default()
    }
}

/// Pod `pod-<uid>` in `default` with these containers and restart policy.
pub(crate) fn pod(uid: &str, policy: &str, containers: &[&str]) -> Pod {
    let mut p = Pod::default();
    p.metadata.name = Some(format!("pod-{uid}"));
    p.metadata.namespace = Some("default".into());
    p.metadata.uid = Some(uid.into());
    p.spec = Some(PodSpec {
        restart_policy: Some(policy.into()),
        containers: containers.iter().map(|n| container(n)).collect(),
        ..Default::default()
    });
    p
}

/// Adds init containers (run to completion, in order).
pub(crate) fn with_init(mut p: Pod, names: &[&str]) -> Pod {
    let spec = p.spec.as_mut().unwrap();
    spec.init_containers
        .get_or_insert_with(Vec::new)
        .extend(names.iter().map(|n| container(n)));
    p
}

/// Adds sidecars: init containers with `restartPolicy: Always`.
pub(crate) fn with_sidecars(mut p: Pod, names: &[&str]) -> Pod {
    let spec = p.spec.as_mut().unwrap();
    spec.init_containers
        .get_or_insert_with(Vec::new)
        .extend(names.iter().map(|n| Container {
            restart_policy: Some("Always".into()),
            ..container(n)
        }));
    p
}

/// The fake's calls that change something, in order, in short words:
/// `run-sandbox`, `pull <image>`, `create <name>#<attempt>`, `start <name>`,
/// `stop <name>`, `remove <name>`, `resize <name>`, `stop-sandbox`, `remove-sandbox`.
pub(crate) fn script(fake: &FakeRuntime) -> Vec<String> {
    let name = |id: &str| fake.name_of(id).unwrap_or_else(|| id.to_owned());
    fake.mutations()
        .into_iter()
        .map(|c| match c {
            Call::RunPodSandbox { .. } => "run-sandbox".to_owned(),
            Call::StopPodSandbox(_) => "stop-sandbox".to_owned(),
            Call::RemovePodSandbox(_) => "remove-sandbox".to_owned(),
            Call::PullImage(image) => format!("pull {image}"),
            Call::CreateContainer { name, attempt, .. } => format!("create {name}#{attempt}"),
            Call::StartContainer(id) => format!("start {}", name(&id)),
            Call::StopContainer(id, _) => format!("stop {}", name(&id)),
            Call::RemoveContainer(id) => format!("remove {}", name(&id)),
            Call::UpdateContainerResources(id, _) => format!("resize {}", name(&id)),
            other => format!("{other:?}"),
        })
        .collect()
}

/// The API status of container `name` in `status`.
fn api_status<'a>(
    status: &'a k8s_openapi::api::core::v1::PodStatus,
    name: &str,
) -> &'a ApiContainerStatus {
    status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no status of {name}"))
}

fn state_of(st: &PodState, name: &str) -> Option<ContainerState> {
    st.containers.get(name)?.current.as_ref().map(|c| c.state)
}

// --- (a) A new pod ---

#[tokio::test(start_paused = true)]
async fn a_new_pod_gets_a_sandbox_then_its_init_containers_to_success_then_the_regular_ones() {
    let h = harness();
    let pod = with_init(
        pod("uid-a", "Always", &["app", "web"]),
        &["init-1", "init-2"],
    );
    h.fake.exit_on_start("init-1", 0);
    h.fake.exit_on_start("init-2", 0);
    let mut st = PodState::default();
    let out = h.syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(
        script(&h.fake),
        [
            "run-sandbox",
            "pull img/init-1:1",
            "create init-1#0",
            "start init-1",
            "pull img/init-2:1",
            "create init-2#0",
            "start init-2",
            "pull img/app:1",
            "create app#0",
            "start app",
            "pull img/web:1",
            "create web#0",
            "start web",
        ]
    );
    assert_eq!(out.requeue_after, None, "nothing to wait for");
    assert!(st.initialized);
    for name in ["app", "web"] {
        assert_eq!(state_of(&st, name), Some(ContainerState::Running), "{name}");
        assert_eq!(
            h.fake.container(name).unwrap().state,
            ContainerState::Running
        );
    }
    // The sandbox and containers carry the labels the node finds its own by.
    let sandboxes = h.fake.sandboxes();
    assert_eq!(sandboxes.len(), 1);
    let sb = &sandboxes[0];
    assert_eq!(sb.labels[labels::POD_UID], "uid-a");
    assert_eq!(sb.state, SandboxState::Ready);
    assert_eq!(st.sandbox.as_ref().map(|s| s.id.as_str()), Some(&*sb.id));
    let app = h.fake.container_config("app").unwrap();
    assert_eq!(app.labels[labels::POD_UID], "uid-a");
    assert_eq!(app.labels[labels::CONTAINER_NAME], "app");
    assert_eq!(app.annotations[labels::CONTAINER_RESTART_COUNT], "0");
    // The pod's log directory was made (in the tempdir) for the runtime to write in.
    let log_dir = h.fake.sandbox_config(&sb.id).unwrap().log_directory;
    assert!(log_dir.starts_with(h.dir.path()) && log_dir.is_dir());
    assert_eq!(
        pod_status(&pod, &st, None).phase.as_deref(),
        Some("Running")
    );

    // In sync already: another sync changes nothing.
    h.fake.take_calls();
    h.syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(script(&h.fake), Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn init_containers_run_one_at_a_time_and_hold_the_regular_ones_back() {
    let h = harness();
    let pod = with_init(
        pod("uid-i", "Always", &["app", "web"]),
        &["init-1", "init-2"],
    );
    let mut st = PodState::default();
    h.syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(
        script(&h.fake),
        [
            "run-sandbox",
            "pull img/init-1:1",
            "create init-1#0",
            "start init-1"
        ],
        "the next one waits for init-1 to succeed"
    );
    assert!(!st.initialized);
    let status = pod_status(&pod, &st, None);
    assert_eq!(status.phase.as_deref(), Some("Pending"));
    let app = api_status(&status, "app");
    assert_eq!(
        app.state
            .as_ref()
            .unwrap()
            .waiting
            .as_ref()
            .unwrap()
            .reason
            .as_deref(),
        Some("PodInitializing")
    );

    h.fake.take_calls();
    h.fake.exit("init-1", 0);
    h.syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(
        script(&h.fake),
        ["pull img/init-2:1", "create init-2#0", "start init-2"]
    );

    // A failed init container is run again (OnFailure, under Always); the regular
    // containers still wait.
    h.fake.take_calls();
    h.fake.exit("init-2", 1);
    h.syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(script(&h.fake), ["create init-2#1", "start init-2"]);
    assert_eq!(st.containers["init-2"].restart_count, 1);

    h.fake.take_calls();
    h.fake.exit("init-2", 0);
    h.syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(
        script(&h.fake),
        [
            "pull img/app:1",
            "create app#0",
            "start app",
            "pull img/web:1",
            "create web#0",
            "start web"
        ]
    );
    assert!(st.initialized);
}

#[tokio::test(start_paused = true)]
async fn a_failed_sandbox_creation_is_retried_on_the_next_sync() {
    let h = harness();
    let pod = pod("uid-s", "Always", &["app"]);
    h.fake
        .fail_next(CallKind::RunPodSandbox, Error::unavailable("no network"));
    let mut st = PodState::default();
    let out = h.syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(
        script(&h.fake),
        ["run-sandbox"],
        "no container without a sandbox"
    );
    assert!(st.sandbox.is_none());
    assert_eq!(out.requeue_after, Some(BACKOFF_INITIAL));
    let status = pod_status(&pod, &st, None);
    assert!(
        status
            .message
            .as_deref()
            .is_some_and(|m| m.contains("failed to create pod sandbox") && m.contains("no network")),
        "{:?}",
        status.message
    );
    let waiting = api_status(&status, "app")
        .state
        .clone()
        .unwrap()
        .waiting
        .unwrap();
    assert_eq!(waiting.reason.as_deref(), Some("ContainerCreating"));

    h.fake.take_calls();
    h.syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(
        script(&h.fake),
        ["run-sandbox", "pull img/app:1", "create app#0", "start app"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_missing_image_leaves_the_container_waiting_in_err_image_pull_then_back_off() {
    let h = harness();
    let pod = pod("uid-m", "Always", &["app"]);
    h.fake.missing_image("img/app:1");
    let mut st = PodState::default();
    let out = h.syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(script(&h.fake), ["run-sandbox", "pull img/app:1"]);
    assert_eq!(
        out.requeue_after,
        Some(BACKOFF_INITIAL / 2),
        "looks again halfway through the pull back-off"
    );
    let waiting = |st: &PodState| {
        let status = pod_status(&pod, st, None);
        let w = api_status(&status, "app")
            .state
            .clone()
            .unwrap()
            .waiting
            .unwrap();
        w.reason.unwrap()
    };
    assert_eq!(waiting(&st), "ErrImagePull");

    h.fake.take_calls();
    h.syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(
        script(&h.fake),
        Vec::<String>::new(),
        "no pull during the back-off"
    );
    assert_eq!(waiting(&st), "ImagePullBackOff");
}

// --- (b) Restarts ---

#[tokio::test(start_paused = true)]
async fn always_restarts_a_container_that_exited_even_successfully() {
    let h = harness();
    let pod = pod("uid-r", "Always", &["app"]);
    let mut st = PodState::default();
    h.syncer.sync_pod(&pod, &mut st).await;
    let first = h.fake.exit("app", 0);
    h.fake.take_calls();
    h.syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(script(&h.fake), ["create app#1", "start app"]);
    let rec = &st.containers["app"];
    assert_eq!(rec.restart_count, 1);
    assert_eq!(rec.current.as_ref().unwrap().state, ContainerState::Running);
    assert_ne!(rec.current.as_ref().unwrap().id, first);
    let last = rec.last_terminated.as_ref().unwrap();
    assert_eq!((last.id.as_str(), last.exit_code), (&*first, 0));
}

#[tokio::test(start_paused = true)]
async fn never_does_not_restart_an_exited_container() {
    let h = harness();
    let pod = pod("uid-n", "Never", &["app", "other"]);
    let mut st = PodState::default();
    h.syncer.sync_pod(&pod, &mut st).await;
    h.fake.exit("app", 1);
    h.fake.take_calls();
    h.syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(script(&h.fake), Vec::<String>::new());
    assert_eq!(state_of(&st, "app"), Some(ContainerState::Exited));
    assert_eq!(st.containers["app"].restart_count, 0);
    assert_eq!(state_of(&st, "other"), Some(ContainerState::Running));
}

#[tokio::test(start_paused = true)]
async fn on_failure_restarts_only_a_container_that_failed() {
    let h = harness();
    let pod = pod("uid-o", "OnFailure", &["bad", "good"]);
    let mut st = PodState::default();
    h.syncer.sync_pod(&pod, &mut st).await;
    h.fake.exit("good", 0);
    h.fake.exit("bad", 2);
    h.fake.take_calls();
    h.syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(script(&h.fake), ["create bad#1", "start bad"]);
    assert_eq!(st.containers["bad"].restart_count, 1);
    assert_eq!(st.containers["good"].restart_count, 0);
    assert_eq!(state_of(&st, "good"), Some(ContainerState::Exited));
}

#[tokio::test(start_paused = true)]
async fn a_second_restart_is_not_immediate_and_shows_crash_loop_back_off() {
    let h = harness();
    let pod = pod("uid-b", "Always", &["app"]);
    let mut st = PodState::default();
    h.syncer.sync_pod(&pod, &mut st).await;
    h.fake.exit("app", 1);
    h.fake.take_calls();
    let out = h.syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(
        script(&h.fake),
        ["create app#1", "start app"],
        "first restart at once"
    );
    assert_eq!(out.requeue_after, None);

    h.fake.exit("app", 1);
    h.fake.take_calls();
    let out = h.syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(
        script(&h.fake),
        Vec::<String>::new(),
        "second restart waits"
    );
    let left = out
        .requeue_after
        .expect("synced again when the back-off ends");
    assert!(
        left > BACKOFF_INITIAL - Duration::from_secs(1) && left <= BACKOFF_INITIAL,
        "{left:?}"
    );
    let waiting = st.containers["app"].waiting.clone().unwrap();
    assert_eq!(waiting.reason, "CrashLoopBackOff");
    assert!(
        waiting.message.contains("container=app"),
        "{}",
        waiting.message
    );
    // Syncing again during the back-off still does not restart it.
    h.syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(script(&h.fake), Vec::<String>::new());

    // (e) The status shows the wait, the restart count and the last exit.
    let status = pod_status(&pod, &st, None);
    assert_eq!(status.phase.as_deref(), Some("Running"));
    let app = api_status(&status, "app");
    assert_eq!(app.restart_count, 1);
    assert_eq!(
        app.state
            .as_ref()
            .unwrap()
            .waiting
            .as_ref()
            .unwrap()
            .reason
            .as_deref(),
        Some("CrashLoopBackOff")
    );
    let last = app
        .last_state
        .as_ref()
        .unwrap()
        .terminated
        .as_ref()
        .unwrap();
    assert_eq!((last.exit_code, last.reason.as_deref()), (1, Some("Error")));
}

#[tokio::test(start_paused = true)]
async fn a_restart_comes_once_the_back_off_has_passed_since_the_exit_and_it_doubles() {
    let h = harness();
    let pod = pod("uid-d", "Always", &["app"]);
    let mut st = PodState::default();
    h.syncer.sync_pod(&pod, &mut st).await;
    let first = h.fake.exit("app", 1);
    h.syncer.sync_pod(&pod, &mut st).await; // restart 1, at once; back-off now 10 s
    let ago = |secs| Timestamp::now() - SignedDuration::from_secs(secs);

    // Exited 11 s ago: the 10 s back-off has passed.
    h.fake.exit_at("app", 1, ago(11));
    h.fake.take_calls();
    h.syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(
        script(&h.fake),
        ["create app#2", "start app"],
        "the worker removes nothing: the first dead instance is container GC's"
    );
    assert!(
        !h.fake
            .calls()
            .contains(&Call::RemoveContainer(first.clone()))
    );
    let last = st.containers["app"].last_terminated.as_ref().unwrap();
    assert_ne!(last.id, first, "the status shows the newer dead instance");

    // Exited 11 s ago again: the back-off doubled to 20 s, 9 s are left.
    h.fake.exit_at("app", 1, ago(11));
    h.fake.take_calls();
    let out = h.syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(script(&h.fake), Vec::<String>::new());
    let left = out.requeue_after.unwrap();
    assert!(
        left > Duration::from_secs(8) && left <= Duration::from_secs(9),
        "{left:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_sandbox_that_died_is_replaced_and_its_containers_started_in_it() {
    let h = harness();
    let pod = pod("uid-x", "Always", &["app"]);
    let mut st = PodState::default();
    h.syncer.sync_pod(&pod, &mut st).await;
    let old = st.sandbox.clone().unwrap().id;
    h.fake.kill_sandbox(&old);
    h.fake.take_calls();
    h.syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(
        script(&h.fake),
        ["remove-sandbox", "run-sandbox", "create app#1", "start app"]
    );
    assert!(
        h.fake
            .calls()
            .contains(&Call::RemovePodSandbox(old.clone()))
    );
    let new = st.sandbox.clone().unwrap();
    assert_ne!(new.id, old);
    assert_eq!(st.sandbox_attempts, 2);
    assert_eq!(h.fake.sandboxes()[0].metadata.attempt, 1);
    assert_eq!(
        st.containers["app"].current.as_ref().unwrap().sandbox_id,
        new.id
    );
}

// --- (c) Killing a pod ---

#[tokio::test(start_paused = true)]
async fn kill_pod_stops_the_containers_then_the_sidecars_in_reverse_then_the_sandbox() {
    let h = harness();
    let mut pod = with_sidecars(pod("uid-k", "Always", &["a", "b"]), &["log", "proxy"]);
    pod.spec.as_mut().unwrap().termination_grace_period_seconds = Some(30);
    let mut st = PodState::default();
    h.syncer.sync_pod(&pod, &mut st).await;
    for name in ["log", "proxy", "a", "b"] {
        assert_eq!(state_of(&st, name), Some(ContainerState::Running), "{name}");
    }
    h.fake.take_calls();
    let grace = Duration::from_secs(5);
    h.syncer.kill_pod(&pod, &mut st, grace).await;
    assert_eq!(
        script(&h.fake),
        [
            "stop a",
            "stop b",
            "stop proxy",
            "stop log",
            "remove-sandbox"
        ]
    );
    // Every stop gets the grace it was given (the clock is paused: none of it passed).
    for c in h.fake.calls() {
        if let Call::StopContainer(_, timeout) = c {
            assert_eq!(timeout, grace);
        }
    }
    assert!(st.sandbox.is_none());
    assert!(h.fake.sandboxes().is_empty() && h.fake.containers().is_empty());
}

// --- (d) Adoption ---

#[tokio::test(start_paused = true)]
async fn a_restarted_node_adopts_the_pods_sandbox_and_containers_instead_of_creating_them() {
    let h = harness();
    let pod = pod("uid-p", "Always", &["a", "b"]);
    let mut st = PodState::default();
    h.syncer.sync_pod(&pod, &mut st).await;
    let a0 = h.fake.exit("a", 1);
    h.syncer.sync_pod(&pod, &mut st).await;
    let a1 = h.fake.container("a").unwrap().id;
    let b = h.fake.container("b").unwrap().id;
    let sandbox = st.sandbox.clone().unwrap().id;

    // The node restarts: a new syncer, and a worker that knows nothing.
    let syncer = syncer_over(&h.fake, h.dir.path());
    let mut st = PodState::default();
    h.fake.take_calls();
    syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(
        script(&h.fake),
        ["resize a", "resize b"],
        "nothing created or removed; adopted containers get their resources once"
    );
    assert!(st.adopted);
    assert_eq!(st.sandbox.as_ref().map(|s| s.id.as_str()), Some(&*sandbox));
    assert_eq!(st.sandbox_attempts, 1);
    let rec = &st.containers["a"];
    assert_eq!(rec.current.as_ref().unwrap().id, a1);
    assert_eq!(rec.restart_count, 1, "from the restart-count annotation");
    let last = rec.last_terminated.as_ref().unwrap();
    assert_eq!((last.id.as_str(), last.exit_code), (&*a0, 1));
    assert_eq!(st.containers["b"].current.as_ref().unwrap().id, b);
    assert_eq!(state_of(&st, "b"), Some(ContainerState::Running));
}

#[tokio::test(start_paused = true)]
async fn adoption_finds_the_pod_by_the_kubelets_labels_and_removes_what_it_no_longer_has() {
    let h = harness();
    let fake = &h.fake;
    let sandbox_config = |uid: &str, attempt| PodSandboxConfig {
        metadata: PodMetadata {
            name: format!("pod-{uid}"),
            namespace: "default".into(),
            uid: uid.into(),
            attempt,
        },
        labels: BTreeMap::from([
            (labels::POD_UID.to_owned(), uid.to_owned()),
            (labels::POD_NAME.to_owned(), format!("pod-{uid}")),
            (labels::POD_NAMESPACE.to_owned(), "default".to_owned()),
        ]),
        log_directory: h.dir.path().join("logs/left-over"),
        ..Default::default()
    };
    let container_config = |uid: &str, name: &str, restarts: u32| ContainerConfig {
        metadata: ContainerMetadata {
            name: name.into(),
            attempt: restarts,
        },
        image: format!("img/{name}:1"),
        labels: BTreeMap::from([
            (labels::POD_UID.to_owned(), uid.to_owned()),
            (labels::CONTAINER_NAME.to_owned(), name.to_owned()),
        ]),
        annotations: BTreeMap::from([(
            labels::CONTAINER_RESTART_COUNT.to_owned(),
            restarts.to_string(),
        )]),
        ..Default::default()
    };
    // What an earlier run left: a dead sandbox, and a newer one running `a` (restarted
    // twice) and `gone`, which the pod no longer has; and another pod's sandbox.
    let dead = fake
        .run_pod_sandbox(&sandbox_config("uid-l", 0))
        .await
        .unwrap();
    fake.kill_sandbox(&dead);
    let sc = sandbox_config("uid-l", 1);
    let live = fake.run_pod_sandbox(&sc).await.unwrap();
    fake.add_image("img/a:1");
    fake.add_image("img/gone:1");
    let mut ids = Vec::new();
    for name in ["a", "gone"] {
        let config = container_config("uid-l", name, 2);
        let id = fake.create_container(&live, &config, &sc).await.unwrap();
        fake.start_container(&id).await.unwrap();
        ids.push(id);
    }
    let other = fake
        .run_pod_sandbox(&sandbox_config("uid-other", 0))
        .await
        .unwrap();
    fake.take_calls();

    let pod = pod("uid-l", "Always", &["a"]);
    let mut st = PodState::default();
    h.syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(
        script(fake),
        ["stop gone", "remove gone", "remove-sandbox", "resize a"]
    );
    assert!(
        fake.calls()
            .contains(&Call::StopContainer(ids[1].clone(), Duration::ZERO))
    );
    assert!(fake.calls().contains(&Call::RemovePodSandbox(dead.clone())));
    assert_eq!(st.sandbox.as_ref().map(|s| s.id.as_str()), Some(&*live));
    assert_eq!(st.sandbox_attempts, 2);
    assert_eq!(st.containers["a"].current.as_ref().unwrap().id, ids[0]);
    assert_eq!(st.containers["a"].restart_count, 2);
    let left: Vec<String> = fake.sandboxes().into_iter().map(|s| s.id).collect();
    assert_eq!(left, [live, other], "another pod's sandbox is left alone");
}

#[tokio::test(start_paused = true)]
async fn killing_a_pod_this_node_never_synced_stops_what_the_runtime_runs_for_it() {
    let h = harness();
    let pod = pod("uid-q", "Always", &["app"]);
    h.syncer.sync_pod(&pod, &mut PodState::default()).await;
    h.fake.take_calls();
    // After a restart, the pod is deleted before its worker ever synced it.
    let syncer = syncer_over(&h.fake, h.dir.path());
    let mut st = PodState::default();
    syncer.kill_pod(&pod, &mut st, Duration::from_secs(3)).await;
    assert_eq!(script(&h.fake), ["stop app", "remove-sandbox"]);
    assert!(h.fake.sandboxes().is_empty() && h.fake.containers().is_empty());
}

// --- (e) Exit codes in the status ---

#[tokio::test(start_paused = true)]
async fn exit_codes_and_reasons_reach_the_pod_status() {
    let h = harness();
    let pod = pod("uid-e", "Never", &["bad", "ok"]);
    let mut st = PodState::default();
    h.syncer.sync_pod(&pod, &mut st).await;
    let ok = h.fake.exit("ok", 0);
    h.fake.exit("bad", 3);
    h.fake.take_calls();
    h.syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(
        script(&h.fake),
        ["stop-sandbox"],
        "a finished pod releases its sandbox"
    );
    assert!(!st.sandbox.as_ref().unwrap().ready);
    let status = pod_status(&pod, &st, None);
    assert_eq!(status.phase.as_deref(), Some("Failed"));
    let terminated = |name| {
        api_status(&status, name)
            .state
            .clone()
            .unwrap()
            .terminated
            .unwrap()
    };
    let t = terminated("ok");
    assert_eq!((t.exit_code, t.reason.as_deref()), (0, Some("Completed")));
    assert_eq!(t.container_id, Some(format!("fake://{ok}")));
    let t = terminated("bad");
    assert_eq!((t.exit_code, t.reason.as_deref()), (3, Some("Error")));
}

#[tokio::test(start_paused = true)]
async fn a_pod_whose_containers_all_succeed_is_succeeded() {
    let h = harness();
    let pod = pod("uid-j", "OnFailure", &["job"]);
    h.fake.exit_on_start("job", 0);
    let mut st = PodState::default();
    h.syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(
        pod_status(&pod, &st, None).phase.as_deref(),
        Some("Succeeded")
    );
    h.fake.take_calls();
    h.syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(script(&h.fake), ["stop-sandbox"], "and it is not run again");
}

#[tokio::test(start_paused = true)]
async fn a_deleted_pods_final_status_carries_the_exit_codes_of_its_stop() {
    for (code, phase) in [(0, "Succeeded"), (143, "Failed")] {
        let h = harness();
        let pod = pod("uid-f", "Always", &["app"]);
        h.fake.set_stop_exit_code(code);
        let mut st = PodState::default();
        h.syncer.sync_pod(&pod, &mut st).await;
        h.syncer
            .kill_pod(&pod, &mut st, Duration::from_secs(1))
            .await;
        let status = terminal(pod_status(&pod, &st, None));
        assert_eq!(status.phase.as_deref(), Some(phase), "exit {code}");
        let t = api_status(&status, "app")
            .state
            .clone()
            .unwrap()
            .terminated
            .unwrap();
        assert_eq!(t.exit_code, code);
    }
}

/// Disk-pressure reclaim removes every dead container of a finished pod (the kubelet's
/// `DeleteAllUnusedContainers`): a sync after that starts nothing again, and the pod's
/// containers keep their last state.
#[tokio::test(start_paused = true)]
async fn a_finished_pod_whose_dead_containers_were_removed_starts_nothing() {
    let h = harness();
    let pod = pod("uid-f", "Never", &["app"]);
    let mut st = PodState::default();
    h.syncer.sync_pod(&pod, &mut st).await;
    let id = h.fake.exit("app", 0);
    h.syncer.sync_pod(&pod, &mut st).await;
    h.fake.remove_container(&id).await.unwrap();
    h.fake.take_calls();
    h.syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(script(&h.fake), Vec::<String>::new());
    assert_eq!(state_of(&st, "app"), Some(ContainerState::Exited));
    let status = pod_status(&pod, &st, None);
    assert_eq!(status.phase.as_deref(), Some("Succeeded"));
}

/// containerd's error when a container's name is held by another instance.
fn name_reserved(holder: &str) -> Error {
    reserved("container", "app_pod-uid-r_default_uid-r_0", holder)
}

/// containerd's error when pod `uid-r`'s sandbox name is held by another sandbox.
fn sandbox_name_reserved(holder: &str) -> Error {
    reserved("sandbox", "pod-uid-r_default_uid-r_0", holder)
}

fn reserved(kind: &str, name: &str, holder: &str) -> Error {
    Error::internal(format!(
        "failed to reserve {kind} name \"{name}\": name \"{name}\" is reserved for \"{holder}\""
    ))
}

/// A sandbox of pod `uid-r` made behind the node's back (what the runtime did with
/// a call whose reply the node lost).
async fn stray_sandbox(fake: &FakeRuntime) -> String {
    fake.run_pod_sandbox(&PodSandboxConfig {
        metadata: PodMetadata {
            name: "pod-uid-r".into(),
            namespace: "default".into(),
            uid: "uid-r".into(),
            attempt: 0,
        },
        ..Default::default()
    })
    .await
    .unwrap()
}

/// A create the runtime carried out after the node lost its reply (containerd
/// restarted under the call) leaves an instance the node never heard of holding the
/// container's name: the next sync's create fails on the name, the node removes that
/// never-started instance and creates again at once.
#[tokio::test(start_paused = true)]
async fn a_name_held_by_a_create_whose_reply_was_lost_is_freed_and_the_create_retried() {
    let h = harness();
    let pod = pod("uid-r", "Always", &["app"]);
    h.fake.add_image("img/app:1");
    h.fake.fail_next(
        CallKind::CreateContainer,
        Error::unavailable("operation was canceled: connection closed"),
    );
    let mut st = PodState::default();
    h.syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(script(&h.fake), ["run-sandbox", "create app#0"]);
    // What the runtime did with the call anyway.
    let sandbox = h.fake.sandboxes()[0].id.clone();
    let holder = h
        .fake
        .create_container(
            &sandbox,
            &ContainerConfig {
                metadata: ContainerMetadata {
                    name: "app".into(),
                    attempt: 0,
                },
                image: "img/app:1".into(),
                labels: BTreeMap::from([(labels::POD_UID.to_owned(), "uid-r".to_owned())]),
                ..Default::default()
            },
            &PodSandboxConfig::default(),
        )
        .await
        .unwrap();
    h.fake.take_calls();
    h.fake
        .fail_next(CallKind::CreateContainer, name_reserved(&holder));
    h.syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(
        script(&h.fake),
        ["create app#0", "remove app", "create app#0", "start app"]
    );
    assert!(
        h.fake.container(&holder).is_none(),
        "the stray instance is gone"
    );
    assert_eq!(state_of(&st, "app"), Some(ContainerState::Running));
}

/// A holder the runtime cannot show (its create is still under way) is left alone:
/// the container waits in CreateContainerError and the next sync creates it.
#[tokio::test(start_paused = true)]
async fn a_name_held_by_a_create_still_under_way_waits_for_the_next_sync() {
    let h = harness();
    let pod = pod("uid-r", "Always", &["app"]);
    h.fake.add_image("img/app:1");
    h.fake
        .fail_next(CallKind::CreateContainer, name_reserved("in-flight"));
    let mut st = PodState::default();
    h.syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(script(&h.fake), ["run-sandbox", "create app#0"]);
    let waiting = api_status(&pod_status(&pod, &st, None), "app")
        .state
        .clone()
        .unwrap()
        .waiting
        .unwrap();
    assert_eq!(waiting.reason.as_deref(), Some("CreateContainerError"));
    assert!(
        waiting
            .message
            .as_deref()
            .is_some_and(|m| m.contains("is reserved for")),
        "{waiting:?}"
    );

    h.fake.take_calls();
    h.syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(script(&h.fake), ["create app#0", "start app"]);
}

/// The same for a pod sandbox: a RunPodSandbox the runtime carried out after the node
/// lost its reply holds the sandbox name; the node stops and removes that sandbox and
/// creates the pod's again.
#[tokio::test(start_paused = true)]
async fn a_sandbox_name_held_by_a_create_whose_reply_was_lost_is_freed_and_the_create_retried() {
    let h = harness();
    let pod = pod("uid-r", "Always", &["app"]);
    h.fake.add_image("img/app:1");
    h.fake.fail_next(
        CallKind::RunPodSandbox,
        Error::unavailable("operation was canceled: connection closed"),
    );
    let mut st = PodState::default();
    h.syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(script(&h.fake), ["run-sandbox"]);
    // What the runtime did with the call anyway.
    let holder = stray_sandbox(&h.fake).await;
    h.fake.take_calls();
    h.fake
        .fail_next(CallKind::RunPodSandbox, sandbox_name_reserved(&holder));
    h.syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(
        script(&h.fake),
        [
            "run-sandbox",
            "stop-sandbox",
            "remove-sandbox",
            "run-sandbox",
            "create app#0",
            "start app"
        ]
    );
    assert!(
        h.fake.sandboxes().iter().all(|s| s.id != holder),
        "the stray sandbox is gone"
    );
    assert_eq!(state_of(&st, "app"), Some(ContainerState::Running));
}

/// A stray sandbox the runtime cannot stop (its network cannot be torn down) keeps
/// the name: the node creates the next attempt, as the kubelet does.
#[tokio::test(start_paused = true)]
async fn a_sandbox_name_held_by_a_sandbox_that_cannot_stop_moves_to_the_next_attempt() {
    let h = harness();
    let pod = pod("uid-r", "Always", &["app"]);
    h.fake.add_image("img/app:1");
    let holder = stray_sandbox(&h.fake).await;
    h.fake.take_calls();
    h.fake
        .fail_next(CallKind::RunPodSandbox, sandbox_name_reserved(&holder));
    h.fake.fail_next(
        CallKind::StopPodSandbox,
        Error::internal("failed to destroy network for sandbox: decoding version"),
    );
    let mut st = PodState::default();
    h.syncer.sync_pod(&pod, &mut st).await;
    assert_eq!(
        script(&h.fake),
        [
            "run-sandbox",
            "stop-sandbox",
            "run-sandbox",
            "create app#0",
            "start app"
        ]
    );
    let created = h
        .fake
        .sandboxes()
        .into_iter()
        .find(|s| s.id != holder)
        .expect("a new sandbox");
    assert_eq!(created.metadata.attempt, 1);
    assert_eq!(st.sandbox_attempts, 2);
    assert_eq!(state_of(&st, "app"), Some(ContainerState::Running));
}
