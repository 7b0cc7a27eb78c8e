//! TokenReview and SubjectAccessReview: answered, recorded, never stored.

use k8s_openapi::api::authentication::v1::TokenReview;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

use super::api_status;
use crate::apiserver::ApiServer;

fn token_review(token: &str, audiences: &[&str]) -> anyhow::Result<TokenReview> {
    let mut spec = json!({ "token": token });
    if !audiences.is_empty() {
        spec["audiences"] = json!(audiences);
    }
    Ok(serde_json::from_value(json!({ "spec": spec }))?)
}

#[tokio::test]
async fn token_reviews_answer_from_the_token_authenticators() -> anyhow::Result<()> {
    let server = ApiServer::new();
    server.add_token("kubelet-scraper", "prometheus", &["monitoring"]);
    let reviews: Api<TokenReview> = Api::all(server.client("system:node:n1"));
    let pp = PostParams::default();

    let known = reviews
        .create(&pp, &token_review("kubelet-scraper", &[])?)
        .await?;
    let status = known.status.clone().expect("a status");
    assert_eq!(status.authenticated, Some(true));
    let user = status.user.expect("a user");
    assert_eq!(user.username.as_deref(), Some("prometheus"));
    assert_eq!(
        user.groups,
        Some(vec![
            "monitoring".to_string(),
            "system:authenticated".to_string()
        ])
    );
    assert_eq!(
        status.audiences,
        Some(vec![
            "https://kubernetes.default.svc.cluster.local".to_string()
        ])
    );
    assert_eq!(known.spec.token.as_deref(), Some("kubelet-scraper"));

    let unknown = reviews.create(&pp, &token_review("nope", &[])?).await?;
    let status = unknown.status.expect("a status");
    assert_ne!(status.authenticated, Some(true));
    assert_eq!(status.error.as_deref(), Some("invalid bearer token"));
    assert!(status.user.and_then(|u| u.username).is_none());

    // A static token is good for the API's own audience only.
    let elsewhere = reviews
        .create(&pp, &token_review("kubelet-scraper", &["https://vault"])?)
        .await?;
    assert_ne!(elsewhere.status.and_then(|s| s.authenticated), Some(true));

    // Service account tokens the server issued authenticate as their account.
    let accounts: Api<ServiceAccount> = Api::namespaced(server.client("admin"), "default");
    let request = json!({ "spec": { "audiences": ["https://kubelet"] } });
    let issued: Value = accounts
        .create_subresource("token", "default", &pp, &request)
        .await?;
    let token = issued["status"]["token"]
        .as_str()
        .expect("a token")
        .to_string();
    let sa = reviews
        .create(&pp, &token_review(&token, &["https://kubelet"])?)
        .await?;
    let status = sa.status.expect("a status");
    assert_eq!(status.authenticated, Some(true), "{status:?}");
    let user = status.user.expect("a user");
    assert_eq!(
        user.username.as_deref(),
        Some("system:serviceaccount:default:default")
    );
    assert!(
        user.groups
            .unwrap_or_default()
            .contains(&"system:serviceaccounts:default".to_string())
    );
    assert_eq!(status.audiences, Some(vec!["https://kubelet".to_string()]));
    let wrong_audience = reviews.create(&pp, &token_review(&token, &[])?).await?;
    assert_ne!(
        wrong_audience.status.and_then(|s| s.authenticated),
        Some(true)
    );

    let empty = api_status(reviews.create(&pp, &token_review("", &[])?).await);
    assert_eq!(
        (empty.code, empty.message.as_str()),
        (400, "token is required for TokenReview in authentication")
    );

    let recorded = server.token_reviews();
    assert_eq!(recorded.len(), 5, "the 400 is not recorded");
    assert_eq!(recorded[0], known);
    assert_eq!(recorded[1].spec.token.as_deref(), Some("nope"));
    assert_eq!(
        recorded[2].spec.audiences,
        Some(vec!["https://vault".to_string()])
    );
    // Reviews are not stored: there is nothing to get or list.
    assert_eq!(api_status(reviews.get("anything").await).code, 405);
    Ok(())
}

#[tokio::test]
async fn subject_access_reviews_follow_the_policy_and_are_recorded() -> anyhow::Result<()> {
    let server = ApiServer::new();
    server.set_access_policy(|review| {
        let spec = &review.spec;
        let verb = spec
            .resource_attributes
            .as_ref()
            .and_then(|a| a.verb.clone())
            .unwrap_or_default();
        if spec.user.as_deref() == Some("system:anonymous") {
            (false, "anonymous may not".into())
        } else if verb == "get" {
            (
                true,
                format!("{} may get", spec.user.clone().unwrap_or_default()),
            )
        } else {
            (false, String::new())
        }
    });
    let reviews: Api<SubjectAccessReview> = Api::all(server.client("system:kube-apiserver"));
    let pp = PostParams::default();
    let review = |user: &str, attributes: Value| -> anyhow::Result<SubjectAccessReview> {
        Ok(serde_json::from_value(json!({
            "spec": {
                "user": user,
                "groups": ["system:authenticated"],
                "uid": "u-1",
                "extra": { "scopes": ["a", "b"] },
                "resourceAttributes": attributes,
            },
        }))?)
    };
    let stats = json!({ "verb": "get", "resource": "nodes", "subresource": "stats", "name": "n1" });
    let allowed = reviews
        .create(&pp, &review("prometheus", stats.clone())?)
        .await?;
    let status = allowed.status.clone().expect("a status");
    assert!(status.allowed);
    assert_eq!(status.reason.as_deref(), Some("prometheus may get"));

    let proxy =
        json!({ "verb": "create", "resource": "nodes", "subresource": "proxy", "name": "n1" });
    let denied = reviews.create(&pp, &review("prometheus", proxy)?).await?;
    let status = denied.status.clone().expect("a status");
    assert!(!status.allowed);
    assert_eq!(status.reason, None);

    let anonymous = reviews
        .create(&pp, &review("system:anonymous", stats)?)
        .await?;
    assert_eq!(
        anonymous.status.and_then(|s| s.reason).as_deref(),
        Some("anonymous may not")
    );

    let recorded = server.access_reviews();
    assert_eq!(recorded.len(), 3);
    assert_eq!(recorded[0], allowed);
    let spec = &recorded[1].spec;
    let attributes = spec
        .resource_attributes
        .as_ref()
        .expect("resource attributes");
    assert_eq!(
        (
            spec.user.as_deref(),
            spec.uid.as_deref(),
            attributes.verb.as_deref(),
            attributes.resource.as_deref(),
            attributes.subresource.as_deref(),
            attributes.name.as_deref(),
        ),
        (
            Some("prometheus"),
            Some("u-1"),
            Some("create"),
            Some("nodes"),
            Some("proxy"),
            Some("n1")
        )
    );
    assert_eq!(
        spec.extra.as_ref().and_then(|e| e.get("scopes")).cloned(),
        Some(vec!["a".to_string(), "b".to_string()])
    );

    // Validation as the apiserver does it.
    let neither: SubjectAccessReview = serde_json::from_value(json!({ "spec": { "user": "x" } }))?;
    let invalid = api_status(reviews.create(&pp, &neither).await);
    assert_eq!(invalid.code, 422);
    assert!(
        invalid.message.contains(
            "exactly one of nonResourceAttributes or resourceAttributes must be specified"
        ),
        "{}",
        invalid.message
    );
    let nobody: SubjectAccessReview = serde_json::from_value(
        json!({ "spec": { "nonResourceAttributes": { "path": "/metrics", "verb": "get" } } }),
    )?;
    let invalid = api_status(reviews.create(&pp, &nobody).await);
    assert!(
        invalid
            .message
            .contains("at least one of user or group must be specified"),
        "{}",
        invalid.message
    );
    assert_eq!(server.access_reviews().len(), 3);
    Ok(())
}
