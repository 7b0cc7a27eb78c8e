//! Static pods: decoding a manifest file, the kubelet's identity rules and defaults.
//!
//! A static pod's name gets `-<nodeName>` appended, its namespace defaults to
//! `default`, and — when the manifest has no UID — its UID is derived from the
//! manifest's content, the node and the file, so that editing a manifest makes a new
//! pod and an unchanged one keeps its identity across restarts.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::{Pod, Toleration};
use sha2::{Digest, Sha256};

use crate::pod::{
    CONFIG_HASH_ANNOTATION, CONFIG_SOURCE_ANNOTATION, DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS,
    is_dns_label, is_dns_subdomain,
};

/// Decodes one manifest (YAML or JSON) into a pod, with a message naming what is wrong.
pub fn decode(path: &Path, bytes: &[u8]) -> Result<Pod, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8 text: {e}"))?;
    if text.trim().is_empty() {
        return Err("the file is empty".into());
    }
    let is_json = path.extension().is_some_and(|e| e == "json");
    let value = parse(text, is_json)?;
    let (kind, api_version) = kind_of(&value);
    if kind != "Pod" || api_version != "v1" {
        return Err(format!(
            "expected a v1 Pod, found kind {kind:?} apiVersion {api_version:?} (one pod per file)"
        ));
    }
    serde_json::from_value(value).map_err(|e| format!("not a valid Pod: {e}"))
}

/// Decodes a manifest URL's body (YAML or JSON): one v1 Pod, a v1 `PodList`, or a v1
/// `List` of Pods. An empty list is zero pods; the caller decides what an empty body is.
pub fn decode_pods(bytes: &[u8]) -> Result<Vec<Pod>, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8 text: {e}"))?;
    let mut value = parse(text, false)?;
    let (kind, api_version) = kind_of(&value);
    match (kind, api_version) {
        ("Pod", "v1") => {
            return Ok(vec![
                serde_json::from_value(value).map_err(|e| format!("not a valid Pod: {e}"))?,
            ]);
        }
        ("PodList" | "List", "v1") => {}
        _ => {
            return Err(format!(
                "expected a v1 Pod, PodList or List, found kind {kind:?} apiVersion {api_version:?}"
            ));
        }
    }
    let items = match value.get_mut("items").map(serde_json::Value::take) {
        None | Some(serde_json::Value::Null) => return Ok(Vec::new()),
        Some(serde_json::Value::Array(items)) => items,
        Some(_) => return Err("items: not a list".into()),
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            // PodList items usually omit kind and apiVersion; List items carry them.
            let (kind, api_version) = kind_of(&item);
            if !matches!(kind, "" | "Pod") || !matches!(api_version, "" | "v1") {
                return Err(format!(
                    "items[{i}]: expected a v1 Pod, found kind {kind:?} apiVersion {api_version:?}"
                ));
            }
            serde_json::from_value(item).map_err(|e| format!("items[{i}]: not a valid Pod: {e}"))
        })
        .collect()
}

fn parse(text: &str, is_json: bool) -> Result<serde_json::Value, String> {
    if is_json || text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| format!("invalid JSON: {e}"))
    } else {
        serde_saphyr::from_str(text).map_err(|e| format!("invalid YAML: {e}"))
    }
}

fn kind_of(value: &serde_json::Value) -> (&str, &str) {
    let field = |f: &str| value.get(f).and_then(|k| k.as_str()).unwrap_or("");
    (field("kind"), field("apiVersion"))
}

/// Where a static pod came from; its identity and `config.source` annotation follow it.
#[derive(Clone, Copy, Debug)]
pub enum Origin<'a> {
    /// A file in the static pod directory (`config.source: file`).
    File(&'a Path),
    /// The manifest URL (`config.source: http`).
    Url(&'a str),
}

/// Applies the kubelet's static-pod identity and the API server's defaults.
pub fn apply_defaults(pod: &mut Pod, origin: Origin<'_>, node_name: &str) {
    let meta = &mut pod.metadata;
    if meta.uid.as_deref().unwrap_or("").is_empty() {
        let mut h = Sha256::new();
        h.update(serde_json::to_vec(&pod).expect("pods serialize"));
        // As the kubelet: a file's pod is unique per node, a URL's per URL.
        match origin {
            Origin::File(path) => {
                h.update(format!("host:{node_name}"));
                h.update(format!("file:{}", path.display()));
            }
            Origin::Url(url) => h.update(format!("url:{url}")),
        }
        pod.metadata.uid = Some(hex::encode(&h.finalize()[..16]));
    }
    let meta = &mut pod.metadata;
    let uid = meta.uid.clone().unwrap_or_default();
    meta.name = Some(format!(
        "{}-{}",
        meta.name.as_deref().unwrap_or(""),
        node_name.to_lowercase()
    ));
    if meta.namespace.as_deref().unwrap_or("").is_empty() {
        meta.namespace = Some("default".into());
    }
    let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(CONFIG_HASH_ANNOTATION.into(), uid);
    let source = match origin {
        Origin::File(_) => "file",
        Origin::Url(_) => "http",
    };
    annotations.insert(CONFIG_SOURCE_ANNOTATION.into(), source.into());

    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    spec.node_name = Some(node_name.to_owned());
    // Static pods from files tolerate every NoExecute taint, so node problems never
    // evict them (the kubelet adds this for files only, not for a manifest URL).
    if let Origin::File(_) = origin {
        let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
        tolerations.push(Toleration {
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            ..Default::default()
        });
    }
    spec.restart_policy.get_or_insert_with(|| "Always".into());
    spec.termination_grace_period_seconds
        .get_or_insert(DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS);
    spec.dns_policy.get_or_insert_with(|| "ClusterFirst".into());
    spec.scheduler_name
        .get_or_insert_with(|| "default-scheduler".into());
    spec.enable_service_links.get_or_insert(true);
    spec.security_context.get_or_insert_with(Default::default);
    for c in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        c.termination_message_path
            .get_or_insert_with(|| "/dev/termination-log".into());
        c.termination_message_policy
            .get_or_insert_with(|| "File".into());
        let image = c.image.clone().unwrap_or_default();
        c.image_pull_policy.get_or_insert_with(|| {
            if wasmlet_runtime::reference::is_latest_or_untagged(&image) {
                "Always".into()
            } else {
                "IfNotPresent".into()
            }
        });
    }
}

/// Checks what the API server would refuse, so a bad manifest never reaches a runtime.
pub fn validate(pod: &Pod) -> Result<(), String> {
    let mut problems = Vec::new();
    let name = pod.metadata.name.as_deref().unwrap_or("");
    if name.is_empty() {
        problems.push("metadata.name: required".to_owned());
    } else if !is_dns_subdomain(name) {
        problems.push(format!("metadata.name: {name:?} is not a DNS subdomain"));
    }
    match &pod.spec {
        None => problems.push("spec: required".into()),
        Some(spec) => {
            if spec.containers.is_empty() {
                problems.push("spec.containers: at least one container is required".into());
            }
            let mut seen = std::collections::HashSet::new();
            let all = spec
                .init_containers
                .iter()
                .flatten()
                .map(|c| ("spec.initContainers", c))
                .chain(spec.containers.iter().map(|c| ("spec.containers", c)));
            for (i, (field, c)) in all.enumerate() {
                let at = format!("{field}[{}]", i);
                if !is_dns_label(&c.name) {
                    problems.push(format!("{at}.name: {:?} is not a DNS label", c.name));
                }
                if !seen.insert(c.name.clone()) {
                    problems.push(format!("{at}.name: {:?} is a duplicate", c.name));
                }
                if c.image.as_deref().unwrap_or("").trim().is_empty() {
                    problems.push(format!("{at}.image: required"));
                }
                if let Some(p) = &c.image_pull_policy
                    && !["Always", "IfNotPresent", "Never"].contains(&p.as_str())
                {
                    problems.push(format!(
                        "{at}.imagePullPolicy: {p:?} is not Always, IfNotPresent or Never"
                    ));
                }
            }
            if let Some(p) = &spec.restart_policy
                && !["Always", "OnFailure", "Never"].contains(&p.as_str())
            {
                problems.push(format!(
                    "spec.restartPolicy: {p:?} is not Always, OnFailure or Never"
                ));
            }
            if spec.termination_grace_period_seconds.is_some_and(|g| g < 0) {
                problems.push("spec.terminationGracePeriodSeconds: must not be negative".into());
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANIFEST: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: app\n    image: localhost/app:v1\n";

    fn load(text: &str, path: &str, node: &str) -> Pod {
        let mut pod = decode(Path::new(path), text.as_bytes()).unwrap();
        apply_defaults(&mut pod, Origin::File(Path::new(path)), node);
        validate(&pod).unwrap();
        pod
    }

    #[test]
    fn static_pods_get_the_kubelets_identity() {
        let pod = load(MANIFEST, "/m/web.yaml", "Node-1");
        assert_eq!(pod.metadata.name.as_deref(), Some("web-node-1"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("default"));
        let uid = pod.metadata.uid.clone().unwrap();
        assert_eq!(uid.len(), 32);
        let ann = pod.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann[CONFIG_HASH_ANNOTATION], uid);
        assert_eq!(ann[CONFIG_SOURCE_ANNOTATION], "file");
        let spec = pod.spec.unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("Node-1"));
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
        assert_eq!(spec.termination_grace_period_seconds, Some(30));
        assert_eq!(
            spec.containers[0].image_pull_policy.as_deref(),
            Some("IfNotPresent")
        );
        assert_eq!(
            spec.containers[0].termination_message_path.as_deref(),
            Some("/dev/termination-log")
        );
    }

    #[test]
    fn the_uid_follows_content_node_and_file() {
        let a = load(MANIFEST, "/m/web.yaml", "n").metadata.uid;
        assert_eq!(a, load(MANIFEST, "/m/web.yaml", "n").metadata.uid, "stable");
        assert_ne!(a, load(MANIFEST, "/m/other.yaml", "n").metadata.uid, "file");
        assert_ne!(a, load(MANIFEST, "/m/web.yaml", "m").metadata.uid, "node");
        let edited = MANIFEST.replace("app:v1", "app:v2");
        assert_ne!(a, load(&edited, "/m/web.yaml", "n").metadata.uid, "content");
        let with_uid = MANIFEST.replace("name: web\n", "name: web\n  uid: fixed\n");
        assert_eq!(
            load(&with_uid, "/m/web.yaml", "n").metadata.uid.as_deref(),
            Some("fixed")
        );
    }

    #[test]
    fn latest_images_default_to_always_pull() {
        let text = MANIFEST.replace("localhost/app:v1", "localhost/app");
        let pod = load(&text, "/m/a.yaml", "n");
        assert_eq!(
            pod.spec.unwrap().containers[0].image_pull_policy.as_deref(),
            Some("Always")
        );
    }

    #[test]
    fn json_manifests_decode() {
        let json = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"j"},"spec":{"containers":[{"name":"c","image":"x:1"}]}}"#;
        let pod = load(json, "/m/j.json", "n");
        assert_eq!(pod.metadata.name.as_deref(), Some("j-n"));
    }

    #[test]
    fn bad_manifests_say_what_is_wrong() {
        let cases = [
            ("", "empty"),
            ("kind: Pod\napiVersion: v1\nmetadata: [", "invalid YAML"),
            (
                "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n",
                "expected a v1 Pod",
            ),
            (
                "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: 3}\n",
                "not a valid Pod",
            ),
        ];
        for (text, want) in cases {
            let err = decode(Path::new("/m/x.yaml"), text.as_bytes()).unwrap_err();
            assert!(err.contains(want), "{text:?}: {err}");
        }
        let mut pod = decode(
            Path::new("/m/x.yaml"),
            b"apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  restartPolicy: Sometimes\n  containers:\n  - {name: A_B}\n  - {name: A_B, image: x}\n",
        )
        .unwrap();
        apply_defaults(&mut pod, Origin::File(Path::new("/m/x.yaml")), "n");
        let err = validate(&pod).unwrap_err();
        for want in [
            "A_B\" is not a DNS label",
            "duplicate",
            "image: required",
            "restartPolicy",
        ] {
            assert!(err.contains(want), "missing {want:?} in {err}");
        }
    }
}
