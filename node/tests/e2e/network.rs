//! The pod network, end to end: a joined node whose Wasm pods are attached with the
//! same CNI configuration as its containerd (one bridge, one host-local range), so
//! busybox and Wasm pods get addresses from one subnet and reach each other; a
//! `hostNetwork` Wasm pod has the node's address; a restart of the node keeps the
//! pods' addresses; deleting the pods leaves no allocation, veth or namespace. A
//! `wasi:http/proxy` component answers on its containerPort at its pod IP.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;
use wasmlet_testkit::containerd::{Containerd, images::BUSYBOX_IMAGE};
use wasmlet_testkit::node::poll;

use crate::cluster::*;
use crate::*;

const WEB_PORT: u16 = 8080;
const BUSYBOX_PORT: u16 = 8000;
const PROXY_PORT: u16 = 9090;

/// The Wasm runtime's namespaces in `/var/run/netns`.
fn wasm_namespaces() -> BTreeSet<String> {
    std::fs::read_dir("/var/run/netns")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("wasmlet-"))
        .collect()
}

fn busybox(name: &str, policy: &str, script: &str) -> Pod {
    pod_with_spec(
        name,
        json!({
            "nodeName": NODE,
            "restartPolicy": policy,
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
            }],
        }),
    )
}

/// The `httpd` Wasm image: serving on [`WEB_PORT`] (ready by its readiness probe), or
/// with `args`, a one-shot client.
fn wasm(name: &str, policy: &str, args: &[String], host_network: bool) -> Pod {
    let mut container = json!({
        "name": "main",
        "image": image("httpd"),
        "imagePullPolicy": "IfNotPresent",
        "env": [{"name": "PORT", "value": WEB_PORT.to_string()}],
        "ports": [{"containerPort": WEB_PORT}],
    });
    if args.is_empty() {
        container["readinessProbe"] = json!({
            "httpGet": {"path": "/ready", "port": WEB_PORT},
            "periodSeconds": 1,
        });
    } else {
        container["args"] = json!(args);
    }
    pod_with_spec(
        name,
        json!({
            "nodeName": NODE,
            "restartPolicy": policy,
            "hostNetwork": host_network,
            "terminationGracePeriodSeconds": 2,
            "containers": [container],
        }),
    )
}

fn pod_ip(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap_or_default()
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Waits for `name` to finish and returns its log's lines (it must succeed).
fn succeeded_log(c: &Cluster, node: &crate::Fixture, name: &str) -> Vec<String> {
    let done = wait(&format!("{name} to finish"), LONG, || {
        get(c, name).filter(|p| matches!(phase(p), "Succeeded" | "Failed"))
    });
    let lines: Vec<String> = node
        .container_log(&done, "main", 0)
        .map(|r| r.into_iter().map(|r| r.text).collect())
        .unwrap_or_default();
    assert_eq!(
        phase(&done),
        "Succeeded",
        "{name}: {lines:?} {:?}",
        done.status
    );
    lines
}

#[test]
fn wasm_and_container_pods_share_one_pod_network_and_reach_each_other() {
    let containerd = Containerd::start().expect("containerd starts");
    containerd.import_test_images().expect("test images import");
    let layout = containerd.layout().clone();
    let c = cluster();
    let mut opts = node_options(&c, &["httpd", "hello-http"]).with_cri(containerd.address());
    opts.cni_conf_dir = Some(layout.cni_conf_dir());
    let namespaces_before = wasm_namespaces();
    let mut node = start_with(opts);
    wait("the Node to be Ready", LONG, || {
        c.api.get::<Node>(None, NODE).filter(node_ready)
    });

    // Two servers: the Wasm httpd (its readiness probe goes to its pod IP) and a
    // busybox httpd.
    c.api
        .create(&wasm("wasm-web", "Always", &[], false))
        .unwrap();
    c.api
        .create(&busybox(
            "box-web",
            "Always",
            &format!(
                "mkdir -p /www && echo hello from busybox > /www/index.html && exec httpd -f -p {BUSYBOX_PORT} -h /www"
            ),
        ))
        .unwrap();
    // A wasi:http/proxy component, served by the node on its containerPort.
    c.api
        .create(&pod_with_spec(
            "wasm-proxy",
            json!({
                "nodeName": NODE,
                "terminationGracePeriodSeconds": 2,
                "containers": [{
                    "name": "main",
                    "image": image("hello-http"),
                    "imagePullPolicy": "IfNotPresent",
                    "ports": [{"containerPort": PROXY_PORT}],
                }],
            }),
        ))
        .unwrap();
    let web = wait("the Wasm server to be Ready", LONG, || {
        get(&c, "wasm-web").filter(ready)
    });
    let boxed = wait("the busybox server to run", LONG, || {
        get(&c, "box-web").filter(|p| phase(p) == "Running")
    });
    let proxy = wait("the wasi:http component to run", LONG, || {
        get(&c, "wasm-proxy").filter(|p| phase(p) == "Running")
    });
    let proxy_ip = pod_ip(&proxy);
    let (web_ip, box_ip) = (pod_ip(&web), pod_ip(&boxed));
    for ip in [&web_ip, &box_ip] {
        assert!(
            layout.subnet.contains(ip),
            "{ip} is not in {}",
            layout.subnet
        );
    }
    assert_ne!(web_ip, box_ip);
    let status = web.status.clone().unwrap();
    assert_eq!(
        status.pod_ips.unwrap()[0].ip,
        web_ip,
        "podIPs starts with podIP"
    );
    assert_eq!(status.host_ip.as_deref(), Some("127.0.0.1"));
    let new_namespaces: Vec<String> = wasm_namespaces()
        .difference(&namespaces_before)
        .cloned()
        .collect();
    assert_eq!(new_namespaces.len(), 2, "{new_namespaces:?}");

    // Each kind reaches the other at its pod IP.
    c.api
        .create(&busybox(
            "box-client",
            "Never",
            &format!(
                "wget -qO- http://{web_ip}:{WEB_PORT}/healthz && wget -qO- http://{proxy_ip}:{PROXY_PORT}/"
            ),
        ))
        .unwrap();
    c.api
        .create(&wasm(
            "wasm-client",
            "Never",
            &[
                "fetch".into(),
                format!("{box_ip}:{BUSYBOX_PORT}"),
                "/".into(),
            ],
            false,
        ))
        .unwrap();
    assert_eq!(
        succeeded_log(&c, &node, "box-client"),
        ["ok", "hello from wasi:http"]
    );
    assert_eq!(
        succeeded_log(&c, &node, "wasm-client"),
        ["HTTP/1.1 200 OK", "hello from busybox"]
    );

    // A hostNetwork Wasm pod has the node's address, and reaches the pod network from
    // the node's side of the bridge.
    c.api
        .create(&wasm(
            "wasm-host",
            "Never",
            &[
                "fetch".into(),
                format!("{web_ip}:{WEB_PORT}"),
                "/healthz".into(),
            ],
            true,
        ))
        .unwrap();
    assert_eq!(
        succeeded_log(&c, &node, "wasm-host"),
        ["HTTP/1.1 200 OK", "ok"]
    );
    let host = get(&c, "wasm-host").unwrap();
    assert_eq!(pod_ip(&host), "127.0.0.1");

    // A node killed and started again adopts its Wasm pod with its address.
    node.kill();
    node.restart().unwrap();
    wait("the Node to be Ready again", LONG, || {
        c.api.get::<Node>(None, NODE).filter(node_ready)
    });
    let again = wait("the Wasm server to be Ready again", LONG, || {
        get(&c, "wasm-web").filter(ready)
    });
    assert_eq!(pod_ip(&again), web_ip);
    assert_eq!(container(&again).restart_count, 0, "{:?}", again.status);
    c.api
        .create(&busybox(
            "box-client-2",
            "Never",
            &format!("wget -qO- http://{web_ip}:{WEB_PORT}/healthz"),
        ))
        .unwrap();
    assert_eq!(succeeded_log(&c, &node, "box-client-2"), ["ok"]);

    // Every pod deleted: no address, veth or namespace is left.
    let names = [
        "wasm-proxy",
        "wasm-web",
        "box-web",
        "box-client",
        "wasm-client",
        "wasm-host",
        "box-client-2",
    ];
    for name in names {
        c.api.delete::<Pod>(Some("default"), name, None).unwrap();
    }
    wait("every pod to be gone", LONG, || {
        names.iter().all(|n| get(&c, n).is_none()).then_some(())
    });
    let ipam = layout.ipam_dir().join(&layout.prefix);
    let leftovers = || {
        let allocations: Vec<String> = std::fs::read_dir(&ipam)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
            .collect();
        let veths: Vec<String> =
            std::fs::read_dir(format!("/sys/class/net/{}/brif", layout.bridge))
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
        let namespaces: Vec<String> = wasm_namespaces()
            .difference(&namespaces_before)
            .cloned()
            .collect();
        (allocations, veths, namespaces)
    };
    let left = poll(LONG, || {
        let left = leftovers();
        (left == Default::default()).then_some(())
    });
    assert!(left.is_some(), "left behind: {:?}", leftovers());
    drop(node);
}
