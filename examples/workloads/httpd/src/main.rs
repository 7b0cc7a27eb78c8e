//! `httpd`: a tiny HTTP/1.1 server for the node's probes to hit (httpGet and
//! tcpSocket), with switches that make those probes fail on demand.
//!
//! WASI preview 1 has no sockets, so it listens through WASI 0.2's
//! `wasi:sockets` (the `wasi` crate's bindings) and only runs as a component:
//! the image `httpd` is this module wrapped into a `wasi:cli/command`
//! component, whose preview 1 adapter serves std's stdout, environment and
//! files. One thread serves every connection: `wasi:io/poll` waits on the
//! listener and on each open connection at once, so a request that is never
//! answered does not hold up anyone else.
//!
//! Configuration, from the environment:
//! - `PORT` (default 8080): listens on `0.0.0.0:PORT`.
//! - `FAIL_AFTER=N`: the first N requests to `/healthz` get 200, later ones 500.
//! - `HANG_PATHS=/a,/b`: requests for these paths are read and never answered;
//!   the connection stays open until the client gives up.
//! - `READY=0`: start not ready (see `/ready` and `/flip`).
//! - `UNREADY_FILE=/path`: `/ready` answers 503 while this file exists (it must
//!   be in a mounted volume to be visible).
//!
//! Routes (any other path is 404, any method but GET or HEAD 405):
//! - `/healthz`: 200 `ok` (or 500, see `FAIL_AFTER`).
//! - `/ready`: 200 `ready`, or 503 `not ready`.
//! - `/flip`: toggles readiness, answers with the new state.
//! - `/status`: 200 `{"status":"ok","requests":N}`, N counting every request.
//! - `/redirect?to=URL`: 302 to URL (percent-decoded).
//! - `/headers`: the request's headers, one `name: value` line each.
//!
//! `httpd fetch A.B.C.D:PORT [PATH]` is a client instead: it GETs `PATH` (default `/`)
//! from that address over `wasi:sockets`, prints the response's status line and body
//! to stdout, and exits 0 for a 2xx answer, 1 otherwise (pods and execs use it to
//! reach other pods).
//!
//! Every response closes its connection. Each request is logged to stdout as
//! `<method> <target> <code>` (`-` for an unanswered one); `listening on PORT`
//! is printed once the socket listens. A client that connects and closes
//! without a word (a tcpSocket probe) is simply forgotten.

use std::process::ExitCode;

use wasi::io::poll::{Pollable, poll};
use wasi::io::streams::{InputStream, OutputStream, StreamError};
use wasi::sockets::network::{
    ErrorCode, IpAddressFamily, IpSocketAddress, Ipv4SocketAddress, Network,
};
use wasi::sockets::tcp::{ShutdownType, TcpSocket};

/// The longest request head (request line and headers) accepted, in bytes.
const MAX_HEAD: usize = 16 * 1024;
/// How much one read asks for.
const READ_CHUNK: u64 = 4096;
/// The most `blocking-write-and-flush` takes at once.
const WRITE_CHUNK: usize = 4096;

struct Config {
    port: u16,
    fail_after: Option<u64>,
    hang_paths: Vec<String>,
    ready: bool,
    unready_file: Option<String>,
}

impl Config {
    /// Reads the environment; every bad value is reported, then the first error returned.
    fn from_env() -> Result<Config, String> {
        let mut errors = Vec::new();
        let port = match std::env::var("PORT") {
            Err(_) => 8080,
            Ok(raw) => raw.trim().parse().unwrap_or_else(|_| {
                errors.push(format!("PORT={raw:?} is not a port number"));
                0
            }),
        };
        let fail_after = match std::env::var("FAIL_AFTER") {
            Err(_) => None,
            Ok(raw) if raw.trim().is_empty() => None,
            Ok(raw) => match raw.trim().parse() {
                Ok(n) => Some(n),
                Err(_) => {
                    errors.push(format!("FAIL_AFTER={raw:?} is not a non-negative integer"));
                    None
                }
            },
        };
        let hang_paths = std::env::var("HANG_PATHS")
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(String::from)
            .collect();
        let ready = match std::env::var("READY").as_deref() {
            Err(_) | Ok("1" | "true") => true,
            Ok("0" | "false") => false,
            Ok(raw) => {
                errors.push(format!("READY={raw:?} is not one of 0, 1, true, false"));
                true
            }
        };
        let unready_file = std::env::var("UNREADY_FILE").ok().filter(|f| !f.is_empty());
        if errors.is_empty() {
            Ok(Config {
                port,
                fail_after,
                hang_paths,
                ready,
                unready_file,
            })
        } else {
            Err(errors.join("; "))
        }
    }
}

/// What the server remembers between requests.
struct State {
    config: Config,
    requests: u64,
    healthz: u64,
    ready: bool,
}

/// One accepted connection. Fields drop in order: the pollable before the
/// stream it watches, the streams before their socket (the host refuses to
/// drop a resource whose children are alive).
struct Conn {
    readable: Pollable,
    input: InputStream,
    output: OutputStream,
    socket: TcpSocket,
    head: Vec<u8>,
    /// The request was for a hang path: read and discard until the client leaves.
    hung: bool,
}

/// What became of a connection after a read.
enum Next {
    Keep,
    Close,
}

// This module exports `cabi_realloc` (from the `wasi` crate's bindings), which the
// preview 1 adapter also allocates through. In a command module wasm-ld wraps every
// export in a call to the static constructors unless the module references
// `__wasm_call_ctors` itself; a wrapped `cabi_realloc` would run wasi-libc's preopen
// set-up again while the host is lowering the preopen list into this instance, which
// the component model forbids ("cannot leave component instance"). `_start` runs the
// constructors once; this reference only opts out of the wrappers.
unsafe extern "C" {
    fn __wasm_call_ctors();
}
#[used]
static RUNS_ITS_OWN_CTORS: unsafe extern "C" fn() = __wasm_call_ctors;

fn main() -> ExitCode {
    // argv[0] is the program's name, whatever it is; the mode is the first argument.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(at) = args.iter().position(|a| a == "fetch") {
        let Some(target) = args.get(at + 1) else {
            eprintln!("httpd: usage: httpd fetch A.B.C.D:PORT [PATH]");
            return ExitCode::from(2);
        };
        let path = args.get(at + 2).map(String::as_str).unwrap_or("/");
        return match fetch(target, path) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(1),
            Err(e) => {
                eprintln!("httpd: fetch {target}{path}: {e}");
                ExitCode::from(1)
            }
        };
    }
    let config = match Config::from_env() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("httpd: {e}");
            return ExitCode::from(2);
        }
    };
    let port = config.port;
    let network = wasi::sockets::instance_network::instance_network();
    let listener = match listen(&network, port) {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("httpd: cannot listen on 0.0.0.0:{port}: {e}");
            return ExitCode::from(1);
        }
    };
    println!("listening on {port}");
    let ready = config.ready;
    let mut state = State {
        config,
        requests: 0,
        healthz: 0,
        ready,
    };
    serve(&listener, &mut state);
    ExitCode::SUCCESS
}

/// GETs `path` from `target` (`A.B.C.D:PORT`), prints the status line and body:
/// whether the status was 2xx.
fn fetch(target: &str, path: &str) -> Result<bool, String> {
    let (host, port) = target
        .rsplit_once(':')
        .ok_or_else(|| format!("{target:?} is not A.B.C.D:PORT"))?;
    let ip: std::net::Ipv4Addr = host.parse().map_err(|e| format!("{host:?}: {e}"))?;
    let port: u16 = port.parse().map_err(|e| format!("{port:?}: {e}"))?;
    let [a, b, c, d] = ip.octets();
    let network = wasi::sockets::instance_network::instance_network();
    let socket = wasi::sockets::tcp_create_socket::create_tcp_socket(IpAddressFamily::Ipv4)
        .map_err(|e| e.to_string())?;
    let address = IpSocketAddress::Ipv4(Ipv4SocketAddress {
        port,
        address: (a, b, c, d),
    });
    socket
        .start_connect(&network, address)
        .map_err(|e| format!("connect: {e}"))?;
    let (input, output) = loop {
        match socket.finish_connect() {
            Err(ErrorCode::WouldBlock) => socket.subscribe().block(),
            Err(e) => return Err(format!("connect: {e}")),
            Ok(streams) => break streams,
        }
    };
    let request = format!("GET {path} HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n");
    for chunk in request.as_bytes().chunks(WRITE_CHUNK) {
        output
            .blocking_write_and_flush(chunk)
            .map_err(|e| format!("write: {e:?}"))?;
    }
    let mut response = Vec::new();
    loop {
        match input.blocking_read(READ_CHUNK) {
            Ok(data) => response.extend(data),
            Err(StreamError::Closed) => break,
            Err(e) => return Err(format!("read: {e:?}")),
        }
    }
    drop((input, output));
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.lines().next().unwrap_or_default();
    println!("{status}");
    print!("{body}");
    Ok(status.split(' ').nth(1).is_some_and(|code| code.starts_with('2')))
}

/// A TCP socket listening on `0.0.0.0:port`.
fn listen(network: &Network, port: u16) -> Result<TcpSocket, ErrorCode> {
    let socket = wasi::sockets::tcp_create_socket::create_tcp_socket(IpAddressFamily::Ipv4)?;
    let address = IpSocketAddress::Ipv4(Ipv4SocketAddress {
        port,
        address: (0, 0, 0, 0),
    });
    socket.start_bind(network, address)?;
    finish(&socket, TcpSocket::finish_bind)?;
    socket.start_listen()?;
    finish(&socket, TcpSocket::finish_listen)?;
    Ok(socket)
}

/// Completes a two-phase socket operation, waiting while it would block.
fn finish(
    socket: &TcpSocket,
    op: impl Fn(&TcpSocket) -> Result<(), ErrorCode>,
) -> Result<(), ErrorCode> {
    loop {
        match op(socket) {
            Err(ErrorCode::WouldBlock) => socket.subscribe().block(),
            result => return result,
        }
    }
}

/// Serves forever: waits on the listener and every connection, accepts what is
/// pending and reads what has arrived.
fn serve(listener: &TcpSocket, state: &mut State) {
    let acceptable = listener.subscribe();
    let mut conns: Vec<Conn> = Vec::new();
    loop {
        let ready = {
            let mut pollables = Vec::with_capacity(conns.len() + 1);
            pollables.push(&acceptable);
            pollables.extend(conns.iter().map(|c| &c.readable));
            poll(&pollables)
        };
        // Indexes of connections to close, highest first so removal keeps the rest valid.
        let mut closed = Vec::new();
        let mut accept_now = false;
        for index in ready {
            match index {
                0 => accept_now = true,
                i => {
                    let i = i as usize - 1;
                    if let Next::Close = on_readable(&mut conns[i], state) {
                        closed.push(i);
                    }
                }
            }
        }
        closed.sort_unstable_by(|a, b| b.cmp(a));
        for i in closed {
            // Its resources drop in field order.
            conns.swap_remove(i);
        }
        if accept_now {
            accept_pending(listener, &mut conns);
        }
    }
}

/// Accepts every pending connection.
fn accept_pending(listener: &TcpSocket, conns: &mut Vec<Conn>) {
    loop {
        match listener.accept() {
            Ok((socket, input, output)) => conns.push(Conn {
                readable: input.subscribe(),
                input,
                output,
                socket,
                head: Vec::new(),
                hung: false,
            }),
            Err(ErrorCode::WouldBlock) => return,
            // The client gave up before we got to it: nothing to answer.
            Err(ErrorCode::ConnectionAborted) => {}
            // A limit was hit; the listener itself is fine, try again later.
            Err(e) => {
                eprintln!("httpd: accept: {e}");
                return;
            }
        }
    }
}

/// Reads what arrived on a connection and answers once the request head is complete.
fn on_readable(conn: &mut Conn, state: &mut State) -> Next {
    let data = match conn.input.read(READ_CHUNK) {
        Ok(data) => data,
        // The client closed (or reset) the connection; if it never sent a
        // request, that was a tcpSocket probe or a port scan.
        Err(StreamError::Closed | StreamError::LastOperationFailed(_)) => return Next::Close,
    };
    if conn.hung {
        return Next::Keep;
    }
    conn.head.extend_from_slice(&data);
    let Some(end) = head_end(&conn.head) else {
        if conn.head.len() > MAX_HEAD {
            let response = Response::text(431, "request header fields too large\n");
            respond(conn, "-", "-", &response);
            return Next::Close;
        }
        return Next::Keep;
    };
    state.requests += 1;
    let head = String::from_utf8_lossy(&conn.head[..end]).into_owned();
    let Some(request) = Request::parse(&head) else {
        respond(conn, "-", "-", &Response::text(400, "bad request\n"));
        return Next::Close;
    };
    let path = request.path();
    if state.config.hang_paths.iter().any(|p| p == path) {
        println!("{} {} -", request.method, request.target);
        conn.hung = true;
        conn.head = Vec::new();
        return Next::Keep;
    }
    let response = route(&request, state);
    respond(conn, request.method, request.target, &response);
    Next::Close
}

/// Where the request head ends (after its blank line), if it has arrived.
fn head_end(buf: &[u8]) -> Option<usize> {
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

struct Request<'a> {
    method: &'a str,
    target: &'a str,
    headers: Vec<(&'a str, &'a str)>,
}

impl<'a> Request<'a> {
    /// Parses `METHOD TARGET HTTP/1.x` and the header lines; `None` if malformed.
    fn parse(head: &'a str) -> Option<Request<'a>> {
        let mut lines = head.lines().map(|l| l.trim_end_matches('\r'));
        let mut parts = lines.next()?.split(' ').filter(|p| !p.is_empty());
        let method = parts.next()?;
        let target = parts.next()?;
        let version = parts.next()?;
        if parts.next().is_some() || !version.starts_with("HTTP/1.") || !target.starts_with('/') {
            return None;
        }
        let mut headers = Vec::new();
        for line in lines.take_while(|l| !l.is_empty()) {
            let (name, value) = line.split_once(':')?;
            headers.push((name.trim(), value.trim()));
        }
        Some(Request {
            method,
            target,
            headers,
        })
    }

    fn path(&self) -> &'a str {
        self.target.split_once('?').map_or(self.target, |(p, _)| p)
    }

    /// The percent-decoded value of query parameter `name`.
    fn query(&self, name: &str) -> Option<String> {
        let (_, query) = self.target.split_once('?')?;
        query
            .split('&')
            .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| percent_decode(v))
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

struct Response {
    code: u16,
    headers: Vec<(&'static str, String)>,
    body: String,
}

impl Response {
    fn text(code: u16, body: impl Into<String>) -> Response {
        Response {
            code,
            headers: vec![("Content-Type", "text/plain; charset=utf-8".into())],
            body: body.into(),
        }
    }

    fn header(mut self, name: &'static str, value: impl Into<String>) -> Response {
        self.headers.push((name, value.into()));
        self
    }

    /// The bytes on the wire; `HEAD` gets the headers only.
    fn encode(&self, head_only: bool) -> Vec<u8> {
        let mut out = format!("HTTP/1.1 {} {}\r\n", self.code, reason(self.code));
        for (name, value) in &self.headers {
            out.push_str(&format!("{name}: {value}\r\n"));
        }
        out.push_str(&format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n",
            self.body.len()
        ));
        if !head_only {
            out.push_str(&self.body);
        }
        out.into_bytes()
    }
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        302 => "Found",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "",
    }
}

fn route(request: &Request, state: &mut State) -> Response {
    if !matches!(request.method, "GET" | "HEAD") {
        return Response::text(405, "method not allowed\n").header("Allow", "GET, HEAD");
    }
    match request.path() {
        "/healthz" => {
            state.healthz += 1;
            match state.config.fail_after {
                Some(n) if state.healthz > n => Response::text(500, "failing\n"),
                _ => Response::text(200, "ok\n"),
            }
        }
        "/ready" => {
            if is_ready(state) {
                Response::text(200, "ready\n")
            } else {
                Response::text(503, "not ready\n")
            }
        }
        "/flip" => {
            state.ready = !state.ready;
            Response::text(
                200,
                if state.ready {
                    "ready\n"
                } else {
                    "not ready\n"
                },
            )
        }
        "/status" => Response {
            code: 200,
            headers: vec![("Content-Type", "application/json".into())],
            body: format!("{{\"status\":\"ok\",\"requests\":{}}}", state.requests),
        },
        "/redirect" => match request.query("to") {
            Some(to) if !to.is_empty() && !to.contains(['\r', '\n']) => {
                Response::text(302, format!("redirecting to {to}\n")).header("Location", to)
            }
            _ => Response::text(400, "missing query parameter to=<url>\n"),
        },
        "/headers" => {
            let body: String = request
                .headers
                .iter()
                .map(|(name, value)| format!("{name}: {value}\n"))
                .collect();
            Response::text(200, body)
        }
        _ => Response::text(404, "not found\n"),
    }
}

fn is_ready(state: &State) -> bool {
    let file_says_unready = state
        .config
        .unready_file
        .as_deref()
        .is_some_and(|f| std::fs::metadata(f).is_ok());
    state.ready && !file_says_unready
}

/// Writes the response, logs it, and half-closes the connection.
fn respond(conn: &Conn, method: &str, target: &str, response: &Response) {
    let bytes = response.encode(method == "HEAD");
    for chunk in bytes.chunks(WRITE_CHUNK) {
        if conn.output.blocking_write_and_flush(chunk).is_err() {
            break; // The client is gone; nothing more to say.
        }
    }
    println!("{method} {target} {}", response.code);
    let _ = conn.socket.shutdown(ShutdownType::Send);
}
