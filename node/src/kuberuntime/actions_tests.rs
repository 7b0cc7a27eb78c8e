//! Table tests of [`compute_pod_actions`], in the manner of upstream's
//! `TestComputePodActions`.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, Probe};
use wasmlet_runtime::{
    ContainerMetadata, ContainerResources, ContainerState, ContainerStatus, PodSandboxConfig,
};

use super::*;
use crate::pod_state::{ContainerRecord, PodState, SandboxRecord};

const SB: &str = "sb-1";

fn now() -> Timestamp {
    "2026-01-01T00:10:00Z".parse().unwrap()
}

fn container(name: &str) -> Container {
    Container {
        name: name.into(),
        image: Some("img".into()),
        ..Default::default()
    }
}

fn sidecar(name: &str, startup_probe: bool) -> Container {
    Container {
        restart_policy: Some("Always".into()),
        startup_probe: startup_probe.then(Probe::default),
        ..container(name)
    }
}

fn pod(policy: &str, init: Vec<Container>, containers: Vec<Container>) -> Pod {
    let mut p = Pod::default();
    p.metadata.name = Some("p".into());
    p.metadata.namespace = Some("ns".into());
    p.metadata.uid = Some("u1".into());
    p.spec = Some(PodSpec {
        restart_policy: Some(policy.into()),
        init_containers: (!init.is_empty()).then_some(init),
        containers,
        ..Default::default()
    });
    p
}

fn status(name: &str, sandbox: &str, state: ContainerState, exit_code: i32) -> ContainerStatus {
    ContainerStatus {
        id: format!("{name}-{sandbox}"),
        sandbox_id: sandbox.into(),
        metadata: ContainerMetadata {
            name: name.into(),
            attempt: 0,
        },
        state,
        created_at: now(),
        started_at: None,
        finished_at: Some("2026-01-01T00:09:00Z".parse().unwrap()),
        exit_code,
        image: String::new(),
        image_ref: String::new(),
        reason: String::new(),
        message: String::new(),
        labels: Default::default(),
        annotations: Default::default(),
        log_path: Default::default(),
    }
}

fn running(name: &str) -> ContainerStatus {
    status(name, SB, ContainerState::Running, 0)
}

fn exited(name: &str, code: i32) -> ContainerStatus {
    status(name, SB, ContainerState::Exited, code)
}

/// A state with a ready sandbox `SB` (or a dead one) and these instances.
fn state(ready: bool, containers: Vec<(ContainerStatus, u32)>) -> PodState {
    let mut st = PodState {
        sandbox: Some(SandboxRecord {
            id: SB.into(),
            ready,
            ip: None,
            additional_ips: Vec::new(),
            config: PodSandboxConfig::default(),
        }),
        sandbox_attempts: 1,
        start_time: Some("2026-01-01T00:00:00Z".parse().unwrap()),
        ..Default::default()
    };
    for (cs, restarts) in containers {
        st.containers.insert(
            cs.metadata.name.clone(),
            ContainerRecord {
                current: Some(cs),
                restart_count: restarts,
                ..Default::default()
            },
        );
    }
    st
}

fn new_pod_state() -> PodState {
    PodState {
        start_time: Some(now()),
        ..Default::default()
    }
}

fn inputs() -> ActionInputs {
    ActionInputs::at(now())
}

fn step(name: &str, action: ContainerAction) -> ContainerStep {
    ContainerStep {
        name: name.into(),
        action,
    }
}

fn start(attempt: u32) -> ContainerAction {
    ContainerAction::Start(Start {
        attempt,
        retire_current: false,
        backoff_from: None,
    })
}

fn restart(attempt: u32) -> ContainerAction {
    ContainerAction::Start(Start {
        attempt,
        retire_current: false,
        backoff_from: Some("2026-01-01T00:09:00Z".parse().unwrap()),
    })
}

fn new_attempt(attempt: u32) -> ContainerAction {
    ContainerAction::Start(Start {
        attempt,
        retire_current: true,
        backoff_from: None,
    })
}

fn keep() -> ContainerAction {
    ContainerAction::Keep { resize: false }
}

fn sync(
    create: Option<Option<&str>>,
    init: Vec<ContainerStep>,
    initialized: bool,
    containers: Vec<ContainerStep>,
) -> PodActions {
    PodActions::Sync(SyncActions {
        create_sandbox: create.map(|remove| CreateSandbox {
            remove: remove.map(str::to_owned),
        }),
        containers: ContainerActions {
            init_containers: init,
            already_initialized: false,
            initialized,
            containers,
        },
    })
}

/// Inputs where every running container runs with the resources it asks for.
fn applied(st: &mut PodState, inputs: &mut ActionInputs) {
    for (name, rec) in st.containers.iter_mut() {
        rec.applied = Some((ContainerResources::default(), None));
        inputs
            .desired_resources
            .insert(name.clone(), ContainerResources::default());
    }
}

struct Case {
    name: &'static str,
    pod: Pod,
    state: PodState,
    inputs: ActionInputs,
    want: PodActions,
}

fn cases() -> Vec<Case> {
    let two = || vec![container("a"), container("b")];
    let mut v = Vec::new();
    v.push(Case {
        name: "new pod: a sandbox, then every container",
        pod: pod("Always", vec![], two()),
        state: new_pod_state(),
        inputs: inputs(),
        want: sync(
            Some(None),
            vec![],
            true,
            vec![step("a", start(0)), step("b", start(0))],
        ),
    });
    v.push(Case {
        name: "new pod with init containers: the first init container only",
        pod: pod("Always", vec![container("i1"), container("i2")], two()),
        state: new_pod_state(),
        inputs: inputs(),
        want: sync(Some(None), vec![step("i1", start(0))], false, vec![]),
    });
    let mut st = state(true, vec![(running("a"), 0), (running("b"), 0)]);
    let mut inp = inputs();
    applied(&mut st, &mut inp);
    v.push(Case {
        name: "all running: nothing to start",
        pod: pod("Always", vec![], two()),
        state: st,
        inputs: inp,
        want: sync(
            None,
            vec![],
            true,
            vec![step("a", keep()), step("b", keep())],
        ),
    });
    // Sandbox dead: a new one; the init containers run again (new attempts), the
    // regular containers lost with it restart under the policy.
    let mut st = state(
        false,
        vec![
            (exited("i1", 0), 0),
            (status("a", SB, ContainerState::Running, 0), 2),
        ],
    );
    st.initialized_in = Some(SB.into());
    v.push(Case {
        name: "sandbox dead: a new sandbox, init containers run again",
        pod: pod("Always", vec![container("i1")], vec![container("a")]),
        state: st,
        inputs: inputs(),
        want: sync(
            Some(Some(SB)),
            vec![step("i1", new_attempt(1))],
            false,
            vec![],
        ),
    });
    v.push(Case {
        name: "sandbox dead without init containers: containers restart in the new one",
        pod: pod("Always", vec![], vec![container("a")]),
        state: state(false, vec![(running("a"), 2)]),
        inputs: inputs(),
        want: sync(Some(Some(SB)), vec![], true, vec![step("a", restart(3))]),
    });
    v.push(Case {
        name: "sandbox dead, Never pod that ran: not started again",
        pod: pod("Never", vec![], two()),
        state: state(false, vec![(running("a"), 0), (exited("b", 0), 0)]),
        inputs: inputs(),
        want: PodActions::SandboxDiedNoRestart,
    });
    v.push(Case {
        name: "sandbox dead, Never pod that never ran: a new sandbox",
        pod: pod("Never", vec![], vec![container("a")]),
        state: state(false, vec![]),
        inputs: inputs(),
        want: sync(Some(Some(SB)), vec![], true, vec![step("a", start(0))]),
    });
    // Exits under each restart policy (b keeps running, so the pod is not done).
    for (policy, code, want) in [
        ("Always", 0, restart(1)),
        ("Always", 1, restart(1)),
        ("OnFailure", 0, ContainerAction::Done),
        ("OnFailure", 1, restart(1)),
        ("Never", 0, ContainerAction::Done),
        ("Never", 1, ContainerAction::Done),
    ] {
        let mut st = state(true, vec![(exited("a", code), 0), (running("b"), 0)]);
        let mut inp = inputs();
        applied(&mut st, &mut inp);
        v.push(Case {
            name: match (policy, code) {
                ("Always", 0) => "exited 0 under Always: restarted",
                ("Always", _) => "exited 1 under Always: restarted",
                ("OnFailure", 0) => "exited 0 under OnFailure: done",
                ("OnFailure", _) => "exited 1 under OnFailure: restarted",
                (_, 0) => "exited 0 under Never: done",
                _ => "exited 1 under Never: done",
            },
            pod: pod(policy, vec![], two()),
            state: st,
            inputs: inp,
            want: sync(None, vec![], true, vec![step("a", want), step("b", keep())]),
        });
    }
    let mut st = state(true, vec![(exited("a", 1), 3), (running("b"), 0)]);
    let mut inp = inputs();
    applied(&mut st, &mut inp);
    inp.backoff.insert(
        "a".into(),
        BackoffLeft {
            remaining: Duration::from_secs(25),
            delay: Duration::from_secs(40),
        },
    );
    v.push(Case {
        name: "exited in its back-off: CrashLoopBackOff, looked at when it ends",
        pod: pod("Always", vec![], two()),
        state: st,
        inputs: inp,
        want: sync(
            None,
            vec![],
            true,
            vec![
                step(
                    "a",
                    ContainerAction::BackOff {
                        waiting: Waiting::new(
                            "CrashLoopBackOff",
                            "back-off 40s restarting failed container=a pod=p_ns(u1)",
                        ),
                        retry: Duration::from_secs(25),
                    },
                ),
                step("b", keep()),
            ],
        ),
    });
    let mut st = state(true, vec![(exited("a", 137), 3), (running("b"), 0)]);
    st.containers.get_mut("a").unwrap().probe_killed = true;
    let mut inp = inputs();
    applied(&mut st, &mut inp);
    inp.backoff.insert(
        "a".into(),
        BackoffLeft {
            remaining: Duration::from_secs(25),
            delay: Duration::from_secs(40),
        },
    );
    v.push(Case {
        name: "killed for a probe: restarted at once despite its back-off",
        pod: pod("OnFailure", vec![], two()),
        state: st,
        inputs: inp,
        want: sync(
            None,
            vec![],
            true,
            vec![step("a", restart(4)), step("b", keep())],
        ),
    });
    for (cs, name) in [
        (
            status("a", SB, ContainerState::Created, 0),
            "created, never started: started again",
        ),
        (
            status("a", SB, ContainerState::Unknown, 0),
            "unknown state: started again",
        ),
    ] {
        v.push(Case {
            name,
            pod: pod("Never", vec![], vec![container("a")]),
            state: state(true, vec![(cs, 0)]),
            inputs: inputs(),
            want: sync(None, vec![], true, vec![step("a", start(1))]),
        });
    }
    // Init containers in order.
    v.push(Case {
        name: "init: the first succeeded, the second starts, nothing else",
        pod: pod(
            "Always",
            vec![container("i1"), container("i2"), container("i3")],
            vec![container("a")],
        ),
        state: state(true, vec![(exited("i1", 0), 0)]),
        inputs: inputs(),
        want: sync(
            None,
            vec![step("i1", ContainerAction::Done), step("i2", start(0))],
            false,
            vec![],
        ),
    });
    v.push(Case {
        name: "init: a failed one restarts under OnFailure (Always pod)",
        pod: pod("Always", vec![container("i1")], vec![container("a")]),
        state: state(true, vec![(exited("i1", 1), 0)]),
        inputs: inputs(),
        want: sync(None, vec![step("i1", restart(1))], false, vec![]),
    });
    v.push(Case {
        name: "init: a failed one under Never ends the pod",
        pod: pod("Never", vec![container("i1")], vec![container("a")]),
        state: state(true, vec![(exited("i1", 1), 0)]),
        inputs: inputs(),
        want: PodActions::KillPod(KillReason::PodDone),
    });
    let mut st = state(true, vec![(exited("i1", 0), 0), (running("a"), 0)]);
    st.initialized_in = Some(SB.into());
    let mut inp = inputs();
    applied(&mut st, &mut inp);
    v.push(Case {
        name: "init: initialized in this sandbox already: not run again",
        pod: pod("Always", vec![container("i1")], vec![container("a")]),
        state: st,
        inputs: inp,
        want: PodActions::Sync(SyncActions {
            create_sandbox: None,
            containers: ContainerActions {
                init_containers: vec![],
                already_initialized: true,
                initialized: true,
                containers: vec![step("a", keep())],
            },
        }),
    });
    // Sidecars.
    let mut st = state(true, vec![(running("s"), 0)]);
    let mut inp = inputs();
    applied(&mut st, &mut inp);
    v.push(Case {
        name: "sidecar without a startup probe running: the next starts",
        pod: pod(
            "Always",
            vec![sidecar("s", false), container("i2")],
            vec![container("a")],
        ),
        state: st,
        inputs: inp,
        want: sync(
            None,
            vec![step("s", keep()), step("i2", start(0))],
            false,
            vec![],
        ),
    });
    let mut st = state(true, vec![(running("s"), 0)]);
    let mut inp = inputs();
    applied(&mut st, &mut inp);
    v.push(Case {
        name: "sidecar with a startup probe not yet succeeded: holds the next",
        pod: pod(
            "Always",
            vec![sidecar("s", true), container("i2")],
            vec![container("a")],
        ),
        state: st,
        inputs: inp,
        want: sync(None, vec![step("s", keep())], false, vec![]),
    });
    let mut st = state(true, vec![(running("s"), 0)]);
    let mut inp = inputs();
    applied(&mut st, &mut inp);
    inp.startup_succeeded.insert("s".into());
    v.push(Case {
        name: "sidecar with a startup probe that succeeded: the next starts",
        pod: pod(
            "Always",
            vec![sidecar("s", true), container("i2")],
            vec![container("a")],
        ),
        state: st,
        inputs: inp,
        want: sync(
            None,
            vec![step("s", keep()), step("i2", start(0))],
            false,
            vec![],
        ),
    });
    v.push(Case {
        name: "sidecar exited in a Never pod: restarted (its policy is Always)",
        pod: pod("Never", vec![sidecar("s", false)], vec![container("a")]),
        state: state(true, vec![(exited("s", 0), 0)]),
        inputs: inputs(),
        want: sync(None, vec![step("s", restart(1))], false, vec![]),
    });
    // Resize.
    let mut st = state(true, vec![(running("a"), 0)]);
    let mut inp = inputs();
    applied(&mut st, &mut inp);
    inp.desired_resources.insert(
        "a".into(),
        ContainerResources {
            cpu_shares: Some(512),
            ..Default::default()
        },
    );
    v.push(Case {
        name: "running with other resources than its spec's: resized in place",
        pod: pod("Always", vec![], vec![container("a")]),
        state: st,
        inputs: inp,
        want: sync(
            None,
            vec![],
            true,
            vec![step("a", ContainerAction::Keep { resize: true })],
        ),
    });
    // Probes.
    for (policy, kind, grace, name) in [
        (
            "Always",
            ProbeKind::Liveness,
            7,
            "failed liveness probe: killed with its grace, restarted",
        ),
        (
            "Never",
            ProbeKind::Liveness,
            30,
            "failed liveness probe, Never pod: killed, not restarted",
        ),
        (
            "OnFailure",
            ProbeKind::Startup,
            3,
            "failed startup probe: killed, restarted",
        ),
    ] {
        let mut st = state(true, vec![(running("a"), 2)]);
        let mut inp = inputs();
        applied(&mut st, &mut inp);
        inp.failed_probes.insert(
            "a".into(),
            FailedProbe {
                kind,
                grace_seconds: grace,
            },
        );
        v.push(Case {
            name,
            pod: pod(policy, vec![], vec![container("a")]),
            state: st,
            inputs: inp,
            want: sync(
                None,
                vec![],
                true,
                vec![step(
                    "a",
                    ContainerAction::Kill {
                        probe: kind,
                        grace: Duration::from_secs(grace),
                        restart: policy != "Never",
                        attempt: 3,
                    },
                )],
            ),
        });
    }
    // The pod as a whole.
    let mut p = pod("Always", vec![], vec![container("a")]);
    p.spec.as_mut().unwrap().active_deadline_seconds = Some(600);
    v.push(Case {
        name: "past activeDeadlineSeconds: the pod is killed",
        pod: p.clone(),
        state: state(true, vec![(running("a"), 0)]),
        inputs: inputs(),
        want: PodActions::KillPod(KillReason::DeadlineExceeded),
    });
    let mut st = state(true, vec![(running("a"), 0)]);
    st.failure = Some(("DeadlineExceeded".into(), String::new()));
    v.push(Case {
        name: "failed already: nothing",
        pod: p,
        state: st,
        inputs: inputs(),
        want: PodActions::Nothing,
    });
    v.push(Case {
        name: "every container done: the pod stops for good",
        pod: pod("OnFailure", vec![sidecar("s", false)], two()),
        state: state(
            true,
            vec![(running("s"), 0), (exited("a", 0), 0), (exited("b", 0), 0)],
        ),
        inputs: inputs(),
        want: PodActions::KillPod(KillReason::PodDone),
    });
    v
}

#[test]
fn compute_pod_actions_table() {
    let mut failures = Vec::new();
    for case in cases() {
        let got = compute_pod_actions(&case.pod, &case.state, &case.inputs);
        if got != case.want {
            failures.push(format!(
                "{}:\n  got  {got:?}\n  want {:?}",
                case.name, case.want
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_new_sandbox_plans_as_the_sandbox_it_will_be() {
    // The executor creates the sandbox, then takes the steps computed before it: a
    // sandbox id none of the instances runs in must plan the same.
    for case in cases() {
        let PodActions::Sync(SyncActions {
            create_sandbox: Some(_),
            containers,
        }) = compute_pod_actions(&case.pod, &case.state, &case.inputs)
        else {
            continue;
        };
        let later = compute_container_actions(&case.pod, &case.state, Some("sb-new"), &case.inputs);
        assert_eq!(containers, later, "{}", case.name);
    }
}

#[test]
fn init_container_done_after_a_start() {
    let rec = |cs: ContainerStatus| ContainerRecord {
        current: Some(cs),
        ..Default::default()
    };
    // A sidecar started in this sync lets the next start unless it has a startup
    // probe that has not succeeded; an init container must have succeeded.
    assert!(init_container_done(
        &sidecar("s", false),
        Some(&rec(running("s"))),
        false
    ));
    assert!(!init_container_done(
        &sidecar("s", true),
        Some(&rec(running("s"))),
        false
    ));
    assert!(init_container_done(
        &sidecar("s", true),
        Some(&rec(running("s"))),
        true
    ));
    assert!(init_container_done(
        &container("i"),
        Some(&rec(exited("i", 0))),
        false
    ));
    assert!(!init_container_done(
        &container("i"),
        Some(&rec(exited("i", 1))),
        false
    ));
    assert!(!init_container_done(
        &container("i"),
        Some(&rec(running("i"))),
        false
    ));
    assert!(!init_container_done(&container("i"), None, false));
}

#[test]
fn requeue_at_the_deadline() {
    let mut p = pod("Always", vec![], vec![container("a")]);
    p.spec.as_mut().unwrap().active_deadline_seconds = Some(900);
    let st = state(true, vec![]);
    assert_eq!(
        until_deadline(&p, &st, now()),
        Some(Duration::from_secs(300) + Duration::from_millis(10))
    );
    assert_eq!(
        until_deadline(&pod("Always", vec![], vec![]), &st, now()),
        None
    );
}
