//! The API server's connections to kubelets: `nodes/{name}/proxy/{path}` and
//! `pods/{name}/log`, as kube-apiserver makes them.
//!
//! The kubelet is found from its Node: the first address of type InternalIP,
//! ExternalIP, Hostname (kubeadm's `--kubelet-preferred-address-types`) and
//! `status.daemonEndpoints.kubeletEndpoint.Port` (10250 when unset). Requests go
//! over HTTPS with the apiserver-kubelet-client certificate; the kubelet's serving
//! certificate is checked only against [`ApiServer::set_kubelet_ca`]. Responses
//! stream through chunk by chunk.
//!
//! Errors are the real ones: a proxy that cannot reach the kubelet is 503
//! `error trying to reach service: dial tcp ...`, and the kubelet's own answers
//! pass through unchanged; a log request that cannot reach it is 500
//! `Get "https://...": dial tcp ...`, and a kubelet error is wrapped as the
//! apiserver's response checker does. `pods/{exec,attach,portforward}` are
//! upgraded and relayed ([`pod_stream`]); `nodes/proxy` upgrades are not. Not
//! modelled: HTML link rewriting, and the refusal of loopback node addresses
//! (the real proxy answers 400 `address not allowed` for them; every test kubelet
//! listens on loopback).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::http::header::{CONTENT_TYPE, HOST};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, Uri};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::auth::Connection;
use super::errors::{ApiError, FieldError};
use super::store::meta_str;
use super::{ApiServer, lock, resources, tls};

/// The kubelet port when a Node does not report one (`--kubelet-port`).
const DEFAULT_KUBELET_PORT: u16 = 10250;

/// How much of a failed log response is read into the error.
const MAX_ERROR_BODY: usize = 50_000;

/// The client certificate kubeadm gives the apiserver for kubelets.
pub(crate) const KUBELET_CLIENT_CN: &str = "kube-apiserver-kubelet-client";
pub(crate) const KUBELET_CLIENT_ORG: &str = "system:masters";

/// Headers that belong to one hop.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Where and how to reach a kubelet.
struct Backend {
    scheme: String,
    host: String,
    port: String,
    /// TLS for `https`.
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl Backend {
    fn host_port(&self) -> String {
        match self.host.parse::<IpAddr>() {
            Ok(IpAddr::V6(_)) => format!("[{}]:{}", self.host, self.port),
            _ => format!("{}:{}", self.host, self.port),
        }
    }

    fn url(&self, path_and_query: &str) -> String {
        format!("{}://{}{path_and_query}", self.scheme, self.host_port())
    }
}

/// The kubelet of node `name`: (address, port).
fn connection_info(server: &ApiServer, name: &str) -> Result<(String, String), ApiError> {
    let nodes = resources::find("", "v1", "nodes").ok_or_else(ApiError::no_such_resource)?;
    let node = lock(&server.inner.store).get(nodes, "", name)?;
    let addresses: Vec<(String, String)> = node
        .pointer("/status/addresses")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .map(|a| {
                    let text = |k: &str| a.get(k).and_then(Value::as_str).unwrap_or("").to_string();
                    (text("type"), text("address"))
                })
                .collect()
        })
        .unwrap_or_default();
    let host = ["InternalIP", "ExternalIP", "Hostname"]
        .iter()
        .find_map(|kind| {
            addresses
                .iter()
                .find(|(t, a)| t == kind && !a.is_empty())
                .map(|(_, a)| a.clone())
        })
        .ok_or_else(|| {
            let known: Vec<String> = addresses
                .iter()
                .map(|(t, a)| format!("{{{t} {a}}}"))
                .collect();
            ApiError::unknown(format!(
                "no preferred addresses found; known addresses: [{}]",
                known.join(" ")
            ))
        })?;
    let port = node
        .pointer("/status/daemonEndpoints/kubeletEndpoint/Port")
        .and_then(Value::as_i64)
        .filter(|p| *p > 0)
        .unwrap_or(i64::from(DEFAULT_KUBELET_PORT));
    Ok((host, port.to_string()))
}

/// The TLS configuration towards kubelets: the apiserver-kubelet-client
/// certificate, verifying the kubelet against the kubelet CA if one is set.
fn kubelet_tls(
    server: &ApiServer,
    skip_verify: bool,
) -> Result<Arc<rustls::ClientConfig>, ApiError> {
    let (cert, key) = server
        .kubelet_client_identity()
        .map_err(|e| ApiError::internal(&e.to_string()))?;
    let ca = if skip_verify {
        None
    } else {
        lock(&server.inner.kubelet_ca).clone()
    };
    tls::client(&cert, &key, ca.as_deref()).map_err(|e| ApiError::internal(&format!("{e:#}")))
}

/// Go's rendering of a failed dial.
fn dial_error(addr: &str, err: &std::io::Error) -> String {
    let text = err.to_string();
    let text = text.split(" (os error").next().unwrap_or(&text);
    let mut chars = text.chars();
    let lowered = match chars.next() {
        Some(first) => first.to_lowercase().collect::<String>() + chars.as_str(),
        None => String::new(),
    };
    format!("dial tcp {addr}: connect: {lowered}")
}

/// Sends `request` to `backend` on a new connection.
async fn round_trip(
    backend: &Backend,
    request: Request<Body>,
) -> Result<Response<Incoming>, String> {
    if backend.scheme != "http" && backend.scheme != "https" {
        return Err(format!("unsupported protocol scheme {:?}", backend.scheme));
    }
    let addr = backend.host_port();
    // No dial timeout: under a paused Tokio clock it would fire while a loopback
    // connect is in flight, and test kubelets are only ever on loopback.
    let stream = TcpStream::connect(&addr)
        .await
        .map_err(|err| dial_error(&addr, &err))?;
    match &backend.tls {
        Some(config) if backend.scheme == "https" => {
            let name = tls::server_name(&backend.host).map_err(|e| e.to_string())?;
            let connector = tokio_rustls::TlsConnector::from(config.clone());
            let stream = connector
                .connect(name, stream)
                .await
                .map_err(|e| format!("remote error: tls: {e}"))?;
            send(stream, request).await
        }
        _ => send(stream, request).await,
    }
}

async fn send<T>(io: T, request: Request<Body>) -> Result<Response<Incoming>, String>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        if let Err(err) = connection.with_upgrades().await {
            tracing::debug!("test apiserver: kubelet connection ended: {err}");
        }
    });
    sender.send_request(request).await.map_err(|e| {
        if e.is_incomplete_message() {
            "EOF".to_string()
        } else {
            e.to_string()
        }
    })
}

/// `scheme:name:port`, `name:port` or `name` (`SplitSchemeNamePort`).
fn split_scheme_name_port(id: &str) -> Option<(&str, &str, &str)> {
    let parts: Vec<&str> = id.split(':').collect();
    let (scheme, name, port) = match parts.as_slice() {
        [name] => ("", *name, ""),
        [name, port] => ("", *name, *port),
        [scheme, name, port] => (*scheme, *name, *port),
        _ => return None,
    };
    (!name.is_empty() && matches!(scheme, "" | "http" | "https")).then_some((scheme, name, port))
}

/// `/` + `rest` with `.`/`..` and empty segments resolved, keeping a trailing `/`.
fn clean_path(rest: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for segment in rest.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            s => out.push(s),
        }
    }
    let mut path = format!("/{}", out.join("/"));
    if rest.ends_with('/') && !path.ends_with('/') {
        path.push('/');
    }
    path
}

/// Link-local, multicast and unspecified node addresses are never proxied to.
fn proxyable(host: &str) -> bool {
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => !(ip.is_link_local() || ip.is_multicast() || ip.is_unspecified()),
        Ok(IpAddr::V6(ip)) => {
            !(ip.is_multicast() || ip.is_unspecified() || (ip.segments()[0] & 0xffc0) == 0xfe80)
        }
        Err(_) => true,
    }
}

/// `{GET,POST,PUT,DELETE,HEAD,OPTIONS} /api/v1/nodes/{node}/proxy/{path}`.
pub(crate) async fn node_proxy(
    server: &ApiServer,
    node: &str,
    req: axum::extract::Request,
) -> Result<axum::response::Response, ApiError> {
    let method = req.method().clone();
    if ![
        Method::GET,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::HEAD,
        Method::OPTIONS,
    ]
    .contains(&method)
    {
        return Err(ApiError::method_not_allowed(format!(
            "{method} is not supported on nodes/proxy"
        )));
    }
    let (scheme, name, port) = split_scheme_name_port(node)
        .ok_or_else(|| ApiError::bad_request(format!("invalid node request {node:?}")))?;
    let (host, kubelet_port) = connection_info(server, name)?;
    if !proxyable(&host) {
        return Err(ApiError::bad_request("address not allowed"));
    }
    let backend = if port.is_empty() || port == kubelet_port {
        Backend {
            scheme: "https".into(),
            host,
            port: kubelet_port,
            tls: Some(kubelet_tls(server, false)?),
        }
    } else {
        Backend {
            scheme: scheme.to_string(),
            host,
            port: port.to_string(),
            tls: Some(tls::insecure_client().map_err(|e| ApiError::internal(&e.to_string()))?),
        }
    };
    let prefix = format!("/api/v1/nodes/{node}/proxy");
    let full = req.uri().path().to_string();
    let rest = full.strip_prefix(&prefix).unwrap_or("");
    let path = clean_path(rest);
    let path_and_query = match req.uri().query() {
        Some(query) => format!("{path}?{query}"),
        None => path.clone(),
    };
    let client_ip = req
        .extensions()
        .get::<Connection>()
        .map(|c| c.peer.ip().to_string());
    let forwarded_proto = if req.extensions().get::<Connection>().is_some_and(|c| c.tls) {
        "https"
    } else {
        "http"
    };
    let (parts, body) = req.into_parts();
    let mut headers = HeaderMap::new();
    for (key, value) in &parts.headers {
        let lower = key.as_str();
        if HOP_BY_HOP.contains(&lower) || lower == "authorization" || lower == "host" {
            continue;
        }
        headers.append(key.clone(), value.clone());
    }
    let original_host = parts.headers.get(HOST).cloned();
    let set = |headers: &mut HeaderMap, name: &'static str, value: &str| {
        if let Ok(value) = HeaderValue::from_str(value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    };
    if let Some(ip) = client_ip {
        set(&mut headers, "x-forwarded-for", &ip);
    }
    set(&mut headers, "x-forwarded-uri", &format!("{prefix}{path}"));
    if let Some(host) = original_host.as_ref().and_then(|h| h.to_str().ok()) {
        set(&mut headers, "x-forwarded-host", host);
    }
    set(&mut headers, "x-forwarded-proto", forwarded_proto);
    let mut request = Request::builder()
        .method(method)
        .uri(
            path_and_query
                .parse::<Uri>()
                .map_err(|e| ApiError::bad_request(e.to_string()))?,
        )
        .body(body)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    *request.headers_mut() = headers;
    if let Ok(host) = HeaderValue::from_str(&backend.host_port()) {
        request.headers_mut().insert(HOST, host);
    }
    let response = round_trip(&backend, request).await.map_err(|e| {
        ApiError::service_unavailable(format!("error trying to reach service: {e}"))
    })?;
    let (mut parts, body) = response.into_parts();
    for name in HOP_BY_HOP {
        parts.headers.remove(name);
    }
    Ok(Response::from_parts(parts, Body::new(body)))
}

/// The `PodLogOptions` of a `pods/log` query.
#[derive(Debug, Default)]
struct LogOptions {
    container: String,
    follow: bool,
    previous: bool,
    timestamps: bool,
    insecure_skip_tls_verify_backend: bool,
    since_seconds: Option<i64>,
    since_time: Option<String>,
    tail_lines: Option<i64>,
    limit_bytes: Option<i64>,
}

impl LogOptions {
    fn parse(query: &HashMap<String, String>, name: &str) -> Result<LogOptions, ApiError> {
        let flag = |key: &str| -> Result<bool, ApiError> {
            match query.get(key).map(String::as_str) {
                None => Ok(false),
                Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
                Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
                Some(other) => Err(ApiError::bad_request(format!(
                    "strconv.ParseBool: parsing {other:?}: invalid syntax"
                ))),
            }
        };
        let int = |key: &str| -> Result<Option<i64>, ApiError> {
            query
                .get(key)
                .map(|v| {
                    v.parse().map_err(|_| {
                        ApiError::bad_request(format!(
                            "strconv.ParseInt: parsing {v:?}: invalid syntax"
                        ))
                    })
                })
                .transpose()
        };
        let since_time = match query.get("sinceTime") {
            None => None,
            Some(text) => {
                let at: jiff::Timestamp = text.parse().map_err(|_| {
                    ApiError::bad_request(format!(
                        "parsing time {text:?} as \"2006-01-02T15:04:05Z07:00\": cannot parse"
                    ))
                })?;
                Some(super::store::format_time(at))
            }
        };
        let options = LogOptions {
            container: query.get("container").cloned().unwrap_or_default(),
            follow: flag("follow")?,
            previous: flag("previous")?,
            timestamps: flag("timestamps")?,
            insecure_skip_tls_verify_backend: flag("insecureSkipTLSVerifyBackend")?,
            since_seconds: int("sinceSeconds")?,
            since_time,
            tail_lines: int("tailLines")?,
            limit_bytes: int("limitBytes")?,
        };
        let mut errors = Vec::new();
        if let Some(n) = options.tail_lines.filter(|n| *n < 0) {
            errors.push(FieldError::invalid(
                "tailLines",
                &n.to_string(),
                "must be greater than or equal to 0",
            ));
        }
        if let Some(n) = options.limit_bytes.filter(|n| *n < 1) {
            errors.push(FieldError::invalid(
                "limitBytes",
                &n.to_string(),
                "must be greater than 0",
            ));
        }
        match (options.since_seconds, &options.since_time) {
            (Some(_), Some(_)) => errors.push(FieldError::forbidden(
                "",
                "at most one of `sinceTime` or `sinceSeconds` may be specified",
            )),
            (Some(n), None) if n < 1 => errors.push(FieldError::invalid(
                "sinceSeconds",
                &n.to_string(),
                "must be greater than 0",
            )),
            _ => {}
        }
        if errors.is_empty() {
            Ok(options)
        } else {
            Err(ApiError::invalid_fields("", "PodLogOptions", name, &errors))
        }
    }

    /// The kubelet query, as `url.Values.Encode` writes it (keys sorted).
    fn kubelet_query(&self) -> String {
        let mut params: Vec<(&str, String)> = Vec::new();
        if self.follow {
            params.push(("follow", "true".into()));
        }
        if let Some(n) = self.limit_bytes {
            params.push(("limitBytes", n.to_string()));
        }
        if self.previous {
            params.push(("previous", "true".into()));
        }
        if let Some(n) = self.since_seconds {
            params.push(("sinceSeconds", n.to_string()));
        }
        if let Some(t) = &self.since_time {
            params.push(("sinceTime", t.clone()));
        }
        if let Some(n) = self.tail_lines {
            params.push(("tailLines", n.to_string()));
        }
        if self.timestamps {
            params.push(("timestamps", "true".into()));
        }
        params
            .iter()
            .map(|(k, v)| format!("{k}={}", query_escape(v)))
            .collect::<Vec<_>>()
            .join("&")
    }
}

/// `url.QueryEscape`.
fn query_escape(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            b => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The container a log request is for (`validateContainer`).
fn log_container(pod: &Value, requested: &str) -> Result<String, ApiError> {
    let name = meta_str(pod, "name");
    let names = |list: &str| -> Vec<String> {
        pod.pointer(&format!("/spec/{list}"))
            .and_then(Value::as_array)
            .map(|cs| {
                cs.iter()
                    .filter_map(|c| c.get("name").and_then(Value::as_str))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    let (init, regular, ephemeral) = (
        names("initContainers"),
        names("containers"),
        names("ephemeralContainers"),
    );
    if requested.is_empty() {
        return match regular.as_slice() {
            [only] => Ok(only.clone()),
            [] => Err(ApiError::bad_request(format!(
                "a container name must be specified for pod {name}"
            ))),
            _ => {
                let all: Vec<String> = init.into_iter().chain(regular).chain(ephemeral).collect();
                Err(ApiError::bad_request(format!(
                    "a container name must be specified for pod {name}, choose one of: [{}]",
                    all.join(" ")
                )))
            }
        };
    }
    if init
        .iter()
        .chain(&regular)
        .chain(&ephemeral)
        .any(|c| c == requested)
    {
        Ok(requested.to_string())
    } else {
        Err(ApiError::bad_request(format!(
            "container {requested} is not valid for pod {name}"
        )))
    }
}

/// `GET /api/v1/namespaces/{ns}/pods/{name}/log`: the kubelet's
/// `/containerLogs/{ns}/{name}/{container}`, streamed.
pub(crate) async fn pod_log(
    server: &ApiServer,
    namespace: &str,
    name: &str,
    query: &HashMap<String, String>,
) -> Result<axum::response::Response, ApiError> {
    let pods = resources::find("", "v1", "pods").ok_or_else(ApiError::no_such_resource)?;
    let pod = lock(&server.inner.store).get(pods, namespace, name)?;
    let options = LogOptions::parse(query, name)?;
    let container = log_container(&pod, &options.container)?;
    let node = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .unwrap_or("");
    let text = |body: Body| {
        axum::response::Response::builder()
            .status(200)
            .header(CONTENT_TYPE, "text/plain")
            .body(body)
            .map_err(|e| ApiError::internal(&e.to_string()))
    };
    if node.is_empty() {
        // An unscheduled pod has no logs yet: an empty stream.
        return text(Body::empty());
    }
    let (host, port) = connection_info(server, node)?;
    let backend = Backend {
        scheme: "https".into(),
        host,
        port,
        tls: Some(kubelet_tls(
            server,
            options.insecure_skip_tls_verify_backend,
        )?),
    };
    let query = options.kubelet_query();
    let mut path_and_query = format!("/containerLogs/{namespace}/{name}/{container}");
    if !query.is_empty() {
        path_and_query.push('?');
        path_and_query.push_str(&query);
    }
    let url = backend.url(&path_and_query);
    let mut request = Request::builder()
        .method(Method::GET)
        .uri(
            path_and_query
                .parse::<Uri>()
                .map_err(|e| ApiError::bad_request(e.to_string()))?,
        )
        .header("user-agent", "Go-http-client/1.1")
        .body(Body::empty())
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    if let Ok(host) = HeaderValue::from_str(&backend.host_port()) {
        request.headers_mut().insert(HOST, host);
    }
    let response = round_trip(&backend, request)
        .await
        .map_err(|e| ApiError::unknown(format!("Get {url:?}: {e}")))?;
    let code = response.status().as_u16();
    if !(200..=206).contains(&code) {
        let mut body = response.into_body();
        let mut bytes = Vec::new();
        while bytes.len() < MAX_ERROR_BODY {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        bytes.extend_from_slice(&data);
                    }
                }
                Some(Err(err)) => return Err(ApiError::internal(&err.to_string())),
                None => break,
            }
        }
        bytes.truncate(MAX_ERROR_BODY);
        let text = String::from_utf8_lossy(&bytes).to_string();
        return Err(match code {
            500 => ApiError::internal(&text),
            400 => ApiError::bad_request(text),
            _ => ApiError::generic_server_response(code, "pods/log", name, &text),
        });
    }
    text(Body::new(response.into_body()))
}

/// `{GET,POST} /api/v1/namespaces/{ns}/pods/{name}/{exec,attach,portforward}`: the
/// kubelet's `/exec/{ns}/{name}/{container}`, `/attach/...` or
/// `/portForward/{ns}/{name}` with the options as the apiserver's `streamParams`
/// writes them, the client's upgrade proxied there and, once the kubelet has switched
/// protocols, bytes relayed both ways (`UpgradeAwareHandler` with
/// `upgradeRequired`).
pub(crate) async fn pod_stream(
    server: &ApiServer,
    namespace: &str,
    name: &str,
    subresource: &str,
    mut req: axum::extract::Request,
) -> Result<axum::response::Response, ApiError> {
    if ![Method::GET, Method::POST].contains(req.method()) {
        return Err(ApiError::method_not_allowed(format!(
            "{} is not supported on pods/{subresource}",
            req.method()
        )));
    }
    let pods = resources::find("", "v1", "pods").ok_or_else(ApiError::no_such_resource)?;
    let pod = lock(&server.inner.store).get(pods, namespace, name)?;
    let query = req.uri().query().unwrap_or("").to_string();
    let pairs: Vec<(String, String)> = url_pairs(&query);
    let get = |key: &str| -> Vec<&str> {
        pairs
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect()
    };
    let flag = |key: &str| {
        get(key)
            .first()
            .is_some_and(|v| matches!(*v, "1" | "t" | "T" | "true" | "TRUE" | "True"))
    };
    let mut params: Vec<(&str, String)> = Vec::new();
    let path = if subresource == "portforward" {
        let ports: Vec<&str> = get("ports");
        if !ports.is_empty() {
            params.push(("port", ports.join(",")));
        }
        format!("/portForward/{namespace}/{name}")
    } else {
        let container = get("container").first().copied().unwrap_or("").to_string();
        let container = log_container(&pod, &container)?;
        for command in get("command") {
            params.push(("command", command.to_string()));
        }
        for (option, param) in [
            ("stderr", "error"),
            ("stdin", "input"),
            ("stdout", "output"),
            ("tty", "tty"),
        ] {
            if flag(option) {
                params.push((param, "1".into()));
            }
        }
        let kubelet_path = if subresource == "exec" {
            "exec"
        } else {
            "attach"
        };
        format!("/{kubelet_path}/{namespace}/{name}/{container}")
    };
    let node = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .unwrap_or("");
    if node.is_empty() {
        return Err(ApiError::bad_request(format!(
            "pod {name} does not have a host assigned"
        )));
    }
    let upgrade = req
        .headers()
        .get(axum::http::header::CONNECTION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().contains("upgrade"));
    if !upgrade {
        return Err(ApiError::bad_request("Upgrade request required"));
    }
    let (host, port) = connection_info(server, node)?;
    let backend = Backend {
        scheme: "https".into(),
        host,
        port,
        tls: Some(kubelet_tls(server, false)?),
    };
    // `url.Values.Encode`: keys sorted, values in order.
    params.sort_by_key(|(k, _)| *k);
    let encoded: Vec<String> = params
        .iter()
        .map(|(k, v)| format!("{k}={}", query_escape(v)))
        .collect();
    let path_and_query = if encoded.is_empty() {
        path
    } else {
        format!("{path}?{}", encoded.join("&"))
    };
    let client_upgrade = hyper::upgrade::on(&mut req);
    let mut request = Request::builder()
        .method(req.method().clone())
        .uri(
            path_and_query
                .parse::<Uri>()
                .map_err(|e| ApiError::bad_request(e.to_string()))?,
        )
        .body(Body::empty())
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    for (key, value) in req.headers() {
        if key != HOST && key != axum::http::header::AUTHORIZATION {
            request.headers_mut().append(key.clone(), value.clone());
        }
    }
    if let Ok(host) = HeaderValue::from_str(&backend.host_port()) {
        request.headers_mut().insert(HOST, host);
    }
    let mut response = round_trip(&backend, request).await.map_err(|e| {
        ApiError::service_unavailable(format!("error trying to reach service: {e}"))
    })?;
    if response.status() != axum::http::StatusCode::SWITCHING_PROTOCOLS {
        let (parts, body) = response.into_parts();
        return Ok(Response::from_parts(parts, Body::new(body)));
    }
    let kubelet_upgrade = hyper::upgrade::on(&mut response);
    tokio::spawn(async move {
        if let (Ok(client), Ok(kubelet)) = tokio::join!(client_upgrade, kubelet_upgrade) {
            let mut client = hyper_util::rt::TokioIo::new(client);
            let mut kubelet = hyper_util::rt::TokioIo::new(kubelet);
            let _ = tokio::io::copy_bidirectional(&mut client, &mut kubelet).await;
        }
    });
    let (parts, _) = response.into_parts();
    Ok(Response::from_parts(parts, Body::empty()))
}

/// The query's `key=value` pairs in order, `+` and `%XX` decoded.
fn url_pairs(query: &str) -> Vec<(String, String)> {
    let decode = |s: &str| -> String {
        let mut out = Vec::new();
        let mut bytes = s.bytes();
        while let Some(b) = bytes.next() {
            match b {
                b'+' => out.push(b' '),
                b'%' => {
                    let hex: Vec<u8> = bytes.by_ref().take(2).collect();
                    match std::str::from_utf8(&hex)
                        .ok()
                        .and_then(|h| u8::from_str_radix(h, 16).ok())
                    {
                        Some(v) => out.push(v),
                        None => out.extend_from_slice(&hex),
                    }
                }
                b => out.push(b),
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode(k), decode(v))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_split_like_the_apiserver() {
        assert_eq!(split_scheme_name_port("n1"), Some(("", "n1", "")));
        assert_eq!(
            split_scheme_name_port("n1:10255"),
            Some(("", "n1", "10255"))
        );
        assert_eq!(
            split_scheme_name_port("https:n1:10250"),
            Some(("https", "n1", "10250"))
        );
        assert_eq!(split_scheme_name_port("ftp:n1:1"), None);
        assert_eq!(split_scheme_name_port(":1"), None);
    }

    #[test]
    fn paths_and_queries() {
        assert_eq!(clean_path(""), "/");
        assert_eq!(clean_path("/stats/summary"), "/stats/summary");
        assert_eq!(clean_path("/a/../b/./c/"), "/b/c/");
        let mut query = HashMap::new();
        query.insert("tailLines".to_string(), "5".to_string());
        query.insert("follow".to_string(), "1".to_string());
        query.insert(
            "sinceTime".to_string(),
            "2024-01-02T03:04:05.678Z".to_string(),
        );
        let options = LogOptions::parse(&query, "p").expect("valid");
        assert_eq!(
            options.kubelet_query(),
            "follow=true&sinceTime=2024-01-02T03%3A04%3A05Z&tailLines=5"
        );
        query.insert("sinceSeconds".to_string(), "0".to_string());
        query.insert("tailLines".to_string(), "-1".to_string());
        let err = LogOptions::parse(&query, "p").expect_err("invalid");
        assert_eq!(err.code, 422);
        assert!(
            err.message
                .starts_with("PodLogOptions \"p\" is invalid: [tailLines: Invalid value: -1"),
            "{}",
            err.message
        );
    }

    #[test]
    fn containers_of_a_log_request() {
        let pod = serde_json::json!({
            "metadata": { "name": "p" },
            "spec": { "initContainers": [{ "name": "init" }], "containers": [{ "name": "a" }, { "name": "b" }] },
        });
        let err = log_container(&pod, "").expect_err("ambiguous");
        assert_eq!(
            err.message,
            "a container name must be specified for pod p, choose one of: [init a b]"
        );
        assert_eq!(log_container(&pod, "init").ok().as_deref(), Some("init"));
        let err = log_container(&pod, "c").expect_err("unknown");
        assert_eq!(err.message, "container c is not valid for pod p");
        let single = serde_json::json!({ "metadata": { "name": "q" }, "spec": { "containers": [{ "name": "only" }] } });
        assert_eq!(log_container(&single, "").ok().as_deref(), Some("only"));
    }

    #[test]
    fn dial_errors_read_like_go() {
        let err = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let os = std::io::Error::from_raw_os_error(111);
        assert_eq!(
            dial_error("127.0.0.1:1", &os),
            "dial tcp 127.0.0.1:1: connect: connection refused"
        );
        assert!(dial_error("a:1", &err).starts_with("dial tcp a:1: connect: "));
    }
}
