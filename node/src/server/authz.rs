//! Authorization of the node API (AlwaysAllow, or Webhook through SubjectAccessReview),
//! and [`filter`], the middleware that authenticates then authorizes every request as
//! the kubelet's `InstallAuthFilter` does.
//!
//! A request is checked as a verb on `nodes/<subresource>` named after this node
//! ([`request_attributes`], the kubelet's `GetRequestAttributes`): the verb from the
//! HTTP method, the subresource from the path (`stats`, `metrics`, `log`,
//! `checkpoint`, else `proxy`). With fine-grained authorization (the
//! `KubeletFineGrainedAuthz` gate: alpha and off in 1.32, beta and on from 1.33)
//! `/pods`, `/runningpods/`, `/healthz` and `/configz` are first asked as `pods`,
//! `healthz` or `configz`, then, if denied, as `proxy`. The first allowed set
//! admits the request; an authorizer error ends it with a 500.
//!
//! In Webhook mode each set becomes a `SubjectAccessReview` ([`subject_access_review`],
//! as the apiserver's webhook authorizer writes it), and answers are cached,
//! `cacheAuthorizedTTL` for allowed and `cacheUnauthorizedTTL` for the rest.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec, SubjectAccessReviewStatus,
};
use tokio::time::Instant;

use super::auth::{Authenticator, Authn, Credential, ReviewError, User};
use super::text;
use crate::config::AuthzMode;

/// How many answers the SubjectAccessReview cache keeps (the webhook authorizer's LRU).
const ACCESS_CACHE_CAPACITY: usize = 8192;
/// Requests whose requester-controlled attributes are this long or longer are not
/// cached (the webhook authorizer's `maxControlledAttrCacheSize`).
const MAX_CACHED_ATTRIBUTES_SIZE: usize = 10_000;

/// One set of authorization attributes, as the kubelet's `AttributesRecord`: always a
/// resource request on `nodes` in the core group, `v1`, no namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attributes {
    pub user: User,
    /// `get`, `create`, `update`, `patch`, `delete`, or empty for other methods.
    pub verb: String,
    pub namespace: String,
    pub api_group: String,
    pub api_version: String,
    pub resource: String,
    pub subresource: String,
    /// The node's name.
    pub name: String,
    /// The request path (not sent: a resource request carries no path).
    pub path: String,
}

/// The kubelet's verb for an HTTP method. Any other method (HEAD, OPTIONS, ...) has
/// the empty verb, as in the kubelet's code (its documentation says HEAD is `get`;
/// its code does not map it).
pub fn verb(method: &Method) -> &'static str {
    match *method {
        Method::GET => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "",
    }
}

/// The kubelet's `isSubpath`: `path` itself, or below it.
fn is_subpath(request: &str, path: &str) -> bool {
    let path = path.strip_suffix('/').unwrap_or(path);
    request == path
        || request
            .strip_prefix(path)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// The subresources to ask for, in order (the kubelet's `GetRequestAttributes`, 1.32
/// and 1.33). `/spec/` has no subresource of its own any more (the kubelet dropped
/// the endpoint; it is `proxy`, though the kubelet's documentation still lists it).
fn subresources(path: &str, fine_grained: bool) -> Vec<&'static str> {
    let fine = |sub: &'static str| {
        if fine_grained {
            vec![sub, "proxy"]
        } else {
            vec!["proxy"]
        }
    };
    if is_subpath(path, "/stats/") {
        vec!["stats"]
    } else if is_subpath(path, "/metrics") {
        vec!["metrics"]
    } else if is_subpath(path, "/logs/") {
        vec!["log"]
    } else if is_subpath(path, "/checkpoint/") {
        vec!["checkpoint"]
    } else if is_subpath(path, "/pods") || is_subpath(path, "/runningpods/") {
        fine("pods")
    } else if is_subpath(path, "/healthz") {
        fine("healthz")
    } else if is_subpath(path, "/configz") {
        fine("configz")
    } else {
        vec!["proxy"]
    }
}

/// The attribute sets to authorize a request by, in the order to try them; at least
/// one. `path` is the request's path as the router matches it (not percent-decoded).
pub fn request_attributes(
    node_name: &str,
    user: &User,
    method: &Method,
    path: &str,
    fine_grained: bool,
) -> Vec<Attributes> {
    subresources(path, fine_grained)
        .into_iter()
        .map(|subresource| Attributes {
            user: user.clone(),
            verb: verb(method).to_owned(),
            namespace: String::new(),
            api_group: String::new(),
            api_version: "v1".to_owned(),
            resource: "nodes".to_owned(),
            subresource: subresource.to_owned(),
            name: node_name.to_owned(),
            path: path.to_owned(),
        })
        .collect()
}

/// `Some` unless empty: Go's `omitempty`, so the review is the webhook authorizer's
/// byte for byte.
fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

/// The SubjectAccessReview the webhook authorizer sends for `attrs`: the user's name,
/// UID, groups and extra, and the resource attributes (namespace, verb, group,
/// version, resource, subresource, name). Empty fields are left out, as Go's
/// `omitempty` leaves them out.
pub fn subject_access_review(attrs: &Attributes) -> SubjectAccessReview {
    let user = &attrs.user;
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: non_empty(&user.name),
            uid: non_empty(&user.uid),
            groups: (!user.groups.is_empty()).then(|| user.groups.clone()),
            extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
            resource_attributes: Some(ResourceAttributes {
                namespace: non_empty(&attrs.namespace),
                verb: non_empty(&attrs.verb),
                group: non_empty(&attrs.api_group),
                version: non_empty(&attrs.api_version),
                resource: non_empty(&attrs.resource),
                subresource: non_empty(&attrs.subresource),
                name: non_empty(&attrs.name),
                field_selector: None,
                label_selector: None,
            }),
            non_resource_attributes: None,
        },
        ..SubjectAccessReview::default()
    }
}

/// Answers SubjectAccessReviews.
#[async_trait::async_trait]
pub trait SubjectAccessReviewer: Send + Sync {
    async fn review(
        &self,
        review: &SubjectAccessReview,
    ) -> Result<SubjectAccessReviewStatus, ReviewError>;
}

#[async_trait::async_trait]
impl<T: SubjectAccessReviewer + ?Sized> SubjectAccessReviewer for Arc<T> {
    async fn review(
        &self,
        review: &SubjectAccessReview,
    ) -> Result<SubjectAccessReviewStatus, ReviewError> {
        (**self).review(review).await
    }
}

/// Creates `authorization.k8s.io/v1` SubjectAccessReviews.
#[derive(Clone)]
pub struct KubeAccessReviewer {
    pub client: kube::Client,
}

impl KubeAccessReviewer {
    pub fn new(client: kube::Client) -> KubeAccessReviewer {
        KubeAccessReviewer { client }
    }
}

#[async_trait::async_trait]
impl SubjectAccessReviewer for KubeAccessReviewer {
    async fn review(
        &self,
        review: &SubjectAccessReview,
    ) -> Result<SubjectAccessReviewStatus, ReviewError> {
        let api = kube::Api::<SubjectAccessReview>::all(self.client.clone());
        let answer = api
            .create(&kube::api::PostParams::default(), review)
            .await
            .map_err(|e| ReviewError::Request {
                kind: "SubjectAccessReview",
                message: e.to_string(),
            })?;
        Ok(answer.status.unwrap_or_default())
    }
}

struct AccessEntry {
    expires: Instant,
    status: SubjectAccessReviewStatus,
}

/// A [`SubjectAccessReviewer`] that remembers allowed answers for `authorized_ttl`
/// and the others for `unauthorized_ttl` (a zero TTL keeps none); errors are not
/// kept. Keyed by the review's spec, as JSON: user, groups, extra and attributes.
pub struct CachingAccessReviewer<R> {
    inner: R,
    authorized_ttl: Duration,
    unauthorized_ttl: Duration,
    cache: Mutex<HashMap<String, AccessEntry>>,
}

impl<R: SubjectAccessReviewer> CachingAccessReviewer<R> {
    pub fn new(
        inner: R,
        authorized_ttl: Duration,
        unauthorized_ttl: Duration,
    ) -> CachingAccessReviewer<R> {
        CachingAccessReviewer {
            inner,
            authorized_ttl,
            unauthorized_ttl,
            cache: Mutex::new(HashMap::new()),
        }
    }
}

/// Whether the requester-controlled attributes are short enough to cache.
fn should_cache(review: &SubjectAccessReview) -> bool {
    let Some(attrs) = &review.spec.resource_attributes else {
        return false;
    };
    let size: usize = [
        &attrs.namespace,
        &attrs.verb,
        &attrs.group,
        &attrs.version,
        &attrs.resource,
        &attrs.subresource,
        &attrs.name,
    ]
    .iter()
    .map(|s| s.as_deref().map_or(0, str::len))
    .sum();
    size < MAX_CACHED_ATTRIBUTES_SIZE
}

#[async_trait::async_trait]
impl<R: SubjectAccessReviewer> SubjectAccessReviewer for CachingAccessReviewer<R> {
    async fn review(
        &self,
        review: &SubjectAccessReview,
    ) -> Result<SubjectAccessReviewStatus, ReviewError> {
        let key = serde_json::to_string(&review.spec).map_err(|e| ReviewError::Request {
            kind: "SubjectAccessReview",
            message: e.to_string(),
        })?;
        {
            let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(entry) = cache.get(&key).filter(|e| e.expires > Instant::now()) {
                return Ok(entry.status.clone());
            }
        }
        let status = self.inner.review(review).await?;
        let ttl = if status.allowed {
            self.authorized_ttl
        } else {
            self.unauthorized_ttl
        };
        if ttl.is_zero() || !should_cache(review) {
            return Ok(status);
        }
        let now = Instant::now();
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if cache.len() >= ACCESS_CACHE_CAPACITY {
            cache.retain(|_, e| e.expires > now);
        }
        if cache.len() >= ACCESS_CACHE_CAPACITY
            && let Some(soonest) = cache
                .iter()
                .min_by_key(|(_, e)| e.expires)
                .map(|(k, _)| k.clone())
        {
            cache.remove(&soonest);
        }
        cache.insert(
            key,
            AccessEntry {
                expires: now + ttl,
                status: status.clone(),
            },
        );
        Ok(status)
    }
}

/// A configuration the authorizer cannot be built from.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthzSetupError {
    #[error("no client provided, cannot use webhook authorization")]
    NoAccessReviewer,
}

/// What authorization made of a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// No attribute set was allowed; the reason the last review gave.
    Deny(String),
    /// A review failed: the subresource it was for, and why.
    Error {
        subresource: String,
        message: String,
    },
}

/// Authorizes attribute sets (see the module doc).
pub struct Authorizer {
    reviewer: Option<Arc<dyn SubjectAccessReviewer>>,
}

impl Authorizer {
    /// `reviewer` is the uncached SubjectAccessReview client, needed in Webhook mode;
    /// the authorizer caches its answers for the mode's TTLs.
    pub fn new(
        mode: AuthzMode,
        reviewer: Option<Arc<dyn SubjectAccessReviewer>>,
    ) -> Result<Authorizer, AuthzSetupError> {
        let reviewer: Option<Arc<dyn SubjectAccessReviewer>> = match (mode, reviewer) {
            (AuthzMode::AlwaysAllow, _) => None,
            (AuthzMode::Webhook { .. }, None) => return Err(AuthzSetupError::NoAccessReviewer),
            (
                AuthzMode::Webhook {
                    authorized_ttl,
                    unauthorized_ttl,
                },
                Some(reviewer),
            ) => Some(Arc::new(CachingAccessReviewer::new(
                reviewer,
                authorized_ttl,
                unauthorized_ttl,
            ))),
        };
        Ok(Authorizer { reviewer })
    }

    /// Tries each set in order: the first allowed admits; an error ends the check.
    pub async fn authorize(&self, attrs: &[Attributes]) -> Decision {
        let Some(reviewer) = &self.reviewer else {
            return if attrs.is_empty() {
                Decision::Deny("could not determine attributes for request".to_owned())
            } else {
                Decision::Allow
            };
        };
        let mut reason = String::new();
        for attr in attrs {
            let error = |message: String| Decision::Error {
                subresource: attr.subresource.clone(),
                message,
            };
            let status = match reviewer.review(&subject_access_review(attr)).await {
                Ok(status) => status,
                Err(e) => return error(e.to_string()),
            };
            let denied = status.denied == Some(true);
            if status.allowed && denied {
                return error(
                    "webhook subject access review returned both allow and deny response"
                        .to_owned(),
                );
            }
            if status.allowed {
                return Decision::Allow;
            }
            reason = status.reason.unwrap_or_default();
        }
        if attrs.is_empty() {
            reason = "could not determine attributes for request".to_owned();
        }
        Decision::Deny(reason)
    }
}

/// What [`filter`] needs: who this node is, and how to authenticate and authorize.
pub struct Guard {
    pub node_name: String,
    pub authenticator: Authenticator,
    pub authorizer: Authorizer,
    /// `KubeletFineGrainedAuthz`.
    pub fine_grained: bool,
}

impl Guard {
    pub fn new(
        node_name: impl Into<String>,
        authenticator: Authenticator,
        authorizer: Authorizer,
        fine_grained: bool,
    ) -> Guard {
        Guard {
            node_name: node_name.into(),
            authenticator,
            authorizer,
            fine_grained,
        }
    }
}

/// Go's `%v` of a `[]string`: `[a b]`.
fn go_list(items: &[&str]) -> String {
    format!("[{}]", items.join(" "))
}

/// The kubelet's auth filter, as axum middleware
/// (`axum::middleware::from_fn_with_state(guard, filter)`): 401 `Unauthorized` when
/// authentication fails; 403 `Forbidden (user=…, verb=…, resource=nodes,
/// subresource(s)=[…])` when no attribute set is allowed; 500 `Authorization error
/// (…)` when a review fails; otherwise the request goes on with its [`User`] in the
/// extensions (and, authenticated by a bearer token, without its `Authorization`
/// header, as the apiserver's bearer authenticator removes it).
pub async fn filter(State(guard): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    let (mut parts, body) = req.into_parts();
    let (authn, credential) = guard.authenticator.authenticate_request(&parts).await;
    let user = match authn {
        Authn::Authenticated(user) => user,
        Authn::Unauthenticated(reason) => {
            tracing::debug!(path = parts.uri.path(), %reason, "Unauthorized");
            return text(StatusCode::UNAUTHORIZED, "Unauthorized");
        }
        Authn::Error(error) => {
            tracing::error!(
                path = parts.uri.path(),
                "Unable to authenticate the request due to an error: {error}"
            );
            return text(StatusCode::UNAUTHORIZED, "Unauthorized");
        }
    };
    match &credential {
        Credential::Token => {
            parts.headers.remove(header::AUTHORIZATION);
        }
        // As the apiserver's protocol authenticator: the token's subprotocol is
        // removed, the others stay for the handshake.
        Credential::WebSocketToken(others) => {
            parts.headers.remove(header::SEC_WEBSOCKET_PROTOCOL);
            if let Ok(v) = header::HeaderValue::from_str(others) {
                parts.headers.insert(header::SEC_WEBSOCKET_PROTOCOL, v);
            }
        }
        Credential::None | Credential::Certificate => {}
    }

    let attrs = request_attributes(
        &guard.node_name,
        &user,
        &parts.method,
        parts.uri.path(),
        guard.fine_grained,
    );
    let Some(first) = attrs.first() else {
        tracing::error!("Authorization error: could not determine attributes for request");
        return text(
            StatusCode::FORBIDDEN,
            "Authorization error: could not determine attributes for request".to_owned(),
        );
    };
    match guard.authorizer.authorize(&attrs).await {
        Decision::Allow => {
            parts.extensions.insert(user);
            next.run(Request::from_parts(parts, body)).await
        }
        Decision::Deny(reason) => {
            let subs: Vec<&str> = attrs.iter().map(|a| a.subresource.as_str()).collect();
            tracing::debug!(
                user = %first.user.name,
                verb = %first.verb,
                resource = %first.resource,
                subresources = ?subs,
                %reason,
                "Forbidden"
            );
            text(
                StatusCode::FORBIDDEN,
                format!(
                    "Forbidden (user={}, verb={}, resource={}, subresource(s)={})\n",
                    first.user.name,
                    first.verb,
                    first.resource,
                    go_list(&subs)
                ),
            )
        }
        Decision::Error {
            subresource,
            message,
        } => {
            tracing::error!(
                user = %first.user.name,
                verb = %first.verb,
                resource = %first.resource,
                %subresource,
                "Authorization error: {message}"
            );
            text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!(
                    "Authorization error (user={}, verb={}, resource={}, subresource={})",
                    first.user.name, first.verb, first.resource, subresource
                ),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{AuthnConfig, DEFAULT_TOKEN_CACHE_TTL};
    use crate::server::auth::tests::{FakeTokens, certificate};
    use crate::server::auth::{AUTHENTICATED_GROUP, ClientCertificate, UNAUTHENTICATED_GROUP};
    use axum::Router;
    use axum::body::Body;
    use axum::extract::Extension;
    use axum::http::HeaderMap;
    use axum::routing::any;
    use http_body_util::BodyExt;
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tower::ServiceExt;

    fn user(name: &str) -> User {
        User {
            name: name.to_owned(),
            ..User::default()
        }
    }

    fn subs(path: &str, fine: bool) -> Vec<String> {
        request_attributes("n1", &user("u"), &Method::GET, path, fine)
            .into_iter()
            .map(|a| a.subresource)
            .collect()
    }

    #[test]
    fn paths_map_to_subresources() {
        let table: &[(&str, &[&str], &[&str])] = &[
            // path, without fine-grained, with it
            ("/stats", &["stats"], &["stats"]),
            ("/stats/", &["stats"], &["stats"]),
            ("/stats/summary", &["stats"], &["stats"]),
            ("/statsfoo", &["proxy"], &["proxy"]),
            ("/metrics", &["metrics"], &["metrics"]),
            ("/metrics/cadvisor", &["metrics"], &["metrics"]),
            ("/metrics/probes", &["metrics"], &["metrics"]),
            ("/metricsz", &["proxy"], &["proxy"]),
            ("/logs", &["log"], &["log"]),
            ("/logs/syslog", &["log"], &["log"]),
            ("/checkpoint/ns/pod/c", &["checkpoint"], &["checkpoint"]),
            ("/spec/", &["proxy"], &["proxy"]),
            ("/pods", &["proxy"], &["pods", "proxy"]),
            ("/pods/", &["proxy"], &["pods", "proxy"]),
            ("/podsx", &["proxy"], &["proxy"]),
            ("/runningpods/", &["proxy"], &["pods", "proxy"]),
            ("/runningpods", &["proxy"], &["pods", "proxy"]),
            ("/healthz", &["proxy"], &["healthz", "proxy"]),
            ("/healthz/ping", &["proxy"], &["healthz", "proxy"]),
            ("/configz", &["proxy"], &["configz", "proxy"]),
            ("/exec/ns/pod/c", &["proxy"], &["proxy"]),
            ("/attach/ns/pod/c", &["proxy"], &["proxy"]),
            ("/portForward/ns/pod", &["proxy"], &["proxy"]),
            ("/containerLogs/ns/pod/c", &["proxy"], &["proxy"]),
            ("/run/ns/pod/c", &["proxy"], &["proxy"]),
            ("/readyz", &["proxy"], &["proxy"]),
            ("/", &["proxy"], &["proxy"]),
        ];
        for (path, coarse, fine) in table {
            assert_eq!(subs(path, false), *coarse, "{path} without fine-grained");
            assert_eq!(subs(path, true), *fine, "{path} with fine-grained");
        }
    }

    #[test]
    fn methods_map_to_verbs() {
        let table = [
            (Method::GET, "get"),
            (Method::POST, "create"),
            (Method::PUT, "update"),
            (Method::PATCH, "patch"),
            (Method::DELETE, "delete"),
            (Method::HEAD, ""),
            (Method::OPTIONS, ""),
            (Method::CONNECT, ""),
            (Method::TRACE, ""),
        ];
        for (method, want) in table {
            let attrs = request_attributes("n1", &user("u"), &method, "/pods", true);
            assert_eq!(attrs.len(), 2);
            for a in attrs {
                assert_eq!(a.verb, want, "{method}");
            }
        }
    }

    #[test]
    fn attributes_are_a_resource_request_on_this_node() {
        let u = user("alice");
        let attrs = request_attributes("node-a", &u, &Method::POST, "/exec/ns/p/c", false);
        assert_eq!(
            attrs,
            vec![Attributes {
                user: u,
                verb: "create".into(),
                namespace: String::new(),
                api_group: String::new(),
                api_version: "v1".into(),
                resource: "nodes".into(),
                subresource: "proxy".into(),
                name: "node-a".into(),
                path: "/exec/ns/p/c".into(),
            }]
        );
    }

    #[test]
    fn subject_access_review_is_the_webhook_authorizers() {
        let u = User {
            name: "alice".into(),
            uid: "uid-1".into(),
            groups: vec!["dev".into(), AUTHENTICATED_GROUP.into()],
            extra: BTreeMap::from([("scopes".into(), vec!["a".into(), "b".into()])]),
        };
        let attrs = &request_attributes("node-a", &u, &Method::GET, "/stats/summary", false)[0];
        let sar = subject_access_review(attrs);
        assert_eq!(sar.metadata, Default::default());
        assert_eq!(sar.status, None);
        let spec = &sar.spec;
        assert_eq!(spec.user.as_deref(), Some("alice"));
        assert_eq!(spec.uid.as_deref(), Some("uid-1"));
        assert_eq!(
            spec.groups.as_deref(),
            Some(&["dev".to_owned(), AUTHENTICATED_GROUP.to_owned()][..])
        );
        assert_eq!(
            spec.extra,
            Some(BTreeMap::from([(
                "scopes".to_owned(),
                vec!["a".to_owned(), "b".to_owned()]
            )]))
        );
        assert_eq!(spec.non_resource_attributes, None);
        let ra = spec.resource_attributes.as_ref().unwrap();
        assert_eq!(ra.verb.as_deref(), Some("get"));
        assert_eq!(ra.resource.as_deref(), Some("nodes"));
        assert_eq!(ra.subresource.as_deref(), Some("stats"));
        assert_eq!(ra.name.as_deref(), Some("node-a"));
        assert_eq!(ra.version.as_deref(), Some("v1"));
        assert_eq!(ra.group, None, "the core group, left out as empty");
        assert_eq!(ra.namespace, None, "no namespace, left out as empty");
        assert_eq!(ra.field_selector, None);
        assert_eq!(ra.label_selector, None);

        // On the wire: what Go's webhook authorizer marshals.
        let json = serde_json::to_value(&sar).unwrap();
        assert_eq!(
            json["spec"]["resourceAttributes"],
            serde_json::json!({
                "verb": "get", "version": "v1", "resource": "nodes",
                "subresource": "stats", "name": "node-a"
            })
        );
        assert_eq!(json["apiVersion"], "authorization.k8s.io/v1");
        assert_eq!(json["kind"], "SubjectAccessReview");

        // The anonymous user: no uid, no extra.
        let anon = &request_attributes("node-a", &User::anonymous(), &Method::HEAD, "/", false)[0];
        let spec = subject_access_review(anon).spec;
        assert_eq!(spec.user.as_deref(), Some("system:anonymous"));
        assert_eq!(spec.uid, None);
        assert_eq!(spec.extra, None);
        assert_eq!(spec.groups, Some(vec![UNAUTHENTICATED_GROUP.to_owned()]));
        assert_eq!(
            spec.resource_attributes.unwrap().verb,
            None,
            "HEAD has no verb"
        );
    }

    #[tokio::test]
    async fn kube_access_reviewer_creates_the_review() {
        use crate::server::auth::tests::fake_api;
        let (client, seen) = fake_api(serde_json::json!({"allowed": true, "reason": "RBAC"}));
        let attrs = &request_attributes("node-a", &user("alice"), &Method::GET, "/pods", false)[0];
        let review = subject_access_review(attrs);
        let status = KubeAccessReviewer::new(client)
            .review(&review)
            .await
            .unwrap();
        assert!(status.allowed);
        assert_eq!(status.reason.as_deref(), Some("RBAC"));
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 1);
        let (method, uri, body) = &seen[0];
        assert_eq!(method, "POST");
        assert_eq!(
            uri.trim_end_matches('?'),
            "/apis/authorization.k8s.io/v1/subjectaccessreviews"
        );
        assert_eq!(body, &serde_json::to_value(&review).unwrap());
        assert_eq!(
            body["spec"],
            serde_json::json!({
                "user": "alice",
                "resourceAttributes": {
                    "verb": "get", "version": "v1", "resource": "nodes",
                    "subresource": "proxy", "name": "node-a"
                }
            })
        );
    }

    /// Allows the (user, subresource) pairs it is given; records every review.
    #[derive(Default)]
    struct FakeAccess {
        allowed: Vec<(String, String)>,
        reviews: Mutex<Vec<SubjectAccessReview>>,
        fail: AtomicBool,
        both: AtomicBool,
    }

    impl FakeAccess {
        fn allowing(pairs: &[(&str, &str)]) -> Arc<FakeAccess> {
            Arc::new(FakeAccess {
                allowed: pairs
                    .iter()
                    .map(|(u, s)| ((*u).to_owned(), (*s).to_owned()))
                    .collect(),
                ..FakeAccess::default()
            })
        }

        fn reviews(&self) -> Vec<SubjectAccessReview> {
            self.reviews.lock().unwrap().clone()
        }

        fn count(&self) -> usize {
            self.reviews.lock().unwrap().len()
        }
    }

    #[async_trait::async_trait]
    impl SubjectAccessReviewer for FakeAccess {
        async fn review(
            &self,
            review: &SubjectAccessReview,
        ) -> Result<SubjectAccessReviewStatus, ReviewError> {
            self.reviews.lock().unwrap().push(review.clone());
            if self.fail.load(Ordering::SeqCst) {
                return Err(ReviewError::Request {
                    kind: "SubjectAccessReview",
                    message: "connection refused".into(),
                });
            }
            let spec = &review.spec;
            let who = spec.user.clone().unwrap_or_default();
            let sub = spec
                .resource_attributes
                .as_ref()
                .and_then(|r| r.subresource.clone())
                .unwrap_or_default();
            let allowed = self.allowed.contains(&(who, sub));
            let both = self.both.load(Ordering::SeqCst);
            Ok(SubjectAccessReviewStatus {
                allowed: allowed || both,
                denied: Some(both),
                reason: (!allowed).then(|| "no RBAC policy matched".to_owned()),
                evaluation_error: None,
            })
        }
    }

    fn tokens(pairs: &[(&str, &str)]) -> Arc<FakeTokens> {
        Arc::new(FakeTokens {
            users: pairs
                .iter()
                .map(|(t, n)| ((*t).to_owned(), user(n)))
                .collect(),
            ..FakeTokens::default()
        })
    }

    fn guard(
        anonymous: bool,
        tokens: &Arc<FakeTokens>,
        access: Option<&Arc<FakeAccess>>,
        fine_grained: bool,
    ) -> Arc<Guard> {
        let authn = Authenticator::new(
            AuthnConfig {
                anonymous,
                x509: true,
                webhook: Some(DEFAULT_TOKEN_CACHE_TTL),
            },
            Some(tokens.clone()),
        )
        .unwrap();
        let authz = match access {
            Some(access) => Authorizer::new(AuthzMode::default(), Some(access.clone())),
            None => Authorizer::new(AuthzMode::AlwaysAllow, None),
        }
        .unwrap();
        Arc::new(Guard::new("node-a", authn, authz, fine_grained))
    }

    /// Answers with who the handler saw and whether it saw an Authorization header
    /// (and the WebSocket subprotocols it saw, if any).
    async fn whoami(Extension(user): Extension<User>, headers: HeaderMap) -> String {
        let auth = headers.contains_key(header::AUTHORIZATION);
        let mut out = format!("{} {:?} authorization={auth}", user.name, user.groups);
        if let Some(p) = headers.get(header::SEC_WEBSOCKET_PROTOCOL) {
            out.push_str(&format!(" protocols={}", p.to_str().unwrap()));
        }
        out
    }

    fn router(guard: Arc<Guard>) -> Router {
        Router::new()
            .route("/pods", any(whoami))
            .route("/stats/summary", any(whoami))
            .route("/exec/{ns}/{pod}/{c}", any(whoami))
            .layer(axum::middleware::from_fn_with_state(guard, filter))
    }

    struct Answer {
        status: StatusCode,
        content_type: Option<String>,
        body: String,
    }

    async fn send(guard: &Arc<Guard>, req: Request<Body>) -> Answer {
        let resp = router(guard.clone()).oneshot(req).await.unwrap();
        let status = resp.status();
        let content_type = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_owned());
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        Answer {
            status,
            content_type,
            body: String::from_utf8(body.to_vec()).unwrap(),
        }
    }

    fn get(path: &str) -> Request<Body> {
        axum::http::Request::get(path).body(Body::empty()).unwrap()
    }

    fn get_with_token(path: &str, token: &str) -> Request<Body> {
        axum::http::Request::get(path)
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .body(Body::empty())
            .unwrap()
    }

    #[tokio::test]
    async fn no_credentials_is_401() {
        let g = guard(false, &tokens(&[]), None, false);
        let answer = send(&g, get("/pods")).await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
        assert_eq!(answer.body, "Unauthorized");
        assert_eq!(
            answer.content_type.as_deref(),
            Some("text/plain; charset=utf-8")
        );
    }

    #[tokio::test]
    async fn anonymous_reaches_authorization() {
        let access = FakeAccess::allowing(&[]);
        let g = guard(true, &tokens(&[]), Some(&access), false);
        let answer = send(&g, get("/stats/summary")).await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN);
        assert_eq!(
            answer.body,
            "Forbidden (user=system:anonymous, verb=get, resource=nodes, subresource(s)=[stats])\n"
        );
        let reviews = access.reviews();
        assert_eq!(reviews.len(), 1);
        assert_eq!(reviews[0].spec.user.as_deref(), Some("system:anonymous"));
        assert_eq!(
            reviews[0].spec.groups,
            Some(vec![UNAUTHENTICATED_GROUP.to_owned()])
        );

        let allowed = FakeAccess::allowing(&[("system:anonymous", "stats")]);
        let g = guard(true, &tokens(&[]), Some(&allowed), false);
        let answer = send(&g, get("/stats/summary")).await;
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(
            answer.body,
            "system:anonymous [\"system:unauthenticated\"] authorization=false"
        );
    }

    #[tokio::test]
    async fn rejected_token_is_401_even_with_anonymous_on() {
        let access = FakeAccess::allowing(&[("system:anonymous", "proxy")]);
        let toks = tokens(&[("good", "alice")]);
        let g = guard(true, &toks, Some(&access), false);
        let answer = send(&g, get_with_token("/pods", "forged")).await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
        assert_eq!(answer.body, "Unauthorized");
        assert_eq!(toks.calls.load(Ordering::SeqCst), 1);
        assert_eq!(access.count(), 0, "never reached authorization");
    }

    #[tokio::test]
    async fn failing_token_review_is_401() {
        let toks = tokens(&[("good", "alice")]);
        toks.fail.store(true, Ordering::SeqCst);
        let g = guard(true, &toks, None, false);
        let answer = send(&g, get_with_token("/pods", "good")).await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
        assert_eq!(answer.body, "Unauthorized");
    }

    #[tokio::test]
    async fn accepted_token_denied_is_403_with_the_kubelets_message() {
        let access = FakeAccess::allowing(&[]);
        let g = guard(false, &tokens(&[("good", "alice")]), Some(&access), false);
        let req = axum::http::Request::post("/exec/ns/pod/c")
            .header(header::AUTHORIZATION, "Bearer good")
            .body(Body::empty())
            .unwrap();
        let answer = send(&g, req).await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN);
        assert_eq!(
            answer.body,
            "Forbidden (user=alice, verb=create, resource=nodes, subresource(s)=[proxy])\n"
        );
        assert_eq!(
            answer.content_type.as_deref(),
            Some("text/plain; charset=utf-8")
        );
    }

    #[tokio::test]
    async fn a_websocket_token_reaches_the_handler_without_its_subprotocol() {
        use base64::Engine as _;
        let access = FakeAccess::allowing(&[("alice", "proxy")]);
        let g = guard(false, &tokens(&[("good", "alice")]), Some(&access), false);
        let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("good");
        let req = axum::http::Request::get("/exec/ns/pod/c")
            .header(header::CONNECTION, "Upgrade")
            .header(header::UPGRADE, "websocket")
            .header(
                header::SEC_WEBSOCKET_PROTOCOL,
                format!("v5.channel.k8s.io,base64url.bearer.authorization.k8s.io.{token}"),
            )
            .body(Body::empty())
            .unwrap();
        let answer = send(&g, req).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
        assert_eq!(
            answer.body,
            "alice [\"system:authenticated\"] authorization=false protocols=v5.channel.k8s.io"
        );
    }

    #[tokio::test]
    async fn allowed_token_reaches_the_handler_with_its_user_and_without_the_header() {
        let access = FakeAccess::allowing(&[("alice", "proxy")]);
        let g = guard(false, &tokens(&[("good", "alice")]), Some(&access), false);
        let answer = send(&g, get_with_token("/pods", "good")).await;
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(
            answer.body,
            "alice [\"system:authenticated\"] authorization=false"
        );
        let reviews = access.reviews();
        assert_eq!(reviews.len(), 1);
        let spec = &reviews[0].spec;
        assert_eq!(spec.user.as_deref(), Some("alice"));
        assert_eq!(spec.groups, Some(vec![AUTHENTICATED_GROUP.to_owned()]));
    }

    #[tokio::test]
    async fn client_certificate_names_the_user_without_a_token_review() {
        let toks = tokens(&[("good", "alice")]);
        let access = FakeAccess::allowing(&[("system:node:n1", "stats")]);
        let g = guard(false, &toks, Some(&access), false);
        let mut req = get_with_token("/stats/summary", "good");
        let der = certificate(Some("system:node:n1"), &["system:nodes", "ops"]);
        req.extensions_mut().insert(ClientCertificate(der));
        let answer = send(&g, req).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
        assert_eq!(
            answer.body,
            "system:node:n1 [\"system:nodes\", \"ops\", \"system:authenticated\"] \
             authorization=true"
        );
        assert_eq!(toks.calls.load(Ordering::SeqCst), 0, "no TokenReview");
        let spec = &access.reviews()[0].spec;
        assert_eq!(spec.user.as_deref(), Some("system:node:n1"));
        assert!(
            spec.extra.as_ref().unwrap()["authentication.kubernetes.io/credential-id"][0]
                .starts_with("X509SHA256=")
        );
    }

    #[tokio::test]
    async fn fine_grained_falls_back_to_proxy() {
        let access = FakeAccess::allowing(&[("alice", "proxy")]);
        let g = guard(false, &tokens(&[("good", "alice")]), Some(&access), true);
        let answer = send(&g, get_with_token("/pods", "good")).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);

        let reviews = access.reviews();
        assert_eq!(reviews.len(), 2);
        for (review, sub) in reviews.iter().zip(["pods", "proxy"]) {
            let spec = &review.spec;
            assert_eq!(spec.user.as_deref(), Some("alice"));
            assert_eq!(spec.uid, None);
            assert_eq!(spec.groups, Some(vec![AUTHENTICATED_GROUP.to_owned()]));
            assert_eq!(spec.extra, None);
            let ra = spec.resource_attributes.as_ref().unwrap();
            assert_eq!(ra.verb.as_deref(), Some("get"));
            assert_eq!(ra.group, None);
            assert_eq!(ra.version.as_deref(), Some("v1"));
            assert_eq!(ra.resource.as_deref(), Some("nodes"));
            assert_eq!(ra.subresource.as_deref(), Some(sub));
            assert_eq!(ra.name.as_deref(), Some("node-a"));
            assert_eq!(ra.namespace, None);
        }

        // Allowed as `pods`: `proxy` is never asked.
        let pods_only = FakeAccess::allowing(&[("alice", "pods")]);
        let g = guard(false, &tokens(&[("good", "alice")]), Some(&pods_only), true);
        let answer = send(&g, get_with_token("/pods", "good")).await;
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(pods_only.count(), 1);

        // Denied both ways: the message lists both.
        let neither = FakeAccess::allowing(&[]);
        let g = guard(false, &tokens(&[("good", "alice")]), Some(&neither), true);
        let answer = send(&g, get_with_token("/pods", "good")).await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN);
        assert_eq!(
            answer.body,
            "Forbidden (user=alice, verb=get, resource=nodes, subresource(s)=[pods proxy])\n"
        );
    }

    #[tokio::test]
    async fn review_errors_are_500_and_stop_the_fallback() {
        let access = FakeAccess::allowing(&[("alice", "proxy")]);
        access.fail.store(true, Ordering::SeqCst);
        let g = guard(false, &tokens(&[("good", "alice")]), Some(&access), true);
        let answer = send(&g, get_with_token("/pods", "good")).await;
        assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            answer.body,
            "Authorization error (user=alice, verb=get, resource=nodes, subresource=pods)"
        );
        assert_eq!(access.count(), 1, "no fallback after an error");

        let both = FakeAccess::allowing(&[]);
        both.both.store(true, Ordering::SeqCst);
        let g = guard(false, &tokens(&[("good", "alice")]), Some(&both), false);
        let answer = send(&g, get_with_token("/pods", "good")).await;
        assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            answer.body,
            "Authorization error (user=alice, verb=get, resource=nodes, subresource=proxy)"
        );
    }

    #[tokio::test]
    async fn always_allow_asks_nobody() {
        let g = guard(false, &tokens(&[("good", "alice")]), None, true);
        let answer = send(&g, get_with_token("/stats/summary", "good")).await;
        assert_eq!(answer.status, StatusCode::OK);
    }

    #[tokio::test(start_paused = true)]
    async fn token_reviews_are_cached_through_the_filter() {
        let toks = tokens(&[("good", "alice")]);
        let g = guard(false, &toks, None, false);
        let calls = || toks.calls.load(Ordering::SeqCst);
        assert_eq!(
            send(&g, get_with_token("/pods", "good")).await.status,
            StatusCode::OK
        );
        assert_eq!(
            send(&g, get_with_token("/pods", "forged")).await.status,
            StatusCode::UNAUTHORIZED
        );
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(
            send(&g, get_with_token("/pods", "good")).await.status,
            StatusCode::OK
        );
        assert_eq!(
            send(&g, get_with_token("/pods", "forged")).await.status,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(calls(), 2, "within the 2 m TTL");
        tokio::time::advance(DEFAULT_TOKEN_CACHE_TTL).await;
        assert_eq!(
            send(&g, get_with_token("/pods", "good")).await.status,
            StatusCode::OK
        );
        assert_eq!(calls(), 3, "after the TTL");
    }

    #[tokio::test(start_paused = true)]
    async fn access_answers_are_cached_for_their_own_ttls() {
        let access = FakeAccess::allowing(&[("alice", "stats")]);
        let authz = Authorizer::new(AuthzMode::default(), Some(access.clone())).unwrap();
        let alice = user("alice");
        let stats = request_attributes("n", &alice, &Method::GET, "/stats/summary", false);
        let proxy = request_attributes("n", &alice, &Method::GET, "/exec/a/b/c", false);

        assert_eq!(authz.authorize(&stats).await, Decision::Allow);
        assert_eq!(
            authz.authorize(&proxy).await,
            Decision::Deny("no RBAC policy matched".into())
        );
        assert_eq!(access.count(), 2);

        // 29 s: both cached.
        tokio::time::advance(Duration::from_secs(29)).await;
        authz.authorize(&stats).await;
        authz.authorize(&proxy).await;
        assert_eq!(access.count(), 2);

        // 30 s: the denial expired, the allowance did not.
        tokio::time::advance(Duration::from_secs(1)).await;
        authz.authorize(&stats).await;
        authz.authorize(&proxy).await;
        assert_eq!(access.count(), 3);
        assert_eq!(
            access.reviews()[2]
                .spec
                .resource_attributes
                .as_ref()
                .unwrap()
                .subresource
                .as_deref(),
            Some("proxy")
        );

        // 5 m after the first: the allowance expired too.
        tokio::time::advance(Duration::from_secs(270)).await;
        authz.authorize(&stats).await;
        assert_eq!(access.count(), 4);

        // Another verb, another user: another question.
        let post = request_attributes("n", &alice, &Method::POST, "/stats/summary", false);
        authz.authorize(&post).await;
        let bob = request_attributes("n", &user("bob"), &Method::GET, "/stats/summary", false);
        authz.authorize(&bob).await;
        assert_eq!(access.count(), 6);
    }

    #[tokio::test(start_paused = true)]
    async fn access_errors_are_not_cached() {
        let access = FakeAccess::allowing(&[("alice", "stats")]);
        let authz = Authorizer::new(AuthzMode::default(), Some(access.clone())).unwrap();
        let stats = request_attributes("n", &user("alice"), &Method::GET, "/stats/x", false);
        access.fail.store(true, Ordering::SeqCst);
        assert!(matches!(
            authz.authorize(&stats).await,
            Decision::Error { .. }
        ));
        access.fail.store(false, Ordering::SeqCst);
        assert_eq!(authz.authorize(&stats).await, Decision::Allow);
        assert_eq!(authz.authorize(&stats).await, Decision::Allow);
        assert_eq!(
            access.count(),
            2,
            "the error was asked again, the answer was kept"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn zero_ttls_and_oversized_attributes_are_not_cached() {
        let access = FakeAccess::allowing(&[("alice", "stats")]);
        let authz = Authorizer::new(
            AuthzMode::Webhook {
                authorized_ttl: Duration::ZERO,
                unauthorized_ttl: Duration::ZERO,
            },
            Some(access.clone()),
        )
        .unwrap();
        let stats = request_attributes("n", &user("alice"), &Method::GET, "/stats/x", false);
        authz.authorize(&stats).await;
        authz.authorize(&stats).await;
        assert_eq!(access.count(), 2);

        let authz = Authorizer::new(AuthzMode::default(), Some(access.clone())).unwrap();
        let long = "n".repeat(MAX_CACHED_ATTRIBUTES_SIZE);
        let big = request_attributes(&long, &user("alice"), &Method::GET, "/stats/x", false);
        authz.authorize(&big).await;
        authz.authorize(&big).await;
        assert_eq!(access.count(), 4);
    }

    #[test]
    fn webhook_mode_needs_a_reviewer() {
        assert_eq!(
            Authorizer::new(AuthzMode::default(), None).err(),
            Some(AuthzSetupError::NoAccessReviewer)
        );
        assert!(Authorizer::new(AuthzMode::AlwaysAllow, None).is_ok());
    }

    #[test]
    fn go_lists_print_as_fmt_does() {
        assert_eq!(go_list(&["proxy"]), "[proxy]");
        assert_eq!(go_list(&["pods", "proxy"]), "[pods proxy]");
    }
}
