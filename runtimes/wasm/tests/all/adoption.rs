//! A node that crashes leaves its Wasm sandboxes running; its next run adopts them.
//! Here the "next run" is a second runtime on the same directories.

use anyhow::Result;
use wasmlet_runtime::{ContainerState, Runtime, SandboxState};

use crate::fixture::{Fixture, poll_until, process_exists, with_env};

#[tokio::test]
async fn a_new_runtime_adopts_running_sandboxes_and_their_containers() -> Result<()> {
    let fx = Fixture::with_images(&["ticker", "hello"])?;
    let pod = fx.pod("ticker").await?;
    let config = with_env(pod.container("ticker", "ticker"), &[("INTERVAL_MS", "20")]);
    let ticker = fx.run(&pod, &config).await?;
    let hello = fx.run(&pod, &pod.container("hello", "hello")).await?;
    fx.wait_for_state(&ticker, ContainerState::Running).await?;
    let done = fx.wait_exited(&hello).await?;
    let pid = fx.runtime.sandbox_pid(&pod.id).expect("sandbox pid");

    let next = fx.reopen()?;
    assert_eq!(next.restore().await, 1, "one running sandbox adopted");
    let sandboxes = next.list_pod_sandboxes().await?;
    assert_eq!(sandboxes.len(), 1);
    assert_eq!(sandboxes[0].id, pod.id);
    assert_eq!(sandboxes[0].state, SandboxState::Ready);
    assert_eq!(sandboxes[0].labels, pod.config.labels);
    assert_eq!(sandboxes[0].metadata, pod.config.metadata);

    let running = next.container_status(&ticker).await?;
    assert_eq!(running.state, ContainerState::Running, "{running:#?}");
    assert_eq!(running.metadata, config.metadata);
    assert_eq!(running.annotations, config.annotations);
    assert!(running.started_at.is_some());
    let exited = next.container_status(&hello).await?;
    assert_eq!(exited.state, ContainerState::Exited);
    assert_eq!(exited.exit_code, done.exit_code);
    assert_eq!(
        exited.finished_at, done.finished_at,
        "the sandbox's own record"
    );

    // The adopted sandbox obeys the new runtime: a stop ends the container and
    // removing the sandbox ends the process and forgets its records.
    next.stop_container(&ticker, std::time::Duration::from_secs(5))
        .await?;
    assert_eq!(
        next.container_status(&ticker).await?.state,
        ContainerState::Exited
    );
    next.remove_pod_sandbox(&pod.id).await?;
    poll_until("the sandbox process exits", async || {
        Ok((!process_exists(pid)).then_some(()))
    })
    .await?;
    assert!(next.list_pod_sandboxes().await?.is_empty());
    assert_eq!(next.restore().await, 0);
    assert!(
        std::fs::read_dir(fx.path().join("sandboxes"))?
            .next()
            .is_none(),
        "no sandbox records are left"
    );
    Ok(())
}

#[tokio::test]
async fn a_sandbox_that_died_meanwhile_is_reported_not_ready() -> Result<()> {
    let fx = Fixture::with_images(&["ticker"])?;
    let pod = fx.pod("ticker").await?;
    let ticker = fx.run(&pod, &pod.container("ticker", "ticker")).await?;
    fx.wait_for_state(&ticker, ContainerState::Running).await?;
    let pid = fx.runtime.sandbox_pid(&pod.id).expect("sandbox pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )?;
    fx.wait_exited(&ticker).await?;

    let next = fx.reopen()?;
    assert_eq!(next.restore().await, 0);
    let sandboxes = next.list_pod_sandboxes().await?;
    assert_eq!(sandboxes.len(), 1);
    assert_eq!(sandboxes[0].state, SandboxState::NotReady);
    let lost = next.container_status(&ticker).await?;
    assert_eq!(lost.state, ContainerState::Exited);
    assert_eq!(lost.exit_code, 137);
    next.remove_pod_sandbox(&pod.id).await?;
    assert!(next.list_containers().await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn an_unreachable_sandbox_is_stopped_rather_than_run_twice() -> Result<()> {
    let fx = Fixture::with_images(&["ticker"])?;
    let pod = fx.pod("ticker").await?;
    let ticker = fx.run(&pod, &pod.container("ticker", "ticker")).await?;
    fx.wait_for_state(&ticker, ContainerState::Running).await?;
    let pid = fx.runtime.sandbox_pid(&pod.id).expect("sandbox pid");
    // Its socket is gone (deleted by hand): the process runs but cannot be reached.
    let dir = std::fs::read_dir(fx.path().join("sandboxes"))?
        .next()
        .expect("a sandbox directory")?
        .path();
    std::fs::remove_file(dir.join("sandbox.sock"))?;

    let next = fx.reopen()?;
    assert_eq!(next.restore().await, 0);
    assert_eq!(
        next.list_pod_sandboxes().await?[0].state,
        SandboxState::NotReady,
        "reported for the node to replace"
    );
    poll_until("the unreachable sandbox process is killed", async || {
        Ok(fx
            .runtime
            .container_status(&ticker)
            .await?
            .state
            .eq(&ContainerState::Exited)
            .then_some(()))
    })
    .await?;
    // The first runtime reaps its child before it reports the container exited.
    assert!(!process_exists(pid), "the sandbox process {pid} is gone");
    Ok(())
}

#[tokio::test]
async fn a_sandbox_recorded_before_pods_ran_as_their_user_is_adopted_as_it_runs() -> Result<()> {
    let fx = Fixture::with_images(&["ticker"])?;
    let pod = fx.pod("earlier").await?;
    // The record an earlier node wrote: no credentials.
    let record = fx
        .path()
        .join("sandboxes")
        .join(&pod.id[..16])
        .join("sandbox.json");
    let mut json: serde_json::Value = serde_json::from_slice(&std::fs::read(&record)?)?;
    json.as_object_mut().unwrap().remove("credentials");
    std::fs::write(&record, serde_json::to_vec(&json)?)?;

    let next = fx.reopen()?;
    assert_eq!(next.restore().await, 1);
    // Its process runs as uid 0, as that node started it; a container with a user of
    // its own is created in it as that node would have (not refused for a user the
    // process never switched to).
    let mut config = with_env(pod.container("ticker", "ticker"), &[("INTERVAL_MS", "20")]);
    config.security.run_as_user = Some(2000);
    let ticker = next.create_container(&pod.id, &config, &pod.config).await?;
    next.start_container(&ticker).await?;
    let status = next.container_status(&ticker).await?;
    assert_eq!(status.state, ContainerState::Running, "{status:#?}");
    next.remove_pod_sandbox(&pod.id).await?;
    Ok(())
}
