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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [calls, probe, eviction] = &args[..] else {
        anyhow::bail!("usage: plugin_call CALLS PROBE_COMPONENT EVICTION_COMPONENT");
    };
    let calls: usize = calls.parse().context("CALLS")?;
    let host = PluginHost::new(HostOptions::default())?;
    let config = |name: &str, world, path: &str| PluginConfig {
        name: name.into(),
        world,
        source: PluginSource::File(path.into()),
        limits: Limits::default(),
        grants: Default::default(),
        settings: [("field".to_string(), "status".to_string())].into(),
        failure_policy: None,
    };
    host.load(config("probe", World::Probe, probe)).await?;
    host.load(config("eviction", World::Eviction, eviction))
        .await?;
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

    println!("{calls} calls each, after {} warm-up calls", calls / 10);
    let plugin_probe = measure(calls, || async {
        let r = host.try_probe("probe", request.clone()).await.unwrap();
        assert_eq!(r, ProbeResult::Success);
    })
    .await;
    report("http-json-probe plugin", &plugin_probe);
    let native_probe = measure(calls, || async {
        native_http_json_check(port).await.unwrap();
    })
    .await;
    report("the same GET + JSON check, native", &native_probe);
    let plugin_rank = measure(calls, || async {
        host.try_rank("eviction", "memory.available", &candidates)
            .await
            .unwrap();
    })
    .await;
    report("priority-eviction plugin (20 pods)", &plugin_rank);
    let native_rank = measure(calls, || async {
        std::hint::black_box(builtin_rank(std::hint::black_box(&candidates)));
    })
    .await;
    report("builtin_rank, native (20 pods)", &native_rank);
    Ok(())
}

async fn measure<F, Fut>(calls: usize, f: F) -> Vec<Duration>
where
    F: Fn() -> Fut,
    Fut: Future<Output = ()>,
{
    for _ in 0..calls / 10 {
        f().await;
    }
    let mut times = Vec::with_capacity(calls);
    for _ in 0..calls {
        let started = Instant::now();
        f().await;
        times.push(started.elapsed());
    }
    times.sort();
    times
}

fn report(what: &str, times: &[Duration]) {
    let p = |q: usize| times[(times.len() * q / 100).min(times.len() - 1)];
    println!("{what:<40} p50 {:>10.1?}  p99 {:>10.1?}", p(50), p(99));
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
