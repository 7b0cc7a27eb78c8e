//! `cargo xtask <task>`: the project's build chores that are not cargo's.
//!
//! Each task is a variant of [`Task`]; its logic lives in a library
//! (`wasmlet_testkit::images` for guest builds and OCI archives) so tests
//! can run the same code.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::Context;
use clap::{Parser, Subcommand};
use wasmlet_testkit::images;

mod bench;
mod fuzz;
mod soak;

/// The cargo that runs this xtask, for a build of its own, without the variables
/// `cargo run` set for the xtask: some build scripts (ring's) depend on
/// `CARGO_PKG_NAME` and the like, so a build that inherits them would compile again
/// what `cargo build` compiled, and the next `cargo build` again.
fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    for (name, _) in std::env::vars_os() {
        let inherited = name.to_str().is_some_and(|n| {
            n.starts_with("CARGO_PKG_")
                || n.starts_with("CARGO_MANIFEST_")
                || matches!(
                    n,
                    "CARGO_BIN_NAME" | "CARGO_CRATE_NAME" | "CARGO_PRIMARY_PACKAGE"
                )
        });
        if inherited {
            cmd.env_remove(name);
        }
    }
    cmd
}

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "wasmlet build tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Build the Wasm guests in examples/workloads (Debian toolchain,
    /// wasm32-wasip1) and write their OCI archives.
    Images {
        /// Where to write `<name>.tar` and `<name>.wasm` [default: <workspace>/target/images].
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
    /// Build the fuzz targets of `fuzz/` (cargo-fuzz, libFuzzer) and run each for a
    /// bounded time from its seeds; fails if one crashed.
    Fuzz {
        /// Seconds per target (0: build only).
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Targets run at once (each a single-threaded libFuzzer process).
        #[arg(long, default_value_t = 2)]
        jobs: usize,
        /// Print the figures as JSON.
        #[arg(long)]
        json: bool,
        /// The targets to run [default: all].
        targets: Vec<String>,
    },
    /// Churn Wasm and busybox pods (create, probe, restart, delete) on a node for a
    /// while, then check that nothing leaked and the node's RSS held; prints the
    /// figures and the RSS curve.
    Soak(soak::Soak),
    /// Benchmarks (they print figures; they are not tests).
    Bench {
        #[command(subcommand)]
        bench: Bench,
    },
}

#[derive(Debug, Subcommand)]
enum Bench {
    /// Manifest appears -> pod Running, for many pods on a standalone node.
    PodStart {
        /// `wasm`: Wasm pods. `cri`: container pods through a private
        /// containerd, against `ctr run` of the same image on it.
        #[arg(long, value_enum, default_value_t = bench::Runtime::Wasm)]
        runtime: bench::Runtime,
        /// How many pods to start at once [default: 100 for wasm, 30 for cri].
        #[arg(long)]
        pods: Option<usize>,
        /// Build and run the debug binary instead of the release one.
        #[arg(long)]
        debug: bool,
    },
    /// One Wasm pod at a time, module cached: manifest -> Running as the node
    /// times it and as seen from outside, beside fork+exec of /bin/true.
    WasmSingle {
        /// Pods started one after another.
        #[arg(long, default_value_t = 50)]
        pods: usize,
        #[command(flatten)]
        run: bench::WasmRun,
    },
    /// N Wasm pods written at once, module cached: until all run, the node's
    /// `/healthz` latency, PLEG relist time and RSS meanwhile; then their removal;
    /// beside N processes spawned at once.
    WasmBurst {
        /// Pods written at once (`maxPods` is raised to fit them).
        #[arg(long, default_value_t = 100)]
        pods: usize,
        #[command(flatten)]
        run: bench::WasmRun,
    },
    /// The memory of N running Wasm pods: Pss and private dirty per sandbox
    /// process, the node's RSS; beside the Pss of as many `sleep` processes.
    Density {
        /// Pods running at once (`maxPods` is raised to fit them).
        #[arg(long, default_value_t = 100)]
        pods: usize,
        #[command(flatten)]
        run: bench::WasmRun,
    },
    /// Wasm pods that run to completion, N in flight: written → Succeeded →
    /// removed, pods per second over a window; beside /bin/true runs.
    Churn {
        /// The measuring window.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Pods in flight at once.
        #[arg(long, default_value_t = 20)]
        in_flight: usize,
        #[command(flatten)]
        run: bench::WasmRun,
    },
    /// One plugin call against the same work done natively: p50/p99 of the
    /// http-json-probe and priority-eviction examples, each call on a fresh
    /// instance (before) and on an instance made ahead of it (after).
    PluginCall {
        /// Measured calls per case.
        #[arg(long, default_value_t = 2000)]
        calls: usize,
        /// Build and run in debug instead of release.
        #[arg(long)]
        debug: bool,
        /// Also print the figures as JSON.
        #[arg(long)]
        json: bool,
    },
    /// An idle node's own CPU and RSS with each pod source (none, a manifest
    /// directory empty and with a pod, a manifest URL, the API server).
    Idle {
        /// The measuring window per case.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Build and run the debug binary instead of the release one.
        #[arg(long)]
        debug: bool,
    },
    /// Requests/s and p50/p99 latency of the hello-http wasi:http component
    /// beside the same handler as a native hyper server and the httpd example,
    /// at 1, 16 and 64 connections (wrk).
    Http {
        /// The load per case.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        /// Build and run the debug binary instead of the release one.
        #[arg(long)]
        debug: bool,
    },
    /// containerd-shim-wasmlet-v1 against runc on one containerd: `ctr run --rm`
    /// tasks/s and p50/p99, and Pss per running task.
    Shim {
        /// `ctr run --rm` per runtime.
        #[arg(long, default_value_t = 100)]
        runs: usize,
        /// Tasks running at once for the memory figure.
        #[arg(long, default_value_t = 20)]
        density: usize,
        /// Build and run the debug shim instead of the release one.
        #[arg(long)]
        debug: bool,
    },
    /// Memory threshold crossed -> victim stopped, with memcg threshold
    /// notifications and by 10 s polling.
    Eviction {
        /// Rounds per mode.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Build and run the debug binary instead of the release one.
        #[arg(long)]
        debug: bool,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().task {
        Task::Images { out_dir } => images_task(out_dir),
        Task::Fuzz {
            seconds,
            jobs,
            json,
            targets,
        } => fuzz::fuzz(targets, seconds, jobs, json),
        Task::Soak(soak) => soak::soak(soak),
        Task::Bench {
            bench:
                Bench::PodStart {
                    runtime,
                    pods,
                    debug,
                },
        } => bench::pod_start(
            runtime,
            pods.unwrap_or_else(|| runtime.default_pods()),
            debug,
        ),
        Task::Bench {
            bench: Bench::PluginCall { calls, debug, json },
        } => bench::plugin_call(calls, debug, json),
        Task::Bench {
            bench: Bench::WasmSingle { pods, run },
        } => bench::wasm_single(pods, run),
        Task::Bench {
            bench: Bench::WasmBurst { pods, run },
        } => bench::wasm_burst(pods, run),
        Task::Bench {
            bench: Bench::Density { pods, run },
        } => bench::density(pods, run),
        Task::Bench {
            bench:
                Bench::Churn {
                    seconds,
                    in_flight,
                    run,
                },
        } => bench::churn(seconds, in_flight, run),
        Task::Bench {
            bench: Bench::Idle { seconds, debug },
        } => bench::idle(seconds, debug),
        Task::Bench {
            bench: Bench::Eviction { rounds, debug },
        } => bench::eviction(rounds, debug),
        Task::Bench {
            bench: Bench::Http { seconds, debug },
        } => bench::http(seconds, debug),
        Task::Bench {
            bench:
                Bench::Shim {
                    runs,
                    density,
                    debug,
                },
        } => bench::shim(runs, density, debug),
    }
}

fn images_task(out_dir: Option<PathBuf>) -> anyhow::Result<()> {
    let root = images::workspace_root()?;
    let out_dir = out_dir.unwrap_or_else(|| root.join("target").join("images"));
    let started = Instant::now();
    eprintln!(
        "building Wasm guests in {} and {} (a cold build takes a minute or two)",
        root.join("examples/workloads").display(),
        root.join("examples/http").display()
    );
    let built = images::build_all_example_images(&root, &out_dir)
        .with_context(|| format!("writing images to {}", out_dir.display()))?;
    for image in &built {
        println!(
            "{}\t{}\t{}",
            image.archive.display(),
            image.reference,
            image.manifest_digest
        );
    }
    eprintln!(
        "{} images in {:.1} s",
        built.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
