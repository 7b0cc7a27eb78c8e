//! The kubelet's `computePodActions`: what one sync of a pod should do, decided from
//! the pod, its [`PodState`] and a few facts gathered beforehand ([`ActionInputs`]),
//! without touching the runtime. [`crate::sync::PodSyncer::sync_pod`] executes it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Container, Pod};
use wasmlet_runtime::{ContainerResources, ContainerState};

use crate::duration;
use crate::pod::{full_name, restart_policy, should_restart, uid};
use crate::pod_state::{ContainerRecord, PodState, Waiting};
use crate::probe_results::ProbeKind;

/// What the decision needs beyond the pod and its state, gathered by the caller
/// (from the prober, the restart back-off and the node's resource settings). Keyed
/// by container name.
#[derive(Clone, Debug, Default)]
pub struct ActionInputs {
    pub now: Timestamp,
    /// The running instances whose liveness or startup probe failed.
    pub failed_probes: BTreeMap<String, FailedProbe>,
    /// The running instances whose startup probe succeeded.
    pub startup_succeeded: BTreeSet<String>,
    /// The containers whose restart back-off has not ended (from their last exit).
    pub backoff: BTreeMap<String, BackoffLeft>,
    /// The resources each container's spec asks for now (absent: they cannot be
    /// computed; a resize reports why).
    pub desired_resources: BTreeMap<String, ContainerResources>,
}

impl ActionInputs {
    /// Inputs with nothing but the time.
    pub fn at(now: Timestamp) -> Self {
        ActionInputs {
            now,
            ..Default::default()
        }
    }
}

/// A failed liveness or startup probe of a running instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailedProbe {
    pub kind: ProbeKind,
    /// The probe's `terminationGracePeriodSeconds`, else the pod's (at least 0).
    pub grace_seconds: u64,
}

/// A restart back-off that has not ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackoffLeft {
    /// Until it ends.
    pub remaining: Duration,
    /// Its current length (for the message).
    pub delay: Duration,
}

/// What one sync does with the pod.
#[derive(Clone, Debug, PartialEq)]
pub enum PodActions {
    /// Nothing: the pod has failed already (its deadline).
    Nothing,
    /// A `Never` pod whose sandbox died after its containers ran: nothing is started
    /// again, its containers are reported as they ended.
    SandboxDiedNoRestart,
    /// Stop the pod.
    KillPod(KillReason),
    /// Bring the pod closer to its spec.
    Sync(SyncActions),
}

/// Why the pod is stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KillReason {
    /// It ran past `activeDeadlineSeconds`: it fails, and is killed within its grace.
    DeadlineExceeded,
    /// Every container has terminated and none will be restarted: the sidecars are
    /// stopped, the sandbox released, for good.
    PodDone,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SyncActions {
    /// A sandbox to create first (none is ready).
    pub create_sandbox: Option<CreateSandbox>,
    /// The containers, as they stand before the sandbox is made.
    pub containers: ContainerActions,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateSandbox {
    /// The dead sandbox to remove first.
    pub remove: Option<String>,
}

/// The containers' actions, in the order they are taken.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContainerActions {
    /// Init containers in order, up to the first that is not done (a sidecar: not
    /// running, or not started with a startup probe) and including it.
    pub init_containers: Vec<ContainerStep>,
    /// The pod was initialized in this sandbox already: only the sidecars are looked
    /// at, and none holds the regular containers back.
    pub already_initialized: bool,
    /// Every init container is done: the regular containers follow.
    pub initialized: bool,
    /// The regular containers (empty unless `initialized`).
    pub containers: Vec<ContainerStep>,
}

impl ContainerActions {
    /// The step of a container, init or regular.
    pub fn step(&self, name: &str) -> Option<&ContainerAction> {
        self.init_containers
            .iter()
            .chain(&self.containers)
            .find(|s| s.name == name)
            .map(|s| &s.action)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ContainerStep {
    pub name: String,
    pub action: ContainerAction,
}

/// What happens to one container.
#[derive(Clone, Debug, PartialEq)]
pub enum ContainerAction {
    /// Running in the sandbox: left alone, or resized in place when its resources
    /// differ from what it runs with.
    Keep { resize: bool },
    /// Ended and not restarted under its policy.
    Done,
    /// Kill it first (its liveness or startup probe failed), with `grace`; then it
    /// is restarted at once unless the policy is `Never` (the back-off still grows).
    Kill {
        probe: ProbeKind,
        grace: Duration,
        restart: bool,
        /// The attempt of the restart.
        attempt: u32,
    },
    /// Start a new instance.
    Start(Start),
    /// Still in its restart back-off: waits, looked at again after `retry`.
    BackOff { waiting: Waiting, retry: Duration },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Start {
    /// The attempt (restart count) of the new instance.
    pub attempt: u32,
    /// An init container whose current instance is from an older sandbox: it
    /// becomes the last termination (and the attempt counts) before the start.
    pub retire_current: bool,
    /// The exit the restart back-off grows from (a restart after an exit).
    pub backoff_from: Option<Timestamp>,
}

/// The pod's `activeDeadlineSeconds` as a point in time, from its start.
pub fn active_deadline(pod: &Pod, st: &PodState) -> Option<Timestamp> {
    let secs = pod.spec.as_ref()?.active_deadline_seconds?;
    st.start_time?
        .checked_add(jiff::SignedDuration::from_secs(secs))
        .ok()
}

/// How long until the pod's deadline (and a little more), to sync again then.
pub fn until_deadline(pod: &Pod, st: &PodState, now: Timestamp) -> Option<Duration> {
    active_deadline(pod, st).map(|d| {
        Duration::try_from(d.duration_since(now)).unwrap_or_default() + Duration::from_millis(10)
    })
}

/// Whether every container has terminated and none will be restarted.
pub fn is_pod_done(pod: &Pod, st: &PodState) -> bool {
    let policy = restart_policy(pod);
    let Some(spec) = &pod.spec else { return true };
    let init_failed = spec.init_containers.iter().flatten().any(|c| {
        !is_sidecar(c)
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

fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// What this sync does with the pod (the kubelet's `computePodActions`).
pub fn compute_pod_actions(pod: &Pod, st: &PodState, inputs: &ActionInputs) -> PodActions {
    if st.failure.is_some() {
        return PodActions::Nothing;
    }
    if let Some(deadline) = active_deadline(pod, st)
        && inputs.now >= deadline
    {
        return PodActions::KillPod(KillReason::DeadlineExceeded);
    }
    if is_pod_done(pod, st) {
        return PodActions::KillPod(KillReason::PodDone);
    }
    let ready = st.sandbox.as_ref().filter(|s| s.ready);
    let create_sandbox = match ready {
        Some(_) => None,
        None => {
            let ran = st.containers.values().any(|r| r.current.is_some());
            if restart_policy(pod) == "Never" && st.sandbox_attempts > 0 && ran {
                return PodActions::SandboxDiedNoRestart;
            }
            Some(CreateSandbox {
                remove: st.sandbox.as_ref().map(|s| s.id.clone()),
            })
        }
    };
    let sandbox = ready.map(|s| s.id.as_str());
    PodActions::Sync(SyncActions {
        create_sandbox,
        containers: compute_container_actions(pod, st, sandbox, inputs),
    })
}

/// The containers' actions in `sandbox` (`None`: one about to be made, which none
/// of them runs in).
pub fn compute_container_actions(
    pod: &Pod,
    st: &PodState,
    sandbox: Option<&str>,
    inputs: &ActionInputs,
) -> ContainerActions {
    let policy = restart_policy(pod);
    let spec = pod.spec.clone().unwrap_or_default();
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
    let already = sandbox.is_some() && st.initialized_in.as_deref() == sandbox;
    let mut out = ContainerActions {
        already_initialized: already,
        initialized: true,
        ..Default::default()
    };
    for ic in spec.init_containers.iter().flatten() {
        let sidecar = is_sidecar(ic);
        if already && !sidecar {
            continue;
        }
        let rec = st.containers.get(&ic.name);
        let from_old_sandbox = rec
            .and_then(|r| r.current.as_ref())
            .is_some_and(|cs| Some(cs.sandbox_id.as_str()) != sandbox);
        let action = if let Some(rec) = rec.filter(|_| from_old_sandbox) {
            // A new attempt (the runtime names containers by attempt).
            ContainerAction::Start(Start {
                attempt: rec.restart_count + 1,
                retire_current: true,
                backoff_from: None,
            })
        } else {
            let container_policy = if sidecar { "Always" } else { init_policy };
            container_action(pod, ic, rec, sandbox, container_policy, inputs)
        };
        out.init_containers.push(ContainerStep {
            name: ic.name.clone(),
            action,
        });
        let done = !from_old_sandbox
            && init_container_done(ic, rec, inputs.startup_succeeded.contains(&ic.name));
        if !done && !already {
            out.initialized = false;
            break;
        }
    }
    if out.initialized {
        out.containers = spec
            .containers
            .iter()
            .map(|c| ContainerStep {
                name: c.name.clone(),
                action: container_action(
                    pod,
                    c,
                    st.containers.get(&c.name),
                    sandbox,
                    policy,
                    inputs,
                ),
            })
            .collect();
    }
    out
}

/// Whether an init container lets the next start: it succeeded, or — a sidecar — it
/// runs (and, with a startup probe, the probe succeeded, as the kubelet waits for
/// it).
pub fn init_container_done(
    ic: &Container,
    rec: Option<&ContainerRecord>,
    startup_succeeded: bool,
) -> bool {
    let current = rec.and_then(|r| r.current.as_ref());
    if is_sidecar(ic) {
        current.is_some_and(|c| {
            c.state == ContainerState::Running && (ic.startup_probe.is_none() || startup_succeeded)
        })
    } else {
        current.is_some_and(|c| c.state == ContainerState::Exited && c.exit_code == 0)
    }
}

/// One container under `policy`: left running, or started (again, within the
/// restart back-off).
pub fn container_action(
    pod: &Pod,
    c: &Container,
    rec: Option<&ContainerRecord>,
    sandbox: Option<&str>,
    policy: &str,
    inputs: &ActionInputs,
) -> ContainerAction {
    let restart_count = rec.map_or(0, |r| r.restart_count);
    let Some(cs) = rec.and_then(|r| r.current.as_ref()) else {
        return ContainerAction::Start(Start {
            attempt: restart_count,
            retire_current: false,
            backoff_from: None,
        });
    };
    let rec = rec.expect("it has an instance");
    let running_here =
        cs.state == ContainerState::Running && Some(cs.sandbox_id.as_str()) == sandbox;
    if running_here {
        if let Some(failed) = inputs.failed_probes.get(&c.name) {
            // The kubelet's restart on a failed liveness or startup probe: kill with
            // the probe's grace (else the pod's), then restart within the policy.
            return ContainerAction::Kill {
                probe: failed.kind,
                grace: Duration::from_secs(failed.grace_seconds),
                restart: policy != "Never",
                attempt: restart_count + 1,
            };
        }
        let resize = !inputs
            .desired_resources
            .get(&c.name)
            .is_some_and(|desired| {
                rec.applied
                    .as_ref()
                    .is_some_and(|(applied, spec)| applied == desired && *spec == c.resources)
            });
        return ContainerAction::Keep { resize };
    }
    // Created but never started (the node stopped in between), or in an unknown
    // state: always started again, as the kubelet does.
    if matches!(cs.state, ContainerState::Created | ContainerState::Unknown) {
        return ContainerAction::Start(Start {
            attempt: restart_count + 1,
            retire_current: false,
            backoff_from: None,
        });
    }
    // Exited, or lost with a sandbox that died: restart within the policy and the
    // back-off, as every container start does.
    let exit_code = if cs.state == ContainerState::Exited {
        cs.exit_code
    } else {
        137
    };
    let restart = should_restart(policy, exit_code) || (rec.probe_killed && policy != "Never");
    if !restart {
        return ContainerAction::Done;
    }
    // A container the node killed for a failed probe is started again at once, as
    // the kubelet kills and starts in one sync (the back-off still grows).
    if !rec.probe_killed
        && let Some(left) = inputs.backoff.get(&c.name)
    {
        return ContainerAction::BackOff {
            waiting: Waiting::new(
                "CrashLoopBackOff",
                format!(
                    "back-off {} restarting failed container={} pod={}_{}({})",
                    duration::format(left.delay),
                    c.name,
                    pod.metadata.name.as_deref().unwrap_or(""),
                    pod.metadata.namespace.as_deref().unwrap_or(""),
                    uid(pod)
                ),
            ),
            retry: left.remaining,
        };
    }
    ContainerAction::Start(Start {
        attempt: restart_count + 1,
        retire_current: false,
        backoff_from: Some(cs.finished_at.unwrap_or(inputs.now)),
    })
}

/// The message of the Killing event of a container that failed a probe.
pub fn probe_kill_message(c: &Container, probe: ProbeKind, restart: bool) -> String {
    let what = probe.name().to_lowercase();
    if restart {
        format!(
            "Container {} failed {what} probe, will be restarted",
            c.name
        )
    } else {
        format!("Container {} failed {what} probe", c.name)
    }
}

/// The BackOff event of a container entering its back-off.
pub fn backoff_event_message(pod: &Pod, c: &Container) -> String {
    format!(
        "Back-off restarting failed container {} in pod {}",
        c.name,
        full_name(pod)
    )
}

#[cfg(test)]
#[path = "actions_tests.rs"]
mod tests;
