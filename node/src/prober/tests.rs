//! Probe workers on a paused clock, with a scripted handler: timings, thresholds,
//! gating and what reaches the sync loop.

use std::collections::VecDeque;

use k8s_openapi::api::core::v1::PodStatus;

use super::*;

/// Answers with the scripted results (then `otherwise`), and records when it ran.
struct Script {
    results: Mutex<VecDeque<ProbeResult>>,
    otherwise: ProbeResult,
    calls: Mutex<Vec<(Duration, ProbeKind)>>,
    epoch: Instant,
    /// Never answers (a hung handler).
    hang: bool,
}

impl Script {
    fn new(results: &[ProbeResult], otherwise: ProbeResult) -> Arc<Self> {
        Arc::new(Script {
            results: Mutex::new(results.iter().copied().collect()),
            otherwise,
            calls: Mutex::default(),
            epoch: Instant::now(),
            hang: false,
        })
    }

    fn times(&self, kind: ProbeKind) -> Vec<u64> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, k)| *k == kind)
            .map(|(t, _)| t.as_secs())
            .collect()
    }
}

#[async_trait::async_trait]
impl Runner for Script {
    async fn run(&self, _pod: &Pod, target: handlers::Target<'_>) -> Outcome {
        let kind = if target.probe.exec.is_some() {
            ProbeKind::Liveness
        } else if target.probe.tcp_socket.is_some() {
            ProbeKind::Startup
        } else {
            ProbeKind::Readiness
        };
        self.calls
            .lock()
            .unwrap()
            .push((self.epoch.elapsed(), kind));
        if self.hang {
            std::future::pending::<()>().await;
        }
        let result = self
            .results
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(self.otherwise);
        Outcome {
            result,
            output: format!("scripted {result:?}"),
            warning: false,
        }
    }
}

/// A pod with container `c`, whose probes are given as JSON (each kind has its own
/// handler so the script can tell them apart: liveness exec, readiness httpGet,
/// startup tcpSocket).
fn pod(probes: serde_json::Value) -> Pod {
    let mut c = serde_json::json!({"name": "c", "image": "i"});
    for (k, v) in probes.as_object().unwrap() {
        c[k] = v.clone();
    }
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
        "spec": {"containers": [c]},
    }))
    .unwrap()
}

fn running(id: &str, started: bool) -> PodStatus {
    serde_json::from_value(serde_json::json!({
        "phase": "Running",
        "containerStatuses": [{
            "name": "c", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "containerID": format!("wasm://{id}"),
            "started": started,
            "state": {"running": {"startedAt": jiff::Timestamp::now().to_string()}},
        }],
    }))
    .unwrap()
}

struct Harness {
    probes: ProbeManager,
    statuses: StatusStore,
    updates: mpsc::UnboundedReceiver<String>,
    script: Arc<Script>,
}

fn harness(script: Arc<Script>) -> Harness {
    let statuses = StatusStore::default();
    let (tx, updates) = mpsc::unbounded_channel();
    let runner: Arc<dyn Runner> = script.clone();
    let probes = ProbeManager::new(statuses.clone(), None, runner, EventRecorder::default(), tx);
    Harness {
        probes,
        statuses,
        updates,
        script,
    }
}

impl Harness {
    /// Starts the pod's workers after the node's start-up jitter window.
    async fn start(&self, pod: &Pod, status: PodStatus) {
        tokio::time::advance(Duration::from_secs(600)).await;
        self.statuses.set(pod.clone(), status);
        self.probes.add_pod(pod);
    }

    /// Lets the clock run for `secs`, one second at a time.
    async fn run_for(&self, secs: u64) {
        for _ in 0..secs {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    fn result(&self, id: &str, kind: ProbeKind) -> Option<ProbeResult> {
        self.probes.result(id, kind)
    }

    fn drain_updates(&mut self) -> usize {
        let mut n = 0;
        while self.updates.try_recv().is_ok() {
            n += 1;
        }
        n
    }
}

fn since_start(times: Vec<u64>, start: u64) -> Vec<u64> {
    times.into_iter().map(|t| t - start).collect()
}

#[tokio::test(start_paused = true)]
async fn readiness_follows_the_thresholds_on_its_period() {
    use ProbeResult::*;
    let script = Script::new(
        &[Success, Success, Failure, Failure, Failure, Success],
        Success,
    );
    let mut h = harness(script);
    let p = pod(serde_json::json!({"readinessProbe": {
        "httpGet": {"port": 80}, "periodSeconds": 10, "successThreshold": 2, "failureThreshold": 3,
    }}));
    h.start(&p, running("id1", true)).await;
    let start = h.script.epoch.elapsed().as_secs();
    h.run_for(1).await;
    // A new instance is not ready until probed: the initial result is Failure.
    assert_eq!(h.result("id1", ProbeKind::Readiness), Some(Failure));
    assert_eq!(h.drain_updates(), 1);
    h.run_for(10).await;
    assert_eq!(
        h.result("id1", ProbeKind::Readiness),
        Some(Success),
        "2 successes"
    );
    assert_eq!(h.drain_updates(), 1);
    h.run_for(20).await;
    assert_eq!(
        h.result("id1", ProbeKind::Readiness),
        Some(Success),
        "2 failures are not 3"
    );
    h.run_for(10).await;
    assert_eq!(
        h.result("id1", ProbeKind::Readiness),
        Some(Failure),
        "3 failures"
    );
    assert_eq!(h.drain_updates(), 1);
    h.run_for(20).await;
    assert_eq!(h.result("id1", ProbeKind::Readiness), Some(Success));
    let times = since_start(h.script.times(ProbeKind::Readiness), start);
    assert_eq!(times, [0, 10, 20, 30, 40, 50, 60], "one probe per period");
}

#[tokio::test(start_paused = true)]
async fn the_initial_delay_and_startup_gate_liveness() {
    use ProbeResult::*;
    let script = Script::new(&[Failure, Failure, Success], Success);
    let h = harness(script);
    let p = pod(serde_json::json!({
        "livenessProbe": {"exec": {"command": ["check"]}, "periodSeconds": 5, "initialDelaySeconds": 12},
        "startupProbe": {"tcpSocket": {"port": 80}, "periodSeconds": 2, "failureThreshold": 30},
    }));
    h.start(&p, running("id1", false)).await;
    let start = h.script.epoch.elapsed().as_secs();
    h.run_for(5).await;
    assert_eq!(h.result("id1", ProbeKind::Startup), Some(Success));
    assert!(
        h.script.times(ProbeKind::Liveness).is_empty(),
        "not started yet"
    );
    // The sync loop turns the startup success into `started: true`.
    h.statuses.set(p.clone(), running("id1", true));
    h.run_for(30).await;
    let startup = since_start(h.script.times(ProbeKind::Startup), start);
    assert_eq!(startup, [0, 2, 4], "stops once started");
    let liveness = since_start(h.script.times(ProbeKind::Liveness), start);
    assert_eq!(
        liveness[0], 15,
        "after the 12 s delay, on the 5 s ticker: {liveness:?}"
    );
    assert!(
        liveness.windows(2).all(|w| w[1] - w[0] == 5),
        "{liveness:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_liveness_failure_is_reported_once_and_the_next_instance_is_probed_afresh() {
    use ProbeResult::*;
    let script = Script::new(&[Failure, Failure, Failure], Success);
    let mut h = harness(script);
    let p = pod(serde_json::json!({"livenessProbe": {
        "exec": {"command": ["check"]}, "periodSeconds": 1, "failureThreshold": 3,
    }}));
    h.start(&p, running("id1", true)).await;
    h.run_for(1).await;
    assert_eq!(
        h.result("id1", ProbeKind::Liveness),
        Some(Success),
        "initial"
    );
    h.drain_updates();
    h.run_for(3).await;
    assert_eq!(h.result("id1", ProbeKind::Liveness), Some(Failure));
    assert_eq!(h.drain_updates(), 1, "the sync loop hears of it once");
    let calls = h.script.times(ProbeKind::Liveness).len();
    h.run_for(10).await;
    assert_eq!(
        h.script.times(ProbeKind::Liveness).len(),
        calls,
        "on hold until the container is replaced"
    );
    // The container was restarted: a new instance, probed from its initial result.
    h.statuses.set(p.clone(), running("id2", true));
    h.run_for(3).await;
    assert_eq!(h.result("id2", ProbeKind::Liveness), Some(Success));
    assert_eq!(
        h.result("id1", ProbeKind::Liveness),
        None,
        "the old one is forgotten"
    );
    assert!(h.script.times(ProbeKind::Liveness).len() > calls);
    assert_eq!(h.probes.count(ProbeKind::Liveness, Failure, &p, "c"), 3);
    let metrics = h.probes.metrics_text();
    assert!(
        metrics.contains(r#"prober_probe_total{container="c",namespace="ns",pod="p",pod_uid="u1",probe_type="Liveness",result="failed"} 3"#),
        "{metrics}"
    );
}

#[tokio::test(start_paused = true)]
async fn readiness_flapping_never_reports_a_liveness_failure() {
    use ProbeResult::*;
    let flaps: Vec<ProbeResult> = (0..20)
        .map(|i| if i % 2 == 0 { Failure } else { Success })
        .collect();
    let script = Script::new(&flaps, Success);
    let h = harness(script);
    let p = pod(serde_json::json!({"readinessProbe": {
        "httpGet": {"port": 80}, "periodSeconds": 1, "failureThreshold": 1,
    }}));
    h.start(&p, running("id1", true)).await;
    let mut seen = Vec::new();
    for _ in 0..20 {
        h.run_for(1).await;
        seen.push(h.result("id1", ProbeKind::Readiness));
    }
    assert!(
        seen.contains(&Some(Success)) && seen.contains(&Some(Failure)),
        "{seen:?}"
    );
    assert_eq!(h.result("id1", ProbeKind::Liveness), None);
}

#[tokio::test(start_paused = true)]
async fn a_hung_handler_counts_as_a_failure_and_removal_stops_every_worker() {
    use ProbeResult::*;
    let script = Arc::new(Script {
        hang: true,
        ..Arc::into_inner(Script::new(&[], Success)).unwrap()
    });
    let h = harness(script);
    let p = pod(serde_json::json!({
        "readinessProbe": {"httpGet": {"port": 80}, "periodSeconds": 10, "timeoutSeconds": 1, "failureThreshold": 1},
        "livenessProbe": {"exec": {"command": ["x"]}, "periodSeconds": 10, "timeoutSeconds": 1},
    }));
    h.start(&p, running("id1", true)).await;
    assert_eq!(h.probes.workers(), 2);
    h.run_for(4).await;
    // timeoutSeconds plus the 2 s margin for a handler that ignores its own timeout.
    assert_eq!(h.probes.count(ProbeKind::Readiness, Failure, &p, "c"), 1);
    assert_eq!(h.result("id1", ProbeKind::Readiness), Some(Failure));
    h.probes.remove_pod("u1");
    assert_eq!(h.probes.workers(), 0);
    let calls = h.script.calls.lock().unwrap().len();
    h.run_for(30).await;
    assert_eq!(
        h.script.calls.lock().unwrap().len(),
        calls,
        "no worker is left"
    );
    assert_eq!(h.result("id1", ProbeKind::Readiness), None);
}

/// At the node's shutdown every worker ends, a hung probe with them, and no pod that
/// is synced after it gets workers again.
#[tokio::test(start_paused = true)]
async fn shutdown_waits_for_every_worker_and_starts_no_more() {
    use ProbeResult::*;
    let script = Arc::new(Script {
        hang: true,
        ..Arc::into_inner(Script::new(&[], Success)).unwrap()
    });
    let h = harness(script);
    let p = pod(serde_json::json!({
        "readinessProbe": {"httpGet": {"port": 80}, "periodSeconds": 10, "timeoutSeconds": 60},
        "livenessProbe": {"exec": {"command": ["x"]}, "periodSeconds": 10, "timeoutSeconds": 60},
    }));
    h.start(&p, running("id1", true)).await;
    h.run_for(12).await;
    assert_eq!(
        h.script.calls.lock().unwrap().len(),
        2,
        "both probes are in flight"
    );

    tokio::time::timeout(Duration::from_secs(1), h.probes.shutdown())
        .await
        .expect("shutdown does not wait for the hung probes' timeouts");
    assert_eq!(h.probes.workers(), 0);
    assert!(
        h.probes.inner.tasks.is_empty(),
        "a worker task outlived shutdown"
    );

    h.probes.add_pod(&p);
    assert_eq!(h.probes.workers(), 0, "a worker was started after shutdown");
}

#[tokio::test(start_paused = true)]
async fn probes_of_a_finished_pod_end() {
    let script = Script::new(&[], ProbeResult::Success);
    let h = harness(script);
    let p =
        pod(serde_json::json!({"readinessProbe": {"httpGet": {"port": 80}, "periodSeconds": 1}}));
    h.start(&p, running("id1", true)).await;
    h.run_for(2).await;
    let mut done = running("id1", true);
    done.phase = Some("Succeeded".into());
    h.statuses.set(p.clone(), done);
    h.run_for(2).await;
    assert_eq!(h.probes.workers(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_stopped_worker_does_not_remove_its_successor() {
    let script = Script::new(&[], ProbeResult::Success);
    let h = harness(script);
    let p =
        pod(serde_json::json!({"readinessProbe": {"httpGet": {"port": 80}, "periodSeconds": 1}}));
    h.start(&p, running("id1", true)).await;
    h.run_for(2).await;
    // Removed and added again before the old worker has seen its cancellation.
    h.probes.remove_pod("u1");
    h.probes.add_pod(&p);
    assert_eq!(h.probes.workers(), 1);
    h.run_for(3).await;
    assert_eq!(
        h.probes.workers(),
        1,
        "the old worker ended without taking the new one"
    );
    let calls = h.script.times(ProbeKind::Readiness).len();
    h.run_for(3).await;
    assert_eq!(h.script.times(ProbeKind::Readiness).len(), calls + 3);
    assert_eq!(
        h.result("id1", ProbeKind::Readiness),
        Some(ProbeResult::Success)
    );
    assert!(
        h.probes
            .count(ProbeKind::Readiness, ProbeResult::Success, &p, "c")
            >= 6,
        "the new worker's series survived the old worker's end"
    );
    // Its own entry is still the one the manager stops.
    h.probes.remove_pod("u1");
    h.run_for(3).await;
    assert_eq!(h.script.times(ProbeKind::Readiness).len(), calls + 3);
}

#[tokio::test(start_paused = true)]
async fn a_trigger_probes_an_unprobed_readiness_at_once() {
    use ProbeResult::*;
    let script = Script::new(&[], Success);
    let h = harness(script);
    let p = pod(serde_json::json!({"readinessProbe": {
        "httpGet": {"port": 80}, "periodSeconds": 10, "initialDelaySeconds": 3,
    }}));
    h.start(&p, running("id1", true)).await;
    let start = h.script.epoch.elapsed().as_secs();
    h.run_for(5).await;
    assert!(
        h.script.times(ProbeKind::Readiness).is_empty(),
        "in its delay"
    );
    assert_eq!(h.result("id1", ProbeKind::Readiness), Some(Failure));
    h.probes.trigger_unprobed_readiness("u1", "c");
    tokio::task::yield_now().await;
    assert_eq!(h.result("id1", ProbeKind::Readiness), Some(Success));
    // Probed: further triggers are ignored, the period is kept.
    h.probes.trigger_unprobed_readiness("u1", "c");
    h.run_for(1).await;
    h.probes.trigger_unprobed_readiness("u1", "c");
    h.run_for(15).await;
    let times = since_start(h.script.times(ProbeKind::Readiness), start);
    assert_eq!(times, [5, 10, 20]);
    // A new instance (past its delay) is unprobed again: a trigger probes it at once.
    let mut restarted = running("id2", true);
    restarted.container_statuses.as_mut().unwrap()[0]
        .state
        .as_mut()
        .unwrap()
        .running
        .as_mut()
        .unwrap()
        .started_at = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        jiff::Timestamp::now() - jiff::SignedDuration::from_secs(60),
    ));
    h.statuses.set(p.clone(), restarted);
    h.run_for(1).await;
    h.probes.trigger_unprobed_readiness("u1", "c");
    tokio::task::yield_now().await;
    let times = since_start(h.script.times(ProbeKind::Readiness), start);
    assert_eq!(times, [5, 10, 20, 22], "not at the next tick (30)");
    assert_eq!(h.result("id2", ProbeKind::Readiness), Some(Success));
    assert_eq!(h.result("id1", ProbeKind::Readiness), None);
}

#[tokio::test(start_paused = true)]
async fn a_startup_success_wakes_readiness_and_liveness() {
    use ProbeResult::*;
    let script = Script::new(&[Failure], Success);
    let h = harness(script);
    let p = pod(serde_json::json!({
        "startupProbe": {"tcpSocket": {"port": 80}, "periodSeconds": 2, "failureThreshold": 30},
        "readinessProbe": {"httpGet": {"port": 80}, "periodSeconds": 10},
        "livenessProbe": {"exec": {"command": ["check"]}, "periodSeconds": 10},
    }));
    // The status still says not started: the startup result is fresher.
    h.start(&p, running("id1", false)).await;
    let start = h.script.epoch.elapsed().as_secs();
    h.run_for(3).await;
    assert_eq!(
        since_start(h.script.times(ProbeKind::Startup), start),
        [0, 2]
    );
    assert_eq!(
        since_start(h.script.times(ProbeKind::Readiness), start),
        [2]
    );
    assert_eq!(since_start(h.script.times(ProbeKind::Liveness), start), [2]);
    assert_eq!(h.result("id1", ProbeKind::Readiness), Some(Success));
    h.run_for(10).await;
    assert_eq!(
        since_start(h.script.times(ProbeKind::Startup), start),
        [0, 2]
    );
    assert_eq!(
        since_start(h.script.times(ProbeKind::Readiness), start),
        [2, 10]
    );
}

#[tokio::test(start_paused = true)]
async fn a_terminating_pod_keeps_readiness_and_quiets_liveness_and_startup() {
    use ProbeResult::*;
    // Startup never succeeds; readiness and liveness wait for it.
    let script = Script::new(&[], Failure);
    let h = harness(script);
    let p = pod(serde_json::json!({
        "startupProbe": {"tcpSocket": {"port": 80}, "periodSeconds": 1, "failureThreshold": 100},
        "readinessProbe": {"httpGet": {"port": 80}, "periodSeconds": 1},
        "livenessProbe": {"exec": {"command": ["check"]}, "periodSeconds": 1},
    }));
    h.start(&p, running("id1", false)).await;
    h.run_for(3).await;
    assert_eq!(h.probes.workers(), 3);
    assert_eq!(h.result("id1", ProbeKind::Startup), Some(Unknown));
    assert!(h.probes.count(ProbeKind::Startup, Failure, &p, "c") > 0);
    h.probes.stop_liveness_and_startup("u1");
    assert_eq!(h.probes.workers(), 1);
    // A quiet shutdown: nothing to kill, and the container counts as started.
    assert_eq!(h.result("id1", ProbeKind::Startup), Some(Success));
    assert_eq!(h.result("id1", ProbeKind::Liveness), Some(Success));
    assert_eq!(h.probes.count(ProbeKind::Startup, Failure, &p, "c"), 0);
    let startup = h.script.times(ProbeKind::Startup).len();
    // Syncs go on while it terminates; they start nothing again.
    h.probes.add_pod(&p);
    h.run_for(5).await;
    h.probes.add_pod(&p);
    assert_eq!(h.probes.workers(), 1);
    assert_eq!(h.script.times(ProbeKind::Startup).len(), startup);
    assert!(h.script.times(ProbeKind::Liveness).is_empty());
    assert!(
        h.script.times(ProbeKind::Readiness).len() >= 5,
        "readiness runs while the pod terminates"
    );
    assert_eq!(h.result("id1", ProbeKind::Readiness), Some(Failure));
    assert_eq!(h.result("id1", ProbeKind::Liveness), Some(Success));
    // Terminated: everything goes, and the pod could start afresh.
    h.probes.remove_pod("u1");
    assert_eq!(h.probes.workers(), 0);
    for kind in ProbeKind::ALL {
        assert_eq!(h.result("id1", kind), None, "{kind:?}");
    }
    h.probes.add_pod(&p);
    assert_eq!(h.probes.workers(), 3);
}

#[tokio::test(start_paused = true)]
async fn errored_probes_are_neither_counted_nor_a_result() {
    use ProbeResult::*;
    let script = Script::new(&[Unknown, Unknown], Success);
    let h = harness(script);
    let p = pod(serde_json::json!({"readinessProbe": {
        "httpGet": {"port": 80}, "periodSeconds": 1, "failureThreshold": 1,
    }}));
    h.start(&p, running("id1", true)).await;
    h.run_for(2).await;
    assert_eq!(h.script.times(ProbeKind::Readiness).len(), 2);
    assert_eq!(
        h.result("id1", ProbeKind::Readiness),
        Some(Failure),
        "initial"
    );
    for result in [Unknown, Failure, Success] {
        assert_eq!(h.probes.count(ProbeKind::Readiness, result, &p, "c"), 0);
    }
    assert!(!h.probes.metrics_text().contains("result=\"unknown\""));
    h.run_for(1).await;
    assert_eq!(h.result("id1", ProbeKind::Readiness), Some(Success));
    assert_eq!(h.probes.count(ProbeKind::Readiness, Success, &p, "c"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_workers_series_go_with_it() {
    use ProbeResult::*;
    let script = Script::new(&[Failure], Success);
    let h = harness(script);
    let p =
        pod(serde_json::json!({"readinessProbe": {"httpGet": {"port": 80}, "periodSeconds": 1}}));
    let mut other = p.clone();
    other.metadata.name = Some("q".into());
    other.metadata.uid = Some("u2".into());
    h.start(&p, running("id1", true)).await;
    h.statuses.set(other.clone(), running("id2", true));
    h.probes.add_pod(&other);
    h.run_for(3).await;
    let metrics = h.probes.metrics_text();
    assert!(
        metrics.contains(r#"pod_uid="u1",probe_type="Readiness",result="failed"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"pod_uid="u1",probe_type="Readiness",result="successful"}"#),
        "{metrics}"
    );
    h.probes.remove_pod("u1");
    let gone = |h: &Harness| !h.probes.metrics_text().contains("pod_uid=\"u1\"");
    assert!(gone(&h), "{}", h.probes.metrics_text());
    h.run_for(3).await;
    assert!(gone(&h), "{}", h.probes.metrics_text());
    assert!(
        h.probes.metrics_text().contains("pod_uid=\"u2\""),
        "another pod's stay"
    );
    // A worker that ends on its own takes its series too.
    let mut done = running("id2", true);
    done.phase = Some("Succeeded".into());
    h.statuses.set(other.clone(), done);
    h.run_for(2).await;
    assert_eq!(h.probes.workers(), 0);
    assert!(!h.probes.metrics_text().contains("pod_uid=\"u2\""));
}

#[tokio::test(start_paused = true)]
async fn add_pod_is_idempotent_and_does_not_revive_a_never_container() {
    let script = Script::new(&[], ProbeResult::Success);
    let h = harness(script);
    let mut p =
        pod(serde_json::json!({"readinessProbe": {"httpGet": {"port": 80}, "periodSeconds": 1}}));
    p.spec.as_mut().unwrap().restart_policy = Some("Never".into());
    h.start(&p, running("id1", true)).await;
    for _ in 0..5 {
        h.probes.add_pod(&p);
    }
    assert_eq!(h.probes.workers(), 1);
    h.run_for(3).await;
    assert_eq!(h.script.times(ProbeKind::Readiness).len(), 3, "one worker");
    let mut exited = running("id1", true);
    exited.container_statuses.as_mut().unwrap()[0].state =
        Some(serde_json::from_value(serde_json::json!({"terminated": {"exitCode": 0}})).unwrap());
    h.statuses.set(p.clone(), exited);
    h.run_for(2).await;
    assert_eq!(h.probes.workers(), 0, "the container will not run again");
    h.probes.add_pod(&p);
    h.run_for(2).await;
    assert_eq!(h.probes.workers(), 0, "not started again");
    h.probes.remove_pod("u1");
    h.probes.add_pod(&p);
    assert_eq!(h.probes.workers(), 1, "forgotten with the pod");
}

#[test]
fn timing_defaults_are_the_kubelets() {
    let t = Timing::of(&Probe::default());
    assert_eq!(
        t,
        Timing {
            initial_delay: Duration::ZERO,
            period: Duration::from_secs(10),
            timeout: Duration::from_secs(1),
            success_threshold: 1,
            failure_threshold: 3,
        }
    );
}
