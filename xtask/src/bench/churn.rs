//! `bench churn`: Wasm pods that run to completion (`hello`, `restartPolicy:
//! Never`), kept `in_flight` at a time for a while: each manifest written → the pod
//! Succeeded → its manifest removed → the pod gone from `/pods`, and at once the next
//! one written. Prints completed cycles per second and each cycle's latency; beside
//! as many `/bin/true` runs, `in_flight` at a time, over the same time.

use std::collections::HashMap;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use wasmlet_testkit::node::{TestNode, poll};

use super::{WasmRun, ms, percentile};

/// How often `/pods` is read.
const POLL_EVERY: Duration = Duration::from_millis(2);
/// A pod that takes longer than this for one cycle fails the run.
const CYCLE_TIMEOUT: Duration = Duration::from_secs(60);

fn hello_yaml(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  restartPolicy: Never\n  containers:\n  - name: main\n    image: localhost/wasmlet-examples/hello:latest\n    imagePullPolicy: IfNotPresent\n"
    )
}

#[derive(serde::Serialize)]
struct Figures {
    seconds: f64,
    in_flight: usize,
    cycles: usize,
    pods_per_second: f64,
    cycle_p50_ms: f64,
    cycle_p99_ms: f64,
    baseline_processes_per_second: f64,
}

enum Stage {
    Written(Instant),
    Removed(Instant),
}

/// `cargo xtask bench churn`.
pub fn churn(seconds: u64, in_flight: usize, run: WasmRun) -> anyhow::Result<()> {
    if in_flight == 0 || seconds == 0 {
        bail!("--in-flight and --seconds must be at least 1");
    }
    let node = run.start_node(&["hello"], format!("maxPods: {}\n", in_flight + 10))?;
    // The first pod compiles the module; the run finds it cached.
    node.write_manifest("cold.yaml", &hello_yaml("cold"))?;
    poll(CYCLE_TIMEOUT, || {
        (phase(&node, "cold")? == "Succeeded").then_some(())
    })
    .context("the first pod never succeeded")?;
    node.remove_manifest("cold.yaml")?;
    poll(CYCLE_TIMEOUT, || node.pods().ok()?.is_empty().then_some(()))
        .context("the first pod did not go away")?;

    let suffix = format!("-{}", node.node_name);
    let mut next = 0usize;
    let mut stages: HashMap<String, (String, Stage)> = HashMap::new();
    let mut write_next = |stages: &mut HashMap<String, (String, Stage)>| -> anyhow::Result<()> {
        let name = format!("c{next:06}");
        next += 1;
        let file = format!("{name}.yaml");
        node.write_manifest(&file, &hello_yaml(&name))?;
        stages.insert(
            format!("{name}{suffix}"),
            (file, Stage::Written(Instant::now())),
        );
        Ok(())
    };
    let started = Instant::now();
    let window = Duration::from_secs(seconds);
    for _ in 0..in_flight {
        write_next(&mut stages)?;
    }
    let mut cycles: Vec<Duration> = Vec::new();
    while started.elapsed() < window {
        let listed: HashMap<String, String> = node
            .pods()?
            .into_iter()
            .filter_map(|p| {
                let phase = p.status.as_ref()?.phase.clone().unwrap_or_default();
                Some((p.metadata.name?, phase))
            })
            .collect();
        let now = Instant::now();
        let mut done = Vec::new();
        for (name, (file, stage)) in stages.iter_mut() {
            match stage {
                Stage::Written(at) => match listed.get(name).map(String::as_str) {
                    Some("Succeeded") => {
                        node.remove_manifest(file)?;
                        *stage = Stage::Removed(*at);
                    }
                    Some("Failed") => bail!("pod {name} failed"),
                    _ if now - *at > CYCLE_TIMEOUT => {
                        bail!("pod {name} did not succeed within {CYCLE_TIMEOUT:?}")
                    }
                    _ => {}
                },
                Stage::Removed(at) => {
                    if !listed.contains_key(name) {
                        cycles.push(now - *at);
                        done.push(name.clone());
                    } else if now - *at > CYCLE_TIMEOUT {
                        bail!("pod {name} was not removed within {CYCLE_TIMEOUT:?}");
                    }
                }
            }
        }
        for name in done {
            stages.remove(&name);
            write_next(&mut stages)?;
        }
        std::thread::sleep(POLL_EVERY);
    }
    let took = started.elapsed();
    // What is still in flight goes before the node does.
    for (file, _) in stages.values() {
        let _ = node.remove_manifest(file);
    }
    poll(CYCLE_TIMEOUT, || node.pods().ok()?.is_empty().then_some(()))
        .context("the last pods did not go away")?;

    let baseline = true_per_second(in_flight, Duration::from_secs(seconds.min(5)))?;
    if cycles.is_empty() {
        bail!("no pod completed a cycle in {seconds} s");
    }
    cycles.sort();
    let f = Figures {
        seconds: took.as_secs_f64(),
        in_flight,
        cycles: cycles.len(),
        pods_per_second: cycles.len() as f64 / took.as_secs_f64(),
        cycle_p50_ms: ms(percentile(&cycles, 0.50)),
        cycle_p99_ms: ms(percentile(&cycles, 0.99)),
        baseline_processes_per_second: baseline,
    };
    println!(
        "churn ({}, hello pods with restartPolicy Never, {in_flight} in flight, {:.1} s; /pods polled every {POLL_EVERY:?})",
        run.how(),
        f.seconds
    );
    println!(
        "  written → Succeeded → removed : {} pods, {:.1} pods/s",
        f.cycles, f.pods_per_second
    );
    println!(
        "  one cycle                     : p50 {:.1} ms, p99 {:.1} ms",
        f.cycle_p50_ms, f.cycle_p99_ms
    );
    println!(
        "  baseline: /bin/true runs      : {:.0} processes/s, {in_flight} at a time",
        f.baseline_processes_per_second
    );
    run.print_json(&f)?;
    Ok(())
}

/// The pod's phase in `/pods`, if it is listed.
fn phase(node: &TestNode, name: &str) -> Option<String> {
    node.pod(name)?.status?.phase
}

/// `/bin/true` runs per second, `in_flight` at a time, over `window`.
fn true_per_second(in_flight: usize, window: Duration) -> anyhow::Result<f64> {
    let started = Instant::now();
    let mut runs = 0usize;
    while started.elapsed() < window {
        let children: Vec<Child> = (0..in_flight)
            .map(|_| Command::new("/bin/true").spawn())
            .collect::<std::io::Result<_>>()
            .context("running /bin/true")?;
        for mut c in children {
            c.wait()?;
            runs += 1;
        }
    }
    Ok(runs as f64 / started.elapsed().as_secs_f64())
}
