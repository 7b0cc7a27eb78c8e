//! Container pods through a real (private) containerd, next to Wasm pods on one node.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use wasmlet_testkit::containerd::{Containerd, images::BUSYBOX_IMAGE};
use wasmlet_testkit::node::{NodeOptions, http_get, poll};

use crate::*;

/// A node whose default runtime is `containerd` (and with the given Wasm images).
pub(crate) fn cri_node(containerd: &Containerd, images: &[&str]) -> Fixture {
    start_with(
        NodeOptions {
            images: images.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
        .with_cri(containerd.address()),
    )
}

/// A one-container busybox pod running `sh -c <script>`.
pub(crate) fn busybox_pod(name: &str, restart_policy: &str, grace: u32, script: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  restartPolicy: {restart_policy}\n  terminationGracePeriodSeconds: {grace}\n  containers:\n  - name: main\n    image: {BUSYBOX_IMAGE}\n    imagePullPolicy: Never\n    command: [sh, -c, {script:?}]\n"
    )
}

/// The ids of a pod's sandbox and containers in containerd, by the kubelet's label.
pub(crate) fn pod_containers(containerd: &Containerd, pod: &Pod) -> BTreeSet<String> {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let filter = format!(r#"labels."io.kubernetes.pod.uid"=={uid}"#);
    containerd
        .ctr_k8s(["containers", "ls", "-q", filter.as_str()])
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn container_id(p: &Pod) -> String {
    container(p).container_id.unwrap_or_default()
}

#[test]
fn a_container_pod_and_a_wasm_pod_run_side_by_side() {
    let containerd = Containerd::start().expect("containerd starts");
    containerd.import_test_images().expect("test images import");
    let node = cri_node(&containerd, &["ticker"]);

    // No RuntimeClass: busybox goes to the default (CRI) runtime, the ticker to the
    // Wasm runtime because its image is a Wasm image in the node's store.
    node.write_manifest(
        "box.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: box}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    image: {BUSYBOX_IMAGE}\n    imagePullPolicy: Never\n    command: [sh, -c, 'echo hello from busybox; exec sleep 1000']\n"
        ),
    )
    .unwrap();
    node.write_manifest("tick.yaml", &manifest("tick", "ticker", "Always", ""))
        .unwrap();

    let boxed = node.wait_pod("box", LONG, is_running).unwrap();
    let tick = node.wait_pod("tick", LONG, is_running).unwrap();

    let c = container(&boxed);
    assert!(
        c.container_id
            .as_deref()
            .unwrap()
            .starts_with("containerd://"),
        "{c:?}"
    );
    assert!(
        container(&tick)
            .container_id
            .as_deref()
            .unwrap()
            .starts_with("wasm://")
    );
    let ip = boxed
        .status
        .as_ref()
        .unwrap()
        .pod_ip
        .clone()
        .expect("the container pod has an IP");
    assert!(
        containerd.layout().subnet.contains(&ip),
        "{ip} from the CNI bridge"
    );
    assert!(
        tick.status.as_ref().unwrap().pod_ip.is_none(),
        "a node without a CNI configuration runs Wasm pods on its own network"
    );

    let lines = poll(Duration::from_secs(10), || {
        let r = node.container_log(&boxed, "main", 0).ok()?;
        (!r.is_empty()).then_some(r)
    })
    .expect("the container's CRI log file");
    assert_eq!(lines[0].text, "hello from busybox");
    assert_eq!(lines[0].stream, "stdout");

    // Deleting the container pod stops it (SIGTERM, SIGKILL after the 2 s grace: sleep
    // as PID 1 ignores SIGTERM) and leaves the Wasm pod alone.
    let removed = std::time::Instant::now();
    node.remove_manifest("box.yaml").unwrap();
    node.wait_gone("box", Duration::from_secs(15)).unwrap();
    assert!(
        removed.elapsed() >= Duration::from_secs(2),
        "SIGKILL came only after the 2 s grace period: gone after {:?}",
        removed.elapsed()
    );
    let still = node.pod("tick").unwrap();
    assert!(is_running(&still));
    assert_eq!(container(&still).restart_count, 0);
    let leftover = containerd
        .ctr_k8s(["containers", "ls", "-q"])
        .unwrap_or_default();
    assert!(
        leftover.trim().is_empty(),
        "containers left in containerd: {leftover}"
    );
}

#[test]
fn container_exit_codes_restarts_and_termination_behave_like_the_kubelets() {
    let containerd = Containerd::start().expect("containerd starts");
    containerd.import_test_images().expect("test images import");
    let node = cri_node(&containerd, &[]);
    node.write_manifest(
        "fails.yaml",
        &busybox_pod("fails", "OnFailure", 2, "echo failing; exit 3"),
    )
    .unwrap();
    node.write_manifest("done.yaml", &busybox_pod("done", "Never", 2, "exit 0"))
        .unwrap();
    node.write_manifest(
        "polite.yaml",
        &busybox_pod(
            "polite",
            "Always",
            20,
            "trap 'echo got TERM; exit 0' TERM; echo ready; while true; do sleep 0.1; done",
        ),
    )
    .unwrap();

    // A Never pod whose container exits 0 succeeds.
    let done = node
        .wait_pod("done", LONG, |p| phase(p) == "Succeeded")
        .unwrap();
    assert_eq!(terminated_exit(&done), Some((0, "Completed".into())));

    // OnFailure with exit 3: restarted with back-off, the last termination kept.
    let fails = node
        .wait_pod("fails", LONG, |p| container(p).restart_count >= 2)
        .unwrap();
    let c = container(&fails);
    let last = c.last_state.unwrap().terminated.unwrap();
    assert_eq!(last.exit_code, 3);
    assert_eq!(last.reason.as_deref(), Some("Error"));
    assert_eq!(phase(&fails), "Running", "restarting pods stay Running");
    let fails = node
        .wait_pod("fails", LONG, |p| {
            waiting_reason(p).as_deref() == Some("CrashLoopBackOff")
        })
        .unwrap();
    let message = waiting_message(&fails);
    assert!(message.starts_with("back-off "), "{message}");
    // The current attempt's log (container GC keeps it; older ones may be gone).
    let attempt = container(&fails).restart_count as u32;
    let lines = node.container_log(&fails, "main", attempt).unwrap();
    assert_eq!(lines[0].text, "failing", "each attempt logs to <n>.log");

    // Termination: SIGTERM first; a container that handles it ends within its grace.
    let polite = node.wait_pod("polite", LONG, is_running).unwrap();
    poll(Duration::from_secs(10), || {
        let lines = node.container_log(&polite, "main", 0).ok()?;
        lines.iter().any(|l| l.text == "ready").then_some(())
    })
    .expect("the trap is installed");
    let started = std::time::Instant::now();
    node.remove_manifest("polite.yaml").unwrap();
    node.wait_gone("polite", Duration::from_secs(15)).unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "handled SIGTERM, not killed after the 20 s grace: {:?}",
        started.elapsed()
    );
    let lines = node.container_log(&polite, "main", 0).unwrap();
    assert!(
        lines.iter().any(|l| l.text == "got TERM"),
        "the container saw SIGTERM: {lines:?}"
    );
}

#[test]
fn a_restarted_agent_adopts_its_containers_instead_of_duplicating_them() {
    let containerd = Containerd::start().expect("containerd starts");
    containerd.import_test_images().expect("test images import");
    let mut node = cri_node(&containerd, &["ticker"]);
    node.write_manifest("tick.yaml", &manifest("tick", "ticker", "Always", ""))
        .unwrap();
    node.write_manifest(
        "keep.yaml",
        &busybox_pod("keep", "Always", 2, "echo up; exec sleep 1000"),
    )
    .unwrap();
    node.write_manifest("crash.yaml", &busybox_pod("crash", "Always", 2, "exit 1"))
        .unwrap();
    node.write_manifest(
        "orphan.yaml",
        &busybox_pod("orphan", "Always", 2, "exec sleep 1000"),
    )
    .unwrap();
    let keep = node.wait_pod("keep", LONG, is_running).unwrap();
    node.wait_pod("orphan", LONG, is_running).unwrap();
    let crash = node
        .wait_pod("crash", LONG, |p| container(p).restart_count >= 1)
        .unwrap();
    let restarts_before = container(&crash).restart_count;
    let keep_id = container_id(&keep);
    let tick = node.wait_pod("tick", LONG, is_running).unwrap();
    let tick_id = container_id(&tick);
    let sandboxes_before = node.sandbox_pids();
    assert_eq!(sandboxes_before.len(), 1, "one Wasm sandbox process");
    let orphan = node.pod("orphan").unwrap();
    let keep_objects = || pod_containers(&containerd, &keep);
    let keep_before = keep_objects();
    assert_eq!(
        keep_before.len(),
        2,
        "a sandbox and a container: {keep_before:?}"
    );

    // The agent dies hard; the orphan's manifest goes away while it is down.
    node.kill();
    node.remove_manifest("orphan.yaml").unwrap();
    node.restart().expect("the node starts again");

    let keep = node
        .wait_pod("keep", LONG, |p| {
            is_running(p) && container_id(p) == keep_id
        })
        .unwrap();
    assert_eq!(container(&keep).restart_count, 0, "adopted, not restarted");
    // The Wasm pod's sandbox process outlived the agent and was adopted too.
    let tick_after = node
        .wait_pod("tick", LONG, |p| {
            is_running(p) && container_id(p) == tick_id
        })
        .unwrap();
    assert_eq!(container(&tick_after).restart_count, 0);
    assert_eq!(
        node.sandbox_pids(),
        sandboxes_before,
        "the same sandbox process"
    );
    let ticks = node.container_log(&tick_after, "main", 0).unwrap().len();
    poll(Duration::from_secs(10), || {
        (node.container_log(&tick_after, "main", 0).ok()?.len() > ticks).then_some(())
    })
    .expect("the adopted ticker keeps logging");
    // The crashing pod's restart count continues from the runtime's annotation.
    let crash = node
        .wait_pod("crash", LONG, |p| !container_id(p).is_empty())
        .unwrap();
    assert!(
        container(&crash).restart_count >= restarts_before,
        "{} restarts before the kill, {} after",
        restarts_before,
        container(&crash).restart_count
    );
    // The orphan (no manifest any more) is removed once the file source has reported;
    // `keep` and `crash` keep exactly one sandbox each.
    let sandboxes = poll(LONG, || {
        let s = containerd
            .ctr_k8s([
                "containers",
                "ls",
                "-q",
                r#"labels."io.cri-containerd.kind"==sandbox"#,
            ])
            .ok()?;
        (s.lines().count() == 2).then_some(s)
    });
    assert!(
        sandboxes.is_some(),
        "one sandbox per pod after adoption; node log:\n{}",
        tail(&node.log())
    );
    assert!(pod_containers(&containerd, &orphan).is_empty());
    assert_eq!(
        keep_objects(),
        keep_before,
        "nothing of keep was created again"
    );
    let log = node.log();
    assert!(log.contains("adopted the pod's sandbox"), "{}", tail(&log));
}

#[test]
fn a_containerd_outage_leaves_wasm_pods_running_and_container_pods_recover() {
    let mut containerd = Containerd::start().expect("containerd starts");
    containerd.import_test_images().expect("test images import");
    let node = cri_node(&containerd, &["ticker"]);
    let ready = || http_get(node.healthz_port, "/readyz?verbose").unwrap();
    poll(LONG, || (ready().0 == 200).then_some(())).expect("the node becomes ready");
    node.write_manifest(
        "box.yaml",
        &busybox_pod("box", "Always", 2, "exec sleep 1000"),
    )
    .unwrap();
    node.write_manifest("tick.yaml", &manifest("tick", "ticker", "Always", ""))
        .unwrap();
    let boxed = node.wait_pod("box", LONG, is_running).unwrap();
    let tick = node.wait_pod("tick", LONG, is_running).unwrap();

    containerd.stop_daemon().expect("containerd stops");
    let (code, body) = poll(LONG, || {
        let r = ready();
        (r.0 == 500).then_some(r)
    })
    .expect("the node reports the runtime not ready");
    assert_eq!(code, 500);
    assert!(
        body.contains("[-]runtime failed: cri: container runtime is down"),
        "{body}"
    );
    assert!(body.contains("wasm: ready"), "{body}");
    assert_eq!(
        http_get(node.healthz_port, "/healthz").unwrap().0,
        200,
        "the agent itself is healthy"
    );
    // A container pod that arrives now waits for the runtime.
    node.write_manifest(
        "late.yaml",
        &busybox_pod("late", "Always", 2, "exec sleep 1000"),
    )
    .unwrap();
    let late = node
        .wait_pod("late", LONG, |p| {
            waiting_reason(p).as_deref() == Some("ContainerCreating")
        })
        .unwrap();
    assert!(!is_running(&late));
    // The Wasm pod keeps running and logging through the outage.
    let lines_before = node.container_log(&tick, "main", 0).unwrap().len();
    poll(Duration::from_secs(10), || {
        (node.container_log(&tick, "main", 0).ok()?.len() > lines_before).then_some(())
    })
    .expect("the ticker keeps ticking");
    let still = node.pod("tick").unwrap();
    assert!(is_running(&still));
    assert_eq!(container(&still).restart_count, 0);

    containerd.start_daemon().expect("containerd starts again");
    poll(LONG, || (ready().0 == 200).then_some(())).expect("the node is ready again");
    node.wait_pod("late", LONG, is_running).unwrap();
    let boxed_after = node.pod("box").unwrap();
    assert!(is_running(&boxed_after));
    assert_eq!(
        container_id(&boxed_after),
        container_id(&boxed),
        "the container kept running through the outage"
    );
    assert_eq!(container(&node.pod("tick").unwrap()).restart_count, 0);
}

#[test]
fn a_missing_image_backs_off_with_the_runtimes_message_and_others_run() {
    let containerd = Containerd::start().expect("containerd starts");
    containerd.import_test_images().expect("test images import");
    let node = cri_node(&containerd, &[]);
    node.write_manifest(
        "ghost.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: ghost}\nspec:\n  containers:\n  - name: main\n    image: 127.0.0.1:9/wasmlet-test/none:latest\n    command: [sh]\n",
    )
    .unwrap();
    node.write_manifest(
        "box.yaml",
        &busybox_pod("box", "Always", 2, "exec sleep 1000"),
    )
    .unwrap();
    let pulled = node
        .wait_pod("ghost", LONG, |p| {
            waiting_reason(p).as_deref() == Some("ErrImagePull")
        })
        .unwrap();
    let message = waiting_message(&pulled);
    assert!(
        message.contains("127.0.0.1:9/wasmlet-test/none:latest"),
        "the runtime's message names the image: {message}"
    );
    let backing_off = node
        .wait_pod("ghost", LONG, |p| {
            waiting_reason(p).as_deref() == Some("ImagePullBackOff")
        })
        .unwrap();
    let message = waiting_message(&backing_off);
    assert!(
        message.starts_with("Back-off pulling image \"127.0.0.1:9/wasmlet-test/none:latest\""),
        "{message}"
    );
    assert_eq!(phase(&backing_off), "Pending");
    node.wait_pod("box", LONG, is_running).unwrap();
}

fn tail(log: &str) -> String {
    wasmlet_testkit::node::tail(log, 30)
}

#[test]
fn the_pod_spec_reaches_the_container_through_cri() {
    let containerd = Containerd::start().expect("containerd starts");
    containerd.import_test_images().expect("test images import");
    let node = cri_node(&containerd, &[]);
    let script = "echo ids $(id -u) $(id -g) $(id -G); \
                  cat /etc/resolv.conf; \
                  echo port_start $(cat /proc/sys/net/ipv4/ip_unprivileged_port_start); \
                  echo cpu $(cat /sys/fs/cgroup/cpu/cpu.shares) $(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us)";
    node.write_manifest(
        "spec.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: spec}}\nspec:\n  restartPolicy: Never\n  dnsPolicy: None\n  dnsConfig:\n    nameservers: [10.0.0.53]\n    searches: [example.test]\n    options: [{{name: ndots, value: '2'}}]\n  securityContext:\n    runAsUser: 1000\n    runAsGroup: 3000\n    supplementalGroups: [4000]\n    sysctls: [{{name: net.ipv4.ip_unprivileged_port_start, value: '0'}}]\n  containers:\n  - name: main\n    image: {BUSYBOX_IMAGE}\n    imagePullPolicy: Never\n    command: [sh, -c, {script:?}]\n    resources:\n      requests: {{cpu: 250m}}\n      limits: {{cpu: 500m}}\n"
        ),
    )
    .unwrap();
    let pod = node
        .wait_pod("spec", LONG, |p| phase(p) == "Succeeded")
        .unwrap();
    let lines: Vec<String> = node
        .container_log(&pod, "main", 0)
        .unwrap()
        .into_iter()
        .map(|l| l.text)
        .collect();
    let has = |want: &str| {
        assert!(
            lines.iter().any(|l| l == want),
            "{want:?} not in the container's output: {lines:#?}"
        )
    };
    has("ids 1000 3000 3000 4000");
    has("nameserver 10.0.0.53");
    has("search example.test");
    has("options ndots:2");
    has("port_start 0");
    // requests.cpu 250m -> 256 shares; limits.cpu 500m -> 50 ms per 100 ms period.
    has("cpu 256 50000");

    // The kubelet's default masked and read-only paths, even for root.
    node.write_manifest(
        "masked.yaml",
        &busybox_pod(
            "masked",
            "Never",
            2,
            "echo firmware $(ls /sys/firmware | wc -l); echo timers $(wc -c < /proc/timer_list); \
             if echo 1 > /proc/sys/kernel/ns_last_pid; then echo sys writable; else echo sys read-only; fi",
        ),
    )
    .unwrap();
    let masked = node
        .wait_pod("masked", LONG, |p| phase(p) == "Succeeded")
        .unwrap();
    let lines: Vec<String> = node
        .container_log(&masked, "main", 0)
        .unwrap()
        .into_iter()
        .map(|l| l.text)
        .collect();
    for want in ["firmware 0", "timers 0", "sys read-only"] {
        assert!(
            lines.iter().any(|l| l == want),
            "{want:?} not in {lines:#?}"
        );
    }

    // runAsNonRoot with an image that names no user: refused before it is created.
    node.write_manifest(
        "nonroot.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: nonroot}}\nspec:\n  securityContext: {{runAsNonRoot: true}}\n  containers:\n  - name: main\n    image: {BUSYBOX_IMAGE}\n    imagePullPolicy: Never\n    command: [sh, -c, 'exit 0']\n"
        ),
    )
    .unwrap();
    let refused = node
        .wait_pod("nonroot", LONG, |p| {
            waiting_reason(p).as_deref() == Some("CreateContainerConfigError")
        })
        .unwrap();
    let message = waiting_message(&refused);
    assert!(message.contains("image will run as root"), "{message}");
}

#[test]
fn init_containers_sidecars_hooks_and_termination_messages_on_containerd() {
    let containerd = Containerd::start().expect("containerd starts");
    containerd.import_test_images().expect("test images import");
    let node = cri_node(&containerd, &[]);
    let yaml = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: cbox}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 5
  initContainers:
  - name: setup
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: Never
    command: [sh, -c, "echo set up"]
  - name: helper
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: Never
    restartPolicy: Always
    command: [sh, -c, "trap 'echo helper got TERM; exit 0' TERM; while true; do sleep 0.1; done"]
    lifecycle:
      preStop:
        exec: {{command: [sh, -c, "echo prestop ran > /proc/1/fd/1"]}}
  containers:
  - name: main
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: Never
    command: [sh, -c, "sleep 1; echo bye > /dev/termination-log; exit 1"]
    lifecycle:
      postStart:
        exec: {{command: [sh, -c, "true"]}}
"#
    );
    node.write_manifest("cbox.yaml", &yaml).unwrap();
    let pod = node
        .wait_pod("cbox", LONG, |p| phase(p) == "Failed")
        .unwrap();
    let status = pod.status.clone().unwrap();
    let inits = status.init_container_statuses.clone().unwrap();
    let setup = inits[0].state.clone().unwrap().terminated.unwrap();
    assert_eq!(setup.exit_code, 0);
    let main = container(&pod).state.unwrap().terminated.unwrap();
    assert_eq!(main.exit_code, 1);
    assert_eq!(
        main.message.as_deref(),
        Some("bye\n"),
        "the termination message file"
    );
    let helper = wasmlet_testkit::node::poll(Duration::from_secs(20), || {
        let p = node.pod("cbox")?;
        let s = p.status?.init_container_statuses?[1].clone();
        s.state?.terminated
    })
    .expect("the sidecar is stopped once the main container finished");
    assert!(setup.finished_at <= main.started_at, "init before main");
    assert!(main.finished_at <= helper.finished_at, "sidecar stops last");
    let helper_log: Vec<String> = node
        .container_log(&pod, "helper", 0)
        .unwrap()
        .into_iter()
        .map(|r| r.text)
        .collect();
    assert!(
        helper_log.contains(&"prestop ran".to_owned()),
        "{helper_log:?}"
    );
    assert!(
        helper_log.contains(&"helper got TERM".to_owned()),
        "{helper_log:?}"
    );
}

/// A manifest of `examples/manifests`.
fn example_manifest(path: &str) -> String {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/manifests")
        .join(path);
    let yaml = std::fs::read_to_string(&file).unwrap();
    assert!(
        yaml.contains(BUSYBOX_IMAGE),
        "{} uses the test image",
        file.display()
    );
    yaml
}

fn init_state(p: &Pod, name: &str) -> k8s_openapi::api::core::v1::ContainerState {
    p.status
        .as_ref()
        .and_then(|s| s.init_container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == name))
        .and_then(|c| c.state.clone())
        .unwrap_or_default()
}

#[test]
fn the_documentations_sidecar_examples_behave_as_documented() {
    let containerd = Containerd::start().expect("containerd starts");
    containerd.import_test_images().expect("test images import");
    let node = cri_node(&containerd, &[]);

    // The Deployment's pod: the sidecar starts first and ships the app's log lines,
    // read from the emptyDir both mount, for as long as the pod runs.
    node.write_manifest(
        "myapp.yaml",
        &example_manifest("sidecar/app-with-logshipper.yaml"),
    )
    .unwrap();
    let pod = node.wait_pod("myapp", LONG, is_running).unwrap();
    let shipper = init_state(&pod, "logshipper")
        .running
        .expect("the sidecar runs");
    let app = container(&pod)
        .state
        .unwrap()
        .running
        .expect("the app runs");
    assert!(
        shipper.started_at <= app.started_at,
        "the sidecar starts first"
    );
    assert_eq!(condition(&pod, "Initialized").as_deref(), Some("True"));
    let shipped = poll(Duration::from_secs(20), || {
        let lines = node.container_log(&pod, "logshipper", 0).ok()?;
        (lines.iter().filter(|r| r.text == "logging").count() >= 2).then_some(lines.len())
    });
    assert!(shipped.is_some(), "the sidecar ships the app's lines");
    let pod = node.pod("myapp").unwrap();
    assert!(
        init_state(&pod, "logshipper").running.is_some(),
        "and keeps running"
    );

    // The Job's pod: the sidecar runs on, but the pod completes once the job is done.
    node.write_manifest(
        "myjob.yaml",
        &example_manifest("sidecar/job-with-logshipper.yaml"),
    )
    .unwrap();
    let pod = node
        .wait_pod("myjob", LONG, |p| phase(p) == "Succeeded")
        .unwrap();
    let job = container(&pod).state.unwrap().terminated.unwrap();
    assert_eq!(job.exit_code, 0);
    let shipper = poll(Duration::from_secs(20), || {
        init_state(&node.pod("myjob")?, "logshipper").terminated
    })
    .expect("the sidecar is stopped once the job is done");
    assert!(job.finished_at <= shipper.finished_at);
    let data = node
        .dir()
        .join("root/pods")
        .join(pod.metadata.uid.clone().unwrap())
        .join("volumes/kubernetes.io~empty-dir/data/logs.txt");
    assert_eq!(std::fs::read_to_string(&data).unwrap(), "logging\n");

    node.remove_manifest("myapp.yaml").unwrap();
    node.wait_gone("myapp", LONG).unwrap();
}

/// The attempts whose log files a pod's container has, in order.
fn logged_attempts(node: &Fixture, pod: &Pod, container: &str) -> Vec<u32> {
    let dir = node.logs.join(format!(
        "{}_{}_{}/{container}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or(""),
        pod.metadata.uid.as_deref().unwrap_or("")
    ));
    let mut attempts: Vec<u32> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_suffix(".log")?.parse().ok()
        })
        .collect();
    attempts.sort();
    attempts
}

#[test]
fn container_gc_keeps_the_current_and_the_last_dead_instance_of_each_container() {
    let containerd = Containerd::start().expect("containerd starts");
    containerd.import_test_images().expect("test images import");
    let node = cri_node(&containerd, &["hello"]);
    node.write_manifest(
        "crashbox.yaml",
        &busybox_pod("crashbox", "Always", 1, "echo attempt; exit 1"),
    )
    .unwrap();
    node.write_manifest(
        "crashwasm.yaml",
        &manifest(
            "crashwasm",
            "hello",
            "Always",
            "    env:\n    - name: EXIT_CODE\n      value: \"1\"\n",
        ),
    )
    .unwrap();
    for name in ["crashbox", "crashwasm"] {
        node.wait_pod(name, LONG, |p| container(p).restart_count >= 4)
            .unwrap();
    }
    // Between restarts (2 s apart at most) and housekeeping passes (every second),
    // each container has its current instance and the last dead one, nothing older:
    // not in containerd, and no log file of an older attempt.
    let settled = poll(LONG, || {
        let boxed = node.pod("crashbox")?;
        let wasm = node.pod("crashwasm")?;
        let in_containerd = pod_containers(&containerd, &boxed).len();
        let box_logs = logged_attempts(&node, &boxed, "main");
        let wasm_logs = logged_attempts(&node, &wasm, "main");
        (in_containerd <= 3 && box_logs.len() <= 2 && wasm_logs.len() <= 2).then_some((
            in_containerd,
            box_logs,
            wasm_logs,
        ))
    });
    let (in_containerd, box_logs, wasm_logs) =
        settled.expect("container GC kept more than one dead instance per container");
    eprintln!(
        "containerd holds {in_containerd} (sandbox included); logs of attempts {box_logs:?} (busybox), {wasm_logs:?} (Wasm)"
    );
    for logs in [&box_logs, &wasm_logs] {
        assert!(
            logs.first().is_some_and(|a| *a >= 3),
            "the logs of the first attempts went with their containers: {logs:?}"
        );
    }
    // The status still shows the last termination.
    for name in ["crashbox", "crashwasm"] {
        let last = container(&node.pod(name).unwrap())
            .last_state
            .and_then(|s| s.terminated)
            .unwrap_or_else(|| panic!("{name} shows no last termination"));
        assert_eq!(last.exit_code, 1, "{name}");
    }
}
