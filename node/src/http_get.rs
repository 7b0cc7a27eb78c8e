//! The HTTP/1 client of the `httpGet` actions: the probes' (`prober::handlers`) and
//! the lifecycle hooks' (`hooks`). One GET per connection, over TCP or TLS (whose
//! certificate is not verified, as the kubelet's probes do not verify it); its
//! redirects, its body cap and its bound are the caller's [`Options`], its headers the
//! caller's [`Headers`]. Errors read as Go's `url.Error` (`Get "<url>": <cause>`).
//!
//! What a status means (a probe's success, warning or failure; a hook's error) is the
//! caller's business. Nothing here depends on the rest of the node.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt as _;

/// How much of a response body the kubelet's probes read (10 KiB).
pub const MAX_BODY: usize = 10 << 10;
/// How many requests a GET that follows redirects sends at most, redirects included
/// (Go's `len(via) >= 10`).
pub const MAX_REDIRECTS: usize = 10;

/// `host:port`, with an IPv6 address in brackets.
pub fn host_port(host: &str, port: impl fmt::Display) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The headers of a GET's requests.
#[derive(Debug, Default, Clone)]
pub struct Headers {
    /// The `Host` to send instead of the URL's authority (through relative redirects).
    host: Option<String>,
    /// Sent once, if not empty.
    user_agent: String,
    /// Everything else, in order; repeated names are all sent. A `Host` here is sent
    /// instead of the URL's authority.
    other: Vec<(String, String)>,
}

impl Headers {
    /// The headers of the kubelet's probe requests (`buildHeader`, `newProbeRequest`)
    /// as Go's client sends them: the action's, with `user_agent` unless the action
    /// sets a `User-Agent` (set but empty: none is sent) and `Accept: */*` unless it
    /// sets an `Accept` (set but empty: none is sent). The action's first `Host`, if
    /// not empty, replaces the URL's authority.
    pub fn kubelet<'a>(
        user_agent: &str,
        action: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Self {
        let mut h = Headers::default();
        let mut agent = None;
        let mut accept = None;
        for (name, value) in action {
            if name.eq_ignore_ascii_case("host") {
                h.host.get_or_insert_with(|| value.to_owned());
                continue;
            }
            if name.eq_ignore_ascii_case("user-agent") {
                agent.get_or_insert_with(|| value.to_owned());
                continue;
            }
            if name.eq_ignore_ascii_case("accept") {
                accept.get_or_insert_with(|| value.to_owned());
            }
            h.other.push((name.to_owned(), value.to_owned()));
        }
        h.host = h.host.filter(|v| !v.is_empty());
        h.user_agent = agent.unwrap_or_else(|| user_agent.to_owned());
        match accept.as_deref() {
            None => h.other.push(("Accept".into(), "*/*".into())),
            // Set to an empty value: the header is removed.
            Some("") => h.other.retain(|(k, _)| !k.eq_ignore_ascii_case("accept")),
            Some(_) => {}
        }
        h
    }

    /// The action's headers as they are, in order, every value; nothing is added but
    /// a `Host` (the URL's authority) when the action sets none.
    pub fn as_given<'a>(action: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        Headers {
            other: action
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            ..Headers::default()
        }
    }

    fn has(&self, name: &str) -> bool {
        self.other.iter().any(|(k, _)| k.eq_ignore_ascii_case(name))
    }
}

/// Which redirects a GET follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redirects {
    /// The kubelet's probe client: 301, 302, 303, 307 and 308 to the same host name
    /// (any port or scheme), at most [`MAX_REDIRECTS`] requests in all. A redirect to
    /// another host, or with another code or no `Location`, is the response.
    SameHost,
    /// None: a redirect is the response.
    None,
}

/// How a GET goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    pub redirects: Redirects,
    /// How much of the last response's body is read (0: none is).
    pub max_body: usize,
    /// The bound of the whole GET, redirects included (`None`: the caller bounds it).
    pub timeout: Option<Duration>,
}

impl Options {
    /// The kubelet's probe client: same-host redirects, 10 KiB of body, `timeout`.
    pub fn probe(timeout: Duration) -> Self {
        Options {
            redirects: Redirects::SameHost,
            max_body: MAX_BODY,
            timeout: Some(timeout),
        }
    }
}

/// The last response of a GET.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    /// The start of the body (at most [`Options::max_body`] bytes), lossily UTF-8.
    pub body: String,
}

/// Why a GET failed, as Go's `url.Error` says it: `Get "<url>": <cause>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// The URL, quoted as Go quotes it.
    url: String,
    cause: String,
}

impl Error {
    /// What failed, without the URL (`dial tcp 10.0.0.1:80: ...`, `stopped after 10
    /// redirects`, ...).
    pub fn cause(&self) -> &str {
        &self.cause
    }

    /// Whether the GET ran out of its [`Options::timeout`].
    pub fn is_timeout(&self) -> bool {
        self.cause == TIMEOUT
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Get {}: {}", self.url, self.cause)
    }
}

impl std::error::Error for Error {}

/// Go's client's words for its timeout.
const TIMEOUT: &str = "context deadline exceeded (Client.Timeout exceeded while awaiting headers)";

/// GETs `url` (`http` or `https`) with `headers`, following redirects as `options`
/// says. Returns the last response; a redirect that is not followed returns its own.
/// Every connection is closed, and every task ended, when this returns or is dropped.
pub async fn get(url: &str, headers: &Headers, options: Options) -> Result<Response, Error> {
    let run = follow(url, headers, options);
    match options.timeout {
        None => run.await,
        Some(timeout) => tokio::time::timeout(timeout, run)
            .await
            .unwrap_or_else(|_| {
                Err(Error {
                    url: format!("\"{url}\""),
                    cause: TIMEOUT.to_owned(),
                })
            }),
    }
}

/// What a redirected request sends besides the caller's headers.
struct Hop<'a> {
    /// The `Host` header: the caller's through relative redirects, else the URL's.
    host: Option<&'a str>,
    /// The previous URL (Go's client sets it on redirects).
    referer: Option<String>,
}

async fn follow(url: &str, headers: &Headers, options: Options) -> Result<Response, Error> {
    let first: hyper::Uri = url.parse().map_err(|e| Error {
        url: format!("{url:?}"),
        cause: format!("{e}"),
    })?;
    let origin_host = first.host().unwrap_or("").to_owned();
    let mut uri = first;
    let mut hop = Hop {
        host: headers.host.as_deref(),
        referer: None,
    };
    let mut sent = 0;
    loop {
        let at = |cause: String, uri: &hyper::Uri| Error {
            url: format!("\"{uri}\""),
            cause,
        };
        let (status, location, body) = get_once(&uri, headers, &hop, options.max_body)
            .await
            .map_err(|e| at(e, &uri))?;
        sent += 1;
        let done = Response { status, body };
        if options.redirects == Redirects::None {
            return Ok(done);
        }
        let Some(location) =
            location.filter(|l| !l.is_empty() && matches!(status, 301 | 302 | 303 | 307 | 308))
        else {
            return Ok(done);
        };
        let next = resolve(&uri, &location).map_err(|e| {
            at(
                format!("failed to parse Location header {location:?}: {e}"),
                &uri,
            )
        })?;
        // The kubelet's RedirectChecker: another host name ends the chain with this
        // response; then Go's limit.
        if next.host().unwrap_or("") != origin_host {
            return Ok(done);
        }
        if sent >= MAX_REDIRECTS {
            return Err(Error {
                url: format!("{location:?}"),
                cause: format!("stopped after {MAX_REDIRECTS} redirects"),
            });
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

/// A response's status, `Location` and the start of its body.
type Once = (u16, Option<String>, String);

/// One request on its own connection.
async fn get_once(
    uri: &hyper::Uri,
    headers: &Headers,
    hop: &Hop<'_>,
    max_body: usize,
) -> Result<Once, String> {
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
    let mut req = hyper::Request::get(uri.path_and_query().map_or("/", |p| p.as_str()));
    if !headers.has("host") {
        req = req.header("Host", hop.host.unwrap_or(authority));
    }
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
        send(hyper_util::rt::TokioIo::new(tls), req, max_body).await
    } else {
        send(hyper_util::rt::TokioIo::new(tcp), req, max_body).await
    }
}

/// Aborts a spawned task when dropped, so a GET that is dropped leaves nothing.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn send<T>(
    io: T,
    req: hyper::Request<http_body_util::Empty<Bytes>>,
    max_body: usize,
) -> Result<Once, String>
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
    while body.len() < max_body {
        match stream.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    body.extend_from_slice(data);
                }
            }
            _ => break,
        }
    }
    body.truncate(max_body);
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

/// A tiny HTTP server for the tests of this client's callers.
#[cfg(test)]
pub(crate) mod testing {
    use std::sync::{Arc, Mutex};

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpListener;

    /// Answers each request with `respond(request head)`; `None` keeps the connection
    /// open without answering. Records the request heads and whether each connection
    /// was closed by the client.
    pub(crate) struct Server {
        pub(crate) port: u16,
        pub(crate) heads: Arc<Mutex<Vec<String>>>,
        pub(crate) closed: Arc<Mutex<usize>>,
    }

    pub(crate) async fn server(
        respond: impl Fn(&str) -> Option<String> + Send + Sync + 'static,
    ) -> Server {
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

    pub(crate) fn reply(status: &str, extra: &str, body: &str) -> String {
        format!(
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n{body}",
            body.len()
        )
    }

    pub(crate) fn path_of(head: &str) -> &str {
        head.split(' ').nth(1).unwrap_or("")
    }

    impl Server {
        /// The paths requested so far.
        pub(crate) fn paths(&self) -> Vec<String> {
            self.heads
                .lock()
                .unwrap()
                .iter()
                .map(|h| path_of(h).to_owned())
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::testing::{reply, server};
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    const AS_IS: Options = Options {
        redirects: Redirects::None,
        max_body: 0,
        timeout: None,
    };

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
    fn host_port_brackets_ipv6() {
        assert_eq!(host_port("10.0.0.1", 80), "10.0.0.1:80");
        assert_eq!(host_port("::1", 8080), "[::1]:8080");
        assert_eq!(host_port("h", -1), "h:-1");
    }

    #[tokio::test]
    async fn without_redirects_a_redirect_is_the_response_and_no_body_is_read() {
        let s = server(|head| match super::testing::path_of(head) {
            "/here" => Some(reply("302 Found", "Location: /ok\r\n", "moved")),
            _ => Some(reply("200 OK", "", "fine")),
        })
        .await;
        let url = format!("http://127.0.0.1:{}/here", s.port);
        let got = get(&url, &Headers::as_given([]), AS_IS).await.unwrap();
        assert_eq!(
            got,
            Response {
                status: 302,
                body: String::new()
            }
        );
        assert_eq!(s.paths(), ["/here"]);
        let probe = get(&url, &Headers::kubelet("x", []), Options::probe(SECOND))
            .await
            .unwrap();
        assert_eq!(
            probe,
            Response {
                status: 200,
                body: "fine".into()
            }
        );
        assert_eq!(s.paths(), ["/here", "/here", "/ok"]);
    }

    #[tokio::test]
    async fn headers_as_given_add_nothing_but_a_host() {
        let s = server(|_| Some(reply("200 OK", "", ""))).await;
        let url = format!("http://127.0.0.1:{}/", s.port);
        get(
            &url,
            &Headers::as_given([("X-A", "1"), ("x-a", "2")]),
            AS_IS,
        )
        .await
        .unwrap();
        let head = s.heads.lock().unwrap()[0].to_lowercase();
        assert!(
            head.contains(&format!("host: 127.0.0.1:{}", s.port)),
            "{head}"
        );
        assert!(head.contains("x-a: 1") && head.contains("x-a: 2"), "{head}");
        assert!(
            !head.contains("user-agent") && !head.contains("accept"),
            "{head}"
        );
        // The action's own Host (even empty) is the one sent.
        for host in ["example.test", ""] {
            get(&url, &Headers::as_given([("Host", host)]), AS_IS)
                .await
                .unwrap();
            let heads = s.heads.lock().unwrap();
            let head = heads.last().unwrap().to_lowercase();
            assert_eq!(head.matches("host:").count(), 1, "{head}");
            assert!(head.contains(&format!("host: {host}\r\n")), "{head}");
        }
    }

    #[tokio::test]
    async fn a_body_that_never_ends_is_not_waited_for_unless_read() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 8192];
                    let _ = s.read(&mut buf).await;
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nab")
                        .await;
                    // Hang until the client goes away.
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                    }
                });
            }
        });
        let url = format!("http://127.0.0.1:{port}/");
        let got = get(&url, &Headers::as_given([]), AS_IS).await.unwrap();
        assert_eq!(got.status, 200);
        let hung = get(
            &url,
            &Headers::as_given([]),
            Options::probe(Duration::from_millis(200)),
        )
        .await
        .unwrap_err();
        assert!(hung.is_timeout(), "{hung}");
        assert_eq!(
            hung.to_string(),
            format!(
                "Get \"{url}\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
            )
        );
    }

    #[tokio::test]
    async fn errors_read_as_gos_and_give_their_cause() {
        let free = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = free.local_addr().unwrap().port();
        drop(free);
        let url = format!("http://127.0.0.1:{port}/x");
        let e = get(&url, &Headers::as_given([]), AS_IS).await.unwrap_err();
        assert!(!e.is_timeout());
        assert!(
            e.cause()
                .starts_with(&format!("dial tcp 127.0.0.1:{port}: ")),
            "{e}"
        );
        assert_eq!(e.to_string(), format!("Get \"{url}\": {}", e.cause()));
        let e = get("ftp://h/", &Headers::as_given([]), AS_IS)
            .await
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "Get \"ftp://h/\": unsupported protocol scheme \"ftp\""
        );
        let e = get("http://h:80x/", &Headers::as_given([]), AS_IS)
            .await
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("Get \"http://h:80x/\": {}", e.cause())
        );
    }
}
