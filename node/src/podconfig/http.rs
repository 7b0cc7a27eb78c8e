//! The HTTP static pod source: `--manifest-url` / `staticPodURL`.
//!
//! Every `httpCheckFrequency` (the first time at once) the URL is fetched with the
//! configured headers, as the kubelet's `pkg/kubelet/config/http.go` does. The body is
//! one Pod, a `PodList` or a `List` of Pods, YAML or JSON; an empty body is no pods.
//! Each pod gets the static-pod identity and defaults and is validated; one bad pod
//! rejects the whole body. A failed fetch (transport error, timeout, non-200 answer, bad
//! body) is logged once per distinct error and changes nothing: the pods of the last
//! good body keep running. A body identical to the last good one sends nothing.
//!
//! Only `http://` URLs are fetched for now; `https://` ones fail with a clear error.

use std::collections::HashSet;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, LengthLimitError, Limited};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use k8s_openapi::api::core::v1::Pod;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::static_pod::{self, Origin};
use super::{SourceSnapshot, full_name};
use crate::config::ManifestUrl;

/// The source name used in annotations and logs.
pub const SOURCE: &str = crate::pod::HTTP_SOURCE;

/// The time limit of one fetch, redirects and body included (the kubelet's client timeout).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest body accepted (the kubelet's `maxConfigLength`).
pub const MAX_BODY_BYTES: usize = 10 << 20;

/// Redirects followed before giving up (Go's `http.Client` default).
const MAX_REDIRECTS: usize = 10;

/// Headers not forwarded when a redirect leaves the original host (as Go's client does).
const SENSITIVE_HEADERS: [&str; 4] = ["authorization", "www-authenticate", "cookie", "cookie2"];

/// Why a fetch of the manifest URL gave no usable set of pods.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    #[error("manifest URL {url}: https manifest URLs are not supported yet")]
    HttpsUnsupported { url: String },
    #[error("manifest URL {url:?}: not a valid http URL: {reason}")]
    InvalidUrl { url: String, reason: String },
    #[error("manifest URL {url}: header {name:?}: {reason}")]
    InvalidHeader {
        url: String,
        name: String,
        reason: String,
    },
    #[error("manifest URL {url}: request failed: {reason}")]
    Transport { url: String, reason: String },
    #[error("manifest URL {url}: no complete answer within {}s", after.as_secs_f64())]
    Timeout { url: String, after: Duration },
    #[error("manifest URL {url}: the server answered HTTP {status} {reason}")]
    Status {
        url: String,
        status: u16,
        reason: String,
    },
    #[error("manifest URL {url}: the body is larger than {limit} bytes")]
    TooLarge { url: String, limit: usize },
    #[error("manifest URL {url}: {message}")]
    Manifest { url: String, message: String },
}

/// What one request sends: the parsed URL and headers.
#[derive(Clone, Debug)]
struct Target {
    uri: Uri,
    headers: HeaderMap,
}

/// Polls the manifest URL, remembering the last good body.
pub struct HttpSource {
    url: String,
    node_name: String,
    check_frequency: Duration,
    timeout: Duration,
    /// The URL and headers, or why they cannot be used (reported on every fetch).
    target: Result<Target, FetchError>,
    client: Client<HttpConnector, Empty<Bytes>>,
    /// Digest of the last body that gave a good set of pods.
    good: Option<[u8; 32]>,
}

impl HttpSource {
    pub fn new(config: ManifestUrl, node_name: impl Into<String>) -> Self {
        let ManifestUrl {
            url,
            headers,
            check_frequency,
        } = config;
        let target = prepare(&url, &headers);
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(REQUEST_TIMEOUT));
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .build(connector);
        HttpSource {
            url,
            node_name: node_name.into(),
            check_frequency,
            timeout: REQUEST_TIMEOUT,
            target,
            client,
            good: None,
        }
    }

    /// Replaces the per-fetch time limit (default [`REQUEST_TIMEOUT`]).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The configured URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Fetches the URL once. `Ok(Some(pods))` is a new set to send (always so after the
    /// first good fetch, even when empty); `Ok(None)` means the body is the same as the
    /// last good one; an error leaves the last good set in force.
    pub async fn fetch_once(&mut self) -> Result<Option<Vec<Pod>>, FetchError> {
        let body = match tokio::time::timeout(self.timeout, self.get()).await {
            Ok(body) => body?,
            Err(_) => {
                return Err(FetchError::Timeout {
                    url: self.url.clone(),
                    after: self.timeout,
                });
            }
        };
        let digest: [u8; 32] = Sha256::digest(&body).into();
        if self.good == Some(digest) {
            return Ok(None);
        }
        let pods = if body.iter().all(u8::is_ascii_whitespace) {
            Vec::new()
        } else {
            self.load(&body)?
        };
        self.good = Some(digest);
        Ok(Some(pods))
    }

    /// Decodes a body into defaulted, validated pods, or names the first bad one.
    fn load(&self, body: &[u8]) -> Result<Vec<Pod>, FetchError> {
        let manifest = |message: String| FetchError::Manifest {
            url: self.url.clone(),
            message,
        };
        let mut pods = static_pod::decode_pods(body).map_err(manifest)?;
        let count = pods.len();
        let mut names = HashSet::new();
        for (i, pod) in pods.iter_mut().enumerate() {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let label = if count == 1 {
                format!("pod {name:?}")
            } else {
                format!("items[{i}] (pod {name:?})")
            };
            static_pod::apply_defaults(pod, Origin::Url(&self.url), &self.node_name);
            static_pod::validate(pod).map_err(|e| manifest(format!("{label}: {e}")))?;
            if !names.insert(full_name(pod)) {
                return Err(manifest(format!(
                    "{label}: another pod in the manifest has the same namespace and name"
                )));
            }
        }
        Ok(pods)
    }

    /// GETs the URL, following redirects, and returns the body of a 200 answer.
    async fn get(&self) -> Result<Bytes, FetchError> {
        let Target {
            mut uri,
            mut headers,
        } = self.target.clone()?;
        let mut url = self.url.clone();
        for _ in 0..=MAX_REDIRECTS {
            if uri.scheme_str() == Some("https") {
                return Err(FetchError::HttpsUnsupported { url });
            }
            let mut request = Request::get(uri.clone()).body(Empty::new()).map_err(|e| {
                FetchError::InvalidUrl {
                    url: url.clone(),
                    reason: e.to_string(),
                }
            })?;
            *request.headers_mut() = headers.clone();
            let response =
                self.client
                    .request(request)
                    .await
                    .map_err(|e| FetchError::Transport {
                        url: url.clone(),
                        reason: chain(&e),
                    })?;
            let status = response.status();
            let location = response.headers().get(header::LOCATION);
            if is_redirect(status)
                && let Some(location) = location
            {
                let next = location
                    .to_str()
                    .map_err(|e| e.to_string())
                    .and_then(|l| resolve(&uri, l))
                    .map_err(|reason| FetchError::Transport {
                        url: url.clone(),
                        reason: format!("bad redirect (HTTP {status}): {reason}"),
                    })?;
                if !same_site(&uri, &next) {
                    for name in SENSITIVE_HEADERS {
                        headers.remove(name);
                    }
                }
                url = next.to_string();
                uri = next;
                continue;
            }
            if status != StatusCode::OK {
                return Err(FetchError::Status {
                    url,
                    status: status.as_u16(),
                    reason: status.canonical_reason().unwrap_or("").to_owned(),
                });
            }
            return match Limited::new(response.into_body(), MAX_BODY_BYTES)
                .collect()
                .await
            {
                Ok(body) => Ok(body.to_bytes()),
                Err(e) if e.is::<LengthLimitError>() => Err(FetchError::TooLarge {
                    url,
                    limit: MAX_BODY_BYTES,
                }),
                Err(e) => Err(FetchError::Transport {
                    url,
                    reason: format!("reading the body: {}", chain(&*e)),
                }),
            };
        }
        Err(FetchError::Transport {
            url: self.url.clone(),
            reason: format!("stopped after {MAX_REDIRECTS} redirects (last to {url})"),
        })
    }

    /// Runs the source until cancelled: fetches at once and then every
    /// `check_frequency`, sending a snapshot whenever the set of pods changes.
    pub async fn run(mut self, tx: mpsc::Sender<SourceSnapshot>, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(self.check_frequency.max(Duration::from_millis(1)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The error being reported, so that a lasting problem is logged once.
        let mut failing: Option<FetchError> = None;
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            let result = tokio::select! {
                () = cancel.cancelled() => return,
                result = self.fetch_once() => result,
            };
            match result {
                Ok(pods) => {
                    if let Some(e) = failing.take() {
                        tracing::info!(url = %self.url, "manifest URL read again after: {e}");
                    }
                    let Some(pods) = pods else { continue };
                    tracing::debug!(url = %self.url, pods = pods.len(), "manifest URL changed");
                    let snapshot = SourceSnapshot {
                        source: SOURCE.into(),
                        pods,
                    };
                    tokio::select! {
                        () = cancel.cancelled() => return,
                        sent = tx.send(snapshot) => {
                            if sent.is_err() {
                                return;
                            }
                        }
                    }
                }
                Err(e) => {
                    if failing.as_ref() != Some(&e) {
                        let kept = if self.good.is_some() {
                            "the pods from its last good answer keep running"
                        } else {
                            "no pods from it until it answers"
                        };
                        tracing::error!(url = %self.url, "{e} ({kept})");
                        failing = Some(e);
                    }
                }
            }
        }
    }
}

/// Parses the URL and headers once; a bad one fails every fetch with the same error.
fn prepare(url: &str, headers: &[(String, String)]) -> Result<Target, FetchError> {
    let invalid = |reason: String| FetchError::InvalidUrl {
        url: url.to_owned(),
        reason,
    };
    let uri: Uri = url.parse().map_err(|e| invalid(format!("{e}")))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(FetchError::HttpsUnsupported {
                url: url.to_owned(),
            });
        }
        _ => return Err(invalid("the scheme must be http".into())),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(invalid("no host".into()));
    }
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        let bad = |reason: String| FetchError::InvalidHeader {
            url: url.to_owned(),
            name: name.clone(),
            reason,
        };
        let header_name =
            HeaderName::try_from(name.as_str()).map_err(|e| bad(format!("bad name: {e}")))?;
        let header_value =
            HeaderValue::try_from(value.as_str()).map_err(|e| bad(format!("bad value: {e}")))?;
        map.append(header_name, header_value);
    }
    if !map.contains_key(header::USER_AGENT) {
        map.insert(
            header::USER_AGENT,
            HeaderValue::from_static(concat!("wasmlet/", env!("CARGO_PKG_VERSION"))),
        );
    }
    Ok(Target { uri, headers: map })
}

/// The redirects Go's client follows for a GET.
fn is_redirect(status: StatusCode) -> bool {
    matches!(status.as_u16(), 301 | 302 | 303 | 307 | 308)
}

/// Resolves a `Location` against the URL that answered with it.
fn resolve(base: &Uri, location: &str) -> Result<Uri, String> {
    let scheme = base.scheme_str().unwrap_or("http");
    let authority = base.authority().map(|a| a.as_str()).unwrap_or("");
    let absolute = if location.contains("://") {
        location.to_owned()
    } else if let Some(rest) = location.strip_prefix("//") {
        format!("{scheme}://{rest}")
    } else if location.starts_with('/') {
        format!("{scheme}://{authority}{location}")
    } else {
        let dir = base.path().rsplit_once('/').map_or("", |(dir, _)| dir);
        format!("{scheme}://{authority}{dir}/{location}")
    };
    let uri: Uri = absolute
        .parse()
        .map_err(|e| format!("Location {location:?}: {e}"))?;
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("Location {location:?}: no host"));
    }
    Ok(uri)
}

/// Whether credentials may follow a redirect: the same host or a subdomain of it.
fn same_site(from: &Uri, to: &Uri) -> bool {
    let (Some(from), Some(to)) = (from.host(), to.host()) else {
        return false;
    };
    let (from, to) = (from.to_ascii_lowercase(), to.to_ascii_lowercase());
    to == from || to.ends_with(&format!(".{from}"))
}

/// An error and its causes on one line: hyper's own message is only "client error".
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tokio::sync::watch;

    use axum::extract::{Path, State};
    use axum::http::{HeaderMap as AxumHeaders, StatusCode as AxumStatus, header as axum_header};
    use axum::response::IntoResponse;
    use axum::routing::get;

    use super::*;
    use crate::pod::{CONFIG_HASH_ANNOTATION, CONFIG_SOURCE_ANNOTATION};

    const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: NAME\nspec:\n  containers:\n  - name: c\n    image: x:1\n";

    /// What the test server answers, and what it saw.
    struct Served {
        status: u16,
        body: String,
        headers: Vec<AxumHeaders>,
    }

    struct Server {
        served: Mutex<Served>,
        /// The number of requests answered from `served`.
        requests: watch::Sender<usize>,
    }

    type Shared = Arc<Server>;

    /// A local server answering `/<anything>` with the shared status and body,
    /// `/redirect/<path>` with a 302 to `/<path>`, and never answering `/hang`.
    async fn server(body: &str) -> (String, Shared) {
        let shared = Arc::new(Server {
            served: Mutex::new(Served {
                status: 200,
                body: body.to_owned(),
                headers: Vec::new(),
            }),
            requests: watch::Sender::new(0),
        });
        async fn answer(State(s): State<Shared>, headers: AxumHeaders) -> impl IntoResponse {
            let answer = {
                let mut served = s.served.lock().unwrap();
                served.headers.push(headers);
                (
                    AxumStatus::from_u16(served.status).unwrap(),
                    served.body.clone(),
                )
            };
            s.requests.send_modify(|n| *n += 1);
            answer
        }
        async fn redirect(Path(to): Path<String>) -> impl IntoResponse {
            (
                AxumStatus::FOUND,
                [(axum_header::LOCATION, format!("/{to}"))],
            )
        }
        async fn hang() {
            std::future::pending::<()>().await
        }
        let app = axum::Router::new()
            .route("/hang", get(hang))
            .route("/redirect/{*to}", get(redirect))
            .route("/{*path}", get(answer))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (format!("http://{addr}"), shared)
    }

    fn source(url: &str) -> HttpSource {
        source_with(url, Vec::new())
    }

    fn source_with(url: &str, headers: Vec<(&str, &str)>) -> HttpSource {
        HttpSource::new(
            ManifestUrl {
                url: url.to_owned(),
                headers: headers
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect(),
                check_frequency: Duration::from_millis(10),
            },
            "node1",
        )
    }

    fn set(shared: &Shared, status: u16, body: &str) {
        let mut s = shared.served.lock().unwrap();
        s.status = status;
        s.body = body.to_owned();
    }

    fn names(pods: &[Pod]) -> Vec<String> {
        pods.iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect()
    }

    fn uids(pods: &[Pod]) -> Vec<String> {
        pods.iter()
            .map(|p| p.metadata.uid.clone().unwrap())
            .collect()
    }

    fn pod_list(names: &[&str]) -> String {
        let items: Vec<String> = names
            .iter()
            .map(|n| format!(r#"{{"metadata":{{"name":"{n}"}},"spec":{{"containers":[{{"name":"c","image":"x:1"}}]}}}}"#))
            .collect();
        format!(
            r#"{{"apiVersion":"v1","kind":"PodList","items":[{}]}}"#,
            items.join(",")
        )
    }

    /// Waits until the server has answered `n` more requests than it has now.
    async fn served(shared: &Shared, n: usize) {
        let mut requests = shared.requests.subscribe();
        let want = *requests.borrow_and_update() + n;
        tokio::time::timeout(Duration::from_secs(10), requests.wait_for(|&r| r >= want))
            .await
            .expect("the server saw no new requests in time")
            .unwrap();
    }

    #[tokio::test]
    async fn one_pod_gets_the_static_pod_identity() {
        let (base, _shared) = server(&POD.replace("NAME", "web")).await;
        let url = format!("{base}/pods");
        let mut src = source(&url);
        let pods = src.fetch_once().await.unwrap().expect("a first snapshot");
        assert_eq!(names(&pods), ["web-node1"]);
        let pod = &pods[0];
        assert_eq!(pod.metadata.namespace.as_deref(), Some("default"));
        let ann = pod.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann[CONFIG_SOURCE_ANNOTATION], SOURCE);
        assert_eq!(
            Some(&ann[CONFIG_HASH_ANNOTATION]),
            pod.metadata.uid.as_ref()
        );
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("node1"));
        assert!(
            spec.tolerations.is_none(),
            "the NoExecute toleration is for file pods only, as in the kubelet"
        );
        assert_eq!(src.fetch_once().await, Ok(None), "an unchanged body");
    }

    #[tokio::test]
    async fn pod_lists_and_lists_of_pods() {
        let (base, shared) = server(&pod_list(&["a", "b"])).await;
        let mut src = source(&format!("{base}/pods"));
        let pods = src.fetch_once().await.unwrap().unwrap();
        assert_eq!(names(&pods), ["a-node1", "b-node1"]);

        let item = "- apiVersion: v1\n  kind: Pod\n  metadata: {name: NAME}\n  spec: {containers: [{name: c, image: 'x:1'}]}\n";
        let list = format!(
            "apiVersion: v1\nkind: List\nitems:\n{}{}",
            item.replace("NAME", "web-y"),
            item.replace("NAME", "web-z")
        );
        set(&shared, 200, &list);
        let pods = src.fetch_once().await.unwrap().unwrap();
        assert_eq!(names(&pods), ["web-y-node1", "web-z-node1"]);

        set(
            &shared,
            200,
            r#"{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Service","metadata":{"name":"s"}}]}"#,
        );
        let err = src.fetch_once().await.unwrap_err().to_string();
        assert!(err.contains("items[0]") && err.contains("Service"), "{err}");

        set(&shared, 200, r#"{"apiVersion":"v1","kind":"PodList"}"#);
        assert_eq!(src.fetch_once().await, Ok(Some(Vec::new())));
    }

    #[tokio::test]
    async fn configured_headers_are_sent() {
        let (base, shared) = server(&POD.replace("NAME", "web")).await;
        let mut src = source_with(
            &format!("{base}/pods"),
            vec![
                ("Authorization", "Bearer t0ken"),
                ("X-Multi", "one"),
                ("X-Multi", "two"),
            ],
        );
        src.fetch_once().await.unwrap().unwrap();
        let s = shared.served.lock().unwrap();
        let h = &s.headers[0];
        assert_eq!(h["authorization"], "Bearer t0ken");
        let multi: Vec<_> = h.get_all("x-multi").iter().collect();
        assert_eq!(multi, ["one", "two"]);
        assert!(
            h["user-agent"].to_str().unwrap().starts_with("wasmlet/"),
            "{h:?}"
        );
    }

    #[tokio::test]
    async fn a_non_200_answer_is_an_error_and_keeps_the_last_good_set() {
        let good = POD.replace("NAME", "web");
        let (base, shared) = server(&good).await;
        let url = format!("{base}/pods");
        let mut src = source(&url);
        assert!(src.fetch_once().await.unwrap().is_some());

        set(&shared, 404, "no such thing");
        let err = src.fetch_once().await.unwrap_err();
        assert!(
            matches!(err, FetchError::Status { status: 404, .. }),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(
            text.contains("404") && text.contains("Not Found") && text.contains(&url),
            "{text}"
        );

        set(&shared, 200, &good);
        assert_eq!(src.fetch_once().await, Ok(None), "the last good set stands");
        set(&shared, 200, &POD.replace("NAME", "other"));
        let pods = src.fetch_once().await.unwrap().unwrap();
        assert_eq!(names(&pods), ["other-node1"]);
    }

    #[tokio::test]
    async fn a_bad_body_is_an_error_and_keeps_the_last_good_set() {
        let good = pod_list(&["a", "b"]);
        let (base, shared) = server(&good).await;
        let mut src = source(&format!("{base}/pods"));
        assert!(src.fetch_once().await.unwrap().is_some());

        set(&shared, 200, "kind: Pod\nspec: [");
        let err = src.fetch_once().await.unwrap_err();
        assert!(matches!(err, FetchError::Manifest { .. }), "{err:?}");
        assert!(err.to_string().contains("invalid YAML"), "{err}");

        // One bad pod rejects the whole list, naming it.
        let bad = pod_list(&["a", "b"]).replacen(
            r#"{"name":"c","image":"x:1"}"#,
            r#"{"name":"c","image":"x:1"},{"name":"c","image":"x:2"}"#,
            1,
        );
        let bad = bad.replacen(r#""name":"a""#, r#""name":"first""#, 1);
        set(&shared, 200, &bad);
        let err = src.fetch_once().await.unwrap_err().to_string();
        assert!(
            err.contains("items[0]") && err.contains("\"first\"") && err.contains("duplicate"),
            "{err}"
        );

        set(&shared, 200, &pod_list(&["a", "a"]));
        let err = src.fetch_once().await.unwrap_err().to_string();
        assert!(err.contains("items[1]") && err.contains("same"), "{err}");

        set(&shared, 200, &good);
        assert_eq!(src.fetch_once().await, Ok(None), "the last good set stands");
    }

    #[tokio::test]
    async fn an_empty_body_is_an_empty_set() {
        let (base, shared) = server("").await;
        let mut src = source(&format!("{base}/pods"));
        assert_eq!(src.fetch_once().await, Ok(Some(Vec::new())));
        assert_eq!(src.fetch_once().await, Ok(None));
        set(&shared, 200, &POD.replace("NAME", "web"));
        assert_eq!(src.fetch_once().await.unwrap().unwrap().len(), 1);
        set(&shared, 200, "\n");
        assert_eq!(src.fetch_once().await, Ok(Some(Vec::new())));
    }

    #[tokio::test]
    async fn uids_are_stable_and_differ_by_url() {
        let body = POD.replace("NAME", "web");
        let (base, _shared) = server(&body).await;
        let a = format!("{base}/a");
        let first = source(&a).fetch_once().await.unwrap().unwrap();
        let again = source(&a).fetch_once().await.unwrap().unwrap();
        assert_eq!(uids(&first), uids(&again));
        let other = source(&format!("{base}/b"))
            .fetch_once()
            .await
            .unwrap()
            .unwrap();
        assert_ne!(uids(&first), uids(&other));
        assert_eq!(names(&first), names(&other));
    }

    #[tokio::test]
    async fn run_sends_the_first_set_then_only_changes() {
        let (base, shared) = server("").await;
        let (tx, mut rx) = mpsc::channel(8);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(source(&format!("{base}/pods")).run(tx, cancel.clone()));
        let recv = async |rx: &mut mpsc::Receiver<SourceSnapshot>| {
            tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .expect("a snapshot in time")
                .expect("the source is running")
        };

        let first = recv(&mut rx).await;
        assert_eq!(first.source, SOURCE);
        assert!(first.pods.is_empty(), "an empty first snapshot is sent");

        served(&shared, 3).await;
        assert!(rx.try_recv().is_err(), "an unchanged body sends nothing");

        set(&shared, 200, &pod_list(&["a", "b"]));
        assert_eq!(names(&recv(&mut rx).await.pods), ["a-node1", "b-node1"]);

        set(&shared, 500, "boom");
        served(&shared, 3).await;
        assert!(rx.try_recv().is_err(), "a failing URL sends nothing");

        set(&shared, 200, &POD.replace("NAME", "c"));
        assert_eq!(names(&recv(&mut rx).await.pods), ["c-node1"]);

        cancel.cancel();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("run ends when cancelled")
            .unwrap();
    }

    #[tokio::test]
    async fn redirects_are_followed_with_the_headers() {
        let (base, shared) = server(&POD.replace("NAME", "web")).await;
        let mut src = source_with(
            &format!("{base}/redirect/pods"),
            vec![("Authorization", "Bearer t")],
        );
        let pods = src.fetch_once().await.unwrap().unwrap();
        assert_eq!(names(&pods), ["web-node1"]);
        assert_eq!(
            shared.served.lock().unwrap().headers[0]["authorization"],
            "Bearer t"
        );
    }

    #[tokio::test]
    async fn transport_problems_are_errors_naming_the_url() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/pods", listener.local_addr().unwrap());
        drop(listener);
        let err = source(&url).fetch_once().await.unwrap_err();
        assert!(matches!(err, FetchError::Transport { .. }), "{err:?}");
        assert!(err.to_string().contains(&url), "{err}");

        let (base, shared) = server("").await;
        let mut src = source(&format!("{base}/hang")).with_timeout(Duration::from_millis(200));
        let err = src.fetch_once().await.unwrap_err();
        assert!(matches!(err, FetchError::Timeout { .. }), "{err:?}");

        set(&shared, 200, &"#".repeat(MAX_BODY_BYTES + 1));
        let err = source(&format!("{base}/big"))
            .fetch_once()
            .await
            .unwrap_err();
        assert!(matches!(err, FetchError::TooLarge { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn bad_urls_and_headers_fail_clearly() {
        let err = source("https://example.invalid/pods")
            .fetch_once()
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("https manifest URLs are not supported yet"),
            "{err}"
        );
        let err = source("ftp://example.invalid/pods")
            .fetch_once()
            .await
            .unwrap_err();
        assert!(matches!(err, FetchError::InvalidUrl { .. }), "{err:?}");
        let err = source_with("http://127.0.0.1:1/", vec![("Bad Header", "v")])
            .fetch_once()
            .await
            .unwrap_err();
        assert!(err.to_string().contains("\"Bad Header\""), "{err}");
    }

    #[test]
    fn redirect_locations_resolve() {
        let base: Uri = "http://h:8080/dir/pods?x=1".parse().unwrap();
        for (location, want) in [
            ("http://o/p", "http://o/p"),
            ("//o/p", "http://o/p"),
            ("/p?q=2", "http://h:8080/p?q=2"),
            ("other", "http://h:8080/dir/other"),
        ] {
            assert_eq!(resolve(&base, location).unwrap().to_string(), want);
        }
        let sub: Uri = "http://a.h/".parse().unwrap();
        let h: Uri = "http://H/".parse().unwrap();
        let evil: Uri = "http://evilh/".parse().unwrap();
        assert!(same_site(&h, &sub) && !same_site(&sub, &h) && !same_site(&h, &evil));
    }
}
