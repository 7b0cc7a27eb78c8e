//! The real kubectl (`/usr/bin/kubectl`) against `serve_tls`.

use std::time::Duration;

use serde_json::Value;

use super::{TestKubelet, cert_credentials, kubectl, node_at, pod_on};
use crate::apiserver::{ApiServer, Credentials};

#[tokio::test]
async fn kubectl_works_with_client_certificates_and_tokens() -> anyhow::Result<()> {
    let server = ApiServer::new();
    server.serve_tls(0).await?;
    let kubelet = TestKubelet::start(server.ca(), server.ca()).await?;
    node_at(&server, "n1", kubelet.addr)?;
    pod_on(&server, "p", "n1", &["app"])?;
    server.add_token("admin-token", "admin", &["system:masters"]);
    let scratch = tempfile::tempdir()?;
    let with_cert = scratch.path().join("cert.kubeconfig");
    let credentials = cert_credentials(
        server.ca(),
        "kubectl-user",
        &["system:masters"],
        Duration::from_secs(600),
    )?;
    server.write_kubeconfig_tls(&with_cert, &credentials)?;
    let with_token = scratch.path().join("token.kubeconfig");
    server.write_kubeconfig_tls(&with_token, &Credentials::Token("admin-token".into()))?;

    for (kubeconfig, user) in [(&with_cert, "kubectl-user"), (&with_token, "admin")] {
        let (ok, out, err) =
            kubectl(kubeconfig, scratch.path(), &["get", "nodes", "-o", "name"]).await?;
        assert!(ok, "kubectl get nodes failed: {err}");
        assert_eq!(out.trim(), "node/n1");
        let last = server
            .requests()
            .into_iter()
            .rev()
            .find(|r| r.resource == "nodes")
            .expect("kubectl listed nodes");
        assert_eq!((last.user.as_str(), last.verb.as_str()), (user, "list"));
    }

    // A TokenReview, created from a file as a kubelet's webhook would send it.
    let review = scratch.path().join("review.json");
    std::fs::write(
        &review,
        r#"{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{"token":"admin-token"}}"#,
    )?;
    let review_path = review.to_string_lossy().into_owned();
    let (ok, out, err) = kubectl(
        &with_cert,
        scratch.path(),
        &[
            "create",
            "--validate=false",
            "-f",
            &review_path,
            "-o",
            "json",
        ],
    )
    .await?;
    assert!(ok, "kubectl create failed: {err}");
    let answered: Value = serde_json::from_str(&out)?;
    assert_eq!(answered["status"]["authenticated"], true);
    assert_eq!(answered["status"]["user"]["username"], "admin");
    assert_eq!(server.token_reviews().len(), 1);

    // kubectl get --raw through the node proxy, and kubectl logs.
    let (ok, out, err) = kubectl(
        &with_token,
        scratch.path(),
        &["get", "--raw", "/api/v1/nodes/n1/proxy/stats/summary?x=1"],
    )
    .await?;
    assert!(ok, "kubectl get --raw failed: {err}");
    let echoed: Value = serde_json::from_str(&out)?;
    assert_eq!(
        (
            echoed["path"].as_str(),
            echoed["query"].as_str(),
            echoed["cn"].as_str()
        ),
        (
            Some("/stats/summary"),
            Some("x=1"),
            Some("kube-apiserver-kubelet-client")
        )
    );
    let (ok, out, err) = kubectl(&with_cert, scratch.path(), &["logs", "p", "--tail=3"]).await?;
    assert!(ok, "kubectl logs failed: {err}");
    let echoed: Value = serde_json::from_str(&out)?;
    assert_eq!(echoed["path"], "/containerLogs/default/p/app");
    assert_eq!(echoed["query"], "tailLines=3");

    // An unknown token: kubectl reports the 401.
    let bad = scratch.path().join("bad.kubeconfig");
    server.write_kubeconfig_tls(&bad, &Credentials::Token("wrong".into()))?;
    let (ok, _, err) = kubectl(&bad, scratch.path(), &["get", "nodes"]).await?;
    assert!(!ok);
    assert!(
        err.contains("Unauthorized") || err.contains("provide credentials"),
        "{err}"
    );
    Ok(())
}
