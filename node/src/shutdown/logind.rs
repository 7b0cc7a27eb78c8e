//! systemd-logind over the system D-Bus (`zbus`): its `InhibitDelayMaxUSec`, a delay
//! inhibitor for `shutdown`, and its `PrepareForShutdown` announcements. The bus is
//! the one `DBUS_SYSTEM_BUS_ADDRESS` names, else `/run/dbus/system_bus_socket`.

use std::time::Duration;

use futures::{Stream, StreamExt};
use zbus::proxy::CacheProperties;
use zbus::zvariant::OwnedFd;

const LOGIND: &str = "org.freedesktop.login1";
const LOGIND_PATH: &str = "/org/freedesktop/login1";
const LOGIND_MANAGER: &str = "org.freedesktop.login1.Manager";
const SYSTEMD: &str = "org.freedesktop.systemd1";
const SYSTEMD_PATH: &str = "/org/freedesktop/systemd1";
const SYSTEMD_MANAGER: &str = "org.freedesktop.systemd1.Manager";
/// Where the node raises logind's `InhibitDelayMaxSec` when it is below the grace
/// periods (as the kubelet does with its `99-kubelet.conf`).
const LOGIND_CONF_DROP_IN: &str = "/etc/systemd/logind.conf.d/99-wasmlet.conf";
/// How long logind gets to read its configuration again after SIGHUP.
const RELOAD_WAIT: Duration = Duration::from_secs(2);

/// A connection to logind's manager object.
pub struct Logind {
    connection: zbus::Connection,
    manager: zbus::Proxy<'static>,
}

/// A taken inhibitor: the shutdown waits (up to logind's delay) until it is dropped.
pub struct Inhibitor {
    _fd: OwnedFd,
}

impl Logind {
    /// Connects to the system bus and checks logind is on it.
    pub async fn connect() -> Result<Logind, String> {
        let connection = zbus::Connection::system()
            .await
            .map_err(|e| format!("the system D-Bus cannot be reached: {e}"))?;
        let manager = zbus::proxy::Builder::new(&connection)
            .destination(LOGIND)
            .and_then(|b| b.path(LOGIND_PATH))
            .and_then(|b| b.interface(LOGIND_MANAGER))
            .map_err(|e| e.to_string())?
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(|e| format!("systemd-logind: {e}"))?;
        let logind = Logind {
            connection,
            manager,
        };
        logind.inhibit_delay().await?;
        Ok(logind)
    }

    /// logind's `InhibitDelayMaxUSec`: the longest a delay inhibitor holds a shutdown.
    pub async fn inhibit_delay(&self) -> Result<Duration, String> {
        let usec: u64 = self
            .manager
            .get_property("InhibitDelayMaxUSec")
            .await
            .map_err(|e| format!("systemd-logind is not on the system bus: {e}"))?;
        Ok(Duration::from_micros(usec))
    }

    /// Makes sure a delay inhibitor can hold the shutdown for `requested`: when
    /// logind allows less, its configuration is raised by a drop-in and it is told to
    /// read it again (SIGHUP through systemd), as the kubelet does.
    pub async fn ensure_inhibit_delay(&self, requested: Duration) -> Result<(), String> {
        let current = self.inhibit_delay().await?;
        if current >= requested {
            return Ok(());
        }
        tracing::info!(
            current = %crate::duration::format(current),
            requested = %crate::duration::format(requested),
            "systemd-logind's InhibitDelayMaxSec is below the shutdown grace periods; raising it"
        );
        let raised = self.raise_inhibit_delay(requested).await;
        let deadline = tokio::time::Instant::now() + RELOAD_WAIT;
        let mut current = current;
        while raised.is_ok() && tokio::time::Instant::now() < deadline {
            current = self.inhibit_delay().await?;
            if current >= requested {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!(
            "systemd-logind's InhibitDelayMaxSec is {}, below the {} the shutdown grace periods need{}",
            crate::duration::format(current),
            crate::duration::format(requested),
            match raised {
                Ok(()) => " after it was raised in ".to_owned() + LOGIND_CONF_DROP_IN,
                Err(e) => format!(", and raising it failed: {e}"),
            }
        ))
    }

    async fn raise_inhibit_delay(&self, requested: Duration) -> Result<(), String> {
        let path = std::path::Path::new(LOGIND_CONF_DROP_IN);
        let body = format!(
            "# Written by wasmlet for its graceful node shutdown.\n[Login]\nInhibitDelayMaxSec={}\n",
            requested.as_secs()
        );
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        std::fs::write(path, body).map_err(|e| format!("{}: {e}", path.display()))?;
        let systemd = zbus::Proxy::new(&self.connection, SYSTEMD, SYSTEMD_PATH, SYSTEMD_MANAGER)
            .await
            .map_err(|e| format!("systemd: {e}"))?;
        systemd
            .call_method(
                "KillUnit",
                &("systemd-logind.service", "all", nix::libc::SIGHUP),
            )
            .await
            .map_err(|e| format!("reloading systemd-logind through systemd: {e}"))?;
        Ok(())
    }

    /// A delay inhibitor for `shutdown`.
    pub async fn inhibit(&self) -> Result<Inhibitor, String> {
        let reply = self
            .manager
            .call_method(
                "Inhibit",
                &(
                    "shutdown",
                    "wasmlet",
                    "wasmlet needs time to stop the node's pods gracefully",
                    "delay",
                ),
            )
            .await
            .map_err(|e| format!("taking a systemd-logind inhibitor: {e}"))?;
        let fd: OwnedFd = reply
            .body()
            .deserialize()
            .map_err(|e| format!("systemd-logind's inhibitor reply: {e}"))?;
        Ok(Inhibitor { _fd: fd })
    }

    /// logind's `PrepareForShutdown` arguments as they come (`true`: the machine is
    /// going down; `false`: that was cancelled); the stream ends when logind leaves
    /// the bus (it restarted, or the bus went away).
    pub async fn announcements(
        &self,
    ) -> Result<impl Stream<Item = Result<bool, String>> + Unpin + use<>, String> {
        let signals = self
            .manager
            .receive_signal("PrepareForShutdown")
            .await
            .map_err(|e| format!("subscribing to PrepareForShutdown: {e}"))?
            .map(|m| {
                m.body()
                    .deserialize::<bool>()
                    .map_err(|e| format!("a PrepareForShutdown signal: {e}"))
            });
        // logind's owner changing (a restart) ends the watch: its inhibitor is gone.
        let owner_gone = self
            .manager
            .receive_owner_changed()
            .await
            .map_err(|e| format!("watching systemd-logind on the bus: {e}"))?
            .into_future();
        Ok(Box::pin(signals.take_until(owner_gone)))
    }
}
