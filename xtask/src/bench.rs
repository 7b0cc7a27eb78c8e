//! Benchmarks. Each prints its figures; none asserts a speed.

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use wasmlet_testkit::images;
use wasmlet_testkit::node::{NodeOptions, TestNode, poll};

fn build_node(debug: bool) -> anyhow::Result<std::path::PathBuf> {
    let root = images::workspace_root()?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args(["build", "-p", "wasmlet-node", "--bin", "wasmlet"]);
    if !debug {
        cmd.arg("--release");
    }
    let status = cmd.status().context("running cargo build")?;
    if !status.success() {
        bail!("cargo build failed");
    }
    Ok(root
        .join("target")
        .join(if debug { "debug" } else { "release" })
        .join("wasmlet"))
}

fn pod_yaml(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: main\n    image: localhost/wasmlet-examples/ticker:latest\n    imagePullPolicy: IfNotPresent\n"
    )
}

fn running_pods(node: &TestNode) -> Vec<String> {
    node.pods()
        .unwrap_or_default()
        .into_iter()
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .is_some_and(|cs| {
                    !cs.is_empty()
                        && cs
                            .iter()
                            .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
                })
        })
        .filter_map(|p| p.metadata.name)
        .collect()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[idx]
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// `cargo xtask bench pod-start`: manifest appears -> Running for `pods` Wasm pods.
pub fn pod_start(pods: usize, debug: bool) -> anyhow::Result<()> {
    let binary = build_node(debug)?;
    let node = TestNode::start(
        &binary,
        NodeOptions {
            images: vec!["ticker".into()],
            ..Default::default()
        },
    )?;
    let suffix = format!("-{}", node.node_name);

    // The first pod of an image compiles it (once per node); measured on its own.
    let cold = Instant::now();
    node.write_manifest("cold.yaml", &pod_yaml("cold"))?;
    poll(Duration::from_secs(120), || {
        running_pods(&node)
            .contains(&format!("cold{suffix}"))
            .then_some(())
    })
    .context("the first pod never ran")?;
    let cold = cold.elapsed();
    node.remove_manifest("cold.yaml")?;
    poll(Duration::from_secs(60), || {
        node.pods().ok()?.is_empty().then_some(())
    })
    .context("the first pod did not go away")?;

    let mut written: HashMap<String, Instant> = HashMap::new();
    let started = Instant::now();
    for i in 0..pods {
        let name = format!("p{i:03}");
        node.write_manifest(&format!("{name}.yaml"), &pod_yaml(&name))?;
        written.insert(format!("{name}{suffix}"), Instant::now());
    }
    let mut latencies: HashMap<String, Duration> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    while latencies.len() < pods && Instant::now() < deadline {
        let now = Instant::now();
        for name in running_pods(&node) {
            if let Some(at) = written.get(&name) {
                latencies.entry(name).or_insert_with(|| now - *at);
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let wall = started.elapsed();
    if latencies.len() < pods {
        bail!("only {} of {pods} pods ran within 300 s", latencies.len());
    }
    let mut sorted: Vec<Duration> = latencies.into_values().collect();
    sorted.sort();
    let sandboxes = node.sandbox_pids();
    let rss: u64 = sandboxes.iter().map(|p| rss_kib(*p)).sum();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "pod-start ({} build, {pods} Wasm pods, ticker image, /pods polled every 5 ms)",
        if debug { "debug" } else { "release" }
    );
    println!("  first pod, cold compile : {:8.1} ms", ms(cold));
    println!(
        "  p50                     : {:8.1} ms",
        ms(percentile(&sorted, 0.50))
    );
    println!(
        "  p90                     : {:8.1} ms",
        ms(percentile(&sorted, 0.90))
    );
    println!(
        "  p99                     : {:8.1} ms",
        ms(percentile(&sorted, 0.99))
    );
    println!(
        "  max                     : {:8.1} ms",
        ms(*sorted.last().unwrap())
    );
    println!("  all {pods} running after  : {:8.1} ms", ms(wall));
    println!(
        "  sandbox processes       : {} ({:.1} MiB RSS in all, {:.2} MiB each)",
        sandboxes.len(),
        rss as f64 / 1024.0,
        rss as f64 / 1024.0 / sandboxes.len().max(1) as f64
    );
    println!(
        "  node RSS                : {:.1} MiB",
        rss_kib(node.pid()) as f64 / 1024.0
    );
    Ok(())
}
