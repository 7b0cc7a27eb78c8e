//! `bench wasm-single`: one Wasm pod at a time, its module already compiled, from
//! the manifest to Running, measured by the node (`kubelet_pod_start_duration_seconds`:
//! its pod worker first seeing the pod until it reports the pod Running) and from
//! outside (the manifest written until `/pods` shows the container running); beside
//! `fork`+`exec` of `/bin/true`, the floor of starting any process.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use wasmlet_testkit::node::{TestNode, poll};

use super::scrape::{self, Histogram};
use super::{WasmRun, first_pod, ms, percentile, pod_yaml, running_pods};

/// How often `/pods` is read while a pod starts: the outside figure's resolution.
const POLL_EVERY: Duration = Duration::from_micros(500);
/// How long one pod may take to run.
const POD_TIMEOUT: Duration = Duration::from_secs(60);
/// The node-side histogram: the pod worker's first sight of a pod -> Running.
const POD_START: &str = "kubelet_pod_start_duration_seconds";

#[derive(serde::Serialize)]
struct Row {
    case: &'static str,
    samples: usize,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
}

fn row(case: &'static str, mut times: Vec<Duration>) -> Row {
    times.sort();
    Row {
        case,
        samples: times.len(),
        p50_ms: ms(percentile(&times, 0.50)),
        p99_ms: ms(percentile(&times, 0.99)),
        max_ms: ms(*times.last().expect("at least one sample")),
    }
}

/// The node's [`POD_START`] histogram.
fn pod_start_metric(node: &TestNode) -> anyhow::Result<Histogram> {
    scrape::histogram(&scrape::metrics(node)?, POD_START, "")
}

const RUNTIME_OPERATIONS: &str = "kubelet_runtime_operations_duration_seconds";
const POD_WORKER: &str = "kubelet_pod_worker_duration_seconds";

/// `cargo xtask bench wasm-single`.
pub fn wasm_single(pods: usize, run: WasmRun) -> anyhow::Result<()> {
    if pods == 0 {
        bail!("--pods must be at least 1");
    }
    let node = run.start_node(&["ticker"], scrape::ANONYMOUS_API.into())?;
    // The first pod of the image compiles its module; the rest find it cached.
    let cold = first_pod(&node, &pod_yaml)?;

    let before = scrape::metrics(&node)?;
    let runtime_before = scrape::by_operation(&before, RUNTIME_OPERATIONS)?;
    let worker_before = scrape::by_operation(&before, POD_WORKER)?;
    let mut outside = Vec::with_capacity(pods);
    let mut inside = Vec::with_capacity(pods);
    for i in 0..pods {
        let name = format!("single-{i:03}");
        let full = format!("{name}-{}", node.node_name);
        let file = format!("{name}.yaml");
        let seen_before = pod_start_metric(&node)?;
        let written = Instant::now();
        node.write_manifest(&file, &pod_yaml(&name))?;
        let deadline = written + POD_TIMEOUT;
        loop {
            if running_pods(&node).contains(&full) {
                outside.push(written.elapsed());
                break;
            }
            if Instant::now() >= deadline {
                bail!("pod {name} did not run within {POD_TIMEOUT:?}");
            }
            std::thread::sleep(POLL_EVERY);
        }
        // The histogram counts the pod once its worker reported it Running, which
        // the status `/pods` shows comes after: wait for the count.
        let seen = poll(Duration::from_secs(10), || {
            pod_start_metric(&node)
                .ok()
                .map(|h| h.since(&seen_before))
                .filter(|h| h.count == 1)
        })
        .with_context(|| format!("{POD_START} did not count pod {name}"))?;
        inside.push(Duration::from_secs_f64(seen.sum.max(0.0)));
        node.remove_manifest(&file)?;
        node.wait_gone(&name, Duration::from_secs(60))?;
    }

    let after = scrape::metrics(&node)?;
    let runtime = scrape::operations_between(
        &runtime_before,
        &scrape::by_operation(&after, RUNTIME_OPERATIONS)?,
    );
    let worker =
        scrape::operations_between(&worker_before, &scrape::by_operation(&after, POD_WORKER)?);

    // The floor: starting a trivial process and seeing it exit.
    let mut floor = Vec::with_capacity(pods);
    for _ in 0..pods.max(100) {
        let started = Instant::now();
        let status = Command::new("/bin/true")
            .status()
            .context("running /bin/true")?;
        floor.push(started.elapsed());
        if !status.success() {
            bail!("/bin/true failed: {status}");
        }
    }

    let rows = [
        row("node: pod seen -> Running reported", inside),
        row("outside: manifest written -> running in /pods", outside),
        row("floor: fork+exec+wait of /bin/true", floor),
    ];
    println!(
        "wasm-single ({}, ticker image, module compiled once before: {:.1} ms for that first pod; one pod at a time, removed before the next; /pods polled every {POLL_EVERY:?})",
        run.how(),
        ms(cold)
    );
    println!(
        "  {:<48} {:>7} {:>9} {:>9} {:>9}",
        "case", "samples", "p50 ms", "p99 ms", "max ms"
    );
    for r in &rows {
        println!(
            "  {:<48} {:>7} {:>9.2} {:>9.2} {:>9.2}",
            r.case, r.samples, r.p50_ms, r.p99_ms, r.max_ms
        );
    }
    println!("  where the node's time went (its histograms over the run; starts and removals):");
    for (what, ops) in [
        ("runtime operation", &runtime),
        ("pod worker sync", &worker),
    ] {
        for (op, n, mean) in ops {
            println!("    {what:<18} {op:<24} {n:>6} × {mean:>8.2} ms mean");
        }
    }
    run.print_json(&rows)?;
    Ok(())
}
