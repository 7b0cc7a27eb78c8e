//! The machine's CPU and NUMA layout, read from sysfs as the kubelet's CPU manager
//! reads it through cAdvisor: each online logical CPU's socket, core and NUMA node,
//! and the NUMA distance table. The sysfs root is a parameter so tests can lay out
//! a multi-NUMA machine in a directory.
//!
//! ```text
//! <sys>/devices/system/cpu/online                      0-3
//! <sys>/devices/system/cpu/cpu<N>/topology/physical_package_id
//! <sys>/devices/system/cpu/cpu<N>/topology/core_id
//! <sys>/devices/system/node/node<M>/cpulist            0-1
//! <sys>/devices/system/node/node<M>/distance           10 21
//! ```
//!
//! A machine without `devices/system/node` (a kernel built without NUMA) is one NUMA
//! node, 0, holding every CPU.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::cpuset::CpuSet;

/// Where one logical CPU sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuInfo {
    /// `physical_package_id`.
    pub socket: u32,
    /// The core, named by its lowest logical CPU id (unique across sockets, as the
    /// kubelet names cores).
    pub core: u32,
    pub numa_node: u32,
}

/// The machine's CPUs and NUMA nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuTopology {
    pub cpus: BTreeMap<u32, CpuInfo>,
    /// NUMA node → its distance to every node, in node order (`node<M>/distance`);
    /// empty when sysfs has no table.
    pub distances: BTreeMap<u32, Vec<u32>>,
    numa_nodes: BTreeSet<u32>,
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("read {}: {e}", path.display()))
}

fn read_u32(path: &Path) -> Result<u32, String> {
    let text = read(path)?;
    text.trim()
        .parse()
        .map_err(|_| format!("{}: {:?} is not a number", path.display(), text.trim()))
}

impl CpuTopology {
    /// Reads the topology under `sys` (normally `/sys`).
    pub fn read(sys: &Path) -> Result<Self, String> {
        let cpu_dir = sys.join("devices/system/cpu");
        let online: CpuSet = read(&cpu_dir.join("online"))?
            .parse()
            .map_err(|e| format!("{}: {e}", cpu_dir.join("online").display()))?;
        // NUMA node of each CPU, from the nodes' cpulists.
        let node_dir = sys.join("devices/system/node");
        let mut numa_of: BTreeMap<u32, u32> = BTreeMap::new();
        let mut distances = BTreeMap::new();
        let mut numa_nodes = BTreeSet::new();
        if let Ok(entries) = std::fs::read_dir(&node_dir) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(id) = name
                    .to_str()
                    .and_then(|n| n.strip_prefix("node"))
                    .and_then(|n| n.parse::<u32>().ok())
                else {
                    continue;
                };
                let list_path = entry.path().join("cpulist");
                let cpus: CpuSet = read(&list_path)?
                    .parse()
                    .map_err(|e| format!("{}: {e}", list_path.display()))?;
                for cpu in cpus.iter() {
                    numa_of.insert(cpu, id);
                }
                numa_nodes.insert(id);
                if let Ok(text) = read(&entry.path().join("distance")) {
                    let row: Vec<u32> = text
                        .split_whitespace()
                        .map(|d| d.parse())
                        .collect::<Result<_, _>>()
                        .map_err(|_| format!("{}/distance: {text:?}", entry.path().display()))?;
                    distances.insert(id, row);
                }
            }
        }
        if numa_nodes.is_empty() {
            numa_nodes.insert(0);
        }
        // Cores: (socket, core_id) → the lowest logical CPU on it.
        let mut raw = Vec::new();
        for cpu in online.iter() {
            let topo = cpu_dir.join(format!("cpu{cpu}/topology"));
            let socket = read_u32(&topo.join("physical_package_id")).unwrap_or(0);
            let core_id = read_u32(&topo.join("core_id")).unwrap_or(cpu);
            raw.push((cpu, socket, core_id));
        }
        let mut core_names: BTreeMap<(u32, u32), u32> = BTreeMap::new();
        for &(cpu, socket, core_id) in &raw {
            let name = core_names.entry((socket, core_id)).or_insert(cpu);
            *name = (*name).min(cpu);
        }
        let cpus = raw
            .into_iter()
            .map(|(cpu, socket, core_id)| {
                let info = CpuInfo {
                    socket,
                    core: core_names[&(socket, core_id)],
                    numa_node: numa_of.get(&cpu).copied().unwrap_or(0),
                };
                (cpu, info)
            })
            .collect();
        Ok(CpuTopology {
            cpus,
            distances,
            numa_nodes,
        })
    }

    /// A topology given directly: `(cpu, socket, core, numa node)` per CPU.
    pub fn from_cpus(cpus: &[(u32, u32, u32, u32)]) -> Self {
        let cpus: BTreeMap<u32, CpuInfo> = cpus
            .iter()
            .map(|&(cpu, socket, core, numa_node)| {
                (
                    cpu,
                    CpuInfo {
                        socket,
                        core,
                        numa_node,
                    },
                )
            })
            .collect();
        let numa_nodes = cpus.values().map(|c| c.numa_node).collect();
        CpuTopology {
            cpus,
            distances: BTreeMap::new(),
            numa_nodes,
        }
    }

    /// Every online CPU.
    pub fn all(&self) -> CpuSet {
        self.cpus.keys().copied().collect()
    }

    /// NUMA node ids, ascending.
    pub fn numa_nodes(&self) -> Vec<u32> {
        self.numa_nodes.iter().copied().collect()
    }

    /// The CPUs of NUMA node `node`.
    pub fn cpus_in_numa(&self, node: u32) -> CpuSet {
        self.cpus
            .iter()
            .filter(|(_, i)| i.numa_node == node)
            .map(|(c, _)| *c)
            .collect()
    }

    pub fn sockets(&self) -> BTreeSet<u32> {
        self.cpus.values().map(|c| c.socket).collect()
    }

    pub fn cpus_in_socket(&self, socket: u32) -> CpuSet {
        self.cpus
            .iter()
            .filter(|(_, i)| i.socket == socket)
            .map(|(c, _)| *c)
            .collect()
    }

    /// The logical CPUs of core `core` (hyper-thread siblings).
    pub fn cpus_in_core(&self, core: u32) -> CpuSet {
        self.cpus
            .iter()
            .filter(|(_, i)| i.core == core)
            .map(|(c, _)| *c)
            .collect()
    }

    /// Logical CPUs per core (1 without SMT).
    pub fn cpus_per_core(&self) -> usize {
        let cores: BTreeSet<u32> = self.cpus.values().map(|c| c.core).collect();
        if cores.is_empty() {
            return 1;
        }
        self.cpus.len().div_ceil(cores.len())
    }

    /// The NUMA distance from `a` to `b` (10 to itself, 20 otherwise, where sysfs
    /// has no table).
    pub fn distance(&self, a: u32, b: u32) -> u32 {
        let index = self.numa_nodes.iter().position(|n| *n == b);
        self.distances
            .get(&a)
            .zip(index)
            .and_then(|(row, i)| row.get(i).copied())
            .unwrap_or(if a == b { 10 } else { 20 })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Lays out a machine under `root`: `numa` lists each node's CPUs; every CPU is
    /// its own core on socket = its NUMA node unless `smt` pairs (2n, 2n+1).
    pub(crate) fn write_sysfs(root: &Path, numa: &[&str], smt: bool) {
        let all: CpuSet = numa
            .iter()
            .map(|l| l.parse::<CpuSet>().unwrap())
            .fold(CpuSet::new(), |a, b| a.union(&b));
        let cpu = root.join("devices/system/cpu");
        std::fs::create_dir_all(&cpu).unwrap();
        std::fs::write(cpu.join("online"), format!("{all}\n")).unwrap();
        for (node, list) in numa.iter().enumerate() {
            let dir = root.join(format!("devices/system/node/node{node}"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("cpulist"), format!("{list}\n")).unwrap();
            let row: Vec<String> = (0..numa.len())
                .map(|other| if other == node { "10" } else { "21" }.to_string())
                .collect();
            std::fs::write(dir.join("distance"), row.join(" ") + "\n").unwrap();
            for c in list.parse::<CpuSet>().unwrap().iter() {
                let topo = cpu.join(format!("cpu{c}/topology"));
                std::fs::create_dir_all(&topo).unwrap();
                std::fs::write(topo.join("physical_package_id"), format!("{node}\n")).unwrap();
                let core = if smt { c / 2 } else { c };
                std::fs::write(topo.join("core_id"), format!("{core}\n")).unwrap();
            }
        }
    }

    #[test]
    fn a_two_numa_machine_is_read_from_a_sysfs_fixture() {
        let dir = tempfile::tempdir().unwrap();
        write_sysfs(dir.path(), &["0-3", "4-7"], true);
        let t = CpuTopology::read(dir.path()).unwrap();
        assert_eq!(t.all().to_string(), "0-7");
        assert_eq!(t.numa_nodes(), [0, 1]);
        assert_eq!(t.cpus_in_numa(1).to_string(), "4-7");
        assert_eq!(t.cpus_per_core(), 2);
        assert_eq!(t.cpus_in_core(4).to_string(), "4-5");
        assert_eq!(t.cpus[&5].core, 4);
        assert_eq!(t.cpus[&5].socket, 1);
        assert_eq!(t.distance(0, 1), 21);
        assert_eq!(t.distance(1, 1), 10);
    }

    #[test]
    fn a_machine_without_numa_is_one_node() {
        let dir = tempfile::tempdir().unwrap();
        let cpu = dir.path().join("devices/system/cpu");
        std::fs::create_dir_all(&cpu).unwrap();
        std::fs::write(cpu.join("online"), "0-1\n").unwrap();
        let t = CpuTopology::read(dir.path()).unwrap();
        assert_eq!(t.numa_nodes(), [0]);
        assert_eq!(t.cpus_in_numa(0).to_string(), "0-1");
        assert_eq!(t.cpus_per_core(), 1);
    }

    #[test]
    fn this_machine_can_be_read() {
        let t = CpuTopology::read(Path::new("/sys")).unwrap();
        assert!(!t.all().is_empty());
        assert!(!t.numa_nodes().is_empty());
    }
}
