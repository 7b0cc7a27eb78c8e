//! The prober: liveness, readiness and startup probes, the kubelet's way.
//!
//! One worker per container and probe type runs on its own ticker, independent of the
//! sync loop. It reads the container's state from the status store, runs the probe's
//! handler ([`handlers`]) and keeps a result per container instance: readiness starts
//! as Failure, liveness as Success, startup as Unknown. A result changes only after
//! `failureThreshold` consecutive failures or `successThreshold` consecutive successes.
//! A change is sent to the sync loop (the pod's UID on a channel), which syncs the pod:
//!
//! - liveness or startup Failure: the container is killed (with the probe's
//!   `terminationGracePeriodSeconds` if it has one) and restarted per the pod's
//!   restart policy; the worker waits for the next instance;
//! - readiness drives `containerStatuses[].ready` and the Ready and ContainersReady
//!   conditions, and never touches the process;
//! - startup gates liveness and readiness: they run only once the container has
//!   `started` (its startup probe succeeded, or it has none).
//!
//! A worker can be woken before its next tick, as the kubelet's `manualTriggerCh`:
//! [`ProbeManager::trigger_unprobed_readiness`] (the sync loop, for a running and
//! started container whose readiness is still the initial Failure), and a startup
//! Success wakes the container's readiness and liveness workers. A trigger only counts
//! while the worker has not yet run its handler on the container's current instance;
//! otherwise the worker ignores it and keeps to its period.
//!
//! Lifecycle, as the kubelet's probe manager: [`ProbeManager::add_pod`] is called on
//! every sync of a non-terminal pod and only starts the workers that are missing (not
//! those that ended for good: their container terminated under `restartPolicy: Never`,
//! or the pod finished); [`ProbeManager::stop_liveness_and_startup`] when the pod
//! starts terminating (readiness keeps running, liveness and startup are left at
//! Success for a quiet shutdown); [`ProbeManager::remove_pod`] once it is terminated.
//!
//! Every probe whose handler ran is counted in `prober_probe_total` with the kubelet's
//! labels (a probe that errored, `Unknown`, is not); a worker's series go away with the
//! worker. A failure is an `Unhealthy` warning event.

pub mod handlers;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, ContainerStatus as ApiContainerStatus, Pod, Probe};
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::cluster::events::{EventRecorder, WARNING};
use crate::pod::uid;
use crate::probe_results::{ProbeKind, ProbeResult};
use crate::router::RuntimeRouter;
use crate::status::StatusStore;

/// What one run of a probe gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub result: ProbeResult,
    /// The handler's output or the reason it failed.
    pub output: String,
    /// A success with a warning (an HTTP redirect that was not followed).
    pub warning: bool,
}

/// The probe's timing with the kubelet's defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

impl Timing {
    pub fn of(p: &Probe) -> Timing {
        let secs = |v: Option<i32>, default: i32, min: i32| {
            Duration::from_secs(v.unwrap_or(default).max(min) as u64)
        };
        Timing {
            initial_delay: secs(p.initial_delay_seconds, 0, 0),
            period: secs(p.period_seconds, 10, 1),
            timeout: secs(p.timeout_seconds, 1, 1),
            success_threshold: p.success_threshold.unwrap_or(1).max(1) as u32,
            failure_threshold: p.failure_threshold.unwrap_or(3).max(1) as u32,
        }
    }
}

/// Runs a probe's handler: the seam paused-clock tests replace.
#[async_trait::async_trait]
pub trait Runner: Send + Sync {
    async fn run(&self, pod: &Pod, target: handlers::Target<'_>) -> Outcome;
}

/// How much of a probe plugin's failure message is kept (the kubelet's 10 KiB of
/// probe output).
const PLUGIN_OUTPUT_MAX: usize = 10 << 10;

/// The real handlers; `exec` goes to the pod's runtime, and a probe the pod's
/// annotations give a plugin goes to the node's plugin host
/// ([`crate::plugins::probe_plugin`]).
#[derive(Default)]
pub struct RealRunner {
    plugins: Option<wasmlet_plugin_host::PluginHost>,
}

impl RealRunner {
    /// Runs probe plugins in `host`.
    pub fn with_plugins(host: wasmlet_plugin_host::PluginHost) -> Self {
        RealRunner {
            plugins: Some(host),
        }
    }
}

#[async_trait::async_trait]
impl Runner for RealRunner {
    async fn run(&self, pod: &Pod, target: handlers::Target<'_>) -> Outcome {
        match crate::plugins::probe_plugin(pod, &target.container.name, target.kind) {
            None => handlers::run(&target).await,
            // A malformed annotation is the probe's error, not the container's.
            Some(Err(message)) => Outcome::unknown(message),
            Some(Ok((name, settings))) => {
                let Some(host) = &self.plugins else {
                    return Outcome {
                        result: ProbeResult::Failure,
                        output: format!("probe plugin {name}: the node has no plugins configured"),
                        warning: false,
                    };
                };
                let request = wasmlet_plugin_host::types::ProbeRequest {
                    pod: crate::plugins::pod_info(pod),
                    container: target.container.name.clone(),
                    probe_type: target.kind.name().to_lowercase(),
                    pod_ips: vec![target.pod_ip.to_owned()],
                    settings,
                    timeout_ms: u32::try_from(target.timeout.as_millis()).unwrap_or(u32::MAX),
                };
                match host.probe(&name, request).await {
                    wasmlet_plugin_host::types::ProbeResult::Success => Outcome::success(""),
                    wasmlet_plugin_host::types::ProbeResult::Failure(mut output) => {
                        // As much as the kubelet keeps of a probe's output.
                        if output.len() > PLUGIN_OUTPUT_MAX {
                            let mut cut = PLUGIN_OUTPUT_MAX;
                            while !output.is_char_boundary(cut) {
                                cut -= 1;
                            }
                            output.truncate(cut);
                        }
                        // The plugin's name with its message, in the event and the log.
                        Outcome {
                            result: ProbeResult::Failure,
                            output: format!("plugin {name}: {output}"),
                            warning: false,
                        }
                    }
                }
            }
        }
    }
}

type WorkerKey = (String, String, ProbeKind);

/// A live worker as the manager holds it.
struct Handle {
    /// Unique per worker: a worker that ends removes its entry only if it is its own.
    generation: u64,
    cancel: CancellationToken,
    /// Wakes the worker before its next tick.
    trigger: Arc<Notify>,
}

#[derive(Default)]
struct Workers {
    live: HashMap<WorkerKey, Handle>,
    /// Per pod UID, what `add_pod` must not start again; forgotten by `remove_pod`.
    ended: HashMap<String, Ended>,
}

#[derive(Default)]
struct Ended {
    /// Workers (container, type) that ended for good.
    keys: HashSet<(String, ProbeKind)>,
    /// The pod is terminating: only readiness runs.
    terminating: bool,
}

impl Ended {
    fn contains(&self, container: &str, kind: ProbeKind) -> bool {
        (self.terminating && kind != ProbeKind::Readiness)
            || self.keys.contains(&(container.to_owned(), kind))
    }
}

struct Inner {
    statuses: StatusStore,
    router: Option<RuntimeRouter>,
    runner: Arc<dyn Runner>,
    events: EventRecorder,
    updates: mpsc::UnboundedSender<String>,
    /// Per container instance (runtime id) and type: the result and the pod's UID.
    results: Mutex<HashMap<(String, ProbeKind), (ProbeResult, String)>>,
    workers: Mutex<Workers>,
    /// `prober_probe_total` by (probe_type, result, container, pod, namespace, pod_uid).
    counts: Mutex<BTreeMap<[String; 6], u64>>,
    started: Instant,
    generations: AtomicU64,
    /// Every worker runs on it, so that [`ProbeManager::shutdown`] can wait for them.
    tasks: TaskTracker,
}

impl Inner {
    /// Wakes a worker if it exists (a no-op otherwise, and if a wake-up is pending).
    fn trigger(&self, pod_uid: &str, container: &str, kind: ProbeKind) {
        let workers = self.workers.lock().unwrap();
        let key = (pod_uid.to_owned(), container.to_owned(), kind);
        if let Some(h) = workers.live.get(&key) {
            h.trigger.notify_one();
        }
    }

    /// Deletes the `prober_probe_total` series of one worker.
    fn forget_series(&self, pod_uid: &str, container: &str, kind: ProbeKind) {
        self.counts
            .lock()
            .unwrap()
            .retain(|k, _| !(k[5] == pod_uid && k[2] == container && k[0] == kind.name()));
    }
}

/// The probe workers of every pod and their results.
#[derive(Clone)]
pub struct ProbeManager {
    inner: Arc<Inner>,
}

impl ProbeManager {
    /// Results that change are announced on `updates` as the pod's UID.
    pub fn new(
        statuses: StatusStore,
        router: Option<RuntimeRouter>,
        runner: Arc<dyn Runner>,
        events: EventRecorder,
        updates: mpsc::UnboundedSender<String>,
    ) -> Self {
        ProbeManager {
            inner: Arc::new(Inner {
                statuses,
                router,
                runner,
                events,
                updates,
                results: Mutex::default(),
                workers: Mutex::default(),
                counts: Mutex::default(),
                started: Instant::now(),
                generations: AtomicU64::new(0),
                tasks: TaskTracker::new(),
            }),
        }
    }

    /// Starts the workers of the pod's probes that have none (regular containers and
    /// sidecars; init containers that run to completion are not probed). Cheap and
    /// idempotent: called on every sync of a non-terminal pod. A worker that ended for
    /// good (its container terminated under `restartPolicy: Never`, the pod finished)
    /// is not started again, nor liveness and startup once the pod is terminating.
    pub fn add_pod(&self, pod: &Pod) {
        let Some(spec) = pod.spec.as_ref() else {
            return;
        };
        let pod_uid = uid(pod);
        let containers = spec.containers.iter().chain(
            spec.init_containers
                .iter()
                .flatten()
                .filter(|c| c.restart_policy.as_deref() == Some("Always")),
        );
        let mut workers = self.inner.workers.lock().unwrap();
        if self.inner.tasks.is_closed() {
            // The node is stopping (checked under the lock `shutdown` drains under).
            return;
        }
        let Workers { live, ended } = &mut *workers;
        let ended = ended.get(pod_uid);
        for c in containers {
            for kind in ProbeKind::ALL {
                let Some(probe) = kind.of(c) else { continue };
                if ended.is_some_and(|e| e.contains(&c.name, kind)) {
                    continue;
                }
                let key = (pod_uid.to_owned(), c.name.clone(), kind);
                if live.contains_key(&key) {
                    continue;
                }
                let handle = Handle {
                    generation: self.inner.generations.fetch_add(1, Ordering::Relaxed),
                    cancel: CancellationToken::new(),
                    trigger: Arc::new(Notify::new()),
                };
                let worker = Worker {
                    inner: self.inner.clone(),
                    key: key.clone(),
                    generation: handle.generation,
                    cancel: handle.cancel.clone(),
                    trigger: handle.trigger.clone(),
                    pod: pod.clone(),
                    container: c.clone(),
                    kind,
                    probe: probe.clone(),
                    timing: Timing::of(probe),
                    container_id: None,
                    probed: false,
                    keep_result: false,
                    last: ProbeResult::Unknown,
                    run: 0,
                    on_hold: false,
                    delay_until: Instant::now(),
                };
                live.insert(key, handle);
                self.inner.tasks.spawn(worker.run());
            }
        }
    }

    /// The pod is terminating (the kubelet's `StopLivenessAndStartup`): its liveness
    /// and startup workers stop, their results are left at Success (a quiet shutdown:
    /// no kill, the container counts as started) and `add_pod` does not start them
    /// again; readiness keeps running until [`Self::remove_pod`].
    pub fn stop_liveness_and_startup(&self, pod_uid: &str) {
        let mut stopped = Vec::new();
        {
            let mut workers = self.inner.workers.lock().unwrap();
            workers.live.retain(|(u, c, k), h| {
                if u == pod_uid && *k != ProbeKind::Readiness {
                    h.cancel.cancel();
                    stopped.push((c.clone(), *k));
                    false
                } else {
                    true
                }
            });
            let ended = workers.ended.entry(pod_uid.to_owned()).or_default();
            ended.terminating = true;
            ended.keys.extend(stopped.iter().cloned());
        }
        // The workers are cancelled first: none of them writes a result after this.
        for ((_, kind), (result, u)) in self.inner.results.lock().unwrap().iter_mut() {
            if u == pod_uid && *kind != ProbeKind::Readiness {
                *result = ProbeResult::Success;
            }
        }
        for (container, kind) in stopped {
            self.inner.forget_series(pod_uid, &container, kind);
        }
    }

    /// The pod is terminated: stops its workers and forgets their results, series and
    /// what ended.
    pub fn remove_pod(&self, pod_uid: &str) {
        {
            let mut workers = self.inner.workers.lock().unwrap();
            workers.live.retain(|(u, _, _), h| {
                if u == pod_uid {
                    h.cancel.cancel();
                    false
                } else {
                    true
                }
            });
            workers.ended.remove(pod_uid);
        }
        // The workers are cancelled first: none of them writes a result after this.
        self.inner
            .results
            .lock()
            .unwrap()
            .retain(|_, (_, u)| u != pod_uid);
        self.inner
            .counts
            .lock()
            .unwrap()
            .retain(|k, _| k[5] != pod_uid);
    }

    /// Wakes the readiness worker of a container so it probes now rather than at its
    /// next tick (the kubelet's manual trigger, non-blocking). It has effect only while
    /// the worker has not yet run its handler on the container's current instance; the
    /// worker ignores it otherwise, so it may be called on every sync. A no-op if the
    /// container has no readiness worker.
    pub fn trigger_unprobed_readiness(&self, pod_uid: &str, container: &str) {
        self.inner.trigger(pod_uid, container, ProbeKind::Readiness);
    }

    /// The current result of a container instance's probe, if it has that probe.
    pub fn result(&self, container_id: &str, kind: ProbeKind) -> Option<ProbeResult> {
        self.inner
            .results
            .lock()
            .unwrap()
            .get(&(container_id.to_owned(), kind))
            .map(|(r, _)| *r)
    }

    /// The node is stopping: stops every worker, starts none after, and returns once
    /// they have all ended (a probe in flight is cancelled, not awaited). Their last
    /// results stay readable.
    pub async fn shutdown(&self) {
        self.inner.tasks.close();
        {
            let mut workers = self.inner.workers.lock().unwrap();
            for (_, handle) in workers.live.drain() {
                handle.cancel.cancel();
            }
        }
        self.inner.tasks.wait().await;
    }

    /// Number of live workers.
    pub fn workers(&self) -> usize {
        self.inner.workers.lock().unwrap().live.len()
    }

    /// `prober_probe_total` in the Prometheus text format.
    pub fn metrics_text(&self) -> String {
        let mut out = String::from(
            "# HELP prober_probe_total [ALPHA] Cumulative number of a liveness, readiness or startup probe for a container by result.\n# TYPE prober_probe_total counter\n",
        );
        for (labels, n) in self.inner.counts.lock().unwrap().iter() {
            let [probe_type, result, container, pod, namespace, pod_uid] = labels;
            let _ = writeln!(
                out,
                "prober_probe_total{{container={container:?},namespace={namespace:?},pod={pod:?},pod_uid={pod_uid:?},probe_type={probe_type:?},result={result:?}}} {n}"
            );
        }
        out
    }

    /// `prober_probe_total` for one label set (tests and the bench).
    pub fn count(&self, kind: ProbeKind, result: ProbeResult, pod: &Pod, container: &str) -> u64 {
        let key = labels(kind, result, pod, container);
        self.inner
            .counts
            .lock()
            .unwrap()
            .get(&key)
            .copied()
            .unwrap_or(0)
    }
}

fn labels(kind: ProbeKind, result: ProbeResult, pod: &Pod, container: &str) -> [String; 6] {
    [
        kind.name().to_owned(),
        result.metric().to_owned(),
        container.to_owned(),
        pod.metadata.name.clone().unwrap_or_default(),
        pod.metadata.namespace.clone().unwrap_or_default(),
        uid(pod).to_owned(),
    ]
}

/// Why a worker ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Exit {
    /// Stopped by the manager (`remove_pod`, `stop_liveness_and_startup`), which
    /// takes care of the results.
    Stopped,
    /// Ended for good on its own: the pod finished, the container terminated and will
    /// not be restarted, or the pod is being deleted.
    Done,
}

struct Worker {
    inner: Arc<Inner>,
    key: WorkerKey,
    generation: u64,
    cancel: CancellationToken,
    trigger: Arc<Notify>,
    pod: Pod,
    container: Container,
    kind: ProbeKind,
    probe: Probe,
    timing: Timing,
    /// The container instance being probed.
    container_id: Option<String>,
    /// Whether the handler ran on this instance (triggers are ignored from then on).
    probed: bool,
    /// Leave the result in place when ending (the pod is being deleted).
    keep_result: bool,
    last: ProbeResult,
    /// How many times in a row `last` came.
    run: u32,
    /// After a liveness or startup failure: wait for the next instance.
    on_hold: bool,
    /// The end of `initialDelaySeconds` for this instance, on the node's clock.
    delay_until: Instant,
}

impl Worker {
    async fn run(mut self) {
        let cancel = self.cancel.clone();
        let trigger = self.trigger.clone();
        // Right after the node starts, spread the probes of the pods it finds over one
        // period rather than running them all at once (the kubelet's jitter). A trigger
        // meanwhile is kept for the first round.
        if self.inner.started.elapsed() < self.timing.period {
            let spread = jitter(&self.key) * self.timing.period.as_secs_f64();
            tokio::select! {
                () = cancel.cancelled() => return self.finish(Exit::Stopped),
                () = tokio::time::sleep(Duration::from_secs_f64(spread)) => {}
            }
        }
        // As the kubelet's worker: probe, then wait for the next tick or a trigger. The
        // interval's first tick is taken here, before the first probe: it is not ready
        // at once (the timer fires it on its next turn), and left pending it would run a
        // second probe right after a triggered first one.
        let mut ticker = tokio::time::interval(self.timing.period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        let exit = 'probing: loop {
            let keep_going = tokio::select! {
                () = cancel.cancelled() => break Exit::Stopped,
                go = self.probe_once() => go,
            };
            if !keep_going {
                break Exit::Done;
            }
            loop {
                tokio::select! {
                    biased;
                    () = cancel.cancelled() => break 'probing Exit::Stopped,
                    _ = ticker.tick() => break,
                    () = trigger.notified() => {
                        if self.wants_trigger() {
                            break;
                        }
                    }
                }
            }
        };
        self.finish(exit);
    }

    /// Whether a trigger should run a probe now: the handler has not run on the
    /// container's current instance (a new instance counts as not probed).
    fn wants_trigger(&self) -> bool {
        if !self.probed {
            return true;
        }
        let current = self
            .inner
            .statuses
            .status(uid(&self.pod))
            .and_then(|s| find_status(&s, &self.container.name).and_then(instance_id));
        current.is_some() && current != self.container_id
    }

    fn finish(&self, exit: Exit) {
        if exit == Exit::Done
            && !self.keep_result
            && let Some(id) = &self.container_id
        {
            self.forget(id);
        }
        let mut workers = self.inner.workers.lock().unwrap();
        let newer = match workers.live.get(&self.key) {
            Some(h) if h.generation == self.generation => {
                workers.live.remove(&self.key);
                if exit == Exit::Done {
                    let (pod_uid, container, kind) = &self.key;
                    workers
                        .ended
                        .entry(pod_uid.clone())
                        .or_default()
                        .keys
                        .insert((container.clone(), *kind));
                }
                false
            }
            Some(_) => true,
            None => false,
        };
        // The series is the worker's, unless a newer worker of the same key took it
        // over. The workers lock is held so that no newer worker starts meanwhile.
        if !newer {
            let (pod_uid, container, kind) = &self.key;
            self.inner.forget_series(pod_uid, container, *kind);
        }
    }

    /// Records a result; a stopped worker records nothing (the manager owns its
    /// results from then on).
    fn set(&self, id: &str, result: ProbeResult) {
        let previous = {
            let mut results = self.inner.results.lock().unwrap();
            if self.cancel.is_cancelled() {
                return;
            }
            results.insert(
                (id.to_owned(), self.kind),
                (result, uid(&self.pod).to_owned()),
            )
        };
        if previous.map(|(r, _)| r) != Some(result) {
            let _ = self.inner.updates.send(uid(&self.pod).to_owned());
        }
    }

    fn forget(&self, id: &str) {
        let mut results = self.inner.results.lock().unwrap();
        if !self.cancel.is_cancelled() {
            results.remove(&(id.to_owned(), self.kind));
        }
    }

    /// Whether the instance has started: the status says so, or its startup probe
    /// succeeded (fresher than the status, which the sync loop writes after), or the
    /// container has no startup probe.
    fn started(&self, cs: &ApiContainerStatus, id: &str) -> bool {
        cs.started == Some(true)
            || self.container.startup_probe.is_none()
            || self
                .inner
                .results
                .lock()
                .unwrap()
                .get(&(id.to_owned(), ProbeKind::Startup))
                .is_some_and(|(r, _)| *r == ProbeResult::Success)
    }

    /// One probe, the kubelet's `doProbe`. `false` ends the worker.
    async fn probe_once(&mut self) -> bool {
        let Some(status) = self.inner.statuses.status(uid(&self.pod)) else {
            return true;
        };
        if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
            return false;
        }
        let Some(cs) = find_status(&status, &self.container.name) else {
            return true;
        };
        let Some(id) = instance_id(cs) else {
            return true;
        };
        if self.container_id.as_deref() != Some(id.as_str()) {
            if let Some(old) = self.container_id.replace(id.clone()) {
                self.forget(&old);
            }
            self.set(&id, self.kind.initial());
            self.last = ProbeResult::Unknown;
            self.run = 0;
            self.on_hold = false;
            self.probed = false;
            // `startedAt` is wall-clock time; the delay is counted on the node's clock
            // from here on.
            let up = cs
                .state
                .as_ref()
                .and_then(|s| s.running.as_ref())
                .and_then(|r| r.started_at.as_ref())
                .and_then(|t| Duration::try_from(jiff::Timestamp::now().duration_since(t.0)).ok())
                .unwrap_or_default();
            self.delay_until = Instant::now() + self.timing.initial_delay.saturating_sub(up);
        }
        if self.on_hold {
            return true;
        }
        let state = cs.state.clone().unwrap_or_default();
        if state.running.is_none() {
            self.set(&id, ProbeResult::Failure);
            let never = self
                .pod
                .spec
                .as_ref()
                .and_then(|s| s.restart_policy.as_deref())
                == Some("Never");
            return !(state.terminated.is_some() && never);
        }
        if self.pod.metadata.deletion_timestamp.is_some()
            && matches!(self.kind, ProbeKind::Liveness | ProbeKind::Startup)
        {
            // A quiet shutdown: the result stays Success until the pod is removed.
            self.set(&id, ProbeResult::Success);
            self.keep_result = true;
            return false;
        }
        if Instant::now() < self.delay_until {
            return true;
        }
        let started = self.started(cs, &id);
        match self.kind {
            ProbeKind::Startup if started => return true,
            ProbeKind::Liveness | ProbeKind::Readiness if !started => return true,
            _ => {}
        }

        let runtime = self
            .inner
            .router
            .as_ref()
            .and_then(|r| r.for_pod(&self.pod).ok())
            .map(|(r, _)| r);
        let pod_ip = status
            .pod_ip
            .clone()
            .filter(|ip| !ip.is_empty())
            .unwrap_or_else(|| "127.0.0.1".into());
        let target = handlers::Target {
            probe: &self.probe,
            kind: self.kind,
            container: &self.container,
            container_id: &id,
            pod_ip: &pod_ip,
            runtime,
            timeout: self.timing.timeout,
        };
        // The handlers bound themselves; this bound is for one that does not.
        let hard = self.timing.timeout + Duration::from_secs(2);
        let outcome =
            match tokio::time::timeout(hard, self.inner.runner.run(&self.pod, target)).await {
                Ok(o) => o,
                Err(_) => Outcome {
                    result: ProbeResult::Failure,
                    output: format!("probe did not finish within {hard:?}"),
                    warning: false,
                },
            };
        self.probed = true;
        let name = self.kind.name();
        if outcome.result == ProbeResult::Unknown {
            // The probe errored: reported, but neither counted nor a result (the
            // kubelet's doProbe returns on the error before recording anything).
            self.inner.events.pod(
                &self.pod,
                Some(&self.container.name),
                WARNING,
                "Unhealthy",
                format!("{name} probe errored: {}", outcome.output),
            );
            return true;
        }
        *self
            .inner
            .counts
            .lock()
            .unwrap()
            .entry(labels(
                self.kind,
                outcome.result,
                &self.pod,
                &self.container.name,
            ))
            .or_default() += 1;
        match outcome.result {
            ProbeResult::Failure => self.inner.events.pod(
                &self.pod,
                Some(&self.container.name),
                WARNING,
                "Unhealthy",
                format!("{name} probe failed: {}", outcome.output),
            ),
            ProbeResult::Success if outcome.warning => self.inner.events.pod(
                &self.pod,
                Some(&self.container.name),
                WARNING,
                "ProbeWarning",
                format!("{name} probe warning: {}", outcome.output),
            ),
            ProbeResult::Success | ProbeResult::Unknown => {}
        }
        if self.last == outcome.result {
            self.run += 1;
        } else {
            self.last = outcome.result;
            self.run = 1;
        }
        let threshold = match outcome.result {
            ProbeResult::Failure => self.timing.failure_threshold,
            _ => self.timing.success_threshold,
        };
        if self.run < threshold {
            return true;
        }
        self.set(&id, outcome.result);
        match (self.kind, outcome.result) {
            (ProbeKind::Liveness | ProbeKind::Startup, ProbeResult::Failure) => {
                // The container is about to be killed; probe its next instance.
                self.on_hold = true;
                self.run = 0;
            }
            (ProbeKind::Startup, ProbeResult::Success) => {
                // Started: readiness and liveness need not wait for their next tick.
                let (pod_uid, container, _) = &self.key;
                self.inner.trigger(pod_uid, container, ProbeKind::Readiness);
                self.inner.trigger(pod_uid, container, ProbeKind::Liveness);
            }
            _ => {}
        }
        true
    }
}

/// The runtime id of the container's current instance, if it has one.
fn instance_id(cs: &ApiContainerStatus) -> Option<String> {
    cs.container_id
        .as_deref()
        .and_then(|c| c.split_once("://").map(|(_, id)| id.to_owned()))
        .filter(|id| !id.is_empty())
}

/// A container's status among the pod's regular and init containers.
fn find_status<'a>(
    status: &'a k8s_openapi::api::core::v1::PodStatus,
    name: &str,
) -> Option<&'a ApiContainerStatus> {
    status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .find(|c| c.name == name)
}

/// A stable fraction in [0, 1) for a worker, for the start-up jitter.
fn jitter(key: &WorkerKey) -> f64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    (h.finish() % 1000) as f64 / 1000.0
}

#[cfg(test)]
mod tests;
