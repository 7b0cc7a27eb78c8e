//! Liveness, readiness and startup probes against real guests and real containers:
//! the `httpd` Wasm component on the node's network, exec probes running the Wasm
//! container's own program, and busybox containers through containerd.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use wasmlet_testkit::containerd::{Containerd, images::BUSYBOX_IMAGE};
use wasmlet_testkit::node::{NodeOptions, free_port, http_get, poll};

use crate::*;

fn named(p: &Pod, name: &str) -> ContainerStatus {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == name).cloned())
        .unwrap_or_else(|| panic!("no status for {name}: {p:#?}"))
}

fn pod_yaml(name: &str, containers: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 30\n  containers:\n{containers}"
    )
}

fn httpd(port: u16, env: &str, probes: &str) -> String {
    format!(
        "  - name: web\n    image: {}\n    imagePullPolicy: IfNotPresent\n    ports: [{{name: http, containerPort: {port}}}]\n    env: [{{name: PORT, value: \"{port}\"}}{env}]\n{probes}",
        image("httpd")
    )
}

fn ticker(name: &str, env: &str, probes: &str) -> String {
    format!(
        "  - name: {name}\n    image: {}\n    imagePullPolicy: IfNotPresent\n    env: [{{name: INTERVAL_MS, value: \"200\"}}{env}]\n{probes}",
        image("ticker")
    )
}

fn ready(p: &Pod) -> bool {
    condition(p, "Ready").as_deref() == Some("True")
}

#[test]
fn wasm_http_tcp_and_exec_probes_drive_restarts_and_readiness() {
    let node = start(&["httpd", "ticker"]);

    // Startup (tcpSocket) gates the others; readiness (httpGet on a named port) makes
    // the pod Ready; liveness (httpGet) fails after 4 answers, so the container is
    // restarted with the probe's 1 s grace rather than the pod's 30 s.
    let failing = free_port();
    let probes = "    startupProbe: {tcpSocket: {port: http}, periodSeconds: 1, failureThreshold: 30}\n    readinessProbe: {httpGet: {port: http, path: /ready}, periodSeconds: 1}\n    livenessProbe: {httpGet: {port: http, path: /healthz}, periodSeconds: 1, failureThreshold: 2, terminationGracePeriodSeconds: 1}\n";
    node.write_manifest(
        "sick.yaml",
        &pod_yaml(
            "sick",
            &httpd(failing, ", {name: FAIL_AFTER, value: \"4\"}", probes),
        ),
    )
    .unwrap();
    let up = node.wait_pod("sick", LONG, ready).unwrap();
    let web = named(&up, "web");
    assert!(web.ready && web.started == Some(true), "{web:#?}");
    let restarted = node
        .wait_pod("sick", Duration::from_secs(40), |p| {
            named(p, "web").restart_count >= 1
        })
        .unwrap();
    let last = named(&restarted, "web")
        .last_state
        .and_then(|s| s.terminated)
        .expect("the killed instance is the last state");
    assert_eq!(last.exit_code, 137);
    let ran = last
        .finished_at
        .unwrap()
        .0
        .duration_since(last.started_at.unwrap().0);
    assert!(
        ran < jiff::SignedDuration::from_secs(20),
        "killed within the probe's grace, not the pod's 30 s: ran {ran:?}"
    );
    // The new instance serves again and becomes Ready again.
    node.wait_pod("sick", LONG, |p| {
        ready(p) && named(p, "web").restart_count >= 1
    })
    .unwrap();

    // Readiness flapping (the test flips /ready) turns Ready off and on and never
    // restarts anything.
    let flappy = free_port();
    let probes = "    readinessProbe: {httpGet: {port: http, path: /ready}, periodSeconds: 1, failureThreshold: 1}\n    livenessProbe: {tcpSocket: {port: http}, periodSeconds: 1}\n";
    node.write_manifest(
        "flappy.yaml",
        &pod_yaml("flappy", &httpd(flappy, "", probes)),
    )
    .unwrap();
    node.wait_pod("flappy", LONG, ready).unwrap();
    for _ in 0..2 {
        assert_eq!(http_get(flappy, "/flip").unwrap().0, 200);
        let p = node
            .wait_pod("flappy", Duration::from_secs(10), |p| !ready(p))
            .unwrap();
        assert!(!named(&p, "web").ready);
        assert_eq!(condition(&p, "ContainersReady").as_deref(), Some("False"));
        assert_eq!(http_get(flappy, "/flip").unwrap().0, 200);
        node.wait_pod("flappy", Duration::from_secs(10), ready)
            .unwrap();
    }
    assert_eq!(named(&node.pod("flappy").unwrap(), "web").restart_count, 0);

    // Exec probes run the container's own program (`ticker check`): one that passes
    // keeps the container and makes it ready; one that fails restarts it; one that
    // hangs past its timeout counts as a failure.
    let exec = |cmd: &str| {
        format!(
            "{{exec: {{command: [ticker, {cmd}]}}, periodSeconds: 1, timeoutSeconds: 1, failureThreshold: 2}}"
        )
    };
    let containers = [
        ticker(
            "healthy",
            "",
            &format!(
                "    livenessProbe: {}\n    readinessProbe: {}\n",
                exec("check"),
                exec("check")
            ),
        ),
        ticker(
            "failing",
            ", {name: CHECK_EXIT, value: \"1\"}",
            &format!("    livenessProbe: {}\n", exec("check")),
        ),
        ticker(
            "hanging",
            "",
            &format!("    readinessProbe: {}\n", exec("hang")),
        ),
    ]
    .concat();
    node.write_manifest("execs.yaml", &pod_yaml("execs", &containers))
        .unwrap();
    let p = node
        .wait_pod("execs", LONG, |p| {
            named(p, "failing").restart_count >= 1 && named(p, "healthy").ready
        })
        .unwrap();
    assert_eq!(named(&p, "healthy").restart_count, 0);
    let hanging = named(&p, "hanging");
    assert!(!hanging.ready && hanging.restart_count == 0, "{hanging:#?}");
    assert!(!ready(&p), "one container is not ready");

    // prober_probe_total, with the kubelet's labels.
    let (code, metrics) = http_get(node.read_only_port, "/metrics/probes").unwrap();
    assert_eq!(code, 200);
    let count = |container: &str, probe: &str, result: &str| -> u64 {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("prober_probe_total{")
                    && l.contains(&format!("container=\"{container}\""))
                    && l.contains(&format!("probe_type=\"{probe}\""))
                    && l.contains(&format!("result=\"{result}\""))
            })
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0)
    };
    assert!(count("healthy", "Liveness", "successful") >= 1, "{metrics}");
    assert!(count("failing", "Liveness", "failed") >= 2, "{metrics}");
    assert!(count("hanging", "Readiness", "failed") >= 1, "{metrics}");
    assert!(count("web", "Startup", "successful") >= 1, "{metrics}");
    // The hanging execs were interrupted: the sandbox does not pile up threads.
    let sandboxes = node.sandbox_pids();
    let threads = || -> usize {
        sandboxes
            .iter()
            .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
            .filter_map(|s| {
                s.lines()
                    .find(|l| l.starts_with("Threads:"))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse::<usize>().ok())
            })
            .sum()
    };
    let before = threads();
    let hung = count("hanging", "Readiness", "failed");
    poll(Duration::from_secs(30), || {
        let (_, m) = http_get(node.read_only_port, "/metrics/probes").ok()?;
        let now = m
            .lines()
            .find(|l| l.contains("container=\"hanging\"") && l.contains("result=\"failed\""))
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())?;
        (now >= hung + 5).then_some(())
    })
    .expect("five more hung execs");
    let after = threads();
    assert!(
        after <= before + 2,
        "threads {before} -> {after} after five hung execs"
    );
}

#[test]
fn container_probes_through_containerd() {
    let containerd = Containerd::start().expect("containerd starts");
    containerd.import_test_images().expect("test images import");
    let node = start_with(NodeOptions::default().with_cri(containerd.address()));
    // The documentation's liveness-exec example, with a container that ignores
    // SIGTERM: the probe's 1 s grace (2 s at least, as the kubelet) ends it, not the
    // pod's 30 s. A busybox httpd probed by httpGet on a named port and by tcpSocket,
    // and a container whose readiness flaps.
    let yaml = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: probed}}
spec:
  terminationGracePeriodSeconds: 30
  containers:
  - name: liveness
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: Never
    command: [sh, -c, "touch /tmp/healthy; sleep 3; rm -f /tmp/healthy; trap '' TERM; sleep 600"]
    livenessProbe:
      exec: {{command: [cat, /tmp/healthy]}}
      periodSeconds: 1
      failureThreshold: 2
      terminationGracePeriodSeconds: 1
  - name: web
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: Never
    command: [sh, -c, "mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p 8080 -h /www"]
    ports: [{{name: http, containerPort: 8080}}]
    readinessProbe: {{httpGet: {{port: http, path: /index.html}}, periodSeconds: 1}}
    livenessProbe: {{tcpSocket: {{port: 8080}}, periodSeconds: 1}}
  - name: flappy
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: Never
    command: [sh, -c, "while true; do touch /tmp/ready; sleep 2; rm -f /tmp/ready; sleep 2; done"]
    readinessProbe: {{exec: {{command: [test, -f, /tmp/ready]}}, periodSeconds: 1, failureThreshold: 1}}
"#
    );
    node.write_manifest("probed.yaml", &yaml).unwrap();
    let p = node
        .wait_pod("probed", LONG, |p| named(p, "liveness").restart_count >= 1)
        .unwrap();
    let last = named(&p, "liveness")
        .last_state
        .and_then(|s| s.terminated)
        .expect("the killed instance");
    assert_eq!(last.exit_code, 137, "SIGKILL after the probe's grace");
    let ran = last
        .finished_at
        .unwrap()
        .0
        .duration_since(last.started_at.unwrap().0);
    assert!(
        ran < jiff::SignedDuration::from_secs(15),
        "3 s healthy, 2 failures, a 2 s grace: ran {ran:?}"
    );
    node.wait_pod("probed", LONG, |p| named(p, "web").ready)
        .unwrap();
    let mut seen = std::collections::BTreeSet::new();
    poll(Duration::from_secs(15), || {
        seen.insert(named(&node.pod("probed")?, "flappy").ready);
        (seen.len() == 2).then_some(())
    });
    assert_eq!(seen.len(), 2, "readiness flaps");
    let p = node.pod("probed").unwrap();
    assert_eq!(named(&p, "web").restart_count, 0);
    assert_eq!(
        named(&p, "flappy").restart_count,
        0,
        "readiness never restarts"
    );
}

#[test]
fn startup_failures_restart_and_gate_liveness_and_grpc_probes_ask_the_health_service() {
    let health = wasmlet_testkit::health::HealthServer::start(false).unwrap();
    let node = start(&["ticker"]);
    let closed = free_port();
    // Startup (gRPC, service "") fails until the server says SERVING: three failures
    // restart the container, and liveness — a tcpSocket probe of a closed port that
    // would fail at once — is never run meanwhile. Readiness (tcpSocket, closed port)
    // keeps the container unready for good.
    let probes = format!(
        "    startupProbe: {{grpc: {{port: {port}}}, periodSeconds: 1, failureThreshold: 3}}\n    livenessProbe: {{grpc: {{port: {port}, service: live}}, periodSeconds: 1}}\n  - name: unready\n    image: {ticker}\n    imagePullPolicy: IfNotPresent\n    readinessProbe: {{tcpSocket: {{port: {closed}}}, periodSeconds: 1}}\n    livenessProbe: {{tcpSocket: {{port: {closed}}}, periodSeconds: 1, initialDelaySeconds: 600}}\n",
        port = health.port,
        ticker = image("ticker"),
    );
    node.write_manifest(
        "gated.yaml",
        &pod_yaml("gated", &ticker("slow", "", &probes)),
    )
    .unwrap();
    let p = node
        .wait_pod("gated", LONG, |p| named(p, "slow").restart_count >= 1)
        .unwrap();
    let slow = named(&p, "slow");
    assert_eq!(slow.started, Some(false));
    assert!(!slow.ready);
    let metrics = || http_get(node.read_only_port, "/metrics/probes").unwrap().1;
    let m = metrics();
    assert!(
        m.lines().any(|l| l.contains(r#"container="slow""#)
            && l.contains(r#"probe_type="Startup""#)
            && l.contains(r#"result="failed""#)
            && l.rsplit(' ').next().and_then(|n| n.parse::<u64>().ok()) >= Some(3)),
        "three startup failures, then the restart: {m}"
    );
    assert!(
        !m.lines()
            .any(|l| l.contains(r#"container="slow""#) && l.contains(r#"probe_type="Liveness""#)),
        "liveness waits for startup: {m}"
    );
    // Now the service is up: the container starts, and liveness (service "live")
    // passes from then on.
    health.set_serving(true);
    let p = node
        .wait_pod("gated", LONG, |p| named(p, "slow").ready)
        .unwrap();
    let restarts = named(&p, "slow").restart_count;
    poll(Duration::from_secs(20), || {
        metrics()
            .lines()
            .any(|l| {
                l.contains(r#"container="slow""#)
                    && l.contains(r#"probe_type="Liveness""#)
                    && l.contains(r#"result="successful""#)
            })
            .then_some(())
    })
    .expect("liveness runs once started");
    let p = node.pod("gated").unwrap();
    assert_eq!(
        named(&p, "slow").restart_count,
        restarts,
        "no restart once started"
    );
    let unready = named(&p, "unready");
    assert!(!unready.ready && unready.restart_count == 0, "{unready:#?}");
    assert!(!ready(&p));
    assert!(
        metrics()
            .lines()
            .any(|l| l.contains(r#"container="unready""#)
                && l.contains(r#"probe_type="Readiness""#)
                && l.contains(r#"result="failed""#))
    );
}

#[test]
fn the_remaining_handler_and_probe_type_pairs_pass_fail_and_act_on_wasm_pods() {
    let health = wasmlet_testkit::health::HealthServer::start(true).unwrap();
    let node = start(&["ticker", "httpd"]);
    let closed = free_port();
    let web = free_port();
    let g = health.port;
    // startup exec failing → restarted; startup httpGet passing → started; liveness
    // tcpSocket failing → restarted; readiness gRPC passing (`live`) and failing (`db`).
    let containers = [
        ticker(
            "exec-startup",
            ", {name: CHECK_EXIT, value: \"1\"}",
            "    startupProbe: {exec: {command: [ticker, check]}, periodSeconds: 1, failureThreshold: 2}\n",
        ),
        httpd(
            web,
            "",
            "    startupProbe: {httpGet: {port: http, path: /healthz}, periodSeconds: 1}\n",
        ),
        ticker(
            "tcp-liveness",
            "",
            &format!("    livenessProbe: {{tcpSocket: {{port: {closed}}}, periodSeconds: 1, failureThreshold: 1}}\n"),
        ),
        ticker(
            "grpc-ready",
            "",
            &format!("    readinessProbe: {{grpc: {{port: {g}, service: live}}, periodSeconds: 1}}\n"),
        ),
        ticker(
            "grpc-unready",
            "",
            &format!("    readinessProbe: {{grpc: {{port: {g}, service: db}}, periodSeconds: 1}}\n"),
        ),
    ]
    .concat();
    node.write_manifest("pairs.yaml", &pod_yaml("pairs", &containers))
        .unwrap();
    let p = node
        .wait_pod("pairs", LONG, |p| {
            named(p, "exec-startup").restart_count >= 1
                && named(p, "tcp-liveness").restart_count >= 1
                && named(p, "web").started == Some(true)
                && named(p, "grpc-ready").ready
        })
        .unwrap();
    assert_eq!(named(&p, "exec-startup").started, Some(false));
    assert!(
        named(&p, "web").ready,
        "no readiness probe: ready once started"
    );
    assert_eq!(named(&p, "web").restart_count, 0);
    let unready = named(&p, "grpc-unready");
    assert!(!unready.ready && unready.restart_count == 0, "{unready:#?}");
    assert_eq!(named(&p, "grpc-ready").restart_count, 0);
    assert!(!ready(&p));
    let (_, m) = http_get(node.read_only_port, "/metrics/probes").unwrap();
    for (container, probe, result) in [
        ("exec-startup", "Startup", "failed"),
        ("web", "Startup", "successful"),
        ("tcp-liveness", "Liveness", "failed"),
        ("grpc-ready", "Readiness", "successful"),
        ("grpc-unready", "Readiness", "failed"),
    ] {
        assert!(
            m.lines()
                .any(|l| l.contains(&format!("container=\"{container}\""))
                    && l.contains(&format!("probe_type=\"{probe}\""))
                    && l.contains(&format!("result=\"{result}\""))),
            "{container} {probe} {result}: {m}"
        );
    }
}
