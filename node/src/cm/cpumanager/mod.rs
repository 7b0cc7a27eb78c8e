//! The CPU manager's `static` policy (the kubelet's `cm/cpumanager`): a container of
//! a Guaranteed pod whose CPU request is a whole number gets that many CPUs to
//! itself; every other container shares the rest (the default set, which keeps the
//! reserved CPUs). Assignments live in `cpu_manager_state`, the kubelet's
//! checkpoint, so they survive a restart.
//!
//! ```text
//! admission ─ topology manager ─▶ hints (NUMA nodes with n free CPUs) ─▶ allocate
//!                                                          │
//! container start ◀── cpuset: its own CPUs, or the shared default set
//! ```
//!
//! CPUs are taken whole cores first, within the admitted NUMA hint first, lowest ids
//! first. When the default set changes, [`CpuManager::subscribe`] tells the sync loop,
//! whose pod syncs give running containers their new cpuset in place. Not done (see
//! `docs/status.md`): the policy options (`full-pcpus-only`, …) and reusing an init
//! container's CPUs for the app containers.

pub mod checkpoint;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::api::core::v1::{Container, Pod};

use super::cpuset::CpuSet;
use super::cputopology::CpuTopology;
use super::topologymanager::{BitMask, HintProvider, ProviderHints, TopologyHint, policy};
use crate::pod::uid;

/// The checkpoint's file name, in the root directory.
pub const CHECKPOINT_FILE: &str = "cpu_manager_state";
/// The policy's name as the checkpoint records it.
pub const POLICY_STATIC: &str = "static";

/// The assignments: the shared default set and each exclusive container's CPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    pub default: CpuSet,
    /// pod UID → container → CPUs.
    pub assignments: BTreeMap<String, BTreeMap<String, CpuSet>>,
}

struct Inner {
    topology: CpuTopology,
    reserved: CpuSet,
    numa_nodes: Vec<u32>,
    path: PathBuf,
    state: Mutex<State>,
    /// Bumped whenever the default set changes: running shared containers are then
    /// given the new set (the kubelet's reconcile loop).
    changed: tokio::sync::watch::Sender<u64>,
}

/// The static policy. Cheap to clone.
#[derive(Clone)]
pub struct CpuManager {
    inner: Arc<Inner>,
}

/// How many exclusive CPUs the container gets: its CPU request when the pod is
/// Guaranteed and the request is a whole number, else none.
pub fn exclusive_cpus(pod: &Pod, c: &Container) -> usize {
    if crate::qos::qos_class(pod) != "Guaranteed" {
        return 0;
    }
    let Some(q) = c.resources.as_ref().and_then(|r| {
        r.requests
            .as_ref()
            .and_then(|m| m.get("cpu"))
            .or(r.limits.as_ref().and_then(|m| m.get("cpu")))
    }) else {
        return 0;
    };
    match crate::quantity::parse(q) {
        Ok(v) if v > 0.0 && v.fract() == 0.0 => v as usize,
        _ => 0,
    }
}

impl CpuManager {
    /// The static policy on `topology`, with `reserved` CPUs kept for the system,
    /// its state read from (or started in) `<root>/cpu_manager_state`. A checkpoint
    /// of another policy, or one that does not fit this machine, is refused as the
    /// kubelet refuses it: the operator drains the node and removes the file.
    pub fn new(root: &Path, topology: CpuTopology, reserved: CpuSet) -> Result<Self, String> {
        if reserved.is_empty() {
            return Err("the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero".into());
        }
        let all = topology.all();
        if !reserved.is_subset(&all) {
            return Err(format!(
                "reserved CPUs {reserved} are not all on this machine ({all})"
            ));
        }
        let path = root.join(CHECKPOINT_FILE);
        let state = match checkpoint::read(&path)? {
            None => State {
                default: all.clone(),
                assignments: BTreeMap::new(),
            },
            Some((policy, state)) => {
                if policy != POLICY_STATIC {
                    return Err(format!(
                        "configured policy \"static\" differs from state checkpoint policy {policy:?} ({}): drain the node and remove the file",
                        path.display()
                    ));
                }
                let mut union = state.default.clone();
                for set in state.assignments.values().flat_map(BTreeMap::values) {
                    union = union.union(set);
                }
                if union != all {
                    return Err(format!(
                        "the CPUs of {} ({union}) are not this machine's ({all}): drain the node and remove the file",
                        path.display()
                    ));
                }
                state
            }
        };
        let m = CpuManager {
            inner: Arc::new(Inner {
                numa_nodes: topology.numa_nodes(),
                topology,
                reserved,
                path,
                state: Mutex::new(state),
                changed: tokio::sync::watch::channel(0).0,
            }),
        };
        m.save(&m.lock());
        Ok(m)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A receiver that sees a new value whenever the default (shared) set changes.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.changed.subscribe()
    }

    fn save(&self, state: &State) {
        self.inner.changed.send_modify(|n| *n += 1);
        if let Err(e) = checkpoint::write(&self.inner.path, POLICY_STATIC, state) {
            tracing::error!(checkpoint = %self.inner.path.display(), "writing the CPU manager checkpoint: {e}");
        }
    }

    pub fn state(&self) -> State {
        self.lock().clone()
    }

    /// The container's cpuset: its exclusive CPUs, else the shared default set.
    pub fn cpuset(&self, pod_uid: &str, container: &str) -> CpuSet {
        let state = self.lock();
        state
            .assignments
            .get(pod_uid)
            .and_then(|c| c.get(container))
            .cloned()
            .unwrap_or_else(|| state.default.clone())
    }

    /// The CPUs an exclusive allocation may take now.
    fn assignable(&self, state: &State) -> CpuSet {
        state.default.difference(&self.inner.reserved)
    }

    fn cpus_in(&self, mask: BitMask, set: &CpuSet) -> usize {
        set.iter()
            .filter(|cpu| {
                self.inner
                    .topology
                    .cpus
                    .get(cpu)
                    .is_some_and(|i| mask.is_set(i.numa_node))
            })
            .count()
    }

    /// Takes `n` CPUs from `available` as the kubelet's accumulator does, within
    /// `affinity` first: whole free cores while `n` still needs a whole core, then
    /// single CPUs from the cores with the fewest free CPUs (keeping whole cores
    /// whole), lowest ids first.
    fn take(&self, available: &CpuSet, n: usize, affinity: Option<BitMask>) -> CpuSet {
        let topo = &self.inner.topology;
        let outside = |cpu: u32| match (affinity, topo.cpus.get(&cpu)) {
            (Some(mask), Some(i)) => !mask.is_set(i.numa_node),
            _ => false,
        };
        let per_core = topo.cpus_per_core().max(1);
        let mut left = available.clone();
        let mut taken = CpuSet::new();
        // Whole cores.
        let mut cores: Vec<u32> = left
            .iter()
            .filter_map(|cpu| topo.cpus.get(&cpu).map(|i| i.core))
            .collect::<std::collections::BTreeSet<u32>>()
            .into_iter()
            .filter(|core| topo.cpus_in_core(*core).is_subset(&left))
            .collect();
        cores.sort_by_key(|core| (outside(*core), *core));
        for core in cores {
            let cpus = topo.cpus_in_core(core);
            let still = n.saturating_sub(taken.len());
            if still < per_core || cpus.len() > still {
                continue;
            }
            taken = taken.union(&cpus);
            left = left.difference(&cpus);
        }
        // Single CPUs, packed onto partly used cores.
        let free_in_core = |cpu: u32| {
            topo.cpus
                .get(&cpu)
                .map_or(0, |i| topo.cpus_in_core(i.core).intersection(&left).len())
        };
        let mut rest: Vec<u32> = left.iter().collect();
        rest.sort_by_key(|cpu| (outside(*cpu), free_in_core(*cpu), *cpu));
        for cpu in rest.into_iter().take(n.saturating_sub(taken.len())) {
            taken.insert(cpu);
        }
        taken
    }

    /// Allocates the container's exclusive CPUs, if it gets any.
    pub fn allocate_container(
        &self,
        pod: &Pod,
        c: &Container,
        hint: TopologyHint,
    ) -> Result<(), String> {
        let n = exclusive_cpus(pod, c);
        if n == 0 {
            return Ok(());
        }
        let pod_uid = uid(pod).to_owned();
        let mut state = self.lock();
        if let Some(held) = state.assignments.get(&pod_uid).and_then(|m| m.get(&c.name)) {
            if held.len() == n {
                return Ok(());
            }
            return Err(format!(
                "container {} already has {} CPUs ({held}), now asks for {n}",
                c.name,
                held.len()
            ));
        }
        let available = self.assignable(&state);
        if available.len() < n {
            return Err(format!(
                "not enough cpus available to satisfy request: requested={n}, available={}",
                available.len()
            ));
        }
        let taken = self.take(&available, n, hint.affinity);
        state.default = state.default.difference(&taken);
        tracing::info!(pod = %crate::pod::full_name(pod), container = %c.name, cpus = %taken, shared = %state.default, "exclusive CPUs allocated");
        state
            .assignments
            .entry(pod_uid)
            .or_default()
            .insert(c.name.clone(), taken);
        self.save(&state);
        Ok(())
    }

    /// Frees the CPUs of pods not in `active`.
    pub fn retain_pods(&self, active: &HashSet<String>) {
        let mut state = self.lock();
        let gone: Vec<String> = state
            .assignments
            .keys()
            .filter(|p| !active.contains(*p))
            .cloned()
            .collect();
        if gone.is_empty() {
            return;
        }
        for p in gone {
            if let Some(containers) = state.assignments.remove(&p) {
                for set in containers.values() {
                    state.default = state.default.union(set);
                }
            }
        }
        self.save(&state);
    }

    fn hints_for(&self, n: usize, held: Option<&CpuSet>) -> Vec<TopologyHint> {
        let state = self.lock();
        let numa = policy::NumaInfo::new(self.inner.numa_nodes.clone());
        let all = self.inner.topology.all();
        let available = match held {
            Some(held) => held.clone(),
            None => self.assignable(&state),
        };
        policy::count_hints(
            &numa,
            n,
            |mask| self.cpus_in(mask, &available),
            |mask| self.cpus_in(mask, &all),
        )
    }
}

#[async_trait::async_trait]
impl HintProvider for CpuManager {
    fn container_hints(&self, pod: &Pod, c: &Container) -> ProviderHints {
        let n = exclusive_cpus(pod, c);
        let mut out = ProviderHints::new();
        if n == 0 {
            return out;
        }
        let held = self
            .lock()
            .assignments
            .get(uid(pod))
            .and_then(|m| m.get(&c.name))
            .cloned();
        out.insert("cpu".into(), Some(self.hints_for(n, held.as_ref())));
        out
    }

    fn pod_hints(&self, pod: &Pod) -> ProviderHints {
        let spec = pod.spec.clone().unwrap_or_default();
        let init = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| exclusive_cpus(pod, c))
            .max()
            .unwrap_or(0);
        let app: usize = spec.containers.iter().map(|c| exclusive_cpus(pod, c)).sum();
        let n = init.max(app);
        let mut out = ProviderHints::new();
        if n > 0 {
            out.insert("cpu".into(), Some(self.hints_for(n, None)));
        }
        out
    }

    async fn allocate(&self, pod: &Pod, c: &Container, hint: TopologyHint) -> Result<(), String> {
        self.allocate_container(pod, c, hint)
    }

    fn remove_pod(&self, pod_uid: &str) {
        let mut state = self.lock();
        if let Some(containers) = state.assignments.remove(pod_uid) {
            for set in containers.values() {
                state.default = state.default.union(set);
            }
            self.save(&state);
        }
    }

    fn retain_pods(&self, active: &HashSet<String>) {
        CpuManager::retain_pods(self, active);
    }
}

#[cfg(test)]
mod tests;
