//! A guest that traps, exhausts memory or loses its sandbox process takes down only
//! its own pod; the agent and the other pods keep running.

use std::time::Duration;

use wasmlet_testkit::node::poll;

use crate::*;

#[test]
fn a_guest_that_exhausts_memory_or_aborts_ends_only_itself() {
    let mut node = start(&["ticker", "memhog", "crasher"]);
    node.write_manifest(
        "bystander.yaml",
        &manifest("bystander", "ticker", "Always", ""),
    )
    .unwrap();
    let bystander = node.wait_pod("bystander", LONG, is_running).unwrap();

    let hog = "    env:\n    - name: MIB\n      value: \"200\"\n    resources:\n      limits:\n        memory: 64Mi\n";
    node.write_manifest("hog.yaml", &manifest("hog", "memhog", "Never", hog))
        .unwrap();
    node.write_manifest("crash.yaml", &manifest("crash", "crasher", "Never", ""))
        .unwrap();

    let hog = node
        .wait_pod("hog", LONG, |p| phase(p) == "Failed")
        .unwrap();
    assert_eq!(terminated_exit(&hog), Some((137, "OOMKilled".into())));
    let crash = node
        .wait_pod("crash", LONG, |p| phase(p) == "Failed")
        .unwrap();
    let (code, _) = terminated_exit(&crash).unwrap();
    assert_eq!(code, 134, "a trap ends the container like an abort");
    let message = container(&crash)
        .state
        .unwrap()
        .terminated
        .unwrap()
        .message
        .unwrap_or_default();
    assert!(
        message.contains("unreachable"),
        "the trap is named: {message}"
    );

    assert!(node.is_running());
    let still = node.pod("bystander").unwrap();
    assert_eq!(still.metadata.uid, bystander.metadata.uid);
    assert!(is_running(&still));
    assert_eq!(container(&still).restart_count, 0);
}

#[test]
fn a_killed_sandbox_process_fails_its_pod_only_and_the_pod_restarts() {
    let mut node = start(&["ticker"]);
    node.write_manifest("a.yaml", &manifest("a", "ticker", "Always", ""))
        .unwrap();
    node.write_manifest("b.yaml", &manifest("b", "ticker", "Always", ""))
        .unwrap();
    node.wait_pod("a", LONG, is_running).unwrap();
    node.wait_pod("b", LONG, is_running).unwrap();
    let sandboxes = node.sandbox_pids();
    assert_eq!(sandboxes.len(), 2);

    // Find a's sandbox: the one whose command line carries a's UID.
    let a = node.pod("a").unwrap();
    let a_uid = a.metadata.uid.clone().unwrap();
    let victim = *sandboxes
        .iter()
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(&a_uid))
                .unwrap_or(false)
        })
        .expect("a's sandbox");
    // As the kernel's OOM killer would.
    std::process::Command::new("kill")
        .args(["-KILL", &victim.to_string()])
        .status()
        .unwrap();

    let restarted = node
        .wait_pod("a", LONG, |p| {
            container(p).restart_count == 1 && is_running(p)
        })
        .unwrap();
    let last = container(&restarted)
        .last_state
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(last.exit_code, 137);
    assert!(node.is_running(), "the agent survives");
    let b = node.pod("b").unwrap();
    assert!(is_running(&b));
    assert_eq!(container(&b).restart_count, 0, "the other pod is untouched");
    poll(Duration::from_secs(10), || {
        (node.sandbox_pids().len() == 2).then_some(())
    })
    .expect("a new sandbox replaced the killed one");
    assert!(!node.sandbox_pids().contains(&victim));
}

/// The value of `field` in `/proc/<pid>/status`.
fn proc_status(pid: u32, field: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| Some(l.strip_prefix(field)?.strip_prefix(':')?.trim().to_owned()))
        .unwrap_or_default()
}

/// The sandbox process of `pod`: the one whose command line carries its UID.
fn sandbox_of(
    node: &wasmlet_testkit::node::TestNode,
    pod: &k8s_openapi::api::core::v1::Pod,
) -> u32 {
    let uid = pod.metadata.uid.clone().unwrap();
    *node
        .sandbox_pids()
        .iter()
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&uid))
        })
        .expect("the pod's sandbox")
}

#[test]
fn a_wasm_pods_run_as_user_is_the_user_of_its_sandbox_process() {
    let mut node = start(&["ticker"]);
    // As a restricted namespace asks: the container's own non-root user.
    let restricted = "    securityContext:\n      runAsUser: 1000\n      runAsGroup: 3000\n      runAsNonRoot: true\n      allowPrivilegeEscalation: false\n      capabilities:\n        drop: [ALL]\n";
    node.write_manifest(
        "user.yaml",
        &manifest("user", "ticker", "Always", restricted),
    )
    .unwrap();
    let pod = node.wait_pod("user", LONG, is_running).unwrap();
    let sandbox = sandbox_of(&node, &pod);
    assert_eq!(proc_status(sandbox, "Uid"), "1000\t1000\t1000\t1000");
    assert_eq!(proc_status(sandbox, "Gid"), "3000\t3000\t3000\t3000");
    assert_eq!(proc_status(sandbox, "CapEff"), "0000000000000000");
    // The guest writes its log as that user.
    poll(LONG, || {
        let records = node.container_log(&pod, "main", 0).ok()?;
        (records.len() >= 2).then_some(())
    })
    .expect("the ticker's log");

    // runAsNonRoot with no user: a Wasm image names none to take, so nobody, not root.
    let non_root = "    securityContext:\n      runAsNonRoot: true\n";
    node.write_manifest(
        "nobody.yaml",
        &manifest("nobody", "ticker", "Always", non_root),
    )
    .unwrap();
    let nobody = node.wait_pod("nobody", LONG, is_running).unwrap();
    let sandbox = sandbox_of(&node, &nobody);
    assert_eq!(proc_status(sandbox, "Uid"), "65534\t65534\t65534\t65534");
    assert_eq!(proc_status(sandbox, "Gid"), "65534\t65534\t65534\t65534");

    // Two containers that ask for two users cannot share one sandbox process, which
    // then runs as neither: each is refused with the reason.
    let mixed = format!(
        "{}  - name: other\n    image: {}\n    imagePullPolicy: IfNotPresent\n    securityContext:\n      runAsUser: 2000\n",
        manifest("mixed", "ticker", "Always", restricted),
        image("ticker")
    );
    node.write_manifest("mixed.yaml", &mixed).unwrap();
    let mixed = node
        .wait_pod("mixed", LONG, |p| {
            p.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.name == "other"))
                .and_then(|c| c.state.as_ref()?.waiting.as_ref()?.message.clone())
                .is_some_and(|m| m.contains("runAsUser 2000"))
        })
        .unwrap();
    let statuses = mixed.status.unwrap().container_statuses.unwrap();
    for (name, user) in [("main", "runAsUser 1000"), ("other", "runAsUser 2000")] {
        let status = statuses.iter().find(|c| c.name == name).unwrap();
        let waiting = status.state.clone().unwrap().waiting.unwrap();
        assert_eq!(
            waiting.reason.as_deref(),
            Some("CreateContainerError"),
            "{waiting:?}"
        );
        assert!(waiting.message.unwrap_or_default().contains(user), "{name}");
    }
    assert!(node.is_running());
}
