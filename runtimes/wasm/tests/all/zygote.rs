//! Sandboxes forked from a zygote (`wasmlet_runtime_wasm::sandbox::zygote`): they are
//! the zygote's children, run their guests, outlive the zygote, and a zygote that has
//! gone is replaced by the next sandbox's start. The pod cgroup of a forked sandbox is
//! shown in [`crate::cgroups`].

use std::path::Path;

use anyhow::{Context, Result, ensure};
use wasmlet_runtime::{ContainerState, Runtime};
use wasmlet_testkit::node::parent_of;

use crate::fixture::{Fixture, poll_until, process_exists, wait_for_stdout_line, with_env};

/// The zygote of the fixture rooted at `dir`: the process this test started with
/// `--zygote` and that fixture's socket (the sandboxes it forks have the same command
/// line, and the zygote for a parent).
fn zygotes_of(dir: &Path) -> Vec<u32> {
    let socket = dir.join("sandboxes").join("zygote").join("zygote.sock");
    let socket = socket.to_string_lossy().into_owned();
    wasmlet_testkit::node::processes_matching(|cmdline| {
        cmdline.contains("--zygote") && cmdline.contains(&socket)
    })
    .into_iter()
    .filter(|pid| parent_of(*pid) == Some(std::process::id()))
    .collect()
}

/// Whether process `pid` has ended: gone, or a zombie its parent (this test's
/// runtime, the zygote's) has not reaped yet.
fn ended(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

#[tokio::test]
async fn forked_sandboxes_run_their_guests_and_outlive_a_zygote_that_is_replaced() -> Result<()> {
    let fx = Fixture::forked_with_images(&["ticker"])?;
    let ticker = |pod: &crate::fixture::Pod| {
        with_env(pod.container("ticker", "ticker"), &[("INTERVAL_MS", "20")])
    };
    let first = fx.pod("first").await?;
    let first_pid = fx.runtime.sandbox_pid(&first.id).context("a sandbox pid")?;
    let zygotes = zygotes_of(fx.path());
    ensure!(zygotes.len() == 1, "one zygote: {zygotes:?}");
    let zygote = zygotes[0];
    assert_eq!(
        parent_of(first_pid),
        Some(zygote),
        "the sandbox is the zygote's child"
    );

    let id = fx.run(&first, &ticker(&first)).await?;
    fx.wait_for_state(&id, ContainerState::Running).await?;
    let log = fx.runtime.container_status(&id).await?.log_path;
    wait_for_stdout_line(&log, "tick 2").await?;

    // The zygote goes; the sandbox it forked runs on, and the next pod gets a new one.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(zygote as i32),
        nix::sys::signal::Signal::SIGKILL,
    )?;
    poll_until(
        "the zygote to end",
        async || Ok(ended(zygote).then_some(())),
    )
    .await?;
    wait_for_stdout_line(&log, "tick 6").await?;
    let second = fx.pod("second").await?;
    let second_pid = fx
        .runtime
        .sandbox_pid(&second.id)
        .context("a sandbox pid")?;
    let replaced = zygotes_of(fx.path());
    ensure!(
        replaced.len() == 1 && replaced[0] != zygote,
        "a new zygote: {replaced:?} (the first was {zygote})"
    );
    assert_eq!(parent_of(second_pid), Some(replaced[0]));
    let id = fx.run(&second, &ticker(&second)).await?;
    fx.wait_for_state(&id, ContainerState::Running).await?;
    let log = fx.runtime.container_status(&id).await?.log_path;
    wait_for_stdout_line(&log, "tick 2").await?;

    for (pod, pid) in [(&first, first_pid), (&second, second_pid)] {
        fx.runtime.remove_pod_sandbox(&pod.id).await?;
        poll_until("the sandbox process to exit", async || {
            Ok((!process_exists(pid)).then_some(()))
        })
        .await?;
    }
    // The runtime takes its zygote with it.
    let zygote = replaced[0];
    drop(fx);
    poll_until("the zygote to end with its runtime", async || {
        Ok(ended(zygote).then_some(()))
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_killed_forked_sandbox_ends_its_containers() -> Result<()> {
    let fx = Fixture::forked_with_images(&["ticker"])?;
    let pod = fx.pod("killed").await?;
    let pid = fx.runtime.sandbox_pid(&pod.id).context("a sandbox pid")?;
    let id = fx.run(&pod, &pod.container("ticker", "ticker")).await?;
    fx.wait_for_state(&id, ContainerState::Running).await?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )?;
    let status = fx.wait_for_state(&id, ContainerState::Exited).await?;
    assert!(
        status.message.contains("sandbox process exited"),
        "{status:#?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_zygote_that_cannot_start_says_why() -> Result<()> {
    let fx = Fixture::with_sandbox_args(&["--no-such-flag"])?;
    let mut config = fx.pod_config("refused");
    config.metadata.uid = "uid-refused".into();
    // The same fixture, forked: the leading argument is the zygote's too.
    let forked = Fixture::forked_with_sandbox_args(&["--no-such-flag"])?;
    let err = forked
        .runtime
        .run_pod_sandbox(&forked.pod_config("refused"))
        .await
        .expect_err("a zygote that cannot start starts no sandbox");
    let text = err.to_string();
    assert!(
        text.contains("zygote") && text.contains("--no-such-flag"),
        "{text}"
    );
    // Without a zygote the same argument fails the sandbox's own start, as before.
    let err = fx
        .runtime
        .run_pod_sandbox(&config)
        .await
        .expect_err("the sandbox refuses the argument");
    assert!(err.to_string().contains("--no-such-flag"), "{err}");
    Ok(())
}
