//! The node API on its TLS port, in a cluster: every request authenticated (client
//! certificates against `--client-ca-file`, bearer tokens through TokenReview) and
//! authorized (SubjectAccessReview) through the testkit API server; logs read by the
//! real `kubectl` through the API server's `pods/log` proxy, which reaches the node
//! with the API server's own client certificate.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{Node, Pod};
use wasmlet_testkit::apiserver::Credentials;
use wasmlet_testkit::node::NodeApiAuth;
use wasmlet_testkit::pki::Ca;

use crate::cluster::{NODE, api_pod, cluster, node_options, node_ready, wait};
use crate::*;

const HOUR: Duration = Duration::from_secs(3600);

fn is_running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// A Wasm pod that prints a line every 200 ms.
fn talker() -> Pod {
    let mut pod = api_pod("talker", "ticker");
    pod.spec.as_mut().unwrap().containers[0].env = Some(vec![k8s_openapi::api::core::v1::EnvVar {
        name: "INTERVAL_MS".into(),
        value: Some("200".into()),
        value_from: None,
    }]);
    pod
}

/// The node's subresource a SubjectAccessReview asked about, and its verb, user and
/// the node's name.
fn asked(r: &SubjectAccessReview) -> (String, String, String, String) {
    let spec = &r.spec;
    let attrs = spec.resource_attributes.clone().unwrap_or_default();
    (
        spec.user.clone().unwrap_or_default(),
        attrs.verb.unwrap_or_default(),
        attrs.subresource.unwrap_or_default(),
        attrs.name.unwrap_or_default(),
    )
}

/// The cluster CA as a file in a directory of its own, for `--client-ca-file`.
pub(crate) fn client_ca_file(
    c: &crate::cluster::Cluster,
) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("client-ca.crt");
    std::fs::write(&file, c.api.ca().pem()).unwrap();
    (dir, file)
}

/// The node verifies client certificates (the API server's included) against `ca`.
pub(crate) fn trust_client_ca(opts: &mut wasmlet_testkit::node::NodeOptions, ca: &std::path::Path) {
    opts.extra_args
        .extend(["--client-ca-file".into(), ca.display().to_string()]);
}

#[test]
fn the_node_api_authenticates_and_authorizes_every_request() {
    let c = cluster();
    let (_ca_dir, ca_file) = client_ca_file(&c);
    let mut opts = node_options(&c, &["ticker"]);
    trust_client_ca(&mut opts, &ca_file);
    let node = start_with(opts);
    wait("the Node to be Ready", LONG, || {
        c.api.get::<Node>(None, NODE).filter(node_ready)
    });
    c.api.create(&talker()).unwrap();
    wait("the pod to run", LONG, || {
        c.api
            .get::<Pod>(Some("default"), "talker")
            .filter(is_running)
    });
    let get = |path: &str, auth: NodeApiAuth<'_>| node.api_get(path, auth).unwrap();

    // No credentials: 401 on every path, known or not.
    for path in [
        "/pods",
        "/healthz",
        "/runningpods/",
        "/containerLogs/default/talker/main",
        "/metrics/probes",
        "/stats/summary",
        "/no/such/path",
    ] {
        let (code, body) = get(path, NodeApiAuth::None);
        assert_eq!((code, body.trim()), (401, "Unauthorized"), "{path}");
    }
    // A certificate from another CA: 401, and no review was asked for.
    let other = Ca::new("not-the-cluster");
    let (cert, key) = other
        .issue_client("system:admin", &["system:masters"], HOUR)
        .unwrap();
    let intruder = NodeApiAuth::ClientCert {
        cert_pem: &cert,
        key_pem: &key,
    };
    assert_eq!(get("/pods", intruder).0, 401);
    assert!(c.api.access_reviews().is_empty());
    // A token the API server does not know: its TokenReview says no, 401.
    assert_eq!(get("/pods", NodeApiAuth::Token("not-a-token")).0, 401);
    let reviews = c.api.token_reviews();
    assert_eq!(reviews.len(), 1, "{reviews:?}");
    assert_eq!(reviews[0].spec.token.as_deref(), Some("not-a-token"));

    // A user the SubjectAccessReview denies: 403 naming the verb and the resource.
    c.api.add_token("viewer-token", "viewer", &["viewers"]);
    c.api
        .set_access_policy(|r| (r.spec.user.as_deref() == Some("admin"), String::new()));
    let (code, body) = get("/pods", NodeApiAuth::Token("viewer-token"));
    assert_eq!(code, 403, "{body}");
    assert_eq!(
        body.trim(),
        "Forbidden (user=viewer, verb=get, resource=nodes, subresource(s)=[proxy])"
    );
    let review = c.api.access_reviews().pop().unwrap();
    let spec = &review.spec;
    assert_eq!(spec.user.as_deref(), Some("viewer"));
    let groups = spec.groups.clone().unwrap_or_default();
    assert!(
        groups.contains(&"viewers".to_owned())
            && groups.contains(&"system:authenticated".to_owned()),
        "{groups:?}"
    );
    let attrs = spec.resource_attributes.clone().unwrap();
    assert_eq!(attrs.verb.as_deref(), Some("get"));
    assert_eq!(attrs.group.as_deref().unwrap_or(""), "");
    assert_eq!(attrs.resource.as_deref(), Some("nodes"));
    assert_eq!(attrs.subresource.as_deref(), Some("proxy"));
    assert_eq!(attrs.name.as_deref(), Some(NODE));
    assert_eq!(attrs.namespace.as_deref().unwrap_or(""), "");
    assert!(spec.non_resource_attributes.is_none());
    // Each path asks for the kubelet's subresource.
    for (path, subresource) in [
        ("/stats/summary", "stats"),
        ("/metrics/probes", "metrics"),
        ("/logs/", "log"),
    ] {
        assert_eq!(
            get(path, NodeApiAuth::Token("viewer-token")).0,
            403,
            "{path}"
        );
        let review = c.api.access_reviews().pop().unwrap();
        assert_eq!(
            asked(&review),
            (
                "viewer".into(),
                "get".into(),
                subresource.into(),
                NODE.into()
            ),
            "{path}"
        );
    }

    // The denial is cached (cacheUnauthorizedTTL, 30 s) by its attributes, which do
    // not hold the path: another `proxy` path asks no new review.
    let reviews = c.api.access_reviews().len();
    assert_eq!(
        get(
            "/containerLogs/default/talker/main",
            NodeApiAuth::Token("viewer-token")
        )
        .0,
        403
    );
    assert_eq!(c.api.access_reviews().len(), reviews);

    // Allowed: a client certificate from the cluster's CA, for a user the policy lets.
    let (cert, key) = c.api.ca().issue_client("admin", &[], HOUR).unwrap();
    let admin = NodeApiAuth::ClientCert {
        cert_pem: &cert,
        key_pem: &key,
    };
    let tokens_before = c.api.token_reviews().len();
    let (code, body) = get("/pods", admin);
    assert_eq!(code, 200, "{body}");
    let pods: serde_json::Value = serde_json::from_str(&body).unwrap();
    let names: Vec<&str> = pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    assert!(names.contains(&"talker"), "{names:?}");
    assert_eq!(
        c.api.token_reviews().len(),
        tokens_before,
        "a certificate needs no TokenReview"
    );
    assert_eq!(get("/healthz", admin), (200, "ok".to_owned()));
    // The agent's own metrics: the talker was created, started and is running.
    let (code, body) = get("/metrics", admin);
    assert_eq!(code, 200, "{body}");
    let value = |series: &str| -> f64 {
        body.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in {body}"))
    };
    assert!(value("kubelet_pod_start_duration_seconds_count") >= 1.0);
    assert!(value("kubelet_pod_worker_duration_seconds_count{operation_type=\"create\"}") >= 1.0);
    assert!(value("kubelet_pleg_relist_duration_seconds_count") >= 1.0);
    assert!(value("kubelet_running_pods") >= 1.0);
    assert!(value("kubelet_running_containers{container_state=\"running\"}") >= 1.0);
    assert_eq!(value(&format!("kubelet_node_name{{node=\"{NODE}\"}}")), 1.0);
    // Every runtime call goes through the instrumented runtime.
    assert!(value("kubelet_runtime_operations_total{operation_type=\"run_podsandbox\"}") >= 1.0);
    assert!(
        value(
            "kubelet_runtime_operations_duration_seconds_count{operation_type=\"create_container\"}"
        ) >= 1.0
    );
    assert!(value("kubelet_runtime_operations_total{operation_type=\"list_containers\"}") >= 1.0);
    let (code, body) = get("/configz", admin);
    assert_eq!(code, 200, "{body}");
    let configz: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        configz["kubeletconfig"]["port"],
        serde_json::json!(node.api_port)
    );
    assert_eq!(
        configz["kubeletconfig"]["authentication"]["x509"]["clientCAFile"],
        serde_json::json!(ca_file.display().to_string())
    );
    let (code, body) = get("/runningpods/", admin);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"talker\""), "{body}");
    // The node's own logs: /var/log listed and its files served.
    let (code, body) = get("/logs/", admin);
    assert_eq!(code, 200, "{body}");
    let mut files: Vec<String> = std::fs::read_dir("/var/log")
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    for name in &files {
        assert!(body.contains(&format!(">{name}</a>")), "{name} in {body}");
    }
    if let Some(name) = files.iter().find(|n| n.ends_with(".log")) {
        let (code, served) = get(&format!("/logs/{name}"), admin);
        assert_eq!(code, 200, "{served}");
        let on_disk = std::fs::read(format!("/var/log/{name}")).unwrap();
        assert_eq!(served.len(), on_disk.len(), "/logs/{name}");
    }
    let (code, body) = get("/containerLogs/default/talker/main?tailLines=1", admin);
    assert_eq!(code, 200, "{body}");
    assert!(
        body.starts_with("tick ") && body.lines().count() == 1,
        "{body:?}"
    );
    // Not found, named.
    let (code, body) = get("/containerLogs/default/nobody/main", admin);
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("nobody"), "{body}");
    let (code, body) = get("/containerLogs/default/talker/other", admin);
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("other"), "{body}");
    let (code, body) = get("/containerLogs/default/talker/main?tailLines=-1", admin);
    assert_eq!(code, 422, "{body}");
}

/// `kubectl logs` as an operator runs it: through the API server, whose `pods/log`
/// proxy reaches the node with the API server's client certificate.
fn kubectl(kubeconfig: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--request-timeout=20s")
        .args(args)
        .output()
        .expect("kubectl runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `kubectl logs -f <pod> --tail=1`: its first three lines are consecutive numbered
/// lines (`<prefix><n>`), as the container writes them.
fn follow_consecutive(kubeconfig: &std::path::Path, pod: &str, prefix: &str) {
    let mut follow = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["logs", "-f", pod, "--tail=1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(follow.stdout.take().unwrap());
    let mut seen = Vec::new();
    for _ in 0..3 {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        seen.push(line.trim_end().to_owned());
    }
    let _ = follow.kill();
    let _ = follow.wait();
    let numbers: Vec<u64> = seen
        .iter()
        .map(|l| l.strip_prefix(prefix).unwrap().parse().unwrap())
        .collect();
    assert!(
        numbers.windows(2).all(|w| w[1] == w[0] + 1),
        "consecutive lines as they are written: {seen:?}"
    );
}

/// The test API server also over TLS (on a runtime of its own, returned to be kept
/// for the test's length) and a kubeconfig for kubectl: an admin with a token.
pub(crate) fn kubectl_access(
    c: &crate::cluster::Cluster,
    dir: &std::path::Path,
) -> (tokio::runtime::Runtime, std::path::PathBuf) {
    let tls = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    tls.block_on(c.api.serve_tls(0)).unwrap();
    c.api.add_token("admin-token", "admin", &["system:masters"]);
    let kubeconfig = dir.join("kubeconfig");
    c.api
        .write_kubeconfig_tls(&kubeconfig, &Credentials::Token("admin-token".into()))
        .unwrap();
    (tls, kubeconfig)
}

#[test]
fn kubectl_logs_reads_a_wasm_pods_log_through_the_api_server() {
    let c = cluster();
    let (ca_dir, ca_file) = client_ca_file(&c);
    let mut opts = node_options(&c, &["ticker"]);
    trust_client_ca(&mut opts, &ca_file);
    let node = start_with(opts);
    let (_tls, kubeconfig) = kubectl_access(&c, ca_dir.path());
    wait("the Node to be Ready", LONG, || {
        c.api.get::<Node>(None, NODE).filter(node_ready)
    });
    c.api.create(&talker()).unwrap();
    wait("the pod to run", LONG, || {
        c.api
            .get::<Pod>(Some("default"), "talker")
            .filter(is_running)
    });
    wait("three lines in the log", LONG, || {
        let (ok, out, _) = kubectl(&kubeconfig, &["logs", "talker"]);
        (ok && out.lines().count() >= 3).then_some(())
    });

    let (ok, out, err) = kubectl(&kubeconfig, &["logs", "talker"]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "tick 1", "{out}");
    assert!(lines.iter().all(|l| l.starts_with("tick ")), "{out}");

    let (ok, out, err) = kubectl(&kubeconfig, &["logs", "talker", "--tail=2"]);
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 2, "{out}");

    let (ok, out, err) = kubectl(&kubeconfig, &["logs", "talker", "--tail=1", "--timestamps"]);
    assert!(ok, "{err}");
    let (stamp, line) = out
        .trim_end()
        .split_once(' ')
        .expect("a timestamp, then the line");
    assert!(stamp.parse::<jiff::Timestamp>().is_ok(), "{stamp:?}");
    assert!(line.starts_with("tick "), "{out:?}");

    let (ok, out, err) = kubectl(&kubeconfig, &["logs", "talker", "--limit-bytes=6"]);
    assert!(ok, "{err}");
    assert_eq!(out, "tick 1");

    let (ok, out, err) = kubectl(&kubeconfig, &["logs", "talker", "--since=1h"]);
    assert!(ok, "{err}");
    assert!(out.starts_with("tick 1\n"), "{out}");

    let (ok, _, err) = kubectl(&kubeconfig, &["logs", "talker", "--previous"]);
    assert!(!ok);
    assert!(err.contains("previous terminated container"), "{err}");

    // Follow: lines written after kubectl started arrive while it runs.
    follow_consecutive(&kubeconfig, "talker", "tick ");
    drop(node);
}

/// An API pod from YAML-ish JSON: one container `main` of `image` running `command`.
pub(crate) fn command_pod(name: &str, image: &str, command: &[&str], restart_policy: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": "default" },
        "spec": {
            "nodeName": NODE,
            "restartPolicy": restart_policy,
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "main",
                "image": image,
                "imagePullPolicy": "Never",
                "command": command,
            }],
        },
    }))
    .unwrap()
}

fn restarts(p: &Pod) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.first())
        .map(|c| c.restart_count)
        .unwrap_or(0)
}

#[test]
fn kubectl_logs_reads_container_pods_and_previous_instances_of_both_kinds() {
    use wasmlet_testkit::containerd::{Containerd, images::BUSYBOX_IMAGE};
    let containerd = Containerd::start().expect("containerd starts");
    containerd.import_test_images().expect("test images import");
    let c = cluster();
    let (ca_dir, ca_file) = client_ca_file(&c);
    let mut opts = node_options(&c, &["crasher"]).with_cri(containerd.address());
    trust_client_ca(&mut opts, &ca_file);
    let node = start_with(opts);
    let (_tls, kubeconfig) = kubectl_access(&c, ca_dir.path());
    wait("the Node to be Ready", LONG, || {
        c.api.get::<Node>(None, NODE).filter(node_ready)
    });

    // A busybox pod that counts, and one that prints its run and exits (restarted).
    c.api
        .create(&command_pod(
            "counter",
            BUSYBOX_IMAGE,
            &[
                "sh",
                "-c",
                "i=1; while true; do echo line $i; i=$((i+1)); sleep 0.2; done",
            ],
            "Always",
        ))
        .unwrap();
    c.api
        .create(&command_pod(
            "box-crasher",
            BUSYBOX_IMAGE,
            &["sh", "-c", "echo run at $(date +%s%N); exit 1"],
            "Always",
        ))
        .unwrap();
    let mut wasm_crasher = api_pod("wasm-crasher", "crasher");
    wasm_crasher.spec.as_mut().unwrap().restart_policy = Some("Always".into());
    c.api.create(&wasm_crasher).unwrap();

    wait("the counter's third line", LONG, || {
        let (ok, out, _) = kubectl(&kubeconfig, &["logs", "counter"]);
        (ok && out.lines().count() >= 3).then_some(())
    });
    let (ok, out, err) = kubectl(
        &kubeconfig,
        &["logs", "counter", "--tail=1", "--timestamps"],
    );
    assert!(ok, "{err}");
    let (stamp, line) = out.trim_end().split_once(' ').unwrap();
    assert!(stamp.parse::<jiff::Timestamp>().is_ok(), "{out:?}");
    assert!(line.starts_with("line "), "{out:?}");
    let (ok, out, err) = kubectl(&kubeconfig, &["logs", "counter", "--limit-bytes=4"]);
    assert!(ok, "{err}");
    assert_eq!(out, "line");

    follow_consecutive(&kubeconfig, "counter", "line ");

    // Previous instances, after a restart, of a container and of a Wasm pod (whose
    // panic went to stderr, interleaved in the same log).
    for (pod, first, last) in [
        ("box-crasher", "run at ", "run at "),
        ("wasm-crasher", "about to crash", "deliberate panic"),
    ] {
        wait(&format!("{pod} to restart"), LONG, || {
            c.api
                .get::<Pod>(Some("default"), pod)
                .filter(|p| restarts(p) >= 1)
        });
        let (ok, out, err) = kubectl(&kubeconfig, &["logs", pod, "--previous"]);
        assert!(ok, "{pod}: {err}");
        assert!(out.starts_with(first), "{pod}: {out:?}");
        assert!(out.contains(last), "{pod}: {out:?}");
        assert_eq!(out.matches(first).count(), 1, "one instance's log: {out:?}");
    }
    drop(node);
}

/// `enableDebuggingHandlers: false` answers the debugging endpoints with the kubelet's
/// 405 and leaves the rest; `enableSystemLogHandler: false` alone refuses `/logs/`.
#[test]
fn debugging_and_system_log_handlers_can_be_turned_off() {
    let client = crate::stats::ApiClient::new();
    let get = |node: &wasmlet_testkit::node::TestNode, path: &str| {
        node.api_get(path, client.auth()).unwrap()
    };
    let node = crate::start_with(client.options(wasmlet_testkit::node::NodeOptions {
        kubelet_config: "enableDebuggingHandlers: false\n".into(),
        ..Default::default()
    }));
    for path in [
        "/containerLogs/default/p/c",
        "/runningpods/",
        "/logs/",
        "/logs",
        "/exec/default/p/c",
        "/portForward/default/p",
        "/debug/pprof/",
    ] {
        assert_eq!(
            get(&node, path),
            (405, "Debug endpoints are disabled.\n".to_owned()),
            "{path}"
        );
    }
    assert_eq!(get(&node, "/configz").0, 404);
    for path in ["/pods", "/healthz", "/stats/summary", "/metrics/cadvisor"] {
        assert_eq!(get(&node, path).0, 200, "{path}");
    }
    drop(node);

    let node = crate::start_with(client.options(wasmlet_testkit::node::NodeOptions {
        kubelet_config: "enableSystemLogHandler: false\n".into(),
        ..Default::default()
    }));
    assert_eq!(
        get(&node, "/logs/"),
        (405, "logs endpoint is disabled.\n".to_owned())
    );
    assert_eq!(get(&node, "/runningpods/").0, 200);
    let (code, configz) = get(&node, "/configz");
    assert_eq!(code, 200);
    let configz: serde_json::Value = serde_json::from_str(&configz).unwrap();
    let c = &configz["kubeletconfig"];
    assert_eq!(
        (&c["enableSystemLogHandler"], &c["enableDebuggingHandlers"]),
        (&serde_json::json!(false), &serde_json::json!(true))
    );
    assert_eq!(c["volumeStatsAggPeriod"], "1m0s");
}
