//! Local ephemeral storage limits, enforced by eviction as the kubelet's
//! `localStorageEviction` does on every pass, with or without disk pressure: an
//! emptyDir over its `sizeLimit`, a pod over the sum of its containers'
//! `ephemeral-storage` limits, or a container whose writable layer and logs exceed
//! its own limit gets the pod evicted at once, with the kubelet's message.

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::stats::types::PodStats;

/// The ephemeral-storage limit of a container, in bytes.
fn limit(c: &Container) -> Option<(u64, String)> {
    let q = c
        .resources
        .as_ref()?
        .limits
        .as_ref()?
        .get("ephemeral-storage")?;
    // A zero limit is no limit (the kubelet skips it).
    let bytes = crate::quantity::bytes(q).ok().filter(|b| *b > 0)?;
    Some((bytes, q.0.clone()))
}

/// Why `pod` breaks a local storage limit, in the kubelet's words; `None` if it
/// does not (or its figures are not known).
pub fn violation(pod: &Pod, stats: &PodStats) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    // emptyDir sizeLimit.
    for v in spec.volumes.iter().flatten() {
        let Some(size) = v.empty_dir.as_ref().and_then(|e| e.size_limit.as_ref()) else {
            continue;
        };
        let Ok(limit) = crate::quantity::bytes(size) else {
            continue;
        };
        let used = stats
            .volume_stats
            .iter()
            .find(|s| s.name == v.name)
            .and_then(|s| s.fs.used_bytes);
        if limit > 0 && used.is_some_and(|u| u > limit) {
            return Some(format!(
                "Usage of EmptyDir volume {:?} exceeds the limit {:?}. ",
                v.name, size.0
            ));
        }
    }
    // The pod's total: the sum of the limits its containers have (`PodLimits`).
    let limits: Vec<(u64, String)> = spec.containers.iter().filter_map(limit).collect();
    if let (false, Some(used)) = (
        limits.is_empty(),
        stats.ephemeral_storage.as_ref().and_then(|e| e.used_bytes),
    ) {
        let total: u64 = limits.iter().map(|(b, _)| b).sum();
        if used > total {
            return Some(format!(
                "Pod ephemeral local storage usage exceeds the total limit of containers {}. ",
                crate::quantity::binary_si(total).0
            ));
        }
    }
    // Each container's writable layer and logs.
    for c in &spec.containers {
        let Some((bytes, text)) = limit(c) else {
            continue;
        };
        let Some(cs) = stats.containers.iter().find(|s| s.name == c.name) else {
            continue;
        };
        let rootfs = cs.rootfs.as_ref().and_then(|f| f.used_bytes).unwrap_or(0);
        let logs = cs.logs.as_ref().and_then(|f| f.used_bytes).unwrap_or(0);
        if rootfs + logs > bytes {
            return Some(format!(
                "Container {} exceeded its local ephemeral storage limit {text:?}. ",
                c.name
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::types::{ContainerStats, FsStats, VolumeStats};

    fn pod(yaml: serde_json::Value) -> Pod {
        serde_json::from_value(yaml).unwrap()
    }

    fn used(bytes: u64) -> Option<FsStats> {
        Some(FsStats {
            used_bytes: Some(bytes),
            ..Default::default()
        })
    }

    #[test]
    fn an_empty_dir_over_its_size_limit_is_a_violation() {
        let p = pod(serde_json::json!({
            "spec": {
                "containers": [{"name": "c"}],
                "volumes": [{"name": "data", "emptyDir": {"sizeLimit": "1Mi"}}],
            }
        }));
        let mut s = PodStats {
            volume_stats: vec![VolumeStats {
                name: "data".into(),
                fs: used(1 << 20).unwrap(),
                pvc_ref: None,
            }],
            ..Default::default()
        };
        assert_eq!(violation(&p, &s), None, "at the limit is within it");
        s.volume_stats[0].fs.used_bytes = Some((1 << 20) + 1);
        assert_eq!(
            violation(&p, &s).as_deref(),
            Some("Usage of EmptyDir volume \"data\" exceeds the limit \"1Mi\". ")
        );
    }

    #[test]
    fn pod_and_container_limits_count_what_the_kubelet_counts() {
        let p = pod(serde_json::json!({
            "spec": {"containers": [
                {"name": "a", "resources": {"limits": {"ephemeral-storage": "2Mi"}}},
                {"name": "b", "resources": {"limits": {"ephemeral-storage": "2Mi"}}},
            ]}
        }));
        let container = |name: &str, rootfs: u64, logs: u64| ContainerStats {
            name: name.into(),
            rootfs: used(rootfs),
            logs: used(logs),
            ..Default::default()
        };
        let mut s = PodStats {
            containers: vec![container("a", 1 << 20, 0), container("b", 0, 0)],
            ephemeral_storage: used(1 << 20),
            ..Default::default()
        };
        assert_eq!(violation(&p, &s), None);
        s.ephemeral_storage = used(5 << 20);
        assert_eq!(
            violation(&p, &s).as_deref(),
            Some("Pod ephemeral local storage usage exceeds the total limit of containers 4Mi. ")
        );
        s.ephemeral_storage = used(3 << 20);
        s.containers[0] = container("a", 2 << 20, 1);
        assert_eq!(
            violation(&p, &s).as_deref(),
            Some("Container a exceeded its local ephemeral storage limit \"2Mi\". ")
        );
    }
}
