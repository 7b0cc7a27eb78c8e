//! Live stdio: an interactive exec (`exec_stdio`) and attaching to a running
//! container (`attach_stdio`), through the sandbox's stream socket. `ticker cat`
//! answers each line of stdin with `got: LINE` on stdout and `err: LINE` on stderr,
//! `eof` at the end, and exits with `CAT_EXIT`.

use anyhow::{Context, Result, ensure};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use wasmlet_runtime::{ContainerState, Error, Runtime, StdioSession, Streams};

use crate::fixture::{
    Fixture, lines, log_records, poll_until, wait_for_stdout_line, with_env, within,
};

fn command(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| (*a).to_owned()).collect()
}

const ALL: Streams = Streams {
    stdin: true,
    stdout: true,
    stderr: true,
    tty: false,
};

/// Reads from `r` until what was read ends with `want`; what was read.
async fn read_until(r: &mut (impl AsyncRead + Unpin), want: &str) -> Result<String> {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    within(&format!("{want:?} on the stream"), async {
        while !String::from_utf8_lossy(&got).ends_with(want) {
            let n = r.read(&mut buf).await?;
            ensure!(
                n > 0,
                "the stream ended after {:?}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..n]);
        }
        Ok(())
    })
    .await??;
    Ok(String::from_utf8(got)?)
}

/// The number of open file descriptors of process `pid`.
fn fds(pid: u32) -> Result<usize> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))?.count())
}

/// The sandbox's descriptor count once it holds still for 200 ms: a session's
/// connection closes on the sandbox's side just after the node has its last frame.
async fn settled_fds(pid: u32) -> Result<usize> {
    poll_until("the sandbox's descriptors to settle", async || {
        let before = fds(pid)?;
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        Ok((fds(pid)? == before).then_some(before))
    })
    .await
}

/// A running `ticker` container with `args`, `env` and the given stdin settings.
async fn running(
    fx: &Fixture,
    pod_name: &str,
    args: &[&str],
    env: &[(&str, &str)],
    stdin: bool,
    stdin_once: bool,
) -> Result<(crate::fixture::Pod, String)> {
    let pod = fx.pod(pod_name).await?;
    let mut config = with_env(pod.container("ticker", "ticker"), env);
    config.args = command(args);
    config.stdin = stdin;
    config.stdin_once = stdin_once;
    let id = fx.run(&pod, &config).await?;
    fx.wait_for_state(&id, ContainerState::Running).await?;
    Ok((pod, id))
}

type Input = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;
type Output = Box<dyn AsyncRead + Send + Unpin>;

fn take(session: &mut StdioSession) -> (Input, Output, Output) {
    (
        session.stdin.take().expect("stdin"),
        session.stdout.take().expect("stdout"),
        session.stderr.take().expect("stderr"),
    )
}

#[tokio::test]
async fn an_interactive_exec_answers_stdin_as_it_comes_and_carries_its_exit_code() -> Result<()> {
    let fx = Fixture::with_images(&["ticker"])?;
    let (pod, id) = running(&fx, "stdio-exec", &[], &[("CAT_EXIT", "5")], false, false).await?;
    let mut session = fx
        .runtime
        .exec_stdio(&id, &command(&["ticker", "cat"]), ALL)
        .await?;
    let (mut stdin, mut stdout, mut stderr) = take(&mut session);
    stdin.write_all(b"one\n").await?;
    // Answered while stdin is still open: the output is live, not collected at the end.
    assert_eq!(read_until(&mut stdout, "got: one\n").await?, "got: one\n");
    assert_eq!(read_until(&mut stderr, "err: one\n").await?, "err: one\n");
    stdin.write_all(b"two\n").await?;
    stdin.shutdown().await?;
    assert_eq!(read_until(&mut stdout, "eof\n").await?, "got: two\neof\n");
    assert_eq!(within("the exit", session.exit).await??, 5);
    // The container's log has none of it: the exec is not the container.
    let log = fx.runtime.container_status(&id).await?.log_path;
    let records = log_records(&log).unwrap_or_default();
    assert!(
        !lines(&records, wasmlet_runtime_wasm::crilog::Stream::Stdout)
            .iter()
            .any(|l| l.starts_with("got:"))
    );
    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    Ok(())
}

#[tokio::test]
async fn an_exec_of_a_program_the_image_does_not_hold_is_refused_at_once() -> Result<()> {
    let fx = Fixture::with_images(&["ticker"])?;
    let (pod, id) = running(&fx, "stdio-nosuch", &[], &[], false, false).await?;
    let err = within(
        "the exec",
        fx.runtime.exec_stdio(&id, &command(&["nosuch"]), ALL),
    )
    .await?
    .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("\"nosuch\" is not a program its image holds")
            && message.contains("\"ticker\""),
        "{message}"
    );
    // The same for an exec that waits (probes, hooks), and the other names work.
    let err = within(
        "the exec",
        fx.runtime.exec_sync(
            &id,
            &command(&["sh", "-c", "true"]),
            std::time::Duration::ZERO,
        ),
    )
    .await?
    .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    for name in ["ticker"] {
        let out = fx
            .runtime
            .exec_sync(&id, &command(&[name, "check"]), std::time::Duration::ZERO)
            .await
            .with_context(|| format!("exec as {name}"))?;
        assert_eq!(out.stdout, b"ok\n", "{name}");
    }
    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    Ok(())
}

#[tokio::test]
async fn a_client_that_vanishes_mid_exec_leaves_no_instance_and_no_descriptor() -> Result<()> {
    let fx = Fixture::with_images(&["ticker"])?;
    let (pod, id) = running(&fx, "stdio-vanish", &[], &[], false, false).await?;
    let pid = fx.runtime.sandbox_pid(&pod.id).expect("sandbox pid");
    // One session first, so whatever the first one sets up is counted before.
    let warm = fx
        .runtime
        .exec_stdio(&id, &command(&["ticker", "check"]), ALL)
        .await?;
    within("the first exec", warm.exit).await??;
    let baseline = settled_fds(pid).await?;
    let vm_size = crate::exec::proc_status(pid, "VmSize")?;

    let mut sessions = Vec::new();
    for _ in 0..3 {
        sessions.push(
            fx.runtime
                .exec_stdio(&id, &command(&["ticker", "hang"]), ALL)
                .await?,
        );
    }
    crate::exec::wait_for_an_extra_instance(pid, vm_size).await?;
    ensure!(fds(pid)? > baseline, "the sessions hold connections");
    drop(sessions);
    crate::exec::wait_for_no_extra_instance(pid, vm_size).await?;
    poll_until("the sandbox's descriptors to be back", async || {
        let now = fds(pid)?;
        eprintln!("sandbox descriptors: {now} (before the sessions: {baseline})");
        Ok((now <= baseline).then_some(()))
    })
    .await?;
    // The container runs on.
    assert_eq!(
        fx.runtime.container_status(&id).await?.state,
        ContainerState::Running
    );
    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    Ok(())
}

#[tokio::test]
async fn attach_relays_a_containers_stdin_and_output_and_ends_with_its_exit() -> Result<()> {
    let fx = Fixture::with_images(&["ticker"])?;
    let (pod, id) = running(
        &fx,
        "stdio-attach",
        &["cat"],
        &[("CAT_EXIT", "4")],
        true,
        true,
    )
    .await?;
    let mut session = fx.runtime.attach_stdio(&id, ALL).await?;
    let (mut stdin, mut stdout, mut stderr) = take(&mut session);
    stdin.write_all(b"hi\n").await?;
    assert_eq!(read_until(&mut stdout, "got: hi\n").await?, "got: hi\n");
    assert_eq!(read_until(&mut stderr, "err: hi\n").await?, "err: hi\n");
    // The container's own output: in its log as well.
    let log = fx.runtime.container_status(&id).await?.log_path;
    wait_for_stdout_line(&log, "got: hi").await?;
    // stdinOnce: the client's close is the container's end of input.
    stdin.shutdown().await?;
    assert_eq!(read_until(&mut stdout, "eof\n").await?, "eof\n");
    assert_eq!(within("the exit", session.exit).await??, 4);
    let status = fx.wait_exited(&id).await?;
    assert_eq!(status.exit_code, 4);
    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    Ok(())
}

#[tokio::test]
async fn a_client_that_detaches_leaves_the_container_and_its_stdin_open() -> Result<()> {
    let fx = Fixture::with_images(&["ticker"])?;
    let (pod, id) = running(&fx, "stdio-detach", &["cat"], &[], true, false).await?;
    let pid = fx.runtime.sandbox_pid(&pod.id).expect("sandbox pid");
    let mut baseline = None;
    for word in ["first", "second", "third"] {
        let mut session = fx.runtime.attach_stdio(&id, ALL).await?;
        let (mut stdin, mut stdout, _stderr) = take(&mut session);
        stdin.write_all(format!("{word}\n").as_bytes()).await?;
        read_until(&mut stdout, &format!("got: {word}\n")).await?;
        // Closing stdin without stdinOnce keeps the container's open.
        stdin.shutdown().await?;
        drop((stdin, stdout, session));
        // Counted once the guest answered the first client: its instance (and what
        // wasmtime opens for it) exists by then.
        let now = settled_fds(pid).await?;
        let before = *baseline.get_or_insert(now);
        ensure!(
            now <= before,
            "{word}: {now} descriptors, {before} after the first client"
        );
    }
    assert_eq!(
        fx.runtime.container_status(&id).await?.state,
        ContainerState::Running
    );
    // Without stdin: output only; with stdin asked of a container that has none, refused.
    let (_, other) = ((), fx.run(&pod, &pod.container("plain", "ticker")).await?);
    fx.wait_for_state(&other, ContainerState::Running).await?;
    let err = fx.runtime.attach_stdio(&other, ALL).await.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert!(err.to_string().contains("keeps no stdin open"), "{err}");
    let mut session = fx
        .runtime
        .attach_stdio(
            &other,
            Streams {
                stdin: false,
                ..ALL
            },
        )
        .await?;
    let mut stdout = session.stdout.take().expect("stdout");
    read_until(&mut stdout, "\n").await?;
    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    Ok(())
}
