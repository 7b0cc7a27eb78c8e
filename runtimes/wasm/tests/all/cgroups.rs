//! The sandbox process in its pod's cgroup, on this machine's real cgroup v1 hierarchy,
//! and its `oom_score_adj`.
//!
//! Each test makes its own pod cgroup, `/wasmlet-rt-test-<pid>-<n>/pod<uid>`, in the
//! `cpu`, `cpuacct`, `memory` and `pids` hierarchies, as the node would, and removes it
//! however the test ends ([`TestCgroup`]); the v2 case uses the hybrid layout's
//! `unified` tree as its mount root. They need root and this machine's hybrid layout
//! (as CI has): elsewhere they fail saying so rather than pass without testing.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use wasmlet_runtime::{ContainerState, Error, PodSandboxConfig, Runtime};
use wasmlet_runtime_wasm::crilog::Stream;

use crate::fixture::{
    Fixture, lines, log_records, poll_until, process_exists, wait_for_stdout_line, with_env,
};

const MOUNT_ROOT: &str = "/sys/fs/cgroup";
/// The hierarchies the node creates a pod cgroup in.
const CONTROLLERS: [&str; 4] = ["cpu", "cpuacct", "memory", "pids"];
const MIB: u64 = 1024 * 1024;

/// Fails the test unless the real v1 hierarchy is here for it to use.
fn real_v1_available() -> bool {
    let root = Path::new(MOUNT_ROOT);
    let ok = nix::unistd::geteuid().is_root()
        && !root.join("cgroup.controllers").exists()
        && CONTROLLERS
            .iter()
            .all(|c| root.join(c).join("cgroup.procs").is_file());
    assert!(
        ok,
        "this test needs root and the cgroup v1 hierarchy at {MOUNT_ROOT}"
    );
    ok
}

/// A pod cgroup `/wasmlet-rt-test-<pid>-<n>/pod<uid>` in each of [`CONTROLLERS`]. On
/// drop, whatever still runs in it is killed and its directories are removed.
struct TestCgroup {
    /// `/wasmlet-rt-test-<pid>-<n>`.
    root: String,
    /// `<root>/pod<uid>`, the pod's `cgroup_parent`.
    pod: String,
    /// The directories made, in order.
    made: Vec<PathBuf>,
}

impl TestCgroup {
    /// The root in `root_in` (directories under the mount root: v1 hierarchies, or the
    /// hybrid layout's v2 `unified`) and, in `pod_in` (some of them), the pod cgroup.
    fn new(uid: &str, root_in: &[&str], pod_in: &[&str]) -> Result<Self> {
        static N: AtomicU32 = AtomicU32::new(0);
        let root = format!(
            "/wasmlet-rt-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let mut cg = TestCgroup {
            pod: format!("{root}/pod{uid}"),
            root,
            made: Vec::new(),
        };
        for &c in root_in {
            cg.mkdir(&cg.path(c, &cg.root))?;
            if pod_in.contains(&c) {
                cg.mkdir(&cg.path(c, &cg.pod))?;
            }
        }
        Ok(cg)
    }

    fn mkdir(&mut self, dir: &Path) -> Result<()> {
        std::fs::create_dir(dir).with_context(|| format!("creating {}", dir.display()))?;
        self.made.push(dir.to_owned());
        Ok(())
    }

    /// `<mount root>/<hierarchy><cgroup>`.
    fn path(&self, hierarchy: &str, cgroup: &str) -> PathBuf {
        Path::new(MOUNT_ROOT)
            .join(hierarchy)
            .join(cgroup.trim_start_matches('/'))
    }

    /// `file` of the pod cgroup in `hierarchy`, trimmed.
    fn read(&self, hierarchy: &str, file: &str) -> Result<String> {
        let path = self.path(hierarchy, &self.pod).join(file);
        Ok(std::fs::read_to_string(&path)
            .with_context(|| path.display().to_string())?
            .trim()
            .to_owned())
    }

    fn write(&self, hierarchy: &str, file: &str, value: &str) -> Result<()> {
        let path = self.path(hierarchy, &self.pod).join(file);
        std::fs::write(&path, value).with_context(|| path.display().to_string())
    }

    /// The ids in a `cgroup.procs` or `tasks` file of the pod cgroup.
    fn ids(&self, hierarchy: &str, file: &str) -> Result<Vec<u32>> {
        Ok(self
            .read(hierarchy, file)?
            .lines()
            .map(|l| l.parse().expect("a pid"))
            .collect())
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        for dir in self.made.iter().rev() {
            loop {
                // A failed test may leave its sandbox running in the cgroup.
                for pid in std::fs::read_to_string(dir.join("cgroup.procs"))
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|l| l.parse::<i32>().ok())
                {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                match std::fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(e) if Instant::now() > deadline => {
                        eprintln!("cleaning up {}: {e}", dir.display());
                        break;
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
    }
}

/// The cgroups of a test root (`/wasmlet-rt-test-...`) still under the mount root, in
/// any hierarchy.
fn leftovers(root: &str) -> Vec<PathBuf> {
    std::fs::read_dir(MOUNT_ROOT)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path().join(root.trim_start_matches('/')))
                .filter(|p| p.exists())
                .collect()
        })
        .unwrap_or_default()
}

/// The cgroup of each hierarchy in a `/proc/<pid>/cgroup` (or a thread's) file:
/// `(controllers, path)`.
fn proc_cgroups(file: &Path) -> Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(file).with_context(|| file.display().to_string())?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let _id = parts.next()?;
            Some((parts.next()?.to_owned(), parts.next()?.to_owned()))
        })
        .collect())
}

/// The cgroup of `controller` in `file`, a `/proc/<pid>/cgroup` file (`""` for the v2
/// tree's line).
fn cgroup_of(file: &Path, controller: &str) -> Result<String> {
    proc_cgroups(file)?
        .into_iter()
        .find(|(controllers, _)| controllers.split(',').any(|c| c == controller))
        .map(|(_, path)| path)
        .with_context(|| format!("no {controller} line in {}", file.display()))
}

/// The thread ids of a process.
fn threads(pid: u32) -> Result<Vec<u32>> {
    let dir = format!("/proc/{pid}/task");
    Ok(std::fs::read_dir(&dir)
        .with_context(|| dir.clone())?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect())
}

/// The processes whose command line mentions `path` (a sandbox is started with its
/// socket's path, which is under the fixture's directory).
fn processes_mentioning(path: &Path) -> Vec<u32> {
    let needle = path.as_os_str().as_encoded_bytes();
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .filter(|pid| {
                    std::fs::read(format!("/proc/{pid}/cmdline"))
                        .is_ok_and(|c| c.windows(needle.len()).any(|w| w == needle))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn oom_score_adj(pid: u32) -> Result<i64> {
    let path = format!("/proc/{pid}/oom_score_adj");
    Ok(std::fs::read_to_string(&path)
        .with_context(|| path.clone())?
        .trim()
        .parse()?)
}

fn pod_config(fx: &Fixture, name: &str, cgroup: &TestCgroup) -> PodSandboxConfig {
    let mut config = fx.pod_config(name);
    config.cgroup_parent = Some(cgroup.pod.clone());
    config
}

#[tokio::test]
async fn the_sandbox_and_every_guest_run_in_the_pod_cgroup() -> Result<()> {
    if !real_v1_available() {
        return Ok(());
    }
    // Declared before the fixture, so dropped after it has killed its sandboxes.
    let cgroup = TestCgroup::new("in-cgroup", &CONTROLLERS, &CONTROLLERS)?;
    let fx = Fixture::with_images(&["ticker", "spin"])?;
    sandbox_and_guests_in_the_pod_cgroup(cgroup, fx).await
}

#[tokio::test]
async fn a_sandbox_forked_from_the_zygote_and_its_guests_run_in_the_pod_cgroup() -> Result<()> {
    if !real_v1_available() {
        return Ok(());
    }
    let cgroup = TestCgroup::new("forked", &CONTROLLERS, &CONTROLLERS)?;
    let fx = Fixture::forked_with_images(&["ticker", "spin"])?;
    sandbox_and_guests_in_the_pod_cgroup(cgroup, fx).await
}

/// The sandbox process of a pod in `cgroup` (its pod cgroup in every hierarchy but
/// `freezer` and `devices`), and all its threads, are in the pod cgroup alone, with
/// the pod's `oom_score_adj`; the guests' CPU and memory are charged to it; removing
/// the pod ends the process and leaves the cgroup empty.
async fn sandbox_and_guests_in_the_pod_cgroup(cgroup: TestCgroup, fx: Fixture) -> Result<()> {
    let mut config = pod_config(&fx, "in-cgroup", &cgroup);
    config.oom_score_adj = Some(900);
    let pod = fx.start_pod(config).await?;
    let pid = fx.runtime.sandbox_pid(&pod.id).expect("sandbox pid");

    // The process is in the pod cgroup in every hierarchy the node made it in, and alone.
    let proc_file = PathBuf::from(format!("/proc/{pid}/cgroup"));
    for c in CONTROLLERS {
        assert_eq!(cgroup_of(&proc_file, c)?, cgroup.pod, "{c}");
        assert_eq!(cgroup.ids(c, "cgroup.procs")?, [pid], "{c}");
    }
    // Hierarchies without the pod's directory were left alone.
    let mine = PathBuf::from(format!("/proc/{}/cgroup", std::process::id()));
    for c in ["freezer", "devices"] {
        assert_eq!(cgroup_of(&proc_file, c)?, cgroup_of(&mine, c)?, "{c}");
    }
    assert_eq!(oom_score_adj(pid)?, 900);

    // Guests run on the sandbox's threads, and every thread is in the pod cgroup.
    let ticker = fx
        .run(
            &pod,
            &with_env(pod.container("ticker", "ticker"), &[("INTERVAL_MS", "20")]),
        )
        .await?;
    let spin = fx.run(&pod, &pod.container("spin", "spin")).await?;
    for id in [&ticker, &spin] {
        fx.wait_for_state(id, ContainerState::Running).await?;
    }
    let log = fx.runtime.container_status(&ticker).await?.log_path;
    wait_for_stdout_line(&log, "tick 3").await?;
    let tids = threads(pid)?;
    ensure!(tids.len() > 1, "the sandbox runs a thread pool: {tids:?}");
    for c in ["cpu", "memory"] {
        let tasks = cgroup.ids(c, "tasks")?;
        for tid in &tids {
            // A pool thread may have ended since the listing.
            let alive = Path::new(&format!("/proc/{pid}/task/{tid}")).exists();
            assert!(
                tasks.contains(tid) || !alive,
                "thread {tid} is not in {c}:{}: {tasks:?}",
                cgroup.pod
            );
        }
    }
    for tid in threads(pid)? {
        let file = PathBuf::from(format!("/proc/{pid}/task/{tid}/cgroup"));
        if let Ok(path) = cgroup_of(&file, "cpu") {
            assert_eq!(path, cgroup.pod, "thread {tid}");
        }
    }
    // The busy guest's CPU time is charged to the pod cgroup.
    let before: u64 = cgroup.read("cpuacct", "cpuacct.usage")?.parse()?;
    poll_until("the spinning guest to use 200 ms of CPU", async || {
        let now: u64 = cgroup.read("cpuacct", "cpuacct.usage")?.parse()?;
        Ok((now - before >= 200_000_000).then_some(()))
    })
    .await?;
    ensure!(
        cgroup
            .read("memory", "memory.usage_in_bytes")?
            .parse::<u64>()?
            > 0
    );

    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    poll_until("the sandbox process to exit", async || {
        Ok((!process_exists(pid)).then_some(()))
    })
    .await?;
    for c in CONTROLLERS {
        assert_eq!(cgroup.ids(c, "cgroup.procs")?, [0u32; 0], "{c}");
    }
    let root = cgroup.root.clone();
    drop(fx);
    drop(cgroup);
    let leftovers = leftovers(&root);
    assert!(leftovers.is_empty(), "{leftovers:?}");
    Ok(())
}

#[tokio::test]
async fn on_cgroup_v2_the_sandbox_joins_the_one_directory() -> Result<()> {
    // The hybrid layout's v2 tree (no controllers bound to it here) as the mount root.
    let unified = Path::new(MOUNT_ROOT).join("unified");
    assert!(
        nix::unistd::geteuid().is_root() && unified.join("cgroup.controllers").is_file(),
        "this test needs root and a cgroup v2 tree at {}",
        unified.display()
    );
    let cgroup = TestCgroup::new("v2", &["unified"], &["unified"])?;
    let fx = Fixture::with_cgroup_mount_root(&unified)?;
    fx.import("hello")?;
    let pod = fx.start_pod(pod_config(&fx, "v2", &cgroup)).await?;
    let pid = fx.runtime.sandbox_pid(&pod.id).expect("sandbox pid");

    let proc_file = PathBuf::from(format!("/proc/{pid}/cgroup"));
    assert_eq!(cgroup_of(&proc_file, "")?, cgroup.pod);
    assert_eq!(cgroup.ids("unified", "cgroup.procs")?, [pid]);
    // The v1 hierarchies are not this mount's: left alone.
    let mine = PathBuf::from(format!("/proc/{}/cgroup", std::process::id()));
    assert_eq!(cgroup_of(&proc_file, "cpu")?, cgroup_of(&mine, "cpu")?);
    let id = fx.run(&pod, &pod.container("hello", "hello")).await?;
    assert_eq!(fx.wait_exited(&id).await?.exit_code, 0);

    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    poll_until("the sandbox process to exit", async || {
        Ok((!process_exists(pid)).then_some(()))
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn the_pod_cgroups_memory_limit_is_the_kernels() -> Result<()> {
    if !real_v1_available() {
        return Ok(());
    }
    let cgroup = TestCgroup::new("oom", &CONTROLLERS, &CONTROLLERS)?;
    // The node's pod-level limit; the container itself has none.
    cgroup.write("memory", "memory.limit_in_bytes", &(160 * MIB).to_string())?;
    let fx = Fixture::with_images(&["memhog"])?;
    let pod = fx.start_pod(pod_config(&fx, "oom", &cgroup)).await?;
    let pid = fx.runtime.sandbox_pid(&pod.id).expect("sandbox pid");
    let id = fx
        .run(
            &pod,
            &with_env(pod.container("memhog", "memhog"), &[("MIB", "400")]),
        )
        .await?;

    let status = fx.wait_exited(&id).await?;
    assert_eq!(status.exit_code, 137, "{status:#?}");
    assert!(
        status.message.contains("sandbox process exited"),
        "{status:#?}"
    );
    let stdout = lines(&log_records(&status.log_path)?, Stream::Stdout);
    assert!(
        stdout.contains(&"allocated 16 MiB".to_owned()),
        "the guest ran: {stdout:#?}"
    );
    assert!(
        !stdout.contains(&"allocated 160 MiB".to_owned()),
        "{stdout:#?}"
    );
    let oom_control = cgroup.read("memory", "memory.oom_control")?;
    assert!(
        oom_control
            .lines()
            .any(|l| l.strip_prefix("oom_kill ").is_some_and(|n| n != "0")),
        "the kernel's OOM killer ended it: {oom_control}"
    );
    assert!(!process_exists(pid));
    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    Ok(())
}

#[tokio::test]
async fn a_missing_pod_cgroup_is_an_error_and_starts_nothing() -> Result<()> {
    if !real_v1_available() {
        return Ok(());
    }
    let fx = Fixture::new()?;
    // Missing everywhere, then only in the memory hierarchy.
    let nowhere = TestCgroup::new("nowhere", &CONTROLLERS, &[])?;
    let no_memory = TestCgroup::new("no-memory", &CONTROLLERS, &["cpu", "cpuacct", "pids"])?;
    for cgroup in [&nowhere, &no_memory] {
        let err = fx
            .runtime
            .run_pod_sandbox(&pod_config(&fx, "missing", cgroup))
            .await
            .expect_err("a missing pod cgroup");
        assert!(
            matches!(&err, Error::FailedPrecondition(m)
                if m.starts_with(&format!("pod cgroup {} does not exist", cgroup.pod))),
            "{err:?}"
        );
    }
    let err = fx
        .runtime
        .run_pod_sandbox(&PodSandboxConfig {
            cgroup_parent: Some("kubepods/pod1".into()),
            ..fx.pod_config("relative")
        })
        .await
        .expect_err("a relative cgroup parent");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");

    assert!(fx.runtime.list_pod_sandboxes().await?.is_empty());
    assert_eq!(processes_mentioning(fx.path()), [0u32; 0]);
    let state = fx.path().join("sandboxes");
    assert!(
        std::fs::read_dir(&state)?.next().is_none(),
        "nothing left in {}",
        state.display()
    );
    Ok(())
}

#[tokio::test]
async fn an_oom_score_adj_the_kernel_refuses_is_kept_at_its_value() -> Result<()> {
    // No cgroup: this needs no root, only a process that lacks CAP_SYS_RESOURCE to see
    // the refusal (a process that has it gets the value).
    let fx = Fixture::with_images(&["hello"])?;
    let mine = oom_score_adj(std::process::id())?;
    let pod = fx
        .start_pod(PodSandboxConfig {
            oom_score_adj: Some(-998),
            ..fx.pod_config("lower")
        })
        .await?;
    let pid = fx.runtime.sandbox_pid(&pod.id).expect("sandbox pid");
    let got = oom_score_adj(pid)?;
    assert!(got == -998 || got == mine, "{got}, not -998 or {mine}");
    let id = fx.run(&pod, &pod.container("hello", "hello")).await?;
    assert_eq!(fx.wait_exited(&id).await?.exit_code, 0);
    fx.runtime.remove_pod_sandbox(&pod.id).await?;

    let err = fx
        .runtime
        .run_pod_sandbox(&PodSandboxConfig {
            oom_score_adj: Some(1001),
            ..fx.pod_config("out-of-range")
        })
        .await
        .expect_err("an oom_score_adj above 1000");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    Ok(())
}
