//! CSI in a real node: a driver the testkit runs (a real gRPC server in the node's
//! `plugins_registry`) registers; the node asks it `NodeGetInfo` and publishes what
//! it says in the `CSINode` object and on the Node, and takes it off again when the
//! driver goes. Pods' PersistentVolumeClaims, generic ephemeral and inline CSI
//! volumes are staged and published through it, for busybox pods in a real
//! containerd and for Wasm pods, and torn down in the CSI order.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, VolumeAttachment};
use sha2::Digest as _;
use wasmlet_testkit::containerd::{Containerd, images::BUSYBOX_IMAGE};
use wasmlet_testkit::csidriver::{CsiDriverOptions, TestCsiDriver};

use crate::cluster::{Cluster, NODE, cluster, node_options, pod_with_spec, wait};
use crate::*;

const HOSTPATH: &str = "hostpath.csi.example.com";

fn registry(node: &Fixture) -> std::path::PathBuf {
    node.dir().join("root").join("plugins_registry")
}

/// Starts `options` in the node's registry and waits for its CSINode entry.
fn driver(c: &Cluster, node: &Fixture, options: CsiDriverOptions) -> TestCsiDriver {
    let name = options.name.clone();
    let d = TestCsiDriver::start(&registry(node), options).expect("the driver starts");
    wait(&format!("{name} to register"), LONG, || {
        c.api
            .get::<CSINode>(None, NODE)
            .filter(|n| n.spec.drivers.iter().any(|d| d.name == name))
    });
    d
}

fn csidriver(c: &Cluster, name: &str, spec: serde_json::Value) {
    let d: CSIDriver = serde_json::from_value(serde_json::json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap();
    c.api.create(&d).unwrap();
}

/// A claim `claim` bound to the PV `pv` of `driver`'s volume `handle`, as the PV
/// controller leaves them; `owner` is the pod a generic ephemeral claim belongs to.
fn bound_claim(
    c: &Cluster,
    claim: &str,
    pv: &str,
    driver: &str,
    handle: &str,
    owner: Option<&Pod>,
) {
    let owners: Vec<serde_json::Value> = owner
        .map(|p| {
            serde_json::json!({
                "apiVersion": "v1", "kind": "Pod", "controller": true, "blockOwnerDeletion": true,
                "name": p.metadata.name, "uid": p.metadata.uid,
            })
        })
        .into_iter()
        .collect();
    let pvc: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": "default", "ownerReferences": owners},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, "volumeName": pv},
        "status": {"phase": "Bound"},
    }))
    .unwrap();
    let pvc = c.api.create(&pvc).unwrap();
    let volume: PersistentVolume = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": pv},
        "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "claimRef": {"namespace": "default", "name": claim, "uid": pvc.metadata.uid},
            "csi": {"driver": driver, "volumeHandle": handle},
        },
        "status": {"phase": "Bound"},
    }))
    .unwrap();
    c.api.create(&volume).unwrap();
}

fn get_pod(c: &Cluster, name: &str) -> Option<Pod> {
    c.api.get::<Pod>(Some("default"), name)
}

/// A pod mounting `volume` at `path`: busybox running `script`, or the Wasm `hello`
/// with `env`.
fn volume_pod(name: &str, volume: serde_json::Value, path: &str, run: Run<'_>) -> Pod {
    let mount = serde_json::json!([{"name": volume["name"], "mountPath": path}]);
    let (container, policy) = match run {
        Run::Busybox(script, policy) => (
            serde_json::json!({
                "name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["sh", "-c", script], "volumeMounts": mount,
            }),
            policy,
        ),
        Run::Wasm(env) => (
            serde_json::json!({
                "name": "main", "image": image("hello"), "imagePullPolicy": "IfNotPresent",
                "env": env.iter().map(|(k, v)| serde_json::json!({"name": k, "value": v})).collect::<Vec<_>>(),
                "volumeMounts": mount,
            }),
            "Never",
        ),
    };
    pod_with_spec(
        name,
        serde_json::json!({
            "nodeName": NODE, "restartPolicy": policy, "terminationGracePeriodSeconds": 1,
            "containers": [container], "volumes": [volume],
        }),
    )
}

enum Run<'a> {
    Busybox(&'a str, &'a str),
    Wasm(&'a [(&'a str, &'a str)]),
}

fn claim_volume(claim: &str) -> serde_json::Value {
    serde_json::json!({"name": "data", "persistentVolumeClaim": {"claimName": claim}})
}

fn count(calls: &[String], prefix: &str) -> usize {
    calls.iter().filter(|c| c.starts_with(prefix)).count()
}

/// The messages of the pod's events with `reason`.
fn events(c: &Cluster, pod: &str, reason: &str) -> Vec<String> {
    c.api
        .list::<Event>(Some("default"))
        .into_iter()
        .filter(|e| {
            e.involved_object.name.as_deref() == Some(pod) && e.reason.as_deref() == Some(reason)
        })
        .filter_map(|e| e.message)
        .collect()
}

fn succeeded(c: &Cluster, name: &str) -> Pod {
    wait(&format!("{name} to succeed"), LONG, || {
        get_pod(c, name).filter(|p| phase(p) == "Succeeded")
    })
}

fn volumes_in_use(c: &Cluster) -> Vec<String> {
    c.api
        .get::<Node>(None, NODE)
        .and_then(|n| n.status?.volumes_in_use)
        .unwrap_or_default()
}

fn sha256_hex(s: &str) -> String {
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

const NODE_ID: &str = "csi.volume.kubernetes.io/nodeid";

#[test]
fn a_csi_driver_registers_into_the_csinode_and_the_node_and_leaves_them_when_it_goes() {
    let c = cluster();
    let node = start_with(node_options(&c, &[]));
    // As the kubelet: the CSINode exists, owned by the Node, before any driver.
    let empty = wait("the node's empty CSINode", LONG, || {
        c.api.get::<CSINode>(None, NODE)
    });
    assert!(empty.spec.drivers.is_empty());
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
    // The node tells the driver after it has written the CSINode: wait for it.
    let statuses = wait("the driver to hear it is registered", LONG, || {
        Some(driver.statuses()).filter(|s| !s.is_empty())
    });
    assert_eq!(statuses, [(true, String::new())]);

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

#[test]
fn a_claim_keeps_its_data_across_busybox_and_wasm_pods_a_node_kill_and_is_staged_once() {
    let containerd = Containerd::start().expect("containerd starts");
    containerd.import_test_images().expect("test images import");
    let c = cluster();
    let client = crate::stats::ApiClient::new();
    let mut node =
        start_with(client.options(node_options(&c, &["hello"]).with_cri(containerd.address())));
    let d = driver(&c, &node, CsiDriverOptions::new(HOSTPATH));
    csidriver(
        &c,
        HOSTPATH,
        serde_json::json!({"attachRequired": false, "podInfoOnMount": true}),
    );
    bound_claim(&c, "data", "pv-data", HOSTPATH, "vol-data", None);

    // A busybox pod and a Wasm pod write to the claim at the same time.
    let box_pod = c
        .api
        .create(&volume_pod(
            "box",
            claim_volume("data"),
            "/data",
            Run::Busybox(
                "echo from-busybox > /data/box.txt && exec sleep 600",
                "Always",
            ),
        ))
        .unwrap();
    let wasm_pod = c
        .api
        .create(&volume_pod(
            "wasm",
            claim_volume("data"),
            "/data",
            Run::Wasm(&[("WRITE_FILE", "/data/wasm.txt"), ("FILE_TEXT", "from-wasm")]),
        ))
        .unwrap();
    let running = wait("the busybox pod to run", LONG, || {
        get_pod(&c, "box").filter(is_running)
    });
    succeeded(&c, "wasm");
    let data = d.volume_dir("vol-data");
    wait("busybox's file in the volume", LONG, || {
        std::fs::read_to_string(data.join("box.txt")).ok()
    });
    assert_eq!(
        std::fs::read_to_string(data.join("wasm.txt")).unwrap(),
        "from-wasm\n"
    );
    let calls = d.calls();
    assert_eq!(count(&calls, "NodeStageVolume vol-data"), 1, "{calls:#?}");
    assert_eq!(count(&calls, "NodePublishVolume vol-data"), 2, "{calls:#?}");
    // podInfoOnMount: the pod's identity in the volume context.
    let published = d.publishes();
    let ctx = &published
        .iter()
        .find(|p| {
            p.volume_context
                .get("csi.storage.k8s.io/pod.name")
                .map(String::as_str)
                == Some("box")
        })
        .expect("box's publish carries its pod info")
        .volume_context;
    assert_eq!(ctx["csi.storage.k8s.io/pod.namespace"], "default");
    assert_eq!(
        ctx["csi.storage.k8s.io/pod.uid"],
        box_pod.metadata.uid.clone().unwrap()
    );
    assert_eq!(ctx["csi.storage.k8s.io/ephemeral"], "false");
    // The driver's NodeGetVolumeStats: in /stats/summary under the pod's volume name
    // with its claim, and in the kubelet's volume metrics by claim.
    let volume = wait("the volume's stats in /stats/summary", LONG, || {
        let (_, body) = node.api_get("/stats/summary", client.auth()).ok()?;
        let s: serde_json::Value = serde_json::from_str(&body).ok()?;
        s["pods"]
            .as_array()?
            .iter()
            .find(|p| p["podRef"]["name"] == "box")?["volume"]
            .as_array()?
            .iter()
            .find(|v| v["name"] == "data")
            .cloned()
    });
    assert_eq!(
        volume["pvcRef"],
        serde_json::json!({"name": "data", "namespace": "default"})
    );
    assert!(volume["capacityBytes"].as_u64().unwrap() > 0, "{volume}");
    let (_, metrics) = node.api_get("/metrics", client.auth()).unwrap();
    assert!(
        metrics.lines().any(|l| l.starts_with(
            "kubelet_volume_stats_capacity_bytes{namespace=\"default\",persistentvolumeclaim=\"data\"} "
        )),
        "{metrics}"
    );
    let unique = format!("kubernetes.io/csi/{HOSTPATH}^vol-data");
    wait("the volume in the Node's volumesInUse", LONG, || {
        volumes_in_use(&c).contains(&unique).then_some(())
    });

    // The node is killed while busybox uses the volume and starts again: the pod keeps
    // its container and its mount; nothing is staged or published twice.
    let registrations = d.statuses().len();
    node.kill();
    node.restart().expect("the node starts again");
    wait("the driver to register again", LONG, || {
        (d.statuses().len() > registrations).then_some(())
    });
    wait(
        "the restarted node to find the volume published",
        LONG,
        || {
            node.log()
                .contains("CSI volume found published")
                .then_some(())
        },
    );
    let after = wait("busybox reported running again", LONG, || {
        get_pod(&c, "box").filter(is_running)
    });
    assert_eq!(
        container(&after).container_id,
        container(&running).container_id
    );
    assert_eq!(container(&after).restart_count, 0);
    let calls = d.calls();
    assert_eq!(count(&calls, "NodeStageVolume vol-data"), 1, "{calls:#?}");
    assert_eq!(count(&calls, "NodePublishVolume vol-data"), 2, "{calls:#?}");

    // Both pods go: each publish is unpublished once, then the volume is unstaged once.
    for name in ["box", "wasm"] {
        c.api.delete::<Pod>(Some("default"), name, Some(1)).unwrap();
    }
    wait("the volume to be unstaged", LONG, || {
        d.calls()
            .iter()
            .any(|c| c.starts_with("NodeUnstageVolume"))
            .then_some(())
    });
    let calls = d.calls();
    let unstage = calls
        .iter()
        .position(|c| c.starts_with("NodeUnstageVolume"))
        .unwrap();
    assert_eq!(count(&calls, "NodeUnstageVolume vol-data"), 1, "{calls:#?}");
    for pod in [&box_pod, &wasm_pod] {
        let target = "volumes/kubernetes.io~csi/pv-data/mount";
        let uid = pod.metadata.uid.as_deref().unwrap();
        let unpublished: Vec<usize> = calls
            .iter()
            .enumerate()
            .filter(|(_, c)| {
                c.starts_with("NodeUnpublishVolume vol-data")
                    && c.contains(&format!("/pods/{uid}/{target}"))
            })
            .map(|(i, _)| i)
            .collect();
        assert_eq!(unpublished.len(), 1, "{calls:#?}");
        assert!(
            unpublished[0] < unstage,
            "unpublished before unstaged: {calls:#?}"
        );
    }
    wait("volumesInUse to be empty", LONG, || {
        volumes_in_use(&c).is_empty().then_some(())
    });

    // A new pod mounting the claim finds what both wrote.
    c.api
        .create(&volume_pod(
            "reader",
            claim_volume("data"),
            "/data",
            Run::Busybox("cat /data/box.txt /data/wasm.txt", "Never"),
        ))
        .unwrap();
    let reader = succeeded(&c, "reader");
    let text = node
        .container_log(&reader, "main", 0)
        .unwrap()
        .into_iter()
        .map(|r| r.text)
        .collect::<Vec<_>>();
    assert_eq!(text, ["from-busybox", "from-wasm"]);
}

#[test]
fn a_driver_that_attaches_waits_for_its_volume_attachment_before_staging() {
    let c = cluster();
    let node = start_with(node_options(&c, &["hello"]));
    let d = driver(&c, &node, CsiDriverOptions::new("attach.csi.example.com"));
    // No CSIDriver object: the kubelet takes that as attachRequired.
    bound_claim(
        &c,
        "disk",
        "pv-disk",
        "attach.csi.example.com",
        "vol-disk",
        None,
    );
    c.api
        .create(&volume_pod(
            "attached",
            claim_volume("disk"),
            "/data",
            Run::Wasm(&[("WRITE_FILE", "/data/f.txt")]),
        ))
        .unwrap();
    let va_name = format!(
        "csi-{}",
        sha256_hex(&format!("vol-diskattach.csi.example.com{NODE}"))
    );
    let message = wait("FailedMount while not attached", LONG, || {
        events(&c, "attached", "FailedMount").into_iter().next()
    });
    assert!(
        message.starts_with("MountVolume.WaitForAttach failed for volume \"pv-disk\" : ")
            && message.contains(&va_name),
        "{message}"
    );
    assert_eq!(
        count(&d.calls(), "NodeStageVolume"),
        0,
        "not staged before attached"
    );

    // The external attacher's part: the VolumeAttachment, attached.
    let va: VolumeAttachment = serde_json::from_value(serde_json::json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
        "metadata": {"name": va_name},
        "spec": {"attacher": "attach.csi.example.com", "nodeName": NODE, "source": {"persistentVolumeName": "pv-disk"}},
        "status": {"attached": true, "attachmentMetadata": {"devicePath": "/dev/fake0"}},
    }))
    .unwrap();
    c.api.create(&va).unwrap();
    succeeded(&c, "attached");
    assert_eq!(
        std::fs::read_to_string(d.volume_dir("vol-disk").join("f.txt")).unwrap(),
        "hello\n"
    );
    assert_eq!(count(&d.calls(), "NodeStageVolume vol-disk"), 1);

    // The claim mounted readOnly, with a publish secret on the PV: published
    // read-only with the secret's data, and a Wasm guest cannot write to it.
    c.api
        .create(
            &serde_json::from_value::<k8s_openapi::api::core::v1::Secret>(serde_json::json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "disk-key", "namespace": "default"},
                "data": {"key": "czNjcmV0"},
            }))
            .unwrap(),
        )
        .unwrap();
    let mut pv: PersistentVolume = c.api.get(None, "pv-disk").unwrap();
    pv.spec
        .as_mut()
        .unwrap()
        .csi
        .as_mut()
        .unwrap()
        .node_publish_secret_ref = Some(k8s_openapi::api::core::v1::SecretReference {
        name: Some("disk-key".into()),
        namespace: Some("default".into()),
    });
    c.api.replace(&pv).unwrap();
    c.api
        .create(&volume_pod(
            "reader",
            serde_json::json!({"name": "data", "persistentVolumeClaim": {"claimName": "disk", "readOnly": true}}),
            "/data",
            Run::Wasm(&[("WRITE_FILE", "/data/g.txt")]),
        ))
        .unwrap();
    let reader = wait("the read-only writer to fail", LONG, || {
        get_pod(&c, "reader").filter(|p| phase(p) == "Failed")
    });
    assert_eq!(terminated_exit(&reader).map(|(code, _)| code), Some(1));
    assert!(!d.volume_dir("vol-disk").join("g.txt").exists());
    let published = d.publishes();
    let last = published.last().unwrap();
    assert!(last.readonly);
    assert_eq!(last.secrets.get("key").map(String::as_str), Some("s3cret"));
}

#[test]
fn inline_and_generic_ephemeral_volumes_are_published_for_their_pod_and_cleaned_up() {
    let c = cluster();
    let node = start_with(node_options(&c, &["hello"]));
    let d = driver(&c, &node, CsiDriverOptions::new(HOSTPATH));
    csidriver(
        &c,
        HOSTPATH,
        serde_json::json!({"attachRequired": false, "volumeLifecycleModes": ["Persistent", "Ephemeral"]}),
    );

    // Inline: published (never staged) under a handle of the pod's own, then
    // unpublished when the pod is done.
    let inline = c
        .api
        .create(&volume_pod(
            "inline",
            serde_json::json!({"name": "scratch", "csi": {"driver": HOSTPATH, "volumeAttributes": {"size": "1Mi"}}}),
            "/scratch",
            Run::Wasm(&[("WRITE_FILE", "/scratch/x.txt")]),
        ))
        .unwrap();
    succeeded(&c, "inline");
    let handle = format!(
        "csi-{}",
        sha256_hex(&format!(
            "{}scratch",
            inline.metadata.uid.as_deref().unwrap()
        ))
    );
    assert_eq!(
        std::fs::read_to_string(d.volume_dir(&handle).join("x.txt")).unwrap(),
        "hello\n"
    );
    wait("the inline volume to be unpublished", LONG, || {
        (count(&d.calls(), &format!("NodeUnpublishVolume {handle}")) == 1).then_some(())
    });
    let calls = d.calls();
    assert_eq!(
        count(&calls, &format!("NodePublishVolume {handle}")),
        1,
        "{calls:#?}"
    );
    assert_eq!(count(&calls, "NodeStageVolume"), 0, "{calls:#?}");

    // Generic ephemeral: the pod waits for the claim the ephemeral volume controller
    // makes for it, named <pod>-<volume> and owned by the pod.
    let generic = c
        .api
        .create(&volume_pod(
            "gen",
            serde_json::json!({"name": "work", "ephemeral": {"volumeClaimTemplate": {"spec": {
                "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}}}),
            "/work",
            Run::Wasm(&[("WRITE_FILE", "/work/y.txt")]),
        ))
        .unwrap();
    let message = wait("FailedMount before the claim exists", LONG, || {
        events(&c, "gen", "FailedMount").into_iter().next()
    });
    assert!(
        message.contains("error processing PVC default/gen-work"),
        "{message}"
    );
    bound_claim(
        &c,
        "gen-work",
        "pv-gen",
        HOSTPATH,
        "vol-gen",
        Some(&generic),
    );
    succeeded(&c, "gen");
    assert_eq!(
        std::fs::read_to_string(d.volume_dir("vol-gen").join("y.txt")).unwrap(),
        "hello\n"
    );
    c.api
        .delete::<Pod>(Some("default"), "gen", Some(1))
        .unwrap();
    c.api
        .delete::<Pod>(Some("default"), "inline", Some(1))
        .unwrap();
    wait("the generic volume to be unstaged", LONG, || {
        (count(&d.calls(), "NodeUnstageVolume vol-gen") == 1).then_some(())
    });
    let pods = node.dir().join("root").join("pods");
    for p in [&inline, &generic] {
        let dir = pods.join(p.metadata.uid.as_deref().unwrap());
        wait("the pod's directory to go", LONG, || {
            (!dir.exists()).then_some(())
        });
    }
    let global = node
        .dir()
        .join("root/plugins/kubernetes.io/csi")
        .join(HOSTPATH);
    assert!(
        std::fs::read_dir(&global)
            .map(|mut e| e.next().is_none())
            .unwrap_or(true),
        "no staging directory is left"
    );
}

#[test]
fn a_failing_publish_is_retried_with_back_off_and_a_hanging_one_is_cut_at_the_timeout() {
    let c = cluster();
    let mut options = node_options(&c, &["hello"]);
    options.wasmlet_config.push_str("  csiTimeout: 3s\n");
    let node = start_with(options);
    let mut broken = CsiDriverOptions::new("broken.csi.example.com");
    broken.fail_publish = Some("disk on fire".into());
    let broken = driver(&c, &node, broken);
    let mut stuck = CsiDriverOptions::new("stuck.csi.example.com");
    stuck.hang_publish = true;
    let _stuck = driver(&c, &node, stuck);
    for name in ["broken.csi.example.com", "stuck.csi.example.com"] {
        csidriver(
            &c,
            name,
            serde_json::json!({"attachRequired": false, "volumeLifecycleModes": ["Ephemeral"]}),
        );
    }
    let inline = |driver: &str| serde_json::json!({"name": "scratch", "csi": {"driver": driver}});
    c.api
        .create(&volume_pod(
            "broken",
            inline("broken.csi.example.com"),
            "/s",
            Run::Wasm(&[]),
        ))
        .unwrap();
    c.api
        .create(&volume_pod(
            "stuck",
            inline("stuck.csi.example.com"),
            "/s",
            Run::Wasm(&[]),
        ))
        .unwrap();

    // The driver's message, in the kubelet's words; each retry waits at least twice as
    // long as the one before (500 ms, 1 s, 2 s).
    let message = wait("FailedMount from the broken driver", LONG, || {
        events(&c, "broken", "FailedMount").into_iter().next()
    });
    assert!(
        message.starts_with(
            "MountVolume.SetUp failed for volume \"scratch\" : rpc error: code = Internal desc = disk on fire"
        ),
        "{message}"
    );
    let times = wait("four publish attempts", LONG, || {
        let at: Vec<_> = broken
            .calls_at()
            .into_iter()
            .filter(|(_, c)| c.starts_with("NodePublishVolume"))
            .map(|(t, _)| t)
            .collect();
        (at.len() >= 4).then_some(at)
    });
    for (i, min) in [500u64, 1000, 2000].into_iter().enumerate() {
        let gap = times[i + 1] - times[i];
        assert!(
            gap >= Duration::from_millis(min),
            "attempt {}: {gap:?} < {min} ms",
            i + 2
        );
    }
    assert_ne!(phase(&get_pod(&c, "broken").unwrap()), "Running");

    let message = wait("FailedMount from the hanging driver", LONG, || {
        events(&c, "stuck", "FailedMount").into_iter().next()
    });
    assert!(
        message.starts_with(
            "MountVolume.SetUp failed for volume \"scratch\" : rpc error: code = DeadlineExceeded desc = context deadline exceeded"
        ),
        "{message}"
    );
}

#[test]
fn a_claim_whose_volume_grew_is_expanded_on_the_node_and_takes_the_new_size() {
    let c = cluster();
    let mut options = node_options(&c, &["ticker"]);
    // Running pods sync often, so the grown volume is seen at once.
    options.kubelet_config.push_str("syncFrequency: 2s\n");
    let node = start_with(options);
    let d = driver(&c, &node, CsiDriverOptions::new(HOSTPATH));
    csidriver(&c, HOSTPATH, serde_json::json!({"attachRequired": false}));
    bound_claim(&c, "grow", "pv-grow", HOSTPATH, "vol-grow", None);
    let mut pvc: PersistentVolumeClaim = c.api.get(Some("default"), "grow").unwrap();
    pvc.status.as_mut().unwrap().capacity = Some(
        [(
            "storage".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("1Gi".into()),
        )]
        .into(),
    );
    c.api.replace(&pvc).unwrap();
    let ticker = pod_with_spec(
        "ticker",
        serde_json::json!({
            "nodeName": NODE, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": image("ticker"), "imagePullPolicy": "IfNotPresent",
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [claim_volume("grow")],
        }),
    );
    c.api.create(&ticker).unwrap();
    wait("the ticker to run", LONG, || {
        get_pod(&c, "ticker").filter(is_running)
    });
    assert_eq!(
        count(&d.calls(), "NodeExpandVolume"),
        0,
        "nothing to expand yet"
    );

    // The external resizer's part: the volume is 2Gi, the claim waits for the node.
    let mut pv: PersistentVolume = c.api.get(None, "pv-grow").unwrap();
    pv.spec.as_mut().unwrap().capacity = Some(
        [(
            "storage".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("2Gi".into()),
        )]
        .into(),
    );
    c.api.replace(&pv).unwrap();
    let mut pvc: PersistentVolumeClaim = c.api.get(Some("default"), "grow").unwrap();
    let status = pvc.status.as_mut().unwrap();
    status.allocated_resource_statuses =
        Some([("storage".to_string(), "NodeResizePending".to_string())].into());
    status.conditions = Some(vec![
        serde_json::from_value(serde_json::json!({
            "type": "FileSystemResizePending", "status": "True",
        }))
        .unwrap(),
    ]);
    c.api.replace(&pvc).unwrap();

    let pvc = wait("the claim to take the new size", LONG, || {
        c.api
            .get::<PersistentVolumeClaim>(Some("default"), "grow")
            .filter(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.capacity.as_ref())
                    .and_then(|c| c.get("storage"))
                    .map(|q| q.0.as_str())
                    == Some("2Gi")
            })
    });
    let status = pvc.status.unwrap();
    assert!(status.conditions.unwrap_or_default().is_empty());
    assert!(
        !status
            .allocated_resource_statuses
            .unwrap_or_default()
            .contains_key("storage")
    );
    let calls = d.calls();
    let expanded: Vec<&String> = calls
        .iter()
        .filter(|c| c.starts_with("NodeExpandVolume"))
        .collect();
    assert_eq!(expanded.len(), 1, "{calls:#?}");
    assert!(
        expanded[0].contains("/volumes/kubernetes.io~csi/pv-grow/mount")
            && expanded[0].ends_with(" 2147483648"),
        "{}",
        expanded[0]
    );
    let message = wait("the resize event", LONG, || {
        events(&c, "ticker", "FileSystemResizeSuccessful")
            .into_iter()
            .next()
    });
    assert_eq!(
        message,
        format!("MountVolume.NodeExpandVolume succeeded for volume \"pv-grow\" {NODE}")
    );
}

#[test]
fn a_block_claim_is_a_device_file_in_a_busybox_pod_and_refused_to_a_wasm_pod() {
    let containerd = Containerd::start().expect("containerd starts");
    containerd.import_test_images().expect("test images import");
    let c = cluster();
    let node = start_with(node_options(&c, &["hello"]).with_cri(containerd.address()));
    let d = driver(&c, &node, CsiDriverOptions::new(HOSTPATH));
    csidriver(&c, HOSTPATH, serde_json::json!({"attachRequired": false}));
    bound_claim(&c, "raw", "pv-raw", HOSTPATH, "vol-raw", None);
    let mut pv: PersistentVolume = c.api.get(None, "pv-raw").unwrap();
    pv.spec.as_mut().unwrap().volume_mode = Some("Block".into());
    c.api.replace(&pv).unwrap();
    let block_pod = |name: &str, script: &str| {
        pod_with_spec(
            name,
            serde_json::json!({
                "nodeName": NODE, "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                    "command": ["sh", "-c", script],
                    "volumeDevices": [{"name": "data", "devicePath": "/dev/xvda"}]}],
                "volumes": [claim_volume("raw")],
            }),
        )
    };

    // A pod writes the device's first sector; once it is done the volume is
    // unpublished and unstaged; another pod reads what it wrote.
    c.api
        .create(&block_pod(
            "blk-writer",
            "test -b /dev/xvda && printf block-data | dd of=/dev/xvda bs=512 count=1 conv=sync 2>/dev/null && sync",
        ))
        .unwrap();
    succeeded(&c, "blk-writer");
    wait("the block volume to be unstaged", LONG, || {
        (count(&d.calls(), "NodeUnstageVolume vol-raw") == 1).then_some(())
    });
    let calls = d.calls();
    let publish = calls
        .iter()
        .find(|c| c.starts_with("NodePublishVolume vol-raw"))
        .expect("published");
    assert!(
        publish.contains("/plugins/kubernetes.io/csi/volumeDevices/publish/pv-raw/"),
        "{publish}"
    );
    c.api
        .create(&block_pod(
            "blk-reader",
            "dd if=/dev/xvda bs=10 count=1 2>/dev/null; echo",
        ))
        .unwrap();
    let reader = wait("the reader to succeed", LONG, || {
        get_pod(&c, "blk-reader").filter(|p| phase(p) == "Succeeded")
    });
    let text: Vec<String> = node
        .container_log(&reader, "main", 0)
        .unwrap()
        .into_iter()
        .map(|r| r.text)
        .collect();
    assert_eq!(text, ["block-data"]);

    // A Wasm guest has no device files: the pod is told so and never runs.
    let wasm = pod_with_spec(
        "blk-wasm",
        serde_json::json!({
            "nodeName": NODE, "restartPolicy": "Never",
            "containers": [{"name": "main", "image": image("hello"), "imagePullPolicy": "IfNotPresent",
                "volumeDevices": [{"name": "data", "devicePath": "/dev/xvda"}]}],
            "volumes": [claim_volume("raw")],
        }),
    );
    c.api.create(&wasm).unwrap();
    let message = wait("the Wasm pod to be refused the device", LONG, || {
        get_pod(&c, "blk-wasm")
            .map(|p| waiting_message(&p))
            .filter(|m| m.contains("cannot have block devices"))
    });
    assert!(message.contains("volumeDevice \"data\""), "{message}");
    assert_ne!(phase(&get_pod(&c, "blk-wasm").unwrap()), "Running");
}

#[test]
fn a_pod_deleted_while_the_node_was_down_has_its_volume_unpublished_and_unstaged() {
    let c = cluster();
    let mut node = start_with(node_options(&c, &["ticker"]));
    let d = driver(&c, &node, CsiDriverOptions::new(HOSTPATH));
    csidriver(&c, HOSTPATH, serde_json::json!({"attachRequired": false}));
    bound_claim(&c, "left", "pv-left", HOSTPATH, "vol-left", None);
    let pod = c
        .api
        .create(&pod_with_spec(
            "left",
            serde_json::json!({
                "nodeName": NODE, "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "main", "image": image("ticker"), "imagePullPolicy": "IfNotPresent",
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                "volumes": [claim_volume("left")],
            }),
        ))
        .unwrap();
    wait("the pod to run", LONG, || {
        get_pod(&c, "left").filter(is_running)
    });
    let dir = node
        .dir()
        .join("root/pods")
        .join(pod.metadata.uid.as_deref().unwrap());

    // The node dies; the pod is removed from the API for good meanwhile.
    node.kill();
    c.api
        .delete::<Pod>(Some("default"), "left", Some(0))
        .unwrap();
    node.restart().expect("the node starts again");
    wait("the orphan's volume to be unstaged", LONG, || {
        (count(&d.calls(), "NodeUnstageVolume vol-left") == 1).then_some(())
    });
    let calls = d.calls();
    let unpublish = calls
        .iter()
        .position(|c| c.starts_with("NodeUnpublishVolume vol-left"))
        .expect("unpublished");
    let unstage = calls
        .iter()
        .position(|c| c.starts_with("NodeUnstageVolume vol-left"))
        .unwrap();
    assert!(unpublish < unstage, "{calls:#?}");
    assert_eq!(count(&calls, "NodeStageVolume"), 1, "{calls:#?}");
    wait("the orphan's directory to go", LONG, || {
        (!dir.exists()).then_some(())
    });
}
