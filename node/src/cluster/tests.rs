//! The cluster parts against the testkit API server, in-process, with paused time.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use wasmlet_testkit::apiserver::{ApiServer, Request};

use super::lease::LeaseController;
use super::node_status::{NodeStatusLoop, StatusInputs};
use super::registration::{NodeFacts, register};
use super::*;
use crate::pod::MIRROR_ANNOTATION;

fn facts() -> NodeFacts {
    NodeFacts {
        name: "n1".into(),
        hostname: "n1".into(),
        addresses: vec!["10.1.2.3".parse().unwrap()],
        runtime_handlers: vec!["wasmtime".into()],
        kubelet_port: 10250,
        ..Default::default()
    }
}

fn count(api: &ApiServer, f: impl Fn(&Request) -> bool) -> usize {
    api.requests().iter().filter(|r| f(r)).count()
}

fn lease_updates(r: &Request) -> bool {
    r.resource == "leases" && r.verb == "update" && r.status == 200
}

fn status_writes(r: &Request) -> bool {
    r.resource == "nodes" && r.subresource == "status" && r.verb == "patch" && r.status == 200
}

#[tokio::test(start_paused = true)]
async fn lease_renews_every_ten_seconds_and_status_is_written_on_change_or_every_five_minutes() {
    let api = ApiServer::new();
    let client = api.client("system:node:n1");
    let cancel = CancellationToken::new();
    let handle = NodeHandle::default();
    let node = register(&client, &facts(), &cancel).await.unwrap();
    handle.set(node.clone());
    let registered: Node = api.get(None, "n1").unwrap();
    assert_eq!(registered.metadata.uid, node.metadata.uid);

    let start = tokio::time::Instant::now();
    api.clear_requests();
    let ready = Arc::new(AtomicBool::new(true));
    let inputs = StatusInputs {
        pressure: Arc::new(Default::default),
        nudge: None,
        readiness: {
            let ready = ready.clone();
            Arc::new(move || {
                if ready.load(Ordering::SeqCst) {
                    Ok(())
                } else {
                    Err("container runtime is down: gone".into())
                }
            })
        },
        images: Arc::new(|| Box::pin(async { Vec::new() })),
        devices: None,
        volumes_in_use: None,
    };
    tokio::spawn(
        LeaseController::new(client.clone(), "n1", 40, handle.clone()).run(cancel.clone()),
    );
    tokio::spawn(
        NodeStatusLoop {
            client: client.clone(),
            facts: facts(),
            inputs,
            node: handle.clone(),
            update_frequency: Duration::from_secs(10),
            report_frequency: Duration::from_secs(300),
        }
        .run(cancel.clone()),
    );

    tokio::time::sleep_until(start + Duration::from_secs(65)).await;
    // Created at 0 s, renewed at 0, 10, ..., 60 s: one GET and one create, then one
    // update per renewal, none refused (a stale resourceVersion would add 409s).
    assert_eq!(count(&api, lease_updates), 7);
    let lease_requests: Vec<(String, u16)> = api
        .requests()
        .into_iter()
        .filter(|r| r.resource == "leases")
        .map(|r| (r.verb, r.status))
        .collect();
    assert_eq!(lease_requests.len(), 9, "{lease_requests:?}");
    assert!(
        lease_requests.iter().all(|(_, s)| *s < 300 || *s == 404),
        "{lease_requests:?}"
    );
    let lease: Lease = api.get(Some("kube-node-lease"), "n1").unwrap();
    let spec = lease.spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("n1"));
    assert_eq!(spec.lease_duration_seconds, Some(40));
    let owner = &lease.metadata.owner_references.unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Node", node.metadata.uid.as_deref().unwrap())
    );
    // The first status at once; nothing changed since, so nothing more.
    assert_eq!(count(&api, status_writes), 1);

    ready.store(false, Ordering::SeqCst);
    tokio::time::sleep_until(start + Duration::from_secs(75)).await;
    assert_eq!(
        count(&api, status_writes),
        2,
        "a change is written at the next check"
    );
    let n: Node = api.get(None, "n1").unwrap();
    let cond = n.status.unwrap().conditions.unwrap();
    let ready_cond = cond.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(ready_cond.status, "False");
    assert_eq!(ready_cond.reason.as_deref(), Some("KubeletNotReady"));
    assert_eq!(
        ready_cond.message.as_deref(),
        Some("container runtime is down: gone")
    );

    // Unchanged: written again only when the report frequency is due.
    tokio::time::sleep_until(start + Duration::from_secs(365)).await;
    assert_eq!(count(&api, status_writes), 2);
    tokio::time::sleep_until(start + Duration::from_secs(375)).await;
    assert_eq!(count(&api, status_writes), 3);

    // A deleted Node is registered again.
    api.delete::<Node>(None, "n1", None).unwrap();
    tokio::time::sleep_until(start + Duration::from_secs(395)).await;
    let again: Node = api.get(None, "n1").expect("registered again");
    assert_ne!(again.metadata.uid, node.metadata.uid);
    cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn the_lease_survives_an_outage_with_back_off() {
    let api = ApiServer::new();
    let client = api.client("system:node:n1");
    let cancel = CancellationToken::new();
    let handle = NodeHandle::default();
    handle.set(register(&client, &facts(), &cancel).await.unwrap());
    let start = tokio::time::Instant::now();
    tokio::spawn(LeaseController::new(client.clone(), "n1", 40, handle).run(cancel.clone()));
    tokio::time::sleep_until(start + Duration::from_secs(5)).await;
    api.faults().set_down(true);
    api.clear_requests();
    tokio::time::sleep_until(start + Duration::from_secs(65)).await;
    let attempts = api.requests().len();
    api.faults().set_down(false);
    tokio::time::sleep_until(start + Duration::from_secs(76)).await;
    assert!(count(&api, lease_updates) >= 1, "renewed after the outage");
    // Backed off: a few dozen attempts in a minute, not a hot loop.
    assert!(attempts < 100, "{attempts} attempts during the outage");
    cancel.cancel();
}

fn bound_pod(name: &str, mirror: bool) -> Pod {
    let mut p: Pod = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name, "namespace": "default" },
        "spec": { "nodeName": "n1", "containers": [{ "name": "c", "image": "x" }] },
    }))
    .unwrap();
    if mirror {
        p.metadata.annotations = Some([(MIRROR_ANNOTATION.to_owned(), "h".to_owned())].into());
    }
    p
}

#[tokio::test(start_paused = true)]
async fn the_pod_source_sends_the_nodes_pods_but_not_mirrors_and_relists_after_gone() {
    let api = ApiServer::new();
    let client = api.client("system:node:n1");
    let cancel = CancellationToken::new();
    api.create(&bound_pod("a", false)).unwrap();
    api.create(&bound_pod("m", true)).unwrap();
    let mut other = bound_pod("elsewhere", false);
    other.spec.as_mut().unwrap().node_name = Some("n2".into());
    api.create(&other).unwrap();
    let store = ApiPods::default();
    let (tx, mut rx) = mpsc::channel(16);
    tokio::spawn(pod_source::run(
        client,
        "n1".into(),
        store.clone(),
        tx,
        cancel.clone(),
    ));

    let names = |s: &crate::podconfig::SourceSnapshot| -> Vec<String> {
        s.pods
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect()
    };
    let first = rx.recv().await.unwrap();
    assert_eq!(first.source, "api");
    assert_eq!(names(&first), ["a"]);
    assert_eq!(
        first.pods[0].metadata.annotations.as_ref().unwrap()["kubernetes.io/config.source"],
        "api"
    );
    assert!(
        store.get("default", "m").is_some(),
        "mirrors are kept for the managers"
    );

    api.create(&bound_pod("b", false)).unwrap();
    assert_eq!(names(&rx.recv().await.unwrap()), ["a", "b"]);

    // A watch that ends with 410 Gone is followed by a new list.
    api.faults().expire_history();
    api.faults().drop_watches();
    api.delete::<Pod>(Some("default"), "a", Some(0)).unwrap();
    let next = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let s = rx.recv().await.unwrap();
            if names(&s) == ["b"] {
                return s;
            }
        }
    })
    .await
    .expect("the deletion is seen after the relist");
    assert_eq!(names(&next), ["b"]);
    let lists = count(&api, |r| r.resource == "pods" && r.verb == "list");
    assert!(lists >= 2, "listed again ({lists} lists)");
    cancel.cancel();
}

/// A registered node and a pod bound to it, as the API source hands it over.
async fn registered_with_pod() -> (ApiServer, kube::Client, CancellationToken, NodeHandle, Pod) {
    let api = ApiServer::new();
    let client = api.client("system:node:n1");
    let cancel = CancellationToken::new();
    let handle = NodeHandle::default();
    handle.set(register(&client, &facts(), &cancel).await.unwrap());
    let mut pod = api.create(&bound_pod("a", false)).unwrap();
    pod.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(crate::pod::CONFIG_SOURCE_ANNOTATION.into(), "api".into());
    (api, client, cancel, handle, pod)
}

#[tokio::test(start_paused = true)]
async fn statuses_are_written_once_per_change_and_deleted_pods_are_finalized() {
    use k8s_openapi::api::core::v1::PodStatus;
    let (api, client, cancel, handle, mut pod) = registered_with_pod().await;
    let statuses = crate::status::StatusStore::default();
    api.clear_requests();
    tokio::spawn(
        status_manager::StatusManager::new(
            client.clone(),
            statuses.clone(),
            ApiPods::default(),
            handle,
        )
        .run(cancel.clone()),
    );
    let running = PodStatus {
        phase: Some("Running".into()),
        ..Default::default()
    };
    statuses.set(pod.clone(), running.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let in_api: Pod = api.get(Some("default"), "a").unwrap();
    let st = in_api.status.unwrap();
    assert_eq!(st.phase.as_deref(), Some("Running"));
    assert_eq!(st.host_ip.as_deref(), Some("10.1.2.3"));
    let patches = |api: &ApiServer| {
        count(api, |r| {
            r.resource == "pods" && r.subresource == "status" && r.verb == "patch"
        })
    };
    assert_eq!(patches(&api), 1);
    // The same status again, and the periodic pass: nothing to write.
    statuses.set(pod.clone(), running);
    tokio::time::sleep(Duration::from_secs(25)).await;
    assert_eq!(patches(&api), 1);

    // Deleted in the API, then stopped by the node: final status, then gone.
    api.delete::<Pod>(Some("default"), "a", Some(30)).unwrap();
    let deleting: Pod = api.get(Some("default"), "a").unwrap();
    assert!(deleting.metadata.deletion_timestamp.is_some(), "graceful");
    pod.metadata.deletion_timestamp = deleting.metadata.deletion_timestamp.clone();
    statuses.finish(
        pod,
        PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        },
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(api.get::<Pod>(Some("default"), "a").is_none(), "finalized");
    assert_eq!(patches(&api), 2, "the final status was written first");
    let deletes: Vec<Request> = api
        .requests()
        .into_iter()
        .filter(|r| r.resource == "pods" && r.verb == "delete")
        .collect();
    assert_eq!(deletes.len(), 1);
    cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_status_the_api_changed_is_written_again_and_a_recreated_pod_is_left_alone() {
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    let (api, client, cancel, handle, pod) = registered_with_pod().await;
    let api_pods = ApiPods::default();
    let (tx, mut rx) = mpsc::channel(16);
    tokio::spawn(pod_source::run(
        client.clone(),
        "n1".into(),
        api_pods.clone(),
        tx,
        cancel.clone(),
    ));
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let statuses = crate::status::StatusStore::default();
    tokio::spawn(
        status_manager::StatusManager::new(client.clone(), statuses.clone(), api_pods, handle)
            .run(cancel.clone()),
    );
    let ready = |status: &str| PodCondition {
        type_: "Ready".into(),
        status: status.into(),
        ..Default::default()
    };
    statuses.set(
        pod.clone(),
        PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![ready("True")]),
            ..Default::default()
        },
    );
    let ready_in_api = |api: &ApiServer| -> Option<String> {
        let p: Pod = api.get(Some("default"), "a")?;
        p.status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.status)
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(ready_in_api(&api).as_deref(), Some("True"));

    // The node lifecycle controller marks the pod NotReady (the node was unreachable).
    let mut marked: Pod = api.get(Some("default"), "a").unwrap();
    marked.status.as_mut().unwrap().conditions = Some(vec![ready("False")]);
    api.replace(&marked).unwrap();
    // Meanwhile another pod's status changes every two seconds: the passes those
    // changes wake must not keep pushing the periodic one away.
    let mut other = pod.clone();
    other.metadata.uid = Some("other-uid".into());
    other.metadata.name = Some("other".into());
    other.metadata.annotations = None; // a static pod without a mirror: nothing to write
    for i in 0..6 {
        statuses.set(
            other.clone(),
            PodStatus {
                phase: Some("Running".into()),
                message: Some(format!("change {i}")),
                ..Default::default()
            },
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    assert_eq!(
        ready_in_api(&api).as_deref(),
        Some("True"),
        "the periodic pass writes the node's view again"
    );

    // Deleted and created again under the same name: the old pod's status must not
    // land on the new one, and nothing is retried in a loop.
    api.delete::<Pod>(Some("default"), "a", Some(0)).unwrap();
    let fresh = api.create(&bound_pod("a", false)).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    api.clear_requests();
    statuses.set(
        pod,
        PodStatus {
            phase: Some("Failed".into()),
            ..Default::default()
        },
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    let now: Pod = api.get(Some("default"), "a").unwrap();
    assert_eq!(now.metadata.uid, fresh.metadata.uid);
    assert_ne!(now.status.and_then(|s| s.phase).as_deref(), Some("Failed"));
    let patches = count(&api, |r| r.resource == "pods" && r.verb == "patch");
    assert_eq!(patches, 0, "the recreated pod is not patched");
    cancel.cancel();
}
