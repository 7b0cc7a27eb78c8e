//! The task's rootfs: the snapshot mounts containerd hands over in `Create`, mounted
//! in order on `<bundle>/rootfs` (overlay from the overlayfs snapshotter, binds from
//! the native one), and unmounted at `Delete` or by `delete` after a dead shim.

use std::path::{Path, PathBuf};

use anyhow::Context;
use containerd_shim_protos::api::Mount;
use nix::mount::{MntFlags, MsFlags};

/// Mounts `mounts` on `target`, each over the one before (containerd's `mount.All`).
pub fn mount_rootfs(mounts: &[Mount], target: &Path) -> anyhow::Result<()> {
    if mounts.is_empty() {
        return Ok(());
    }
    std::fs::create_dir_all(target).with_context(|| format!("creating {}", target.display()))?;
    for m in mounts {
        let (flags, data) = options(&m.options);
        let bind = m.type_ == "bind" || flags.contains(MsFlags::MS_BIND);
        let fstype = (!bind).then_some(m.type_.as_str());
        let data = (!data.is_empty()).then_some(data.as_str());
        nix::mount::mount(
            Some(m.source.as_str()),
            target,
            fstype,
            flags & !MsFlags::MS_RDONLY
                | if bind {
                    MsFlags::MS_BIND
                } else {
                    MsFlags::empty()
                },
            data,
        )
        .with_context(|| {
            format!(
                "mounting {} ({}) on {}",
                m.source,
                m.type_,
                target.display()
            )
        })?;
        if flags.contains(MsFlags::MS_RDONLY) {
            // A bind mount is made read-only by a remount; other types take the flag
            // as they mount, and the remount is harmless.
            nix::mount::mount(
                None::<&str>,
                target,
                None::<&str>,
                MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY,
                None::<&str>,
            )
            .with_context(|| format!("making {} read-only", target.display()))?;
        }
    }
    Ok(())
}

/// Unmounts everything on `<bundle>/rootfs`, lazily: a process still inside keeps
/// its view, the bundle is free. The task's views in the sandbox's shared directory
/// ([`share_task`]) go first.
pub fn unmount_rootfs(bundle: &Path) {
    let record = bundle.join(SHARED_FILE);
    if let Ok(text) = std::fs::read_to_string(&record) {
        let _sharing = SHARING.lock().unwrap_or_else(|e| e.into_inner());
        for shared in text.lines().rev().filter(|l| !l.is_empty()) {
            let shared = Path::new(shared);
            detach_all(shared);
            let _ = std::fs::remove_dir(shared);
        }
        let _ = std::fs::remove_file(&record);
    }
    detach_all(&bundle.join("rootfs"));
}

/// Lazily unmounts what is stacked on `target` (and everything under it).
fn detach_all(target: &Path) {
    // Stacked mounts come off one at a time.
    for _ in 0..16 {
        if nix::mount::umount2(target, MntFlags::MNT_DETACH).is_err() {
            break;
        }
    }
}

/// The file in a bundle naming, a line each, where its rootfs and volumes are shared
/// with the sandbox process, so that whoever unmounts the rootfs (this shim, or
/// `delete` after it died) finds them.
const SHARED_FILE: &str = "wasmlet-shared-mounts";

/// Held while something is bound under, or removed from, a shared directory: a
/// directory is never removed while a bind is being made under it, and two tasks never
/// both bind it onto itself.
static SHARING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The directory under a shim's run directory through which the root filesystems and
/// volumes of its tasks reach its sandbox process.
///
/// The sandbox has a mount namespace of its own, a slave of this one, made when it
/// started: what is mounted later (the pod's next container's rootfs, a volume's
/// subPath bind) reaches it only through a mount with shared propagation, and a host's
/// mounts may all be private. So this directory is made a mount point of its own,
/// shared ([`make_shared`]) before the sandbox starts, and each task's rootfs and
/// bind-mounted directories are bound under it ([`share_task`]).
pub fn shared_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("rootfs")
}

/// Makes `dir` a mount point with shared propagation (bound onto itself if it is not a
/// mount point yet). Done again, it changes nothing.
pub fn make_shared(dir: &Path) -> anyhow::Result<()> {
    let _sharing = SHARING.lock().unwrap_or_else(|e| e.into_inner());
    make_shared_locked(dir)
}

fn make_shared_locked(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    if !is_mount_point(dir)? {
        nix::mount::mount(Some(dir), dir, None::<&str>, MsFlags::MS_BIND, None::<&str>)
            .with_context(|| format!("binding {} onto itself", dir.display()))?;
    }
    nix::mount::mount(
        None::<&str>,
        dir,
        None::<&str>,
        MsFlags::MS_SHARED,
        None::<&str>,
    )
    .with_context(|| format!("making {} shared", dir.display()))
}

/// Binds each of `sources` (a task's rootfs first, then the directories it mounts),
/// with what is mounted under it, at `<shared>/<id>`, `<shared>/<id>-1`, …; records
/// them in the bundle; and returns the paths the sandbox process reaches them by, in
/// order. On error what was bound is left for [`unmount_rootfs`].
pub fn share_task(
    bundle: &Path,
    shared: &Path,
    id: &str,
    sources: &[&Path],
) -> anyhow::Result<Vec<PathBuf>> {
    let _sharing = SHARING.lock().unwrap_or_else(|e| e.into_inner());
    make_shared_locked(shared)?;
    let targets: Vec<PathBuf> = (0..sources.len())
        .map(|i| match i {
            0 => shared.join(id),
            i => shared.join(format!("{id}-{i}")),
        })
        .collect();
    let record: Vec<_> = targets.iter().map(|t| t.to_string_lossy()).collect();
    std::fs::write(bundle.join(SHARED_FILE), record.join("\n"))
        .with_context(|| format!("recording the shared mounts in {}", bundle.display()))?;
    for (source, target) in sources.iter().zip(&targets) {
        std::fs::create_dir_all(target)
            .with_context(|| format!("creating {}", target.display()))?;
        nix::mount::mount(
            Some(*source),
            target,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .with_context(|| format!("binding {} on {}", source.display(), target.display()))?;
    }
    Ok(targets)
}

/// Unmounts the shared directory of `run_dir` and all under it, lazily, then removes
/// `run_dir` — unless something is still mounted under it, which would make the
/// removal delete inside a task's rootfs.
pub fn release_run_dir(run_dir: &Path) {
    let _sharing = SHARING.lock().unwrap_or_else(|e| e.into_inner());
    detach_all(&shared_dir(run_dir));
    match mounts_under(run_dir) {
        Ok(left) if left.is_empty() => {
            let _ = std::fs::remove_dir_all(run_dir);
        }
        Ok(left) => {
            tracing::warn!(dir = %run_dir.display(), ?left, "not removing the run directory: mounts are left under it")
        }
        Err(e) => {
            tracing::warn!(dir = %run_dir.display(), "not removing the run directory: {e:#}")
        }
    }
}

/// The run directory of the shim whose sandbox a bundle's task was shared with, from
/// its record ([`share_task`]): for `delete`, after that shim died.
pub fn recorded_run_dir(bundle: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string(bundle.join(SHARED_FILE)).ok()?;
    let first = Path::new(text.lines().next()?);
    Some(first.parent()?.parent()?.to_owned())
}

/// Whether `dir` is a mount point of this mount namespace.
fn is_mount_point(dir: &Path) -> anyhow::Result<bool> {
    Ok(mounts_under(dir)?.iter().any(|m| m == dir))
}

/// The mount points at or under `dir`.
fn mounts_under(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let points =
        wasmlet_runtime_wasm::mountinfo::mount_points().context("reading /proc/self/mountinfo")?;
    Ok(points.into_iter().filter(|p| p.starts_with(dir)).collect())
}

/// The flags and the filesystem data of a mount's options.
fn options(options: &[String]) -> (MsFlags, String) {
    let mut flags = MsFlags::empty();
    let mut data = Vec::new();
    for o in options {
        match o.as_str() {
            "ro" => flags |= MsFlags::MS_RDONLY,
            "rw" | "defaults" => {}
            "bind" => flags |= MsFlags::MS_BIND,
            "rbind" => flags |= MsFlags::MS_BIND | MsFlags::MS_REC,
            "nosuid" => flags |= MsFlags::MS_NOSUID,
            "nodev" => flags |= MsFlags::MS_NODEV,
            "noexec" => flags |= MsFlags::MS_NOEXEC,
            "noatime" => flags |= MsFlags::MS_NOATIME,
            "relatime" => flags |= MsFlags::MS_RELATIME,
            "private" | "rprivate" | "slave" | "rslave" | "shared" | "rshared" => {}
            other => data.push(other.to_owned()),
        }
    }
    (flags, data.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_split_into_flags_and_data() {
        let o = |v: &[&str]| options(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let (flags, data) = o(&["index=off", "workdir=/w", "upperdir=/u", "lowerdir=/a:/b"]);
        assert!(flags.is_empty());
        assert_eq!(data, "index=off,workdir=/w,upperdir=/u,lowerdir=/a:/b");
        let (flags, data) = o(&["rbind", "ro", "rprivate"]);
        assert_eq!(
            flags,
            MsFlags::MS_BIND | MsFlags::MS_REC | MsFlags::MS_RDONLY
        );
        assert_eq!(data, "");
    }
}
