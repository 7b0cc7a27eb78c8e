//! The task's rootfs: the snapshot mounts containerd hands over in `Create`, mounted
//! in order on `<bundle>/rootfs` (overlay from the overlayfs snapshotter, binds from
//! the native one), and unmounted at `Delete` or by `delete` after a dead shim.

use std::path::Path;

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
/// its view, the bundle is free.
pub fn unmount_rootfs(bundle: &Path) {
    let target = bundle.join("rootfs");
    // Stacked mounts come off one at a time.
    for _ in 0..16 {
        if nix::mount::umount2(&target, MntFlags::MNT_DETACH).is_err() {
            break;
        }
    }
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
