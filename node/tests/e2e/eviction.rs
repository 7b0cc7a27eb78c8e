//! Node-pressure eviction on real cgroups, Wasm and busybox pods side by side.
//!
//! The node's allocatable memory is made small (`systemReserved` is all the machine
//! but 1200 MiB, which is then the `kubepods` limit) and the hard threshold
//! `memory.available<300Mi` is, as the kubelet derives it, also
//! `allocatableMemory.available<300Mi`: pods holding more than 900 MiB together put
//! the node under memory pressure, with 300 MiB left before the kernel's OOM killer
//! would act. The signal counts only the pods' cgroups, so other tests running on the
//! machine do not move it.

use std::time::Instant;

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;
use wasmlet_testkit::containerd::{Containerd, images::BUSYBOX_IMAGE};
use wasmlet_testkit::node::poll;

use crate::cluster::*;
use crate::*;

const MIB: u64 = 1 << 20;
/// The `kubepods` limit, and the allocatable the signal is a share of.
const ALLOCATABLE: u64 = 1200 * MIB;

fn mem_total() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kb: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    kb * 1024
}

/// A Wasm memhog holding `mib` MiB, with `resources`.
fn wasm_hog(name: &str, mib: u64, resources: serde_json::Value) -> Pod {
    let mut pod = api_pod(name, "memhog");
    let c = &mut pod.spec.as_mut().unwrap().containers[0];
    c.env = Some(vec![k8s_openapi::api::core::v1::EnvVar {
        name: "MIB".into(),
        value: Some(mib.to_string()),
        ..Default::default()
    }]);
    c.resources = serde_json::from_value(resources).unwrap();
    pod
}

/// A busybox pod bound to the node running `script`, its container's fields
/// extended by `container` (resources, volume mounts) and its spec's by `spec`.
fn busybox(name: &str, script: &str, container: serde_json::Value, spec: serde_json::Value) -> Pod {
    let mut c = json!({
        "name": "main",
        "image": BUSYBOX_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", script],
    });
    c.as_object_mut()
        .unwrap()
        .extend(container.as_object().unwrap().clone());
    let mut pod_spec = json!({
        "nodeName": NODE,
        "terminationGracePeriodSeconds": 2,
        "containers": [c],
    });
    pod_spec
        .as_object_mut()
        .unwrap()
        .extend(spec.as_object().unwrap().clone());
    crate::cluster::pod_with_spec(name, pod_spec)
}

/// A busybox pod holding `mib` MiB: dd's buffer, full of zeros read into it, held
/// while dd waits on a pipe nobody reads.
fn busybox_hog(name: &str, mib: u64, request: &str) -> Pod {
    busybox(
        name,
        &format!("dd if=/dev/zero bs={mib}M count=1 2>/dev/null | sleep 3600"),
        json!({"resources": {"requests": {"memory": request}}}),
        json!({}),
    )
}

fn running_pod(c: &Cluster, name: &str) {
    if poll(LONG, || get(c, name).filter(|p| phase(p) == "Running")).is_none() {
        panic!(
            "{name} did not run: {:?}",
            get(c, name).and_then(|p| p.status)
        );
    }
}

fn status_of(p: &Pod) -> (String, String, String) {
    let s = p.status.clone().unwrap_or_default();
    (
        s.phase.unwrap_or_default(),
        s.reason.unwrap_or_default(),
        s.message.unwrap_or_default(),
    )
}

/// The status of the node's condition `kind`.
pub(crate) fn condition_of(c: &Cluster, kind: &str) -> Option<String> {
    let node = c.api.get::<Node>(None, NODE)?;
    node.status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == kind)
        .map(|c| c.status)
}

/// The working set of the node allocatable cgroup, as the signal reads it.
fn pods_working_set(node: &TestNode) -> u64 {
    let dir = std::path::Path::new("/sys/fs/cgroup/memory")
        .join(node.cgroup_root.trim_start_matches('/'))
        .join("kubepods");
    let usage: u64 = std::fs::read_to_string(dir.join("memory.usage_in_bytes"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap();
    let inactive: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("total_inactive_file "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    usage.saturating_sub(inactive)
}

#[test]
fn memory_pressure_evicts_best_effort_then_burstable_and_spares_guaranteed() {
    let containerd = Containerd::start().expect("containerd starts");
    containerd.import_test_images().expect("test images import");
    let c = cluster();
    let reserved = (mem_total() - ALLOCATABLE) / 1024;
    let mut opts = node_options(&c, &["memhog"]).with_cri(containerd.address());
    opts.kubelet_config = format!(
        "systemReserved: {{memory: {reserved}Ki}}\n\
         evictionHard: {{memory.available: 300Mi}}\n\
         evictionPressureTransitionPeriod: 20s\n\
         nodeStatusUpdateFrequency: 2s\n"
    );
    opts.wasmlet_config = "  evictionMonitoringPeriod: 2s\n".into();
    let mut node = start_with(opts);
    wait("the Node to be Ready", LONG, || {
        c.api.get::<Node>(None, NODE).filter(node_ready)
    });
    assert_eq!(condition_of(&c, "MemoryPressure").as_deref(), Some("False"));

    // Guaranteed, under its request; Burstable, a little over its request.
    let guaranteed = json!({
        "requests": {"memory": "256Mi", "cpu": "100m"},
        "limits": {"memory": "256Mi", "cpu": "100m"},
    });
    c.api
        .create(&wasm_hog("guaranteed", 100, guaranteed))
        .unwrap();
    c.api
        .create(&busybox_hog("burstable", 150, "64Mi"))
        .unwrap();
    running_pod(&c, "guaranteed");
    running_pod(&c, "burstable");
    let base = wait("the two pods to hold their memory", LONG, || {
        let ws = pods_working_set(&node);
        (ws > 240 * MIB).then_some(ws)
    });
    eprintln!("pods hold {} MiB", base / MIB);
    assert!(
        base < 600 * MIB,
        "{} MiB before the BestEffort pod",
        base / MIB
    );

    // A BestEffort hog takes the pods to about 1050 MiB: past 900, short of 1200.
    let hog = (1050 * MIB).saturating_sub(base) / MIB;
    let crossed = Instant::now();
    c.api
        .create(&wasm_hog("best-effort", hog, json!({})))
        .unwrap();
    let evicted = wait("the BestEffort pod to be evicted", LONG, || {
        get(&c, "best-effort").filter(|p| phase(p) == "Failed")
    });
    eprintln!(
        "best-effort ({hog} MiB) evicted {:?} after it was created",
        crossed.elapsed()
    );
    let (_, reason, message) = status_of(&evicted);
    assert_eq!(reason, "Evicted", "{message}");
    assert!(
        message.starts_with(
            "The node was low on resource: memory. Threshold quantity: 300Mi, available: "
        ),
        "{message}"
    );
    assert!(
        message.contains("Container main was using ")
            && message.contains("request is 0, has larger consumption of memory."),
        "{message}"
    );
    assert!(
        condition(&evicted, "DisruptionTarget").as_deref() == Some("True"),
        "{:?}",
        evicted.status
    );
    wait("MemoryPressure to be True", LONG, || {
        (condition_of(&c, "MemoryPressure").as_deref() == Some("True")).then_some(())
    });

    // Under memory pressure a BestEffort pod is refused; a Burstable one is admitted,
    // and when it takes the pods past the threshold it is the one evicted (it is over
    // its request by far more than the small Burstable pod), not the Guaranteed pod.
    c.api.create(&wasm_hog("late", 10, json!({}))).unwrap();
    let late = wait("the late BestEffort pod to be refused", LONG, || {
        get(&c, "late").filter(|p| phase(p) == "Failed")
    });
    let (_, reason, message) = status_of(&late);
    assert_eq!(
        (reason.as_str(), message.as_str()),
        ("Evicted", "The node had condition: [MemoryPressure]. ")
    );
    let base = pods_working_set(&node);
    let big = (1050 * MIB).saturating_sub(base) / MIB;
    eprintln!(
        "pods hold {} MiB after the eviction; the big Burstable pod takes {big} MiB",
        base / MIB
    );
    c.api
        .create(&busybox_hog("burstable-big", big, "64Mi"))
        .unwrap();
    let evicted = wait("the big Burstable pod to be evicted", LONG, || {
        get(&c, "burstable-big").filter(|p| phase(p) == "Failed")
    });
    let (_, reason, message) = status_of(&evicted);
    assert_eq!(reason, "Evicted", "{message}");
    assert!(
        message.contains("request is 64Mi, has larger consumption of memory."),
        "{message}"
    );

    // The pressure ends after the transition period; the rest kept running.
    wait("MemoryPressure to be False again", LONG, || {
        (condition_of(&c, "MemoryPressure").as_deref() == Some("False")).then_some(())
    });
    for line in node.log().lines().filter(|l| l.contains("evict")) {
        eprintln!("node: {line}");
    }
    for name in ["guaranteed", "burstable"] {
        let p = get(&c, name).unwrap();
        assert_eq!(phase(&p), "Running", "{name}: {:?}", p.status);
    }
    assert!(node.is_running(), "{}", node.log());
    let events = c
        .api
        .list::<k8s_openapi::api::core::v1::Event>(Some("default"));
    assert!(
        events.iter().any(|e| e.reason.as_deref() == Some("Evicted")
            && e.involved_object.name.as_deref() == Some("best-effort")),
        "no Evicted event: {events:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("EvictionThresholdMet")
                && e.type_.as_deref() == Some("Warning")
                && e.involved_object.kind.as_deref() == Some("Node")
                && e.message.as_deref() == Some("Attempting to reclaim memory")),
        "no EvictionThresholdMet event on the Node: {events:?}"
    );
    drop(containerd);
}

/// The machine's threads now (`/proc/loadavg`'s total, what `pid.available` counts).
fn threads() -> i64 {
    let raw = std::fs::read_to_string("/proc/loadavg").unwrap();
    raw.split_whitespace()
        .nth(3)
        .and_then(|f| f.split('/').nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap()
}

fn pid_max() -> i64 {
    std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn a_fork_bomb_stays_within_pod_pids_limit_and_pid_pressure_evicts_it() {
    let containerd = Containerd::start().expect("containerd starts");
    containerd.import_test_images().expect("test images import");
    let c = cluster();
    let mut opts = node_options(&c, &[]).with_cri(containerd.address());
    opts.kubelet_config =
        "podPidsLimit: 200\nevictionPressureTransitionPeriod: 10s\nnodeStatusUpdateFrequency: 1s\n"
            .into();
    opts.wasmlet_config = "  evictionMonitoringPeriod: 1s\n".into();
    // The threshold: 80 threads above what the machine runs now (the bomb adds about
    // 200), set once the node runs; a node restart reads it.
    let mut node = start_with(opts);
    wait("the Node to be Ready", LONG, || {
        c.api.get::<Node>(None, NODE).filter(node_ready)
    });
    let baseline = threads();
    let threshold = pid_max() - baseline - 80;
    let config = node.dir().join("config.yaml");
    // The test node's own evictionHard (memory only) gains the pid threshold: one
    // `evictionHard` key, as YAML allows.
    let yaml = std::fs::read_to_string(&config).unwrap();
    let defaults = "evictionHard: {memory.available: 100Mi}\n";
    assert!(yaml.contains(defaults), "{yaml}");
    std::fs::write(
        &config,
        yaml.replacen(
            defaults,
            &format!("evictionHard: {{memory.available: 100Mi, pid.available: \"{threshold}\"}}\n"),
            1,
        ),
    )
    .unwrap();
    node.stop();
    node.restart().unwrap();
    wait("the Node to be Ready again", LONG, || {
        c.api.get::<Node>(None, NODE).filter(node_ready)
    });
    assert_eq!(condition_of(&c, "PIDPressure").as_deref(), Some("False"));

    let bomb = busybox(
        "bomb",
        "b() { b | b & }; b; sleep 3600",
        json!({"resources": {"limits": {"cpu": "500m"}}}),
        json!({"terminationGracePeriodSeconds": 1}),
    );
    c.api.create(&bomb).unwrap();
    let pod = wait("the bomb pod to start", LONG, || {
        get(&c, "bomb").filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.start_time.as_ref())
                .is_some()
        })
    });
    let uid = pod.metadata.uid.clone().unwrap();
    // Contained: the pod's pids cgroup never holds more than the limit.
    let pids = std::path::Path::new("/sys/fs/cgroup/pids")
        .join(node.cgroup_root.trim_start_matches('/'))
        .join("kubepods/burstable")
        .join(format!("pod{uid}"));
    let mut most = 0u64;
    let evicted = wait("the bomb to be evicted", LONG, || {
        if let Ok(n) = std::fs::read_to_string(pids.join("pids.current")) {
            most = most.max(n.trim().parse().unwrap_or(0));
        }
        get(&c, "bomb").filter(|p| phase(p) == "Failed")
    });
    eprintln!("the bomb held at most {most} pids (limit 200); {baseline} threads before it");
    assert!(most <= 200, "{most} pids in the bomb's cgroup");
    assert!(most > 80, "the bomb did not fork: {most}");
    let (_, reason, message) = status_of(&evicted);
    assert_eq!(reason, "Evicted", "{message}");
    assert!(
        message.starts_with(&format!(
            "The node was low on resource: pids. Threshold quantity: {threshold}, available: "
        )),
        "{message}"
    );
    wait("PIDPressure to be True", LONG, || {
        (condition_of(&c, "PIDPressure").as_deref() == Some("True")).then_some(())
    });
    wait("PIDPressure to be False again", LONG, || {
        (condition_of(&c, "PIDPressure").as_deref() == Some("False")).then_some(())
    });
    assert!(node.is_running(), "{}", node.log());
}

/// A node whose allocatable memory is 1200 MiB with the 300 MiB threshold, Wasm pods
/// only, and `plugins` as its `wasmlet.plugins`.
fn pressure_node(c: &Cluster, plugins: &str) -> crate::Fixture {
    let reserved = (mem_total() - ALLOCATABLE) / 1024;
    let mut opts = node_options(c, &["memhog"]);
    opts.kubelet_config = format!(
        "systemReserved: {{memory: {reserved}Ki}}\n\
         evictionHard: {{memory.available: 300Mi}}\n\
         evictionPressureTransitionPeriod: 5s\n"
    );
    opts.wasmlet_config = format!("  evictionMonitoringPeriod: 1s\n  plugins:\n{plugins}");
    let node = start_with(opts);
    wait("the Node to be Ready", LONG, || {
        c.api.get::<Node>(None, NODE).filter(node_ready)
    });
    node
}

/// Two BestEffort hogs, the larger in namespace `protected`: which one is evicted.
fn evicted_of_two(c: &Cluster) -> String {
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": "protected"}})).unwrap();
    c.api.create(&ns).unwrap();
    let mut keep = wasm_hog("keep", 650, json!({}));
    keep.metadata.namespace = Some("protected".into());
    c.api.create(&keep).unwrap();
    wait("the protected hog to run", LONG, || {
        c.api
            .get::<Pod>(Some("protected"), "keep")
            .filter(|p| phase(p) == "Running")
    });
    c.api.create(&wasm_hog("go", 350, json!({}))).unwrap();
    wait("one hog to be evicted", LONG, || {
        let go = get(c, "go").filter(|p| phase(p) == "Failed");
        let keep = c
            .api
            .get::<Pod>(Some("protected"), "keep")
            .filter(|p| phase(p) == "Failed");
        match (go, keep) {
            (Some(p), None) | (None, Some(p)) => {
                assert_eq!(status_of(&p).1, "Evicted");
                p.metadata.name
            }
            _ => None,
        }
    })
}

#[test]
fn an_eviction_plugin_reorders_the_candidates_and_a_failing_one_falls_back() {
    let built = wasmlet_testkit::images::ensure_plugins().expect("the example plugins build");
    // The built-in order evicts the larger hog; priority-eviction protects its namespace.
    let c = cluster();
    let node = pressure_node(
        &c,
        &format!(
            "  - name: rank\n    world: eviction-plugin\n    source: {{file: {}}}\n    settings: {{protect-namespaces: protected}}\n",
            built["priority-eviction"].display()
        ),
    );
    assert_eq!(evicted_of_two(&c), "go", "{}", node.log());
    drop(node);

    // A plugin that cannot rank (a probe plugin, not an eviction one): the built-in
    // order, and an event that says so.
    let c = cluster();
    let node = pressure_node(
        &c,
        &format!(
            "  - name: rank\n    world: eviction-plugin\n    source: {{file: {}}}\n",
            built["hostile-trap"].display()
        ),
    );
    assert_eq!(evicted_of_two(&c), "keep", "{}", node.log());
    let events = c
        .api
        .list::<k8s_openapi::api::core::v1::Event>(Some("default"));
    let failed = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("EvictionPluginFailed"))
        .unwrap_or_else(|| panic!("no EvictionPluginFailed event: {events:?}"));
    assert_eq!(failed.involved_object.kind.as_deref(), Some("Node"));
    assert!(
        failed.message.as_deref().is_some_and(
            |m| m.contains("eviction plugin rank failed, so the built-in ranking is used")
        ),
        "{failed:?}"
    );
}

/// A busybox pod running `script` with an emptyDir `data` of `size_limit`.
fn busybox_with_empty_dir(name: &str, script: &str, size_limit: &str) -> Pod {
    busybox(
        name,
        script,
        json!({"volumeMounts": [{"name": "data", "mountPath": "/data"}]}),
        json!({"volumes": [{"name": "data", "emptyDir": {"sizeLimit": size_limit}}]}),
    )
}

#[test]
fn an_empty_dir_over_its_size_limit_gets_its_pod_evicted() {
    let containerd = Containerd::start().expect("containerd starts");
    containerd.import_test_images().expect("test images import");
    let c = cluster();
    let mut opts = node_options(&c, &[]).with_cri(containerd.address());
    opts.kubelet_config = "volumeStatsAggPeriod: 1s\n".into();
    opts.wasmlet_config = "  evictionMonitoringPeriod: 1s\n".into();
    let node = start_with(opts);
    wait("the Node to be Ready", LONG, || {
        c.api.get::<Node>(None, NODE).filter(node_ready)
    });
    let write =
        |mib: u32| format!("dd if=/dev/zero of=/data/f bs=1M count={mib} 2>/dev/null; sleep 3600");
    c.api
        .create(&busybox_with_empty_dir("filler", &write(4), "1Mi"))
        .unwrap();
    c.api
        .create(&busybox_with_empty_dir("within", &write(1), "4Mi"))
        .unwrap();
    let evicted = wait("the filler to be evicted", LONG, || {
        get(&c, "filler").filter(|p| phase(p) == "Failed")
    });
    let (_, reason, message) = status_of(&evicted);
    assert_eq!(
        (reason.as_str(), message.as_str()),
        (
            "Evicted",
            "Usage of EmptyDir volume \"data\" exceeds the limit \"1Mi\". "
        )
    );
    // The pod within its limit runs on through the passes after (one a second).
    running_pod(&c, "within");
    let since = Instant::now();
    wait("three seconds of passes", LONG, || {
        let within = get(&c, "within").unwrap();
        assert_eq!(phase(&within), "Running", "{:?}", within.status);
        (since.elapsed() > std::time::Duration::from_secs(3)).then_some(())
    });

    // Deleted, the evicted pod leaves nothing behind: its log directory goes with it
    // (container GC), the pod's own with its worker.
    let uid = evicted.metadata.uid.clone().unwrap();
    let logs = node.logs.join(format!("default_filler_{uid}"));
    assert!(logs.exists(), "{} is not there", logs.display());
    c.api
        .delete::<Pod>(Some("default"), "filler", Some(0))
        .unwrap();
    wait("the evicted pod's logs to be removed", LONG, || {
        (!logs.exists()).then_some(())
    });
    wait("the evicted pod to be gone", LONG, || {
        get(&c, "filler").is_none().then_some(())
    });
    assert!(!node.root.join("pods").join(&uid).exists());
}

/// A small ext4 filesystem on a loop device, mounted for the test and unmounted when
/// dropped.
pub(crate) struct LoopFs {
    dir: tempfile::TempDir,
}

impl LoopFs {
    pub(crate) fn new(mib: u64) -> LoopFs {
        let dir = tempfile::Builder::new()
            .prefix("wasmlet-e2e-loopfs-")
            .tempdir()
            .unwrap();
        let image = dir.path().join("fs.img");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(mib * MIB)
            .unwrap();
        let run = |cmd: &mut std::process::Command| {
            let out = cmd.output().unwrap();
            assert!(
                out.status.success(),
                "{cmd:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run(std::process::Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .arg(&image));
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        run(std::process::Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(&mnt));
        LoopFs { dir }
    }

    pub(crate) fn path(&self) -> std::path::PathBuf {
        self.dir.path().join("mnt")
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.path())
            .status();
    }
}

fn node_images(c: &Cluster) -> Vec<String> {
    c.api
        .get::<Node>(None, NODE)
        .and_then(|n| n.status?.images)
        .into_iter()
        .flatten()
        .flat_map(|i| i.names.unwrap_or_default())
        .collect()
}

#[test]
fn disk_pressure_reclaims_dead_containers_and_unused_images_then_evicts_the_heaviest_consumer() {
    let containerd = Containerd::start().expect("containerd starts");
    containerd.import_test_images().expect("test images import");
    // The node's root dir (with the Wasm image store) and pod logs on 64 MiB.
    let fs = LoopFs::new(64);
    let c = cluster();
    let mut opts = node_options(&c, &["ticker", "memhog", "httpd"]).with_cri(containerd.address());
    opts.base_dir = Some(fs.path());
    opts.kubelet_config = "evictionHard: {memory.available: 100Mi, nodefs.available: 40%}\n\
         evictionPressureTransitionPeriod: 20s\n\
         imageMinimumGCAge: 0s\n\
         volumeStatsAggPeriod: 1s\n\
         nodeStatusUpdateFrequency: 1s\n"
        .into();
    opts.wasmlet_config = "  evictionMonitoringPeriod: 1s\n".into();
    let node = start_with(opts);
    wait("the Node to be Ready", LONG, || {
        c.api.get::<Node>(None, NODE).filter(node_ready)
    });
    let memhog = image("memhog");
    wait("the node to report its images", LONG, || {
        node_images(&c).iter().any(|n| n == &memhog).then_some(())
    });
    assert_eq!(condition_of(&c, "DiskPressure").as_deref(), Some("False"));

    // A Wasm pod keeps the ticker image in use; a light and a heavy writer fill
    // emptyDirs on the node's filesystem, the heavy one past 40 % left.
    c.api.create(&api_pod("tick", "ticker")).unwrap();
    running_pod(&c, "tick");
    // A finished pod whose dead container holds a 4 MiB log: container GC keeps a
    // finished pod's last instance, disk-pressure reclaim takes it.
    c.api
        .create(&busybox(
            "done",
            "i=0; while [ $i -lt 1024 ]; do head -c 4000 /dev/zero | tr '\\0' x; echo; i=$((i+1)); done",
            json!({}),
            json!({"restartPolicy": "Never"}),
        ))
        .unwrap();
    wait("the log writer to succeed", LONG, || {
        get(&c, "done").filter(|p| phase(p) == "Succeeded")
    });
    let done_log = wait("the log writer's log", LONG, || {
        let dir = std::fs::read_dir(&node.logs)
            .ok()?
            .flatten()
            .find(|e| e.file_name().to_string_lossy().contains("_done_"))?;
        let log = dir.path().join("main").join("0.log");
        (std::fs::metadata(&log).ok()?.len() > 4_000_000).then_some(log)
    });
    let write =
        |mib: u32| format!("dd if=/dev/zero of=/data/f bs=1M count={mib} 2>/dev/null; sleep 3600");
    c.api
        .create(&busybox_with_empty_dir("light", &write(2), "64Mi"))
        .unwrap();
    running_pod(&c, "light");
    c.api
        .create(&busybox_with_empty_dir("heavy", &write(40), "64Mi"))
        .unwrap();
    let evicted = wait("the heavy writer to be evicted", LONG, || {
        get(&c, "heavy").filter(|p| phase(p) == "Failed")
    });
    let (_, reason, message) = status_of(&evicted);
    assert_eq!(reason, "Evicted", "{message}");
    assert!(
        message
            .starts_with("The node was low on resource: ephemeral-storage. Threshold quantity: "),
        "{message}"
    );
    // The finished pod's dead container and its log went before the eviction; the pod
    // is still Succeeded.
    assert!(
        !done_log.exists(),
        "{} outlived the disk reclaim",
        done_log.display()
    );
    assert_eq!(phase(&get(&c, "done").unwrap()), "Succeeded");
    // Unused images went first; the one in use stayed.
    wait("the unused images to be gone", LONG, || {
        let images = node_images(&c);
        (!images.iter().any(|n| n == &memhog)).then_some(images)
    });
    assert!(node_images(&c).contains(&image("ticker")));
    // Under disk pressure no pod is admitted; then it ends, the rest kept running.
    wait("DiskPressure to be True", LONG, || {
        (condition_of(&c, "DiskPressure").as_deref() == Some("True")).then_some(())
    });
    c.api.create(&api_pod("late", "ticker")).unwrap();
    let late = wait("the late pod to be refused", LONG, || {
        get(&c, "late").filter(|p| phase(p) == "Failed")
    });
    assert_eq!(
        status_of(&late).2,
        "The node had condition: [DiskPressure]. "
    );
    wait("DiskPressure to be False again", LONG, || {
        (condition_of(&c, "DiskPressure").as_deref() == Some("False")).then_some(())
    });
    for name in ["tick", "light"] {
        let p = get(&c, name).unwrap();
        assert_eq!(phase(&p), "Running", "{name}: {:?}", p.status);
    }
    drop(node);
    drop(fs);
}
