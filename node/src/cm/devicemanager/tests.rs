use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use tokio_util::sync::CancellationToken;
use wasmlet_proto::deviceplugin::v1beta1 as api;

use super::checkpoint;
use super::*;
use crate::cm::topologymanager::{HintProvider, TopologyHint};

const WIDGET: &str = "example.com/widget";

/// A plugin that answers `Allocate` with an env naming the devices and a device
/// node per device, and records its calls.
#[derive(Default)]
struct Fake {
    calls: Mutex<Vec<Vec<String>>>,
    preferred: Option<Vec<String>>,
    pre_start: bool,
    pre_starts: Mutex<Vec<Vec<String>>>,
}

#[async_trait::async_trait]
impl Endpoint for Fake {
    fn options(&self) -> api::DevicePluginOptions {
        api::DevicePluginOptions {
            pre_start_required: self.pre_start,
            get_preferred_allocation_available: self.preferred.is_some(),
        }
    }
    async fn preferred_allocation(
        &self,
        _available: Vec<String>,
        _must: Vec<String>,
        _size: usize,
    ) -> Result<Vec<String>, String> {
        Ok(self.preferred.clone().unwrap_or_default())
    }
    async fn allocate(&self, ids: Vec<String>) -> Result<api::ContainerAllocateResponse, String> {
        self.calls.lock().unwrap().push(ids.clone());
        Ok(api::ContainerAllocateResponse {
            envs: [("WIDGETS".to_string(), ids.join(","))].into(),
            devices: ids
                .iter()
                .map(|id| api::DeviceSpec {
                    container_path: format!("/dev/{id}"),
                    host_path: "/dev/null".into(),
                    permissions: "rw".into(),
                })
                .collect(),
            ..Default::default()
        })
    }
    async fn pre_start(&self, ids: Vec<String>) -> Result<(), String> {
        self.pre_starts.lock().unwrap().push(ids);
        Ok(())
    }
}

/// Four widgets, w0 and w1 on NUMA node 0, w2 and w3 on node 1.
fn widgets() -> BTreeMap<String, DeviceInfo> {
    (0..4)
        .map(|i| {
            (
                format!("w{i}"),
                DeviceInfo {
                    healthy: true,
                    numa: vec![i / 2],
                },
            )
        })
        .collect()
}

fn manager(dir: &Path) -> DeviceManager {
    DeviceManager::new(dir, vec![0, 1], CancellationToken::new()).unwrap()
}

fn pod(uid: &str, widgets: u32) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": uid, "namespace": "default", "uid": uid},
        "spec": {"containers": [{
            "name": "app", "image": "x",
            "resources": {"limits": {WIDGET: widgets.to_string()}},
        }]},
    }))
    .unwrap()
}

fn app(p: &Pod) -> Container {
    p.spec.as_ref().unwrap().containers[0].clone()
}

#[tokio::test]
async fn devices_become_capacity_and_allocations_reach_the_container() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(dir.path());
    let fake = Arc::new(Fake::default());
    let generation = m.connect(WIDGET, fake.clone());
    m.update_devices(WIDGET, generation, widgets());
    let cap = m.capacity();
    assert_eq!(cap.capacity[WIDGET], 4);
    assert_eq!(cap.allocatable[WIDGET], 4);

    let a = pod("a", 2);
    m.allocate_container(&a, &app(&a), TopologyHint::new(&[1], true))
        .await
        .unwrap();
    // Aligned with the hint: the two devices on node 1.
    assert_eq!(
        *fake.calls.lock().unwrap(),
        [vec!["w2".to_string(), "w3".to_string()]]
    );
    let run = m.run_options("a", "app").await.unwrap().unwrap();
    assert_eq!(run.envs["WIDGETS"], "w2,w3");
    assert_eq!(run.devices.len(), 2);
    assert_eq!(m.run_options("a", "other").await.unwrap(), None);

    // More than is left: the kubelet's words.
    let b = pod("b", 3);
    let err = m
        .allocate_container(&b, &app(&b), TopologyHint::ANY)
        .await
        .unwrap_err();
    assert_eq!(
        err,
        "requested number of devices unavailable for example.com/widget. Requested: 3, Available: 2"
    );
    // Asking again for what it holds changes nothing.
    m.allocate_container(&a, &app(&a), TopologyHint::ANY)
        .await
        .unwrap();
    assert_eq!(fake.calls.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn unhealthy_devices_and_a_lost_plugin_lower_allocatable() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(dir.path());
    let mut changes = m.subscribe();
    let generation = m.connect(WIDGET, Arc::new(Fake::default()));
    let mut devices = widgets();
    m.update_devices(WIDGET, generation, devices.clone());
    assert!(changes.has_changed().unwrap());
    changes.mark_unchanged();
    devices.get_mut("w0").unwrap().healthy = false;
    m.update_devices(WIDGET, generation, devices);
    assert!(changes.has_changed().unwrap());
    assert_eq!(m.capacity().allocatable[WIDGET], 3);
    assert_eq!(m.capacity().capacity[WIDGET], 4);

    // A stale registration's stream ending does not touch the new one's devices.
    let newer = m.connect(WIDGET, Arc::new(Fake::default()));
    m.disconnected(WIDGET, generation, "old stream ended");
    assert_eq!(m.capacity().allocatable[WIDGET], 3);
    m.disconnected(WIDGET, newer, "stream ended");
    let cap = m.capacity();
    assert_eq!((cap.capacity[WIDGET], cap.allocatable[WIDGET]), (4, 0));
    assert!(cap.removed.is_empty());
    let p = pod("a", 1);
    let err = m
        .allocate_container(&p, &app(&p), TopologyHint::ANY)
        .await
        .unwrap_err();
    assert!(
        err.contains("no device plugin serves example.com/widget"),
        "{err}"
    );
}

#[tokio::test]
async fn allocations_survive_a_restart_and_are_not_handed_out_twice() {
    let dir = tempfile::tempdir().unwrap();
    {
        let m = manager(dir.path());
        let generation = m.connect(WIDGET, Arc::new(Fake::default()));
        m.update_devices(WIDGET, generation, widgets());
        let a = pod("a", 3);
        m.allocate_container(&a, &app(&a), TopologyHint::ANY)
            .await
            .unwrap();
    }
    let m = manager(dir.path());
    let held = m.container_devices("a", "app");
    assert_eq!(held[WIDGET].ids().len(), 3);
    assert_eq!(
        m.run_options("a", "app").await.unwrap().unwrap().envs["WIDGETS"],
        "w0,w1,w2"
    );
    // Restored but not yet registered again: shown, none allocatable.
    let cap = m.capacity();
    assert_eq!((cap.capacity[WIDGET], cap.allocatable[WIDGET]), (4, 0));
    // The plugin comes back: only the fourth device is free.
    let generation = m.connect(WIDGET, Arc::new(Fake::default()));
    m.update_devices(WIDGET, generation, widgets());
    let b = pod("b", 2);
    let err = m
        .allocate_container(&b, &app(&b), TopologyHint::ANY)
        .await
        .unwrap_err();
    assert!(err.ends_with("Requested: 2, Available: 1"), "{err}");
    // Once the pod is gone its devices are free again.
    m.retain_pods(&HashSet::from(["b".to_string()]));
    m.allocate_container(&b, &app(&b), TopologyHint::ANY)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_plugins_preferred_allocation_is_used_when_it_is_sane() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(dir.path());
    let fake = Arc::new(Fake {
        preferred: Some(vec!["w3".into(), "w0".into()]),
        ..Default::default()
    });
    let generation = m.connect(WIDGET, fake.clone());
    m.update_devices(WIDGET, generation, widgets());
    let a = pod("a", 2);
    m.allocate_container(&a, &app(&a), TopologyHint::ANY)
        .await
        .unwrap();
    assert_eq!(fake.calls.lock().unwrap()[0], ["w3", "w0"]);
    // An answer of the wrong size is ignored.
    let b = pod("b", 1);
    m.allocate_container(&b, &app(&b), TopologyHint::ANY)
        .await
        .unwrap();
    assert_eq!(fake.calls.lock().unwrap()[1], ["w1"]);
}

#[test]
fn hints_follow_the_devices_numa_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(dir.path());
    let generation = m.connect(WIDGET, Arc::new(Fake::default()));
    m.update_devices(WIDGET, generation, widgets());
    let two = pod("a", 2);
    let hints = m.container_hints(&two, &app(&two));
    assert_eq!(
        hints[WIDGET],
        Some(vec![
            TopologyHint::new(&[0], true),
            TopologyHint::new(&[1], true),
            TopologyHint::new(&[0, 1], false),
        ])
    );
    let three = pod("b", 3);
    assert_eq!(
        m.container_hints(&three, &app(&three))[WIDGET],
        Some(vec![TopologyHint::new(&[0, 1], true)])
    );
    let five = pod("c", 5);
    assert_eq!(m.container_hints(&five, &app(&five))[WIDGET], Some(vec![]));
    // Devices without topology: no preference.
    let plain: BTreeMap<String, DeviceInfo> = widgets()
        .into_iter()
        .map(|(id, d)| (id, DeviceInfo { numa: vec![], ..d }))
        .collect();
    m.update_devices(WIDGET, generation, plain);
    assert_eq!(m.container_hints(&two, &app(&two))[WIDGET], None);
}

#[test]
fn resource_names_are_extended_resource_names() {
    assert!(valid_resource_name("example.com/widget"));
    assert!(!valid_resource_name("widget"));
    assert!(!valid_resource_name("kubernetes.io/widget"));
    assert!(!valid_resource_name("example.com/"));
    assert!(!valid_resource_name("Example.com/a/b"));
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/checkpoints")
}

#[test]
fn the_kubelets_checkpoints_are_read_and_their_checksums_match() {
    for name in ["dm_empty", "dm_empty_slice", "dm_one", "dm_two", "dm_edge"] {
        let path = fixtures().join(format!("{name}.json"));
        let cp = checkpoint::read(&path)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .unwrap();
        if name == "dm_one" {
            let held = &cp.pod_devices[&(
                "6f1e2c3a-0000-4000-8000-000000000001".to_string(),
                "app".to_string(),
            )][WIDGET];
            assert_eq!(held.by_numa[&0], ["w0"]);
            assert_eq!(held.by_numa[&1], ["w2"]);
            assert_eq!(cp.registered[WIDGET], ["w0", "w1", "w2", "w3"]);
        }
    }
    // What wasmlet writes for the same content carries the kubelet's checksum.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cp");
    let one = checkpoint::read(&fixtures().join("dm_one.json"))
        .unwrap()
        .unwrap();
    checkpoint::write(&out, &one).unwrap();
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        std::fs::read_to_string(fixtures().join("dm_one.json"))
            .unwrap()
            .trim_end()
    );
    let empty = checkpoint::Checkpoint::default();
    checkpoint::write(&out, &empty).unwrap();
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        std::fs::read_to_string(fixtures().join("dm_empty.json"))
            .unwrap()
            .trim_end()
    );
}

#[test]
fn a_corrupted_checkpoint_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cp");
    let text = std::fs::read_to_string(fixtures().join("dm_one.json"))
        .unwrap()
        .replace("w2", "w1");
    std::fs::write(&path, text).unwrap();
    let err = checkpoint::read(&path).unwrap_err();
    assert!(err.contains("checkpoint is corrupted"), "{err}");
}

#[tokio::test]
async fn pre_start_is_called_when_the_plugin_asks_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(dir.path());
    let fake = Arc::new(Fake {
        pre_start: true,
        ..Default::default()
    });
    let generation = m.connect(WIDGET, fake.clone());
    m.update_devices(WIDGET, generation, widgets());
    let a = pod("a", 2);
    m.allocate_container(&a, &app(&a), TopologyHint::ANY)
        .await
        .unwrap();
    assert!(fake.pre_starts.lock().unwrap().is_empty());
    m.run_options("a", "app").await.unwrap().unwrap();
    assert_eq!(
        *fake.pre_starts.lock().unwrap(),
        [vec!["w0".to_string(), "w1".to_string()]]
    );
}

#[test]
fn a_plugin_gone_past_the_grace_period_is_removed_from_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(dir.path());
    let generation = m.connect(WIDGET, Arc::new(Fake::default()));
    m.update_devices(WIDGET, generation, widgets());
    m.disconnected(WIDGET, generation, "stream ended");
    m.age_stop(WIDGET, ENDPOINT_STOP_GRACE_PERIOD - Duration::from_secs(1));
    assert!(m.capacity().removed.is_empty());
    m.age_stop(WIDGET, Duration::from_secs(2));
    let cap = m.capacity();
    assert_eq!(cap.removed, [WIDGET]);
    assert!(!cap.capacity.contains_key(WIDGET));
    // The Node shows it at 0.
    assert_eq!(cap.per_resource()[WIDGET], (0, 0));
    // Every report says so (whoever asked first), until a plugin registers it again.
    assert_eq!(m.admission_allocatable().get(WIDGET), None);
    assert_eq!(m.capacity().removed, [WIDGET]);
    let again = m.connect(WIDGET, Arc::new(Fake::default()));
    m.update_devices(WIDGET, again, widgets());
    let cap = m.capacity();
    assert!(cap.removed.is_empty());
    assert_eq!(cap.allocatable[WIDGET], 4);
}

#[tokio::test]
async fn a_preferred_allocation_off_the_admitted_numa_node_is_not_taken() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(dir.path());
    // The plugin would rather hand out node 0's widgets.
    let fake = Arc::new(Fake {
        preferred: Some(vec!["w0".into(), "w1".into()]),
        ..Default::default()
    });
    let generation = m.connect(WIDGET, fake.clone());
    m.update_devices(WIDGET, generation, widgets());
    let a = pod("a", 2);
    m.allocate_container(&a, &app(&a), TopologyHint::new(&[1], true))
        .await
        .unwrap();
    // Only node 1's were offered, so its answer is not usable: node 1's are taken.
    assert_eq!(fake.calls.lock().unwrap()[0], ["w2", "w3"]);
}

#[test]
fn sidecars_keep_their_devices_and_count_with_the_app_containers() {
    let p: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "default", "uid": "p"},
        "spec": {
            "initContainers": [
                {"name": "sidecar", "image": "x", "restartPolicy": "Always",
                 "resources": {"limits": {WIDGET: "1"}}},
                {"name": "init", "image": "x", "resources": {"limits": {WIDGET: "2"}}},
            ],
            "containers": [{"name": "app", "image": "x", "resources": {"limits": {WIDGET: "2"}}}],
        },
    }))
    .unwrap();
    // The init container runs beside the sidecar (3), the app beside it too (3).
    assert_eq!(crate::cm::topologymanager::pod_request(&p, WIDGET), 3);
}
