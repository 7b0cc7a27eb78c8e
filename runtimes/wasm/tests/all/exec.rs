//! Exec in a running container: a new instance of the container's own program with
//! the exec's command as `argv`, beside the container and unseen by it. `ticker` and
//! `graceful` answer `check` (print `ok`, exit with `CHECK_EXIT`); `ticker hang` never
//! returns.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::io::AsyncWriteExt;
use wasmlet_runtime::{ContainerState, Error, Runtime};
use wasmlet_runtime_wasm::crilog::Stream;
use wasmlet_runtime_wasm::protocol::{Op, Request};

use crate::fixture::{
    Fixture, Pod, lines, log_records, poll_until, wait_for_stdout_line, with_env, within,
};

/// A timeout an exec that returns at once never comes near.
const EXEC_TIMEOUT: Duration = Duration::from_secs(30);
/// The timeout of an exec that never returns by itself.
const HANG_TIMEOUT: Duration = Duration::from_millis(300);

fn command(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| (*a).to_owned()).collect()
}

/// A pod `name` with a `ticker` container with `env`, running, and its instance
/// alive: the sandbox reports Running as soon as it has started the container's task,
/// before the instance (and its linear memory) exists, so the tests that measure the
/// sandbox's address space wait for the first tick before they take a baseline.
async fn running_ticker(fx: &Fixture, name: &str, env: &[(&str, &str)]) -> Result<(Pod, String)> {
    let pod = fx.pod(name).await?;
    let id = fx
        .run(&pod, &with_env(pod.container("ticker", "ticker"), env))
        .await?;
    let status = fx.wait_for_state(&id, ContainerState::Running).await?;
    wait_for_stdout_line(&status.log_path, "tick 1").await?;
    Ok((pod, id))
}

/// A field of `/proc/<pid>/status` that is a number (kB for sizes).
pub(crate) fn proc_status(pid: u32, field: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let value = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .with_context(|| format!("no {field} in /proc/{pid}/status"))?;
    let number = value.trim().trim_end_matches(" kB");
    number
        .parse()
        .with_context(|| format!("{field} is not a number: {value:?}"))
}

/// More than the sandbox's address space grows by while one more instance is alive:
/// wasmtime reserves 4 GiB of address space for each linear memory (its default).
const INSTANCE_RESERVATION_KIB: u64 = 2 * 1024 * 1024;

/// Waits until the sandbox has more instances alive than when it measured `baseline`.
pub(crate) async fn wait_for_an_extra_instance(pid: u32, baseline: u64) -> Result<()> {
    poll_until("an exec instance to be alive", async || {
        Ok((proc_status(pid, "VmSize")? > baseline + INSTANCE_RESERVATION_KIB).then_some(()))
    })
    .await
}

/// Waits until the sandbox's address space is back near `baseline`: no instance made
/// since is still alive.
pub(crate) async fn wait_for_no_extra_instance(pid: u32, baseline: u64) -> Result<()> {
    poll_until("every exec instance to be gone", async || {
        Ok((proc_status(pid, "VmSize")? < baseline + INSTANCE_RESERVATION_KIB).then_some(()))
    })
    .await
}

#[tokio::test]
async fn an_exec_runs_the_containers_program_again_beside_it() -> Result<()> {
    let fx = Fixture::with_images(&["ticker"])?;
    let (pod, id) = running_ticker(&fx, "exec", &[("INTERVAL_MS", "20")]).await?;
    let status = fx.runtime.container_status(&id).await?;
    wait_for_stdout_line(&status.log_path, "tick 2").await?;

    let result = fx
        .runtime
        .exec_sync(&id, &command(&["ticker", "check"]), EXEC_TIMEOUT)
        .await?;
    assert_eq!(result.exit_code, 0, "{result:?}");
    assert_eq!(String::from_utf8_lossy(&result.stdout), "ok\n");
    assert!(result.stderr.is_empty(), "{result:?}");

    // The container went on as it was: running, ticking, and its log is its own.
    let status = fx.runtime.container_status(&id).await?;
    assert_eq!(status.state, ContainerState::Running, "{status:#?}");
    let seen = lines(&log_records(&status.log_path)?, Stream::Stdout).len();
    let stdout = poll_until("the container's log to grow", async || {
        let stdout = lines(&log_records(&status.log_path)?, Stream::Stdout);
        Ok((stdout.len() > seen + 1).then_some(stdout))
    })
    .await?;
    assert!(!stdout.iter().any(|l| l == "ok"), "{stdout:#?}");
    assert_eq!(
        fx.runtime.list_containers().await?.len(),
        1,
        "no exec listed"
    );

    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    Ok(())
}

#[tokio::test]
async fn an_exec_has_the_containers_environment() -> Result<()> {
    let fx = Fixture::with_images(&["ticker"])?;
    let (pod, id) = running_ticker(&fx, "exec-env", &[("CHECK_EXIT", "3")]).await?;

    let result = fx
        .runtime
        .exec_sync(&id, &command(&["ticker", "check"]), EXEC_TIMEOUT)
        .await?;
    assert_eq!(result.exit_code, 3, "{result:?}");
    assert_eq!(String::from_utf8_lossy(&result.stdout), "ok\n");

    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    Ok(())
}

#[tokio::test]
async fn a_hanging_exec_times_out_and_leaves_nothing_behind() -> Result<()> {
    let fx = Fixture::with_images(&["ticker"])?;
    let (pod, id) = running_ticker(&fx, "exec-hang", &[("INTERVAL_MS", "20")]).await?;
    let pid = fx.runtime.sandbox_pid(&pod.id).expect("sandbox pid");
    let check = command(&["ticker", "check"]);
    // One exec first, so whatever the first one sets up is counted before.
    fx.runtime.exec_sync(&id, &check, EXEC_TIMEOUT).await?;
    let threads = proc_status(pid, "Threads")?;
    let vm_size = proc_status(pid, "VmSize")?;

    let hang = command(&["ticker", "hang"]);
    let began = Instant::now();
    let err = within(
        "a hanging exec",
        fx.runtime.exec_sync(&id, &hang, HANG_TIMEOUT),
    )
    .await?
    .unwrap_err();
    let took = began.elapsed();
    assert!(
        matches!(err, Error::Timeout { after, .. } if after == HANG_TIMEOUT),
        "{err:?}"
    );
    assert!(err.to_string().contains("timed out"), "{err}");
    assert!(
        HANG_TIMEOUT <= took && took < Duration::from_secs(2),
        "took {took:?}"
    );

    let mut execs = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let (runtime, id, hang) = (fx.runtime.clone(), id.clone(), hang.clone());
        execs.spawn(async move { runtime.exec_sync(&id, &hang, HANG_TIMEOUT).await });
    }
    while let Some(joined) = within("20 hanging execs", execs.join_next()).await? {
        let err = joined?.unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    }

    // Nothing of them is left: no instance, no thread, and the container and the
    // sandbox serve on.
    wait_for_no_extra_instance(pid, vm_size).await?;
    poll_until("the sandbox's thread count to settle", async || {
        Ok((proc_status(pid, "Threads")? == threads).then_some(()))
    })
    .await?;
    assert_eq!(
        fx.runtime.container_status(&id).await?.state,
        ContainerState::Running
    );
    let result = fx.runtime.exec_sync(&id, &check, EXEC_TIMEOUT).await?;
    assert_eq!(result.exit_code, 0, "{result:?}");

    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    Ok(())
}

#[tokio::test]
async fn an_exec_ends_with_its_container() -> Result<()> {
    let fx = Fixture::with_images(&["ticker"])?;
    let (pod, id) = running_ticker(&fx, "exec-stop", &[]).await?;
    let pid = fx.runtime.sandbox_pid(&pod.id).expect("sandbox pid");
    let vm_size = proc_status(pid, "VmSize")?;

    // No timeout at all (CRI's 0): only the container's end ends it.
    let exec = tokio::spawn({
        let (runtime, id) = (fx.runtime.clone(), id.clone());
        async move {
            runtime
                .exec_sync(&id, &command(&["ticker", "hang"]), Duration::ZERO)
                .await
        }
    });
    wait_for_an_extra_instance(pid, vm_size).await?;
    fx.runtime
        .stop_container(&id, Duration::from_secs(5))
        .await?;
    let err = within("the exec", exec).await??.unwrap_err();
    assert!(matches!(err, Error::FailedPrecondition(_)), "{err:?}");
    assert!(err.to_string().contains("exited while exec"), "{err}");
    wait_for_no_extra_instance(pid, vm_size).await?;

    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    Ok(())
}

#[tokio::test]
async fn exec_in_a_container_that_is_not_running_is_refused() -> Result<()> {
    let fx = Fixture::with_images(&["ticker"])?;
    let pod = fx.pod("exec-exited").await?;
    let config = with_env(pod.container("ticker", "ticker"), &[("TICKS", "1")]);
    let id = fx.run(&pod, &config).await?;
    fx.wait_exited(&id).await?;

    let check = command(&["ticker", "check"]);
    let err = fx
        .runtime
        .exec_sync(&id, &check, EXEC_TIMEOUT)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::FailedPrecondition(_)), "{err:?}");
    assert!(err.to_string().contains("not running"), "{err}");
    let err = fx
        .runtime
        .exec_sync("no-such-container", &check, EXEC_TIMEOUT)
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err:?}");

    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    Ok(())
}

#[tokio::test]
async fn an_exec_in_a_component_runs_the_component_again() -> Result<()> {
    let fx = Fixture::with_images(&["graceful-component"])?;
    let pod = fx.pod("exec-component").await?;
    let id = fx
        .run(&pod, &pod.container("graceful", "graceful-component"))
        .await?;
    let status = fx.wait_for_state(&id, ContainerState::Running).await?;
    wait_for_stdout_line(&status.log_path, "working 1").await?;

    let result = fx
        .runtime
        .exec_sync(&id, &command(&["graceful", "check"]), EXEC_TIMEOUT)
        .await?;
    assert_eq!(result.exit_code, 0, "{result:?}");
    assert_eq!(String::from_utf8_lossy(&result.stdout), "ok\n");

    // The container still has its own stop signal: it exits cleanly by itself.
    fx.runtime
        .stop_container(&id, Duration::from_secs(30))
        .await?;
    let status = fx.runtime.container_status(&id).await?;
    assert_eq!(
        (status.state, status.exit_code),
        (ContainerState::Exited, 0)
    );

    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    Ok(())
}

#[tokio::test]
async fn an_exec_ends_when_its_nodes_connection_closes() -> Result<()> {
    let fx = Fixture::with_images(&["ticker"])?;
    let (pod, id) = running_ticker(&fx, "exec-conn", &[]).await?;
    let pid = fx.runtime.sandbox_pid(&pod.id).expect("sandbox pid");
    let vm_size = proc_status(pid, "VmSize")?;
    let dir = std::fs::read_dir(fx.path().join("sandboxes"))?
        .next()
        .context("a sandbox directory")??
        .path();

    // A node of our own: it asks for an exec without a timeout, then goes away.
    let mut node = tokio::net::UnixStream::connect(dir.join("sandbox.sock")).await?;
    let request = Request {
        id: 1,
        op: Op::Exec {
            container_id: id.clone(),
            argv: command(&["ticker", "hang"]),
            timeout_ms: 0,
        },
    };
    let mut line = serde_json::to_vec(&request)?;
    line.push(b'\n');
    node.write_all(&line).await?;
    wait_for_an_extra_instance(pid, vm_size).await?;
    drop(node);
    wait_for_no_extra_instance(pid, vm_size).await?;
    poll_until("the sandbox to end the exec", async || {
        let log = std::fs::read_to_string(dir.join("sandbox.log"))?;
        Ok(log
            .contains("request 1 ended after its connection closed")
            .then_some(()))
    })
    .await?;

    // The next node adopts the sandbox, whose container runs on.
    let next = fx.reopen()?;
    assert_eq!(next.restore().await, 1);
    let result = next
        .exec_sync(&id, &command(&["ticker", "check"]), EXEC_TIMEOUT)
        .await?;
    assert_eq!(result.exit_code, 0, "{result:?}");
    next.remove_pod_sandbox(&pod.id).await?;
    Ok(())
}
