//! An idle node stays idle: a guard against a pod source or manager that wakes
//! itself. The node's own CPU time is read from `/proc/<pid>/stat` over 10 s with a
//! static pod directory that is empty, then holds one pod, then has lost it, both
//! standalone and joined to the test API server. 5 % of a core is a wide margin (an
//! idle node uses well under 1 %); `cargo xtask bench idle` prints the figures.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use wasmlet_testkit::node::{TestNode, cpu_share, poll, tail};

use crate::cluster::{cluster, node_options, node_ready};
use crate::*;

const WINDOW: Duration = Duration::from_secs(10);
const MAX_SHARE: f64 = 0.05;

fn assert_idle(node: &TestNode, what: &str) {
    let share = cpu_share(node.pid(), WINDOW).expect("the node's /proc/<pid>/stat");
    eprintln!("{what}: {:.2} % of a core", share * 100.0);
    assert!(
        share <= MAX_SHARE,
        "{what}: the node used {:.1} % of a core over {WINDOW:?} (at most {:.0} %); its log tail:\n{}",
        share * 100.0,
        MAX_SHARE * 100.0,
        tail(&node.log(), 30)
    );
}

/// Empty directory, one pod, the pod's file removed: idle after each.
fn empty_then_one_pod_then_none(node: &TestNode) {
    assert_idle(node, "an empty static pod directory");
    node.write_manifest("ticker.yaml", &manifest("ticker", "ticker", "Always", ""))
        .unwrap();
    node.wait_pod("ticker", LONG, is_running).unwrap();
    assert_idle(node, "one static pod running");
    node.remove_manifest("ticker.yaml").unwrap();
    node.wait_gone("ticker", LONG).unwrap();
    assert_idle(node, "the static pod's manifest removed");
}

#[test]
fn a_standalone_node_with_a_static_pod_directory_stays_idle() {
    let node = start(&["ticker"]);
    empty_then_one_pod_then_none(&node);
}

#[test]
fn a_joined_node_with_a_static_pod_directory_stays_idle() {
    let c = cluster();
    let node = start_with(node_options(&c, &["ticker"]));
    poll(LONG, || {
        c.api.get::<Node>(None, &node.node_name).filter(node_ready)
    })
    .expect("the node registers and is Ready");
    empty_then_one_pod_then_none(&node);
}
