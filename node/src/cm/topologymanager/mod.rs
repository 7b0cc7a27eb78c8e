//! The topology manager (the kubelet's `cm/topologymanager`): at admission it asks
//! the hint providers (the device manager, the CPU manager) where on the machine's
//! NUMA nodes they could place each container's resources, merges their hints under
//! the configured policy and scope, refuses the pod with `TopologyAffinityError`
//! when the policy says no, and otherwise has every provider allocate with the
//! chosen hint.
//!
//! ```text
//! admit(pod) ─ scope container: per container ─┐   providers: container_hints()
//!            └ scope pod: once for the pod ────┤──▶ policy::merge ─▶ admit?
//!                                              └──▶ providers: allocate(hint)
//! ```

pub mod bitmask;
pub mod policy;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Container, Pod};

pub use bitmask::BitMask;
pub use policy::{NumaInfo, Policy, PolicyOptions, ProviderHints, TopologyHint};

use crate::admission::Rejection;

/// The kubelet's reason for a pod the policy cannot place.
pub const REASON_TOPOLOGY_AFFINITY: &str = "TopologyAffinityError";
/// Its message (upstream's `TopologyAffinityError.Error()`).
pub const MESSAGE_TOPOLOGY_AFFINITY: &str = "Resources cannot be allocated with Topology locality";
/// The kubelet's reason for a provider's failed allocation.
pub const REASON_UNEXPECTED: &str = "UnexpectedAdmissionError";

/// `topologyManagerScope`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Scope {
    #[default]
    Container,
    Pod,
}

impl Scope {
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "container" => Ok(Scope::Container),
            "pod" => Ok(Scope::Pod),
            other => Err(format!("unknown scope: \"{other}\" (container, pod)")),
        }
    }
}

/// A resource manager that can say where it would place a container's resources and
/// then place them.
#[async_trait::async_trait]
pub trait HintProvider: Send + Sync {
    /// Hints for one container's resources.
    fn container_hints(&self, pod: &Pod, container: &Container) -> ProviderHints;
    /// Hints for the whole pod's resources (scope `pod`).
    fn pod_hints(&self, pod: &Pod) -> ProviderHints;
    /// Allocates the container's resources, aligned with `hint` where it can. The
    /// error is the reason the allocation failed (it becomes the pod's message).
    async fn allocate(
        &self,
        pod: &Pod,
        container: &Container,
        hint: TopologyHint,
    ) -> Result<(), String>;
    /// Forgets the pod's allocations (a rejected or removed pod).
    fn remove_pod(&self, pod_uid: &str);
    /// Frees what pods not in `active` (UIDs) hold.
    fn retain_pods(&self, active: &std::collections::HashSet<String>);
}

/// The topology manager's settings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Config {
    pub policy: Policy,
    pub scope: Scope,
    pub options: PolicyOptions,
}

/// Merges hints and admits pods.
pub struct TopologyManager {
    config: Config,
    numa: NumaInfo,
    providers: Vec<Arc<dyn HintProvider>>,
    /// The hint each admitted container got, by (pod UID, container).
    hints: Mutex<HashMap<(String, String), TopologyHint>>,
}

impl TopologyManager {
    /// Fails, as the kubelet does, on a machine with more NUMA nodes than
    /// `max-allowable-numa-nodes` unless the policy is `none`.
    pub fn new(config: Config, numa: NumaInfo) -> Result<Self, String> {
        if config.policy != Policy::None
            && numa.nodes.len() > config.options.max_allowable_numa_nodes
        {
            return Err(format!(
                "unsupported on machines with more than {} NUMA Nodes",
                config.options.max_allowable_numa_nodes
            ));
        }
        if let Some(big) = numa.nodes.iter().find(|n| **n >= 64) {
            return Err(format!(
                "NUMA node {big} is beyond the 64 the topology manager handles"
            ));
        }
        Ok(TopologyManager {
            config,
            numa,
            providers: Vec::new(),
            hints: Mutex::new(HashMap::new()),
        })
    }

    pub fn add_provider(&mut self, provider: Arc<dyn HintProvider>) {
        self.providers.push(provider);
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The hint the container was admitted with.
    pub fn affinity(&self, pod_uid: &str, container: &str) -> Option<TopologyHint> {
        self.hints
            .lock()
            .unwrap()
            .get(&(pod_uid.to_owned(), container.to_owned()))
            .copied()
    }

    fn merge(&self, hints: &[ProviderHints]) -> (TopologyHint, bool) {
        policy::merge(self.config.policy, &self.numa, &self.config.options, hints)
    }

    /// Admits `pod` and allocates its containers' resources, or says why not. A
    /// refused pod holds nothing afterwards.
    pub async fn admit(&self, pod: &Pod) -> Result<(), Rejection> {
        let result = self.admit_inner(pod).await;
        if result.is_err() {
            self.remove_pod(crate::pod::uid(pod));
        }
        result
    }

    async fn admit_inner(&self, pod: &Pod) -> Result<(), Rejection> {
        let uid = crate::pod::uid(pod).to_owned();
        let spec = pod.spec.clone().unwrap_or_default();
        let containers: Vec<Container> = spec
            .init_containers
            .unwrap_or_default()
            .into_iter()
            .chain(spec.containers)
            .collect();
        let pod_hint = match (self.config.policy, self.config.scope) {
            (Policy::None, _) | (_, Scope::Container) => None,
            (_, Scope::Pod) => {
                let hints: Vec<ProviderHints> =
                    self.providers.iter().map(|p| p.pod_hints(pod)).collect();
                let (hint, admit) = self.merge(&hints);
                tracing::info!(pod = %crate::pod::full_name(pod), ?hint, ?hints, "best TopologyHint for the pod");
                if !admit {
                    return Err(affinity_error());
                }
                Some(hint)
            }
        };
        for c in &containers {
            let hint = match (self.config.policy, pod_hint) {
                (Policy::None, _) => TopologyHint::ANY,
                (_, Some(hint)) => hint,
                (_, None) => {
                    let hints: Vec<ProviderHints> = self
                        .providers
                        .iter()
                        .map(|p| p.container_hints(pod, c))
                        .collect();
                    let (hint, admit) = self.merge(&hints);
                    tracing::info!(pod = %crate::pod::full_name(pod), container = %c.name, ?hint, ?hints, "best TopologyHint");
                    if !admit {
                        return Err(affinity_error());
                    }
                    hint
                }
            };
            self.hints
                .lock()
                .unwrap()
                .insert((uid.clone(), c.name.clone()), hint);
            for p in &self.providers {
                p.allocate(pod, c, hint).await.map_err(|e| Rejection {
                    reason: REASON_UNEXPECTED.into(),
                    message: format!("Allocate failed due to {e}, which is unexpected"),
                })?;
            }
        }
        Ok(())
    }

    /// Frees what pods not in `active` hold, in every provider (the kubelet's
    /// `UpdateAllocatedDevices` and the CPU manager's `removeStaleState`).
    pub fn retain_pods(&self, active: &std::collections::HashSet<String>) {
        self.hints
            .lock()
            .unwrap()
            .retain(|(uid, _), _| active.contains(uid));
        for p in &self.providers {
            p.retain_pods(active);
        }
    }

    /// Forgets a pod: its hints and every provider's allocations.
    pub fn remove_pod(&self, pod_uid: &str) {
        self.hints
            .lock()
            .unwrap()
            .retain(|(uid, _), _| uid != pod_uid);
        for p in &self.providers {
            p.remove_pod(pod_uid);
        }
    }
}

fn affinity_error() -> Rejection {
    Rejection {
        reason: REASON_TOPOLOGY_AFFINITY.into(),
        message: MESSAGE_TOPOLOGY_AFFINITY.into(),
    }
}

/// A container's request for `resource` as a whole number (extended resources and
/// CPUs are counted in units).
pub fn container_request(c: &Container, resource: &str) -> Option<i64> {
    let resources = c.resources.as_ref()?;
    let q = resources
        .requests
        .as_ref()
        .and_then(|r| r.get(resource))
        .or_else(|| resources.limits.as_ref().and_then(|l| l.get(resource)))?;
    crate::quantity::parse(q).ok().map(|v| v.ceil() as i64)
}

/// The pod's need for `resource`, as the kubelet's `PodRequests`: init containers
/// run one at a time before the app containers, except sidecars (`restartPolicy:
/// Always`), which keep running beside the later ones and the app containers.
pub fn pod_request(pod: &Pod, resource: &str) -> i64 {
    let Some(spec) = pod.spec.as_ref() else {
        return 0;
    };
    let mut sidecars = 0i64;
    let mut peak = 0i64;
    for c in spec.init_containers.iter().flatten() {
        let r = container_request(c, resource).unwrap_or(0);
        if c.restart_policy.as_deref() == Some("Always") {
            sidecars += r;
            peak = peak.max(sidecars);
        } else {
            peak = peak.max(sidecars + r);
        }
    }
    let app: i64 = spec
        .containers
        .iter()
        .filter_map(|c| container_request(c, resource))
        .sum();
    peak.max(sidecars + app)
}

#[cfg(test)]
mod tests;
