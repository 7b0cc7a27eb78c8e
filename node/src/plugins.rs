//! The node's Wasm plugins (`wasmlet.plugins` in the config file): the pod and node
//! as the plugin ABI sees them, probe plugins chosen per container and probe type by a
//! pod annotation, and admission plugins after the built-in admission.
//!
//! Probe plugins are chosen with annotations (documented in `docs/plugins.md`):
//!
//! ```yaml
//! metadata:
//!   annotations:
//!     probe.wasmlet.dev/<container>.<liveness|readiness|startup>: <plugin name>
//!     probe.wasmlet.dev/<container>.<type>.settings: '{"path": "/healthz"}'
//! ```
//!
//! The container's probe must still be declared (its handler, any of the four, is
//! replaced by the plugin): its timing fields — `initialDelaySeconds`,
//! `periodSeconds`, `timeoutSeconds` (the call's deadline), the thresholds — apply
//! as they do to any probe.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use wasmlet_plugin_host::types::{
    ContainerInfo, Decision, NodeState, Pair, PodInfo, ResourceAmount,
};
use wasmlet_plugin_host::{PluginHost, World};

use crate::probe_results::ProbeKind;

/// The annotation prefix that selects a probe plugin.
pub const PROBE_ANNOTATION_PREFIX: &str = "probe.wasmlet.dev/";

/// A resource quantity in the ABI's canonical unit: `cpu` in millicores, everything
/// else as a whole number (bytes for memory and storage), rounded up.
pub fn canonical_amount(name: &str, q: &Quantity) -> Option<u64> {
    let v = crate::quantity::parse(q).ok()?;
    if v < 0.0 {
        return None;
    }
    let v = if name == "cpu" { v * 1000.0 } else { v };
    Some(v.ceil() as u64)
}

fn amounts(list: Option<&BTreeMap<String, Quantity>>) -> Vec<ResourceAmount> {
    list.into_iter()
        .flatten()
        .filter_map(|(name, q)| {
            canonical_amount(name, q).map(|amount| ResourceAmount {
                name: name.clone(),
                amount,
            })
        })
        .collect()
}

fn pairs(map: Option<&BTreeMap<String, String>>) -> Vec<Pair> {
    map.into_iter()
        .flatten()
        .map(|(key, value)| Pair {
            key: key.clone(),
            value: value.clone(),
        })
        .collect()
}

fn container_info(c: &Container, init: bool) -> ContainerInfo {
    let resources = c.resources.as_ref();
    ContainerInfo {
        name: c.name.clone(),
        image: c.image.clone().unwrap_or_default(),
        requests: amounts(resources.and_then(|r| r.requests.as_ref())),
        limits: amounts(resources.and_then(|r| r.limits.as_ref())),
        init,
    }
}

/// The pod as plugins see it (`types.pod-info`).
pub fn pod_info(pod: &Pod) -> PodInfo {
    let spec = pod.spec.clone().unwrap_or_default();
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| container_info(c, true))
        .chain(spec.containers.iter().map(|c| container_info(c, false)))
        .collect();
    PodInfo {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        labels: pairs(pod.metadata.labels.as_ref()),
        annotations: pairs(pod.metadata.annotations.as_ref()),
        qos_class: crate::qos::qos_class(pod).to_owned(),
        priority: spec.priority.unwrap_or(0),
        runtime_class: spec.runtime_class_name.clone().unwrap_or_default(),
        containers,
    }
}

/// The probe plugin a pod's annotations choose for one of its containers' probes,
/// with the annotation's settings. A settings annotation that is not a JSON object
/// of strings is an error naming the annotation.
pub fn probe_plugin(
    pod: &Pod,
    container: &str,
    kind: ProbeKind,
) -> Option<Result<(String, Vec<Pair>), String>> {
    let annotations = pod.metadata.annotations.as_ref()?;
    let key = format!(
        "{PROBE_ANNOTATION_PREFIX}{container}.{}",
        kind.name().to_lowercase()
    );
    let plugin = annotations.get(&key)?.trim().to_owned();
    let settings_key = format!("{key}.settings");
    let settings = match annotations.get(&settings_key) {
        None => Vec::new(),
        Some(raw) => match settings_from_json(raw) {
            Ok(settings) => settings,
            Err(e) => return Some(Err(format!("annotation {settings_key}: {e}"))),
        },
    };
    Some(Ok((plugin, settings)))
}

/// A probe's per-pod settings from their JSON object, as the pod annotation carries
/// them: every value becomes text (`{"port": 8080}` gives `port` = `8080`), in key
/// order.
pub fn settings_from_json(raw: &str) -> Result<Vec<Pair>, String> {
    let map = serde_json::from_str::<BTreeMap<String, serde_json::Value>>(raw)
        .map_err(|e| format!("not a JSON object: {e}"))?;
    Ok(map
        .into_iter()
        .map(|(key, value)| Pair {
            key,
            value: match value {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            },
        })
        .collect())
}

/// The node as admission plugins see it: allocatable, what `admitted` already
/// requests, how many there are, the node's labels.
pub fn node_state(node: &crate::admission::NodeInfo, admitted: &[Pod]) -> NodeState {
    let mut requested: BTreeMap<String, f64> = BTreeMap::new();
    for pod in admitted {
        for (name, v) in crate::resources::pod_requests(pod) {
            *requested.entry(name).or_default() += v;
        }
    }
    NodeState {
        node_name: node.name.clone(),
        allocatable: amounts(Some(&node.allocatable)),
        requested: requested
            .into_iter()
            .map(|(name, v)| {
                // pod_requests gives cores for cpu.
                let amount = if name == "cpu" { v * 1000.0 } else { v };
                ResourceAmount {
                    name,
                    amount: amount.ceil() as u64,
                }
            })
            .collect(),
        pod_count: admitted.len() as u32,
        labels: pairs(Some(&node.labels)),
    }
}

/// The admission plugins of a configuration, in its order, each with what a failed
/// call decides.
pub type AdmissionPlugins = Vec<(String, wasmlet_plugin_host::FailurePolicy)>;

/// The admission plugins of a configuration, in its order: all of them, loaded or
/// not (one that failed to load decides by its `failurePolicy`).
pub fn admission_plugins(config: &[wasmlet_plugin_host::PluginConfig]) -> AdmissionPlugins {
    config
        .iter()
        .filter(|p| p.world == World::Admission)
        .map(|p| (p.name.clone(), p.failure_policy()))
        .collect()
}

/// The device adapters of a configuration, in its order, each with the host paths
/// it may hand to containers: its filesystem grants.
pub fn device_adapters(
    config: &[wasmlet_plugin_host::PluginConfig],
) -> Vec<(String, Vec<std::path::PathBuf>)> {
    config
        .iter()
        .filter(|p| p.world == World::DeviceAdapter)
        .map(|p| {
            let allowed = p
                .grants
                .filesystem
                .iter()
                .map(|g| g.host_path.clone())
                .collect();
            (p.name.clone(), allowed)
        })
        .collect()
}

/// The eviction plugin of a configuration: the first `eviction` one (a node ranks
/// its candidates one way).
pub fn eviction_plugin(config: &[wasmlet_plugin_host::PluginConfig]) -> Option<String> {
    config
        .iter()
        .find(|p| p.world == World::Eviction)
        .map(|p| p.name.clone())
}

/// Asks the eviction plugin `name` to order `pods` (already in the built-in order)
/// for `signal`, each with its usage and request of the starved resource. The
/// plugin's order, completed by the built-in one for pods it left out; `Err` with
/// why when the call failed (the caller keeps the built-in order).
pub async fn rank(
    host: &PluginHost,
    name: &str,
    signal: &str,
    pods: &[(&Pod, u64, u64)],
) -> Result<Vec<usize>, String> {
    let candidates: Vec<wasmlet_plugin_host::types::Candidate> = pods
        .iter()
        .map(
            |(pod, usage, request)| wasmlet_plugin_host::types::Candidate {
                pod: pod_info(pod),
                usage: *usage,
                request: *request,
            },
        )
        .collect();
    host.try_rank(name, signal, &candidates)
        .await
        .map(|order| order.into_iter().map(|i| i as usize).collect())
        .map_err(|e| e.to_string())
}

/// Whether a pod already ran on a node: the API reports it Running or with a
/// container that started. After a restart such pods are re-admitted by the built-in
/// checks only, so a plugin that is slow, failing or changed does not stop what runs.
pub fn already_running(pod: &Pod) -> bool {
    pod.status.as_ref().is_some_and(|s| {
        s.phase.as_deref() == Some("Running")
            || s.container_statuses
                .iter()
                .flatten()
                .any(|c| c.container_id.is_some())
    })
}

/// Runs the admission plugins in order; the first denial rejects the pod with its
/// reason and message. A plugin that fails (or is not loaded) decides by its
/// `failurePolicy`: `Fail` rejects the pod (`PluginError`), `Ignore` admits it with a
/// warning event on the pod (`AdmissionPluginFailed`).
pub async fn admit(
    host: &PluginHost,
    plugins: &[(String, wasmlet_plugin_host::FailurePolicy)],
    pod: &Pod,
    node: &crate::admission::NodeInfo,
    admitted: &[Pod],
    events: &crate::cluster::events::EventRecorder,
) -> Result<(), crate::admission::Rejection> {
    use wasmlet_plugin_host::FailurePolicy;
    if plugins.is_empty() || already_running(pod) {
        return Ok(());
    }
    let info = pod_info(pod);
    let state = node_state(node, admitted);
    for (name, policy) in plugins {
        match host.try_admit(name, info.clone(), state.clone()).await {
            Ok(Decision::Admit) => {}
            Ok(Decision::Deny(denial)) => {
                return Err(crate::admission::Rejection {
                    reason: denial.reason,
                    message: format!("admission plugin {name}: {}", denial.message),
                });
            }
            Err(e) => match policy {
                FailurePolicy::Fail => {
                    return Err(crate::admission::Rejection {
                        reason: "PluginError".into(),
                        message: format!("admission plugin {name} failed: {e}"),
                    });
                }
                // Admitted, and said so on the pod as well as in the log.
                FailurePolicy::Ignore => {
                    let message = format!(
                        "admission plugin {name} failed; admitted by its failurePolicy Ignore: {e}"
                    );
                    tracing::warn!(plugin = %name, pod = %crate::pod::full_name(pod), "{message}");
                    events.pod(
                        pod,
                        None,
                        crate::cluster::events::WARNING,
                        "AdmissionPluginFailed",
                        message,
                    );
                }
            },
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(annotations: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "p", "namespace": "ns", "uid": "u-1",
                "labels": {"app": "web"},
                "annotations": annotations,
            },
            "spec": {
                "priority": 7,
                "initContainers": [{"name": "setup", "image": "i0"}],
                "containers": [{
                    "name": "main", "image": "i1",
                    "resources": {
                        "requests": {"cpu": "250m", "memory": "64Mi"},
                        "limits": {"cpu": "1", "memory": "1Gi", "example.com/widget": "2"},
                    },
                }],
            },
        }))
        .unwrap()
    }

    #[test]
    fn pods_reach_plugins_in_canonical_units() {
        let info = pod_info(&pod(serde_json::json!({})));
        assert_eq!((info.namespace.as_str(), info.uid.as_str()), ("ns", "u-1"));
        assert_eq!(info.qos_class, "Burstable");
        assert_eq!(info.priority, 7);
        assert_eq!(info.containers.len(), 2);
        assert!(info.containers[0].init && !info.containers[1].init);
        let main = &info.containers[1];
        let amount = |list: &[ResourceAmount], name: &str| {
            list.iter().find(|a| a.name == name).map(|a| a.amount)
        };
        assert_eq!(amount(&main.requests, "cpu"), Some(250));
        assert_eq!(amount(&main.requests, "memory"), Some(64 << 20));
        assert_eq!(amount(&main.limits, "cpu"), Some(1000));
        assert_eq!(amount(&main.limits, "example.com/widget"), Some(2));
        assert_eq!(
            canonical_amount("cpu", &Quantity("1.0005".into())),
            Some(1001)
        );
    }

    #[test]
    fn probe_plugins_are_chosen_per_container_and_probe_type() {
        let p = pod(serde_json::json!({
            "probe.wasmlet.dev/main.readiness": "http-json",
            "probe.wasmlet.dev/main.readiness.settings": r#"{"path": "/healthz", "port": 8080}"#,
            "probe.wasmlet.dev/main.liveness": "other",
            "probe.wasmlet.dev/setup.startup.settings": "not json",
            "probe.wasmlet.dev/setup.startup": "x",
        }));
        let (name, settings) = probe_plugin(&p, "main", ProbeKind::Readiness)
            .unwrap()
            .unwrap();
        assert_eq!(name, "http-json");
        assert_eq!(
            settings,
            vec![
                Pair {
                    key: "path".into(),
                    value: "/healthz".into()
                },
                Pair {
                    key: "port".into(),
                    value: "8080".into()
                },
            ]
        );
        let (name, settings) = probe_plugin(&p, "main", ProbeKind::Liveness)
            .unwrap()
            .unwrap();
        assert_eq!((name.as_str(), settings.len()), ("other", 0));
        assert!(probe_plugin(&p, "main", ProbeKind::Startup).is_none());
        assert!(probe_plugin(&p, "other", ProbeKind::Readiness).is_none());
        let err = probe_plugin(&p, "setup", ProbeKind::Startup)
            .unwrap()
            .unwrap_err();
        assert!(
            err.contains("probe.wasmlet.dev/setup.startup.settings"),
            "{err}"
        );
    }

    #[test]
    fn pods_that_already_ran_are_not_asked_about_again() {
        let mut p = pod(serde_json::json!({}));
        assert!(!already_running(&p));
        p.status = Some(serde_json::from_value(serde_json::json!({"phase": "Pending"})).unwrap());
        assert!(!already_running(&p));
        p.status = Some(
            serde_json::from_value(serde_json::json!({
                "phase": "Pending",
                "containerStatuses": [{"name": "main", "image": "i1", "imageID": "", "ready": false,
                    "restartCount": 1, "containerID": "wasm://abc"}],
            }))
            .unwrap(),
        );
        assert!(already_running(&p), "a container started");
        p.status = Some(serde_json::from_value(serde_json::json!({"phase": "Running"})).unwrap());
        assert!(already_running(&p));
        let config: Vec<wasmlet_plugin_host::PluginConfig> =
            serde_json::from_value(serde_json::json!([
                {"name": "b", "world": "admission-plugin", "source": {"file": "/b.wasm"}},
                {"name": "p", "world": "probe-plugin", "source": {"file": "/p.wasm"}},
                {"name": "a", "world": "admission-plugin", "source": {"file": "/a.wasm"}},
            ]))
            .unwrap();
        assert_eq!(
            admission_plugins(&config)
                .into_iter()
                .map(|(name, _)| name)
                .collect::<Vec<_>>(),
            ["b", "a"],
            "the configuration's order"
        );
    }

    #[test]
    fn node_state_sums_what_admitted_pods_request() {
        let node = crate::admission::NodeInfo {
            name: "n".into(),
            allocatable: [
                ("cpu".to_owned(), Quantity("2".into())),
                ("memory".to_owned(), Quantity("1Gi".into())),
            ]
            .into(),
            labels: [("tier".to_owned(), "edge".to_owned())].into(),
            taints: Vec::new(),
            os: "linux".into(),
            arch: "amd64".into(),
        };
        let admitted = [pod(serde_json::json!({})), pod(serde_json::json!({}))];
        let state = node_state(&node, &admitted);
        assert_eq!(state.pod_count, 2);
        let requested = |name: &str| {
            state
                .requested
                .iter()
                .find(|a| a.name == name)
                .map(|a| a.amount)
        };
        assert_eq!(requested("cpu"), Some(500));
        assert_eq!(requested("memory"), Some(128 << 20));
        assert_eq!(state.allocatable[0].amount, 2000);
        assert_eq!(state.labels[0].key, "tier");
    }
}
