//! Volumes whose files the node writes: `configMap`, `secret`, `downwardAPI` and
//! `projected` (with `serviceAccountToken`, the source of the `kube-api-access-*`
//! volume every pod of a cluster gets).
//!
//! Files are written the kubelet's atomic way: a new timestamped directory, then the
//! `..data` symlink swapped to it, with one symlink per top-level entry pointing into
//! `..data`; a reader never sees half an update. Secret and projected volumes live on
//! a tmpfs, so their contents never reach the node's disk.

use std::collections::BTreeMap;
use std::path::{Component, Path};

use k8s_openapi::api::core::v1::{
    ConfigMap, DownwardAPIVolumeFile, KeyToPath, Pod, ProjectedVolumeSource, Secret, Volume,
};

use crate::env::ObjectSource;

/// The files of a volume: relative path → (content, mode).
pub type Payload = BTreeMap<String, (Vec<u8>, u32)>;

/// The kubelet's `defaultMode` when a volume sets none.
const DEFAULT_MODE: i32 = 0o644;

/// Whether this module provides the volume, and the kubelet's plugin directory name.
pub fn plugin_dir(v: &Volume) -> Option<&'static str> {
    if v.config_map.is_some() {
        Some("kubernetes.io~configmap")
    } else if v.secret.is_some() {
        Some("kubernetes.io~secret")
    } else if v.downward_api.is_some() {
        Some("kubernetes.io~downward-api")
    } else if v.projected.is_some() {
        Some("kubernetes.io~projected")
    } else {
        None
    }
}

/// Whether the volume's files are secret (kept on a tmpfs).
pub fn is_secret(v: &Volume) -> bool {
    v.secret.is_some() || v.projected.is_some()
}

/// What rendering a volume gave: its files and, for a projected token, when the token
/// should be requested again (80 % of its lifetime, as the kubelet refreshes it).
pub struct Rendered {
    pub payload: Payload,
    pub refresh_token_at: Option<jiff::Timestamp>,
}

/// Reads what the volume holds and makes its files.
pub async fn render(
    pod: &Pod,
    v: &Volume,
    objects: &dyn ObjectSource,
    allocatable: &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
) -> Result<Rendered, String> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut payload = Payload::new();
    let mut refresh_token_at = None;
    if let Some(cm) = &v.config_map {
        let mode = cm.default_mode.unwrap_or(DEFAULT_MODE);
        let object = objects.config_map(namespace, &cm.name).await?;
        config_map_files(
            &mut payload,
            object.as_ref(),
            &cm.name,
            cm.items.as_deref(),
            cm.optional == Some(true),
            mode,
        )?;
    } else if let Some(s) = &v.secret {
        let name = s.secret_name.clone().unwrap_or_default();
        let mode = s.default_mode.unwrap_or(DEFAULT_MODE);
        let object = objects.secret(namespace, &name).await?;
        secret_files(
            &mut payload,
            object.as_ref(),
            &name,
            s.items.as_deref(),
            s.optional == Some(true),
            mode,
        )?;
    } else if let Some(d) = &v.downward_api {
        let mode = d.default_mode.unwrap_or(DEFAULT_MODE);
        downward_files(&mut payload, pod, d.items.as_deref(), mode, allocatable)?;
    } else if let Some(p) = &v.projected {
        refresh_token_at = projected_files(&mut payload, pod, p, objects, allocatable).await?;
    } else {
        return Err("not a configMap, secret, downwardAPI or projected volume".into());
    }
    Ok(Rendered {
        payload,
        refresh_token_at,
    })
}

fn mode_of(item_mode: Option<i32>, default: i32) -> u32 {
    (item_mode.unwrap_or(default) & 0o777) as u32
}

/// The files of a ConfigMap's or Secret's `data` (all keys, or the `items`); a
/// missing object or key is an error unless `optional`.
fn keyed_files(
    out: &mut Payload,
    data: Option<BTreeMap<String, Vec<u8>>>,
    what: &str,
    items: Option<&[KeyToPath]>,
    optional: bool,
    mode: i32,
) -> Result<(), String> {
    let Some(data) = data else {
        return if optional {
            Ok(())
        } else {
            Err(format!("{what} not found"))
        };
    };
    match items {
        None => {
            for (k, v) in data {
                out.insert(k, (v, mode_of(None, mode)));
            }
        }
        Some(items) => {
            for item in items {
                match data.get(&item.key) {
                    Some(v) => {
                        out.insert(item.path.clone(), (v.clone(), mode_of(item.mode, mode)));
                    }
                    None if optional => {}
                    None => {
                        return Err(format!(
                            "configuration error: {what} has no key {:?}",
                            item.key
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

fn config_map_files(
    out: &mut Payload,
    cm: Option<&ConfigMap>,
    name: &str,
    items: Option<&[KeyToPath]>,
    optional: bool,
    mode: i32,
) -> Result<(), String> {
    let data = cm.map(|cm| {
        let mut data: BTreeMap<String, Vec<u8>> = cm
            .data
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.into_bytes()))
            .collect();
        for (k, v) in cm.binary_data.clone().unwrap_or_default() {
            data.insert(k, v.0);
        }
        data
    });
    keyed_files(
        out,
        data,
        &format!("configmap {name:?}"),
        items,
        optional,
        mode,
    )
}

fn secret_files(
    out: &mut Payload,
    secret: Option<&Secret>,
    name: &str,
    items: Option<&[KeyToPath]>,
    optional: bool,
    mode: i32,
) -> Result<(), String> {
    let data = secret.map(|secret| {
        let mut data: BTreeMap<String, Vec<u8>> = secret
            .data
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect();
        for (k, v) in secret.string_data.clone().unwrap_or_default() {
            data.insert(k, v.into_bytes());
        }
        data
    });
    keyed_files(
        out,
        data,
        &format!("secret {name:?}"),
        items,
        optional,
        mode,
    )
}

fn downward_files(
    out: &mut Payload,
    pod: &Pod,
    items: Option<&[DownwardAPIVolumeFile]>,
    mode: i32,
    allocatable: &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
) -> Result<(), String> {
    let objects = crate::env::Objects::default();
    let ctx = crate::env::Context {
        host_ips: &[],
        pod_ips: &[],
        allocatable,
        objects: &objects,
        services: &[],
    };
    for item in items.into_iter().flatten() {
        let value = if let Some(f) = &item.field_ref {
            let path = f.field_path.as_str();
            // In volumes only the pod's metadata may be projected.
            if !path.starts_with("metadata.") {
                return Err(format!(
                    "downwardAPI volume: fieldPath {path} is not supported in volumes"
                ));
            }
            crate::env::field_value(pod, path, &ctx)?
        } else if let Some(r) = &item.resource_field_ref {
            let container = r.container_name.clone().unwrap_or_default();
            crate::env::resource_value(pod, &container, &r.resource, r.divisor.as_ref(), &ctx)?
        } else {
            return Err(format!(
                "downwardAPI item {:?} has no fieldRef or resourceFieldRef",
                item.path
            ));
        };
        out.insert(
            item.path.clone(),
            (value.into_bytes(), mode_of(item.mode, mode)),
        );
    }
    Ok(())
}

async fn projected_files(
    out: &mut Payload,
    pod: &Pod,
    p: &ProjectedVolumeSource,
    objects: &dyn ObjectSource,
    allocatable: &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
) -> Result<Option<jiff::Timestamp>, String> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mode = p.default_mode.unwrap_or(DEFAULT_MODE);
    let mut refresh = None;
    for source in p.sources.iter().flatten() {
        if let Some(cm) = &source.config_map {
            let object = objects.config_map(namespace, &cm.name).await?;
            config_map_files(
                out,
                object.as_ref(),
                &cm.name,
                cm.items.as_deref(),
                cm.optional == Some(true),
                mode,
            )?;
        } else if let Some(s) = &source.secret {
            let object = objects.secret(namespace, &s.name).await?;
            secret_files(
                out,
                object.as_ref(),
                &s.name,
                s.items.as_deref(),
                s.optional == Some(true),
                mode,
            )?;
        } else if let Some(d) = &source.downward_api {
            downward_files(out, pod, d.items.as_deref(), mode, allocatable)?;
        } else if let Some(t) = &source.service_account_token {
            let expiration = t.expiration_seconds.unwrap_or(3600).max(600);
            let audiences = t
                .audience
                .iter()
                .filter(|a| !a.is_empty())
                .cloned()
                .collect();
            let (token, expires) = objects
                .service_account_token(pod, audiences, expiration)
                .await?;
            out.insert(t.path.clone(), (token.into_bytes(), mode_of(None, mode)));
            // Refresh at 80 % of the lifetime (at most a day), as the kubelet.
            let now = jiff::Timestamp::now();
            let life = expires.duration_since(now);
            let at = now
                .checked_add(life.checked_mul(4).unwrap_or_default() / 5)
                .unwrap_or(now)
                .min(
                    now.checked_add(jiff::SignedDuration::from_hours(24))
                        .unwrap_or(now),
                );
            refresh = Some(refresh.map_or(at, |r: jiff::Timestamp| r.min(at)));
        } else {
            return Err("projected volume: a source this node does not support yet (clusterTrustBundle, podCertificate)".into());
        }
    }
    Ok(refresh)
}

/// Checks that a payload path is relative and stays inside the volume.
fn check_path(path: &str) -> Result<(), String> {
    let p = Path::new(path);
    if path.is_empty()
        || p.is_absolute()
        || p.components().any(|c| !matches!(c, Component::Normal(_)))
        || path.starts_with("..")
    {
        return Err(format!("invalid path {path:?} in the volume"));
    }
    Ok(())
}

/// Writes `payload` into `dir` atomically (the kubelet's AtomicWriter layout):
/// `..<stamp>/` holds the files, `..data` points at it, and each top-level entry is a
/// symlink into `..data`. Old generations and entries no longer in the payload go.
pub fn write_atomically(dir: &Path, payload: &Payload) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt as _;
    let err = |what: &str, p: &Path, e: std::io::Error| format!("{what} {}: {e}", p.display());
    for path in payload.keys() {
        check_path(path)?;
    }
    let stamp = format!("..{}", jiff::Timestamp::now().as_nanosecond());
    let generation = dir.join(&stamp);
    std::fs::create_dir_all(&generation).map_err(|e| err("creating", &generation, e))?;
    std::fs::set_permissions(&generation, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| err("chmod", &generation, e))?;
    for (path, (content, mode)) in payload {
        let file = generation.join(path);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent).map_err(|e| err("creating", parent, e))?;
        }
        std::fs::write(&file, content).map_err(|e| err("writing", &file, e))?;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(*mode))
            .map_err(|e| err("chmod", &file, e))?;
    }
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&stamp, &tmp).map_err(|e| err("linking", &tmp, e))?;
    std::fs::rename(&tmp, dir.join("..data")).map_err(|e| err("switching", dir, e))?;
    let tops: std::collections::BTreeSet<String> = payload
        .keys()
        .filter_map(|p| p.split('/').next().map(str::to_owned))
        .collect();
    for top in &tops {
        let link = dir.join(top);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(top), &link)
                .map_err(|e| err("linking", &link, e))?;
        }
    }
    for entry in std::fs::read_dir(dir)
        .map_err(|e| err("reading", dir, e))?
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        let stale_generation = name.starts_with("..") && name != "..data" && name != stamp;
        let stale_link = !name.starts_with("..") && !tops.contains(&name);
        if stale_generation {
            let _ = std::fs::remove_dir_all(entry.path());
        } else if stale_link {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(files: &[(&str, &str, u32)]) -> Payload {
        files
            .iter()
            .map(|(p, c, m)| ((*p).to_owned(), (c.as_bytes().to_vec(), *m)))
            .collect()
    }

    #[test]
    fn files_are_written_atomically_and_updates_replace_them() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        write_atomically(
            dir.path(),
            &payload(&[("a", "1", 0o644), ("sub/b", "2", 0o600)]),
        )
        .unwrap();
        assert_eq!(std::fs::read_to_string(dir.path().join("a")).unwrap(), "1");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("sub/b")).unwrap(),
            "2"
        );
        let mode = std::fs::metadata(dir.path().join("sub/b"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(
            std::fs::symlink_metadata(dir.path().join("a"))
                .unwrap()
                .is_symlink()
        );
        // An update: `a` changes, `sub` goes, `c` comes; one generation is left.
        write_atomically(
            dir.path(),
            &payload(&[("a", "3", 0o644), ("c", "4", 0o644)]),
        )
        .unwrap();
        assert_eq!(std::fs::read_to_string(dir.path().join("a")).unwrap(), "3");
        assert_eq!(std::fs::read_to_string(dir.path().join("c")).unwrap(), "4");
        assert!(!dir.path().join("sub").exists());
        let generations = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .filter(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.starts_with("..") && n != "..data"
            })
            .count();
        assert_eq!(generations, 1);
        for bad in ["../x", "/abs", "a/../../b", ""] {
            assert!(
                write_atomically(dir.path(), &payload(&[(bad, "x", 0o644)])).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn config_map_and_secret_items_follow_keys_modes_and_optional() {
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "cfg"},
            "data": {"a": "1", "b": "2"},
            "binaryData": {"bin": "AAE="},
        }))
        .unwrap();
        let mut out = Payload::new();
        config_map_files(&mut out, Some(&cm), "cfg", None, false, 0o644).unwrap();
        assert_eq!(out.keys().collect::<Vec<_>>(), ["a", "b", "bin"]);
        assert_eq!(out["bin"].0, vec![0, 1]);
        let items: Vec<KeyToPath> = serde_json::from_value(serde_json::json!([
            {"key": "a", "path": "dir/first", "mode": 0o400},
        ]))
        .unwrap();
        let mut out = Payload::new();
        config_map_files(&mut out, Some(&cm), "cfg", Some(&items), false, 0o644).unwrap();
        assert_eq!(out["dir/first"], (b"1".to_vec(), 0o400));
        let missing: Vec<KeyToPath> =
            serde_json::from_value(serde_json::json!([{"key": "zz", "path": "z"}])).unwrap();
        let e = config_map_files(
            &mut Payload::new(),
            Some(&cm),
            "cfg",
            Some(&missing),
            false,
            0o644,
        )
        .unwrap_err();
        assert!(e.contains("no key \"zz\""), "{e}");
        assert!(
            config_map_files(
                &mut Payload::new(),
                Some(&cm),
                "cfg",
                Some(&missing),
                true,
                0o644
            )
            .is_ok()
        );
        let e =
            config_map_files(&mut Payload::new(), None, "gone", None, false, 0o644).unwrap_err();
        assert_eq!(e, "configmap \"gone\" not found");
        assert!(secret_files(&mut Payload::new(), None, "gone", None, true, 0o644).is_ok());
    }

    #[test]
    fn downward_api_files_project_metadata_only() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"memory": "64Mi"}}}]},
        }))
        .unwrap();
        let items: Vec<DownwardAPIVolumeFile> = serde_json::from_value(serde_json::json!([
            {"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}},
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            {"path": "mem", "resourceFieldRef": {"containerName": "c", "resource": "limits.memory", "divisor": "1Mi"}},
        ]))
        .unwrap();
        let mut out = Payload::new();
        downward_files(&mut out, &pod, Some(&items), 0o644, &BTreeMap::new()).unwrap();
        assert_eq!(out["namespace"].0, b"ns");
        assert_eq!(out["labels"].0, b"app=\"web\"");
        assert_eq!(out["mem"].0, b"64");
        let ip: Vec<DownwardAPIVolumeFile> = serde_json::from_value(serde_json::json!([
            {"path": "ip", "fieldRef": {"fieldPath": "status.podIP"}},
        ]))
        .unwrap();
        assert!(
            downward_files(
                &mut Payload::new(),
                &pod,
                Some(&ip),
                0o644,
                &BTreeMap::new()
            )
            .is_err()
        );
    }
}
