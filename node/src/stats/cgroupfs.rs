//! Reading a cgroup's CPU and memory counters, as cAdvisor reads them for the
//! kubelet: cgroup v1 `cpuacct.usage` (ns), `memory.usage_in_bytes`,
//! `memory.limit_in_bytes` and `memory.stat` (`total_inactive_file`, `total_rss`,
//! `total_pgfault`, `total_pgmajfault`); cgroup v2 `cpu.stat` (`usage_usec`),
//! `memory.current`, `memory.max` and `memory.stat` (`inactive_file`, `anon`,
//! `pgfault`, `pgmajfault`). The working set is usage minus inactive file pages,
//! floored at 0 (cAdvisor's `setMemoryStats`).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use crate::cm::cgroup::Version;

/// A limit at or above this is "no limit" (v1 writes `9223372036854771712`).
const UNLIMITED: u64 = 1 << 62;

/// The counters read from one cgroup at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupSample {
    /// Cumulative CPU time, in ns.
    pub cpu_usage_ns: Option<u64>,
    pub memory: Option<MemorySample>,
}

/// A cgroup's memory, in bytes and faults.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemorySample {
    pub usage_bytes: u64,
    pub working_set_bytes: u64,
    pub rss_bytes: Option<u64>,
    /// Page cache (v1 `total_cache`, v2 `file`).
    pub cache_bytes: Option<u64>,
    pub page_faults: Option<u64>,
    pub major_page_faults: Option<u64>,
    /// `None`: no limit.
    pub limit_bytes: Option<u64>,
}

/// `memory.stat`'s `key value` lines.
pub fn parse_flat_keyed(text: &str) -> BTreeMap<&str, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k, v.trim().parse().ok()?))
        })
        .collect()
}

/// A single-number file (`cpuacct.usage`, `memory.usage_in_bytes`); `max` is `None`.
pub fn parse_single(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// A limit file: `None` when it is `max` or at the v1 "unlimited" value.
pub fn parse_limit(text: &str) -> Option<u64> {
    parse_single(text).filter(|v| *v < UNLIMITED)
}

/// cgroup v1 memory from `memory.usage_in_bytes`, `memory.limit_in_bytes`, `memory.stat`.
pub fn v1_memory(usage: &str, limit: Option<&str>, stat: &str) -> Option<MemorySample> {
    let usage = parse_single(usage)?;
    let stat = parse_flat_keyed(stat);
    let inactive = stat.get("total_inactive_file").copied().unwrap_or(0);
    Some(MemorySample {
        usage_bytes: usage,
        working_set_bytes: usage.saturating_sub(inactive),
        rss_bytes: stat.get("total_rss").copied(),
        cache_bytes: stat.get("total_cache").copied(),
        page_faults: stat.get("total_pgfault").copied(),
        major_page_faults: stat.get("total_pgmajfault").copied(),
        limit_bytes: limit.and_then(parse_limit),
    })
}

/// cgroup v2 memory from `memory.current`, `memory.max`, `memory.stat`.
pub fn v2_memory(current: &str, max: Option<&str>, stat: &str) -> Option<MemorySample> {
    let usage = parse_single(current)?;
    let stat = parse_flat_keyed(stat);
    let inactive = stat.get("inactive_file").copied().unwrap_or(0);
    Some(MemorySample {
        usage_bytes: usage,
        working_set_bytes: usage.saturating_sub(inactive),
        rss_bytes: stat.get("anon").copied(),
        cache_bytes: stat.get("file").copied(),
        page_faults: stat.get("pgfault").copied(),
        major_page_faults: stat.get("pgmajfault").copied(),
        limit_bytes: max.and_then(parse_limit),
    })
}

/// cgroup v2 `cpu.stat`'s `usage_usec`, in ns.
pub fn v2_cpu_ns(cpu_stat: &str) -> Option<u64> {
    parse_flat_keyed(cpu_stat)
        .get("usage_usec")
        .map(|us| us.saturating_mul(1000))
}

/// Reads cgroups by their path below the hierarchy's root (the driver's naming, as
/// [`crate::cm::cgroup::CgroupManager::path`] gives it).
#[derive(Clone, Debug)]
pub struct CgroupReader {
    version: Version,
    mount_root: PathBuf,
}

fn read(path: &Path) -> io::Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
    }
}

impl CgroupReader {
    pub fn new(version: Version, mount_root: impl Into<PathBuf>) -> Self {
        Self {
            version,
            mount_root: mount_root.into(),
        }
    }

    /// The cgroup's directory in `controller`'s hierarchy (v2: the one hierarchy).
    pub fn dir(&self, controller: &str, rel: &str) -> PathBuf {
        let rel = rel.trim_start_matches('/');
        match self.version {
            Version::V1 => self.mount_root.join(controller).join(rel),
            Version::V2 => self.mount_root.join(rel),
        }
    }

    /// The cgroup's counters; a cgroup that does not exist reads as empty.
    pub fn sample(&self, rel: &str) -> io::Result<CgroupSample> {
        match self.version {
            Version::V1 => {
                let cpu = read(&self.dir("cpuacct", rel).join("cpuacct.usage"))?;
                let mem = self.dir("memory", rel);
                let usage = read(&mem.join("memory.usage_in_bytes"))?;
                let memory = match usage {
                    Some(usage) => {
                        let limit = read(&mem.join("memory.limit_in_bytes"))?;
                        let stat = read(&mem.join("memory.stat"))?.unwrap_or_default();
                        v1_memory(&usage, limit.as_deref(), &stat)
                    }
                    None => None,
                };
                Ok(CgroupSample {
                    cpu_usage_ns: cpu.as_deref().and_then(parse_single),
                    memory,
                })
            }
            Version::V2 => {
                let dir = self.dir("", rel);
                let cpu = read(&dir.join("cpu.stat"))?;
                let memory = match read(&dir.join("memory.current"))? {
                    Some(current) => {
                        let max = read(&dir.join("memory.max"))?;
                        let stat = read(&dir.join("memory.stat"))?.unwrap_or_default();
                        v2_memory(&current, max.as_deref(), &stat)
                    }
                    None => None,
                };
                Ok(CgroupSample {
                    cpu_usage_ns: cpu.as_deref().and_then(v2_cpu_ns),
                    memory,
                })
            }
        }
    }

    /// The cgroup directly below `rel` (in the memory hierarchy) whose name holds
    /// `id`: a CRI container's cgroup under its pod's (`<id>` with cgroupfs,
    /// `cri-containerd-<id>.scope` with systemd). Its path, as `rel` is written.
    pub fn find_child(&self, rel: &str, id: &str) -> Option<String> {
        if id.is_empty() {
            return None;
        }
        let entries = std::fs::read_dir(self.dir("memory", rel)).ok()?;
        entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|name| name.contains(id))
            .map(|name| format!("{}/{name}", rel.trim_end_matches('/')))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1_STAT: &str = "cache 4096\nrss 1000\ntotal_cache 819200\ntotal_rss 5242880\ntotal_inactive_file 409600\ntotal_active_file 409600\ntotal_pgfault 1234\ntotal_pgmajfault 5\n";

    fn write(dir: &Path, file: &str, text: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(file), text).unwrap();
    }

    #[test]
    fn v1_memory_stat_gives_the_working_set_and_faults() {
        let m = v1_memory("6291456\n", Some("9223372036854771712\n"), V1_STAT).unwrap();
        assert_eq!(m.usage_bytes, 6291456);
        assert_eq!(m.working_set_bytes, 6291456 - 409600);
        assert_eq!(m.rss_bytes, Some(5242880));
        assert_eq!(m.page_faults, Some(1234));
        assert_eq!(m.major_page_faults, Some(5));
        assert_eq!(m.limit_bytes, None);
        // Inactive file above usage (it happens with racing reads): 0, not a wrap.
        let m = v1_memory("100", Some("1048576"), "total_inactive_file 4096\n").unwrap();
        assert_eq!((m.working_set_bytes, m.limit_bytes), (0, Some(1048576)));
        assert!(v1_memory("", None, V1_STAT).is_none());
    }

    #[test]
    fn v2_files_are_parsed() {
        let stat = "anon 2097152\nfile 1048576\ninactive_file 524288\npgfault 77\npgmajfault 2\n";
        let m = v2_memory("3145728\n", Some("max\n"), stat).unwrap();
        assert_eq!(m.working_set_bytes, 3145728 - 524288);
        assert_eq!(
            (m.rss_bytes, m.page_faults, m.major_page_faults),
            (Some(2097152), Some(77), Some(2))
        );
        assert_eq!(m.limit_bytes, None);
        assert_eq!(
            v2_cpu_ns("usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n"),
            Some(1_500_000)
        );
    }

    #[test]
    fn a_v1_tree_in_a_tempdir_is_sampled_and_its_container_found() {
        let root = tempfile::tempdir().unwrap();
        let pod = "kubepods/burstable/podabc";
        write(
            &root.path().join("cpuacct").join(pod),
            "cpuacct.usage",
            "987654321\n",
        );
        let mem = root.path().join("memory").join(pod);
        write(&mem, "memory.usage_in_bytes", "6291456\n");
        write(&mem, "memory.limit_in_bytes", "134217728\n");
        write(&mem, "memory.stat", V1_STAT);
        write(&mem.join("0123abcd"), "memory.usage_in_bytes", "4096\n");
        let reader = CgroupReader::new(Version::V1, root.path());
        let s = reader.sample(&format!("/{pod}")).unwrap();
        assert_eq!(s.cpu_usage_ns, Some(987654321));
        let m = s.memory.unwrap();
        assert_eq!(
            (m.working_set_bytes, m.limit_bytes),
            (6291456 - 409600, Some(134217728))
        );
        assert_eq!(
            reader.find_child(&format!("/{pod}"), "0123abcd").as_deref(),
            Some("/kubepods/burstable/podabc/0123abcd")
        );
        assert_eq!(reader.find_child(&format!("/{pod}"), "ffff"), None);
        // A cgroup that is gone reads as empty.
        assert_eq!(
            reader.sample("/kubepods/gone").unwrap(),
            CgroupSample::default()
        );
    }
}
