//! The task's cgroup, as the OCI spec's `linux.cgroupsPath` names it (the cgroupfs
//! form `/kubepods/burstable/pod<uid>/<id>` or systemd's `slice:prefix:name`): made
//! for the sandbox process, limited as the spec says, read for `Stats`, removed with
//! the sandbox. cgroup v1 (each hierarchy) and v2 (the unified tree).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use containerd_shim_protos::cgroups::metrics::{
    CPUStat, CPUUsage, MemoryEntry, MemoryStat, Metrics, PidsStat,
};

use crate::spec::Resources;

pub const MOUNT_ROOT: &str = "/sys/fs/cgroup";

/// The v1 hierarchies a task cgroup is made in. Not `cpuset`: a new cpuset cgroup
/// takes no process until its CPUs and memory nodes are written, and the pod's own
/// cpuset cgroup (the kubelet's) already holds the pod to its CPUs.
const V1_HIERARCHIES: [&str; 6] = ["memory", "cpu", "cpuacct", "pids", "blkio", "devices"];

/// `cgroupsPath` as a path below each hierarchy's root.
pub fn relative_path(cgroups_path: &str) -> anyhow::Result<PathBuf> {
    let absolute = if let Some((slice, rest)) = cgroups_path.split_once(':') {
        let Some((prefix, name)) = rest.split_once(':') else {
            bail!("cgroupsPath {cgroups_path:?} is neither a path nor slice:prefix:name");
        };
        let mut path = expand_slice(slice)?;
        let unit = if name.ends_with(".slice") {
            name.to_owned()
        } else if prefix.is_empty() {
            format!("{name}.scope")
        } else {
            format!("{prefix}-{name}.scope")
        };
        path.push(unit);
        path
    } else {
        PathBuf::from(cgroups_path)
    };
    let mut rel = PathBuf::new();
    for part in absolute.to_str().unwrap_or_default().split('/') {
        match part {
            "" | "." => {}
            ".." => bail!("cgroupsPath {cgroups_path:?} has a '..' component"),
            p => rel.push(p),
        }
    }
    if rel.as_os_str().is_empty() {
        bail!("cgroupsPath {cgroups_path:?} names the root cgroup");
    }
    Ok(rel)
}

/// systemd's slice name as its path: `a-b-c.slice` is `/a.slice/a-b.slice/a-b-c.slice`.
fn expand_slice(slice: &str) -> anyhow::Result<PathBuf> {
    let slice = if slice.is_empty() {
        "system.slice"
    } else {
        slice
    };
    let Some(stem) = slice.strip_suffix(".slice") else {
        bail!("{slice:?} is not a systemd slice (no .slice suffix)");
    };
    let mut path = PathBuf::from("/");
    if stem == "-" {
        return Ok(path);
    }
    let mut prefix = String::new();
    for part in stem.split('-') {
        if part.is_empty() {
            bail!("systemd slice {slice:?} has an empty component");
        }
        prefix = if prefix.is_empty() {
            part.to_owned()
        } else {
            format!("{prefix}-{part}")
        };
        path.push(format!("{prefix}.slice"));
    }
    Ok(path)
}

/// One task cgroup, in every hierarchy it was made in.
#[derive(Debug, Clone)]
pub struct TaskCgroup {
    /// As the spec named it.
    pub name: String,
    /// Its directory in each hierarchy (one on v2).
    pub dirs: Vec<PathBuf>,
    v2: bool,
}

impl TaskCgroup {
    /// Makes (or finds) the cgroup `cgroups_path` under `mount_root`.
    pub fn create(mount_root: &Path, cgroups_path: &str) -> anyhow::Result<TaskCgroup> {
        let rel = relative_path(cgroups_path)?;
        let v2 = mount_root.join("cgroup.controllers").is_file();
        let dirs: Vec<PathBuf> = if v2 {
            vec![mount_root.join(&rel)]
        } else {
            let mut seen = std::collections::BTreeSet::new();
            V1_HIERARCHIES
                .iter()
                .map(|h| mount_root.join(h))
                .filter(|h| h.join("cgroup.procs").is_file())
                // `cpu` and `cpuacct` are often one co-mounted hierarchy.
                .filter(|h| seen.insert(std::fs::canonicalize(h).unwrap_or_else(|_| h.clone())))
                .map(|h| h.join(&rel))
                .collect()
        };
        if dirs.is_empty() {
            bail!("no cgroup hierarchy is mounted at {}", mount_root.display());
        }
        for dir in &dirs {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating cgroup {}", dir.display()))?;
        }
        Ok(TaskCgroup {
            name: cgroups_path.to_owned(),
            dirs,
            v2,
        })
    }

    /// The hierarchy-relative path for `PodCgroup::open` (which joins a process to it).
    pub fn parent_for_join(&self) -> anyhow::Result<String> {
        Ok(format!("/{}", relative_path(&self.name)?.display()))
    }

    /// The controller file `name` (`memory.stat`, …): in the hierarchy that has it.
    fn file(&self, name: &str) -> Option<PathBuf> {
        self.dirs.iter().map(|d| d.join(name)).find(|p| p.exists())
    }

    fn write(&self, name: &str, value: &str) -> anyhow::Result<()> {
        let Some(path) = self.file(name) else {
            bail!("cgroup {} has no {name}", self.name);
        };
        std::fs::write(&path, value)
            .with_context(|| format!("writing {value} to {}", path.display()))
    }

    fn read(&self, name: &str) -> Option<String> {
        std::fs::read_to_string(self.file(name)?).ok()
    }

    fn read_u64(&self, name: &str) -> u64 {
        self.read(name)
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Applies the spec's memory limit and CPU shares and quota.
    pub fn apply(&self, resources: &Resources) -> anyhow::Result<()> {
        if let Some(limit) = resources.memory_limit() {
            if self.v2 {
                self.write("memory.max", &limit.to_string())?;
            } else {
                self.write("memory.limit_in_bytes", &limit.to_string())?;
            }
        }
        if let Some(cpu) = &resources.cpu {
            if let Some(shares) = cpu.shares.filter(|s| *s > 0) {
                if self.v2 {
                    // runc's conversion of shares [2, 262144] to weight [1, 10000].
                    let weight = 1 + ((shares.clamp(2, 262_144) - 2) * 9999) / 262_142;
                    self.write("cpu.weight", &weight.to_string())?;
                } else {
                    self.write("cpu.shares", &shares.to_string())?;
                }
            }
            if let Some(quota) = cpu.quota.filter(|q| *q > 0) {
                let period = cpu.period.filter(|p| *p > 0).unwrap_or(100_000);
                if self.v2 {
                    self.write("cpu.max", &format!("{quota} {period}"))?;
                } else {
                    self.write("cpu.cfs_period_us", &period.to_string())?;
                    self.write("cpu.cfs_quota_us", &quota.to_string())?;
                }
            }
        }
        Ok(())
    }

    /// Whether the kernel OOM-killed a process of this cgroup.
    pub fn oom_killed(&self) -> bool {
        let text = if self.v2 {
            self.read("memory.events")
        } else {
            self.read("memory.oom_control")
        };
        text.unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once(' '))
            .any(|(k, v)| k == "oom_kill" && v.trim() != "0")
    }

    /// containerd's v1 metrics (`io.containerd.cgroups.v1.Metrics`), what `ctr task
    /// metrics` and CRI's container stats read. On v2 the same fields are filled from
    /// the unified files.
    pub fn metrics(&self) -> Metrics {
        let mut m = Metrics::new();
        let stat: std::collections::HashMap<String, u64> = self
            .read("memory.stat")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once(' '))
            .filter_map(|(k, v)| Some((k.to_owned(), v.trim().parse().ok()?)))
            .collect();
        let get = |k: &str| stat.get(k).copied().unwrap_or(0);
        let mut memory = MemoryStat::new();
        let mut usage = MemoryEntry::new();
        if self.v2 {
            usage.usage = self.read_u64("memory.current");
            usage.max = self.read_u64("memory.peak");
            usage.limit = self
                .read("memory.max")
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(u64::MAX);
            memory.rss = get("anon");
            memory.cache = get("file");
            memory.mapped_file = get("file_mapped");
            memory.inactive_file = get("inactive_file");
            memory.active_file = get("active_file");
            memory.inactive_anon = get("inactive_anon");
            memory.active_anon = get("active_anon");
            memory.pg_fault = get("pgfault");
            memory.pg_maj_fault = get("pgmajfault");
        } else {
            usage.usage = self.read_u64("memory.usage_in_bytes");
            usage.max = self.read_u64("memory.max_usage_in_bytes");
            usage.limit = self.read_u64("memory.limit_in_bytes");
            usage.failcnt = self.read_u64("memory.failcnt");
            memory.cache = get("cache");
            memory.rss = get("rss");
            memory.rss_huge = get("rss_huge");
            memory.mapped_file = get("mapped_file");
            memory.dirty = get("dirty");
            memory.writeback = get("writeback");
            memory.pg_pg_in = get("pgpgin");
            memory.pg_pg_out = get("pgpgout");
            memory.pg_fault = get("pgfault");
            memory.pg_maj_fault = get("pgmajfault");
            memory.inactive_anon = get("inactive_anon");
            memory.active_anon = get("active_anon");
            memory.inactive_file = get("inactive_file");
            memory.active_file = get("active_file");
            memory.unevictable = get("unevictable");
            memory.total_cache = get("total_cache");
            memory.total_rss = get("total_rss");
            memory.total_inactive_file = get("total_inactive_file");
            memory.total_active_file = get("total_active_file");
        }
        memory.usage = protobuf::MessageField::some(usage);
        m.memory = protobuf::MessageField::some(memory);

        let mut cpu_usage = CPUUsage::new();
        if self.v2 {
            let cpu: std::collections::HashMap<String, u64> = self
                .read("cpu.stat")
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.split_once(' '))
                .filter_map(|(k, v)| Some((k.to_owned(), v.trim().parse().ok()?)))
                .collect();
            let us = |k: &str| cpu.get(k).copied().unwrap_or(0) * 1000;
            cpu_usage.total = us("usage_usec");
            cpu_usage.user = us("user_usec");
            cpu_usage.kernel = us("system_usec");
        } else {
            cpu_usage.total = self.read_u64("cpuacct.usage");
            cpu_usage.per_cpu = self
                .read("cpuacct.usage_percpu")
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|v| v.parse().ok())
                .collect();
            // cpuacct.stat counts USER_HZ ticks (100 per second on Linux).
            for line in self.read("cpuacct.stat").unwrap_or_default().lines() {
                if let Some((k, v)) = line.split_once(' ') {
                    let ns = v.trim().parse::<u64>().unwrap_or(0) * 10_000_000;
                    match k {
                        "user" => cpu_usage.user = ns,
                        "system" => cpu_usage.kernel = ns,
                        _ => {}
                    }
                }
            }
        }
        let mut cpu = CPUStat::new();
        cpu.usage = protobuf::MessageField::some(cpu_usage);
        m.cpu = protobuf::MessageField::some(cpu);

        let mut pids = PidsStat::new();
        pids.current = self.read_u64("pids.current");
        pids.limit = self
            .read("pids.max")
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        m.pids = protobuf::MessageField::some(pids);
        m
    }

    /// Removes the cgroup once its processes are gone; a cgroup still in use stays.
    pub fn remove(&self) {
        for dir in &self.dirs {
            if let Err(e) = std::fs::remove_dir(dir)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(cgroup = %dir.display(), "cannot remove the task cgroup: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroups_paths_in_both_forms() {
        assert_eq!(
            relative_path("/kubepods/burstable/podu/abc").unwrap(),
            Path::new("kubepods/burstable/podu/abc")
        );
        assert_eq!(
            relative_path("default/t1").unwrap(),
            Path::new("default/t1")
        );
        assert_eq!(
            relative_path("kubepods-burstable-podu.slice:cri-containerd:abc").unwrap(),
            Path::new(
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podu.slice/cri-containerd-abc.scope"
            )
        );
        assert_eq!(
            relative_path("system.slice:docker:x").unwrap(),
            Path::new("system.slice/docker-x.scope")
        );
        assert_eq!(relative_path("-.slice::x").unwrap(), Path::new("x.scope"));
        for bad in ["/", "/a/../b", "a:b", "kube--x.slice:p:n", "notaslice:p:n"] {
            assert!(relative_path(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
