//! `bench density`: the memory of N running Wasm pods (ticker) once they have
//! settled: each sandbox process's `Pss` (its share of pages mapped by several, the
//! engine's code among them) and private dirty memory, and the node's own RSS; beside
//! the `Pss` of as many plain processes (`sleep`), the floor of a process.

use std::process::{Child, Command};
use std::time::Duration;

use anyhow::{Context, bail};
use wasmlet_testkit::node::rss_kib;

use super::{WasmRun, first_pod, pod_yaml, pss_of, remove_pods, smaps_kib, start_pods};

/// How long the pods run before they are measured.
const SETTLE: Duration = Duration::from_secs(3);

#[derive(serde::Serialize)]
struct Figures {
    pods: usize,
    sandbox_pss_mean_mib: f64,
    sandbox_pss_max_mib: f64,
    sandbox_private_dirty_mean_mib: f64,
    sandbox_rss_mean_mib: f64,
    zygote_pss_mib: f64,
    node_rss_mib: f64,
    baseline_sleep_pss_mean_mib: f64,
}

/// `cargo xtask bench density`.
pub fn density(pods: usize, run: WasmRun) -> anyhow::Result<()> {
    if pods == 0 {
        bail!("--pods must be at least 1");
    }
    let node = run.start_node(&["ticker"], format!("maxPods: {}\n", pods + 10))?;
    first_pod(&node, &pod_yaml)?;
    let poll_every = Duration::from_millis((pods as u64 / 20).max(5));
    start_pods(&node, pods, &pod_yaml, poll_every)?;
    std::thread::sleep(SETTLE);
    let sandboxes = node.sandbox_pids();
    // The zygote's own memory, shared with every sandbox it forked, counts for them.
    let zygote_pss: u64 = node.zygote_pid().map_or(0, |p| smaps_kib(p, "Pss"));
    if sandboxes.len() != pods {
        bail!("{} sandbox processes for {pods} pods", sandboxes.len());
    }
    let mib = |kib: u64| kib as f64 / 1024.0;
    let pss: Vec<u64> = sandboxes.iter().map(|p| smaps_kib(*p, "Pss")).collect();
    let dirty: u64 = sandboxes
        .iter()
        .map(|p| smaps_kib(*p, "Private_Dirty"))
        .sum();
    let rss: u64 = sandboxes.iter().map(|p| rss_kib(*p)).sum();
    let node_rss = rss_kib(node.pid());
    remove_pods(&node, pods)?;

    let mut sleeps: Vec<Child> = Vec::with_capacity(pods);
    let spawned = (0..pods).try_for_each(|_| {
        sleeps.push(Command::new("sleep").arg("1000").spawn()?);
        std::io::Result::Ok(())
    });
    let sleep_pss = pss_of(&sleeps.iter().map(Child::id).collect::<Vec<_>>());
    for c in &mut sleeps {
        let _ = c.kill();
        let _ = c.wait();
    }
    spawned.context("spawning the baseline's processes")?;

    let n = pods as f64;
    let f = Figures {
        pods,
        sandbox_pss_mean_mib: mib(pss.iter().sum()) / n,
        sandbox_pss_max_mib: mib(pss.iter().copied().max().unwrap_or(0)),
        sandbox_private_dirty_mean_mib: mib(dirty) / n,
        sandbox_rss_mean_mib: mib(rss) / n,
        zygote_pss_mib: mib(zygote_pss),
        node_rss_mib: mib(node_rss),
        baseline_sleep_pss_mean_mib: mib(sleep_pss) / n,
    };
    println!(
        "density ({}, {pods} ticker pods running, measured {SETTLE:?} after the last started)",
        run.how(),
    );
    println!(
        "  sandbox Pss per pod      : {:.2} MiB mean, {:.2} MiB max",
        f.sandbox_pss_mean_mib, f.sandbox_pss_max_mib
    );
    println!(
        "  sandbox private dirty    : {:.2} MiB mean",
        f.sandbox_private_dirty_mean_mib
    );
    println!(
        "  sandbox RSS              : {:.2} MiB mean (shared pages counted in each)",
        f.sandbox_rss_mean_mib
    );
    if run.zygote {
        println!(
            "  the zygote's Pss         : {:.2} MiB ({:.3} MiB per pod)",
            f.zygote_pss_mib,
            f.zygote_pss_mib / n
        );
    }
    println!("  node RSS                 : {:.1} MiB", f.node_rss_mib);
    println!(
        "  baseline: Pss of a sleep : {:.2} MiB mean over {pods}",
        f.baseline_sleep_pss_mean_mib
    );
    run.print_json(&f)?;
    Ok(())
}
