//! The sandbox process's least privilege (`wasmlet_runtime_wasm::confine`): what
//! `/proc` says about it, and what happens when host code in it makes a call no
//! sandbox should.

use anyhow::{Context, Result, ensure};
use nix::libc;
use wasmlet_runtime::{ContainerState, Runtime as _};
use wasmlet_testkit::images::{WasmImage, WasmLayout, write_oci_archive};

use crate::fixture::{Fixture, process_exists, wait_for_stdout_line, with_env};

/// The value of `field` in `/proc/<pid>/status`.
fn status_field(pid: u32, field: &str) -> Result<String> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).with_context(|| path.clone())?;
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(|v| v.trim().to_owned())
        .with_context(|| format!("{path} has no {field}"))
}

#[tokio::test]
async fn the_sandbox_runs_without_capabilities_under_seccomp_in_its_own_mount_namespace()
-> Result<()> {
    let fx = Fixture::with_images(&["ticker"])?;
    let pod = fx.pod("confined").await?;
    let pid = fx.runtime.sandbox_pid(&pod.id).context("sandbox pid")?;

    // A guest runs: the confinement leaves what WASI needs.
    let ticker = fx
        .run(
            &pod,
            &with_env(pod.container("ticker", "ticker"), &[("INTERVAL_MS", "20")]),
        )
        .await?;
    fx.wait_for_state(&ticker, ContainerState::Running).await?;
    let log = pod.config.log_directory.join("ticker/0.log");
    wait_for_stdout_line(&log, "tick 2").await?;

    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(status_field(pid, set)?, "0000000000000000", "{set}");
    }
    assert_eq!(status_field(pid, "NoNewPrivs")?, "1");
    // 2: filter mode; three filters (allowed, clone3, fatal).
    assert_eq!(status_field(pid, "Seccomp")?, "2");
    assert_eq!(status_field(pid, "Seccomp_filters")?, "3");
    // Every thread, the guests' among them, has the same.
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let status = std::fs::read_to_string(task?.path().join("status"))?;
        ensure!(
            status.contains("\nSeccomp:\t2\n") && status.contains("\nCapEff:\t0000000000000000\n"),
            "a thread of the sandbox is not confined:\n{status}"
        );
    }
    let mount_ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/mnt"));
    assert_ne!(mount_ns(&pid.to_string())?, mount_ns("self")?);
    Ok(())
}

/// A core module that asks the sandbox's fault-injection host call (debug builds) for
/// an allowed call, a call outside the allowed set, then `execve`: it prints a line
/// after each check and exits non-zero if a check fails or the process survives.
fn escaping_guest() -> Result<Vec<u8>> {
    let wat = format!(
        r#"(module
  (import "wasmlet:fault/host" "syscall" (func $syscall (param i64) (result i64)))
  (import "wasi_snapshot_preview1" "fd_write"
    (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "allowed\n")
  (data (i32.const 32) "refused\n")
  (func $say (param $at i32)
    (i32.store (i32.const 0) (local.get $at))
    (i32.store (i32.const 4) (i32.const 8))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8))))
  (func (export "_start")
    (if (i64.le_s (call $syscall (i64.const {getpid})) (i64.const 0))
      (then (call $exit (i32.const 3))))
    (call $say (i32.const 16))
    (if (i64.ne (call $syscall (i64.const {getpriority})) (i64.const -{eperm}))
      (then (call $exit (i32.const 4))))
    (call $say (i32.const 32))
    (drop (call $syscall (i64.const {execve})))
    (call $exit (i32.const 5))))"#,
        getpid = libc::SYS_getpid,
        getpriority = libc::SYS_getpriority,
        eperm = libc::EPERM,
        execve = libc::SYS_execve,
    );
    Ok(wat::parse_str(wat)?)
}

#[tokio::test]
async fn a_forbidden_system_call_ends_its_sandbox_and_nothing_else() -> Result<()> {
    let fx = Fixture::with_sandbox_args(&["--fault-injection"])?;
    fx.import("ticker")?;
    let image = "localhost/wasmlet-test/escape:latest";
    let archive = fx.path().join("escape.tar");
    write_oci_archive(
        &WasmImage::new(image, escaping_guest()?, WasmLayout::Artifact),
        &archive,
    )?;
    fx.runtime.images().import_archive(&archive)?;

    // A neighbour, which must not notice.
    let neighbour = fx.pod("neighbour").await?;
    let neighbour_pid = fx
        .runtime
        .sandbox_pid(&neighbour.id)
        .context("sandbox pid")?;
    let ticker = fx
        .run(
            &neighbour,
            &with_env(
                neighbour.container("ticker", "ticker"),
                &[("INTERVAL_MS", "20")],
            ),
        )
        .await?;
    fx.wait_for_state(&ticker, ContainerState::Running).await?;

    let pod = fx.pod("escape").await?;
    let pid = fx.runtime.sandbox_pid(&pod.id).context("sandbox pid")?;
    let mut config = pod.container("escape", "ticker");
    config.image = image.to_owned();
    let escape = fx.run(&pod, &config).await?;
    let status = fx.wait_exited(&escape).await?;

    // The allowed call ran, the other failed with EPERM, and execve ended the process.
    let log = pod.config.log_directory.join("escape/0.log");
    wait_for_stdout_line(&log, "refused").await?;
    assert!(
        status.message.contains("SIGSYS"),
        "the container's end does not name the seccomp kill: {status:?}"
    );
    assert_ne!(status.exit_code, 0, "{status:?}");
    crate::fixture::poll_until("the escaping pod's sandbox to be gone", async || {
        Ok((!process_exists(pid)).then_some(()))
    })
    .await?;

    // The neighbour's sandbox and guest run on, and the runtime still serves it.
    assert!(process_exists(neighbour_pid));
    let before = std::fs::read_to_string(neighbour.config.log_directory.join("ticker/0.log"))?;
    let ticks = before.lines().count();
    crate::fixture::poll_until("the neighbour's ticker to tick on", async || {
        let now = std::fs::read_to_string(neighbour.config.log_directory.join("ticker/0.log"))?;
        Ok((now.lines().count() > ticks).then_some(()))
    })
    .await?;
    let status = fx.runtime.container_status(&ticker).await?;
    assert_eq!(status.state, ContainerState::Running, "{status:?}");
    Ok(())
}
