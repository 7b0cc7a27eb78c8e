//! The real plugins of `examples/plugins`, built with the SDK for `wasm32-wasip1`
//! and componentized with the preview 1 adapter: each example does its job, each
//! hostile one ends in a clear error, and the host and a good plugin keep working.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wasmlet_plugin_host::types::{Decision, NodeState, Pair, PodInfo, ProbeRequest, ProbeResult};
use wasmlet_plugin_host::{CallError, FilesystemGrant, PluginConfig, PluginHost, World};

use crate::{candidates, config, host, pod};

fn plugins() -> &'static BTreeMap<String, PathBuf> {
    static PLUGINS: OnceLock<BTreeMap<String, PathBuf>> = OnceLock::new();
    PLUGINS.get_or_init(|| {
        wasmlet_testkit::images::ensure_plugins().expect("building the example plugins")
    })
}

async fn load(host: &PluginHost, name: &str, world: World, settings: &[(&str, &str)]) {
    let mut c = config(name, world);
    c.settings = settings
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    load_config(host, c).await;
}

async fn load_config(host: &PluginHost, c: PluginConfig) {
    let file = plugins()[c.name.as_str()].clone();
    let bytes = tokio::fs::read(&file).await.unwrap();
    host.load_bytes(c, bytes).await.unwrap();
}

async fn good_eviction(host: &PluginHost) {
    load(host, "priority-eviction", World::Eviction, &[]).await;
}

async fn good_still_works(host: &PluginHost) {
    assert_eq!(
        host.try_rank("priority-eviction", "memory.available", &candidates())
            .await
            .unwrap(),
        [1, 2, 0]
    );
}

fn request(pod_ips: &[&str], settings: &[(&str, &str)], timeout_ms: u32) -> ProbeRequest {
    ProbeRequest {
        pod: pod("p", 0),
        container: "c".into(),
        probe_type: "readiness".into(),
        pod_ips: pod_ips.iter().map(|s| s.to_string()).collect(),
        settings: settings
            .iter()
            .map(|(k, v)| Pair {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        timeout_ms,
    }
}

/// An HTTP server answering every request with `body`, once per connection.
async fn serve(body: &'static str) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = vec![0; 4096];
                let _ = s.read(&mut buf).await;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(answer.as_bytes()).await;
            });
        }
    });
    port
}

#[tokio::test]
async fn http_json_probe_checks_a_field_of_the_answer() {
    let (host, _) = host();
    load(
        &host,
        "http-json-probe",
        World::Probe,
        &[("field", "status")],
    )
    .await;
    let ok = serve(r#"{"status": "ok"}"#).await.to_string();
    let bad = serve(r#"{"status": "starting"}"#).await.to_string();
    let r = host
        .try_probe(
            "http-json-probe",
            request(&["127.0.0.1"], &[("port", &ok), ("path", "/healthz")], 2000),
        )
        .await
        .unwrap();
    assert_eq!(r, ProbeResult::Success);
    let r = host
        .try_probe(
            "http-json-probe",
            request(&["127.0.0.1"], &[("port", &bad)], 2000),
        )
        .await
        .unwrap();
    assert!(
        matches!(&r, ProbeResult::Failure(m) if m.contains("starting")),
        "{r:?}"
    );
    // No pod IP that the plugin may reach.
    let r = host
        .try_probe("http-json-probe", request(&[], &[("port", &ok)], 2000))
        .await
        .unwrap();
    assert!(matches!(r, ProbeResult::Failure(_)), "{r:?}");
}

#[tokio::test]
async fn require_label_admission_denies_a_pod_without_the_label() {
    let (host, _) = host();
    load(
        &host,
        "require-label-admission",
        World::Admission,
        &[("label", "team")],
    )
    .await;
    let node = NodeState {
        node_name: "n".into(),
        allocatable: vec![],
        requested: vec![],
        pod_count: 0,
        labels: vec![],
    };
    let d = host
        .try_admit("require-label-admission", pod("p", 0), node.clone())
        .await
        .unwrap();
    assert!(
        matches!(&d, Decision::Deny(d) if d.reason == "MissingLabel"),
        "{d:?}"
    );
    let labelled = PodInfo {
        labels: vec![Pair {
            key: "team".into(),
            value: "a".into(),
        }],
        ..pod("p", 0)
    };
    assert_eq!(
        host.try_admit("require-label-admission", labelled, node)
            .await
            .unwrap(),
        Decision::Admit
    );
}

#[tokio::test]
async fn priority_eviction_ranks_like_the_builtin() {
    let (host, _) = host();
    good_eviction(&host).await;
    good_still_works(&host).await;
    assert_eq!(
        host.try_rank("priority-eviction", "memory.available", &candidates())
            .await
            .unwrap(),
        wasmlet_plugin_host::builtin_rank(&candidates())
    );
}

#[tokio::test]
async fn widget_device_discovers_and_allocates() {
    let (host, _) = host();
    load(
        &host,
        "widget-device",
        World::DeviceAdapter,
        &[("count", "2"), ("unhealthy", "widget-1")],
    )
    .await;
    assert_eq!(
        host.resource_name("widget-device").as_deref(),
        Some("example.com/widget")
    );
    let devices = host.try_discover("widget-device").await.unwrap();
    let ids: Vec<(&str, bool)> = devices.iter().map(|d| (d.id.as_str(), d.healthy)).collect();
    assert_eq!(ids, [("widget-0", true), ("widget-1", false)]);
    let a = host
        .allocate("widget-device", vec!["widget-0".into()])
        .await
        .unwrap()
        .unwrap();
    assert!(
        a.envs
            .iter()
            .any(|p| p.key == "WIDGET_IDS" && p.value == "widget-0"),
        "{a:?}"
    );
    let err = host
        .allocate("widget-device", vec!["widget-9".into()])
        .await
        .unwrap();
    assert!(err.is_err());
    let ids = host
        .try_preferred_allocation(
            "widget-device",
            &["widget-1".into(), "widget-0".into()],
            &[],
            1,
        )
        .await
        .unwrap();
    assert_eq!(ids, ["widget-0"]);
}

/// Loads hostile plugin `name` with `settings` and `limits`, calls it once and
/// returns the outcome; then checks a good plugin still answers.
async fn hostile(
    name: &str,
    settings: &[(&str, &str)],
    edit: impl FnOnce(&mut PluginConfig),
) -> (Result<ProbeResult, CallError>, Duration) {
    let (host, _) = host();
    good_eviction(&host).await;
    let mut c = config(name, World::Probe);
    c.settings = settings
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    edit(&mut c);
    load_config(&host, c).await;
    let started = Instant::now();
    let r = host.try_probe(name, request(&["127.0.0.1"], &[], 0)).await;
    let took = started.elapsed();
    good_still_works(&host).await;
    // The host can still load and run the same plugin's neighbour.
    assert!(host.plugins().len() == 2);
    (r, took)
}

#[tokio::test]
async fn hostile_loop_times_out() {
    let (r, took) = hostile("hostile-loop", &[], |c| c.limits.timeout_millis = 300).await;
    assert_eq!(
        r.unwrap_err(),
        CallError::Timeout(Duration::from_millis(300))
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[tokio::test]
async fn hostile_membomb_is_out_of_memory() {
    let (r, _) = hostile("hostile-membomb", &[], |_| {}).await;
    assert_eq!(r.unwrap_err(), CallError::OutOfMemory { cap: 16 << 20 });
}

#[tokio::test]
async fn hostile_trap_traps_in_every_mode() {
    for mode in ["panic", "unreachable", "divide", "abort"] {
        let (r, _) = hostile("hostile-trap", &[("mode", mode)], |_| {}).await;
        let err = r.unwrap_err();
        assert!(matches!(err, CallError::Trap(_)), "{mode}: {err}");
    }
}

#[tokio::test]
async fn hostile_huge_result_is_invalid() {
    let (r, _) = hostile("hostile-huge", &[("bytes", "4194304")], |c| {
        c.limits.memory_bytes = 48 << 20;
    })
    .await;
    let err = r.unwrap_err();
    assert!(matches!(err, CallError::InvalidResult(_)), "{err}");
    // The default 64 MiB answer does not even fit the memory cap.
    let (r, _) = hostile("hostile-huge", &[], |_| {}).await;
    assert_eq!(r.unwrap_err(), CallError::OutOfMemory { cap: 16 << 20 });
}

#[tokio::test]
async fn hostile_file_is_denied_without_a_grant_and_reads_with_one() {
    let (r, _) = hostile("hostile-file", &[], |_| {}).await;
    let r = r.unwrap();
    assert!(
        matches!(&r, ProbeResult::Failure(m) if m.starts_with("denied:")),
        "{r:?}"
    );

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("state"), "x").unwrap();
    let host_path = dir.path().to_path_buf();
    let (r, _) = hostile("hostile-file", &[("path", "/data/state")], |c| {
        c.grants.filesystem = vec![FilesystemGrant {
            host_path,
            guest_path: "/data".into(),
            read_only: true,
        }];
    })
    .await;
    assert_eq!(r.unwrap(), ProbeResult::Success);
}

#[tokio::test]
async fn hostile_socket_is_denied_without_a_grant_and_connects_with_one() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let settings = [("ip", "127.0.0.1"), ("port", port.as_str())];
    let (r, _) = hostile("hostile-socket", &settings, |_| {}).await;
    let r = r.unwrap();
    assert!(
        matches!(&r, ProbeResult::Failure(m) if m.starts_with("denied:")),
        "{r:?}"
    );
    let (r, _) = hostile("hostile-socket", &settings, |c| c.grants.network = true).await;
    assert_eq!(r.unwrap(), ProbeResult::Success);
}
