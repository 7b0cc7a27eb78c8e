//! Pod volumes the node provides itself: `emptyDir` (on disk, or `medium: Memory` as a
//! tmpfs) and `hostPath` with the kubelet's type checks. A volume lives in
//! `<root>/pods/<uid>/volumes/<plugin>/<name>`, as the kubelet lays it out, and is set
//! up before the sandbox; a container's `volumeMounts` become runtime mounts (for a
//! Wasm guest, preopened directories). Any other volume type is refused with a
//! `FailedMount` message rather than run without it.

use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, Pod, Volume};

use crate::quantity;

/// The kubelet's directory name of the emptyDir plugin.
pub const EMPTY_DIR: &str = "kubernetes.io~empty-dir";

/// Where the volumes of the pod whose directory is `pod_dir` live.
pub fn volumes_dir(pod_dir: &Path) -> PathBuf {
    pod_dir.join("volumes")
}

/// A volume set up on the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostVolume {
    pub path: PathBuf,
    pub is_dir: bool,
}

/// Sets up every volume of `pod` under `pod_dir` (idempotent) and says where each is.
/// `memory_limit` caps a `medium: Memory` emptyDir without a `sizeLimit` (the pod's
/// memory limit, else the node's allocatable memory, as the kubelet sizes it).
pub fn set_up(
    pod: &Pod,
    pod_dir: &Path,
    memory_limit: Option<u64>,
) -> Result<Vec<(String, HostVolume)>, String> {
    let mut out = Vec::new();
    for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        let host = set_up_one(v, pod_dir, memory_limit)
            .map_err(|e| format!("MountVolume.SetUp failed for volume {:?} : {e}", v.name))?;
        out.push((v.name.clone(), host));
    }
    Ok(out)
}

fn set_up_one(v: &Volume, pod_dir: &Path, memory_limit: Option<u64>) -> Result<HostVolume, String> {
    if let Some(empty) = &v.empty_dir {
        let path = volumes_dir(pod_dir).join(EMPTY_DIR).join(&v.name);
        create_dir(&path, 0o777)?;
        let size_limit = empty
            .size_limit
            .as_ref()
            .map(quantity::bytes)
            .transpose()
            .map_err(|e| format!("sizeLimit: {e}"))?;
        match empty.medium.as_deref().unwrap_or("") {
            "" => {}
            "Memory" => {
                let size = match (size_limit, memory_limit) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                mount_tmpfs(&path, size)?;
            }
            other => return Err(format!("emptyDir medium {other:?} is not supported")),
        }
        return Ok(HostVolume { path, is_dir: true });
    }
    if let Some(hp) = &v.host_path {
        return host_path(Path::new(&hp.path), hp.type_.as_deref().unwrap_or(""));
    }
    let kind = serde_json::to_value(v)
        .ok()
        .and_then(|j| {
            j.as_object()?
                .keys()
                .find(|k| k.as_str() != "name")
                .cloned()
        })
        .unwrap_or_else(|| "(none)".into());
    Err(format!(
        "volume type {kind} is not supported by this node yet (emptyDir and hostPath are)"
    ))
}

fn create_dir(path: &Path, mode: u32) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt as _;
    if path.is_dir() {
        return Ok(());
    }
    std::fs::create_dir_all(path).map_err(|e| format!("creating {}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("chmod {}: {e}", path.display()))
}

/// A hostPath volume, checked against its `type` as the kubelet does.
fn host_path(path: &Path, kind: &str) -> Result<HostVolume, String> {
    use std::os::unix::fs::FileTypeExt as _;
    if !path.is_absolute() {
        return Err(format!("hostPath {} is not absolute", path.display()));
    }
    let meta = || std::fs::metadata(path);
    let fail = |what: &str| {
        Err(format!(
            "hostPath type check failed: {} is not {what}",
            path.display()
        ))
    };
    match kind {
        "" => {}
        "DirectoryOrCreate" => create_dir(path, 0o755)?,
        "FileOrCreate" if !path.exists() => {
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .map_err(|e| format!("creating {}: {e}", path.display()))?;
        }
        "FileOrCreate" | "File" => {
            if !meta().is_ok_and(|m| m.is_file()) {
                return fail("a file");
            }
        }
        "Directory" => {
            if !meta().is_ok_and(|m| m.is_dir()) {
                return fail("a directory");
            }
        }
        "Socket" => {
            if !meta().is_ok_and(|m| m.file_type().is_socket()) {
                return fail("a socket file");
            }
        }
        "CharDevice" => {
            if !meta().is_ok_and(|m| m.file_type().is_char_device()) {
                return fail("a character device");
            }
        }
        "BlockDevice" => {
            if !meta().is_ok_and(|m| m.file_type().is_block_device()) {
                return fail("a block device");
            }
        }
        other => return Err(format!("hostPath type {other:?} is not valid")),
    }
    Ok(HostVolume {
        path: path.to_owned(),
        // An untyped path that does not exist yet is a directory once a runtime makes it.
        is_dir: meta().map(|m| m.is_dir()).unwrap_or(true),
    })
}

fn is_mount_point(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let (Ok(me), Some(Ok(parent))) = (
        std::fs::metadata(path),
        path.parent().map(std::fs::metadata),
    ) else {
        return false;
    };
    me.dev() != parent.dev()
}

fn mount_tmpfs(path: &Path, size: Option<u64>) -> Result<(), String> {
    if is_mount_point(path) {
        return Ok(());
    }
    let mut options = "mode=0777".to_owned();
    if let Some(size) = size {
        options.push_str(&format!(",size={size}"));
    }
    nix::mount::mount(
        Some("tmpfs"),
        path,
        Some("tmpfs"),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
        Some(options.as_str()),
    )
    .map_err(|e| format!("mounting a tmpfs at {}: {e}", path.display()))
}

/// Unmounts what [`set_up`] mounted for the pod whose directory is `pod_dir`, so the
/// directory can be removed.
pub fn tear_down(pod_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(volumes_dir(pod_dir).join(EMPTY_DIR)) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if is_mount_point(&path)
            && let Err(e) = nix::mount::umount2(&path, nix::mount::MntFlags::MNT_DETACH)
        {
            tracing::warn!("unmounting {}: {e}", path.display());
        }
    }
}

/// The runtime mounts of `c`'s `volumeMounts`. `expand` expands `subPathExpr` with the
/// container's environment. For a Wasm guest (`wasm`) every mount must be a
/// directory: WASI preopens directories only.
pub fn container_mounts(
    c: &Container,
    volumes: &[(String, HostVolume)],
    expand: &dyn Fn(&str) -> String,
    wasm: bool,
) -> Result<Vec<wasmlet_runtime::Mount>, String> {
    let mut out = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let Some((_, vol)) = volumes.iter().find(|(n, _)| *n == m.name) else {
            return Err(format!(
                "volumeMount {:?}: the pod has no volume of that name",
                m.name
            ));
        };
        let sub = match (m.sub_path.as_deref(), m.sub_path_expr.as_deref()) {
            (Some(p), _) if !p.is_empty() => p.to_owned(),
            (_, Some(e)) if !e.is_empty() => expand(e),
            _ => String::new(),
        };
        let mut host_path = vol.path.clone();
        let mut is_dir = vol.is_dir;
        if !sub.is_empty() {
            let rel = Path::new(&sub);
            if rel.is_absolute() || rel.components().any(|c| !matches!(c, Component::Normal(_))) {
                return Err(format!(
                    "volumeMount {:?}: subPath {sub:?} must be a relative path within the volume",
                    m.name
                ));
            }
            host_path = host_path.join(rel);
            // As the kubelet: a missing subPath is created as a directory.
            if !host_path.exists() {
                create_dir(&host_path, 0o777)?;
            }
            // It must still be inside the volume once symlinks are followed.
            let inside = std::fs::canonicalize(&host_path)
                .ok()
                .zip(std::fs::canonicalize(&vol.path).ok())
                .is_some_and(|(p, root)| p.starts_with(root));
            if !inside {
                return Err(format!(
                    "volumeMount {:?}: subPath {sub:?} leads outside the volume",
                    m.name
                ));
            }
            is_dir = host_path.is_dir();
        }
        if wasm && !is_dir {
            return Err(format!(
                "volumeMount {:?}: {} is not a directory; a Wasm container can mount directories only (WASI preopens)",
                m.name,
                host_path.display()
            ));
        }
        out.push(wasmlet_runtime::Mount {
            container_path: m.mount_path.clone(),
            host_path,
            readonly: m.read_only.unwrap_or(false),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(volumes: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"containers": [], "volumes": volumes},
        }))
        .unwrap()
    }

    fn container(mounts: serde_json::Value) -> Container {
        serde_json::from_value(serde_json::json!({"name": "c", "volumeMounts": mounts})).unwrap()
    }

    #[test]
    fn empty_dirs_are_made_in_the_kubelets_layout_and_mounted_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let p = pod(serde_json::json!([{"name": "data", "emptyDir": {}}]));
        let vols = set_up(&p, dir.path(), None).unwrap();
        let path = dir.path().join("volumes/kubernetes.io~empty-dir/data");
        assert_eq!(
            vols,
            [(
                "data".to_owned(),
                HostVolume {
                    path: path.clone(),
                    is_dir: true
                }
            )]
        );
        assert!(path.is_dir());
        // Idempotent.
        assert_eq!(set_up(&p, dir.path(), None).unwrap(), vols);

        let c = container(serde_json::json!([
            {"name": "data", "mountPath": "/opt"},
            {"name": "data", "mountPath": "/cfg", "subPath": "conf/d", "readOnly": true},
            {"name": "data", "mountPath": "/mine", "subPathExpr": "$(POD)"},
        ]));
        let expand = |s: &str| s.replace("$(POD)", "p");
        let mounts = container_mounts(&c, &vols, &expand, true).unwrap();
        assert_eq!(mounts.len(), 3);
        assert_eq!(
            (mounts[0].container_path.as_str(), mounts[0].readonly),
            ("/opt", false)
        );
        assert_eq!(mounts[0].host_path, path);
        assert_eq!(mounts[1].host_path, path.join("conf/d"));
        assert!(mounts[1].readonly && path.join("conf/d").is_dir());
        assert_eq!(mounts[2].host_path, path.join("p"));
    }

    #[test]
    fn bad_volumes_and_mounts_are_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let err = |v: serde_json::Value| set_up(&pod(v), dir.path(), None).unwrap_err();
        let e = err(serde_json::json!([{"name": "cfg", "configMap": {"name": "x"}}]));
        assert!(
            e.contains("\"cfg\"") && e.contains("configMap is not supported"),
            "{e}"
        );
        let missing = dir.path().join("nope");
        let e = err(
            serde_json::json!([{"name": "h", "hostPath": {"path": missing, "type": "Directory"}}]),
        );
        assert!(e.contains("is not a directory"), "{e}");
        let e = err(
            serde_json::json!([{"name": "h", "hostPath": {"path": dir.path(), "type": "File"}}]),
        );
        assert!(e.contains("is not a file"), "{e}");

        let vols = set_up(
            &pod(serde_json::json!([
                {"name": "data", "emptyDir": {}},
                {"name": "made", "hostPath": {"path": dir.path().join("made"), "type": "DirectoryOrCreate"}},
                {"name": "file", "hostPath": {"path": dir.path().join("f"), "type": "FileOrCreate"}},
            ])),
            dir.path(),
            None,
        )
        .unwrap();
        assert!(dir.path().join("made").is_dir() && dir.path().join("f").is_file());
        let none = |_: &str| String::new();
        let mounts =
            |m: serde_json::Value, wasm| container_mounts(&container(m), &vols, &none, wasm);
        let e = mounts(
            serde_json::json!([{"name": "other", "mountPath": "/x"}]),
            false,
        )
        .unwrap_err();
        assert!(e.contains("no volume of that name"), "{e}");
        for sub in ["../escape", "/abs", "a/../../b"] {
            let e = mounts(
                serde_json::json!([{"name": "data", "mountPath": "/x", "subPath": sub}]),
                false,
            )
            .unwrap_err();
            assert!(e.contains("relative path within the volume"), "{sub}: {e}");
        }
        std::os::unix::fs::symlink("/etc", vols[0].1.path.join("link")).unwrap();
        let e = mounts(
            serde_json::json!([{"name": "data", "mountPath": "/x", "subPath": "link"}]),
            false,
        )
        .unwrap_err();
        assert!(e.contains("outside the volume"), "{e}");
        // A file is fine for a container, not for a Wasm guest.
        let file = serde_json::json!([{"name": "file", "mountPath": "/etc/f"}]);
        assert!(mounts(file.clone(), false).is_ok());
        let e = mounts(file, true).unwrap_err();
        assert!(e.contains("WASI preopens"), "{e}");
    }

    #[test]
    fn a_memory_empty_dir_is_a_sized_tmpfs_until_torn_down() {
        let dir = tempfile::tempdir().unwrap();
        let p = pod(serde_json::json!([
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Mi"}},
        ]));
        /// Unmounts even when an assertion fails.
        struct TearDown<'a>(&'a Path);
        impl Drop for TearDown<'_> {
            fn drop(&mut self) {
                tear_down(self.0);
            }
        }
        let _guard = TearDown(dir.path());
        let vols = set_up(&p, dir.path(), Some(64 << 20)).unwrap();
        let path = &vols[0].1.path;
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let line = mounts
            .lines()
            .find(|l| l.split(' ').nth(4) == Some(path.to_str().unwrap()))
            .unwrap_or_else(|| panic!("{} is not mounted", path.display()));
        assert!(
            line.contains(" - tmpfs ") && line.contains("size=8192k"),
            "{line}"
        );
        // Set up again: not mounted twice.
        set_up(&p, dir.path(), Some(64 << 20)).unwrap();
        let count = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|l| l.split(' ').nth(4) == Some(path.to_str().unwrap()))
            .count();
        assert_eq!(count, 1);
        tear_down(dir.path());
        assert!(!is_mount_point(path));
    }
}
