//! Log rotation through the runtime: the node renames a running container's log
//! aside and asks the sandbox to reopen it, as the kubelet's container log manager
//! does; the container's records continue in a new file, none lost, none repeated.

use anyhow::{Result, ensure};
use wasmlet_runtime::{ContainerState, Error, Runtime};
use wasmlet_runtime_wasm::crilog::Stream;

use crate::fixture::{Fixture, lines, log_records, poll_until, wait_for_stdout_line, with_env};

/// The ticks of a log file's stdout, as numbers.
fn ticks(path: &std::path::Path) -> Result<Vec<u64>> {
    lines(&log_records(path)?, Stream::Stdout)
        .iter()
        .map(|l| {
            l.strip_prefix("tick ")
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| anyhow::anyhow!("{}: not a tick: {l:?}", path.display()))
        })
        .collect()
}

#[tokio::test]
async fn a_reopened_log_continues_in_a_new_file_losing_and_repeating_nothing() -> Result<()> {
    let fx = Fixture::with_images(&["ticker"])?;
    let pod = fx.pod("rotate").await?;
    let config = with_env(pod.container("ticker", "ticker"), &[("INTERVAL_MS", "5")]);
    let id = fx.run(&pod, &config).await?;
    let status = fx.wait_for_state(&id, ContainerState::Running).await?;
    let log = status.log_path.clone();
    wait_for_stdout_line(&log, "tick 10").await?;

    let mut files = Vec::new();
    for round in 0..4 {
        // Let the container write into the current file, then rotate it as the node does.
        poll_until("ticks in the current log", async || {
            Ok((ticks(&log)?.len() >= 10).then_some(()))
        })
        .await?;
        let rotated = log.with_file_name(format!("0.log.2024010{round}-000000"));
        std::fs::rename(&log, &rotated)?;
        fx.runtime.reopen_container_log(&id).await?;
        files.push(rotated);
    }
    poll_until("ticks in the newest log", async || {
        Ok((ticks(&log)?.len() >= 10).then_some(()))
    })
    .await?;
    fx.runtime
        .stop_container(&id, std::time::Duration::from_secs(1))
        .await?;
    fx.wait_exited(&id).await?;
    files.push(log.clone());

    let mut all = Vec::new();
    for file in &files {
        let part = ticks(file)?;
        ensure!(!part.is_empty(), "{} has no ticks", file.display());
        all.extend(part);
    }
    let expected: Vec<u64> = (1..=all.len() as u64).collect();
    ensure!(
        all == expected,
        "ticks across {files:?} are not 1..={}: {all:?}",
        all.len()
    );

    // An exited container writes nothing more: there is nothing to reopen.
    let err = fx.runtime.reopen_container_log(&id).await.unwrap_err();
    ensure!(matches!(err, Error::FailedPrecondition(_)), "{err}");
    Ok(())
}
