//! The QoS and pod cgroup hierarchy on this machine's real cgroup v1, for Wasm pods
//! and container pods alike, read back from the cgroup files: the formulas' values,
//! processes in their pod cgroups, a memory limit enforced, a CPU limit measured, and
//! nothing left once the pods are gone. Each node has a `cgroupRoot` of its own.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use wasmlet_testkit::containerd::{Containerd, images::BUSYBOX_IMAGE};
use wasmlet_testkit::node::{NodeOptions, TestNode, poll};

use crate::*;

/// `<mount>/<hierarchy><cgroup root>/kubepods/<qos>/pod<uid>`.
pub(crate) fn pod_cgroup(node: &TestNode, hierarchy: &str, qos: &str, pod: &Pod) -> PathBuf {
    let mut p = PathBuf::from("/sys/fs/cgroup")
        .join(hierarchy)
        .join(node.cgroup_root.trim_start_matches('/'))
        .join("kubepods");
    if qos != "Guaranteed" {
        p = p.join(qos.to_lowercase());
    }
    p.join(format!("pod{}", pod.metadata.uid.as_deref().unwrap()))
}

pub(crate) fn read(path: PathBuf) -> String {
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_owned()
}

fn wasm_pod(name: &str, image_name: &str, resources: &str, env: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    image: {}\n    imagePullPolicy: IfNotPresent\n    env: [{{name: INTERVAL_MS, value: \"200\"}}{env}]\n{resources}",
        image(image_name)
    )
}

#[test]
fn wasm_pods_of_each_qos_class_live_in_their_pod_cgroups_with_the_kubelets_values() {
    let node = start(&["ticker"]);
    let guaranteed = "    resources: {limits: {cpu: 200m, memory: 64Mi}}\n";
    let burstable =
        "    resources: {requests: {cpu: 100m, memory: 32Mi}, limits: {memory: 128Mi}}\n";
    node.write_manifest("g.yaml", &wasm_pod("g", "ticker", guaranteed, ""))
        .unwrap();
    node.write_manifest("b.yaml", &wasm_pod("b", "ticker", burstable, ""))
        .unwrap();
    node.write_manifest("be.yaml", &wasm_pod("be", "ticker", "", ""))
        .unwrap();
    let g = node.wait_pod("g", LONG, is_running).unwrap();
    let b = node.wait_pod("b", LONG, is_running).unwrap();
    let be = node.wait_pod("be", LONG, is_running).unwrap();

    // Guaranteed, directly under kubepods: shares from the request, the quota from the
    // limit, the memory limit plus the Wasm sandbox's 64 Mi overhead.
    assert_eq!(
        read(pod_cgroup(&node, "cpu", "Guaranteed", &g).join("cpu.shares")),
        "204"
    );
    assert_eq!(
        read(pod_cgroup(&node, "cpu", "Guaranteed", &g).join("cpu.cfs_quota_us")),
        "20000"
    );
    assert_eq!(
        read(pod_cgroup(&node, "cpu", "Guaranteed", &g).join("cpu.cfs_period_us")),
        "100000"
    );
    assert_eq!(
        read(pod_cgroup(&node, "memory", "Guaranteed", &g).join("memory.limit_in_bytes")),
        (128u64 << 20).to_string()
    );
    // Burstable: shares from the request, no quota without a CPU limit.
    assert_eq!(
        read(pod_cgroup(&node, "cpu", "Burstable", &b).join("cpu.shares")),
        "102"
    );
    assert_eq!(
        read(pod_cgroup(&node, "cpu", "Burstable", &b).join("cpu.cfs_quota_us")),
        "-1"
    );
    assert_eq!(
        read(pod_cgroup(&node, "memory", "Burstable", &b).join("memory.limit_in_bytes")),
        (192u64 << 20).to_string()
    );
    // BestEffort: the minimum shares.
    assert_eq!(
        read(pod_cgroup(&node, "cpu", "BestEffort", &be).join("cpu.shares")),
        "2"
    );
    // The QoS cgroups.
    let qos = PathBuf::from("/sys/fs/cgroup/cpu")
        .join(node.cgroup_root.trim_start_matches('/'))
        .join("kubepods");
    assert_eq!(read(qos.join("besteffort/cpu.shares")), "2");
    assert!(
        read(qos.join("burstable/cpu.shares"))
            .parse::<u64>()
            .unwrap()
            >= 102
    );

    // Each pod's sandbox process is in its pod cgroup (every hierarchy), with the
    // oom_score_adj of its QoS class (BestEffort 1000; Guaranteed's -997 cannot be
    // set here without CAP_SYS_RESOURCE: it is clamped to the node's own value).
    let sandboxes = node.sandbox_pids();
    assert_eq!(sandboxes.len(), 3);
    for (pod, qos) in [(&g, "Guaranteed"), (&b, "Burstable"), (&be, "BestEffort")] {
        for hierarchy in ["cpu", "memory", "pids"] {
            let procs = read(pod_cgroup(&node, hierarchy, qos, pod).join("cgroup.procs"));
            let pids: Vec<u32> = procs.lines().filter_map(|l| l.parse().ok()).collect();
            assert_eq!(pids.len(), 1, "{qos} {hierarchy}: {procs}");
            assert!(sandboxes.contains(&pids[0]));
            if hierarchy == "cpu" {
                let adj: i64 = read(PathBuf::from(format!("/proc/{}/oom_score_adj", pids[0])))
                    .parse()
                    .unwrap();
                let node_adj: i64 = read(PathBuf::from("/proc/self/oom_score_adj"))
                    .parse()
                    .unwrap();
                match qos {
                    "BestEffort" => assert_eq!(adj, 1000),
                    "Guaranteed" => assert_eq!(adj, (-997i64).max(node_adj)),
                    _ => assert!((3..=999).contains(&adj), "{adj}"),
                }
            }
        }
    }

    // Gone with their pods.
    for f in ["g.yaml", "b.yaml", "be.yaml"] {
        node.remove_manifest(f).unwrap();
    }
    for name in ["g", "b", "be"] {
        node.wait_gone(name, LONG).unwrap();
    }
    for (pod, qos) in [(&g, "Guaranteed"), (&b, "Burstable"), (&be, "BestEffort")] {
        let cg = pod_cgroup(&node, "cpu", qos, pod);
        poll(Duration::from_secs(15), || (!cg.exists()).then_some(()))
            .unwrap_or_else(|| panic!("{} is left", cg.display()));
    }
}

#[test]
fn a_wasm_container_over_its_memory_limit_is_oom_killed_and_restarted() {
    let node = start(&["memhog", "ticker"]);
    let limited = "    resources: {limits: {memory: 64Mi}}\n";
    node.write_manifest(
        "hog.yaml",
        &wasm_pod("hog", "memhog", limited, ", {name: MIB, value: \"200\"}"),
    )
    .unwrap();
    node.write_manifest("calm.yaml", &wasm_pod("calm", "ticker", "", ""))
        .unwrap();
    let hog = node
        .wait_pod("hog", LONG, |p| container(p).restart_count >= 1)
        .unwrap();
    let last = container(&hog)
        .last_state
        .and_then(|s| s.terminated)
        .expect("the killed instance");
    assert_eq!(
        (last.exit_code, last.reason.as_deref()),
        (137, Some("OOMKilled"))
    );
    // The other pod and the node are untouched (polled: a node that is busy
    // restarting the hog may answer /pods late).
    let calm = node
        .wait_pod("calm", LONG, is_running)
        .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
    assert_eq!(container(&calm).restart_count, 0);
    assert!(node.log().contains("wasmlet is running"));
    node.remove_manifest("hog.yaml").unwrap();
    node.wait_gone("hog", LONG).unwrap();
}

#[test]
fn a_busy_wasm_container_limited_to_200m_uses_a_fifth_of_a_core() {
    let node = start(&["spin"]);
    let limited = "    resources: {limits: {cpu: 200m, memory: 64Mi}}\n";
    node.write_manifest("busy.yaml", &wasm_pod("busy", "spin", limited, ""))
        .unwrap();
    let busy = node.wait_pod("busy", LONG, is_running).unwrap();
    let usage = pod_cgroup(&node, "cpuacct", "Guaranteed", &busy).join("cpuacct.usage");
    let ns = || -> u64 { read(usage.clone()).parse().unwrap() };
    // Let it reach its steady state, then measure 10 s.
    poll(Duration::from_secs(10), || {
        (ns() > 100_000_000).then_some(())
    })
    .expect("it runs");
    let (start_ns, start) = (ns(), Instant::now());
    poll(Duration::from_secs(15), || {
        (start.elapsed() >= Duration::from_secs(10)).then_some(())
    })
    .unwrap();
    let used = (ns() - start_ns) as f64 / start.elapsed().as_nanos() as f64;
    eprintln!(
        "a busy loop limited to 200m used {:.1} % of a core over 10 s",
        used * 100.0
    );
    assert!(used <= 0.23, "{:.1} % of a core", used * 100.0);
    assert!(used >= 0.10, "it ran: {:.1} %", used * 100.0);
}

#[test]
fn container_pods_get_their_pod_cgroup_as_cgroup_parent() {
    let containerd = Containerd::start().expect("containerd starts");
    containerd.import_test_images().expect("test images import");
    let node = start_with(NodeOptions::default().with_cri(containerd.address()));
    let pod = |name: &str, resources: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: {BUSYBOX_IMAGE}\n    imagePullPolicy: Never\n    command: [sleep, \"600\"]\n{resources}"
        )
    };
    node.write_manifest(
        "cg.yaml",
        &pod("cg", "    resources: {limits: {cpu: 500m, memory: 96Mi}}\n"),
    )
    .unwrap();
    node.write_manifest("cbe.yaml", &pod("cbe", "")).unwrap();
    let g = node.wait_pod("cg", LONG, is_running).unwrap();
    let be = node.wait_pod("cbe", LONG, is_running).unwrap();
    let g_cpu = pod_cgroup(&node, "cpu", "Guaranteed", &g);
    assert_eq!(read(g_cpu.join("cpu.shares")), "512");
    assert_eq!(read(g_cpu.join("cpu.cfs_quota_us")), "50000");
    assert_eq!(
        read(pod_cgroup(&node, "memory", "Guaranteed", &g).join("memory.limit_in_bytes")),
        (96u64 << 20).to_string()
    );
    // runc put the container (and the pause container) below the pod cgroup, with the
    // container's own values.
    let id = container(&g).container_id.unwrap();
    let id = id.trim_start_matches("containerd://");
    let c_cpu = g_cpu.join(id);
    assert_eq!(read(c_cpu.join("cpu.shares")), "512");
    assert_eq!(read(c_cpu.join("cpu.cfs_quota_us")), "50000");
    assert!(!read(c_cpu.join("cgroup.procs")).is_empty());
    let be_cpu = pod_cgroup(&node, "cpu", "BestEffort", &be);
    assert_eq!(read(be_cpu.join("cpu.shares")), "2");
    let be_id = container(&be).container_id.unwrap();
    assert!(
        be_cpu
            .join(be_id.trim_start_matches("containerd://"))
            .is_dir()
    );

    node.remove_manifest("cg.yaml").unwrap();
    node.remove_manifest("cbe.yaml").unwrap();
    node.wait_gone("cg", LONG).unwrap();
    node.wait_gone("cbe", LONG).unwrap();
    for cg in [g_cpu, be_cpu] {
        poll(Duration::from_secs(15), || (!cg.exists()).then_some(()))
            .unwrap_or_else(|| panic!("{} is left", cg.display()));
    }
}

/// A pod that finished keeps its status but not its cgroup: nothing runs in it, and
/// it stops counting in the burstable shares.
#[test]
fn a_finished_pods_cgroup_is_removed_while_the_pod_stays() {
    let node = start(&["hello"]);
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: done}}\nspec:\n  restartPolicy: Never\n  containers:\n  - name: main\n    image: {}\n    imagePullPolicy: IfNotPresent\n    resources: {{requests: {{cpu: 300m}}}}\n",
        image("hello")
    );
    node.write_manifest("done.yaml", &yaml).unwrap();
    let done = node
        .wait_pod("done", LONG, |p| phase(p) == "Succeeded")
        .unwrap();
    let cg = pod_cgroup(&node, "cpu", "Burstable", &done);
    poll(Duration::from_secs(15), || (!cg.exists()).then_some(()))
        .unwrap_or_else(|| panic!("{} is left", cg.display()));
    let burstable = cg.parent().unwrap().join("cpu.shares");
    assert_eq!(read(burstable), "2", "no Burstable pod is counted any more");
    assert_eq!(phase(&node.pod("done").unwrap()), "Succeeded");
}
