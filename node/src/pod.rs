//! Pod facts: what the node reads off a pod, the same way everywhere.
//!
//! The ground floor of the node: identity (UID, `namespace/name`), where a pod came
//! from (its config annotations and sources), static and mirror pods, the grace it
//! stops with, its restart policy, and the DNS-name rules its fields follow. Every
//! other module may import this one; it imports none of them.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};

/// Annotation carrying the pod's config hash (its UID for static pods).
pub const CONFIG_HASH_ANNOTATION: &str = "kubernetes.io/config.hash";
/// Annotation naming the pod's source: [`FILE_SOURCE`], [`HTTP_SOURCE`] or [`API_SOURCE`].
pub const CONFIG_SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";
/// Annotation with the time the node first saw the pod.
pub const CONFIG_SEEN_ANNOTATION: &str = "kubernetes.io/config.seen";
/// Annotation that marks a mirror pod (its value is the static pod's hash).
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// The static pod directory's source name.
pub const FILE_SOURCE: &str = "file";
/// The manifest URL's source name.
pub const HTTP_SOURCE: &str = "http";
/// The API server's source name.
pub const API_SOURCE: &str = "api";

/// The grace a pod stops with when neither its deletion nor its spec sets one.
pub const DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS: i64 = 30;

/// The UID of a pod, which every pod from a source has.
pub fn uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or("")
}

/// `namespace/name`, for logs.
pub fn full_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

/// One annotation of a pod.
pub fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// The source a pod came from (`kubernetes.io/config.source`), if it is marked.
pub fn source(pod: &Pod) -> Option<&str> {
    annotation(pod, CONFIG_SOURCE_ANNOTATION)
}

/// Whether a pod came from the API server.
pub fn is_from_api(pod: &Pod) -> bool {
    source(pod) == Some(API_SOURCE)
}

/// `types.IsStaticPod`: the pod is marked with a source other than the API server
/// (a manifest file or URL).
pub fn is_static(pod: &Pod) -> bool {
    source(pod).is_some_and(|s| s != API_SOURCE)
}

/// Whether a pod is the API's mirror of a static pod.
pub fn is_mirror(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION))
}

/// Every container of the pod: the regular ones, then the init containers (sidecars
/// among them).
pub fn containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    pod.spec.iter().flat_map(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
    })
}

/// The grace the spec gives the pod's containers to stop, else 30 s (seconds).
pub fn spec_grace_seconds(pod: &Pod) -> i64 {
    pod.spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS)
}

/// The grace a pod is stopped with: its deletion grace, else its spec's, else 30 s.
pub fn grace_period(pod: &Pod) -> Duration {
    let seconds = pod
        .metadata
        .deletion_grace_period_seconds
        .unwrap_or_else(|| spec_grace_seconds(pod))
        .max(0);
    Duration::from_secs(seconds as u64)
}

/// The restart policy of a pod, defaulting to `Always`.
pub fn restart_policy(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always")
}

/// Whether a container that exited with `exit_code` is restarted under `policy`.
pub fn should_restart(policy: &str, exit_code: i32) -> bool {
    match policy {
        "Never" => false,
        "OnFailure" => exit_code != 0,
        _ => true,
    }
}

/// RFC 1123 subdomain: lower-case alphanumerics, `-` and `.`, at most 253 characters.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// RFC 1123 label: a single DNS label, as container names must be.
pub fn is_dns_label(s: &str) -> bool {
    !s.contains('.') && is_dns_subdomain(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod_with(
        annotations: &[(&str, &str)],
        deletion_grace: Option<i64>,
        spec_grace: Option<i64>,
    ) -> Pod {
        let mut p = Pod::default();
        p.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        p.metadata.deletion_grace_period_seconds = deletion_grace;
        p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            termination_grace_period_seconds: spec_grace,
            ..Default::default()
        });
        p
    }

    #[test]
    fn static_pods_are_marked_with_a_source_other_than_the_api() {
        for (source, want) in [
            (FILE_SOURCE, true),
            (HTTP_SOURCE, true),
            (API_SOURCE, false),
        ] {
            let pod = pod_with(&[(CONFIG_SOURCE_ANNOTATION, source)], None, None);
            assert_eq!(is_static(&pod), want, "{source}");
            assert_eq!(is_from_api(&pod), !want, "{source}");
        }
        assert!(!is_static(&Pod::default()), "an unmarked pod is not static");
        assert!(is_mirror(&pod_with(
            &[(MIRROR_ANNOTATION, "abc")],
            None,
            None
        )));
        assert!(!is_mirror(&Pod::default()));
    }

    #[test]
    fn the_grace_is_the_deletions_then_the_specs_then_30_s() {
        let table = [
            (Some(5), Some(10), 5),
            (None, Some(10), 10),
            (None, None, 30),
            (Some(0), None, 0),
            (Some(-1), None, 0),
        ];
        for (deletion, spec, want) in table {
            let pod = pod_with(&[], deletion, spec);
            assert_eq!(
                grace_period(&pod),
                Duration::from_secs(want),
                "{deletion:?} {spec:?}"
            );
        }
    }

    #[test]
    fn restart_policies() {
        assert!(should_restart("Always", 0));
        assert!(should_restart("OnFailure", 1));
        assert!(!should_restart("OnFailure", 0));
        assert!(!should_restart("Never", 1));
        assert_eq!(restart_policy(&Pod::default()), "Always");
    }

    #[test]
    fn dns_names() {
        assert!(is_dns_label("web-1"));
        assert!(is_dns_subdomain("node-1.example.com"));
        assert!(!is_dns_subdomain("Node"));
        assert!(!is_dns_label("web.1"));
        assert!(is_dns_subdomain("a.b-c"));
        assert!(!is_dns_subdomain("-a"));
        assert!(!is_dns_subdomain("A"));
        assert!(!is_dns_subdomain(&"a".repeat(64)));
    }
}
