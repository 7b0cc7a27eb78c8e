//! Node capacity and allocatable, with the kubelet's formula:
//! `allocatable = capacity − kubeReserved − systemReserved − hard eviction thresholds`,
//! and memory less what huge pages hold.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::machine::{FsStats, MachineInfo};
use crate::quantity;

/// A hard eviction threshold: an amount, or a share of the capacity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Threshold {
    Bytes(u64),
    /// 0.0 – 1.0.
    Fraction(f64),
}

impl Threshold {
    pub fn of(self, capacity: u64) -> u64 {
        match self {
            Threshold::Bytes(b) => b,
            Threshold::Fraction(f) => (capacity as f64 * f).round() as u64,
        }
    }
}

/// The eviction signals the kubelet knows.
pub const SIGNALS: [&str; 9] = [
    "memory.available",
    "allocatableMemory.available",
    "nodefs.available",
    "nodefs.inodesFree",
    "imagefs.available",
    "imagefs.inodesFree",
    "containerfs.available",
    "containerfs.inodesFree",
    "pid.available",
];

/// The kubelet's default `evictionHard`.
pub fn default_eviction_hard() -> BTreeMap<String, Threshold> {
    BTreeMap::from([
        ("memory.available".into(), Threshold::Bytes(100 << 20)),
        ("nodefs.available".into(), Threshold::Fraction(0.10)),
        ("nodefs.inodesFree".into(), Threshold::Fraction(0.05)),
        ("imagefs.available".into(), Threshold::Fraction(0.15)),
    ])
}

/// Parses a map of thresholds by signal (`evictionHard`, `evictionSoft`,
/// `evictionMinimumReclaim`: `memory.available: 100Mi`, `nodefs.available: 10%`);
/// `what` names the field in errors.
pub fn parse_thresholds(
    what: &str,
    map: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, Threshold>, Vec<String>> {
    let mut out = BTreeMap::new();
    let mut errors = Vec::new();
    for (signal, value) in map {
        if !SIGNALS.contains(&signal.as_str()) {
            errors.push(format!("{what}: unknown signal {signal:?}"));
            continue;
        }
        // As the kubelet's parseThresholdStatement: 0% and 100% set no threshold (a
        // way to turn a default off).
        if matches!(value.trim(), "0%" | "100%") {
            continue;
        }
        let parsed = match value.strip_suffix('%') {
            Some(p) => p
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|p| (0.0..=100.0).contains(p))
                .map(|p| Threshold::Fraction(p / 100.0))
                .ok_or(()),
            None => quantity::bytes(&Quantity(value.clone()))
                .map(Threshold::Bytes)
                .map_err(drop),
        };
        match parsed {
            Ok(t) => {
                out.insert(signal.clone(), t);
            }
            Err(()) => errors.push(format!(
                "{what}: {signal}: {value:?} is neither a quantity nor a percentage"
            )),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// What the node keeps back from pods.
#[derive(Clone, Debug, PartialEq)]
pub struct Reservations {
    pub kube_reserved: BTreeMap<String, Quantity>,
    pub system_reserved: BTreeMap<String, Quantity>,
    pub eviction_hard: BTreeMap<String, Threshold>,
}

impl Default for Reservations {
    fn default() -> Self {
        Reservations {
            kube_reserved: BTreeMap::new(),
            system_reserved: BTreeMap::new(),
            eviction_hard: default_eviction_hard(),
        }
    }
}

/// A node's resources in plain numbers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    pub milli_cpu: u64,
    pub memory: u64,
    pub ephemeral_storage: u64,
    pub pods: u64,
    /// Page size → bytes.
    pub hugepages: BTreeMap<u64, u64>,
}

impl Resources {
    /// The node's capacity.
    pub fn capacity(machine: &MachineInfo, root_fs: Option<FsStats>, max_pods: u32) -> Self {
        Resources {
            milli_cpu: u64::from(machine.cpus) * 1000,
            memory: machine.memory_bytes,
            ephemeral_storage: root_fs.map_or(0, |f| f.capacity_bytes),
            pods: u64::from(max_pods),
            hugepages: machine.hugepages.clone(),
        }
    }

    /// Capacity less reservations and hard eviction thresholds, never below zero.
    pub fn allocatable(&self, r: &Reservations) -> Result<Self, String> {
        let reserved = |name: &str, as_milli: bool| -> Result<u64, String> {
            let mut total = 0u64;
            for (what, map) in [
                ("kubeReserved", &r.kube_reserved),
                ("systemReserved", &r.system_reserved),
            ] {
                if let Some(q) = map.get(name) {
                    let v = quantity::parse(q).map_err(|e| format!("{what}.{name}: {e}"))?;
                    if v < 0.0 {
                        return Err(format!("{what}.{name}: negative quantity {:?}", q.0));
                    }
                    total += if as_milli {
                        (v * 1000.0).ceil() as u64
                    } else {
                        v.ceil() as u64
                    };
                }
            }
            Ok(total)
        };
        let threshold =
            |signal: &str, capacity: u64| r.eviction_hard.get(signal).map_or(0, |t| t.of(capacity));
        let hugepages: u64 = self.hugepages.values().sum();
        Ok(Resources {
            milli_cpu: self.milli_cpu.saturating_sub(reserved("cpu", true)?),
            memory: self
                .memory
                .saturating_sub(reserved("memory", false)?)
                .saturating_sub(threshold("memory.available", self.memory))
                .saturating_sub(hugepages),
            ephemeral_storage: self
                .ephemeral_storage
                .saturating_sub(reserved("ephemeral-storage", false)?)
                .saturating_sub(threshold("nodefs.available", self.ephemeral_storage)),
            pods: self.pods,
            hugepages: self.hugepages.clone(),
        })
    }

    /// As a `ResourceList` in the kubelet's canonical forms.
    pub fn to_list(&self) -> BTreeMap<String, Quantity> {
        let mut list = BTreeMap::from([
            ("cpu".to_owned(), quantity::milli_cpu(self.milli_cpu)),
            ("memory".to_owned(), quantity::binary_si(self.memory)),
            (
                "ephemeral-storage".to_owned(),
                quantity::binary_si(self.ephemeral_storage),
            ),
            ("pods".to_owned(), Quantity(self.pods.to_string())),
        ]);
        for (size, bytes) in &self.hugepages {
            list.insert(
                format!("hugepages-{}", quantity::binary_si(*size).0),
                quantity::binary_si(*bytes),
            );
        }
        list
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine() -> MachineInfo {
        MachineInfo {
            cpus: 4,
            memory_bytes: 16 << 30,
            hugepages: BTreeMap::from([(2 << 20, 512 << 20), (1 << 30, 0)]),
            ..Default::default()
        }
    }

    fn fs() -> FsStats {
        FsStats {
            capacity_bytes: 100 << 30,
            available_bytes: 50 << 30,
            inodes: 1000,
            inodes_free: 500,
        }
    }

    #[test]
    fn capacity_is_the_machine() {
        let cap = Resources::capacity(&machine(), Some(fs()), 110).to_list();
        assert_eq!(cap["cpu"].0, "4");
        assert_eq!(cap["memory"].0, "16Gi");
        assert_eq!(cap["ephemeral-storage"].0, "100Gi");
        assert_eq!(cap["pods"].0, "110");
        assert_eq!(cap["hugepages-2Mi"].0, "512Mi");
        assert_eq!(cap["hugepages-1Gi"].0, "0");
    }

    #[test]
    fn allocatable_subtracts_reservations_thresholds_and_hugepages() {
        let cap = Resources::capacity(&machine(), Some(fs()), 110);
        // Defaults: only the hard eviction thresholds.
        let a = cap.allocatable(&Reservations::default()).unwrap();
        assert_eq!(a.milli_cpu, 4000);
        assert_eq!(a.memory, (16 << 30) - (100 << 20) - (512 << 20));
        assert_eq!(a.ephemeral_storage, (100 << 30) - (10 << 30));
        assert_eq!(a.pods, 110);

        let r = Reservations {
            kube_reserved: BTreeMap::from([
                ("cpu".into(), Quantity("500m".into())),
                ("memory".into(), Quantity("1Gi".into())),
            ]),
            system_reserved: BTreeMap::from([
                ("cpu".into(), Quantity("250m".into())),
                ("ephemeral-storage".into(), Quantity("5Gi".into())),
            ]),
            eviction_hard: parse_thresholds(
                "evictionHard",
                &BTreeMap::from([
                    ("memory.available".into(), "5%".into()),
                    ("nodefs.available".into(), "1Gi".into()),
                ]),
            )
            .unwrap(),
        };
        let a = cap.allocatable(&r).unwrap();
        assert_eq!(a.to_list()["cpu"].0, "3250m");
        let five_percent = ((16u64 << 30) as f64 * 0.05).round() as u64;
        assert_eq!(
            a.memory,
            (16 << 30) - (1 << 30) - five_percent - (512 << 20)
        );
        assert_eq!(a.ephemeral_storage, (100 << 30) - (5 << 30) - (1 << 30));

        let greedy = Reservations {
            kube_reserved: BTreeMap::from([("cpu".into(), Quantity("64".into()))]),
            ..Reservations::default()
        };
        assert_eq!(
            cap.allocatable(&greedy).unwrap().milli_cpu,
            0,
            "never negative"
        );
    }

    #[test]
    fn eviction_thresholds_are_validated() {
        let errors = parse_thresholds(
            "evictionHard",
            &BTreeMap::from([
                ("memory.avail".into(), "1Gi".into()),
                ("nodefs.available".into(), "150%".into()),
                ("imagefs.available".into(), "lots".into()),
            ]),
        )
        .unwrap_err();
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(
            errors[0].contains("imagefs.available")
                || errors.iter().any(|e| e.contains("memory.avail"))
        );
    }
}
