//! Authentication of the node API (x509 client certificates, bearer tokens through
//! TokenReview, anonymous), as the kubelet builds it from `KubeletAuthentication`
//! with k8s.io/apiserver's `DelegatingAuthenticatorConfig`.
//!
//! The order is the apiserver's union: a client certificate first (when
//! `clientCAFile` is set), then an `Authorization: Bearer` token, then a token in a
//! WebSocket request's `Sec-WebSocket-Protocol` ([`websocket_token`]) (both when the
//! token webhook is on). The first that names a user wins; every authenticated user gets
//! `system:authenticated`. A request that presented a credential that failed is
//! refused even with anonymous access on: anonymous (`system:anonymous` in
//! `system:unauthenticated`) is only for a request that presented none.
//!
//! Start at [`Authenticator::authenticate`]; [`user_from_certificate`] is the x509
//! conversion, [`KubeTokenReviewer`] the TokenReview call and
//! [`CachingTokenReviewer`] its cache. Tokens are never logged nor kept: the cache
//! is keyed by their SHA-256.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::config::AuthnConfig;
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

/// The user of a request that presented no credentials.
pub const ANONYMOUS_USER: &str = "system:anonymous";
/// The group of [`ANONYMOUS_USER`].
pub const UNAUTHENTICATED_GROUP: &str = "system:unauthenticated";
/// The group every authenticated user is in.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";
/// The `extra` key naming the credential a user authenticated with.
pub const CREDENTIAL_ID_KEY: &str = "authentication.kubernetes.io/credential-id";
/// How many token answers the cache keeps at most (the apiserver's token cache
/// holds 32 stripes of 128).
const TOKEN_CACHE_CAPACITY: usize = 4096;

/// Who a request is from, as `user.Info`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct User {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl User {
    /// `system:anonymous` in `system:unauthenticated`.
    pub fn anonymous() -> User {
        User {
            name: ANONYMOUS_USER.to_owned(),
            groups: vec![UNAUTHENTICATED_GROUP.to_owned()],
            ..User::default()
        }
    }

    /// Adds `system:authenticated`, as the apiserver's `AuthenticatedGroupAdder`: not
    /// to the anonymous user, nor to one already in `system:authenticated` or
    /// `system:unauthenticated`.
    fn with_authenticated_group(mut self) -> User {
        let marked = self
            .groups
            .iter()
            .any(|g| g == AUTHENTICATED_GROUP || g == UNAUTHENTICATED_GROUP);
        if self.name != ANONYMOUS_USER && !marked {
            self.groups.push(AUTHENTICATED_GROUP.to_owned());
        }
        self
    }
}

/// The DER of the end-entity client certificate the TLS handshake presented, already
/// verified against `clientCAFile`. The TLS layer puts it in the request extensions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientCertificate(pub Vec<u8>);

/// A client certificate the handshake presented that does not verify against
/// `clientCAFile`, with why: a credential that fails (401, anonymous or not), as the
/// apiserver's x509 authenticator has it; a valid token on the same request still
/// counts. The TLS layer puts it in the request extensions instead of a
/// [`ClientCertificate`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RejectedCertificate(pub String);

/// Why a client certificate names no user.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CertificateError {
    #[error("the client certificate does not parse: {0}")]
    Parse(String),
    #[error("the client certificate has {0} bytes after its end")]
    TrailingData(usize),
    #[error("the client certificate's subject has a value that is not a string: {0}")]
    Subject(String),
    /// Not an error to the apiserver: the certificate names nobody, and the request
    /// goes on to the next authenticator.
    #[error("the client certificate's subject has no common name")]
    NoCommonName,
}

/// The user a verified client certificate names, as the apiserver's
/// `CommonNameUserConversion`: the subject's CN (the last, as Go's `pkix.Name` keeps
/// it) is the name, each O in order is a group, the credential id is
/// `X509SHA256=<hex SHA-256 of the DER>`, then `system:authenticated`.
pub fn user_from_certificate(der: &[u8]) -> Result<User, CertificateError> {
    let (rest, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| CertificateError::Parse(e.to_string()))?;
    if !rest.is_empty() {
        return Err(CertificateError::TrailingData(rest.len()));
    }
    let subject = cert.subject();
    let mut name = String::new();
    for cn in subject.iter_common_name() {
        name = attribute_string(cn)?;
    }
    if name.is_empty() {
        return Err(CertificateError::NoCommonName);
    }
    let groups = subject
        .iter_organization()
        .map(attribute_string)
        .collect::<Result<Vec<_>, _>>()?;
    let fingerprint = hex::encode(Sha256::digest(der));
    let user = User {
        name,
        uid: String::new(),
        groups,
        extra: BTreeMap::from([(
            CREDENTIAL_ID_KEY.to_owned(),
            vec![format!("X509SHA256={fingerprint}")],
        )]),
    };
    Ok(user.with_authenticated_group())
}

/// A subject attribute's value as Go's x509 parser reads the string types.
fn attribute_string(
    attr: &x509_parser::x509::AttributeTypeAndValue<'_>,
) -> Result<String, CertificateError> {
    use x509_parser::der_parser::asn1_rs::Tag;
    if let Ok(s) = attr.as_str() {
        return Ok(s.to_owned());
    }
    let value = attr.attr_value();
    let data = value.data;
    let bad = || CertificateError::Subject(format!("{:?}", value.header.tag()));
    match value.header.tag() {
        Tag::T61String => String::from_utf8(data.to_vec()).map_err(|_| bad()),
        Tag::BmpString if data.len() % 2 == 0 => {
            let units = data
                .chunks_exact(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]));
            char::decode_utf16(units)
                .collect::<Result<String, _>>()
                .map_err(|_| bad())
        }
        Tag::UniversalString if data.len() % 4 == 0 => data
            .chunks_exact(4)
            .map(|c| char::from_u32(u32::from_be_bytes([c[0], c[1], c[2], c[3]])))
            .collect::<Option<String>>()
            .ok_or_else(bad),
        _ => Err(bad()),
    }
}

/// A review (TokenReview or SubjectAccessReview) that gave no answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReviewError {
    /// The review could not be made: the API server unreachable, an error status.
    #[error("the {kind} request failed: {message}")]
    Request { kind: &'static str, message: String },
    /// The reviewer answered with an error of its own (TokenReview `status.error`).
    #[error("the {kind} answered with an error: {message}")]
    Answer { kind: &'static str, message: String },
}

/// Who a bearer token belongs to.
#[async_trait::async_trait]
pub trait TokenReviewer: Send + Sync {
    /// `Ok(None)` when the token does not authenticate (for these audiences; none
    /// means the API server's own).
    async fn review(&self, token: &str, audiences: &[String]) -> Result<Option<User>, ReviewError>;
}

#[async_trait::async_trait]
impl<T: TokenReviewer + ?Sized> TokenReviewer for Arc<T> {
    async fn review(&self, token: &str, audiences: &[String]) -> Result<Option<User>, ReviewError> {
        (**self).review(token, audiences).await
    }
}

/// The TokenReview the webhook token authenticator creates for `token`.
pub fn token_review(token: &str, audiences: &[String]) -> TokenReview {
    TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.to_owned()),
            audiences: (!audiences.is_empty()).then(|| audiences.to_vec()),
        },
        ..TokenReview::default()
    }
}

/// What a TokenReview's status says, as the webhook token authenticator reads it:
/// with audiences asked for, the answer's must meet them; not authenticated with an
/// `error` is an error (not cached), without one a plain no (cached).
pub fn user_from_token_review(
    status: Option<&TokenReviewStatus>,
    audiences: &[String],
) -> Result<Option<User>, ReviewError> {
    let Some(status) = status else {
        return Ok(None);
    };
    if !audiences.is_empty() {
        let answered = status.audiences.as_deref().unwrap_or_default();
        if !answered.iter().any(|a| audiences.contains(a)) {
            return Ok(None);
        }
    }
    if status.authenticated != Some(true) {
        return match status.error.as_deref() {
            Some(e) if !e.is_empty() => Err(ReviewError::Answer {
                kind: "TokenReview",
                message: e.to_owned(),
            }),
            _ => Ok(None),
        };
    }
    let info = status.user.clone().unwrap_or_default();
    Ok(Some(User {
        name: info.username.unwrap_or_default(),
        uid: info.uid.unwrap_or_default(),
        groups: info.groups.unwrap_or_default(),
        extra: info.extra.unwrap_or_default(),
    }))
}

/// Reviews tokens by creating `authentication.k8s.io/v1` TokenReviews.
#[derive(Clone)]
pub struct KubeTokenReviewer {
    pub client: kube::Client,
}

impl KubeTokenReviewer {
    pub fn new(client: kube::Client) -> KubeTokenReviewer {
        KubeTokenReviewer { client }
    }
}

#[async_trait::async_trait]
impl TokenReviewer for KubeTokenReviewer {
    async fn review(&self, token: &str, audiences: &[String]) -> Result<Option<User>, ReviewError> {
        let api = kube::Api::<TokenReview>::all(self.client.clone());
        let answer = api
            .create(
                &kube::api::PostParams::default(),
                &token_review(token, audiences),
            )
            .await
            .map_err(|e| ReviewError::Request {
                kind: "TokenReview",
                message: e.to_string(),
            })?;
        user_from_token_review(answer.status.as_ref(), audiences)
    }
}

struct TokenEntry {
    expires: Instant,
    user: Option<User>,
}

/// A [`TokenReviewer`] that remembers answers for `authentication.webhook.cacheTTL`,
/// yes and no alike, as the apiserver's token cache does; errors are not kept. A
/// zero TTL keeps nothing. Keyed by the SHA-256 of the audiences and the token.
pub struct CachingTokenReviewer<R> {
    inner: R,
    ttl: Duration,
    cache: Mutex<HashMap<[u8; 32], TokenEntry>>,
}

impl<R: TokenReviewer> CachingTokenReviewer<R> {
    pub fn new(inner: R, ttl: Duration) -> CachingTokenReviewer<R> {
        CachingTokenReviewer {
            inner,
            ttl,
            cache: Mutex::new(HashMap::new()),
        }
    }

    fn key(token: &str, audiences: &[String]) -> [u8; 32] {
        let mut hash = Sha256::new();
        for audience in audiences {
            hash.update((audience.len() as u64).to_be_bytes());
            hash.update(audience.as_bytes());
        }
        hash.update(u64::MAX.to_be_bytes());
        hash.update(token.as_bytes());
        hash.finalize().into()
    }
}

#[async_trait::async_trait]
impl<R: TokenReviewer> TokenReviewer for CachingTokenReviewer<R> {
    async fn review(&self, token: &str, audiences: &[String]) -> Result<Option<User>, ReviewError> {
        if self.ttl.is_zero() {
            return self.inner.review(token, audiences).await;
        }
        let key = Self::key(token, audiences);
        {
            let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(entry) = cache.get(&key).filter(|e| e.expires > Instant::now()) {
                return Ok(entry.user.clone());
            }
        }
        let user = self.inner.review(token, audiences).await?;
        let now = Instant::now();
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if cache.len() >= TOKEN_CACHE_CAPACITY {
            cache.retain(|_, e| e.expires > now);
        }
        if cache.len() >= TOKEN_CACHE_CAPACITY
            && let Some(soonest) = cache.iter().min_by_key(|(_, e)| e.expires).map(|(k, _)| *k)
        {
            cache.remove(&soonest);
        }
        cache.insert(
            key,
            TokenEntry {
                expires: now + self.ttl,
                user: user.clone(),
            },
        );
        Ok(user)
    }
}

/// A configuration the authenticator cannot be built from.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthnSetupError {
    #[error("no authentication method configured")]
    NoMethod,
    #[error("no client provided, cannot use webhook authentication")]
    NoTokenReviewer,
}

/// What authentication made of a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Authn {
    Authenticated(User),
    /// No user: no credentials (and anonymous off), or ones that name nobody. 401.
    Unauthenticated(String),
    /// A credential could not be checked (the TokenReview failed). 401, logged.
    Error(String),
}

/// The credential a request was authenticated with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Credential {
    None,
    Certificate,
    Token,
    /// A token in `Sec-WebSocket-Protocol`; the subprotocols that remain.
    WebSocketToken(String),
}

/// The prefix of the WebSocket subprotocol that carries a bearer token (browsers
/// cannot set `Authorization` on a WebSocket): `base64url.bearer.authorization.k8s.io.<token>`.
pub const WEBSOCKET_TOKEN_PREFIX: &str = "base64url.bearer.authorization.k8s.io.";

/// The token of a WebSocket request's `Sec-WebSocket-Protocol`, as the apiserver's
/// `websocket.ProtocolAuthenticator` reads it: `Ok(None)` for a request that is no
/// WebSocket upgrade or carries no token; otherwise the token and the other
/// subprotocols (what the header must say once the token is accepted, so that it
/// never reaches the runtime).
pub(crate) fn websocket_token(headers: &HeaderMap) -> Result<Option<(String, String)>, String> {
    if !super::is_websocket(headers) {
        return Ok(None);
    }
    let mut token = None;
    let mut others = Vec::new();
    for value in headers.get_all(header::SEC_WEBSOCKET_PROTOCOL) {
        let Ok(value) = value.to_str() else {
            continue;
        };
        for protocol in value.split(',').map(str::trim) {
            let Some(encoded) = protocol.strip_prefix(WEBSOCKET_TOKEN_PREFIX) else {
                others.push(protocol);
                continue;
            };
            if token.is_some() {
                return Err("multiple base64.bearer.authorization tokens specified".into());
            }
            use base64::Engine as _;
            let decoded = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(encoded)
                .map_err(|_| "invalid base64.bearer.authorization token encoding".to_owned())?;
            token = Some(
                String::from_utf8(decoded)
                    .map_err(|_| "invalid base64.bearer.authorization token".to_owned())?,
            );
        }
    }
    match token {
        Some(t) if !t.is_empty() && others.is_empty() => {
            Err("missing additional subprotocol".into())
        }
        Some(t) if !t.is_empty() => Ok(Some((t, others.join(",")))),
        _ => Ok(None),
    }
}

/// What the `Authorization` header holds, as the apiserver's bearer token
/// authenticator reads it.
#[derive(Debug, PartialEq, Eq)]
enum Bearer<'a> {
    /// No header, another scheme, or an empty token: no credentials.
    Absent,
    Token(&'a str),
    /// A bearer token that is not text: presented, and not valid.
    Invalid,
}

fn bearer_token(headers: &HeaderMap) -> Bearer<'_> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Bearer::Absent;
    };
    let value = value.as_bytes().trim_ascii();
    let mut parts = value.splitn(3, |b| *b == b' ');
    let (Some(scheme), Some(token)) = (parts.next(), parts.next()) else {
        return Bearer::Absent;
    };
    if !scheme.eq_ignore_ascii_case(b"bearer") || token.is_empty() {
        return Bearer::Absent;
    }
    match std::str::from_utf8(token) {
        Ok(token) => Bearer::Token(token),
        Err(_) => Bearer::Invalid,
    }
}

/// Authenticates node API requests (see the module doc).
pub struct Authenticator {
    anonymous: bool,
    x509: bool,
    tokens: Option<Arc<dyn TokenReviewer>>,
}

impl Authenticator {
    /// `reviewer` is the uncached TokenReview client, needed with the webhook on; the
    /// authenticator caches its answers for the configured TTL.
    pub fn new(
        config: AuthnConfig,
        reviewer: Option<Arc<dyn TokenReviewer>>,
    ) -> Result<Authenticator, AuthnSetupError> {
        let tokens: Option<Arc<dyn TokenReviewer>> = match (config.webhook, reviewer) {
            (None, _) => None,
            (Some(_), None) => return Err(AuthnSetupError::NoTokenReviewer),
            (Some(ttl), Some(reviewer)) => Some(Arc::new(CachingTokenReviewer::new(reviewer, ttl))),
        };
        if !config.anonymous && !config.x509 && tokens.is_none() {
            return Err(AuthnSetupError::NoMethod);
        }
        Ok(Authenticator {
            anonymous: config.anonymous,
            x509: config.x509,
            tokens,
        })
    }

    /// Who the request is from.
    pub async fn authenticate(&self, parts: &Parts) -> Authn {
        self.authenticate_request(parts).await.0
    }

    /// [`Self::authenticate`], and the credential that named the user.
    pub(crate) async fn authenticate_request(&self, parts: &Parts) -> (Authn, Credential) {
        let mut failures: Vec<String> = Vec::new();
        let mut errors: Vec<String> = Vec::new();
        if self.x509
            && let Some(ClientCertificate(der)) = parts.extensions.get::<ClientCertificate>()
        {
            match user_from_certificate(der) {
                Ok(user) => return (Authn::Authenticated(user), Credential::Certificate),
                Err(CertificateError::NoCommonName) => {}
                Err(e) => failures.push(e.to_string()),
            }
        }
        if self.x509
            && let Some(RejectedCertificate(why)) = parts.extensions.get::<RejectedCertificate>()
        {
            failures.push(format!("verifying certificate failed: {why}"));
        }
        if let Some(tokens) = &self.tokens {
            match bearer_token(&parts.headers) {
                Bearer::Absent => {}
                Bearer::Invalid => failures.push("invalid bearer token".to_owned()),
                Bearer::Token(token) => match tokens.review(token, &[]).await {
                    Ok(Some(user)) => {
                        let user = user.with_authenticated_group();
                        return (Authn::Authenticated(user), Credential::Token);
                    }
                    Ok(None) => failures.push("invalid bearer token".to_owned()),
                    Err(e) => errors.push(e.to_string()),
                },
            }
            match websocket_token(&parts.headers) {
                Ok(None) => {}
                Err(why) => failures.push(why),
                Ok(Some((token, others))) => match tokens.review(&token, &[]).await {
                    Ok(Some(user)) => {
                        let user = user.with_authenticated_group();
                        return (
                            Authn::Authenticated(user),
                            Credential::WebSocketToken(others),
                        );
                    }
                    Ok(None) => failures.push("invalid bearer token".to_owned()),
                    Err(e) => errors.push(e.to_string()),
                },
            }
        }
        if !errors.is_empty() {
            errors.extend(failures);
            return (Authn::Error(errors.join(", ")), Credential::None);
        }
        if !failures.is_empty() {
            return (
                Authn::Unauthenticated(failures.join(", ")),
                Credential::None,
            );
        }
        if self.anonymous {
            return (Authn::Authenticated(User::anonymous()), Credential::None);
        }
        (
            Authn::Unauthenticated("no credentials".to_owned()),
            Credential::None,
        )
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::DEFAULT_TOKEN_CACHE_TTL;
    use axum::http::Request;
    use k8s_openapi::api::authentication::v1::UserInfo;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A certificate with `cn` and these organizations, self-signed.
    pub(crate) fn certificate(cn: Option<&str>, orgs: &[&str]) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        if let Some(cn) = cn {
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, cn);
        }
        // rcgen keeps one value per attribute type; the second O goes in under the
        // same OID (2.5.4.10) spelled as a custom type, so the subject has both.
        assert!(orgs.len() <= 2, "at most two organizations");
        for (i, org) in orgs.iter().enumerate() {
            let ty = if i == 0 {
                rcgen::DnType::OrganizationName
            } else {
                rcgen::DnType::CustomDnType(vec![2, 5, 4, 10])
            };
            params.distinguished_name.push(ty, *org);
        }
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn certificate_user_is_cn_with_each_o_as_a_group() {
        let der = certificate(Some("system:node:n1"), &["system:nodes", "team-b"]);
        let user = user_from_certificate(&der).unwrap();
        assert_eq!(user.name, "system:node:n1");
        assert_eq!(user.uid, "");
        assert_eq!(user.groups, ["system:nodes", "team-b", AUTHENTICATED_GROUP]);
        let id = format!("X509SHA256={}", hex::encode(Sha256::digest(&der)));
        assert_eq!(
            user.extra,
            BTreeMap::from([(CREDENTIAL_ID_KEY.to_owned(), vec![id])])
        );
    }

    #[test]
    fn certificate_without_cn_names_nobody_and_garbage_does_not_parse() {
        let der = certificate(None, &["system:masters"]);
        assert_eq!(
            user_from_certificate(&der),
            Err(CertificateError::NoCommonName)
        );
        assert!(matches!(
            user_from_certificate(b"not a certificate"),
            Err(CertificateError::Parse(_))
        ));
        let mut long = certificate(Some("a"), &[]);
        long.push(0);
        assert_eq!(
            user_from_certificate(&long),
            Err(CertificateError::TrailingData(1))
        );
    }

    #[test]
    fn authenticated_group_is_added_once_and_never_to_anonymous() {
        let user = User {
            name: "alice".into(),
            groups: vec![AUTHENTICATED_GROUP.into()],
            ..User::default()
        };
        assert_eq!(user.clone().with_authenticated_group(), user);
        assert_eq!(
            User::anonymous().with_authenticated_group(),
            User::anonymous()
        );
        let bob = User {
            name: "bob".into(),
            ..User::default()
        };
        assert_eq!(bob.with_authenticated_group().groups, [AUTHENTICATED_GROUP]);
    }

    #[test]
    fn bearer_header_is_read_as_the_apiserver_reads_it() {
        let read = |value: &[u8]| {
            let mut headers = HeaderMap::new();
            headers.insert(
                header::AUTHORIZATION,
                header::HeaderValue::from_bytes(value).unwrap(),
            );
            match bearer_token(&headers) {
                Bearer::Token(t) => Some(Ok(t.to_owned())),
                Bearer::Absent => None,
                Bearer::Invalid => Some(Err(())),
            }
        };
        assert_eq!(read(b"Bearer abc"), Some(Ok("abc".into())));
        assert_eq!(read(b"bEaReR abc"), Some(Ok("abc".into())));
        assert_eq!(read(b"  Bearer abc  "), Some(Ok("abc".into())));
        assert_eq!(read(b"Bearer abc def"), Some(Ok("abc".into())));
        assert_eq!(read(b"Bearer"), None);
        assert_eq!(
            read(b"Bearer  abc"),
            None,
            "an empty token after two spaces"
        );
        assert_eq!(read(b"Basic dXNlcjpwYXNz"), None);
        assert_eq!(read(b"Bearer \xff\xfe"), Some(Err(())));
        assert!(matches!(bearer_token(&HeaderMap::new()), Bearer::Absent));
    }

    #[test]
    fn token_review_status_is_read_as_the_webhook_authenticator_reads_it() {
        let ok = TokenReviewStatus {
            authenticated: Some(true),
            user: Some(UserInfo {
                username: Some("system:serviceaccount:ns:sa".into()),
                uid: Some("u-1".into()),
                groups: Some(vec!["system:serviceaccounts".into()]),
                extra: Some(BTreeMap::from([("k".into(), vec!["v".into()])])),
            }),
            ..Default::default()
        };
        let user = user_from_token_review(Some(&ok), &[]).unwrap().unwrap();
        assert_eq!(user.name, "system:serviceaccount:ns:sa");
        assert_eq!(user.uid, "u-1");
        assert_eq!(user.groups, ["system:serviceaccounts"]);
        assert_eq!(user.extra["k"], ["v"]);

        let no = TokenReviewStatus {
            authenticated: Some(false),
            ..Default::default()
        };
        assert_eq!(user_from_token_review(Some(&no), &[]), Ok(None));
        assert_eq!(user_from_token_review(None, &[]), Ok(None));
        let erred = TokenReviewStatus {
            authenticated: Some(false),
            error: Some("token expired".into()),
            ..Default::default()
        };
        assert!(matches!(
            user_from_token_review(Some(&erred), &[]),
            Err(ReviewError::Answer { .. })
        ));

        let wanted = vec!["api".to_owned()];
        assert_eq!(user_from_token_review(Some(&ok), &wanted), Ok(None));
        let for_api = TokenReviewStatus {
            audiences: Some(vec!["other".into(), "api".into()]),
            ..ok.clone()
        };
        assert!(
            user_from_token_review(Some(&for_api), &wanted)
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn token_review_carries_the_token_and_audiences() {
        let review = token_review("t0k", &[]);
        assert_eq!(review.spec.token.as_deref(), Some("t0k"));
        assert_eq!(review.spec.audiences, None);
        let review = token_review("t0k", &["a".to_owned()]);
        assert_eq!(review.spec.audiences, Some(vec!["a".to_owned()]));
    }

    /// What a fake API server saw: method, path and query, body.
    pub(crate) type Seen = Arc<Mutex<Vec<(String, String, serde_json::Value)>>>;

    /// A kube client whose API server answers every POST by echoing the object with
    /// `status` set, and records what it was sent.
    pub(crate) fn fake_api(status: serde_json::Value) -> (kube::Client, Seen) {
        use http_body_util::BodyExt;
        let seen: Seen = Arc::default();
        let log = seen.clone();
        let service = tower::service_fn(move |req: Request<kube::client::Body>| {
            let log = log.clone();
            let status = status.clone();
            async move {
                let (parts, body) = req.into_parts();
                let bytes = body.collect().await?.to_bytes();
                let mut object: serde_json::Value = serde_json::from_slice(&bytes)?;
                log.lock().unwrap().push((
                    parts.method.to_string(),
                    parts.uri.to_string(),
                    object.clone(),
                ));
                object["status"] = status;
                let resp = axum::http::Response::builder()
                    .status(201)
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(axum::body::Body::from(object.to_string()))?;
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(resp)
            }
        });
        (kube::Client::new(service, "default"), seen)
    }

    #[tokio::test]
    async fn kube_token_reviewer_creates_a_token_review() {
        let (client, seen) = fake_api(serde_json::json!({
            "authenticated": true,
            "user": {"username": "alice", "uid": "u-1", "groups": ["dev"]},
        }));
        let reviewer = KubeTokenReviewer::new(client);
        let user = reviewer.review("s3cret", &[]).await.unwrap().unwrap();
        assert_eq!(
            user,
            User {
                name: "alice".into(),
                uid: "u-1".into(),
                groups: vec!["dev".into()],
                extra: BTreeMap::new(),
            }
        );
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 1);
        let (method, uri, body) = &seen[0];
        assert_eq!(method, "POST");
        assert_eq!(
            uri.trim_end_matches('?'),
            "/apis/authentication.k8s.io/v1/tokenreviews"
        );
        assert_eq!(body["apiVersion"], "authentication.k8s.io/v1");
        assert_eq!(body["kind"], "TokenReview");
        assert_eq!(body["spec"], serde_json::json!({"token": "s3cret"}));

        let (client, _) = fake_api(serde_json::json!({"authenticated": false}));
        let no = KubeTokenReviewer::new(client).review("x", &[]).await;
        assert_eq!(no, Ok(None));
    }

    /// Answers from a table; counts the calls; `fail` makes every call an error.
    #[derive(Default)]
    pub(crate) struct FakeTokens {
        pub users: HashMap<String, User>,
        pub calls: AtomicUsize,
        pub fail: std::sync::atomic::AtomicBool,
    }

    #[async_trait::async_trait]
    impl TokenReviewer for FakeTokens {
        async fn review(&self, token: &str, _: &[String]) -> Result<Option<User>, ReviewError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.fail.load(Ordering::SeqCst) {
                return Err(ReviewError::Request {
                    kind: "TokenReview",
                    message: "connection refused".into(),
                });
            }
            Ok(self.users.get(token).cloned())
        }
    }

    fn fake(tokens: &[(&str, &str)]) -> Arc<FakeTokens> {
        Arc::new(FakeTokens {
            users: tokens
                .iter()
                .map(|(t, name)| {
                    let user = User {
                        name: (*name).to_owned(),
                        ..User::default()
                    };
                    ((*t).to_owned(), user)
                })
                .collect(),
            ..FakeTokens::default()
        })
    }

    #[tokio::test(start_paused = true)]
    async fn token_answers_are_cached_for_the_ttl_yes_and_no() {
        let inner = fake(&[("good", "alice")]);
        let cached = CachingTokenReviewer::new(inner.clone(), Duration::from_secs(120));
        let calls = || inner.calls.load(Ordering::SeqCst);

        assert_eq!(
            cached.review("good", &[]).await.unwrap().unwrap().name,
            "alice"
        );
        assert_eq!(cached.review("bad", &[]).await.unwrap(), None);
        assert_eq!(calls(), 2);
        tokio::time::advance(Duration::from_secs(119)).await;
        assert!(cached.review("good", &[]).await.unwrap().is_some());
        assert_eq!(cached.review("bad", &[]).await.unwrap(), None);
        assert_eq!(
            calls(),
            2,
            "both answers came from the cache within the TTL"
        );

        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(cached.review("good", &[]).await.unwrap().is_some());
        assert_eq!(cached.review("bad", &[]).await.unwrap(), None);
        assert_eq!(calls(), 4, "both asked again once the TTL passed");

        // Other audiences are another question.
        cached.review("good", &["x".to_owned()]).await.unwrap();
        assert_eq!(calls(), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn token_errors_are_not_cached_and_zero_ttl_caches_nothing() {
        let inner = fake(&[("good", "alice")]);
        let cached = CachingTokenReviewer::new(inner.clone(), Duration::from_secs(120));
        inner.fail.store(true, Ordering::SeqCst);
        assert!(cached.review("good", &[]).await.is_err());
        inner.fail.store(false, Ordering::SeqCst);
        assert!(cached.review("good", &[]).await.unwrap().is_some());
        assert_eq!(inner.calls.load(Ordering::SeqCst), 2);

        let uncached = CachingTokenReviewer::new(inner.clone(), Duration::ZERO);
        uncached.review("good", &[]).await.unwrap();
        uncached.review("good", &[]).await.unwrap();
        assert_eq!(inner.calls.load(Ordering::SeqCst), 4);
    }

    #[test]
    fn cache_keys_are_hashes_not_tokens() {
        let a = CachingTokenReviewer::<Arc<FakeTokens>>::key("secret", &[]);
        assert_eq!(
            a.to_vec(),
            Sha256::digest([&u64::MAX.to_be_bytes()[..], b"secret"].concat()).to_vec()
        );
        assert_ne!(
            a,
            CachingTokenReviewer::<Arc<FakeTokens>>::key("secret", &["x".into()])
        );
    }

    fn parts(build: impl FnOnce(&mut Request<()>)) -> Parts {
        let mut req = Request::new(());
        build(&mut req);
        req.into_parts().0
    }

    fn with_token(token: &str) -> Parts {
        parts(|r| {
            r.headers_mut().insert(
                header::AUTHORIZATION,
                format!("Bearer {token}").parse().unwrap(),
            );
        })
    }

    fn with_cert(der: Vec<u8>) -> Parts {
        parts(|r| {
            r.extensions_mut().insert(ClientCertificate(der));
        })
    }

    fn config(anonymous: bool) -> AuthnConfig {
        AuthnConfig {
            anonymous,
            x509: true,
            webhook: Some(DEFAULT_TOKEN_CACHE_TTL),
        }
    }

    #[tokio::test]
    async fn anonymous_only_without_credentials() {
        let tokens = fake(&[("good", "alice")]);
        let on = Authenticator::new(config(true), Some(tokens.clone())).unwrap();
        let off = Authenticator::new(config(false), Some(tokens.clone())).unwrap();
        let none = parts(|_| {});

        assert_eq!(
            on.authenticate(&none).await,
            Authn::Authenticated(User::anonymous())
        );
        assert!(matches!(
            off.authenticate(&none).await,
            Authn::Unauthenticated(_)
        ));
        for auth in [&on, &off] {
            assert!(matches!(
                auth.authenticate(&with_token("bad")).await,
                Authn::Unauthenticated(_)
            ));
            assert!(matches!(
                auth.authenticate(&with_cert(b"junk".to_vec())).await,
                Authn::Unauthenticated(_)
            ));
        }
        // A certificate without a CN names nobody: the request goes on as if it had
        // presented nothing, as the apiserver's CommonNameUserConversion has it.
        let no_cn = with_cert(certificate(None, &["system:masters"]));
        assert_eq!(
            on.authenticate(&no_cn).await,
            Authn::Authenticated(User::anonymous())
        );
    }

    #[tokio::test]
    async fn a_certificate_from_another_ca_is_refused_but_a_token_beside_it_counts() {
        let tokens = fake(&[("good", "alice")]);
        let auth = Authenticator::new(config(true), Some(tokens.clone())).unwrap();
        let rejected = |p: &mut Parts| {
            p.extensions
                .insert(RejectedCertificate("unknown authority".into()));
        };
        let mut only = parts(|_| {});
        rejected(&mut only);
        assert!(
            matches!(auth.authenticate(&only).await, Authn::Unauthenticated(why) if why.contains("unknown authority")),
            "anonymous is not a way around a bad certificate"
        );
        let mut with_good_token = with_token("good");
        rejected(&mut with_good_token);
        assert!(matches!(
            auth.authenticate(&with_good_token).await,
            Authn::Authenticated(u) if u.name == "alice"
        ));
    }

    fn websocket(protocols: &[&str]) -> Parts {
        parts(|r| {
            let h = r.headers_mut();
            h.insert(header::CONNECTION, "Upgrade".parse().unwrap());
            h.insert(header::UPGRADE, "websocket".parse().unwrap());
            for p in protocols {
                h.append(header::SEC_WEBSOCKET_PROTOCOL, p.parse().unwrap());
            }
        })
    }

    #[tokio::test]
    async fn a_websocket_subprotocol_token_is_read_as_the_apiserver_reads_it() {
        use base64::Engine as _;
        let enc = |t: &str| {
            format!(
                "{WEBSOCKET_TOKEN_PREFIX}{}",
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(t)
            )
        };
        let tokens = fake(&[("good", "alice")]);
        let auth = Authenticator::new(config(false), Some(tokens.clone())).unwrap();

        let csv = format!("v5.channel.k8s.io, {}, v4.channel.k8s.io", enc("good"));
        let (authn, via) = auth.authenticate_request(&websocket(&[&csv])).await;
        assert!(matches!(authn, Authn::Authenticated(u) if u.name == "alice"));
        assert_eq!(
            via,
            Credential::WebSocketToken("v5.channel.k8s.io,v4.channel.k8s.io".into())
        );
        // Also across several headers.
        let (_, via) = auth
            .authenticate_request(&websocket(&["v4.channel.k8s.io", &enc("good")]))
            .await;
        assert_eq!(via, Credential::WebSocketToken("v4.channel.k8s.io".into()));

        for (protocols, why) in [
            (
                vec![enc("bad"), "v4.channel.k8s.io".into()],
                "invalid bearer token",
            ),
            (vec![enc("good")], "missing additional subprotocol"),
            (
                vec![enc("good"), enc("good"), "v4.channel.k8s.io".into()],
                "multiple base64.bearer.authorization tokens specified",
            ),
            (
                vec![
                    format!("{WEBSOCKET_TOKEN_PREFIX}***"),
                    "v4.channel.k8s.io".into(),
                ],
                "invalid base64.bearer.authorization token encoding",
            ),
        ] {
            let refs: Vec<&str> = protocols.iter().map(String::as_str).collect();
            assert_eq!(
                auth.authenticate(&websocket(&refs)).await,
                Authn::Unauthenticated(why.into()),
                "{protocols:?}"
            );
        }
        // Not a WebSocket upgrade: the header is not a credential.
        let mut plain = parts(|_| {});
        plain
            .headers
            .insert(header::SEC_WEBSOCKET_PROTOCOL, enc("good").parse().unwrap());
        assert!(matches!(
            auth.authenticate(&plain).await,
            Authn::Unauthenticated(why) if why == "no credentials"
        ));
    }

    #[tokio::test]
    async fn certificate_first_then_token() {
        let tokens = fake(&[("good", "alice")]);
        let auth = Authenticator::new(config(false), Some(tokens.clone())).unwrap();
        let mut both = with_token("good");
        both.extensions
            .insert(ClientCertificate(certificate(Some("bob"), &[])));
        let (authn, via) = auth.authenticate_request(&both).await;
        assert!(matches!(authn, Authn::Authenticated(u) if u.name == "bob"));
        assert_eq!(via, Credential::Certificate);
        assert_eq!(tokens.calls.load(Ordering::SeqCst), 0);

        let (authn, via) = auth.authenticate_request(&with_token("good")).await;
        let Authn::Authenticated(user) = authn else {
            panic!("{authn:?}")
        };
        assert_eq!((user.name.as_str(), via), ("alice", Credential::Token));
        assert_eq!(user.groups, [AUTHENTICATED_GROUP]);

        // A bad certificate does not stop a good token.
        let mut bad_cert = with_token("good");
        bad_cert
            .extensions
            .insert(ClientCertificate(b"junk".to_vec()));
        assert!(
            matches!(auth.authenticate(&bad_cert).await, Authn::Authenticated(u) if u.name == "alice")
        );
    }

    #[tokio::test]
    async fn certificates_are_ignored_without_a_client_ca_and_review_errors_are_errors() {
        let tokens = fake(&[]);
        let auth = Authenticator::new(
            AuthnConfig {
                anonymous: true,
                x509: false,
                webhook: Some(DEFAULT_TOKEN_CACHE_TTL),
            },
            Some(tokens.clone()),
        )
        .unwrap();
        let cert = with_cert(certificate(Some("bob"), &[]));
        assert_eq!(
            auth.authenticate(&cert).await,
            Authn::Authenticated(User::anonymous())
        );

        tokens.fail.store(true, Ordering::SeqCst);
        assert!(matches!(
            auth.authenticate(&with_token("t")).await,
            Authn::Error(_)
        ));
    }

    #[test]
    fn setup_needs_a_method_and_a_reviewer_for_the_webhook() {
        let none = AuthnConfig {
            anonymous: false,
            x509: false,
            webhook: None,
        };
        assert_eq!(
            Authenticator::new(none, None).err(),
            Some(AuthnSetupError::NoMethod)
        );
        assert_eq!(
            Authenticator::new(AuthnConfig::default(), None).err(),
            Some(AuthnSetupError::NoTokenReviewer)
        );
        let anonymous_only = AuthnConfig {
            anonymous: true,
            x509: false,
            webhook: None,
        };
        assert!(Authenticator::new(anonymous_only, None).is_ok());
    }
}
