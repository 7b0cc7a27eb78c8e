//! The private containerd harness, driven over CRI as a kubelet would.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tonic::transport::Channel;
use wasmlet_proto::cri::v1::runtime_service_client::RuntimeServiceClient;
use wasmlet_proto::cri::v1::{
    ContainerConfig, ContainerMetadata, ContainerState, ContainerStatus, ContainerStatusRequest,
    CreateContainerRequest, ImageSpec, LinuxContainerConfig, LinuxContainerSecurityContext,
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, ListImagesRequest, NamespaceMode,
    NamespaceOption, PodSandboxConfig, PodSandboxMetadata, PodSandboxStatusRequest,
    RemoveContainerRequest, RemovePodSandboxRequest, RunPodSandboxRequest, StartContainerRequest,
    StopContainerRequest, StopPodSandboxRequest, VersionRequest,
};
use wasmlet_testkit::containerd::{Containerd, Footprint, images};

type Cri = RuntimeServiceClient<Channel>;

fn sandbox_config(name: &str, log_dir: &Path) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: name.into(),
        log_directory: log_dir.to_string_lossy().into_owned(),
        linux: Some(LinuxPodSandboxConfig::default()),
        ..Default::default()
    }
}

/// What the kubelet sends for a pod without `shareProcessNamespace`: each
/// container gets its own PID namespace. (Unset namespace options mean POD.)
fn private_pid() -> Option<NamespaceOption> {
    Some(NamespaceOption {
        pid: NamespaceMode::Container as i32,
        ..Default::default()
    })
}

fn with_private_pid_sandbox(mut config: PodSandboxConfig) -> PodSandboxConfig {
    config.linux = Some(LinuxPodSandboxConfig {
        security_context: Some(LinuxSandboxSecurityContext {
            namespace_options: private_pid(),
            ..Default::default()
        }),
        ..Default::default()
    });
    config
}

fn with_private_pid(mut config: ContainerConfig) -> ContainerConfig {
    config.linux = Some(LinuxContainerConfig {
        security_context: Some(LinuxContainerSecurityContext {
            namespace_options: private_pid(),
            ..Default::default()
        }),
        ..Default::default()
    });
    config
}

fn busybox(name: &str, command: &[&str], log_path: &str) -> ContainerConfig {
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: images::BUSYBOX_IMAGE.into(),
            ..Default::default()
        }),
        command: command.iter().map(|s| s.to_string()).collect(),
        log_path: log_path.into(),
        ..Default::default()
    }
}

async fn run_sandbox(cri: &mut Cri, config: &PodSandboxConfig) -> Result<String> {
    let id = cri
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        })
        .await
        .context("RunPodSandbox")?
        .into_inner()
        .pod_sandbox_id;
    Ok(id)
}

async fn start_container(
    cri: &mut Cri,
    sandbox: &str,
    sandbox_config: &PodSandboxConfig,
    config: ContainerConfig,
) -> Result<String> {
    let id = cri
        .create_container(CreateContainerRequest {
            pod_sandbox_id: sandbox.into(),
            config: Some(config),
            sandbox_config: Some(sandbox_config.clone()),
        })
        .await
        .context("CreateContainer")?
        .into_inner()
        .container_id;
    cri.start_container(StartContainerRequest {
        container_id: id.clone(),
    })
    .await
    .context("StartContainer")?;
    Ok(id)
}

async fn status(cri: &mut Cri, id: &str) -> Result<ContainerStatus> {
    cri.container_status(ContainerStatusRequest {
        container_id: id.into(),
        verbose: false,
    })
    .await?
    .into_inner()
    .status
    .context("no status")
}

async fn wait_state(
    cri: &mut Cri,
    id: &str,
    state: ContainerState,
    timeout: Duration,
) -> Result<ContainerStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        let s = status(cri, id).await?;
        if s.state == state as i32 {
            return Ok(s);
        }
        if Instant::now() > deadline {
            bail!("container {id} not {state:?} after {timeout:?}: {s:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn remove_pod(cri: &mut Cri, sandbox: &str, containers: &[&str]) -> Result<()> {
    for c in containers {
        cri.stop_container(StopContainerRequest {
            container_id: c.to_string(),
            timeout: 0,
        })
        .await
        .context("StopContainer")?;
        cri.remove_container(RemoveContainerRequest {
            container_id: c.to_string(),
        })
        .await
        .context("RemoveContainer")?;
    }
    cri.stop_pod_sandbox(StopPodSandboxRequest {
        pod_sandbox_id: sandbox.into(),
    })
    .await
    .context("StopPodSandbox")?;
    cri.remove_pod_sandbox(RemovePodSandboxRequest {
        pod_sandbox_id: sandbox.into(),
    })
    .await
    .context("RemovePodSandbox")?;
    Ok(())
}

/// Start containerd and import the images, printing how long each took.
fn start() -> Result<Containerd> {
    let t = Instant::now();
    let containerd = Containerd::start()?;
    let started = t.elapsed();
    let t = Instant::now();
    containerd.import_test_images()?;
    eprintln!(
        "{}: containerd answered in {:?} ({started:?} with setup), images imported in {:?}",
        containerd.prefix(),
        containerd.started_in(),
        t.elapsed()
    );
    Ok(containerd)
}

/// Stop the run and assert it left nothing behind.
fn stop_and_check(containerd: Containerd) {
    let footprint: Footprint = containerd.footprint();
    let log = containerd.log_tail(30);
    let t = Instant::now();
    containerd.stop().expect("clean teardown");
    eprintln!("{}: torn down in {:?}", footprint.prefix, t.elapsed());
    let left = footprint.leftovers();
    assert!(left.is_empty(), "left behind: {left:#?}\nlog tail:\n{log}");
}

#[tokio::test]
async fn cri_runs_a_busybox_pod_and_logs_its_output() -> Result<()> {
    let containerd = start()?;
    let mut cri = containerd.runtime_client().await?;

    let version = cri.version(VersionRequest::default()).await?.into_inner();
    assert_eq!(version.runtime_name, "containerd", "{version:?}");
    assert_eq!(version.runtime_api_version, "v1", "{version:?}");

    let mut image_cri = containerd.image_client().await?;
    let listed = image_cri
        .list_images(ListImagesRequest::default())
        .await?
        .into_inner()
        .images;
    for want in [images::BUSYBOX_IMAGE, images::PAUSE_IMAGE] {
        assert!(
            listed.iter().any(|i| i.repo_tags.iter().any(|t| t == want)),
            "{want} not listed by CRI: {listed:?}"
        );
    }

    let logs = tempfile::tempdir()?;
    let t = Instant::now();
    let sandbox_config = sandbox_config("hello", logs.path());
    let sandbox = run_sandbox(&mut cri, &sandbox_config).await?;
    let sandbox_ready = t.elapsed();
    let container = start_container(
        &mut cri,
        &sandbox,
        &sandbox_config,
        busybox(
            "hello",
            &["sh", "-c", "echo hello; echo oops >&2; exit 3"],
            "c/0.log",
        ),
    )
    .await?;
    let exited = wait_state(
        &mut cri,
        &container,
        ContainerState::ContainerExited,
        Duration::from_secs(30),
    )
    .await?;
    eprintln!(
        "{}: sandbox ready in {sandbox_ready:?}, container exited {:?} after RunPodSandbox",
        containerd.prefix(),
        t.elapsed()
    );
    assert_eq!(exited.exit_code, 3, "{exited:?}");
    assert_eq!(exited.reason, "Error", "{exited:?}");

    // CRI log format: `<RFC 3339 time> <stream> <P|F> <line>`.
    let log_file = logs.path().join("c/0.log");
    let log = std::fs::read_to_string(&log_file)
        .with_context(|| format!("reading {}", log_file.display()))?;
    let records: Vec<(&str, &str, &str)> = log
        .lines()
        .map(|l| {
            let mut f = l.splitn(4, ' ');
            let _time = f.next().unwrap();
            (
                f.next().unwrap_or(""),
                f.next().unwrap_or(""),
                f.next().unwrap_or(""),
            )
        })
        .collect();
    assert!(records.contains(&("stdout", "F", "hello")), "{log}");
    assert!(records.contains(&("stderr", "F", "oops")), "{log}");

    let pod = cri
        .pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: sandbox.clone(),
            verbose: false,
        })
        .await?
        .into_inner()
        .status
        .context("no sandbox status")?;
    let ip = pod.network.map(|n| n.ip).unwrap_or_default();
    let subnet = containerd.layout().subnet;
    assert!(subnet.contains(&ip), "pod IP {ip:?} not in {subnet}");

    remove_pod(&mut cri, &sandbox, &[&container]).await?;
    drop(cri);
    drop(image_cri);
    stop_and_check(containerd);
    Ok(())
}

#[tokio::test]
async fn stop_with_a_timeout_kills_what_ignores_sigterm() -> Result<()> {
    let containerd = start()?;
    let mut cri = containerd.runtime_client().await?;
    let logs = tempfile::tempdir()?;
    let sandbox_config = with_private_pid_sandbox(sandbox_config("sleeper", logs.path()));
    let sandbox = run_sandbox(&mut cri, &sandbox_config).await?;
    let container = start_container(
        &mut cri,
        &sandbox,
        &sandbox_config,
        with_private_pid(busybox("sleeper", &["sleep", "1000"], "sleeper/0.log")),
    )
    .await?;
    wait_state(
        &mut cri,
        &container,
        ContainerState::ContainerRunning,
        Duration::from_secs(30),
    )
    .await?;

    // `sleep` is PID 1 of its own PID namespace: SIGTERM (no handler) is
    // ignored, so the stop must come from the SIGKILL after the 2 s grace.
    let t = Instant::now();
    cri.stop_container(StopContainerRequest {
        container_id: container.clone(),
        timeout: 2,
    })
    .await?;
    let took = t.elapsed();
    eprintln!(
        "{}: StopContainer(timeout 2) took {took:?}",
        containerd.prefix()
    );
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(5),
        "{took:?}"
    );
    let s = status(&mut cri, &container).await?;
    assert_eq!(s.state, ContainerState::ContainerExited as i32, "{s:?}");
    assert_eq!(s.exit_code, 137, "{s:?}");

    remove_pod(&mut cri, &sandbox, &[&container]).await?;
    drop(cri);
    stop_and_check(containerd);
    Ok(())
}

#[tokio::test]
async fn dropping_the_handle_removes_running_pods() -> Result<()> {
    let containerd = start()?;
    let mut cri = containerd.runtime_client().await?;
    let logs = tempfile::tempdir()?;
    let mut netns = Vec::new();
    let mut sandboxes = Vec::new();
    for name in ["left-a", "left-b"] {
        let sandbox_config = sandbox_config(name, logs.path());
        let sandbox = run_sandbox(&mut cri, &sandbox_config).await?;
        let container = start_container(
            &mut cri,
            &sandbox,
            &sandbox_config,
            busybox(name, &["sleep", "1000"], &format!("{name}.log")),
        )
        .await?;
        wait_state(
            &mut cri,
            &container,
            ContainerState::ContainerRunning,
            Duration::from_secs(30),
        )
        .await?;
        let info = cri
            .pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: sandbox.clone(),
                verbose: true,
            })
            .await?
            .into_inner()
            .info;
        let info: serde_json::Value = serde_json::from_str(&info["info"])?;
        let path = info["runtimeSpec"]["linux"]["namespaces"]
            .as_array()
            .and_then(|nss| nss.iter().find(|ns| ns["type"] == "network"))
            .and_then(|ns| ns["path"].as_str())
            .context("sandbox has no network namespace path")?
            .to_string();
        netns.push(path);
        sandboxes.push(sandbox);
    }
    let bridge = containerd.layout().bridge.clone();
    assert!(
        Path::new("/sys/class/net").join(&bridge).exists(),
        "bridge {bridge} missing while pods run"
    );
    for path in &netns {
        assert!(
            path.starts_with(&containerd.layout().dir.to_string_lossy().into_owned()),
            "netns {path} is outside the run directory"
        );
        assert!(Path::new(path).exists(), "{path}");
    }
    drop(cri);
    let footprint = containerd.footprint();
    drop(containerd);
    let left = footprint.leftovers();
    assert!(left.is_empty(), "left behind: {left:#?}");
    for path in &netns {
        assert!(!Path::new(path).exists(), "{path} left behind");
    }
    // libcni's result cache (shared by every runtime on the machine).
    let cached: Vec<String> = std::fs::read_dir("/var/lib/cni/results")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|f| sandboxes.iter().any(|id| f.contains(id.as_str())))
        .collect();
    assert!(cached.is_empty(), "CNI results left behind: {cached:?}");
    Ok(())
}

#[tokio::test]
async fn unset_namespace_options_share_the_pods_pid_namespace_with_pause() -> Result<()> {
    let containerd = start()?;
    let mut cri = containerd.runtime_client().await?;
    let logs = tempfile::tempdir()?;
    let sandbox_config = sandbox_config("shared", logs.path());
    let sandbox = run_sandbox(&mut cri, &sandbox_config).await?;
    // An orphan (the backgrounded sleep) is left to PID 1 to reap.
    let container = start_container(
        &mut cri,
        &sandbox,
        &sandbox_config,
        busybox(
            "shared",
            &[
                "sh",
                "-c",
                "sleep 0.1 & tr '\\0' ' ' < /proc/1/cmdline; echo",
            ],
            "shared.log",
        ),
    )
    .await?;
    let exited = wait_state(
        &mut cri,
        &container,
        ContainerState::ContainerExited,
        Duration::from_secs(30),
    )
    .await?;
    assert_eq!(exited.exit_code, 0, "{exited:?}");
    let log = std::fs::read_to_string(logs.path().join("shared.log"))?;
    let init = images::PAUSE_ENTRYPOINT.join(" ");
    assert!(
        log.contains(&format!("stdout F {init}")),
        "PID 1 is not the pause: {log}"
    );

    // The pause exits on SIGTERM, so stopping the sandbox is quick.
    let t = Instant::now();
    remove_pod(&mut cri, &sandbox, &[&container]).await?;
    eprintln!(
        "{}: pod stopped and removed in {:?}",
        containerd.prefix(),
        t.elapsed()
    );
    drop(cri);
    stop_and_check(containerd);
    Ok(())
}

#[tokio::test]
async fn a_crashed_run_is_removed_from_its_footprint() -> Result<()> {
    let containerd = start()?;
    let mut cri = containerd.runtime_client().await?;
    let logs = tempfile::tempdir()?;
    let sandbox_config = with_private_pid_sandbox(sandbox_config("crashed", logs.path()));
    let sandbox = run_sandbox(&mut cri, &sandbox_config).await?;
    let container = start_container(
        &mut cri,
        &sandbox,
        &sandbox_config,
        with_private_pid(busybox("crashed", &["sleep", "1000"], "crashed.log")),
    )
    .await?;
    wait_state(
        &mut cri,
        &container,
        ContainerState::ContainerRunning,
        Duration::from_secs(30),
    )
    .await?;
    drop(cri);

    // containerd dies; the shim and the containers live on; the handle is
    // never dropped.
    let footprint = containerd.footprint();
    let pid = containerd.pid().context("containerd pid")?;
    let pid = nix::unistd::Pid::from_raw(pid as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL)?;
    // Reap it here: the forgotten handle never will.
    nix::sys::wait::waitpid(pid, None)?;
    std::mem::forget(containerd);

    footprint.remove()?;
    let left = footprint.leftovers();
    assert!(left.is_empty(), "left behind: {left:#?}");
    let cached: Vec<String> = std::fs::read_dir("/var/lib/cni/results")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|f| f.contains(&sandbox))
        .collect();
    assert!(cached.is_empty(), "CNI results left behind: {cached:?}");
    Ok(())
}
