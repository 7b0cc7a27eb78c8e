//! Benchmarks. Each prints its figures; none asserts a speed.
//!
//! `bench pod-start` measures "manifest appears -> pod Running" on a
//! standalone node, for Wasm pods ([`Runtime::Wasm`]) or for container pods
//! through a private containerd ([`Runtime::Cri`]), where it also measures
//! `ctr run` of the same image on the same containerd as a lower bound.
//! `bench idle` ([`idle::idle`]) measures an idle node's own CPU and RSS per pod
//! source. `bench eviction` ([`eviction::eviction`]) measures how soon a pod crossing
//! a memory threshold is stopped, with memcg notifications and by polling. `bench
//! http` ([`http::http`]) measures the `wasi:http` example against a native server.

use std::collections::HashMap;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use wasmlet_testkit::containerd::images::BUSYBOX_IMAGE;
use wasmlet_testkit::containerd::{Containerd, SNAPSHOTTER};
use wasmlet_testkit::images;
use wasmlet_testkit::node::{NodeOptions, TestNode, poll, rss_kib, tail};

mod churn;
mod density;
mod eviction;
mod http;
mod idle;
mod scrape;
mod shim;
mod wasm_burst;
mod wasm_single;
pub use churn::churn;
pub use density::density;
pub use eviction::eviction;
pub use http::http;
pub use idle::idle;
pub use shim::shim;
pub use wasm_burst::wasm_burst;
pub use wasm_single::wasm_single;

/// `bench plugin-call`: builds the example plugins, then runs the host's
/// `plugin_call` example (release unless `debug`), which prints p50/p99 of plugin
/// calls next to the same work done natively.
pub fn plugin_call(calls: usize, debug: bool, json: bool) -> anyhow::Result<()> {
    let root = images::workspace_root()?;
    let plugins = images::ensure_plugins()?;
    let mut cmd = crate::cargo();
    cmd.current_dir(&root).args([
        "run",
        "--quiet",
        "-p",
        "wasmlet-plugin-host",
        "--example",
        "plugin_call",
    ]);
    if !debug {
        cmd.arg("--release");
    }
    cmd.arg("--");
    if json {
        cmd.arg("--json");
    }
    cmd.arg(calls.to_string())
        .arg(&plugins["http-json-probe"])
        .arg(&plugins["priority-eviction"]);
    let status = cmd.status().context("running the plugin_call example")?;
    if !status.success() {
        bail!("the plugin_call example failed");
    }
    Ok(())
}

/// How the Wasm benches (`wasm-single`, `wasm-burst`, `density`, `churn`) run
/// their node and report.
#[derive(Clone, Copy, Debug, clap::Args)]
pub struct WasmRun {
    /// Fork sandboxes from a zygote (`wasmlet.sandboxZygote`).
    #[arg(long)]
    pub zygote: bool,
    /// Build and run the debug binary instead of the release one.
    #[arg(long)]
    pub debug: bool,
    /// Also print the figures as JSON.
    #[arg(long)]
    pub json: bool,
}

impl WasmRun {
    /// Builds the node and starts it with these example images and kubelet
    /// configuration lines; sandboxes forked from a zygote when asked.
    fn start_node(&self, images: &[&str], kubelet_config: String) -> anyhow::Result<TestNode> {
        let binary = build_node(self.debug)?;
        TestNode::start(
            &binary,
            NodeOptions {
                images: images.iter().map(|i| i.to_string()).collect(),
                kubelet_config,
                wasmlet_config: if self.zygote {
                    "  sandboxZygote: true\n".into()
                } else {
                    String::new()
                },
                ..Default::default()
            },
        )
    }

    /// The build and how sandboxes start, for a bench's title.
    fn how(&self) -> String {
        format!(
            "{} build, sandboxes {}",
            if self.debug { "debug" } else { "release" },
            if self.zygote {
                "forked from a zygote"
            } else {
                "each a new process"
            }
        )
    }

    /// Prints the figures as one JSON line when asked.
    fn print_json(&self, figures: &impl serde::Serialize) -> anyhow::Result<()> {
        if self.json {
            println!("{}", serde_json::to_string(figures)?);
        }
        Ok(())
    }
}

/// What `bench pod-start` starts its pods with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Runtime {
    /// Wasm pods (the ticker example image).
    Wasm,
    /// Container pods (busybox) through a private containerd, and `ctr run`
    /// of the same image on that containerd as the baseline.
    Cri,
}

impl Runtime {
    /// How many pods a run starts unless `--pods` says otherwise.
    pub fn default_pods(self) -> usize {
        match self {
            Runtime::Wasm => 100,
            Runtime::Cri => 30,
        }
    }
}

/// How long all pods of one batch may take to run (each `ctr run` has the testkit's `CTR_TIMEOUT`).
const BATCH_TIMEOUT: Duration = Duration::from_secs(300);
/// How often `/pods` is read while a batch starts.
const POLL_EVERY: Duration = Duration::from_millis(5);
/// The command of the busybox containers, in the pods and under `ctr run`.
const BUSYBOX_COMMAND: [&str; 3] = ["sh", "-c", "exec sleep 1000"];

pub(crate) fn build_node(debug: bool) -> anyhow::Result<std::path::PathBuf> {
    let root = images::workspace_root()?;
    let mut cmd = crate::cargo();
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

/// A busybox pod for the CRI runtime: the shape of the e2e test in `node/tests/e2e/cri.rs`.
fn busybox_pod_yaml(name: &str) -> String {
    let [sh, c, script] = BUSYBOX_COMMAND;
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    image: {BUSYBOX_IMAGE}\n    imagePullPolicy: Never\n    command: [{sh}, {c}, '{script}']\n"
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

/// One field of a process's `smaps_rollup` (`Pss`, `Private_Dirty`, …), in KiB; 0
/// when the process is gone.
fn smaps_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|text| {
            text.lines().find_map(|l| {
                l.strip_prefix(field)?
                    .strip_prefix(':')?
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse()
                    .ok()
            })
        })
        .unwrap_or(0)
}

/// The sum of the processes' `Pss`, in KiB.
fn pss_of(pids: &[u32]) -> u64 {
    pids.iter().map(|pid| smaps_kib(*pid, "Pss")).sum()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[idx]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Start latencies of one batch started at once.
struct Batch {
    /// Per pod (or `ctr run`), ascending.
    sorted: Vec<Duration>,
    /// From the first start to the last one running.
    wall: Duration,
}

impl Batch {
    fn p50(&self) -> Duration {
        percentile(&self.sorted, 0.50)
    }
    fn p90(&self) -> Duration {
        percentile(&self.sorted, 0.90)
    }
    fn p99(&self) -> Duration {
        percentile(&self.sorted, 0.99)
    }
    fn max(&self) -> Duration {
        *self.sorted.last().expect("a batch has at least one start")
    }
}

/// One pod on its own, manifest written -> Running; then removed and waited gone.
fn first_pod(node: &TestNode, yaml: &dyn Fn(&str) -> String) -> anyhow::Result<Duration> {
    let full = format!("cold-{}", node.node_name);
    let started = Instant::now();
    node.write_manifest("cold.yaml", &yaml("cold"))?;
    poll(Duration::from_secs(120), || {
        running_pods(node).contains(&full).then_some(())
    })
    .context("the first pod never ran")?;
    let took = started.elapsed();
    node.remove_manifest("cold.yaml")?;
    poll(Duration::from_secs(60), || {
        node.pods().ok()?.is_empty().then_some(())
    })
    .context("the first pod did not go away")?;
    Ok(took)
}

/// The manifest files of a batch of `pods`.
fn batch_names(pods: usize) -> Vec<String> {
    (0..pods).map(|i| format!("p{i:03}")).collect()
}

/// Writes the manifests of `pods` pods at once and times each from its write
/// to Running in `/pods` (read every `poll_every`).
fn start_pods(
    node: &TestNode,
    pods: usize,
    yaml: &dyn Fn(&str) -> String,
    poll_every: Duration,
) -> anyhow::Result<Batch> {
    let suffix = format!("-{}", node.node_name);
    let mut written: HashMap<String, Instant> = HashMap::new();
    let started = Instant::now();
    for name in batch_names(pods) {
        node.write_manifest(&format!("{name}.yaml"), &yaml(&name))?;
        written.insert(format!("{name}{suffix}"), Instant::now());
    }
    let mut latencies: HashMap<String, Duration> = HashMap::new();
    let deadline = Instant::now() + BATCH_TIMEOUT;
    while latencies.len() < pods && Instant::now() < deadline {
        let now = Instant::now();
        for name in running_pods(node) {
            if let Some(at) = written.get(&name) {
                latencies.entry(name).or_insert_with(|| now - *at);
            }
        }
        std::thread::sleep(poll_every);
    }
    let wall = started.elapsed();
    if latencies.len() < pods {
        bail!(
            "only {} of {pods} pods ran within {BATCH_TIMEOUT:?}",
            latencies.len()
        );
    }
    let mut sorted: Vec<Duration> = latencies.into_values().collect();
    sorted.sort();
    Ok(Batch { sorted, wall })
}

/// Removes the manifests of a batch and waits until `/pods` is empty.
fn remove_pods(node: &TestNode, pods: usize) -> anyhow::Result<()> {
    for name in batch_names(pods) {
        node.remove_manifest(&format!("{name}.yaml"))?;
    }
    let left = poll(Duration::from_secs(120), || {
        let pods = node.pods().ok()?;
        pods.is_empty().then_some(())
    });
    left.with_context(|| {
        format!(
            "pods still listed 120 s after their manifests were removed: {:?}",
            node.pods()
                .unwrap_or_default()
                .into_iter()
                .filter_map(|p| p.metadata.name)
                .collect::<Vec<_>>()
        )
    })
}

/// `cargo xtask bench pod-start`: manifest appears -> Running for `pods` pods.
pub fn pod_start(runtime: Runtime, pods: usize, debug: bool) -> anyhow::Result<()> {
    if pods == 0 {
        bail!("--pods must be at least 1");
    }
    match runtime {
        Runtime::Wasm => pod_start_wasm(pods, debug),
        Runtime::Cri => pod_start_cri(pods, debug),
    }
}

fn pod_start_wasm(pods: usize, debug: bool) -> anyhow::Result<()> {
    let binary = build_node(debug)?;
    let node = TestNode::start(
        &binary,
        NodeOptions {
            images: vec!["ticker".into()],
            ..Default::default()
        },
    )?;

    // The first pod of an image compiles it (once per node); measured on its own.
    let cold = first_pod(&node, &pod_yaml)?;
    let batch = start_pods(&node, pods, &pod_yaml, POLL_EVERY)?;
    let sandboxes = node.sandbox_pids();
    let rss: u64 = sandboxes.iter().map(|p| rss_kib(*p)).sum();
    println!(
        "pod-start ({} build, {pods} Wasm pods, ticker image, /pods polled every 5 ms)",
        if debug { "debug" } else { "release" }
    );
    println!("  first pod, cold compile : {:8.1} ms", ms(cold));
    println!("  p50                     : {:8.1} ms", ms(batch.p50()));
    println!("  p90                     : {:8.1} ms", ms(batch.p90()));
    println!("  p99                     : {:8.1} ms", ms(batch.p99()));
    println!("  max                     : {:8.1} ms", ms(batch.max()));
    println!("  all {pods} running after  : {:8.1} ms", ms(batch.wall));
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

/// Container pods through a private containerd, then `ctr run` on the same
/// containerd. On an error, dropping the node and then containerd (in that
/// order: reverse declaration) removes what the run made.
fn pod_start_cri(pods: usize, debug: bool) -> anyhow::Result<()> {
    let binary = build_node(debug)?;
    let containerd = Containerd::start()?;
    containerd.import_test_images()?;
    let node = TestNode::start(
        &binary,
        NodeOptions::default().with_cri(containerd.address()),
    )?;

    // 1. The node: one pod on its own, then all of them at once.
    let node_first = first_pod(&node, &busybox_pod_yaml)?;
    let node_batch = start_pods(&node, pods, &busybox_pod_yaml, POLL_EVERY)
        .with_context(|| format!("node log tail:\n{}", tail(&node.log(), 30)))?;
    remove_pods(&node, pods)?;
    let leftover = containerd.ctr_k8s(["containers", "ls", "--quiet"])?;
    if !leftover.trim().is_empty() {
        bail!("the node left containers in containerd: {leftover}");
    }
    // The baseline runs without the node competing for the CPUs (Drop stops it).
    drop(node);

    // 2. `ctr run` of the same image: one on its own, then all at once.
    let ctr_first = ctr_run_batch(&containerd, &["ctr-first".to_owned()])?;
    ctr_remove(&containerd, &["ctr-first".to_owned()])?;
    let ids: Vec<String> = (0..pods).map(|i| format!("ctr-{i:03}")).collect();
    let ctr_batch = ctr_run_batch(&containerd, &ids)?;
    ctr_remove(&containerd, &ids)?;

    let stack = format!(
        "containerd {}, runc, {SNAPSHOTTER}",
        containerd_version(&containerd)
    );
    containerd.stop()?;

    println!(
        "pod-start --runtime cri ({} build of the node, {BUSYBOX_IMAGE} `sh -c 'exec sleep 1000'`, private {stack})",
        if debug { "debug" } else { "release" }
    );
    println!(
        "  wasmlet: manifest written -> pod Running in /pods (polled every 5 ms); pod sandbox + CNI bridge + container"
    );
    println!(
        "  ctr run: `ctr run -d --null-io` launched -> returned (it returns after the task started, i.e. RUNNING);"
    );
    println!(
        "           no pod sandbox, no CNI network: the lower bound of the same containerd + runc"
    );
    println!(
        "  order  : wasmlet first (pods then removed, node stopped), then ctr run; N started at once, first = one alone before"
    );
    println!(
        "  {:<10} {:>5} {:>10} {:>10} {:>16} {:>10}",
        "runtime", "pods", "p50 ms", "p99 ms", "all-running ms", "first ms"
    );
    for (label, batch, first) in [
        ("wasmlet", &node_batch, node_first),
        ("ctr run", &ctr_batch, ctr_first.max()),
    ] {
        println!(
            "  {:<10} {:>5} {:>10.1} {:>10.1} {:>16.1} {:>10.1}",
            label,
            batch.sorted.len(),
            ms(batch.p50()),
            ms(batch.p99()),
            ms(batch.wall),
            ms(first)
        );
    }
    Ok(())
}

/// `ctr run -d` of busybox under each of `ids`, all launched at once (one
/// thread each, released together), each timed from launch to `ctr` returning,
/// which it does once the task has started. Checks that `ctr tasks ls` then
/// shows all of them RUNNING.
fn ctr_run_batch(containerd: &Containerd, ids: &[String]) -> anyhow::Result<Batch> {
    let runc_root = containerd.layout().runc_root();
    let gate = Barrier::new(ids.len() + 1);
    let results = std::thread::scope(|s| {
        let threads: Vec<_> = ids
            .iter()
            .map(|id| {
                let gate = &gate;
                let runc_root = &runc_root;
                s.spawn(move || {
                    let mut args: Vec<std::ffi::OsString> = vec![
                        "run".into(),
                        "--detach".into(),
                        // No fifos to copy output through (and none left in /tmp).
                        "--null-io".into(),
                        "--snapshotter".into(),
                        SNAPSHOTTER.into(),
                        // runc's state in the run directory, as the CRI plugin's is.
                        "--runc-root".into(),
                        runc_root.into(),
                        BUSYBOX_IMAGE.into(),
                        id.into(),
                    ];
                    args.extend(BUSYBOX_COMMAND.iter().map(Into::into));
                    gate.wait();
                    let launched = Instant::now();
                    let result = containerd.ctr_k8s(args);
                    (launched, Instant::now(), result)
                })
            })
            .collect();
        gate.wait();
        threads
            .into_iter()
            .map(|t| t.join().expect("a ctr run thread panicked"))
            .collect::<Vec<_>>()
    });
    let mut sorted = Vec::with_capacity(ids.len());
    let (mut first, mut last) = (None::<Instant>, None::<Instant>);
    for (id, (launched, done, result)) in ids.iter().zip(results) {
        result.with_context(|| format!("ctr run {id}"))?;
        sorted.push(done - launched);
        first = Some(first.map_or(launched, |f| f.min(launched)));
        last = Some(last.map_or(done, |l| l.max(done)));
    }
    sorted.sort();

    let tasks = containerd.ctr_k8s(["tasks", "ls"])?;
    let running = tasks
        .lines()
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.first().is_some_and(|id| ids.iter().any(|i| i == id)) && f.last() == Some(&"RUNNING")
        })
        .count();
    if running != ids.len() {
        bail!(
            "{running} of {} ctr tasks RUNNING after ctr run returned:\n{tasks}",
            ids.len()
        );
    }
    Ok(Batch {
        sorted,
        // From the first launch to the last `ctr` returning.
        wall: match (first, last) {
            (Some(first), Some(last)) => last - first,
            _ => Duration::ZERO,
        },
    })
}

/// Kill (SIGKILL) and delete the tasks, then delete the containers (and
/// their snapshots).
fn ctr_remove(containerd: &Containerd, ids: &[String]) -> anyhow::Result<()> {
    for id in ids {
        containerd
            .ctr_k8s(["tasks", "kill", "--signal", "SIGKILL", id])
            .with_context(|| format!("killing ctr task {id}"))?;
    }
    // `--force`: a task the SIGKILL has not stopped yet is waited for.
    containerd
        .ctr_k8s(
            ["tasks", "delete", "--force"]
                .into_iter()
                .chain(ids.iter().map(String::as_str)),
        )
        .context("deleting the ctr tasks")?;
    containerd
        .ctr_k8s(
            ["containers", "delete"]
                .into_iter()
                .chain(ids.iter().map(String::as_str)),
        )
        .context("deleting the ctr containers")?;
    let left = containerd.ctr_k8s(["containers", "ls", "--quiet"])?;
    if !left.trim().is_empty() {
        bail!("containers left in containerd after ctr delete: {left}");
    }
    Ok(())
}

/// containerd's server version, as `ctr version` prints it.
fn containerd_version(containerd: &Containerd) -> String {
    containerd
        .ctr(["version"])
        .ok()
        .and_then(|out| {
            out.split("Server:").nth(1)?.lines().find_map(|l| {
                l.trim()
                    .strip_prefix("Version:")
                    .map(|v| v.trim().to_owned())
            })
        })
        .unwrap_or_else(|| "?".into())
}
