//! Tearing a run down to nothing, and checking that nothing is left.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use nix::mount::{MntFlags, umount2};
use nix::sys::signal::{Signal, kill as send};
use nix::unistd::Pid;

use super::CRI_NAMESPACE;

/// How long containerd gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// How long one `ctr` call may take during teardown.
const TEARDOWN_CTR_TIMEOUT: Duration = Duration::from_secs(20);
/// Where libcni caches ADD results (`<network>-<container id>-<ifname>`).
const CNI_RESULTS_DIR: &str = "/var/lib/cni/results";
/// The loopback network the CRI plugin adds in front of the configured one.
const CNI_LOOPBACK_NETWORK: &str = "cni-loopback";
/// The runc shim of containerd 1.6 puts its sockets here, whatever the state dir.
const SHIM_SOCKET_DIR: &str = "/run/containerd/s";
/// Where `containerd-shim-wasmlet-v1` keeps its sandbox processes' sockets.
const WASM_SHIM_RUN_DIR: &str = "/run/containerd-wasmlet";

/// What one run puts on the machine, named so that it can be found again
/// from the run directory alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Footprint {
    /// `wl-<pid>-<n>`; also the CNI network name.
    pub prefix: String,
    /// The run directory; everything containerd writes is below it.
    pub dir: PathBuf,
    /// containerd's socket (in `dir`).
    pub socket: PathBuf,
    /// The CNI bridge.
    pub bridge: String,
}

impl Footprint {
    /// The footprint of the run directory `dir` (`<parent>/wl-<pid>-<n>.XXXXXX`).
    pub fn for_dir(dir: &Path) -> Option<Self> {
        let name = dir.file_name()?.to_str()?;
        let (prefix, _) = name.split_once('.')?;
        let (pid, n) = prefix.strip_prefix("wl-")?.split_once('-')?;
        pid.parse::<u32>().ok()?;
        n.parse::<u32>().ok()?;
        Some(Footprint {
            prefix: prefix.to_string(),
            dir: dir.to_path_buf(),
            socket: dir.join("c.sock"),
            bridge: bridge_name(prefix),
        })
    }

    /// Tear the run down from its footprint alone — for a run whose handle
    /// was never dropped (its process died, or a test leaked it on purpose).
    /// containerd, if it still runs, is killed by its command line.
    pub fn remove(&self) -> anyhow::Result<()> {
        let problems = teardown(self, None);
        if problems.is_empty() {
            Ok(())
        } else {
            anyhow::bail!("tearing down {}: {}", self.prefix, problems.join("; "))
        }
    }

    /// The pid of the process that made the run.
    pub fn owner_pid(&self) -> Option<u32> {
        self.prefix
            .strip_prefix("wl-")?
            .split('-')
            .next()?
            .parse()
            .ok()
    }

    /// Everything of the run still on the machine: the directory, mounts
    /// below it, processes whose command line names it (containerd, shims,
    /// runc), the bridge and libcni's cached results for the network.
    /// Empty after a clean teardown. (What can only be attributed to the run
    /// while its directory exists — cgroups, `cni-loopback` results, shim
    /// sockets — is checked by the teardown itself, which reports it as an
    /// error of [`super::Containerd::stop`].)
    pub fn leftovers(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.dir.exists() {
            out.push(format!("directory {}", self.dir.display()));
        }
        for m in mounts_under(&self.dir) {
            out.push(format!("mount {}", m.display()));
        }
        for (pid, cmdline) in processes_naming(&self.dir) {
            out.push(format!("process {pid}: {cmdline}"));
        }
        if link_exists(&self.bridge) {
            out.push(format!("link {}", self.bridge));
        }
        for f in cni_cache_files(&self.prefix) {
            out.push(format!("CNI cache {}", f.display()));
        }
        out
    }
}

/// The bridge of run `prefix`: the prefix itself when it fits `IFNAMSIZ`.
pub(super) fn bridge_name(prefix: &str) -> String {
    if prefix.len() <= 15 {
        prefix.to_string()
    } else {
        let digest = crate::images::sha256_digest(prefix.as_bytes());
        format!("wl-{}", &digest["sha256:".len()..][..12])
    }
}

/// Remove everything `fp` names; `child` is containerd if we started it.
/// Returns what could not be removed.
pub(super) fn teardown(fp: &Footprint, child: Option<Child>) -> Vec<String> {
    let mut problems = Vec::new();

    // 0. What the run made, read before containerd removes any of it.
    let bundles = bundles(&fp.dir.join("state"));
    let sandbox_ids = sandbox_ids(fp);

    // 1. Tasks and containers, while containerd still answers. Pods a test
    // removed through CRI are already gone; this is for the ones it didn't.
    let mut child = child;
    let alive = match child.as_mut() {
        Some(c) => matches!(c.try_wait(), Ok(None)),
        // Someone else's (or nobody's): ask it.
        None => {
            fp.socket.exists()
                && super::ctr(&fp.socket, ["version"], Duration::from_secs(5)).is_ok()
        }
    };
    if alive && let Err(e) = remove_k8s_objects(&fp.socket) {
        problems.push(format!("removing k8s.io tasks and containers: {e:#}"));
    }

    // 2. containerd itself.
    if let Some(child) = child
        && let Err(e) = stop_child(child)
    {
        problems.push(format!("stopping containerd: {e:#}"));
    }

    // 3. containerd (if not ours), shims and runc processes of this run.
    kill_processes_naming(&fp.dir);

    // 4. Container processes, by their cgroups, then the cgroups.
    for bundle in &bundles {
        if let Some(path) = &bundle.cgroups_path
            && let Err(e) = remove_cgroup(path)
        {
            problems.push(format!("cgroup {path}: {e:#}"));
        }
    }

    // 5. Sandbox network namespaces in the usual place (with
    // `netns_mounts_under_state_dir` they are in the run directory and go
    // with the mounts below; containers name theirs as `/proc/<pid>/ns/net`).
    for bundle in &bundles {
        if let Some(netns) = &bundle.netns
            && (netns.starts_with("/run/netns/") || netns.starts_with("/var/run/netns/"))
            && netns.exists()
        {
            let _ = umount2(netns, MntFlags::MNT_DETACH);
            if let Err(e) = std::fs::remove_file(netns) {
                problems.push(format!("netns {}: {e}", netns.display()));
            }
        }
    }

    // 6. Mounts under the run directory: rootfs overlays, /dev/shm tmpfs,
    // netns bind mounts.
    if let Err(e) = unmount_all_under(&fp.dir) {
        problems.push(e);
    }

    // 7. The bridge and the veths still attached to it.
    delete_bridge(&fp.bridge);
    if link_exists(&fp.bridge) {
        problems.push(format!("link {} is still there", fp.bridge));
    }

    // 8. Files outside the run directory: libcni's cache (our network's
    // results, and the CRI plugin's `cni-loopback` network's for our
    // sandboxes), shim sockets.
    for f in cni_cache_files(&fp.prefix) {
        let _ = std::fs::remove_file(f);
    }
    for id in &sandbox_ids {
        let f = Path::new(CNI_RESULTS_DIR).join(format!("{CNI_LOOPBACK_NETWORK}-{id}-lo"));
        if f.exists()
            && let Err(e) = std::fs::remove_file(&f)
        {
            problems.push(format!("removing {}: {e}", f.display()));
        }
    }
    for bundle in &bundles {
        if let Some(sock) = &bundle.shim_socket
            && sock.starts_with(SHIM_SOCKET_DIR)
            && sock.exists()
            && let Err(e) = std::fs::remove_file(sock)
        {
            problems.push(format!("removing shim socket {}: {e}", sock.display()));
        }
        // The Wasm shim's sandbox directory, named by its socket's first 16 characters.
        if let Some(name) = bundle
            .shim_socket
            .as_ref()
            .and_then(|s| s.file_name()?.to_str())
            && name.len() >= 16
        {
            let dir = Path::new(WASM_SHIM_RUN_DIR).join(&name[..16]);
            if dir.exists()
                && let Err(e) = std::fs::remove_dir_all(&dir)
            {
                problems.push(format!("removing {}: {e}", dir.display()));
            }
        }
    }

    // 9. The directory.
    if fp.dir.exists()
        && let Err(e) = std::fs::remove_dir_all(&fp.dir)
    {
        problems.push(format!("removing {}: {e}", fp.dir.display()));
    }

    // 10. Directories every containerd shares, once no containerd runs.
    prune_shared();
    problems
}

/// Remove the empty directories containerd, runc and libcni create outside
/// any run directory — if no containerd (or shim) is running on the
/// machine; `rmdir` leaves non-empty ones alone.
fn prune_shared() {
    // By executable, not `comm`: a test binary of this crate is named
    // `containerd-<hash>` too.
    let me = std::process::id();
    let running = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me && !is_gone(*pid))
        .any(|pid| {
            std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| {
                exe.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n == "containerd" || n.starts_with("containerd-shim"))
            })
        });
    if running {
        return;
    }
    for cgroup in cgroup_mounts() {
        let _ = std::fs::remove_dir(cgroup.join(CRI_NAMESPACE));
    }
    for dir in [
        SHIM_SOCKET_DIR,
        "/run/containerd",
        CNI_RESULTS_DIR,
        "/var/lib/cni",
    ] {
        let _ = std::fs::remove_dir(dir);
    }
}

/// Sandbox ids the CRI plugin keeps directories for.
fn sandbox_ids(fp: &Footprint) -> Vec<String> {
    let mut ids: Vec<String> = ["root", "state"]
        .iter()
        .flat_map(|d| {
            std::fs::read_dir(
                fp.dir
                    .join(d)
                    .join("io.containerd.grpc.v1.cri")
                    .join("sandboxes"),
            )
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(String::from))
        })
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

/// Tear down runs in `parent` whose process is gone (it was killed before it
/// could drop its handle).
pub(super) fn sweep_stale(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let Some(fp) = Footprint::for_dir(&entry.path()) else {
            continue;
        };
        let Some(pid) = fp.owner_pid() else { continue };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let problems = teardown(&fp, None);
        for p in problems {
            eprintln!("wasmlet-testkit: sweeping stale run {}: {p}", fp.prefix);
        }
    }
}

pub(super) fn remove_dir(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
}

fn remove_k8s_objects(socket: &Path) -> anyhow::Result<()> {
    let ctr = |args: &[&str]| {
        let mut all = vec!["--namespace", CRI_NAMESPACE];
        all.extend_from_slice(args);
        super::ctr(socket, all, TEARDOWN_CTR_TIMEOUT)
    };
    let tasks = ctr(&["tasks", "ls", "--quiet"])?;
    for id in tasks.split_whitespace() {
        // `delete --force` SIGKILLs the task, waits for it and deletes it.
        let _ = ctr(&["tasks", "delete", "--force", id]);
    }
    let containers = ctr(&["containers", "ls", "--quiet"])?;
    let ids: Vec<&str> = containers.split_whitespace().collect();
    if !ids.is_empty() {
        let mut args = vec!["containers", "delete"];
        args.extend(ids);
        ctr(&args)?;
    }
    Ok(())
}

pub(super) fn stop_child(mut child: Child) -> anyhow::Result<()> {
    if child.try_wait()?.is_some() {
        return Ok(());
    }
    let pid = Pid::from_raw(child.id() as i32);
    let _ = send(pid, Signal::SIGTERM);
    let deadline = Instant::now() + STOP_GRACE;
    while Instant::now() < deadline {
        if child.try_wait()?.is_some() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = send(pid, Signal::SIGKILL);
    child.wait()?;
    anyhow::bail!("containerd ignored SIGTERM for {STOP_GRACE:?}; killed")
}

/// SIGKILL `pid`, ignoring errors.
pub(super) fn kill(pid: u32) {
    let _ = send(Pid::from_raw(pid as i32), Signal::SIGKILL);
}

/// What a bundle (`<state>/io.containerd.runtime.v2.task/<ns>/<id>/`) tells.
#[derive(Debug, Default)]
struct Bundle {
    cgroups_path: Option<String>,
    netns: Option<PathBuf>,
    shim_socket: Option<PathBuf>,
}

fn bundles(state: &Path) -> Vec<Bundle> {
    let mut out = Vec::new();
    let Ok(namespaces) = std::fs::read_dir(state.join("io.containerd.runtime.v2.task")) else {
        return out;
    };
    for ns in namespaces.flatten() {
        let Ok(ids) = std::fs::read_dir(ns.path()) else {
            continue;
        };
        for id in ids.flatten() {
            let dir = id.path();
            let mut bundle = Bundle::default();
            if let Ok(config) = std::fs::read(dir.join("config.json"))
                && let Ok(spec) = serde_json::from_slice::<serde_json::Value>(&config)
            {
                let linux = &spec["linux"];
                bundle.cgroups_path = linux["cgroupsPath"]
                    .as_str()
                    .filter(|p| !p.is_empty())
                    .map(String::from);
                bundle.netns = linux["namespaces"].as_array().and_then(|nss| {
                    nss.iter()
                        .find(|ns| ns["type"] == "network")
                        .and_then(|ns| ns["path"].as_str())
                        .filter(|p| !p.is_empty())
                        .map(PathBuf::from)
                });
            }
            if let Ok(address) = std::fs::read_to_string(dir.join("address")) {
                let address = address.trim();
                let path = address.strip_prefix("unix://").unwrap_or(address);
                if !path.is_empty() {
                    bundle.shim_socket = Some(PathBuf::from(path));
                }
            }
            out.push(bundle);
        }
    }
    out
}

/// `(pid, command line)` of every other process whose command line contains `dir`.
fn processes_naming(dir: &Path) -> Vec<(u32, String)> {
    let needle = dir.to_string_lossy().into_owned();
    let me = std::process::id();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me)
        .filter_map(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
            cmdline
                .contains(&needle)
                .then(|| (pid, cmdline.trim().to_string()))
        })
        .collect()
}

/// SIGKILL containerd, shims, runc and ctr processes naming `dir`; wait for them.
fn kill_processes_naming(dir: &Path) {
    let ours = |cmdline: &str| {
        let argv0 = cmdline.split(' ').next().unwrap_or("");
        let name = argv0.rsplit('/').next().unwrap_or(argv0);
        name.starts_with("containerd") || name == "runc" || name == "ctr"
    };
    let victims: Vec<u32> = processes_naming(dir)
        .into_iter()
        .filter(|(_, c)| ours(c))
        .map(|(pid, _)| pid)
        .collect();
    for pid in &victims {
        kill(*pid);
    }
    wait_gone(&victims, Duration::from_secs(5));
}

/// Whether `pid` is gone or a zombie.
fn is_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
    }
}

fn wait_gone(pids: &[u32], timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if pids.iter().all(|p| is_gone(*p)) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Mount points of cgroup hierarchies (v1 and v2).
pub(crate) fn cgroup_mounts() -> Vec<PathBuf> {
    mountinfo()
        .into_iter()
        .filter(|(_, fstype)| fstype == "cgroup" || fstype == "cgroup2")
        .map(|(mount, _)| mount)
        .collect()
}

/// Kill the processes in cgroup `path` (relative to each hierarchy) and
/// remove it from every hierarchy.
pub(crate) fn remove_cgroup(path: &str) -> anyhow::Result<()> {
    let rel = path.trim_start_matches('/');
    if rel.is_empty() || rel.contains("..") {
        anyhow::bail!("refusing cgroup path {path:?}");
    }
    let dirs: Vec<PathBuf> = cgroup_mounts()
        .into_iter()
        .map(|m| m.join(rel))
        .filter(|d| d.is_dir())
        .collect();
    if dirs.is_empty() {
        return Ok(());
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut pids = Vec::new();
        for d in &dirs {
            // A frozen process cannot die.
            let _ = std::fs::write(d.join("freezer.state"), "THAWED");
            let _ = std::fs::write(d.join("cgroup.freeze"), "0");
            if let Ok(procs) = std::fs::read_to_string(d.join("cgroup.procs")) {
                pids.extend(
                    procs
                        .split_whitespace()
                        .filter_map(|p| p.parse::<u32>().ok()),
                );
            }
        }
        pids.retain(|p| !is_gone(*p));
        if pids.is_empty() {
            break;
        }
        for pid in &pids {
            kill(*pid);
        }
        if Instant::now() > deadline {
            anyhow::bail!("processes {pids:?} survive SIGKILL");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut last = None;
    for d in &dirs {
        // rmdir fails with EBUSY until the kernel has released the last task.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match std::fs::remove_dir(d) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(e) if Instant::now() > deadline => {
                    last = Some(format!("rmdir {}: {e}", d.display()));
                    break;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
    match last {
        Some(e) => anyhow::bail!(e),
        None => Ok(()),
    }
}

/// Every mount point in our mount namespace.
pub fn mount_points() -> Vec<PathBuf> {
    mountinfo().into_iter().map(|(mount, _)| mount).collect()
}

/// `(mount point, fstype)` of every mount in our mount namespace.
fn mountinfo() -> Vec<(PathBuf, String)> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount = left.split(' ').nth(4)?;
            let fstype = right.split(' ').next()?;
            Some((PathBuf::from(unescape_mount(mount)), fstype.to_string()))
        })
        .collect()
}

/// Undo mountinfo's octal escapes (`\040` for space and so on).
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Mount points at or below `dir`, deepest first.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let mut mounts: Vec<PathBuf> = mountinfo()
        .into_iter()
        .map(|(m, _)| m)
        .filter(|m| m.starts_with(dir))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    mounts.dedup();
    mounts
}

/// Lazily unmounts every mount at or below `dir`, deepest first.
pub(crate) fn unmount_all_under(dir: &Path) -> Result<(), String> {
    for _ in 0..10 {
        let mounts = mounts_under(dir);
        if mounts.is_empty() {
            return Ok(());
        }
        for m in mounts {
            let _ = umount2(&m, MntFlags::MNT_DETACH);
        }
    }
    let left = mounts_under(dir);
    if left.is_empty() {
        Ok(())
    } else {
        Err(format!("mounts survive lazy unmount: {left:?}"))
    }
}

fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// Delete the bridge `name` and every interface enslaved to it.
pub(super) fn delete_bridge(name: &str) {
    if !link_exists(name) {
        return;
    }
    let ports = Path::new("/sys/class/net").join(name).join("brif");
    if let Ok(ports) = std::fs::read_dir(ports) {
        for port in ports.flatten() {
            ip_link_del(&port.file_name().to_string_lossy());
        }
    }
    ip_link_del(name);
}

fn ip_link_del(name: &str) {
    let _ = Command::new("ip")
        .args(["link", "del", name])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
}

fn cni_cache_files(network: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(CNI_RESULTS_DIR) else {
        return Vec::new();
    };
    let prefix = format!("{network}-");
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect()
}

/// Kill every process under the cgroup `root` (relative to each hierarchy) and
/// remove it with all its descendants, deepest first.
pub fn remove_cgroup_tree(root: &str) -> anyhow::Result<()> {
    let rel = root.trim_start_matches('/');
    if rel.is_empty() || rel.contains("..") {
        anyhow::bail!("refusing cgroup path {root:?}");
    }
    let mut paths = std::collections::BTreeSet::new();
    for mount in cgroup_mounts() {
        let top = mount.join(rel);
        let mut stack = vec![top.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            if let Ok(sub) = dir.strip_prefix(&mount) {
                paths.insert(format!("/{}", sub.display()));
            }
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
    }
    let mut paths: Vec<String> = paths.into_iter().collect();
    paths.sort_by_key(|p| std::cmp::Reverse(p.matches('/').count()));
    let mut problems = Vec::new();
    for p in &paths {
        if let Err(e) = remove_cgroup(p) {
            problems.push(format!("{e:#}"));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        anyhow::bail!("{}", problems.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn footprints_come_from_directory_names() {
        let cases = [
            ("/tmp/wl-123-0.abcDEF", Some(("wl-123-0", "wl-123-0", 123))),
            (
                "/tmp/wl-4194304-9999.x",
                Some(("wl-4194304-9999", "wl-4194304-9999", 4194304)),
            ),
            ("/tmp/wl-123-0", None),
            ("/tmp/wl-abc-0.x", None),
            ("/tmp/other-1-2.x", None),
        ];
        for (dir, want) in cases {
            let got = Footprint::for_dir(Path::new(dir));
            match (got, want) {
                (None, None) => {}
                (Some(fp), Some((prefix, bridge, pid))) => {
                    assert_eq!(fp.prefix, prefix, "{dir}");
                    assert_eq!(fp.bridge, bridge, "{dir}");
                    assert_eq!(fp.owner_pid(), Some(pid), "{dir}");
                    assert_eq!(fp.socket, Path::new(dir).join("c.sock"));
                }
                (got, want) => panic!("{dir}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn bridge_names_fit_ifnamsiz() {
        assert_eq!(bridge_name("wl-1-0"), "wl-1-0");
        let long = bridge_name("wl-4194304-12345");
        assert!(long.len() <= 15, "{long}");
        assert_ne!(long, bridge_name("wl-4194304-12346"));
    }

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape_mount(r"/a\040b"), "/a b");
        assert_eq!(unescape_mount(r"/a\134b"), r"/a\b");
        assert_eq!(unescape_mount(r"/plain"), "/plain");
        assert_eq!(unescape_mount(r"/trailing\04"), r"/trailing\04");
    }

    #[test]
    fn mountinfo_parses() {
        let mounts = mountinfo();
        assert!(
            mounts.iter().any(|(m, _)| m == Path::new("/")),
            "{mounts:?}"
        );
    }
}
