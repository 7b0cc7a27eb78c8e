//! The probe handlers, as the kubelet's prober runs them: `exec` through the runtime,
//! `httpGet`, `tcpSocket` and `grpc` from the node to the pod's address. Each is
//! bounded by the probe's `timeoutSeconds` and leaves no task, socket or process
//! behind when it ends, however it ends.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt as _;
use k8s_openapi::api::core::v1::{Container, HTTPGetAction, HTTPHeader, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use wasmlet_runtime::Runtime;

use super::{Outcome, ProbeResult};

/// The User-Agent of the kubelet's HTTP probes (`kube-probe/<major>.<minor>`).
pub const USER_AGENT: &str = "kube-probe/1.33";
/// How much of a response body the HTTP probe reads (the kubelet's 10 KiB).
const MAX_BODY: usize = 10 << 10;
/// How many requests an HTTP probe sends at most, redirects included (Go's
/// `len(via) >= 10`).
const MAX_REDIRECTS: usize = 10;

/// What a probe is run against.
pub struct Target<'a> {
    pub probe: &'a Probe,
    /// Which of the container's probes this is (a pod annotation may give it a plugin).
    pub kind: super::ProbeKind,
    pub container: &'a Container,
    /// The container's id in its runtime, for `exec`.
    pub container_id: &'a str,
    /// Where `httpGet`, `tcpSocket` and `grpc` connect when the probe names no host.
    pub pod_ip: &'a str,
    pub runtime: Option<Arc<dyn Runtime>>,
    pub timeout: Duration,
}

/// Runs the probe's handler.
pub async fn run(t: &Target<'_>) -> Outcome {
    let p = t.probe;
    if let Some(exec) = &p.exec {
        let command = exec.command.clone().unwrap_or_default();
        let Some(runtime) = &t.runtime else {
            return Outcome::unknown("no runtime for the exec probe");
        };
        return exec_probe(&**runtime, t.container_id, &command, t.timeout).await;
    }
    if let Some(http) = &p.http_get {
        return match port(&http.port, t.container) {
            Ok(port) => http_probe(http, t.pod_ip, port, t.timeout).await,
            Err(e) => Outcome::unknown(e),
        };
    }
    if let Some(tcp) = &p.tcp_socket {
        let host = tcp
            .host
            .as_deref()
            .filter(|h| !h.is_empty())
            .unwrap_or(t.pod_ip);
        return match port(&tcp.port, t.container) {
            Ok(port) => tcp_probe(host, port, t.timeout).await,
            Err(e) => Outcome::unknown(e),
        };
    }
    if let Some(grpc) = &p.grpc {
        let service = grpc.service.clone().unwrap_or_default();
        return grpc_probe(t.pod_ip, grpc.port, &service, t.timeout).await;
    }
    Outcome::unknown("the probe has no handler (exec, httpGet, tcpSocket, grpc)")
}

/// A numbered port, or a named container port.
pub fn port(port: &IntOrString, c: &Container) -> Result<u16, String> {
    let n = match port {
        IntOrString::Int(p) => *p,
        IntOrString::String(name) => match name.parse::<i32>() {
            Ok(p) => p,
            Err(_) => c
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .map(|p| p.container_port)
                .ok_or_else(|| format!("no container port named {name:?}"))?,
        },
    };
    u16::try_from(n)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("invalid port number: {n}"))
}

fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

async fn exec_probe(
    runtime: &dyn Runtime,
    container_id: &str,
    command: &[String],
    timeout: Duration,
) -> Outcome {
    let run = runtime.exec_sync(container_id, command, timeout);
    // The runtime enforces the timeout; this bound is for a runtime that does not.
    match tokio::time::timeout(timeout + Duration::from_secs(1), run).await {
        Err(_) => Outcome::failure(format!("command {command:?} timed out after {timeout:?}")),
        Ok(Err(e)) => exec_error(command, e),
        Ok(Ok(r)) => {
            let mut output = String::from_utf8_lossy(&r.stdout).into_owned();
            output.push_str(&String::from_utf8_lossy(&r.stderr));
            if r.exit_code == 0 {
                Outcome::success(output)
            } else {
                Outcome::failure(if output.trim().is_empty() {
                    format!("command {command:?} exited with {}", r.exit_code)
                } else {
                    output
                })
            }
        }
    }
}

/// An `ExecSync` error, as the kubelet's exec prober takes it: the runtime's timeout
/// is a failure; any other error means the probe could not be run (Unknown).
fn exec_error(command: &[String], e: wasmlet_runtime::Error) -> Outcome {
    match e {
        wasmlet_runtime::Error::Timeout { .. } => {
            Outcome::failure(format!("command {command:?} timed out: {e}"))
        }
        e => Outcome::unknown(format!("exec {command:?}: {e}")),
    }
}

async fn tcp_probe(host: &str, port: u16, timeout: Duration) -> Outcome {
    let addr = host_port(host, port);
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(&addr)).await {
        Ok(Ok(stream)) => {
            drop(stream);
            Outcome::success(String::new())
        }
        Ok(Err(e)) => Outcome::failure(format!("dial tcp {addr}: {e}")),
        Err(_) => Outcome::failure(format!("dial tcp {addr}: i/o timeout")),
    }
}

/// Aborts a spawned task when dropped, so a probe that times out leaves nothing.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn http_probe(http: &HTTPGetAction, pod_ip: &str, port: u16, timeout: Duration) -> Outcome {
    let scheme = http.scheme.as_deref().unwrap_or("HTTP").to_lowercase();
    let host = http
        .host
        .clone()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| pod_ip.to_owned());
    let mut path = http.path.clone().unwrap_or_default();
    if !path.starts_with('/') {
        path.insert(0, '/');
    }
    let url = format!("{scheme}://{}{path}", host_port(&host, port));
    let headers = RequestHeaders::of(http.http_headers.iter().flatten());
    match tokio::time::timeout(timeout, http_get(&url, &headers)).await {
        Err(_) => Outcome::failure(format!(
            "Get \"{url}\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
        )),
        Ok(Err(e)) => Outcome::failure(e),
        Ok(Ok((status, body))) => {
            if (200..300).contains(&status) {
                Outcome::success(body)
            } else if (300..400).contains(&status) {
                // A redirect that was not followed (another host, a code that is not
                // followed, no Location): the kubelet's probe.Warning.
                Outcome::warning(format!("Probe terminated redirects, Response body: {body}"))
            } else {
                Outcome::failure(format!("HTTP probe failed with statuscode: {status}"))
            }
        }
    }
}

/// The headers of a probe's requests, as the kubelet builds them (`buildHeader`,
/// `newProbeRequest`) and Go's client sends them.
#[derive(Debug, Default)]
struct RequestHeaders {
    /// The probe's `Host` (its first value), instead of the URL's authority.
    host: Option<String>,
    /// Sent once, if not empty.
    user_agent: String,
    /// Everything else, in order; repeated names are all sent.
    other: Vec<(String, String)>,
}

impl RequestHeaders {
    fn of<'a>(probe: impl IntoIterator<Item = &'a HTTPHeader>) -> Self {
        let mut h = RequestHeaders::default();
        let mut user_agent = None;
        let mut accept = None;
        for header in probe {
            let (name, value) = (header.name.as_str(), header.value.as_str());
            if name.eq_ignore_ascii_case("host") {
                h.host.get_or_insert_with(|| value.to_owned());
                continue;
            }
            if name.eq_ignore_ascii_case("user-agent") {
                user_agent.get_or_insert_with(|| value.to_owned());
                continue;
            }
            if name.eq_ignore_ascii_case("accept") {
                accept.get_or_insert_with(|| value.to_owned());
            }
            h.other.push((name.to_owned(), value.to_owned()));
        }
        h.host = h.host.filter(|v| !v.is_empty());
        // Only if the probe sets none; set but empty, none is sent (as Go's client).
        h.user_agent = user_agent.unwrap_or_else(|| USER_AGENT.to_owned());
        match accept.as_deref() {
            None => h.other.push(("Accept".into(), "*/*".into())),
            // Set to an empty value: the header is removed.
            Some("") => h.other.retain(|(k, _)| !k.eq_ignore_ascii_case("accept")),
            Some(_) => {}
        }
        h
    }

    fn has(&self, name: &str) -> bool {
        self.other.iter().any(|(k, _)| k.eq_ignore_ascii_case(name))
    }
}

/// What a redirected request sends besides the probe's headers.
struct Hop<'a> {
    /// The `Host` header: the probe's through relative redirects, else the URL's.
    host: Option<&'a str>,
    /// The previous URL (Go's client sets it on redirects).
    referer: Option<String>,
}

/// GETs `url` as the kubelet's probe client: follows 301, 302, 303, 307 and 308 on
/// the same host name (any port or scheme), sending at most 10 requests
/// (`len(via) >= 10`). Returns the last status and the start of its body; a redirect
/// that is not followed returns its own response. Errors are Go's `url.Error` text.
async fn http_get(url: &str, headers: &RequestHeaders) -> Result<(u16, String), String> {
    let first: hyper::Uri = url.parse().map_err(|e| format!("Get {url:?}: {e}"))?;
    let origin_host = first.host().unwrap_or("").to_owned();
    let mut uri = first;
    let mut hop = Hop {
        host: headers.host.as_deref(),
        referer: None,
    };
    let mut sent = 0;
    loop {
        let (status, location, body) = get_once(&uri, headers, &hop)
            .await
            .map_err(|e| format!("Get \"{uri}\": {e}"))?;
        sent += 1;
        let Some(location) =
            location.filter(|l| !l.is_empty() && matches!(status, 301 | 302 | 303 | 307 | 308))
        else {
            return Ok((status, body));
        };
        let next = resolve(&uri, &location).map_err(|e| {
            format!("Get \"{uri}\": failed to parse Location header {location:?}: {e}")
        })?;
        // The kubelet's RedirectChecker: another host name ends the chain with this
        // response; then Go's limit.
        if next.host().unwrap_or("") != origin_host {
            return Ok((status, body));
        }
        if sent >= MAX_REDIRECTS {
            return Err(format!(
                "Get {location:?}: stopped after {MAX_REDIRECTS} redirects"
            ));
        }
        // Go keeps a custom Host only through a Location without a scheme (issue 22233)
        // and sets Referer to the previous URL unless going from https to http.
        hop.host = headers.host.as_deref().filter(|_| !has_scheme(&location));
        hop.referer = (!(uri.scheme_str() == Some("https") && next.scheme_str() == Some("http")))
            .then(|| uri.to_string());
        uri = next;
    }
}

/// Whether a URI reference starts with a scheme (`http:`, `https:`, ...).
fn has_scheme(reference: &str) -> bool {
    let Some((scheme, _)) = reference.split_once(':') else {
        return false;
    };
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// Resolves a Location against the request's URL (RFC 3986, section 5.2); the
/// fragment is dropped, as a client does not send it.
fn resolve(base: &hyper::Uri, location: &str) -> Result<hyper::Uri, String> {
    let location = location.split_once('#').map_or(location, |(l, _)| l);
    if has_scheme(location) {
        return location.parse().map_err(|e| format!("{e}"));
    }
    let scheme = base.scheme_str().unwrap_or("http");
    if location.starts_with("//") {
        // Scheme-relative: another authority, the current scheme.
        return format!("{scheme}:{location}")
            .parse()
            .map_err(|e| format!("{e}"));
    }
    let (path, query) = match location.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (location, None),
    };
    let path = if path.is_empty() {
        base.path().to_owned()
    } else if path.starts_with('/') {
        remove_dot_segments(path)
    } else {
        let dir = base.path().rsplit_once('/').map_or("", |(d, _)| d);
        remove_dot_segments(&format!("{dir}/{path}"))
    };
    let query = match query {
        Some(q) => Some(q),
        None if location.is_empty() || location.starts_with('?') => base.query(),
        None => None,
    };
    let path_and_query = match query {
        Some(q) => format!("{path}?{q}"),
        None => path,
    };
    let mut parts = base.clone().into_parts();
    parts.path_and_query = Some(path_and_query.parse().map_err(|e| format!("{e}"))?);
    hyper::Uri::from_parts(parts).map_err(|e| format!("{e}"))
}

/// An absolute path without its `.` and `..` segments.
fn remove_dot_segments(path: &str) -> String {
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let mut out: Vec<&str> = Vec::new();
    for (i, segment) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        match *segment {
            "." => {}
            ".." => {
                out.pop();
            }
            s => {
                out.push(s);
                continue;
            }
        }
        if last {
            out.push("");
        }
    }
    format!("/{}", out.join("/"))
}

type Response = (u16, Option<String>, String);

async fn get_once(
    uri: &hyper::Uri,
    headers: &RequestHeaders,
    hop: &Hop<'_>,
) -> Result<Response, String> {
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") | None => false,
        Some(other) => return Err(format!("unsupported protocol scheme {other:?}")),
    };
    let host = uri
        .host()
        .ok_or("no host")?
        .trim_matches(['[', ']'])
        .to_owned();
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| format!("dial tcp {}: {e}", host_port(&host, port)))?;
    let authority = uri.authority().map_or("", |a| a.as_str());
    let mut req = hyper::Request::get(uri.path_and_query().map_or("/", |p| p.as_str()))
        .header("Host", hop.host.unwrap_or(authority));
    if !headers.user_agent.is_empty() {
        req = req.header("User-Agent", headers.user_agent.as_str());
    }
    for (k, v) in &headers.other {
        req = req.header(k.as_str(), v.as_str());
    }
    if let Some(referer) = hop.referer.as_deref().filter(|_| !headers.has("referer")) {
        req = req.header("Referer", referer);
    }
    let req = req
        .header("Connection", "close")
        .body(http_body_util::Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    if https {
        let tls = tls_connector()
            .connect(server_name(&host)?, tcp)
            .await
            .map_err(|e| format!("tls: {e}"))?;
        send(hyper_util::rt::TokioIo::new(tls), req).await
    } else {
        send(hyper_util::rt::TokioIo::new(tcp), req).await
    }
}

async fn send<T>(
    io: T,
    req: hyper::Request<http_body_util::Empty<Bytes>>,
) -> Result<Response, String>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    let _conn = AbortOnDrop(tokio::spawn(async move {
        let _ = conn.await;
    }));
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let location = resp
        .headers()
        .get(hyper::header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let mut body = Vec::new();
    let mut stream = resp.into_body();
    while body.len() < MAX_BODY {
        match stream.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    body.extend_from_slice(data);
                }
            }
            _ => break,
        }
    }
    body.truncate(MAX_BODY);
    Ok((
        status,
        location,
        String::from_utf8_lossy(&body).into_owned(),
    ))
}

fn server_name(host: &str) -> Result<rustls::pki_types::ServerName<'static>, String> {
    rustls::pki_types::ServerName::try_from(host.to_owned()).map_err(|e| format!("tls: {e}"))
}

/// The kubelet does not verify the certificates of HTTPS probes; neither does this.
fn tls_connector() -> tokio_rustls::TlsConnector {
    #[derive(Debug)]
    struct AnyCertificate(rustls::crypto::CryptoProvider);
    impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
        fn verify_server_cert(
            &self,
            _: &rustls::pki_types::CertificateDer<'_>,
            _: &[rustls::pki_types::CertificateDer<'_>],
            _: &rustls::pki_types::ServerName<'_>,
            _: &[u8],
            _: rustls::pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &rustls::pki_types::CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }
        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &rustls::pki_types::CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
    let provider = rustls::crypto::ring::default_provider();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(provider.clone()))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

async fn grpc_probe(host: &str, port: i32, service: &str, timeout: Duration) -> Outcome {
    use wasmlet_proto::grpc::health::v1::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
    };
    let addr = format!("http://{}", host_port(host, port.clamp(0, 65535) as u16));
    let check = async {
        let channel = match tonic::transport::Endpoint::from_shared(addr.clone()) {
            Ok(e) => e.connect_timeout(timeout).connect().await,
            Err(e) => return Err((false, e.to_string())),
        }
        .map_err(|_| {
            (
                false,
                format!("timeout: failed to connect service {addr:?} within {timeout:?}"),
            )
        })?;
        let mut client = HealthClient::new(channel);
        let request = HealthCheckRequest {
            service: service.to_owned(),
        };
        client
            .check(request)
            .await
            .map(|r| r.into_inner().status)
            .map_err(|s| {
                (
                    true,
                    format!("rpc error: code = {:?} desc = {}", s.code(), s.message()),
                )
            })
    };
    match tokio::time::timeout(timeout, check).await {
        Err(_) => Outcome::failure(format!(
            "timeout: health rpc did not complete within {timeout:?}"
        )),
        Ok(Err((_, message))) => Outcome::failure(message),
        Ok(Ok(status)) => {
            let status = ServingStatus::try_from(status).unwrap_or(ServingStatus::Unknown);
            if status == ServingStatus::Serving {
                Outcome::success(String::new())
            } else {
                Outcome::failure(format!(
                    "service unhealthy (responded with {:?})",
                    status.as_str_name()
                ))
            }
        }
    }
}

impl Outcome {
    pub fn success(output: impl Into<String>) -> Self {
        Outcome {
            result: ProbeResult::Success,
            output: output.into(),
            warning: false,
        }
    }

    /// A success the kubelet reports with a warning (a redirect it did not follow).
    pub fn warning(output: impl Into<String>) -> Self {
        Outcome {
            result: ProbeResult::Success,
            output: output.into(),
            warning: true,
        }
    }

    pub fn failure(output: impl Into<String>) -> Self {
        Outcome {
            result: ProbeResult::Failure,
            output: output.into(),
            warning: false,
        }
    }

    /// The probe could not be run (a missing named port, a runtime error): reported,
    /// but neither counted nor a result.
    pub fn unknown(output: impl Into<String>) -> Self {
        Outcome {
            result: ProbeResult::Unknown,
            output: output.into(),
            warning: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use k8s_openapi::api::core::v1::{HTTPHeader, TCPSocketAction};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpListener;

    use super::*;

    /// A tiny HTTP server: answers each request with `respond(request head)`; `None`
    /// keeps the connection open without answering. Records the request heads and
    /// whether each connection was closed by the client.
    struct Server {
        port: u16,
        heads: Arc<Mutex<Vec<String>>>,
        closed: Arc<Mutex<usize>>,
    }

    async fn server(respond: impl Fn(&str) -> Option<String> + Send + Sync + 'static) -> Server {
        let respond = Arc::new(respond);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let heads: Arc<Mutex<Vec<String>>> = Arc::default();
        let closed: Arc<Mutex<usize>> = Arc::default();
        let (h, c) = (heads.clone(), closed.clone());
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                let (h, c, respond) = (h.clone(), c.clone(), respond.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 8192];
                    let mut head = String::new();
                    while !head.contains("\r\n\r\n") {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => {
                                *c.lock().unwrap() += 1;
                                return;
                            }
                            Ok(n) => head.push_str(&String::from_utf8_lossy(&buf[..n])),
                        }
                    }
                    h.lock().unwrap().push(head.clone());
                    match respond(&head) {
                        Some(r) => {
                            let _ = s.write_all(r.as_bytes()).await;
                        }
                        None => {
                            // Hang until the client goes away.
                            while let Ok(n) = s.read(&mut buf).await {
                                if n == 0 {
                                    break;
                                }
                            }
                            *c.lock().unwrap() += 1;
                        }
                    }
                });
            }
        });
        Server {
            port,
            heads,
            closed,
        }
    }

    fn reply(status: &str, extra: &str, body: &str) -> String {
        format!(
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n{body}",
            body.len()
        )
    }

    fn path_of(head: &str) -> &str {
        head.split(' ').nth(1).unwrap_or("")
    }

    fn http(path: &str, port: u16, headers: &[(&str, &str)]) -> HTTPGetAction {
        HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(port.into()),
            http_headers: Some(
                headers
                    .iter()
                    .map(|(n, v)| HTTPHeader {
                        name: (*n).into(),
                        value: (*v).into(),
                    })
                    .collect(),
            ),
            ..Default::default()
        }
    }

    async fn routes() -> Server {
        server(|head| match path_of(head).split('?').next().unwrap_or("") {
            "/ok" => Some(reply("200 OK", "", "fine")),
            "/missing" => Some(reply("404 Not Found", "", "")),
            "/here" => Some(reply("302 Found", "Location: /ok\r\n", "")),
            "/away" => Some(reply(
                "302 Found",
                "Location: http://elsewhere.invalid:9/\r\n",
                "",
            )),
            "/away-relative-scheme" => Some(reply(
                "301 Moved Permanently",
                "Location: //elsewhere.invalid:9/ok\r\n",
                "",
            )),
            "/loop" => Some(reply("302 Found", "Location: /loop\r\n", "")),
            "/temporary" => Some(reply("307 Temporary Redirect", "Location: ok\r\n", "")),
            "/permanent" => Some(reply(
                "308 Permanent Redirect",
                "Location: ./a/../ok?x=1#frag\r\n",
                "",
            )),
            "/see-other" => Some(reply("303 See Other", "Location: /ok\r\n", "")),
            "/choices" => Some(reply("300 Multiple Choices", "Location: /ok\r\n", "pick")),
            "/not-modified" => Some(reply("304 Not Modified", "Location: /ok\r\n", "")),
            "/no-location" => Some(reply("302 Found", "", "nowhere")),
            "/big" => Some(reply("200 OK", "", &"x".repeat(100_000))),
            _ => None,
        })
        .await
    }

    const SECOND: Duration = Duration::from_secs(1);

    fn paths(s: &Server) -> Vec<String> {
        s.heads
            .lock()
            .unwrap()
            .iter()
            .map(|h| path_of(h).to_owned())
            .collect()
    }

    #[tokio::test]
    async fn http_probes_follow_the_kubelets_rules() {
        let s = routes().await;
        let probe = |path: &str| http(path, s.port, &[]);
        let ok = http_probe(&probe("/ok"), "127.0.0.1", s.port, SECOND).await;
        assert_eq!(
            (ok.result, ok.output.as_str(), ok.warning),
            (ProbeResult::Success, "fine", false)
        );
        let missing = http_probe(&probe("/missing"), "127.0.0.1", s.port, SECOND).await;
        assert_eq!(
            missing,
            Outcome::failure("HTTP probe failed with statuscode: 404")
        );
        // A redirect on the same host is followed; one to another host is not, and is
        // a success with a warning.
        let here = http_probe(&probe("/here"), "127.0.0.1", s.port, SECOND).await;
        assert_eq!((here.result, here.warning), (ProbeResult::Success, false));
        let away = http_probe(&probe("/away"), "127.0.0.1", s.port, SECOND).await;
        assert_eq!((away.result, away.warning), (ProbeResult::Success, true));
        assert!(
            away.output.starts_with("Probe terminated redirects"),
            "{away:?}"
        );
        let big = http_probe(&probe("/big"), "127.0.0.1", s.port, SECOND).await;
        assert_eq!(
            (big.result, big.output.len()),
            (ProbeResult::Success, MAX_BODY)
        );
        let paths = paths(&s);
        assert!(
            paths.contains(&"/ok".to_owned()) && !paths.iter().any(|p| p == "/"),
            "{paths:?}"
        );
    }

    #[tokio::test]
    async fn an_http_probe_sends_at_most_ten_requests() {
        let s = routes().await;
        let looping = http_probe(&http("/loop", s.port, &[]), "127.0.0.1", s.port, SECOND).await;
        assert_eq!(
            looping,
            Outcome::failure("Get \"/loop\": stopped after 10 redirects")
        );
        // Go's checkRedirect `len(via) >= 10`: the first request and 9 redirects.
        assert_eq!(paths(&s), vec!["/loop".to_owned(); 10]);
    }

    #[tokio::test]
    async fn only_the_redirect_codes_go_follows_are_followed() {
        let s = routes().await;
        for path in ["/temporary", "/permanent", "/see-other"] {
            let out = http_probe(&http(path, s.port, &[]), "127.0.0.1", s.port, SECOND).await;
            assert_eq!(out, Outcome::success("fine"), "{path}");
        }
        assert_eq!(
            paths(&s),
            [
                "/temporary",
                "/ok",
                "/permanent",
                "/ok?x=1",
                "/see-other",
                "/ok"
            ]
        );
        // Other 3xx codes, and a redirect without a Location, are the final response:
        // a success with a warning.
        s.heads.lock().unwrap().clear();
        for (path, body) in [
            ("/choices", "pick"),
            ("/not-modified", ""),
            ("/no-location", "nowhere"),
        ] {
            let out = http_probe(&http(path, s.port, &[]), "127.0.0.1", s.port, SECOND).await;
            assert_eq!(
                out,
                Outcome::warning(format!("Probe terminated redirects, Response body: {body}")),
                "{path}"
            );
        }
        assert_eq!(paths(&s), ["/choices", "/not-modified", "/no-location"]);
    }

    #[tokio::test]
    async fn a_scheme_relative_location_keeps_the_scheme_and_the_host_rule() {
        let target = routes().await;
        let port = target.port;
        let s = server(move |head| match path_of(head) {
            "/other-port" => Some(reply(
                "302 Found",
                &format!("Location: //127.0.0.1:{port}/ok\r\n"),
                "",
            )),
            _ => None,
        })
        .await;
        // The same host name on another port is followed.
        let out = http_probe(
            &http("/other-port", s.port, &[]),
            "127.0.0.1",
            s.port,
            SECOND,
        )
        .await;
        assert_eq!(out, Outcome::success("fine"));
        assert_eq!(paths(&target), ["/ok"]);
        // Another host is not.
        let away = http_probe(
            &http("/away-relative-scheme", port, &[]),
            "127.0.0.1",
            port,
            SECOND,
        )
        .await;
        assert_eq!((away.result, away.warning), (ProbeResult::Success, true));
        assert_eq!(paths(&target), ["/ok", "/away-relative-scheme"]);
    }

    #[tokio::test]
    async fn http_probes_send_the_kubelets_headers_and_the_probes_own() {
        let s = routes().await;
        let p = http(
            "/ok",
            s.port,
            &[
                ("X-Custom", "yes"),
                ("Host", "example.test"),
                ("X-Multi", "a"),
                ("x-multi", "b"),
            ],
        );
        assert_eq!(
            http_probe(&p, "127.0.0.1", s.port, SECOND).await.result,
            ProbeResult::Success
        );
        let head = s.heads.lock().unwrap()[0].to_lowercase();
        assert!(head.contains("user-agent: kube-probe/1.33"), "{head}");
        assert!(head.contains("accept: */*"), "{head}");
        assert!(head.contains("x-custom: yes"), "{head}");
        assert!(
            head.contains("x-multi: a") && head.contains("x-multi: b"),
            "every value is sent: {head}"
        );
        assert!(
            head.contains("host: example.test") && !head.contains("host: 127.0.0.1"),
            "{head}"
        );
        assert_eq!(head.matches("host:").count(), 1, "{head}");
        let p = http(
            "/ok",
            s.port,
            &[("User-Agent", "mine"), ("Accept", "text/plain")],
        );
        http_probe(&p, "127.0.0.1", s.port, SECOND).await;
        let head = s.heads.lock().unwrap()[1].to_lowercase();
        assert!(
            head.contains("user-agent: mine") && !head.contains("kube-probe"),
            "{head}"
        );
        assert!(
            head.contains("accept: text/plain") && !head.contains("*/*"),
            "{head}"
        );
        // An empty Accept removes the header; an empty User-Agent sends none.
        let p = http("/ok", s.port, &[("Accept", ""), ("User-Agent", "")]);
        http_probe(&p, "127.0.0.1", s.port, SECOND).await;
        let head = s.heads.lock().unwrap()[2].to_lowercase();
        assert!(
            !head.contains("accept:") && !head.contains("user-agent:"),
            "{head}"
        );
    }

    #[tokio::test]
    async fn a_redirect_carries_the_headers_a_referer_and_a_custom_host_if_relative() {
        let s = routes().await;
        let p = http(
            "/here",
            s.port,
            &[("Host", "example.test"), ("X-Custom", "yes")],
        );
        assert_eq!(
            http_probe(&p, "127.0.0.1", s.port, SECOND).await,
            Outcome::success("fine")
        );
        let heads = s.heads.lock().unwrap().clone();
        assert_eq!(heads.len(), 2);
        let second = heads[1].to_lowercase();
        assert!(second.starts_with("get /ok "), "{second}");
        assert!(
            second.contains("host: example.test") && second.contains("x-custom: yes"),
            "{second}"
        );
        assert!(
            second.contains(&format!("referer: http://127.0.0.1:{}/here", s.port)),
            "{second}"
        );
    }

    #[test]
    fn locations_resolve_against_the_request() {
        let base: hyper::Uri = "http://h:1/a/b?q=1".parse().unwrap();
        let r = |l: &str| resolve(&base, l).unwrap().to_string();
        assert_eq!(r("/x"), "http://h:1/x");
        assert_eq!(r("c"), "http://h:1/a/c");
        assert_eq!(r("../c?d=2#f"), "http://h:1/c?d=2");
        assert_eq!(r("?z"), "http://h:1/a/b?z");
        assert_eq!(r("//other:2/y"), "http://other:2/y");
        assert_eq!(r("https://h/z"), "https://h/z");
        assert_eq!(r("./.."), "http://h:1/");
        assert!(has_scheme("HTTP://x") && !has_scheme("/a:b") && !has_scheme("//h:1/"));
    }

    #[test]
    fn exec_errors_are_unknown_except_the_runtimes_timeout() {
        let command = vec!["check".to_owned()];
        let timeout = wasmlet_runtime::Error::Timeout {
            operation: "ExecSync",
            after: SECOND,
        };
        assert_eq!(exec_error(&command, timeout).result, ProbeResult::Failure);
        // Whatever its text says.
        for e in [
            wasmlet_runtime::Error::Internal("context deadline exceeded".into()),
            wasmlet_runtime::Error::Unavailable("timeout dialing".into()),
            wasmlet_runtime::Error::not_found("container", "c1"),
        ] {
            assert_eq!(exec_error(&command, e).result, ProbeResult::Unknown);
        }
    }

    #[tokio::test]
    async fn a_hung_http_probe_fails_at_its_timeout_and_closes_its_connection() {
        let s = routes().await;
        let began = std::time::Instant::now();
        let out = http_probe(
            &http("/hang", s.port, &[]),
            "127.0.0.1",
            s.port,
            Duration::from_millis(300),
        )
        .await;
        let took = began.elapsed();
        assert_eq!(out.result, ProbeResult::Failure);
        assert!(out.output.contains("context deadline exceeded"), "{out:?}");
        assert!(took < Duration::from_secs(2), "{took:?}");
        // The probe's connection is closed, not left open (no leaked socket or task).
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while *s.closed.lock().unwrap() == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the connection stayed open"
            );
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn tcp_probes_connect_and_close() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        assert_eq!(
            tcp_probe("127.0.0.1", port, SECOND).await.result,
            ProbeResult::Success
        );
        drop(listener);
        let refused = tcp_probe("127.0.0.1", port, SECOND).await;
        assert_eq!(refused.result, ProbeResult::Failure);
        assert!(refused.output.contains("refused"), "{refused:?}");
    }

    #[test]
    fn ports_are_numbers_or_container_port_names() {
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "c", "ports": [{"name": "http", "containerPort": 8080}],
        }))
        .unwrap();
        assert_eq!(port(&IntOrString::Int(80), &c), Ok(80));
        assert_eq!(port(&IntOrString::String("http".into()), &c), Ok(8080));
        assert_eq!(port(&IntOrString::String("81".into()), &c), Ok(81));
        assert!(
            port(&IntOrString::String("grpc".into()), &c)
                .unwrap_err()
                .contains("no container port named")
        );
        assert!(port(&IntOrString::Int(0), &c).is_err());
        assert!(port(&IntOrString::Int(70000), &c).is_err());
    }

    #[tokio::test]
    async fn a_probe_with_an_unknown_port_name_is_unknown_not_failed() {
        let c = Container::default();
        let probe = Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::String("nope".into()),
                host: None,
            }),
            ..Default::default()
        };
        let t = Target {
            probe: &probe,
            kind: crate::probe_results::ProbeKind::Liveness,
            container: &c,
            container_id: "id",
            pod_ip: "127.0.0.1",
            runtime: None,
            timeout: SECOND,
        };
        assert_eq!(run(&t).await.result, ProbeResult::Unknown);
    }

    #[tokio::test]
    async fn grpc_probes_call_the_health_service() {
        let server = wasmlet_testkit::health::HealthServer::start(true).unwrap();
        let port = i32::from(server.port);
        let serving = grpc_probe("127.0.0.1", port, "", SECOND).await;
        assert_eq!(serving.result, ProbeResult::Success, "{serving:?}");
        let down = grpc_probe("127.0.0.1", port, "db", SECOND).await;
        assert_eq!(
            down,
            Outcome::failure("service unhealthy (responded with \"NOT_SERVING\")")
        );
        let unknown = grpc_probe("127.0.0.1", port, "other", SECOND).await;
        assert_eq!(unknown.result, ProbeResult::Failure);
        assert!(unknown.output.contains("NotFound"), "{unknown:?}");
        let free = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let nobody = i32::from(free.local_addr().unwrap().port());
        drop(free);
        let refused = grpc_probe("127.0.0.1", nobody, "", SECOND).await;
        assert_eq!(refused.result, ProbeResult::Failure);
        assert!(refused.output.contains("failed to connect"), "{refused:?}");
    }
}
