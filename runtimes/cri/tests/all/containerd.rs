//! `CriRuntime` against a real, private containerd 1.6 (from `wasmlet-testkit`):
//! a busybox pod run the way the node will run it.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use tokio::sync::broadcast;
use wasmlet_proto::cri::v1 as cri;
use wasmlet_runtime::{
    ContainerConfig, ContainerEventKind, ContainerMetadata, ContainerResources, ContainerState,
    ContainerStatus, Error, PodMetadata, PodSandboxConfig, Runtime, RuntimeEvent, SandboxState,
};
use wasmlet_runtime_cri::{CriConfig, CriRuntime};
use wasmlet_testkit::containerd::{Containerd, images};

fn pod(log_dir: &Path) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: PodMetadata {
            name: "busybox".into(),
            namespace: "default".into(),
            uid: "uid-cri-busybox".into(),
            attempt: 0,
        },
        hostname: "busybox".into(),
        log_directory: log_dir.to_owned(),
        labels: [(
            "io.kubernetes.pod.uid".to_owned(),
            "uid-cri-busybox".to_owned(),
        )]
        .into(),
        ..Default::default()
    }
}

async fn wait_exited(runtime: &CriRuntime, id: &str) -> Result<ContainerStatus> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let status = runtime.container_status(id).await?;
        if status.state == ContainerState::Exited {
            return Ok(status);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("container {id} did not exit within 30s: {status:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `container_id` has had every event in `kinds`.
async fn wait_events(
    rx: &mut broadcast::Receiver<RuntimeEvent>,
    container_id: &str,
    kinds: &[ContainerEventKind],
) -> Result<()> {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !kinds.iter().all(|k| seen.contains(k)) {
        let event = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .with_context(|| format!("events for {container_id}: only {seen:?}"))??;
        if event.container_id == container_id {
            ensure!(event.pod_uid == "uid-cri-busybox", "{event:?}");
            seen.push(event.kind);
        }
    }
    Ok(())
}

/// Whether the runtime answers `GetContainerEvents` (containerd 1.7 and later).
async fn has_container_events(containerd: &Containerd) -> Result<bool> {
    let mut client = containerd.runtime_client().await?;
    match client.get_container_events(cri::GetEventsRequest {}).await {
        Ok(_) => Ok(true),
        Err(status) if status.code() == tonic::Code::Unimplemented => Ok(false),
        Err(status) => bail!("GetContainerEvents: {status}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busybox_pod_runs_to_completion_in_containerd() -> Result<()> {
    let containerd = tokio::task::spawn_blocking(|| -> Result<Containerd> {
        let containerd = Containerd::start()?;
        containerd.import_test_images()?;
        Ok(containerd)
    })
    .await??;
    let result = run_busybox(&containerd).await;
    if result.is_err() {
        eprintln!("containerd log:\n{}", containerd.log_tail(60));
    }
    tokio::task::spawn_blocking(move || containerd.stop()).await??;
    result
}

async fn run_busybox(containerd: &Containerd) -> Result<()> {
    let runtime = CriRuntime::connect(CriConfig {
        runtime_endpoint: containerd.address(),
        image_endpoint: None,
        request_timeout: Duration::from_secs(60),
        handler: String::new(),
    })?;
    let mut events = runtime.subscribe();

    let version = runtime.version().await?;
    ensure!(version.runtime_name == "containerd", "{version:?}");
    ensure!(version.runtime_api_version == "v1", "{version:?}");
    let status = runtime.status().await?;
    ensure!(
        status.runtime_ready && status.network_ready,
        "containerd is not ready: {status:?}"
    );
    let evented = has_container_events(containerd).await?;
    if version.runtime_version.starts_with("1.6") {
        ensure!(
            !evented,
            "containerd {} answers GetContainerEvents; 1.6 was not expected to",
            version.runtime_version
        );
    }

    // Images: the imported busybox is there, a missing one fails as a pull error.
    let image = runtime
        .image_status(images::BUSYBOX_IMAGE)
        .await?
        .context("busybox was imported")?;
    ensure!(image.id.starts_with("sha256:"), "{image:?}");
    let fs = runtime.image_fs_info().await?;
    // containerd samples usage every `stats_collect_period` (10 s), so a fresh daemon
    // may still say 0 bytes; the filesystem and the fields are what is checked here.
    ensure!(
        fs.iter().any(|f| f.used_bytes.is_some()
            && f.inodes_used.is_some()
            && f.mountpoint.starts_with(&containerd.layout().dir)
            && f.mountpoint
                .ends_with("io.containerd.snapshotter.v1.overlayfs")),
        "ImageFsInfo reports the private root's snapshotter: {fs:?}"
    );
    ensure!(
        runtime
            .image_status("localhost/wasmlet-test/absent:1")
            .await?
            .is_none()
    );
    match runtime
        .pull_image("localhost/wasmlet-test/absent:1", None)
        .await
    {
        Err(Error::ImagePull { message, .. }) => ensure!(!message.is_empty()),
        other => bail!("pulling an absent image: {other:?}"),
    }

    // The pod: the node creates the log directories, as the kubelet does.
    let logs = tempfile::tempdir()?;
    std::fs::create_dir_all(logs.path().join("app"))?;
    let pod = pod(logs.path());
    let sandbox = runtime.run_pod_sandbox(&pod).await?;
    let sandbox_status = runtime.pod_sandbox_status(&sandbox).await?;
    ensure!(
        sandbox_status.state == SandboxState::Ready,
        "{sandbox_status:?}"
    );
    ensure!(sandbox_status.metadata.uid == "uid-cri-busybox");
    let ip = sandbox_status.ip.clone().context("the pod has an IP")?;
    ensure!(
        containerd.layout().subnet.contains(&ip),
        "{ip} is not in {}",
        containerd.layout().subnet
    );

    let config = ContainerConfig {
        metadata: ContainerMetadata {
            name: "app".into(),
            attempt: 0,
        },
        image: images::BUSYBOX_IMAGE.into(),
        command: vec!["sh".into(), "-c".into()],
        args: vec!["echo hello from $GREETING; exit 3".into()],
        env: vec![("GREETING".into(), "busybox".into())],
        log_path: "app/0.log".into(),
        ..Default::default()
    };
    let id = runtime.create_container(&sandbox, &config, &pod).await?;
    let created = runtime.container_status(&id).await?;
    ensure!(created.state == ContainerState::Created, "{created:?}");
    ensure!(created.sandbox_id == sandbox, "{created:?}");
    runtime.start_container(&id).await?;

    let done = wait_exited(&runtime, &id).await?;
    ensure!(done.exit_code == 3, "{done:?}");
    ensure!(done.reason == "Error", "{done:?}");
    ensure!(done.metadata.name == "app");
    ensure!(done.image == images::BUSYBOX_IMAGE, "{done:?}");
    ensure!(!done.image_ref.is_empty(), "{done:?}");
    let (started, finished) = (
        done.started_at.context("started_at")?,
        done.finished_at.context("finished_at")?,
    );
    // containerd 1.6 records `started_at` when StartContainer returns and
    // `finished_at` from the exit event: for a container this short the exit can
    // come first, so the two are not ordered.
    ensure!(
        done.created_at <= started && done.created_at <= finished,
        "{done:?}"
    );
    ensure!(done.log_path == logs.path().join("app/0.log"), "{done:?}");
    let log = std::fs::read_to_string(&done.log_path)?;
    ensure!(log.contains("hello from busybox"), "log: {log:?}");

    let listed = runtime.list_containers().await?;
    let listed = listed.iter().find(|c| c.id == id).context("listed")?;
    ensure!(listed.state == ContainerState::Exited && listed.sandbox_id == sandbox);
    ensure!(
        runtime
            .list_pod_sandboxes()
            .await?
            .iter()
            .any(|s| s.id == sandbox)
    );

    if evented {
        use ContainerEventKind::{Created, Started, Stopped};
        wait_events(&mut events, &id, &[Created, Started, Stopped]).await?;
    }

    sleeper(&runtime, &sandbox, &pod).await?;

    // Stop and remove are idempotent against the real runtime too (containerd 1.6
    // answers NotFound to stopping a missing container or sandbox, OK to removing).
    runtime.stop_container(&id, Duration::from_secs(1)).await?;
    runtime.remove_container(&id).await?;
    runtime.remove_container(&id).await?;
    runtime.stop_container(&id, Duration::from_secs(1)).await?;
    match runtime.container_status(&id).await {
        Err(e) if e.is_not_found() => {}
        other => bail!("status of a removed container: {other:?}"),
    }
    runtime.stop_pod_sandbox(&sandbox).await?;
    let stopped = runtime.pod_sandbox_status(&sandbox).await?;
    ensure!(stopped.state == SandboxState::NotReady, "{stopped:?}");
    runtime.stop_pod_sandbox(&sandbox).await?;
    runtime.remove_pod_sandbox(&sandbox).await?;
    runtime.remove_pod_sandbox(&sandbox).await?;
    runtime.stop_pod_sandbox(&sandbox).await?;
    match runtime.pod_sandbox_status(&sandbox).await {
        Err(e) if e.is_not_found() => {}
        other => bail!("status of a removed sandbox: {other:?}"),
    }
    Ok(())
}

/// A long-running container with limits: the limits reach its cgroup, it has a PID
/// namespace of its own, `ExecSync` works, and stopping it kills it after the grace
/// period (busybox `sleep` as PID 1 ignores SIGTERM).
async fn sleeper(runtime: &CriRuntime, sandbox: &str, pod: &PodSandboxConfig) -> Result<()> {
    std::fs::create_dir_all(pod.log_directory.join("sleeper"))?;
    let config = ContainerConfig {
        metadata: ContainerMetadata {
            name: "sleeper".into(),
            attempt: 0,
        },
        image: images::BUSYBOX_IMAGE.into(),
        command: vec!["sleep".into(), "3600".into()],
        log_path: "sleeper/0.log".into(),
        resources: ContainerResources {
            cpu_shares: Some(256),
            cpu_quota: Some(20_000),
            cpu_period: Some(100_000),
            memory_limit_bytes: Some(64 << 20),
            oom_score_adj: Some(1000),
            cpuset_cpus: None,
        },
        ..Default::default()
    };
    let id = runtime.create_container(sandbox, &config, pod).await?;
    runtime.start_container(&id).await?;
    let running = runtime.container_status(&id).await?;
    ensure!(running.state == ContainerState::Running, "{running:?}");

    // cgroup v1 mounts the container's own cgroups; v2 has one unified file tree.
    let limits = exec(
        runtime,
        &id,
        "if [ -e /sys/fs/cgroup/memory.max ]; then \
           cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/cpu.max; \
         else \
           cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/cpu/cpu.shares \
               /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us; \
         fi",
    )
    .await?;
    let limits: Vec<&str> = limits.lines().collect();
    let want_v1 = ["67108864", "256", "20000", "100000"];
    let want_v2 = ["67108864", "20000 100000"];
    ensure!(
        limits == want_v1 || limits == want_v2,
        "cgroup limits: {limits:?}"
    );
    ensure!(exec(runtime, &id, "cat /proc/self/oom_score_adj").await? == "1000");
    // PID namespace of its own: PID 1 is `sleep`, not the sandbox's pause.
    let init = exec(runtime, &id, "tr '\\0' ' ' < /proc/1/cmdline").await?;
    ensure!(init == "sleep 3600", "PID 1 is {init:?}");

    let failed = runtime
        .exec_sync(&id, &["false".to_owned()], Duration::from_secs(10))
        .await?;
    ensure!(failed.exit_code == 1, "{failed:?}");

    let asked = std::time::Instant::now();
    runtime
        .stop_container(&id, Duration::from_millis(500))
        .await?;
    let stopped = runtime.container_status(&id).await?;
    ensure!(stopped.state == ContainerState::Exited, "{stopped:?}");
    ensure!(stopped.exit_code == 137, "killed: {stopped:?}");
    ensure!(
        asked.elapsed() >= Duration::from_millis(900),
        "the grace period is rounded up to a second, not cut to zero"
    );
    runtime.remove_container(&id).await?;
    Ok(())
}

/// Runs `script` with `sh -c` in the container; it must succeed. Returns its stdout.
async fn exec(runtime: &CriRuntime, id: &str, script: &str) -> Result<String> {
    let command = ["sh".to_owned(), "-c".to_owned(), script.to_owned()];
    let out = runtime
        .exec_sync(id, &command, Duration::from_secs(10))
        .await?;
    ensure!(out.exit_code == 0, "{script}: {out:?}");
    Ok(String::from_utf8(out.stdout)?.trim().to_owned())
}
