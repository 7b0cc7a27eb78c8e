//! Resource statistics: the kubelet's Summary API (`/stats/summary`,
//! [`types::Summary`]) and its resource metrics (`/metrics/resource`,
//! [`metrics::resource_metrics_text`]), read from cgroups and `/proc` as cAdvisor
//! reads them. [`StatsProvider::summary`] is where to start.
//!
//! Where each figure comes from:
//!
//! - **node** cpu and memory: the root cgroup (v1 `cpuacct.usage`,
//!   `memory.usage_in_bytes` less `total_inactive_file`; v2 root `cpu.stat`), else
//!   `/proc/stat` and `/proc/meminfo`; `availableBytes` is `MemTotal` less the working
//!   set, as the kubelet computes it. `startTime` is the boot time. Network: every
//!   interface of `/proc/net/dev` but `lo`, the default route's inline. `fs`: statvfs of
//!   the node's root directory; `runtime.imageFs`: the runtime's `image_fs_info`
//!   (the OCI runtime's when there is one) with statvfs of its mount point. `rlimit`:
//!   `kernel.pid_max` and the number of tasks (`/proc/loadavg`).
//! - **pods**: the node's pods (the status store) matched by UID to the pod cgroups
//!   below the QoS cgroups; cpu and memory from the pod cgroup; `process_stats` the
//!   processes in it.
//! - **containers**: the running ones of the pod's status. A CRI container has a
//!   cgroup of its own below the pod's (found by its id); its figures are that
//!   cgroup's. A Wasm container has none (every container of a Wasm pod is a task in
//!   the pod's one sandbox process, see `runtimes/wasm/src/cgroup.rs`), and the sandbox
//!   does not account CPU per container: a pod with **one** container reports the pod
//!   cgroup's figures for it (sandbox overhead included); the containers of a pod
//!   with several report no cpu or memory rather than a made-up share.
//! - `usageNanoCores` is the rate since the previous reading of the same cgroup
//!   ([`rate::CpuRates`]); a cgroup read for the first time is read again after
//!   [`rate::MIN_WINDOW`] in the same request, so every answer has a rate and no
//!   background task runs.
//!
//! - **pod network**: `/proc/<pid>/net/dev` of a process in the pod cgroup (its
//!   network namespace is the pod's; a pod in the node's namespace reports the node's
//!   interfaces, as upstream does for host-network pods), `eth0` inline when present.
//!
//! - **volumes** (`volumeStats`): the pod's emptyDir, configMap, secret, downwardAPI
//!   and projected volumes, each its directory below `<root>/pods/<uid>/volumes/`
//!   measured as `du -x` and `find` measure it ([`disk`]), reused for
//!   `volumeStatsAggPeriod`; capacity from statvfs of the volume (a tmpfs's own for a
//!   Memory emptyDir or a secret). hostPath volumes are not measured, as upstream's
//!   hostPath plugin has no metrics.
//! - **container logs**: the container's directory below the pod's log directory,
//!   measured on every request; **rootfs**: the runtime's writable layer (CRI
//!   ListContainerStats); a Wasm container has none. Both with the capacity of the
//!   node's root filesystem, as the kubelet's `rootFsInfo`.
//! - **ephemeral storage**: the kubelet's `calcEphemeralStorage`: the containers'
//!   rootfs and logs, the local ephemeral volumes (emptyDir on disk, configMap) and the
//!   files of the pod's log directory. Unlike upstream, a container's logs count even
//!   when it has no rootfs (a Wasm container's logs are on the node's disk too).
//!
//! Left out: system containers, swap, PSI, accelerators, persistent volumes (no CSI
//! yet).

pub mod cadvisor;
pub mod cgroupfs;
pub mod disk;
pub mod metrics;
pub mod procfs;
pub mod rate;
pub mod types;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Volume};
use wasmlet_runtime::{Error as RuntimeError, FilesystemUsage, ImageKind, Runtime};

use crate::cm::cgroup::{CgroupManager, CgroupName, Version};
use cgroupfs::{CgroupReader, CgroupSample, MemorySample};
use disk::{DiskUsage, DuCache};
use rate::CpuRates;
use types::*;

/// Where the pods' cgroups are: the hierarchy and the node allocatable cgroup
/// (`<cgroupRoot>/kubepods`), below which the QoS cgroups hold `pod<uid>`.
#[derive(Clone, Debug)]
pub struct PodCgroups {
    pub cgroups: CgroupManager,
    pub kubepods: CgroupName,
}

impl PodCgroups {
    /// The container manager's.
    pub fn of(cm: &crate::cm::ContainerManager) -> Self {
        Self {
            cgroups: cm.cgroups().clone(),
            kubepods: cm.kubepods().clone(),
        }
    }

    /// The pod cgroups by UID, each as its path below the hierarchy's root.
    fn pods(&self) -> HashMap<String, (String, CgroupName)> {
        let parents = [
            self.kubepods.clone(),
            self.kubepods.child(crate::cm::BURSTABLE),
            self.kubepods.child(crate::cm::BESTEFFORT),
        ];
        match self.cgroups.pod_cgroups(&parents) {
            Ok(map) => map
                .into_iter()
                .map(|(uid, name)| (uid, (self.cgroups.path(&name), name)))
                .collect(),
            Err(e) => {
                tracing::debug!("listing pod cgroups for stats: {e}");
                HashMap::new()
            }
        }
    }
}

/// What the provider reads besides the pods.
#[derive(Clone, Debug)]
pub struct StatsConfig {
    pub node_name: String,
    /// The node's root directory (its filesystem is `node.fs`).
    pub root_dir: PathBuf,
    /// Where the pods' log directories are (`podLogsDir`).
    pub pod_logs_dir: PathBuf,
    /// How long a volume's measurement is reused; zero measures no volume.
    pub volume_stats_agg_period: Duration,
    /// Where `/proc` is (tests point it at fixtures).
    pub proc: PathBuf,
    /// The cgroup hierarchy's root and version, for the node's own cgroup.
    pub cgroup_mount: PathBuf,
    pub cgroup_version: Option<Version>,
    /// `None`: the node keeps no pod cgroups (`cgroupsPerQOS: false`).
    pub pod_cgroups: Option<PodCgroups>,
}

/// How much of the Summary to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detail {
    Full,
    /// [`Detail::Full`]'s figures without waiting for a CPU rate of a cgroup read for
    /// the first time (the eviction manager's: it reads no CPU, and a memory
    /// threshold is acted on at once).
    Signals,
    /// [`Detail::Signals`] with every volume measured now rather than within
    /// `volumeStatsAggPeriod` (the eviction manager's, to rank pods for disk: a pod
    /// that has just filled its emptyDir is seen as it is).
    SignalsMeasured,
    /// [`Summary::cpu_and_memory_only`]'s fields (`?only_cpu_and_memory=true`,
    /// `/metrics/resource`): networks, filesystems, the image filesystem and rlimit
    /// are not read at all.
    CpuAndMemory,
}

/// Builds Summaries; keeps the previous CPU reading per cgroup.
pub struct StatsProvider {
    config: StatsConfig,
    reader: Option<CgroupReader>,
    rates: CpuRates,
    volumes: DuCache,
    /// The CSI volumes, whose usage their drivers report.
    csi: Option<Arc<crate::volumes::csi::CsiVolumes>>,
}

/// The interface a pod's network figures are inlined from (the kubelet's
/// `network.DefaultInterfaceName`).
const POD_INTERFACE: &str = "eth0";

/// The system container of the pods' cgroup (`kubepods`), as the kubelet names it.
pub const SYSTEM_CONTAINER_PODS: &str = "pods";

/// The node's key in the rate cache (cgroup paths all start with `/`).
const NODE_KEY: &str = "node";

/// A container's cgroup to read, or none.
struct ContainerPlan {
    name: String,
    /// The runtime's id, without the scheme.
    id: String,
    image: String,
    start_time: Option<Time>,
    key: Option<String>,
}

/// A volume to measure.
struct VolumePlan {
    name: String,
    path: PathBuf,
    /// Counted in the pod's ephemeral storage (the kubelet's
    /// `IsLocalEphemeralVolume`: an emptyDir on disk, a configMap).
    ephemeral: bool,
}

/// One pass over the cgroups: what was planned and what was read, when.
struct Reading {
    plans: Vec<PodPlan>,
    keys: HashSet<String>,
    at: tokio::time::Instant,
    samples: HashMap<String, CgroupSample>,
    failed: bool,
}

struct PodPlan {
    pod_ref: PodReference,
    start_time: Option<Time>,
    cgroup: Option<String>,
    process_count: Option<u64>,
    /// A process in the pod cgroup, whose network namespace is the pod's.
    pid: Option<u32>,
    containers: Vec<ContainerPlan>,
    volumes: Vec<VolumePlan>,
    /// The pod's log directory; each container's logs are in `<name>/` below it.
    log_dir: PathBuf,
}

/// What the pods' files use, read once per Summary ([`Detail::Full`] only).
#[derive(Default)]
struct DiskReading {
    /// Volumes by path, with the filesystem each is on.
    volumes: HashMap<PathBuf, (DiskUsage, Option<FsStats>)>,
    /// Container log directories by path.
    container_logs: HashMap<PathBuf, DiskUsage>,
    /// The files directly in each pod's log directory.
    pod_logs: HashMap<PathBuf, DiskUsage>,
    /// The node's root filesystem (`node.fs`; the logs and ephemeral storage are
    /// on it).
    root_fs: Option<FsStats>,
    /// The filesystems of the runtimes' writable layers, by mount point.
    layer_fs: HashMap<PathBuf, Option<FsStats>>,
}

/// `used` on the filesystem `fs`: its capacity, availability and inodes.
fn usage_on(fs: Option<&FsStats>, used: DiskUsage, time: Time) -> FsStats {
    let fs = fs.cloned().unwrap_or_default();
    FsStats {
        time: Some(time),
        used_bytes: Some(used.bytes),
        inodes_used: Some(used.inodes),
        ..fs
    }
}

/// The volume's directory below the pod's, when the node measures it.
fn volume_dir(v: &Volume) -> Option<(&'static str, bool)> {
    if let Some(e) = &v.empty_dir {
        let on_disk = e.medium.as_deref().unwrap_or_default().is_empty();
        return Some((crate::volumes::EMPTY_DIR, on_disk));
    }
    let plugin = crate::volumes::content::plugin_dir(v)?;
    Some((plugin, v.config_map.is_some()))
}

fn fs_stats(path: &std::path::Path, time: Time) -> Option<FsStats> {
    let s = nix::sys::statvfs::statvfs(path).ok()?;
    let frag = s.fragment_size() as u64;
    let files = s.files() as u64;
    let files_free = s.files_free() as u64;
    Some(FsStats {
        time: Some(time),
        available_bytes: Some(s.blocks_available() as u64 * frag),
        capacity_bytes: Some(s.blocks() as u64 * frag),
        used_bytes: Some((s.blocks() as u64).saturating_sub(s.blocks_free() as u64) * frag),
        inodes_free: Some(files_free),
        inodes: Some(files),
        inodes_used: Some(files.saturating_sub(files_free)),
    })
}

fn memory_stats(m: &MemorySample, time: Time) -> MemoryStats {
    MemoryStats {
        time: Some(time),
        available_bytes: m.limit_bytes.map(|l| l.saturating_sub(m.working_set_bytes)),
        usage_bytes: Some(m.usage_bytes),
        working_set_bytes: Some(m.working_set_bytes),
        rss_bytes: m.rss_bytes,
        page_faults: m.page_faults,
        major_page_faults: m.major_page_faults,
    }
}

fn k8s_time(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> Time {
    Time(t.0)
}

impl StatsProvider {
    pub fn new(config: StatsConfig) -> Self {
        let reader = config
            .cgroup_version
            .map(|v| CgroupReader::new(v, config.cgroup_mount.clone()));
        Self {
            volumes: DuCache::new(config.volume_stats_agg_period),
            config,
            reader,
            rates: CpuRates::default(),
            csi: None,
        }
    }

    /// Adds the usage CSI drivers report for their volumes to the full summary.
    pub fn with_csi(mut self, csi: Arc<crate::volumes::csi::CsiVolumes>) -> Self {
        self.csi = Some(csi);
        self
    }

    /// The CSI volumes, for the `kubelet_volume_stats_*` metrics.
    pub fn csi(&self) -> Option<&Arc<crate::volumes::csi::CsiVolumes>> {
        self.csi.as_ref()
    }

    fn plan(&self, pods: &[Pod]) -> Vec<PodPlan> {
        let cgroups = self
            .config
            .pod_cgroups
            .as_ref()
            .map(PodCgroups::pods)
            .unwrap_or_default();
        let mut plans = Vec::new();
        for pod in pods {
            let Some(uid) = pod.metadata.uid.clone() else {
                continue;
            };
            let (cgroup, pids) = match (cgroups.get(&uid), &self.config.pod_cgroups) {
                (Some((rel, name)), Some(pc)) => (Some(rel.clone()), pc.cgroups.pids(name).ok()),
                _ => (None, None),
            };
            let process_count = pids.as_ref().map(|p| p.len() as u64);
            let pid = pids.and_then(|p| p.first().copied());
            let status = pod.status.as_ref();
            let single = pod.spec.as_ref().is_some_and(|s| s.containers.len() == 1);
            let containers = status
                .and_then(|s| s.container_statuses.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|cs| {
                    let started = cs.state.as_ref()?.running.as_ref()?.started_at.as_ref();
                    let id = cs.container_id.as_deref().unwrap_or_default();
                    let id = id.split_once("://").map_or(id, |(_, id)| id);
                    let own = match (&self.reader, &cgroup) {
                        (Some(r), Some(pod_rel)) => r.find_child(pod_rel, id),
                        _ => None,
                    };
                    let key = own.or_else(|| cgroup.clone().filter(|_| single));
                    Some(ContainerPlan {
                        name: cs.name.clone(),
                        id: id.to_owned(),
                        image: cs.image.clone(),
                        start_time: started.map(k8s_time),
                        key,
                    })
                })
                .collect();
            let volumes_dir =
                crate::volumes::volumes_dir(&self.config.root_dir.join("pods").join(&uid));
            let volumes = pod
                .spec
                .iter()
                .flat_map(|s| s.volumes.iter().flatten())
                .filter(|_| !self.config.volume_stats_agg_period.is_zero())
                .filter_map(|v| {
                    let (plugin, ephemeral) = volume_dir(v)?;
                    Some(VolumePlan {
                        name: v.name.clone(),
                        path: volumes_dir.join(plugin).join(&v.name),
                        ephemeral,
                    })
                })
                .collect();
            plans.push(PodPlan {
                pod_ref: PodReference {
                    name: pod.metadata.name.clone().unwrap_or_default(),
                    namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                    uid,
                },
                start_time: status.and_then(|s| s.start_time.as_ref()).map(k8s_time),
                cgroup,
                process_count,
                pid,
                containers,
                volumes,
                log_dir: crate::sync::pod_log_dir(&self.config.pod_logs_dir, pod),
            });
        }
        plans
    }

    /// Everything [`DiskReading`] holds for `plans`, off the async threads.
    async fn read_disk(
        self: &Arc<Self>,
        plans: &[PodPlan],
        layer_mounts: HashSet<PathBuf>,
        at: tokio::time::Instant,
        now: Time,
        fresh: bool,
    ) -> DiskReading {
        let volumes: Vec<PathBuf> = plans
            .iter()
            .flat_map(|p| p.volumes.iter().map(|v| v.path.clone()))
            .collect();
        let logs: Vec<(PathBuf, Vec<PathBuf>)> = plans
            .iter()
            .map(|p| {
                let containers = p.containers.iter().map(|c| p.log_dir.join(&c.name));
                (p.log_dir.clone(), containers.collect())
            })
            .collect();
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut out = DiskReading {
                root_fs: fs_stats(&this.config.root_dir, now),
                ..DiskReading::default()
            };
            for path in &volumes {
                let usage = if fresh {
                    this.volumes.measure(path, at)
                } else {
                    this.volumes.get(path, at)
                };
                if let Some(u) = usage {
                    out.volumes.insert(path.clone(), (u, fs_stats(path, now)));
                }
            }
            this.volumes.retain(&volumes.iter().cloned().collect());
            for (pod_dir, containers) in logs {
                for dir in containers {
                    if let Ok(u) = disk::du(&dir) {
                        out.container_logs.insert(dir, u);
                    }
                }
                if let Some(u) = files_in(&pod_dir) {
                    out.pod_logs.insert(pod_dir, u);
                }
            }
            for m in layer_mounts {
                let fs = fs_stats(&m, now);
                out.layer_fs.insert(m, fs);
            }
            out
        })
        .await
        .unwrap_or_default()
    }

    /// The node's cpu (ns) and memory now: its root cgroup's, else `/proc`'s.
    fn node_sample(&self) -> CgroupSample {
        let mut s = self
            .reader
            .as_ref()
            .and_then(|r| r.sample("/").ok())
            .unwrap_or_default();
        let proc = &self.config.proc;
        if s.cpu_usage_ns.is_none() {
            let text = std::fs::read_to_string(proc.join("stat")).unwrap_or_default();
            s.cpu_usage_ns = procfs::parse_proc_stat(&text).0;
        }
        let meminfo = std::fs::read_to_string(proc.join("meminfo")).unwrap_or_default();
        let total = procfs::parse_meminfo(&meminfo).get("MemTotal").copied();
        match &mut s.memory {
            // The root cgroup has no limit: the machine's memory is its capacity.
            Some(m) => m.limit_bytes = total,
            None => s.memory = procfs::meminfo_memory(&meminfo),
        }
        s
    }

    /// Every cgroup in `keys` read now, with the node's under [`NODE_KEY`]. A cgroup
    /// that cannot be read is left out and counted in the error flag.
    fn sample(&self, keys: &HashSet<String>) -> (HashMap<String, CgroupSample>, bool) {
        let mut out = HashMap::new();
        let mut failed = false;
        out.insert(NODE_KEY.to_owned(), self.node_sample());
        if let Some(reader) = &self.reader {
            for key in keys {
                match reader.sample(key) {
                    Ok(s) => {
                        out.insert(key.clone(), s);
                    }
                    Err(e) => {
                        tracing::debug!(cgroup = %key, "reading stats: {e}");
                        failed = true;
                    }
                }
            }
        }
        (out, failed)
    }

    /// The node allocatable cgroup's key (`kubepods`), read as the `pods` system
    /// container.
    fn pods_key(&self) -> Option<String> {
        let pc = self.config.pod_cgroups.as_ref()?;
        Some(pc.cgroups.path(&pc.kubepods))
    }

    /// The plan for `pods` and every cgroup in it read, off the async threads.
    async fn read(self: &Arc<Self>, pods: Vec<Pod>) -> Reading {
        let this = self.clone();
        let at = tokio::time::Instant::now();
        tokio::task::spawn_blocking(move || {
            let plans = this.plan(&pods);
            let mut keys: HashSet<String> = plans
                .iter()
                .flat_map(|p| {
                    p.cgroup
                        .iter()
                        .chain(p.containers.iter().filter_map(|c| c.key.as_ref()))
                })
                .cloned()
                .collect();
            keys.extend(this.pods_key());
            let (samples, failed) = this.sample(&keys);
            Reading {
                plans,
                keys,
                at,
                samples,
                failed,
            }
        })
        .await
        .unwrap_or_else(|_| Reading {
            plans: Vec::new(),
            keys: HashSet::new(),
            at,
            samples: HashMap::new(),
            failed: true,
        })
    }

    /// The Summary of the node and `pods` (the node's pods, with their status) to
    /// `detail`, and whether some of it could not be read. `runtimes` give
    /// `runtime.imageFs`.
    pub async fn summary(
        self: &Arc<Self>,
        pods: &[Pod],
        runtimes: &[Arc<dyn Runtime>],
        detail: Detail,
    ) -> (Summary, bool) {
        let full = matches!(
            detail,
            Detail::Full | Detail::Signals | Detail::SignalsMeasured
        );
        let mut reading = self.read(pods.to_vec()).await;
        // A cgroup read for the first time: read everything again a window later,
        // so that it has a rate too.
        let new = detail == Detail::Full
            && reading
                .samples
                .iter()
                .any(|(k, s)| s.cpu_usage_ns.is_some() && !self.rates.has(k));
        if new {
            for (k, s) in &reading.samples {
                if let Some(ns) = s.cpu_usage_ns {
                    self.rates.observe(k, reading.at, ns);
                }
            }
            tokio::time::sleep(rate::MIN_WINDOW).await;
            reading = self.read(pods.to_vec()).await;
        }
        let Reading {
            plans,
            mut keys,
            at,
            samples,
            failed,
        } = reading;
        keys.insert(NODE_KEY.to_owned());
        self.rates.retain(&keys);
        let samples: HashMap<String, (CgroupSample, Option<u64>)> = samples
            .into_iter()
            .map(|(k, s)| {
                let rate = s.cpu_usage_ns.and_then(|ns| self.rates.observe(&k, at, ns));
                (k, (s, rate))
            })
            .collect();
        let now = Time::now();
        let cpu = |key: &str| {
            let (s, rate) = samples.get(key)?;
            Some(CpuStats {
                time: Some(now),
                usage_nano_cores: *rate,
                usage_core_nano_seconds: Some(s.cpu_usage_ns?),
            })
        };
        let memory = |key: &str| Some(memory_stats(samples.get(key)?.0.memory.as_ref()?, now));

        let (layers, disk) = if full {
            let layers = writable_layers(runtimes).await;
            let mounts = layers.values().map(|l| l.mountpoint.clone()).collect();
            let fresh = detail == Detail::SignalsMeasured;
            let disk = self.read_disk(&plans, mounts, at, now, fresh).await;
            (layers, disk)
        } else {
            (HashMap::new(), DiskReading::default())
        };
        let root_fs = disk.root_fs.as_ref();

        let pod_stats = plans
            .into_iter()
            .map(|p| {
                let containers: Vec<ContainerStats> = p
                    .containers
                    .into_iter()
                    .map(|c| {
                        let logs = disk.container_logs.get(&p.log_dir.join(&c.name));
                        let rootfs = layers.get(&c.id).map(|l| {
                            let fs = disk.layer_fs.get(&l.mountpoint).and_then(Option::as_ref);
                            FsStats {
                                time: Some(Time(l.timestamp)),
                                used_bytes: l.used_bytes,
                                inodes_used: l.inodes_used,
                                ..fs.cloned().unwrap_or_default()
                            }
                        });
                        ContainerStats {
                            name: c.name,
                            start_time: c.start_time,
                            cpu: c.key.as_deref().and_then(cpu),
                            memory: c.key.as_deref().and_then(memory),
                            rootfs,
                            logs: logs.map(|u| usage_on(root_fs, *u, now)),
                        }
                    })
                    .collect();
                let measured: Vec<(&VolumePlan, FsStats)> = p
                    .volumes
                    .iter()
                    .filter_map(|v| {
                        let (u, fs) = disk.volumes.get(&v.path)?;
                        Some((v, usage_on(fs.as_ref(), *u, now)))
                    })
                    .collect();
                let ephemeral_storage = full.then(|| {
                    let volumes = measured.iter().filter(|(v, _)| v.ephemeral);
                    let pod_logs = disk.pod_logs.get(&p.log_dir);
                    ephemeral_storage(
                        &containers,
                        volumes.map(|(_, fs)| fs),
                        pod_logs,
                        root_fs,
                        now,
                    )
                });
                PodStats {
                    pod_ref: p.pod_ref,
                    start_time: p.start_time,
                    containers,
                    cpu: p.cgroup.as_deref().and_then(cpu),
                    memory: p.cgroup.as_deref().and_then(memory),
                    process_stats: p.process_count.map(|n| ProcessStats {
                        process_count: Some(n),
                    }),
                    network: p.pid.filter(|_| full).and_then(|pid| {
                        self.network(&format!("{pid}/net"), Some(POD_INTERFACE), now)
                    }),
                    volume_stats: measured
                        .into_iter()
                        .map(|(v, fs)| VolumeStats {
                            fs,
                            name: v.name.clone(),
                            pvc_ref: None,
                        })
                        .collect(),
                    ephemeral_storage,
                }
            })
            .collect();

        // The kubelet's `pods` system container: the node allocatable cgroup, which
        // the eviction manager's `allocatableMemory.available` is read from.
        let system_containers = self
            .pods_key()
            .filter(|k| samples.contains_key(k))
            .map(|k| ContainerStats {
                name: SYSTEM_CONTAINER_PODS.into(),
                start_time: None,
                cpu: cpu(&k),
                memory: memory(&k),
                rootfs: None,
                logs: None,
            })
            .into_iter()
            .collect();
        let node = NodeStats {
            node_name: self.config.node_name.clone(),
            system_containers,
            start_time: self.boot_time(),
            cpu: cpu(NODE_KEY),
            memory: memory(NODE_KEY),
            network: None,
            fs: None,
            runtime: None,
            rlimit: None,
        };
        let mut summary = Summary {
            node,
            pods: pod_stats,
        };
        if let (Detail::Full, Some(csi)) = (detail, &self.csi) {
            for p in &mut summary.pods {
                for u in csi.pod_stats(&p.pod_ref.uid).await {
                    p.volume_stats.push(VolumeStats {
                        fs: FsStats {
                            time: Some(now),
                            available_bytes: u.available_bytes,
                            capacity_bytes: u.capacity_bytes,
                            used_bytes: u.used_bytes,
                            inodes_free: u.inodes_free,
                            inodes: u.inodes,
                            inodes_used: u.inodes_used,
                        },
                        name: u.volume,
                        pvc_ref: u
                            .claim
                            .map(|(namespace, name)| PvcReference { name, namespace }),
                    });
                }
            }
        }
        match detail {
            Detail::Full | Detail::Signals | Detail::SignalsMeasured => {
                let n = &mut summary.node;
                n.network = self.network("net", None, now);
                n.fs = disk.root_fs.clone();
                n.runtime = image_fs(runtimes, now).await.map(|fs| RuntimeStats {
                    image_fs: Some(fs),
                    container_fs: None,
                });
                n.rlimit = Some(self.rlimit(now));
            }
            Detail::CpuAndMemory => summary = summary.cpu_and_memory_only(),
        }
        (summary, failed)
    }

    /// The cgroups of the machine, the pods and their containers as cAdvisor's
    /// series ([`cadvisor`]), the machine's size, and whether some cgroup could not be
    /// read.
    pub async fn cadvisor(
        self: &Arc<Self>,
        pods: &[Pod],
    ) -> (Vec<cadvisor::Series>, cadvisor::Machine, bool) {
        let Reading {
            plans,
            samples,
            failed,
            ..
        } = self.read(pods.to_vec()).await;
        let seconds = |t: Option<Time>| t.map(|t| t.0.as_nanosecond() as f64 / 1e9);
        let series_of = |key: &str, labels: cadvisor::Labels| {
            let sample = samples.get(key).cloned().unwrap_or_default();
            cadvisor::Series {
                labels,
                cpu_ns: sample.cpu_usage_ns,
                memory: sample.memory,
                ..cadvisor::Series::default()
            }
        };
        let interfaces = |net: &str| procfs::parse_net_dev(&self.read_proc(&format!("{net}/dev")));
        let mut root = series_of(
            NODE_KEY,
            cadvisor::Labels {
                id: "/".into(),
                ..cadvisor::Labels::default()
            },
        );
        root.network = interfaces("net");
        root.start_time = seconds(self.boot_time());
        let mut out = vec![root];
        for p in plans {
            let Some(cgroup) = p.cgroup.as_deref() else {
                continue;
            };
            let namespace = p.pod_ref.namespace;
            let pod = p.pod_ref.name;
            let mut series = series_of(
                cgroup,
                cadvisor::Labels {
                    id: cgroup.to_owned(),
                    namespace: namespace.clone(),
                    pod: pod.clone(),
                    ..cadvisor::Labels::default()
                },
            );
            series.network = p
                .pid
                .map(|pid| interfaces(&format!("{pid}/net")))
                .unwrap_or_default();
            series.start_time = seconds(p.start_time);
            out.push(series);
            for c in p.containers {
                let Some(key) = c.key.as_deref() else {
                    continue;
                };
                let mut series = series_of(
                    key,
                    cadvisor::Labels {
                        container: c.name,
                        id: key.to_owned(),
                        image: c.image,
                        name: c.id,
                        namespace: namespace.clone(),
                        pod: pod.clone(),
                    },
                );
                series.start_time = seconds(c.start_time);
                out.push(series);
            }
        }
        let meminfo = self.read_proc("meminfo");
        let meminfo = procfs::parse_meminfo(&meminfo);
        let cores = self
            .read_proc("cpuinfo")
            .lines()
            .filter(|l| l.split(':').next().is_some_and(|k| k.trim() == "processor"))
            .count() as u64;
        let machine = cadvisor::Machine {
            cpu_cores: (cores > 0).then_some(cores),
            memory_bytes: meminfo.get("MemTotal").copied(),
        };
        (out, machine, failed)
    }

    fn read_proc(&self, file: &str) -> String {
        std::fs::read_to_string(self.config.proc.join(file)).unwrap_or_default()
    }

    fn boot_time(&self) -> Option<Time> {
        let secs = procfs::parse_proc_stat(&self.read_proc("stat")).1?;
        jiff::Timestamp::from_second(secs).ok().map(Time)
    }

    /// The interfaces of the network namespace whose `net` directory is `net` (below
    /// `/proc`), but `lo`; inline the `prefer`red one when there is one (a pod's
    /// `eth0`, as the kubelet's), else the default route's, else the first.
    fn network(&self, net: &str, prefer: Option<&str>, now: Time) -> Option<NetworkStats> {
        let devs = procfs::parse_net_dev(&self.read_proc(&format!("{net}/dev")));
        let default = prefer
            .filter(|p| devs.iter().any(|d| d.name == *p))
            .map(str::to_owned)
            .or_else(|| procfs::default_route_interface(&self.read_proc(&format!("{net}/route"))));
        let iface = |d: &procfs::NetDev| InterfaceStats {
            name: d.name.clone(),
            rx_bytes: Some(d.rx_bytes),
            rx_errors: Some(d.rx_errors),
            tx_bytes: Some(d.tx_bytes),
            tx_errors: Some(d.tx_errors),
        };
        let inline = devs
            .iter()
            .find(|d| Some(&d.name) == default.as_ref())
            .or(devs.first())
            .map(iface)?;
        Some(NetworkStats {
            time: Some(now),
            default: inline,
            interfaces: devs.iter().map(iface).collect(),
        })
    }

    fn rlimit(&self, now: Time) -> RlimitStats {
        RlimitStats {
            time: Some(now),
            maxpid: self.read_proc("sys/kernel/pid_max").trim().parse().ok(),
            curproc: procfs::parse_loadavg_total(&self.read_proc("loadavg")),
        }
    }
}

/// The non-directory entries directly in `dir` (the pod log directory's own files),
/// or `None` when it cannot be read.
fn files_in(dir: &Path) -> Option<DiskUsage> {
    let mut total = DiskUsage::default();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| !t.is_dir())
            && let Ok(u) = disk::du(&entry.path())
        {
            total.bytes += u.bytes;
            total.inodes += u.inodes;
        }
    }
    std::fs::metadata(dir).ok().map(|_| total)
}

/// The sum of what may be `None`, `None` only when everything is (the kubelet's
/// `addUsage`).
fn add(total: Option<u64>, more: Option<u64>) -> Option<u64> {
    match (total, more) {
        (Some(a), Some(b)) => Some(a.saturating_add(b)),
        (a, b) => a.or(b),
    }
}

/// A pod's ephemeral storage, as the kubelet's `calcEphemeralStorage`: capacity of
/// the root filesystem; used, the containers' rootfs and logs, the local ephemeral
/// volumes and the pod log directory's own files.
fn ephemeral_storage<'a>(
    containers: &'a [ContainerStats],
    volumes: impl Iterator<Item = &'a FsStats>,
    pod_logs: Option<&DiskUsage>,
    root_fs: Option<&FsStats>,
    now: Time,
) -> FsStats {
    let mut out = FsStats {
        time: Some(now),
        used_bytes: None,
        inodes_used: None,
        ..root_fs.cloned().unwrap_or_default()
    };
    let parts = containers
        .iter()
        .flat_map(|c| c.rootfs.iter().chain(c.logs.iter()))
        .chain(volumes);
    for fs in parts {
        out.used_bytes = add(out.used_bytes, fs.used_bytes);
        out.inodes_used = add(out.inodes_used, fs.inodes_used);
    }
    if let Some(u) = pod_logs {
        out.used_bytes = add(out.used_bytes, Some(u.bytes));
        out.inodes_used = add(out.inodes_used, Some(u.inodes));
    }
    out
}

/// Every runtime's containers' writable layers, by container id. A runtime that
/// cannot say is left out (logged).
async fn writable_layers(runtimes: &[Arc<dyn Runtime>]) -> HashMap<String, FilesystemUsage> {
    let mut out = HashMap::new();
    for runtime in runtimes {
        match runtime.container_fs_usage().await {
            Ok(usage) => out.extend(
                usage
                    .into_iter()
                    .map(|u| (u.container_id, u.writable_layer)),
            ),
            Err(RuntimeError::Unsupported { .. }) => {}
            Err(e) => tracing::debug!(runtime = runtime.name(), "container filesystem usage: {e}"),
        }
    }
    out
}

/// `runtime.imageFs`: the image filesystem of the OCI runtime when there is one,
/// else of the first runtime that reports one; usage from the runtime, capacity
/// from statvfs of its mount point.
async fn image_fs(runtimes: &[Arc<dyn Runtime>], now: Time) -> Option<FsStats> {
    let mut ordered: Vec<&Arc<dyn Runtime>> = runtimes.iter().collect();
    ordered.sort_by_key(|r| r.capabilities().images != ImageKind::Container);
    for runtime in ordered {
        let Ok(usage) = runtime.image_fs_info().await else {
            continue;
        };
        let Some(u) = usage.into_iter().next() else {
            continue;
        };
        let mut fs = fs_stats(&u.mountpoint, now).unwrap_or_default();
        fs.time = Some(now);
        fs.used_bytes = u.used_bytes;
        fs.inodes_used = u.inodes_used;
        return Some(fs);
    }
    None
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::*;
    use crate::cm::cgroup::Driver;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn pod(uid: &str, containers: &[(&str, &str)]) -> Pod {
        let statuses: Vec<serde_json::Value> = containers
            .iter()
            .map(|(name, id)| {
                serde_json::json!({
                    "name": name, "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                    "containerID": id,
                    "state": {"running": {"startedAt": "2026-01-01T00:00:10Z"}}
                })
            })
            .collect();
        let specs: Vec<serde_json::Value> = containers
            .iter()
            .map(|(name, _)| serde_json::json!({"name": name, "image": "i"}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("pod-{uid}"), "namespace": "ns", "uid": uid},
            "spec": {"containers": specs},
            "status": {"startTime": "2026-01-01T00:00:00Z", "containerStatuses": statuses}
        }))
        .unwrap()
    }

    /// A cgroup v1 tree and a `/proc` in a tempdir: pod `a` with one Wasm container,
    /// pod `b` with a CRI container (a cgroup of its own) and a Wasm one.
    fn fixture(root: &Path) -> StatsConfig {
        let cg = root.join("cgroup");
        for c in ["cpu", "cpuacct", "memory"] {
            write(&cg.join(c).join("cgroup.procs"), "1\n");
        }
        write(&cg.join("cpuacct/cpuacct.usage"), "50000000000\n");
        write(&cg.join("memory/memory.usage_in_bytes"), "4294967296\n");
        write(
            &cg.join("memory/memory.stat"),
            "total_inactive_file 1073741824\ntotal_rss 2147483648\n",
        );
        for (pod, cpu, mem) in [
            ("poda", "1000000000", "10485760"),
            ("podb", "3000000000", "20971520"),
        ] {
            let rel = format!("kubepods/burstable/{pod}");
            write(&cg.join("cpu").join(&rel).join("cgroup.procs"), "10\n11\n");
            write(&cg.join("cpuacct").join(&rel).join("cpuacct.usage"), cpu);
            let m = cg.join("memory").join(&rel);
            write(&m.join("cgroup.procs"), "10\n11\n");
            write(&m.join("memory.usage_in_bytes"), mem);
            write(&m.join("memory.limit_in_bytes"), "67108864\n");
            write(
                &m.join("memory.stat"),
                "total_inactive_file 1048576\ntotal_rss 4096\ntotal_pgfault 9\ntotal_pgmajfault 1\n",
            );
        }
        let ctr = "kubepods/burstable/podb/abc123";
        write(
            &cg.join("cpuacct").join(ctr).join("cpuacct.usage"),
            "2000000000\n",
        );
        write(
            &cg.join("memory").join(ctr).join("memory.usage_in_bytes"),
            "8388608\n",
        );
        write(
            &cg.join("memory").join(ctr).join("memory.stat"),
            "total_inactive_file 0\n",
        );
        let proc = root.join("proc");
        write(
            &proc.join("stat"),
            "cpu  1 1 1 1 1 1 1 1 0 0\nbtime 1767225600\n",
        );
        write(
            &proc.join("meminfo"),
            "MemTotal: 8388608 kB\nMemFree: 1048576 kB\n",
        );
        write(
            &proc.join("net/dev"),
            "h1\nh2\n  eth0: 5000 40 1 0 0 0 0 0 3000 30 2 0 0 0 0 0\n",
        );
        write(
            &proc.join("net/route"),
            "Iface\tDestination\neth0\t00000000\n",
        );
        // Process 10 (both pods' first) sits in a network namespace of its own.
        write(
            &proc.join("10/net/dev"),
            "h1\nh2\n    lo: 7 7 0 0 0 0 0 0 7 7 0 0 0 0 0 0\n  eth1: 9 1 0 0 0 0 0 0 9 1 0 0 0 0 0 0\n  eth0: 700 7 0 0 0 0 0 0 800 8 1 0 0 0 0 0\n",
        );
        write(
            &proc.join("10/net/route"),
            "Iface\tDestination\neth1\t00000000\n",
        );
        write(&proc.join("loadavg"), "0.1 0.2 0.3 1/321 99\n");
        write(&proc.join("sys/kernel/pid_max"), "4194304\n");
        let cgroups = CgroupManager::v1(&cg, Driver::Cgroupfs).unwrap();
        StatsConfig {
            node_name: "n".into(),
            root_dir: root.to_owned(),
            pod_logs_dir: root.join("logs"),
            volume_stats_agg_period: Duration::from_secs(60),
            proc,
            cgroup_mount: cg,
            cgroup_version: Some(Version::V1),
            pod_cgroups: Some(PodCgroups {
                cgroups,
                kubepods: CgroupName::new(["kubepods"]),
            }),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_summary_of_fixture_cgroups_matches_pods_by_uid_and_rates_cpu() {
        let dir = tempfile::tempdir().unwrap();
        let provider = Arc::new(StatsProvider::new(fixture(dir.path())));
        let pods = [
            pod("a", &[("main", "wasm://w1")]),
            pod(
                "b",
                &[("app", "containerd://abc123"), ("side", "wasm://w2")],
            ),
            pod("gone", &[("main", "wasm://w3")]),
        ];
        let (s, failed) = provider.summary(&pods, &[], Detail::Full).await;
        assert!(!failed);
        // Node: the root cgroup, capacity from meminfo.
        let n = &s.node;
        assert_eq!(
            n.cpu.as_ref().unwrap().usage_core_nano_seconds,
            Some(50_000_000_000)
        );
        assert_eq!(n.cpu.as_ref().unwrap().usage_nano_cores, Some(0));
        let m = n.memory.as_ref().unwrap();
        assert_eq!(m.working_set_bytes, Some(3 << 30));
        assert_eq!(m.available_bytes, Some((8 << 30) - (3 << 30)));
        assert_eq!(n.start_time.unwrap().0.as_second(), 1767225600);
        assert_eq!(n.network.as_ref().unwrap().default.name, "eth0");
        let r = n.rlimit.as_ref().unwrap();
        assert_eq!((r.maxpid, r.curproc), (Some(4194304), Some(321)));
        assert!(n.fs.as_ref().unwrap().capacity_bytes.unwrap() > 0);

        let a = &s.pods[0];
        assert_eq!(a.pod_ref.uid, "a");
        let mem = a.memory.as_ref().unwrap();
        assert_eq!(mem.working_set_bytes, Some(10485760 - 1048576));
        assert_eq!(mem.available_bytes, Some(67108864 - (10485760 - 1048576)));
        assert_eq!((mem.page_faults, mem.major_page_faults), (Some(9), Some(1)));
        assert_eq!(a.process_stats.as_ref().unwrap().process_count, Some(2));
        // The pod's network namespace, read through one of its processes: eth0
        // inline (not the default route's eth1), lo left out.
        let net = a.network.as_ref().unwrap();
        assert_eq!(net.default.name, "eth0");
        assert_eq!(
            (
                net.default.rx_bytes,
                net.default.tx_bytes,
                net.default.tx_errors
            ),
            (Some(700), Some(800), Some(1))
        );
        let names: Vec<&str> = net.interfaces.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["eth1", "eth0"]);
        // A Wasm pod's only container carries the pod's figures.
        assert_eq!(a.containers[0].cpu, a.cpu);
        assert_eq!(
            a.containers[0].start_time.unwrap().0.as_second(),
            1767225610
        );
        let b = &s.pods[1];
        // The CRI container its own cgroup; the Wasm one of two nothing.
        assert_eq!(
            b.containers[0]
                .cpu
                .as_ref()
                .unwrap()
                .usage_core_nano_seconds,
            Some(2_000_000_000)
        );
        assert_eq!(
            b.containers[0].memory.as_ref().unwrap().working_set_bytes,
            Some(8388608)
        );
        assert_eq!(
            (&b.containers[1].cpu, &b.containers[1].memory),
            (&None, &None)
        );
        // No cgroup: listed, without figures.
        assert_eq!((&s.pods[2].cpu, &s.pods[2].memory), (&None, &None));

        // Two seconds on, pod a burnt one more second: half a core.
        tokio::time::advance(Duration::from_secs(2)).await;
        let usage = dir
            .path()
            .join("cgroup/cpuacct/kubepods/burstable/poda/cpuacct.usage");
        std::fs::write(&usage, "2000000000\n").unwrap();
        let (s, _) = provider.summary(&pods, &[], Detail::Full).await;
        let cpu = s.pods[0].cpu.as_ref().unwrap();
        assert_eq!(cpu.usage_core_nano_seconds, Some(2_000_000_000));
        assert_eq!(cpu.usage_nano_cores, Some(500_000_000));
    }

    #[tokio::test(start_paused = true)]
    async fn volumes_logs_and_ephemeral_storage_are_measured_as_the_kubelet_does() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let provider = Arc::new(StatsProvider::new(fixture(root)));
        let mut pod = pod("a", &[("main", "wasm://w1")]);
        pod.spec.as_mut().unwrap().volumes = serde_json::from_value(serde_json::json!([
            {"name": "data", "emptyDir": {}},
            {"name": "cfg", "configMap": {"name": "c"}},
            {"name": "mem", "emptyDir": {"medium": "Memory"}},
            {"name": "token", "secret": {"secretName": "s"}},
            {"name": "host", "hostPath": {"path": "/"}},
        ]))
        .unwrap();
        let volumes = root.join("pods/a/volumes");
        let data = volumes.join("kubernetes.io~empty-dir/data");
        let cfg = volumes.join("kubernetes.io~configmap/cfg");
        let mem = volumes.join("kubernetes.io~empty-dir/mem");
        write(&data.join("big"), &"x".repeat(200_000));
        write(&cfg.join("key"), "value");
        write(&mem.join("m"), &"m".repeat(50_000));
        // No secret directory: a volume that is not there is not reported.
        let logs = root.join("logs/ns_pod-a_a");
        write(&logs.join("main/0.log"), &"l".repeat(30_000));
        write(&logs.join("extra.log"), &"e".repeat(10_000));

        let (s, _) = provider.summary(&[pod.clone()], &[], Detail::Full).await;
        let p = &s.pods[0];
        let names: Vec<&str> = p.volume_stats.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["data", "cfg", "mem"]);
        let du = |p: &Path| disk::du(p).unwrap();
        let vol = &p.volume_stats[0].fs;
        assert_eq!(vol.used_bytes, Some(du(&data).bytes));
        assert_eq!(vol.inodes_used, Some(2));
        assert!(vol.capacity_bytes.unwrap() > 0 && vol.inodes.unwrap() > 0);

        let root_fs = s.node.fs.as_ref().unwrap();
        let c_logs = p.containers[0].logs.as_ref().unwrap();
        assert_eq!(c_logs.used_bytes, Some(du(&logs.join("main")).bytes));
        assert_eq!(c_logs.inodes_used, Some(2));
        assert_eq!(c_logs.capacity_bytes, root_fs.capacity_bytes);
        assert_eq!(
            p.containers[0].rootfs, None,
            "a Wasm container has no layer"
        );

        // Ephemeral: the logs, the emptyDir on disk, the configMap and the pod log
        // directory's own file; not the Memory emptyDir.
        let eph = p.ephemeral_storage.as_ref().unwrap();
        let want = du(&logs.join("main")).bytes
            + du(&data).bytes
            + du(&cfg).bytes
            + du(&logs.join("extra.log")).bytes;
        assert_eq!(eph.used_bytes, Some(want));
        assert_eq!(eph.inodes_used, Some(2 + 2 + 2 + 1));
        assert_eq!(eph.capacity_bytes, root_fs.capacity_bytes);

        // Within the period a volume is not measured again; logs are.
        write(&data.join("more"), &"y".repeat(100_000));
        write(&logs.join("main/0.log"), &"l".repeat(90_000));
        tokio::time::advance(Duration::from_secs(30)).await;
        let (s, _) = provider.summary(&[pod.clone()], &[], Detail::Full).await;
        let p = &s.pods[0];
        assert_eq!(p.volume_stats[0].fs.used_bytes, vol.used_bytes);
        assert_eq!(
            p.containers[0].logs.as_ref().unwrap().used_bytes,
            Some(du(&logs.join("main")).bytes)
        );
        tokio::time::advance(Duration::from_secs(30)).await;
        let (s, _) = provider.summary(&[pod.clone()], &[], Detail::Full).await;
        assert_eq!(
            s.pods[0].volume_stats[0].fs.used_bytes,
            Some(du(&data).bytes)
        );

        // cpu and memory only: nothing of it is read.
        let (s, _) = provider.summary(&[pod], &[], Detail::CpuAndMemory).await;
        let p = &s.pods[0];
        assert!(p.volume_stats.is_empty() && p.ephemeral_storage.is_none());
        assert_eq!(p.containers[0].logs, None);
    }

    #[tokio::test]
    async fn cadvisor_series_are_the_machine_the_pods_and_containers_with_figures() {
        let dir = tempfile::tempdir().unwrap();
        let config = fixture(dir.path());
        write(
            &config.proc.join("cpuinfo"),
            "processor\t: 0\nmodel name\t: x\n\nprocessor\t: 1\n",
        );
        let provider = Arc::new(StatsProvider::new(config));
        let pods = [
            pod("a", &[("main", "wasm://w1")]),
            pod(
                "b",
                &[("app", "containerd://abc123"), ("side", "wasm://w2")],
            ),
            pod("gone", &[("main", "wasm://w3")]),
        ];
        let (series, machine, failed) = provider.cadvisor(&pods).await;
        assert!(!failed);
        assert_eq!(
            (machine.cpu_cores, machine.memory_bytes),
            (Some(2), Some(8 << 30))
        );
        let got: Vec<(&str, &str, &str, &str)> = series
            .iter()
            .map(|s| {
                let l = &s.labels;
                (
                    l.id.as_str(),
                    l.pod.as_str(),
                    l.container.as_str(),
                    l.name.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("/", "", "", ""),
                ("/kubepods/burstable/poda", "pod-a", "", ""),
                // A Wasm pod's one container: the pod cgroup's figures.
                ("/kubepods/burstable/poda", "pod-a", "main", "w1"),
                ("/kubepods/burstable/podb", "pod-b", "", ""),
                // The CRI container's own cgroup; the second Wasm container has none.
                ("/kubepods/burstable/podb/abc123", "pod-b", "app", "abc123"),
            ]
        );
        assert_eq!(series[0].cpu_ns, Some(50_000_000_000));
        assert_eq!(series[0].network[0].name, "eth0");
        assert_eq!(series[4].cpu_ns, Some(2_000_000_000));
        assert_eq!(series[4].labels.image, "i");
        assert_eq!(
            series[4].memory.as_ref().unwrap().working_set_bytes,
            8388608
        );
        let pod_net: Vec<&str> = series[1].network.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(pod_net, ["eth1", "eth0"]);
        assert!(
            series[2].network.is_empty(),
            "network is on the pod's series"
        );
    }
}
