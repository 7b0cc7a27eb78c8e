//! The cost of a plugin call next to the same work done natively, in one run.
//! `cargo xtask bench plugin-call` builds the example plugins and runs this in
//! release; by hand:
//!
//! ```text
//! cargo run --release -p wasmlet-plugin-host --example plugin_call -- \
//!     CALLS target/plugins/http-json-probe.component.wasm \
//!     target/plugins/priority-eviction.component.wasm
//! ```

use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wasmlet_plugin_host::types::{Candidate, Pair, PodInfo, ProbeRequest, ProbeResult};
use wasmlet_plugin_host::{
    HostOptions, Limits, PluginConfig, PluginHost, PluginSource, World, builtin_rank,
};

const BODY: &str = r#"{"status": "ok", "checks": {"db": "up"}}"#;

/// Between two measured calls: probes come seconds apart and admission once per
/// pod, so a call normally finds the instance made after the previous one ready.
const GAP: Duration = Duration::from_millis(1);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (json, args): (Vec<_>, Vec<_>) = args.into_iter().partition(|a| a == "--json");
    let json = !json.is_empty();
    let [calls, probe, eviction] = &args[..] else {
        anyhow::bail!("usage: plugin_call [--json] CALLS PROBE_COMPONENT EVICTION_COMPONENT");
    };
    let calls: usize = calls.parse().context("CALLS")?;
    let port = serve().await?;
    let request = ProbeRequest {
        pod: pod("p", 0),
        container: "c".into(),
        probe_type: "readiness".into(),
        pod_ips: vec!["127.0.0.1".into()],
        settings: vec![Pair {
            key: "port".into(),
            value: port.to_string(),
        }],
        timeout_ms: 1000,
    };
    let candidates: Vec<Candidate> = (0..20)
        .map(|i| Candidate {
            pod: pod(&format!("p{i}"), i % 3),
            usage: (i as u64 * 37) % 100,
            request: 50,
        })
        .collect();

    println!(
        "{calls} calls per case after {} warm-up calls, {GAP:?} between calls unless back to back",
        calls / 10
    );
    let mut rows = Vec::new();
    // Before (every call instantiates its own, memory reset by madvise), and each
    // of the two changes on its own and together (the default).
    for (mode, warm_instances, keep_resident_bytes) in [
        ("fresh, madvise (before)", false, 0),
        ("fresh, kept resident", false, 1 << 20),
        ("made ahead, madvise", true, 0),
        ("made ahead, kept resident", true, 1 << 20),
    ] {
        let host = PluginHost::new(HostOptions {
            warm_instances,
            keep_resident_bytes,
            ..HostOptions::default()
        })?;
        host.load(config("probe", World::Probe, probe)).await?;
        host.load(config("eviction", World::Eviction, eviction))
            .await?;
        let probe_calls = measure(calls, GAP, || async {
            let r = host.try_probe("probe", request.clone()).await.unwrap();
            assert_eq!(r, ProbeResult::Success);
        })
        .await;
        rows.push(row(mode, "http-json-probe plugin", &probe_calls));
        let rank = measure(calls, GAP, || async {
            host.try_rank("eviction", "memory.available", &candidates)
                .await
                .unwrap();
        })
        .await;
        rows.push(row(mode, "priority-eviction plugin, 20 pods", &rank));
        let empty = measure(calls, GAP, || async {
            host.try_rank("eviction", "memory.available", &[])
                .await
                .unwrap();
        })
        .await;
        rows.push(row(
            mode,
            "priority-eviction plugin, 0 pods (host overhead)",
            &empty,
        ));
        let back_to_back = measure(calls, Duration::ZERO, || async {
            host.try_rank("eviction", "memory.available", &[])
                .await
                .unwrap();
        })
        .await;
        rows.push(row(mode, "the same, back to back", &back_to_back));
        let prepared: u64 = host
            .plugins()
            .iter()
            .map(|p| p.metrics.prepared_calls)
            .sum();
        let all: u64 = host.plugins().iter().map(|p| p.metrics.calls).sum();
        println!("{mode}: {prepared} of {all} calls ran on an instance made ahead");
    }
    let native_probe = measure(calls, GAP, || async {
        native_http_json_check(port).await.unwrap();
    })
    .await;
    rows.push(row(
        "native",
        "the same GET + JSON check in Rust",
        &native_probe,
    ));
    let native_rank = measure(calls, GAP, || async {
        std::hint::black_box(builtin_rank(std::hint::black_box(&candidates)));
    })
    .await;
    rows.push(row("native", "builtin_rank in Rust, 20 pods", &native_rank));

    println!("{:<24} {:<50} {:>10} {:>10}", "mode", "case", "p50", "p99");
    for r in &rows {
        println!(
            "{:<24} {:<50} {:>8.1}µs {:>8.1}µs",
            r.mode, r.case, r.p50_us, r.p99_us
        );
    }
    let rss = std::fs::read_to_string("/proc/self/status")?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:").map(|v| v.trim().to_owned()))
        .unwrap_or_default();
    println!("RSS of this process (four hosts, eight plugins) at the end: {rss}");
    if json {
        println!("{}", serde_json::to_string(&rows)?);
    }
    Ok(())
}

fn config(name: &str, world: World, path: &str) -> PluginConfig {
    PluginConfig {
        name: name.into(),
        world,
        source: PluginSource::File(path.into()),
        limits: Limits::default(),
        grants: Default::default(),
        settings: [("field".to_string(), "status".to_string())].into(),
        failure_policy: None,
    }
}

#[derive(serde::Serialize)]
struct Row {
    mode: &'static str,
    case: &'static str,
    p50_us: f64,
    p99_us: f64,
}

fn row(mode: &'static str, case: &'static str, times: &[Duration]) -> Row {
    let p = |q: usize| times[(times.len() * q / 100).min(times.len() - 1)].as_secs_f64() * 1e6;
    Row {
        mode,
        case,
        p50_us: p(50),
        p99_us: p(99),
    }
}

/// `calls` timed calls of `f` after a tenth as many untimed ones, `gap` apart;
/// sorted.
async fn measure<F, Fut>(calls: usize, gap: Duration, f: F) -> Vec<Duration>
where
    F: Fn() -> Fut,
    Fut: Future<Output = ()>,
{
    for _ in 0..calls / 10 {
        f().await;
    }
    let mut times = Vec::with_capacity(calls);
    for _ in 0..calls {
        if !gap.is_zero() {
            tokio::time::sleep(gap).await;
        }
        let started = Instant::now();
        f().await;
        times.push(started.elapsed());
    }
    times.sort();
    times
}

fn pod(name: &str, priority: i32) -> PodInfo {
    PodInfo {
        namespace: "default".into(),
        name: name.into(),
        uid: name.into(),
        labels: vec![],
        annotations: vec![],
        qos_class: "Burstable".into(),
        priority,
        runtime_class: String::new(),
        containers: vec![],
    }
}

/// What the probe plugin does, in Rust: GET, status 2xx/3xx, `status` == `ok`.
async fn native_http_json_check(port: u16) -> anyhow::Result<()> {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let conn = tokio::spawn(conn);
    let request = hyper::Request::get("/")
        .header("host", format!("127.0.0.1:{port}"))
        .header("accept", "application/json")
        .body(Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await?;
    anyhow::ensure!(response.status().as_u16() < 400);
    let body = response.into_body().collect().await?.to_bytes();
    conn.abort();
    let json: serde_json::Value = serde_json::from_slice(&body)?;
    anyhow::ensure!(json["status"] == "ok");
    Ok(())
}

/// Answers every connection with [`BODY`].
async fn serve() -> anyhow::Result<u16> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0; 4096];
                let _ = s.read(&mut buf).await;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{BODY}",
                    BODY.len()
                );
                let _ = s.write_all(answer.as_bytes()).await;
            });
        }
    });
    Ok(port)
}
