//! The node's container manager: the cgroup hierarchy pods run in (the kubelet's
//! `pkg/kubelet/cm`: QoS, pod and node-allocatable cgroups).
//!
//! ```text
//! <cgroup root>/kubepods                 node allocatable: shares and memory limit
//!               ├── pod<uid>             Guaranteed pods
//!               ├── burstable            shares = Σ burstable pods' CPU requests
//!               │   └── pod<uid>
//!               └── besteffort           shares 2
//!                   └── pod<uid>
//! ```
//!
//! Start with [`ContainerManager`]: [`ContainerManager::start`] makes the QoS tree,
//! [`ContainerManager::ensure_pod`] a pod's cgroup with its values,
//! [`ContainerManager::cgroup_parent`] is what CRI pods get as `cgroup_parent`,
//! [`ContainerManager::add_process`] puts a Wasm sandbox process in it,
//! [`ContainerManager::remove_pod`] and [`ContainerManager::cleanup_orphans`] take
//! pod cgroups down. The arithmetic is in [`formulas`], the file system in
//! [`cgroup`] (v1 and v2, cgroupfs and systemd naming).
//!
//! Everything here is synchronous: file writes take microseconds, but removing a pod
//! cgroup waits for its killed processes, so async callers use `spawn_blocking`.

pub mod cgroup;
pub mod cpumanager;
pub mod cpuset;
pub mod cputopology;
pub mod devicemanager;
pub mod formulas;
pub mod spew;
pub mod topologymanager;

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};

pub use cgroup::{CgroupManager, CgroupName, Driver, Version};
pub use formulas::{Limit, NodeResources, PodCgroupSettings, ResourceConfig};

/// The node allocatable cgroup's name below the cgroup root.
pub const KUBEPODS: &str = "kubepods";
/// The Burstable QoS cgroup's name below `kubepods`.
pub const BURSTABLE: &str = "burstable";
/// The BestEffort QoS cgroup's name below `kubepods`.
pub const BESTEFFORT: &str = "besteffort";

/// What can go wrong managing cgroups.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A cgroup file or directory operation failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// `creating`, `writing`, `reading`, `listing`, `removing`.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A cgroup file held something that is not a value of its kind.
    #[error("{}: unexpected content {content:?}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What it held.
        content: String,
    },
    /// A v1 controller this manager needs is not mounted.
    #[error("no cgroup v1 hierarchy for the {controller} controller under {}", root.display())]
    MissingController {
        /// `cpu`, `memory`, `pids`.
        controller: &'static str,
        /// The mount root looked in.
        root: PathBuf,
    },
    /// A cgroup name component cannot be used.
    #[error("invalid cgroup name component {component:?}: {reason}")]
    InvalidName {
        /// The component.
        component: String,
        /// Why.
        reason: &'static str,
    },
    /// A pod whose cgroup values cannot be computed (a quantity that does not parse,
    /// a missing UID).
    #[error("pod {pod}: {reason}")]
    Pod {
        /// `namespace/name`.
        pod: String,
        /// What is wrong.
        reason: String,
    },
    /// Processes survived SIGKILL for the whole wait.
    #[error("cgroup {cgroup}: processes {pids:?} still there {waited:?} after SIGKILL")]
    StillRunning {
        /// The cgroup's path.
        cgroup: String,
        /// Who is left.
        pids: Vec<u32>,
        /// How long it waited.
        waited: Duration,
    },
    /// The cgroup to destroy holds this node agent itself.
    #[error("cgroup {cgroup} holds the node's own process {pid}: refusing to kill it")]
    OwnProcess {
        /// The cgroup's path.
        cgroup: String,
        /// This process.
        pid: u32,
    },
    /// kill(2) failed for a reason other than the process being gone.
    #[error("sending SIGKILL to process {pid} in cgroup {cgroup}: {source}")]
    Kill {
        /// The cgroup's path.
        cgroup: String,
        /// The process.
        pid: u32,
        /// The cause.
        #[source]
        source: nix::Error,
    },
    /// A configuration value that cannot work.
    #[error("invalid container manager configuration: {0}")]
    Config(String),
    /// The pod's cgroup from an earlier run is being removed as an orphan; it can be
    /// made again once that is done.
    #[error("the old cgroup of pod {uid} is being removed; trying again later")]
    BeingRemoved {
        /// The pod's UID.
        uid: String,
    },
    /// Some orphaned pod cgroups could not be removed (the others were).
    #[error("removing orphaned pod cgroups: {}", list(.errors))]
    Cleanup {
        /// UIDs whose cgroups were removed.
        removed: Vec<String>,
        /// What failed.
        errors: Vec<Error>,
    },
}

fn list(errors: &[Error]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// This module's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The container manager's settings (the kubelet's `NodeConfig` fields it uses).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// `cgroupDriver`.
    pub driver: Driver,
    /// `cgroupRoot` as a cgroupfs path (`/` by default); `kubepods` goes below it.
    pub cgroup_root: String,
    /// Where the cgroup hierarchy is mounted (`/sys/fs/cgroup`).
    pub mount_root: PathBuf,
    /// `cpuCFSQuota`: enforce CPU limits with CFS quota.
    pub cpu_cfs_quota: bool,
    /// `cpuCFSQuotaPeriod` in µs.
    pub cpu_cfs_quota_period_us: u64,
    /// `podPidsLimit`: `None` or -1 for unlimited.
    pub pod_pids_limit: Option<i64>,
    /// `enforceNodeAllocatable`: with `pods`, `kubepods` is limited to capacity minus
    /// the reservations, else to capacity.
    pub enforce_node_allocatable: Vec<String>,
    /// The machine's CPU and memory.
    pub capacity: NodeResources,
    /// `kubeReserved` (cpu, memory).
    pub kube_reserved: NodeResources,
    /// `systemReserved` (cpu, memory).
    pub system_reserved: NodeResources,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            driver: Driver::Cgroupfs,
            cgroup_root: "/".into(),
            mount_root: PathBuf::from("/sys/fs/cgroup"),
            cpu_cfs_quota: true,
            cpu_cfs_quota_period_us: formulas::CPU_PERIOD_US,
            pod_pids_limit: None,
            enforce_node_allocatable: vec!["pods".into()],
            capacity: NodeResources::default(),
            kube_reserved: NodeResources::default(),
            system_reserved: NodeResources::default(),
        }
    }
}

/// A pod this manager made a cgroup for.
struct Tracked {
    pod: Pod,
    /// What was last written successfully.
    applied: Option<ResourceConfig>,
}

/// The kubelet's QoS, pod and node-allocatable cgroup managers in one.
pub struct ContainerManager {
    config: Config,
    cgroups: CgroupManager,
    kubepods: CgroupName,
    /// The containers' scores, floored at this process's own `oom_score_adj`.
    oom: OomScores,
    pods: Mutex<BTreeMap<String, Tracked>>,
    /// UIDs whose orphaned cgroups are being removed: [`Self::ensure_pod`] waits for
    /// them rather than make a cgroup the removal would destroy.
    removing: Mutex<HashSet<String>>,
}

impl ContainerManager {
    /// Checks the configuration and detects the hierarchy at `mount_root`. Touches
    /// nothing; [`Self::start`] does.
    pub fn new(config: Config) -> Result<Self> {
        let root = CgroupName::from_cgroupfs(&config.cgroup_root);
        root.validate()
            .map_err(|e| Error::Config(format!("cgroupRoot {:?}: {e}", config.cgroup_root)))?;
        if config.capacity.milli_cpu == 0 {
            return Err(Error::Config("the node's CPU capacity is 0".into()));
        }
        if config.cpu_cfs_quota_period_us == 0 {
            return Err(Error::Config("cpuCFSQuotaPeriod is 0".into()));
        }
        let cgroups = CgroupManager::detect(&config.mount_root, config.driver)?;
        let oom = OomScores::new(config.capacity.memory_bytes).map_err(|source| Error::Io {
            op: "reading",
            path: "/proc/self/oom_score_adj".into(),
            source,
        })?;
        Ok(Self {
            kubepods: root.child(KUBEPODS),
            config,
            cgroups,
            oom,
            pods: Mutex::new(BTreeMap::new()),
            removing: Mutex::new(HashSet::new()),
        })
    }

    /// The settings it was made with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The cgroup library underneath.
    pub fn cgroups(&self) -> &CgroupManager {
        &self.cgroups
    }

    /// The node allocatable cgroup (`<root>/kubepods`).
    pub fn kubepods(&self) -> &CgroupName {
        &self.kubepods
    }

    /// The QoS cgroup of a class: `kubepods` itself for Guaranteed.
    pub fn qos_cgroup(&self, qos_class: &str) -> CgroupName {
        match qos_class {
            "Burstable" => self.kubepods.child(BURSTABLE),
            "BestEffort" => self.kubepods.child(BESTEFFORT),
            _ => self.kubepods.clone(),
        }
    }

    fn qos_parents(&self) -> [CgroupName; 3] {
        ["Guaranteed", "Burstable", "BestEffort"].map(|q| self.qos_cgroup(q))
    }

    fn settings(&self) -> PodCgroupSettings {
        PodCgroupSettings {
            cpu_cfs_quota: self.config.cpu_cfs_quota,
            cpu_period_us: self.config.cpu_cfs_quota_period_us,
            pod_pids_limit: self.config.pod_pids_limit,
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Tracked>> {
        // A panic elsewhere leaves the map consistent (entries are replaced whole).
        self.pods.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Creates `kubepods` with the node allocatable values, and the `burstable` and
    /// `besteffort` QoS cgroups (the kubelet's `setupNode` and QoS manager `Start`).
    /// Idempotent.
    pub fn start(&self) -> Result<()> {
        let c = &self.config;
        let allocatable = formulas::node_allocatable_resources(
            c.capacity,
            c.kube_reserved,
            c.system_reserved,
            c.enforce_node_allocatable.iter().any(|k| k == "pods"),
        );
        self.cgroups.create(&self.kubepods)?;
        self.cgroups.set(&self.kubepods, &allocatable)?;
        for qos in ["Burstable", "BestEffort"] {
            self.cgroups.create(&self.qos_cgroup(qos))?;
        }
        self.update_qos_locked(&self.lock())
    }

    /// The pod's cgroup: `pod<uid>` under its QoS cgroup (`GetPodContainerName`).
    pub fn pod_cgroup_name(&self, pod: &Pod) -> Result<CgroupName> {
        let uid = pod_uid(pod)?;
        let name = self
            .qos_cgroup(crate::qos::qos_class(pod))
            .child(format!("{}{uid}", cgroup::POD_CGROUP_PREFIX));
        name.validate().map_err(|e| Error::Pod {
            pod: crate::pod::full_name(pod),
            reason: e.to_string(),
        })?;
        Ok(name)
    }

    /// What CRI's `cgroup_parent` gets for the pod's sandbox, as the kubelet passes
    /// it: the pod cgroup's path in the driver's naming. With `cgroupfs` that is
    /// `/kubepods/burstable/pod<uid>`; with `systemd` the expanded slice path
    /// `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`,
    /// whose last element is the slice name the runtime hands systemd (containerd
    /// and CRI-O take the base name of a path ending in `.slice`).
    pub fn cgroup_parent(&self, pod: &Pod) -> Result<String> {
        Ok(self.cgroups.path(&self.pod_cgroup_name(pod)?))
    }

    /// Creates the pod's cgroup with its values ([`formulas::pod_resources`]) or
    /// brings the values up to date. Limits the pod does not set are written as
    /// "no limit", so a cgroup always matches the pod it was last ensured for. A
    /// Burstable pod that is new or changed its CPU request first updates the
    /// burstable QoS cgroup's shares, as the kubelet does before creating the pod
    /// cgroup. Idempotent; writes nothing when nothing changed.
    pub fn ensure_pod(&self, pod: &Pod) -> Result<()> {
        let uid = pod_uid(pod)?.to_owned();
        let name = self.pod_cgroup_name(pod)?;
        let desired = formulas::pod_resources(pod, &self.settings())
            .map_err(|reason| Error::Pod {
                pod: crate::pod::full_name(pod),
                reason,
            })?
            .with_unset_limits_max();

        let mut pods = self.lock();
        if self
            .removing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&uid)
        {
            return Err(Error::BeingRemoved { uid });
        }
        let burstable_request = |p: &Pod| {
            (crate::qos::qos_class(p) == "Burstable").then(|| formulas::pod_cpu_request_milli(p))
        };
        let previous = pods.get(&uid);
        if previous.is_some_and(|t| t.applied.as_ref() == Some(&desired))
            && self.cgroups.exists(&name)
        {
            return Ok(());
        }
        // A pod cgroup is never limited below what it uses now: the kernel would
        // reclaim or OOM-kill the pod (the kubelet refuses such a resize too).
        if let Some(formulas::Limit::Value(limit)) = desired.memory
            && let Some(used) = self.cgroups.memory_usage(&name)?
            && used > limit
        {
            return Err(Error::Pod {
                pod: crate::pod::full_name(pod),
                reason: format!(
                    "its memory limit of {limit} bytes is below the {used} bytes it uses now"
                ),
            });
        }
        let qos_changed =
            previous.and_then(|t| burstable_request(&t.pod)) != burstable_request(pod);
        pods.insert(
            uid.clone(),
            Tracked {
                pod: pod.clone(),
                applied: None,
            },
        );
        if qos_changed {
            self.update_qos_locked(&pods)?;
        }
        self.cgroups.create(&name)?;
        self.cgroups.set(&name, &desired)?;
        if let Some(t) = pods.get_mut(&uid) {
            t.applied = Some(desired);
        }
        Ok(())
    }

    /// Puts a process (a Wasm pod's sandbox) into the pod's cgroup, which
    /// [`Self::ensure_pod`] made.
    pub fn add_process(&self, pod: &Pod, pid: u32) -> Result<()> {
        self.cgroups.add_process(&self.pod_cgroup_name(pod)?, pid)
    }

    /// The pod's `oom_score_adj` for a container ([`OomScores::for_container`]).
    pub fn oom_score_adj(&self, pod: &Pod, container: &Container) -> i64 {
        self.oom.for_container(pod, container)
    }

    /// Where a pod with this UID can have its cgroup: under each QoS cgroup.
    fn pod_cgroup_candidates(&self, uid: &str) -> Result<Vec<CgroupName>> {
        let base = format!("{}{uid}", cgroup::POD_CGROUP_PREFIX);
        let names: Vec<CgroupName> = self.qos_parents().iter().map(|p| p.child(&base)).collect();
        for name in &names {
            name.validate()?;
        }
        Ok(names)
    }

    /// Kills what runs in the pod's cgroup and removes it (the kubelet's pod
    /// container manager `Destroy`), under whichever QoS cgroup it is; then the
    /// burstable shares follow. A pod without a cgroup is fine.
    pub fn remove_pod(&self, uid: &str) -> Result<()> {
        let names = self.pod_cgroup_candidates(uid)?;
        // The pod is gone whether or not its cgroup goes at once: it no longer counts
        // in the burstable shares, and what is left is an orphan for housekeeping.
        {
            let mut pods = self.lock();
            let was_burstable = pods
                .remove(uid)
                .is_some_and(|t| crate::qos::qos_class(&t.pod) == "Burstable");
            if was_burstable && let Err(e) = self.update_qos_locked(&pods) {
                // The next pod ensured or removed writes them again.
                tracing::warn!(pod_uid = %uid, "updating the burstable shares: {e}");
            }
        }
        for name in names {
            self.cgroups.destroy(&name)?;
        }
        Ok(())
    }

    /// Removes the cgroup of a pod this manager does not track (an orphan: its pod is
    /// gone), unless [`Self::ensure_pod`] took the UID up again. Returns whether it
    /// removed it. Until it is done, [`Self::ensure_pod`] refuses the UID with
    /// [`Error::BeingRemoved`], so a pod coming back is not destroyed with its orphan.
    pub fn remove_orphan(&self, uid: &str) -> Result<bool> {
        {
            let pods = self.lock();
            if pods.contains_key(uid) {
                return Ok(false);
            }
            let mut removing = self.removing.lock().unwrap_or_else(|e| e.into_inner());
            if !removing.insert(uid.to_owned()) {
                return Ok(false);
            }
        }
        let result = self.remove_pod(uid);
        self.removing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
        result.map(|()| true)
    }

    /// The pod cgroups on disk, by UID.
    pub fn pod_cgroups(&self) -> Result<BTreeMap<String, CgroupName>> {
        self.cgroups.pod_cgroups(&self.qos_parents())
    }

    /// Removes the cgroups of pods not in `active` (the kubelet's
    /// `cleanupOrphanedPodCgroups`, without its wait for volumes) and forgets them.
    /// Returns the UIDs removed; if some could not be, the error lists them all
    /// after every other was tried.
    pub fn cleanup_orphans(&self, active: &HashSet<String>) -> Result<Vec<String>> {
        {
            let mut pods = self.lock();
            let before = pods.len();
            pods.retain(|uid, _| active.contains(uid));
            if pods.len() != before {
                self.update_qos_locked(&pods)?;
            }
        }
        let mut removed = Vec::new();
        let mut errors = Vec::new();
        for uid in self.pod_cgroups()?.into_keys() {
            if active.contains(&uid) {
                continue;
            }
            match self.remove_orphan(&uid) {
                Ok(true) => removed.push(uid),
                Ok(false) => {}
                Err(e) => errors.push(e),
            }
        }
        if errors.is_empty() {
            Ok(removed)
        } else {
            Err(Error::Cleanup { removed, errors })
        }
    }

    /// Writes the QoS cgroups' shares: burstable from the Burstable pods' CPU
    /// requests, besteffort 2 (`setCPUCgroupConfig`). The pods are those
    /// [`Self::ensure_pod`] saw and that were not removed since. [`Self::ensure_pod`]
    /// and [`Self::remove_pod`] call this when it matters; the kubelet also runs it
    /// periodically.
    pub fn update_qos(&self) -> Result<()> {
        self.update_qos_locked(&self.lock())
    }

    fn update_qos_locked(&self, pods: &BTreeMap<String, Tracked>) -> Result<()> {
        let shares = formulas::burstable_cpu_shares(pods.values().map(|t| &t.pod));
        let shares_of = |n| ResourceConfig {
            cpu_shares: Some(n),
            ..Default::default()
        };
        self.cgroups
            .set(&self.qos_cgroup("Burstable"), &shares_of(shares))?;
        self.cgroups.set(
            &self.qos_cgroup("BestEffort"),
            &shares_of(formulas::MIN_SHARES),
        )
    }
}

/// The containers' `oom_score_adj`, which the kubelet sets whether or not it makes pod
/// cgroups (`cgroupsPerQOS`).
#[derive(Clone, Copy, Debug)]
pub struct OomScores {
    /// The node's memory capacity, for the Burstable formula.
    pub memory_capacity_bytes: u64,
    /// The lowest value this process may give: its own without `CAP_SYS_RESOURCE`.
    pub floor: i64,
}

impl OomScores {
    /// For a node with `memory_capacity_bytes`, with the floor of this process:
    /// without CAP_SYS_RESOURCE no score below its own can be set; with it, any can
    /// (the floor is the kernel's minimum).
    pub fn new(memory_capacity_bytes: u64) -> std::io::Result<Self> {
        let floor = if formulas::has_cap_sys_resource() {
            -1000
        } else {
            formulas::own_oom_score_adj()?
        };
        Ok(Self {
            memory_capacity_bytes,
            floor,
        })
    }

    /// The pod's `oom_score_adj` for a container ([`formulas::oom_score_adj`] on the
    /// node's memory capacity), clamped to this process's own value, which a process
    /// without `CAP_SYS_RESOURCE` cannot go below; the clamp is logged.
    pub fn for_container(&self, pod: &Pod, container: &Container) -> i64 {
        let wanted = formulas::oom_score_adj(pod, container, self.memory_capacity_bytes);
        let value = formulas::clamp_oom_score_adj(wanted, self.floor);

        if value != wanted {
            tracing::info!(
                pod = %crate::pod::full_name(pod),
                container = %container.name,
                wanted,
                value,
                "oom_score_adj raised to the node's own: without CAP_SYS_RESOURCE it cannot be lowered"
            );
        }
        value
    }
}

fn pod_uid(pod: &Pod) -> Result<&str> {
    pod.metadata
        .uid
        .as_deref()
        .filter(|u| !u.is_empty())
        .ok_or_else(|| Error::Pod {
            pod: crate::pod::full_name(pod),
            reason: "no UID".into(),
        })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::{Value, json};
    use std::fs;
    use std::hash::{BuildHasher, Hasher};
    use std::os::unix::process::ExitStatusExt;
    use std::path::Path;
    use std::process::{Child, Command};
    use std::sync::atomic::{AtomicU64, Ordering};

    /// `wasmlet-test-<pid>-<random>`: a cgroup root no other run or test shares.
    pub(crate) fn unique_root_component() -> String {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        format!(
            "wasmlet-test-{}-{:08x}",
            std::process::id(),
            hasher.finish() as u32
        )
    }

    const MI: u64 = 1 << 20;

    fn pod(uid: &str, containers: Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": format!("p-{uid}"), "namespace": "default", "uid": uid},
            "spec": {"containers": containers},
        }))
        .unwrap()
    }

    fn guaranteed(uid: &str) -> Pod {
        let r = json!({"cpu": "500m", "memory": "64Mi"});
        pod(
            uid,
            json!([{"name": "c", "resources": {"requests": r, "limits": r}}]),
        )
    }

    fn burstable(uid: &str, request: &str, limit: &str) -> Pod {
        pod(
            uid,
            json!([{"name": "c", "resources": {
                "requests": {"cpu": request, "memory": "32Mi"},
                "limits": {"cpu": limit},
            }}]),
        )
    }

    fn besteffort(uid: &str) -> Pod {
        pod(uid, json!([{"name": "c"}]))
    }

    /// Destroys the test's cgroup root however the test ends.
    pub(crate) struct RootGuard {
        pub(crate) cgroups: CgroupManager,
        pub(crate) root: CgroupName,
    }

    impl Drop for RootGuard {
        fn drop(&mut self) {
            if let Err(e) = self.cgroups.destroy(&self.root) {
                eprintln!("cleaning up {}: {e}", self.root);
            }
        }
    }

    /// Kills and reaps a child however the test ends.
    pub(crate) struct Reap(pub(crate) Child);

    impl Drop for Reap {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// A `sleep 60` to put in cgroups.
    pub(crate) fn sleeper() -> Reap {
        Reap(Command::new("sleep").arg("60").spawn().unwrap())
    }

    /// `<mount>/<hierarchy>/<cgroup>/<file>` on the real v1 tree, trimmed.
    fn v1_file(cgroups: &CgroupManager, hierarchy: &str, name: &CgroupName, file: &str) -> String {
        let path = cgroups
            .mount_root()
            .join(hierarchy)
            .join(cgroups.path(name).trim_start_matches('/'))
            .join(file);
        fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .trim()
            .to_owned()
    }

    /// Every `/sys/fs/cgroup/<hierarchy>/<root>` still there.
    fn leftovers(mount_root: &Path, on_disk: &str) -> Vec<PathBuf> {
        fs::read_dir(mount_root)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.path().join(on_disk))
            .filter(|p| p.exists())
            .collect()
    }

    fn real_v1_available() -> bool {
        let ok = nix::unistd::geteuid().is_root()
            && Path::new("/sys/fs/cgroup/cpu/cgroup.procs").is_file()
            && Path::new("/sys/fs/cgroup/memory/cgroup.procs").is_file();
        if !ok {
            eprintln!("skipped: needs root and the cgroup v1 hierarchy at /sys/fs/cgroup");
        }
        ok
    }

    /// The whole life of the hierarchy on the machine's real cgroup v1 tree, under a
    /// per-run cgroup root.
    fn real_v1_hierarchy(driver: Driver) {
        if !real_v1_available() {
            return;
        }
        let mount_root = Path::new("/sys/fs/cgroup");
        let root_path = format!("/{}", unique_root_component());
        let manager = ContainerManager::new(Config {
            driver,
            cgroup_root: root_path.clone(),
            mount_root: mount_root.into(),
            pod_pids_limit: Some(1024),
            capacity: NodeResources {
                milli_cpu: 4000,
                memory_bytes: 8192 * MI,
            },
            kube_reserved: NodeResources {
                milli_cpu: 500,
                memory_bytes: 512 * MI,
            },
            system_reserved: NodeResources {
                milli_cpu: 500,
                memory_bytes: 512 * MI,
            },
            ..Default::default()
        })
        .unwrap();
        let cgroups = manager.cgroups().clone();
        assert_eq!(cgroups.version(), Version::V1);
        let root = CgroupName::from_cgroupfs(&root_path);
        let on_disk = cgroups.path(&root).trim_start_matches('/').to_owned();
        let guard = RootGuard {
            cgroups: cgroups.clone(),
            root,
        };
        let file =
            |hierarchy: &str, name: &CgroupName, f: &str| v1_file(&cgroups, hierarchy, name, f);

        // The QoS tree: kubepods limited to capacity - kubeReserved - systemReserved.
        manager.start().unwrap();
        let kubepods = manager.kubepods().clone();
        assert_eq!(file("cpu", &kubepods, "cpu.shares"), "3072");
        assert_eq!(
            file("memory", &kubepods, "memory.limit_in_bytes"),
            (7168 * MI).to_string()
        );
        let burstable_qos = manager.qos_cgroup("Burstable");
        let besteffort_qos = manager.qos_cgroup("BestEffort");
        assert_eq!(file("cpu", &burstable_qos, "cpu.shares"), "2");
        assert_eq!(file("cpu", &besteffort_qos, "cpu.shares"), "2");
        manager.start().unwrap();

        let g = guaranteed("0a1b2c3d-0000-4000-8000-00000000000a");
        let b = burstable("0a1b2c3d-0000-4000-8000-00000000000b", "250m", "1");
        let e = besteffort("0a1b2c3d-0000-4000-8000-00000000000e");
        for p in [&g, &b, &e] {
            manager.ensure_pod(p).unwrap();
            manager.ensure_pod(p).unwrap();
        }
        let (gn, bn, en) = (
            manager.pod_cgroup_name(&g).unwrap(),
            manager.pod_cgroup_name(&b).unwrap(),
            manager.pod_cgroup_name(&e).unwrap(),
        );
        assert_eq!(
            gn,
            kubepods.child("pod0a1b2c3d-0000-4000-8000-00000000000a")
        );
        assert_eq!(
            bn,
            burstable_qos.child("pod0a1b2c3d-0000-4000-8000-00000000000b")
        );
        assert_eq!(
            en,
            besteffort_qos.child("pod0a1b2c3d-0000-4000-8000-00000000000e")
        );

        // Values read back from the cgroup files: (pod, shares, quota, memory, pids).
        let cases = [
            (&gn, "512", "50000", Limit::Value(64 * MI), "1024"),
            (&bn, "256", "100000", Limit::Max, "1024"),
            (&en, "2", "-1", Limit::Max, "1024"),
        ];
        for (name, shares, quota, memory, pids) in cases {
            assert_eq!(file("cpu", name, "cpu.shares"), shares, "{name}");
            assert_eq!(file("cpu", name, "cpu.cfs_quota_us"), quota, "{name}");
            assert_eq!(file("cpu", name, "cpu.cfs_period_us"), "100000", "{name}");
            let limit = file("memory", name, "memory.limit_in_bytes");
            assert_eq!(
                formulas::parse_v1_limit(&limit),
                Some(memory),
                "{name}: {limit}"
            );
            assert_eq!(file("pids", name, "pids.max"), pids, "{name}");
        }
        assert_eq!(
            cgroups.get(&gn).unwrap(),
            ResourceConfig {
                cpu_shares: Some(512),
                cpu_quota: Some(Limit::Value(50_000)),
                cpu_period_us: Some(100_000),
                memory: Some(Limit::Value(64 * MI)),
                pids: Some(Limit::Value(1024)),
            }
        );
        assert_eq!(cgroups.get(&bn).unwrap().memory, Some(Limit::Max));
        // The burstable QoS cgroup follows its pods' requests.
        assert_eq!(file("cpu", &burstable_qos, "cpu.shares"), "256");
        assert_eq!(file("cpu", &besteffort_qos, "cpu.shares"), "2");

        let parent = manager.cgroup_parent(&b).unwrap();
        match driver {
            Driver::Cgroupfs => assert_eq!(
                parent,
                format!("{root_path}/kubepods/burstable/pod0a1b2c3d-0000-4000-8000-00000000000b")
            ),
            Driver::Systemd => {
                let slice = on_disk.trim_end_matches(".slice");
                assert_eq!(
                    parent,
                    format!(
                        "/{slice}.slice/{slice}-kubepods.slice/{slice}-kubepods-burstable.slice/{slice}-kubepods-burstable-pod0a1b2c3d_0000_4000_8000_00000000000b.slice"
                    )
                );
            }
        }

        // A Wasm sandbox process in the pod cgroup, and a container cgroup below it
        // as a CRI runtime would make (also in a hierarchy the node does not manage).
        let mut sandbox = sleeper();
        let mut container = sleeper();
        manager.add_process(&b, sandbox.0.id()).unwrap();
        for hierarchy in ["cpu", "cpuacct", "memory", "pids"] {
            let procs = file(hierarchy, &bn, "cgroup.procs");
            assert!(
                procs.lines().any(|l| l == sandbox.0.id().to_string()),
                "{hierarchy}: {procs:?}"
            );
        }
        let own = fs::read_to_string(format!("/proc/{}/cgroup", sandbox.0.id())).unwrap();
        assert!(
            own.contains(&format!(":cpu:{}\n", cgroups.path(&bn))),
            "{own}"
        );
        let ctr = bn.child("ctr1");
        cgroups.create(&ctr).unwrap();
        cgroups.add_process(&ctr, container.0.id()).unwrap();
        let freezer = mount_root
            .join("freezer")
            .join(cgroups.path(&ctr).trim_start_matches('/'));
        if mount_root.join("freezer/cgroup.procs").is_file() {
            fs::create_dir_all(&freezer).unwrap();
        }
        // runc on a hybrid machine also puts the container in the cgroup2 mount.
        let unified = mount_root.join("unified");
        let unified_ctr = unified.join(cgroups.path(&ctr).trim_start_matches('/'));
        let hybrid = unified.join("cgroup.controllers").is_file();
        if hybrid {
            fs::create_dir_all(&unified_ctr).unwrap();
            fs::write(
                unified_ctr.join("cgroup.procs"),
                container.0.id().to_string(),
            )
            .unwrap();
        }
        let mut both = vec![sandbox.0.id(), container.0.id()];
        both.sort();
        assert_eq!(cgroups.pids(&bn).unwrap(), both);

        // A resize reaches the files; the burstable shares follow the new request.
        let resized = burstable("0a1b2c3d-0000-4000-8000-00000000000b", "500m", "2");
        manager.ensure_pod(&resized).unwrap();
        assert_eq!(file("cpu", &bn, "cpu.shares"), "512");
        assert_eq!(file("cpu", &bn, "cpu.cfs_quota_us"), "200000");
        assert_eq!(file("cpu", &burstable_qos, "cpu.shares"), "512");

        // Removing the pod kills both processes and takes every directory along.
        manager
            .remove_pod("0a1b2c3d-0000-4000-8000-00000000000b")
            .unwrap();
        for child in [&mut sandbox, &mut container] {
            assert_eq!(child.0.wait().unwrap().signal(), Some(9));
        }
        assert!(!cgroups.exists(&bn));
        assert!(!freezer.exists(), "{}", freezer.display());
        let unified_pod = unified.join(cgroups.path(&bn).trim_start_matches('/'));
        assert!(!unified_pod.exists(), "{}", unified_pod.display());
        assert!(cgroups.pids(&bn).unwrap().is_empty());
        assert_eq!(file("cpu", &burstable_qos, "cpu.shares"), "2");

        // Orphans: everything but the active Guaranteed pod goes.
        let active = HashSet::from(["0a1b2c3d-0000-4000-8000-00000000000a".to_owned()]);
        assert_eq!(
            manager.cleanup_orphans(&active).unwrap(),
            ["0a1b2c3d-0000-4000-8000-00000000000e"]
        );
        let left: Vec<String> = manager.pod_cgroups().unwrap().into_keys().collect();
        assert_eq!(left, ["0a1b2c3d-0000-4000-8000-00000000000a"]);
        assert!(cgroups.exists(&gn) && !cgroups.exists(&en));

        drop(guard);
        assert_eq!(leftovers(mount_root, &on_disk), Vec::<PathBuf>::new());
    }

    #[test]
    fn real_v1_hierarchy_cgroupfs() {
        real_v1_hierarchy(Driver::Cgroupfs);
    }

    /// The systemd driver's names on the cgroupfs files (the node does not talk to
    /// systemd).
    #[test]
    fn real_v1_hierarchy_systemd_names() {
        real_v1_hierarchy(Driver::Systemd);
    }

    #[test]
    fn pod_cgroup_names_and_parents() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("cgroup.controllers"), "cpu memory pids").unwrap();
        let config = |driver| Config {
            driver,
            cgroup_root: "/custom".into(),
            mount_root: dir.path().into(),
            capacity: NodeResources {
                milli_cpu: 1000,
                memory_bytes: 1 << 30,
            },
            ..Default::default()
        };
        let uid = "1234-abcd";
        // (pod, cgroupfs parent, systemd parent)
        let cases = [
            (
                guaranteed(uid),
                "/custom/kubepods/pod1234-abcd",
                "/custom.slice/custom-kubepods.slice/custom-kubepods-pod1234_abcd.slice",
            ),
            (
                burstable(uid, "100m", "1"),
                "/custom/kubepods/burstable/pod1234-abcd",
                "/custom.slice/custom-kubepods.slice/custom-kubepods-burstable.slice/custom-kubepods-burstable-pod1234_abcd.slice",
            ),
            (
                besteffort(uid),
                "/custom/kubepods/besteffort/pod1234-abcd",
                "/custom.slice/custom-kubepods.slice/custom-kubepods-besteffort.slice/custom-kubepods-besteffort-pod1234_abcd.slice",
            ),
        ];
        let fs_manager = ContainerManager::new(config(Driver::Cgroupfs)).unwrap();
        let sd_manager = ContainerManager::new(config(Driver::Systemd)).unwrap();
        for (p, cgroupfs, systemd) in &cases {
            assert_eq!(fs_manager.cgroup_parent(p).unwrap(), *cgroupfs);
            assert_eq!(sd_manager.cgroup_parent(p).unwrap(), *systemd);
        }
        let mut no_uid = besteffort("x");
        no_uid.metadata.uid = None;
        assert!(matches!(
            fs_manager.ensure_pod(&no_uid),
            Err(Error::Pod { .. })
        ));
        let bad_root = ContainerManager::new(Config {
            cgroup_root: "/bad_root".into(),
            ..config(Driver::Cgroupfs)
        });
        assert!(matches!(bad_root, Err(Error::Config(_))));
        let no_capacity = ContainerManager::new(Config {
            capacity: NodeResources::default(),
            ..config(Driver::Cgroupfs)
        });
        assert!(matches!(no_capacity, Err(Error::Config(_))));
    }

    /// The manager on a scratch v2 layout: QoS shares as weights, pod values as v2
    /// files (a plain directory standing in for a cgroup2 mount; see the cgroup
    /// module's scratch test for what that does and does not show).
    #[test]
    fn an_orphan_being_removed_is_not_made_again_and_a_tracked_pod_is_no_orphan() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::write(root.join("cgroup.controllers"), "cpu memory pids").unwrap();
        let manager = ContainerManager::new(Config {
            mount_root: root.into(),
            capacity: NodeResources {
                milli_cpu: 2000,
                memory_bytes: 4096 * MI,
            },
            ..Default::default()
        })
        .unwrap();
        manager.start().unwrap();
        let pod = guaranteed("g-2");
        manager.ensure_pod(&pod).unwrap();
        // Housekeeping decided on an old list: the pod came back since, and stays.
        assert!(!manager.remove_orphan("g-2").unwrap());
        assert!(root.join("kubepods/podg-2").is_dir());
        // While an orphan of that UID is being removed, it is not made again.
        // (Its pod went: forgotten, the cgroup on disk being the orphan.)
        manager.lock().remove("g-2");
        manager.removing.lock().unwrap().insert("g-2".into());
        let err = manager.ensure_pod(&pod).unwrap_err();
        assert!(matches!(err, Error::BeingRemoved { .. }), "{err}");
        manager.removing.lock().unwrap().clear();
        manager.ensure_pod(&pod).unwrap();
        assert!(root.join("kubepods/podg-2").is_dir());
    }

    #[test]
    fn manager_writes_v2_files_in_a_scratch_directory() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::write(root.join("cgroup.controllers"), "cpu memory pids").unwrap();
        let manager = ContainerManager::new(Config {
            mount_root: root.into(),
            pod_pids_limit: Some(-1),
            capacity: NodeResources {
                milli_cpu: 2000,
                memory_bytes: 4096 * MI,
            },
            kube_reserved: NodeResources {
                milli_cpu: 1000,
                memory_bytes: 1024 * MI,
            },
            ..Default::default()
        })
        .unwrap();
        assert_eq!(manager.cgroups().version(), Version::V2);
        manager.start().unwrap();
        let read = |rel: &str| fs::read_to_string(root.join(rel)).unwrap();
        assert_eq!(
            read("kubepods/cpu.weight"),
            formulas::cpu_weight(1024).to_string()
        );
        assert_eq!(read("kubepods/memory.max"), (3072 * MI).to_string());
        assert_eq!(read("kubepods/besteffort/cpu.weight"), "1");

        let g = guaranteed("g-1");
        let b = burstable("b-1", "1", "2");
        manager.ensure_pod(&g).unwrap();
        manager.ensure_pod(&b).unwrap();
        assert_eq!(read("kubepods/podg-1/cpu.max"), "50000 100000");
        assert_eq!(read("kubepods/podg-1/memory.max"), (64 * MI).to_string());
        assert_eq!(read("kubepods/podg-1/pids.max"), "max");
        assert_eq!(read("kubepods/burstable/podb-1/cpu.max"), "200000 100000");
        assert_eq!(read("kubepods/burstable/podb-1/memory.max"), "max");
        assert_eq!(
            read("kubepods/burstable/cpu.weight"),
            formulas::cpu_weight(1024).to_string()
        );
        assert_eq!(
            manager
                .pod_cgroups()
                .unwrap()
                .into_keys()
                .collect::<Vec<_>>(),
            ["b-1", "g-1"]
        );
        // Nothing changed: nothing is written (a file removed behind its back stays gone).
        fs::remove_file(root.join("kubepods/podg-1/cpu.max")).unwrap();
        manager.ensure_pod(&g).unwrap();
        assert!(!root.join("kubepods/podg-1/cpu.max").exists());
    }

    #[test]
    fn oom_score_adj_is_clamped_to_the_nodes_own() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("cgroup.controllers"), "").unwrap();
        let manager = ContainerManager::new(Config {
            mount_root: dir.path().into(),
            capacity: NodeResources {
                milli_cpu: 1000,
                memory_bytes: 8_000_000_000,
            },
            ..Default::default()
        })
        .unwrap();
        let own = formulas::own_oom_score_adj().unwrap();
        let g = guaranteed("g");
        let c = g.spec.as_ref().unwrap().containers[0].clone();
        assert_eq!(manager.oom_score_adj(&g, &c), (-997).max(own));
        let e = besteffort("e");
        let c = e.spec.as_ref().unwrap().containers[0].clone();
        assert_eq!(manager.oom_score_adj(&e, &c), 1000);
    }
}
