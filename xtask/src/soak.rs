//! `cargo xtask soak --minutes N`: a node churning pods of both kinds for N minutes,
//! then a look for what it left behind.
//!
//! Each round writes `--wasm` Wasm pods (the ticker, on a CNI network of the node's,
//! an exec readiness probe) and `--boxes` busybox pods (through a private containerd
//! and its CNI network, an exec readiness probe); one pod in four of each kind exits
//! and is restarted. A round ends when every pod is Ready (the restarting ones: once
//! restarted), then every manifest is removed and the round waits until the node lists
//! no pod. After the last round it checks that nothing is left over — file
//! descriptors of the node, cgroups, mounts, network namespaces, veths, IPAM
//! allocations, processes, log files, entries in the node's store and in containerd —
//! and that the node's RSS between rounds stayed within 10 % of its level after the
//! warm-up (the first quarter of the run, at most five minutes). It prints the figures
//! and the RSS curve (a table, or JSON with `--json`) and fails on any leak.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Pod;
use wasmlet_testkit::cni::CniNetwork;
use wasmlet_testkit::containerd::Containerd;
use wasmlet_testkit::containerd::images::BUSYBOX_IMAGE;
use wasmlet_testkit::node::{
    NodeOptions, TestNode, open_fds, poll, processes_matching, rss_kib, tail,
};

/// How long one round's pods may take to be Ready, and to be gone after removal.
const ROUND_TIMEOUT: Duration = Duration::from_secs(180);
/// How long the leftovers may take to go once the last pod is gone (the node's
/// housekeeping and container GC run on their own periods).
const SETTLE_TIMEOUT: Duration = Duration::from_secs(90);
/// The RSS between rounds may exceed its level after the warm-up by this share.
const RSS_SLACK: f64 = 0.10;

/// What one soak run is asked for.
#[derive(Clone, Debug, clap::Args)]
pub struct Soak {
    /// How long to churn (a quarter of it, at most 5 min, is the warm-up).
    #[arg(long, default_value_t = 30.0)]
    pub minutes: f64,
    /// Go on past `--minutes` until this many pods have run.
    #[arg(long, default_value_t = 0)]
    pub min_pods: usize,
    /// Wasm pods per round.
    #[arg(long, default_value_t = 40)]
    pub wasm: usize,
    /// Busybox pods per round (through a private containerd).
    #[arg(long, default_value_t = 8)]
    pub boxes: usize,
    /// Build and run the debug binary instead of the release one.
    #[arg(long)]
    pub debug: bool,
    /// Run this node binary instead of building one (CI runs the one its tests ran).
    #[arg(long)]
    pub binary: Option<PathBuf>,
    /// Print the figures as JSON.
    #[arg(long)]
    pub json: bool,
}

/// One sample, taken between rounds (no pod on the node).
#[derive(Clone, Copy, Debug)]
struct Sample {
    at: Duration,
    pods: usize,
    rss_kib: u64,
    fds: usize,
}

/// Set by SIGINT or SIGTERM: the soak stops at its next check and tears its node,
/// containerd and network down on the way out.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

/// A thread of its own waits for SIGINT or SIGTERM and sets [`INTERRUPTED`].
fn stop_on_signals() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    let (mut int, mut term) = runtime.block_on(async {
        anyhow::Ok((
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
        ))
    })?;
    std::thread::spawn(move || {
        runtime.block_on(async {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        });
        eprintln!("soak: interrupted; tearing down");
        INTERRUPTED.store(true, Ordering::Relaxed);
    });
    Ok(())
}

pub fn soak(opts: Soak) -> anyhow::Result<()> {
    if opts.wasm + opts.boxes == 0 {
        bail!("a round needs at least one pod (--wasm or --boxes)");
    }
    stop_on_signals()?;
    let binary = match &opts.binary {
        Some(binary) => binary.clone(),
        None => crate::bench::build_node(opts.debug)?,
    };
    let build = match &opts.binary {
        Some(binary) => binary.display().to_string(),
        None if opts.debug => "debug build".into(),
        None => "release build".into(),
    };
    let containerd = Containerd::start()?;
    containerd.import_test_images()?;
    let network = CniNetwork::new()?;
    let node = TestNode::start(
        &binary,
        NodeOptions {
            images: vec!["ticker".into()],
            cni_conf_dir: Some(network.conf_dir()),
            ..Default::default()
        }
        .with_cri(containerd.address()),
    )?;
    let machine_before = Machine::now();

    let duration = Duration::from_secs_f64(opts.minutes * 60.0);
    let warm_up = (duration / 4).min(Duration::from_secs(300));
    let started = Instant::now();
    let mut samples: Vec<Sample> = Vec::new();
    let mut warm: Option<(Sample, NodeStore)> = None;
    let mut pods = 0usize;
    let mut peak_rss_kib = 0u64;
    let mut round = 0usize;
    let mut last_print = Instant::now();
    while started.elapsed() < duration || pods < opts.min_pods || warm.is_none() {
        if interrupted() {
            bail!("interrupted after {round} rounds ({pods} pods)");
        }
        let peak = run_round(&node, round, opts.wasm, opts.boxes).with_context(|| {
            format!(
                "round {round} ({pods} pods before it); node log tail:\n{}\ncontainerd log tail:\n{}",
                tail(&node.log(), 40),
                containerd.log_tail(20)
            )
        })?;
        peak_rss_kib = peak_rss_kib.max(peak);
        pods += opts.wasm + opts.boxes;
        round += 1;
        let sample = Sample {
            at: started.elapsed(),
            pods,
            rss_kib: rss_kib(node.pid()),
            fds: open_fds(node.pid()),
        };
        samples.push(sample);
        if warm.is_none() && sample.at >= warm_up {
            warm = Some((sample, NodeStore::of(&node)));
        }
        if !opts.json && last_print.elapsed() >= Duration::from_secs(60) {
            eprintln!(
                "soak: {:>5.1} min, {pods} pods, node RSS {:.1} MiB, {} fds",
                sample.at.as_secs_f64() / 60.0,
                sample.rss_kib as f64 / 1024.0,
                sample.fds
            );
            last_print = Instant::now();
        }
    }
    let elapsed = started.elapsed();
    let (warm, store_after_warm_up) = warm.expect("the loop ends after the warm-up");

    // Everything the pods had is gone, or what is left is a leak.
    let mut leaks = Vec::new();
    let settled = poll(SETTLE_TIMEOUT, || {
        let mut now = Vec::new();
        now.extend(node_leftovers(&node, &store_after_warm_up, warm.fds));
        now.extend(network.leftovers());
        now.extend(Machine::now().added_since(&machine_before));
        now.extend(containerd_leftovers(&containerd));
        if now.is_empty() {
            Some(())
        } else {
            leaks = now;
            None
        }
    });
    if settled.is_some() {
        leaks.clear();
    }

    let after: Vec<&Sample> = samples.iter().filter(|s| s.at > warm.at).collect();
    let highest_after = after
        .iter()
        .map(|s| s.rss_kib)
        .max()
        .unwrap_or(warm.rss_kib);
    let limit = (warm.rss_kib as f64 * (1.0 + RSS_SLACK)) as u64;
    let rss_held = highest_after <= limit;
    let end = *samples.last().expect("at least one round ran");

    if opts.json {
        let curve: Vec<_> = samples
            .iter()
            .map(|s| {
                serde_json::json!({
                    "seconds": s.at.as_secs_f64(), "pods": s.pods,
                    "rss_kib": s.rss_kib, "fds": s.fds,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "node": build,
                "seconds": elapsed.as_secs_f64(),
                "rounds": round,
                "pods": pods,
                "wasm_per_round": opts.wasm,
                "busybox_per_round": opts.boxes,
                "warm_up_seconds": warm.at.as_secs_f64(),
                "rss_kib_after_warm_up": warm.rss_kib,
                "rss_kib_highest_after_warm_up": highest_after,
                "rss_kib_peak_in_rounds": peak_rss_kib,
                "rss_held": rss_held,
                "leaks": leaks,
                "curve": curve,
            }))?
        );
    } else {
        println!(
            "soak ({build}; each round {} Wasm + {} busybox pods, one in four of each restarting)",
            opts.wasm, opts.boxes
        );
        println!(
            "  duration                : {:.1} min, {round} rounds",
            elapsed.as_secs_f64() / 60.0
        );
        println!(
            "  pods                    : {pods} ({:.1}/s)",
            pods as f64 / elapsed.as_secs_f64()
        );
        println!(
            "  node RSS after warm-up  : {:.1} MiB (at {:.1} min)",
            warm.rss_kib as f64 / 1024.0,
            warm.at.as_secs_f64() / 60.0
        );
        println!(
            "  highest between rounds  : {:.1} MiB (limit {:.1} MiB, +{:.0} %)",
            highest_after as f64 / 1024.0,
            limit as f64 / 1024.0,
            RSS_SLACK * 100.0
        );
        println!(
            "  peak during rounds      : {:.1} MiB",
            peak_rss_kib as f64 / 1024.0
        );
        println!(
            "  at the end              : {:.1} MiB RSS, {} fds (after warm-up {})",
            end.rss_kib as f64 / 1024.0,
            end.fds,
            warm.fds
        );
        println!("  leftovers               : {}", leaks.len());
        for leak in &leaks {
            println!("    {leak}");
        }
        println!("  RSS curve (min, pods, MiB, fds):");
        let every = (samples.len() / 30).max(1);
        for s in samples.iter().step_by(every).chain(std::iter::once(&end)) {
            println!(
                "    {:>6.1} {:>7} {:>7.1} {:>5}",
                s.at.as_secs_f64() / 60.0,
                s.pods,
                s.rss_kib as f64 / 1024.0,
                s.fds
            );
        }
    }
    if !leaks.is_empty() {
        bail!("{} leftovers after the soak: {leaks:#?}", leaks.len());
    }
    if !rss_held {
        bail!(
            "the node's RSS grew to {highest_after} KiB between rounds, over {limit} KiB (+{:.0} % of {} KiB after the warm-up)",
            RSS_SLACK * 100.0,
            warm.rss_kib
        );
    }
    drop(node);
    containerd.stop()?;
    Ok(())
}

fn wasm_name(round: usize, i: usize) -> String {
    format!("w{round}-{i}")
}

fn box_name(round: usize, i: usize) -> String {
    format!("b{round}-{i}")
}

/// One pod in four restarts: its container exits soon after it starts.
fn restarts(i: usize) -> bool {
    i % 4 == 3
}

fn wasm_pod(name: &str, restarting: bool) -> String {
    let env = if restarting {
        "[{name: INTERVAL_MS, value: '100'}, {name: TICKS, value: '2'}]"
    } else {
        "[{name: INTERVAL_MS, value: '500'}]"
    };
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  restartPolicy: Always\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    image: localhost/wasmlet-examples/ticker:latest\n    imagePullPolicy: IfNotPresent\n    env: {env}\n    readinessProbe: {{exec: {{command: [ticker, check]}}, periodSeconds: 1}}\n"
    )
}

fn busybox_pod(name: &str, restarting: bool) -> String {
    let script = if restarting {
        "sleep 0.3; exit 3"
    } else {
        "exec sleep 1000"
    };
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  restartPolicy: Always\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    image: {BUSYBOX_IMAGE}\n    imagePullPolicy: Never\n    command: [sh, -c, '{script}']\n    readinessProbe: {{exec: {{command: [\"true\"]}}, periodSeconds: 1}}\n"
    )
}

/// Whether a pod is where its round wants it: a restarting pod once restarted, any
/// other Ready.
fn arrived(pod: &Pod, restarting: bool) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    let Some(c) = status.container_statuses.as_ref().and_then(|cs| cs.first()) else {
        return false;
    };
    if restarting {
        c.restart_count >= 1
    } else {
        c.ready && c.state.as_ref().is_some_and(|s| s.running.is_some())
    }
}

/// Writes a round's manifests, waits for its pods to arrive, removes them and waits
/// until the node lists none. Returns the node's highest RSS seen meanwhile (KiB).
fn run_round(node: &TestNode, round: usize, wasm: usize, boxes: usize) -> anyhow::Result<u64> {
    let mut want: Vec<(String, bool)> = Vec::new();
    for i in 0..wasm {
        let name = wasm_name(round, i);
        node.write_manifest(&format!("{name}.yaml"), &wasm_pod(&name, restarts(i)))?;
        want.push((name, restarts(i)));
    }
    for i in 0..boxes {
        let name = box_name(round, i);
        node.write_manifest(&format!("{name}.yaml"), &busybox_pod(&name, restarts(i)))?;
        want.push((name, restarts(i)));
    }
    let suffix = format!("-{}", node.node_name);
    let mut peak = 0u64;
    let mut missing: Vec<String> = Vec::new();
    let arrived_all = poll(ROUND_TIMEOUT, || {
        if interrupted() {
            return Some(());
        }
        peak = peak.max(rss_kib(node.pid()));
        let pods = node.pods().ok()?;
        missing = want
            .iter()
            .filter(|(name, restarting)| {
                let full = format!("{name}{suffix}");
                !pods.iter().any(|p| {
                    p.metadata.name.as_deref() == Some(full.as_str()) && arrived(p, *restarting)
                })
            })
            .map(|(name, _)| name.clone())
            .collect();
        missing.is_empty().then_some(())
    });
    if arrived_all.is_none() {
        bail!(
            "{} of {} pods did not arrive within {ROUND_TIMEOUT:?}: {missing:?}",
            missing.len(),
            want.len()
        );
    }
    for (name, _) in &want {
        node.remove_manifest(&format!("{name}.yaml"))?;
    }
    let mut left: Vec<String> = Vec::new();
    let gone = poll(ROUND_TIMEOUT, || {
        if interrupted() {
            return Some(());
        }
        peak = peak.max(rss_kib(node.pid()));
        left = node
            .pods()
            .ok()?
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect();
        left.is_empty().then_some(())
    });
    if gone.is_none() {
        bail!("pods still listed {ROUND_TIMEOUT:?} after their manifests went: {left:?}");
    }
    Ok(peak)
}

/// The entries of the node's root directory two levels down (`pods/<uid>`,
/// `containers/<id>`, …), but the image store and the compile cache, which keep what
/// the first round put there.
#[derive(Debug, Default)]
struct NodeStore(BTreeSet<PathBuf>);

impl NodeStore {
    fn of(node: &TestNode) -> Self {
        let mut entries = BTreeSet::new();
        for top in std::fs::read_dir(&node.root)
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = top.file_name();
            if matches!(name.to_str(), Some("images" | "cache" | "modules")) {
                continue;
            }
            entries.insert(top.path());
            if top.path().is_dir() {
                for e in std::fs::read_dir(top.path())
                    .into_iter()
                    .flatten()
                    .flatten()
                {
                    entries.insert(e.path());
                }
            }
        }
        NodeStore(entries)
    }
}

/// What the node holds that it did not hold after the warm-up: file descriptors,
/// pod cgroups, sandbox processes, log files, store entries.
fn node_leftovers(node: &TestNode, after_warm_up: &NodeStore, warm_fds: usize) -> Vec<String> {
    let mut left = Vec::new();
    let fds = open_fds(node.pid());
    if fds > warm_fds {
        left.push(format!(
            "{} file descriptors of the node more than after the warm-up ({warm_fds})",
            fds - warm_fds
        ));
    }
    for cgroup in pod_cgroups(&node.cgroup_root) {
        left.push(format!("cgroup {}", cgroup.display()));
    }
    for pid in node.sandbox_pids() {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
            .unwrap_or_default();
        left.push(format!("process {pid}: {cmdline}"));
    }
    for entry in std::fs::read_dir(&node.logs)
        .into_iter()
        .flatten()
        .flatten()
    {
        left.push(format!("log {}", entry.path().display()));
    }
    for entry in NodeStore::of(node).0.difference(&after_warm_up.0) {
        left.push(format!("store entry {}", entry.display()));
    }
    left
}

/// The pod cgroups (`pod<uid>` directories) below the node's `cgroupRoot`, in every
/// hierarchy.
fn pod_cgroups(cgroup_root: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if e.file_name().to_string_lossy().starts_with("pod") {
                out.push(e.path());
            }
            walk(&e.path(), out);
        }
    }
    let mut out = Vec::new();
    let relative = cgroup_root.trim_start_matches('/');
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        walk(&hierarchy.path().join(relative), &mut out);
    }
    out
}

/// containerd's objects in the CRI namespace: containers (pod sandboxes are
/// containers too) and tasks; and its shims.
fn containerd_leftovers(containerd: &Containerd) -> Vec<String> {
    let mut left = Vec::new();
    match containerd.ctr_k8s(["containers", "ls", "--quiet"]) {
        Ok(out) => left.extend(out.lines().map(|id| format!("containerd container {id}"))),
        Err(e) => left.push(format!("listing containerd's containers: {e:#}")),
    }
    let socket = containerd.socket();
    let socket = socket.to_string_lossy();
    for pid in processes_matching(|cmd| cmd.contains("containerd-shim") && cmd.contains(&*socket)) {
        left.push(format!("containerd shim {pid}"));
    }
    left
}

/// What a pod may leave on the machine outside the node's directories: network
/// namespaces, veth interfaces, mounts (taken with the node started, before any pod).
#[derive(Debug)]
struct Machine {
    netns: BTreeSet<String>,
    veths: BTreeSet<String>,
    mounts: BTreeSet<String>,
}

impl Machine {
    fn now() -> Self {
        let netns = std::fs::read_dir("/var/run/netns")
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        let veths = std::fs::read_dir("/sys/class/net")
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| has_peer(&e.path()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        let mounts = wasmlet_testkit::containerd::mount_points()
            .into_iter()
            .map(|m| m.display().to_string())
            .collect();
        Machine {
            netns,
            veths,
            mounts,
        }
    }

    fn added_since(&self, before: &Machine) -> Vec<String> {
        let mut left = Vec::new();
        left.extend(
            self.netns
                .difference(&before.netns)
                .map(|n| format!("netns {n}")),
        );
        left.extend(
            self.veths
                .difference(&before.veths)
                .map(|n| format!("veth {n}")),
        );
        left.extend(
            self.mounts
                .difference(&before.mounts)
                .map(|m| format!("mount {m}")),
        );
        left
    }
}

/// Whether a network interface is one end of a pair (a veth whose other end is in
/// another namespace): its link index is not its own.
fn has_peer(dev: &Path) -> bool {
    let read = |f: &str| std::fs::read_to_string(dev.join(f)).unwrap_or_default();
    let (index, link) = (read("ifindex"), read("iflink"));
    !index.trim().is_empty() && index.trim() != link.trim()
}
