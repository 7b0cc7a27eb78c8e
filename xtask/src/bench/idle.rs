//! `bench idle`: an idle node's own CPU and memory, with each pod source on its own
//! and together, so a source that wakes itself shows as a figure (issue 25).
//!
//! Each case starts a fresh node, waits until it has settled (healthy; Ready in the
//! API when joined; its pod Running where it has one), then reads its CPU time from
//! `/proc/<pid>/stat` over the window and its RSS at the end.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::Node;
use wasmlet_testkit::apiserver::ApiServer;
use wasmlet_testkit::node::{NodeOptions, TestNode, cpu_share, poll, rss_kib};

use super::build_node;

const SETTLE_TIMEOUT: Duration = Duration::from_secs(120);

/// A ticker pod, as a static manifest.
fn ticker_yaml(name: &str) -> String {
    super::pod_yaml(name)
}

/// The pod sources of one case.
struct Case {
    name: &'static str,
    /// `--pod-manifest-path` (an empty directory unless `static_pod`).
    file: bool,
    /// One ticker pod in the manifest directory.
    static_pod: bool,
    /// `--manifest-url` serving one ticker pod.
    url: bool,
    /// `--kubeconfig` to the testkit API server (no pods bound).
    api: bool,
}

const CASES: [Case; 6] = [
    Case {
        name: "no pod source",
        file: false,
        static_pod: false,
        url: false,
        api: false,
    },
    Case {
        name: "file, empty directory",
        file: true,
        static_pod: false,
        url: false,
        api: false,
    },
    Case {
        name: "file, one pod",
        file: true,
        static_pod: true,
        url: false,
        api: false,
    },
    Case {
        name: "URL, one pod",
        file: false,
        static_pod: false,
        url: true,
        api: false,
    },
    Case {
        name: "API server, no pods",
        file: false,
        static_pod: false,
        url: false,
        api: true,
    },
    Case {
        name: "API server + file, empty",
        file: true,
        static_pod: false,
        url: false,
        api: true,
    },
];

/// A loopback HTTP server that answers every request with `body` (the manifest URL).
fn serve_manifest(body: String) -> anyhow::Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let url = format!("http://{}/pods", listener.local_addr()?);
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request);
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: application/yaml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    Ok(url)
}

/// A testkit API server on loopback, and the runtime serving it.
pub(super) struct Cluster {
    pub api: ApiServer,
    _rt: tokio::runtime::Runtime,
}

/// An API server whose kubeconfig for `node_name` is written to `kubeconfig`.
pub(super) fn start_cluster(kubeconfig: &Path, node_name: &str) -> anyhow::Result<Cluster> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let api = ApiServer::new();
    rt.block_on(api.serve_tcp(0))?;
    api.write_kubeconfig(kubeconfig, &format!("system:node:{node_name}"))?;
    Ok(Cluster { api, _rt: rt })
}

pub fn idle(seconds: u64, debug: bool) -> anyhow::Result<()> {
    let binary = build_node(debug)?;
    let window = Duration::from_secs(seconds);
    let scratch = tempfile::tempdir()?;
    println!(
        "idle ({} build; the node's own CPU over {seconds} s from /proc/<pid>/stat, RSS at the end)",
        if debug { "debug" } else { "release" }
    );
    println!("  {:<26} {:>12} {:>10}", "pod sources", "CPU (core)", "RSS");
    for case in &CASES {
        let mut opts = NodeOptions {
            node_name: "idle".into(),
            images: vec!["ticker".into()],
            static_pods: case.file,
            ..Default::default()
        };
        let cluster = if case.api {
            let kubeconfig = scratch.path().join("kubeconfig");
            let cluster = start_cluster(&kubeconfig, &opts.node_name)?;
            opts.extra_args.extend([
                "--kubeconfig".into(),
                kubeconfig.display().to_string(),
                "--node-ip".into(),
                "127.0.0.1".into(),
            ]);
            Some(cluster)
        } else {
            None
        };
        if case.url {
            opts.extra_args.extend([
                "--manifest-url".into(),
                serve_manifest(ticker_yaml("fromurl"))?,
            ]);
        }
        let node = TestNode::start(&binary, opts)?;
        if case.static_pod {
            node.write_manifest("ticker.yaml", &ticker_yaml("ticker"))?;
        }
        let settled = poll(SETTLE_TIMEOUT, || {
            if let Some(c) = &cluster {
                let ready = c.api.get::<Node>(None, &node.node_name).is_some_and(|n| {
                    n.status.and_then(|s| s.conditions).is_some_and(|cs| {
                        cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                    })
                });
                if !ready {
                    return None;
                }
            }
            let want = usize::from(case.static_pod) + usize::from(case.url);
            (super::running_pods(&node).len() == want).then_some(())
        });
        settled.with_context(|| format!("{}: the node did not settle", case.name))?;
        let share = cpu_share(node.pid(), window)?;
        println!(
            "  {:<26} {:>10.2} % {:>6.1} MiB",
            case.name,
            share * 100.0,
            rss_kib(node.pid()) as f64 / 1024.0
        );
    }
    Ok(())
}
