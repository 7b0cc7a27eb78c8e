//! `/stats/summary` and `/metrics/resource` on a standalone node's API (client
//! certificates against `--client-ca-file`, AlwaysAllow), checked against the pod
//! cgroup's own files read around each request: a Wasm pod burning CPU under a
//! 300m limit and one holding 48 MiB; a busybox container (containerd) whose figures
//! are its own cgroup's below the pod's.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;
use wasmlet_testkit::containerd::{Containerd, images::BUSYBOX_IMAGE};
use wasmlet_testkit::node::{NodeApiAuth, NodeOptions, TestNode, poll};
use wasmlet_testkit::pki::Ca;

use crate::cgroups::{pod_cgroup, read};
use crate::*;

fn wasm_pod(name: &str, image_name: &str, resources: &str, env: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    image: {}\n    imagePullPolicy: IfNotPresent\n    env: [{env}]\n{resources}",
        image(image_name)
    )
}

/// What the pod cgroup's files say now: cpu ns, working set bytes.
fn cgroup_figures(node: &TestNode, pod: &Pod) -> (u64, u64) {
    figures(
        pod_cgroup(node, "cpuacct", "Guaranteed", pod),
        pod_cgroup(node, "memory", "Guaranteed", pod),
    )
}

/// What a cgroup v1's files say now: cpu ns, working set bytes.
fn figures(cpuacct: PathBuf, mem: PathBuf) -> (u64, u64) {
    let cpu: u64 = read(cpuacct.join("cpuacct.usage")).parse().unwrap();
    let usage: u64 = read(mem.join("memory.usage_in_bytes")).parse().unwrap();
    let stat = read(mem.join("memory.stat"));
    let inactive: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("total_inactive_file "))
        .unwrap()
        .parse()
        .unwrap();
    (cpu, usage.saturating_sub(inactive))
}

fn within(got: f64, lo: f64, hi: f64, what: &str) {
    assert!(
        got >= lo * 0.8 && got <= hi * 1.2,
        "{what}: reported {got}, the cgroup said {lo}..{hi}"
    );
}

/// The samples of a Prometheus text, `name{labels}` → value.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

/// A client CA the node trusts (`--client-ca-file`, AlwaysAllow) and a certificate
/// from it.
pub(crate) struct ApiClient {
    _dir: tempfile::TempDir,
    ca_file: PathBuf,
    cert: String,
    key: String,
}

impl ApiClient {
    pub(crate) fn new() -> Self {
        let ca = Ca::new("stats-client-ca");
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("client-ca.crt");
        std::fs::write(&ca_file, ca.pem()).unwrap();
        let (cert, key) = ca
            .issue_client("stats-reader", &[], Duration::from_secs(3600))
            .unwrap();
        ApiClient {
            _dir: dir,
            ca_file,
            cert,
            key,
        }
    }

    pub(crate) fn auth(&self) -> NodeApiAuth<'_> {
        NodeApiAuth::ClientCert {
            cert_pem: &self.cert,
            key_pem: &self.key,
        }
    }

    pub(crate) fn options(&self, mut opts: NodeOptions) -> NodeOptions {
        opts.extra_args.extend([
            "--client-ca-file".into(),
            self.ca_file.display().to_string(),
            "--authorization-mode".into(),
            "AlwaysAllow".into(),
        ]);
        opts
    }
}

fn pod_stats<'a>(summary: &'a Value, name: &str) -> &'a Value {
    summary["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["podRef"]["name"] == name)
        .unwrap_or_else(|| panic!("no pod {name} in {summary:#}"))
}

#[test]
fn stats_summary_and_resource_metrics_match_the_pod_cgroups() {
    let client = ApiClient::new();
    let auth = client.auth();
    let opts = client.options(NodeOptions {
        images: vec!["spin".into(), "memhog".into()],
        ..Default::default()
    });
    let node = start_with(opts);
    let limits = "    resources: {limits: {cpu: 300m, memory: 128Mi}}\n";
    node.write_manifest("burn.yaml", &wasm_pod("burn", "spin", limits, ""))
        .unwrap();
    node.write_manifest(
        "hog.yaml",
        &wasm_pod("hog", "memhog", limits, "{name: MIB, value: \"48\"}"),
    )
    .unwrap();
    let burn = node.wait_pod("burn", LONG, is_running).unwrap();
    let hog = node.wait_pod("hog", LONG, is_running).unwrap();
    let burn_name = burn.metadata.name.clone().unwrap();
    let hog_name = hog.metadata.name.clone().unwrap();
    let namespace = burn.metadata.namespace.clone().unwrap();
    poll(Duration::from_secs(20), || {
        (cgroup_figures(&node, &burn).0 > 300_000_000).then_some(())
    })
    .expect("the spinner runs");
    poll(Duration::from_secs(20), || {
        (cgroup_figures(&node, &hog).1 > 48 << 20).then_some(())
    })
    .expect("memhog holds its 48 MiB");

    let get = |path: &str| {
        let (code, body) = node.api_get(path, auth).unwrap();
        assert_eq!(code, 200, "{path}: {body}");
        body
    };
    let summary = |burn_before: &mut (u64, u64), burn_after: &mut (u64, u64)| {
        *burn_before = cgroup_figures(&node, &burn);
        let s: Value = serde_json::from_str(&get("/stats/summary")).unwrap();
        *burn_after = cgroup_figures(&node, &burn);
        s
    };

    // First reading.
    let (mut b0, mut a0) = ((0, 0), (0, 0));
    let t0 = Instant::now();
    let s0 = summary(&mut b0, &mut a0);
    let first = pod_stats(&s0, &burn_name);
    let cpu0 = first["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap();
    within(cpu0 as f64, b0.0 as f64, a0.0 as f64, "burn cpu (1st)");
    assert!(
        first["cpu"]["usageNanoCores"].as_u64().is_some(),
        "{first:#}"
    );

    // Three seconds of burning later.
    std::thread::sleep(Duration::from_secs(3));
    let (mut b1, mut a1) = ((0, 0), (0, 0));
    let s1 = summary(&mut b1, &mut a1);
    let window = t0.elapsed().as_secs_f64();
    let second = pod_stats(&s1, &burn_name);
    let cpu1 = second["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap();
    within(cpu1 as f64, b1.0 as f64, a1.0 as f64, "burn cpu (2nd)");
    assert!(
        cpu1 > cpu0 + 300_000_000,
        "cpu moves when it burns: {cpu0} then {cpu1}"
    );
    let cgroup_rate = (a1.0 - b0.0) as f64 / window;
    let rate = second["cpu"]["usageNanoCores"].as_u64().unwrap() as f64;
    within(rate, cgroup_rate, cgroup_rate, "burn usageNanoCores");
    let ws = second["memory"]["workingSetBytes"].as_u64().unwrap() as f64;
    within(
        ws,
        b1.1.min(a1.1) as f64,
        b1.1.max(a1.1) as f64,
        "burn working set",
    );
    // The one Wasm container carries its pod's figures.
    let c = &second["containers"][0];
    assert_eq!(c["name"], "main");
    assert!(c["startTime"].is_string(), "{c:#}");
    within(
        c["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap() as f64,
        b1.0 as f64,
        a1.0 as f64,
        "burn container cpu",
    );

    let hog_cg = cgroup_figures(&node, &hog);
    let hog_ws = pod_stats(&s1, &hog_name)["memory"]["workingSetBytes"]
        .as_u64()
        .unwrap();
    within(
        hog_ws as f64,
        hog_cg.1 as f64,
        hog_cg.1 as f64,
        "hog working set",
    );
    assert!(hog_ws >= 48 << 20, "hog working set {hog_ws}");
    let n = &s1["node"];
    assert_eq!(n["nodeName"], "e2e");
    assert!(n["cpu"]["usageNanoCores"].as_u64().unwrap() > 0, "{n:#}");
    assert!(
        n["memory"]["workingSetBytes"].as_u64().unwrap() > hog_ws,
        "{n:#}"
    );
    assert!(n["fs"]["capacityBytes"].as_u64().unwrap() > 0, "{n:#}");
    assert!(n["rlimit"]["maxpid"].as_i64().unwrap() > 0, "{n:#}");
    eprintln!(
        "summary: burn cpu {cpu1} ns (cgroup {}..{}), rate {rate:.0} nano-cores (cgroup {cgroup_rate:.0}), working set {ws} (cgroup {}..{}); hog working set {hog_ws} (cgroup {})",
        b1.0, a1.0, b1.1, a1.1, hog_cg.1
    );

    // metrics-server's subset.
    let only: Value =
        serde_json::from_str(&get("/stats/summary?only_cpu_and_memory=true")).unwrap();
    assert!(only["node"].get("fs").is_none(), "{only:#}");
    assert!(pod_stats(&only, &burn_name)["cpu"]["usageCoreNanoSeconds"].is_u64());

    // The resource metrics.
    let before = cgroup_figures(&node, &burn);
    let text = get("/metrics/resource");
    let after = cgroup_figures(&node, &burn);
    let m = samples(&text);
    let pod_labels = format!("{{namespace=\"{namespace}\",pod=\"{burn_name}\"}}");
    let container_labels =
        format!("{{container=\"main\",namespace=\"{namespace}\",pod=\"{burn_name}\"}}");
    let value = |k: &str| *m.get(k).unwrap_or_else(|| panic!("{k} is not in\n{text}"));
    let pod_cpu = value(&format!("pod_cpu_usage_seconds_total{pod_labels}"));
    within(
        pod_cpu * 1e9,
        before.0 as f64,
        after.0 as f64,
        "pod_cpu_usage_seconds_total",
    );
    let pod_ws = value(&format!("pod_memory_working_set_bytes{pod_labels}"));
    within(
        pod_ws,
        before.1.min(after.1) as f64,
        before.1.max(after.1) as f64,
        "pod_memory_working_set_bytes",
    );
    within(
        value(&format!(
            "container_cpu_usage_seconds_total{container_labels}"
        )) * 1e9,
        before.0 as f64,
        after.0 as f64,
        "container_cpu_usage_seconds_total",
    );
    assert!(value(&format!("container_start_time_seconds{container_labels}")) > 1.7e9);
    assert!(value("node_cpu_usage_seconds_total") > pod_cpu);
    assert!(value("node_memory_working_set_bytes") > pod_ws);
    assert_eq!(value("resource_scrape_error"), 0.0);
    assert!(
        text.contains("# TYPE pod_cpu_usage_seconds_total counter\n"),
        "{text}"
    );
    eprintln!(
        "metrics: pod cpu {pod_cpu:.3} s (cgroup {:.3}..{:.3}), working set {pod_ws} (cgroup {}..{})",
        before.0 as f64 / 1e9,
        after.0 as f64 / 1e9,
        before.1,
        after.1
    );

    // cAdvisor's series of the Wasm pod: its cgroup, and its one container with it.
    let before = cgroup_figures(&node, &burn);
    let text = get("/metrics/cadvisor");
    let after = cgroup_figures(&node, &burn);
    let m = samples(&text);
    let series = |metric: &str, container: &str| -> f64 {
        let want = [
            format!("{metric}{{container=\"{container}\""),
            format!("namespace=\"{namespace}\",pod=\"{burn_name}\"}}"),
        ];
        m.iter()
            .find(|(k, _)| k.starts_with(&want[0]) && k.ends_with(&want[1]))
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("no {metric} of {container:?} in {burn_name}\n{text}"))
    };
    for container in ["", "main"] {
        within(
            series("container_cpu_usage_seconds_total", container) * 1e9,
            before.0 as f64,
            after.0 as f64,
            "cadvisor cpu",
        );
        within(
            series("container_memory_working_set_bytes", container),
            before.1.min(after.1) as f64,
            before.1.max(after.1) as f64,
            "cadvisor working set",
        );
        // The pod cgroup's limit (the sandbox's overhead included).
        let limit: u64 =
            read(pod_cgroup(&node, "memory", "Guaranteed", &burn).join("memory.limit_in_bytes"))
                .parse()
                .unwrap();
        assert_eq!(
            series("container_spec_memory_limit_bytes", container),
            limit as f64
        );
    }
}

#[test]
fn a_cri_containers_stats_are_its_own_cgroups() {
    let containerd = Containerd::start().expect("containerd starts");
    containerd.import_test_images().expect("test images import");
    let client = ApiClient::new();
    let node = start_with(client.options(NodeOptions::default().with_cri(containerd.address())));
    node.write_manifest(
        "cburn.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: cburn}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: {BUSYBOX_IMAGE}\n    imagePullPolicy: Never\n    command: [sh, -c, 'dd if=/dev/zero of=/big bs=1M count=3 && dd if=/dev/zero of=/scratch/f bs=1M count=2 && echo written && while :; do :; done']\n    volumeMounts: [{{name: scratch, mountPath: /scratch}}]\n    resources: {{limits: {{cpu: 200m, memory: 64Mi}}}}\n  volumes: [{{name: scratch, emptyDir: {{}}}}]\n"
        ),
    )
    .unwrap();
    let pod = node.wait_pod("cburn", LONG, is_running).unwrap();
    let name = pod.metadata.name.clone().unwrap();
    let id = container(&pod).container_id.unwrap();
    let id = id.split_once("://").unwrap().1.to_owned();
    let own = |hierarchy: &str| {
        let dir = pod_cgroup(&node, hierarchy, "Guaranteed", &pod);
        std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .find(|p| p.file_name().unwrap().to_string_lossy().contains(&id))
            .unwrap_or_else(|| panic!("no cgroup of {id} under {}", dir.display()))
    };
    let ctr = || figures(own("cpuacct"), own("memory"));
    poll(Duration::from_secs(20), || {
        (ctr().0 > 200_000_000).then_some(())
    })
    .expect("the loop runs");

    let before = (ctr(), cgroup_figures(&node, &pod));
    let (code, body) = node.api_get("/stats/summary", client.auth()).unwrap();
    let after = (ctr(), cgroup_figures(&node, &pod));
    assert_eq!(code, 200, "{body}");
    let summary: Value = serde_json::from_str(&body).unwrap();
    let p = pod_stats(&summary, &name);
    let c = &p["containers"][0];
    assert_eq!(c["name"], "main");
    let c_cpu = c["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap();
    within(
        c_cpu as f64,
        before.0.0 as f64,
        after.0.0 as f64,
        "container cpu",
    );
    let c_ws = c["memory"]["workingSetBytes"].as_u64().unwrap();
    within(
        c_ws as f64,
        before.0.1.min(after.0.1) as f64,
        before.0.1.max(after.0.1) as f64,
        "container working set",
    );
    let p_cpu = p["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap();
    within(p_cpu as f64, before.1.0 as f64, after.1.0 as f64, "pod cpu");
    // The pod's cgroup holds the container's and the sandbox's.
    assert!(p_cpu >= c_cpu, "pod {p_cpu} < container {c_cpu}");
    // The pod's network: the interfaces of the container's network namespace.
    let pid = std::fs::read_to_string(own("cpuacct").join("cgroup.procs")).unwrap();
    let pid = pid.lines().next().expect("a process in the container");
    let dev = std::fs::read_to_string(format!("/proc/{pid}/net/dev")).unwrap();
    let mut want: Vec<String> = dev
        .lines()
        .skip(2)
        .filter_map(|l| Some(l.split_once(':')?.0.trim().to_owned()))
        .filter(|n| n != "lo")
        .collect();
    want.sort();
    let mut got: Vec<String> = p["network"]["interfaces"]
        .as_array()
        .unwrap_or_else(|| panic!("no pod network in {p}"))
        .iter()
        .map(|i| {
            assert!(i["rxBytes"].is_u64(), "{i}");
            i["name"].as_str().unwrap().to_owned()
        })
        .collect();
    got.sort();
    assert_eq!(got, want, "the pod's interfaces");

    // Disk: the emptyDir and the container's log directory as du measures them, the
    // writable layer as containerd reports it (it refreshes its snapshot usage every
    // few seconds), the ephemeral storage their sum and the pod log directory's.
    let uid = pod.metadata.uid.clone().unwrap();
    let scratch = node
        .dir()
        .join("root/pods")
        .join(&uid)
        .join("volumes/kubernetes.io~empty-dir/scratch");
    let log_dir = node.dir().join(format!("pods/default_{name}_{uid}/main"));
    let du = |path: &std::path::Path| -> u64 {
        let out = std::process::Command::new("du")
            .args(["-x", "-s", "-B", "1"])
            .arg(path)
            .output()
            .unwrap();
        assert!(out.status.success(), "du {}", path.display());
        let text = String::from_utf8(out.stdout).unwrap();
        text.split_whitespace().next().unwrap().parse().unwrap()
    };
    let three_mib = 3 << 20;
    let disk = poll(LONG, || {
        let (_, body) = node.api_get("/stats/summary", client.auth()).ok()?;
        let summary: Value = serde_json::from_str(&body).ok()?;
        let p = pod_stats(&summary, &name).clone();
        let rootfs = p["containers"][0]["rootfs"]["usedBytes"].as_u64()?;
        (rootfs >= three_mib).then_some(p)
    })
    .unwrap_or_else(|| panic!("no rootfs of 3 MiB in the summary\n{}", node.log()));
    let c = &disk["containers"][0];
    let rootfs = c["rootfs"]["usedBytes"].as_u64().unwrap();
    assert!(rootfs < three_mib + (1 << 20), "rootfs {rootfs}");
    assert!(
        c["rootfs"]["capacityBytes"].as_u64().unwrap() > rootfs,
        "{c}"
    );
    let logs = c["logs"]["usedBytes"].as_u64().unwrap();
    assert_eq!(logs, du(&log_dir), "container logs");
    let volume = disk["volume"]
        .as_array()
        .unwrap_or_else(|| panic!("no volumes in {disk}"))
        .iter()
        .find(|v| v["name"] == "scratch")
        .unwrap_or_else(|| panic!("no scratch volume in {disk}"));
    let scratch_bytes = volume["usedBytes"].as_u64().unwrap();
    assert_eq!(scratch_bytes, du(&scratch), "the emptyDir");
    assert!(scratch_bytes >= 2 << 20, "{volume}");
    assert_eq!(volume["inodesUsed"], 2, "{volume}");
    let ephemeral = disk["ephemeral-storage"]["usedBytes"].as_u64().unwrap();
    assert!(
        ephemeral >= rootfs + logs + scratch_bytes,
        "ephemeral {ephemeral} < rootfs {rootfs} + logs {logs} + volume {scratch_bytes}"
    );

    // /metrics/cadvisor: the container's own cgroup, labelled as the kubelet does.
    let cad_before = ctr();
    let (code, text) = node.api_get("/metrics/cadvisor", client.auth()).unwrap();
    let cad_after = ctr();
    assert_eq!(code, 200, "{text}");
    let series = samples(&text);
    let find = |metric: &str, labels: &[&str]| -> f64 {
        series
            .iter()
            .find(|(k, _)| {
                k.starts_with(&format!("{metric}{{")) && labels.iter().all(|l| k.contains(l))
            })
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("no {metric} with {labels:?} in\n{text}"))
    };
    let name_label = format!(r#"name="{id}""#);
    let pod_label = format!(r#"pod="{name}""#);
    let image_label = format!(r#"image="{BUSYBOX_IMAGE}""#);
    let ctr_labels = [
        r#"container="main""#,
        pod_label.as_str(),
        r#"namespace="default""#,
        name_label.as_str(),
        image_label.as_str(),
    ];
    let mut cpu_labels = ctr_labels.to_vec();
    cpu_labels.push(r#"cpu="total""#);
    let cpu = find("container_cpu_usage_seconds_total", &cpu_labels);
    within(
        cpu,
        cad_before.0 as f64 / 1e9,
        cad_after.0 as f64 / 1e9,
        "cadvisor cpu",
    );
    let ws = find("container_memory_working_set_bytes", &ctr_labels);
    within(
        ws,
        cad_before.1.min(cad_after.1) as f64,
        cad_before.1.max(cad_after.1) as f64,
        "cadvisor working set",
    );
    assert_eq!(
        find("container_spec_memory_limit_bytes", &ctr_labels),
        (64u64 << 20) as f64
    );
    let pod_labels = [r#"container="""#, pod_label.as_str()];
    find("container_memory_working_set_bytes", &pod_labels);
    let iface = format!(r#"interface="{}""#, want[0]);
    let mut rx_labels = pod_labels.to_vec();
    rx_labels.push(&iface);
    find("container_network_receive_bytes_total", &rx_labels);
    find("container_cpu_usage_seconds_total", &[r#"id="/""#]);
    assert_eq!(series.get("container_scrape_error"), Some(&0.0), "{text}");

    eprintln!(
        "cri disk: rootfs {rootfs} B, logs {logs} B, emptyDir {scratch_bytes} B, ephemeral {ephemeral} B; cadvisor cpu {cpu} s ({}..{}), working set {ws}",
        cad_before.0 as f64 / 1e9,
        cad_after.0 as f64 / 1e9
    );
    eprintln!(
        "cri: container cpu {c_cpu} ns (cgroup {}..{}), working set {c_ws} (cgroup {}..{}); pod cpu {p_cpu} (cgroup {}..{})",
        before.0.0, after.0.0, before.0.1, after.0.1, before.1.0, after.1.0
    );
}
