//! Pod status, computed the kubelet's way from what the pod worker knows, and the
//! store the node API reads.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{
    ContainerState as ApiState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus as ApiContainerStatus, Pod, PodCondition, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use wasmlet_runtime::{ContainerState, ContainerStatus};

use crate::pod::restart_policy;
use crate::pod::uid;
use crate::pod_state::PodState;
use crate::qos::qos_class;

fn time(t: Timestamp) -> Time {
    // Kubernetes times have second precision on the wire.
    Time(Timestamp::from_second(t.as_second()).unwrap_or(t))
}

/// The scheme-prefixed container id, as in `containerStatuses[].containerID`.
fn container_id(runtime: &str, id: &str) -> String {
    format!("{runtime}://{id}")
}

fn terminated(runtime: &str, cs: &ContainerStatus) -> ContainerStateTerminated {
    ContainerStateTerminated {
        container_id: Some(container_id(runtime, &cs.id)),
        exit_code: cs.exit_code,
        reason: Some(cs.reason.clone()).filter(|r| !r.is_empty()),
        message: Some(cs.message.clone()).filter(|m| !m.is_empty()),
        started_at: cs.started_at.map(time),
        finished_at: cs.finished_at.map(time),
        signal: None,
    }
}

fn image_id(cs: &ContainerStatus) -> String {
    if cs.image_ref.is_empty() {
        return String::new();
    }
    format!(
        "{}@{}",
        wasmlet_runtime::reference::repository(&cs.image),
        cs.image_ref
    )
}

/// The API status of one container from its record; `not_started` is the waiting
/// reason of a container that has no instance yet.
fn api_container_status(
    c: &k8s_openapi::api::core::v1::Container,
    st: &PodState,
    scheme: &str,
    not_started: &str,
) -> ApiContainerStatus {
    let rec = st.containers.get(&c.name).cloned().unwrap_or_default();
    let mut s = ApiContainerStatus {
        name: c.name.clone(),
        image: c.image.clone().unwrap_or_default(),
        restart_count: rec.restart_count as i32,
        ready: false,
        started: Some(false),
        ..Default::default()
    };
    if let Some(cs) = &rec.current {
        s.container_id = Some(container_id(scheme, &cs.id));
        s.image_id = image_id(cs);
    }
    s.last_state = rec.last_terminated.as_ref().map(|lt| ApiState {
        terminated: Some(terminated(scheme, lt)),
        ..Default::default()
    });
    let state = match (&rec.waiting, &rec.current) {
        (Some(w), current) => {
            // Waiting to restart: the instance that ended is the last state.
            if let Some(cs) = current
                .as_ref()
                .filter(|cs| cs.state == ContainerState::Exited)
            {
                s.last_state = Some(ApiState {
                    terminated: Some(terminated(scheme, cs)),
                    ..Default::default()
                });
            }
            ApiState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(w.reason.clone()),
                    message: Some(w.message.clone()).filter(|m| !m.is_empty()),
                }),
                ..Default::default()
            }
        }
        (None, Some(cs)) => match cs.state {
            ContainerState::Running => {
                // Started once the startup probe succeeded (at once without one);
                // ready once started and the readiness probe succeeded.
                use crate::probe_results::{ProbeKind, ProbeResult};
                let passed = |kind: ProbeKind| {
                    kind.of(c).is_none()
                        || st.probe_results.get(&(c.name.clone(), kind))
                            == Some(&ProbeResult::Success)
                };
                let started = passed(ProbeKind::Startup);
                s.started = Some(started);
                s.ready = started && passed(ProbeKind::Readiness);
                ApiState {
                    running: Some(ContainerStateRunning {
                        started_at: cs.started_at.map(time),
                    }),
                    ..Default::default()
                }
            }
            ContainerState::Exited => ApiState {
                terminated: Some(terminated(scheme, cs)),
                ..Default::default()
            },
            ContainerState::Created | ContainerState::Unknown => ApiState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("ContainerCreating".into()),
                    message: None,
                }),
                ..Default::default()
            },
        },
        (None, None) => ApiState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(not_started.into()),
                message: None,
            }),
            ..Default::default()
        },
    };
    s.state = Some(state);
    // In-place resize: what the running instance was given, and what the node
    // allocated to the container (its requests).
    if rec
        .current
        .as_ref()
        .is_some_and(|cs| cs.state == ContainerState::Running)
    {
        s.resources = rec.applied.as_ref().and_then(|(_, spec)| spec.clone());
        // The requests the node gave it: those of the last resize it applied.
        s.allocated_resources = s
            .resources
            .as_ref()
            .and_then(|r| r.requests.clone())
            .filter(|r| !r.is_empty());
    }
    s
}

/// Builds the status of `pod` from its worker's state. `previous` keeps condition
/// transition times stable when a condition does not change.
pub fn pod_status(pod: &Pod, st: &PodState, previous: Option<&PodStatus>) -> PodStatus {
    let scheme = st.runtime_name.as_str();
    let spec = pod.spec.clone().unwrap_or_default();
    // Regular containers wait for the init containers: PodInitializing.
    let not_started =
        if st.initialized || spec.init_containers.as_ref().is_none_or(|i| i.is_empty()) {
            "ContainerCreating"
        } else {
            "PodInitializing"
        };
    let statuses: Vec<ApiContainerStatus> = spec
        .containers
        .iter()
        .map(|c| api_container_status(c, st, scheme, not_started))
        .collect();
    let init_statuses: Vec<ApiContainerStatus> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| {
            let mut s = api_container_status(c, st, scheme, "PodInitializing");
            if c.restart_policy.as_deref() != Some("Always") {
                // A regular init container that finished is not "ready" to serve.
                s.ready = s
                    .state
                    .as_ref()
                    .and_then(|st| st.terminated.as_ref())
                    .is_some_and(|t| t.exit_code == 0);
                s.started = Some(s.state.as_ref().is_some_and(|st| st.running.is_some()));
            }
            s
        })
        .collect();

    // Init containers that have not all succeeded keep the pod Pending, or fail it
    // under restartPolicy Never (the kubelet's getPhase).
    let incomplete: Vec<&str> = spec
        .init_containers
        .iter()
        .flatten()
        .zip(&init_statuses)
        .filter(|(c, s)| {
            c.restart_policy.as_deref() != Some("Always")
                && s.state
                    .as_ref()
                    .and_then(|st| st.terminated.as_ref())
                    .is_none_or(|t| t.exit_code != 0)
        })
        .map(|(c, _)| c.name.as_str())
        .collect();
    let init_failed = init_statuses.iter().any(|s| {
        s.state
            .as_ref()
            .and_then(|st| st.terminated.as_ref())
            .is_some_and(|t| t.exit_code != 0)
    });
    // A pod whose regular containers ran is initialized (its init containers may be
    // running again in a new sandbox).
    let initialized = st.initialized
        || incomplete.is_empty()
        || spec.containers.iter().any(|c| {
            st.containers
                .get(&c.name)
                .is_some_and(|r| r.current.is_some() || r.last_terminated.is_some())
        });
    let phase = match &st.failure {
        Some(_) => "Failed",
        None if !initialized && init_failed && restart_policy(pod) == "Never" => "Failed",
        None if !initialized => "Pending",
        None => {
            // A sidecar still running keeps the pod Running: the phase turns terminal
            // only once the sidecars were stopped too (the kubelet's getPhase counts
            // running restartable init containers).
            let running_sidecars: Vec<ApiContainerStatus> = spec
                .init_containers
                .iter()
                .flatten()
                .zip(&init_statuses)
                .filter(|(c, s)| {
                    c.restart_policy.as_deref() == Some("Always")
                        && s.state.as_ref().is_some_and(|st| st.running.is_some())
                })
                .map(|(_, s)| s.clone())
                .collect();
            let counted: Vec<ApiContainerStatus> =
                statuses.iter().cloned().chain(running_sidecars).collect();
            phase(restart_policy(pod), &counted)
        }
    };
    let sandbox_ready = st.sandbox.as_ref().is_some_and(|s| s.ready);
    // Sidecars (restartable init containers) count for readiness.
    let unready: Vec<&str> = statuses
        .iter()
        .chain(
            spec.init_containers
                .iter()
                .flatten()
                .zip(&init_statuses)
                .filter(|(c, _)| c.restart_policy.as_deref() == Some("Always"))
                .map(|(_, s)| s),
        )
        .filter(|s| !s.ready)
        .map(|s| s.name.as_str())
        .collect();
    let finished = phase == "Succeeded" || phase == "Failed";
    let (ready_status, ready_reason, ready_message) = if finished {
        ("False", Some("PodCompleted"), None)
    } else if unready.is_empty() {
        ("True", None, None)
    } else {
        (
            "False",
            Some("ContainersNotReady"),
            Some(format!(
                "containers with unready status: [{}]",
                unready.join(" ")
            )),
        )
    };
    let now = Timestamp::now();
    let condition = |type_: &str, status: &str, reason: Option<&str>, message: Option<String>| {
        let kept = previous
            .and_then(|p| p.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == type_ && c.status == status))
            .and_then(|c| c.last_transition_time.clone());
        PodCondition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.map(str::to_owned),
            message,
            last_transition_time: Some(kept.unwrap_or_else(|| time(now))),
            last_probe_time: None,
            observed_generation: None,
        }
    };
    let conditions = vec![
        condition(
            "PodReadyToStartContainers",
            if sandbox_ready { "True" } else { "False" },
            None,
            None,
        ),
        if initialized {
            condition("Initialized", "True", None, None)
        } else {
            condition(
                "Initialized",
                "False",
                Some("ContainersNotInitialized"),
                Some(format!(
                    "containers with incomplete status: [{}]",
                    incomplete.join(" ")
                )),
            )
        },
        condition("Ready", ready_status, ready_reason, ready_message.clone()),
        condition("ContainersReady", ready_status, ready_reason, ready_message),
        condition("PodScheduled", "True", None, None),
    ];
    // A resize the runtime refused: the kubelet's PodResizeInProgress with reason
    // Error, until a later attempt succeeds.
    let mut conditions = conditions;
    // A pod the node evicted or stopped for its shutdown carries why
    // (PodDisruptionConditions, GA in 1.31).
    if let Some((reason, message)) = &st.failure
        && crate::pod_state::KillCause::is_disruption(reason)
    {
        conditions.push(condition(
            "DisruptionTarget",
            "True",
            Some("TerminationByKubelet"),
            Some(message.clone()),
        ));
    }
    if let Some(message) = st.containers.values().find_map(|r| r.resize_error.clone()) {
        conditions.push(condition(
            "PodResizeInProgress",
            "True",
            Some("Error"),
            Some(message),
        ));
    }

    PodStatus {
        phase: Some(phase.into()),
        conditions: Some(conditions),
        container_statuses: Some(statuses),
        init_container_statuses: Some(init_statuses).filter(|s| !s.is_empty()),
        qos_class: Some(qos_class(pod).into()),
        start_time: st.start_time.map(time),
        message: st
            .failure
            .as_ref()
            .map(|(_, m)| m.clone())
            .or_else(|| st.sandbox_error.clone()),
        reason: st.failure.as_ref().map(|(r, _)| r.clone()),
        pod_ip: st.sandbox.as_ref().and_then(|s| s.ip.clone()),
        pod_ips: st.sandbox.as_ref().and_then(|s| {
            let primary = s.ip.clone()?;
            Some(
                std::iter::once(primary)
                    .chain(s.additional_ips.iter().cloned())
                    .map(|ip| k8s_openapi::api::core::v1::PodIP { ip })
                    .collect(),
            )
        }),
        ..Default::default()
    }
}

/// The node's addresses in a pod's status, as the kubelet's `generateAPIPodStatus`
/// sets them: `hostIP`/`hostIPs` on every pod, and a `hostNetwork` pod (which has no
/// address of its own) gets them as its `podIP`/`podIPs` too.
pub fn with_host_ips(mut status: PodStatus, pod: &Pod, host_ips: &[String]) -> PodStatus {
    use k8s_openapi::api::core::v1::{HostIP, PodIP};
    if host_ips.is_empty() {
        return status;
    }
    status.host_ip = host_ips.first().cloned();
    status.host_ips = Some(
        host_ips
            .iter()
            .map(|ip| HostIP { ip: ip.clone() })
            .collect(),
    );
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    if host_network && status.pod_ip.is_none() {
        status.pod_ip = host_ips.first().cloned();
        status.pod_ips = Some(host_ips.iter().map(|ip| PodIP { ip: ip.clone() }).collect());
    }
    status
}

/// The final status of a pod whose containers were all stopped (it was deleted): the
/// phase is terminal, as the kubelet's `getPhase(..., podIsTerminal)` makes it:
/// Succeeded when every container exited 0, else Failed; nothing is ready.
pub fn terminal(mut status: PodStatus) -> PodStatus {
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return status;
    }
    let all_zero = status.container_statuses.iter().flatten().all(|c| {
        c.state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .is_some_and(|t| t.exit_code == 0)
    });
    status.phase = Some(if all_zero { "Succeeded" } else { "Failed" }.into());
    for c in status.container_statuses.iter_mut().flatten() {
        c.ready = false;
    }
    for cond in status.conditions.iter_mut().flatten() {
        if cond.type_ == "Ready" || cond.type_ == "ContainersReady" {
            cond.status = "False".into();
            cond.reason = Some("PodCompleted".into());
            cond.message = None;
        }
    }
    status
}

/// The pod phase from its container statuses: the kubelet's `getPhase` for pods
/// without init containers.
pub fn phase(restart_policy: &str, statuses: &[ApiContainerStatus]) -> &'static str {
    let (mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for s in statuses {
        let state = s.state.clone().unwrap_or_default();
        if state.running.is_some() {
            running += 1;
        } else if let Some(t) = &state.terminated {
            stopped += 1;
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if state.waiting.is_some() {
            if s.last_state
                .as_ref()
                .is_some_and(|l| l.terminated.is_some())
            {
                stopped += 1;
            } else {
                waiting += 1;
            }
        } else {
            // Unknown: treated as waiting, the pod is not yet known to run.
            waiting += 1;
        }
    }
    match () {
        _ if waiting > 0 => "Pending",
        _ if running > 0 => "Running",
        _ if stopped > 0 => {
            if restart_policy == "Always" {
                "Running"
            } else if stopped == succeeded {
                "Succeeded"
            } else if restart_policy == "Never" {
                "Failed"
            } else {
                "Running"
            }
        }
        _ => "Pending",
    }
}

/// The pods the node runs, with their latest statuses, for the node API and the
/// status manager.
#[derive(Clone, Default)]
pub struct StatusStore {
    inner: Arc<RwLock<HashMap<String, Pod>>>,
    /// Pods whose worker ended, with their final status, until the status manager
    /// takes them.
    finished: Arc<Mutex<Vec<Pod>>>,
    /// Whether a status manager takes finished pods (standalone nodes have none).
    tracking: Arc<std::sync::atomic::AtomicBool>,
    changed: Arc<tokio::sync::Notify>,
}

impl StatusStore {
    /// Records a pod with its status.
    pub fn set(&self, mut pod: Pod, status: PodStatus) {
        pod.status = Some(status);
        let old = self
            .inner
            .write()
            .unwrap()
            .insert(uid(&pod).to_owned(), pod.clone());
        if old.as_ref() != Some(&pod) {
            self.changed.notify_one();
        }
    }

    /// Records that a pod's worker ended, with the pod's final status.
    pub fn finish(&self, mut pod: Pod, status: PodStatus) {
        self.inner.write().unwrap().remove(uid(&pod));
        if self.tracking.load(std::sync::atomic::Ordering::Acquire) {
            pod.status = Some(status);
            self.finished.lock().unwrap().push(pod);
        }
        self.changed.notify_one();
    }

    /// From now on, finished pods are kept for [`Self::take_finished`].
    pub fn track_finished(&self) {
        self.tracking
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// The pods finished since the last call.
    pub fn take_finished(&self) -> Vec<Pod> {
        std::mem::take(&mut *self.finished.lock().unwrap())
    }

    /// Resolves when a status changed or a pod finished since the last wait.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// The last status recorded for a pod.
    pub fn status(&self, uid: &str) -> Option<PodStatus> {
        self.inner
            .read()
            .unwrap()
            .get(uid)
            .and_then(|p| p.status.clone())
    }

    /// Forgets a pod that is gone.
    pub fn remove(&self, uid: &str) {
        self.inner.write().unwrap().remove(uid);
    }

    /// Every pod, sorted by namespace and name.
    pub fn pods(&self) -> Vec<Pod> {
        let mut pods: Vec<Pod> = self.inner.read().unwrap().values().cloned().collect();
        pods.sort_by(|a, b| {
            (&a.metadata.namespace, &a.metadata.name)
                .cmp(&(&b.metadata.namespace, &b.metadata.name))
        });
        pods
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cs(state: &str, exit: i32, last_terminated: bool) -> ApiContainerStatus {
        let mut s = ApiContainerStatus::default();
        let mut st = ApiState::default();
        match state {
            "running" => st.running = Some(Default::default()),
            "terminated" => {
                st.terminated = Some(ContainerStateTerminated {
                    exit_code: exit,
                    ..Default::default()
                })
            }
            "waiting" => st.waiting = Some(Default::default()),
            _ => {}
        }
        s.state = Some(st);
        if last_terminated {
            s.last_state = Some(ApiState {
                terminated: Some(Default::default()),
                ..Default::default()
            });
        }
        s
    }

    #[test]
    fn phases_follow_get_phase() {
        let cases: &[(&str, Vec<ApiContainerStatus>, &str)] = &[
            ("Always", vec![cs("waiting", 0, false)], "Pending"),
            (
                "Always",
                vec![cs("running", 0, false), cs("waiting", 0, false)],
                "Pending",
            ),
            ("Always", vec![cs("running", 0, false)], "Running"),
            ("Always", vec![cs("waiting", 0, true)], "Running"),
            ("Always", vec![cs("terminated", 0, false)], "Running"),
            ("Never", vec![cs("terminated", 0, false)], "Succeeded"),
            (
                "OnFailure",
                vec![cs("terminated", 0, false), cs("terminated", 0, false)],
                "Succeeded",
            ),
            (
                "Never",
                vec![cs("terminated", 0, false), cs("terminated", 3, false)],
                "Failed",
            ),
            ("OnFailure", vec![cs("terminated", 1, false)], "Running"),
            (
                "Never",
                vec![cs("running", 0, false), cs("terminated", 1, false)],
                "Running",
            ),
            ("Never", vec![], "Pending"),
            // A running sidecar counted with a finished main container.
            (
                "Never",
                vec![cs("terminated", 0, false), cs("running", 0, false)],
                "Running",
            ),
        ];
        for (policy, statuses, want) in cases {
            assert_eq!(phase(policy, statuses), *want, "{policy} {statuses:?}");
        }
    }
}
