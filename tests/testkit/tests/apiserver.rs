//! The in-process API server test double, driven through kube's client the way
//! the node drives the real one.

use std::time::Duration;

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, ServiceAccount};
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent,
    WatchParams,
};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use wasmlet_testkit::apiserver::ApiServer;

/// Long enough for two busy cores; under a paused clock it costs nothing.
const WAIT: Duration = Duration::from_secs(30);

fn pod(name: &str, node: &str, labels: Value) -> Pod {
    let mut spec = json!({ "containers": [{ "name": "app", "image": "example/app:1" }] });
    if !node.is_empty() {
        spec["nodeName"] = json!(node);
    }
    serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": "default", "labels": labels },
        "spec": spec,
    }))
    .expect("a valid pod")
}

fn api_code<T: std::fmt::Debug>(result: kube::Result<T>) -> u16 {
    match result {
        Err(kube::Error::Api(status)) => status.code,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// The next item of `stream`, failing the test after [`WAIT`].
async fn next<S: Stream + Unpin>(stream: &mut S) -> S::Item {
    tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("an event before the deadline")
        .expect("the stream goes on")
}

/// The next successful watcher event, skipping (and counting) errors.
async fn next_event<S>(stream: &mut S, errors: &mut Vec<String>) -> watcher::Event<Pod>
where
    S: Stream<Item = Result<watcher::Event<Pod>, watcher::Error>> + Unpin,
{
    loop {
        match next(stream).await {
            Ok(event) => return event,
            Err(err) => errors.push(err.to_string()),
        }
    }
}

fn describe(event: &watcher::Event<Pod>) -> String {
    match event {
        watcher::Event::Init => "Init".into(),
        watcher::Event::InitApply(p) => format!("InitApply {}", p.name_any()),
        watcher::Event::InitDone => "InitDone".into(),
        watcher::Event::Apply(p) => format!("Apply {}", p.name_any()),
        watcher::Event::Delete(p) => format!("Delete {}", p.name_any()),
    }
}

#[tokio::test]
async fn create_get_list_with_selectors_and_errors() -> anyhow::Result<()> {
    let server = ApiServer::new();
    let pods: Api<Pod> = Api::default_namespaced(server.client("admin"));
    let created = pods
        .create(
            &PostParams::default(),
            &pod("a", "n1", json!({ "app": "web" })),
        )
        .await?;
    assert!(created.uid().is_some());
    assert_eq!(
        created.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Pending")
    );
    let spec = created.spec.as_ref().expect("spec");
    assert_eq!(spec.termination_grace_period_seconds, Some(30));
    assert_eq!(
        spec.containers[0].image_pull_policy.as_deref(),
        Some("IfNotPresent")
    );
    pods.create(
        &PostParams::default(),
        &pod("b", "n2", json!({ "app": "web" })),
    )
    .await?;
    pods.create(
        &PostParams::default(),
        &pod("c", "n1", json!({ "app": "db" })),
    )
    .await?;

    let all: Api<Pod> = Api::all(server.client("admin"));
    let names = |list: kube::core::ObjectList<Pod>| {
        list.items
            .iter()
            .map(ResourceExt::name_any)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(
            all.list(&ListParams::default().fields("spec.nodeName=n1"))
                .await?
        ),
        ["a", "c"]
    );
    assert_eq!(
        names(all.list(&ListParams::default().labels("app=web")).await?),
        ["a", "b"]
    );
    let both = ListParams::default()
        .fields("spec.nodeName=n1")
        .labels("app in (web)");
    assert_eq!(names(all.list(&both).await?), ["a"]);
    let metadata = all
        .list_metadata(&ListParams::default().fields("spec.nodeName=n2"))
        .await?;
    assert_eq!(
        metadata
            .items
            .iter()
            .map(ResourceExt::name_any)
            .collect::<Vec<_>>(),
        ["b"]
    );
    assert!(metadata.items[0].metadata.uid.is_some());
    let list = all.list(&ListParams::default().limit(1)).await?;
    assert_eq!(
        list.items.len(),
        3,
        "limit is ignored, everything comes in one page"
    );
    assert_eq!(
        list.metadata.resource_version,
        Some(server.resource_version())
    );

    assert_eq!(pods.get("a").await?.uid(), created.uid());
    assert_eq!(api_code(pods.get("missing").await), 404);
    assert_eq!(
        api_code(
            pods.create(&PostParams::default(), &pod("a", "n1", json!({})))
                .await
        ),
        409
    );
    let elsewhere: Api<Pod> = Api::namespaced(server.client("admin"), "nowhere");
    let mut stray = pod("a", "n1", json!({}));
    assert_eq!(
        api_code(elsewhere.create(&PostParams::default(), &stray).await),
        400,
        "namespace mismatch"
    );
    stray.metadata.namespace = None;
    assert_eq!(
        api_code(elsewhere.create(&PostParams::default(), &stray).await),
        404,
        "no such namespace"
    );
    let mut unnamed = pod("", "n1", json!({}));
    unnamed.metadata.name = None;
    assert_eq!(
        api_code(pods.create(&PostParams::default(), &unnamed).await),
        422
    );
    unnamed.metadata.generate_name = Some("gen-".into());
    let generated = pods.create(&PostParams::default(), &unnamed).await?;
    assert!(generated.name_any().starts_with("gen-") && generated.name_any().len() == 9);

    let namespaces: Api<Namespace> = Api::all(server.client("admin"));
    assert_eq!(
        namespaces.list(&ListParams::default()).await?.items.len(),
        4
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn watcher_sees_changes_and_relists_after_expiry() -> anyhow::Result<()> {
    let server = ApiServer::new();
    server.create(&pod("early", "n1", json!({})))?;
    let api: Api<Pod> = Api::all(server.client("system:node:n1"));
    let config = watcher::Config::default().fields("spec.nodeName=n1");
    let mut stream = watcher(api, config).boxed();
    let mut errors = Vec::new();
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(describe(&next_event(&mut stream, &mut errors).await));
    }
    assert_eq!(seen, ["Init", "InitApply early", "InitDone"]);

    server.create(&pod("other-node", "n2", json!({})))?;
    server.create(&pod("mine", "n1", json!({})))?;
    assert_eq!(
        describe(&next_event(&mut stream, &mut errors).await),
        "Apply mine"
    );
    server.delete::<Pod>(None, "mine", Some(0))?;
    assert_eq!(
        describe(&next_event(&mut stream, &mut errors).await),
        "Delete mine"
    );
    assert!(errors.is_empty(), "{errors:?}");

    // The watch ends and resuming from its resourceVersion is 410 Gone: a relist.
    server.faults().expire_history();
    server.faults().drop_watches();
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(describe(&next_event(&mut stream, &mut errors).await));
    }
    assert_eq!(seen, ["Init", "InitApply early", "InitDone"]);
    assert_eq!(errors.len(), 1, "one 410 before the relist: {errors:?}");
    assert!(
        errors[0].contains("410") || errors[0].to_lowercase().contains("expired"),
        "{errors:?}"
    );

    // Live events flow again after the relist.
    server.create(&pod("later", "n1", json!({})))?;
    assert_eq!(
        describe(&next_event(&mut stream, &mut errors).await),
        "Apply later"
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn streaming_list_watcher_gets_initial_events_end() -> anyhow::Result<()> {
    let server = ApiServer::new();
    server.create(&pod("a", "n1", json!({})))?;
    let api: Api<Pod> = Api::all(server.client("admin"));
    let mut stream = watcher(api, watcher::Config::default().streaming_lists()).boxed();
    let mut errors = Vec::new();
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(describe(&next_event(&mut stream, &mut errors).await));
    }
    assert_eq!(seen, ["Init", "InitApply a", "InitDone"]);
    server.create(&pod("b", "n1", json!({})))?;
    assert_eq!(
        describe(&next_event(&mut stream, &mut errors).await),
        "Apply b"
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn selector_transitions_become_added_and_deleted() -> anyhow::Result<()> {
    let server = ApiServer::new();
    let pods: Api<Pod> = Api::default_namespaced(server.client("admin"));
    pods.create(
        &PostParams::default(),
        &pod("p", "n1", json!({ "app": "web" })),
    )
    .await?;
    let params = WatchParams::default().labels("app=web").disable_bookmarks();
    let mut events = pods.watch(&params, "0").await?.boxed();
    let kinds = |event: WatchEvent<Pod>| match event {
        WatchEvent::Added(p) => format!("ADDED {}", p.labels()["app"]),
        WatchEvent::Modified(p) => format!("MODIFIED {}", p.labels()["app"]),
        WatchEvent::Deleted(p) => format!("DELETED {}", p.labels()["app"]),
        other => format!("{other:?}"),
    };
    assert_eq!(kinds(next(&mut events).await?), "ADDED web");
    let relabel = |app: &str| Patch::Merge(json!({ "metadata": { "labels": { "app": app } } }));
    pods.patch("p", &PatchParams::default(), &relabel("db"))
        .await?;
    assert_eq!(kinds(next(&mut events).await?), "DELETED web");
    pods.patch("p", &PatchParams::default(), &relabel("web"))
        .await?;
    assert_eq!(kinds(next(&mut events).await?), "ADDED web");
    pods.patch(
        "p",
        &PatchParams::default(),
        &Patch::Merge(json!({ "metadata": { "annotations": { "x": "y" } } })),
    )
    .await?;
    assert_eq!(kinds(next(&mut events).await?), "MODIFIED web");
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn graceful_pod_deletion_and_preconditions() -> anyhow::Result<()> {
    let server = ApiServer::new();
    let pods: Api<Pod> = Api::default_namespaced(server.client("admin"));
    let created = pods
        .create(&PostParams::default(), &pod("p", "n1", json!({})))
        .await?;
    let rv = created.resource_version().expect("a resourceVersion");
    let mut events = pods
        .watch(&WatchParams::default().disable_bookmarks(), &rv)
        .await?
        .boxed();

    let deleting = pods
        .delete("p", &DeleteParams::default())
        .await?
        .left()
        .expect("the pod comes back");
    let first_deadline = deleting
        .metadata
        .deletion_timestamp
        .clone()
        .expect("a deletionTimestamp");
    assert_eq!(deleting.metadata.deletion_grace_period_seconds, Some(30));
    assert!(
        matches!(next(&mut events).await?, WatchEvent::Modified(p) if p.metadata.deletion_timestamp.is_some())
    );
    assert!(
        pods.get_opt("p").await?.is_some(),
        "the node still has to stop it"
    );

    let shorter = DeleteParams {
        grace_period_seconds: Some(10),
        ..DeleteParams::default()
    };
    let shortened = pods
        .delete("p", &shorter)
        .await?
        .left()
        .expect("the pod comes back");
    assert_eq!(shortened.metadata.deletion_grace_period_seconds, Some(10));
    let new_deadline = shortened
        .metadata
        .deletion_timestamp
        .expect("a deletionTimestamp");
    assert_eq!(
        first_deadline.0.as_second() - new_deadline.0.as_second(),
        20
    );
    assert!(matches!(next(&mut events).await?, WatchEvent::Modified(_)));
    // A longer grace period does not extend it.
    let longer = DeleteParams {
        grace_period_seconds: Some(60),
        ..DeleteParams::default()
    };
    let unchanged = pods
        .delete("p", &longer)
        .await?
        .left()
        .expect("the pod comes back");
    assert_eq!(unchanged.metadata.deletion_grace_period_seconds, Some(10));

    let force = |uid: &str| DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid.into()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    assert_eq!(api_code(pods.delete("p", &force("wrong-uid")).await), 409);
    let uid = created.uid().expect("a uid");
    let gone = pods
        .delete("p", &force(&uid))
        .await?
        .left()
        .expect("the deleted pod comes back");
    assert_eq!(gone.metadata.deletion_grace_period_seconds, Some(0));
    assert!(matches!(next(&mut events).await?, WatchEvent::Deleted(p) if p.name_any() == "p"));
    assert!(pods.get_opt("p").await?.is_none());

    // Unscheduled pods go at once; finalizers hold a pod until they are cleared.
    pods.create(&PostParams::default(), &pod("unscheduled", "", json!({})))
        .await?;
    pods.delete("unscheduled", &DeleteParams::default()).await?;
    assert!(pods.get_opt("unscheduled").await?.is_none());
    let mut held = pod("held", "n1", json!({}));
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    pods.create(&PostParams::default(), &held).await?;
    let zero = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    pods.delete("held", &zero).await?;
    let still = pods.get("held").await?;
    assert!(still.metadata.deletion_timestamp.is_some());
    pods.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
    )
    .await?;
    assert!(pods.get_opt("held").await?.is_none());

    // Other resources are deleted at once and answer with a Status.
    let maps: Api<ConfigMap> = Api::default_namespaced(server.client("admin"));
    maps.create(
        &PostParams::default(),
        &serde_json::from_value(json!({ "metadata": { "name": "c" } }))?,
    )
    .await?;
    assert!(maps.delete("c", &DeleteParams::default()).await?.is_right());
    assert_eq!(
        api_code(maps.delete("c", &DeleteParams::default()).await),
        404
    );
    Ok(())
}

#[tokio::test]
async fn patches_and_updates() -> anyhow::Result<()> {
    let server = ApiServer::new();
    let client = server.client("system:node:n1");
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    pods.create(
        &PostParams::default(),
        &pod("p", "n1", json!({ "app": "web" })),
    )
    .await?;
    let conditions = json!({ "status": { "conditions": [
        { "type": "PodScheduled", "status": "True" },
        { "type": "Ready", "status": "False" },
    ] } });
    pods.patch_status("p", &PatchParams::default(), &Patch::Merge(conditions))
        .await?;
    let strategic = json!({
        "metadata": { "uid": pods.get("p").await?.uid() },
        "status": {
            "$setElementOrder/conditions": [{ "type": "PodScheduled" }, { "type": "Ready" }],
            "conditions": [{ "type": "Ready", "status": "True" }],
            "phase": "Running",
        },
        "spec": { "nodeName": "elsewhere" },
    });
    let patched = pods
        .patch_status("p", &PatchParams::default(), &Patch::Strategic(strategic))
        .await?;
    let status = patched.status.clone().expect("status");
    assert_eq!(status.phase.as_deref(), Some("Running"));
    let conditions: Vec<(String, String)> = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.type_, c.status))
        .collect();
    assert_eq!(
        conditions,
        [
            ("PodScheduled".into(), "True".into()),
            ("Ready".into(), "True".into())
        ]
    );
    assert_eq!(
        patched.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some("n1"),
        "status writes leave spec"
    );
    assert_eq!(patched.labels()["app"], "web");
    let stored = server.get::<Pod>(None, "p").expect("stored");
    assert!(
        serde_json::to_string(&stored)?.find('$').is_none(),
        "directives are never stored"
    );

    // The main resource ignores status.
    let ignored = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "phase": "Failed" } })),
        )
        .await?;
    assert_eq!(
        ignored.status.and_then(|s| s.phase).as_deref(),
        Some("Running")
    );

    // No-op patches and updates keep the resourceVersion.
    let rv = pods.get("p").await?.resource_version();
    let again = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { "app": "web" } } })),
        )
        .await?;
    assert_eq!(again.resource_version(), rv);
    let replaced = pods.replace("p", &PostParams::default(), &again).await?;
    assert_eq!(replaced.resource_version(), rv);

    // Optimistic concurrency: a stale resourceVersion conflicts.
    let mut stale = replaced.clone();
    pods.patch(
        "p",
        &PatchParams::default(),
        &Patch::Merge(json!({ "metadata": { "labels": { "v": "2" } } })),
    )
    .await?;
    stale.labels_mut().insert("v".into(), "3".into());
    assert_eq!(
        api_code(pods.replace("p", &PostParams::default(), &stale).await),
        409
    );
    let stale_patch = json!({ "metadata": { "resourceVersion": rv, "labels": { "v": "4" } } });
    assert_eq!(
        api_code(
            pods.patch("p", &PatchParams::default(), &Patch::Merge(stale_patch))
                .await
        ),
        409
    );

    // Node status: merge patch; JSON patch on a lease; apply patches are refused.
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": "n1" } }))?,
        )
        .await?;
    let ready = json!({ "status": { "conditions": [{ "type": "Ready", "status": "True" }], "nodeInfo": { "kubeletVersion": "v1.33.0" } } });
    let node = nodes
        .patch_status("n1", &PatchParams::default(), &Patch::Merge(ready))
        .await?;
    let info = node.status.and_then(|s| s.node_info).expect("nodeInfo");
    assert_eq!(info.kubelet_version, "v1.33.0");

    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let lease = json!({ "metadata": { "name": "n1" }, "spec": { "holderIdentity": "n1", "leaseDurationSeconds": 40 } });
    leases
        .create(&PostParams::default(), &serde_json::from_value(lease)?)
        .await?;
    let renew =
        json!([{ "op": "add", "path": "/spec/renewTime", "value": "2025-01-01T00:00:00.123456Z" }]);
    let renewed = leases
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Json::<()>(serde_json::from_value(renew)?),
        )
        .await?;
    let renew_time = renewed.spec.and_then(|s| s.renew_time).expect("renewTime");
    assert_eq!(renew_time.0.subsec_microsecond(), 123_456);
    let apply = Patch::Apply(json!({ "apiVersion": "coordination.k8s.io/v1", "kind": "Lease" }));
    assert_eq!(
        api_code(
            leases
                .patch("n1", &PatchParams::apply("test"), &apply)
                .await
        ),
        415
    );
    assert_eq!(
        api_code(
            leases
                .patch("missing", &PatchParams::default(), &Patch::Merge(json!({})))
                .await
        ),
        404
    );
    Ok(())
}

#[tokio::test]
async fn mirror_pods_and_tokens() -> anyhow::Result<()> {
    let server = ApiServer::new();
    let client = server.client("system:node:n1");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    let mut mirror = pod("static-n1", "n1", json!({}));
    mirror.metadata.namespace = Some("kube-system".into());
    mirror.metadata.annotations = Some(
        [(
            "kubernetes.io/config.mirror".to_string(),
            "hash".to_string(),
        )]
        .into(),
    );
    let created = pods.create(&PostParams::default(), &mirror).await?;
    let spec = created.spec.expect("spec");
    assert_eq!(
        spec.termination_grace_period_seconds, None,
        "mirror pods keep their spec"
    );
    assert_eq!(spec.containers[0].image_pull_policy, None);

    let accounts: Api<ServiceAccount> = Api::default_namespaced(client);
    let request = json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": { "audiences": ["api"], "expirationSeconds": 7200, "boundObjectRef": { "kind": "Pod", "apiVersion": "v1", "name": "p", "uid": "u" } },
    });
    let token: Value = accounts
        .create_subresource("token", "default", &PostParams::default(), &request)
        .await?;
    let text = token["status"]["token"].as_str().expect("a token");
    assert_eq!(text.split('.').count(), 3, "JWT-shaped: {text}");
    let expires: jiff::Timestamp = token["status"]["expirationTimestamp"]
        .as_str()
        .expect("an expiry")
        .parse()?;
    let left = expires.as_second() - jiff::Timestamp::now().as_second();
    assert!((7100..=7200).contains(&left), "expires in {left}s");
    let missing = accounts
        .create_subresource::<_, Value>("token", "nobody", &PostParams::default(), &request)
        .await;
    assert_eq!(api_code(missing), 404);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn requests_are_recorded() -> anyhow::Result<()> {
    let server = ApiServer::new();
    let client = server.client("system:node:n1");
    let nodes: Api<Node> = Api::all(client.clone());
    assert!(nodes.get_opt("n1").await?.is_none());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": "n1" } }))?,
        )
        .await?;
    let status = Patch::Strategic(
        json!({ "status": { "conditions": [{ "type": "Ready", "status": "True" }] } }),
    );
    nodes
        .patch_status("n1", &PatchParams::default(), &status)
        .await?;
    let pods: Api<Pod> = Api::all(client);
    let params = WatchParams::default()
        .fields("spec.nodeName=n1")
        .timeout(10);
    let mut events = pods.watch(&params, "0").await?.boxed();
    assert!(matches!(next(&mut events).await?, WatchEvent::Bookmark(_)));

    let seen: Vec<_> = server
        .requests()
        .into_iter()
        .map(|r| (r.user, r.verb, r.resource, r.subresource, r.name, r.status))
        .collect();
    let n1 = "system:node:n1".to_string();
    let row = |verb: &str, resource: &str, sub: &str, name: &str, status: u16| {
        (
            n1.clone(),
            verb.to_string(),
            resource.to_string(),
            sub.to_string(),
            name.to_string(),
            status,
        )
    };
    assert_eq!(
        seen,
        [
            row("get", "nodes", "", "n1", 404),
            row("create", "nodes", "", "", 201),
            row("patch", "nodes", "status", "n1", 200),
            row("watch", "pods", "", "", 200),
        ]
    );
    let requests = server.requests();
    assert_eq!(
        requests[2].content_type,
        "application/strategic-merge-patch+json"
    );
    assert_eq!(requests[3].field_selector, "spec.nodeName=n1");
    assert_eq!(requests[3].namespace, "");
    server.clear_requests();
    assert!(server.requests().is_empty());
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn paused_clock_drives_bookmarks_timeouts_and_delays() -> anyhow::Result<()> {
    let server = ApiServer::new();
    let pods: Api<Pod> = Api::default_namespaced(server.client("admin"));
    let started = tokio::time::Instant::now();
    let mut events = pods
        .watch(&WatchParams::default().timeout(5), "0")
        .await?
        .boxed();
    let bookmark = next(&mut events).await?;
    let WatchEvent::Bookmark(bookmark) = bookmark else {
        panic!("expected a bookmark, got {bookmark:?}");
    };
    assert_eq!(
        bookmark.metadata.resource_version,
        server.resource_version()
    );
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "bookmarks come after a second of idling"
    );
    // timeoutSeconds ends the stream.
    let rest: Vec<_> = tokio::time::timeout(WAIT, events.try_collect::<Vec<_>>()).await??;
    assert!(rest.iter().all(|e| matches!(e, WatchEvent::Bookmark(_))));
    assert!(started.elapsed() >= Duration::from_secs(5));

    server.faults().set_delay(Some(Duration::from_secs(3)));
    let before = tokio::time::Instant::now();
    pods.list(&ListParams::default()).await?;
    assert!(before.elapsed() >= Duration::from_secs(3));
    Ok(())
}

#[tokio::test]
async fn in_process_faults() -> anyhow::Result<()> {
    let server = ApiServer::new();
    let pods: Api<Pod> = Api::default_namespaced(server.client("admin"));
    server.faults().fail_next(1, 500);
    assert_eq!(api_code(pods.list(&ListParams::default()).await), 500);
    pods.list(&ListParams::default()).await?;

    let mut events = pods.watch(&WatchParams::default(), "0").await?.boxed();
    server.faults().set_down(true);
    assert!(
        tokio::time::timeout(WAIT, events.next()).await?.is_none(),
        "watches end"
    );
    match pods.list(&ListParams::default()).await {
        Err(kube::Error::Service(err)) => assert!(err.to_string().contains("refused"), "{err}"),
        other => panic!("expected a service error, got {other:?}"),
    }
    server.faults().set_down(false);
    pods.list(&ListParams::default()).await?;
    Ok(())
}

#[tokio::test]
async fn tcp_kubeconfig_and_outage() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let server = ApiServer::new();
    let addr = server.serve_tcp(0).await?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("kubeconfig");
    server.write_kubeconfig(&path, "system:node:n1")?;
    let kubeconfig = kube::config::Kubeconfig::read_from(&path)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    assert_eq!(config.default_namespace, "default");
    let client = kube::Client::try_from(config)?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    assert_eq!(
        namespaces.list(&ListParams::default()).await?.items.len(),
        4
    );
    let last = server.requests().pop().expect("a request");
    assert_eq!(
        (
            last.user.as_str(),
            last.verb.as_str(),
            last.resource.as_str()
        ),
        ("system:node:n1", "list", "namespaces")
    );

    let pods: Api<Pod> = Api::default_namespaced(client);
    let mut events = pods.watch(&WatchParams::default(), "0").await?.boxed();
    server.faults().set_down(true);
    let ended = tokio::time::timeout(WAIT, events.next()).await?;
    assert!(!matches!(ended, Some(Ok(_))), "the watch is cut: {ended:?}");
    let refused = namespaces.list(&ListParams::default()).await;
    assert!(
        matches!(refused, Err(ref err) if !matches!(err, kube::Error::Api(_))),
        "{refused:?}"
    );
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "the port is closed"
    );

    server.faults().set_down(false);
    assert_eq!(
        namespaces.list(&ListParams::default()).await?.items.len(),
        4
    );
    assert!(
        std::net::TcpStream::connect(addr).is_ok(),
        "the same port again"
    );
    Ok(())
}

#[tokio::test]
async fn admin_helpers() -> anyhow::Result<()> {
    let server = ApiServer::new();
    let created = server.create(&pod("p", "n1", json!({})))?;
    assert_eq!(created.namespace().as_deref(), Some("default"));
    assert_eq!(server.list::<Pod>(None).len(), 1);
    assert_eq!(server.list::<Pod>(Some("kube-system")).len(), 0);
    assert!(server.get::<Pod>(Some("default"), "p").is_some());

    let mut running = created.clone();
    running.status.get_or_insert_default().phase = Some("Running".into());
    server.replace(&running)?;
    let waiter = server.clone();
    let wait = tokio::spawn(async move {
        waiter
            .wait_for::<Pod, _>(None, "p", WAIT, |p| p.metadata.deletion_timestamp.is_some())
            .await
    });
    server.delete::<Pod>(None, "p", None)?;
    let deleting = wait.await??;
    assert_eq!(
        deleting.status.and_then(|s| s.phase).as_deref(),
        Some("Running")
    );
    assert!(server.requests().is_empty(), "admin calls are not recorded");
    let timeout = server
        .wait_for::<Pod, _>(None, "missing", Duration::from_millis(50), |_| true)
        .await;
    assert!(timeout.is_err());
    Ok(())
}
