//! The shim under containerd's CRI, as a kubelet drives it: a pod whose RuntimeClass
//! handler is `wasmlet` runs its pause container and its Wasm containers in one shim,
//! next to a runc pod.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tonic::transport::Channel;
use wasmlet_proto::cri::v1::runtime_service_client::RuntimeServiceClient;
use wasmlet_proto::cri::v1::{
    ContainerConfig, ContainerMetadata, ContainerState, ContainerStatsRequest, ContainerStatus,
    ContainerStatusRequest, CreateContainerRequest, ExecSyncRequest, ImageSpec, KeyValue,
    LinuxContainerConfig, LinuxContainerResources, LinuxPodSandboxConfig, Mount, PodSandboxConfig,
    PodSandboxMetadata, RemoveContainerRequest, RemovePodSandboxRequest, RunPodSandboxRequest,
    StartContainerRequest, StopContainerRequest, StopPodSandboxRequest,
};
use wasmlet_testkit::containerd::{WASM_HANDLER, images, remove_cgroup_tree};

use crate::harness::{Harness, poll, processes};

type Cri = RuntimeServiceClient<Channel>;
const T: Duration = Duration::from_secs(60);

fn pod(name: &str, log_dir: &Path, cgroup_parent: &str) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: name.into(),
        log_directory: log_dir.to_string_lossy().into_owned(),
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: cgroup_parent.into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn container(name: &str, image: &str, args: &[&str], env: &[(&str, &str)]) -> ContainerConfig {
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: image.into(),
            ..Default::default()
        }),
        args: args.iter().map(|s| s.to_string()).collect(),
        envs: env
            .iter()
            .map(|(k, v)| KeyValue {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        log_path: format!("{name}.log"),
        ..Default::default()
    }
}

async fn run_pod(cri: &mut Cri, config: &PodSandboxConfig, handler: &str) -> Result<String> {
    Ok(cri
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: handler.into(),
        })
        .await
        .context("RunPodSandbox")?
        .into_inner()
        .pod_sandbox_id)
}

async fn start(
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

async fn wait_state(cri: &mut Cri, id: &str, state: ContainerState) -> Result<ContainerStatus> {
    let deadline = Instant::now() + T;
    loop {
        let s = cri
            .container_status(ContainerStatusRequest {
                container_id: id.into(),
                verbose: false,
            })
            .await?
            .into_inner()
            .status
            .context("no status")?;
        if s.state == state as i32 {
            return Ok(s);
        }
        if Instant::now() > deadline {
            bail!("container {id} not {state:?} after {T:?}: {s:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_log(path: &Path, needle: &str) -> Result<String> {
    let deadline = Instant::now() + T;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(needle) {
            return Ok(text);
        }
        if Instant::now() > deadline {
            bail!("{needle:?} not in {} after {T:?}: {text:?}", path.display());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn remove_pod(cri: &mut Cri, sandbox: &str) -> Result<()> {
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

/// The test's pod cgroups (what a kubelet would make), removed from every hierarchy
/// however the test ends.
struct PodsCgroup(String);

impl Drop for PodsCgroup {
    fn drop(&mut self) {
        if let Err(e) = remove_cgroup_tree(&self.0) {
            eprintln!("removing the test's cgroup {}: {e:#}", self.0);
        }
    }
}

/// The memory cgroup a process is in.
/// Lazily unmounts a test's mount when dropped.
struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

fn memory_cgroup(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .ok()?
        .lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
            controllers
                .split(',')
                .any(|c| c == "memory")
                .then(|| path.to_owned())
        })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wasm_pod_of_two_containers_runs_through_cri_beside_a_runc_pod() -> Result<()> {
    let h = Harness::start()?;
    h.containerd.import_test_images()?;
    let mut cri = h.containerd.runtime_client().await?;
    let dir = h.containerd.layout().dir.clone();
    let prefix = h.containerd.prefix().to_owned();
    let pods_cgroup = PodsCgroup(format!("/{prefix}-pods"));
    let cgroup_parent = format!("{}/wasm-pod", pods_cgroup.0);

    // The Wasm pod: pause, a ticker and a hello.
    let logs = dir.join("logs-wasm");
    std::fs::create_dir_all(&logs)?;
    let wasm_pod = pod("wasm-pod", &logs, &cgroup_parent);
    let sandbox = run_pod(&mut cri, &wasm_pod, WASM_HANDLER).await?;
    let mut ticker_config = container("ticker", &h.image("ticker"), &[], &[("INTERVAL_MS", "50")]);
    ticker_config.linux = Some(LinuxContainerConfig {
        resources: Some(LinuxContainerResources {
            memory_limit_in_bytes: 64 << 20,
            ..Default::default()
        }),
        ..Default::default()
    });
    let ticker = start(&mut cri, &sandbox, &wasm_pod, ticker_config).await?;
    // A volume mounted after the pod's sandbox process started (as the kubelet binds
    // a container's subPath just before creating it): hello reads a file from it.
    let late = dir.join("late-volume");
    std::fs::create_dir_all(&late)?;
    nix::mount::mount(
        Some("tmpfs"),
        &late,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=1m"),
    )?;
    let _late = Unmount(late.clone());
    std::fs::write(late.join("note"), "mounted late")?;
    let mut hello_config = container(
        "hello",
        &h.image("hello"),
        &["from-cri"],
        &[("GREETING", "hi"), ("READ_FILE", "/late/note")],
    );
    hello_config.mounts = vec![Mount {
        container_path: "/late".into(),
        host_path: late.to_string_lossy().into_owned(),
        readonly: true,
        ..Default::default()
    }];
    let hello = start(&mut cri, &sandbox, &wasm_pod, hello_config).await?;

    // The runc pod beside it, in the same containerd.
    let runc_logs = dir.join("logs-runc");
    std::fs::create_dir_all(&runc_logs)?;
    let runc_pod = pod(
        "runc-pod",
        &runc_logs,
        &format!("{}/runc-pod", pods_cgroup.0),
    );
    let runc_sandbox = run_pod(&mut cri, &runc_pod, "").await?;
    let mut sleeper = container("sleeper", images::BUSYBOX_IMAGE, &[], &[]);
    sleeper.command = vec!["sleep".into(), "3600".into()];
    let sleeper = start(&mut cri, &runc_sandbox, &runc_pod, sleeper).await?;

    // hello ran to the end; containerd wrote its output as CRI log records.
    let status = wait_state(&mut cri, &hello, ContainerState::ContainerExited).await?;
    assert_eq!(status.exit_code, 0, "{status:?}");
    let log = wait_log(&logs.join("hello.log"), "arg[1]=from-cri").await?;
    assert!(log.contains(" stdout F arg[1]=from-cri"), "{log}");
    assert!(log.contains(" stdout F env GREETING=hi"), "{log}");
    assert!(log.contains(" stderr F hello on stderr"), "{log}");
    assert!(
        log.contains(" stdout F read /late/note: mounted late"),
        "{log}"
    );
    wait_log(&logs.join("ticker.log"), "stdout F tick 3").await?;
    wait_state(&mut cri, &sleeper, ContainerState::ContainerRunning).await?;

    // One shim and one sandbox process for the pod; the sandbox process runs in the
    // pod's cgroup.
    let address = |id: &str| -> Result<String> {
        let path = h
            .containerd
            .layout()
            .state()
            .join("io.containerd.runtime.v2.task/k8s.io")
            .join(id)
            .join("address");
        std::fs::read_to_string(&path).with_context(|| {
            let listing: Vec<_> = std::fs::read_dir(path.parent().unwrap().parent().unwrap())
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.file_name())
                .collect();
            format!(
                "{} (bundle holds {listing:?}); containerd:\n{}",
                path.display(),
                h.containerd.log_tail(60)
            )
        })
    };
    // (containerd deleted hello's task, and its bundle, when it exited.)
    assert_eq!(address(&sandbox)?, address(&ticker)?);
    let sandboxes =
        processes(|c| c.contains(" sandbox ") && c.contains(&dir.to_string_lossy().to_string()));
    assert_eq!(sandboxes.len(), 1, "{sandboxes:?}");
    let cgroup = memory_cgroup(sandboxes[0]).context("the sandbox's memory cgroup")?;
    assert!(
        cgroup.starts_with(&format!("{cgroup_parent}/")),
        "the sandbox process is in {cgroup}, not under {cgroup_parent}"
    );
    // It has a mount namespace of its own; hello's rootfs, mounted after the sandbox
    // started with the ticker, reached it all the same (through the shim's shared
    // directory: this host's mounts are private).
    let mount_ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/mnt"));
    assert_ne!(mount_ns(&sandboxes[0].to_string())?, mount_ns("self")?);

    // ExecSync and stats, as the kubelet's exec probes and the summary API use them.
    let exec = cri
        .exec_sync(ExecSyncRequest {
            container_id: ticker.clone(),
            cmd: vec!["/app.wasm".into(), "check".into()],
            timeout: 10,
        })
        .await?
        .into_inner();
    assert_eq!(
        (exec.exit_code, String::from_utf8_lossy(&exec.stdout).trim()),
        (0, "ok")
    );
    let stats = cri
        .container_stats(ContainerStatsRequest {
            container_id: ticker.clone(),
        })
        .await?
        .into_inner()
        .stats
        .context("no stats")?;
    let memory = stats.memory.context("no memory stats")?;
    assert!(
        memory.usage_bytes.map_or(0, |u| u.value) > 0,
        "memory usage of a running Wasm pod: {memory:?}"
    );

    // A guest over its memory limit is OOMKilled, as runc reports one.
    let mut memhog = container("memhog", &h.image("memhog"), &[], &[("MIB", "64")]);
    memhog.linux = Some(LinuxContainerConfig {
        resources: Some(LinuxContainerResources {
            memory_limit_in_bytes: 16 << 20,
            ..Default::default()
        }),
        ..Default::default()
    });
    let memhog = start(&mut cri, &sandbox, &wasm_pod, memhog).await?;
    let status = wait_state(&mut cri, &memhog, ContainerState::ContainerExited).await?;
    assert_eq!(
        (status.exit_code, status.reason.as_str()),
        (137, "OOMKilled"),
        "{status:?}"
    );

    // Stop as the kubelet does: the ticker ends on SIGTERM.
    cri.stop_container(StopContainerRequest {
        container_id: ticker.clone(),
        timeout: 10,
    })
    .await?;
    let status = wait_state(&mut cri, &ticker, ContainerState::ContainerExited).await?;
    assert_eq!(status.exit_code, 143, "{status:?}");
    for id in [&ticker, &hello, &memhog] {
        cri.remove_container(RemoveContainerRequest {
            container_id: id.to_string(),
        })
        .await?;
    }
    remove_pod(&mut cri, &sandbox).await?;
    remove_pod(&mut cri, &runc_sandbox).await?;
    poll(T, "the pod's shim and sandbox process to exit", || {
        Ok(h.shim_processes().is_empty().then_some(()))
    })?;
    // The sandbox's cgroup went with it.
    let leaf = Path::new("/sys/fs/cgroup/memory")
        .join(cgroup_parent.trim_start_matches('/'))
        .join(&sandbox);
    assert!(!leaf.exists(), "{} left behind", leaf.display());
    // No rootfs of the pod is left mounted, where containerd put it or where the shim
    // shared it.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")?;
    let state = h.containerd.layout().state().to_string_lossy().into_owned();
    let left: Vec<_> = mounts
        .lines()
        .filter(|l| l.contains(&sandbox) || l.contains(&ticker) || l.contains(&state))
        .collect();
    assert!(left.is_empty(), "mounts left: {left:#?}");
    Ok(())
}
