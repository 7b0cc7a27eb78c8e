//! The types every world shares: pods, containers, resource amounts, pairs.
//!
//! Resource amounts are in canonical units (`cpu` in millicores, `memory` and
//! `ephemeral-storage` in bytes, extended resources as counts), so a plugin never
//! parses a Kubernetes quantity.

pub use crate::bindings::probe_world::wasmlet::plugin::types::{
    ContainerInfo, Pair, PodInfo, ResourceAmount,
};

/// The value of `key` among `pairs` (the first one, should it repeat).
pub fn lookup<'a>(pairs: &'a [Pair], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|pair| pair.key == key)
        .map(|pair| pair.value.as_str())
}

/// The amount of `resource` in a list of amounts, 0 when absent.
pub fn amount(amounts: &[ResourceAmount], resource: &str) -> u64 {
    amounts
        .iter()
        .filter(|a| a.name == resource)
        .map(|a| a.amount)
        .fold(0, u64::saturating_add)
}

impl Pair {
    /// A pair from anything string-like.
    pub fn new(key: impl Into<String>, value: impl Into<String>) -> Self {
        Pair {
            key: key.into(),
            value: value.into(),
        }
    }
}

impl PodInfo {
    /// The value of the label `key`.
    pub fn label(&self, key: &str) -> Option<&str> {
        lookup(&self.labels, key)
    }

    /// The value of the annotation `key`.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        lookup(&self.annotations, key)
    }

    /// The regular (not init) containers.
    pub fn app_containers(&self) -> impl Iterator<Item = &ContainerInfo> {
        self.containers.iter().filter(|c| !c.init)
    }

    /// The pod's effective request of `resource` as the scheduler counts a pod
    /// without sidecars: the larger of the regular containers' requests summed and
    /// the largest single init container request.
    pub fn request(&self, resource: &str) -> u64 {
        let apps = self
            .app_containers()
            .map(|c| amount(&c.requests, resource))
            .fold(0, u64::saturating_add);
        let init = self
            .containers
            .iter()
            .filter(|c| c.init)
            .map(|c| amount(&c.requests, resource))
            .max()
            .unwrap_or(0);
        apps.max(init)
    }

    /// `namespace/name`, for messages.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

impl ContainerInfo {
    /// This container's request of `resource`, 0 when absent.
    pub fn request(&self, resource: &str) -> u64 {
        amount(&self.requests, resource)
    }

    /// This container's limit of `resource`, 0 when absent.
    pub fn limit(&self, resource: &str) -> u64 {
        amount(&self.limits, resource)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn container(name: &str, init: bool, cpu: u64) -> ContainerInfo {
        ContainerInfo {
            name: name.into(),
            image: format!("example/{name}"),
            requests: vec![ResourceAmount {
                name: "cpu".into(),
                amount: cpu,
            }],
            limits: vec![],
            init,
        }
    }

    pub(crate) fn pod(name: &str, containers: Vec<ContainerInfo>) -> PodInfo {
        PodInfo {
            namespace: "default".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            labels: vec![Pair::new("app", name)],
            annotations: vec![],
            qos_class: "Burstable".into(),
            priority: 0,
            runtime_class: String::new(),
            containers,
        }
    }

    #[test]
    fn effective_request_is_the_larger_of_apps_summed_and_the_largest_init() {
        let cases = [
            (
                vec![container("a", false, 100), container("b", false, 250)],
                350,
            ),
            (
                vec![container("i", true, 500), container("a", false, 100)],
                500,
            ),
            (
                vec![
                    container("i", true, 100),
                    container("j", true, 200),
                    container("a", false, 300),
                ],
                300,
            ),
            (vec![], 0),
        ];
        for (containers, want) in cases {
            assert_eq!(pod("p", containers).request("cpu"), want);
        }
        assert_eq!(
            pod("p", vec![container("a", false, 1)]).request("memory"),
            0
        );
    }

    #[test]
    fn labels_and_lookup() {
        let p = pod("web", vec![]);
        assert_eq!(p.label("app"), Some("web"));
        assert_eq!(p.label("tier"), None);
        assert_eq!(p.key(), "default/web");
        let pairs = [Pair::new("a", "1"), Pair::new("a", "2")];
        assert_eq!(lookup(&pairs, "a"), Some("1"));
    }
}
