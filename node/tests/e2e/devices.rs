//! Devices in a real node: a gRPC device plugin (the testkit's, over the unix
//! socket) and the `widget-device` Wasm adapter become extended resources of the
//! Node, their devices reach container and Wasm pods, a request beyond what is free
//! is refused with the kubelet's reason, health changes reach allocatable, the
//! allocations survive a killed node, and the topology manager places pods on a
//! two-NUMA sysfs fixture.

use std::path::Path;

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use wasmlet_testkit::deviceplugin::{TestDevice, TestDevicePlugin};
use wasmlet_testkit::node::NodeOptions;

use crate::cluster::{Cluster, NODE, cluster, node_options, pod_with_spec, wait};
use crate::*;

const WIDGET: &str = "example.com/widget";

/// The Node's capacity and allocatable of `resource`.
fn node_amounts(c: &Cluster, resource: &str) -> Option<(String, String)> {
    let node = c.api.get::<Node>(None, NODE)?;
    let status = node.status?;
    let capacity = status.capacity?.get(resource)?.0.clone();
    let allocatable = status.allocatable?.get(resource)?.0.clone();
    Some((capacity, allocatable))
}

fn wait_amounts(c: &Cluster, resource: &str, want: (&str, &str)) {
    wait(
        &format!("{resource} at capacity/allocatable {want:?}"),
        LONG,
        || node_amounts(c, resource).filter(|(cap, alloc)| (cap.as_str(), alloc.as_str()) == want),
    );
}

/// Four widgets: w0 and w1 on NUMA node 0, w2 and w3 on node 1.
fn four_widgets() -> Vec<TestDevice> {
    (0..4)
        .map(|i| TestDevice::new(&format!("w{i}"), Some(i / 2)))
        .collect()
}

fn device_dir(node: &Fixture) -> std::path::PathBuf {
    node.dir().join("root").join("device-plugins")
}

/// A pod asking for `n` of `resource`, running `image` (with `command`, if any).
fn device_pod(name: &str, image: &str, command: Option<Vec<&str>>, resource: &str, n: u32) -> Pod {
    let mut container = serde_json::json!({
        "name": "main",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "resources": { "limits": { resource: n.to_string() } },
    });
    if let Some(command) = command {
        container["command"] = serde_json::json!(command);
    }
    pod_with_spec(
        name,
        serde_json::json!({
            "nodeName": NODE,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
        }),
    )
}

fn failed_with(c: &Cluster, name: &str) -> (String, String) {
    let p = wait(&format!("{name} to be rejected"), LONG, || {
        get_pod(c, name).filter(|p| phase(p) == "Failed")
    });
    let s = p.status.unwrap();
    (s.reason.unwrap_or_default(), s.message.unwrap_or_default())
}

fn get_pod(c: &Cluster, name: &str) -> Option<Pod> {
    c.api.get::<Pod>(Some("default"), name)
}

fn log_text(node: &Fixture, pod: &Pod) -> String {
    node.container_log(pod, "main", 0)
        .map(|records| {
            records
                .into_iter()
                .map(|r| r.text)
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

#[test]
fn a_device_plugin_serves_container_and_wasm_pods_and_its_allocations_survive_a_restart() {
    use wasmlet_testkit::containerd::{Containerd, images::BUSYBOX_IMAGE};
    let containerd = Containerd::start().expect("containerd starts");
    containerd.import_test_images().expect("test images import");
    let c = cluster();
    let mut node = start_with(node_options(&c, &["hello"]).with_cri(containerd.address()));
    let plugin = TestDevicePlugin::start(&device_dir(&node), "widget", WIDGET, four_widgets())
        .expect("the device plugin starts");
    wait_amounts(&c, WIDGET, ("4", "4"));

    // A busybox pod with two widgets sees their env and device nodes.
    let script = "echo \"WIDGETS=$WIDGETS\"; for d in $(echo $WIDGETS | tr , ' '); do test -c /dev/$d && echo \"device /dev/$d\"; done; sleep 600";
    c.api
        .create(&device_pod(
            "gadgets",
            BUSYBOX_IMAGE,
            Some(vec!["sh", "-c", script]),
            WIDGET,
            2,
        ))
        .unwrap();
    let gadgets = wait("the busybox pod to run", LONG, || {
        get_pod(&c, "gadgets").filter(is_running)
    });
    let text = wait("the busybox pod's devices in its log", LONG, || {
        let t = log_text(&node, &gadgets);
        (t.matches("device /dev/w").count() == 2).then_some(t)
    });
    let held: Vec<String> = plugin.allocations()[0].clone();
    assert_eq!(held.len(), 2);
    assert!(
        text.contains(&format!("WIDGETS={}", held.join(","))),
        "{text}"
    );

    // A Wasm pod with one widget gets its env.
    c.api
        .create(&device_pod("wasm-widget", &image("hello"), None, WIDGET, 1))
        .unwrap();
    let wasm = wait("the Wasm pod to finish", LONG, || {
        get_pod(&c, "wasm-widget").filter(|p| phase(p) == "Succeeded")
    });
    let text = log_text(&node, &wasm);
    let given = plugin.allocations()[1].clone();
    assert_eq!(given.len(), 1);
    assert!(
        !held.contains(&given[0]),
        "a held device was handed out again"
    );
    assert!(
        text.contains(&format!("env WIDGETS={}", given[0])),
        "{text}"
    );

    // Two are held (the finished Wasm pod's is free again): three more are refused
    // with the kubelet's reason and message.
    c.api
        .create(&device_pod(
            "too-many",
            BUSYBOX_IMAGE,
            Some(vec!["true"]),
            WIDGET,
            3,
        ))
        .unwrap();
    let (reason, message) = failed_with(&c, "too-many");
    assert_eq!(reason, "UnexpectedAdmissionError");
    assert_eq!(
        message,
        "Allocate failed due to requested number of devices unavailable for example.com/widget. Requested: 3, Available: 2, which is unexpected"
    );

    // A device turning unhealthy lowers allocatable, not capacity.
    let free: Vec<String> = (0..4)
        .map(|i| format!("w{i}"))
        .filter(|id| !held.contains(id))
        .collect();
    plugin.set_healthy(&free[0], false);
    wait_amounts(&c, WIDGET, ("4", "3"));

    // The node is killed and comes back: the plugin registers again, the busybox pod
    // keeps its devices (no restart), and they are not handed out twice.
    let registrations = plugin.registrations();
    let checkpoint = device_dir(&node).join("kubelet_internal_checkpoint");
    let before = std::fs::read_to_string(&checkpoint).unwrap();
    node.kill();
    node.restart().expect("the node starts again");
    wait("the plugin to register again", LONG, || {
        (plugin.registrations() > registrations).then_some(())
    });
    wait_amounts(&c, WIDGET, ("4", "3"));
    let after = wait("the busybox pod to be reported running again", LONG, || {
        get_pod(&c, "gadgets").filter(is_running)
    });
    assert_eq!(
        container(&after).container_id,
        container(&gadgets).container_id
    );
    assert_eq!(container(&after).restart_count, 0);
    let now = std::fs::read_to_string(&checkpoint).unwrap();
    for id in &held {
        assert!(before.contains(id) && now.contains(id), "{now}");
    }
    c.api
        .create(&device_pod(
            "two-more",
            BUSYBOX_IMAGE,
            Some(vec!["true"]),
            WIDGET,
            2,
        ))
        .unwrap();
    let (reason, message) = failed_with(&c, "two-more");
    assert_eq!(reason, "UnexpectedAdmissionError");
    assert!(message.contains("Requested: 2, Available: 1"), "{message}");
    assert_eq!(plugin.allocations().len(), 2, "nothing allocated twice");
    c.api
        .delete::<Pod>(Some("default"), "gadgets", Some(0))
        .unwrap();
    wait("the busybox pod to go", LONG, || {
        get_pod(&c, "gadgets").is_none().then_some(())
    });
}

#[test]
fn the_widget_device_adapter_serves_wasm_pods_and_a_failing_adapter_is_unhealthy() {
    let built = wasmlet_testkit::images::ensure_plugins().expect("the example plugins build");
    let c = cluster();
    let fail_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 15_000;
    let adapter = built["widget-device"].display().to_string();
    let mut opts = node_options(&c, &["hello"]);
    opts.wasmlet_config = format!(
        "  deviceAdapterPeriod: 1s\n  plugins:\n  - name: widgets\n    world: device-adapter-plugin\n    source: {{file: {adapter}}}\n    settings: {{resource-name: example.com/wasm-widget, count: \"2\"}}\n  - name: broken\n    world: device-adapter-plugin\n    source: {{file: {adapter}}}\n    settings: {{resource-name: example.com/broken-widget, count: \"2\", fail-after-ms: \"{fail_at}\"}}\n"
    );
    let node = start_with(opts);
    wait_amounts(&c, "example.com/wasm-widget", ("2", "2"));
    wait_amounts(&c, "example.com/broken-widget", ("2", "2"));

    c.api
        .create(&device_pod(
            "wasm-widget",
            &image("hello"),
            None,
            "example.com/wasm-widget",
            1,
        ))
        .unwrap();
    let wasm = wait("the Wasm pod to finish", LONG, || {
        get_pod(&c, "wasm-widget").filter(|p| phase(p) == "Succeeded")
    });
    let text = log_text(&node, &wasm);
    assert!(text.contains("env WIDGET_IDS=widget-0"), "{text}");

    // The broken adapter starts trapping: its devices go unhealthy, with an event.
    wait_amounts(&c, "example.com/broken-widget", ("2", "0"));
    let event = wait("the adapter's failure event", LONG, || {
        c.api
            .list::<Event>(Some("default"))
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("DeviceAdapterFailed"))
    });
    assert_eq!(event.involved_object.kind.as_deref(), Some("Node"));
    assert!(
        event.message.unwrap_or_default().contains("broken"),
        "the event names the adapter"
    );
    // The healthy adapter is untouched.
    assert_eq!(
        node_amounts(&c, "example.com/wasm-widget"),
        Some(("2".into(), "2".into()))
    );
}

/// A sysfs with two NUMA nodes of two CPUs each.
fn two_numa_sysfs(root: &Path) {
    let cpu = root.join("devices/system/cpu");
    std::fs::create_dir_all(&cpu).unwrap();
    std::fs::write(cpu.join("online"), "0-3\n").unwrap();
    for i in 0..4u32 {
        let t = cpu.join(format!("cpu{i}/topology"));
        std::fs::create_dir_all(&t).unwrap();
        std::fs::write(t.join("physical_package_id"), format!("{}\n", i / 2)).unwrap();
        std::fs::write(t.join("core_id"), format!("{i}\n")).unwrap();
    }
    for n in 0..2u32 {
        let d = root.join(format!("devices/system/node/node{n}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("cpulist"), format!("{}-{}\n", 2 * n, 2 * n + 1)).unwrap();
        let distance = if n == 0 { "10 20\n" } else { "20 10\n" };
        std::fs::write(d.join("distance"), distance).unwrap();
    }
}

/// A node on the two-NUMA fixture with the CPU manager's static policy (CPU 0
/// reserved) and the topology manager's `policy`.
fn topology_node(c: &Cluster, sysfs: &Path, policy: &str) -> Fixture {
    let mut opts: NodeOptions = node_options(c, &["hello"]);
    opts.kubelet_config = format!(
        "topologyManagerPolicy: {policy}\ncpuManagerPolicy: static\nreservedSystemCPUs: \"0\"\n"
    );
    opts.wasmlet_config = format!("  sysfsRoot: {}\n", sysfs.display());
    start_with(opts)
}

/// A Guaranteed Wasm pod asking for one whole CPU and `n` widgets.
fn cpu_and_widgets_pod(name: &str, n: u32) -> Pod {
    let mut pod = device_pod(name, &image("hello"), None, WIDGET, n);
    let amounts = serde_json::json!({ "cpu": "1", "memory": "32Mi", WIDGET: n.to_string() });
    pod.spec.as_mut().unwrap().containers[0].resources = Some(
        serde_json::from_value(serde_json::json!({ "requests": amounts, "limits": amounts }))
            .unwrap(),
    );
    pod
}

#[test]
fn the_topology_manager_places_device_pods_on_one_numa_node_or_refuses_them() {
    let sysfs = tempfile::tempdir().unwrap();
    two_numa_sysfs(sysfs.path());

    // single-numa-node: one CPU and two widgets fit node 0 or 1; one CPU and three
    // widgets need both nodes.
    let c = cluster();
    let node = topology_node(&c, sysfs.path(), "single-numa-node");
    let plugin = TestDevicePlugin::start(&device_dir(&node), "widget", WIDGET, four_widgets())
        .expect("the device plugin starts");
    wait_amounts(&c, WIDGET, ("4", "4"));
    c.api.create(&cpu_and_widgets_pod("fits", 2)).unwrap();
    let fits = wait("the fitting pod to run to completion", LONG, || {
        get_pod(&c, "fits").filter(|p| phase(p) == "Succeeded")
    });
    let ids = plugin.allocations()[0].clone();
    let numa = |id: &str| id.trim_start_matches('w').parse::<u32>().unwrap() / 2;
    assert_eq!(numa(&ids[0]), numa(&ids[1]), "{ids:?} share a NUMA node");
    // Its CPU is on the same NUMA node (CPUs 0-1 are node 0, 2-3 node 1).
    let state = std::fs::read_to_string(node.dir().join("root").join("cpu_manager_state")).unwrap();
    let uid = fits.metadata.uid.clone().unwrap();
    let cpu: u32 = state
        .split(&format!("\"{uid}\":{{\"main\":\""))
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("the pod's CPU in {state}"));
    assert_eq!(
        cpu / 2,
        numa(&ids[0]),
        "CPU {cpu} and {ids:?} on one NUMA node"
    );
    c.api.create(&cpu_and_widgets_pod("spans", 3)).unwrap();
    let (reason, message) = failed_with(&c, "spans");
    assert_eq!(reason, "TopologyAffinityError");
    assert_eq!(
        message,
        "Resources cannot be allocated with Topology locality"
    );
    drop(plugin);
    drop(node);

    // best-effort admits both, and logs the hints it chose.
    let c = cluster();
    let node = topology_node(&c, sysfs.path(), "best-effort");
    let _plugin = TestDevicePlugin::start(&device_dir(&node), "widget", WIDGET, four_widgets())
        .expect("the device plugin starts");
    wait_amounts(&c, WIDGET, ("4", "4"));
    for (name, n) in [("fits", 2), ("spans", 3)] {
        c.api.create(&cpu_and_widgets_pod(name, n)).unwrap();
        wait(&format!("{name} to run to completion"), LONG, || {
            get_pod(&c, name).filter(|p| phase(p) == "Succeeded")
        });
    }
    let log = node.log();
    assert!(
        log.contains("best TopologyHint"),
        "{}",
        wasmlet_testkit::node::tail(&log, 40)
    );
}

/// A static busybox pod printing its cpuset (as its cpuset cgroup and the kernel
/// show it), then sleeping `seconds` (which names its process), with `resources`.
fn cpuset_pod(name: &str, resources: &str, seconds: u32) -> String {
    let script = format!(
        "echo cgroup=$(cat /sys/fs/cgroup/cpuset/cpuset.cpus); grep Cpus_allowed_list /proc/self/status; exec sleep {seconds}"
    );
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: {}\n    imagePullPolicy: Never\n    command: [sh, -c, {script:?}]\n    resources: {resources}\n",
        wasmlet_testkit::containerd::images::BUSYBOX_IMAGE
    )
}

const ONE_CPU: &str = "{requests: {cpu: \"1\", memory: 32Mi}, limits: {cpu: \"1\", memory: 32Mi}}";

fn log_line(node: &Fixture, pod: &Pod, prefix: &str) -> String {
    wait(&format!("{prefix} in the log"), LONG, || {
        log_text(node, pod)
            .lines()
            .find(|l| l.starts_with(prefix))
            .map(str::to_owned)
    })
}

/// `cpuset.cpus` of the cpuset cgroup of the process running `sleep <seconds>`, read
/// from the host.
fn cpuset_of_sleeper(seconds: u32) -> Option<String> {
    let want = format!("sleep\0{seconds}\0");
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if cmdline != want.as_bytes() {
            continue;
        }
        let cgroups = std::fs::read_to_string(entry.path().join("cgroup")).ok()?;
        let path = cgroups.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers
                .split(',')
                .any(|c| c == "cpuset")
                .then(|| path.to_owned())
        })?;
        let file = format!("/sys/fs/cgroup/cpuset{path}/cpuset.cpus");
        return std::fs::read_to_string(file)
            .ok()
            .map(|s| s.trim().to_owned());
    }
    None
}

fn wait_cpuset(seconds: u32, want: &str) {
    wait(
        &format!("the cpuset of sleep {seconds} to be {want}"),
        LONG,
        || (cpuset_of_sleeper(seconds).as_deref() == Some(want)).then_some(()),
    );
}

#[test]
fn the_static_cpu_manager_gives_a_guaranteed_pod_a_cpu_of_its_own_and_keeps_it_across_a_restart() {
    use wasmlet_testkit::containerd::Containerd;
    let containerd = Containerd::start().expect("containerd starts");
    containerd.import_test_images().expect("test images import");
    let mut node = start_with(
        NodeOptions {
            images: vec!["ticker".into()],
            kubelet_config: "cpuManagerPolicy: static\nkubeReserved: {cpu: 500m}\n".into(),
            ..Default::default()
        }
        .with_cri(containerd.address()),
    );
    // On this two-CPU machine, CPU 0 is reserved (kubeReserved rounds up to one)
    // and CPU 1 goes to the Guaranteed pod; everything else shares what is left.
    node.write_manifest("shared.yaml", &cpuset_pod("shared", "{}", 6011))
        .unwrap();
    let shared = node.wait_pod("shared", LONG, is_running).unwrap();
    assert_eq!(log_line(&node, &shared, "cgroup="), "cgroup=0-1");

    node.write_manifest("pinned.yaml", &cpuset_pod("pinned", ONE_CPU, 6012))
        .unwrap();
    let pinned = node.wait_pod("pinned", LONG, is_running).unwrap();
    assert_eq!(log_line(&node, &pinned, "cgroup="), "cgroup=1");
    assert!(log_line(&node, &pinned, "Cpus_allowed_list").ends_with("\t1"));
    wait_cpuset(6012, "1");
    // The shared pool shrinks: the running shared container is moved off CPU 1.
    wait_cpuset(6011, "0");

    // A Wasm sandbox is pinned the same way: a shared one to the shared pool.
    node.write_manifest("tick.yaml", &manifest("tick", "ticker", "Always", ""))
        .unwrap();
    node.wait_pod("tick", LONG, is_running).unwrap();
    let sandbox = node.sandbox_pids()[0];
    let allowed = std::fs::read_to_string(format!("/proc/{sandbox}/status")).unwrap();
    assert!(
        allowed.lines().any(|l| l == "Cpus_allowed_list:\t0"),
        "{}",
        allowed
            .lines()
            .filter(|l| l.starts_with("Cpus"))
            .collect::<Vec<_>>()
            .join("\n")
    );

    // The state, in the kubelet's checkpoint, survives a killed node.
    let state_file = node.dir().join("root").join("cpu_manager_state");
    let state = std::fs::read_to_string(&state_file).unwrap();
    let uid = pinned.metadata.uid.clone().unwrap();
    assert!(
        state.starts_with(&format!(
            r#"{{"policyName":"static","defaultCpuSet":"0","entries":{{"{uid}":{{"main":"1"}}}}"#
        )),
        "{state}"
    );
    node.kill();
    node.restart().expect("the node starts again");
    let again = node.wait_pod("pinned", LONG, is_running).unwrap();
    assert_eq!(
        container(&again).container_id,
        container(&pinned).container_id
    );
    node.write_manifest("second.yaml", &cpuset_pod("second", ONE_CPU, 6013))
        .unwrap();
    let second = node
        .wait_pod("second", LONG, |p| phase(p) == "Failed")
        .unwrap();
    let status = second.status.unwrap();
    assert_eq!(status.reason.as_deref(), Some("UnexpectedAdmissionError"));
    assert_eq!(
        status.message.as_deref(),
        Some(
            "Allocate failed due to not enough cpus available to satisfy request: requested=1, available=0, which is unexpected"
        )
    );
    assert_eq!(std::fs::read_to_string(&state_file).unwrap(), state);

    // The Guaranteed pod goes: its CPU returns to the shared pool, and the running
    // shared container gets it back.
    node.remove_manifest("pinned.yaml").unwrap();
    node.wait_gone("pinned", LONG).unwrap();
    node.remove_manifest("second.yaml").unwrap();
    wait_cpuset(6011, "0-1");
}

#[test]
fn a_device_plugin_registers_through_the_plugin_watcher_and_is_told_why_not() {
    let c = cluster();
    let node = start_with(node_options(&c, &[]));
    let registry = node.dir().join("root").join("plugins_registry");
    let gadgets = vec![TestDevice::new("g0", None), TestDevice::new("g1", None)];
    let plugin = TestDevicePlugin::start_in_registry(
        &registry,
        "gadget",
        "example.com/gadget",
        gadgets.clone(),
    )
    .expect("the plugin starts");
    wait_amounts(&c, "example.com/gadget", ("2", "2"));
    assert_eq!(plugin.statuses(), [(true, String::new())]);

    // A plugin whose name is not an extended resource name is refused, and told why.
    let bad = TestDevicePlugin::start_in_registry(&registry, "bad", "gadget", gadgets)
        .expect("the plugin starts");
    let (registered, error) = wait("the node's answer", LONG, || {
        bad.statuses().first().cloned()
    });
    assert!(!registered);
    assert_eq!(error, "the ResourceName \"gadget\" is invalid");

    // Its socket gone, the plugin's devices are unhealthy.
    drop(plugin);
    wait_amounts(&c, "example.com/gadget", ("2", "0"));
}
