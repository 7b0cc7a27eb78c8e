//! The static manifest directory: edits replace pods, deletions stop them, bad files
//! are reported and change nothing.

use std::path::Path;
use std::time::{Duration, Instant};

use wasmlet_testkit::node::poll;

use crate::*;

fn uid(p: &Pod) -> String {
    p.metadata.uid.clone().unwrap()
}

#[test]
fn editing_a_manifest_replaces_the_pod_with_a_new_uid() {
    let node = start(&["ticker"]);
    node.write_manifest("t.yaml", &manifest("t", "ticker", "Always", ""))
        .unwrap();
    let first = node.wait_pod("t", LONG, is_running).unwrap();
    let sandboxes_before = node.sandbox_pids();
    assert_eq!(
        sandboxes_before.len(),
        1,
        "one sandbox process per Wasm pod"
    );

    let edited = manifest(
        "t",
        "ticker",
        "Always",
        "    env:\n    - name: INTERVAL_MS\n      value: \"200\"\n",
    );
    node.write_manifest("t.yaml", &edited).unwrap();
    let second = node
        .wait_pod("t", LONG, |p| uid(p) != uid(&first) && is_running(p))
        .unwrap();
    // The old pod is listed while it stops, then gone: only the new one is left.
    let same_name = || {
        node.pods().ok().map(|pods| {
            pods.into_iter()
                .filter(|p| p.metadata.name == first.metadata.name)
                .count()
        })
    };
    poll(LONG, || same_name().filter(|n| *n == 1)).unwrap_or_else(|| {
        panic!(
            "the old pod is still listed beside the new one: {:?}",
            same_name()
        )
    });
    assert_eq!(container(&second).restart_count, 0);
    let old_sandbox = sandboxes_before[0];
    poll(LONG, || {
        (!Path::new(&format!("/proc/{old_sandbox}")).exists()).then_some(())
    })
    .expect("the old pod's sandbox process exits");
}

#[test]
fn deleting_a_manifest_stops_the_pod_within_its_grace_period() {
    let node = start(&["ticker"]);
    node.write_manifest("t.yaml", &manifest("t", "ticker", "Always", ""))
        .unwrap();
    let pod = node.wait_pod("t", LONG, is_running).unwrap();
    let sandbox = node.sandbox_pids();
    assert_eq!(sandbox.len(), 1);
    // The ticker has written its first line (Running comes before it).
    poll(LONG, || {
        node.container_log(&pod, "main", 0)
            .ok()
            .filter(|l| !l.is_empty())
    })
    .expect("the ticker logs");

    let removed = Instant::now();
    node.remove_manifest("t.yaml").unwrap();
    // terminationGracePeriodSeconds is 5 in these manifests.
    node.wait_gone("t", Duration::from_secs(5)).unwrap();
    poll(
        Duration::from_secs(5).saturating_sub(removed.elapsed()),
        || (!Path::new(&format!("/proc/{}", sandbox[0])).exists()).then_some(()),
    )
    .expect("the sandbox process is gone within the grace period");
    eprintln!("manifest removed -> pod stopped in {:?}", removed.elapsed());
    // Logs stay for `kubectl logs --previous`-style reading after the pod is gone.
    assert!(!node.container_log(&pod, "main", 0).unwrap().is_empty());
}

#[test]
fn a_malformed_manifest_is_reported_by_file_and_changes_nothing() {
    let mut node = start(&["ticker"]);
    node.write_manifest("good.yaml", &manifest("good", "ticker", "Always", ""))
        .unwrap();
    let good = node.wait_pod("good", LONG, is_running).unwrap();

    let bad = node
        .write_manifest("bad.yaml", "apiVersion: v1\nkind: Pod\nmetadata: [oops\n")
        .unwrap();
    let empty = node
        .write_manifest(
            "nocontainers.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: []}\n",
        )
        .unwrap();
    poll(LONG, || {
        let log = node.log();
        (log.contains(&format!(
            "static pod manifest {}: invalid YAML",
            bad.display()
        )) && log.contains(&format!(
            "static pod manifest {}: spec.containers: at least one container is required",
            empty.display()
        )))
        .then_some(())
    })
    .unwrap_or_else(|| panic!("errors naming each file; log:\n{}", node.log()));

    // A broken edit of a running pod's own manifest keeps the pod as it was.
    node.write_manifest(
        "good.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: good}\nspec: {}\n",
    )
    .unwrap();
    poll(LONG, || node.log().contains("keeps running").then_some(()))
        .unwrap_or_else(|| panic!("the broken edit is reported; log:\n{}", node.log()));

    let still = node.pod("good").expect("listed");
    assert_eq!(uid(&still), uid(&good), "same pod");
    assert!(is_running(&still));
    assert_eq!(container(&still).restart_count, 0, "never restarted");
    assert!(node.is_running(), "the agent did not exit");
    assert_eq!(node.pods().unwrap().len(), 1, "no pod from the bad files");
}

#[test]
fn the_pods_endpoint_is_a_v1_pod_list() {
    let node = start(&["ticker"]);
    node.write_manifest("t.yaml", &manifest("t", "ticker", "Always", ""))
        .unwrap();
    let pod = node.wait_pod("t", LONG, is_running).unwrap();
    let (code, body) = wasmlet_testkit::node::http_get(node.read_only_port, "/pods").unwrap();
    assert_eq!(code, 200);
    let raw: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(raw["kind"], "PodList");
    assert_eq!(raw["apiVersion"], "v1");

    // Static pod identity and the status the kubelet reports.
    let ann = pod.metadata.annotations.clone().unwrap();
    assert_eq!(ann["kubernetes.io/config.source"], "file");
    assert_eq!(ann["kubernetes.io/config.hash"], uid(&pod));
    assert!(ann.contains_key("kubernetes.io/config.seen"));
    assert_eq!(pod.spec.as_ref().unwrap().node_name.as_deref(), Some("e2e"));
    let status = pod.status.unwrap();
    assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));
    assert!(status.start_time.is_some());
    let conditions = status.conditions.unwrap();
    for t in [
        "PodReadyToStartContainers",
        "Initialized",
        "ContainersReady",
        "Ready",
        "PodScheduled",
    ] {
        let c = conditions
            .iter()
            .find(|c| c.type_ == t)
            .unwrap_or_else(|| panic!("{t}"));
        assert_eq!(c.status, "True", "{t}");
    }
    let c = &status.container_statuses.unwrap()[0];
    assert!(c.ready && c.started == Some(true));
    assert!(c.container_id.as_deref().unwrap().starts_with("wasm://"));
    assert!(
        c.image_id
            .starts_with("localhost/wasmlet-examples/ticker@sha256:")
    );

    let (code, body) = wasmlet_testkit::node::http_get(node.healthz_port, "/healthz").unwrap();
    assert_eq!((code, body.as_str()), (200, "ok"));
}

#[test]
fn a_manifest_removed_and_restored_unchanged_comes_back_with_the_same_uid() {
    let node = start(&["ticker"]);
    let yaml = manifest("t", "ticker", "Always", "");
    node.write_manifest("t.yaml", &yaml).unwrap();
    let first = node.wait_pod("t", LONG, is_running).unwrap();
    let first_sandbox = node.sandbox_pids();

    // Same content, same file: the same UID, while the old instance may still be
    // terminating. The node must finish terminating it, then start the pod again.
    node.remove_manifest("t.yaml").unwrap();
    let removed = format!("pod removed pod=default/t-e2e uid={}", uid(&first));
    poll(LONG, || node.log().contains(&removed).then_some(()))
        .unwrap_or_else(|| panic!("the node saw the removal; log:\n{}", node.log()));
    node.write_manifest("t.yaml", &yaml).unwrap();
    // The status may still be the terminating instance's (the UID is the same): wait
    // for the new instance's sandbox, not only for Running.
    let again = node
        .wait_pod("t", LONG, |p| {
            let sandboxes = node.sandbox_pids();
            is_running(p)
                && !sandboxes.is_empty()
                && sandboxes.iter().all(|pid| !first_sandbox.contains(pid))
        })
        .unwrap();
    assert_eq!(uid(&again), uid(&first));
    assert_eq!(
        node.sandbox_pids().len(),
        1,
        "exactly one sandbox for the pod"
    );
}

#[test]
fn the_example_manifests_run_as_the_demo_runs_them() {
    let node = start(&["hello", "hello-component", "ticker", "crasher", "httpd"]);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/manifests");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap().flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let yaml = std::fs::read_to_string(&path).unwrap();
            let pod: Pod = serde_saphyr::from_str(&yaml).unwrap();
            names.push(pod.metadata.name.clone().unwrap());
            node.write_manifest(path.file_name().unwrap().to_str().unwrap(), &yaml)
                .unwrap();
        }
    }
    for name in &names {
        node.wait_pod(name, LONG, |p| {
            container(p)
                .state
                .is_some_and(|s| s.running.is_some() || s.terminated.is_some())
                || container(p).restart_count > 0
        })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    // The probed examples become Ready through their probes.
    for name in ["httpd", "probed-ticker"] {
        node.wait_pod(name, LONG, |p| {
            condition(p, "Ready").as_deref() == Some("True")
        })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}
