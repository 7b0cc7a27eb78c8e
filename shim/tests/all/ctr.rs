//! The shim as `ctr run --runtime io.containerd.wasmlet.v1` drives it.

use std::time::Duration;

use anyhow::Result;

use crate::harness::{Harness, poll};

const T: Duration = Duration::from_secs(60);

#[test]
fn a_ticker_prints_execs_reports_metrics_and_kill_ends_it_with_the_signal() -> Result<()> {
    let h = Harness::start()?;
    let mut ticker = h.ctr_spawn(&h.run_args(
        &[
            "--rm",
            "--env",
            "INTERVAL_MS=50",
            "--memory-limit",
            "67108864",
        ],
        "ticker",
        "tick1",
        &[],
    ))?;
    ticker.wait_line(T, |l| l == "tick 3")?;
    assert_eq!(h.task_status("tick1")?.as_deref(), Some("RUNNING"));

    // An exec runs the container's program again, with its own args and stdio.
    let out = h.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "e1",
        "tick1",
        "/app.wasm",
        "check",
    ])?;
    assert_eq!(out.trim(), "ok");
    let err = h
        .ctr(&["task", "exec", "--exec-id", "e2", "tick1", "/bin/sh"])
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("is not a program its image holds"),
        "{err:#}"
    );

    // Metrics are the task cgroup's: the limit the spec set, and real usage.
    let metrics = h.ctr(&["task", "metrics", "tick1"])?;
    let value = |key: &str| -> Option<u64> {
        metrics.lines().find_map(|l| {
            let mut f = l.split_whitespace();
            (f.next() == Some(key))
                .then(|| f.next()?.parse().ok())
                .flatten()
        })
    };
    assert_eq!(value("memory.limit_in_bytes"), Some(64 << 20), "{metrics}");
    assert!(value("memory.usage_in_bytes").unwrap_or(0) > 0, "{metrics}");
    assert!(value("pids.current").unwrap_or(0) >= 1, "{metrics}");

    let address = h.shim_address("tick1")?;
    h.ctr(&["task", "kill", "tick1"])?;
    let (code, stderr) = ticker.wait(T)?;
    assert_eq!(
        code,
        128 + 15,
        "ended by SIGTERM, as runc reports it; {stderr}"
    );

    // `--rm` deleted the task: the shim and its sandbox process are gone.
    poll(T, "the shim and its sandbox process to exit", || {
        Ok(h.shim_processes().is_empty().then_some(()))
    })?;
    let socket = address.trim().trim_start_matches("unix://").to_owned();
    assert!(
        !std::path::Path::new(&socket).exists(),
        "{socket} left behind"
    );
    Ok(())
}

#[test]
fn a_trapping_guest_exits_with_a_code_and_its_pods_shim_keeps_serving() -> Result<()> {
    let h = Harness::start()?;
    let group = ["--annotation", "io.kubernetes.cri.sandbox-id=pod-a"];
    let mut ticker = h.ctr_spawn(&h.run_args(
        &[&["--rm", "--env", "INTERVAL_MS=50"][..], &group[..]].concat(),
        "ticker",
        "pod-a-ticker",
        &[],
    ))?;
    ticker.wait_line(T, |l| l == "tick 1")?;

    let crasher = h.ctr_spawn(&h.run_args(
        &[&["--rm"][..], &group[..]].concat(),
        "crasher",
        "pod-a-crasher",
        &[],
    ))?;
    let (code, stderr) = crasher.wait(T)?;
    assert_ne!(code, 0, "a trap is a failure; {stderr}");
    assert!(
        code > 128 || code == 1 || code == 134,
        "exit code {code}; {stderr}"
    );

    // One shim for the pod, and it still runs the ticker.
    let seen = ticker.seen.len();
    ticker.wait_line(T, |_| true)?;
    assert!(ticker.seen.len() > seen);
    assert_eq!(h.task_status("pod-a-ticker")?.as_deref(), Some("RUNNING"));

    let hello = h.ctr(&h.run_args(
        &[&["--rm"][..], &group[..]].concat(),
        "hello",
        "pod-a-hello",
        &["/app.wasm", "x"],
    ))?;
    assert!(hello.contains("arg[1]=x"), "{hello}");
    assert_eq!(
        h.shim_processes().len(),
        2,
        "one shim and one sandbox process for the pod"
    );

    h.ctr(&["task", "kill", "-s", "SIGKILL", "pod-a-ticker"])?;
    let (code, _) = ticker.wait(T)?;
    assert_eq!(code, 137);
    poll(T, "the pod's shim to exit with its last task", || {
        Ok(h.shim_processes().is_empty().then_some(()))
    })?;
    Ok(())
}

#[test]
fn running_tasks_survive_a_containerd_restart_and_are_reconnected() -> Result<()> {
    let mut h = Harness::start()?;
    let log = crate::harness::run_file(&h, "ticker.log");
    let uri = format!("file://{}", log.display());
    h.ctr(&h.run_args(
        &["-d", "--log-uri", &uri, "--env", "INTERVAL_MS=50"],
        "ticker",
        "survivor",
        &[],
    ))?;
    let ticks = |log: &std::path::Path| {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("tick "))
            .count()
    };
    poll(T, "the ticker to tick", || {
        Ok((ticks(&log) >= 2).then_some(()))
    })?;
    let shims = h.shim_processes();

    h.containerd.stop_daemon()?;
    let before = ticks(&log);
    poll(T, "ticks while containerd is down", || {
        Ok((ticks(&log) > before + 2).then_some(()))
    })?;
    h.containerd.start_daemon()?;

    assert_eq!(h.task_status("survivor")?.as_deref(), Some("RUNNING"));
    assert_eq!(
        h.shim_processes(),
        shims,
        "the same shim and sandbox processes"
    );
    let out = h.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "after",
        "survivor",
        "/app.wasm",
        "check",
    ])?;
    assert_eq!(out.trim(), "ok");

    h.ctr(&["task", "kill", "-s", "SIGKILL", "survivor"])?;
    poll(T, "the task to stop", || {
        Ok((h.task_status("survivor")?.as_deref() == Some("STOPPED")).then_some(()))
    })?;
    h.ctr(&["task", "rm", "survivor"])?;
    h.ctr(&["container", "rm", "survivor"])?;
    poll(T, "the shim to exit", || {
        Ok(h.shim_processes().is_empty().then_some(()))
    })?;
    Ok(())
}
