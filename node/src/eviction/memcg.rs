//! Memory notifications that wake the eviction manager before its next 10 s pass.
//!
//! On cgroup v1 (the kubelet's `memoryThresholdNotifier` with
//! `kernelMemcgNotification`): an eventfd registered through `cgroup.event_control` on
//! `memory.usage_in_bytes` of the root cgroup (for `memory.available`) and of
//! `kubepods` (for `allocatableMemory.available`), armed at the usage where what is
//! available would cross the threshold. The kernel signals the eventfd the moment usage
//! crosses it, so a fast allocation is acted on without waiting for the next pass.
//! Re-armed after every pass, as the usage the threshold corresponds to moves with the
//! page cache.
//!
//! cgroup v2 has no usage thresholds, and the kubelet takes no notifications there.
//! wasmlet watches what v2 does offer (docs/decisions.md, "Eviction"): a PSI trigger on
//! each cgroup's `memory.pressure` (tasks stalled on memory for [`PSI_STALL`] within
//! [`PSI_WINDOW`], the shortest window an unprivileged trigger may have), and
//! `memory.events` of `kubepods` through inotify (its `high`, `max` and `oom` counters
//! change as the pods reach their allocatable). Either wakes a pass, which then
//! observes and decides as usual.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;

use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};

use super::signals::Observations;
use crate::thresholds::EvictionThreshold;

/// One cgroup v1 memory cgroup watched for one signal.
pub struct Watch {
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

/// The node's memory notifications.
pub enum Notifier {
    /// Usage thresholds, re-armed after every pass.
    V1 { watches: Vec<Watch> },
    /// Pressure stall triggers and `memory.events` watches, armed once.
    V2 { fds: Vec<(OwnedFd, PollFlags)> },
}

/// A PSI trigger fires when tasks of the cgroup were stalled on memory for this long...
pub const PSI_STALL: std::time::Duration = std::time::Duration::from_millis(100);
/// ...within this window (2 s: the kernel's shortest for a process without
/// `CAP_SYS_RESOURCE`, which these machines lack).
pub const PSI_WINDOW: std::time::Duration = std::time::Duration::from_secs(2);

impl Notifier {
    /// Watches each `(signal, cgroup v1 memory cgroup directory)`; fails when a cgroup
    /// has no `cgroup.event_control` (no memory controller on v1).
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
        Ok(Notifier::V1 {
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

    /// Watches each cgroup v2 directory: a PSI trigger on its `memory.pressure`, and an
    /// inotify watch on its `memory.events` where it has one (the root has none). Fails
    /// when a trigger cannot be armed (a kernel without PSI, or `psi=0`), naming the
    /// file.
    pub fn v2(cgroups: Vec<PathBuf>) -> io::Result<Self> {
        use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
        let mut fds = Vec::new();
        let named = |path: &std::path::Path, e: io::Error| {
            io::Error::new(e.kind(), format!("{}: {e}", path.display()))
        };
        let mut inotify: Option<Inotify> = None;
        for dir in &cgroups {
            let pressure = dir.join("memory.pressure");
            let trigger = psi_trigger(&pressure).map_err(|e| named(&pressure, e))?;
            fds.push((trigger, PollFlags::POLLPRI));
            let events = dir.join("memory.events");
            if events.exists() {
                let watcher = match inotify.take() {
                    Some(i) => i,
                    None => Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)
                        .map_err(|e| named(&events, e.into()))?,
                };
                watcher
                    .add_watch(&events, AddWatchFlags::IN_MODIFY)
                    .map_err(|e| named(&events, e.into()))?;
                inotify = Some(watcher);
            }
        }
        if let Some(i) = inotify {
            fds.push((OwnedFd::from(i), PollFlags::POLLIN));
        }
        Ok(Notifier::V2 { fds })
    }

    /// Arms each v1 watch at the usage where its signal's highest threshold would be
    /// crossed: the usage now plus what is available above the threshold. (v2's
    /// triggers do not depend on the thresholds.)
    pub fn update(&mut self, thresholds: &[EvictionThreshold], observations: &Observations) {
        let Notifier::V1 { watches } = self else {
            return;
        };
        for w in watches {
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

/// Opens a PSI trigger: "some" stall of [`PSI_STALL`] within [`PSI_WINDOW`], written
/// in one write (with its NUL, as the kernel documents) on the file kept open.
fn psi_trigger(pressure: &std::path::Path) -> io::Result<OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(pressure)?;
    let trigger = format!(
        "some {} {}\0",
        PSI_STALL.as_micros(),
        PSI_WINDOW.as_micros()
    );
    file.write_all(trigger.as_bytes())?;
    Ok(OwnedFd::from(file))
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

/// The descriptors a wait polls, and for what.
fn pollable(notifier: &Notifier) -> Vec<(OwnedFd, PollFlags)> {
    match notifier {
        Notifier::V1 { watches } => watches
            .iter()
            .filter_map(|w| w.armed.as_ref())
            .filter_map(|(_, r)| r.efd.as_fd().try_clone_to_owned().ok())
            .map(|fd| (fd, PollFlags::POLLIN))
            .collect(),
        Notifier::V2 { fds } => fds
            .iter()
            .filter_map(|(fd, flags)| Some((fd.try_clone().ok()?, *flags)))
            .collect(),
    }
}

/// Resolves when any armed watch fires (never without a notifier or an armed watch).
/// The descriptors are polled on a blocking thread, in slices of a second. A v2
/// descriptor that reports an error (its cgroup was removed) is dropped, so it cannot
/// wake the manager in a loop.
pub async fn notified(notifier: Option<&mut Notifier>) {
    let Some(notifier) = notifier else {
        return std::future::pending().await;
    };
    let fds = pollable(notifier);
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
                .map(|(f, flags)| PollFd::new(f.as_fd(), *flags))
                .collect();
            let fired =
                nix::poll::poll(&mut polled, PollTimeout::from(POLL_SLICE)).is_ok_and(|n| n > 0);
            let broken: Vec<usize> = polled
                .iter()
                .enumerate()
                .filter(|(_, p)| {
                    p.revents().is_some_and(|r| {
                        r.intersects(PollFlags::POLLERR | PollFlags::POLLNVAL | PollFlags::POLLHUP)
                    })
                })
                .map(|(i, _)| i)
                .collect();
            drop(polled);
            (owned, fired, broken)
        })
        .await;
        match waited {
            Ok((owned, true, broken)) => {
                // The counters are reset here, by the wait that is still wanted: one
                // abandoned mid-poll leaves them set, so the next wait sees the
                // crossing at once instead of losing it. (An eventfd's counter and
                // inotify's queue are read empty; a PSI trigger needs no reset.)
                for (f, flags) in &owned {
                    if *flags == PollFlags::POLLIN {
                        let mut buf = [0u8; 4096];
                        while nix::unistd::read(f, &mut buf).is_ok_and(|n| n > 0) {}
                    }
                }
                if let Notifier::V2 { fds } = notifier
                    && !broken.is_empty()
                {
                    tracing::warn!(
                        "eviction: {} memory notification(s) reported an error and are no longer watched",
                        broken.len()
                    );
                    let mut index = 0;
                    fds.retain(|_| {
                        index += 1;
                        !broken.contains(&(index - 1))
                    });
                }
                return;
            }
            Ok((owned, false, _)) => fds = Some(owned),
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

    /// Removes the test's cgroups (after killing what is in them) and its file.
    struct Cleanup(Vec<PathBuf>, Option<std::process::Child>);

    impl Drop for Cleanup {
        fn drop(&mut self) {
            if let Some(mut child) = self.1.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
            for dir in self.0.iter().rev() {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }

    fn within<F: std::future::Future>(
        rt: &tokio::runtime::Runtime,
        limit: std::time::Duration,
        f: F,
    ) -> Option<F::Output> {
        rt.block_on(async { tokio::time::timeout(limit, f).await.ok() })
    }

    /// cgroup v2's PSI trigger, for real: on these hybrid machines PSI is accounted in
    /// the unified hierarchy while memory is limited in v1, so a writer confined to
    /// 16 MiB of v1 memory and placed in a v2 cgroup of the test's stalls on reclaim
    /// there. The trigger stays quiet while the cgroup is empty and fires once the
    /// writer runs.
    #[test]
    fn a_v2_pressure_stall_wakes_the_manager() {
        let unified = std::path::Path::new("/sys/fs/cgroup/unified");
        let memory = std::path::Path::new("/sys/fs/cgroup/memory");
        assert!(
            unified.join("memory.pressure").exists() && memory.join("cgroup.procs").exists(),
            "this test needs PSI in the unified hierarchy and the v1 memory controller"
        );
        let name = format!(
            "wasmlet-psi-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos()
        );
        let v2 = unified.join(&name);
        let v1 = memory.join(&name);
        std::fs::create_dir(&v2).unwrap();
        std::fs::create_dir(&v1).unwrap();
        let mut cleanup = Cleanup(vec![v2.clone(), v1.clone()], None);
        std::fs::write(v1.join("memory.limit_in_bytes"), (16u64 << 20).to_string()).unwrap();
        // On disk: a writer to tmpfs would have its pages charged as shmem, and be
        // killed at the limit instead of reclaiming.
        let scratch = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();

        let mut notifier = Notifier::v2(vec![v2.clone()]).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        assert!(
            within(
                &rt,
                PSI_WINDOW + std::time::Duration::from_millis(500),
                notified(Some(&mut notifier))
            )
            .is_none(),
            "the trigger fired while its cgroup was empty"
        );

        let script = format!(
            "echo $$ > {v2}/cgroup.procs && echo $$ > {v1}/cgroup.procs && \
             exec dd if=/dev/zero of={file} bs=1M count=2000 status=none",
            v2 = v2.display(),
            v1 = v1.display(),
            file = scratch.path().join("fill").display()
        );
        cleanup.1 = Some(
            std::process::Command::new("sh")
                .args(["-c", &script])
                .spawn()
                .unwrap(),
        );
        assert!(
            within(
                &rt,
                std::time::Duration::from_secs(30),
                notified(Some(&mut notifier))
            )
            .is_some(),
            "no PSI notification while a writer stalled on its memory limit"
        );
    }

    /// `memory.events` is watched through inotify: a change of its counters wakes the
    /// manager. (A fixture directory: the unified mount here has no memory
    /// controller, so no `memory.events`. Its `memory.pressure` is a plain file,
    /// which never reports a PSI event.)
    #[test]
    fn a_change_of_memory_events_wakes_the_manager() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("memory.pressure"), "").unwrap();
        let events = dir.path().join("memory.events");
        std::fs::write(&events, "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n").unwrap();
        let mut notifier = Notifier::v2(vec![dir.path().to_owned()]).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        assert!(
            within(
                &rt,
                std::time::Duration::from_millis(1500),
                notified(Some(&mut notifier))
            )
            .is_none(),
            "woken with no change"
        );
        std::fs::write(&events, "low 0\nhigh 0\nmax 3\noom 0\noom_kill 0\n").unwrap();
        assert!(
            within(
                &rt,
                std::time::Duration::from_secs(5),
                notified(Some(&mut notifier))
            )
            .is_some(),
            "a change of memory.events did not wake the manager"
        );
        // The queue was drained: no second wake without a second change.
        assert!(
            within(
                &rt,
                std::time::Duration::from_millis(1500),
                notified(Some(&mut notifier))
            )
            .is_none(),
            "woken again by the same change"
        );
    }
}
