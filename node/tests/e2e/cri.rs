//! Container pods through a real (private) containerd, next to Wasm pods on one node.

use std::time::Duration;

use wasmlet_testkit::containerd::{Containerd, images::BUSYBOX_IMAGE};
use wasmlet_testkit::node::{NodeOptions, poll};

use crate::*;

#[test]
fn a_container_pod_and_a_wasm_pod_run_side_by_side() {
    let containerd = Containerd::start().expect("containerd starts");
    containerd.import_test_images().expect("test images import");
    let node = start_with(NodeOptions {
        images: vec!["ticker".into()],
        extra_args: vec![
            "--container-runtime-endpoint".into(),
            containerd.address(),
            "--runtime-request-timeout".into(),
            "30s".into(),
        ],
        ..Default::default()
    });

    // No RuntimeClass: busybox goes to the default (CRI) runtime, the ticker to the
    // Wasm runtime because its image is a Wasm image in the node's store.
    node.write_manifest(
        "box.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: box}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    image: {BUSYBOX_IMAGE}\n    imagePullPolicy: Never\n    command: [sh, -c, 'echo hello from busybox; exec sleep 1000']\n"
        ),
    )
    .unwrap();
    node.write_manifest("tick.yaml", &manifest("tick", "ticker", "Always", ""))
        .unwrap();

    let boxed = node.wait_pod("box", LONG, is_running).unwrap();
    let tick = node.wait_pod("tick", LONG, is_running).unwrap();

    let c = container(&boxed);
    assert!(
        c.container_id
            .as_deref()
            .unwrap()
            .starts_with("containerd://"),
        "{c:?}"
    );
    assert!(
        container(&tick)
            .container_id
            .as_deref()
            .unwrap()
            .starts_with("wasm://")
    );
    let ip = boxed
        .status
        .as_ref()
        .unwrap()
        .pod_ip
        .clone()
        .expect("the container pod has an IP");
    assert!(
        containerd.layout().subnet.contains(&ip),
        "{ip} from the CNI bridge"
    );
    assert!(
        tick.status.as_ref().unwrap().pod_ip.is_none(),
        "Wasm pods use the node's network for now"
    );

    let lines = poll(Duration::from_secs(10), || {
        let r = node.container_log(&boxed, "main", 0).ok()?;
        (!r.is_empty()).then_some(r)
    })
    .expect("the container's CRI log file");
    assert_eq!(lines[0].text, "hello from busybox");
    assert_eq!(lines[0].stream, "stdout");

    // Deleting the container pod stops it (SIGTERM, SIGKILL after the 2 s grace: sleep
    // as PID 1 ignores SIGTERM) and leaves the Wasm pod alone.
    node.remove_manifest("box.yaml").unwrap();
    node.wait_gone("box", Duration::from_secs(15)).unwrap();
    let still = node.pod("tick").unwrap();
    assert!(is_running(&still));
    assert_eq!(container(&still).restart_count, 0);
    let leftover = containerd
        .ctr_k8s(["containers", "ls", "-q"])
        .unwrap_or_default();
    assert!(
        leftover.trim().is_empty(),
        "containers left in containerd: {leftover}"
    );
}
