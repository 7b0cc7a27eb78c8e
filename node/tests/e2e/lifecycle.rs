//! A manifest becomes a running pod; exits become phases; Always restarts with back-off.

use std::time::{Duration, Instant};

use crate::*;

#[test]
fn a_new_manifest_is_running_within_a_second_and_logs_in_cri_format() {
    let node = start(&["ticker"]);
    // The first pod of an image pays for compiling it once per node.
    node.write_manifest("warm.yaml", &manifest("warm", "ticker", "Always", ""))
        .unwrap();
    node.wait_pod("warm", LONG, is_running).unwrap();

    let written = Instant::now();
    node.write_manifest("tick.yaml", &manifest("tick", "ticker", "Always", ""))
        .unwrap();
    let pod = node
        .wait_pod("tick", Duration::from_secs(1), is_running)
        .expect("running within a second of the manifest appearing");
    eprintln!("manifest -> Running in {:?}", written.elapsed());

    let records = wasmlet_testkit::node::poll(Duration::from_secs(10), || {
        let r = node.container_log(&pod, "main", 0).ok()?;
        (r.len() >= 2).then_some(r)
    })
    .expect("two ticks logged");
    assert_eq!(records[0].stream, "stdout");
    assert!(!records[0].partial);
    assert_eq!(records[0].text, "tick 1");
    assert_eq!(records[1].text, "tick 2");
    // RFC 3339 with nanoseconds, as the CRI log format has it.
    assert_eq!(
        records[0].time.len(),
        "2026-01-02T03:04:05.123456789Z".len(),
        "{}",
        records[0].time
    );
    let uid = pod.metadata.uid.clone().unwrap();
    assert!(
        node.logs
            .join(format!("default_tick-e2e_{uid}/main/0.log"))
            .is_file(),
        "log file at <podLogsDir>/<ns>_<name>_<uid>/<container>/<restartCount>.log"
    );
}

#[test]
fn exit_codes_become_succeeded_or_failed_with_the_exit_code() {
    let node = start(&["hello"]);
    let env = |code: i32| format!("    env:\n    - name: EXIT_CODE\n      value: \"{code}\"\n");
    node.write_manifest("ok.yaml", &manifest("ok", "hello", "Never", &env(0)))
        .unwrap();
    node.write_manifest("bad.yaml", &manifest("bad", "hello", "Never", &env(3)))
        .unwrap();
    node.write_manifest(
        "onfail.yaml",
        &manifest("onfail", "hello", "OnFailure", &env(0)),
    )
    .unwrap();

    let ok = node
        .wait_pod("ok", LONG, |p| phase(p) == "Succeeded")
        .unwrap();
    assert_eq!(terminated_exit(&ok), Some((0, "Completed".into())));
    assert_eq!(container(&ok).restart_count, 0);
    assert!(!container(&ok).ready);

    let bad = node
        .wait_pod("bad", LONG, |p| phase(p) == "Failed")
        .unwrap();
    assert_eq!(terminated_exit(&bad), Some((3, "Error".into())));
    assert_eq!(container(&bad).restart_count, 0);

    let onfail = node
        .wait_pod("onfail", LONG, |p| phase(p) == "Succeeded")
        .unwrap();
    assert_eq!(terminated_exit(&onfail), Some((0, "Completed".into())));

    let conditions = ok.status.unwrap().conditions.unwrap();
    let ready = conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_deref()),
        ("False", Some("PodCompleted"))
    );
}

#[test]
fn always_restarts_with_a_doubling_back_off() {
    // Back-off 500 ms doubling to 2 s (the node's config; the kubelet's is 10 s to 5 min).
    // Container GC keeps every dead attempt, so their logs can be read.
    let node = start_with(NodeOptions {
        images: vec!["hello".into()],
        extra_args: vec!["--maximum-dead-containers-per-container=-1".into()],
        ..Default::default()
    });
    node.write_manifest(
        "crash.yaml",
        &manifest(
            "crash",
            "hello",
            "Always",
            "    env:\n    - name: EXIT_CODE\n      value: \"1\"\n",
        ),
    )
    .unwrap();
    let pod = node
        .wait_pod("crash", LONG, |p| container(p).restart_count >= 4)
        .unwrap();
    assert_eq!(
        phase(&pod),
        "Running",
        "Always keeps the pod Running while it restarts"
    );

    let looping = node
        .wait_pod("crash", LONG, |p| {
            waiting_reason(p).as_deref() == Some("CrashLoopBackOff")
        })
        .unwrap();
    let c = container(&looping);
    let message = c.state.unwrap().waiting.unwrap().message.unwrap();
    assert!(
        message.starts_with("back-off ") && message.contains("restarting failed container=main"),
        "{message}"
    );
    let last = c.last_state.unwrap().terminated.unwrap();
    assert_eq!(last.exit_code, 1);

    // Each attempt logs its first line as it starts: the gaps are the back-off.
    let start_of = |attempt: u32| {
        let r = node.container_log(&pod, "main", attempt).unwrap();
        jiff::Timestamp::from_str_lossy(&r[0].time)
    };
    let gaps: Vec<f64> = (0..4)
        .map(|a| {
            (start_of(a + 1) - start_of(a))
                .total(jiff::Unit::Second)
                .unwrap()
        })
        .collect();
    eprintln!("gaps between attempts: {gaps:?}");
    assert!(gaps[0] < 0.5, "the first restart is immediate: {gaps:?}");
    assert!(gaps[1] >= 0.5, "then 500 ms: {gaps:?}");
    assert!(gaps[2] >= 1.0, "then 1 s: {gaps:?}");
    assert!(gaps[3] >= 2.0, "then 2 s: {gaps:?}");
}

trait LossyTimestamp {
    fn from_str_lossy(s: &str) -> jiff::Timestamp;
}

impl LossyTimestamp for jiff::Timestamp {
    fn from_str_lossy(s: &str) -> jiff::Timestamp {
        s.parse()
            .unwrap_or_else(|e| panic!("bad timestamp {s:?}: {e}"))
    }
}

#[test]
fn components_and_plain_images_run_from_their_manifests() {
    let node = start(&["hello-component", "hello-plain"]);
    let args = "    args: [\"one\", \"two\"]\n";
    node.write_manifest(
        "c.yaml",
        &manifest("comp", "hello-component", "Never", args),
    )
    .unwrap();
    node.write_manifest("p.yaml", &manifest("plain", "hello-plain", "Never", args))
        .unwrap();
    for name in ["comp", "plain"] {
        let pod = node
            .wait_pod(name, LONG, |p| phase(p) == "Succeeded")
            .unwrap();
        let texts: Vec<String> = node
            .container_log(&pod, "main", 0)
            .unwrap()
            .into_iter()
            .map(|r| r.text)
            .collect();
        assert!(
            texts.contains(&"arg[1]=one".to_string()),
            "{name}: {texts:?}"
        );
        assert!(
            texts.contains(&"arg[2]=two".to_string()),
            "{name}: {texts:?}"
        );
        assert!(container(&pod).image_id.contains("@sha256:"), "{name}");
    }
}

#[test]
fn a_missing_image_is_err_image_never_pull_or_err_image_pull() {
    let node = start(&[]);
    let never = "apiVersion: v1\nkind: Pod\nmetadata: {name: never}\nspec:\n  containers:\n  - {name: main, image: localhost/missing:v1, imagePullPolicy: Never}\n";
    let pull = "apiVersion: v1\nkind: Pod\nmetadata: {name: pull}\nspec:\n  containers:\n  - {name: main, image: localhost/missing:v1}\n";
    node.write_manifest("never.yaml", never).unwrap();
    node.write_manifest("pull.yaml", pull).unwrap();
    let pod = node
        .wait_pod("never", LONG, |p| {
            waiting_reason(p).as_deref() == Some("ErrImageNeverPull")
        })
        .unwrap();
    assert_eq!(phase(&pod), "Pending");
    let pod = node
        .wait_pod("pull", LONG, |p| {
            waiting_reason(p).as_deref() == Some("ErrImagePull")
        })
        .unwrap();
    let message = container(&pod)
        .state
        .unwrap()
        .waiting
        .unwrap()
        .message
        .unwrap();
    assert!(message.contains("wasmlet images import"), "{message}");
    node.wait_pod("pull", LONG, |p| {
        waiting_reason(p).as_deref() == Some("ImagePullBackOff")
    })
    .unwrap();
}

#[test]
fn a_pod_past_its_active_deadline_fails_with_deadline_exceeded() {
    let node = start(&["ticker"]);
    let yaml = manifest("late", "ticker", "Always", "").replace(
        "  restartPolicy: Always\n",
        "  restartPolicy: Always\n  activeDeadlineSeconds: 2\n",
    );
    node.write_manifest("late.yaml", &yaml).unwrap();
    node.wait_pod("late", LONG, is_running).unwrap();
    let started = Instant::now();
    let pod = node
        .wait_pod("late", Duration::from_secs(30), |p| phase(p) == "Failed")
        .unwrap();
    eprintln!(
        "Running -> Failed (deadline 2 s) in {:?}",
        started.elapsed()
    );
    let status = pod.status.clone().unwrap();
    assert_eq!(status.reason.as_deref(), Some("DeadlineExceeded"));
    assert_eq!(
        status.message.as_deref(),
        Some("Pod was active on the node longer than the specified deadline")
    );
    assert!(
        container(&pod).state.unwrap().terminated.is_some(),
        "the container was stopped"
    );
    assert!(node.sandbox_pids().is_empty(), "and its sandbox");
}

#[test]
fn a_wasm_guest_that_observes_the_stop_signal_exits_by_itself_when_its_pod_stops() {
    let node = start(&["graceful", "ticker"]);
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: polite\nspec:\n  restartPolicy: Always\n  activeDeadlineSeconds: 2\n  terminationGracePeriodSeconds: 20\n  containers:\n  - name: graceful\n    image: {graceful}\n    imagePullPolicy: IfNotPresent\n    env: [{{name: CLEANUP_MS, value: \"200\"}}]\n  - name: plain\n    image: {ticker}\n    imagePullPolicy: IfNotPresent\n",
        graceful = image("graceful"),
        ticker = image("ticker")
    );
    node.write_manifest("polite.yaml", &yaml).unwrap();
    node.wait_pod("polite", LONG, is_running).unwrap();
    let pod = node
        .wait_pod("polite", Duration::from_secs(30), |p| phase(p) == "Failed")
        .unwrap();
    let terminated = |name: &str| {
        pod.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.name == name))
            .and_then(|c| c.state.clone()?.terminated)
            .unwrap_or_else(|| panic!("{name} is not terminated: {pod:#?}"))
    };
    // The observing guest handled the stop and exited 0 by itself, well within the
    // 20 s grace; the one that does not observe it was interrupted at once (137).
    let polite = terminated("graceful");
    assert_eq!(
        (polite.exit_code, polite.reason.as_deref()),
        (0, Some("Completed"))
    );
    let plain = terminated("plain");
    assert_eq!(plain.exit_code, 137);
    let stopped_in = polite
        .finished_at
        .unwrap()
        .0
        .duration_since(polite.started_at.unwrap().0);
    assert!(
        stopped_in < jiff::SignedDuration::from_secs(10),
        "ran {stopped_in:?} for a 2 s deadline"
    );
    let log: Vec<String> = node
        .container_log(&pod, "graceful", 0)
        .unwrap()
        .into_iter()
        .map(|r| r.text)
        .collect();
    assert_eq!(
        log[log.len() - 2..],
        ["stop requested", "clean exit"],
        "{log:?}"
    );
}

fn init_statuses(p: &Pod) -> Vec<k8s_openapi::api::core::v1::ContainerStatus> {
    p.status
        .as_ref()
        .and_then(|s| s.init_container_statuses.clone())
        .unwrap_or_default()
}

#[test]
fn init_containers_run_in_order_to_success_before_the_regular_ones() {
    let node = start(&["hello", "ticker"]);
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: init\nspec:\n  terminationGracePeriodSeconds: 5\n  initContainers:\n  - name: first\n    image: {hello}\n    imagePullPolicy: IfNotPresent\n    args: [\"one\"]\n  - name: second\n    image: {hello}\n    imagePullPolicy: IfNotPresent\n    args: [\"two\"]\n  containers:\n  - name: main\n    image: {ticker}\n    imagePullPolicy: IfNotPresent\n",
        hello = image("hello"),
        ticker = image("ticker")
    );
    node.write_manifest("init.yaml", &yaml).unwrap();
    let pod = node.wait_pod("init", LONG, is_running).unwrap();
    let inits = init_statuses(&pod);
    assert_eq!(inits.len(), 2);
    let finished: Vec<_> = inits
        .iter()
        .map(|s| s.state.clone().unwrap().terminated.unwrap())
        .collect();
    assert!(finished.iter().all(|t| t.exit_code == 0));
    assert!(
        finished[0].finished_at <= finished[1].started_at,
        "second started after first finished: {finished:?}"
    );
    let main_started = container(&pod).state.unwrap().running.unwrap().started_at;
    assert!(finished[1].finished_at <= main_started);
    assert_eq!(condition(&pod, "Initialized").as_deref(), Some("True"));
}

#[test]
fn a_failing_init_container_fails_a_never_pod_and_blocks_the_regular_ones() {
    let node = start(&["hello", "ticker"]);
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: badinit\nspec:\n  restartPolicy: Never\n  initContainers:\n  - name: setup\n    image: {hello}\n    imagePullPolicy: IfNotPresent\n    env: [{{name: EXIT_CODE, value: \"3\"}}]\n  containers:\n  - name: main\n    image: {ticker}\n    imagePullPolicy: IfNotPresent\n",
        hello = image("hello"),
        ticker = image("ticker")
    );
    node.write_manifest("badinit.yaml", &yaml).unwrap();
    let pod = node
        .wait_pod("badinit", LONG, |p| phase(p) == "Failed")
        .unwrap();
    let init = init_statuses(&pod)[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(init.exit_code, 3);
    assert_eq!(condition(&pod, "Initialized").as_deref(), Some("False"));
    assert_eq!(
        waiting_reason(&pod).as_deref(),
        Some("PodInitializing"),
        "the regular container never started"
    );
}

#[test]
fn a_sidecar_starts_first_keeps_running_and_stops_after_the_main_container() {
    let node = start(&["hello", "ticker"]);
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: withsidecar\nspec:\n  restartPolicy: Never\n  terminationGracePeriodSeconds: 5\n  initContainers:\n  - name: shipper\n    image: {ticker}\n    imagePullPolicy: IfNotPresent\n    restartPolicy: Always\n  containers:\n  - name: main\n    image: {hello}\n    imagePullPolicy: IfNotPresent\n",
        hello = image("hello"),
        ticker = image("ticker")
    );
    node.write_manifest("sidecar.yaml", &yaml).unwrap();
    let pod = node
        .wait_pod("withsidecar", LONG, |p| phase(p) == "Succeeded")
        .unwrap();
    let side = init_statuses(&pod)[0].clone();
    let side_state = side.state.unwrap();
    let main = container(&pod).state.unwrap().terminated.unwrap();
    assert_eq!(main.exit_code, 0);
    let side_end = side_state
        .terminated
        .expect("the sidecar was stopped once the main container finished");
    assert!(side_end.started_at <= main.started_at, "sidecar first");
    assert!(
        main.finished_at <= side_end.finished_at,
        "sidecar stops last"
    );
    assert!(node.sandbox_pids().is_empty());
}

/// A local HTTP server that records the paths it is asked for.
fn recorder() -> (
    tokio::runtime::Runtime,
    u16,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let app = axum::Router::new().fallback(move |uri: axum::http::Uri| {
        let log = log.clone();
        async move {
            log.lock().unwrap().push(uri.path().to_owned());
            "ok"
        }
    });
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    rt.spawn(async move { axum::serve(listener, app).await });
    (rt, port, seen)
}

#[test]
fn post_start_and_pre_stop_hooks_run_http_get_sleep_and_exec() {
    let (_rt, port, seen) = recorder();
    let node = start(&["ticker"]);
    let hooks = format!(
        "    lifecycle:\n      postStart:\n        httpGet: {{host: 127.0.0.1, port: {port}, path: /started}}\n      preStop:\n        httpGet: {{host: 127.0.0.1, port: {port}, path: /stopping}}\n"
    );
    node.write_manifest(
        "hooked.yaml",
        &manifest("hooked", "ticker", "Always", &hooks),
    )
    .unwrap();
    node.wait_pod("hooked", LONG, is_running).unwrap();
    assert!(seen.lock().unwrap().contains(&"/started".to_owned()));
    node.remove_manifest("hooked.yaml").unwrap();
    node.wait_gone("hooked", Duration::from_secs(20)).unwrap();
    assert_eq!(*seen.lock().unwrap(), ["/started", "/stopping"]);

    // preStop sleep: the stop waits for it, within the grace (5 s).
    let nap = "    lifecycle:\n      preStop:\n        sleep: {seconds: 2}\n";
    node.write_manifest("nap.yaml", &manifest("nap", "ticker", "Always", nap))
        .unwrap();
    node.wait_pod("nap", LONG, is_running).unwrap();
    let removed = Instant::now();
    node.remove_manifest("nap.yaml").unwrap();
    node.wait_gone("nap", Duration::from_secs(20)).unwrap();
    let took = removed.elapsed();
    eprintln!("preStop sleep 2 s: stopped in {took:?}");
    assert!(took >= Duration::from_secs(2), "{took:?}");

    // An exec hook runs the container's own program with the hook's command as its
    // arguments (the ticker answers `check` with CHECK_EXIT): one that succeeds lets
    // the container run; one that fails kills and restarts it, as any failed postStart.
    let exec = "    lifecycle:\n      postStart:\n        exec: {command: [ticker, check]}\n";
    node.write_manifest(
        "goodhook.yaml",
        &manifest("goodhook", "ticker", "Always", exec),
    )
    .unwrap();
    let good = node.wait_pod("goodhook", LONG, is_running).unwrap();
    assert_eq!(container(&good).restart_count, 0);
    let failing = format!("{exec}    env: [{{name: CHECK_EXIT, value: \"1\"}}]\n");
    node.write_manifest(
        "badhook.yaml",
        &manifest("badhook", "ticker", "Always", &failing),
    )
    .unwrap();
    node.wait_pod("badhook", LONG, |p| container(p).restart_count >= 1)
        .unwrap();
    assert!(node.log().contains("postStart hook failed"));
    assert_eq!(
        node.pod("goodhook").map(|p| container(&p).restart_count),
        Some(0)
    );
}

#[test]
fn a_failed_container_falls_back_to_its_log_for_the_termination_message() {
    let node = start(&["hello"]);
    let extra = "    terminationMessagePolicy: FallbackToLogsOnError\n    args: [\"last words\"]\n    env: [{name: EXIT_CODE, value: \"3\"}]\n";
    node.write_manifest("words.yaml", &manifest("words", "hello", "Never", extra))
        .unwrap();
    let pod = node
        .wait_pod("words", LONG, |p| phase(p) == "Failed")
        .unwrap();
    let t = container(&pod).state.unwrap().terminated.unwrap();
    assert_eq!(t.exit_code, 3);
    let message = t.message.unwrap_or_default();
    assert!(
        message.contains("arg[1]=last words"),
        "{message:?} {}\n{}",
        serde_json::to_string(&pod.status).unwrap(),
        node.log()
    );
    assert!(message.ends_with("hello on stderr"), "{message:?}");
    // The default policy (File) reports nothing the guest did not write.
    let plain = "    env: [{name: EXIT_CODE, value: \"3\"}]\n";
    node.write_manifest("plain.yaml", &manifest("plain", "hello", "Never", plain))
        .unwrap();
    let pod = node
        .wait_pod("plain", LONG, |p| phase(p) == "Failed")
        .unwrap();
    let t = container(&pod).state.unwrap().terminated.unwrap();
    assert_eq!(t.message, None);
}

#[test]
fn wasm_containers_share_empty_dirs_and_unsupported_volumes_are_refused() {
    let node = start(&["hello"]);
    let yaml = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: shared}}
spec:
  restartPolicy: Never
  initContainers:
  - name: writer
    image: {hello}
    imagePullPolicy: IfNotPresent
    env:
    - {{name: WRITE_FILE, value: /data/greeting}}
    - {{name: FILE_TEXT, value: from the init container}}
    volumeMounts: [{{name: data, mountPath: /data, subPath: sub}}]
  - name: memwriter
    image: {hello}
    imagePullPolicy: IfNotPresent
    env: [{{name: WRITE_FILE, value: /shm/note}}]
    volumeMounts: [{{name: shm, mountPath: /shm}}]
  containers:
  - name: reader
    image: {hello}
    imagePullPolicy: IfNotPresent
    env: [{{name: READ_FILE, value: /in/greeting}}]
    volumeMounts: [{{name: data, mountPath: /in, subPath: sub, readOnly: true}}]
  - name: memreader
    image: {hello}
    imagePullPolicy: IfNotPresent
    env: [{{name: READ_FILE, value: /shm/note}}]
    volumeMounts: [{{name: shm, mountPath: /shm}}]
  - name: readonly
    image: {hello}
    imagePullPolicy: IfNotPresent
    env: [{{name: WRITE_FILE, value: /in/nope}}]
    volumeMounts: [{{name: data, mountPath: /in, readOnly: true}}]
  volumes:
  - {{name: data, emptyDir: {{}}}}
  - {{name: shm, emptyDir: {{medium: Memory, sizeLimit: 1Mi}}}}
"#,
        hello = image("hello")
    );
    node.write_manifest("shared.yaml", &yaml).unwrap();
    let pod = node
        .wait_pod("shared", LONG, |p| phase(p) == "Failed")
        .unwrap();
    let exit = |name: &str| {
        pod.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.name == name))
            .and_then(|c| c.state.clone()?.terminated)
            .map(|t| t.exit_code)
    };
    assert_eq!(exit("reader"), Some(0));
    assert_eq!(exit("memreader"), Some(0));
    assert_eq!(
        exit("readonly"),
        Some(1),
        "a read-only mount refuses writes"
    );
    let stdout = |name: &str| -> Vec<String> {
        node.container_log(&pod, name, 0)
            .unwrap()
            .into_iter()
            .filter(|r| r.stream == "stdout")
            .map(|r| r.text)
            .collect()
    };
    assert!(stdout("reader").contains(&"read /in/greeting: from the init container".to_owned()));
    assert!(stdout("memreader").contains(&"read /shm/note: hello".to_owned()));
    let volumes = node
        .dir()
        .join("root/pods")
        .join(pod.metadata.uid.clone().unwrap())
        .join("volumes/kubernetes.io~empty-dir");
    // The pod finished: its Memory emptyDir's tmpfs is released (the files of the
    // disk volume stay until the pod is removed).
    let shm = volumes.join("shm").display().to_string();
    let released = wasmlet_testkit::node::poll(Duration::from_secs(10), || {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        (!mountinfo.contains(&shm)).then_some(())
    });
    assert!(
        released.is_some(),
        "the tmpfs of a finished pod is unmounted"
    );
    assert!(volumes.join("data/sub/greeting").is_file());

    // Deleting the pod unmounts and removes its volumes.
    node.remove_manifest("shared.yaml").unwrap();
    node.wait_gone("shared", LONG).unwrap();
    wasmlet_testkit::node::poll(Duration::from_secs(10), || {
        (!volumes.exists()).then_some(())
    })
    .expect("the pod's volumes are removed");
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mountinfo.contains(&shm), "the tmpfs is unmounted");

    // A volume type this node does not provide: FailedMount, and nothing runs.
    let yaml = manifest(
        "cfg",
        "hello",
        "Never",
        "    volumeMounts: [{name: cfg, mountPath: /cfg}]\n",
    ) + "  volumes:\n  - {name: cfg, nfs: {server: nfs.example.com, path: /settings}}\n";
    node.write_manifest("cfg.yaml", &yaml).unwrap();
    let pod = node
        .wait_pod("cfg", LONG, |p| {
            container(p)
                .state
                .and_then(|s| s.waiting)
                .and_then(|w| w.message)
                .is_some_and(|m| m.contains("volume type nfs is not supported"))
        })
        .unwrap();
    assert_eq!(phase(&pod), "Pending");
    assert!(node.sandbox_pids().is_empty(), "no sandbox was made");
}
