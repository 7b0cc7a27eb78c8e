//! Graceful node shutdown against a private D-Bus system bus on which the test plays
//! systemd-logind: the node holds a delay inhibitor, and on `PrepareForShutdown(true)`
//! it says it is shutting down, refuses new pods, stops the regular pods and then the
//! critical ones, each group within its budget, and releases the inhibitor.
//!
//! `shutdownGracePeriod: 10s` with `shutdownGracePeriodCriticalPods: 4s`: regular
//! pods get 6 s, critical ones 4 s after them. Every pod here ignores the polite stop
//! (busybox traps SIGTERM; the Wasm guest "cleans up" for a minute) and asks for 30 s,
//! so each is cut short at its group's budget, or at its own smaller grace.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use serde_json::json;
use wasmlet_testkit::containerd::{Containerd, images::BUSYBOX_IMAGE};
use wasmlet_testkit::dbus::{FakeLogind, PrivateBus};
use wasmlet_testkit::node::{NodeOptions, poll, tail};

use crate::cluster::*;
use crate::*;

/// A busybox pod on the node that ignores SIGTERM, asking for `grace` seconds.
fn stubborn(name: &str, grace: i64, priority: Option<i32>) -> Pod {
    let mut spec = json!({
        "nodeName": NODE,
        "terminationGracePeriodSeconds": grace,
        "containers": [{
            "name": "main",
            "image": BUSYBOX_IMAGE,
            "imagePullPolicy": "Never",
            "command": ["sh", "-c", "trap '' TERM; sleep 3600"],
        }],
    });
    if let Some(p) = priority {
        spec["priority"] = json!(p);
        spec["priorityClassName"] = json!("system-node-critical");
    }
    crate::cluster::pod_with_spec(name, spec)
}

fn ready_condition(c: &Cluster) -> Option<(String, String)> {
    let node = c.api.get::<Node>(None, NODE)?;
    node.status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.status, c.message.unwrap_or_default()))
}

#[test]
fn prepare_for_shutdown_stops_regular_then_critical_pods_within_their_budgets() {
    let containerd = Containerd::start().expect("containerd starts");
    containerd.import_test_images().expect("test images import");
    let bus = PrivateBus::start().expect("a private system bus");
    let logind = FakeLogind::start(&bus, Duration::from_secs(30)).expect("the test's logind");
    let c = cluster();
    let mut opts = node_options(&c, &["graceful"]).with_cri(containerd.address());
    opts.kubelet_config = "shutdownGracePeriod: 10s\n\
                           shutdownGracePeriodCriticalPods: 4s\n"
        .into();
    opts.env = vec![("DBUS_SYSTEM_BUS_ADDRESS".into(), bus.address())];
    let node = start_with(opts);
    wait("the Node to be Ready", LONG, || {
        c.api.get::<Node>(None, NODE).filter(node_ready)
    });

    // The inhibitor: a delay lock on shutdown, taken by the node.
    wait("the node's inhibitor", LONG, || {
        (logind.held() == 1).then_some(())
    });
    logind.inhibitors(|all| {
        let i = &all[0];
        assert_eq!(
            (i.what.as_str(), i.mode.as_str(), i.who.as_str()),
            ("shutdown", "delay", "wasmlet"),
            "{}",
            i.why
        );
    });

    let mut wasm = api_pod("wasm-regular", "graceful");
    wasm.spec.as_mut().unwrap().termination_grace_period_seconds = Some(30);
    wasm.spec.as_mut().unwrap().containers[0].env =
        Some(vec![k8s_openapi::api::core::v1::EnvVar {
            name: "CLEANUP_MS".into(),
            value: Some("60000".into()),
            ..Default::default()
        }]);
    c.api.create(&wasm).unwrap();
    c.api
        .create(&stubborn("busybox-regular", 30, None))
        .unwrap();
    // Its own grace (1 s) is below its group's budget: it gets its own.
    c.api.create(&stubborn("quick", 1, None)).unwrap();
    c.api
        .create(&stubborn("critical", 30, Some(2_000_001_000)))
        .unwrap();
    for name in ["wasm-regular", "busybox-regular", "quick", "critical"] {
        wait(&format!("{name} to run"), LONG, || {
            get(&c, name).filter(|p| phase(p) == "Running")
        });
    }

    let announced = Instant::now();
    logind.prepare_for_shutdown(true).unwrap();

    // The node says why it is not ready, and refuses a new pod.
    let (_, message) = wait("the Node to be not ready", LONG, || {
        ready_condition(&c).filter(|(s, _)| s == "False")
    });
    assert_eq!(message, "node is shutting down");
    c.api.create(&stubborn("late", 1, None)).unwrap();
    let late = wait("the late pod to be refused", LONG, || {
        get(&c, "late").filter(|p| phase(p) == "Failed")
    });
    let late_status = late.status.unwrap();
    assert_eq!(late_status.reason.as_deref(), Some("NodeShutdown"));
    assert_eq!(
        late_status.message.as_deref(),
        Some("Pod was rejected as the node is shutting down.")
    );

    // Regular pods first, the critical one after them; each when its budget ends.
    let mut failed_at: std::collections::BTreeMap<&str, Duration> = Default::default();
    let names = ["wasm-regular", "busybox-regular", "quick", "critical"];
    let all_failed = poll(Duration::from_secs(60), || {
        for name in names {
            if failed_at.contains_key(name) {
                continue;
            }
            if get(&c, name).is_some_and(|p| phase(&p) == "Failed") {
                failed_at.insert(name, announced.elapsed());
            }
        }
        (failed_at.len() == names.len()).then_some(())
    });
    assert!(
        all_failed.is_some(),
        "not all pods were stopped: {failed_at:?}\n{}",
        tail(&node.log(), 60)
    );
    eprintln!("stopped after the announcement: {failed_at:?}");
    let secs = Duration::from_secs;
    assert!(failed_at["quick"] < secs(5), "{failed_at:?}");
    for regular in ["wasm-regular", "busybox-regular"] {
        assert!(
            failed_at[regular] >= secs(5) && failed_at[regular] < secs(20),
            "{regular} stopped at its group's 6 s budget, not its own 30 s: {failed_at:?}"
        );
    }
    let regulars_done = failed_at["wasm-regular"].max(failed_at["busybox-regular"]);
    assert!(
        failed_at["critical"] >= regulars_done + secs(2),
        "the critical pod is stopped after the regular ones, within its 4 s: {failed_at:?}"
    );
    for name in names {
        let p = get(&c, name).unwrap();
        let s = p.status.clone().unwrap();
        assert_eq!(s.reason.as_deref(), Some("Terminated"), "{name}");
        assert_eq!(
            s.message.as_deref(),
            Some("Pod was terminated in response to imminent node shutdown."),
            "{name}"
        );
        let disruption = s
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "DisruptionTarget")
            .unwrap_or_else(|| panic!("{name} has no DisruptionTarget condition"));
        assert_eq!(disruption.status, "True");
        assert_eq!(disruption.reason.as_deref(), Some("TerminationByKubelet"));
    }
    let wasm_exit = get(&c, "wasm-regular")
        .and_then(|p| terminated_exit(&p))
        .map(|(code, _)| code);
    assert_eq!(wasm_exit, Some(137), "the Wasm guest was cut short");

    // The inhibitor is released once every group is done, and not before: the
    // node's own view then has the critical pod stopped.
    wait("the inhibitor to be released", LONG, || {
        (logind.held() == 0).then_some(())
    });
    let critical = node
        .pods()
        .unwrap()
        .into_iter()
        .find(|p| p.metadata.name.as_deref() == Some("critical"))
        .expect("the node still knows the critical pod");
    assert_eq!(phase(&critical), "Failed");
    let state = std::fs::read_to_string(node.root.join("graceful_node_shutdown_state"))
        .expect("the shutdown state file");
    let state: serde_json::Value = serde_json::from_str(&state).unwrap();
    assert!(
        state["startTime"]
            .as_str()
            .is_some_and(|t| t.starts_with("20"))
            && state["endTime"]
                .as_str()
                .is_some_and(|t| t.starts_with("20")),
        "{state}"
    );
    let events = c.api.list::<Event>(Some("default"));
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("Shutdown")
                && e.involved_object.kind.as_deref() == Some("Node")
                && e.message.as_deref() == Some("Shutdown manager detected shutdown event")),
        "no Shutdown event on the Node: {events:?}"
    );

    // A cancelled shutdown: ready again, a new inhibitor, new pods run.
    logind.prepare_for_shutdown(false).unwrap();
    wait("the Node to be Ready again", LONG, || {
        c.api.get::<Node>(None, NODE).filter(node_ready)
    });
    wait("a new inhibitor", LONG, || {
        (logind.held() == 1).then_some(())
    });
    c.api.create(&stubborn("after-cancel", 1, None)).unwrap();
    wait("a pod to run after the cancellation", LONG, || {
        get(&c, "after-cancel").filter(|p| phase(p) == "Running")
    });
}

#[test]
fn without_logind_on_the_bus_the_node_says_so_and_runs_on() {
    let bus = PrivateBus::start().expect("a private system bus");
    let mut opts = NodeOptions {
        images: vec!["ticker".into()],
        kubelet_config: "shutdownGracePeriod: 10s\n".into(),
        ..Default::default()
    };
    opts.env = vec![("DBUS_SYSTEM_BUS_ADDRESS".into(), bus.address())];
    let node = start_with(opts);
    let said = poll(LONG, || {
        let log = node.log();
        log.lines()
            .find(|l| l.contains("graceful node shutdown is configured, but"))
            .map(str::to_owned)
    })
    .unwrap_or_else(|| panic!("the node did not say logind is missing:\n{}", node.log()));
    assert!(
        said.contains("systemd-logind is not on the system bus"),
        "{said}"
    );
    node.write_manifest("ticker.yaml", &manifest("ticker", "ticker", "Always", ""))
        .unwrap();
    node.wait_pod("ticker", LONG, is_running)
        .expect("a pod runs");
}
