//! Memory cgroup threshold notifications (cgroup v1, the kubelet's
//! `memoryThresholdNotifier` with `kernelMemcgNotification`): an eventfd registered
//! through `cgroup.event_control` on `memory.usage_in_bytes` of the root cgroup (for
//! `memory.available`) and of `kubepods` (for `allocatableMemory.available`), armed
//! at the usage where what is available would cross the threshold. The kernel
//! signals the eventfd the moment usage crosses it, so a fast allocation is acted on
//! without waiting for the next 10 s pass. Re-armed after every pass, as the usage
//! the threshold corresponds to moves with the page cache.
//!
//! cgroup v2 has no usage thresholds; there the passes alone observe memory.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;

use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};

use super::signals::Observations;
use crate::thresholds::EvictionThreshold;

/// One cgroup watched for one signal.
struct Watch {
    signal: &'static str,
    cgroup: PathBuf,
    /// The usage armed at, and its registration.
    armed: Option<(u64, Registration)>,
}

/// An eventfd registered on a cgroup's usage; closing it unregisters.
struct Registration {
    efd: EventFd,
    _usage: File,
}

/// The node's memory threshold notifications.
pub struct Notifier {
    watches: Vec<Watch>,
}

impl Notifier {
    /// Watches each `(signal, memory cgroup directory)`; fails when a cgroup has no
    /// `cgroup.event_control` (cgroup v2, or no memory controller).
    pub fn new(cgroups: Vec<(&'static str, PathBuf)>) -> io::Result<Self> {
        for (_, dir) in &cgroups {
            let control = dir.join("cgroup.event_control");
            if !control.exists() {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("{} does not exist (not cgroup v1)", control.display()),
                ));
            }
        }
        Ok(Notifier {
            watches: cgroups
                .into_iter()
                .map(|(signal, cgroup)| Watch {
                    signal,
                    cgroup,
                    armed: None,
                })
                .collect(),
        })
    }

    /// Arms each watch at the usage where its signal's highest threshold would be
    /// crossed: the usage now plus what is available above the threshold.
    pub fn update(&mut self, thresholds: &[EvictionThreshold], observations: &Observations) {
        for w in &mut self.watches {
            let Some(o) = observations.get(w.signal) else {
                continue;
            };
            // The next threshold down: the highest not met yet (a soft one met
            // already leaves the hard one below it to watch).
            let Some(quantity) = thresholds
                .iter()
                .filter(|t| t.signal == w.signal)
                .map(|t| t.quantity(o.capacity) as i64)
                .filter(|q| *q < o.available)
                .max()
            else {
                // Every threshold is met: the passes act on them.
                w.armed = None;
                continue;
            };
            let headroom = o.available - quantity;
            let usage = match read_usage(&w.cgroup) {
                Ok(u) => u,
                Err(e) => {
                    tracing::debug!(cgroup = %w.cgroup.display(), "eviction: reading memory usage: {e}");
                    continue;
                }
            };
            let at = usage + headroom as u64;
            if w.armed
                .as_ref()
                .is_some_and(|(a, _)| a.abs_diff(at) < (1 << 20))
            {
                continue;
            }
            match register(&w.cgroup, at) {
                Ok(r) => w.armed = Some((at, r)),
                Err(e) => {
                    tracing::warn!(cgroup = %w.cgroup.display(), "eviction: arming a memory threshold notification: {e}");
                    w.armed = None;
                }
            }
        }
    }
}

fn read_usage(cgroup: &std::path::Path) -> io::Result<u64> {
    let raw = std::fs::read_to_string(cgroup.join("memory.usage_in_bytes"))?;
    raw.trim()
        .parse()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{raw:?}: {e}")))
}

fn register(cgroup: &std::path::Path, usage: u64) -> io::Result<Registration> {
    let efd = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)?;
    let usage_file = File::open(cgroup.join("memory.usage_in_bytes"))?;
    let mut control = std::fs::OpenOptions::new()
        .write(true)
        .open(cgroup.join("cgroup.event_control"))?;
    // One write: the kernel parses each write(2) on its own.
    let line = format!("{} {} {usage}", efd.as_raw_fd(), usage_file.as_raw_fd());
    control.write_all(line.as_bytes())?;
    Ok(Registration {
        efd,
        _usage: usage_file,
    })
}

/// How long one wait on the eventfds blocks a thread before it looks again (a
/// wait the node no longer wants ends within this).
const POLL_SLICE: u16 = 1000;

/// Resolves when any armed watch fires (never without a notifier or an armed watch).
/// The eventfds are polled on a blocking thread, in slices of a second.
pub async fn notified(notifier: Option<&mut Notifier>) {
    let fds: Vec<OwnedFd> = notifier
        .into_iter()
        .flat_map(|n| n.watches.iter())
        .filter_map(|w| w.armed.as_ref())
        .filter_map(|(_, r)| r.efd.as_fd().try_clone_to_owned().ok())
        .collect();
    if fds.is_empty() {
        return std::future::pending().await;
    }
    let mut fds = Some(fds);
    loop {
        let owned = fds
            .take()
            .expect("the descriptors come back from each wait");
        let waited = tokio::task::spawn_blocking(move || {
            let mut polled: Vec<PollFd<'_>> = owned
                .iter()
                .map(|f| PollFd::new(f.as_fd(), PollFlags::POLLIN))
                .collect();
            let fired =
                nix::poll::poll(&mut polled, PollTimeout::from(POLL_SLICE)).is_ok_and(|n| n > 0);
            drop(polled);
            (owned, fired)
        })
        .await;
        match waited {
            Ok((owned, true)) => {
                // The counters are reset here, by the wait that is still wanted: one
                // abandoned mid-poll leaves them set, so the next wait sees the
                // crossing at once instead of losing it.
                for f in &owned {
                    let _ = nix::unistd::read(f, &mut [0u8; 8]);
                }
                return;
            }
            Ok((owned, false)) => fds = Some(owned),
            Err(_) => return std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cgroup_without_event_control_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err = Notifier::new(vec![("memory.available", dir.path().to_owned())])
            .err()
            .unwrap();
        assert_eq!(err.kind(), io::ErrorKind::Unsupported);
    }
}
