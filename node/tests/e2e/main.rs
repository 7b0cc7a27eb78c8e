//! End-to-end tests of the `wasmlet` binary: a real node process, real manifests on
//! disk, real Wasm guests in real sandbox processes, observed through `/pods`, the CRI
//! log files and the node's own log.
//!
//! Tests run one node at a time (see [`start`]): timing assertions then measure the
//! node, not the other tests sharing two cores.

mod bootstrap;
mod cgroups;
mod cli;
mod cluster;
mod cri;
mod csi;
mod devices;
mod eviction;
mod faults;
mod idle;
mod image_gc;
mod isolation;
mod lifecycle;
mod log_rotation;
mod manifests;
mod network;
mod node_api;
mod plugin_authors;
mod plugins;
mod probes;
mod registry;
mod secrets;
mod shutdown;
mod stats;
mod streaming;

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use wasmlet_testkit::node::{NodeOptions, TestNode};

static SERIAL: Mutex<()> = Mutex::new(());

/// A started node and the guard that keeps other tests' nodes from running meanwhile.
pub struct Fixture {
    pub node: TestNode,
    _serial: MutexGuard<'static, ()>,
}

impl std::ops::Deref for Fixture {
    type Target = TestNode;
    fn deref(&self) -> &TestNode {
        &self.node
    }
}

impl std::ops::DerefMut for Fixture {
    fn deref_mut(&mut self) -> &mut TestNode {
        &mut self.node
    }
}

/// Starts a node with the given example images in its drop directory.
pub fn start(images: &[&str]) -> Fixture {
    start_with(NodeOptions {
        images: images.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    })
}

pub fn start_with(opts: NodeOptions) -> Fixture {
    let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let node = TestNode::start(env!("CARGO_BIN_EXE_wasmlet").as_ref(), opts).expect("node starts");
    Fixture {
        node,
        _serial: serial,
    }
}

pub const LONG: Duration = Duration::from_secs(60);

/// The image reference of an example workload.
pub fn image(name: &str) -> String {
    format!("localhost/wasmlet-examples/{name}:latest")
}

/// A one-container pod manifest.
pub fn manifest(
    name: &str,
    image_name: &str,
    restart_policy: &str,
    extra_container_yaml: &str,
) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  restartPolicy: {restart_policy}\n  terminationGracePeriodSeconds: 5\n  containers:\n  - name: main\n    image: {}\n    imagePullPolicy: IfNotPresent\n{extra_container_yaml}",
        image(image_name)
    )
}

pub fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

pub fn container(p: &Pod) -> ContainerStatus {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first().cloned())
        .unwrap_or_default()
}

pub fn is_running(p: &Pod) -> bool {
    phase(p) == "Running" && container(p).state.and_then(|s| s.running).is_some()
}

pub fn waiting_reason(p: &Pod) -> Option<String> {
    container(p).state?.waiting?.reason
}

/// The message of the (only) container's waiting state.
pub fn waiting_message(p: &Pod) -> String {
    container(p)
        .state
        .and_then(|s| s.waiting)
        .and_then(|w| w.message)
        .unwrap_or_default()
}

pub fn terminated_exit(p: &Pod) -> Option<(i32, String)> {
    let t = container(p).state?.terminated?;
    Some((t.exit_code, t.reason.unwrap_or_default()))
}

/// The status of a pod condition.
pub fn condition(pod: &Pod, type_: &str) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.clone())
}
