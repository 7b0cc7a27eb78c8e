//! A private D-Bus system bus (the Debian `dbus-daemon`) and, on it, a test playing
//! systemd-logind: its `InhibitDelayMaxUSec`, `Inhibit` handing out the write end of
//! a pipe whose read end the test watches (closed: the inhibitor is released), and
//! `PrepareForShutdown` announced on demand.

use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::node::poll;

const LOGIND: &str = "org.freedesktop.login1";
const LOGIND_PATH: &str = "/org/freedesktop/login1";
const LOGIND_MANAGER: &str = "org.freedesktop.login1.Manager";

/// A `dbus-daemon` on a socket in a temporary directory, stopped on drop.
pub struct PrivateBus {
    child: Child,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl PrivateBus {
    /// Starts a bus that lets every local peer own any name and call anything.
    pub fn start() -> Result<PrivateBus> {
        let dir = tempfile::Builder::new().prefix("wasmlet-dbus-").tempdir()?;
        let socket = dir.path().join("system_bus_socket");
        let config = dir.path().join("bus.conf");
        let log = dir.path().join("dbus-daemon.log");
        std::fs::write(
            &config,
            format!(
                r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>custom</type>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
"#,
                socket.display()
            ),
        )?;
        let child = Command::new("dbus-daemon")
            .arg(format!("--config-file={}", config.display()))
            .arg("--nofork")
            .arg("--nopidfile")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // It warns that it cannot raise its fd limit without CAP_SYS_RESOURCE;
            // what it says goes to a file the start-up error quotes.
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("starting dbus-daemon (Debian package dbus-daemon)")?;
        let mut bus = PrivateBus {
            child,
            socket,
            _dir: dir,
        };
        if poll(Duration::from_secs(10), || {
            bus.socket.exists().then_some(())
        })
        .is_none()
        {
            let _ = bus.child.kill();
            let said = std::fs::read_to_string(&log).unwrap_or_default();
            bail!("dbus-daemon made no socket within 10 s: {said}");
        }
        Ok(bus)
    }

    /// The bus's address, as `DBUS_SYSTEM_BUS_ADDRESS` takes it.
    pub fn address(&self) -> String {
        format!("unix:path={}", self.socket.display())
    }
}

impl Drop for PrivateBus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An inhibitor a client took.
pub struct Inhibitor {
    pub what: String,
    pub who: String,
    pub why: String,
    pub mode: String,
    /// The read end of the pipe whose write end the client holds.
    read_end: OwnedFd,
}

impl Inhibitor {
    /// Whether the client closed its end (released the inhibitor, or exited).
    pub fn released(&self) -> bool {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let mut fds = [PollFd::new(self.read_end.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::ZERO) {
            Ok(0) => false,
            Ok(_) => fds[0]
                .revents()
                .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLIN)),
            Err(_) => false,
        }
    }
}

struct Manager {
    delay: Duration,
    inhibitors: Arc<Mutex<Vec<Inhibitor>>>,
}

#[zbus::interface(name = "org.freedesktop.login1.Manager")]
impl Manager {
    async fn inhibit(
        &self,
        what: String,
        who: String,
        why: String,
        mode: String,
    ) -> zbus::fdo::Result<zbus::zvariant::OwnedFd> {
        let (read_end, write_end) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| zbus::fdo::Error::Failed(e.to_string()))?;
        self.inhibitors.lock().unwrap().push(Inhibitor {
            what,
            who,
            why,
            mode,
            read_end,
        });
        Ok(write_end.into())
    }

    #[zbus(property, name = "InhibitDelayMaxUSec")]
    async fn inhibit_delay_max_usec(&self) -> u64 {
        self.delay.as_micros() as u64
    }
}

/// The test's systemd-logind on a [`PrivateBus`], on its own runtime.
pub struct FakeLogind {
    connection: zbus::Connection,
    inhibitors: Arc<Mutex<Vec<Inhibitor>>>,
    rt: tokio::runtime::Runtime,
}

impl FakeLogind {
    /// Takes `org.freedesktop.login1` on `bus`, allowing inhibitors `delay`.
    pub fn start(bus: &PrivateBus, delay: Duration) -> Result<FakeLogind> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let inhibitors = Arc::new(Mutex::new(Vec::new()));
        let manager = Manager {
            delay,
            inhibitors: inhibitors.clone(),
        };
        let address = bus.address();
        let connection = rt.block_on(async move {
            zbus::connection::Builder::address(address.as_str())?
                .name(LOGIND)?
                .serve_at(LOGIND_PATH, manager)?
                .build()
                .await
        })?;
        Ok(FakeLogind {
            connection,
            inhibitors,
            rt,
        })
    }

    /// Announces `PrepareForShutdown(start)`, as logind does when a shutdown is
    /// asked for (`true`) or cancelled (`false`).
    pub fn prepare_for_shutdown(&self, start: bool) -> Result<()> {
        self.rt.block_on(self.connection.emit_signal(
            None::<&str>,
            LOGIND_PATH,
            LOGIND_MANAGER,
            "PrepareForShutdown",
            &(start,),
        ))?;
        Ok(())
    }

    /// Runs `f` over the inhibitors taken so far, in the order they were taken.
    pub fn inhibitors<T>(&self, f: impl FnOnce(&[Inhibitor]) -> T) -> T {
        f(&self.inhibitors.lock().unwrap())
    }

    /// How many inhibitors are taken and not released.
    pub fn held(&self) -> usize {
        self.inhibitors(|all| all.iter().filter(|i| !i.released()).count())
    }
}
