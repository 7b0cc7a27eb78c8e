//! Limits and isolation: a container's memory limit, and a sandbox process dying
//! without taking the node or other pods with it.

use anyhow::Result;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use wasmlet_runtime::{ContainerResources, ContainerState, Runtime, SandboxState};
use wasmlet_runtime_wasm::crilog::Stream;

use crate::fixture::{
    Fixture, lines, log_records, poll_until, process_exists, wait_for_stdout_line, with_env,
};

const MIB: u64 = 1024 * 1024;

#[tokio::test]
async fn growing_memory_past_the_limit_is_an_oom_kill() -> Result<()> {
    let fx = Fixture::with_images(&["memhog"])?;
    let pod = fx.pod("memhog").await?;
    let mut config = with_env(pod.container("memhog", "memhog"), &[("MIB", "200")]);
    config.resources = ContainerResources {
        memory_limit_bytes: Some(64 * MIB),
        ..Default::default()
    };
    let id = fx.run(&pod, &config).await?;

    let status = fx.wait_exited(&id).await?;
    assert_eq!(status.exit_code, 137, "{status:#?}");
    assert_eq!(status.reason, "OOMKilled");
    assert!(
        status.message.contains(&(64 * MIB).to_string()),
        "{status:#?}"
    );
    // It got memory up to the limit, and no further.
    let stdout = lines(&log_records(&status.log_path)?, Stream::Stdout);
    assert!(
        stdout.contains(&"allocated 48 MiB".to_owned()),
        "{stdout:#?}"
    );
    assert!(
        !stdout.contains(&"allocated 64 MiB".to_owned()),
        "{stdout:#?}"
    );
    assert!(
        !stdout.iter().any(|l| l.starts_with("holding")),
        "{stdout:#?}"
    );

    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    Ok(())
}

#[tokio::test]
async fn memory_within_the_limit_is_granted() -> Result<()> {
    let fx = Fixture::with_images(&["memhog"])?;
    let pod = fx.pod("memhog-ok").await?;
    let mut config = with_env(
        pod.container("memhog", "memhog"),
        &[("MIB", "32"), ("HOLD", "0")],
    );
    config.resources.memory_limit_bytes = Some(64 * MIB);
    let id = fx.run(&pod, &config).await?;

    let status = fx.wait_exited(&id).await?;
    assert_eq!(
        (status.exit_code, status.reason.as_str()),
        (0, "Completed"),
        "{status:#?}"
    );
    let stdout = lines(&log_records(&status.log_path)?, Stream::Stdout);
    assert_eq!(stdout.last().map(String::as_str), Some("holding 32 MiB"));

    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    Ok(())
}

#[tokio::test]
async fn a_killed_sandbox_takes_down_only_its_own_containers() -> Result<()> {
    let fx = Fixture::with_images(&["ticker", "spin", "hello"])?;
    let doomed = fx.pod("doomed").await?;
    let bystander = fx.pod("bystander").await?;

    let done = fx.run(&doomed, &doomed.container("hello", "hello")).await?;
    fx.wait_exited(&done).await?;
    let ticker = fx
        .run(
            &doomed,
            &with_env(
                doomed.container("ticker", "ticker"),
                &[("INTERVAL_MS", "20")],
            ),
        )
        .await?;
    let spin = fx.run(&doomed, &doomed.container("spin", "spin")).await?;
    let other = fx
        .run(
            &bystander,
            &with_env(
                bystander.container("ticker", "ticker"),
                &[("INTERVAL_MS", "20")],
            ),
        )
        .await?;
    for id in [&ticker, &spin, &other] {
        fx.wait_for_state(id, ContainerState::Running).await?;
    }

    let pid = fx.runtime.sandbox_pid(&doomed.id).expect("sandbox pid");
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL)?;

    for id in [&ticker, &spin] {
        let status = fx.wait_exited(id).await?;
        assert_eq!(status.exit_code, 137, "{status:#?}");
        assert!(
            status.message.contains("sandbox process exited"),
            "{status:#?}"
        );
    }
    // What had already finished keeps its own ending.
    let status = fx.runtime.container_status(&done).await?;
    assert_eq!((status.exit_code, status.reason.as_str()), (0, "Completed"));
    poll_until("the killed sandbox to be NotReady", async || {
        let state = fx.runtime.pod_sandbox_status(&doomed.id).await?.state;
        Ok((state == SandboxState::NotReady).then_some(()))
    })
    .await?;
    assert!(!process_exists(pid));

    // The other pod's sandbox never noticed: its guest keeps ticking.
    let log = fx.runtime.container_status(&other).await?.log_path;
    let ticks = lines(&log_records(&log)?, Stream::Stdout).len();
    wait_for_stdout_line(&log, &format!("tick {}", ticks + 3)).await?;
    assert_eq!(
        fx.runtime.pod_sandbox_status(&bystander.id).await?.state,
        SandboxState::Ready
    );

    // And the runtime goes on making pods.
    let fresh = fx.pod("fresh").await?;
    let id = fx.run(&fresh, &fresh.container("hello", "hello")).await?;
    let status = fx.wait_exited(&id).await?;
    assert_eq!((status.exit_code, status.reason.as_str()), (0, "Completed"));
    let records = log_records(&status.log_path)?;
    assert_eq!(lines(&records, Stream::Stderr), ["hello on stderr"]);

    for pod in [&doomed, &bystander, &fresh] {
        fx.runtime.remove_pod_sandbox(&pod.id).await?;
    }
    Ok(())
}
