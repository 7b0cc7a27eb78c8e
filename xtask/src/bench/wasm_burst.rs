//! `bench wasm-burst`: N Wasm pods written at once (their module compiled before),
//! until all are Running in `/pods`; meanwhile the node's `/healthz` is asked every
//! [`HEALTHZ_EVERY`] and its RSS sampled, and its PLEG relists are timed by its own
//! histogram. Then the pods are removed, until `/pods` is empty. The baseline is the
//! same number of processes (`sleep`) spawned at once by the bench.

use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use wasmlet_testkit::node::{TestNode, http_get, rss_kib};

use super::scrape::{self, Histogram};
use super::{WasmRun, first_pod, ms, percentile, pod_yaml, remove_pods, start_pods};

/// How often `/healthz` is asked during the run.
const HEALTHZ_EVERY: Duration = Duration::from_millis(20);
/// How long the node is watched, all pods running, for its relists at rest.
const AT_REST: Duration = Duration::from_secs(5);
const RELIST: &str = "kubelet_pleg_relist_duration_seconds";

#[derive(serde::Serialize)]
struct Figures {
    pods: usize,
    all_running_ms: f64,
    pod_p50_ms: f64,
    pod_p99_ms: f64,
    all_removed_ms: f64,
    healthz_samples: usize,
    healthz_p50_ms: f64,
    healthz_p99_ms: f64,
    healthz_max_ms: f64,
    healthz_failures: usize,
    relist_during_mean_ms: f64,
    relist_during_max_bound_ms: f64,
    relist_at_rest_mean_ms: f64,
    relist_at_rest_max_bound_ms: f64,
    node_rss_before_mib: f64,
    node_rss_max_mib: f64,
    node_rss_running_mib: f64,
    sandboxes_rss_mib: f64,
    baseline_spawn_all_ms: f64,
}

/// What the watcher thread saw.
#[derive(Default)]
struct Watched {
    healthz: Vec<Duration>,
    failures: usize,
    rss_max_kib: u64,
}

/// Asks `/healthz` on the read-only port and samples the node's RSS until `stop`.
fn watch(port: u16, pid: u32, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Watched> {
    std::thread::spawn(move || {
        let mut seen = Watched::default();
        while !stop.load(Ordering::Relaxed) {
            let asked = Instant::now();
            match http_get(port, "/healthz") {
                Ok((200, _)) => seen.healthz.push(asked.elapsed()),
                _ => seen.failures += 1,
            }
            seen.rss_max_kib = seen.rss_max_kib.max(rss_kib(pid));
            std::thread::sleep(HEALTHZ_EVERY.saturating_sub(asked.elapsed()));
        }
        seen
    })
}

/// Stops the watcher however the run ends.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn relists(node: &TestNode) -> anyhow::Result<Histogram> {
    scrape::histogram(&scrape::metrics(node)?, RELIST, "")
}

/// `pods` processes spawned at once, until the last has been spawned; then killed.
fn spawn_baseline(pods: usize) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut children: Vec<Child> = Vec::with_capacity(pods);
    let spawned = (0..pods).try_for_each(|_| {
        children.push(Command::new("sleep").arg("1000").spawn()?);
        std::io::Result::Ok(())
    });
    let took = started.elapsed();
    for c in &mut children {
        let _ = c.kill();
        let _ = c.wait();
    }
    spawned.context("spawning the baseline's processes")?;
    Ok(took)
}

/// `cargo xtask bench wasm-burst`.
pub fn wasm_burst(pods: usize, run: WasmRun) -> anyhow::Result<()> {
    if pods == 0 {
        bail!("--pods must be at least 1");
    }
    // Room for the pods (the kubelet's default is 110) and the first one.
    let node = run.start_node(
        &["ticker"],
        format!("{}maxPods: {}\n", scrape::ANONYMOUS_API, pods + 10),
    )?;
    let cold = first_pod(&node, &pod_yaml)?;
    let rss_before = rss_kib(node.pid());
    let relists_before = relists(&node)?;

    let stop = StopOnDrop(Arc::new(AtomicBool::new(false)));
    let watcher = watch(node.read_only_port, node.pid(), stop.0.clone());
    // `/pods` of a thousand pods is a few MiB of JSON: read it less often.
    let poll_every = Duration::from_millis((pods as u64 / 20).max(5));
    let batch = start_pods(&node, pods, &pod_yaml, poll_every);
    let relists_running = relists(&node)?;
    let rss_running = rss_kib(node.pid());
    let sandboxes: u64 = node.sandbox_pids().into_iter().map(rss_kib).sum();
    let at_rest_from = relists_running.clone();
    std::thread::sleep(AT_REST);
    let relists_at_rest = relists(&node)?;
    drop(stop);
    let watched = watcher.join().expect("the watcher does not panic");
    let batch = batch?;

    let removing = Instant::now();
    remove_pods(&node, pods)?;
    let removed = removing.elapsed();
    let baseline = spawn_baseline(pods)?;

    let mut healthz = watched.healthz.clone();
    healthz.sort();
    if healthz.is_empty() {
        bail!("/healthz never answered 200 during the run");
    }
    let during = relists_running.since(&relists_before);
    let at_rest = relists_at_rest.since(&at_rest_from);
    let mib = |kib: u64| kib as f64 / 1024.0;
    let f = Figures {
        pods,
        all_running_ms: ms(batch.wall),
        pod_p50_ms: ms(batch.p50()),
        pod_p99_ms: ms(batch.p99()),
        all_removed_ms: ms(removed),
        healthz_samples: healthz.len(),
        healthz_p50_ms: ms(percentile(&healthz, 0.50)),
        healthz_p99_ms: ms(percentile(&healthz, 0.99)),
        healthz_max_ms: ms(*healthz.last().expect("not empty")),
        healthz_failures: watched.failures,
        relist_during_mean_ms: during.mean_ms(),
        relist_during_max_bound_ms: during.max_bound_ms(),
        relist_at_rest_mean_ms: at_rest.mean_ms(),
        relist_at_rest_max_bound_ms: at_rest.max_bound_ms(),
        node_rss_before_mib: mib(rss_before),
        node_rss_max_mib: mib(watched.rss_max_kib),
        node_rss_running_mib: mib(rss_running),
        sandboxes_rss_mib: mib(sandboxes),
        baseline_spawn_all_ms: ms(baseline),
    };
    println!(
        "wasm-burst ({}, {pods} ticker pods written at once, module compiled before by a first pod in {:.1} ms; /pods polled every {poll_every:?}, /healthz every {HEALTHZ_EVERY:?})",
        run.how(),
        ms(cold)
    );
    println!(
        "  all {pods} running after         : {:9.1} ms (per pod p50 {:.1}, p99 {:.1})",
        f.all_running_ms, f.pod_p50_ms, f.pod_p99_ms
    );
    println!(
        "  baseline: {pods} × spawn of sleep : {:9.1} ms",
        f.baseline_spawn_all_ms
    );
    println!(
        "  all removed after              : {:9.1} ms",
        f.all_removed_ms
    );
    println!(
        "  /healthz                       : p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms over {} asks, {} failed",
        f.healthz_p50_ms, f.healthz_p99_ms, f.healthz_max_ms, f.healthz_samples, f.healthz_failures
    );
    println!(
        "  PLEG relist while starting     : {} × {:.2} ms mean, max ≤ {} ms",
        during.count, f.relist_during_mean_ms, f.relist_during_max_bound_ms
    );
    println!(
        "  PLEG relist, all running       : {} × {:.2} ms mean, max ≤ {} ms",
        at_rest.count, f.relist_at_rest_mean_ms, f.relist_at_rest_max_bound_ms
    );
    println!(
        "  node RSS                       : {:.1} MiB before, {:.1} MiB at most, {:.1} MiB all running",
        f.node_rss_before_mib, f.node_rss_max_mib, f.node_rss_running_mib
    );
    println!(
        "  sandbox processes' RSS          : {:.1} MiB in all ({:.2} MiB each; RSS counts shared pages in each)",
        f.sandboxes_rss_mib,
        f.sandboxes_rss_mib / pods as f64
    );
    run.print_json(&f)?;
    Ok(())
}
