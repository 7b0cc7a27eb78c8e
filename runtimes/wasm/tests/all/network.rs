//! A guest that serves the network: the `httpd` example component listens on a TCP
//! port through `wasi:sockets`, and the test talks to it over loopback with plain
//! std sockets, as the node's httpGet and tcpSocket probes will.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use wasmlet_runtime::{ContainerState, Runtime};
use wasmlet_runtime_wasm::crilog::Stream;

use crate::fixture::{
    DEADLINE, Fixture, lines, log_records, poll_until, wait_for_stdout_line, with_env, within,
};

/// The paths the server is told never to answer.
const HANG_PATH: &str = "/hang";

/// A port nobody listens on right now: bound by the kernel's choice, then released.
pub(crate) fn free_port() -> Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

fn addr(port: u16) -> SocketAddr {
    (Ipv4Addr::LOCALHOST, port).into()
}

/// An HTTP response as the test reads it.
#[derive(Debug)]
struct Reply {
    code: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// `GET path` with extra request headers, read until the server closes the
/// connection (it answers every request with `Connection: close`).
fn get_blocking(port: u16, path: &str, headers: &[(&str, &str)]) -> Result<Reply> {
    let mut stream = TcpStream::connect_timeout(&addr(port), DEADLINE)?;
    stream.set_read_timeout(Some(DEADLINE))?;
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes())?;
    let mut raw = String::new();
    stream
        .read_to_string(&mut raw)
        .with_context(|| format!("reading the answer to GET {path}"))?;
    let Some((head, body)) = raw.split_once("\r\n\r\n") else {
        bail!("no complete response head to GET {path}: {raw:?}");
    };
    let mut head_lines = head.split("\r\n");
    let status = head_lines.next().unwrap_or_default();
    let code = status
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .with_context(|| format!("bad status line {status:?}"))?;
    let headers = head_lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Ok(Reply {
        code,
        headers,
        body: body.to_owned(),
    })
}

/// [`get_blocking`] off the async runtime's threads.
async fn get_with(port: u16, path: &str, headers: &[(&str, &str)]) -> Result<Reply> {
    let path = path.to_owned();
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
        .collect();
    tokio::task::spawn_blocking(move || {
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        get_blocking(port, &path, &headers)
    })
    .await?
}

async fn get(port: u16, path: &str) -> Result<Reply> {
    get_with(port, path, &[]).await
}

/// Asserts `GET path` answers `code` with `body`.
async fn expect(port: u16, path: &str, code: u16, body: &str) -> Result<()> {
    let reply = get(port, path).await?;
    ensure!(
        (reply.code, reply.body.as_str()) == (code, body),
        "GET {path}: wanted {code} {body:?}, got {reply:#?}"
    );
    Ok(())
}

/// The server's stdout so far.
fn stdout(log: &Path) -> Result<Vec<String>> {
    Ok(lines(&log_records(log)?, Stream::Stdout))
}

#[tokio::test]
async fn httpd_serves_probes_over_wasi_sockets_and_fails_on_demand() -> Result<()> {
    let fx = Fixture::with_images(&["httpd"])?;
    let pod = fx.pod("httpd").await?;
    let port = free_port()?;
    let config = with_env(
        pod.container("httpd", "httpd"),
        &[
            ("PORT", &port.to_string()),
            ("FAIL_AFTER", "3"),
            ("HANG_PATHS", HANG_PATH),
        ],
    );
    let id = fx.run(&pod, &config).await?;
    let status = fx.wait_for_state(&id, ContainerState::Running).await?;
    let log = status.log_path;
    wait_for_stdout_line(&log, &format!("listening on {port}")).await?;

    // A tcpSocket probe: connect, say nothing, close. The server shrugs it off.
    drop(TcpStream::connect_timeout(&addr(port), DEADLINE)?);
    expect(port, "/healthz", 200, "ok\n").await?; // healthz 1 of 3

    // Readiness flips on request.
    expect(port, "/ready", 200, "ready\n").await?;
    expect(port, "/flip", 200, "not ready\n").await?;
    expect(port, "/ready", 503, "not ready\n").await?;
    expect(port, "/flip", 200, "ready\n").await?;
    expect(port, "/ready", 200, "ready\n").await?;

    // A request that is never answered does not hold up the next connection.
    let mut hung = TcpStream::connect_timeout(&addr(port), DEADLINE)?;
    hung.write_all(format!("GET {HANG_PATH} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())?;
    let hang_line = format!("GET {HANG_PATH} -");
    wait_for_stdout_line(&log, &hang_line).await?;
    expect(port, "/healthz", 200, "ok\n").await?; // healthz 2 of 3
    hung.set_nonblocking(true)?;
    let mut buf = [0u8; 64];
    match hung.read(&mut buf) {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => bail!("the hung request got an answer: {other:?}"),
    }

    // Probe headers come back as sent; redirects carry their Location.
    let reply = get_with(port, "/headers", &[("X-Probe", "liveness")]).await?;
    assert_eq!(reply.code, 200, "{reply:#?}");
    assert!(
        reply.body.lines().any(|l| l == "X-Probe: liveness"),
        "{reply:#?}"
    );
    let reply = get(port, "/redirect?to=http%3A%2F%2F127.0.0.1%2Fhealthz").await?;
    assert_eq!(
        (reply.code, reply.header("Location")),
        (302, Some("http://127.0.0.1/healthz")),
        "{reply:#?}"
    );
    expect(port, "/nowhere", 404, "not found\n").await?;

    // FAIL_AFTER=3: the third /healthz passes, the fourth fails.
    expect(port, "/healthz", 200, "ok\n").await?;
    expect(port, "/healthz", 500, "failing\n").await?;

    // 14 requests: 4 /healthz, 5 readiness, the hung one, 3 more and this one.
    let reply = get(port, "/status").await?;
    assert_eq!(
        (
            reply.code,
            reply.header("Content-Type"),
            reply.body.as_str()
        ),
        (
            200,
            Some("application/json"),
            r#"{"status":"ok","requests":14}"#
        ),
        "{reply:#?}"
    );
    let logged = poll_until("the /status request in the log", async || {
        let lines = stdout(&log)?;
        Ok(lines
            .iter()
            .any(|l| l == "GET /status 200")
            .then_some(lines))
    })
    .await?;
    for want in [
        "GET /healthz 200",
        "GET /ready 503",
        "GET /flip 200",
        hang_line.as_str(),
        "GET /nowhere 404",
        "GET /healthz 500",
    ] {
        assert!(logged.iter().any(|l| l == want), "{want:?} in {logged:#?}");
    }
    // One line per request, nothing for the silent connection.
    assert_eq!(logged.len(), 1 + 14, "{logged:#?}");
    assert_eq!(status.state, ContainerState::Running);

    // Stopping the server, even with a connection still open, frees the port.
    within(
        "stop_container",
        fx.runtime.stop_container(&id, Duration::from_secs(30)),
    )
    .await??;
    let status = fx.runtime.container_status(&id).await?;
    assert_eq!(
        (status.state, status.exit_code),
        (ContainerState::Exited, 137),
        "{status:#?}"
    );
    let refused = TcpStream::connect_timeout(&addr(port), DEADLINE);
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.kind() == ErrorKind::ConnectionRefused),
        "{refused:?}"
    );
    hung.set_nonblocking(false)?;
    hung.set_read_timeout(Some(DEADLINE))?;
    let closed = hung.read(&mut buf);
    assert!(
        matches!(closed, Ok(0))
            || closed
                .as_ref()
                .is_err_and(|e| e.kind() == ErrorKind::ConnectionReset),
        "the hung connection outlived the server: {closed:?}"
    );

    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    Ok(())
}
