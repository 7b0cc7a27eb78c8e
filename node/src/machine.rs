//! What the node is made of: CPUs, memory, huge pages, the root filesystem, and the
//! identity fields of `NodeSystemInfo`. Read from `/proc`, `/sys` and `/etc` as
//! cAdvisor reads them for the kubelet; NodeStatus capacity, the eviction manager and
//! the QoS `oom_score_adj` formula are computed from it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where the host's pseudo-filesystems are (tests point these at fixtures).
#[derive(Clone, Debug)]
pub struct HostPaths {
    pub proc: PathBuf,
    pub sys: PathBuf,
    pub etc: PathBuf,
}

impl Default for HostPaths {
    fn default() -> Self {
        HostPaths {
            proc: "/proc".into(),
            sys: "/sys".into(),
            etc: "/etc".into(),
        }
    }
}

/// The machine as the node reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineInfo {
    /// Online logical CPUs.
    pub cpus: u32,
    /// `MemTotal`, in bytes.
    pub memory_bytes: u64,
    /// Huge page size in bytes → bytes reserved in pages of that size
    /// (`hugepages-2Mi` capacity).
    pub hugepages: BTreeMap<u64, u64>,
    pub machine_id: String,
    /// Empty where the firmware does not expose one (many VMs).
    pub system_uuid: String,
    pub boot_id: String,
    pub kernel_version: String,
    /// `PRETTY_NAME` of os-release.
    pub os_image: String,
    /// Go's name for the architecture (`amd64`, `arm64`), as Kubernetes labels use.
    pub architecture: String,
}

/// `0-3,6,8-9` → 7.
pub fn count_cpu_list(list: &str) -> Result<u32, String> {
    let mut n = 0;
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        n += match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (
                    a.parse().map_err(|_| format!("bad CPU list {list:?}"))?,
                    b.parse().map_err(|_| format!("bad CPU list {list:?}"))?,
                );
                if b < a {
                    return Err(format!("bad CPU list {list:?}"));
                }
                b - a + 1
            }
            None => {
                part.parse::<u32>()
                    .map_err(|_| format!("bad CPU list {list:?}"))?;
                1
            }
        };
    }
    Ok(n)
}

/// `MemTotal` of a `/proc/meminfo`, in bytes.
pub fn mem_total(meminfo: &str) -> Result<u64, String> {
    let line = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .ok_or("no MemTotal in /proc/meminfo")?;
    let mut fields = line.split_whitespace().skip(1);
    let value: u64 = fields
        .next()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("bad line {line:?}"))?;
    match fields.next() {
        Some("kB") => Ok(value * 1024),
        None => Ok(value),
        Some(unit) => Err(format!("unknown unit {unit:?} in {line:?}")),
    }
}

/// `PRETTY_NAME` of an os-release file (quotes removed).
pub fn pretty_name(os_release: &str) -> Option<String> {
    os_release.lines().find_map(|l| {
        let v = l.strip_prefix("PRETTY_NAME=")?;
        Some(v.trim().trim_matches('"').trim_matches('\'').to_owned())
    })
}

/// Rust's architecture name in Go's spelling.
pub fn go_arch(rust_arch: &str) -> &str {
    match rust_arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        other => other,
    }
}

fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
}

impl MachineInfo {
    /// Reads the machine. CPUs and memory are required; identity fields that the host
    /// does not have are left empty.
    pub fn read(paths: &HostPaths) -> Result<Self, String> {
        let online = paths.sys.join("devices/system/cpu/online");
        let cpus = count_cpu_list(
            &std::fs::read_to_string(&online).map_err(|e| format!("{}: {e}", online.display()))?,
        )?;
        let meminfo = paths.proc.join("meminfo");
        let memory_bytes = mem_total(
            &std::fs::read_to_string(&meminfo)
                .map_err(|e| format!("{}: {e}", meminfo.display()))?,
        )?;
        let mut hugepages = BTreeMap::new();
        if let Ok(entries) = std::fs::read_dir(paths.sys.join("kernel/mm/hugepages")) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(kb) = name
                    .strip_prefix("hugepages-")
                    .and_then(|s| s.strip_suffix("kB"))
                    .and_then(|s| s.parse::<u64>().ok())
                else {
                    continue;
                };
                let pages: u64 = read_trimmed(&e.path().join("nr_hugepages"))
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                hugepages.insert(kb * 1024, kb * 1024 * pages);
            }
        }
        let kernel_version =
            read_trimmed(&paths.proc.join("sys/kernel/osrelease")).unwrap_or_default();
        let os_image = std::fs::read_to_string(paths.etc.join("os-release"))
            .ok()
            .and_then(|t| pretty_name(&t))
            .unwrap_or_else(|| "Linux".to_owned());
        Ok(MachineInfo {
            cpus,
            memory_bytes,
            hugepages,
            machine_id: read_trimmed(&paths.etc.join("machine-id")).unwrap_or_default(),
            system_uuid: read_trimmed(&paths.sys.join("class/dmi/id/product_uuid"))
                .unwrap_or_default(),
            boot_id: read_trimmed(&paths.proc.join("sys/kernel/random/boot_id"))
                .unwrap_or_default(),
            kernel_version,
            os_image,
            architecture: go_arch(std::env::consts::ARCH).to_owned(),
        })
    }
}

/// Size and free space of the filesystem holding `path` (the node's root dir holds
/// `ephemeral-storage`), in bytes and inodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsStats {
    pub capacity_bytes: u64,
    pub available_bytes: u64,
    pub inodes: u64,
    pub inodes_free: u64,
}

/// [`FsStats`] of the filesystem holding `path`.
pub fn fs_stats(path: &Path) -> Result<FsStats, String> {
    let s =
        nix::sys::statvfs::statvfs(path).map_err(|e| format!("statvfs {}: {e}", path.display()))?;
    let frag = s.fragment_size() as u64;
    Ok(FsStats {
        capacity_bytes: s.blocks() as u64 * frag,
        available_bytes: s.blocks_available() as u64 * frag,
        inodes: s.files() as u64,
        inodes_free: s.files_free() as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_are_counted() {
        assert_eq!(count_cpu_list("0-1\n").unwrap(), 2);
        assert_eq!(count_cpu_list("0-3,6,8-9").unwrap(), 7);
        assert_eq!(count_cpu_list("0").unwrap(), 1);
        assert!(count_cpu_list("3-1").is_err());
        assert!(count_cpu_list("a").is_err());
    }

    #[test]
    fn meminfo_and_os_release_are_parsed() {
        assert_eq!(
            mem_total("MemTotal:       24683656 kB\nMemFree: 1 kB\n").unwrap(),
            24683656 * 1024
        );
        assert!(mem_total("MemFree: 1 kB\n").is_err());
        assert_eq!(
            pretty_name("NAME=\"Debian\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n")
                .as_deref(),
            Some("Debian GNU/Linux 12 (bookworm)")
        );
        assert_eq!(go_arch("x86_64"), "amd64");
        assert_eq!(go_arch("aarch64"), "arm64");
    }

    #[test]
    fn a_machine_is_read_from_its_pseudo_filesystems() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let write = |rel: &str, text: &str| {
            let p = root.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        write("sys/devices/system/cpu/online", "0-7\n");
        write("proc/meminfo", "MemTotal: 8000 kB\n");
        write(
            "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages",
            "4\n",
        );
        write(
            "sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages",
            "0\n",
        );
        write("proc/sys/kernel/osrelease", "6.1.0-18-amd64\n");
        write("proc/sys/kernel/random/boot_id", "b00t\n");
        write("etc/machine-id", "m4ch1ne\n");
        write(
            "etc/os-release",
            "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n",
        );
        let m = MachineInfo::read(&HostPaths {
            proc: root.join("proc"),
            sys: root.join("sys"),
            etc: root.join("etc"),
        })
        .unwrap();
        assert_eq!(m.cpus, 8);
        assert_eq!(m.memory_bytes, 8000 * 1024);
        assert_eq!(m.hugepages[&(2 << 20)], 4 * (2 << 20));
        assert_eq!(m.hugepages[&(1 << 30)], 0);
        assert_eq!(m.kernel_version, "6.1.0-18-amd64");
        assert_eq!(
            (m.boot_id.as_str(), m.machine_id.as_str()),
            ("b00t", "m4ch1ne")
        );
        assert_eq!(m.system_uuid, "", "no DMI here");
        assert_eq!(m.os_image, "Debian GNU/Linux 12 (bookworm)");
    }

    #[test]
    fn this_machine_can_be_read() {
        let m = MachineInfo::read(&HostPaths::default()).unwrap();
        assert!(m.cpus >= 1);
        assert!(m.memory_bytes > 0);
        let fs = fs_stats(Path::new("/")).unwrap();
        assert!(fs.capacity_bytes >= fs.available_bytes && fs.capacity_bytes > 0);
    }
}
