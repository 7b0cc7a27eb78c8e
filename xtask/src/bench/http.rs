//! `bench http`: requests per second and p50/p99 latency of the `hello-http`
//! `wasi:http/proxy` component served by a standalone node, beside the same handler
//! as a native hyper server in this process and beside the `httpd` example (a
//! `wasi:sockets` server that closes every connection), at 1, 16 and 64 concurrent
//! connections, all driven by `wrk` (Debian's; installed when missing) in one run.
//!
//! The node runs its pods on its own network (no CNI configuration), so each server
//! listens on 127.0.0.1; the three servers and wrk share the machine's two cores.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use wasmlet_testkit::node::{NodeOptions, TestNode, free_port};

use super::build_node;

const PROXY_BODY: &str = "hello from wasi:http\n";
const CONNECTIONS: [u32; 3] = [1, 16, 64];

/// What wrk measured.
#[derive(Debug, Clone, Copy, Default)]
struct Figures {
    requests_per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: u64,
}

fn ensure_wrk() -> anyhow::Result<()> {
    if Command::new("wrk").arg("--version").output().is_ok() {
        return Ok(());
    }
    eprintln!("installing wrk (Debian package) for the load");
    let status = Command::new("apt-get")
        .args(["install", "-y", "-qq", "wrk"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .context("running apt-get")?;
    if !status.success() {
        bail!("apt-get install wrk failed");
    }
    Ok(())
}

/// wrk's `--latency` distribution value (`1.23ms`, `456.00us`, `1.01s`) in ms.
fn millis(v: &str) -> Option<f64> {
    let (n, unit) = v.split_at(v.find(|c: char| c.is_ascii_alphabetic())?);
    let n: f64 = n.parse().ok()?;
    Some(match unit {
        "us" => n / 1000.0,
        "ms" => n,
        "s" => n * 1000.0,
        "m" => n * 60_000.0,
        _ => return None,
    })
}

fn parse_wrk(out: &str) -> Figures {
    let mut f = Figures::default();
    for line in out.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["Requests/sec:", v] => f.requests_per_second = v.parse().unwrap_or_default(),
            ["50%", v] => f.p50_ms = millis(v).unwrap_or_default(),
            ["99%", v] => f.p99_ms = millis(v).unwrap_or_default(),
            ["Non-2xx", "or", "3xx", "responses:", n] => {
                f.errors += n.parse::<u64>().unwrap_or_default()
            }
            ["Socket", "errors:", rest @ ..] => {
                f.errors += rest
                    .iter()
                    .filter_map(|w| w.trim_end_matches(',').parse::<u64>().ok())
                    .sum::<u64>()
            }
            _ => {}
        }
    }
    f
}

fn wrk(url: &str, connections: u32, seconds: u64) -> anyhow::Result<Figures> {
    let threads = connections.min(2);
    let out = Command::new("wrk")
        .args([
            &format!("-t{threads}"),
            &format!("-c{connections}"),
            &format!("-d{seconds}s"),
            "--latency",
            url,
        ])
        .output()
        .context("running wrk")?;
    if !out.status.success() {
        bail!("wrk failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(parse_wrk(&String::from_utf8_lossy(&out.stdout)))
}

/// The native baseline: `hello-http`'s `/` as a hyper server, on a runtime of its own.
fn native_server(port: u16) -> anyhow::Result<tokio::runtime::Runtime> {
    use http_body_util::Full;
    use hyper::body::Bytes;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let listener = rt.block_on(tokio::net::TcpListener::bind(("127.0.0.1", port)))?;
    rt.spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|_req| async {
                    Ok::<_, std::convert::Infallible>(
                        hyper::Response::builder()
                            .header("content-type", "text/plain")
                            .body(Full::new(Bytes::from_static(PROXY_BODY.as_bytes())))
                            .expect("a valid response"),
                    )
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .keep_alive(true)
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(rt)
}

fn wait_answering(port: u16, path: &str) -> anyhow::Result<()> {
    wasmlet_testkit::node::poll(Duration::from_secs(60), || {
        wasmlet_testkit::node::http_get(port, path)
            .ok()
            .filter(|(code, _)| *code == 200)
    })
    .map(drop)
    .with_context(|| format!("nothing answered 200 on 127.0.0.1:{port}{path}"))
}

pub fn http(seconds: u64, debug: bool) -> anyhow::Result<()> {
    ensure_wrk()?;
    let binary = build_node(debug)?;
    let (proxy_port, httpd_port, native_port) = (free_port(), free_port(), free_port());
    let node = TestNode::start(
        &binary,
        NodeOptions {
            images: vec!["hello-http".into(), "httpd".into()],
            ..Default::default()
        },
    )?;
    node.write_manifest(
        "proxy.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: proxy\nspec:\n  containers:\n  - name: main\n    image: localhost/wasmlet-examples/hello-http:latest\n    ports: [{{containerPort: {proxy_port}}}]\n"
        ),
    )?;
    node.write_manifest(
        "httpd.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: httpd\nspec:\n  containers:\n  - name: main\n    image: localhost/wasmlet-examples/httpd:latest\n    env: [{{name: PORT, value: \"{httpd_port}\"}}]\n"
        ),
    )?;
    let _native = native_server(native_port)?;
    wait_answering(proxy_port, "/")?;
    wait_answering(httpd_port, "/healthz")?;
    wait_answering(native_port, "/")?;
    let _node: TestNode = node;

    let servers = [
        ("wasi:http hello-http (wasmlet)", proxy_port, "/"),
        ("native hyper, same handler", native_port, "/"),
        (
            "httpd example (wasi:sockets, closes)",
            httpd_port,
            "/healthz",
        ),
    ];
    println!(
        "{} build, {seconds} s per case, wrk on 127.0.0.1, 2 cores",
        if debug { "debug" } else { "release" }
    );
    println!(
        "| server | connections | requests/s | p50 ms | p99 ms | errors |\n| --- | --- | --- | --- | --- | --- |"
    );
    let mut json = Vec::new();
    for connections in CONNECTIONS {
        for (name, port, path) in servers {
            let f = wrk(
                &format!("http://127.0.0.1:{port}{path}"),
                connections,
                seconds,
            )?;
            println!(
                "| {name} | {connections} | {:.0} | {:.3} | {:.3} | {} |",
                f.requests_per_second, f.p50_ms, f.p99_ms, f.errors
            );
            json.push(serde_json::json!({
                "server": name,
                "connections": connections,
                "requests_per_second": f.requests_per_second,
                "p50_ms": f.p50_ms,
                "p99_ms": f.p99_ms,
                "errors": f.errors,
            }));
        }
    }
    println!("{}", serde_json::Value::Array(json));
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn wrk_output_is_read() {
        let out = "Running 2s test @ http://127.0.0.1:1/\n  2 threads and 16 connections\n  Latency Distribution\n     50%  412.00us\n     75%  1.02ms\n     90%  2.00ms\n     99%    1.20s\n  20000 requests in 2.00s, 1.5MB read\n  Socket errors: connect 0, read 3, write 0, timeout 1\n  Non-2xx or 3xx responses: 2\nRequests/sec:  10000.50\n";
        let f = super::parse_wrk(out);
        assert_eq!(f.requests_per_second, 10000.5);
        assert_eq!(f.p50_ms, 0.412);
        assert_eq!(f.p99_ms, 1200.0);
        assert_eq!(f.errors, 6);
    }
}
