//! HTTPS serving: who each kind of credentials authenticates as.

use std::time::Duration;

use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;

use super::{api_status, cert_credentials, tls_client};
use crate::apiserver::{ApiServer, Credentials};
use crate::pki::Ca;

fn last_user(server: &ApiServer) -> (String, Vec<String>, u16) {
    let last = server.requests().pop().expect("a recorded request");
    (last.user, last.groups, last.status)
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn client_certificates_authenticate_as_their_subject() -> anyhow::Result<()> {
    let server = ApiServer::new();
    server.serve_tls(0).await?;
    let credentials = cert_credentials(
        server.ca(),
        "system:node:n1",
        &["system:nodes"],
        Duration::from_secs(600),
    )?;
    let (client, _dir) = tls_client(&server, &credentials).await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    assert_eq!(
        namespaces.list(&ListParams::default()).await?.items.len(),
        4
    );
    assert_eq!(
        last_user(&server),
        (
            "system:node:n1".to_string(),
            strings(&["system:nodes", "system:authenticated"]),
            200
        )
    );

    // The user is what a SubjectAccessReview about the request would carry.
    let reviews: Api<SubjectAccessReview> = Api::all(client);
    let review: SubjectAccessReview = serde_json::from_value(json!({
        "spec": { "user": "system:node:n1", "groups": ["system:nodes"],
                  "resourceAttributes": { "verb": "get", "resource": "pods" } },
    }))?;
    let answered = reviews.create(&PostParams::default(), &review).await?;
    assert_eq!(answered.status.map(|s| s.allowed), Some(true));
    let request = server.requests().pop().expect("recorded");
    assert_eq!(
        (
            request.user.as_str(),
            request.resource.as_str(),
            request.status
        ),
        ("system:node:n1", "subjectaccessreviews", 201)
    );
    Ok(())
}

#[tokio::test]
async fn tokens_bootstrap_tokens_and_anonymous() -> anyhow::Result<()> {
    let server = ApiServer::new();
    server.serve_tls(0).await?;
    server.add_token("s3cret", "alice", &["devs"]);
    let (client, _d1) = tls_client(&server, &Credentials::Token("s3cret".into())).await?;
    let namespaces: Api<Namespace> = Api::all(client);
    namespaces.list(&ListParams::default()).await?;
    assert_eq!(
        last_user(&server),
        (
            "alice".into(),
            strings(&["devs", "system:authenticated"]),
            200
        )
    );

    server.add_bootstrap_token("abcdef.0123456789abcdef")?;
    let (client, _d2) = tls_client(
        &server,
        &Credentials::Token("abcdef.0123456789abcdef".into()),
    )
    .await?;
    Api::<Namespace>::all(client)
        .list(&ListParams::default())
        .await?;
    assert_eq!(
        last_user(&server),
        (
            "system:bootstrap:abcdef".into(),
            strings(&[
                "system:bootstrappers",
                "system:bootstrappers:kubeadm:default-node-token",
                "system:authenticated"
            ]),
            200
        )
    );

    // Over TLS a token nobody knows is refused, not taken as a user name.
    let (client, _d3) = tls_client(&server, &Credentials::Token("system:node:n1".into())).await?;
    let refused = api_status(
        Api::<Namespace>::all(client)
            .list(&ListParams::default())
            .await,
    );
    assert_eq!(
        (refused.code, refused.reason.as_str()),
        (401, "Unauthorized")
    );
    assert_eq!(last_user(&server), (String::new(), Vec::new(), 401));

    let (client, _d4) = tls_client(&server, &Credentials::Anonymous).await?;
    Api::<Namespace>::all(client)
        .list(&ListParams::default())
        .await?;
    assert_eq!(
        last_user(&server),
        (
            "system:anonymous".into(),
            strings(&["system:unauthenticated"]),
            200
        )
    );
    Ok(())
}

#[tokio::test]
async fn expired_and_foreign_certificates_are_unauthorized() -> anyhow::Result<()> {
    let server = ApiServer::new();
    server.serve_tls(0).await?;
    let foreign = Ca::new("someone-else");
    let credentials = cert_credentials(&foreign, "mallory", &[], Duration::from_secs(600))?;
    let (client, _d1) = tls_client(&server, &credentials).await?;
    let refused = api_status(
        Api::<Namespace>::all(client)
            .list(&ListParams::default())
            .await,
    );
    assert_eq!(refused.code, 401);

    let short = cert_credentials(server.ca(), "shortlived", &[], Duration::from_secs(1))?;
    let (client, _d2) = tls_client(&server, &short).await?;
    let namespaces: Api<Namespace> = Api::all(client);
    namespaces.list(&ListParams::default()).await?;
    assert_eq!(last_user(&server).0, "shortlived");
    tokio::time::sleep(Duration::from_millis(2100)).await;
    // Checked per request, as the apiserver's x509 authenticator does: the same
    // kind of connection now gets 401 rather than a failed handshake.
    let refused = api_status(namespaces.list(&ListParams::default()).await);
    assert_eq!(refused.code, 401);
    Ok(())
}

#[tokio::test]
async fn plain_http_and_in_process_users_are_unchanged() -> anyhow::Result<()> {
    let server = ApiServer::new();
    server.add_token("t0k3n", "bob", &["ops"]);
    let namespaces: Api<Namespace> = Api::all(server.client("system:node:n9"));
    namespaces.list(&ListParams::default()).await?;
    assert_eq!(
        last_user(&server),
        (
            "system:node:n9".into(),
            strings(&["system:authenticated"]),
            200
        )
    );
    super::install_ring();
    server.serve_tcp(0).await?;
    let dir = tempfile::tempdir()?;
    for (token, user) in [("t0k3n", "bob"), ("carol", "carol")] {
        let path = dir.path().join(format!("kubeconfig-{token}"));
        server.write_kubeconfig(&path, token)?;
        let kubeconfig = kube::config::Kubeconfig::read_from(&path)?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
        let client = kube::Client::try_from(config)?;
        Api::<Namespace>::all(client)
            .list(&ListParams::default())
            .await?;
        assert_eq!(last_user(&server).0, user);
    }
    Ok(())
}
