//! Hostile conditions, held for minutes: the node's filesystem full; the API server
//! flapping; the node killed again and again while a hundred pods of both kinds start;
//! containerd killed again and again while pods start.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use wasmlet_testkit::containerd::Containerd;
use wasmlet_testkit::node::{TestNode, poll};

use crate::cluster::{NODE, api_pod, cluster, here, node_options, node_ready, wait};
use crate::cri::{busybox_pod, cri_node, pod_containers};
use crate::eviction::{LoopFs, condition_of};
use crate::*;

/// Each pod's container id and restart count as the node reports them; `None` while
/// one of them is not known to it.
fn containers_of(node: &TestNode, names: &[&str]) -> Option<BTreeMap<String, (String, i32)>> {
    names
        .iter()
        .map(|name| {
            let c = container(&here(node, name)?);
            Some((
                (*name).to_owned(),
                (c.container_id.unwrap_or_default(), c.restart_count),
            ))
        })
        .collect()
}

#[test]
fn an_api_server_flapping_for_two_minutes_restarts_nothing_and_statuses_converge() {
    let c = cluster();
    let node = start_with(node_options(&c, &["ticker"]));
    node.write_manifest("static.yaml", &manifest("static", "ticker", "Always", ""))
        .unwrap();
    for name in ["web", "doomed"] {
        c.api.create(&api_pod(name, "ticker")).unwrap();
    }
    for name in ["web", "doomed", "static-e2e"] {
        wait(&format!("{name} to be Running"), LONG, || {
            c.api.get::<Pod>(Some("default"), name).filter(is_running)
        });
    }
    let pid = node.pid();
    let before = containers_of(&node, &["web", "static-e2e"]).expect("both pods are known");

    // Down 3 s, up 2 s, for two minutes: long enough for every client of the node
    // (the pod watch, status updates, the lease, node status, mirror pods, events) to
    // fail and reconnect many times, each time mid-way through something.
    let flapping = Instant::now();
    let mut changed = false;
    let mut cycles = 0;
    while flapping.elapsed() < Duration::from_secs(120) {
        c.api.faults().set_down(true);
        std::thread::sleep(Duration::from_secs(3)); // the fault's length, not a wait
        c.api.faults().set_down(false);
        cycles += 1;
        // Halfway, while up: a pod comes and a pod goes, to be seen between outages.
        if !changed && flapping.elapsed() > Duration::from_secs(60) {
            c.api.create(&api_pod("late", "ticker")).unwrap();
            c.api
                .delete::<Pod>(Some("default"), "doomed", None)
                .unwrap();
            changed = true;
        }
        // The pods keep running, with no restart, the whole time.
        for name in ["web", "static-e2e"] {
            let p = here(&node, name).unwrap_or_else(|| panic!("{name} is still known"));
            assert!(is_running(&p), "{name} runs while the API server flaps");
        }
        std::thread::sleep(Duration::from_secs(2)); // the up phase's length
    }
    assert!(cycles >= 20, "{cycles} outages");

    // After: the same process, the same containers, nothing restarted; the late pod
    // runs, the deleted one is gone; the API converges on the node's view.
    assert_eq!(node.pid(), pid, "the same node process");
    assert_eq!(
        containers_of(&node, &["web", "static-e2e"]),
        Some(before.clone())
    );
    wait("the late pod to be Running in the API", LONG, || {
        c.api.get::<Pod>(Some("default"), "late").filter(is_running)
    });
    wait("the deleted pod to be gone from the node", LONG, || {
        here(&node, "doomed").is_none().then_some(())
    });
    wait("the deleted pod to be gone from the API", LONG, || {
        c.api
            .get::<Pod>(Some("default"), "doomed")
            .is_none()
            .then_some(())
    });
    wait("the node to be Ready", LONG, || {
        c.api.get::<Node>(None, NODE).filter(node_ready)
    });
    for name in ["web", "static-e2e", "late"] {
        wait(&format!("{name} to be Ready in the API"), LONG, || {
            c.api.get::<Pod>(Some("default"), name).filter(|p| {
                condition(p, "Ready").as_deref() == Some("True") && container(p).restart_count == 0
            })
        });
    }
}

#[test]
fn a_node_killed_every_few_seconds_during_a_rollout_of_a_hundred_pods_runs_each_exactly_once() {
    let containerd = Containerd::start().expect("containerd starts");
    containerd.import_test_images().expect("test images import");
    let mut node = cri_node(&containerd, &["ticker"]);
    const EACH: usize = 50;
    let wasm = |i: usize| format!("wasm-{i}");
    let boxed = |i: usize| format!("box-{i}");

    // The rollout: ten manifests of each kind a second; the node is killed (SIGKILL, no
    // chance to clean up) every three seconds, and started again at once, throughout.
    let kill_every = Duration::from_secs(3);
    let mut next_kill = Instant::now() + kill_every;
    let mut kills = 0;
    let mut written = 0;
    while written < EACH || kills < 10 {
        for i in written..(written + 10).min(EACH) {
            node.write_manifest(
                &format!("{}.yaml", wasm(i)),
                &manifest(&wasm(i), "ticker", "Always", ""),
            )
            .unwrap();
            node.write_manifest(
                &format!("{}.yaml", boxed(i)),
                &busybox_pod(&boxed(i), "Always", 2, "exec sleep 1000"),
            )
            .unwrap();
        }
        written = (written + 10).min(EACH);
        std::thread::sleep(Duration::from_secs(1)); // the rollout's pace
        if Instant::now() >= next_kill {
            node.kill();
            node.restart().expect("the node starts again");
            kills += 1;
            next_kill = Instant::now() + kill_every;
        }
    }

    // Every pod runs, once: one sandbox process per Wasm pod, one pod sandbox and one
    // running container per busybox pod. (A container the node created but was killed
    // before starting is, as for the kubelet, replaced by a new one and counts as a
    // restart: restart counts say how many attempts a pod took, and are printed.)
    let names: Vec<String> = (0..EACH).flat_map(|i| [wasm(i), boxed(i)]).collect();
    let settled = poll(Duration::from_secs(180), || {
        let pods = node.pods().ok()?;
        let running = pods.iter().filter(|p| is_running(p)).count();
        (running == 2 * EACH).then_some(pods)
    });
    let pods = settled.unwrap_or_else(|| {
        let pods = node.pods().unwrap_or_default();
        let waiting: Vec<_> = pods
            .iter()
            .filter(|p| !is_running(p))
            .map(|p| (p.metadata.name.clone(), p.status.clone()))
            .collect();
        panic!(
            "after {kills} kills, {} of {} pods run; the others: {waiting:#?}",
            pods.len() - waiting.len(),
            2 * EACH
        )
    });
    assert_eq!(pods.len(), 2 * EACH, "no pod more, none fewer");
    let restarted: Vec<(String, i32)> = pods
        .iter()
        .map(|p| {
            (
                p.metadata.name.clone().unwrap_or_default(),
                container(p).restart_count,
            )
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    eprintln!("pods that took more than one attempt: {restarted:?}");
    for name in &names {
        assert!(node.pod(name).is_some(), "{name} is known to the node");
    }

    let sandboxes = node.sandbox_pids();
    let uids: BTreeSet<String> = sandboxes
        .iter()
        .filter_map(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args: Vec<String> = raw
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            let at = args.iter().position(|a| a == "--pod-uid")?;
            args.get(at + 1).cloned()
        })
        .collect();
    assert_eq!(
        sandboxes.len(),
        EACH,
        "one sandbox process per Wasm pod: {sandboxes:?}"
    );
    assert_eq!(uids.len(), EACH, "each for a different pod");

    // Each busybox pod's containerd objects: its running sandbox and container are
    // two running tasks, and there are no others.
    let (tasks, running) = running_tasks(&containerd);
    assert_eq!(
        running.len(),
        2 * EACH,
        "a task per sandbox and container:\n{tasks}"
    );
    each_box_runs_a_sandbox_and_a_container(&containerd, &pods, &running);
    eprintln!("{kills} kills during the rollout");
}

/// containerd SIGKILLed every three seconds, eight times, while 20 busybox pods start
/// beside 5 running Wasm pods: the Wasm pods are untouched (same instance, no
/// restart), and every busybox pod ends up running, with one running pod sandbox and
/// one running container. (Creates containerd carried out after the node lost their
/// reply hold their container's name; the node frees it.)
#[test]
fn containerd_killed_in_a_loop_while_pods_start_leaves_every_pod_running_once() {
    let mut containerd = Containerd::start().expect("containerd starts");
    containerd.import_test_images().expect("test images import");
    let node = cri_node(&containerd, &["ticker"]);
    const BOXES: usize = 20;
    const WASM: usize = 5;
    let wasm = |i: usize| format!("wasm-{i}");
    let boxed = |i: usize| format!("box-{i}");
    for i in 0..WASM {
        node.write_manifest(
            &format!("{}.yaml", wasm(i)),
            &manifest(&wasm(i), "ticker", "Always", ""),
        )
        .unwrap();
    }
    // Each Wasm pod's running container and restart count.
    let wasm_instances = || -> Option<BTreeMap<String, (String, i32)>> {
        (0..WASM)
            .map(|i| {
                let p = node.pod(&wasm(i)).filter(is_running)?;
                let c = container(&p);
                Some((wasm(i), (c.container_id?, c.restart_count)))
            })
            .collect()
    };
    let before = poll(Duration::from_secs(60), wasm_instances).expect("the Wasm pods run");

    for i in 0..BOXES {
        node.write_manifest(
            &format!("{}.yaml", boxed(i)),
            &busybox_pod(&boxed(i), "Always", 2, "exec sleep 1000"),
        )
        .unwrap();
    }
    for kill in 0..8u64 {
        // The fault's pace: 1, 2, 3, 1, … s, so kills land at every stage of a start.
        std::thread::sleep(Duration::from_secs(1 + kill % 3));
        containerd.kill_daemon().expect("containerd is killed");
        containerd.start_daemon().expect("containerd starts again");
    }

    let settled = poll(Duration::from_secs(240), || {
        let pods = node.pods().ok()?;
        let running = pods.iter().filter(|p| is_running(p)).count();
        (running == BOXES + WASM).then_some(pods)
    });
    let pods = settled.unwrap_or_else(|| {
        let pods = node.pods().unwrap_or_default();
        let waiting: Vec<_> = pods
            .iter()
            .filter(|p| !is_running(p))
            .map(|p| (p.metadata.name.clone(), p.status.clone()))
            .collect();
        panic!(
            "{} of {} pods run after containerd was killed eight times; the others: {waiting:#?}\nnode log:\n{}\ncontainerd log:\n{}",
            pods.len() - waiting.len(),
            BOXES + WASM,
            wasmlet_testkit::node::tail(&node.log(), 60),
            containerd.log_tail(40)
        )
    });
    assert_eq!(pods.len(), BOXES + WASM, "no pod more, none fewer");
    assert_eq!(
        wasm_instances().expect("the Wasm pods run"),
        before,
        "the Wasm pods kept their containers and restart counts"
    );

    let (_, running) = running_tasks(&containerd);
    each_box_runs_a_sandbox_and_a_container(&containerd, &pods, &running);
}

/// `ctr tasks ls` in the CRI namespace, and the ids of its running tasks.
fn running_tasks(containerd: &Containerd) -> (String, BTreeSet<String>) {
    let tasks = containerd.ctr_k8s(["tasks", "ls"]).unwrap_or_default();
    let running = tasks
        .lines()
        .filter(|l| l.contains("RUNNING"))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    (tasks, running)
}

/// Each `box-*` pod has exactly two of its containerd objects running: its pod
/// sandbox and its container.
fn each_box_runs_a_sandbox_and_a_container(
    containerd: &Containerd,
    pods: &[Pod],
    running: &BTreeSet<String>,
) {
    for p in pods.iter().filter(|p| {
        p.metadata
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with("box-"))
    }) {
        let objects = pod_containers(containerd, p);
        let live = objects.iter().filter(|id| running.contains(*id)).count();
        assert_eq!(
            live, 2,
            "{:?}: one running pod sandbox and one running container: {objects:?}",
            p.metadata.name
        );
    }
}

/// Fills `dir`'s filesystem with one file until a write fails for lack of space.
fn fill(dir: &std::path::Path) -> std::path::PathBuf {
    use std::io::Write as _;
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    let chunk = vec![0u8; 1 << 20];
    loop {
        match file.write_all(&chunk) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    // The last bytes, below a megabyte.
    while file.write_all(&[0u8; 4096]).is_ok() {}
    let _ = file.sync_all();
    path
}

#[test]
fn a_full_filesystem_is_disk_pressure_and_loses_nothing_and_the_node_recovers() {
    // The node's root dir (state, Wasm images, volumes) and pod logs on 64 MiB; its
    // own log (stderr: journald's, in a real deployment) elsewhere.
    let fs = LoopFs::new(64);
    let c = cluster();
    let mut opts = node_options(&c, &["ticker"]);
    opts.state_dir = Some(fs.path());
    // Pressure is reported at once; eviction would wait ten minutes, so what the test
    // sees is the node living with a full disk, not evicting its way out of it.
    opts.kubelet_config = "evictionHard: {memory.available: 100Mi}\n\
         evictionSoft: {nodefs.available: 20%}\n\
         evictionSoftGracePeriod: {nodefs.available: 10m}\n\
         evictionPressureTransitionPeriod: 5s\n\
         nodeStatusUpdateFrequency: 1s\n"
        .into();
    opts.wasmlet_config = "  evictionMonitoringPeriod: 1s\n".into();
    let mut node = start_with(opts);
    node.write_manifest("static.yaml", &manifest("static", "ticker", "Always", ""))
        .unwrap();
    c.api.create(&api_pod("web", "ticker")).unwrap();
    for name in ["web", "static-e2e"] {
        wait(&format!("{name} to be Running"), LONG, || {
            c.api.get::<Pod>(Some("default"), name).filter(is_running)
        });
    }
    assert_eq!(condition_of(&c, "DiskPressure").as_deref(), Some("False"));
    let before = containers_of(&node, &["web", "static-e2e"]).expect("both pods are known");

    // Full: every write of the node (state records, logs, the image store) fails.
    let filler = fill(&fs.path());
    wait("DiskPressure to be True", LONG, || {
        (condition_of(&c, "DiskPressure").as_deref() == Some("True")).then_some(())
    });
    // A pod that comes now is refused, as the kubelet refuses it under disk pressure.
    c.api.create(&api_pod("late", "ticker")).unwrap();
    let late = wait("the late pod to be refused", LONG, || {
        c.api
            .get::<Pod>(Some("default"), "late")
            .filter(|p| phase(p) == "Failed")
    });
    assert_eq!(
        late.status.and_then(|s| s.message).as_deref(),
        Some("The node had condition: [DiskPressure]. ")
    );
    // The node answers and its pods run; killed and started again on the full disk, it
    // adopts them from the records it wrote before: nothing lost, nothing doubled.
    assert!(node.is_running(), "the node survives the full disk");
    node.kill();
    node.restart()
        .expect("the node starts again on a full disk");
    let adopted = poll(LONG, || {
        let now = containers_of(&node, &["web", "static-e2e"])?;
        (now == before).then_some(())
    });
    assert!(
        adopted.is_some(),
        "the pods were not adopted: {:?} before, {:?} now; the node's log:\n{}",
        before,
        containers_of(&node, &["web", "static-e2e"]),
        node.log()
            .lines()
            .filter(|l| !l.contains("DEBUG"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(node.sandbox_pids().len(), 2, "one sandbox per pod");

    // Space returns: the pressure ends, a new pod runs, and the old ones never restarted.
    std::fs::remove_file(&filler).unwrap();
    wait("DiskPressure to be False again", LONG, || {
        (condition_of(&c, "DiskPressure").as_deref() == Some("False")).then_some(())
    });
    c.api.create(&api_pod("after", "ticker")).unwrap();
    wait("a pod created after the pressure to run", LONG, || {
        c.api
            .get::<Pod>(Some("default"), "after")
            .filter(is_running)
    });
    assert_eq!(
        containers_of(&node, &["web", "static-e2e"]),
        Some(before.clone())
    );
    // The ticker's log goes on (its writes failed while the disk was full).
    let web = here(&node, "web").unwrap();
    let lines = node.container_log(&web, "main", 0).unwrap().len();
    wait("the ticker to log again", LONG, || {
        (node.container_log(&web, "main", 0).ok()?.len() > lines).then_some(())
    });
    drop(node);
    drop(fs);
}
