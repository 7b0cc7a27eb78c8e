//! Container log rotation: the kubelet's container log manager
//! (`pkg/kubelet/logs/container_log_manager.go`).
//!
//! Every `containerLogMonitorInterval` the manager lists every runtime's containers
//! and looks at each running one's CRI log (its status's `log_path`). A log that has
//! reached `containerLogMaxSize` is rotated, up to `containerLogMaxWorkers` at once:
//!
//! 1. the leftovers of an interrupted rotation go (`.tmp` files, an uncompressed file
//!    whose `.gz` exists), then the oldest rotated files until `containerLogMaxFiles -
//!    2` remain: with the one about to be made and the new log, `containerLogMaxFiles`
//!    files in all;
//! 2. every rotated file left uncompressed is gzipped to `<file>.gz`, so only the
//!    newest rotated one (made now) stays plain, for a reader still following it;
//! 3. `N.log` is renamed `N.log.<YYYYMMDD-HHMMSS>` (UTC);
//! 4. the runtime is asked to reopen the container's log
//!    ([`Runtime::reopen_container_log`]), and the container writes a new `N.log`. If
//!    it cannot, the file is renamed back, to be rotated at a later tick.
//!
//! A log that is missing (the node stopped between 3 and 4) is reopened first. What
//! fails is logged with its container and never stops the loop. Start at
//! [`ContainerLogManager::run`]; the file steps are in `files.rs`.

mod files;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use wasmlet_runtime::{ContainerState, Runtime};

pub use files::{COMPRESS_SUFFIX, TIMESTAMP_FORMAT, rotated_files, rotated_name};

use crate::config::ContainerLogSettings;
use crate::router::RuntimeRouter;

/// What went wrong rotating one container's log.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{op}: {source}")]
    Runtime {
        op: &'static str,
        #[source]
        source: wasmlet_runtime::Error,
    },
    #[error("the rotation of {} panicked", log.display())]
    Panicked { log: PathBuf },
}

impl Error {
    fn io(op: &'static str, path: &Path, source: std::io::Error) -> Self {
        Error::Io {
            op,
            path: path.to_owned(),
            source,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a look at one container's log did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The log is under the size, or the container has none.
    Kept,
    /// The log was rotated to this file.
    Rotated(PathBuf),
}

/// The current time, injectable for tests.
type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// Rotates the running containers' logs of every runtime of the node.
pub struct ContainerLogManager {
    router: RuntimeRouter,
    max_size: u64,
    max_files: usize,
    interval: Duration,
    workers: usize,
    clock: Clock,
}

impl ContainerLogManager {
    /// A manager with the node's settings; `None` when rotation is off (a negative
    /// `containerLogMaxSize`).
    pub fn new(router: RuntimeRouter, settings: &ContainerLogSettings) -> Option<Self> {
        Some(ContainerLogManager {
            router,
            max_size: settings.max_size?,
            max_files: settings.max_files.max(2),
            interval: settings.monitor_interval,
            workers: settings.max_workers.max(1),
            clock: Arc::new(Timestamp::now),
        })
    }

    #[cfg(test)]
    fn with_clock(mut self, clock: impl Fn() -> Timestamp + Send + Sync + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Rotates at every tick of the monitor interval (the first at once) until
    /// `cancel` fires; idle in between. A pass cut short by `cancel` between a rename
    /// and its reopen is mended by the next run, which reopens a missing log.
    pub async fn run(self, cancel: CancellationToken) {
        tracing::info!(
            max_size = self.max_size,
            max_files = self.max_files,
            workers = self.workers,
            interval = ?self.interval,
            "rotating container logs"
        );
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = self.rotate_logs() => {}
            }
        }
    }

    /// One pass: every running container of every runtime, `workers` at a time.
    pub async fn rotate_logs(&self) {
        let mut running = Vec::new();
        for runtime in self.router.runtimes() {
            match runtime.list_containers().await {
                Ok(containers) => running.extend(
                    containers
                        .into_iter()
                        .filter(|c| c.state == ContainerState::Running)
                        .map(|c| (runtime.clone(), c.id)),
                ),
                Err(e) => tracing::warn!(
                    runtime = runtime.name(),
                    "container log rotation: listing containers: {e}"
                ),
            }
        }
        futures::stream::iter(running)
            .for_each_concurrent(self.workers, |(runtime, id)| async move {
                match self.rotate_container(&*runtime, &id).await {
                    Ok(Outcome::Kept) => {}
                    Ok(Outcome::Rotated(to)) => tracing::debug!(
                        container_id = %id,
                        rotated = %to.display(),
                        "rotated the container log"
                    ),
                    // Removed since it was listed: nothing to rotate.
                    Err(Error::Runtime { source, .. }) if source.is_not_found() => {
                        tracing::debug!(container_id = %id, "container log rotation: {source}")
                    }
                    Err(e) => tracing::warn!(
                        container_id = %id,
                        runtime = runtime.name(),
                        "container log rotation: {e}"
                    ),
                }
            })
            .await;
    }

    /// Rotates one container's log if it has reached the size.
    pub async fn rotate_container(&self, runtime: &dyn Runtime, id: &str) -> Result<Outcome> {
        let status = runtime
            .container_status(id)
            .await
            .map_err(|source| Error::Runtime {
                op: "reading the container's status",
                source,
            })?;
        let log = status.log_path;
        if log.as_os_str().is_empty() {
            return Ok(Outcome::Kept);
        }
        let size = match std::fs::metadata(&log) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                reopen(runtime, id).await?;
                std::fs::metadata(&log)
                    .map_err(|e| Error::io("reading the reopened log", &log, e))?
                    .len()
            }
            Err(e) => return Err(Error::io("reading", &log, e)),
        };
        if size < self.max_size {
            return Ok(Outcome::Kept);
        }
        self.rotate(runtime, id, &log).await.map(Outcome::Rotated)
    }

    async fn rotate(&self, runtime: &dyn Runtime, id: &str, log: &Path) -> Result<PathBuf> {
        // Room for the file made now: the current log and it are two of the files.
        let keep = self.max_files - 2;
        let owned = log.to_owned();
        tokio::task::spawn_blocking(move || files::prepare(&owned, keep))
            .await
            .map_err(|_| Error::Panicked {
                log: log.to_owned(),
            })??;
        let rotated = rotated_name(log, (self.clock)());
        if rotated.exists() {
            // Rotated twice within a second: the next tick has a name of its own.
            return Err(Error::io(
                "rotating to",
                &rotated,
                std::io::ErrorKind::AlreadyExists.into(),
            ));
        }
        std::fs::rename(log, &rotated).map_err(|e| Error::io("renaming", log, e))?;
        if let Err(e) = reopen(runtime, id).await {
            // Back, to be rotated again at a later tick.
            if let Err(back) = std::fs::rename(&rotated, log) {
                tracing::error!(
                    container_id = %id,
                    rotated = %rotated.display(),
                    "cannot rename the rotated log back to {}: {back}",
                    log.display()
                );
            }
            return Err(e);
        }
        Ok(rotated)
    }
}

async fn reopen(runtime: &dyn Runtime, id: &str) -> Result<()> {
    runtime
        .reopen_container_log(id)
        .await
        .map_err(|source| Error::Runtime {
            op: "reopening the container's log",
            source,
        })
}

#[cfg(test)]
mod tests;
