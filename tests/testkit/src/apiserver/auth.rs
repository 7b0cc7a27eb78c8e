//! Authentication as kube-apiserver does it, and the two review APIs built on it.
//!
//! Over TLS a request is authenticated like the real union authenticator: a client
//! certificate signed by the server's CA (user = CN, groups = O), else a bearer
//! token (the token table, bootstrap token Secrets, this server's service account
//! tokens); the first success wins, any failure without a success is 401, and no
//! credentials at all is `system:anonymous`. Authenticated users get the group
//! `system:authenticated`. Plain-HTTP and in-process clients keep the testkit's
//! older convention: a token not in any table *is* the user name.
//!
//! `TokenReview` answers from the same token authenticators; `SubjectAccessReview`
//! from the test's policy. Both are recorded and never stored.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;

use axum::http::header::AUTHORIZATION;
use axum::response::Response;
use jiff::Timestamp;
use k8s_openapi::api::authentication::v1::TokenReview;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use serde_json::{Value, json};
use x509_parser::prelude::{FromDer, X509Certificate};

use super::b64;
use super::errors::{ApiError, FieldError};
use super::http::{AuthUser, json_response};
use super::resources::{self, ResourceType};
use super::{ApiServer, lock};

/// The audience of the API server's own tokens (kubeadm's `--api-audiences`).
pub(crate) const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// The issuer of this server's service account tokens.
pub(crate) const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// The third part of this server's service account tokens (they are not signed).
pub(crate) const TOKEN_SIGNATURE: &[u8] = b"not-a-real-signature";

/// Who a request is from, as `user.Info`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserInfo {
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// `username` in `groups`, plus `system:authenticated`.
    pub fn new(username: &str, groups: &[&str]) -> UserInfo {
        let mut user = UserInfo {
            username: username.to_string(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..UserInfo::default()
        };
        user.add_authenticated();
        user
    }

    /// `system:anonymous` in `system:unauthenticated`.
    pub fn anonymous() -> UserInfo {
        UserInfo {
            username: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
            ..UserInfo::default()
        }
    }

    fn add_authenticated(&mut self) {
        if !self.groups.iter().any(|g| g == "system:authenticated") {
            self.groups.push("system:authenticated".into());
        }
    }

    fn to_json(&self) -> Value {
        let mut user = json!({ "username": self.username, "groups": self.groups });
        if !self.uid.is_empty() {
            user["uid"] = json!(self.uid);
        }
        if !self.extra.is_empty() {
            user["extra"] = json!(self.extra);
        }
        user
    }
}

/// The connection a request arrived on, attached to every request by the listener.
#[derive(Clone)]
pub(crate) struct Connection {
    pub peer: SocketAddr,
    /// Whether the listener is TLS (real authentication) or plain HTTP.
    pub tls: bool,
    /// The client's certificate chain, if it sent one.
    pub peer_certs: Option<Arc<[CertificateDer<'static>]>>,
    /// Verifies client certificates against the server's CA.
    pub verifier: Option<Arc<dyn ClientCertVerifier>>,
}

/// The SubjectAccessReview policy a test sets.
pub(crate) type Policy = dyn Fn(&SubjectAccessReview) -> (bool, String) + Send + Sync;

/// Tokens, the review policy and the reviews answered.
pub(crate) struct AuthState {
    tokens: HashMap<String, UserInfo>,
    policy: Arc<Policy>,
    token_reviews: Vec<TokenReview>,
    access_reviews: Vec<SubjectAccessReview>,
}

impl Default for AuthState {
    fn default() -> Self {
        AuthState {
            tokens: HashMap::new(),
            policy: Arc::new(|_| (true, String::new())),
            token_reviews: Vec::new(),
            access_reviews: Vec::new(),
        }
    }
}

impl ApiServer {
    /// Adds a static token (like a `--token-auth-file` line): requests with
    /// `Authorization: Bearer <token>` are `user` in `groups` (plus
    /// `system:authenticated`), and TokenReview answers so for it.
    pub fn add_token(&self, token: &str, user: &str, groups: &[&str]) {
        lock(&self.inner.auth)
            .tokens
            .insert(token.to_string(), UserInfo::new(user, groups));
    }

    /// Creates the bootstrap token `<id>.<secret>` as `kubeadm token create` does:
    /// the Secret `kube-system/bootstrap-token-<id>` of type
    /// `bootstrap.kubernetes.io/token`, usable for authentication and signing, with
    /// the extra group `system:bootstrappers:kubeadm:default-node-token`. It then
    /// authenticates as `system:bootstrap:<id>` in `system:bootstrappers` and that group.
    pub fn add_bootstrap_token(&self, token: &str) -> anyhow::Result<()> {
        let (id, secret) = split_bootstrap_token(token).ok_or_else(|| {
            anyhow::anyhow!("{token:?} is not a bootstrap token ([a-z0-9]{{6}}.[a-z0-9]{{16}})")
        })?;
        let data = |s: &str| json!(b64::encode(s.as_bytes()));
        let secret_obj = json!({
            "metadata": { "name": format!("bootstrap-token-{id}"), "namespace": "kube-system" },
            "type": "bootstrap.kubernetes.io/token",
            "data": {
                "token-id": data(id),
                "token-secret": data(secret),
                "usage-bootstrap-authentication": data("true"),
                "usage-bootstrap-signing": data("true"),
                "auth-extra-groups": data("system:bootstrappers:kubeadm:default-node-token"),
            },
        });
        let secrets = resources::find("", "v1", "secrets")
            .ok_or_else(|| anyhow::anyhow!("secrets are served"))?;
        lock(&self.inner.store).create(secrets, "kube-system", secret_obj)?;
        Ok(())
    }

    /// Sets how SubjectAccessReviews are answered: `(allowed, reason)` for each
    /// review (default: everything allowed, no reason).
    pub fn set_access_policy(
        &self,
        policy: impl Fn(&SubjectAccessReview) -> (bool, String) + Send + Sync + 'static,
    ) {
        lock(&self.inner.auth).policy = Arc::new(policy);
    }

    /// Every TokenReview answered, as answered (spec as sent, status filled).
    pub fn token_reviews(&self) -> Vec<TokenReview> {
        lock(&self.inner.auth).token_reviews.clone()
    }

    /// Every SubjectAccessReview answered, as answered.
    pub fn access_reviews(&self) -> Vec<SubjectAccessReview> {
        lock(&self.inner.auth).access_reviews.clone()
    }
}

/// The user a request is from, or 401.
pub(crate) fn authenticate(
    server: &ApiServer,
    req: &axum::extract::Request,
) -> Result<UserInfo, ApiError> {
    if let Some(AuthUser(user)) = req.extensions().get::<AuthUser>() {
        return Ok(UserInfo::new(user, &[]));
    }
    let token = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|token| !token.is_empty());
    let connection = req.extensions().get::<Connection>();
    if !connection.is_some_and(|c| c.tls) {
        // Plain HTTP and the in-process router: known tokens, else the token is the user.
        return Ok(match token {
            None => UserInfo::anonymous(),
            Some(token) => match authenticate_token(server, token, &[]) {
                TokenResult::Authenticated(user, _) => user,
                TokenResult::Unknown | TokenResult::Failed(_) => UserInfo::new(token, &[]),
            },
        });
    }
    let mut failed = false;
    if let Some(connection) = connection
        && let Some(certs) = &connection.peer_certs
    {
        match authenticate_cert(connection, certs) {
            Ok(Some(user)) => return Ok(user),
            Ok(None) => {}
            Err(err) => {
                tracing::debug!("test apiserver: client certificate refused: {err}");
                failed = true;
            }
        }
    }
    if let Some(token) = token {
        match authenticate_token(server, token, &[]) {
            TokenResult::Authenticated(user, _) => return Ok(user),
            TokenResult::Unknown | TokenResult::Failed(_) => failed = true,
        }
    }
    if failed {
        Err(ApiError::unauthorized())
    } else {
        Ok(UserInfo::anonymous())
    }
}

/// The x509 authenticator: a chain to the server's CA, valid now, for client auth.
/// `None` for a certificate without a common name (it authenticates nobody).
fn authenticate_cert(
    connection: &Connection,
    certs: &[CertificateDer<'static>],
) -> Result<Option<UserInfo>, String> {
    let (leaf, intermediates) = certs.split_first().ok_or("no certificate")?;
    let verifier = connection.verifier.as_ref().ok_or("no client CA")?;
    verifier
        .verify_client_cert(leaf, intermediates, UnixTime::now())
        .map_err(|e| format!("x509: {e}"))?;
    let (_, cert) = X509Certificate::from_der(leaf).map_err(|e| e.to_string())?;
    let text = |a: &x509_parser::x509::AttributeTypeAndValue<'_>| {
        a.as_str().map(str::to_string).unwrap_or_default()
    };
    let cn = cert
        .subject()
        .iter_common_name()
        .next()
        .map(text)
        .unwrap_or_default();
    if cn.is_empty() {
        return Ok(None);
    }
    let groups: Vec<String> = cert.subject().iter_organization().map(text).collect();
    let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
    Ok(Some(UserInfo::new(&cn, &groups)))
}

/// What the token authenticators made of a token.
pub(crate) enum TokenResult {
    /// The user, and the audiences the token is good for.
    Authenticated(UserInfo, Vec<String>),
    /// No authenticator knows the token.
    Unknown,
    /// An authenticator recognised the token and refused it.
    Failed(String),
}

/// The token authenticators: static tokens, bootstrap tokens, service account
/// tokens. `audiences` empty means the API server's own audience.
pub(crate) fn authenticate_token(
    server: &ApiServer,
    token: &str,
    audiences: &[String],
) -> TokenResult {
    let wanted: Vec<String> = if audiences.is_empty() {
        vec![API_AUDIENCE.to_string()]
    } else {
        audiences.to_vec()
    };
    // Static and bootstrap tokens know no audience: they serve the API's own.
    let implicit = || -> Option<Vec<String>> {
        wanted
            .iter()
            .any(|a| a == API_AUDIENCE)
            .then(|| vec![API_AUDIENCE.to_string()])
    };
    let known = lock(&server.inner.auth).tokens.get(token).cloned();
    if let Some(user) = known {
        return match implicit() {
            Some(auds) => TokenResult::Authenticated(user, auds),
            None => TokenResult::Unknown,
        };
    }
    if let Some((id, secret)) = split_bootstrap_token(token) {
        match bootstrap_user(server, id, secret) {
            Some(user) => {
                return match implicit() {
                    Some(auds) => TokenResult::Authenticated(user, auds),
                    None => TokenResult::Unknown,
                };
            }
            None => return TokenResult::Unknown,
        }
    }
    service_account_user(server, token, &wanted)
}

/// `<id>.<secret>` with `[a-z0-9]{6}` and `[a-z0-9]{16}`.
fn split_bootstrap_token(token: &str) -> Option<(&str, &str)> {
    let (id, secret) = token.split_once('.')?;
    let ok = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    (ok(id, 6) && ok(secret, 16)).then_some((id, secret))
}

/// The bootstrap token authenticator: the Secret `kube-system/bootstrap-token-<id>`.
fn bootstrap_user(server: &ApiServer, id: &str, secret: &str) -> Option<UserInfo> {
    let secrets = resources::find("", "v1", "secrets")?;
    let obj = lock(&server.inner.store)
        .get(secrets, "kube-system", &format!("bootstrap-token-{id}"))
        .ok()?;
    if obj.get("type").and_then(Value::as_str) != Some("bootstrap.kubernetes.io/token") {
        return None;
    }
    let field = |key: &str| -> Option<String> {
        if let Some(text) = obj
            .pointer(&format!("/stringData/{key}"))
            .and_then(Value::as_str)
        {
            return Some(text.to_string());
        }
        let encoded = obj
            .pointer(&format!("/data/{key}"))
            .and_then(Value::as_str)?;
        String::from_utf8(b64::decode(encoded)?).ok()
    };
    if field("token-secret")? != secret || field("usage-bootstrap-authentication")? != "true" {
        return None;
    }
    if let Some(expiration) = field("expiration") {
        let at: Timestamp = expiration.parse().ok()?;
        if at <= Timestamp::now() {
            return None;
        }
    }
    let mut groups = vec!["system:bootstrappers".to_string()];
    if let Some(extra) = field("auth-extra-groups") {
        for group in extra.split(',').map(str::trim).filter(|g| !g.is_empty()) {
            if !group.starts_with("system:bootstrappers:") {
                return None;
            }
            groups.push(group.to_string());
        }
    }
    let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
    Some(UserInfo::new(&format!("system:bootstrap:{id}"), &groups))
}

/// The service account token authenticator, for the tokens `serviceaccounts/token`
/// issues: issuer, expiry, audience, and the account (and bound pod) still there.
fn service_account_user(server: &ApiServer, token: &str, wanted: &[String]) -> TokenResult {
    let parts: Vec<&str> = token.split('.').collect();
    let [_, payload, signature] = parts.as_slice() else {
        return TokenResult::Unknown;
    };
    let Some(claims) = b64::decode(payload).and_then(|p| serde_json::from_slice::<Value>(&p).ok())
    else {
        return TokenResult::Unknown;
    };
    if claims.get("iss").and_then(Value::as_str) != Some(ISSUER) {
        return TokenResult::Unknown;
    }
    if b64::decode(signature).as_deref() != Some(TOKEN_SIGNATURE) {
        return TokenResult::Failed("square/go-jose: error in cryptographic primitive".into());
    }
    let now = Timestamp::now().as_second();
    if claims
        .get("exp")
        .and_then(Value::as_i64)
        .is_none_or(|exp| exp <= now)
    {
        return TokenResult::Failed("service account token has expired".into());
    }
    let token_auds: Vec<String> = match claims.get("aud") {
        Some(Value::String(a)) => vec![a.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        _ => Vec::new(),
    };
    let auds: Vec<String> = wanted
        .iter()
        .filter(|a| token_auds.contains(a))
        .cloned()
        .collect();
    if auds.is_empty() {
        return TokenResult::Failed("token audiences is invalid for the target audiences".into());
    }
    let bound = claims.get("kubernetes.io").cloned().unwrap_or(Value::Null);
    let text = |ptr: &str| {
        bound
            .pointer(ptr)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let (namespace, name, uid) = (
        text("/namespace"),
        text("/serviceaccount/name"),
        text("/serviceaccount/uid"),
    );
    let store = lock(&server.inner.store);
    let account = store.get(resources::service_accounts(), &namespace, &name);
    match account {
        Ok(account) if super::store::meta_str(&account, "uid") == uid => {}
        Ok(_) => {
            return TokenResult::Failed(format!(
                "service account UID ({uid}) does not match claim"
            ));
        }
        Err(_) => {
            return TokenResult::Failed(format!("serviceaccounts {name:?} not found"));
        }
    }
    let mut user = UserInfo::new(
        &format!("system:serviceaccount:{namespace}:{name}"),
        &[
            "system:serviceaccounts",
            &format!("system:serviceaccounts:{namespace}"),
        ],
    );
    user.uid = uid;
    if let Some(jti) = claims.get("jti").and_then(Value::as_str) {
        user.extra.insert(
            "authentication.kubernetes.io/credential-id".into(),
            vec![format!("JTI={jti}")],
        );
    }
    let (pod, pod_uid) = (text("/pod/name"), text("/pod/uid"));
    if !pod.is_empty() {
        let pods = resources::find("", "v1", "pods");
        let found = pods.and_then(|p| store.get(p, &namespace, &pod).ok());
        match found {
            Some(obj) if super::store::meta_str(&obj, "uid") == pod_uid => {}
            _ => return TokenResult::Failed(format!("pods {pod:?} not found")),
        }
        user.extra
            .insert("authentication.kubernetes.io/pod-name".into(), vec![pod]);
        user.extra
            .insert("authentication.kubernetes.io/pod-uid".into(), vec![pod_uid]);
    }
    TokenResult::Authenticated(user, auds)
}

/// `POST tokenreviews`: the token authenticators' answer, recorded.
pub(crate) fn token_review(server: &ApiServer, mut review: Value) -> Result<Response, ApiError> {
    if !review.is_object() {
        return Err(ApiError::bad_request("a TokenReview must be a JSON object"));
    }
    let token = review
        .pointer("/spec/token")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if token.is_empty() {
        return Err(ApiError::bad_request(
            "token is required for TokenReview in authentication",
        ));
    }
    let audiences: Vec<String> = review
        .pointer("/spec/audiences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let status = match authenticate_token(server, &token, &audiences) {
        TokenResult::Authenticated(user, auds) => json!({
            "authenticated": true,
            "user": user.to_json(),
            "audiences": auds,
        }),
        TokenResult::Unknown => json!({ "user": {}, "error": "invalid bearer token" }),
        TokenResult::Failed(err) => {
            json!({ "user": {}, "error": format!("[invalid bearer token, {err}]") })
        }
    };
    review["kind"] = json!("TokenReview");
    review["apiVersion"] = json!("authentication.k8s.io/v1");
    review["metadata"] = json!({ "creationTimestamp": null });
    review["status"] = status;
    let typed: TokenReview = serde_json::from_value(review.clone())
        .map_err(|e| ApiError::bad_request(format!("decoding the TokenReview: {e}")))?;
    lock(&server.inner.auth).token_reviews.push(typed);
    Ok(json_response(201, review))
}

/// `POST subjectaccessreviews`: the test's policy's answer, recorded.
pub(crate) fn subject_access_review(
    server: &ApiServer,
    res: &ResourceType,
    mut review: Value,
) -> Result<Response, ApiError> {
    if !review.is_object() {
        return Err(ApiError::bad_request(
            "a SubjectAccessReview must be a JSON object",
        ));
    }
    let spec = review.get("spec").cloned().unwrap_or(Value::Null);
    let present = |key: &str| spec.get(key).is_some_and(|v| !v.is_null());
    let mut errors = Vec::new();
    match (
        present("resourceAttributes"),
        present("nonResourceAttributes"),
    ) {
        (true, true) => errors.push(FieldError::invalid(
            "spec.resourceAttributes",
            "\"{...}\"",
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        )),
        (false, false) => errors.push(FieldError::invalid(
            "spec.resourceAttributes",
            "\"null\"",
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        )),
        _ => {}
    }
    let user = spec.get("user").and_then(Value::as_str).unwrap_or("");
    let groups = spec
        .get("groups")
        .and_then(Value::as_array)
        .is_some_and(|g| !g.is_empty());
    if user.is_empty() && !groups {
        errors.push(FieldError::invalid(
            "spec.user",
            "\"\"",
            "at least one of user or group must be specified",
        ));
    }
    if !errors.is_empty() {
        return Err(ApiError::invalid_fields(res.group, res.kind, "", &errors));
    }
    review["kind"] = json!("SubjectAccessReview");
    review["apiVersion"] = json!("authorization.k8s.io/v1");
    review["metadata"] = json!({ "creationTimestamp": null });
    let mut typed: SubjectAccessReview = serde_json::from_value(review.clone())
        .map_err(|e| ApiError::bad_request(format!("decoding the SubjectAccessReview: {e}")))?;
    let policy = lock(&server.inner.auth).policy.clone();
    // The policy is the test's code: it runs without the lock held.
    let (allowed, reason) = policy(&typed);
    let mut status = json!({ "allowed": allowed });
    if !reason.is_empty() {
        status["reason"] = json!(reason);
    }
    review["status"] = status;
    typed.status = serde_json::from_value(review["status"].clone()).ok();
    lock(&server.inner.auth).access_reviews.push(typed);
    Ok(json_response(201, review))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_token_shape() {
        assert_eq!(
            split_bootstrap_token("abcdef.0123456789abcdef"),
            Some(("abcdef", "0123456789abcdef"))
        );
        assert!(split_bootstrap_token("abcdef.0123456789ABCDEF").is_none());
        assert!(split_bootstrap_token("abcde.0123456789abcdef").is_none());
        assert!(split_bootstrap_token("system:node:n1").is_none());
    }

    #[test]
    fn users_are_authenticated() {
        let user = UserInfo::new("u", &["g", "system:authenticated"]);
        assert_eq!(user.groups, ["g", "system:authenticated"]);
        assert_eq!(UserInfo::anonymous().groups, ["system:unauthenticated"]);
    }
}
