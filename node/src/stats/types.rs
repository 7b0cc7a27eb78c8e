//! The kubelet's `stats/v1alpha1` Summary API types (`k8s.io/kubelet/pkg/apis/stats/v1alpha1`,
//! `types.go`), with the same JSON keys: what `/stats/summary` answers and what
//! metrics-server reads. Optional fields are `omitempty` upstream and are left out of
//! the JSON when `None`; times are `metav1.Time` (RFC 3339, whole seconds).

use serde::{Deserialize, Serialize};

/// `metav1.Time`: RFC 3339 in UTC with whole seconds, as Go's `metav1.Time` marshals.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Time(pub jiff::Timestamp);

impl Time {
    pub fn now() -> Self {
        Time(jiff::Timestamp::now())
    }
}

impl Serialize for Time {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let secs = jiff::Timestamp::from_second(self.0.as_second()).unwrap_or(self.0);
        s.serialize_str(&secs.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
    }
}

impl<'de> Deserialize<'de> for Time {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map(Time).map_err(serde::de::Error::custom)
    }
}

/// `Summary`: the node and its pods.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub node: NodeStats,
    pub pods: Vec<PodStats>,
}

/// `NodeStats`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    pub node_name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub system_containers: Vec<ContainerStats>,
    pub start_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs: Option<FsStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rlimit: Option<RlimitStats>,
}

/// `RlimitStats`: the node's process limit and count.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RlimitStats {
    pub time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maxpid: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub curproc: Option<i64>,
}

/// `RuntimeStats`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeStats {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_fs: Option<FsStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_fs: Option<FsStats>,
}

/// `PodStats`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    pub pod_ref: PodReference,
    pub start_time: Option<Time>,
    pub containers: Vec<ContainerStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    #[serde(rename = "volume", default, skip_serializing_if = "Vec::is_empty")]
    pub volume_stats: Vec<VolumeStats>,
    #[serde(
        rename = "ephemeral-storage",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub ephemeral_storage: Option<FsStats>,
    #[serde(
        rename = "process_stats",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub process_stats: Option<ProcessStats>,
}

/// `VolumeStats`: a pod volume's filesystem figures (inline), its name in the pod
/// spec and, for a PVC, its claim.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStats {
    #[serde(flatten)]
    pub fs: FsStats,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc_ref: Option<PvcReference>,
}

/// `PVCReference`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PvcReference {
    pub name: String,
    pub namespace: String,
}

/// `PodReference`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PodReference {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

/// `ProcessStats`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessStats {
    #[serde(
        rename = "process_count",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub process_count: Option<u64>,
}

/// `ContainerStats`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    pub name: String,
    pub start_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<FsStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs: Option<FsStats>,
}

/// `InterfaceStats`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceStats {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_errors: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_errors: Option<u64>,
}

/// `NetworkStats`: the default interface inline, every interface in `interfaces`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NetworkStats {
    pub time: Option<Time>,
    #[serde(flatten)]
    pub default: InterfaceStats,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<InterfaceStats>,
}

/// `CPUStats`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    pub time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_nano_cores: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_core_nano_seconds: Option<u64>,
}

/// `MemoryStats`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    pub time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_set_bytes: Option<u64>,
    #[serde(rename = "rssBytes", default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_faults: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major_page_faults: Option<u64>,
}

/// `FsStats`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FsStats {
    pub time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inodes_free: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inodes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inodes_used: Option<u64>,
}

impl Summary {
    /// What `?only_cpu_and_memory=true` answers: the kubelet's
    /// `GetCPUAndMemoryStats`, node, pod and container cpu and memory only.
    pub fn cpu_and_memory_only(mut self) -> Self {
        let n = &mut self.node;
        n.network = None;
        n.fs = None;
        n.runtime = None;
        n.rlimit = None;
        for c in &mut n.system_containers {
            c.rootfs = None;
            c.logs = None;
        }
        for p in &mut self.pods {
            p.network = None;
            p.volume_stats.clear();
            p.ephemeral_storage = None;
            p.process_stats = None;
            for c in &mut p.containers {
                c.rootfs = None;
                c.logs = None;
            }
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key of a JSON object tree, as `a.b.c` paths (array elements as `[]`).
    fn keys(v: &serde_json::Value, at: &str, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    let path = if at.is_empty() {
                        k.clone()
                    } else {
                        format!("{at}.{k}")
                    };
                    out.push(path.clone());
                    keys(v, &path, out);
                }
            }
            serde_json::Value::Array(a) => {
                for v in a {
                    keys(v, &format!("{at}[]"), out);
                }
            }
            _ => {}
        }
    }

    #[test]
    fn a_full_summary_serializes_with_the_upstream_json_keys() {
        let t = Time("2026-12-02T06:35:14.123456789Z".parse().unwrap());
        let cpu = Some(CpuStats {
            time: Some(t),
            usage_nano_cores: Some(1),
            usage_core_nano_seconds: Some(2),
        });
        let memory = Some(MemoryStats {
            time: Some(t),
            available_bytes: Some(1),
            usage_bytes: Some(2),
            working_set_bytes: Some(3),
            rss_bytes: Some(4),
            page_faults: Some(5),
            major_page_faults: Some(6),
        });
        let fs = Some(FsStats {
            time: Some(t),
            available_bytes: Some(1),
            capacity_bytes: Some(2),
            used_bytes: Some(3),
            inodes_free: Some(4),
            inodes: Some(5),
            inodes_used: Some(6),
        });
        let iface = InterfaceStats {
            name: "eth0".into(),
            rx_bytes: Some(1),
            rx_errors: Some(2),
            tx_bytes: Some(3),
            tx_errors: Some(4),
        };
        let network = Some(NetworkStats {
            time: Some(t),
            default: iface.clone(),
            interfaces: vec![iface],
        });
        let container = ContainerStats {
            name: "main".into(),
            start_time: Some(t),
            cpu: cpu.clone(),
            memory: memory.clone(),
            rootfs: fs.clone(),
            logs: fs.clone(),
        };
        let summary = Summary {
            node: NodeStats {
                node_name: "n".into(),
                system_containers: vec![container.clone()],
                start_time: Some(t),
                cpu: cpu.clone(),
                memory: memory.clone(),
                network: network.clone(),
                fs: fs.clone(),
                runtime: Some(RuntimeStats {
                    image_fs: fs.clone(),
                    container_fs: fs.clone(),
                }),
                rlimit: Some(RlimitStats {
                    time: Some(t),
                    maxpid: Some(1),
                    curproc: Some(2),
                }),
            },
            pods: vec![PodStats {
                pod_ref: PodReference {
                    name: "p".into(),
                    namespace: "default".into(),
                    uid: "u".into(),
                },
                start_time: Some(t),
                containers: vec![container],
                cpu,
                memory,
                network,
                volume_stats: vec![VolumeStats {
                    fs: FsStats {
                        used_bytes: Some(1),
                        ..FsStats::default()
                    },
                    name: "v".into(),
                    pvc_ref: Some(PvcReference {
                        name: "c".into(),
                        namespace: "default".into(),
                    }),
                }],
                ephemeral_storage: fs,
                process_stats: Some(ProcessStats {
                    process_count: Some(1),
                }),
            }],
        };
        let json = serde_json::to_value(&summary).unwrap();
        let mut got = Vec::new();
        keys(&json, "", &mut got);
        let leaf = |prefix: &str, names: &[&str]| -> Vec<String> {
            names.iter().map(|n| format!("{prefix}.{n}")).collect()
        };
        let cpu_keys = ["time", "usageNanoCores", "usageCoreNanoSeconds"];
        let mem_keys = [
            "time",
            "availableBytes",
            "usageBytes",
            "workingSetBytes",
            "rssBytes",
            "pageFaults",
            "majorPageFaults",
        ];
        let fs_keys = [
            "time",
            "availableBytes",
            "capacityBytes",
            "usedBytes",
            "inodesFree",
            "inodes",
            "inodesUsed",
        ];
        let if_keys = ["name", "rxBytes", "rxErrors", "txBytes", "txErrors"];
        let mut want: Vec<String> = ["node", "pods"].map(String::from).to_vec();
        want.extend(leaf(
            "node",
            &[
                "nodeName",
                "systemContainers",
                "startTime",
                "cpu",
                "memory",
                "network",
                "fs",
                "runtime",
                "rlimit",
            ],
        ));
        let container_keys = |p: &str, want: &mut Vec<String>| {
            want.extend(leaf(
                p,
                &["name", "startTime", "cpu", "memory", "rootfs", "logs"],
            ));
            want.extend(leaf(&format!("{p}.cpu"), &cpu_keys));
            want.extend(leaf(&format!("{p}.memory"), &mem_keys));
            want.extend(leaf(&format!("{p}.rootfs"), &fs_keys));
            want.extend(leaf(&format!("{p}.logs"), &fs_keys));
        };
        let network_keys = |p: &str, want: &mut Vec<String>| {
            want.extend(leaf(p, &["time", "interfaces"]));
            want.extend(leaf(p, &if_keys));
            want.extend(leaf(&format!("{p}.interfaces[]"), &if_keys));
        };
        container_keys("node.systemContainers[]", &mut want);
        want.extend(leaf("node.cpu", &cpu_keys));
        want.extend(leaf("node.memory", &mem_keys));
        network_keys("node.network", &mut want);
        want.extend(leaf("node.fs", &fs_keys));
        want.extend(leaf("node.runtime", &["imageFs", "containerFs"]));
        want.extend(leaf("node.runtime.imageFs", &fs_keys));
        want.extend(leaf("node.runtime.containerFs", &fs_keys));
        want.extend(leaf("node.rlimit", &["time", "maxpid", "curproc"]));
        want.extend(leaf(
            "pods[]",
            &[
                "podRef",
                "startTime",
                "containers",
                "cpu",
                "memory",
                "network",
                "volume",
                "ephemeral-storage",
                "process_stats",
            ],
        ));
        want.extend(leaf("pods[].podRef", &["name", "namespace", "uid"]));
        container_keys("pods[].containers[]", &mut want);
        want.extend(leaf("pods[].cpu", &cpu_keys));
        want.extend(leaf("pods[].memory", &mem_keys));
        network_keys("pods[].network", &mut want);
        want.extend(leaf(
            "pods[].volume[]",
            &["time", "usedBytes", "name", "pvcRef"],
        ));
        want.extend(leaf("pods[].volume[].pvcRef", &["name", "namespace"]));
        want.extend(leaf("pods[].ephemeral-storage", &fs_keys));
        want.push("pods[].process_stats.process_count".into());
        got.sort();
        want.sort();
        assert_eq!(got, want);
        // metav1.Time: whole seconds, UTC.
        assert_eq!(json["node"]["startTime"], "2026-12-02T06:35:14Z");
        // It reads back.
        let back: Summary = serde_json::from_value(json).unwrap();
        assert_eq!(back.pods[0].pod_ref.uid, "u");
    }

    #[test]
    fn unset_fields_are_left_out_and_cpu_and_memory_only_strips_the_rest() {
        let summary = Summary {
            node: NodeStats {
                node_name: "n".into(),
                fs: Some(FsStats::default()),
                ..NodeStats::default()
            },
            pods: vec![PodStats {
                process_stats: Some(ProcessStats::default()),
                ..PodStats::default()
            }],
        };
        let json = serde_json::to_value(&summary).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "node": {"nodeName": "n", "startTime": null, "fs": {"time": null}},
                "pods": [{
                    "podRef": {"name": "", "namespace": "", "uid": ""},
                    "startTime": null,
                    "containers": [],
                    "process_stats": {}
                }]
            })
        );
        let only = serde_json::to_value(summary.cpu_and_memory_only()).unwrap();
        assert!(only["node"].get("fs").is_none());
        assert!(only["pods"][0].get("process_stats").is_none());
    }
}
