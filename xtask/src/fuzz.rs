//! `cargo xtask fuzz`: builds the libFuzzer targets of `fuzz/` with cargo-fuzz and runs
//! each for a bounded time, from the seeds in `fuzz/seeds/<target>` and the corpus an
//! earlier run grew in `target/fuzz-corpus/<target>`. Prints executions, coverage and
//! corpus per target (a table, or JSON with `--json`); fails if any target crashed,
//! leaving the input in `target/fuzz-artifacts/<target>/` to become a regression
//! (`fuzz/regressions/<target>/`, replayed by `tests/fuzzing`'s tests).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail};

/// How the targets are built: coverage instrumentation, the dev profile (debug
/// assertions, so an arithmetic overflow is a crash as in a test), no sanitizer (it
/// would need nightly compiler flags; the code under test is safe Rust). Not release:
/// cargo-fuzz builds release with one codegen unit per crate, which takes this
/// dependency tree (wasmtime, kube) the better part of an hour on two cores.
const BUILD_FLAGS: [&str; 3] = ["--dev", "--sanitizer", "none"];

/// The figures of one target's run.
#[derive(Debug)]
struct Run {
    target: String,
    seconds: f64,
    executions: u64,
    per_second: u64,
    coverage: u64,
    features: u64,
    corpus: u64,
    peak_rss_mb: u64,
    crashed: Option<String>,
}

pub fn fuzz(targets: Vec<String>, seconds: u64, jobs: usize, json: bool) -> anyhow::Result<()> {
    let root = wasmlet_testkit::images::workspace_root()?;
    let fuzz_dir = root.join("fuzz");
    let all = all_targets(&fuzz_dir)?;
    let targets = if targets.is_empty() {
        all
    } else {
        for t in &targets {
            if !all.contains(t) {
                bail!("no fuzz target {t:?}; the targets are {}", all.join(", "));
            }
        }
        targets
    };
    let version = crate::cargo().args(["fuzz", "--version"]).output();
    if !version.as_ref().is_ok_and(|o| o.status.success()) {
        bail!("cargo-fuzz is not installed: scripts/install-deps.sh installs it");
    }
    let target_dir = root.join("target").join("fuzz");
    let started = Instant::now();
    eprintln!(
        "building {} fuzz targets in {}",
        targets.len(),
        target_dir.display()
    );
    let status = cargo_fuzz(&fuzz_dir, &target_dir)
        .arg("build")
        .args(BUILD_FLAGS)
        .status()
        .context("running cargo fuzz build")?;
    if !status.success() {
        bail!("cargo fuzz build failed: {status}");
    }
    eprintln!("built in {:.0} s", started.elapsed().as_secs_f64());
    if seconds == 0 {
        return Ok(());
    }

    // `jobs` targets at a time, each a single-threaded libFuzzer process.
    let queue = std::sync::Mutex::new(targets.iter());
    let results = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| {
                loop {
                    let Some(target) = queue.lock().unwrap().next() else {
                        return;
                    };
                    let run = run_target(&root, &fuzz_dir, &target_dir, target, seconds);
                    if let Ok(run) = &run {
                        eprintln!(
                            "{target}: {} executions in {:.0} s, cov {}, corpus {}{}",
                            run.executions,
                            run.seconds,
                            run.coverage,
                            run.corpus,
                            run.crashed
                                .as_deref()
                                .map(|a| format!(", CRASHED: {a}"))
                                .unwrap_or_default()
                        );
                    }
                    results.lock().unwrap().push(run);
                }
            });
        }
    });
    let mut runs = Vec::new();
    for run in results.into_inner().unwrap() {
        runs.push(run?);
    }
    runs.sort_by(|a, b| a.target.cmp(&b.target));
    if json {
        let rows: Vec<_> = runs
            .iter()
            .map(|r| {
                serde_json::json!({
                    "target": r.target, "seconds": r.seconds, "executions": r.executions,
                    "exec_per_second": r.per_second, "coverage": r.coverage,
                    "features": r.features, "corpus": r.corpus,
                    "peak_rss_mb": r.peak_rss_mb, "crash": r.crashed,
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(rows));
    } else {
        println!(
            "{:<18} {:>7} {:>12} {:>9} {:>7} {:>8} {:>7} {:>8}  crash",
            "target", "seconds", "executions", "exec/s", "cov", "features", "corpus", "rss MiB"
        );
        for r in &runs {
            println!(
                "{:<18} {:>7.0} {:>12} {:>9} {:>7} {:>8} {:>7} {:>8}  {}",
                r.target,
                r.seconds,
                r.executions,
                r.per_second,
                r.coverage,
                r.features,
                r.corpus,
                r.peak_rss_mb,
                r.crashed.as_deref().unwrap_or("-")
            );
        }
    }
    let crashed: Vec<_> = runs.iter().filter(|r| r.crashed.is_some()).collect();
    if !crashed.is_empty() {
        bail!(
            "{} of {} fuzz targets crashed; each input is in target/fuzz-artifacts/<target>/: \
             fix the bug, then keep the input in fuzz/regressions/<target>/",
            crashed.len(),
            runs.len()
        );
    }
    Ok(())
}

/// The targets: the files of `fuzz/fuzz_targets`.
fn all_targets(fuzz_dir: &Path) -> anyhow::Result<Vec<String>> {
    let dir = fuzz_dir.join("fuzz_targets");
    let mut targets: Vec<String> = std::fs::read_dir(&dir)
        .with_context(|| dir.display().to_string())?
        .flatten()
        .filter_map(|e| {
            e.path()
                .file_stem()
                .filter(|_| e.path().extension().is_some_and(|x| x == "rs"))
                .map(|s| s.to_string_lossy().into_owned())
        })
        .collect();
    targets.sort();
    Ok(targets)
}

fn cargo_fuzz(fuzz_dir: &Path, target_dir: &Path) -> Command {
    let mut cmd = crate::cargo();
    cmd.arg("fuzz")
        .current_dir(fuzz_dir.parent().unwrap_or(fuzz_dir))
        .env("CARGO_TARGET_DIR", target_dir);
    cmd
}

fn run_target(
    root: &Path,
    fuzz_dir: &Path,
    target_dir: &Path,
    target: &str,
    seconds: u64,
) -> anyhow::Result<Run> {
    let corpus = root.join("target").join("fuzz-corpus").join(target);
    let artifacts = root.join("target").join("fuzz-artifacts").join(target);
    // Where the target keeps its scratch files; it is gone after the run.
    let scratch = root.join("target").join("fuzz-scratch").join(target);
    for dir in [&corpus, &artifacts, &scratch] {
        std::fs::create_dir_all(dir)?;
    }
    let seeds = fuzz_dir.join("seeds").join(target);
    let started = Instant::now();
    let output = cargo_fuzz(fuzz_dir, target_dir)
        .arg("run")
        .args(BUILD_FLAGS)
        .arg(target)
        .arg(&corpus)
        .arg(&seeds)
        .arg("--")
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .args(["-timeout=10", "-rss_limit_mb=2048", "-print_final_stats=1"])
        .env("WASMLET_FUZZ_SCRATCH", &scratch)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running fuzz target {target}"))?;
    let elapsed = started.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&scratch);
    let log = String::from_utf8_lossy(&output.stderr);
    let log_path = root.join("target").join(format!("fuzz-{target}.log"));
    std::fs::write(&log_path, log.as_bytes())?;
    let crashed = (!output.status.success()).then(|| {
        let artifact = log
            .lines()
            .find_map(|l| l.split("Test unit written to ").nth(1))
            .map(str::to_owned);
        // The end of the log says what happened (a panic's message, a timeout).
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        eprintln!(
            "fuzz target {target} failed ({}); the end of {}:",
            output.status,
            log_path.display()
        );
        for line in tail.iter().rev() {
            eprintln!("  {line}");
        }
        artifact.unwrap_or_else(|| format!("see {}", log_path.display()))
    });
    let stat = |name: &str| -> u64 {
        log.lines()
            .find_map(|l| l.strip_prefix(&format!("stat::{name}:")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    // The last status line: `#N  DONE  cov: C ft: F corp: K/S ...` (or `pulse`, `NEW`).
    let last = log
        .lines()
        .rev()
        .find(|l| l.starts_with('#') && l.contains("cov:"))
        .unwrap_or("");
    let field = |name: &str| -> u64 {
        last.split_whitespace()
            .skip_while(|w| *w != name)
            .nth(1)
            .and_then(|v| v.split('/').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Ok(Run {
        target: target.to_owned(),
        seconds: elapsed,
        executions: stat("number_of_executed_units"),
        per_second: stat("average_exec_per_sec"),
        coverage: field("cov:"),
        features: field("ft:"),
        corpus: field("corp:"),
        peak_rss_mb: stat("peak_rss_mb"),
        crashed,
    })
}
