//! The manager over the fake runtime and a temporary log directory. The fake writes
//! no logs: a test writes the container's log itself, as its output.

use std::collections::BTreeMap;
use std::io::Read;
use std::sync::atomic::{AtomicI64, Ordering};

use wasmlet_runtime::{ContainerConfig, ContainerMetadata, PodSandboxConfig};
use wasmlet_testkit::fake_runtime::{Call, CallKind, FakeRuntime};

use super::*;

struct Setup {
    _dir: tempfile::TempDir,
    fake: Arc<FakeRuntime>,
    manager: ContainerLogManager,
    sandbox_id: String,
    sandbox: PodSandboxConfig,
    id: String,
    log: PathBuf,
}

/// One running container `app` whose log is `<dir>/default_web_uid/app/0.log`, and a
/// manager whose clock starts at 2024-01-02T03:04:05Z and ticks a second a call.
async fn setup(max_size: u64, max_files: usize, max_workers: usize) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeRuntime::new());
    let mut sandbox = PodSandboxConfig::default();
    sandbox.metadata.name = "web".into();
    sandbox.metadata.namespace = "default".into();
    sandbox.metadata.uid = "uid".into();
    sandbox.log_directory = dir.path().join("default_web_uid");
    let sandbox_id = fake.run_pod_sandbox(&sandbox).await.unwrap();
    fake.pull_image("img:1", None).await.unwrap();
    let id = start(&fake, &sandbox_id, &sandbox, "app").await;
    let log = sandbox.log_directory.join("app/0.log");
    let router = RuntimeRouter::new(
        BTreeMap::new(),
        BTreeMap::from([(String::new(), fake.clone().into_dyn())]),
        "",
    );
    let settings = ContainerLogSettings {
        max_size: Some(max_size),
        max_files,
        monitor_interval: Duration::from_secs(10),
        max_workers,
    };
    let calls = Arc::new(AtomicI64::new(0));
    let manager = ContainerLogManager::new(router, &settings)
        .unwrap()
        .with_clock(move || {
            Timestamp::from_second(1_704_164_645 + calls.fetch_add(1, Ordering::Relaxed)).unwrap()
        });
    fake.take_calls();
    Setup {
        _dir: dir,
        fake,
        manager,
        sandbox_id,
        sandbox,
        id,
        log,
    }
}

/// Starts a container `name` and makes its log directory.
async fn start(
    fake: &FakeRuntime,
    sandbox_id: &str,
    sandbox: &PodSandboxConfig,
    name: &str,
) -> String {
    let config = ContainerConfig {
        metadata: ContainerMetadata {
            name: name.into(),
            attempt: 0,
        },
        image: "img:1".into(),
        log_path: PathBuf::from(name).join("0.log"),
        ..Default::default()
    };
    let id = fake
        .create_container(sandbox_id, &config, sandbox)
        .await
        .unwrap();
    fake.start_container(&id).await.unwrap();
    std::fs::create_dir_all(sandbox.log_directory.join(name)).unwrap();
    id
}

fn reopens(fake: &FakeRuntime) -> usize {
    fake.calls()
        .iter()
        .filter(|c| c.kind() == CallKind::ReopenContainerLog)
        .count()
}

/// The names of the log's rotated files, oldest first.
fn rotated(log: &Path) -> Vec<String> {
    rotated_files(log)
        .unwrap()
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect()
}

fn gunzip(path: &Path) -> String {
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    text
}

#[tokio::test]
async fn a_log_is_rotated_once_it_reaches_the_size_and_not_before() {
    let s = setup(100, 5, 1).await;
    std::fs::write(&s.log, "x".repeat(99)).unwrap();
    let kept = s.manager.rotate_container(&*s.fake, &s.id).await.unwrap();
    assert_eq!(kept, Outcome::Kept);
    assert_eq!(reopens(&s.fake), 0);
    assert!(rotated(&s.log).is_empty());

    std::fs::write(&s.log, "x".repeat(100)).unwrap();
    let outcome = s.manager.rotate_container(&*s.fake, &s.id).await.unwrap();
    let to = s.log.with_file_name("0.log.20240102-030405");
    assert_eq!(outcome, Outcome::Rotated(to.clone()));
    assert_eq!(std::fs::read_to_string(&to).unwrap(), "x".repeat(100));
    assert!(!s.log.exists(), "the runtime makes the new log");
    assert_eq!(
        s.fake
            .calls()
            .into_iter()
            .filter(|c| !c.is_read())
            .collect::<Vec<_>>(),
        [Call::ReopenContainerLog(s.id.clone())]
    );
}

#[tokio::test]
async fn at_most_max_files_are_kept_and_older_rotated_files_are_compressed() {
    let s = setup(64, 3, 1).await;
    let round = |i: usize| format!("round {i}\n").repeat(10);
    for i in 0..5 {
        std::fs::write(&s.log, round(i)).unwrap();
        s.manager.rotate_logs().await;
        let names = rotated(&s.log);
        assert!(names.len() <= 2, "round {i}: {names:?}");
        let (newest, older) = names.split_last().unwrap();
        assert!(
            !newest.ends_with(".gz"),
            "the newest stays plain: {names:?}"
        );
        assert!(
            older.iter().all(|n| n.ends_with(".gz")),
            "the older ones are compressed: {names:?}"
        );
    }
    std::fs::write(&s.log, round(5)).unwrap();
    let dir = s.log.parent().unwrap();
    let mut all: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    all.sort();
    assert_eq!(
        all,
        ["0.log", "0.log.20240102-030408.gz", "0.log.20240102-030409"],
        "maxFiles in all, the current log counted"
    );
    assert_eq!(gunzip(&dir.join("0.log.20240102-030408.gz")), round(3));
    assert_eq!(
        std::fs::read_to_string(dir.join("0.log.20240102-030409")).unwrap(),
        round(4)
    );
    assert_eq!(reopens(&s.fake), 5);
}

#[tokio::test]
async fn a_failed_reopen_renames_the_log_back_for_the_next_tick() {
    let s = setup(10, 5, 1).await;
    std::fs::write(&s.log, "0123456789").unwrap();
    s.fake.fail_next(
        CallKind::ReopenContainerLog,
        wasmlet_runtime::Error::unavailable("down"),
    );
    let err = s
        .manager
        .rotate_container(&*s.fake, &s.id)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Runtime { .. }), "{err}");
    assert_eq!(std::fs::read_to_string(&s.log).unwrap(), "0123456789");
    assert!(rotated(&s.log).is_empty(), "{:?}", rotated(&s.log));

    let outcome = s.manager.rotate_container(&*s.fake, &s.id).await.unwrap();
    assert!(matches!(outcome, Outcome::Rotated(_)), "{outcome:?}");
    assert!(!s.log.exists());
    assert_eq!(reopens(&s.fake), 2);
}

#[tokio::test]
async fn a_missing_log_is_reopened_first() {
    let s = setup(10, 5, 1).await;
    // The fake makes no file: the reopened log is still missing, which is an error.
    let err = s
        .manager
        .rotate_container(&*s.fake, &s.id)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
    assert_eq!(reopens(&s.fake), 1);
}

#[tokio::test]
async fn only_running_containers_are_looked_at_and_one_failure_stops_no_other() {
    let s = setup(10, 5, 1).await;
    start(&s.fake, &s.sandbox_id, &s.sandbox, "side").await;
    let other_log = s.sandbox.log_directory.join("side/0.log");
    std::fs::write(&s.log, "0123456789").unwrap();
    std::fs::write(&other_log, "0123456789").unwrap();
    s.fake.exit(&s.id, 0);
    s.fake.take_calls();
    s.manager.rotate_logs().await;
    assert!(s.log.exists(), "an exited container's log stays");
    assert!(
        !s.fake
            .calls()
            .contains(&Call::ContainerStatus(s.id.clone()))
    );
    assert_eq!(rotated(&other_log).len(), 1);

    // A reopen that fails is logged; the other containers still rotate.
    let third = start(&s.fake, &s.sandbox_id, &s.sandbox, "third").await;
    let third_log = s.sandbox.log_directory.join("third/0.log");
    std::fs::write(&other_log, "0123456789").unwrap();
    std::fs::write(&third_log, "0123456789").unwrap();
    s.fake.fail_next(
        CallKind::ReopenContainerLog,
        wasmlet_runtime::Error::unavailable("down"),
    );
    s.manager.rotate_logs().await;
    let rotations = rotated(&other_log).len() + rotated(&third_log).len();
    assert_eq!(
        rotations, 2,
        "one of two rotated again, the other for the first time"
    );
    assert!(s.fake.container(&third).is_some());
}

#[tokio::test]
async fn rotations_run_up_to_max_workers_at_once() {
    let s = setup(10, 5, 2).await;
    start(&s.fake, &s.sandbox_id, &s.sandbox, "side").await;
    std::fs::write(&s.log, "0123456789").unwrap();
    std::fs::write(s.sandbox.log_directory.join("side/0.log"), "0123456789").unwrap();
    s.fake.hold(CallKind::ReopenContainerLog);
    let fake = s.fake.clone();
    let manager = Arc::new(s.manager);
    let pass = tokio::spawn({
        let manager = manager.clone();
        async move { manager.rotate_logs().await }
    });
    tokio::time::timeout(
        Duration::from_secs(10),
        fake.wait_for(|calls| {
            calls
                .iter()
                .filter(|c| c.kind() == CallKind::ReopenContainerLog)
                .count()
                == 2
        }),
    )
    .await
    .expect("both reopens in flight together");
    fake.release(CallKind::ReopenContainerLog);
    tokio::time::timeout(Duration::from_secs(10), pass)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_loop_looks_at_each_tick_and_is_idle_between() {
    let s = setup(1 << 20, 5, 1).await;
    std::fs::write(&s.log, "small").unwrap();
    let fake = s.fake.clone();
    let cancel = CancellationToken::new();
    let run = tokio::spawn(s.manager.run(cancel.clone()));
    let lists = || {
        fake.calls()
            .iter()
            .filter(|c| c.kind() == CallKind::ListContainers)
            .count()
    };
    tokio::time::sleep(Duration::from_millis(9_990)).await;
    assert_eq!(lists(), 1, "the first pass at once, then nothing");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(lists(), 2, "the next at the interval");
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(lists(), 5);
    assert_eq!(reopens(&fake), 0, "a small log is left alone");
    cancel.cancel();
    run.await.unwrap();
}

#[test]
fn a_negative_size_turns_rotation_off() {
    let router = RuntimeRouter::new(BTreeMap::new(), BTreeMap::new(), "");
    let settings = ContainerLogSettings {
        max_size: None,
        max_files: 5,
        monitor_interval: Duration::from_secs(10),
        max_workers: 1,
    };
    assert!(ContainerLogManager::new(router, &settings).is_none());
}
