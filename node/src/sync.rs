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
use wasmlet_runtime::{
    Capabilities, ContainerConfig, ContainerMetadata, ContainerResources, ContainerState,
    ContainerStatus, PodMetadata, PodSandboxConfig, Runtime, SandboxState,
};

use crate::backoff::Backoff;
use crate::cluster::events::{EventRecorder, NORMAL, WARNING};
use crate::duration;
use crate::pod::{full_name, restart_policy, should_restart, spec_grace_seconds, uid};
use crate::podspec::{self, ClusterDns};
use crate::quantity;
use crate::router::RuntimeRouter;

use crate::pod_state::{PodState, SandboxRecord, Waiting, labels};

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
    router: RuntimeRouter,
    restart_backoff: Mutex<Backoff>,
    image_backoff: Mutex<Backoff>,
    /// The last failed pull per `<pod uid>/<image>`, shown during its back-off.
    pull_errors: Mutex<std::collections::HashMap<String, String>>,
    pod_logs_dir: PathBuf,
    /// How soon to retry after an error that has no back-off of its own.
    retry_after_error: Duration,
    dns: ClusterDns,
    events: EventRecorder,
    /// Where ConfigMaps and Secrets named by environments are read from.
    objects: Arc<dyn crate::env::ObjectSource>,
    /// The node's IPs (`status.hostIP(s)` in the downward API).
    host_ips: Vec<String>,
    /// Where termination message files live (`<root>/pods`); `None` disables them.
    pods_dir: Option<PathBuf>,
    /// The node's allocatable resources (limits a container does not set).
    allocatable: BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    /// Liveness, readiness and startup results.
    probes: Option<crate::prober::ProbeManager>,
    /// The QoS and pod cgroups; `None` without `cgroupsPerQOS`.
    cgroups: Option<Arc<crate::cm::ContainerManager>>,
    /// The containers' oom_score_adj where there are no pod cgroups.
    oom_scores: Option<crate::cm::OomScores>,
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

/// The text of the last `lines` lines of a CRI log file, at most `max_bytes` bytes
/// (the end is kept).
pub fn tail_of_log(path: &std::path::Path, lines: usize, max_bytes: usize) -> String {
    let Ok(text) = std::fs::read_to_string(path) else {
        return String::new();
    };
    let texts: Vec<&str> = text
        .lines()
        .filter_map(|l| l.splitn(4, ' ').nth(3))
        .collect();
    let start = texts.len().saturating_sub(lines);
    let joined = texts[start..].join("\n");
    let mut cut = joined.len().saturating_sub(max_bytes);
    while !joined.is_char_boundary(cut) {
        cut += 1;
    }
    joined[cut..].to_owned()
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

struct StartError {
    waiting: Waiting,
    retry: Duration,
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
        }
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
    fn oom_score_adj(&self, pod: &Pod, c: &Container) -> Option<i64> {
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

    /// The pod as its cgroup sizes it: a runtime whose sandbox needs memory of its own
    /// (a Wasm pod's sandbox process: the runtime, its compiled code and the pod's
    /// stores) has it charged to the pod cgroup beside the containers when the pod
    /// sets no `spec.overhead`, as a RuntimeClass's overhead would add it.
    fn cgroup_view(&self, pod: &Pod, caps: &Capabilities) -> Pod {
        let mut pod = pod.clone();
        if let Some(bytes) = caps.sandbox_memory_overhead
            && let Some(spec) = pod.spec.as_mut()
            && spec.overhead.is_none()
        {
            spec.overhead = Some(BTreeMap::from([(
                "memory".to_owned(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity(bytes.to_string()),
            )]));
        }
        pod
    }

    /// Creates (or updates) the pod's cgroup before its sandbox: its parent for the
    /// runtime, and the oom_score_adj of its sandbox process (Wasm: the lowest of its
    /// containers', since that process runs them all).
    fn pod_cgroup(
        &self,
        pod: &Pod,
        caps: &Capabilities,
    ) -> Result<(Option<String>, Option<i64>), String> {
        // The sandbox process of a Wasm pod runs all its containers: the lowest of
        // their scores.
        let oom = pod
            .spec
            .iter()
            .flat_map(|s| {
                s.containers
                    .iter()
                    .chain(s.init_containers.iter().flatten())
            })
            .filter_map(|c| self.oom_score_adj(pod, c))
            .min();
        let Some(cm) = &self.cgroups else {
            return Ok((None, oom));
        };
        let view = self.cgroup_view(pod, caps);
        // It also brings the burstable QoS cgroup's shares up to date when they change.
        cm.ensure_pod(&view)
            .map_err(|e| format!("pod cgroup: {e}"))?;
        let parent = cm
            .cgroup_parent(&view)
            .map_err(|e| format!("pod cgroup: {e}"))?;
        Ok((Some(parent), oom))
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
    fn failed_probe<'c>(
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
    pub fn with_pods_dir(mut self, dir: PathBuf) -> Self {
        self.pods_dir = Some(dir);
        self
    }

    /// The host file a container attempt writes its termination message to.
    fn termination_file(&self, pod: &Pod, c: &Container, attempt: u32) -> Option<PathBuf> {
        let path = c
            .termination_message_path
            .as_deref()
            .unwrap_or("/dev/termination-log");
        let base = std::path::Path::new(path).file_name()?;
        Some(
            self.pods_dir
                .as_ref()?
                .join(uid(pod))
                .join("containers")
                .join(&c.name)
                .join(attempt.to_string())
                .join(base),
        )
    }

    /// Fills the message of containers that exited from their termination message
    /// file (at most 4096 bytes), or — with `FallbackToLogsOnError` and a failure — from
    /// the last lines of their log (80 lines, 2048 bytes), as the kubelet does.
    fn termination_messages(&self, pod: &Pod, st: &mut PodState) {
        let spec = pod.spec.clone().unwrap_or_default();
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            let Some(rec) = st.containers.get_mut(&c.name) else {
                continue;
            };
            let attempt = rec.restart_count;
            let Some(cs) = rec.current.as_mut() else {
                continue;
            };
            if cs.state != ContainerState::Exited || !cs.message.is_empty() {
                continue;
            }
            let mut message = self
                .termination_file(pod, c, attempt)
                .and_then(|f| std::fs::read(f).ok())
                .map(|mut b| {
                    b.truncate(4096);
                    String::from_utf8_lossy(&b).into_owned()
                })
                .unwrap_or_default();
            if message.is_empty()
                && cs.exit_code != 0
                && c.termination_message_policy.as_deref() == Some("FallbackToLogsOnError")
            {
                let log = pod_log_dir(&self.pod_logs_dir, pod)
                    .join(&c.name)
                    .join(format!("{attempt}.log"));
                message = tail_of_log(&log, 80, 2048);
            }
            cs.message = message;
        }
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
            tracing::info!(pod_uid = %name, "removing the directory of a pod that is gone");
            crate::volumes::tear_down(&entry.path());
            if let Err(e) = std::fs::remove_dir_all(entry.path()) {
                tracing::warn!(pod_uid = %name, "removing {}: {e}", entry.path().display());
            }
        }
    }

    /// Whether every container has terminated and none will be restarted.
    pub fn is_pod_done(pod: &Pod, st: &PodState) -> bool {
        let policy = restart_policy(pod);
        let Some(spec) = &pod.spec else { return true };
        let init_failed = spec.init_containers.iter().flatten().any(|c| {
            c.restart_policy.as_deref() != Some("Always")
                && st
                    .containers
                    .get(&c.name)
                    .and_then(|r| r.current.as_ref())
                    .is_some_and(|cs| cs.state == ContainerState::Exited && cs.exit_code != 0)
        });
        if policy == "Never" && init_failed {
            return true;
        }
        spec.containers.iter().all(|c| {
            st.containers
                .get(&c.name)
                .and_then(|r| r.current.as_ref())
                .is_some_and(|cs| {
                    cs.state == ContainerState::Exited && !should_restart(policy, cs.exit_code)
                })
        })
    }

    /// Brings the runtime one step closer to the pod's spec.
    pub async fn sync_pod(&self, pod: &Pod, st: &mut PodState) -> SyncOutcome {
        let now = Timestamp::now();
        st.start_time.get_or_insert(now);
        if st.failure.is_some() {
            return SyncOutcome::default();
        }
        let deadline = pod
            .spec
            .as_ref()
            .and_then(|s| s.active_deadline_seconds)
            .and_then(|secs| {
                let start = st.start_time?;
                start
                    .checked_add(jiff::SignedDuration::from_secs(secs))
                    .ok()
            });
        if let Some(deadline) = deadline
            && now >= deadline
        {
            // As the kubelet: the pod fails and its containers are stopped.
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
            return SyncOutcome::default();
        }
        let until_deadline = deadline.map(|d| {
            Duration::try_from(d.duration_since(now)).unwrap_or_default()
                + Duration::from_millis(10)
        });
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

        if Self::is_pod_done(pod, st) {
            // Terminal: nothing will run again. Stop the sidecars (gracefully, in
            // reverse order), release the sandbox, keep the statuses.
            if st.sandbox.as_ref().is_some_and(|s| s.ready) {
                let grace = crate::pod::grace_period(pod);
                self.stop_running(pod, st, &*runtime, grace).await;
                self.refresh(&*runtime, st).await;
                self.termination_messages(pod, st);
            }
            if let Some(sb) = st.sandbox.as_mut().filter(|s| s.ready) {
                if let Err(e) = runtime.stop_pod_sandbox(&sb.id).await {
                    tracing::warn!(pod = %full_name(pod), "stopping the sandbox of a finished pod: {e}");
                }
                sb.ready = false;
                // Its tmpfs volumes are released with it; the files of disk volumes
                // stay until the pod is removed.
                if let Some(dir) = &self.pods_dir {
                    crate::volumes::tear_down(&dir.join(uid(pod)));
                }
                // Nothing runs in its cgroup any more: it goes, and the pod stops
                // counting in the burstable shares (what cannot be removed now is an
                // orphan for housekeeping).
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
            return SyncOutcome::default();
        }

        match self.set_up_volumes(pod, st).await {
            Ok(()) => {}
            Err(message) => {
                self.events
                    .pod(pod, None, WARNING, "FailedMount", message.clone());
                return self.not_started(pod, st, message);
            }
        }
        if st.sandbox.as_ref().is_some_and(|s| s.ready) {
            // Every sync keeps the pod cgroup as the spec sizes it: made again if it
            // was removed behind the node, counted in the QoS shares after a restart
            // (an adopted pod), resized in place. A resize that grows the pod must
            // reach the pod cgroup before its containers (cgroup v1 refuses a child
            // quota above its parent's); one that shrinks it fails here (a pod is
            // never limited below what it uses, nor below its containers) and is
            // written again once the containers were updated, below.
            if let Err(message) = self.pod_cgroup(pod, &runtime.capabilities()) {
                tracing::debug!(pod = %full_name(pod), "{message}; trying again after the containers");
            }
        } else {
            let ran = st.containers.values().any(|r| r.current.is_some());
            if restart_policy(pod) == "Never" && st.sandbox_attempts > 0 && ran {
                // Like the kubelet: a Never pod whose sandbox died is not started again;
                // its containers are reported as they ended.
                return SyncOutcome::default();
            }
            if let Some(old) = st.sandbox.take() {
                tracing::info!(pod = %full_name(pod), sandbox = %old.id, "sandbox is gone; creating a new one");
                if let Err(e) = runtime.remove_pod_sandbox(&old.id).await {
                    tracing::warn!(pod = %full_name(pod), "removing dead sandbox {}: {e}", old.id);
                }
            }
            let mut config = self.sandbox_config(pod, st);
            match self.pod_cgroup(pod, &runtime.capabilities()) {
                Ok((parent, oom)) => {
                    config.cgroup_parent = parent;
                    config.oom_score_adj = oom;
                }
                Err(message) => return self.not_started(pod, st, message),
            }
            match podspec::dns_config(pod, &self.dns) {
                Ok(dns) => config.dns = Some(dns),
                Err(e) => {
                    let message = format!("failed to create the pod sandbox config: {e}");
                    return self.not_started(pod, st, message);
                }
            }
            // Runtimes write container logs under it but do not create it.
            if let Err(e) = std::fs::create_dir_all(&config.log_directory) {
                tracing::warn!(pod = %full_name(pod), "creating {}: {e}", config.log_directory.display());
            }
            match runtime.run_pod_sandbox(&config).await {
                Ok(id) => {
                    st.sandbox_attempts += 1;
                    st.sandbox_error = None;
                    let ip = runtime
                        .pod_sandbox_status(&id)
                        .await
                        .ok()
                        .and_then(|s| s.ip);
                    st.sandbox = Some(SandboxRecord {
                        id,
                        ready: true,
                        ip,
                        config,
                    });
                }
                Err(e) => {
                    let message = format!("failed to create pod sandbox: {e}");
                    return self.not_started(pod, st, message);
                }
            }
        }
        let sandbox = st.sandbox.clone().expect("a ready sandbox exists here");

        let policy = restart_policy(pod).to_owned();
        let mut requeue: Option<Duration> = None;
        let mut soonest = |d: Duration| requeue = Some(requeue.map_or(d, |r: Duration| r.min(d)));
        let containers = pod
            .spec
            .as_ref()
            .map(|s| s.containers.clone())
            .unwrap_or_default();
        // Init containers in order: each to success before the next (a sidecar —
        // restartPolicy Always — only to running, and it keeps running); the regular
        // containers wait for all of them. A new sandbox runs them all again.
        let init_policy = if policy == "Never" {
            "Never"
        } else {
            "OnFailure"
        };
        // Once initialized in this sandbox, init containers are not run again and a
        // sidecar that restarts does not hold the regular containers back.
        let already = st.initialized_in.as_deref() == Some(sandbox.id.as_str());
        st.initialized = true;
        for ic in pod
            .spec
            .as_ref()
            .and_then(|s| s.init_containers.clone())
            .unwrap_or_default()
        {
            let sidecar = ic.restart_policy.as_deref() == Some("Always");
            if already && !sidecar {
                continue;
            }
            if let Some(rec) = st.containers.get_mut(&ic.name)
                && rec
                    .current
                    .as_ref()
                    .is_some_and(|c| c.sandbox_id != sandbox.id)
                && let Some(old) = rec.current.take()
            {
                // A new attempt (the runtime names containers by attempt).
                rec.restart_count += 1;
                if let Some(older) = rec.last_terminated.replace(old) {
                    let _ = runtime.remove_container(&older.id).await;
                }
            }
            let container_policy = if sidecar { "Always" } else { init_policy };
            if let Some(d) = self
                .sync_container(&*runtime, pod, &ic, &sandbox, st, container_policy, now)
                .await
            {
                soonest(d);
            }
            let current = st.containers.get(&ic.name).and_then(|r| r.current.as_ref());
            let done = if sidecar {
                // A sidecar with a startup probe holds the next containers back until
                // the probe succeeds, as the kubelet waits for it.
                current.is_some_and(|c| {
                    c.state == ContainerState::Running
                        && (ic.startup_probe.is_none()
                            || self.probes.as_ref().is_some_and(|p| {
                                p.result(&c.id, crate::probe_results::ProbeKind::Startup)
                                    == Some(crate::probe_results::ProbeResult::Success)
                            }))
                })
            } else {
                current.is_some_and(|c| c.state == ContainerState::Exited && c.exit_code == 0)
            };
            if !done && !already {
                st.initialized = false;
                break;
            }
        }
        if st.initialized {
            st.initialized_in = Some(sandbox.id.clone());
            for c in &containers {
                if let Some(d) = self
                    .sync_container(&*runtime, pod, c, &sandbox, st, &policy, now)
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

    /// Brings one container of the pod to its spec under `policy`: leaves it running,
    /// or starts it (again, within the restart back-off). Returns when to look again.
    #[allow(clippy::too_many_arguments)]
    async fn sync_container(
        &self,
        runtime: &dyn Runtime,
        pod: &Pod,
        c: &Container,
        sandbox: &SandboxRecord,
        st: &mut PodState,
        policy: &str,
        now: Timestamp,
    ) -> Option<Duration> {
        if let Some(cs) = st.containers.get(&c.name).and_then(|r| r.current.clone())
            && cs.state == ContainerState::Running
            && cs.sandbox_id == sandbox.id
            && let Some((kind, probe)) = self.failed_probe(c, &cs.id)
        {
            // The kubelet's restart on a failed liveness or startup probe: kill with
            // the probe's grace (else the pod's), then restart within the policy.
            let what = kind.name().to_lowercase();
            tracing::info!(pod = %full_name(pod), container = %c.name, "container failed its {what} probe; restarting it");
            self.events.pod(
                pod,
                Some(&c.name),
                NORMAL,
                "Killing",
                if policy == "Never" {
                    format!("Container {} failed {what} probe", c.name)
                } else {
                    format!(
                        "Container {} failed {what} probe, will be restarted",
                        c.name
                    )
                },
            );
            let grace = probe
                .termination_grace_period_seconds
                .unwrap_or_else(|| spec_grace_seconds(pod))
                .max(0) as u64;
            let deadline = tokio::time::Instant::now() + Duration::from_secs(grace);
            self.stop_one(pod, st, runtime, &c.name, &cs.id, deadline)
                .await;
            let rec = st.containers.get_mut(&c.name).expect("present above");
            rec.probe_killed = true;
            if let Ok(now_status) = runtime.container_status(&cs.id).await {
                rec.current = Some(now_status);
            }
        }
        if let Some(cs) = st.containers.get(&c.name).and_then(|r| r.current.clone())
            && cs.state == ContainerState::Running
            && cs.sandbox_id == sandbox.id
        {
            if let Some(rec) = st.containers.get_mut(&c.name) {
                rec.waiting = None;
            }
            return self.resize_running(runtime, pod, c, &cs.id, st).await;
        }
        let rec = st.containers.entry(c.name.clone()).or_default();
        let restarting = match rec.current.as_ref() {
            // Created but never started (the node stopped in between), or in an
            // unknown state: always started again, as the kubelet does.
            Some(cs) if matches!(cs.state, ContainerState::Created | ContainerState::Unknown) => {
                true
            }
            // Exited, or lost with a sandbox that died: restart within the policy
            // and the back-off, as every container start does.
            Some(cs) => {
                let exit_code = if cs.state == ContainerState::Exited {
                    cs.exit_code
                } else {
                    137
                };
                let restart =
                    should_restart(policy, exit_code) || (rec.probe_killed && policy != "Never");
                if !restart {
                    rec.waiting = None;
                    return None;
                }
                let key = format!("{}/{}", uid(pod), c.name);
                let finished = cs.finished_at.unwrap_or(now);
                let mut backoff = self.restart_backoff.lock().unwrap();
                // A container the node killed for a failed probe is started again at
                // once, as the kubelet kills and starts in one sync (the back-off still
                // grows for the next time).
                let waiting_out = if rec.probe_killed {
                    None
                } else {
                    backoff.remaining(&key, finished, now)
                };
                if let Some(left) = waiting_out {
                    let delay = backoff.get(&key).unwrap_or_default();
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
                            format!(
                                "Back-off restarting failed container {} in pod {}",
                                c.name,
                                full_name(pod)
                            ),
                        );
                    }
                    rec.waiting = Some(Waiting::new(
                        "CrashLoopBackOff",
                        format!(
                            "back-off {} restarting failed container={} pod={}_{}({})",
                            duration::format(delay),
                            c.name,
                            pod.metadata.name.as_deref().unwrap_or(""),
                            pod.metadata.namespace.as_deref().unwrap_or(""),
                            uid(pod)
                        ),
                    ));
                    return Some(left);
                }
                backoff.next(&key, finished, now);
                true
            }
            None => false,
        };
        let attempt = if restarting {
            rec.restart_count + 1
        } else {
            rec.restart_count
        };
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
                        let _ = runtime.remove_container(&prev.id).await;
                    } else if let Some(older) = rec.last_terminated.replace(prev) {
                        // Keep one dead instance per container, as container GC does.
                        let _ = runtime.remove_container(&older.id).await;
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
                return Some(retry);
            }
        }
        None
    }

    /// Stops the pod's running containers within `grace`: the regular containers (and
    /// init containers still running) together, then the sidecars in reverse order with
    /// what is left of the grace, as the kubelet does since sidecars.
    async fn stop_running(&self, pod: &Pod, st: &PodState, runtime: &dyn Runtime, grace: Duration) {
        let sidecars: Vec<String> = pod
            .spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten())
            .filter(|c| c.restart_policy.as_deref() == Some("Always"))
            .map(|c| c.name.clone())
            .collect();
        let running = |name: &str| {
            st.containers
                .get(name)
                .and_then(|r| r.current.as_ref())
                .filter(|cs| cs.state == ContainerState::Running)
                .map(|cs| cs.id.clone())
        };
        let kill = |name: &str| {
            self.events.pod(
                pod,
                Some(name),
                NORMAL,
                "Killing",
                format!("Stopping container {name}"),
            );
        };
        let deadline = tokio::time::Instant::now() + grace;
        let first: Vec<(String, String)> = st
            .containers
            .keys()
            .filter(|n| !sidecars.contains(n))
            .filter_map(|n| Some((n.clone(), running(n)?)))
            .collect();
        let stops = first.iter().map(|(name, id)| {
            kill(name);
            self.stop_one(pod, st, runtime, name, id, deadline)
        });
        futures::future::join_all(stops).await;
        for name in sidecars.iter().rev() {
            if let Some(id) = running(name) {
                kill(name);
                self.stop_one(pod, st, runtime, name, &id, deadline).await;
            }
        }
    }

    /// Stops one container by `deadline`: its preStop hook first (within the grace),
    /// then the runtime's stop with what is left, at least 2 s, as the kubelet does.
    async fn stop_one(
        &self,
        pod: &Pod,
        st: &PodState,
        runtime: &dyn Runtime,
        name: &str,
        id: &str,
        deadline: tokio::time::Instant,
    ) {
        let spec = pod.spec.clone().unwrap_or_default();
        let container = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .find(|c| c.name == name);
        // As the kubelet: no preStop hook without a grace period to run it in.
        if let Some(c) = container
            && let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref())
            && deadline > tokio::time::Instant::now()
        {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let ip = st.sandbox.as_ref().and_then(|s| s.ip.as_deref());
            if let Err(e) = crate::hooks::run(hook, runtime, c, id, ip, left).await {
                tracing::warn!(pod = %full_name(pod), container = %name, "preStop hook failed: {e}");
                self.events
                    .pod(pod, Some(name), WARNING, "FailedPreStopHook", e);
            }
        }
        let left = deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .max(Duration::from_secs(2));
        if let Err(e) = runtime.stop_container(id, left).await {
            tracing::warn!(pod = %full_name(pod), container = %name, "stopping container: {e}");
        }
    }

    /// Stops every container (within `grace`) and the sandbox, and removes them. A pod
    /// this worker never synced (the node restarted meanwhile) first adopts what the
    /// runtime still runs for it, so that is stopped gracefully too.
    pub async fn kill_pod(&self, pod: &Pod, st: &mut PodState, grace: Duration) {
        if !st.adopted
            && st.runtime.is_none()
            && let Ok((runtime, handler)) = self.router.for_pod(pod)
        {
            st.runtime_name = id_scheme(&*runtime)
                .await
                .unwrap_or_else(|_| runtime.name().to_owned());
            let _ = self.adopt_on_draft(&*runtime, pod, st).await;
            st.runtime = Some(runtime);
            st.handler = handler;
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
            crate::volumes::tear_down(&dir.join(uid(pod)));
            // Kept while its cgroup is: housekeeping tries again through it.
            if cgroup_removed {
                let _ = std::fs::remove_dir_all(dir.join(uid(pod)));
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

    /// Takes over what an earlier run of the node left of this pod in the runtime,
    /// found by the labels it wrote: the newest sandbox, and per container the newest
    /// instance (and the one before it, as the last termination) with its restart
    /// count. Older sandboxes and instances, and containers the spec no longer has,
    /// are removed. Nothing is created twice after an agent restart.
    /// [`Self::adopt`] on a draft of `st`, kept only when it succeeds: an adoption
    /// that fails half-way leaves nothing behind.
    async fn adopt_on_draft(
        &self,
        runtime: &dyn Runtime,
        pod: &Pod,
        st: &mut PodState,
    ) -> wasmlet_runtime::Result<()> {
        let mut draft = st.clone();
        self.adopt(runtime, pod, &mut draft).await?;
        *st = draft;
        st.adopted = true;
        Ok(())
    }

    async fn adopt(
        &self,
        runtime: &dyn Runtime,
        pod: &Pod,
        st: &mut PodState,
    ) -> wasmlet_runtime::Result<()> {
        let id = uid(pod);
        let owned = |labels: &wasmlet_runtime::Labels| {
            labels.get(labels::POD_UID).map(String::as_str) == Some(id)
        };
        let mut sandboxes: Vec<_> = runtime
            .list_pod_sandboxes()
            .await?
            .into_iter()
            .filter(|s| owned(&s.labels))
            .collect();
        let mut containers: Vec<_> = runtime
            .list_containers()
            .await?
            .into_iter()
            .filter(|c| owned(&c.labels))
            .collect();
        if sandboxes.is_empty() && containers.is_empty() {
            return Ok(());
        }
        // Newest first: a ready sandbox wins, then the highest attempt.
        sandboxes.sort_by_key(|s| {
            std::cmp::Reverse((
                s.state == SandboxState::Ready,
                s.metadata.attempt,
                s.created_at,
            ))
        });
        let name = full_name(pod);
        let mut stale_sandboxes = Vec::new();
        if let Some((newest, older)) = sandboxes.split_first() {
            st.sandbox_attempts = newest.metadata.attempt + 1;
            // The pod started when its first surviving sandbox did, not when this run
            // of the node first saw it.
            st.start_time = Some(
                st.start_time
                    .map_or(newest.created_at, |t| t.min(newest.created_at)),
            );
            let mut config = self.sandbox_config(pod, st);
            config.metadata.attempt = newest.metadata.attempt;
            let status = runtime.pod_sandbox_status(&newest.id).await.ok();
            let ready = newest.state == SandboxState::Ready;
            tracing::info!(pod = %name, sandbox = %newest.id, ready, "adopted the pod's sandbox");
            st.sandbox = Some(SandboxRecord {
                id: newest.id.clone(),
                ready,
                ip: status.and_then(|s| s.ip),
                config,
            });
            stale_sandboxes.extend(older.iter().map(|s| s.id.clone()));
        }
        let wanted: std::collections::HashSet<&str> = pod
            .spec
            .iter()
            .flat_map(|s| {
                s.containers
                    .iter()
                    .chain(s.init_containers.iter().flatten())
            })
            .map(|c| c.name.as_str())
            .collect();
        containers.sort_by_key(|c| std::cmp::Reverse((c.metadata.attempt, c.created_at)));
        let mut stale_containers = Vec::new();
        for c in containers {
            let name_label = c
                .labels
                .get(labels::CONTAINER_NAME)
                .cloned()
                .unwrap_or_else(|| c.metadata.name.clone());
            if !wanted.contains(name_label.as_str()) {
                stale_containers.push((c.id, c.state));
                continue;
            }
            let rec = st.containers.entry(name_label.clone()).or_default();
            if rec.current.is_some() && rec.last_terminated.is_some() {
                stale_containers.push((c.id, c.state));
                continue;
            }
            let status = match runtime.container_status(&c.id).await {
                Ok(s) => s,
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(e),
            };
            if rec.current.is_none() {
                rec.restart_count = c
                    .annotations
                    .get(labels::CONTAINER_RESTART_COUNT)
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(c.metadata.attempt);
                tracing::info!(pod = %name, container = %name_label, id = %c.id, state = ?status.state, restarts = rec.restart_count, "adopted container");
                rec.current = Some(status);
            } else {
                rec.last_terminated = Some(status);
            }
        }
        for (cid, state) in stale_containers {
            tracing::info!(pod = %name, container = %cid, "removing a container the pod no longer has");
            if state == ContainerState::Running
                && let Err(e) = runtime.stop_container(&cid, Duration::ZERO).await
            {
                tracing::warn!(pod = %name, container = %cid, "stopping: {e}");
            }
            if let Err(e) = runtime.remove_container(&cid).await {
                tracing::warn!(pod = %name, container = %cid, "removing: {e}");
            }
        }
        for sid in stale_sandboxes {
            tracing::info!(pod = %name, sandbox = %sid, "removing an older sandbox of the pod");
            if let Err(e) = runtime.remove_pod_sandbox(&sid).await {
                tracing::warn!(pod = %name, sandbox = %sid, "removing: {e}");
            }
        }
        Ok(())
    }

    /// Sets up the pod's volumes not set up yet, and refreshes the content volumes
    /// (ConfigMaps, Secrets, tokens) once a minute. A `medium: Memory` emptyDir without
    /// a `sizeLimit` is sized by the pod's memory limit, else the node's allocatable
    /// memory.
    async fn set_up_volumes(&self, pod: &Pod, st: &mut PodState) -> Result<(), String> {
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
    async fn refresh(&self, runtime: &dyn Runtime, st: &mut PodState) {
        if let Some(sb) = st.sandbox.as_mut() {
            match runtime.pod_sandbox_status(&sb.id).await {
                Ok(s) => {
                    sb.ready = s.state == SandboxState::Ready;
                    sb.ip = s.ip;
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
    fn not_started(&self, pod: &Pod, st: &mut PodState, message: String) -> SyncOutcome {
        tracing::warn!(pod = %full_name(pod), "{message}");
        self.wait_all(pod, st, Waiting::new("ContainerCreating", message.clone()));
        st.sandbox_error = Some(message);
        SyncOutcome {
            requeue_after: Some(self.retry_after_error),
        }
    }

    fn wait_all(&self, pod: &Pod, st: &mut PodState, waiting: Waiting) {
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

    fn sandbox_config(&self, pod: &Pod, st: &PodState) -> PodSandboxConfig {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let namespace = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let spec = pod.spec.clone().unwrap_or_default();
        let mut labels = pod.metadata.labels.clone().unwrap_or_default();
        labels.insert(labels::POD_NAME.into(), name.clone());
        labels.insert(labels::POD_NAMESPACE.into(), namespace.clone());
        labels.insert(labels::POD_UID.into(), uid(pod).to_owned());
        let mut hostname = spec.hostname.clone().unwrap_or_else(|| name.clone());
        hostname.truncate(63);
        PodSandboxConfig {
            metadata: PodMetadata {
                name,
                namespace,
                uid: uid(pod).to_owned(),
                attempt: st.sandbox_attempts,
            },
            hostname,
            log_directory: pod_log_dir(&self.pod_logs_dir, pod),
            labels,
            annotations: pod.metadata.annotations.clone().unwrap_or_default(),
            runtime_handler: st.handler.clone(),
            cgroup_parent: None,
            oom_score_adj: None,
            host_network: spec.host_network.unwrap_or(false),
            host_pid: spec.host_pid.unwrap_or(false),
            host_ipc: spec.host_ipc.unwrap_or(false),
            share_process_namespace: spec.share_process_namespace.unwrap_or(false),
            dns: None,
            port_mappings: podspec::port_mappings(&spec),
            sysctls: podspec::sysctls(&spec),
            security: podspec::sandbox_security(&spec),
        }
    }

    async fn ensure_image(
        &self,
        runtime: &dyn Runtime,
        pod: &Pod,
        c: &Container,
    ) -> Result<(), StartError> {
        let image = c.image.clone().unwrap_or_default();
        let policy = c.image_pull_policy.as_deref().unwrap_or("IfNotPresent");
        let present = runtime.image_status(&image).await.map_err(|e| StartError {
            waiting: Waiting::new("ErrImagePull", format!("image status of {image:?}: {e}")),
            retry: self.retry_after_error,
        })?;
        match (policy, present.is_some()) {
            ("Never", false) => {
                return Err(StartError {
                    waiting: Waiting::new(
                        "ErrImageNeverPull",
                        format!(
                            "Container image {image:?} is not present with pull policy of Never"
                        ),
                    ),
                    retry: self.retry_after_error,
                });
            }
            ("Never", true) | ("IfNotPresent", true) => {
                self.events.pod(
                    pod,
                    Some(&c.name),
                    NORMAL,
                    "Pulled",
                    format!("Container image {image:?} already present on machine"),
                );
                return Ok(());
            }
            _ => {}
        }
        let key = format!("{}/{image}", uid(pod));
        let now = Timestamp::now();
        {
            let backoff = self.image_backoff.lock().unwrap();
            if let Some(left) = backoff.remaining_since_update(&key, now) {
                self.events.pod(
                    pod,
                    Some(&c.name),
                    NORMAL,
                    "BackOff",
                    format!("Back-off pulling image {image:?}"),
                );
                let last = self.pull_errors.lock().unwrap().get(&key).cloned();
                return Err(StartError {
                    waiting: Waiting::new(
                        "ImagePullBackOff",
                        match last {
                            Some(e) => {
                                format!("Back-off pulling image {image:?}: ErrImagePull: {e}")
                            }
                            None => format!("Back-off pulling image {image:?}"),
                        },
                    ),
                    retry: left,
                });
            }
        }
        self.events.pod(
            pod,
            Some(&c.name),
            NORMAL,
            "Pulling",
            format!("Pulling image {image:?}"),
        );
        let pull_started = std::time::Instant::now();
        match runtime.pull_image(&image).await {
            Ok(_) => {
                self.pull_errors.lock().unwrap().remove(&key);
                self.events.pod(
                    pod,
                    Some(&c.name),
                    NORMAL,
                    "Pulled",
                    format!(
                        "Successfully pulled image {image:?} in {:.3?}",
                        pull_started.elapsed()
                    ),
                );
                Ok(())
            }
            Err(e) => {
                self.events.pod(
                    pod,
                    Some(&c.name),
                    WARNING,
                    "Failed",
                    format!("Failed to pull image {image:?}: {e}"),
                );
                let mut backoff = self.image_backoff.lock().unwrap();
                backoff.next(&key, now, now);
                let delay = backoff.get(&key).unwrap_or(self.retry_after_error);
                self.pull_errors.lock().unwrap().insert(key, e.to_string());
                // Look again halfway through the back-off, so the status moves from
                // ErrImagePull to ImagePullBackOff as the kubelet's does.
                Err(StartError {
                    waiting: Waiting::new("ErrImagePull", e.to_string()),
                    retry: delay / 2,
                })
            }
        }
    }

    /// A container's cgroup resources from its spec: CPU shares from the request,
    /// CFS quota from the limit (as `cpuCFSQuota` and `cpuCFSQuotaPeriod` say), the
    /// memory limit, and its oom_score_adj. Given at create, and again in place when a
    /// running container's resources change.
    fn container_resources(&self, pod: &Pod, c: &Container) -> Result<ContainerResources, String> {
        let (cpu_shares, quota) =
            podspec::cpu_resources(c).map_err(|e| format!("resources: {e}"))?;
        // `cpuCFSQuota: false` sets no quota; `cpuCFSQuotaPeriod` is the period.
        let (cpu_quota, cpu_period) = match (quota, self.cgroups.as_ref().map(|cm| cm.config())) {
            (Some(_), Some(cfg)) if !cfg.cpu_cfs_quota => (None, None),
            (Some(_), Some(cfg)) => {
                let limit = podspec::milli_cpu_limit(c).unwrap_or(0);
                let period = cfg.cpu_cfs_quota_period_us;
                (
                    Some(podspec::milli_cpu_to_quota(limit, period)),
                    Some(period),
                )
            }
            (q, _) => (q.map(|(q, _)| q), q.map(|(_, p)| p)),
        };
        let memory_limit_bytes = c
            .resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get("memory"))
            .map(quantity::bytes)
            .transpose()
            .map_err(|e| format!("resources.limits.memory: {e}"))?;
        Ok(ContainerResources {
            cpu_shares: Some(cpu_shares),
            cpu_quota,
            cpu_period,
            memory_limit_bytes,
            oom_score_adj: self.oom_score_adj(pod, c),
        })
    }

    /// Changes a running container's resources in place when its spec's differ from
    /// what it runs with (in-place pod resize): the runtime's
    /// UpdateContainerResources. Returns when to try again after a failure.
    async fn resize_running(
        &self,
        runtime: &dyn Runtime,
        pod: &Pod,
        c: &Container,
        container_id: &str,
        st: &mut PodState,
    ) -> Option<Duration> {
        let desired = match self.container_resources(pod, c) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(pod = %full_name(pod), container = %c.name, "resizing: {e}");
                return None;
            }
        };
        let rec = st.containers.get_mut(&c.name)?;
        if rec
            .applied
            .as_ref()
            .is_some_and(|(applied, spec)| *applied == desired && *spec == c.resources)
        {
            // What it runs with is what the spec says (again: a refused resize that
            // was reverted is no longer in progress).
            rec.resize_error = None;
            return None;
        }
        let adopted = rec.applied.is_none();
        match runtime
            .update_container_resources(container_id, &desired)
            .await
        {
            Ok(()) => {
                if !adopted {
                    tracing::info!(pod = %full_name(pod), container = %c.name, resources = ?desired, "container resized in place");
                }
                rec.applied = Some((desired, c.resources.clone()));
                rec.resize_error = None;
                None
            }
            Err(e) => {
                let message = format!("updating the resources of container {}: {e}", c.name);
                if rec.resize_error.as_deref() != Some(message.as_str()) {
                    tracing::warn!(pod = %full_name(pod), container = %c.name, "{message}");
                    self.events
                        .pod(pod, Some(&c.name), WARNING, "ResizeFailed", message.clone());
                }
                rec.resize_error = Some(message);
                Some(self.retry_after_error)
            }
        }
    }

    async fn start_container(
        &self,
        runtime: &dyn Runtime,
        pod: &Pod,
        c: &Container,
        sandbox: &SandboxRecord,
        volumes: &[(String, crate::volumes::HostVolume)],
        attempt: u32,
    ) -> Result<ContainerStatus, StartError> {
        self.ensure_image(runtime, pod, c).await?;
        let caps = runtime.capabilities();
        // runAsNonRoot needs the image's user, which only container images have: a
        // Wasm guest has no uid (see docs/decisions.md).
        if caps.image_user {
            let image = c.image.clone().unwrap_or_default();
            let user = runtime
                .image_status(&image)
                .await
                .ok()
                .flatten()
                .map(|i| (i.uid, i.username))
                .unwrap_or((None, String::new()));
            let spec = pod.spec.clone().unwrap_or_default();
            podspec::verify_run_as_non_root(&spec, c, (user.0, &user.1)).map_err(|message| {
                StartError {
                    waiting: Waiting::new("CreateContainerConfigError", message),
                    retry: self.retry_after_error,
                }
            })?;
        }
        let env = self
            .container_env(pod, c, sandbox)
            .await
            .map_err(|message| StartError {
                waiting: Waiting::new("CreateContainerConfigError", message),
                retry: self.retry_after_error,
            })?;
        let config = self
            .container_config(pod, c, attempt, env, volumes, caps.directory_mounts_only)
            .map_err(|message| StartError {
                waiting: Waiting::new("CreateContainerConfigError", message),
                retry: self.retry_after_error,
            })?;
        let id = runtime
            .create_container(&sandbox.id, &config, &sandbox.config)
            .await
            .map_err(|e| StartError {
                waiting: Waiting::new("CreateContainerError", e.to_string()),
                retry: self.retry_after_error,
            })?;
        self.events.pod(
            pod,
            Some(&c.name),
            NORMAL,
            "Created",
            format!("Created container: {}", c.name),
        );
        if let Err(e) = runtime.start_container(&id).await {
            let _ = runtime.remove_container(&id).await;
            return Err(StartError {
                waiting: Waiting::new("RunContainerError", e.to_string()),
                retry: self.retry_after_error,
            });
        }
        self.events.pod(
            pod,
            Some(&c.name),
            NORMAL,
            "Started",
            format!("Started container {}", c.name),
        );
        if let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) {
            let grace = crate::pod::grace_period(pod);
            if let Err(e) =
                crate::hooks::run(hook, runtime, c, &id, sandbox.ip.as_deref(), grace).await
            {
                // As the kubelet: a failed postStart kills the container, which then
                // restarts as its policy says.
                tracing::warn!(pod = %full_name(pod), container = %c.name, "postStart hook failed: {e}");
                self.events.pod(
                    pod,
                    Some(&c.name),
                    WARNING,
                    "FailedPostStartHook",
                    e.clone(),
                );
                self.events.pod(
                    pod,
                    Some(&c.name),
                    NORMAL,
                    "Killing",
                    format!("FailedPostStartHook: stopping container {}", c.name),
                );
                let _ = runtime.stop_container(&id, grace).await;
            }
        }
        runtime.container_status(&id).await.map_err(|e| StartError {
            waiting: Waiting::new("RunContainerError", e.to_string()),
            retry: self.retry_after_error,
        })
    }

    /// The container's environment: ConfigMaps and Secrets it names are read first,
    /// and the services' variables come from the watched Services.
    async fn container_env(
        &self,
        pod: &Pod,
        c: &Container,
        sandbox: &SandboxRecord,
    ) -> Result<crate::env::Env, String> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let (config_maps, secrets) = crate::env::references(c);
        let mut objects = crate::env::Objects::default();
        for name in config_maps {
            let cm = self.objects.config_map(ns, &name).await?;
            objects.config_maps.insert(name, cm);
        }
        for name in secrets {
            let secret = self.objects.secret(ns, &name).await?;
            objects.secrets.insert(name, secret);
        }
        let links = pod
            .spec
            .as_ref()
            .and_then(|s| s.enable_service_links)
            .unwrap_or(true);
        let services = crate::env::service_env(&self.objects.services().await?, ns, links);
        let pod_ips: Vec<String> = sandbox.ip.iter().cloned().collect();
        let ctx = crate::env::Context {
            host_ips: &self.host_ips,
            pod_ips: &pod_ips,
            allocatable: &self.allocatable,
            objects: &objects,
            services: &services,
        };
        let (env, invalid) = crate::env::make_env(pod, c, &ctx)?;
        if !invalid.is_empty() {
            self.events.pod(
                pod,
                Some(&c.name),
                WARNING,
                "InvalidEnvironmentVariableNames",
                format!(
                    "Keys [{}] from the EnvFrom configMap or secret were skipped since they are invalid environment variable names.",
                    invalid.join(", ")
                ),
            );
        }
        Ok(env)
    }

    /// The mount of a container attempt's termination message file: the file itself
    /// at `terminationMessagePath` for containers, its directory at the path's
    /// directory for Wasm guests (WASI preopens directories).
    fn termination_mount(
        &self,
        pod: &Pod,
        c: &Container,
        attempt: u32,
        directories_only: bool,
    ) -> Result<Option<wasmlet_runtime::Mount>, String> {
        let Some(file) = self.termination_file(pod, c, attempt) else {
            return Ok(None);
        };
        let path = c
            .termination_message_path
            .clone()
            .unwrap_or_else(|| "/dev/termination-log".into());
        let dir = file
            .parent()
            .expect("the file is in a directory")
            .to_owned();
        let create = || -> std::io::Result<()> {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::create_dir_all(&dir)?;
            std::fs::write(&file, b"")?;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666))?;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))
        };
        create().map_err(|e| {
            format!(
                "creating the termination message file {}: {e}",
                file.display()
            )
        })?;
        Ok(Some(if directories_only {
            wasmlet_runtime::Mount {
                container_path: std::path::Path::new(&path)
                    .parent()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| "/".into()),
                host_path: dir,
                readonly: false,
            }
        } else {
            wasmlet_runtime::Mount {
                container_path: path,
                host_path: file,
                readonly: false,
            }
        }))
    }

    fn container_config(
        &self,
        pod: &Pod,
        c: &Container,
        attempt: u32,
        env: crate::env::Env,
        volumes: &[(String, crate::volumes::HostVolume)],
        directories_only: bool,
    ) -> Result<ContainerConfig, String> {
        let (command, args) = crate::env::expand_command(c, &env);
        // subPathExpr: a variable that is missing or empty is an error (the kubelet's
        // ExpandContainerVolumeMounts), never a mount of the whole volume.
        let expand_sub_path = |s: &str| -> Result<String, String> {
            let missing = std::cell::RefCell::new(std::collections::BTreeSet::new());
            let expanded = crate::env::expand(s, &|name| {
                let value = env.get(name).unwrap_or_default();
                if value.is_empty() {
                    missing.borrow_mut().insert(name.to_owned());
                }
                Some(value.to_owned())
            });
            let missing = missing.into_inner();
            if missing.is_empty() {
                Ok(expanded)
            } else {
                Err(format!(
                    "missing value for {}",
                    missing.into_iter().collect::<Vec<_>>().join(", ")
                ))
            }
        };
        let mut mounts =
            crate::volumes::container_mounts(c, volumes, &expand_sub_path, directories_only)?;
        mounts.extend(self.termination_mount(pod, c, attempt, directories_only)?);
        let env = env.into_vec();
        let spec = pod.spec.clone().unwrap_or_default();
        let resources = self.container_resources(pod, c)?;
        let mut labels = BTreeMap::new();
        labels.insert(
            labels::POD_NAME.into(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        labels.insert(
            labels::POD_NAMESPACE.into(),
            pod.metadata.namespace.clone().unwrap_or_default(),
        );
        labels.insert(labels::POD_UID.into(), uid(pod).to_owned());
        labels.insert(labels::CONTAINER_NAME.into(), c.name.clone());
        let mut annotations = BTreeMap::new();
        annotations.insert(labels::CONTAINER_HASH.into(), container_hash(c));
        annotations.insert(labels::CONTAINER_RESTART_COUNT.into(), attempt.to_string());
        annotations.insert(
            labels::CONTAINER_TERMINATION_MESSAGE_PATH.into(),
            c.termination_message_path.clone().unwrap_or_default(),
        );
        annotations.insert(
            labels::CONTAINER_TERMINATION_MESSAGE_POLICY.into(),
            c.termination_message_policy.clone().unwrap_or_default(),
        );
        let grace = spec_grace_seconds(pod);
        annotations.insert(
            labels::POD_TERMINATION_GRACE_PERIOD.into(),
            grace.to_string(),
        );
        Ok(ContainerConfig {
            metadata: ContainerMetadata {
                name: c.name.clone(),
                attempt,
            },
            image: c.image.clone().unwrap_or_default(),
            command,
            args,
            working_dir: c.working_dir.clone().filter(|w| !w.is_empty()),
            env,
            mounts,
            log_path: PathBuf::from(&c.name).join(format!("{attempt}.log")),
            labels,
            annotations,
            resources,
            devices: Vec::new(),
            security: podspec::container_security(&spec, c),
            stdin: c.stdin.unwrap_or(false),
            tty: c.tty.unwrap_or(false),
        })
    }
}
