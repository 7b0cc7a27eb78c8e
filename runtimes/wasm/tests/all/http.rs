//! `wasi:http/proxy` components: the `hello-http` example is served on its
//! container's port, a new instance per request, over keep-alive connections, with the
//! container's environment and memory limit, and request lines in its log.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use wasmlet_runtime::{ContainerState, Runtime};
use wasmlet_runtime_wasm::crilog::Stream;

use crate::fixture::{
    DEADLINE, Fixture, lines, log_records, poll_until, wait_for_stdout_line, with_env,
};

/// One request on an open connection and its answer (status, body), read by its
/// `content-length`.
fn exchange(
    conn: &mut BufReader<TcpStream>,
    method: &str,
    path: &str,
    body: &str,
) -> Result<(u16, String)> {
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: pod\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.get_mut().write_all(request.as_bytes())?;
    let mut status = String::new();
    conn.read_line(&mut status)?;
    let code: u16 = status
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("status line {status:?}"))?;
    let mut length = None;
    loop {
        let mut line = String::new();
        conn.read_line(&mut line)?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse::<usize>().ok();
        }
    }
    let Some(length) = length else {
        bail!("no content-length in the answer to {method} {path}");
    };
    let mut body = vec![0; length];
    conn.read_exact(&mut body)?;
    Ok((code, String::from_utf8(body)?))
}

async fn connect(port: u16) -> Result<BufReader<TcpStream>> {
    tokio::task::spawn_blocking(move || {
        let s = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), DEADLINE)?;
        s.set_read_timeout(Some(DEADLINE))?;
        Ok(BufReader::new(s))
    })
    .await?
}

#[tokio::test]
async fn a_wasi_http_component_is_served_on_its_port_one_instance_per_request() -> Result<()> {
    let fx = Fixture::with_images(&["hello-http"])?;
    let pod = fx.pod("web").await?;
    let port = crate::network::free_port()?;
    let mut config = with_env(
        pod.container("web", "hello-http"),
        &[("GREETING", "hi there")],
    );
    config.ports = vec![port];
    config.resources.memory_limit_bytes = Some(32 << 20);
    let id = fx.run(&pod, &config).await?;
    let log = fx
        .wait_for_state(&id, ContainerState::Running)
        .await?
        .log_path;
    wait_for_stdout_line(&log, &format!("wasi:http/proxy serving on 0.0.0.0:{port}")).await?;

    // Several requests on one connection (keep-alive), each a new instance: the
    // container's environment reaches them, a body is read.
    let answers = {
        let mut conn = connect(port).await?;
        tokio::task::spawn_blocking(move || -> Result<Vec<(u16, String)>> {
            Ok(vec![
                exchange(&mut conn, "GET", "/", "")?,
                exchange(&mut conn, "GET", "/env?name=GREETING", "")?,
                exchange(&mut conn, "POST", "/echo?x=1", "a body")?,
                exchange(&mut conn, "GET", "/nowhere", "")?,
                // Past the 32 MiB limit: that request fails...
                exchange(&mut conn, "GET", "/alloc?mib=64", "")?,
                // ...and the next one, in a new instance, does not.
                exchange(&mut conn, "GET", "/alloc?mib=8", "")?,
            ])
        })
        .await??
    };
    assert_eq!(
        answers,
        [
            (200, "hello from wasi:http\n".to_owned()),
            (200, "hi there\n".to_owned()),
            (200, "POST\n/echo?x=1\na body\n".to_owned()),
            (404, "not found\n".to_owned()),
            (500, "the handler failed\n".to_owned()),
            (200, "allocated 8 MiB\n".to_owned()),
        ]
    );
    assert_eq!(
        fx.runtime.container_status(&id).await?.state,
        ContainerState::Running,
        "a failed request does not end the server"
    );

    // The log: the guest's own output and a line per request.
    let logged = poll_until("the last request's log line", async || {
        let out = lines(&log_records(&log)?, Stream::Stdout);
        Ok(out
            .iter()
            .any(|l| l.starts_with("GET /alloc?mib=8 200 "))
            .then_some(out))
    })
    .await?;
    for prefix in [
        "GET / 200 ",
        "GET /env?name=GREETING 200 ",
        "echo /echo?x=1",
        "POST /echo?x=1 200 ",
        "GET /nowhere 404 ",
        "GET /alloc?mib=64 500 ",
    ] {
        ensure!(
            logged.iter().any(|l| l.starts_with(prefix)),
            "no {prefix:?} in {logged:#?}"
        );
    }

    // There is no command to exec in a proxy.
    let err = fx
        .runtime
        .exec_sync(&id, &["web".into()], Duration::from_secs(10))
        .await
        .expect_err("no exec in a proxy");
    ensure!(
        err.to_string()
            .contains("wasi:http/proxy component has no command"),
        "{err}"
    );

    // Stopped: the port is closed.
    fx.runtime
        .stop_container(&id, Duration::from_secs(5))
        .await?;
    assert_eq!(
        fx.runtime.container_status(&id).await?.state,
        ContainerState::Exited
    );
    ensure!(
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), DEADLINE).is_err(),
        "the port still answers"
    );
    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    Ok(())
}
