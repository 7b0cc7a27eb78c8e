//! `bench eviction`: the time from a memory threshold being crossed to the victim
//! being stopped, with the kernel's memory cgroup threshold notifications and by the
//! kubelet's 10 s polling alone (`kernelMemcgNotification: false`), side by side.
//!
//! Each round starts a joined node whose allocatable memory is 1200 MiB with the
//! hard threshold `memory.available<300Mi` (also `allocatableMemory.available`),
//! binds a BestEffort Wasm memhog of 1050 MiB to it, and samples the node
//! allocatable cgroup's working set every 2 ms: *crossed* is the first sample above
//! 900 MiB, *stopped* the first one back below it once the hog is killed.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use wasmlet_testkit::node::{NodeOptions, TestNode, poll};

use super::build_node;

const MIB: u64 = 1 << 20;
const ALLOCATABLE: u64 = 1200 * MIB;
const CROSSING: u64 = 900 * MIB;
const NODE: &str = "bench-eviction";

fn mem_total() -> anyhow::Result<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")?;
    let kb: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .context("no MemTotal in /proc/meminfo")?;
    Ok(kb * 1024)
}

/// The working set of a memory cgroup (v1): usage less inactive file pages.
fn working_set(dir: &Path) -> Option<u64> {
    let usage: u64 = std::fs::read_to_string(dir.join("memory.usage_in_bytes"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let stat = std::fs::read_to_string(dir.join("memory.stat")).ok()?;
    let inactive: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("total_inactive_file "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Some(usage.saturating_sub(inactive))
}

fn hog() -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "hog", "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": "localhost/wasmlet-examples/memhog:latest",
                "imagePullPolicy": "IfNotPresent",
                "env": [{"name": "MIB", "value": "1050"}],
            }],
        },
    }))?)
}

/// One round: crossed → stopped.
fn round(binary: &Path, scratch: &Path, notifications: bool) -> anyhow::Result<Duration> {
    let kubeconfig = scratch.join("kubeconfig");
    let cluster = super::idle::start_cluster(&kubeconfig, NODE)?;
    let api = &cluster.api;
    let reserved = (mem_total()? - ALLOCATABLE) / 1024;
    let node = TestNode::start(
        binary,
        NodeOptions {
            node_name: NODE.into(),
            images: vec!["memhog".into()],
            static_pods: false,
            extra_args: vec![
                "--kubeconfig".into(),
                kubeconfig.display().to_string(),
                "--node-ip".into(),
                "127.0.0.1".into(),
            ],
            kubelet_config: format!(
                "systemReserved: {{memory: {reserved}Ki}}\n\
                 evictionHard: {{memory.available: 300Mi}}\n\
                 kernelMemcgNotification: {notifications}\n"
            ),
            ..Default::default()
        },
    )?;
    poll(Duration::from_secs(60), || {
        api.get::<Node>(None, NODE)?
            .status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
            .then_some(())
    })
    .context("the node did not get Ready")?;
    let kubepods: PathBuf = Path::new("/sys/fs/cgroup/memory")
        .join(node.cgroup_root.trim_start_matches('/'))
        .join("kubepods");
    api.create(&hog()?)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut crossed = None;
    loop {
        let ws = working_set(&kubepods).unwrap_or(0);
        let now = Instant::now();
        match crossed {
            None if ws > CROSSING => crossed = Some(now),
            Some(at) if ws < CROSSING => return Ok(now - at),
            _ => {}
        }
        if now > deadline {
            bail!(
                "no eviction within 60 s (crossed: {}); the node's log ends:\n{}",
                crossed.is_some(),
                wasmlet_testkit::node::tail(&node.log(), 20)
            );
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

pub fn eviction(rounds: usize, debug: bool) -> anyhow::Result<()> {
    let binary = build_node(debug)?;
    let scratch = tempfile::tempdir()?;
    println!(
        "eviction ({} build): memory threshold crossed -> victim stopped, {rounds} rounds each",
        if debug { "debug" } else { "release" }
    );
    for (name, notifications) in [
        ("memcg threshold notification", true),
        ("polling every 10 s", false),
    ] {
        let mut times = Vec::new();
        for _ in 0..rounds {
            times.push(round(&binary, scratch.path(), notifications)?);
        }
        times.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "  {name:<30} min {:>8.0} ms  median {:>8.0} ms  max {:>8.0} ms",
            ms(times[0]),
            ms(times[times.len() / 2]),
            ms(times[times.len() - 1])
        );
    }
    Ok(())
}
