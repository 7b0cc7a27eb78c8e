//! Pod volumes the node provides itself: `emptyDir` (on disk, or `medium: Memory` as a
//! tmpfs), `hostPath` with the kubelet's type checks, and the volumes whose files the
//! node writes ([`content`]: configMap, secret, downwardAPI, projected with service
//! account tokens). A volume lives in `<root>/pods/<uid>/volumes/<plugin>/<name>`, as
//! the kubelet lays it out, and is set up once, before the sandbox; a container's
//! `volumeMounts` become runtime mounts (for a Wasm guest, preopened directories). Any
//! other volume type is refused with a `FailedMount` message rather than run without
//! it.

pub mod content;
pub mod csi;

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, Pod, Volume};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::env::ObjectSource;
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
    /// A volume whose files the node writes ([`content`]): rewritten by [`refresh`].
    pub content: bool,
    /// When its service account token should be requested again.
    pub renew_token_at: Option<jiff::Timestamp>,
    /// Mounted read-only for every container (a `readOnly` claim or CSI volume).
    pub read_only: bool,
    /// A raw block device (`volumeMode: Block`), given to containers through
    /// `volumeDevices` rather than mounted.
    pub block: bool,
}

/// What the volumes are set up with besides the pod.
pub struct SetUpContext<'a> {
    /// Caps a `medium: Memory` emptyDir without a `sizeLimit` (the pod's memory limit,
    /// else the node's allocatable memory, as the kubelet sizes it).
    pub memory_limit: Option<u64>,
    pub objects: &'a dyn ObjectSource,
    pub allocatable: &'a BTreeMap<String, Quantity>,
    /// Stages and publishes CSI volumes; `None` refuses them.
    pub csi: Option<&'a csi::CsiVolumes>,
}

/// Sets up the volumes of `pod` under `pod_dir` that are not in `done` yet (a volume
/// is set up, and its type checked, once, as the kubelet's volume manager mounts it
/// once) and says where each is.
pub async fn set_up(
    pod: &Pod,
    pod_dir: &Path,
    done: &[(String, HostVolume)],
    ctx: &SetUpContext<'_>,
) -> Result<Vec<(String, HostVolume)>, String> {
    let mut out = Vec::new();
    for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        if let Some(existing) = done.iter().find(|(n, _)| *n == v.name) {
            out.push(existing.clone());
            continue;
        }
        let host = if csi::volumes::is_csi(v) {
            // Its errors are the kubelet's whole event text already.
            let Some(csi) = ctx.csi else {
                return Err(format!(
                    "MountVolume.SetUp failed for volume {:?} : this node has no CSI volume support configured",
                    v.name
                ));
            };
            csi.set_up(pod, v, pod_dir, ctx.objects).await?
        } else {
            set_up_one(pod, v, pod_dir, ctx)
                .await
                .map_err(|e| format!("MountVolume.SetUp failed for volume {:?} : {e}", v.name))?
        };
        out.push((v.name.clone(), host));
    }
    Ok(out)
}

/// Rewrites the content volumes from their ConfigMaps, Secrets and pod metadata (the
/// kubelet refreshes them on pod syncs), requesting a new service account token once
/// the old one reached 80 % of its life. A failure keeps the files as they were.
pub async fn refresh(
    pod: &Pod,
    volumes: &mut [(String, HostVolume)],
    ctx: &SetUpContext<'_>,
) -> Result<(), String> {
    let now = jiff::Timestamp::now();
    for (name, host) in volumes.iter_mut().filter(|(_, h)| h.content) {
        let Some(v) = pod
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .find(|v| v.name == *name)
        else {
            continue;
        };
        // A token is requested again only when due; otherwise the file is kept.
        let token_due = host.renew_token_at.is_none_or(|at| now >= at);
        if v.projected.is_some() && !token_due {
            continue;
        }
        let rendered = content::render(pod, v, ctx.objects, ctx.allocatable)
            .await
            .map_err(|e| format!("refreshing volume {name:?}: {e}"))?;
        content::write_atomically(&host.path, &rendered.payload)
            .map_err(|e| format!("refreshing volume {name:?}: {e}"))?;
        host.renew_token_at = rendered.refresh_token_at;
    }
    Ok(())
}

async fn set_up_one(
    pod: &Pod,
    v: &Volume,
    pod_dir: &Path,
    ctx: &SetUpContext<'_>,
) -> Result<HostVolume, String> {
    if let Some(plugin) = content::plugin_dir(v) {
        let path = volumes_dir(pod_dir).join(plugin).join(&v.name);
        create_dir(&path, 0o755)?;
        if content::is_secret(v) {
            // Secrets never reach the node's disk.
            mount_tmpfs(&path, None, 0o755)?;
        }
        let rendered = content::render(pod, v, ctx.objects, ctx.allocatable).await?;
        content::write_atomically(&path, &rendered.payload)?;
        return Ok(HostVolume {
            path,
            is_dir: true,
            content: true,
            renew_token_at: rendered.refresh_token_at,
            read_only: false,
            block: false,
        });
    }
    let memory_limit = ctx.memory_limit;
    if let Some(empty) = &v.empty_dir {
        let path = volumes_dir(pod_dir).join(EMPTY_DIR).join(&v.name);
        create_dir(&path, 0o777)?;
        let size_limit = empty
            .size_limit
            .as_ref()
            .map(quantity::bytes)
            .transpose()
            .map_err(|e| format!("sizeLimit: {e}"))?
            // A zero limit is no limit, as the kubelet reads it.
            .filter(|b| *b > 0);
        match empty.medium.as_deref().unwrap_or("") {
            "" => {}
            "Memory" => {
                let size = match (size_limit, memory_limit) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                mount_tmpfs(&path, size, 0o777)?;
            }
            other => return Err(format!("emptyDir medium {other:?} is not supported")),
        }
        return Ok(HostVolume {
            path,
            is_dir: true,
            content: false,
            renew_token_at: None,
            read_only: false,
            block: false,
        });
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
        "volume type {kind} is not supported by this node yet (emptyDir, hostPath, configMap, secret, downwardAPI, projected, persistentVolumeClaim, ephemeral and csi are)"
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
            use std::os::unix::fs::OpenOptionsExt as _;
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o644)
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
        content: false,
        renew_token_at: None,
        read_only: false,
        block: false,
    })
}

/// Every mount point of this mount namespace (`/proc/self/mountinfo`, octal escapes
/// undone); none when the table cannot be read.
pub fn mount_points() -> Vec<PathBuf> {
    wasmlet_runtime_wasm::mountinfo::mount_points().unwrap_or_default()
}

/// Removes a pod's directory unless something is still mounted under it (a volume
/// whose teardown failed): removing through a mount would delete the volume's data.
pub fn remove_pod_dir(pod_dir: &Path) -> bool {
    let canonical = std::fs::canonicalize(pod_dir).unwrap_or_else(|_| pod_dir.to_owned());
    if let Some(m) = mount_points().iter().find(|m| m.starts_with(&canonical)) {
        tracing::warn!(
            dir = %pod_dir.display(),
            "not removing the directory of a pod: {} is still mounted",
            m.display()
        );
        return false;
    }
    match std::fs::remove_dir_all(pod_dir) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => {
            tracing::warn!("removing {}: {e}", pod_dir.display());
            false
        }
    }
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

fn mount_tmpfs(path: &Path, size: Option<u64>, mode: u32) -> Result<(), String> {
    if is_mount_point(path) {
        return Ok(());
    }
    let mut options = format!("mode={mode:04o}");
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

/// Unmounts what [`set_up`] mounted (tmpfs of Memory emptyDirs, secret and projected
/// volumes) for the pod whose directory is `pod_dir`, so the directory can be removed.
pub fn tear_down(pod_dir: &Path) {
    let Ok(plugins) = std::fs::read_dir(volumes_dir(pod_dir)) else {
        return;
    };
    for plugin in plugins.flatten() {
        // CSI volumes are unmounted by their drivers (`csi::CsiVolumes::tear_down`).
        if plugin.file_name() == csi::volumes::PLUGIN_DIR {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(plugin.path()) else {
            continue;
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
}

/// Creates `rel` inside the volume at `root` one component at a time, refusing any
/// existing component that leads outside the volume (a symlink planted by a
/// container), before anything is created. New directories take the root's mode.
fn make_sub_dir(root: &Path, rel: &Path) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt as _;
    let canonical_root =
        std::fs::canonicalize(root).map_err(|e| format!("{}: {e}", root.display()))?;
    let mode = std::fs::metadata(&canonical_root)
        .map(|m| m.permissions().mode() & 0o7777)
        .unwrap_or(0o755);
    let mut cur = canonical_root.clone();
    for part in rel.components() {
        let Component::Normal(part) = part else {
            continue;
        };
        let next = cur.join(part);
        match std::fs::symlink_metadata(&next) {
            Ok(_) => {
                let resolved =
                    std::fs::canonicalize(&next).map_err(|e| format!("{}: {e}", next.display()))?;
                if !resolved.starts_with(&canonical_root) {
                    return Err("leads outside the volume".into());
                }
                cur = resolved;
            }
            Err(_) => {
                std::fs::create_dir(&next)
                    .map_err(|e| format!("creating {}: {e}", next.display()))?;
                std::fs::set_permissions(&next, std::fs::Permissions::from_mode(mode))
                    .map_err(|e| format!("chmod {}: {e}", next.display()))?;
                cur = next;
            }
        }
    }
    Ok(cur)
}

/// The device files of `c`'s `volumeDevices` (raw block volumes), read-write; a Wasm
/// guest (`directories_only`) can have none.
pub fn container_devices(
    c: &Container,
    volumes: &[(String, HostVolume)],
    directories_only: bool,
) -> Result<Vec<wasmlet_runtime::Device>, String> {
    let mut out = Vec::new();
    for d in c.volume_devices.iter().flatten() {
        if directories_only {
            return Err(format!(
                "volumeDevice {:?}: a Wasm container cannot have block devices (WASI has no device files)",
                d.name
            ));
        }
        let Some((_, vol)) = volumes.iter().find(|(n, _)| *n == d.name) else {
            return Err(format!(
                "volumeDevice {:?}: the pod has no volume of that name",
                d.name
            ));
        };
        if !vol.block {
            return Err(format!(
                "volumeDevice {:?}: the volume has volumeMode Filesystem; a container mounts it through volumeMounts",
                d.name
            ));
        }
        out.push(wasmlet_runtime::Device {
            container_path: d.device_path.clone(),
            host_path: vol.path.clone(),
            permissions: if vol.read_only { "r" } else { "mrw" }.into(),
        });
    }
    Ok(out)
}

/// The runtime mounts of `c`'s `volumeMounts`. `expand` expands `subPathExpr` with the
/// container's environment (an error for a variable that is missing or empty, as the
/// kubelet). With `directories_only` (a Wasm guest: WASI preopens directories only)
/// every mount must be a directory.
pub fn container_mounts(
    c: &Container,
    volumes: &[(String, HostVolume)],
    expand: &dyn Fn(&str) -> Result<String, String>,
    directories_only: bool,
) -> Result<Vec<wasmlet_runtime::Mount>, String> {
    let mut out = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let Some((_, vol)) = volumes.iter().find(|(n, _)| *n == m.name) else {
            return Err(format!(
                "volumeMount {:?}: the pod has no volume of that name",
                m.name
            ));
        };
        if vol.block {
            return Err(format!(
                "volumeMount {:?}: the volume has volumeMode Block; a container takes it through volumeDevices",
                m.name
            ));
        }
        let sub = match (m.sub_path.as_deref(), m.sub_path_expr.as_deref()) {
            (Some(p), _) if !p.is_empty() => p.to_owned(),
            (_, Some(e)) if !e.is_empty() => {
                let sub = expand(e).map_err(|e| format!("volumeMount {:?}: {e}", m.name))?;
                if sub.is_empty() {
                    return Err(format!(
                        "volumeMount {:?}: subPathExpr {e:?} expands to nothing",
                        m.name
                    ));
                }
                sub
            }
            _ => String::new(),
        };
        let mut host_path = vol.path.clone();
        let mut is_dir = vol.is_dir;
        if !sub.is_empty() {
            let rel = Path::new(&sub);
            if rel.is_absolute()
                || rel
                    .components()
                    .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
            {
                return Err(format!(
                    "volumeMount {:?}: subPath {sub:?} must be a relative path within the volume",
                    m.name
                ));
            }
            // As the kubelet: a missing subPath is created as a directory — never
            // through a symlink that leads out of the volume.
            host_path = make_sub_dir(&vol.path, rel)
                .map_err(|e| format!("volumeMount {:?}: subPath {sub:?}: {e}", m.name))?;
            is_dir = host_path.is_dir();
        }
        if directories_only && !is_dir {
            return Err(format!(
                "volumeMount {:?}: {} is not a directory; a Wasm container can mount directories only (WASI preopens)",
                m.name,
                host_path.display()
            ));
        }
        out.push(wasmlet_runtime::Mount {
            container_path: m.mount_path.clone(),
            host_path,
            readonly: m.read_only.unwrap_or(false) || vol.read_only,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};

    use super::*;

    fn pod(volumes: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"containers": [], "volumes": volumes, "serviceAccountName": "robot"},
        }))
        .unwrap()
    }

    fn container(mounts: serde_json::Value) -> Container {
        serde_json::from_value(serde_json::json!({"name": "c", "volumeMounts": mounts})).unwrap()
    }

    /// ConfigMaps, Secrets and tokens as an API server would give them; counts token
    /// requests.
    #[derive(Default)]
    struct Objects {
        tokens: Mutex<u32>,
        color: Mutex<String>,
    }

    #[async_trait::async_trait]
    impl ObjectSource for Objects {
        async fn config_map(&self, _: &str, name: &str) -> Result<Option<ConfigMap>, String> {
            let color = self.color.lock().unwrap().clone();
            Ok((name == "cfg").then(|| {
                serde_json::from_value(serde_json::json!({"data": {"color": color}})).unwrap()
            }))
        }
        async fn secret(&self, _: &str, name: &str) -> Result<Option<Secret>, String> {
            Ok((name == "creds").then(|| {
                serde_json::from_value(serde_json::json!({"data": {"password": "czNjcmV0"}}))
                    .unwrap()
            }))
        }
        async fn services(&self) -> Result<std::sync::Arc<[Service]>, String> {
            Ok(std::sync::Arc::from([]))
        }
        async fn service_account_token(
            &self,
            pod: &Pod,
            audiences: Vec<String>,
            expiration_seconds: i64,
        ) -> Result<(String, jiff::Timestamp), String> {
            let mut n = self.tokens.lock().unwrap();
            *n += 1;
            let account = pod
                .spec
                .as_ref()
                .unwrap()
                .service_account_name
                .clone()
                .unwrap();
            let expires = jiff::Timestamp::now()
                .checked_add(jiff::SignedDuration::from_secs(expiration_seconds))
                .unwrap();
            Ok((format!("token-{n}-{account}-{audiences:?}"), expires))
        }
    }

    async fn set_up_new(
        p: &Pod,
        dir: &Path,
        memory_limit: Option<u64>,
        objects: &Objects,
    ) -> Result<Vec<(String, HostVolume)>, String> {
        let allocatable = BTreeMap::new();
        let ctx = SetUpContext {
            memory_limit,
            objects,
            allocatable: &allocatable,
            csi: None,
        };
        set_up(p, dir, &[], &ctx).await
    }

    /// Unmounts even when an assertion fails.
    struct TearDown<'a>(&'a Path);
    impl Drop for TearDown<'_> {
        fn drop(&mut self) {
            tear_down(self.0);
        }
    }

    fn mounted(path: &Path) -> Option<String> {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .find(|l| l.split(' ').nth(4) == Some(path.to_str().unwrap()))
            .map(str::to_owned)
    }

    #[tokio::test]
    async fn empty_dirs_are_made_in_the_kubelets_layout_and_mounted_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let objects = Objects::default();
        let p = pod(serde_json::json!([{"name": "data", "emptyDir": {}}]));
        let vols = set_up_new(&p, dir.path(), None, &objects).await.unwrap();
        let path = dir.path().join("volumes/kubernetes.io~empty-dir/data");
        assert_eq!(vols.len(), 1);
        assert_eq!((vols[0].0.as_str(), &vols[0].1.path), ("data", &path));
        assert!(path.is_dir());
        // Idempotent.
        assert_eq!(
            set_up_new(&p, dir.path(), None, &objects).await.unwrap(),
            vols
        );

        let c = container(serde_json::json!([
            {"name": "data", "mountPath": "/opt"},
            {"name": "data", "mountPath": "/cfg", "subPath": "./conf/d", "readOnly": true},
            {"name": "data", "mountPath": "/mine", "subPathExpr": "$(POD)"},
        ]));
        let expand = |s: &str| Ok(s.replace("$(POD)", "p"));
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
        // A variable that is missing (or empty) is an error, not the whole volume.
        let missing = |_: &str| Err("missing value for POD".to_owned());
        let c = container(
            serde_json::json!([{"name": "data", "mountPath": "/m", "subPathExpr": "$(POD)"}]),
        );
        assert!(
            container_mounts(&c, &vols, &missing, true)
                .unwrap_err()
                .contains("missing value")
        );
        let empty = |_: &str| Ok(String::new());
        assert!(
            container_mounts(&c, &vols, &empty, true)
                .unwrap_err()
                .contains("expands to nothing")
        );
    }

    #[tokio::test]
    async fn bad_volumes_and_mounts_are_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let objects = Objects::default();
        let e = set_up_new(
            &pod(serde_json::json!([{"name": "disk", "awsElasticBlockStore": {"volumeID": "x"}}])),
            dir.path(),
            None,
            &objects,
        )
        .await
        .unwrap_err();
        assert!(
            e.contains("\"disk\"") && e.contains("awsElasticBlockStore is not supported"),
            "{e}"
        );
        let missing = dir.path().join("nope");
        let e = set_up_new(&pod(serde_json::json!([{"name": "h", "hostPath": {"path": missing, "type": "Directory"}}])), dir.path(), None, &objects)
            .await
            .unwrap_err();
        assert!(e.contains("is not a directory"), "{e}");
        let e = set_up_new(&pod(serde_json::json!([{"name": "h", "hostPath": {"path": dir.path(), "type": "File"}}])), dir.path(), None, &objects)
            .await
            .unwrap_err();
        assert!(e.contains("is not a file"), "{e}");
        let e = set_up_new(
            &pod(serde_json::json!([{"name": "c", "configMap": {"name": "gone"}}])),
            dir.path(),
            None,
            &objects,
        )
        .await
        .unwrap_err();
        assert!(e.contains("configmap \"gone\" not found"), "{e}");

        let vols = set_up_new(
            &pod(serde_json::json!([
                {"name": "data", "emptyDir": {}},
                {"name": "made", "hostPath": {"path": dir.path().join("made"), "type": "DirectoryOrCreate"}},
                {"name": "file", "hostPath": {"path": dir.path().join("f"), "type": "FileOrCreate"}},
            ])),
            dir.path(),
            None,
            &objects,
        )
        .await
        .unwrap();
        assert!(dir.path().join("made").is_dir() && dir.path().join("f").is_file());
        let none = |_: &str| Ok(String::new());
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
        // A symlink a container planted is not followed out of the volume, and nothing
        // is created outside it.
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), vols[0].1.path.join("link")).unwrap();
        for sub in ["link", "link/x"] {
            let e = mounts(
                serde_json::json!([{"name": "data", "mountPath": "/x", "subPath": sub}]),
                false,
            )
            .unwrap_err();
            assert!(e.contains("outside the volume"), "{e}");
        }
        assert!(
            !outside.path().join("x").exists(),
            "nothing made through the link"
        );
        // A file is fine for a container, not for a Wasm guest.
        let file = serde_json::json!([{"name": "file", "mountPath": "/etc/f"}]);
        assert!(mounts(file.clone(), false).is_ok());
        let e = mounts(file, true).unwrap_err();
        assert!(e.contains("WASI preopens"), "{e}");
    }

    #[tokio::test]
    async fn a_memory_empty_dir_is_a_sized_tmpfs_until_torn_down() {
        let dir = tempfile::tempdir().unwrap();
        let objects = Objects::default();
        let p = pod(serde_json::json!([
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Mi"}},
            {"name": "unlimited", "emptyDir": {"medium": "Memory", "sizeLimit": "0"}},
        ]));
        let _guard = TearDown(dir.path());
        let vols = set_up_new(&p, dir.path(), Some(64 << 20), &objects)
            .await
            .unwrap();
        let line = mounted(&vols[0].1.path).expect("mounted");
        assert!(
            line.contains(" - tmpfs ") && line.contains("size=8192k"),
            "{line}"
        );
        // A zero sizeLimit is no limit: the pod's memory limit sizes it.
        let line = mounted(&vols[1].1.path).expect("mounted");
        assert!(line.contains("size=65536k"), "{line}");
        // Set up again: not mounted twice.
        set_up_new(&p, dir.path(), Some(64 << 20), &objects)
            .await
            .unwrap();
        let count = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|l| l.split(' ').nth(4) == Some(vols[0].1.path.to_str().unwrap()))
            .count();
        assert_eq!(count, 1);
        tear_down(dir.path());
        assert!(!is_mount_point(&vols[0].1.path));
    }

    #[tokio::test]
    async fn the_kube_api_access_volume_is_projected_on_a_tmpfs_and_refreshed() {
        let dir = tempfile::tempdir().unwrap();
        let objects = Objects::default();
        *objects.color.lock().unwrap() = "blue".into();
        let p = pod(serde_json::json!([
            {"name": "kube-api-access-x1", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "cfg", "items": [{"key": "color", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
            ]}},
            {"name": "conf", "configMap": {"name": "cfg"}},
            {"name": "creds", "secret": {"secretName": "creds", "defaultMode": 256}},
        ]));
        let _guard = TearDown(dir.path());
        let mut vols = set_up_new(&p, dir.path(), None, &objects).await.unwrap();
        let projected = &vols[0].1.path;
        assert!(projected.ends_with("volumes/kubernetes.io~projected/kube-api-access-x1"));
        let read = |p: &Path, f: &str| std::fs::read_to_string(p.join(f)).unwrap();
        assert_eq!(read(projected, "token"), "token-1-robot-[]");
        assert_eq!(read(projected, "ca.crt"), "blue");
        assert_eq!(read(projected, "namespace"), "ns");
        assert!(
            mounted(projected).is_some_and(|l| l.contains(" - tmpfs ")),
            "secrets stay in memory"
        );
        assert_eq!(read(&vols[1].1.path, "color"), "blue");
        assert!(mounted(&vols[1].1.path).is_none(), "a configMap is on disk");
        assert_eq!(read(&vols[2].1.path, "password"), "s3cret");
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(vols[2].1.path.join("password"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o400);
        }
        let renew = vols[0].1.renew_token_at.expect("a token renewal time");
        let life = renew.duration_since(jiff::Timestamp::now()).as_secs();
        assert!((2800..=2890).contains(&life), "80 % of 3607 s: {life}");

        // A refresh rewrites the ConfigMap's files; the token is not requested again
        // before it is due.
        *objects.color.lock().unwrap() = "green".into();
        let allocatable = BTreeMap::new();
        let ctx = SetUpContext {
            memory_limit: None,
            objects: &objects,
            allocatable: &allocatable,
            csi: None,
        };
        refresh(&p, &mut vols, &ctx).await.unwrap();
        assert_eq!(read(&vols[1].1.path, "color"), "green");
        assert_eq!(*objects.tokens.lock().unwrap(), 1);
        vols[0].1.renew_token_at = Some(jiff::Timestamp::now());
        refresh(&p, &mut vols, &ctx).await.unwrap();
        assert_eq!(*objects.tokens.lock().unwrap(), 2);
        assert_eq!(read(&vols[0].1.path, "token"), "token-2-robot-[]");
        assert_eq!(read(&vols[0].1.path, "ca.crt"), "green");
        tear_down(dir.path());
        assert!(mounted(&vols[0].1.path).is_none());
    }
}
