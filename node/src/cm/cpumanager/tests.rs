use std::collections::HashSet;
use std::path::Path;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::*;
use crate::cm::topologymanager::TopologyHint;

/// Four CPUs, two cores of two threads each, one per NUMA node: cores 0 (cpus 0,1)
/// and 2 (cpus 2,3).
fn four() -> CpuTopology {
    CpuTopology::from_cpus(&[(0, 0, 0, 0), (1, 0, 0, 0), (2, 0, 2, 1), (3, 0, 2, 1)])
}

fn set(s: &str) -> CpuSet {
    s.parse().unwrap()
}

fn pod(uid: &str, cpu: &str, memory: &str, limit_cpu: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": uid, "namespace": "default", "uid": uid},
        "spec": {"containers": [{
            "name": "app", "image": "x",
            "resources": {
                "requests": {"cpu": cpu, "memory": memory},
                "limits": {"cpu": limit_cpu, "memory": memory},
            },
        }]},
    }))
    .unwrap()
}

fn app(p: &Pod) -> Container {
    p.spec.as_ref().unwrap().containers[0].clone()
}

fn manager(root: &Path) -> CpuManager {
    CpuManager::new(root, four(), set("0")).unwrap()
}

#[test]
fn guaranteed_integer_containers_get_cpus_of_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(dir.path());
    assert_eq!(m.state().default, set("0-3"));
    let g = pod("g", "2", "64Mi", "2");
    m.allocate_container(&g, &app(&g), TopologyHint::ANY)
        .unwrap();
    // A whole free core: 2-3 (0 is reserved, so core 0 is not whole).
    assert_eq!(m.cpuset("g", "app"), set("2-3"));
    assert_eq!(m.state().default, set("0-1"));
    // Everyone else shares the default set, reserved CPUs included.
    assert_eq!(m.cpuset("other", "app"), set("0-1"));
    // Not Guaranteed, or not a whole number: shared.
    let burstable = pod("b", "1", "64Mi", "2");
    m.allocate_container(&burstable, &app(&burstable), TopologyHint::ANY)
        .unwrap();
    let fraction = pod("f", "1500m", "64Mi", "1500m");
    m.allocate_container(&fraction, &app(&fraction), TopologyHint::ANY)
        .unwrap();
    assert_eq!(m.state().assignments.len(), 1);
    // Only cpu 1 is left to give.
    let two = pod("h", "2", "64Mi", "2");
    let err = m
        .allocate_container(&two, &app(&two), TopologyHint::ANY)
        .unwrap_err();
    assert_eq!(
        err,
        "not enough cpus available to satisfy request: requested=2, available=1"
    );
    // A pod that is gone gives its CPUs back.
    m.retain_pods(&HashSet::new());
    assert_eq!(m.state().default, set("0-3"));
}

#[test]
fn the_numa_hint_is_followed_and_hints_count_free_cpus() {
    let dir = tempfile::tempdir().unwrap();
    let m = CpuManager::new(dir.path(), four(), set("3")).unwrap();
    let one = pod("a", "1", "64Mi", "1");
    let hints = m.container_hints(&one, &app(&one))["cpu"].clone().unwrap();
    assert_eq!(
        hints,
        [
            TopologyHint::new(&[0], true),
            TopologyHint::new(&[1], true),
            TopologyHint::new(&[0, 1], false)
        ]
    );
    m.allocate_container(&one, &app(&one), TopologyHint::new(&[1], true))
        .unwrap();
    assert_eq!(m.cpuset("a", "app"), set("2"));
    // Two more: node 1 has none free, node 0 has two.
    let two = pod("b", "2", "64Mi", "2");
    let hints = m.container_hints(&two, &app(&two))["cpu"].clone().unwrap();
    assert_eq!(
        hints,
        [
            TopologyHint::new(&[0], true),
            TopologyHint::new(&[0, 1], false)
        ]
    );
}

#[test]
fn the_state_survives_a_restart_in_the_kubelets_format() {
    let dir = tempfile::tempdir().unwrap();
    {
        let m = manager(dir.path());
        let g = pod("6f1e2c3a-0000-4000-8000-000000000001", "1", "64Mi", "1");
        m.allocate_container(&g, &app(&g), TopologyHint::ANY)
            .unwrap();
    }
    let m = manager(dir.path());
    assert_eq!(
        m.cpuset("6f1e2c3a-0000-4000-8000-000000000001", "app"),
        set("1")
    );
    let text = std::fs::read_to_string(dir.path().join(CHECKPOINT_FILE)).unwrap();
    assert!(
        text.starts_with(r#"{"policyName":"static","defaultCpuSet":"0,2-3","entries":{"#),
        "{text}"
    );
    // Another policy's checkpoint is refused, as the kubelet refuses it.
    let other = tempfile::tempdir().unwrap();
    checkpoint::write(
        &other.path().join(CHECKPOINT_FILE),
        "none",
        &State::default(),
    )
    .unwrap();
    let err = CpuManager::new(other.path(), four(), set("0"))
        .err()
        .unwrap();
    assert!(
        err.contains("differs from state checkpoint policy \"none\""),
        "{err}"
    );
    // No reserved CPU: the static policy refuses to start.
    let err = CpuManager::new(other.path(), four(), CpuSet::new())
        .err()
        .unwrap();
    assert!(err.contains("greater than zero"), "{err}");
}

fn fixtures() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/checkpoints")
}

#[test]
fn the_kubelets_cpu_manager_checkpoints_are_read_and_written_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["cpu_none_empty", "cpu_static_one", "cpu_static_multi"] {
        let path = fixtures().join(format!("{name}.json"));
        let (policy, state) = checkpoint::read(&path)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .unwrap();
        let out = dir.path().join(name);
        checkpoint::write(&out, &policy, &state).unwrap();
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            std::fs::read_to_string(&path).unwrap().trim_end(),
            "{name}"
        );
    }
}

#[test]
fn a_core_wider_than_what_is_left_is_not_taken_whole() {
    // Core 0 has three threads, core 3 one: two CPUs are asked for.
    let topo = CpuTopology::from_cpus(&[(0, 0, 0, 0), (1, 0, 0, 0), (2, 0, 0, 0), (3, 0, 3, 0)]);
    let dir = tempfile::tempdir().unwrap();
    let m = CpuManager::new(dir.path(), topo, set("3")).unwrap();
    let two = pod("a", "2", "64Mi", "2");
    m.allocate_container(&two, &app(&two), TopologyHint::ANY)
        .unwrap();
    assert_eq!(m.cpuset("a", "app").len(), 2);
}
