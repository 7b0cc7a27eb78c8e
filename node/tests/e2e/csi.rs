//! CSI in a real node: a driver the testkit runs (a real gRPC server in the node's
//! `plugins_registry`) registers; the node asks it `NodeGetInfo` and publishes what
//! it says in the `CSINode` object and on the Node, and takes it off again when the
//! driver goes.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::CSINode;
use wasmlet_testkit::csidriver::{CsiDriverOptions, TestCsiDriver};

use crate::cluster::{NODE, cluster, node_options, wait};
use crate::*;

const NODE_ID: &str = "csi.volume.kubernetes.io/nodeid";

#[test]
fn a_csi_driver_registers_into_the_csinode_and_the_node_and_leaves_them_when_it_goes() {
    let c = cluster();
    let node = start_with(node_options(&c, &[]));
    let registry = node.dir().join("root").join("plugins_registry");
    let mut options = CsiDriverOptions::new("hostpath.csi.example.com");
    options.topology = [(
        "topology.hostpath.csi.example.com/node".to_string(),
        "n1".to_string(),
    )]
    .into();
    let driver = TestCsiDriver::start(&registry, options).expect("the driver starts");

    let csinode = wait("the CSINode to list the driver", LONG, || {
        c.api
            .get::<CSINode>(None, NODE)
            .filter(|n| !n.spec.drivers.is_empty())
    });
    let entry = &csinode.spec.drivers[0];
    assert_eq!(entry.name, "hostpath.csi.example.com");
    assert_eq!(entry.node_id, "hostpath.csi.example.com-node");
    assert_eq!(
        entry.topology_keys.as_deref(),
        Some(&["topology.hostpath.csi.example.com/node".to_string()][..])
    );
    assert_eq!(entry.allocatable.as_ref().and_then(|a| a.count), Some(16));
    let owner = &csinode.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Node", NODE));
    let n = c.api.get::<Node>(None, NODE).unwrap();
    let annotations = n.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get(NODE_ID).map(String::as_str),
        Some(r#"{"hostpath.csi.example.com":"hostpath.csi.example.com-node"}"#)
    );
    let labels = n.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels
            .get("topology.hostpath.csi.example.com/node")
            .map(String::as_str),
        Some("n1")
    );
    assert_eq!(driver.statuses(), [(true, String::new())]);

    // A driver speaking only CSI 0.x is refused, and told why.
    let mut old = CsiDriverOptions::new("old.csi.example.com");
    old.versions = vec!["0.3.0".into()];
    let old = TestCsiDriver::start(&registry, old).expect("the driver starts");
    let (registered, error) = wait("the node's answer to the old driver", LONG, || {
        old.statuses().first().cloned()
    });
    assert!(!registered);
    assert!(error.contains("must be v1.x"), "{error}");

    // The driver goes: its entry and annotation go; the topology label stays.
    drop(driver);
    wait("the CSINode entry to go", LONG, || {
        c.api
            .get::<CSINode>(None, NODE)
            .filter(|n| n.spec.drivers.is_empty())
    });
    let n = wait("the annotation to go", LONG, || {
        c.api.get::<Node>(None, NODE).filter(|n| {
            !n.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(NODE_ID))
        })
    });
    assert!(
        n.metadata
            .labels
            .unwrap_or_default()
            .contains_key("topology.hostpath.csi.example.com/node")
    );
}
