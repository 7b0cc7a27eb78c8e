//! The three patch formats kube's client sends: JSON merge patch (RFC 7386), JSON
//! patch (RFC 6902) and the subset of strategic merge patch that node agents use.

use serde_json::{Map, Value};

use super::errors::ApiError;

/// The patch formats, by request content type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PatchType {
    Merge,
    Json,
    Strategic,
}

impl PatchType {
    /// The format for a `Content-Type` (parameters ignored); apply patches and
    /// unknown types are 415.
    pub(crate) fn from_content_type(content_type: &str) -> Result<PatchType, ApiError> {
        let media = content_type.split(';').next().unwrap_or("").trim();
        match media {
            "application/merge-patch+json" => Ok(PatchType::Merge),
            "application/json-patch+json" => Ok(PatchType::Json),
            "application/strategic-merge-patch+json" => Ok(PatchType::Strategic),
            _ => Err(ApiError::unsupported_media_type(media)),
        }
    }
}

/// Applies `body` to `target` for an object of `kind`.
pub(crate) fn apply(
    kind: &str,
    patch_type: PatchType,
    target: &mut Value,
    body: &[u8],
) -> Result<(), ApiError> {
    match patch_type {
        PatchType::Json => {
            let patch: json_patch::Patch = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
            json_patch::patch(target, &patch).map_err(|e| ApiError {
                code: 422,
                reason: "Invalid",
                message: format!(
                    "the server rejected our request due to an error in our request: {e}"
                ),
                details: None,
            })
        }
        PatchType::Merge => {
            let patch = parse_object(body)?;
            json_patch::merge(target, &patch);
            Ok(())
        }
        PatchType::Strategic => {
            let patch = parse_object(body)?;
            let (Value::Object(target), Value::Object(patch)) = (target, &patch) else {
                return Err(ApiError::bad_request(
                    "a strategic merge patch must be a JSON object",
                ));
            };
            merge_map(target, patch, &Schema { kind }, "")
        }
    }
}

fn parse_object(body: &[u8]) -> Result<Value, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid patch body: {e}")))?;
    if value.is_object() {
        Ok(value)
    } else {
        Err(ApiError::bad_request("the patch must be a JSON object"))
    }
}

/// How a list field is merged by a strategic merge patch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ListStrategy {
    /// The patch's list replaces the old one (no patch strategy in the Go types).
    Replace,
    /// Items are maps merged by the value of this key.
    MergeByKey(&'static str),
    /// A list of scalars merged as a set.
    MergeSet,
}

/// The patch strategies of the fields kubelets patch, keyed by kind and dotted path
/// (list indices left out).
struct Schema<'a> {
    kind: &'a str,
}

impl Schema<'_> {
    fn list_strategy(&self, path: &str) -> ListStrategy {
        use ListStrategy::*;
        match path {
            "metadata.ownerReferences" => return MergeByKey("uid"),
            "metadata.finalizers" => return MergeSet,
            _ => {}
        }
        let containers = [
            "spec.containers",
            "spec.initContainers",
            "spec.ephemeralContainers",
        ];
        let in_container = |suffix: &str| {
            containers
                .iter()
                .any(|c| path.strip_prefix(c).and_then(|p| p.strip_prefix('.')) == Some(suffix))
        };
        match self.kind {
            "Pod" => match path {
                p if containers.contains(&p) => MergeByKey("name"),
                _ if in_container("env") => MergeByKey("name"),
                _ if in_container("ports") => MergeByKey("containerPort"),
                _ if in_container("volumeMounts") => MergeByKey("mountPath"),
                _ if in_container("volumeDevices") => MergeByKey("devicePath"),
                "spec.volumes" | "spec.imagePullSecrets" | "spec.resourceClaims" => {
                    MergeByKey("name")
                }
                "spec.hostAliases" => MergeByKey("ip"),
                "status.conditions" => MergeByKey("type"),
                "status.podIPs" | "status.hostIPs" => MergeByKey("ip"),
                "status.resourceClaimStatuses" => MergeByKey("name"),
                _ => Replace,
            },
            // `status.addresses` is merge-by-type in the Go types (which folds
            // dual-stack InternalIPs together): writers send a `$patch: replace`.
            "Node" => match path {
                "status.conditions" => MergeByKey("type"),
                "status.addresses" => MergeByKey("type"),
                "spec.podCIDRs" => MergeSet,
                _ => Replace,
            },
            "Namespace" => match path {
                "status.conditions" => MergeByKey("type"),
                _ => Replace,
            },
            "Service" => match path {
                "spec.ports" => MergeByKey("port"),
                _ => Replace,
            },
            _ => Replace,
        }
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn directive(map: &Map<String, Value>) -> Option<&str> {
    map.get("$patch").and_then(Value::as_str)
}

/// Merges `patch` into `target`, the map at `path`.
fn merge_map(
    target: &mut Map<String, Value>,
    patch: &Map<String, Value>,
    schema: &Schema<'_>,
    path: &str,
) -> Result<(), ApiError> {
    match directive(patch) {
        None => {}
        Some("replace") => {
            *target = strip_directives_map(patch);
            return Ok(());
        }
        // `$patch: delete` on the top-level map empties it.
        Some("delete") => {
            target.clear();
            return Ok(());
        }
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "unknown patch directive '{other}'"
            )));
        }
    }
    if let Some(keep) = patch.get("$retainKeys") {
        let keep = keep
            .as_array()
            .ok_or_else(|| ApiError::bad_request("$retainKeys must be a list"))?;
        target.retain(|k, _| keep.iter().any(|v| v.as_str() == Some(k.as_str())));
    }
    for (key, value) in patch {
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            let remove = value
                .as_array()
                .ok_or_else(|| ApiError::bad_request(format!("{key} must be a list")))?;
            if let Some(Value::Array(items)) = target.get_mut(field) {
                items.retain(|item| !remove.contains(item));
            }
            continue;
        }
        if key.starts_with('$') {
            // `$setElementOrder/…`, `$retainKeys`, `$patch`: directives, never stored.
            continue;
        }
        let child = join(path, key);
        match value {
            Value::Null => {
                target.remove(key);
            }
            Value::Object(sub) => {
                if directive(sub) == Some("delete") {
                    target.remove(key);
                    continue;
                }
                let slot = target
                    .entry(key.clone())
                    .or_insert_with(|| Value::Object(Map::new()));
                if !slot.is_object() {
                    *slot = Value::Object(Map::new());
                }
                if let Value::Object(slot) = slot {
                    merge_map(slot, sub, schema, &child)?;
                }
            }
            Value::Array(items) => {
                let merged = match schema.list_strategy(&child) {
                    ListStrategy::Replace => replace_list(items),
                    ListStrategy::MergeSet => {
                        let mut old = take_list(target.get(key.as_str()));
                        for item in items {
                            if !old.contains(item) {
                                old.push(item.clone());
                            }
                        }
                        old
                    }
                    ListStrategy::MergeByKey(merge_key) => {
                        let old = take_list(target.get(key.as_str()));
                        merge_keyed_list(old, items, merge_key, schema, &child)?
                    }
                };
                target.insert(key.clone(), Value::Array(merged));
            }
            scalar => {
                target.insert(key.clone(), scalar.clone());
            }
        }
    }
    Ok(())
}

fn take_list(value: Option<&Value>) -> Vec<Value> {
    match value {
        Some(Value::Array(items)) => items.clone(),
        _ => Vec::new(),
    }
}

/// A replaced list: items as given, directive items and keys dropped.
fn replace_list(items: &[Value]) -> Vec<Value> {
    items
        .iter()
        .filter(|item| item.as_object().is_none_or(|m| directive(m).is_none()))
        .map(strip_directives)
        .collect()
}

fn merge_keyed_list(
    mut old: Vec<Value>,
    patch: &[Value],
    merge_key: &str,
    schema: &Schema<'_>,
    path: &str,
) -> Result<Vec<Value>, ApiError> {
    // A `{"$patch": "replace"}` item replaces the whole list with the other items.
    let replace_all = patch.iter().any(|item| {
        item.as_object()
            .is_some_and(|m| directive(m) == Some("replace") && !m.contains_key(merge_key))
    });
    if replace_all {
        return Ok(replace_list(patch));
    }
    for item in patch {
        let Value::Object(fields) = item else {
            return Err(ApiError::bad_request(format!(
                "{path}: list items must be objects with the merge key '{merge_key}'"
            )));
        };
        let key_value = fields.get(merge_key).ok_or_else(|| {
            ApiError::bad_request(format!("{path}: an item has no merge key '{merge_key}'"))
        })?;
        let existing = old.iter().position(|o| o.get(merge_key) == Some(key_value));
        match (directive(fields), existing) {
            (Some("delete"), Some(at)) => {
                old.remove(at);
            }
            (Some("delete"), None) => {}
            (Some("replace"), at) => {
                let new = Value::Object(strip_directives_map(fields));
                match at {
                    Some(at) => old[at] = new,
                    None => old.push(new),
                }
            }
            (Some(other), _) => {
                return Err(ApiError::bad_request(format!(
                    "unknown patch directive '{other}'"
                )));
            }
            (None, Some(at)) => {
                if let Value::Object(target) = &mut old[at] {
                    merge_map(target, fields, schema, path)?;
                }
            }
            (None, None) => {
                let mut new = Map::new();
                merge_map(&mut new, fields, schema, path)?;
                old.push(Value::Object(new));
            }
        }
    }
    Ok(old)
}

/// A copy of `value` without any `$`-prefixed keys, at any depth.
fn strip_directives(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(strip_directives_map(map)),
        Value::Array(items) => Value::Array(items.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

fn strip_directives_map(map: &Map<String, Value>) -> Map<String, Value> {
    map.iter()
        .filter(|(k, _)| !k.starts_with('$'))
        .map(|(k, v)| (k.clone(), strip_directives(v)))
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn smp(kind: &str, mut target: Value, patch: Value) -> Value {
        let body = serde_json::to_vec(&patch).expect("patch serializes");
        apply(kind, PatchType::Strategic, &mut target, &body).expect("patch applies");
        target
    }

    #[test]
    fn strategic_merges_conditions_by_type_and_keeps_the_rest() {
        let pod = json!({
            "metadata": { "name": "p", "labels": { "a": "1" } },
            "status": {
                "phase": "Pending",
                "conditions": [
                    { "type": "PodScheduled", "status": "True" },
                    { "type": "Ready", "status": "False" },
                ],
                "containerStatuses": [{ "name": "old" }],
            },
        });
        let patch = json!({
            "metadata": { "labels": { "b": "2" } },
            "status": {
                "$setElementOrder/conditions": [{ "type": "PodScheduled" }, { "type": "Ready" }],
                "phase": "Running",
                "conditions": [{ "type": "Ready", "status": "True" }],
                "containerStatuses": [{ "name": "new" }],
            },
        });
        let got = smp("Pod", pod, patch);
        assert_eq!(
            got,
            json!({
                "metadata": { "name": "p", "labels": { "a": "1", "b": "2" } },
                "status": {
                    "phase": "Running",
                    "conditions": [
                        { "type": "PodScheduled", "status": "True" },
                        { "type": "Ready", "status": "True" },
                    ],
                    "containerStatuses": [{ "name": "new" }],
                },
            })
        );
    }

    #[test]
    fn strategic_directives() {
        let obj = json!({
            "metadata": { "finalizers": ["a", "b"], "annotations": { "x": "1", "y": "2" } },
            "status": { "conditions": [{ "type": "A" }, { "type": "B" }] },
            "spec": { "podCIDRs": ["10.0.0.0/24"] },
        });
        let patch = json!({
            "metadata": {
                "finalizers": ["c"],
                "$deleteFromPrimitiveList/finalizers": ["a"],
                "annotations": { "x": null },
            },
            "status": { "conditions": [{ "type": "A", "$patch": "delete" }, { "type": "C" }] },
            "spec": { "podCIDRs": ["10.0.0.0/24", "fd00::/64"], "taints": [{ "key": "k" }] },
        });
        let got = smp("Node", obj, patch);
        assert_eq!(
            got,
            json!({
                "metadata": { "finalizers": ["b", "c"], "annotations": { "y": "2" } },
                "status": { "conditions": [{ "type": "B" }, { "type": "C" }] },
                "spec": { "podCIDRs": ["10.0.0.0/24", "fd00::/64"], "taints": [{ "key": "k" }] },
            })
        );
        let replaced = smp(
            "Pod",
            json!({ "spec": { "nodeSelector": { "a": "1" } } }),
            json!({ "spec": { "nodeSelector": { "$patch": "replace", "b": "2" } } }),
        );
        assert_eq!(
            replaced,
            json!({ "spec": { "nodeSelector": { "b": "2" } } })
        );
        let deleted = smp(
            "Pod",
            json!({ "spec": { "nodeSelector": { "a": "1" }, "x": 1 } }),
            json!({ "spec": { "nodeSelector": { "$patch": "delete" } } }),
        );
        assert_eq!(deleted, json!({ "spec": { "x": 1 } }));
    }

    #[test]
    fn strategic_node_addresses_merge_by_type_unless_replaced() {
        let old =
            json!({ "status": { "addresses": [{ "type": "InternalIP", "address": "10.0.0.1" }] } });
        let merged = smp(
            "Node",
            old.clone(),
            json!({ "status": { "addresses": [{ "type": "Hostname", "address": "n1" }] } }),
        );
        assert_eq!(
            merged,
            json!({ "status": { "addresses": [
                { "type": "InternalIP", "address": "10.0.0.1" },
                { "type": "Hostname", "address": "n1" },
            ] } })
        );
        let replaced = smp(
            "Node",
            old,
            json!({ "status": { "addresses": [{ "$patch": "replace" }, { "type": "Hostname", "address": "n1" }] } }),
        );
        assert_eq!(
            replaced,
            json!({ "status": { "addresses": [{ "type": "Hostname", "address": "n1" }] } })
        );
    }

    #[test]
    fn merge_and_json_patches() {
        let mut obj = json!({ "a": { "b": 1, "c": [1, 2] } });
        apply(
            "X",
            PatchType::Merge,
            &mut obj,
            br#"{"a":{"b":null,"c":[3]}}"#,
        )
        .expect("merge");
        assert_eq!(obj, json!({ "a": { "c": [3] } }));
        apply(
            "X",
            PatchType::Json,
            &mut obj,
            br#"[{"op":"add","path":"/a/d","value":4}]"#,
        )
        .expect("json patch");
        assert_eq!(obj, json!({ "a": { "c": [3], "d": 4 } }));
        let failed = apply(
            "X",
            PatchType::Json,
            &mut obj,
            br#"[{"op":"test","path":"/a/d","value":5}]"#,
        );
        assert_eq!(failed.map_err(|e| e.code), Err(422));
        assert_eq!(
            PatchType::from_content_type("application/apply-patch+yaml").map_err(|e| e.code),
            Err(415)
        );
    }
}
