//! `bench shim`: `containerd-shim-wasmlet-v1` against runc on the same private
//! containerd, in one run: 100 × `ctr run --rm` one after the other (tasks/s, p50,
//! p99), then the proportional memory (Pss) per running task at 20 tasks — for the
//! shim its shim and sandbox processes, for runc its shims and the containers'
//! processes.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use wasmlet_testkit::containerd::images::BUSYBOX_IMAGE;
use wasmlet_testkit::containerd::{Containerd, SNAPSHOTTER, WASM_RUNTIME_TYPE};
use wasmlet_testkit::images;
use wasmlet_testkit::node::{children_of, processes_matching as processes};

use super::{ms, percentile, pss_of};

fn build_shim(debug: bool) -> anyhow::Result<PathBuf> {
    let root = images::workspace_root()?;
    let mut cmd = crate::cargo();
    cmd.current_dir(&root).args([
        "build",
        "-p",
        "containerd-shim-wasmlet",
        "--bin",
        "containerd-shim-wasmlet-v1",
    ]);
    if !debug {
        cmd.arg("--release");
    }
    if !cmd.status().context("running cargo build")?.success() {
        bail!("cargo build failed");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    Ok(target
        .join(if debug { "debug" } else { "release" })
        .join("containerd-shim-wasmlet-v1"))
}

struct Case {
    name: &'static str,
    /// `ctr run` arguments before the id (runtime, image).
    run: Vec<String>,
    /// After the id: the command (none for the Wasm image's entrypoint).
    command: Vec<String>,
    /// A long-running task for the density run.
    long_run: Vec<String>,
    long_command: Vec<String>,
}

pub fn shim(runs: usize, density: usize, debug: bool) -> anyhow::Result<()> {
    let shim = build_shim(debug)?;
    let shim_images = images::ensure_shim_images()?;
    let containerd = Containerd::start_with_shim(&shim)?;
    containerd.import_test_images()?;
    for image in &shim_images {
        containerd.import_archive(&image.archive)?;
    }
    let reference = |name: &str| {
        shim_images
            .iter()
            .find(|i| i.name == name)
            .map(|i| i.reference.clone())
            .expect("a shim image")
    };
    let runc_root = containerd
        .layout()
        .runc_root()
        .to_string_lossy()
        .into_owned();
    let common = |runtime: &str, image: String| -> Vec<String> {
        vec![
            "run".into(),
            "--snapshotter".into(),
            SNAPSHOTTER.into(),
            "--runtime".into(),
            runtime.into(),
            "--runc-root".into(),
            runc_root.clone(),
            image,
        ]
    };
    let cases = [
        Case {
            name: "wasmlet shim (hello-linux)",
            run: common(WASM_RUNTIME_TYPE, reference("hello-linux")),
            command: Vec::new(),
            long_run: common(WASM_RUNTIME_TYPE, reference("ticker-linux")),
            long_command: Vec::new(),
        },
        Case {
            name: "runc (busybox true)",
            run: common("io.containerd.runc.v2", BUSYBOX_IMAGE.into()),
            command: vec!["true".into()],
            long_run: common("io.containerd.runc.v2", BUSYBOX_IMAGE.into()),
            long_command: vec!["sleep".into(), "1000".into()],
        },
    ];

    println!(
        "shim: {runs} x `ctr run --rm` one after the other, then {density} tasks running, containerd {}",
        super::containerd_version(&containerd)
    );
    let mut rows = Vec::new();
    for (n, case) in cases.iter().enumerate() {
        // One warm-up run: the image is unpacked once, the module compiled once.
        let mut times = Vec::with_capacity(runs);
        for i in 0..=runs {
            let id = format!("b{n}-{i}");
            let mut args = case.run.clone();
            args.insert(1, "--rm".into());
            args.insert(2, "--null-io".into());
            args.push(id.clone());
            args.extend(case.command.iter().cloned());
            let started = Instant::now();
            containerd.ctr_k8s(&args).with_context(|| {
                format!(
                    "{}: ctr run {id}; containerd's log:\n{}",
                    case.name,
                    containerd.log_tail(40)
                )
            })?;
            if i > 0 {
                times.push(started.elapsed());
            }
        }
        let total: Duration = times.iter().sum();
        times.sort();

        // Density: `density` long-running tasks.
        let ids: Vec<String> = (0..density).map(|i| format!("d{n}-{i}")).collect();
        for id in &ids {
            let mut args = case.long_run.clone();
            args.insert(1, "--detach".into());
            args.insert(2, "--null-io".into());
            args.push(id.clone());
            args.extend(case.long_command.iter().cloned());
            containerd
                .ctr_k8s(&args)
                .with_context(|| format!("ctr run -d {id}"))?;
        }
        let dir = containerd.layout().dir.to_string_lossy().into_owned();
        // The run's shims (and the Wasm shim's sandbox processes, which name the run
        // directory too), then runc's containers: its shims' other children.
        let ours = processes(|c| c.contains("containerd-shim") && c.contains(&dir));
        let containers: Vec<u32> = ours
            .iter()
            .flat_map(|pid| children_of(*pid))
            .filter(|pid| !ours.contains(pid))
            .collect();
        let per_task = (pss_of(&ours) + pss_of(&containers)) as f64 / density as f64 / 1024.0;
        let procs = ours.len() + containers.len();
        super::ctr_remove(&containerd, &ids)?;
        rows.push((
            case.name,
            runs as f64 / total.as_secs_f64(),
            ms(percentile(&times, 0.50)),
            ms(percentile(&times, 0.99)),
            per_task,
            procs,
        ));
    }
    println!(
        "{:<28} {:>9} {:>9} {:>9} {:>16} {:>10}",
        "runtime", "tasks/s", "p50 ms", "p99 ms", "Pss/task MiB", "processes"
    );
    for (name, rate, p50, p99, pss, procs) in &rows {
        println!("{name:<28} {rate:>9.1} {p50:>9.1} {p99:>9.1} {pss:>16.2} {procs:>10}");
    }
    if let [wasm, runc] = &rows[..] {
        println!(
            "wasmlet shim / runc: {:.2}x throughput, {:.2}x Pss per task",
            wasm.1 / runc.1,
            wasm.4 / runc.4
        );
    }
    containerd.stop()?;
    Ok(())
}
