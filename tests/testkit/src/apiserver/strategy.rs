//! Per-resource rules the real apiserver applies on create, update and delete
//! (its "registry strategies"): pod defaulting, generation, graceful deletion.

use serde_json::{Map, Value, json};

use super::resources::ResourceType;

/// The annotation that marks a mirror pod (the node's copy of a static pod).
pub(crate) const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Default `spec.terminationGracePeriodSeconds`.
pub(crate) const DEFAULT_GRACE_SECONDS: i64 = 30;

fn is_pod(res: &ResourceType) -> bool {
    res.is("", "pods")
}

/// Fills defaults and initial status for a new object.
pub(crate) fn prepare_create(res: &ResourceType, obj: &mut Value) {
    if is_pod(res) {
        default_pod(obj);
        let phase = obj.pointer("/status/phase").and_then(Value::as_str);
        if phase.is_none_or(str::is_empty) {
            ensure_object(obj, "status").insert("phase".into(), json!("Pending"));
        }
        ensure_object(obj, "metadata").insert("generation".into(), json!(1));
        if obj.pointer("/status/qosClass").is_none() {
            let qos = qos_class(obj);
            ensure_object(obj, "status").insert("qosClass".into(), json!(qos));
        }
    } else if res.is("", "namespaces") {
        ensure_object(obj, "status").insert("phase".into(), json!("Active"));
    }
}

/// The QoS class the API server records at creation: BestEffort without any request
/// or limit, Guaranteed when every container's cpu and memory limits equal its
/// requests (requests default to limits), else Burstable.
fn qos_class(pod: &Value) -> &'static str {
    let containers: Vec<&Value> = ["containers", "initContainers"]
        .iter()
        .filter_map(|k| pod.pointer(&format!("/spec/{k}")).and_then(Value::as_array))
        .flatten()
        .collect();
    let get = |c: &Value, kind: &str, res: &str| {
        c.pointer(&format!("/resources/{kind}/{res}"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let any = containers.iter().any(|c| {
        ["requests", "limits"]
            .iter()
            .any(|k| ["cpu", "memory"].iter().any(|r| get(c, k, r).is_some()))
    });
    if !any {
        return "BestEffort";
    }
    let guaranteed = containers.iter().all(|c| {
        ["cpu", "memory"].iter().all(|r| match get(c, "limits", r) {
            Some(limit) => get(c, "requests", r).is_none_or(|req| req == limit),
            None => false,
        })
    });
    if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// Fills defaults for a replacement object and bumps `metadata.generation` when
/// the spec changed.
pub(crate) fn prepare_update(res: &ResourceType, old: &Value, new: &mut Value) {
    if is_pod(res) {
        default_pod(new);
    }
    let generation = old.pointer("/metadata/generation").and_then(Value::as_i64);
    if let Some(generation) = generation
        && old.get("spec") != new.get("spec")
    {
        ensure_object(new, "metadata").insert("generation".into(), json!(generation + 1));
    }
}

/// The grace period a DELETE of `obj` gets, or `None` when the resource is not
/// deleted gracefully (everything but pods).
///
/// Pods: the requested period, else `spec.terminationGracePeriodSeconds`, else 30;
/// zero for unscheduled pods and pods that already finished; negative means 1.
pub(crate) fn grace_period(res: &ResourceType, obj: &Value, requested: Option<i64>) -> Option<i64> {
    if !is_pod(res) {
        return None;
    }
    let mut period = requested.unwrap_or_else(|| {
        obj.pointer("/spec/terminationGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(DEFAULT_GRACE_SECONDS)
    });
    let node = obj.pointer("/spec/nodeName").and_then(Value::as_str);
    let phase = obj.pointer("/status/phase").and_then(Value::as_str);
    if node.is_none_or(str::is_empty) || matches!(phase, Some("Succeeded" | "Failed")) {
        period = 0;
    }
    if period < 0 {
        period = 1;
    }
    Some(period)
}

/// Whether a DELETE answers with the object (pods) rather than a success `Status`.
pub(crate) fn returns_deleted_object(res: &ResourceType) -> bool {
    is_pod(res)
}

/// `obj[key]` as a map, replacing a missing or non-map value.
pub(crate) fn ensure_object<'a>(obj: &'a mut Value, key: &str) -> &'a mut Map<String, Value> {
    if !obj.is_object() {
        *obj = Value::Object(Map::new());
    }
    let Value::Object(map) = obj else {
        unreachable!("made an object above")
    };
    let slot = map
        .entry(key.to_string())
        .or_insert_with(|| Value::Object(Map::new()));
    if !slot.is_object() {
        *slot = Value::Object(Map::new());
    }
    match slot {
        Value::Object(inner) => inner,
        _ => unreachable!("made an object above"),
    }
}

fn is_mirror(pod: &Value) -> bool {
    pod.pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION))
}

/// The apiserver's pod defaults; mirror pods keep their spec as given.
fn default_pod(pod: &mut Value) {
    if is_mirror(pod) {
        return;
    }
    let spec = ensure_object(pod, "spec");
    let defaults = [
        (
            "terminationGracePeriodSeconds",
            json!(DEFAULT_GRACE_SECONDS),
        ),
        ("restartPolicy", json!("Always")),
        ("dnsPolicy", json!("ClusterFirst")),
        ("schedulerName", json!("default-scheduler")),
    ];
    for (key, value) in defaults {
        spec.entry(key).or_insert(value);
    }
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        let Some(Value::Array(containers)) = spec.get_mut(list) else {
            continue;
        };
        for container in containers.iter_mut().filter_map(Value::as_object_mut) {
            default_container(container);
        }
    }
}

fn default_container(container: &mut Map<String, Value>) {
    container
        .entry("terminationMessagePath")
        .or_insert_with(|| json!("/dev/termination-log"));
    container
        .entry("terminationMessagePolicy")
        .or_insert_with(|| json!("File"));
    let image = container.get("image").and_then(Value::as_str).unwrap_or("");
    let policy = image_pull_policy(image);
    container
        .entry("imagePullPolicy")
        .or_insert_with(|| json!(policy));
    if let Some(Value::Array(ports)) = container.get_mut("ports") {
        for port in ports.iter_mut().filter_map(Value::as_object_mut) {
            port.entry("protocol").or_insert_with(|| json!("TCP"));
        }
    }
}

/// `Always` for `:latest` or untagged images, `IfNotPresent` otherwise.
fn image_pull_policy(image: &str) -> &'static str {
    if image.contains('@') {
        return "IfNotPresent";
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.split_once(':') {
        Some((_, "latest")) | None => "Always",
        Some(_) => "IfNotPresent",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::find;

    fn pods() -> &'static ResourceType {
        find("", "v1", "pods").expect("pods are served")
    }

    #[test]
    fn pull_policies() {
        let cases = [
            ("nginx", "Always"),
            ("nginx:latest", "Always"),
            ("nginx:1.27", "IfNotPresent"),
            ("localhost:5000/app", "Always"),
            ("localhost:5000/app:v1", "IfNotPresent"),
            ("app@sha256:abcd", "IfNotPresent"),
        ];
        for (image, want) in cases {
            assert_eq!(image_pull_policy(image), want, "{image}");
        }
    }

    #[test]
    fn pod_defaults_and_mirror_pods() {
        let mut pod = json!({ "metadata": { "name": "p" }, "spec": { "containers": [{ "name": "c", "image": "a:1" }] } });
        prepare_create(pods(), &mut pod);
        assert_eq!(pod["spec"]["terminationGracePeriodSeconds"], 30);
        assert_eq!(pod["spec"]["restartPolicy"], "Always");
        assert_eq!(
            pod["spec"]["containers"][0]["imagePullPolicy"],
            "IfNotPresent"
        );
        assert_eq!(pod["status"]["phase"], "Pending");
        assert_eq!(pod["metadata"]["generation"], 1);

        let mut mirror = json!({
            "metadata": { "name": "m", "annotations": { MIRROR_ANNOTATION: "x" } },
            "spec": { "containers": [{ "name": "c", "image": "a" }] },
        });
        prepare_create(pods(), &mut mirror);
        assert_eq!(
            mirror["spec"],
            json!({ "containers": [{ "name": "c", "image": "a" }] })
        );
    }

    #[test]
    fn grace_periods() {
        let scheduled = json!({ "spec": { "nodeName": "n", "terminationGracePeriodSeconds": 10 } });
        assert_eq!(grace_period(pods(), &scheduled, None), Some(10));
        assert_eq!(grace_period(pods(), &scheduled, Some(3)), Some(3));
        assert_eq!(grace_period(pods(), &scheduled, Some(-5)), Some(1));
        let unscheduled = json!({ "spec": {} });
        assert_eq!(grace_period(pods(), &unscheduled, Some(30)), Some(0));
        let done = json!({ "spec": { "nodeName": "n" }, "status": { "phase": "Succeeded" } });
        assert_eq!(grace_period(pods(), &done, None), Some(0));
        let nodes = find("", "v1", "nodes").expect("nodes are served");
        assert_eq!(grace_period(nodes, &scheduled, None), None);
    }
}
