//! Containers with real guests: arguments, environment and logs, exit codes, traps,
//! stopping long-running and busy guests, events, and stopping a whole sandbox.

use std::time::{Duration, Instant};

use anyhow::Result;
use wasmlet_runtime::{ContainerEventKind, ContainerState, Error, Runtime, SandboxState};
use wasmlet_runtime_wasm::crilog::Stream;

use crate::fixture::{
    DEADLINE, Fixture, lines, log_records, poll_until, process_exists, wait_for_stdout_line,
    with_env, within,
};

/// A stop timeout the runtime must not need: a Wasm guest is cancelled at its next
/// epoch tick, so stopping should take a small fraction of it.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn hello_gets_args_and_env_and_logs_both_streams_in_cri_format() -> Result<()> {
    let fx = Fixture::with_images(&["hello"])?;
    let pod = fx.pod("hello").await?;
    let mut config = with_env(
        pod.container("hello", "hello"),
        &[
            ("GREETING", "hello world"),
            ("DUP", "first"),
            ("DUP", "second"),
        ],
    );
    config.args = vec!["first-arg".into(), "second arg".into()];
    let id = fx.run(&pod, &config).await?;

    let status = fx.wait_exited(&id).await?;
    assert_eq!(status.exit_code, 0, "{status:#?}");
    assert_eq!(status.reason, "Completed");
    let (started, finished) = (status.started_at.unwrap(), status.finished_at.unwrap());
    assert!(
        status.created_at <= started && started <= finished,
        "{status:#?}"
    );
    assert_eq!(
        status.log_path,
        pod.config.log_directory.join(&config.log_path)
    );

    let records = log_records(&status.log_path)?;
    let stdout = lines(&records, Stream::Stdout);
    for want in [
        "arg[1]=first-arg",
        "arg[2]=second arg",
        "env GREETING=hello world",
        "env DUP=second",
    ] {
        assert!(
            stdout.iter().any(|l| l == want),
            "{want:?} not in {stdout:#?}"
        );
    }
    assert!(
        !stdout.iter().any(|l| l.starts_with("arg[3]")),
        "{stdout:#?}"
    );
    assert!(!stdout.iter().any(|l| l == "env DUP=first"), "{stdout:#?}");
    assert_eq!(lines(&records, Stream::Stderr), ["hello on stderr"]);

    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    Ok(())
}

#[tokio::test]
async fn a_nonzero_exit_code_is_reported_as_an_error() -> Result<()> {
    let fx = Fixture::with_images(&["hello"])?;
    let pod = fx.pod("exit-code").await?;
    let config = with_env(pod.container("hello", "hello"), &[("EXIT_CODE", "3")]);
    let id = fx.run(&pod, &config).await?;

    let status = fx.wait_exited(&id).await?;
    assert_eq!(status.exit_code, 3, "{status:#?}");
    assert_eq!(status.reason, "Error");

    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    Ok(())
}

#[tokio::test]
async fn component_runwasi_and_plain_images_run_and_print_their_args() -> Result<()> {
    let fx = Fixture::with_images(&["hello-component", "hello-runwasi", "hello-plain"])?;
    let pod = fx.pod("shapes").await?;
    let mut running = Vec::new();
    for image in ["hello-component", "hello-runwasi", "hello-plain"] {
        let mut config = pod.container(image, image);
        config.args = vec!["from".into(), image.into()];
        running.push((image, fx.run(&pod, &config).await?));
    }
    for (image, id) in running {
        let status = fx.wait_exited(&id).await?;
        assert_eq!(
            (status.exit_code, status.reason.as_str()),
            (0, "Completed"),
            "{image}: {status:#?}"
        );
        let records = log_records(&status.log_path)?;
        let stdout = lines(&records, Stream::Stdout);
        for want in ["arg[1]=from".to_owned(), format!("arg[2]={image}")] {
            assert!(
                stdout.contains(&want),
                "{image}: {want:?} not in {stdout:#?}"
            );
        }
        assert_eq!(
            lines(&records, Stream::Stderr),
            ["hello on stderr"],
            "{image}"
        );
        if image == "hello-plain" {
            // The plain image's config names the program and carries an environment.
            assert_eq!(stdout[0], "arg[0]=/app.wasm");
            assert!(stdout.contains(&"env PATH=/".to_owned()), "{stdout:#?}");
        }
    }
    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    Ok(())
}

#[tokio::test]
async fn a_trapping_guest_exits_134_with_the_trap_in_its_message() -> Result<()> {
    let fx = Fixture::with_images(&["crasher"])?;
    let pod = fx.pod("crasher").await?;
    let id = fx.run(&pod, &pod.container("crasher", "crasher")).await?;

    let status = fx.wait_exited(&id).await?;
    assert_eq!(status.exit_code, 134, "{status:#?}");
    assert_eq!(status.reason, "Error");
    assert!(status.message.contains("unreachable"), "{status:#?}");
    let records = log_records(&status.log_path)?;
    assert_eq!(lines(&records, Stream::Stdout), ["about to crash"]);
    let stderr = lines(&records, Stream::Stderr).join("\n");
    assert!(stderr.contains("crasher: deliberate panic"), "{stderr}");
    // The sandbox survives its guest's trap.
    let sandbox = fx.runtime.pod_sandbox_status(&pod.id).await?;
    assert_eq!(sandbox.state, SandboxState::Ready);

    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    Ok(())
}

#[tokio::test]
async fn a_ticking_guest_runs_until_stopped() -> Result<()> {
    let fx = Fixture::with_images(&["ticker"])?;
    let pod = fx.pod("ticker").await?;
    let config = with_env(pod.container("ticker", "ticker"), &[("INTERVAL_MS", "20")]);
    let id = fx.run(&pod, &config).await?;

    let status = fx.wait_for_state(&id, ContainerState::Running).await?;
    assert!(status.started_at.is_some());
    wait_for_stdout_line(&status.log_path, "tick 3").await?;
    assert_eq!(
        fx.runtime.container_status(&id).await?.state,
        ContainerState::Running
    );
    let err = fx.runtime.remove_container(&id).await.unwrap_err();
    assert!(matches!(err, Error::FailedPrecondition(_)), "{err:?}");

    let began = Instant::now();
    within(
        "stop_container",
        fx.runtime.stop_container(&id, STOP_TIMEOUT),
    )
    .await??;
    let took = began.elapsed();
    assert!(took < STOP_TIMEOUT / 6, "stopping took {took:?}");
    // A stop returns once the container has exited.
    let status = fx.runtime.container_status(&id).await?;
    assert_eq!(status.state, ContainerState::Exited, "{status:#?}");
    assert_eq!(status.exit_code, 137);
    assert!(status.finished_at.is_some());
    // Stopping an exited container succeeds; removing it forgets it.
    fx.runtime.stop_container(&id, STOP_TIMEOUT).await?;
    fx.runtime.remove_container(&id).await?;
    assert!(
        fx.runtime
            .container_status(&id)
            .await
            .unwrap_err()
            .is_not_found()
    );

    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    Ok(())
}

#[tokio::test]
async fn a_busy_loop_without_host_calls_is_stoppable() -> Result<()> {
    let fx = Fixture::with_images(&["spin"])?;
    let pod = fx.pod("spin").await?;
    let id = fx.run(&pod, &pod.container("spin", "spin")).await?;

    let status = fx.wait_for_state(&id, ContainerState::Running).await?;
    wait_for_stdout_line(&status.log_path, "spinning").await?;

    let began = Instant::now();
    within(
        "stop_container",
        fx.runtime.stop_container(&id, STOP_TIMEOUT),
    )
    .await??;
    let took = began.elapsed();
    assert!(took < STOP_TIMEOUT / 6, "stopping took {took:?}");
    let status = fx.runtime.container_status(&id).await?;
    assert_eq!(
        (status.state, status.exit_code),
        (ContainerState::Exited, 137),
        "{status:#?}"
    );

    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    Ok(())
}

#[tokio::test]
async fn events_follow_a_container_from_created_to_deleted() -> Result<()> {
    let fx = Fixture::with_images(&["hello"])?;
    let mut events = fx.runtime.subscribe();
    let pod = fx.pod("events").await?;
    let id = fx.run(&pod, &pod.container("hello", "hello")).await?;
    fx.wait_exited(&id).await?;
    fx.runtime.remove_container(&id).await?;

    let mut kinds = Vec::new();
    while kinds.last() != Some(&ContainerEventKind::Deleted) {
        let event = tokio::time::timeout(DEADLINE, events.recv()).await??;
        if event.container_id != id {
            continue;
        }
        assert_eq!(event.sandbox_id, pod.id);
        assert_eq!(event.pod_uid, pod.config.metadata.uid);
        kinds.push(event.kind);
    }
    assert_eq!(
        kinds,
        [
            ContainerEventKind::Created,
            ContainerEventKind::Started,
            ContainerEventKind::Stopped,
            ContainerEventKind::Deleted,
        ]
    );

    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    Ok(())
}

#[tokio::test]
async fn stopping_a_sandbox_ends_its_process_and_its_containers() -> Result<()> {
    let fx = Fixture::with_images(&["ticker", "hello"])?;
    let pod = fx.pod("stop-pod").await?;
    let id = fx.run(&pod, &pod.container("ticker", "ticker")).await?;
    fx.wait_for_state(&id, ContainerState::Running).await?;
    let pid = fx.runtime.sandbox_pid(&pod.id).expect("sandbox pid");
    assert!(process_exists(pid));

    within("stop_pod_sandbox", fx.runtime.stop_pod_sandbox(&pod.id)).await??;
    let status = fx.runtime.container_status(&id).await?;
    assert_eq!(
        (status.state, status.exit_code),
        (ContainerState::Exited, 137),
        "{status:#?}"
    );
    let sandbox = fx.runtime.pod_sandbox_status(&pod.id).await?;
    assert_eq!(sandbox.state, SandboxState::NotReady);
    poll_until(&format!("sandbox process {pid} to be gone"), async || {
        Ok((!process_exists(pid)).then_some(()))
    })
    .await?;
    // Stopping is idempotent, and a stopped sandbox takes no new containers.
    fx.runtime.stop_pod_sandbox(&pod.id).await?;
    let err = fx
        .runtime
        .create_container(&pod.id, &pod.container("late", "hello"), &pod.config)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::FailedPrecondition(_)), "{err:?}");

    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    assert!(
        fx.runtime
            .pod_sandbox_status(&pod.id)
            .await
            .unwrap_err()
            .is_not_found()
    );
    assert!(
        fx.runtime
            .container_status(&id)
            .await
            .unwrap_err()
            .is_not_found()
    );
    assert!(fx.runtime.list_pod_sandboxes().await?.is_empty());
    assert!(fx.runtime.list_containers().await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn a_guest_that_observes_the_stop_signal_exits_by_itself_within_the_grace() -> Result<()> {
    let fx = Fixture::with_images(&["graceful"])?;
    let pod = fx.pod("graceful").await?;
    let config = with_env(
        pod.container("graceful", "graceful"),
        &[("CLEANUP_MS", "300"), ("EXIT_CODE", "3")],
    );
    let id = fx.run(&pod, &config).await?;
    let status = fx.wait_for_state(&id, ContainerState::Running).await?;
    wait_for_stdout_line(&status.log_path, "working 1").await?;

    let began = Instant::now();
    within(
        "stop_container",
        fx.runtime.stop_container(&id, STOP_TIMEOUT),
    )
    .await??;
    let took = began.elapsed();
    // It spent its cleanup (300 ms), then exited with its own code, well before the
    // grace period ran out.
    assert!(took >= Duration::from_millis(300), "stopping took {took:?}");
    assert!(took < STOP_TIMEOUT / 6, "stopping took {took:?}");
    let status = fx.runtime.container_status(&id).await?;
    assert_eq!(
        (status.state, status.exit_code),
        (ContainerState::Exited, 3),
        "{status:#?}"
    );
    let stdout = lines(&log_records(&status.log_path)?, Stream::Stdout);
    let tail: Vec<&str> = stdout
        .iter()
        .rev()
        .take(2)
        .rev()
        .map(|s| s.as_str())
        .collect();
    assert_eq!(tail, ["stop requested", "clean exit"], "{stdout:?}");

    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    Ok(())
}

#[tokio::test]
async fn a_guest_that_outlasts_the_grace_is_interrupted_at_the_deadline() -> Result<()> {
    let fx = Fixture::with_images(&["graceful"])?;
    let pod = fx.pod("slow-graceful").await?;
    let config = with_env(
        pod.container("graceful", "graceful"),
        &[("CLEANUP_MS", "600000")],
    );
    let id = fx.run(&pod, &config).await?;
    let status = fx.wait_for_state(&id, ContainerState::Running).await?;
    wait_for_stdout_line(&status.log_path, "working 1").await?;

    let grace = Duration::from_millis(700);
    let began = Instant::now();
    within("stop_container", fx.runtime.stop_container(&id, grace)).await??;
    let took = began.elapsed();
    assert!(took >= grace, "stopping took {took:?}");
    assert!(
        took < grace + Duration::from_secs(2),
        "stopping took {took:?}"
    );
    let status = fx.runtime.container_status(&id).await?;
    assert_eq!(
        (status.state, status.exit_code),
        (ContainerState::Exited, 137),
        "{status:#?}"
    );
    let stdout = lines(&log_records(&status.log_path)?, Stream::Stdout);
    assert_eq!(stdout.last().map(String::as_str), Some("stop requested"));

    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    Ok(())
}

#[tokio::test]
async fn a_component_observes_the_stop_signal_through_its_wit_interface() -> Result<()> {
    let fx = Fixture::with_images(&["graceful-component"])?;
    let pod = fx.pod("graceful-component").await?;
    let id = fx
        .run(&pod, &pod.container("graceful", "graceful-component"))
        .await?;
    let status = fx.wait_for_state(&id, ContainerState::Running).await?;
    wait_for_stdout_line(&status.log_path, "working 1").await?;

    let began = Instant::now();
    within(
        "stop_container",
        fx.runtime.stop_container(&id, STOP_TIMEOUT),
    )
    .await??;
    assert!(began.elapsed() < STOP_TIMEOUT / 6, "{:?}", began.elapsed());
    let status = fx.runtime.container_status(&id).await?;
    assert_eq!(
        (status.state, status.exit_code),
        (ContainerState::Exited, 0),
        "{status:#?}"
    );
    let stdout = lines(&log_records(&status.log_path)?, Stream::Stdout);
    assert_eq!(stdout.last().map(String::as_str), Some("clean exit"));

    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    Ok(())
}
