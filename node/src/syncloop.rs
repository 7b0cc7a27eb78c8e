//! The sync loop: the one place that decides what pod workers do.
//!
//! It wakes on source snapshots (merged by [`PodConfig`]), PLEG events, a housekeeping
//! tick and a resync tick, and hands each affected pod to its worker.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::pleg::PodLifecycleEvent;
use crate::pod::{full_name, grace_period, uid};
use crate::pod_state::labels;
use crate::podconfig::{PodConfig, PodOp, PodUpdate, SourceSnapshot};
use crate::router::RuntimeRouter;
use crate::status::StatusStore;
use crate::sync::PodSyncer;
use crate::workers::{PodWorkers, Work};

/// When the sync loop last went round, for `/healthz`.
#[derive(Clone)]
pub struct LoopHealth {
    last: Arc<Mutex<Instant>>,
}

impl Default for LoopHealth {
    fn default() -> Self {
        LoopHealth {
            last: Arc::new(Mutex::new(Instant::now())),
        }
    }
}

impl LoopHealth {
    fn touch(&self) {
        *self.last.lock().unwrap() = Instant::now();
    }

    /// `Err` if the loop has not gone round within `threshold`.
    pub fn check(&self, threshold: Duration) -> Result<String, String> {
        let since = self.last.lock().unwrap().elapsed();
        if since > threshold {
            Err(format!(
                "sync loop last ran {since:.0?} ago; threshold is {threshold:?}"
            ))
        } else {
            Ok(format!("last ran {since:.0?} ago"))
        }
    }
}

/// Whether the API says a pod has finished (Succeeded or Failed).
pub fn is_terminal_in_api(pod: &Pod) -> bool {
    crate::pod::is_from_api(pod)
        && matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        )
}

/// Timing of the loop.
#[derive(Clone, Copy, Debug)]
pub struct LoopTiming {
    pub housekeeping_interval: Duration,
    pub sync_frequency: Duration,
}

/// The sync loop's state.
pub struct SyncLoop {
    config: PodConfig,
    syncer: Arc<PodSyncer>,
    pods: HashMap<String, Pod>,
    workers: PodWorkers,
    done_rx: mpsc::UnboundedReceiver<String>,
    /// Pods that came back with a UID whose old worker is still terminating.
    readd_after_termination: HashMap<String, Pod>,
    router: RuntimeRouter,
    timing: LoopTiming,
    health: LoopHealth,
    housekeeping_running: Arc<std::sync::atomic::AtomicBool>,
    /// Whether a removal of orphaned pod cgroups is under way.
    cgroup_cleanup_running: Arc<std::sync::atomic::AtomicBool>,
    /// The plugin host and the admission plugins, in the configuration's order.
    plugins: Option<(
        wasmlet_plugin_host::PluginHost,
        crate::plugins::AdmissionPlugins,
    )>,
    /// The pod sources this node has; housekeeping removes nothing until each has
    /// sent its first snapshot (the kubelet's `sourcesReady`).
    sources: Vec<String>,
    /// Pods being deleted in the API whose termination has been started.
    deleting: HashSet<String>,
    /// Where the mirror pod manager reads the static pods from.
    static_pods: crate::cluster::mirror::StaticPods,
    /// What admission checks pods against; `None` admits every pod.
    node_info: Option<crate::admission::NodeInfo>,
    /// Pods admission rejected: Failed, never started.
    rejected: HashSet<String>,
    /// Pods whose workers are stopping them (they still use the node).
    terminating: HashMap<String, Pod>,
    statuses: StatusStore,
    events: crate::cluster::events::EventRecorder,
    /// Every pod UID this run has had a worker for (whose cgroups are this node's).
    seen: HashSet<String>,
    /// The probe workers, and the UIDs of pods whose probe results changed.
    probes: Option<crate::prober::ProbeManager>,
    probe_updates: Option<mpsc::UnboundedReceiver<String>>,
    /// The eviction manager's pressure (for admission) and its evictions.
    pressure: Option<crate::eviction::Pressure>,
    /// Whether the node shuts down (no new pod then).
    shutdown: Option<crate::shutdown::ShutdownState>,
    evictions: Option<mpsc::Receiver<crate::eviction::Eviction>>,
    /// What container GC keeps.
    container_gc: crate::kuberuntime::gc::ContainerGcPolicy,
    /// The topology manager (whose providers allocate devices at admission) and the
    /// device manager (whose allocatable joins the node's).
    resources: Option<(
        Arc<crate::cm::topologymanager::TopologyManager>,
        crate::cm::devicemanager::DeviceManager,
    )>,
    /// Changes of the CPU manager's shared set: every pod is synced, so that running
    /// containers get their new cpuset in place.
    cpu_changes: Option<tokio::sync::watch::Receiver<u64>>,
}

impl SyncLoop {
    pub fn new(
        syncer: Arc<PodSyncer>,
        statuses: StatusStore,
        timing: LoopTiming,
        health: LoopHealth,
    ) -> Self {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let router = syncer.router().clone();
        SyncLoop {
            config: PodConfig::default(),
            syncer: syncer.clone(),
            pods: HashMap::new(),
            workers: PodWorkers::new(syncer, statuses.clone(), done_tx),
            done_rx,
            readd_after_termination: HashMap::new(),
            router,
            timing,
            health,
            housekeeping_running: Arc::default(),
            cgroup_cleanup_running: Arc::default(),
            plugins: None,
            sources: Vec::new(),
            deleting: HashSet::new(),
            static_pods: Default::default(),
            node_info: None,
            resources: None,
            cpu_changes: None,
            rejected: HashSet::new(),
            terminating: HashMap::new(),
            statuses,
            events: Default::default(),
            probes: None,
            probe_updates: None,
            pressure: None,
            shutdown: None,
            evictions: None,
            seen: HashSet::new(),
            container_gc: Default::default(),
        }
    }

    /// Collects dead containers by `policy` (the kubelet's defaults otherwise).
    pub fn with_container_gc(mut self, policy: crate::kuberuntime::gc::ContainerGcPolicy) -> Self {
        self.container_gc = policy;
        self
    }

    /// Runs the pods' probes with `probes`; `updates` names the pods whose results
    /// changed, which are synced.
    pub fn with_probes(
        mut self,
        probes: crate::prober::ProbeManager,
        updates: mpsc::UnboundedReceiver<String>,
    ) -> Self {
        self.probes = Some(probes);
        self.probe_updates = Some(updates);
        self
    }

    /// Hands a pod to its worker to sync (the worker starts its probes once it has a
    /// status).
    fn sync(&mut self, pod: Pod) {
        self.seen.insert(uid(&pod).to_owned());
        self.workers.update(Work::Sync(Box::new(pod)));
    }

    /// Hands a pod to its worker to stop within `grace`. Its liveness and startup
    /// probes stop; readiness keeps running until it has terminated, as the kubelet's.
    fn terminate(&mut self, pod: Pod, grace: Duration) {
        self.seen.insert(uid(&pod).to_owned());
        if let Some(probes) = &self.probes {
            probes.stop_liveness_and_startup(uid(&pod));
        }
        self.terminating.insert(uid(&pod).to_owned(), pod.clone());
        self.workers.update(Work::Terminate {
            pod: Box::new(pod),
            grace,
        });
    }

    /// Names the pod sources whose first snapshot housekeeping waits for.
    pub fn with_sources(mut self, sources: impl IntoIterator<Item = String>) -> Self {
        self.sources = sources.into_iter().collect();
        self
    }

    /// Publishes the static pods to `static_pods` (for their mirror pods).
    pub fn with_static_pods(mut self, static_pods: crate::cluster::mirror::StaticPods) -> Self {
        self.static_pods = static_pods;
        self
    }

    /// Allocates new pods' devices at admission through the topology manager, after
    /// the pressure checks and before the built-in admission, as the kubelet's
    /// resource allocation admit handler.
    pub fn with_resources(
        mut self,
        topology: Arc<crate::cm::topologymanager::TopologyManager>,
        devices: crate::cm::devicemanager::DeviceManager,
    ) -> Self {
        self.resources = Some((topology, devices));
        self
    }

    /// Syncs every pod when the CPU manager's shared set changes (its containers'
    /// cpusets are then updated in place, as the kubelet's CPU manager reconciles).
    pub fn with_cpu_changes(mut self, changes: tokio::sync::watch::Receiver<u64>) -> Self {
        self.cpu_changes = Some(changes);
        self
    }

    /// Asks the admission plugins of `host` about every new pod, after the built-in
    /// admission.
    pub fn with_plugins(
        mut self,
        host: wasmlet_plugin_host::PluginHost,
        admission: crate::plugins::AdmissionPlugins,
    ) -> Self {
        self.plugins = Some((host, admission));
        self
    }

    /// Refuses new pods under the eviction manager's pressure (before every other
    /// check, as the kubelet's eviction admit handler comes first) and carries out
    /// its evictions.
    pub fn with_eviction(
        mut self,
        pressure: crate::eviction::Pressure,
        evictions: mpsc::Receiver<crate::eviction::Eviction>,
    ) -> Self {
        self.pressure = Some(pressure);
        self.evictions = Some(evictions);
        self
    }

    /// Refuses new pods while the node shuts down.
    pub fn with_shutdown(mut self, state: crate::shutdown::ShutdownState) -> Self {
        self.shutdown = Some(state);
        self
    }

    /// Admits new pods against `node` (resources, node affinity, OS, taints) and
    /// records admission rejections as events with `events`.
    pub fn with_admission(
        mut self,
        node: crate::admission::NodeInfo,
        events: crate::cluster::events::EventRecorder,
    ) -> Self {
        self.node_info = Some(node);
        self.events = events;
        self
    }

    /// The kubelet's admission of a new pod; a rejected pod is Failed with the
    /// rejection's reason and never started.
    async fn admit(&mut self, pod: &Pod) -> bool {
        if self.node_info.is_none() && self.resources.is_none() {
            return true;
        }
        // Active pods: not finished; those still terminating count too.
        let finished = |p: &Pod| {
            let phase = self
                .statuses
                .status(uid(p))
                .and_then(|s| s.phase)
                .or_else(|| p.status.as_ref().and_then(|s| s.phase.clone()));
            matches!(phase.as_deref(), Some("Succeeded" | "Failed"))
        };
        let admitted: Vec<Pod> = self
            .pods
            .values()
            .chain(self.readd_after_termination.values())
            .chain(self.terminating.values())
            .filter(|p| !finished(p))
            .cloned()
            .collect();
        // Pressure first, then the resource allocation (the topology manager and the
        // device manager), then the built-in checks, then the admission plugins in
        // their order. A pod the API reports Running was admitted by an earlier run of
        // this node, which was restarted: node pressure does not reject it now (the
        // kubelet's eviction manager has seen no pressure yet when a restarted kubelet
        // re-admits its pods; here the first pass may have run, and a full disk would
        // otherwise fail every running pod). Eviction still applies to it.
        let was_running = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|phase| phase == "Running");
        let under_pressure = self
            .pressure
            .as_ref()
            .filter(|_| !was_running)
            .map_or(Ok(()), |p| p.admit(pod))
            .and_then(|()| self.shutdown.as_ref().map_or(Ok(()), |s| s.admit(pod)));
        let allocated = match (under_pressure, &self.resources) {
            (Err(rejection), _) => Err(rejection),
            (Ok(()), None) => Ok(()),
            (Ok(()), Some((topology, _))) => {
                // As the kubelet's UpdateAllocatedDevices: once every source has
                // sent its pods, devices of pods that are gone or finished are free.
                if self
                    .config
                    .seen_all(self.sources.iter().map(String::as_str))
                {
                    let finished_uids: HashSet<&str> = self
                        .pods
                        .values()
                        .filter(|p| finished(p))
                        .map(uid)
                        .collect();
                    let active: HashSet<String> = self
                        .config
                        .uids()
                        .chain(self.terminating.keys().map(String::as_str))
                        .chain(std::iter::once(uid(pod)))
                        .filter(|u| !finished_uids.contains(u))
                        .map(str::to_owned)
                        .collect();
                    topology.retain_pods(&active);
                }
                topology.admit(pod).await
            }
        };
        let node = self.node_info.as_ref().map(|node| {
            let mut node = node.clone();
            if let Some((_, devices)) = &self.resources {
                for (name, n) in devices.admission_allocatable() {
                    node.allocatable.insert(
                        name,
                        k8s_openapi::apimachinery::pkg::api::resource::Quantity(n.to_string()),
                    );
                }
            }
            node
        });
        let decided = match allocated {
            Err(rejection) => Err(rejection),
            Ok(()) => {
                let checked = match &node {
                    Some(node) => crate::admission::admit(pod, &admitted, node),
                    None => Ok(()),
                };
                let checked = match (checked, &self.plugins, &node) {
                    (Ok(()), Some((host, names)), Some(node)) => {
                        crate::plugins::admit(host, names, pod, node, &admitted, &self.events).await
                    }
                    (other, _, _) => other,
                };
                if checked.is_err()
                    && let Some((topology, _)) = &self.resources
                {
                    topology.remove_pod(uid(pod));
                }
                checked
            }
        };
        match decided {
            Ok(()) => true,
            Err(rejection) => {
                tracing::warn!(pod = %full_name(pod), reason = %rejection.reason, "pod rejected: {}", rejection.message);
                self.events.pod(
                    pod,
                    None,
                    crate::cluster::events::WARNING,
                    "FailedAdmission",
                    format!("{}: {}", rejection.reason, rejection.message),
                );
                let status = k8s_openapi::api::core::v1::PodStatus {
                    phase: Some("Failed".into()),
                    reason: Some(rejection.reason),
                    message: Some(rejection.message),
                    ..Default::default()
                };
                self.rejected.insert(uid(pod).to_owned());
                self.statuses.set(pod.clone(), status);
                false
            }
        }
    }

    fn publish_static_pods(&self) {
        let ready = self
            .config
            .seen_all(self.sources.iter().map(String::as_str));
        let pods = self
            .pods
            .values()
            .filter(|p| crate::pod::is_static(p))
            .cloned()
            .collect();
        self.static_pods.set(ready, pods);
    }

    /// The tracker the pod workers run on (see [`PodWorkers::tasks`]), and the
    /// housekeeping passes' removals of orphans.
    pub fn worker_tasks(&self) -> tokio_util::task::TaskTracker {
        self.workers.tasks()
    }

    /// Runs until cancelled.
    pub async fn run(
        mut self,
        mut sources: mpsc::Receiver<SourceSnapshot>,
        mut pleg: mpsc::Receiver<PodLifecycleEvent>,
        cancel: CancellationToken,
    ) {
        let mut housekeeping = tokio::time::interval(self.timing.housekeeping_interval);
        let mut resync = tokio::time::interval(self.timing.sync_frequency);
        housekeeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        resync.tick().await;
        let mut probe_updates = self.probe_updates.take();
        let mut evictions = self.evictions.take();
        let mut cpu_changes = self.cpu_changes.take();
        loop {
            self.health.touch();
            tokio::select! {
                () = cancel.cancelled() => return,
                Some(snapshot) = sources.recv() => {
                    for update in self.config.merge(snapshot) {
                        self.apply(update).await;
                    }
                    self.publish_static_pods();
                }
                Some(event) = pleg.recv() => {
                    if let Some(pod) = self.pods.get(&event.pod_uid) {
                        self.workers.update(Work::Sync(Box::new(pod.clone())));
                    }
                }
                Some(id) = async {
                    match probe_updates.as_mut() {
                        Some(rx) => rx.recv().await,
                        None => std::future::pending().await,
                    }
                } => {
                    if let Some(pod) = self.pods.get(&id) {
                        self.workers.update(Work::Sync(Box::new(pod.clone())));
                    }
                }
                Some(eviction) = async {
                    match evictions.as_mut() {
                        Some(rx) => rx.recv().await,
                        None => std::future::pending().await,
                    }
                } => self.evict(eviction),
                Some(done) = self.done_rx.recv() => {
                    self.workers.finished(&done);
                    if let Some(probes) = &self.probes {
                        probes.remove_pod(&done);
                    }
                    // Its worker removed its cgroup (a second try is housekeeping's,
                    // through its directory, if that failed).
                    self.seen.remove(&done);
                    self.terminating.remove(&done);
                    if let Some(pod) = self.readd_after_termination.remove(&done) {
                        tracing::info!(pod = %full_name(&pod), "previous instance terminated; starting the pod again");
                        self.pods.insert(done, pod.clone());
                        self.sync(pod);
                    } else if !self.pods.contains_key(&done)
                        && let Some((topology, _)) = &self.resources
                    {
                        // Gone for good: its CPUs and devices are free again.
                        topology.remove_pod(&done);
                    }
                }
                Some(()) = async {
                    match cpu_changes.as_mut() {
                        Some(rx) => rx.changed().await.ok(),
                        None => std::future::pending().await,
                    }
                } => {
                    for pod in self.pods.values() {
                        self.workers.update(Work::Sync(Box::new(pod.clone())));
                    }
                }
                _ = housekeeping.tick() => self.housekeeping(),
                _ = resync.tick() => {
                    for pod in self.pods.values() {
                        self.workers.update(Work::Sync(Box::new(pod.clone())));
                    }
                }
            }
        }
    }

    /// Hands an eviction to the pod's worker; a pod the loop no longer runs is
    /// left alone.
    fn evict(&mut self, eviction: crate::eviction::Eviction) {
        let crate::eviction::Eviction {
            uid,
            grace,
            message,
            cause,
            accepted,
        } = eviction;
        let handed = match self.pods.get(&uid) {
            Some(pod) if !self.workers.is_terminating(&uid) => self.workers.update(Work::Evict {
                pod: Box::new(pod.clone()),
                grace,
                message,
                cause,
            }),
            _ => {
                tracing::debug!(uid = %uid, "eviction of a pod the node no longer runs or is stopping; refused");
                false
            }
        };
        let _ = accepted.send(handed);
    }

    async fn apply(&mut self, update: PodUpdate) {
        for pod in update.pods {
            let id = uid(&pod).to_owned();
            match update.op {
                PodOp::Add | PodOp::Update | PodOp::Reconcile
                    if pod.metadata.deletion_timestamp.is_some() =>
                {
                    // Deleted in the API: stop it within its grace; once stopped, the
                    // status manager deletes it for good and the source drops it.
                    self.readd_after_termination.remove(&id);
                    self.pods.remove(&id);
                    self.rejected.remove(&id);
                    if !self.deleting.insert(id.clone()) && !self.workers.contains(&id) {
                        continue; // already stopped; waiting for the source to drop it
                    }
                    tracing::info!(pod = %full_name(&pod), uid = %id, source = %update.source, "pod is being deleted");
                    let grace = grace_period(&pod);
                    self.terminate(pod, grace);
                }
                PodOp::Add | PodOp::Update | PodOp::Reconcile
                    if is_terminal_in_api(&pod) && !self.workers.contains(&id) =>
                {
                    // Finished before (this node restarted since): never run again, as
                    // the kubelet treats a pod terminal in the API as terminated.
                    if update.op == PodOp::Add {
                        tracing::info!(pod = %full_name(&pod), uid = %id, phase = ?pod.status.as_ref().and_then(|s| s.phase.as_deref()), "pod already finished; not starting it again");
                    }
                }
                PodOp::Add | PodOp::Update | PodOp::Reconcile if self.rejected.contains(&id) => {}
                PodOp::Add | PodOp::Update | PodOp::Reconcile
                    if !self.pods.contains_key(&id)
                        && !self.workers.contains(&id)
                        && !self.admit(&pod).await => {}
                PodOp::Add | PodOp::Update | PodOp::Reconcile => {
                    if self.workers.is_terminating(&id) {
                        self.readd_after_termination.insert(id, pod);
                        continue;
                    }
                    if update.op == PodOp::Add {
                        tracing::info!(pod = %full_name(&pod), uid = %id, source = %update.source, "pod added");
                    }
                    self.pods.insert(id, pod.clone());
                    self.sync(pod);
                }
                PodOp::Delete => {
                    tracing::info!(pod = %full_name(&pod), uid = %id, source = %update.source, "pod removed");
                    self.readd_after_termination.remove(&id);
                    if self.rejected.remove(&id) {
                        let status = self.statuses.status(&id).unwrap_or_default();
                        self.statuses.finish(pod, status);
                        continue;
                    }
                    if self.deleting.remove(&id) && !self.workers.contains(&id) {
                        continue; // stopped and finalized already
                    }
                    self.pods.remove(&id);
                    let grace = grace_period(&pod);
                    self.terminate(pod, grace);
                }
            }
        }
    }

    /// Removes sandboxes no desired pod and no worker owns (left over from pods that
    /// were deleted while the node was down, or from an earlier run).
    fn housekeeping(&mut self) {
        use std::sync::atomic::Ordering;
        if !self
            .config
            .seen_all(self.sources.iter().map(String::as_str))
        {
            // After a restart, pods still running belong to pods the sources have not
            // sent yet: removing them now would kill what the workers are about to adopt.
            return;
        }
        if self.housekeeping_running.swap(true, Ordering::AcqRel) {
            return;
        }
        let known: HashSet<String> = self
            .pods
            .keys()
            .cloned()
            .chain(self.readd_after_termination.keys().cloned())
            .collect();
        // A worker that is terminating owns its sandbox until it is done.
        let active: HashSet<String> = self.workers.uids().collect();
        // Directories and cgroups of pods that are gone, chosen here where no worker
        // can start meanwhile (the cgroups are removed in the background: what is left
        // in them is killed first).
        let live: HashSet<String> = known.union(&active).cloned().collect();
        // Only pod cgroups of pods this node ran (seen this run, or with a directory
        // of its own) are removed: another kubelet sharing the cgroup root keeps its
        // pods.
        let ours: HashSet<String> = self
            .seen
            .iter()
            .cloned()
            .chain(self.syncer.pod_dir_uids())
            .collect();
        self.syncer.remove_orphaned_pod_dirs(&live);
        if let Some(cm) = self.syncer.cgroups().cloned() {
            let orphans: Vec<String> = cm
                .pod_cgroups()
                .map(|m| {
                    m.into_keys()
                        .filter(|u| !live.contains(u) && ours.contains(u))
                        .collect()
                })
                .unwrap_or_default();
            // One removal at a time: a pass that is still killing what was left in an
            // orphan is not doubled by the next; what it could not remove is found on
            // disk again at the next pass and retried.
            if !orphans.is_empty()
                && !self
                    .cgroup_cleanup_running
                    .swap(true, std::sync::atomic::Ordering::AcqRel)
            {
                let running = self.cgroup_cleanup_running.clone();
                self.workers.tasks().spawn_blocking(move || {
                    for id in orphans {
                        match cm.remove_orphan(&id) {
                            Ok(true) => {
                                tracing::info!(pod_uid = %id, "removed an orphaned pod cgroup")
                            }
                            Ok(false) => {}
                            Err(e) => {
                                tracing::warn!(pod_uid = %id, "removing an orphaned pod cgroup: {e}")
                            }
                        }
                    }
                    running.store(false, std::sync::atomic::Ordering::Release);
                });
            }
        }
        let router = self.router.clone();
        let flag = self.housekeeping_running.clone();
        // Container GC's share: the log directories of pods gone, removed here where no
        // pod can be added meanwhile (as the pod directories above). A pod's logs stay
        // while any source has it, finished or refused.
        let mut with_logs = live.clone();
        with_logs.extend(self.config.uids().map(str::to_owned));
        for dir in
            crate::kuberuntime::gc::remove_pod_log_dirs(&self.syncer.pod_logs_dir, &with_logs)
        {
            tracing::info!(dir = %dir, "container GC: removed the log directory of a pod gone");
        }
        // Pods whose content may go though a source still has them: evicted and
        // stopped (the kubelet's `ShouldPodContentBeRemoved`).
        let evicted: HashSet<String> = self
            .pods
            .keys()
            .filter(|id| !active.contains(*id))
            .filter(|id| {
                self.statuses.status(id).is_some_and(|s| {
                    s.phase.as_deref() == Some("Failed")
                        && s.reason.as_deref() == Some(crate::thresholds::EVICTED)
                })
            })
            .cloned()
            .collect();
        let gc_policy = self.container_gc;
        self.workers.tasks().spawn(async move {
            let removable = |id: &str| !live.contains(id) || evicted.contains(id);
            for runtime in router.runtimes() {
                let sandboxes = match runtime.list_pod_sandboxes().await {
                    Ok(sandboxes) => sandboxes,
                    Err(e) => {
                        // The next pass tries again; an outage is reported by the
                        // runtime state manager, not once per pass here.
                        tracing::debug!(
                            runtime = runtime.name(),
                            "housekeeping: listing sandboxes for orphans: {e}"
                        );
                        continue;
                    }
                };
                // Container GC: dead instances beyond the policy, then dead, empty
                // sandboxes of pods that run in a newer one or whose content may go.
                let with_containers: HashSet<String> = match runtime.list_containers().await {
                    Ok(cs) => {
                        let gone = crate::kuberuntime::gc::remove_dead_containers(runtime.as_ref(), &cs, &gc_policy, &removable).await;
                        cs.into_iter()
                            .filter(|c| !gone.contains(&c.id))
                            .map(|c| c.sandbox_id)
                            .collect()
                    }
                    Err(_) => sandboxes.iter().map(|s| s.id.clone()).collect(),
                };
                for sb in crate::kuberuntime::gc::stale_sandboxes(&sandboxes, &with_containers, &live, &removable) {
                    tracing::info!(sandbox = %sb.id, "container GC: removing a dead sandbox of a pod that runs in a newer one");
                    if let Err(e) = runtime.remove_pod_sandbox(&sb.id).await {
                        tracing::warn!(sandbox = %sb.id, "removing a dead sandbox: {e}");
                    }
                }
                for sb in sandboxes {
                    let owner = sb.labels.get(labels::POD_UID).cloned().unwrap_or_default();
                    if known.contains(&owner) || active.contains(&owner) {
                        continue;
                    }
                    tracing::info!(sandbox = %sb.id, pod_uid = %owner, "removing orphaned sandbox");
                    if let Err(e) = runtime.remove_pod_sandbox(&sb.id).await {
                        tracing::warn!(sandbox = %sb.id, "removing orphaned sandbox: {e}");
                    }
                }
            }
            flag.store(false, Ordering::Release);
        });
    }
}
