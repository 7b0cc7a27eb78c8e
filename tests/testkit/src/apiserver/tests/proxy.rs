//! The API server's connections to kubelets: node proxy and pod logs.

use futures::AsyncBufReadExt as _;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::LogParams;
use serde_json::Value;

use super::{TestKubelet, WAIT, api_status, closed_port, get_text, node_at, pod_on};
use crate::apiserver::ApiServer;
use crate::pki::Ca;

#[tokio::test]
async fn node_proxy_reaches_the_kubelet_with_the_apiserver_client_certificate() -> anyhow::Result<()>
{
    let server = ApiServer::new();
    let kubelet = TestKubelet::start(server.ca(), server.ca()).await?;
    node_at(&server, "n1", kubelet.addr)?;
    let client = server.client("admin");

    let echoed: Value = serde_json::from_str(
        &get_text(
            &client,
            "/api/v1/nodes/n1/proxy/stats/summary?x=1&only_cpu_and_memory=true",
        )
        .await?,
    )?;
    assert_eq!(echoed["method"], "GET");
    assert_eq!(echoed["path"], "/stats/summary");
    assert_eq!(echoed["query"], "x=1&only_cpu_and_memory=true");
    assert_eq!(echoed["cn"], "kube-apiserver-kubelet-client");
    assert_eq!(
        echoed["authorization"], false,
        "the user's token stays here"
    );
    assert_eq!(
        echoed["forwardedUri"],
        "/api/v1/nodes/n1/proxy/stats/summary"
    );

    // POST bodies go through; the kubelet's own errors come back unchanged.
    let post = axum::http::Request::post("/api/v1/nodes/n1/proxy/run/default/p/c?cmd=ls")
        .body(b"payload".to_vec())?;
    let echoed: Value = serde_json::from_str(&client.request_text(post).await?)?;
    assert_eq!(
        (
            echoed["method"].as_str(),
            echoed["path"].as_str(),
            echoed["body"].as_str()
        ),
        (Some("POST"), Some("/run/default/p/c"), Some("payload"))
    );
    let response = client
        .send(
            axum::http::Request::get("/api/v1/nodes/n1/proxy/status/403")
                .body(kube::client::Body::from(Vec::new()))?,
        )
        .await?;
    assert_eq!(response.status().as_u16(), 403);
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await?
        .to_bytes();
    assert_eq!(&body[..], b"kubelet says 403");

    // The explicit kubelet port is the kubelet.
    let path = format!("/api/v1/nodes/n1:{}/proxy/healthz", kubelet.addr.port());
    let echoed: Value = serde_json::from_str(&get_text(&client, &path).await?)?;
    assert_eq!(echoed["cn"], "kube-apiserver-kubelet-client");

    let recorded = server.requests();
    let first = &recorded[0];
    assert_eq!(
        (
            first.verb.as_str(),
            first.resource.as_str(),
            first.subresource.as_str(),
            first.name.as_str(),
            first.status
        ),
        ("get", "nodes", "proxy", "n1", 200)
    );
    assert_eq!(recorded[1].verb, "create");

    let missing = api_status(get_text(&client, "/api/v1/nodes/n2/proxy/healthz").await);
    assert_eq!(
        (missing.code, missing.message.as_str()),
        (404, "nodes \"n2\" not found")
    );
    Ok(())
}

#[tokio::test]
async fn pod_logs_map_to_container_logs() -> anyhow::Result<()> {
    let server = ApiServer::new();
    let kubelet = TestKubelet::start(server.ca(), server.ca()).await?;
    node_at(&server, "n1", kubelet.addr)?;
    pod_on(&server, "p", "n1", &["app"])?;
    pod_on(&server, "two", "n1", &["a", "b"])?;
    pod_on(&server, "pending", "", &["app"])?;
    let pods: Api<Pod> = Api::default_namespaced(server.client("admin"));

    let params = LogParams {
        tail_lines: Some(5),
        timestamps: true,
        since_seconds: Some(60),
        ..LogParams::default()
    };
    let echoed: Value = serde_json::from_str(&pods.logs("p", &params).await?)?;
    assert_eq!(echoed["path"], "/containerLogs/default/p/app");
    assert_eq!(
        echoed["query"],
        "sinceSeconds=60&tailLines=5&timestamps=true"
    );
    assert_eq!(echoed["cn"], "kube-apiserver-kubelet-client");

    let params = LogParams {
        container: Some("b".into()),
        previous: true,
        limit_bytes: Some(100),
        ..LogParams::default()
    };
    let echoed: Value = serde_json::from_str(&pods.logs("two", &params).await?)?;
    assert_eq!(echoed["path"], "/containerLogs/default/two/b");
    assert_eq!(echoed["query"], "limitBytes=100&previous=true");

    let ambiguous = api_status(pods.logs("two", &LogParams::default()).await);
    assert_eq!(
        (ambiguous.code, ambiguous.message.as_str()),
        (
            400,
            "a container name must be specified for pod two, choose one of: [a b]"
        )
    );
    let params = LogParams {
        container: Some("zzz".into()),
        ..LogParams::default()
    };
    let unknown = api_status(pods.logs("p", &params).await);
    assert_eq!(unknown.message, "container zzz is not valid for pod p");
    assert_eq!(pods.logs("pending", &LogParams::default()).await?, "");
    let invalid = api_status(
        pods.logs(
            "p",
            &LogParams {
                tail_lines: Some(-1),
                ..LogParams::default()
            },
        )
        .await,
    );
    assert_eq!(invalid.code, 422);
    Ok(())
}

#[tokio::test]
async fn followed_logs_stream_chunk_by_chunk() -> anyhow::Result<()> {
    let server = ApiServer::new();
    let kubelet = TestKubelet::start(server.ca(), server.ca()).await?;
    node_at(&server, "n1", kubelet.addr)?;
    pod_on(&server, "p", "n1", &["app"])?;
    let pods: Api<Pod> = Api::default_namespaced(server.client("admin"));
    let params = LogParams {
        follow: true,
        ..LogParams::default()
    };
    let mut lines = pods.log_stream("p", &params).await?.lines();
    let first = tokio::time::timeout(WAIT, lines.next()).await?;
    assert_eq!(
        first.transpose()?.as_deref(),
        Some("line 1"),
        "the first chunk arrives before the kubelet writes the second"
    );
    kubelet.gate.notify_one();
    let second = tokio::time::timeout(WAIT, lines.next()).await?;
    assert_eq!(second.transpose()?.as_deref(), Some("line 2"));
    let end = tokio::time::timeout(WAIT, lines.next()).await?;
    assert!(end.is_none(), "the stream ends with the kubelet's");
    Ok(())
}

#[tokio::test]
async fn unreachable_and_failing_kubelets_are_error_statuses() -> anyhow::Result<()> {
    let server = ApiServer::new();
    let down = closed_port().await?;
    node_at(&server, "gone", down)?;
    pod_on(&server, "p", "gone", &["app"])?;
    let client = server.client("admin");

    let unreachable = api_status(get_text(&client, "/api/v1/nodes/gone/proxy/healthz").await);
    assert_eq!(
        (
            unreachable.code,
            unreachable.reason.as_str(),
            unreachable.message
        ),
        (
            503,
            "ServiceUnavailable",
            format!("error trying to reach service: dial tcp {down}: connect: connection refused")
        )
    );
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let unreachable = api_status(pods.logs("p", &LogParams::default()).await);
    assert_eq!(unreachable.code, 500);
    assert_eq!(
        unreachable.message,
        format!(
            "Get \"https://{down}/containerLogs/default/p/app\": dial tcp {down}: connect: connection refused"
        )
    );

    // A node without addresses.
    let bare: k8s_openapi::api::core::v1::Node =
        serde_json::from_value(serde_json::json!({ "metadata": { "name": "bare" } }))?;
    server.create(&bare)?;
    let noaddr = api_status(get_text(&client, "/api/v1/nodes/bare/proxy/healthz").await);
    assert_eq!(
        (noaddr.code, noaddr.message.as_str()),
        (500, "no preferred addresses found; known addresses: []")
    );

    // The proxy passes a kubelet's failure through; the log path wraps it as the
    // apiserver's response checker does.
    let kubelet = TestKubelet::start(server.ca(), server.ca()).await?;
    node_at(&server, "n1", kubelet.addr)?;
    let response = client
        .send(
            axum::http::Request::get("/api/v1/nodes/n1/proxy/status/500")
                .body(kube::client::Body::from(Vec::new()))?,
        )
        .await?;
    assert_eq!(response.status().as_u16(), 500);
    pod_on(&server, "missing", "n1", &["app"])?;
    let wrapped = api_status(pods.logs("missing", &LogParams::default()).await);
    assert_eq!(
        (
            wrapped.code,
            wrapped.reason.as_str(),
            wrapped.message.as_str()
        ),
        (
            404,
            "NotFound",
            "the server could not find the requested resource ( pods/log missing)"
        )
    );
    pod_on(&server, "broken", "n1", &["app"])?;
    let wrapped = api_status(pods.logs("broken", &LogParams::default()).await);
    assert_eq!(
        (
            wrapped.code,
            wrapped.reason.as_str(),
            wrapped.message.as_str()
        ),
        (
            500,
            "InternalError",
            "Internal error occurred: kubelet says 500"
        )
    );
    Ok(())
}

#[tokio::test]
async fn kubelet_serving_certificates_are_verified_only_with_a_kubelet_ca() -> anyhow::Result<()> {
    let server = ApiServer::new();
    let kubelet_ca = Ca::new("kubelet-ca");
    let kubelet = TestKubelet::start(&kubelet_ca, server.ca()).await?;
    node_at(&server, "n1", kubelet.addr)?;
    let client = server.client("admin");
    get_text(&client, "/api/v1/nodes/n1/proxy/healthz").await?;

    server.set_kubelet_ca(server.ca().pem())?;
    let refused = api_status(get_text(&client, "/api/v1/nodes/n1/proxy/healthz").await);
    assert_eq!(refused.code, 503);
    assert!(
        refused
            .message
            .starts_with("error trying to reach service: "),
        "{}",
        refused.message
    );
    server.set_kubelet_ca(kubelet_ca.pem())?;
    let echoed: Value =
        serde_json::from_str(&get_text(&client, "/api/v1/nodes/n1/proxy/healthz").await?)?;
    assert_eq!(echoed["path"], "/healthz");
    Ok(())
}

#[tokio::test]
async fn kubelet_client_identity_is_kubeadms() -> anyhow::Result<()> {
    let server = ApiServer::new();
    let (cert, _) = server.kubelet_client_identity()?;
    let info = server.ca().verify(&cert)?;
    assert_eq!(info.common_name, "kube-apiserver-kubelet-client");
    assert_eq!(info.organizations, ["system:masters"]);
    assert!(info.usages.contains(&"client auth".to_string()));
    assert_eq!(server.kubelet_client_identity()?.0, cert, "made once");
    Ok(())
}
