//! `CriRuntime` against the fake CRI server.

use std::time::Duration;

use wasmlet_proto::cri::v1 as cri;
use wasmlet_runtime::{
    ContainerConfig, ContainerMetadata, ContainerResources, ContainerState, Error, Mount,
    PodMetadata, PodSandboxConfig, Runtime, SandboxState,
};
use wasmlet_runtime_cri::{CriConfig, CriRuntime};

use crate::fake::Fake;
use crate::{config, setup, socket_dir};

fn pod() -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: PodMetadata {
            name: "web".into(),
            namespace: "default".into(),
            uid: "uid-1".into(),
            attempt: 0,
        },
        hostname: "web".into(),
        log_directory: "/var/log/pods/default_web_uid-1".into(),
        labels: [("io.kubernetes.pod.uid".to_owned(), "uid-1".to_owned())].into(),
        annotations: Default::default(),
        runtime_handler: String::new(),
        cgroup_parent: Some("/kubepods/besteffort/poduid-1".into()),
        host_network: false,
        ..Default::default()
    }
}

fn container() -> ContainerConfig {
    ContainerConfig {
        metadata: ContainerMetadata {
            name: "app".into(),
            attempt: 0,
        },
        image: "registry.local/busybox:1".into(),
        command: vec!["sleep".into()],
        args: vec!["3600".into()],
        env: vec![("GREETING".into(), "hi".into())],
        mounts: vec![Mount {
            container_path: "/data".into(),
            host_path: "/tmp/data".into(),
            readonly: false,
        }],
        log_path: "app/0.log".into(),
        resources: ContainerResources {
            cpu_shares: Some(256),
            cpu_quota: Some(20_000),
            cpu_period: Some(100_000),
            memory_limit_bytes: Some(64 << 20),
            oom_score_adj: Some(1000),
            cpuset_cpus: None,
        },
        ..Default::default()
    }
}

/// The `grpc-timeout` header of the last call of `method`, as a duration.
fn sent_timeout(fake: &Fake, method: &str) -> Option<Duration> {
    let state = fake.state();
    let (_, header) = state.calls.iter().rev().find(|(m, _)| m == method)?;
    let header = header.as_deref()?;
    let (value, unit) = header.split_at(header.len() - 1);
    let value: u64 = value.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(value * 3600),
        "M" => Duration::from_secs(value * 60),
        "S" => Duration::from_secs(value),
        "m" => Duration::from_millis(value),
        "u" => Duration::from_micros(value),
        "n" => Duration::from_nanos(value),
        _ => return None,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connects_lazily_and_recovers_when_the_socket_appears() {
    let (_dir, path) = socket_dir();
    // Nothing listens yet: construction must still succeed.
    let runtime = CriRuntime::connect(config(&path)).expect("a dead runtime does not fail connect");

    let err = runtime.version().await.unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    let err = runtime.list_containers().await.unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    let err = runtime
        .pull_image("registry.local/x:1", None)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Unavailable { .. }),
        "a dead runtime is not an image pull error: {err:?}"
    );

    let fake = Fake::default();
    let server = fake.serve(&path);
    let version = runtime
        .version()
        .await
        .expect("calls work once the runtime is up");
    assert_eq!(version.runtime_name, "fake");
    assert_eq!(version.runtime_version, "1.0.0");
    assert_eq!(version.runtime_api_version, "v1");

    // The runtime restarts: calls fail while it is gone and work again after.
    server.stop().await;
    let err = runtime.list_pod_sandboxes().await.unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    let server = fake.serve(&path);
    let sandboxes = match runtime.list_pod_sandboxes().await {
        Ok(sandboxes) => sandboxes,
        // The first call may still meet the connection the old server closed (tonic
        // reports it as Cancelled, which is Unavailable here); the channel connects
        // again for the next one.
        Err(Error::Unavailable { .. }) => runtime
            .list_pod_sandboxes()
            .await
            .expect("the call after the channel reconnected works"),
        Err(e) => panic!("{e:?}"),
    };
    assert!(sandboxes.is_empty());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unavailable_names_the_missing_socket() {
    let (_dir, path) = socket_dir();
    let runtime = CriRuntime::connect(config(&path)).unwrap();
    let err = runtime.status().await.unwrap_err();
    let Error::Unavailable { message, source } = &err else {
        panic!("{err:?}")
    };
    assert!(message.contains("Status"), "{message}");
    assert!(
        message.contains("No such file or directory"),
        "the cause is kept: {message}"
    );
    assert!(
        message.contains(&path.display().to_string()),
        "the socket is named: {message}"
    );
    // The cause itself is kept too: the client's Status, and below it the io::Error.
    let status = source
        .as_deref()
        .and_then(|s| s.downcast_ref::<tonic::Status>())
        .unwrap_or_else(|| panic!("the Status is the source: {err:?}"));
    assert_eq!(status.code(), tonic::Code::Unavailable);
    let mut cause = std::error::Error::source(&err);
    let mut kind = None;
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            kind = Some(io.kind());
        }
        cause = e.source();
    }
    assert_eq!(kind, Some(std::io::ErrorKind::NotFound), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_endpoints_are_refused() {
    let err = CriRuntime::connect(CriConfig {
        runtime_endpoint: "tcp://127.0.0.1:10010".into(),
        ..CriConfig::default()
    })
    .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_negotiation_failures_are_explained() {
    let s = setup(Fake::with(|s| s.api_version = "v1alpha2".into()));
    let err = s.runtime.version().await.unwrap_err();
    let Error::FailedPrecondition(message) = &err else {
        panic!("{err:?}")
    };
    assert!(message.contains("\"v1alpha2\""), "{message}");
    assert!(message.contains("needs \"v1\""), "{message}");
    assert!(message.contains("fake 1.0.0"), "{message}");
    let sent = s.fake.state().last_version.clone().unwrap();
    assert_eq!(sent.version, "v1", "the request names the version we speak");
    s.server.stop().await;

    let s = setup(Fake::with(|s| s.version_unimplemented = true));
    let err = s.runtime.version().await.unwrap_err();
    let Error::FailedPrecondition(message) = &err else {
        panic!("{err:?}")
    };
    assert!(message.contains("does not implement CRI v1"), "{message}");
    s.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_and_remove_of_missing_objects_succeed() {
    for not_found in [true, false] {
        let s = setup(Fake::with(|s| s.missing_is_not_found = not_found));
        let r = &s.runtime;
        r.stop_container("gone", Duration::from_secs(1))
            .await
            .unwrap();
        r.remove_container("gone").await.unwrap();
        r.stop_pod_sandbox("gone").await.unwrap();
        r.remove_pod_sandbox("gone").await.unwrap();
        r.remove_image("registry.local/gone:1").await.unwrap();

        // Status of a missing object is still NotFound, naming it.
        let err = r.container_status("gone").await.unwrap_err();
        assert!(
            matches!(&err, Error::NotFound { kind: "container", id } if id == "gone"),
            "{err:?}"
        );
        let err = r.pod_sandbox_status("gone").await.unwrap_err();
        assert!(
            matches!(&err, Error::NotFound { kind: "sandbox", id } if id == "gone"),
            "{err:?}"
        );
        let err = r.start_container("gone").await.unwrap_err();
        assert!(err.is_not_found(), "{err:?}");
        s.server.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_runs_through_the_seam() {
    let s = setup(Fake::default());
    let r = &s.runtime;

    let sandbox_id = r.run_pod_sandbox(&pod()).await.unwrap();
    let run = s.fake.state().last_run.clone().unwrap();
    assert_eq!(
        run.runtime_handler, "runc",
        "the configured handler by default"
    );
    let sent = run.config.unwrap();
    assert_eq!(sent.metadata.as_ref().unwrap().uid, "uid-1");
    assert_eq!(sent.log_directory, "/var/log/pods/default_web_uid-1");
    let linux = sent.linux.unwrap();
    assert_eq!(linux.cgroup_parent, "/kubepods/besteffort/poduid-1");
    let ns = linux.security_context.unwrap().namespace_options.unwrap();
    assert_eq!(ns.network(), cri::NamespaceMode::Pod);
    assert_eq!(ns.pid(), cri::NamespaceMode::Container);
    assert_eq!(ns.ipc(), cri::NamespaceMode::Pod);
    let twice = r.inner_timeout() * 2;
    assert_eq!(sent_timeout(&s.fake, "RunPodSandbox"), Some(twice));

    let status = r.pod_sandbox_status(&sandbox_id).await.unwrap();
    assert_eq!(status.state, SandboxState::Ready);
    assert_eq!(status.ip.as_deref(), Some("10.88.0.2"));
    assert_eq!(status.metadata.uid, "uid-1");
    assert_eq!(status.runtime_handler, "runc");
    let listed = r.list_pod_sandboxes().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, sandbox_id);

    let id = r
        .create_container(&sandbox_id, &container(), &pod())
        .await
        .unwrap();
    let create = s.fake.state().last_create.clone().unwrap();
    assert_eq!(create.pod_sandbox_id, sandbox_id);
    assert!(create.sandbox_config.is_some());
    let c = create.config.unwrap();
    assert_eq!(c.command, ["sleep"]);
    assert_eq!(c.args, ["3600"]);
    assert_eq!(c.envs[0].key, "GREETING");
    assert_eq!(c.mounts[0].host_path, "/tmp/data");
    let res = c.linux.unwrap().resources.unwrap();
    assert_eq!(
        (
            res.cpu_shares,
            res.cpu_quota,
            res.cpu_period,
            res.memory_limit_in_bytes,
            res.oom_score_adj
        ),
        (256, 20_000, 100_000, 64 << 20, 1000)
    );

    r.start_container(&id).await.unwrap();
    let status = r.container_status(&id).await.unwrap();
    assert_eq!(status.state, ContainerState::Running);
    assert_eq!(
        status.sandbox_id, sandbox_id,
        "found through ListContainers"
    );
    assert_eq!(status.image, "registry.local/busybox:1");
    assert_eq!(status.image_ref, "sha256:feedface");
    assert!(status.started_at.is_some());
    assert_eq!(status.finished_at, None);
    assert_eq!(
        status.log_path,
        std::path::PathBuf::from("/var/log/pods/default_web_uid-1/app/0.log")
    );

    // A sub-second grace period is rounded up, and the call may last that much longer.
    r.stop_container(&id, Duration::from_millis(1500))
        .await
        .unwrap();
    assert_eq!(s.fake.state().last_stop.as_ref().unwrap().timeout, 2);
    assert_eq!(
        sent_timeout(&s.fake, "StopContainer"),
        Some(r.inner_timeout() + Duration::from_millis(1500))
    );
    let status = r.container_status(&id).await.unwrap();
    assert_eq!(status.state, ContainerState::Exited);
    assert_eq!(status.exit_code, 137);
    assert_eq!(status.reason, "Error");
    assert!(status.finished_at.is_some());

    let exec = r
        .exec_sync(
            &id,
            &["echo".into(), "ok".into()],
            Duration::from_millis(10),
        )
        .await
        .unwrap();
    assert_eq!(exec.stdout, b"echo ok");
    assert_eq!(exec.stderr, b"warning\n");
    assert_eq!(exec.exit_code, 7);
    assert_eq!(s.fake.state().last_exec.as_ref().unwrap().timeout, 1);

    let listed = r.list_containers().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].sandbox_id, sandbox_id);
    assert_eq!(listed[0].state, ContainerState::Exited);

    r.remove_container(&id).await.unwrap();
    r.stop_pod_sandbox(&sandbox_id).await.unwrap();
    assert_eq!(
        r.pod_sandbox_status(&sandbox_id).await.unwrap().state,
        SandboxState::NotReady
    );
    r.remove_pod_sandbox(&sandbox_id).await.unwrap();
    assert!(r.list_containers().await.unwrap().is_empty());
    assert!(r.list_pod_sandboxes().await.unwrap().is_empty());
    s.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_may_name_its_own_handler() {
    let s = setup(Fake::default());
    let mut p = pod();
    p.runtime_handler = "kata".into();
    p.host_network = true;
    s.runtime.run_pod_sandbox(&p).await.unwrap();
    let run = s.fake.state().last_run.clone().unwrap();
    assert_eq!(run.runtime_handler, "kata");
    let ns = run
        .config
        .unwrap()
        .linux
        .unwrap()
        .security_context
        .unwrap()
        .namespace_options
        .unwrap();
    assert_eq!(ns.network(), cri::NamespaceMode::Node);
    s.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_runtime_times_out() {
    let fake = Fake::with(|s| s.start_delay = Duration::from_secs(5));
    let (_dir, path) = socket_dir();
    let server = fake.serve(&path);
    let runtime = CriRuntime::connect(CriConfig {
        request_timeout: Duration::from_millis(300),
        ..config(&path)
    })
    .unwrap();
    let started = std::time::Instant::now();
    let err = runtime.start_container("c").await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Timeout {
                operation: "StartContainer",
                after
            } if after == Duration::from_millis(300)
        ),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(4));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images() {
    let s = setup(Fake::default());
    let r = &s.runtime;
    assert_eq!(
        r.image_status("registry.local/busybox:1").await.unwrap(),
        None
    );

    let err = r
        .pull_image("docker.io/library/nope:1", None)
        .await
        .unwrap_err();
    let Error::ImagePull { image, message, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(image, "docker.io/library/nope:1");
    assert!(message.contains("pull access denied"), "{message}");
    assert_eq!(
        sent_timeout(&s.fake, "PullImage"),
        None,
        "pulls have no deadline"
    );

    let auth = wasmlet_runtime::AuthConfig {
        username: "puller".into(),
        password: "s3cret".into(),
        server_address: "registry.local".into(),
        ..Default::default()
    };
    let id = r
        .pull_image("registry.local/busybox:1", Some(&auth))
        .await
        .unwrap();
    assert_eq!(id, "sha256:0123456789abcdef");
    let sent = s.fake.state().last_pull.clone().unwrap().auth.unwrap();
    assert_eq!(
        (
            sent.username.as_str(),
            sent.password.as_str(),
            sent.server_address.as_str()
        ),
        ("puller", "s3cret", "registry.local"),
        "the credentials reach the runtime as CRI's AuthConfig"
    );
    let image = r
        .image_status("registry.local/busybox:1")
        .await
        .unwrap()
        .expect("pulled");
    assert_eq!(image.id, id);
    assert_eq!(image.repo_tags, ["registry.local/busybox:1"]);
    assert_eq!((image.uid, image.username.as_str()), (Some(65534), ""));
    assert_eq!(image.size, 4096);
    assert_eq!(r.list_images().await.unwrap(), [image]);

    r.remove_image("registry.local/busybox:1").await.unwrap();
    r.remove_image("registry.local/busybox:1").await.unwrap();
    assert!(r.list_images().await.unwrap().is_empty());

    let fs = r.image_fs_info().await.unwrap();
    assert_eq!(fs.len(), 1);
    assert_eq!(
        fs[0].mountpoint,
        std::path::Path::new("/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs")
    );
    assert_eq!(
        (fs[0].used_bytes, fs[0].inodes_used),
        (Some(4096), Some(12))
    );
    assert_eq!(fs[0].timestamp.as_second(), 1_700_000_000);
    s.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_comes_from_the_conditions() {
    let s = setup(Fake::with(|s| s.network_ready = false));
    let status = s.runtime.status().await.unwrap();
    assert!(status.runtime_ready);
    assert!(!status.network_ready);
    assert!(
        status.message.contains("NetworkPluginNotReady"),
        "{status:?}"
    );
    s.fake.state().network_ready = true;
    let status = s.runtime.status().await.unwrap();
    assert!(status.runtime_ready && status.network_ready);
    assert_eq!(status.message, "");
    s.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_separate_image_endpoint_is_used_for_images() {
    let runtime_side = Fake::default();
    let image_side = Fake::default();
    let (_dir, path) = socket_dir();
    let image_path = path.with_file_name("images.sock");
    let a = runtime_side.serve(&path);
    let b = image_side.serve(&image_path);
    let runtime = CriRuntime::connect(CriConfig {
        image_endpoint: Some(image_path.display().to_string()),
        ..config(&path)
    })
    .unwrap();
    runtime.list_images().await.unwrap();
    runtime.list_containers().await.unwrap();
    let called = |f: &Fake, m: &str| f.state().calls.iter().any(|(c, _)| c == m);
    assert!(called(&image_side, "ListImages"));
    assert!(!called(&runtime_side, "ListImages"));
    assert!(called(&runtime_side, "ListContainers"));
    assert!(!called(&image_side, "ListContainers"));
    a.stop().await;
    b.stop().await;
}

/// The request timeout the tests configure, for comparing deadlines.
trait InnerTimeout {
    fn inner_timeout(&self) -> Duration;
}

impl InnerTimeout for CriRuntime {
    fn inner_timeout(&self) -> Duration {
        self.config().request_timeout
    }
}
