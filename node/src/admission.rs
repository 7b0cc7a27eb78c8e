//! Pod admission: what the kubelet decides before a pod may start on this node.
//!
//! This is upstream's `lifecycle.NewPredicateAdmitHandler` as pure functions: [`admit`]
//! takes the pod, the pods already admitted and a [`NodeInfo`], and returns the
//! [`Rejection`] the kubelet would write into `status.reason` / `status.message`.
//! [`crate::resources::pod_requests`] is the effective-request formula the resource
//! check uses.
//!
//! Checks run in upstream's order (`pkg/kubelet/lifecycle/predicate.go`: `Admit`, then
//! `generalFilter`, which runs the scheduler's `AdmissionCheck` and a taint check), and
//! the first failure is reported, as the kubelet reports `reasons[0]`:
//!
//! 1. the pod's *label* `kubernetes.io/os` against the node's OS —
//!    `PodOSSelectorNodeLabelDoesNotMatch`;
//! 2. `spec.os.name` against the node's OS — `PodOSNotSupported`;
//! 3. resources (`NodeResourcesFit`): the pod count, then cpu, memory,
//!    ephemeral-storage, then hugepages and extended resources by name —
//!    `OutOfpods`, `OutOfcpu`, …, `OutOf<resource>`;
//! 4. `spec.nodeSelector` and required node affinity — `NodeAffinity`;
//! 5. `spec.nodeName` against the node's name — `NodeName`;
//! 6. the node's `NoExecute` taints, skipped for static pods — `TaintToleration`.
//!
//! Extended resources (`example.com/foo`) the node does not advertise at all are
//! dropped from the pod's request before the resource check, as upstream does
//! (`removeMissingExtendedResources`: they may be cluster-level or DRA-backed).
//!
//! Not done here, unlike upstream:
//! - host port conflicts (the `NodePorts` predicate);
//! - `SupplementalGroupsPolicy: Strict` on a node without that feature;
//! - device-plugin allocation and DRA-backed extended resources;
//! - preemption: upstream's `CriticalPodAdmissionHandler` evicts lower-priority pods
//!   to make room for a critical pod (priority >= 2000000000). Here a critical pod
//!   that does not fit is rejected like any other;
//! - the label key/value syntax checks of selectors (API validation does those).
//!
//! Quantities are rounded up to whole millicores (cpu) or whole units (everything
//! else) one by one before they are summed; upstream sums exactly and rounds once.
//! The two differ only for sub-millicore or fractional-byte requests.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, Pod, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::resources::{Units, add, is_extended, is_scalar, requests_in_units, to_units};

/// The node label holding the operating system.
pub const LABEL_OS: &str = "kubernetes.io/os";
/// The node label holding the CPU architecture.
pub const LABEL_ARCH: &str = "kubernetes.io/arch";

/// Reason: the pod's `kubernetes.io/os` label names another OS.
pub const REASON_OS_LABEL: &str = "PodOSSelectorNodeLabelDoesNotMatch";
/// Reason: the pod's `spec.os.name` names another OS.
pub const REASON_OS_FIELD: &str = "PodOSNotSupported";
/// Reason: something that should not happen (an unparsable quantity).
pub const REASON_UNEXPECTED: &str = "UnexpectedAdmissionError";
/// Reason prefix for a resource that does not fit: `OutOfcpu`, `OutOfexample.com/foo`.
pub const REASON_OUT_OF_PREFIX: &str = "OutOf";
/// Reason (predicate name): nodeSelector or required node affinity does not match.
pub const REASON_NODE_AFFINITY: &str = "NodeAffinity";
/// Reason (predicate name): `spec.nodeName` names another node.
pub const REASON_NODE_NAME: &str = "NodeName";
/// Reason (predicate name): a `NoExecute` taint the pod does not tolerate.
pub const REASON_TAINT_TOLERATION: &str = "TaintToleration";

const MESSAGE_OS_LABEL: &str =
    "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label";
const MESSAGE_OS_FIELD: &str = "Failed to admit pod as the OS field doesn't match node OS";
const DESC_NODE_AFFINITY: &str = "node(s) didn't match Pod's node affinity/selector";
const DESC_NODE_NAME: &str = "node(s) didn't match the requested node name";
const DESC_TAINT_TOLERATION: &str = "node(s) had taints that the pod didn't tolerate";

/// What the node offers to pods.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeInfo {
    /// The node's name, matched by `spec.nodeName` and by `matchFields` on `metadata.name`.
    pub name: String,
    /// Allocatable resources by name: `cpu`, `memory`, `ephemeral-storage`, `pods`,
    /// `hugepages-2Mi`, `example.com/foo`, ….
    pub allocatable: BTreeMap<String, Quantity>,
    /// The node's labels.
    pub labels: BTreeMap<String, String>,
    /// The node's taints; only `NoExecute` ones matter for admission.
    pub taints: Vec<Taint>,
    /// The operating system (`linux`): the kubelet's `runtime.GOOS`.
    pub os: String,
    /// The architecture (`amd64`): the kubelet's `runtime.GOARCH`.
    pub arch: String,
}

/// Why a pod is rejected: `reason` as the kubelet writes it into `status.reason`,
/// `message` as it writes it into `status.message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub reason: String,
    pub message: String,
}

impl Rejection {
    fn new(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            message: message.into(),
        }
    }

    /// Upstream's `PredicateFailureError`: reason is the predicate's name.
    fn predicate(name: &str, desc: &str) -> Self {
        Self::new(name, format!("Predicate {name} failed: {desc}"))
    }

    /// Upstream's `InsufficientResourceError`, cpu in millicores, the rest in units.
    fn insufficient(resource: &str, requested: i64, used: i64, capacity: i64) -> Self {
        Self::new(
            format!("{REASON_OUT_OF_PREFIX}{resource}"),
            format!(
                "Node didn't have enough resource: {resource}, requested: {requested}, \
                 used: {used}, capacity: {capacity}"
            ),
        )
    }

    fn unexpected(error: &str) -> Self {
        Self::new(
            REASON_UNEXPECTED,
            format!("Failed to admit pod: {error}, which is unexpected."),
        )
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.reason, self.message)
    }
}

impl std::error::Error for Rejection {}

/// Decides whether `pod` may run on `node` next to `admitted`: the pods already
/// admitted and not yet terminal (the caller filters those).
pub fn admit(pod: &Pod, admitted: &[Pod], node: &NodeInfo) -> Result<(), Rejection> {
    let os = node_os(node);
    if label(pod, LABEL_OS).is_some_and(|l| l != os) {
        return Err(Rejection::new(REASON_OS_LABEL, MESSAGE_OS_LABEL));
    }
    if let Some(pod_os) = pod.spec.as_ref().and_then(|s| s.os.as_ref())
        && pod_os.name != os
    {
        return Err(Rejection::new(REASON_OS_FIELD, MESSAGE_OS_FIELD));
    }

    fits_resources(pod, admitted, node)?;

    if !matches_node_affinity(pod, &node_labels(node), &node.name) {
        return Err(Rejection::predicate(
            REASON_NODE_AFFINITY,
            DESC_NODE_AFFINITY,
        ));
    }
    if let Some(name) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
        && !name.is_empty()
        && name != node.name
    {
        return Err(Rejection::predicate(REASON_NODE_NAME, DESC_NODE_NAME));
    }
    if !crate::pod::is_static(pod) {
        let tolerations = pod
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.as_deref())
            .unwrap_or_default();
        let untolerated = node
            .taints
            .iter()
            .filter(|t| t.effect == "NoExecute")
            .any(|t| !tolerations.iter().any(|tol| tolerates(tol, t)));
        if untolerated {
            return Err(Rejection::predicate(
                REASON_TAINT_TOLERATION,
                DESC_TAINT_TOLERATION,
            ));
        }
    }
    Ok(())
}

/// `NodeResourcesFit`'s `fitsRequest`, returning the first insufficiency.
fn fits_resources(pod: &Pod, admitted: &[Pod], node: &NodeInfo) -> Result<(), Rejection> {
    let mut allocatable = Units::new();
    for (name, q) in &node.allocatable {
        if let Some(v) = to_units(name, q, true).map_err(|e| Rejection::unexpected(&e))? {
            allocatable.insert(name.clone(), v);
        }
    }
    let node_has = |name: &str| !is_extended(name) || allocatable.contains_key(name);
    let request = requests_in_units(pod, &node_has, true).map_err(|e| Rejection::unexpected(&e))?;
    let mut used = Units::new();
    for other in admitted {
        let r = requests_in_units(other, &|_| true, true).map_err(|e| Rejection::unexpected(&e))?;
        add(&mut used, &r);
    }

    let pods = i64::try_from(admitted.len()).unwrap_or(i64::MAX);
    let allowed = allocatable.get("pods").copied().unwrap_or(0);
    if pods.saturating_add(1) > allowed {
        return Err(Rejection::insufficient("pods", 1, pods, allowed));
    }

    const NATIVE: [&str; 3] = ["cpu", "memory", "ephemeral-storage"];
    let scalars = request
        .keys()
        .map(String::as_str)
        .filter(|n| !NATIVE.contains(n) && is_scalar(n));
    for name in NATIVE.into_iter().chain(scalars) {
        let requested = request.get(name).copied().unwrap_or(0);
        if requested <= 0 {
            continue;
        }
        let in_use = used.get(name).copied().unwrap_or(0);
        let capacity = allocatable.get(name).copied().unwrap_or(0);
        if requested > capacity.saturating_sub(in_use) {
            return Err(Rejection::insufficient(name, requested, in_use, capacity));
        }
    }
    Ok(())
}

/// The node's OS as the kubelet sees it (its own GOOS), falling back to its label.
fn node_os(node: &NodeInfo) -> &str {
    if node.os.is_empty() {
        node.labels.get(LABEL_OS).map_or("", String::as_str)
    } else {
        &node.os
    }
}

/// The labels selectors see. Upstream's OS check forces `kubernetes.io/os` to the
/// kubelet's own OS on the node object; `kubernetes.io/arch`, which the kubelet sets
/// at registration, is filled in from [`NodeInfo::arch`] when missing.
fn node_labels(node: &NodeInfo) -> BTreeMap<String, String> {
    let mut labels = node.labels.clone();
    let os = node_os(node);
    if !os.is_empty() {
        labels.insert(LABEL_OS.to_owned(), os.to_owned());
    }
    if !node.arch.is_empty() {
        labels
            .entry(LABEL_ARCH.to_owned())
            .or_insert_with(|| node.arch.clone());
    }
    labels
}

fn label<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// `nodeaffinity.GetRequiredNodeAffinity(pod).Match(node)`: every nodeSelector pair,
/// and at least one required term.
fn matches_node_affinity(pod: &Pod, labels: &BTreeMap<String, String>, node_name: &str) -> bool {
    let Some(spec) = &pod.spec else {
        return true;
    };
    let selector_ok = spec
        .node_selector
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    if !selector_ok {
        return false;
    }
    let Some(required) = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
    else {
        return true;
    };
    // Terms are ORed; an empty term selects nothing, so no usable term means no match.
    required.node_selector_terms.iter().any(|term| {
        let expressions = term.match_expressions.as_deref().unwrap_or_default();
        let fields = term.match_fields.as_deref().unwrap_or_default();
        if expressions.is_empty() && fields.is_empty() {
            return false;
        }
        // An invalid requirement makes its whole term fail, whatever the others say.
        let Some(expressions_ok) = expressions
            .iter()
            .map(|r| label_requirement_matches(r, labels))
            .collect::<Option<Vec<bool>>>()
        else {
            return false;
        };
        let Some(fields_ok) = fields
            .iter()
            .map(|r| field_requirement_matches(r, node_name))
            .collect::<Option<Vec<bool>>>()
        else {
            return false;
        };
        // Upstream skips field requirements when the node has no name.
        expressions_ok.into_iter().all(|ok| ok)
            && (node_name.is_empty() || fields_ok.into_iter().all(|ok| ok))
    })
}

/// One `matchExpressions` requirement (`labels.Requirement.Matches`); `None` when the
/// requirement is invalid (`labels.NewRequirement` would refuse it).
fn label_requirement_matches(
    r: &NodeSelectorRequirement,
    labels: &BTreeMap<String, String>,
) -> Option<bool> {
    let values = r.values.as_deref().unwrap_or_default();
    let value = labels.get(&r.key);
    match r.operator.as_str() {
        "In" | "NotIn" if values.is_empty() => None,
        "In" => Some(value.is_some_and(|v| values.contains(v))),
        "NotIn" => Some(value.is_none_or(|v| !values.contains(v))),
        "Exists" | "DoesNotExist" if !values.is_empty() => None,
        "Exists" => Some(value.is_some()),
        "DoesNotExist" => Some(value.is_none()),
        op @ ("Gt" | "Lt") => {
            let [bound] = values else {
                return None;
            };
            let bound: i64 = bound.parse().ok()?;
            let Some(Ok(actual)) = value.map(|v| v.parse::<i64>()) else {
                return Some(false);
            };
            Some(if op == "Gt" {
                actual > bound
            } else {
                actual < bound
            })
        }
        _ => None,
    }
}

/// One `matchFields` requirement: only `In`/`NotIn` with exactly one value; the only
/// node field is `metadata.name`.
fn field_requirement_matches(r: &NodeSelectorRequirement, node_name: &str) -> Option<bool> {
    let [value] = r.values.as_deref().unwrap_or_default() else {
        return None;
    };
    let actual = if r.key == "metadata.name" {
        node_name
    } else {
        ""
    };
    match r.operator.as_str() {
        "In" => Some(actual == value),
        "NotIn" => Some(actual != value),
        _ => None,
    }
}

/// `Toleration.ToleratesTaint`: an empty effect matches every effect, an empty key
/// (with `Exists`) every key; an empty operator means `Equal`.
fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    let effect = t.effect.as_deref().unwrap_or_default();
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = t.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match t.operator.as_deref().unwrap_or_default() {
        "" | "Equal" => {
            t.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default()
        }
        "Exists" => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn pod(spec: Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).unwrap()
    }

    fn pod_with_meta(metadata: Value, spec: Value) -> Pod {
        serde_json::from_value(json!({"metadata": metadata, "spec": spec})).unwrap()
    }

    /// A pod with one container requesting `requests`.
    fn requesting(requests: Value) -> Pod {
        pod(json!({"containers": [{"name": "c", "resources": {"requests": requests}}]}))
    }

    fn node(allocatable: &[(&str, &str)]) -> NodeInfo {
        NodeInfo {
            name: "node-a".into(),
            allocatable: allocatable
                .iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect(),
            labels: BTreeMap::from([("kubernetes.io/hostname".into(), "node-a".into())]),
            taints: vec![],
            os: "linux".into(),
            arch: "amd64".into(),
        }
    }

    fn roomy() -> NodeInfo {
        node(&[
            ("cpu", "4"),
            ("memory", "8Gi"),
            ("ephemeral-storage", "100Gi"),
            ("pods", "110"),
        ])
    }

    fn reject(reason: &str, message: &str) -> Result<(), Rejection> {
        Err(Rejection::new(reason, message))
    }

    /// A pod's effective requests as sorted pairs.
    type Requests = Vec<(String, f64)>;

    fn requests_of(p: &Pod) -> Requests {
        crate::resources::pod_requests(p).into_iter().collect()
    }

    fn r(pairs: &[(&str, f64)]) -> Requests {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn effective_request_formula() {
        let cases: Vec<(&str, Value, Requests)> = vec![
            (
                "containers add up",
                json!({"containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}}},
                    {"name": "b", "resources": {"requests": {"cpu": "500m"}}},
                ]}),
                r(&[("cpu", 0.75), ("memory", 67108864.0)]),
            ),
            (
                "an init container bigger than the sum wins, per resource",
                json!({
                    "initContainers": [
                        {"name": "i1", "resources": {"requests": {"cpu": "2", "memory": "1G"}}},
                        {"name": "i2", "resources": {"requests": {"cpu": "2", "memory": "3G"}}},
                    ],
                    "containers": [
                        {"name": "c1", "resources": {"requests": {"cpu": "2", "memory": "1G"}}},
                        {"name": "c2", "resources": {"requests": {"cpu": "1", "memory": "1G"}}},
                    ],
                }),
                r(&[("cpu", 3.0), ("memory", 3e9)]),
            ),
            (
                "init containers take the max, not the sum",
                json!({
                    "initContainers": [
                        {"name": "i1", "resources": {"requests": {"cpu": "1"}}},
                        {"name": "i2", "resources": {"requests": {"cpu": "1"}}},
                    ],
                    "containers": [{"name": "c", "resources": {"requests": {"cpu": "500m"}}}],
                }),
                r(&[("cpu", 1.0)]),
            ),
            (
                "a sidecar adds to the sum",
                json!({
                    "initContainers": [
                        {"name": "s", "restartPolicy": "Always",
                         "resources": {"requests": {"cpu": "200m"}}},
                    ],
                    "containers": [{"name": "c", "resources": {"requests": {"cpu": "500m"}}}],
                }),
                r(&[("cpu", 0.7)]),
            ),
            (
                "an init container after a sidecar runs next to it",
                json!({
                    "initContainers": [
                        {"name": "s", "restartPolicy": "Always",
                         "resources": {"requests": {"cpu": "500m"}}},
                        {"name": "i", "resources": {"requests": {"cpu": "1"}}},
                    ],
                    "containers": [{"name": "c", "resources": {"requests": {"cpu": "100m"}}}],
                }),
                r(&[("cpu", 1.5)]),
            ),
            (
                "an init container before a sidecar does not",
                json!({
                    "initContainers": [
                        {"name": "i", "resources": {"requests": {"cpu": "1"}}},
                        {"name": "s", "restartPolicy": "Always",
                         "resources": {"requests": {"cpu": "500m"}}},
                    ],
                    "containers": [{"name": "c", "resources": {"requests": {"cpu": "100m"}}}],
                }),
                r(&[("cpu", 1.0)]),
            ),
            (
                "a limit without a request is the request",
                json!({"containers": [
                    {"name": "a", "resources": {"limits": {"cpu": "1", "memory": "1Gi"},
                                                "requests": {"cpu": "100m"}}},
                ]}),
                r(&[("cpu", 0.1), ("memory", 1073741824.0)]),
            ),
            (
                "an init container's limit counts too",
                json!({
                    "initContainers": [{"name": "i", "resources": {"limits": {"memory": "2Gi"}}}],
                    "containers": [{"name": "c", "resources": {"requests": {"memory": "1Gi"}}}],
                }),
                r(&[("memory", 2147483648.0)]),
            ),
            (
                "overhead is added after the max",
                json!({
                    "overhead": {"cpu": "250m", "memory": "120Mi"},
                    "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "2"}}}],
                    "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
                }),
                r(&[("cpu", 2.25), ("memory", 125829120.0)]),
            ),
            (
                "pod-level requests replace the containers' sum",
                json!({
                    "resources": {"requests": {"cpu": "2"}, "limits": {"memory": "1Gi"}},
                    "containers": [
                        {"name": "c", "resources": {"requests": {"cpu": "1", "example.com/foo": "1"}}},
                    ],
                }),
                r(&[
                    ("cpu", 2.0),
                    ("example.com/foo", 1.0),
                    ("memory", 1073741824.0),
                ]),
            ),
            (
                "extended resources and hugepages",
                json!({"containers": [
                    {"name": "a", "resources": {"requests": {"example.com/foo": "2",
                                                             "hugepages-2Mi": "4Mi"}}},
                    {"name": "b", "resources": {"limits": {"example.com/foo": "1"}}},
                ]}),
                r(&[("example.com/foo", 3.0), ("hugepages-2Mi", 4194304.0)]),
            ),
            (
                "no requests at all",
                json!({"containers": [{"name": "c"}]}),
                r(&[]),
            ),
            (
                "float noise does not round up",
                json!({"containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "0.1"}}},
                    {"name": "b", "resources": {"requests": {"cpu": "0.2"}}},
                ]}),
                r(&[("cpu", 0.3)]),
            ),
            (
                "a sub-millicore request rounds up to a millicore",
                json!({"containers": [{"name": "a", "resources": {"requests": {"cpu": "0.0001"}}}]}),
                r(&[("cpu", 0.001)]),
            ),
        ];
        for (name, spec, want) in cases {
            assert_eq!(requests_of(&pod(spec)), want, "{name}");
        }
    }

    #[test]
    fn resources_fit_or_not() {
        let node = node(&[
            ("cpu", "1500m"),
            ("memory", "1Gi"),
            ("ephemeral-storage", "10Gi"),
            ("pods", "110"),
            ("hugepages-2Mi", "8Mi"),
            ("example.com/foo", "2"),
        ]);
        let running = [requesting(json!({
            "cpu": "500m", "memory": "512Mi", "ephemeral-storage": "1Gi",
            "hugepages-2Mi": "4Mi", "example.com/foo": "1",
        }))];
        let cases: Vec<(&str, Value, Result<(), Rejection>)> = vec![
            ("fits", json!({"cpu": "1", "memory": "512Mi"}), Ok(())),
            (
                "cpu in millicores",
                json!({"cpu": "2"}),
                reject(
                    "OutOfcpu",
                    "Node didn't have enough resource: cpu, requested: 2000, used: 500, capacity: 1500",
                ),
            ),
            (
                "memory in bytes",
                json!({"memory": "513Mi"}),
                reject(
                    "OutOfmemory",
                    "Node didn't have enough resource: memory, requested: 537919488, \
                     used: 536870912, capacity: 1073741824",
                ),
            ),
            (
                "ephemeral storage",
                json!({"ephemeral-storage": "10Gi"}),
                reject(
                    "OutOfephemeral-storage",
                    "Node didn't have enough resource: ephemeral-storage, requested: 10737418240, \
                     used: 1073741824, capacity: 10737418240",
                ),
            ),
            (
                "hugepages",
                json!({"hugepages-2Mi": "6Mi"}),
                reject(
                    "OutOfhugepages-2Mi",
                    "Node didn't have enough resource: hugepages-2Mi, requested: 6291456, \
                     used: 4194304, capacity: 8388608",
                ),
            ),
            (
                "extended resource",
                json!({"example.com/foo": "2"}),
                reject(
                    "OutOfexample.com/foo",
                    "Node didn't have enough resource: example.com/foo, requested: 2, used: 1, capacity: 2",
                ),
            ),
            (
                "exactly full fits",
                json!({"cpu": "1", "example.com/foo": "1"}),
                Ok(()),
            ),
            (
                "cpu is reported before memory",
                json!({"cpu": "2", "memory": "2Gi"}),
                reject(
                    "OutOfcpu",
                    "Node didn't have enough resource: cpu, requested: 2000, used: 500, capacity: 1500",
                ),
            ),
            (
                "extended resources the node lacks are not checked",
                json!({"other.example.com/bar": "5"}),
                Ok(()),
            ),
            (
                "hugepages the node lacks count as zero",
                json!({"hugepages-1Gi": "1Gi"}),
                reject(
                    "OutOfhugepages-1Gi",
                    "Node didn't have enough resource: hugepages-1Gi, requested: 1073741824, \
                     used: 0, capacity: 0",
                ),
            ),
            (
                "zero requests never reject",
                json!({"cpu": "0", "hugepages-1Gi": "0", "example.com/foo": "0"}),
                Ok(()),
            ),
            (
                "unaccounted resources are ignored",
                json!({"foo": "100"}),
                Ok(()),
            ),
            (
                "an unparsable quantity",
                json!({"cpu": "lots"}),
                reject(
                    "UnexpectedAdmissionError",
                    "Failed to admit pod: resource cpu: invalid quantity \"lots\", which is unexpected.",
                ),
            ),
        ];
        for (name, requests, want) in cases {
            assert_eq!(
                admit(&requesting(requests), &running, &node),
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn resources_missing_from_the_node_count_as_zero() {
        let node = node(&[("pods", "10")]);
        assert_eq!(
            admit(&requesting(json!({"memory": "1"})), &[], &node),
            reject(
                "OutOfmemory",
                "Node didn't have enough resource: memory, requested: 1, used: 0, capacity: 0"
            )
        );
        assert_eq!(admit(&requesting(json!({})), &[], &node), Ok(()));
    }

    #[test]
    fn used_counts_the_admitted_pods_effective_requests() {
        let node = node(&[("cpu", "2"), ("pods", "10")]);
        let with_init_and_overhead = pod(json!({
            "overhead": {"cpu": "100m"},
            "initContainers": [{"name": "i", "resources": {"limits": {"cpu": "1"}}}],
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "200m"}}}],
        }));
        assert_eq!(
            admit(
                &requesting(json!({"cpu": "1"})),
                &[with_init_and_overhead],
                &node
            ),
            reject(
                "OutOfcpu",
                "Node didn't have enough resource: cpu, requested: 1000, used: 1100, capacity: 2000"
            )
        );
    }

    #[test]
    fn candidate_pod_overhead_and_sidecars_count() {
        let node = node(&[("memory", "1Gi"), ("pods", "10")]);
        let p = pod(json!({
            "overhead": {"memory": "1Mi"},
            "initContainers": [{"name": "s", "restartPolicy": "Always",
                                "resources": {"requests": {"memory": "512Mi"}}}],
            "containers": [{"name": "c", "resources": {"requests": {"memory": "512Mi"}}}],
        }));
        assert_eq!(
            admit(&p, &[], &node),
            reject(
                "OutOfmemory",
                "Node didn't have enough resource: memory, requested: 1074790400, used: 0, \
                 capacity: 1073741824"
            )
        );
    }

    #[test]
    fn pod_count() {
        let node = node(&[("cpu", "4"), ("pods", "2")]);
        let empty = requesting(json!({}));
        assert_eq!(admit(&empty, std::slice::from_ref(&empty), &node), Ok(()));
        let want = reject(
            "OutOfpods",
            "Node didn't have enough resource: pods, requested: 1, used: 2, capacity: 2",
        );
        assert_eq!(admit(&empty, &[empty.clone(), empty.clone()], &node), want);
        // The pod count is checked before cpu.
        let big = requesting(json!({"cpu": "8"}));
        assert_eq!(admit(&big, &[empty.clone(), empty.clone()], &node), want);
        // A node without `pods` admits nothing, as upstream.
        assert_eq!(
            admit(&empty, &[], &NodeInfo::default()),
            reject(
                "OutOfpods",
                "Node didn't have enough resource: pods, requested: 1, used: 0, capacity: 0"
            )
        );
    }

    fn affinity(terms: Value) -> Pod {
        pod(json!({
            "containers": [{"name": "c"}],
            "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms},
            }},
        }))
    }

    fn expr(key: &str, operator: &str, values: &[&str]) -> Value {
        json!({"matchExpressions": [{"key": key, "operator": operator, "values": values}]})
    }

    const NODE_AFFINITY_MESSAGE: &str =
        "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector";

    #[test]
    fn node_affinity_operators() {
        let mut n = roomy();
        n.labels.insert("zone".into(), "a".into());
        n.labels.insert("cores".into(), "8".into());
        n.labels.insert("weird".into(), "eight".into());
        let cases: Vec<(&str, Value, bool)> = vec![
            ("In matches", json!([expr("zone", "In", &["b", "a"])]), true),
            ("In other value", json!([expr("zone", "In", &["b"])]), false),
            (
                "In missing label",
                json!([expr("rack", "In", &["a"])]),
                false,
            ),
            (
                "In without values is invalid",
                json!([expr("zone", "In", &[])]),
                false,
            ),
            (
                "NotIn other value",
                json!([expr("zone", "NotIn", &["b"])]),
                true,
            ),
            (
                "NotIn same value",
                json!([expr("zone", "NotIn", &["a"])]),
                false,
            ),
            (
                "NotIn missing label",
                json!([expr("rack", "NotIn", &["a"])]),
                true,
            ),
            ("Exists", json!([expr("zone", "Exists", &[])]), true),
            (
                "Exists missing",
                json!([expr("rack", "Exists", &[])]),
                false,
            ),
            (
                "Exists with values is invalid",
                json!([expr("zone", "Exists", &["a"])]),
                false,
            ),
            (
                "DoesNotExist missing",
                json!([expr("rack", "DoesNotExist", &[])]),
                true,
            ),
            (
                "DoesNotExist present",
                json!([expr("zone", "DoesNotExist", &[])]),
                false,
            ),
            (
                "Gt smaller bound",
                json!([expr("cores", "Gt", &["4"])]),
                true,
            ),
            (
                "Gt equal bound",
                json!([expr("cores", "Gt", &["8"])]),
                false,
            ),
            (
                "Lt larger bound",
                json!([expr("cores", "Lt", &["16"])]),
                true,
            ),
            (
                "Lt smaller bound",
                json!([expr("cores", "Lt", &["4"])]),
                false,
            ),
            (
                "a signed bound parses",
                json!([expr("cores", "Gt", &["+4"])]),
                true,
            ),
            (
                "Gt negative bound",
                json!([expr("cores", "Gt", &["-1"])]),
                true,
            ),
            (
                "Gt on a non-integer label",
                json!([expr("weird", "Gt", &["1"])]),
                false,
            ),
            (
                "Lt on a missing label",
                json!([expr("rack", "Lt", &["100"])]),
                false,
            ),
            (
                "Gt with a non-integer bound",
                json!([expr("cores", "Gt", &["4.5"])]),
                false,
            ),
            (
                "Gt with two bounds",
                json!([expr("cores", "Gt", &["1", "2"])]),
                false,
            ),
            (
                "unknown operator",
                json!([expr("zone", "Equals", &["a"])]),
                false,
            ),
            (
                "expressions in a term are ANDed",
                json!([{"matchExpressions": [
                    {"key": "zone", "operator": "In", "values": ["a"]},
                    {"key": "cores", "operator": "Gt", "values": ["10"]},
                ]}]),
                false,
            ),
            (
                "terms are ORed",
                json!([expr("zone", "In", &["b"]), expr("cores", "Gt", &["2"])]),
                true,
            ),
            (
                "an invalid term does not spoil a valid one",
                json!([expr("zone", "In", &[]), expr("zone", "In", &["a"])]),
                true,
            ),
            (
                "an invalid requirement spoils its term",
                json!([{"matchExpressions": [
                    {"key": "zone", "operator": "In", "values": ["a"]},
                    {"key": "zone", "operator": "Bogus"},
                ]}]),
                false,
            ),
            ("an empty term matches nothing", json!([{}]), false),
            ("no terms match nothing", json!([]), false),
            (
                "matchFields In the node name",
                json!([{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]),
                true,
            ),
            (
                "matchFields In another name",
                json!([{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": ["node-b"]}]}]),
                false,
            ),
            (
                "matchFields NotIn another name",
                json!([{"matchFields": [
                    {"key": "metadata.name", "operator": "NotIn", "values": ["node-b"]}]}]),
                true,
            ),
            (
                "matchFields with two values is invalid",
                json!([{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": ["node-a", "node-b"]}]}]),
                false,
            ),
            (
                "matchFields with Exists is invalid",
                json!([{"matchFields": [{"key": "metadata.name", "operator": "Exists"}]}]),
                false,
            ),
            (
                "matchFields and matchExpressions are ANDed",
                json!([{
                    "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}],
                    "matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}],
                }]),
                false,
            ),
            (
                "the os label is the node's OS",
                json!([expr(LABEL_OS, "In", &["linux"])]),
                true,
            ),
            (
                "the arch label is filled in",
                json!([expr(LABEL_ARCH, "In", &["amd64"])]),
                true,
            ),
        ];
        for (name, terms, fits) in cases {
            let want = if fits {
                Ok(())
            } else {
                reject("NodeAffinity", NODE_AFFINITY_MESSAGE)
            };
            assert_eq!(admit(&affinity(terms), &[], &n), want, "{name}");
        }
    }

    #[test]
    fn match_fields_are_ignored_on_a_nameless_node() {
        let mut n = roomy();
        n.name = String::new();
        let p = affinity(json!([{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["node-b"]}]}]));
        assert_eq!(admit(&p, &[], &n), Ok(()));
    }

    #[test]
    fn node_selector() {
        let mut n = roomy();
        n.labels.insert("disk".into(), "ssd".into());
        n.labels.insert("kubernetes.io/arch".into(), "arm64".into());
        let cases: Vec<(&str, Value, bool)> = vec![
            ("matching", json!({"disk": "ssd"}), true),
            (
                "all pairs must match",
                json!({"disk": "ssd", "gpu": "yes"}),
                false,
            ),
            ("other value", json!({"disk": "hdd"}), false),
            ("missing label, empty value", json!({"gpu": ""}), false),
            (
                "os via nodeSelector",
                json!({"kubernetes.io/os": "linux"}),
                true,
            ),
            (
                "other os via nodeSelector",
                json!({"kubernetes.io/os": "windows"}),
                false,
            ),
            (
                "the node's arch label wins",
                json!({"kubernetes.io/arch": "arm64"}),
                true,
            ),
            ("other arch", json!({"kubernetes.io/arch": "amd64"}), false),
        ];
        for (name, selector, fits) in cases {
            let p = pod(json!({"containers": [{"name": "c"}], "nodeSelector": selector}));
            let want = if fits {
                Ok(())
            } else {
                reject("NodeAffinity", NODE_AFFINITY_MESSAGE)
            };
            assert_eq!(admit(&p, &[], &n), want, "{name}");
        }
    }

    #[test]
    fn node_selector_and_affinity_must_both_match() {
        let mut n = roomy();
        n.labels.insert("zone".into(), "a".into());
        let mut p = affinity(json!([expr("zone", "In", &["a"])]));
        p.spec.as_mut().unwrap().node_selector =
            Some(BTreeMap::from([("zone".into(), "b".into())]));
        assert_eq!(
            admit(&p, &[], &n),
            reject("NodeAffinity", NODE_AFFINITY_MESSAGE)
        );
    }

    #[test]
    fn operating_system() {
        let n = roomy();
        let cases: Vec<(&str, Pod, Result<(), Rejection>)> = vec![
            ("no os", pod(json!({"containers": []})), Ok(())),
            (
                "os field matches",
                pod(json!({"containers": [], "os": {"name": "linux"}})),
                Ok(()),
            ),
            (
                "os field differs",
                pod(json!({"containers": [], "os": {"name": "windows"}})),
                reject(
                    "PodOSNotSupported",
                    "Failed to admit pod as the OS field doesn't match node OS",
                ),
            ),
            (
                "os label differs",
                pod_with_meta(
                    json!({"name": "p", "labels": {"kubernetes.io/os": "windows"}}),
                    json!({"containers": []}),
                ),
                reject(
                    "PodOSSelectorNodeLabelDoesNotMatch",
                    "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label",
                ),
            ),
            (
                "os label matches",
                pod_with_meta(
                    json!({"name": "p", "labels": {"kubernetes.io/os": "linux"}}),
                    json!({"containers": []}),
                ),
                Ok(()),
            ),
        ];
        for (name, p, want) in cases {
            assert_eq!(admit(&p, &[], &n), want, "{name}");
        }
    }

    #[test]
    fn os_checks_come_first_and_the_node_os_beats_its_label() {
        let mut n = node(&[("pods", "0")]);
        n.labels.insert(LABEL_OS.into(), "windows".into());
        let p = pod(json!({"containers": [], "os": {"name": "windows"}}));
        assert_eq!(
            admit(&p, &[], &n),
            reject(
                "PodOSNotSupported",
                "Failed to admit pod as the OS field doesn't match node OS"
            )
        );
    }

    #[test]
    fn node_name() {
        let n = roomy();
        let ours = pod(json!({"containers": [], "nodeName": "node-a"}));
        let theirs = pod(json!({"containers": [], "nodeName": "node-b"}));
        assert_eq!(admit(&ours, &[], &n), Ok(()));
        assert_eq!(
            admit(&theirs, &[], &n),
            reject(
                "NodeName",
                "Predicate NodeName failed: node(s) didn't match the requested node name"
            )
        );
    }

    fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: value.map(Into::into),
            effect: effect.into(),
            time_added: None,
        }
    }

    #[test]
    fn toleration_matching() {
        let t = taint("dedicated", Some("gpu"), "NoExecute");
        let cases: Vec<(&str, Value, bool)> = vec![
            (
                "Equal key and value",
                json!({"key": "dedicated", "operator": "Equal", "value": "gpu"}),
                true,
            ),
            (
                "empty operator is Equal",
                json!({"key": "dedicated", "value": "gpu"}),
                true,
            ),
            (
                "Equal other value",
                json!({"key": "dedicated", "operator": "Equal", "value": "cpu"}),
                false,
            ),
            (
                "Equal without value",
                json!({"key": "dedicated", "operator": "Equal"}),
                false,
            ),
            (
                "Exists key",
                json!({"key": "dedicated", "operator": "Exists"}),
                true,
            ),
            (
                "Exists other key",
                json!({"key": "other", "operator": "Exists"}),
                false,
            ),
            (
                "Exists empty key matches all",
                json!({"operator": "Exists"}),
                true,
            ),
            (
                "same effect",
                json!({"operator": "Exists", "effect": "NoExecute"}),
                true,
            ),
            (
                "other effect",
                json!({"operator": "Exists", "effect": "NoSchedule"}),
                false,
            ),
            (
                "unknown operator",
                json!({"key": "dedicated", "operator": "Gt", "value": "1"}),
                false,
            ),
        ];
        for (name, toleration, want) in cases {
            let tol: Toleration = serde_json::from_value(toleration).unwrap();
            assert_eq!(tolerates(&tol, &t), want, "{name}");
        }
        let valueless = taint("node.kubernetes.io/unreachable", None, "NoExecute");
        let tol: Toleration = serde_json::from_value(
            json!({"key": "node.kubernetes.io/unreachable", "operator": "Equal"}),
        )
        .unwrap();
        assert!(
            tolerates(&tol, &valueless),
            "an empty value equals a missing one"
        );
    }

    const TAINT_MESSAGE: &str =
        "Predicate TaintToleration failed: node(s) had taints that the pod didn't tolerate";

    #[test]
    fn only_no_execute_taints_reject() {
        let mut n = roomy();
        n.taints = vec![
            taint("a", None, "NoSchedule"),
            taint("b", None, "PreferNoSchedule"),
        ];
        let plain = pod(json!({"containers": []}));
        assert_eq!(admit(&plain, &[], &n), Ok(()));

        n.taints.push(taint("c", Some("x"), "NoExecute"));
        n.taints.push(taint("d", None, "NoExecute"));
        assert_eq!(
            admit(&plain, &[], &n),
            reject("TaintToleration", TAINT_MESSAGE)
        );

        let one = pod(json!({"containers": [], "tolerations": [
            {"key": "c", "operator": "Equal", "value": "x"},
        ]}));
        assert_eq!(
            admit(&one, &[], &n),
            reject("TaintToleration", TAINT_MESSAGE)
        );

        let both = pod(json!({"containers": [], "tolerations": [
            {"key": "c", "operator": "Equal", "value": "x", "effect": "NoExecute"},
            {"key": "d", "operator": "Exists", "tolerationSeconds": 30},
        ]}));
        assert_eq!(admit(&both, &[], &n), Ok(()));

        let everything = pod(json!({"containers": [], "tolerations": [{"operator": "Exists"}]}));
        assert_eq!(admit(&everything, &[], &n), Ok(()));
    }

    #[test]
    fn static_pods_skip_the_taint_check() {
        let mut n = roomy();
        n.taints = vec![taint("c", None, "NoExecute")];
        let from = |source: &str| {
            pod_with_meta(
                json!({"name": "p", "annotations": {"kubernetes.io/config.source": source}}),
                json!({"containers": []}),
            )
        };
        assert_eq!(admit(&from("file"), &[], &n), Ok(()));
        assert_eq!(admit(&from("http"), &[], &n), Ok(()));
        assert_eq!(
            admit(&from("api"), &[], &n),
            reject("TaintToleration", TAINT_MESSAGE)
        );
    }

    #[test]
    fn order_of_checks() {
        // Resources, then node affinity, then node name, then taints.
        let mut n = node(&[("cpu", "1"), ("pods", "10")]);
        n.taints = vec![taint("c", None, "NoExecute")];
        let everything_wrong = json!({
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}],
            "nodeSelector": {"zone": "b"},
            "nodeName": "node-b",
        });
        let out_of_cpu = reject(
            "OutOfcpu",
            "Node didn't have enough resource: cpu, requested: 2000, used: 0, capacity: 1000",
        );
        assert_eq!(admit(&pod(everything_wrong.clone()), &[], &n), out_of_cpu);

        let mut p = pod(everything_wrong);
        let spec = p.spec.as_mut().unwrap();
        spec.containers[0].resources = None;
        assert_eq!(
            admit(&p, &[], &n),
            reject("NodeAffinity", NODE_AFFINITY_MESSAGE)
        );

        p.spec.as_mut().unwrap().node_selector = None;
        assert_eq!(
            admit(&p, &[], &n),
            reject(
                "NodeName",
                "Predicate NodeName failed: node(s) didn't match the requested node name"
            )
        );

        p.spec.as_mut().unwrap().node_name = None;
        assert_eq!(admit(&p, &[], &n), reject("TaintToleration", TAINT_MESSAGE));
    }

    #[test]
    fn critical_pods_are_not_special() {
        let n = node(&[("cpu", "1"), ("pods", "10")]);
        let mut p = requesting(json!({"cpu": "2"}));
        p.spec.as_mut().unwrap().priority = Some(2_000_001_000);
        assert_eq!(admit(&p, &[], &n).unwrap_err().reason, "OutOfcpu");
    }

    #[test]
    fn rejection_displays_reason_and_message() {
        let r = Rejection::predicate(REASON_NODE_NAME, DESC_NODE_NAME);
        assert_eq!(
            r.to_string(),
            "NodeName: Predicate NodeName failed: node(s) didn't match the requested node name"
        );
    }
}
