//! The sandbox process's least privilege (`wasmlet_runtime_wasm::confine`): what
//! `/proc` says about it, and what happens when host code in it makes a call no
//! sandbox should.

use anyhow::{Context, Result, ensure};
use nix::libc;
use wasmlet_runtime::{ContainerState, Runtime as _};
use wasmlet_testkit::images::{WasmImage, WasmLayout, write_oci_archive};

use crate::fixture::{Fixture, log_records, process_exists, wait_for_stdout_line, with_env};

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

#[tokio::test]
async fn a_pod_with_a_run_as_user_has_its_sandbox_run_as_that_user() -> Result<()> {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let fx = Fixture::with_images(&["ticker", "hello"])?;
    let mut config = fx.pod_config("runs-as");
    config.security = wasmlet_runtime::SandboxSecurity {
        run_as_user: Some(1000),
        run_as_group: Some(3000),
        supplemental_groups: vec![2000],
        containers_run_as_user: Some(1000),
        containers_run_as_group: Some(3000),
        ..Default::default()
    };
    let pod = fx.start_pod(config).await?;
    let pid = fx.runtime.sandbox_pid(&pod.id).context("sandbox pid")?;

    // Real, effective, saved and filesystem ids; the groups it was given, and no more.
    assert_eq!(status_field(pid, "Uid")?, "1000\t1000\t1000\t1000");
    assert_eq!(status_field(pid, "Gid")?, "3000\t3000\t3000\t3000");
    assert_eq!(status_field(pid, "Groups")?, "2000");
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(status_field(pid, set)?, "0000000000000000", "{set}");
    }
    assert_eq!(status_field(pid, "Seccomp_filters")?, "3");

    // The fixture's directory stands for the node's root directory. Made `0700`, the
    // images are closed to the pod's user, and the node says so; `0755`, as the node
    // makes it, they are open.
    std::fs::set_permissions(fx.path(), std::fs::Permissions::from_mode(0o700))?;
    let ticker_config = with_env(pod.container("ticker", "ticker"), &[("INTERVAL_MS", "20")]);
    let e = fx
        .runtime
        .create_container(&pod.id, &ticker_config, &pod.config)
        .await
        .expect_err("images closed to the pod's user");
    assert!(
        e.to_string().contains(&format!(
            "{} (mode 700, owner 0:0) is closed to it",
            fx.path().display()
        )),
        "{e}"
    );
    std::fs::set_permissions(fx.path(), std::fs::Permissions::from_mode(0o755))?;

    // A guest runs and logs: its log file is the pod user's, its directory the node's.
    let ticker = fx.run(&pod, &ticker_config).await?;
    fx.wait_for_state(&ticker, ContainerState::Running).await?;
    let log = pod.config.log_directory.join("ticker/0.log");
    wait_for_stdout_line(&log, "tick 2").await?;
    let owner = |path: &std::path::Path| -> Result<(u32, u32)> {
        let meta = std::fs::symlink_metadata(path).with_context(|| path.display().to_string())?;
        Ok((meta.uid(), meta.gid()))
    };
    assert_eq!(owner(&log)?, (1000, 3000));
    assert_eq!(owner(log.parent().unwrap())?, (0, 0));

    // A rotation's new file is handed over too, and written.
    let rotated = log.with_extension("log.1");
    std::fs::rename(&log, &rotated)?;
    fx.runtime.reopen_container_log(&ticker).await?;
    let records = log_records(&log)?;
    let next = records.len() + 3;
    crate::fixture::poll_until("the ticker to write its new log file", async || {
        Ok((log_records(&log)?.len() >= next).then_some(()))
    })
    .await?;
    assert_eq!(owner(&log)?, (1000, 3000));

    // What the guest writes is the pod user's; what only root may write it cannot.
    let shared = fx.path().join("shared");
    let closed = fx.path().join("closed");
    for (dir, mode) in [(&shared, 0o777), (&closed, 0o755)] {
        std::fs::create_dir(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))?;
    }
    let mut writer = with_env(
        pod.container("writer", "hello"),
        &[("WRITE_FILE", "/shared/made")],
    );
    let mut refused = with_env(
        pod.container("refused", "hello"),
        &[("WRITE_FILE", "/closed/made")],
    );
    for (config, dir, name) in [
        (&mut writer, &shared, "/shared"),
        (&mut refused, &closed, "/closed"),
    ] {
        config.mounts = vec![wasmlet_runtime::Mount {
            container_path: name.into(),
            host_path: dir.clone(),
            readonly: false,
        }];
    }
    let wrote = fx.run(&pod, &writer).await?;
    assert_eq!(fx.wait_exited(&wrote).await?.exit_code, 0);
    assert_eq!(owner(&shared.join("made"))?, (1000, 3000));
    let not_written = fx.run(&pod, &refused).await?;
    assert_eq!(fx.wait_exited(&not_written).await?.exit_code, 1);
    assert!(!closed.join("made").exists());

    // A container that asks for another user cannot have it in this process.
    let mut other = pod.container("other", "hello");
    other.security.run_as_user = Some(2000);
    let e = fx
        .runtime
        .create_container(&pod.id, &other, &pod.config)
        .await
        .expect_err("a container of another user");
    assert!(
        e.to_string().contains("runAsUser 2000") && e.to_string().contains("runAsUser 1000"),
        "{e}"
    );
    let status = fx.runtime.container_status(&ticker).await?;
    assert_eq!(status.state, ContainerState::Running, "{status:?}");
    Ok(())
}
