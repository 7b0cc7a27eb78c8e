//! Wasm plugins in a real node: a probe plugin (from a file) chosen by a pod
//! annotation decides a Wasm pod's readiness (with the probe's own timing), an
//! admission plugin (from an image in the node's store) rejects pods with its reason
//! before they start, and both show in `/metrics/plugins`.

use k8s_openapi::api::core::v1::Pod;
use wasmlet_testkit::node::{NodeOptions, free_port, http_get, poll};

use crate::*;

fn ready(p: &Pod) -> bool {
    condition(p, "Ready").as_deref() == Some("True")
}

/// An httpd pod labelled `team: web` whose readiness is the `http-json` plugin
/// checking `/status`'s `status` field against `expect`.
fn probed_httpd(name: &str, port: u16, expect: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels: {{team: web}}\n  annotations:\n    probe.wasmlet.dev/web.readiness: http-json\n    probe.wasmlet.dev/web.readiness.settings: '{{\"port\": \"{port}\", \"path\": \"/status\", \"field\": \"status\", \"expect\": \"{expect}\"}}'\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: web\n    image: {}\n    imagePullPolicy: IfNotPresent\n    env: [{{name: PORT, value: \"{port}\"}}]\n    readinessProbe:\n      tcpSocket: {{port: {port}}}\n      periodSeconds: 1\n",
        image("httpd")
    )
}

#[test]
fn probe_and_admission_plugins_decide_for_real_pods() {
    let built = wasmlet_testkit::images::ensure_plugins().expect("the example plugins build");
    // The admission plugin comes as an image in the node's store (imported from its
    // drop directory), the probe plugin as a file.
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("require-team.tar");
    let reference = "localhost/wasmlet-plugins/require-team:1";
    wasmlet_testkit::images::write_oci_archive(
        &wasmlet_testkit::images::WasmImage::new(
            reference,
            std::fs::read(&built["require-label-admission"]).unwrap(),
            wasmlet_testkit::images::WasmLayout::Artifact,
        ),
        &archive,
    )
    .unwrap();
    let config = format!(
        "  plugins:\n  - name: http-json\n    world: probe-plugin\n    source: {{file: {}}}\n  - name: require-team\n    world: admission-plugin\n    source: {{image: {reference}}}\n    settings: {{label: team, max-cpu-millis: \"1000\"}}\n  - name: gone\n    world: admission-plugin\n    source: {{file: /nonexistent/gone.component.wasm}}\n    failurePolicy: Ignore\n",
        built["http-json-probe"].display(),
    );
    let node = start_with(NodeOptions {
        images: vec!["httpd".into(), "ticker".into()],
        image_archives: vec![archive],
        wasmlet_config: config,
        ..Default::default()
    });

    // Admission: a pod without the label and one asking too much are rejected with the
    // plugin's reasons and never started; a labelled one runs.
    let ticker = |name: &str, labels: &str, cpu: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, labels: {{{labels}}}}}\nspec:\n  containers:\n  - name: main\n    image: {}\n    imagePullPolicy: IfNotPresent\n    resources: {{requests: {{cpu: {cpu}}}}}\n",
            image("ticker")
        )
    };
    node.write_manifest("unlabelled.yaml", &ticker("unlabelled", "", "100m"))
        .unwrap();
    node.write_manifest("greedy.yaml", &ticker("greedy", "team: web", "1500m"))
        .unwrap();
    node.write_manifest("fine.yaml", &ticker("fine", "team: web", "100m"))
        .unwrap();
    let rejected = |name: &str| {
        let pod = node.wait_pod(name, LONG, |p| phase(p) == "Failed").unwrap();
        let status = pod.status.unwrap();
        assert!(status.container_statuses.is_none(), "{name} never started");
        (status.reason.unwrap(), status.message.unwrap())
    };
    let (reason, message) = rejected("unlabelled");
    assert_eq!(reason, "MissingLabel");
    assert!(message.contains("require-team"), "{message}");
    assert_eq!(rejected("greedy").0, "RequestTooLarge");
    node.wait_pod("fine", LONG, is_running).unwrap();
    // A plugin that cannot answer (this one never loaded) admits by its
    // failurePolicy Ignore, and says so on the pod.
    assert!(
        node.log()
            .lines()
            .any(|l| l.contains("AdmissionPluginFailed")
                && l.contains(
                    "admission plugin gone failed; admitted by its failurePolicy Ignore"
                )),
        "{}",
        node.log()
    );

    // Probes: the plugin reads the JSON body; a pod whose field matches becomes Ready,
    // one that expects another value stays running and unready.
    let (good_port, bad_port) = (free_port(), free_port());
    node.write_manifest("good.yaml", &probed_httpd("good", good_port, "ok"))
        .unwrap();
    node.write_manifest("bad.yaml", &probed_httpd("bad", bad_port, "degraded"))
        .unwrap();
    node.wait_pod("good", LONG, ready).unwrap();
    let failed_checks = || {
        let (_, text) = http_get(node.read_only_port, "/metrics/probes").ok()?;
        text.lines()
            .find(|l| {
                l.starts_with("prober_probe_total{")
                    && l.contains("pod=\"bad-e2e\"")
                    && l.contains("result=\"failed\"")
            })
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .filter(|n| *n >= 3)
    };
    poll(LONG, failed_checks).unwrap_or_else(|| {
        let metrics = http_get(node.read_only_port, "/metrics/probes").map(|r| r.1);
        panic!(
            "the plugin fails the bad pod's readiness: {metrics:?}\n{:?}\n{}",
            node.pod("bad"),
            node.log()
        )
    });
    let bad = node.pod("bad").unwrap();
    assert!(
        node.log()
            .lines()
            .any(|l| l.contains("Readiness probe failed") && l.contains("degraded")),
        "the plugin's message is the probe's output"
    );
    assert!(is_running(&bad) && !ready(&bad));
    assert_eq!(container(&bad).restart_count, 0, "readiness never restarts");

    let (_, metrics) = http_get(node.read_only_port, "/metrics/plugins").unwrap();
    let calls = metrics
        .lines()
        .find(|l| l.starts_with("wasmlet_plugin_calls_total{plugin=\"http-json\""))
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(calls >= 4, "{metrics}");
    assert!(
        metrics.contains("wasmlet_plugin_calls_total{plugin=\"require-team\""),
        "{metrics}"
    );
}
