//! One interface over cgroup v1 and v2 (the kubelet's `CgroupManager`,
//! `cgroup_manager_linux.go`), picked at runtime from the mounted filesystem.
//!
//! - **Names.** A [`CgroupName`] is a list of components (`["kubepods", "burstable",
//!   "pod<uid>"]`). The [`Driver`] turns it into a path below the hierarchy's root:
//!   `cgroupfs` gives `/kubepods/burstable/pod<uid>`, `systemd` gives
//!   `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`
//!   (dashes inside a component become underscores, as the kubelet escapes them).
//! - **The systemd driver only changes names.** The node never talks to systemd (no
//!   D-Bus, no transient units): it creates and writes the slice-named directories
//!   itself through the cgroup filesystem, as the `cgroupfs` driver does. That is
//!   what lets a CRI runtime configured with `SystemdCgroup = true` find the pod's
//!   slice where it expects it.
//! - **Hierarchies.** v2 when `<mount root>/cgroup.controllers` exists (one tree,
//!   `cpu.weight`, `cpu.max`, `memory.max`, `pids.max`); otherwise v1, one tree per
//!   controller under the mount root (`cpu.shares`, `cpu.cfs_quota_us`,
//!   `cpu.cfs_period_us`, `memory.limit_in_bytes`, `pids.max`). On v1, cgroups are
//!   created in the `cpu`, `cpuacct`, `memory` and `pids` hierarchies; processes and
//!   leftovers (directories a CRI runtime made in `freezer`, `devices`, ...) are looked
//!   for in every mounted hierarchy, as the kubelet's `Pids` and `Destroy` do —
//!   the cgroup2 mount of a hybrid machine (`<mount root>/unified`) included, where
//!   runc puts every container too.
//!
//! Every call is synchronous file I/O; [`CgroupManager::destroy`] may wait up to
//! [`DESTROY_TIMEOUT`] for killed processes to go, so async callers run it on a
//! blocking thread.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::formulas::{self, CPU_PERIOD_US, Limit, ResourceConfig};
use super::{Error, Result};

/// How long [`CgroupManager::destroy`] waits for killed processes to leave and for
/// busy directories to become removable.
pub const DESTROY_TIMEOUT: Duration = Duration::from_secs(10);
/// The prefix of a pod cgroup's last component (`pod<uid>`).
pub const POD_CGROUP_PREFIX: &str = "pod";

const SYSTEMD_SUFFIX: &str = ".slice";
const PROCS: &str = "cgroup.procs";
const POLL: Duration = Duration::from_millis(10);

/// How cgroup names become paths (`cgroupDriver`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Driver {
    /// Plain paths: `/kubepods/burstable/pod<uid>`.
    #[default]
    Cgroupfs,
    /// systemd slice names, expanded into their path (names only; see the module docs).
    Systemd,
}

impl FromStr for Driver {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cgroupfs" => Ok(Self::Cgroupfs),
            "systemd" => Ok(Self::Systemd),
            other => Err(format!(
                "unknown cgroup driver {other:?} (cgroupfs or systemd)"
            )),
        }
    }
}

impl fmt::Display for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Cgroupfs => "cgroupfs",
            Self::Systemd => "systemd",
        })
    }
}

/// Which cgroup hierarchy the machine mounts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// One tree per controller.
    V1,
    /// The unified tree.
    V2,
}

/// A cgroup's name, independent of the driver: its components from the root.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CgroupName(Vec<String>);

impl CgroupName {
    /// The root of the hierarchy.
    pub fn root() -> Self {
        Self::default()
    }

    /// A name from its components.
    pub fn new<I, S>(components: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self(components.into_iter().map(Into::into).collect())
    }

    /// A name from a cgroupfs path (`ParseCgroupfsToCgroupName`): `/a/b` is `[a, b]`,
    /// `/` is the root. This is how `--cgroup-root` is read, whatever the driver.
    pub fn from_cgroupfs(path: &str) -> Self {
        Self::new(path.split('/').filter(|c| !c.is_empty()))
    }

    /// A name from a systemd slice (`ParseSystemdToCgroupName`): the last path
    /// element's dash-separated parts, underscores turned back into dashes.
    pub fn from_systemd(path: &str) -> Self {
        let base = path.rsplit('/').next().unwrap_or(path);
        let base = base.strip_suffix(SYSTEMD_SUFFIX).unwrap_or(base);
        if base.is_empty() || base == "-" {
            return Self::root();
        }
        Self::new(base.split('-').map(|part| part.replace('_', "-")))
    }

    /// This name with one more component.
    pub fn child(&self, component: impl Into<String>) -> Self {
        let mut components = self.0.clone();
        components.push(component.into());
        Self(components)
    }

    /// The components, from the root.
    pub fn components(&self) -> &[String] {
        &self.0
    }

    /// The last component (`None` for the root).
    pub fn base(&self) -> Option<&str> {
        self.0.last().map(String::as_str)
    }

    /// Whether `self` is `other` or below it.
    pub fn starts_with(&self, other: &CgroupName) -> bool {
        self.0.starts_with(&other.0)
    }

    /// Checks every component can be a directory name and survives the systemd
    /// round trip (`NewCgroupName` forbids `/` and `_`).
    pub fn validate(&self) -> Result<()> {
        for c in &self.0 {
            let reason = if c.is_empty() {
                "empty"
            } else if c.contains('/') {
                "contains '/'"
            } else if c.contains('_') {
                "contains '_', which the systemd driver could not map back"
            } else if c == "." || c == ".." {
                "is a relative path"
            } else if c.ends_with(SYSTEMD_SUFFIX) {
                "ends in .slice"
            } else {
                continue;
            };
            return Err(Error::InvalidName {
                component: c.clone(),
                reason,
            });
        }
        Ok(())
    }

    /// The cgroupfs path (`ToCgroupfs`): `/a/b`, `/` for the root.
    pub fn to_cgroupfs(&self) -> String {
        format!("/{}", self.0.join("/"))
    }

    /// The systemd slice expanded into its path (`ToSystemd`, runc's `ExpandSlice`):
    /// `[a, b-c]` is `/a.slice/a-b_c.slice`, the root is `/`.
    pub fn to_systemd(&self) -> String {
        if self.0.is_empty() {
            return "/".to_owned();
        }
        let mut path = String::new();
        let mut prefix = String::new();
        for component in &self.0 {
            prefix.push_str(&component.replace('-', "_"));
            path.push('/');
            path.push_str(&prefix);
            path.push_str(SYSTEMD_SUFFIX);
            prefix.push('-');
        }
        path
    }
}

impl fmt::Display for CgroupName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_cgroupfs())
    }
}

/// The v1 controllers cgroups are created in, and whether each must be mounted.
const V1_CONTROLLERS: [(&str, bool); 4] = [
    ("cpu", true),
    ("cpuacct", false),
    ("memory", true),
    ("pids", false),
];

/// The v2 controllers enabled down to each created cgroup.
const V2_CONTROLLERS: [&str; 3] = ["cpu", "memory", "pids"];

#[derive(Clone, Debug)]
struct V1 {
    mount_root: PathBuf,
    /// `(controller, mount)` for the mounted ones of [`V1_CONTROLLERS`].
    managed: Vec<(&'static str, PathBuf)>,
    /// Every mounted hierarchy once (co-mounts and symlinks folded), with a hybrid
    /// machine's cgroup2 mount.
    all: Vec<PathBuf>,
}

impl V1 {
    fn detect(mount_root: &Path) -> Result<Self> {
        let is_v1_mount =
            |p: &Path| p.join(PROCS).is_file() && !p.join("cgroup.controllers").exists();
        let mut managed = Vec::new();
        for (controller, required) in V1_CONTROLLERS {
            let mount = mount_root.join(controller);
            if is_v1_mount(&mount) {
                managed.push((controller, mount));
            } else if required {
                return Err(Error::MissingController {
                    controller,
                    root: mount_root.to_owned(),
                });
            }
        }
        let entries = fs::read_dir(mount_root).map_err(io_error("listing", mount_root))?;
        // A hybrid machine's cgroup2 mount (`unified`) holds no controller the node
        // sets, but runc puts each container there as well: its directories are
        // leftovers to remove with the pod's.
        let is_hybrid_v2_mount =
            |p: &Path| p.join(PROCS).is_file() && p.join("cgroup.controllers").is_file();
        let mut mounts: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| is_v1_mount(p) || is_hybrid_v2_mount(p))
            .collect();
        mounts.sort();
        let mut seen = BTreeSet::new();
        let all = mounts
            .into_iter()
            .filter(|p| seen.insert(fs::canonicalize(p).unwrap_or_else(|_| p.clone())))
            .collect();
        Ok(Self {
            mount_root: mount_root.to_owned(),
            managed,
            all,
        })
    }

    fn controller(&self, name: &str) -> Option<&Path> {
        self.managed
            .iter()
            .find(|(c, _)| *c == name)
            .map(|(_, p)| p.as_path())
    }

    fn set(&self, rel: &Path, res: &ResourceConfig) -> Result<()> {
        if let Some(cpu) = self.controller("cpu").map(|p| p.join(rel)) {
            if let Some(shares) = res.cpu_shares {
                write(&cpu.join("cpu.shares"), &shares.to_string())?;
            }
            // libcontainer's order: period, then quota; a period the kernel rejects
            // (EINVAL: old quota / new period over the parent's) is retried after
            // the quota changed.
            let mut period_pending = None;
            if let Some(period) = res.cpu_period_us {
                let file = cpu.join("cpu.cfs_period_us");
                match write(&file, &period.to_string()) {
                    Err(Error::Io { source, .. })
                        if source.raw_os_error() == Some(Errno::EINVAL as i32)
                            && res.cpu_quota.is_some() =>
                    {
                        period_pending = Some((file, period));
                    }
                    other => other?,
                }
            }
            if let Some(quota) = res.cpu_quota {
                write(&cpu.join("cpu.cfs_quota_us"), &formulas::v1_limit(quota))?;
            }
            if let Some((file, period)) = period_pending {
                write(&file, &period.to_string())?;
            }
        }
        if let (Some(memory), Some(limit)) = (self.controller("memory"), res.memory) {
            write(
                &memory.join(rel).join("memory.limit_in_bytes"),
                &formulas::v1_limit(limit),
            )?;
        }
        match (self.controller("pids"), res.pids) {
            (Some(pids), Some(limit)) => {
                write(&pids.join(rel).join("pids.max"), &formulas::v2_limit(limit))?
            }
            // A pids limit needs the pids hierarchy...
            (None, Some(Limit::Value(_))) => {
                return Err(Error::MissingController {
                    controller: "pids",
                    root: self.mount_root.clone(),
                });
            }
            // ..."no limit" holds without it (libcontainer skips it too).
            _ => {}
        }
        Ok(())
    }

    fn get(&self, rel: &Path) -> Result<ResourceConfig> {
        let mut res = ResourceConfig::default();
        if let Some(cpu) = self.controller("cpu").map(|p| p.join(rel)) {
            res.cpu_shares = read_parsed(&cpu.join("cpu.shares"), |t| t.parse().ok())?;
            res.cpu_period_us = read_parsed(&cpu.join("cpu.cfs_period_us"), |t| t.parse().ok())?;
            res.cpu_quota = read_parsed(&cpu.join("cpu.cfs_quota_us"), formulas::parse_v1_limit)?;
        }
        if let Some(memory) = self.controller("memory") {
            let file = memory.join(rel).join("memory.limit_in_bytes");
            res.memory = read_parsed(&file, formulas::parse_v1_limit)?;
        }
        if let Some(pids) = self.controller("pids") {
            res.pids = read_parsed(&pids.join(rel).join("pids.max"), formulas::parse_v2_limit)?;
        }
        Ok(res)
    }
}

#[derive(Clone, Debug)]
struct V2 {
    root: PathBuf,
}

impl V2 {
    /// mkdir each level, first enabling the controllers in the parent's
    /// `cgroup.subtree_control` where the parent offers them.
    fn create(&self, rel: &Path) -> Result<()> {
        let mut dir = self.root.clone();
        for component in rel.components() {
            enable_controllers(&dir)?;
            dir.push(component);
            match fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_error("creating", &dir)(e)),
            }
        }
        Ok(())
    }

    fn set(&self, dir: &Path, res: &ResourceConfig) -> Result<()> {
        if let Some(shares) = res.cpu_shares {
            write(
                &dir.join("cpu.weight"),
                &formulas::cpu_weight(shares).to_string(),
            )?;
        }
        if let Some(quota) = res.cpu_quota {
            let period = res.cpu_period_us.unwrap_or(CPU_PERIOD_US);
            write(&dir.join("cpu.max"), &formulas::cpu_max(quota, period))?;
        }
        if let Some(limit) = res.memory {
            write(&dir.join("memory.max"), &formulas::v2_limit(limit))?;
        }
        if let Some(limit) = res.pids {
            write(&dir.join("pids.max"), &formulas::v2_limit(limit))?;
        }
        Ok(())
    }

    fn get(&self, dir: &Path) -> Result<ResourceConfig> {
        let weight: Option<u64> = read_parsed(&dir.join("cpu.weight"), |t| t.parse().ok())?;
        let cpu_max = read_parsed(&dir.join("cpu.max"), formulas::parse_cpu_max)?;
        Ok(ResourceConfig {
            cpu_shares: weight.map(formulas::cpu_shares_from_weight),
            cpu_quota: cpu_max.map(|(q, _)| q),
            cpu_period_us: cpu_max.map(|(_, p)| p),
            memory: read_parsed(&dir.join("memory.max"), formulas::parse_v2_limit)?,
            pids: read_parsed(&dir.join("pids.max"), formulas::parse_v2_limit)?,
        })
    }
}

/// Enables [`V2_CONTROLLERS`] that `dir` offers (`cgroup.controllers`) but has not
/// yet enabled for its children. Like libcontainer, a refused batch is retried one
/// controller at a time and a refusal is not an error here: a controller that stays
/// off shows up as a missing file when a value is set.
fn enable_controllers(dir: &Path) -> Result<()> {
    let offered = read_optional(&dir.join("cgroup.controllers"))?;
    let enabled = read_optional(&dir.join("cgroup.subtree_control"))?;
    let has = |list: &str, c: &str| list.split_whitespace().any(|x| x == c);
    let missing: Vec<String> = V2_CONTROLLERS
        .iter()
        .filter(|c| has(&offered, c) && !has(&enabled, c))
        .map(|c| format!("+{c}"))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let file = dir.join("cgroup.subtree_control");
    if fs::write(&file, missing.join(" ")).is_err() {
        for one in &missing {
            if let Err(e) = fs::write(&file, one) {
                // cpu and memory carry the pod's limits: without them nothing is
                // enforced, so that is an error here rather than a missing file later
                // (EBUSY: the parent holds processes, cgroup v2's "no internal
                // processes" rule). The others are optional.
                let op = match &one[1..] {
                    "cpu" => Some("enabling the cpu controller in"),
                    "memory" => Some("enabling the memory controller in"),
                    _ => None,
                };
                if let Some(op) = op {
                    return Err(Error::Io {
                        op,
                        path: file.clone(),
                        source: e,
                    });
                }
                tracing::debug!(file = %file.display(), controller = %one, error = %e, "controller not enabled");
            }
        }
    }
    Ok(())
}

#[derive(Clone, Debug)]
enum Hierarchy {
    V1(V1),
    V2(V2),
}

/// Creates, configures, lists and destroys cgroups on one machine's hierarchy.
#[derive(Clone, Debug)]
pub struct CgroupManager {
    driver: Driver,
    mount_root: PathBuf,
    hierarchy: Hierarchy,
}

impl CgroupManager {
    /// The hierarchy mounted at `mount_root` (normally `/sys/fs/cgroup`): v2 when it
    /// has `cgroup.controllers`, else v1.
    pub fn detect(mount_root: &Path, driver: Driver) -> Result<Self> {
        if mount_root.join("cgroup.controllers").is_file() {
            Ok(Self::v2(mount_root, driver))
        } else {
            Self::v1(mount_root, driver)
        }
    }

    /// The v1 hierarchies mounted under `mount_root` (`cpu` and `memory` required).
    pub fn v1(mount_root: &Path, driver: Driver) -> Result<Self> {
        Ok(Self {
            driver,
            mount_root: mount_root.to_owned(),
            hierarchy: Hierarchy::V1(V1::detect(mount_root)?),
        })
    }

    /// The v2 hierarchy mounted at `mount_root`.
    pub fn v2(mount_root: &Path, driver: Driver) -> Self {
        Self {
            driver,
            mount_root: mount_root.to_owned(),
            hierarchy: Hierarchy::V2(V2 {
                root: mount_root.to_owned(),
            }),
        }
    }

    /// v1 or v2.
    pub fn version(&self) -> Version {
        match self.hierarchy {
            Hierarchy::V1(_) => Version::V1,
            Hierarchy::V2(_) => Version::V2,
        }
    }

    /// The naming driver.
    pub fn driver(&self) -> Driver {
        self.driver
    }

    /// Where the hierarchy is mounted.
    pub fn mount_root(&self) -> &Path {
        &self.mount_root
    }

    /// The cgroup's path below a hierarchy's root, in the driver's naming
    /// (the kubelet's `CgroupManager.Name`): what CRI's `cgroup_parent` carries.
    pub fn path(&self, name: &CgroupName) -> String {
        match self.driver {
            Driver::Cgroupfs => name.to_cgroupfs(),
            Driver::Systemd => name.to_systemd(),
        }
    }

    fn rel(&self, name: &CgroupName) -> PathBuf {
        PathBuf::from(self.path(name).trim_start_matches('/'))
    }

    /// The cgroup's directories in the hierarchies it is created in.
    fn managed_dirs(&self, name: &CgroupName) -> Vec<PathBuf> {
        let rel = self.rel(name);
        match &self.hierarchy {
            Hierarchy::V1(v1) => v1.managed.iter().map(|(_, m)| m.join(&rel)).collect(),
            Hierarchy::V2(v2) => vec![v2.root.join(&rel)],
        }
    }

    /// The cgroup's directories in every hierarchy, existing or not.
    fn all_dirs(&self, name: &CgroupName) -> Vec<PathBuf> {
        let rel = self.rel(name);
        match &self.hierarchy {
            Hierarchy::V1(v1) => v1.all.iter().map(|m| m.join(&rel)).collect(),
            Hierarchy::V2(v2) => vec![v2.root.join(&rel)],
        }
    }

    /// Whether the cgroup exists in every hierarchy it is created in.
    pub fn exists(&self, name: &CgroupName) -> bool {
        self.managed_dirs(name).iter().all(|d| d.is_dir())
    }

    /// Creates the cgroup and any missing ancestors (mkdir in each v1 controller; on
    /// v2 one directory, controllers enabled on the way down). Idempotent.
    pub fn create(&self, name: &CgroupName) -> Result<()> {
        name.validate()?;
        match &self.hierarchy {
            Hierarchy::V1(_) => {
                for dir in self.managed_dirs(name) {
                    fs::create_dir_all(&dir).map_err(io_error("creating", &dir))?;
                }
                Ok(())
            }
            Hierarchy::V2(v2) => v2.create(&self.rel(name)),
        }
    }

    /// Writes the values `res` sets; leaves the others.
    pub fn set(&self, name: &CgroupName, res: &ResourceConfig) -> Result<()> {
        match &self.hierarchy {
            Hierarchy::V1(v1) => v1.set(&self.rel(name), res),
            Hierarchy::V2(v2) => v2.set(&v2.root.join(self.rel(name)), res),
        }
    }

    /// Reads the values back (v2's `cpu.weight` as shares, the kubelet's lossy way).
    /// A file that is missing reads as `None`.
    pub fn get(&self, name: &CgroupName) -> Result<ResourceConfig> {
        match &self.hierarchy {
            Hierarchy::V1(v1) => v1.get(&self.rel(name)),
            Hierarchy::V2(v2) => v2.get(&v2.root.join(self.rel(name))),
        }
    }

    /// The memory the cgroup uses now, in bytes (v1 `memory.usage_in_bytes`, v2
    /// `memory.current`); `None` when it does not exist.
    pub fn memory_usage(&self, name: &CgroupName) -> Result<Option<u64>> {
        let rel = self.rel(name);
        let file = match &self.hierarchy {
            Hierarchy::V1(v1) => match v1.managed.iter().find(|(c, _)| *c == "memory") {
                Some((_, mount)) => mount.join(&rel).join("memory.usage_in_bytes"),
                None => return Ok(None),
            },
            Hierarchy::V2(v2) => v2.root.join(&rel).join("memory.current"),
        };
        read_parsed(&file, |t| t.trim().parse().ok())
    }

    /// Moves a process into the cgroup (its `cgroup.procs` in each hierarchy it is
    /// created in).
    pub fn add_process(&self, name: &CgroupName, pid: u32) -> Result<()> {
        for dir in self.managed_dirs(name) {
            write(&dir.join(PROCS), &pid.to_string())?;
        }
        Ok(())
    }

    /// The processes in the cgroup and every cgroup below it, in any hierarchy
    /// (the kubelet's `Pids`), sorted. A cgroup that does not exist has none.
    pub fn pids(&self, name: &CgroupName) -> Result<Vec<u32>> {
        let mut pids = BTreeSet::new();
        for dir in self.all_dirs(name) {
            collect_pids(&dir, &mut pids)?;
        }
        Ok(pids.into_iter().collect())
    }

    /// The cgroups directly below `name`, in any hierarchy. With the systemd driver
    /// only slices count (a runtime's `.scope` units are containers, not cgroups
    /// this node names).
    pub fn children(&self, name: &CgroupName) -> Result<Vec<CgroupName>> {
        let mut children = BTreeSet::new();
        for dir in self.all_dirs(name) {
            let entries = match fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_error("listing", &dir)(e)),
            };
            for entry in entries {
                let entry = entry.map_err(io_error("listing", &dir))?;
                if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                let file_name = entry.file_name().to_string_lossy().into_owned();
                let child = match self.driver {
                    Driver::Cgroupfs => name.child(file_name),
                    Driver::Systemd if file_name.ends_with(SYSTEMD_SUFFIX) => {
                        CgroupName::from_systemd(&file_name)
                    }
                    Driver::Systemd => continue,
                };
                if child.components().len() == name.components().len() + 1
                    && child.starts_with(name)
                {
                    children.insert(child);
                }
            }
        }
        Ok(children.into_iter().collect())
    }

    /// The pod cgroups (`pod<uid>`) directly below any of `parents`, by pod UID
    /// (the kubelet's `GetAllPodsFromCgroups`), for orphan cleanup.
    pub fn pod_cgroups(&self, parents: &[CgroupName]) -> Result<BTreeMap<String, CgroupName>> {
        let mut pods = BTreeMap::new();
        for parent in parents {
            for child in self.children(parent)? {
                let uid = child
                    .base()
                    .and_then(|b| b.strip_prefix(POD_CGROUP_PREFIX))
                    .filter(|uid| !uid.is_empty())
                    .map(str::to_owned);
                if let Some(uid) = uid {
                    pods.insert(uid, child);
                }
            }
        }
        Ok(pods)
    }

    /// Removes the cgroup and everything below it in every hierarchy: first every
    /// process in it gets SIGKILL (again, until none is left, as the kubelet's
    /// `tryKillingCgroupProcesses` does), then the directories go, children first.
    /// A cgroup that does not exist is fine. Refuses to kill this process itself.
    pub fn destroy(&self, name: &CgroupName) -> Result<()> {
        let deadline = Instant::now() + DESTROY_TIMEOUT;
        self.kill_all(name, deadline)?;
        for dir in self.all_dirs(name) {
            remove_tree(&dir, deadline)?;
        }
        Ok(())
    }

    fn kill_all(&self, name: &CgroupName, deadline: Instant) -> Result<()> {
        let own = std::process::id();
        loop {
            let pids = self.pids(name)?;
            if pids.is_empty() {
                return Ok(());
            }
            if pids.contains(&own) {
                return Err(Error::OwnProcess {
                    cgroup: self.path(name),
                    pid: own,
                });
            }
            if Instant::now() >= deadline {
                return Err(Error::StillRunning {
                    cgroup: self.path(name),
                    pids,
                    waited: DESTROY_TIMEOUT,
                });
            }
            for pid in pids {
                let Ok(raw) = i32::try_from(pid) else {
                    continue;
                };
                match kill(Pid::from_raw(raw), Signal::SIGKILL) {
                    Ok(()) | Err(Errno::ESRCH) => {}
                    Err(source) => {
                        return Err(Error::Kill {
                            cgroup: self.path(name),
                            pid,
                            source,
                        });
                    }
                }
            }
            std::thread::sleep(POLL);
        }
    }
}

/// Adds the pids of `dir` and every directory below it.
fn collect_pids(dir: &Path, pids: &mut BTreeSet<u32>) -> Result<()> {
    let file = dir.join(PROCS);
    let text = match fs::read_to_string(&file) {
        Ok(text) => text,
        // Not there (the cgroup is gone in this hierarchy): nothing in it; a
        // directory without the file still has its subdirectories looked at.
        Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(io_error("reading", &file)(e)),
    };
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let pid: u32 = line.parse().map_err(|_| Error::Parse {
            path: file.clone(),
            content: line.to_owned(),
        })?;
        // 0: a process outside this pid namespace.
        if pid != 0 {
            pids.insert(pid);
        }
    }
    for sub in subdirs(dir)? {
        collect_pids(&sub, pids)?;
    }
    Ok(())
}

/// The directories directly below `dir` (none if `dir` is gone).
fn subdirs(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_error("listing", dir)(e)),
    };
    let mut dirs = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_error("listing", dir))?;
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            dirs.push(entry.path());
        }
    }
    Ok(dirs)
}

/// rmdir `dir` after everything below it; a cgroup still busy (EBUSY: its last
/// processes are exiting) is retried until `deadline`.
fn remove_tree(dir: &Path, deadline: Instant) -> Result<()> {
    for sub in subdirs(dir)? {
        remove_tree(&sub, deadline)?;
    }
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e)
                if e.raw_os_error() == Some(Errno::EBUSY as i32) && Instant::now() < deadline =>
            {
                std::thread::sleep(POLL)
            }
            Err(e) => return Err(io_error("removing", dir)(e)),
        }
    }
}

fn io_error<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> Error + 'a {
    move |source| Error::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

fn write(path: &Path, value: &str) -> Result<()> {
    fs::write(path, value).map_err(io_error("writing", path))
}

/// A file's content, or "" if it does not exist.
fn read_optional(path: &Path) -> Result<String> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(text),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(io_error("reading", path)(e)),
    }
}

/// A file's value through `parse`; `None` if the file does not exist.
fn read_parsed<T>(path: &Path, parse: impl Fn(&str) -> Option<T>) -> Result<Option<T>> {
    let text = match fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error("reading", path)(e)),
    };
    parse(text.trim()).map(Some).ok_or_else(|| Error::Parse {
        path: path.to_owned(),
        content: text.trim().to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::tests::{RootGuard, sleeper, unique_root_component};

    #[test]
    fn cgroup_names_table() {
        // (components, cgroupfs path, systemd path); the third row is the kubelet's
        // own ToSystemd example.
        let cases: [(&[&str], &str, &str); 5] = [
            (&[], "/", "/"),
            (&["kubepods"], "/kubepods", "/kubepods.slice"),
            (
                &["kubepods", "burstable"],
                "/kubepods/burstable",
                "/kubepods.slice/kubepods-burstable.slice",
            ),
            (
                &["kubepods", "burstable", "pod1234-abcd-5678-efgh"],
                "/kubepods/burstable/pod1234-abcd-5678-efgh",
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234_abcd_5678_efgh.slice",
            ),
            (
                &["wasmlet-test-7-ab", "kubepods"],
                "/wasmlet-test-7-ab/kubepods",
                "/wasmlet_test_7_ab.slice/wasmlet_test_7_ab-kubepods.slice",
            ),
        ];
        for (components, cgroupfs, systemd) in cases {
            let name = CgroupName::new(components.iter().copied());
            assert_eq!(name.to_cgroupfs(), cgroupfs);
            assert_eq!(name.to_systemd(), systemd);
            assert_eq!(CgroupName::from_cgroupfs(cgroupfs), name, "{cgroupfs}");
            assert_eq!(CgroupName::from_systemd(systemd), name, "{systemd}");
            name.validate().unwrap();
        }
        // --cgroup-root is read as a cgroupfs path whatever the driver.
        assert_eq!(
            CgroupName::from_cgroupfs("/custom/root/").child("kubepods"),
            CgroupName::new(["custom", "root", "kubepods"])
        );
        assert_eq!(CgroupName::from_cgroupfs(""), CgroupName::root());
        assert_eq!(CgroupName::from_systemd("-.slice"), CgroupName::root());
        for bad in ["a_b", "", "..", "x.slice"] {
            assert!(CgroupName::new([bad]).validate().is_err(), "{bad:?}");
        }
        assert_eq!("systemd".parse::<Driver>(), Ok(Driver::Systemd));
        assert_eq!("cgroupfs".parse::<Driver>(), Ok(Driver::Cgroupfs));
        assert!("docker".parse::<Driver>().is_err());
    }

    /// The v2 backend's file layout, against a scratch directory made to look like a
    /// cgroup2 mount (`cgroup.controllers` and `cgroup.subtree_control` files at its
    /// root). It is a plain directory, so the kernel's side is not there: creating a
    /// cgroup makes no interface files, and the files written here are regular ones.
    /// What it shows is which files the backend writes, with what content, and that
    /// it reads them back. The real cgroup2 mount is exercised by
    /// `v2_backend_on_the_unified_mount`.
    #[test]
    fn v2_file_layout_in_a_scratch_directory() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::write(
            root.join("cgroup.controllers"),
            "cpuset cpu io memory hugetlb pids rdma\n",
        )
        .unwrap();
        fs::write(root.join("cgroup.subtree_control"), "").unwrap();
        fs::write(root.join(PROCS), "").unwrap();

        for driver in [Driver::Cgroupfs, Driver::Systemd] {
            let cgroups = CgroupManager::detect(root, driver).unwrap();
            assert_eq!(cgroups.version(), Version::V2);
            let pod = CgroupName::new(["kubepods", "burstable", "pod1234-abcd"]);
            cgroups.create(&pod).unwrap();
            assert!(cgroups.exists(&pod));
            let rel = match driver {
                Driver::Cgroupfs => "kubepods/burstable/pod1234-abcd",
                Driver::Systemd => {
                    "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234_abcd.slice"
                }
            };
            let pod_dir = root.join(rel);
            assert!(pod_dir.is_dir(), "{}", pod_dir.display());
            assert_eq!(
                fs::read_to_string(root.join("cgroup.subtree_control")).unwrap(),
                "+cpu +memory +pids",
                "controllers enabled at the root for its children"
            );

            let res = ResourceConfig {
                cpu_shares: Some(1024),
                cpu_quota: Some(Limit::Value(50_000)),
                cpu_period_us: Some(100_000),
                memory: Some(Limit::Value(64 << 20)),
                pids: Some(Limit::Max),
            };
            cgroups.set(&pod, &res).unwrap();
            let file = |f: &str| fs::read_to_string(pod_dir.join(f)).unwrap();
            assert_eq!(file("cpu.weight"), "39");
            assert_eq!(file("cpu.max"), "50000 100000");
            assert_eq!(file("memory.max"), "67108864");
            assert_eq!(file("pids.max"), "max");
            let back = cgroups.get(&pod).unwrap();
            assert_eq!(
                back,
                ResourceConfig {
                    cpu_shares: Some(998), // weight 39, read back the kubelet's way
                    ..res
                }
            );

            cgroups
                .set(
                    &pod,
                    &ResourceConfig {
                        cpu_quota: Some(Limit::Max),
                        memory: Some(Limit::Max),
                        ..Default::default()
                    },
                )
                .unwrap();
            assert_eq!(file("cpu.max"), "max 100000");
            assert_eq!(file("memory.max"), "max");

            cgroups.add_process(&pod, 4242).unwrap();
            assert_eq!(file(PROCS), "4242");
            assert_eq!(cgroups.pids(&pod).unwrap(), [4242]);
            assert_eq!(
                cgroups.pids(&CgroupName::new(["kubepods"])).unwrap(),
                [4242],
                "pids are listed recursively"
            );

            let burstable = CgroupName::new(["kubepods", "burstable"]);
            assert_eq!(
                cgroups.children(&burstable).unwrap(),
                std::slice::from_ref(&pod)
            );
            let pods = cgroups.pod_cgroups(&[burstable]).unwrap();
            assert_eq!(
                pods,
                BTreeMap::from([("1234-abcd".to_owned(), pod.clone())])
            );
            assert!(
                cgroups
                    .get(&CgroupName::new(["kubepods", "nowhere"]))
                    .unwrap()
                    == ResourceConfig::default(),
                "missing files read as unset"
            );
        }
    }

    fn is_cgroup2_mount(path: &Path) -> bool {
        nix::sys::statfs::statfs(path)
            .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
    }

    /// The v2 backend on the machine's real cgroup2 mount. On these hybrid machines
    /// that is `/sys/fs/cgroup/unified`, with every controller bound to v1, so only
    /// mkdir, `cgroup.procs` and rmdir (with the kill) can be exercised there.
    #[test]
    fn v2_backend_on_the_unified_mount() {
        let unified = Path::new("/sys/fs/cgroup/unified");
        if !is_cgroup2_mount(unified) || !nix::unistd::geteuid().is_root() {
            eprintln!(
                "skipped: {} is not a writable cgroup2 mount",
                unified.display()
            );
            return;
        }
        let cgroups = CgroupManager::detect(unified, Driver::Cgroupfs).unwrap();
        assert_eq!(cgroups.version(), Version::V2);
        let root = CgroupName::new([unique_root_component()]);
        let pod = root.child("kubepods").child("pod-unified");
        let _guard = RootGuard {
            cgroups: cgroups.clone(),
            root: root.clone(),
        };

        cgroups.create(&pod).unwrap();
        assert!(unified.join(cgroups.rel(&pod)).is_dir());
        let mut child = sleeper();
        cgroups.add_process(&pod, child.0.id()).unwrap();
        assert_eq!(cgroups.pids(&pod).unwrap(), [child.0.id()]);
        let own = fs::read_to_string(format!("/proc/{}/cgroup", child.0.id())).unwrap();
        assert!(
            own.lines()
                .any(|l| l == format!("0::{}", pod.to_cgroupfs())),
            "{own}"
        );

        cgroups.destroy(&root).unwrap();
        let status = child.0.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
        assert!(!unified.join(cgroups.rel(&root)).exists());
    }
}
