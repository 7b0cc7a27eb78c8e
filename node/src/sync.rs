//! Syncing one pod: the kubelet's `SyncPod` and `computePodActions`, and `KillPod`.
//!
//! A pod worker owns a [`PodState`] for its pod and calls [`PodSyncer::sync_pod`]
//! whenever something may have changed. Each call refreshes what the runtime says,
//! then brings the runtime one step closer to the spec: a sandbox if there is none
//! (or it died), then every container that should run and does not, within the
//! restart policy and its back-off. What could not be done is recorded as the
//! container's waiting reason, with a time to try again.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Container, Pod};
use wasmlet_runtime::{ContainerState, ContainerStatus, Runtime, SandboxState};

use crate::backoff::Backoff;
use crate::cluster::events::{EventRecorder, NORMAL, WARNING};
use crate::kuberuntime::actions::{
    self, ActionInputs, BackoffLeft, ContainerAction, FailedProbe, KillReason, PodActions, Start,
    compute_container_actions, compute_pod_actions, init_container_done,
};
use crate::pod::{full_name, restart_policy, spec_grace_seconds, uid};
use crate::podspec::ClusterDns;
use crate::quantity;
use crate::router::RuntimeRouter;

use crate::pod_state::{KillCause, PodState, SandboxRecord, Waiting};

pub use crate::kuberuntime::termination::tail_of_log;

/// How often ConfigMap, Secret and downward API volumes are rewritten.
const CONTENT_REFRESH: Duration = Duration::from_secs(60);

/// The running instance of each of the pod's containers, by name.
fn running_instances(st: &PodState) -> impl Iterator<Item = (&str, &ContainerStatus)> {
    st.containers.iter().filter_map(|(name, rec)| {
        rec.current
            .as_ref()
            .filter(|cs| cs.state == ContainerState::Running)
            .map(|cs| (name.as_str(), cs))
    })
}

/// What a sync asks of its worker afterwards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncOutcome {
    /// Sync again after this long even if nothing happens (a back-off ends).
    pub requeue_after: Option<Duration>,
}

/// Does the work of pod workers; shared by all of them.
pub struct PodSyncer {
    pub(crate) router: RuntimeRouter,
    pub(crate) restart_backoff: Mutex<Backoff>,
    pub(crate) image_backoff: Mutex<Backoff>,
    /// The last failed pull per `<pod uid>/<image>`, shown during its back-off.
    pub(crate) pull_errors: Mutex<std::collections::HashMap<String, String>>,
    pub(crate) pod_logs_dir: PathBuf,
    /// How soon to retry after an error that has no back-off of its own.
    pub(crate) retry_after_error: Duration,
    pub(crate) dns: ClusterDns,
    pub(crate) events: EventRecorder,
    /// Where ConfigMaps and Secrets named by environments are read from.
    pub(crate) objects: Arc<dyn crate::env::ObjectSource>,
    /// The node's IPs (`status.hostIP(s)` in the downward API).
    pub(crate) host_ips: Vec<String>,
    /// Where termination message files live (`<root>/pods`); `None` disables them.
    pub(crate) pods_dir: Option<PathBuf>,
    /// The node's allocatable resources (limits a container does not set).
    pub(crate) allocatable:
        BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    /// Liveness, readiness and startup results.
    pub(crate) probes: Option<crate::prober::ProbeManager>,
    /// The QoS and pod cgroups; `None` without `cgroupsPerQOS`.
    pub(crate) cgroups: Option<Arc<crate::cm::ContainerManager>>,
    /// The containers' oom_score_adj where there are no pod cgroups.
    pub(crate) oom_scores: Option<crate::cm::OomScores>,
    /// How many pulls run at once and how often one starts.
    pub(crate) pull_limits: crate::images::puller::PullLimits,
    /// The node's own pull credentials (docker config, credential providers).
    pub(crate) node_keyring: Option<Arc<crate::images::providers::NodeKeyring>>,
    /// The device plugins' allocations, given to containers at start.
    pub(crate) devices: Option<crate::cm::devicemanager::DeviceManager>,
    /// The CPU manager's static policy: each container's cpuset.
    pub(crate) cpus: Option<crate::cm::cpumanager::CpuManager>,
    /// Stages and publishes the pods' CSI volumes.
    pub(crate) csi: Option<Arc<crate::volumes::csi::CsiVolumes>>,
}

/// Removes a container instance the pod no longer keeps; one already gone is fine,
/// any other failure is logged with the pod, the container and the instance.
pub(crate) async fn remove_instance(runtime: &dyn Runtime, pod: &Pod, container: &str, id: &str) {
    if let Err(e) = runtime.remove_container(id).await
        && !e.is_not_found()
    {
        tracing::warn!(pod = %full_name(pod), container, id, "removing an old container instance: {e}");
    }
}

/// The directory of a pod's log files: `<root>/<namespace>_<name>_<uid>`.
pub fn pod_log_dir(root: &std::path::Path, pod: &Pod) -> PathBuf {
    root.join(format!(
        "{}_{}_{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or(""),
        uid(pod)
    ))
}

/// The scheme of a runtime's container ids: the one it declares (`wasm://…`), else
/// the runtime name its version reports (`containerd://…`).
async fn id_scheme(runtime: &dyn Runtime) -> wasmlet_runtime::Result<String> {
    match runtime.capabilities().container_id_scheme {
        Some(scheme) => Ok(scheme),
        None => Ok(runtime.version().await?.runtime_name),
    }
}

/// The hash of a container's spec, written as `io.kubernetes.container.hash` like the
/// kubelet does: FNV-1a (32 bits) of the spec's JSON, in hex.
pub fn container_hash(c: &Container) -> String {
    let json = serde_json::to_vec(c).unwrap_or_default();
    let hash = json.iter().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    });
    format!("{hash:x}")
}

/// Why a container could not be started, and when to try again.
pub(crate) struct StartError {
    pub(crate) waiting: Waiting,
    pub(crate) retry: Duration,
}

impl PodSyncer {
    pub fn new(
        router: RuntimeRouter,
        backoff_initial: Duration,
        backoff_max: Duration,
        pod_logs_dir: PathBuf,
    ) -> Self {
        PodSyncer {
            router,
            restart_backoff: Mutex::new(Backoff::new(backoff_initial, backoff_max)),
            image_backoff: Mutex::new(Backoff::new(backoff_initial, backoff_max)),
            pull_errors: Mutex::default(),
            pod_logs_dir,
            retry_after_error: backoff_initial,
            dns: ClusterDns::default(),
            events: EventRecorder::default(),
            objects: Arc::new(crate::env::NoApiServer),
            host_ips: Vec::new(),
            allocatable: BTreeMap::new(),
            pods_dir: None,
            probes: None,
            cgroups: None,
            oom_scores: None,
            pull_limits: crate::images::puller::PullLimits::new(Default::default()),
            node_keyring: None,
            devices: None,
            cpus: None,
            csi: None,
        }
    }

    /// Gives containers the devices the device manager allocated to them.
    pub fn with_devices(mut self, devices: crate::cm::devicemanager::DeviceManager) -> Self {
        self.devices = Some(devices);
        self
    }

    /// Gives containers the cpusets of the CPU manager's static policy.
    pub fn with_cpus(mut self, cpus: crate::cm::cpumanager::CpuManager) -> Self {
        self.cpus = Some(cpus);
        self
    }

    /// Puts every pod in a pod cgroup of `cm`'s hierarchy.
    pub fn with_cgroups(mut self, cm: Arc<crate::cm::ContainerManager>) -> Self {
        self.cgroups = Some(cm);
        self
    }

    /// Gives containers the kubelet's oom_score_adj without pod cgroups
    /// (`cgroupsPerQOS: false`); with them, the container manager does.
    pub fn with_oom_scores(mut self, scores: crate::cm::OomScores) -> Self {
        self.oom_scores = Some(scores);
        self
    }

    /// A container's oom_score_adj, when the node knows its memory capacity.
    pub(crate) fn oom_score_adj(&self, pod: &Pod, c: &Container) -> Option<i64> {
        match (&self.cgroups, &self.oom_scores) {
            (Some(cm), _) => Some(cm.oom_score_adj(pod, c)),
            (None, Some(scores)) => Some(scores.for_container(pod, c)),
            (None, None) => None,
        }
    }

    /// The container manager, for housekeeping.
    pub fn cgroups(&self) -> Option<&Arc<crate::cm::ContainerManager>> {
        self.cgroups.as_ref()
    }

    /// Reads probe results from `probes`: a failed liveness or startup probe restarts
    /// its container, readiness goes into the status.
    pub fn with_probes(mut self, probes: crate::prober::ProbeManager) -> Self {
        self.probes = Some(probes);
        self
    }

    /// Copies the probe results of the pod's running instances into `st`, for its
    /// status.
    pub fn snapshot_probes(&self, st: &mut PodState) {
        st.probe_results.clear();
        let Some(probes) = &self.probes else { return };
        let mut results = BTreeMap::new();
        for (name, cs) in running_instances(st) {
            for kind in crate::probe_results::ProbeKind::ALL {
                if let Some(r) = probes.result(&cs.id, kind) {
                    results.insert((name.to_owned(), kind), r);
                }
            }
        }
        st.probe_results = results;
    }

    /// Starts the probes of a pod that is not finished (idempotent, as the kubelet's
    /// AddPod on every sync) and asks for a readiness probe at once of each running,
    /// started container not yet probed ready — called once its status is published,
    /// which is what the probe workers read.
    pub fn probe(&self, pod: &Pod, st: &PodState) {
        use crate::probe_results::{ProbeKind, ProbeResult};
        let Some(probes) = &self.probes else { return };
        probes.add_pod(pod);
        for (name, cs) in running_instances(st) {
            let started = matches!(
                probes.result(&cs.id, ProbeKind::Startup),
                None | Some(ProbeResult::Success)
            );
            if started && probes.result(&cs.id, ProbeKind::Readiness) != Some(ProbeResult::Success)
            {
                probes.trigger_unprobed_readiness(uid(pod), name);
            }
        }
    }

    /// A failed liveness or startup probe of a running instance: its type and probe.
    pub(crate) fn failed_probe<'c>(
        &self,
        c: &'c Container,
        id: &str,
    ) -> Option<(
        crate::probe_results::ProbeKind,
        &'c k8s_openapi::api::core::v1::Probe,
    )> {
        use crate::probe_results::{ProbeKind, ProbeResult};
        let probes = self.probes.as_ref()?;
        [ProbeKind::Startup, ProbeKind::Liveness]
            .into_iter()
            .filter_map(|k| Some((k, k.of(c)?)))
            .find(|(k, _)| probes.result(id, *k) == Some(ProbeResult::Failure))
    }

    /// Keeps termination message files under `dir` (`<root>/pods`).
    /// Image pulls within `limits`, with the node's own credentials after a pod's.
    pub fn with_pulls(
        mut self,
        limits: crate::images::puller::PullLimits,
        keyring: Arc<crate::images::providers::NodeKeyring>,
    ) -> Self {
        self.pull_limits = limits;
        self.node_keyring = Some(keyring);
        self
    }

    pub fn with_pods_dir(mut self, dir: PathBuf) -> Self {
        self.pods_dir = Some(dir);
        self
    }

    /// Sets up the pods' CSI volumes through `csi`.
    pub fn with_csi(mut self, csi: Arc<crate::volumes::csi::CsiVolumes>) -> Self {
        self.csi = Some(csi);
        self
    }

    /// Reads ConfigMaps and Secrets for environments from `objects`.
    pub fn with_objects(mut self, objects: Arc<dyn crate::env::ObjectSource>) -> Self {
        self.objects = objects;
        self
    }

    /// The node's IPs and allocatable resources, for the downward API.
    pub fn with_node(
        mut self,
        host_ips: Vec<String>,
        allocatable: BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    ) -> Self {
        self.host_ips = host_ips;
        self.allocatable = allocatable;
        self
    }

    /// Records the kubelet's events (Pulling, Created, Started, Killing, BackOff...).
    pub fn with_events(mut self, events: EventRecorder) -> Self {
        self.events = events;
        self
    }

    /// Sets the cluster DNS that pods with `ClusterFirst` get.
    pub fn with_dns(mut self, dns: ClusterDns) -> Self {
        self.dns = dns;
        self
    }

    pub fn router(&self) -> &RuntimeRouter {
        &self.router
    }

    /// The UIDs of the pods this node has a directory for (it ran them).
    pub fn pod_dir_uids(&self) -> std::collections::HashSet<String> {
        let Some(dir) = &self.pods_dir else {
            return Default::default();
        };
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    }

    /// Removes the directories (volumes, termination messages) of pods that are not
    /// in `live`: pods deleted while the node was down (the kubelet's
    /// cleanupOrphanedPodDirs). The caller makes sure no worker of such a pod runs.
    pub fn remove_orphaned_pod_dirs(&self, live: &std::collections::HashSet<String>) {
        let Some(dir) = &self.pods_dir else { return };
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if live.contains(&name) {
                continue;
            }
            // CSI volumes are unpublished (and unstaged) by their drivers first, in
            // the background; the directory goes once they are.
            if let Some(csi) = &self.csi
                && csi.tear_down_in_background(entry.path())
            {
                continue;
            }
            tracing::info!(pod_uid = %name, "removing the directory of a pod that is gone");
            crate::volumes::tear_down(&entry.path());
            crate::volumes::remove_pod_dir(&entry.path());
        }
    }

    /// Whether every container has terminated and none will be restarted.
    pub fn is_pod_done(pod: &Pod, st: &PodState) -> bool {
        actions::is_pod_done(pod, st)
    }

    /// What a sync needs to know besides the pod and its state: the probe results
    /// and restart back-offs of its containers, and the resources their specs ask for.
    pub(crate) fn action_inputs(&self, pod: &Pod, st: &PodState, now: Timestamp) -> ActionInputs {
        let mut inputs = ActionInputs::at(now);
        let backoff = self.restart_backoff.lock().unwrap();
        for c in crate::pod::containers(pod) {
            if let Ok(r) = self.container_resources(pod, c) {
                inputs.desired_resources.insert(c.name.clone(), r);
            }
            let Some(cs) = st.containers.get(&c.name).and_then(|r| r.current.as_ref()) else {
                continue;
            };
            if cs.state == ContainerState::Running {
                if let Some((kind, probe)) = self.failed_probe(c, &cs.id) {
                    let grace = probe
                        .termination_grace_period_seconds
                        .unwrap_or_else(|| spec_grace_seconds(pod))
                        .max(0) as u64;
                    let failed = FailedProbe {
                        kind,
                        grace_seconds: grace,
                    };
                    inputs.failed_probes.insert(c.name.clone(), failed);
                }
                if self.startup_succeeded(&cs.id) {
                    inputs.startup_succeeded.insert(c.name.clone());
                }
            } else {
                let key = format!("{}/{}", uid(pod), c.name);
                let finished = cs.finished_at.unwrap_or(now);
                if let Some(remaining) = backoff.remaining(&key, finished, now) {
                    let delay = backoff.get(&key).unwrap_or_default();
                    inputs
                        .backoff
                        .insert(c.name.clone(), BackoffLeft { remaining, delay });
                }
            }
        }
        inputs
    }

    /// Whether the startup probe of a running instance succeeded.
    pub(crate) fn startup_succeeded(&self, id: &str) -> bool {
        use crate::probe_results::{ProbeKind, ProbeResult};
        self.probes
            .as_ref()
            .is_some_and(|p| p.result(id, ProbeKind::Startup) == Some(ProbeResult::Success))
    }

    /// Brings the runtime one step closer to the pod's spec: gathers what the runtime
    /// says, then executes what [`compute_pod_actions`] decides.
    pub async fn sync_pod(&self, pod: &Pod, st: &mut PodState) -> SyncOutcome {
        let now = Timestamp::now();
        st.start_time.get_or_insert(now);
        // Before the runtime is asked anything: a pod that failed already, or ran past
        // its deadline.
        match compute_pod_actions(pod, st, &ActionInputs::at(now)) {
            PodActions::Nothing => return SyncOutcome::default(),
            PodActions::KillPod(KillReason::DeadlineExceeded) => {
                self.kill_past_deadline(pod, st).await;
                return SyncOutcome::default();
            }
            _ => {}
        }
        let until_deadline = actions::until_deadline(pod, st, now);
        let runtime = match &st.runtime {
            Some(r) => r.clone(),
            None => match self.router.for_pod(pod) {
                Ok((r, handler)) => {
                    st.runtime_name = match id_scheme(&*r).await {
                        Ok(scheme) => scheme,
                        Err(e) => {
                            let message = format!("container runtime is down: {e}");
                            return self.not_started(pod, st, message);
                        }
                    };
                    st.runtime = Some(r.clone());
                    st.handler = handler;
                    r
                }
                Err(message) => {
                    return self.not_started(pod, st, message);
                }
            },
        };
        if !st.adopted
            && let Err(e) = self.adopt_on_draft(&*runtime, pod, st).await
        {
            // Creating anything now could duplicate what is already running.
            let message = format!("listing the runtime's sandboxes and containers: {e}");
            return self.not_started(pod, st, message);
        }
        self.refresh(&*runtime, st).await;
        self.termination_messages(pod, st);

        let mut inputs = self.action_inputs(pod, st, now);
        let actions = match compute_pod_actions(pod, st, &inputs) {
            PodActions::Nothing => return SyncOutcome::default(),
            // An adopted sandbox can date the pod's start back past its deadline.
            PodActions::KillPod(KillReason::DeadlineExceeded) => {
                self.kill_past_deadline(pod, st).await;
                return SyncOutcome::default();
            }
            PodActions::KillPod(KillReason::PodDone) => {
                self.finish_pod(pod, st, &*runtime).await;
                return SyncOutcome::default();
            }
            PodActions::SandboxDiedNoRestart => None,
            PodActions::Sync(actions) => Some(actions),
        };

        match self.set_up_volumes(pod, st).await {
            Ok(()) => {}
            Err(message) => {
                self.events
                    .pod(pod, None, WARNING, "FailedMount", message.clone());
                return self.not_started(pod, st, message);
            }
        }
        // Like the kubelet: a Never pod whose sandbox died is not started again; its
        // containers are reported as they ended.
        let Some(actions) = actions else {
            return SyncOutcome::default();
        };
        match &actions.create_sandbox {
            None => {
                // Every sync keeps the pod cgroup as the spec sizes it: made again if
                // it was removed behind the node, counted in the QoS shares after a
                // restart (an adopted pod), resized in place. A resize that grows the
                // pod must reach the pod cgroup before its containers (cgroup v1
                // refuses a child quota above its parent's); one that shrinks it fails
                // here (a pod is never limited below what it uses, nor below its
                // containers) and is written again once the containers were updated,
                // below.
                if let Err(message) = self.pod_cgroup(pod, &runtime.capabilities()) {
                    tracing::debug!(pod = %full_name(pod), "{message}; trying again after the containers");
                }
            }
            Some(create) => {
                if let Err(outcome) = self.create_sandbox(pod, st, &*runtime, create).await {
                    return outcome;
                }
            }
        }
        let sandbox = st.sandbox.clone().expect("a ready sandbox exists here");

        let policy = restart_policy(pod).to_owned();
        let init_policy = if policy == "Never" {
            "Never"
        } else {
            "OnFailure"
        };
        let mut requeue: Option<Duration> = None;
        let mut soonest = |d: Duration| requeue = Some(requeue.map_or(d, |r: Duration| r.min(d)));
        let spec = pod.spec.clone().unwrap_or_default();
        let find = |list: &[Container], name: &str| list.iter().find(|c| c.name == name).cloned();
        let init_containers = spec.init_containers.clone().unwrap_or_default();
        let mut plan = actions.containers;
        // Each init container is synced once; one that is done at once (a sidecar
        // without a startup probe, a guest that ends at once) lets the next start in
        // this same sync: the actions are computed again for the rest.
        let mut handled = std::collections::BTreeSet::new();
        let initialized = loop {
            let mut progressed = false;
            let mut blocked = false;
            for step in &plan.init_containers {
                if !handled.insert(step.name.clone()) {
                    continue;
                }
                progressed = true;
                let Some(ic) = find(&init_containers, &step.name) else {
                    continue;
                };
                let sidecar = ic.restart_policy.as_deref() == Some("Always");
                let container_policy = if sidecar { "Always" } else { init_policy };
                if let Some(d) = self
                    .execute_container(
                        &*runtime,
                        pod,
                        &ic,
                        (&sandbox, container_policy, now),
                        st,
                        &step.action,
                        &inputs,
                    )
                    .await
                {
                    soonest(d);
                }
                let rec = st.containers.get(&ic.name);
                let started = rec
                    .and_then(|r| r.current.as_ref())
                    .is_some_and(|cs| self.startup_succeeded(&cs.id));
                if !init_container_done(&ic, rec, started) && !plan.already_initialized {
                    blocked = true;
                    break;
                }
            }
            if blocked {
                break false;
            }
            if plan.initialized {
                break true;
            }
            if !progressed {
                break false;
            }
            inputs = self.action_inputs(pod, st, now);
            plan = compute_container_actions(pod, st, Some(&sandbox.id), &inputs);
        };
        st.initialized = initialized;
        if initialized {
            st.initialized_in = Some(sandbox.id.clone());
            for step in &plan.containers {
                let Some(c) = find(&spec.containers, &step.name) else {
                    continue;
                };
                if let Some(d) = self
                    .execute_container(
                        &*runtime,
                        pod,
                        &c,
                        (&sandbox, &policy, now),
                        st,
                        &step.action,
                        &inputs,
                    )
                    .await
                {
                    soonest(d);
                }
            }
        }
        // A container that exited during this sync (a guest that ends at once) has
        // its termination message in the status this sync makes.
        self.termination_messages(pod, st);
        // After the containers: what a shrink could not write before them (nothing
        // while one of them refused its resize). A no-op when nothing changed.
        if st.containers.values().all(|r| r.resize_error.is_none())
            && let Err(message) = self.pod_cgroup(pod, &runtime.capabilities())
        {
            tracing::warn!(pod = %full_name(pod), "{message}");
        }
        SyncOutcome {
            requeue_after: match (requeue, until_deadline) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
        }
    }

    /// The kubelet's `killPodFunc`: for an eviction (`isEvicted`) the `Evicted` event
    /// first; then the pod stopped within `grace`, and failed with the cause's reason
    /// and `message`. A pod that failed already is left as it is.
    pub(crate) async fn evict(
        &self,
        pod: &Pod,
        st: &mut PodState,
        grace: Duration,
        message: String,
        cause: KillCause,
    ) {
        if st.failure.is_some() {
            return;
        }
        if cause == KillCause::Evicted {
            self.events.pod(
                pod,
                None,
                WARNING,
                crate::thresholds::EVICTED,
                message.clone(),
            );
        }
        self.kill_pod(pod, st, grace).await;
        st.failure = Some((cause.reason().into(), message));
    }

    /// As the kubelet: a pod past its deadline fails and its containers are stopped.
    pub(crate) async fn kill_past_deadline(&self, pod: &Pod, st: &mut PodState) {
        tracing::info!(pod = %full_name(pod), "pod ran past activeDeadlineSeconds; stopping it");
        self.events.pod(
            pod,
            None,
            NORMAL,
            "DeadlineExceeded",
            "Pod was active on the node longer than the specified deadline",
        );
        let grace = crate::pod::grace_period(pod);
        self.kill_pod(pod, st, grace).await;
        st.failure = Some((
            "DeadlineExceeded".into(),
            "Pod was active on the node longer than the specified deadline".into(),
        ));
    }

    /// Terminal: nothing will run again. Stops the sidecars (gracefully, in reverse
    /// order), releases the sandbox, keeps the statuses.
    pub(crate) async fn finish_pod(&self, pod: &Pod, st: &mut PodState, runtime: &dyn Runtime) {
        if st.sandbox.as_ref().is_some_and(|s| s.ready) {
            let grace = crate::pod::grace_period(pod);
            self.stop_running(pod, st, runtime, grace).await;
            self.refresh(runtime, st).await;
            self.termination_messages(pod, st);
        }
        if let Some(sb) = st.sandbox.as_mut().filter(|s| s.ready) {
            if let Err(e) = runtime.stop_pod_sandbox(&sb.id).await {
                tracing::warn!(pod = %full_name(pod), "stopping the sandbox of a finished pod: {e}");
            }
            sb.ready = false;
            // Its tmpfs and CSI volumes are released with it; the files of disk
            // volumes stay until the pod is removed.
            if let Some(dir) = &self.pods_dir {
                self.tear_down_csi(pod, &dir.join(uid(pod))).await;
                crate::volumes::tear_down(&dir.join(uid(pod)));
            }
            // Nothing runs in its cgroup any more: it goes, and the pod stops counting
            // in the burstable shares (what cannot be removed now is an orphan for
            // housekeeping).
            if let Some(cm) = self.cgroups.clone() {
                let id = uid(pod).to_owned();
                match tokio::task::spawn_blocking(move || cm.remove_pod(&id)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::warn!(pod = %full_name(pod), "removing the cgroup of a finished pod: {e}")
                    }
                    Err(e) => {
                        tracing::warn!(pod = %full_name(pod), "removing the cgroup of a finished pod: {e}")
                    }
                }
            }
        }
    }

    /// Executes one container's action (`at`: its sandbox, its restart policy and the
    /// sync's time). Returns when to look again.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn execute_container(
        &self,
        runtime: &dyn Runtime,
        pod: &Pod,
        c: &Container,
        at: (&SandboxRecord, &str, Timestamp),
        st: &mut PodState,
        action: &ContainerAction,
        inputs: &ActionInputs,
    ) -> Option<Duration> {
        let (sandbox, policy, now) = at;
        let mut action = action.clone();
        let mut inputs = std::borrow::Cow::Borrowed(inputs);
        loop {
            match action {
                ContainerAction::Kill {
                    probe,
                    grace,
                    restart,
                    ..
                } => {
                    let id = st
                        .containers
                        .get(&c.name)
                        .and_then(|r| r.current.as_ref())
                        .map(|cs| cs.id.clone())
                        .expect("a running instance");
                    let what = probe.name().to_lowercase();
                    tracing::info!(pod = %full_name(pod), container = %c.name, "container failed its {what} probe; restarting it");
                    self.events.pod(
                        pod,
                        Some(&c.name),
                        NORMAL,
                        "Killing",
                        actions::probe_kill_message(c, probe, restart),
                    );
                    let deadline = tokio::time::Instant::now() + grace;
                    self.stop_one(pod, st, runtime, &c.name, &id, deadline)
                        .await;
                    let rec = st.containers.get_mut(&c.name).expect("present above");
                    rec.probe_killed = true;
                    match runtime.container_status(&id).await {
                        Ok(now_status) => rec.current = Some(now_status),
                        // Decided on what was known before the kill; the next sync sees more.
                        Err(e) => {
                            tracing::warn!(pod = %full_name(pod), container = %c.name, id = %id, error = %e, "reading the container's status after its probe kill")
                        }
                    }
                    // Then as it stands now: restarted, or still running.
                    inputs.to_mut().failed_probes.remove(&c.name);
                    action = actions::container_action(
                        pod,
                        c,
                        st.containers.get(&c.name),
                        Some(&sandbox.id),
                        policy,
                        &inputs,
                    );
                }
                ContainerAction::Keep { resize } => {
                    let rec = st.containers.get_mut(&c.name)?;
                    rec.waiting = None;
                    if !resize {
                        // What it runs with is what the spec says (again: a refused
                        // resize that was reverted is no longer in progress).
                        rec.resize_error = None;
                        return None;
                    }
                    let id = rec.current.as_ref()?.id.clone();
                    return self.resize_running(runtime, pod, c, &id, st).await;
                }
                ContainerAction::Done => {
                    st.containers.entry(c.name.clone()).or_default().waiting = None;
                    return None;
                }
                ContainerAction::BackOff { waiting, retry } => {
                    let rec = st.containers.entry(c.name.clone()).or_default();
                    if rec
                        .waiting
                        .as_ref()
                        .is_none_or(|w| w.reason != "CrashLoopBackOff")
                    {
                        self.events.pod(
                            pod,
                            Some(&c.name),
                            WARNING,
                            "BackOff",
                            actions::backoff_event_message(pod, c),
                        );
                    }
                    rec.waiting = Some(waiting);
                    return Some(retry);
                }
                ContainerAction::Start(start) => {
                    return self
                        .execute_start(runtime, pod, c, sandbox, st, &start, now)
                        .await;
                }
            }
        }
    }

    /// Starts a new instance of a container, as `start` says.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn execute_start(
        &self,
        runtime: &dyn Runtime,
        pod: &Pod,
        c: &Container,
        sandbox: &SandboxRecord,
        st: &mut PodState,
        start: &Start,
        now: Timestamp,
    ) -> Option<Duration> {
        let rec = st.containers.entry(c.name.clone()).or_default();
        if start.retire_current
            && let Some(old) = rec.current.take()
        {
            // A new attempt (the runtime names containers by attempt).
            rec.restart_count += 1;
            // The older dead instance is container GC's to remove.
            rec.last_terminated = Some(old);
        }
        if let Some(finished) = start.backoff_from {
            let key = format!("{}/{}", uid(pod), c.name);
            self.restart_backoff
                .lock()
                .unwrap()
                .next(&key, finished, now);
        }
        let attempt = start.attempt;
        let volumes = st.volumes.clone();
        match self
            .start_container(runtime, pod, c, sandbox, &volumes, attempt)
            .await
        {
            Ok(status) => {
                let rec = st.containers.get_mut(&c.name).expect("inserted above");
                if let Some(prev) = rec.current.take() {
                    if matches!(
                        prev.state,
                        ContainerState::Created | ContainerState::Unknown
                    ) {
                        // It never ran: nothing to keep.
                        remove_instance(runtime, pod, &c.name, &prev.id).await;
                    } else {
                        // Shown as the last termination; the older dead instance is
                        // container GC's to remove.
                        rec.last_terminated = Some(prev);
                    }
                }
                rec.current = Some(status);
                rec.restart_count = attempt;
                rec.waiting = None;
                rec.probe_killed = false;
                rec.resize_error = None;
                rec.applied = self
                    .container_resources(pod, c)
                    .ok()
                    .map(|r| (r, c.resources.clone()));
                None
            }
            Err(StartError { waiting, retry }) => {
                tracing::warn!(pod = %full_name(pod), container = %c.name, reason = %waiting.reason, "{}", waiting.message);
                if waiting.reason != "ImagePullBackOff" {
                    self.events.pod(
                        pod,
                        Some(&c.name),
                        WARNING,
                        "Failed",
                        format!("Error: {}", waiting.reason),
                    );
                }
                st.containers
                    .get_mut(&c.name)
                    .expect("inserted above")
                    .waiting = Some(waiting);
                Some(retry)
            }
        }
    }

    /// Stops every container (within `grace`) and the sandbox, and removes them. A pod
    /// this worker never synced (the node restarted meanwhile) first adopts what the
    /// runtime still runs for it, so that is stopped gracefully too.
    pub async fn kill_pod(&self, pod: &Pod, st: &mut PodState, grace: Duration) {
        if !st.adopted && st.runtime.is_none() {
            match self.router.for_pod(pod) {
                Ok((runtime, handler)) => {
                    st.runtime_name = match id_scheme(&*runtime).await {
                        Ok(scheme) => scheme,
                        Err(e) => {
                            tracing::warn!(pod = %full_name(pod), runtime = runtime.name(), error = %e, "reading the runtime's container id scheme while killing the pod; using its name");
                            runtime.name().to_owned()
                        }
                    };
                    // Whatever it did not find is not stopped gracefully; housekeeping
                    // removes it later.
                    if let Err(e) = self.adopt_on_draft(&*runtime, pod, st).await {
                        tracing::warn!(pod = %full_name(pod), runtime = runtime.name(), error = %e, "adopting what the runtime runs for the pod before killing it");
                    }
                    st.runtime = Some(runtime);
                    st.handler = handler;
                }
                // No runtime for it: this node cannot have started anything for it.
                Err(message) => {
                    tracing::debug!(pod = %full_name(pod), "no runtime to kill the pod in: {message}")
                }
            }
        }
        if let Some(runtime) = st.runtime.clone() {
            self.stop_running(pod, st, &*runtime, grace).await;
            // The final states (exit codes, termination messages) are read before the
            // sandbox and its containers are removed with it.
            self.refresh(&*runtime, st).await;
            self.termination_messages(pod, st);
            if let Some(sb) = st.sandbox.take()
                && let Err(e) = runtime.remove_pod_sandbox(&sb.id).await
            {
                tracing::warn!(pod = %full_name(pod), "removing sandbox {}: {e}", sb.id);
            }
        }
        let mut cgroup_removed = true;
        if let Some(cm) = self.cgroups.clone() {
            // Whatever is left in it is killed first (it can take a few seconds).
            let id = uid(pod).to_owned();
            let removed = tokio::task::spawn_blocking(move || cm.remove_pod(&id)).await;
            if let Ok(Err(e)) = removed {
                tracing::warn!(pod = %full_name(pod), "removing the pod cgroup: {e}");
                cgroup_removed = false;
            }
        }
        if let Some(dir) = &self.pods_dir {
            let pod_dir = dir.join(uid(pod));
            // A CSI volume that could not be unpublished keeps the directory (and its
            // data) for housekeeping to try again.
            let csi_done = self.tear_down_csi(pod, &pod_dir).await;
            crate::volumes::tear_down(&pod_dir);
            // Kept while its cgroup is: housekeeping tries again through it. Its
            // volumes' contents go now either way, so what they held (an emptyDir an
            // evicted pod filled) is freed at once.
            if cgroup_removed && csi_done {
                crate::volumes::remove_pod_dir(&pod_dir);
            } else if csi_done {
                crate::volumes::remove_pod_dir(&crate::volumes::volumes_dir(&pod_dir));
            }
        }
        let prefix = format!("{}/", uid(pod));
        self.restart_backoff.lock().unwrap().forget_prefix(&prefix);
        self.image_backoff.lock().unwrap().forget_prefix(&prefix);
        self.pull_errors
            .lock()
            .unwrap()
            .retain(|k, _| !k.starts_with(&prefix));
    }

    /// Unpublishes (and unstages) the pod's CSI volumes; `false`, with a
    /// `FailedUnmount` event, when one could not be.
    async fn tear_down_csi(&self, pod: &Pod, pod_dir: &std::path::Path) -> bool {
        let Some(csi) = &self.csi else { return true };
        match csi.tear_down(pod_dir).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(pod = %full_name(pod), "{e}");
                self.events.pod(pod, None, WARNING, "FailedUnmount", e);
                false
            }
        }
    }

    /// Sets up the pod's volumes not set up yet, and refreshes the content volumes
    /// (ConfigMaps, Secrets, tokens) once a minute. A `medium: Memory` emptyDir without
    /// a `sizeLimit` is sized by the pod's memory limit, else the node's allocatable
    /// memory.
    pub(crate) async fn set_up_volumes(&self, pod: &Pod, st: &mut PodState) -> Result<(), String> {
        let spec = pod.spec.as_ref();
        if spec.is_none_or(|s| s.volumes.as_ref().is_none_or(Vec::is_empty)) {
            return Ok(());
        }
        let Some(dir) = &self.pods_dir else {
            return Err("this node has no pods directory for volumes".into());
        };
        let pod_limit: Option<u64> = spec
            .iter()
            .flat_map(|s| &s.containers)
            .map(|c| {
                c.resources
                    .as_ref()
                    .and_then(|r| r.limits.as_ref())
                    .and_then(|l| l.get("memory"))
                    .and_then(|q| quantity::bytes(q).ok())
            })
            .sum();
        let limit = pod_limit.or_else(|| {
            self.allocatable
                .get("memory")
                .and_then(|q| quantity::bytes(q).ok())
        });
        let ctx = crate::volumes::SetUpContext {
            memory_limit: limit,
            objects: &*self.objects,
            allocatable: &self.allocatable,
            csi: self.csi.as_deref(),
        };
        let all_set_up = spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .all(|v| st.volumes.iter().any(|(n, _)| *n == v.name));
        if !all_set_up {
            st.volumes =
                crate::volumes::set_up(pod, &dir.join(uid(pod)), &st.volumes, &ctx).await?;
            st.volumes_refreshed = Some(tokio::time::Instant::now());
            return Ok(());
        }
        // A claim whose volume grew gets its filesystem expanded (every sync, as the
        // kubelet's volume manager checks).
        if let Some(csi) = &self.csi {
            for outcome in csi.expand(pod, &*self.objects).await {
                match outcome {
                    Ok(m) => self
                        .events
                        .pod(pod, None, NORMAL, "FileSystemResizeSuccessful", m),
                    Err(e) => {
                        tracing::warn!(pod = %full_name(pod), "{e}");
                        self.events.pod(pod, None, WARNING, "VolumeResizeFailed", e);
                    }
                }
            }
        }
        let due = st
            .volumes_refreshed
            .is_none_or(|t| t.elapsed() >= CONTENT_REFRESH);
        if due {
            st.volumes_refreshed = Some(tokio::time::Instant::now());
            // A failed refresh keeps the files as they are and the pod running.
            if let Err(e) = crate::volumes::refresh(pod, &mut st.volumes, &ctx).await {
                tracing::warn!(pod = %full_name(pod), "{e}");
                self.events.pod(pod, None, WARNING, "FailedMount", e);
            }
        }
        Ok(())
    }

    /// Re-reads the sandbox and container states from the runtime.
    pub(crate) async fn refresh(&self, runtime: &dyn Runtime, st: &mut PodState) {
        if let Some(sb) = st.sandbox.as_mut() {
            match runtime.pod_sandbox_status(&sb.id).await {
                Ok(s) => {
                    sb.ready = s.state == SandboxState::Ready;
                    sb.ip = s.ip;
                    sb.additional_ips = s.additional_ips;
                }
                Err(e) if e.is_not_found() => sb.ready = false,
                Err(e) => tracing::warn!(sandbox = %sb.id, "sandbox status: {e}"),
            }
        }
        for rec in st.containers.values_mut() {
            let Some(cur) = rec.current.as_mut() else {
                continue;
            };
            match runtime.container_status(&cur.id).await {
                Ok(s) => *cur = s,
                Err(e) if e.is_not_found() => {
                    if cur.state != ContainerState::Exited {
                        cur.state = ContainerState::Exited;
                        cur.exit_code = 137;
                        cur.reason = "ContainerStatusUnknown".into();
                        cur.message = "The container could not be located".into();
                        cur.finished_at = Some(Timestamp::now());
                    }
                }
                Err(e) => tracing::warn!(container = %cur.id, "container status: {e}"),
            }
        }
    }

    /// The pod cannot start yet: every container waits in `ContainerCreating` with
    /// `message`, and the pod is looked at again after the error delay.
    pub(crate) fn not_started(&self, pod: &Pod, st: &mut PodState, message: String) -> SyncOutcome {
        tracing::warn!(pod = %full_name(pod), "{message}");
        self.wait_all(pod, st, Waiting::new("ContainerCreating", message.clone()));
        st.sandbox_error = Some(message);
        SyncOutcome {
            requeue_after: Some(self.retry_after_error),
        }
    }

    pub(crate) fn wait_all(&self, pod: &Pod, st: &mut PodState, waiting: Waiting) {
        for c in pod.spec.iter().flat_map(|s| &s.containers) {
            let rec = st.containers.entry(c.name.clone()).or_default();
            if rec
                .current
                .as_ref()
                .is_none_or(|cs| cs.state != ContainerState::Running)
            {
                rec.waiting = Some(waiting.clone());
            }
        }
    }
}
