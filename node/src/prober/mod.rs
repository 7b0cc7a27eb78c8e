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
//!   `started`.
//!
//! Every probe run is counted in `prober_probe_total` with the kubelet's labels; a
//! failure is a `Unhealthy` warning event.

pub mod handlers;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, ContainerStatus as ApiContainerStatus, Pod, Probe};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cluster::events::{EventRecorder, WARNING};
use crate::podconfig::uid;
use crate::router::RuntimeRouter;
use crate::status::StatusStore;

/// The three probe types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProbeKind {
    Liveness,
    Readiness,
    Startup,
}

impl ProbeKind {
    pub const ALL: [ProbeKind; 3] = [
        ProbeKind::Liveness,
        ProbeKind::Readiness,
        ProbeKind::Startup,
    ];

    /// As in the kubelet's metrics and events.
    pub fn name(self) -> &'static str {
        match self {
            ProbeKind::Liveness => "Liveness",
            ProbeKind::Readiness => "Readiness",
            ProbeKind::Startup => "Startup",
        }
    }

    /// The container's probe of this type.
    pub fn of(self, c: &Container) -> Option<&Probe> {
        match self {
            ProbeKind::Liveness => c.liveness_probe.as_ref(),
            ProbeKind::Readiness => c.readiness_probe.as_ref(),
            ProbeKind::Startup => c.startup_probe.as_ref(),
        }
    }

    /// The result a new container instance starts with.
    fn initial(self) -> ProbeResult {
        match self {
            ProbeKind::Liveness => ProbeResult::Success,
            ProbeKind::Readiness => ProbeResult::Failure,
            ProbeKind::Startup => ProbeResult::Unknown,
        }
    }
}

/// A probe's result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProbeResult {
    Success,
    Failure,
    Unknown,
}

impl ProbeResult {
    /// The `result` label of `prober_probe_total`.
    fn metric(self) -> &'static str {
        match self {
            ProbeResult::Success => "successful",
            ProbeResult::Failure => "failed",
            ProbeResult::Unknown => "unknown",
        }
    }
}

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

/// The real handlers; `exec` goes to the pod's runtime.
pub struct RealRunner;

#[async_trait::async_trait]
impl Runner for RealRunner {
    async fn run(&self, _pod: &Pod, target: handlers::Target<'_>) -> Outcome {
        handlers::run(&target).await
    }
}

type WorkerKey = (String, String, ProbeKind);

struct Inner {
    statuses: StatusStore,
    router: Option<RuntimeRouter>,
    runner: Arc<dyn Runner>,
    events: EventRecorder,
    updates: mpsc::UnboundedSender<String>,
    /// Per container instance (runtime id) and type.
    results: Mutex<HashMap<(String, ProbeKind), ProbeResult>>,
    workers: Mutex<HashMap<WorkerKey, CancellationToken>>,
    /// `prober_probe_total` by (probe_type, result, container, pod, namespace, pod_uid).
    counts: Mutex<BTreeMap<[String; 6], u64>>,
    started: Instant,
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
            }),
        }
    }

    /// Starts the workers of the pod's probes that have none (regular containers and
    /// sidecars; init containers that run to completion are not probed).
    pub fn add_pod(&self, pod: &Pod) {
        let Some(spec) = pod.spec.as_ref() else {
            return;
        };
        let containers = spec.containers.iter().chain(
            spec.init_containers
                .iter()
                .flatten()
                .filter(|c| c.restart_policy.as_deref() == Some("Always")),
        );
        let mut workers = self.inner.workers.lock().unwrap();
        for c in containers {
            for kind in ProbeKind::ALL {
                let Some(probe) = kind.of(c) else { continue };
                let key = (uid(pod).to_owned(), c.name.clone(), kind);
                if workers.contains_key(&key) {
                    continue;
                }
                let cancel = CancellationToken::new();
                workers.insert(key.clone(), cancel.clone());
                let worker = Worker {
                    inner: self.inner.clone(),
                    pod: pod.clone(),
                    container: c.clone(),
                    kind,
                    probe: probe.clone(),
                    timing: Timing::of(probe),
                    container_id: None,
                    last: ProbeResult::Unknown,
                    run: 0,
                    on_hold: false,
                    delay_until: Instant::now(),
                };
                tokio::spawn(worker.run(key, cancel));
            }
        }
    }

    /// Stops the pod's workers and forgets their results.
    pub fn remove_pod(&self, pod_uid: &str) {
        let mut workers = self.inner.workers.lock().unwrap();
        workers.retain(|(u, _, _), cancel| {
            if u == pod_uid {
                cancel.cancel();
                false
            } else {
                true
            }
        });
    }

    /// The current result of a container instance's probe, if it has that probe.
    pub fn result(&self, container_id: &str, kind: ProbeKind) -> Option<ProbeResult> {
        self.inner
            .results
            .lock()
            .unwrap()
            .get(&(container_id.to_owned(), kind))
            .copied()
    }

    /// Number of live workers.
    pub fn workers(&self) -> usize {
        self.inner.workers.lock().unwrap().len()
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

struct Worker {
    inner: Arc<Inner>,
    pod: Pod,
    container: Container,
    kind: ProbeKind,
    probe: Probe,
    timing: Timing,
    /// The container instance being probed.
    container_id: Option<String>,
    last: ProbeResult,
    /// How many times in a row `last` came.
    run: u32,
    /// After a liveness or startup failure: wait for the next instance.
    on_hold: bool,
    /// The end of `initialDelaySeconds` for this instance, on the node's clock.
    delay_until: Instant,
}

impl Worker {
    async fn run(mut self, key: WorkerKey, cancel: CancellationToken) {
        // Right after the node starts, spread the probes of the pods it finds over one
        // period rather than running them all at once (the kubelet's jitter).
        if self.inner.started.elapsed() < self.timing.period {
            let spread = jitter(&key) * self.timing.period.as_secs_f64();
            tokio::select! {
                () = cancel.cancelled() => return self.finish(&key),
                () = tokio::time::sleep(Duration::from_secs_f64(spread)) => {}
            }
        }
        let mut ticker = tokio::time::interval(self.timing.period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = cancel.cancelled() => break,
                _ = ticker.tick() => {}
            }
            let keep_going = tokio::select! {
                () = cancel.cancelled() => break,
                go = self.probe_once() => go,
            };
            if !keep_going {
                break;
            }
        }
        self.finish(&key);
    }

    fn finish(&self, key: &WorkerKey) {
        if let Some(id) = &self.container_id {
            self.inner
                .results
                .lock()
                .unwrap()
                .remove(&(id.clone(), self.kind));
        }
        let mut workers = self.inner.workers.lock().unwrap();
        if workers.get(key).is_some_and(|c| !c.is_cancelled()) {
            workers.remove(key);
        }
    }

    fn set(&self, id: &str, result: ProbeResult) {
        let previous = self
            .inner
            .results
            .lock()
            .unwrap()
            .insert((id.to_owned(), self.kind), result);
        if previous != Some(result) {
            let _ = self.inner.updates.send(uid(&self.pod).to_owned());
        }
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
        let Some(id) = cs
            .container_id
            .as_deref()
            .and_then(|c| c.split_once("://").map(|(_, id)| id.to_owned()))
            .filter(|id| !id.is_empty())
        else {
            return true;
        };
        if self.container_id.as_deref() != Some(id.as_str()) {
            if let Some(old) = self.container_id.replace(id.clone()) {
                self.inner.results.lock().unwrap().remove(&(old, self.kind));
            }
            self.set(&id, self.kind.initial());
            self.last = ProbeResult::Unknown;
            self.run = 0;
            self.on_hold = false;
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
        let Some(running) = state.running else {
            self.set(&id, ProbeResult::Failure);
            let never = self
                .pod
                .spec
                .as_ref()
                .and_then(|s| s.restart_policy.as_deref())
                == Some("Never");
            return !(state.terminated.is_some() && never);
        };
        if self.pod.metadata.deletion_timestamp.is_some()
            && matches!(self.kind, ProbeKind::Liveness | ProbeKind::Startup)
        {
            self.set(&id, ProbeResult::Success);
            return false;
        }
        let _ = running;
        if Instant::now() < self.delay_until {
            return true;
        }
        let started = cs.started == Some(true);
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
        let name = self.kind.name();
        match outcome.result {
            ProbeResult::Unknown => {
                self.inner.events.pod(
                    &self.pod,
                    Some(&self.container.name),
                    WARNING,
                    "Unhealthy",
                    format!("{name} probe errored: {}", outcome.output),
                );
                return true;
            }
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
            ProbeResult::Success => {}
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
        if matches!(self.kind, ProbeKind::Liveness | ProbeKind::Startup)
            && outcome.result == ProbeResult::Failure
        {
            // The container is about to be killed; probe its next instance.
            self.on_hold = true;
            self.run = 0;
        }
        true
    }
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
