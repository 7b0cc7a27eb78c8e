//! The node in a cluster: the real binary against the testkit API server over TCP,
//! authenticated as `system:node:e2e`.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::api::node::v1::RuntimeClass;
use wasmlet_testkit::apiserver::{ApiServer, Request};
use wasmlet_testkit::node::{NodeOptions, TestNode, poll};

use crate::*;

pub(crate) const NODE: &str = "e2e";

/// A test API server on its own runtime, and a kubeconfig for the node.
pub(crate) struct Cluster {
    pub(crate) api: ApiServer,
    kubeconfig: PathBuf,
    _rt: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

pub(crate) fn cluster() -> Cluster {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let api = ApiServer::new();
    rt.block_on(api.serve_tcp(0)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig, &format!("system:node:{NODE}"))
        .unwrap();
    Cluster {
        api,
        kubeconfig,
        _rt: rt,
        _dir: dir,
    }
}

pub(crate) fn node_options(c: &Cluster, images: &[&str]) -> NodeOptions {
    NodeOptions {
        images: images.iter().map(|s| s.to_string()).collect(),
        extra_args: vec![
            "--kubeconfig".into(),
            c.kubeconfig.display().to_string(),
            "--node-labels".into(),
            "example.com/tier=edge".into(),
            "--register-with-taints".into(),
            "wasm=only:NoSchedule".into(),
            "--node-ip".into(),
            "127.0.0.1".into(),
        ],
        ..Default::default()
    }
}

/// A pod bound to the node, as the scheduler would leave it.
/// The pod `name` in `default`, as the API server has it.
pub(crate) fn get(c: &Cluster, name: &str) -> Option<Pod> {
    c.api.get::<Pod>(Some("default"), name)
}

/// A pod named `name` in `default` with `spec` as it is.
pub(crate) fn pod_with_spec(name: &str, spec: serde_json::Value) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": "default" },
        "spec": spec,
    }))
    .unwrap()
}

pub(crate) fn api_pod(name: &str, image_name: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": "default" },
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "main",
                "image": image(image_name),
                "imagePullPolicy": "IfNotPresent",
            }],
        },
    }))
    .unwrap()
}

pub(crate) fn node_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.type_ == "Ready"
                    && c.status == "True"
                    && c.reason.as_deref() == Some("KubeletReady")
            })
        })
}

/// The pod of this exact name on the node (`/pods`).
pub(crate) fn here(node: &TestNode, name: &str) -> Option<Pod> {
    node.pods()
        .ok()?
        .into_iter()
        .find(|p| p.metadata.name.as_deref() == Some(name))
}

pub(crate) fn wait<T>(what: &str, timeout: Duration, f: impl FnMut() -> Option<T>) -> T {
    poll(timeout, f).unwrap_or_else(|| panic!("timed out waiting for {what}"))
}

/// Whether the Node authorizer (with NodeRestriction) lets `system:node:<NODE>` make
/// this request; `pods` are the pods bound to the node. The table is docs/cluster.md's.
fn allowed(r: &Request, pods: &BTreeSet<String>) -> bool {
    let own_pod = || pods.contains(&r.name);
    match (
        r.api_group.as_str(),
        r.resource.as_str(),
        r.subresource.as_str(),
        r.verb.as_str(),
    ) {
        ("", "nodes", "", "create") => true,
        ("", "nodes", "", "get" | "patch" | "update") => r.name == NODE,
        ("", "nodes", "status", "patch" | "update") => r.name == NODE,
        ("", "pods", "", "list" | "watch") => r.field_selector == format!("spec.nodeName={NODE}"),
        ("", "pods", "status", "patch" | "update") => own_pod(),
        // Mirror pods only (NodeRestriction); checked on the objects below.
        ("", "pods", "", "create") => true,
        ("", "pods", "", "delete") => own_pod(),
        ("coordination.k8s.io", "leases", "", "get" | "update" | "patch") => {
            r.namespace == "kube-node-lease" && r.name == NODE
        }
        ("coordination.k8s.io", "leases", "", "create") => r.namespace == "kube-node-lease",
        ("" | "events.k8s.io", "events", "", "create" | "patch" | "update") => true,
        ("node.k8s.io", "runtimeclasses", "", "get" | "list" | "watch") => true,
        // The node API's webhooks (the system:node role's rules).
        ("authentication.k8s.io", "tokenreviews", "", "create") => true,
        ("authorization.k8s.io", "subjectaccessreviews", "", "create") => true,
        ("", "services", "", "list" | "watch") => true,
        // Tokens for the service accounts of its pods, bound to the pod.
        ("", "serviceaccounts", "token", "create") => true,
        // Only those the node's pods reference (the authorizer's graph).
        ("", "configmaps" | "secrets", "", "get") => r.namespace == "default",
        // Its own CSINode (the Node authorizer's rule), made at start.
        ("storage.k8s.io", "csinodes", "", "get" | "create" | "update" | "patch") => {
            r.name == NODE || (r.verb == "create" && r.name.is_empty())
        }
        _ => false,
    }
}

#[test]
fn joins_the_cluster_runs_api_pods_keeps_mirrors_and_asks_only_what_a_node_may() {
    let c = cluster();
    let node = start_with(node_options(&c, &["ticker"]));
    node.write_manifest("static.yaml", &manifest("static", "ticker", "Always", ""))
        .unwrap();

    // Registration: labels, taints, resources, addresses, identity, handlers, Ready.
    let n: Node = wait("the Node to be Ready", LONG, || {
        c.api.get::<Node>(None, NODE).filter(node_ready)
    });
    let labels = n.metadata.labels.clone().unwrap();
    assert_eq!(labels["kubernetes.io/hostname"], NODE);
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert_eq!(labels["kubernetes.io/arch"], "amd64");
    assert_eq!(labels["example.com/tier"], "edge");
    let taint = &n.spec.as_ref().unwrap().taints.as_ref().unwrap()[0];
    assert_eq!(
        (taint.key.as_str(), taint.effect.as_str()),
        ("wasm", "NoSchedule")
    );
    let status = n.status.clone().unwrap();
    let capacity = status.capacity.unwrap();
    let allocatable = status.allocatable.unwrap();
    for r in ["cpu", "memory", "ephemeral-storage", "pods"] {
        assert!(capacity.contains_key(r), "capacity has {r}: {capacity:?}");
        assert!(allocatable.contains_key(r), "allocatable has {r}");
    }
    assert_eq!(capacity["pods"].0, "110");
    assert_ne!(
        capacity["memory"], allocatable["memory"],
        "evictionHard is reserved"
    );
    let addresses: Vec<(String, String)> = status
        .addresses
        .unwrap()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect();
    assert_eq!(
        addresses,
        [
            ("InternalIP".to_owned(), "127.0.0.1".to_owned()),
            ("Hostname".to_owned(), NODE.to_owned())
        ]
    );
    let info = status.node_info.unwrap();
    assert!(
        info.kubelet_version.starts_with("v1.33.0-wasmlet"),
        "{info:?}"
    );
    assert!(
        info.container_runtime_version.starts_with("wasmtime://"),
        "{info:?}"
    );
    assert!(!info.boot_id.is_empty() && !info.kernel_version.is_empty());
    assert_eq!(info.operating_system, "linux");
    let handlers: Vec<String> = status
        .runtime_handlers
        .unwrap()
        .into_iter()
        .filter_map(|h| h.name)
        .collect();
    assert!(handlers.contains(&"wasmtime".to_owned()), "{handlers:?}");
    assert_eq!(
        status
            .daemon_endpoints
            .unwrap()
            .kubelet_endpoint
            .unwrap()
            .port,
        i32::from(node.api_port),
        "the node API's port (the testkit gives each node a free one)"
    );

    // The Lease: held by the node, 40 s, owned by the Node.
    let lease: Lease = wait("the node lease", LONG, || {
        c.api.get::<Lease>(Some("kube-node-lease"), NODE)
    });
    let spec = lease.spec.clone().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some(NODE));
    assert_eq!(spec.lease_duration_seconds, Some(40));
    let owner = wait("the lease's owner reference", LONG, || {
        c.api
            .get::<Lease>(Some("kube-node-lease"), NODE)?
            .metadata
            .owner_references?
            .pop()
    });
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Node", NODE));
    assert_eq!(Some(owner.uid), n.metadata.uid.clone());

    // An API pod runs and its status reaches Running with the right conditions. Its
    // RuntimeClass exists only in the API: the node resolves it to its handler.
    let class: RuntimeClass = serde_json::from_value(serde_json::json!({
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": { "name": "edge-wasm" },
        "handler": "wasmtime",
    }))
    .unwrap();
    c.api.create(&class).unwrap();
    let mut web = api_pod("web", "ticker");
    web.spec.as_mut().unwrap().runtime_class_name = Some("edge-wasm".into());
    let created = c.api.create(&web).unwrap();
    let started = Instant::now();
    let web: Pod = wait("the API pod to be Running and Ready", LONG, || {
        c.api
            .get::<Pod>(Some("default"), "web")
            .filter(|p| is_running(p) && condition(p, "Ready").as_deref() == Some("True"))
    });
    eprintln!(
        "API pod created -> Running in the API in {:?}",
        started.elapsed()
    );
    let st = web.status.clone().unwrap();
    for t in [
        "PodReadyToStartContainers",
        "Initialized",
        "ContainersReady",
        "PodScheduled",
    ] {
        assert_eq!(condition(&web, t).as_deref(), Some("True"), "{t}");
    }
    assert_eq!(st.host_ip.as_deref(), Some("127.0.0.1"));
    assert_eq!(st.qos_class.as_deref(), Some("BestEffort"));
    assert!(st.start_time.is_some());
    let cs = container(&web);
    assert!(cs.ready && cs.started == Some(true));
    assert_eq!(cs.restart_count, 0);
    assert!(
        cs.container_id
            .as_deref()
            .unwrap_or("")
            .starts_with("wasm://"),
        "{cs:?}"
    );
    assert!(cs.image_id.contains("@sha256:"), "{cs:?}");

    // The static pod has a mirror pod with the config hash and the Node as owner.
    let mirror: Pod = wait("the mirror pod to be Running", LONG, || {
        c.api
            .get::<Pod>(Some("default"), "static-e2e")
            .filter(is_running)
    });
    let local = node.pod("static").expect("the static pod runs");
    let hash = local.metadata.annotations.as_ref().unwrap()["kubernetes.io/config.hash"].clone();
    assert_eq!(
        mirror.metadata.annotations.as_ref().unwrap()["kubernetes.io/config.mirror"],
        hash
    );
    let owner = &mirror.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Node", NODE));

    // Deleting the mirror recreates it; the static pod keeps running, untouched.
    let old_uid = mirror.metadata.uid.clone().unwrap();
    c.api
        .delete::<Pod>(Some("default"), "static-e2e", None)
        .unwrap();
    wait("a new mirror pod", LONG, || {
        c.api.get::<Pod>(Some("default"), "static-e2e").filter(|p| {
            p.metadata.uid.as_deref() != Some(&old_uid) && p.metadata.deletion_timestamp.is_none()
        })
    });
    let still = node.pod("static").unwrap();
    assert!(is_running(&still));
    assert_eq!(still.metadata.uid, local.metadata.uid);
    assert_eq!(container(&still).restart_count, 0);

    // Deleting the API pod stops it within its grace and finalizes it.
    let deleted = Instant::now();
    c.api
        .delete::<Pod>(Some("default"), "web", Some(5))
        .unwrap();
    wait("the pod to be finalized", Duration::from_secs(20), || {
        c.api
            .get::<Pod>(Some("default"), "web")
            .is_none()
            .then_some(())
    });
    eprintln!("API pod deleted -> finalized in {:?}", deleted.elapsed());
    wait("the node to stop the pod", Duration::from_secs(10), || {
        here(&node, "web").is_none().then_some(())
    });

    // Events with the kubelet's reasons.
    let reasons: BTreeSet<String> = wait("events", LONG, || {
        let reasons: BTreeSet<String> = c
            .api
            .list::<Event>(Some("default"))
            .into_iter()
            .filter(|e| e.involved_object.uid == created.metadata.uid)
            .filter_map(|e| e.reason)
            .collect();
        reasons.contains("Killing").then_some(reasons)
    });
    for r in ["Pulled", "Created", "Started", "Killing"] {
        assert!(reasons.contains(r), "event {r} in {reasons:?}");
    }

    // Every request the node made is one the Node authorizer allows.
    let pods = BTreeSet::from(["web".to_owned(), "static-e2e".to_owned()]);
    let requests = c.api.requests();
    assert!(requests.len() > 10);
    let denied: Vec<&Request> = requests
        .iter()
        .filter(|r| r.user != format!("system:node:{NODE}") || !allowed(r, &pods))
        .collect();
    assert!(
        denied.is_empty(),
        "requests a node may not make: {denied:#?}"
    );
    // What NodeRestriction checks on the objects: the node created only mirror pods,
    // each owned by this Node as controller, without blockOwnerDeletion.
    let node_uid = c.api.get::<Node>(None, NODE).unwrap().metadata.uid;
    for p in c.api.list::<Pod>(Some("default")) {
        if p.metadata.name.as_deref() == Some("static-e2e") {
            assert!(
                p.metadata
                    .annotations
                    .as_ref()
                    .unwrap()
                    .contains_key("kubernetes.io/config.mirror")
            );
            let owners = p.metadata.owner_references.clone().unwrap();
            assert_eq!(owners.len(), 1);
            assert_eq!(Some(owners[0].uid.clone()), node_uid);
            assert_eq!(owners[0].controller, Some(true));
            assert_eq!(owners[0].block_owner_deletion, None);
            let spec = p.spec.clone().unwrap();
            assert!(spec.service_account_name.is_none() && spec.volumes.is_none());
        }
    }
    let n: Node = c.api.get(None, NODE).unwrap();
    for key in n.metadata.labels.unwrap().keys() {
        assert!(
            wasmlet_node::config::node_label_allowed(key),
            "the node set label {key} on itself"
        );
    }
}

#[test]
fn an_api_server_outage_of_a_minute_changes_nothing_that_runs() {
    let c = cluster();
    let node = start_with(node_options(&c, &["ticker"]));
    node.write_manifest("static.yaml", &manifest("static", "ticker", "Always", ""))
        .unwrap();
    c.api.create(&api_pod("web", "ticker")).unwrap();
    wait("the API pod to be Running", LONG, || {
        c.api.get::<Pod>(Some("default"), "web").filter(is_running)
    });
    wait("the mirror pod", LONG, || {
        c.api
            .get::<Pod>(Some("default"), "static-e2e")
            .filter(is_running)
    });
    let pid = node.pid();
    let before: Vec<(String, Option<String>)> = node
        .pods()
        .unwrap()
        .into_iter()
        .map(|p| (p.metadata.name.clone().unwrap(), p.metadata.uid.clone()))
        .collect();

    c.api.faults().set_down(true);
    let down_at = Instant::now();
    let outage = Duration::from_secs(60);
    while down_at.elapsed() < outage {
        // Both pods keep running, with no restart, the whole time.
        for name in ["web", "static-e2e"] {
            let p = here(&node, name).unwrap_or_else(|| panic!("{name} is still known"));
            assert!(is_running(&p), "{name} runs during the outage");
            assert_eq!(container(&p).restart_count, 0);
        }
        std::thread::sleep(Duration::from_secs(2)); // pacing of the observation, not sync
    }
    // Meanwhile the node lifecycle controller marks the node Unknown, as it does
    // when the lease expires.
    let mut n: Node = c.api.get(None, NODE).unwrap();
    for cond in n.status.as_mut().unwrap().conditions.as_mut().unwrap() {
        cond.status = "Unknown".into();
        cond.reason = Some("NodeStatusUnknown".into());
        cond.message = Some("Kubelet stopped posting node status.".into());
    }
    c.api.replace(&n).unwrap();
    // ... and every pod on it NotReady.
    let mut web: Pod = c.api.get(Some("default"), "web").unwrap();
    for cond in web.status.as_mut().unwrap().conditions.as_mut().unwrap() {
        if cond.type_ == "Ready" {
            cond.status = "False".into();
        }
    }
    c.api.replace(&web).unwrap();
    let renewed_before = c
        .api
        .get::<Lease>(Some("kube-node-lease"), NODE)
        .unwrap()
        .spec
        .unwrap()
        .renew_time
        .unwrap();
    c.api.faults().set_down(false);
    let up_at = jiff::Timestamp::now();

    // The lease and node status resume without a restart.
    wait("the lease to be renewed", Duration::from_secs(30), || {
        let t = c
            .api
            .get::<Lease>(Some("kube-node-lease"), NODE)?
            .spec?
            .renew_time?;
        (t.0 > renewed_before.0 && t.0 >= up_at).then_some(())
    });
    wait(
        "the node to report Ready again",
        Duration::from_secs(30),
        || c.api.get::<Node>(None, NODE).filter(node_ready),
    );
    wait(
        "the pod to be Ready again in the API",
        Duration::from_secs(30),
        || {
            c.api
                .get::<Pod>(Some("default"), "web")
                .filter(|p| condition(p, "Ready").as_deref() == Some("True"))
        },
    );
    assert_eq!(node.pid(), pid, "the same node process");
    let after: Vec<(String, Option<String>)> = node
        .pods()
        .unwrap()
        .into_iter()
        .map(|p| (p.metadata.name.clone().unwrap(), p.metadata.uid.clone()))
        .collect();
    assert_eq!(before, after, "the same pods, never restarted");
    // The pod watch resumed: a new pod runs.
    c.api.create(&api_pod("late", "ticker")).unwrap();
    wait("a pod created after the outage to run", LONG, || {
        c.api.get::<Pod>(Some("default"), "late").filter(is_running)
    });
}

#[test]
fn static_pods_from_a_manifest_url_run_and_follow_the_url() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let body = std::sync::Arc::new(std::sync::Mutex::new(manifest(
        "fromurl", "ticker", "Always", "",
    )));
    let served = body.clone();
    let app = axum::Router::new().route(
        "/pods",
        axum::routing::get(move |headers: axum::http::HeaderMap| {
            let served = served.clone();
            async move {
                if headers.get("x-token").map(|v| v.as_bytes()) != Some(b"secret") {
                    return (axum::http::StatusCode::FORBIDDEN, String::new());
                }
                (axum::http::StatusCode::OK, served.lock().unwrap().clone())
            }
        }),
    );
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(async move { axum::serve(listener, app).await });

    let node = start_with(NodeOptions {
        images: vec!["ticker".into()],
        extra_args: vec![
            "--manifest-url".into(),
            format!("http://{addr}/pods"),
            "--manifest-url-header".into(),
            "x-token:secret".into(),
            "--http-check-frequency".into(),
            "1s".into(),
        ],
        ..Default::default()
    });
    let pod = node.wait_pod("fromurl", LONG, is_running).unwrap();
    assert_eq!(
        pod.metadata.annotations.as_ref().unwrap()["kubernetes.io/config.source"],
        "http"
    );
    *body.lock().unwrap() = String::new();
    node.wait_gone("fromurl", Duration::from_secs(20)).unwrap();
}

#[test]
fn after_a_restart_deleted_pods_stop_gracefully_and_finished_pods_stay_finished() {
    let c = cluster();
    let mut node = start_with(node_options(&c, &["ticker", "hello"]));
    let mut done = api_pod("done", "hello");
    done.spec.as_mut().unwrap().restart_policy = Some("Never".into());
    c.api.create(&done).unwrap();
    c.api.create(&api_pod("web", "ticker")).unwrap();
    wait("the Never pod to succeed", LONG, || {
        c.api
            .get::<Pod>(Some("default"), "done")
            .filter(|p| phase(p) == "Succeeded")
    });
    wait("the API pod to be Running", LONG, || {
        c.api.get::<Pod>(Some("default"), "web").filter(is_running)
    });

    // The node dies; meanwhile the pod is deleted in the API.
    node.kill();
    c.api
        .delete::<Pod>(Some("default"), "web", Some(30))
        .unwrap();
    assert!(
        !node.sandbox_pids().is_empty(),
        "the Wasm sandbox outlives the node"
    );
    node.restart().unwrap();

    // The restarted node adopts what runs for it, stops it and only then finalizes.
    wait("the deleted pod to be finalized", LONG, || {
        c.api
            .get::<Pod>(Some("default"), "web")
            .is_none()
            .then_some(())
    });
    wait("no sandbox left", Duration::from_secs(30), || {
        node.sandbox_pids().is_empty().then_some(())
    });
    assert!(
        node.log().contains("terminating pod"),
        "stopped by a pod worker, not by housekeeping"
    );
    // The finished pod is not run a second time.
    let finished: Pod = c.api.get(Some("default"), "done").unwrap();
    assert_eq!(phase(&finished), "Succeeded");
    assert!(here(&node, "done").is_none(), "not started again");
    assert!(
        node.log()
            .contains("pod already finished; not starting it again")
    );
}

#[test]
fn the_environment_comes_from_the_downward_api_config_maps_secrets_and_services() {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
    let c = cluster();
    for (name, ip, port) in [
        ("kubernetes", "10.96.0.1", 443),
        ("redis-primary", "10.0.0.11", 6379),
    ] {
        let svc: Service = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "namespace": "default" },
            "spec": { "clusterIP": ip, "ports": [{ "name": "main", "port": port }] },
        }))
        .unwrap();
        c.api.create(&svc).unwrap();
    }
    let node = start_with(node_options(&c, &["hello"]));
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "cfg", "namespace": "default" },
        "data": { "color": "blue", "bad key": "x" },
    }))
    .unwrap();
    c.api.create(&cm).unwrap();
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "creds", "namespace": "default" },
        "stringData": {},
        "data": { "password": "czNjcmV0" },
    }))
    .unwrap();
    c.api.create(&secret).unwrap();
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "envpod", "namespace": "default" },
        "spec": {
            "nodeName": NODE,
            "restartPolicy": "Never",
            "containers": [{
                "name": "main",
                "image": image("hello"),
                "imagePullPolicy": "IfNotPresent",
                "args": ["$(POD_NAME)", "$$(COLOR)", "$(UNDEFINED)"],
                "resources": { "limits": { "memory": "64Mi" } },
                "envFrom": [{ "prefix": "CFG_", "configMapRef": { "name": "cfg" } }],
                "env": [
                    { "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } },
                    { "name": "NODE", "valueFrom": { "fieldRef": { "fieldPath": "spec.nodeName" } } },
                    { "name": "HOST_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.hostIP" } } },
                    { "name": "MEM_MI", "valueFrom": { "resourceFieldRef": { "resource": "limits.memory", "divisor": "1Mi" } } },
                    { "name": "COLOR", "valueFrom": { "configMapKeyRef": { "name": "cfg", "key": "color" } } },
                    { "name": "OPT", "valueFrom": { "configMapKeyRef": { "name": "cfg", "key": "nope", "optional": true } } },
                    { "name": "PW", "valueFrom": { "secretKeyRef": { "name": "creds", "key": "password" } } },
                    { "name": "GREETING", "value": "hi-$(COLOR)" },
                    { "name": "REDIS_URL", "value": "redis://$(REDIS_PRIMARY_SERVICE_HOST)" },
                ],
            }],
        },
    }))
    .unwrap();
    c.api.create(&pod).unwrap();
    wait("the pod to succeed", LONG, || {
        c.api
            .get::<Pod>(Some("default"), "envpod")
            .filter(|p| phase(p) == "Succeeded")
    });
    let local = here(&node, "envpod").expect("the node has the pod");
    let lines: Vec<String> = node
        .container_log(&local, "main", 0)
        .unwrap()
        .into_iter()
        .filter(|r| r.stream == "stdout")
        .map(|r| r.text)
        .collect();
    for want in [
        "arg[1]=envpod",
        "arg[2]=$(COLOR)",
        "arg[3]=$(UNDEFINED)",
        "env POD_NAME=envpod",
        "env NODE=e2e",
        "env HOST_IP=127.0.0.1",
        "env MEM_MI=64",
        "env COLOR=blue",
        "env PW=s3cret",
        "env GREETING=hi-blue",
        "env CFG_color=blue",
        "env REDIS_URL=redis://10.0.0.11",
        "env REDIS_PRIMARY_SERVICE_HOST=10.0.0.11",
        "env REDIS_PRIMARY_SERVICE_PORT_MAIN=6379",
        "env REDIS_PRIMARY_PORT_6379_TCP=tcp://10.0.0.11:6379",
        "env KUBERNETES_SERVICE_HOST=10.96.0.1",
        "env KUBERNETES_PORT=tcp://10.96.0.1:443",
    ] {
        assert!(lines.iter().any(|l| l == want), "{want} in {lines:#?}");
    }
    assert!(
        !lines.iter().any(|l| l.starts_with("env OPT=")),
        "{lines:#?}"
    );
    assert!(!lines.iter().any(|l| l.contains("bad key")), "{lines:#?}");

    // A missing reference: the container is not started with a wrong value.
    let mut broken = pod.clone();
    broken.metadata.name = Some("broken".into());
    broken.spec.as_mut().unwrap().containers[0].env_from = None;
    broken.spec.as_mut().unwrap().containers[0].env = Some(vec![
        serde_json::from_value(serde_json::json!({
            "name": "X",
            "valueFrom": { "configMapKeyRef": { "name": "missing", "key": "k" } },
        }))
        .unwrap(),
    ]);
    c.api.create(&broken).unwrap();
    let waiting = wait("CreateContainerConfigError", LONG, || {
        let p = c.api.get::<Pod>(Some("default"), "broken")?;
        let w = container(&p).state?.waiting?;
        (w.reason.as_deref() == Some("CreateContainerConfigError")).then_some(w)
    });
    assert_eq!(
        waiting.message.as_deref(),
        Some("configmap \"missing\" not found")
    );
    let invalid = wait("an InvalidEnvironmentVariableNames event", LONG, || {
        c.api
            .list::<Event>(Some("default"))
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("InvalidEnvironmentVariableNames"))
    });
    assert!(invalid.message.unwrap().contains("CFG_bad key"));
    // The secret's value never reaches the node's log.
    assert!(!node.log().contains("s3cret"));
}

#[test]
fn pods_that_do_not_fit_are_rejected_with_the_kubelets_reasons_and_never_started() {
    let c = cluster();
    let node = start_with(node_options(&c, &["ticker"]));
    let mut big = api_pod("big", "ticker");
    big.spec.as_mut().unwrap().containers[0].resources =
        Some(serde_json::from_value(serde_json::json!({ "requests": { "cpu": "1000" } })).unwrap());
    c.api.create(&big).unwrap();
    let mut elsewhere = api_pod("elsewhere", "ticker");
    elsewhere.spec.as_mut().unwrap().node_selector =
        Some([("example.com/tier".to_owned(), "core".to_owned())].into());
    c.api.create(&elsewhere).unwrap();
    let mut fits = api_pod("fits", "ticker");
    fits.spec.as_mut().unwrap().node_selector =
        Some([("example.com/tier".to_owned(), "edge".to_owned())].into());
    c.api.create(&fits).unwrap();

    let rejected = |name: &str| {
        wait(&format!("{name} to be rejected"), LONG, || {
            c.api
                .get::<Pod>(Some("default"), name)
                .filter(|p| phase(p) == "Failed")
        })
        .status
        .unwrap()
    };
    let big = rejected("big");
    assert_eq!(big.reason.as_deref(), Some("OutOfcpu"));
    assert!(
        big.message
            .as_deref()
            .unwrap()
            .starts_with("Node didn't have enough resource: cpu, requested: 1000000"),
        "{big:?}"
    );
    let elsewhere = rejected("elsewhere");
    assert_eq!(elsewhere.reason.as_deref(), Some("NodeAffinity"));
    wait("the pod that fits to run", LONG, || {
        c.api.get::<Pod>(Some("default"), "fits").filter(is_running)
    });
    assert!(
        here(&node, "big")
            .unwrap()
            .status
            .unwrap()
            .container_statuses
            .is_none()
    );
    assert!(node.log().contains("pod rejected"));
}

#[test]
fn the_service_account_volume_every_cluster_pod_gets_is_projected_into_wasm_pods() {
    use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
    let c = cluster();
    let node = start_with(node_options(&c, &["hello"]));
    let ca: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "kube-root-ca.crt", "namespace": "default" },
        "data": { "ca.crt": "-----BEGIN CERTIFICATE-----\nfake\n-----END CERTIFICATE-----\n" },
    }))
    .unwrap();
    c.api.create(&ca).unwrap();
    let sa: ServiceAccount = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "robot", "namespace": "default" },
    }))
    .unwrap();
    c.api.create(&sa).unwrap();
    // The pod as the ServiceAccount admission plugin leaves it: the
    // `kube-api-access-*` projected volume mounted at the well-known path.
    let mount = "/var/run/secrets/kubernetes.io/serviceaccount";
    let container = |name: &str, file: &str| {
        serde_json::json!({
            "name": name,
            "image": image("hello"),
            "imagePullPolicy": "IfNotPresent",
            "env": [{ "name": "READ_FILE", "value": format!("{mount}/{file}") }],
            "volumeMounts": [{ "name": "kube-api-access-abcde", "mountPath": mount, "readOnly": true }],
        })
    };
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "sa-pod", "namespace": "default" },
        "spec": {
            "nodeName": NODE,
            "restartPolicy": "Never",
            "serviceAccountName": "robot",
            "containers": [container("token", "token"), container("ns", "namespace"), container("ca", "ca.crt")],
            "volumes": [{
                "name": "kube-api-access-abcde",
                "projected": {
                    "defaultMode": 420,
                    "sources": [
                        { "serviceAccountToken": { "expirationSeconds": 3607, "path": "token" } },
                        { "configMap": { "name": "kube-root-ca.crt", "items": [{ "key": "ca.crt", "path": "ca.crt" }] } },
                        { "downwardAPI": { "items": [{ "path": "namespace", "fieldRef": { "apiVersion": "v1", "fieldPath": "metadata.namespace" } }] } },
                    ],
                },
            }],
        },
    }))
    .unwrap();
    c.api.create(&pod).unwrap();
    wait("the pod to succeed", LONG, || {
        c.api
            .get::<Pod>(Some("default"), "sa-pod")
            .filter(|p| phase(p) == "Succeeded")
    });
    let local = here(&node, "sa-pod").expect("the node has the pod");
    let read = |name: &str| -> String {
        node.container_log(&local, name, 0)
            .unwrap()
            .into_iter()
            .filter(|r| r.stream == "stdout" && r.text.starts_with("read "))
            .map(|r| r.text)
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(
        read("token").starts_with(&format!("read {mount}/token: ")),
        "{}",
        read("token")
    );
    assert!(
        read("token").len() > format!("read {mount}/token: ").len() + 10,
        "a token"
    );
    assert_eq!(read("ns"), format!("read {mount}/namespace: default"));
    assert!(read("ca").contains("BEGIN CERTIFICATE"), "{}", read("ca"));
    // The token was requested for the pod's own service account.
    assert!(
        c.api
            .requests()
            .iter()
            .any(|r| r.resource == "serviceaccounts"
                && r.subresource == "token"
                && r.name == "robot"
                && r.verb == "create"),
        "a TokenRequest for robot"
    );
    // Nothing of the token reaches the node's log.
    let token = read("token").rsplit(": ").next().unwrap().to_owned();
    assert!(!node.log().contains(&token));
}

/// In-place pod resize: an API pod whose container resources change keeps running
/// (same instance, no restart); its pod cgroup, its Wasm store's memory cap and its
/// status follow. A memory limit below what the guest's memory already uses is refused
/// with the kubelet's `PodResizeInProgress` condition (reason `Error`).
#[test]
fn an_api_pod_is_resized_in_place_without_a_restart() {
    use crate::cgroups::{pod_cgroup, read};
    let c = cluster();
    let node = start_with(node_options(&c, &["ticker"]));
    let resources = |cpu: &str, memory: &str| {
        serde_json::from_value(serde_json::json!({
            "requests": { "cpu": "100m", "memory": "16Mi" },
            "limits": { "cpu": cpu, "memory": memory },
        }))
        .unwrap()
    };
    let mut pod = api_pod("resized", "ticker");
    pod.spec.as_mut().unwrap().containers[0].resources = Some(resources("200m", "64Mi"));
    c.api.create(&pod).unwrap();
    let running = wait("the pod to run", LONG, || {
        c.api
            .get::<Pod>(Some("default"), "resized")
            .filter(is_running)
    });
    let first_id = container(&running).container_id.unwrap();
    let cpu = pod_cgroup(&node, "cpu", "Burstable", &running);
    let memory = pod_cgroup(&node, "memory", "Burstable", &running);
    assert_eq!(read(cpu.join("cpu.cfs_quota_us")), "20000");
    // The limit plus the Wasm sandbox's 64 Mi overhead.
    assert_eq!(
        read(memory.join("memory.limit_in_bytes")),
        (128u64 << 20).to_string()
    );
    let limits = |p: &Pod| {
        container(p)
            .resources
            .and_then(|r| r.limits)
            .map(|l| (l["cpu"].0.clone(), l["memory"].0.clone()))
    };
    assert_eq!(
        limits(&running),
        Some(("200m".to_owned(), "64Mi".to_owned()))
    );

    // Up: the pod cgroup and the status follow, the container keeps running.
    let mut bigger = running.clone();
    bigger.metadata.resource_version = None;
    bigger.spec.as_mut().unwrap().containers[0].resources = Some(resources("400m", "96Mi"));
    c.api.replace(&bigger).unwrap();
    let resized = wait("the resize to show in the status", LONG, || {
        c.api
            .get::<Pod>(Some("default"), "resized")
            .filter(|p| limits(p) == Some(("400m".to_owned(), "96Mi".to_owned())))
    });
    assert_eq!(read(cpu.join("cpu.cfs_quota_us")), "40000");
    assert_eq!(
        read(memory.join("memory.limit_in_bytes")),
        (160u64 << 20).to_string()
    );
    let status = container(&resized);
    assert_eq!(status.container_id.as_ref(), Some(&first_id));
    assert_eq!(status.restart_count, 0);
    assert!(is_running(&resized));
    assert_eq!(
        status.allocated_resources.unwrap()["memory"].0,
        "16Mi",
        "allocatedResources are the requests"
    );

    // Below what its linear memory uses: refused, and said so; it keeps running.
    let mut tiny = resized.clone();
    tiny.metadata.resource_version = None;
    tiny.spec.as_mut().unwrap().containers[0].resources = Some(resources("400m", "1Mi"));
    c.api.replace(&tiny).unwrap();
    let refused = wait("the refused resize to show", LONG, || {
        c.api
            .get::<Pod>(Some("default"), "resized")
            .filter(|p| condition(p, "PodResizeInProgress").as_deref() == Some("True"))
    });
    let cond = refused
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodResizeInProgress"))
        .cloned()
        .unwrap();
    assert_eq!(cond.reason.as_deref(), Some("Error"));
    assert!(
        cond.message.as_deref().unwrap().contains("cannot shrink"),
        "{cond:?}"
    );
    assert!(is_running(&refused));
    assert_eq!(container(&refused).restart_count, 0);
    assert_eq!(
        limits(&refused),
        Some(("400m".to_owned(), "96Mi".to_owned())),
        "the status keeps what the container runs with"
    );
}

/// In-place resize of a container pod: UpdateContainerResources through containerd
/// changes the running container's own cgroup (runc's), and the pod cgroup follows.
#[test]
fn a_container_pod_is_resized_in_place_through_update_container_resources() {
    use crate::cgroups::{pod_cgroup, read};
    use wasmlet_testkit::containerd::{Containerd, images::BUSYBOX_IMAGE};
    let containerd = Containerd::start().expect("containerd starts");
    containerd.import_test_images().expect("test images import");
    let c = cluster();
    let node = start_with(node_options(&c, &[]).with_cri(containerd.address()));
    let limits = |cpu: &str| -> k8s_openapi::api::core::v1::ResourceRequirements {
        serde_json::from_value(serde_json::json!({
            "requests": { "cpu": "100m", "memory": "16Mi" },
            "limits": { "cpu": cpu, "memory": "64Mi" },
        }))
        .unwrap()
    };
    let mut pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": "busy", "namespace": "default" },
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sleep", "600"],
            }],
        },
    }))
    .unwrap();
    pod.spec.as_mut().unwrap().containers[0].resources = Some(limits("500m"));
    c.api.create(&pod).unwrap();
    let running = wait("the pod to run", LONG, || {
        c.api.get::<Pod>(Some("default"), "busy").filter(is_running)
    });
    let id = container(&running).container_id.unwrap();
    let pod_cpu = pod_cgroup(&node, "cpu", "Burstable", &running);
    let own_cpu = pod_cpu.join(id.trim_start_matches("containerd://"));
    assert_eq!(read(own_cpu.join("cpu.cfs_quota_us")), "50000");
    assert_eq!(read(pod_cpu.join("cpu.cfs_quota_us")), "50000");

    let mut bigger = running.clone();
    bigger.metadata.resource_version = None;
    bigger.spec.as_mut().unwrap().containers[0].resources = Some(limits("700m"));
    c.api.replace(&bigger).unwrap();
    wait("the container's own quota to change", LONG, || {
        (read(own_cpu.join("cpu.cfs_quota_us")) == "70000").then_some(())
    });
    assert_eq!(read(pod_cpu.join("cpu.cfs_quota_us")), "70000");
    let resized = wait("the status to follow", LONG, || {
        c.api.get::<Pod>(Some("default"), "busy").filter(|p| {
            container(p)
                .resources
                .and_then(|r| r.limits)
                .is_some_and(|l| l["cpu"].0 == "700m")
        })
    });
    assert_eq!(container(&resized).container_id.as_ref(), Some(&id));
    assert_eq!(container(&resized).restart_count, 0);

    // Down: the container first, then the pod (cgroup v1 keeps a child's quota at or
    // below its parent's).
    let mut smaller = resized.clone();
    smaller.metadata.resource_version = None;
    smaller.spec.as_mut().unwrap().containers[0].resources = Some(limits("300m"));
    c.api.replace(&smaller).unwrap();
    wait("the pod's quota to shrink", LONG, || {
        (read(pod_cpu.join("cpu.cfs_quota_us")) == "30000").then_some(())
    });
    assert_eq!(read(own_cpu.join("cpu.cfs_quota_us")), "30000");
    c.api
        .delete::<Pod>(Some("default"), "busy", Some(0))
        .unwrap();
    poll(Duration::from_secs(30), || {
        (!pod_cpu.exists()).then_some(())
    })
    .unwrap_or_else(|| panic!("{} is left", pod_cpu.display()));
}
