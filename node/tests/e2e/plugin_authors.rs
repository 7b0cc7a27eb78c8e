//! A plugin author outside Rust, end to end: the C example of `examples/plugins/c-probe`
//! built from the WIT with wit-bindgen's C generator and clang-19, made a component
//! with the adapter `wasmlet plugin adapter` writes, checked and called once with
//! `wasmlet plugin check` / `run`, then loaded by a node where it makes an httpd pod
//! Ready — with one probe call at the container's start, not two.

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use k8s_openapi::api::core::v1::Pod;
use wasmlet_testkit::node::{NodeOptions, free_port, http_get, poll};

use crate::*;

const BIN: &str = env!("CARGO_BIN_EXE_wasmlet");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A one-request-at-a-time HTTP server answering every GET with `body`.
fn serve(body: &'static str) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf);
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

fn ready(p: &Pod) -> bool {
    condition(p, "Ready").as_deref() == Some("True")
}

/// `name{...labels...} value` of the first line of `metrics` matching every label.
fn sample(metrics: &str, name: &str, labels: &[&str]) -> Option<u64> {
    metrics
        .lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && labels.iter().all(|m| l.contains(m)))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn a_c_plugin_goes_from_the_wit_to_a_ready_pod() {
    let example = repo().join("examples/plugins/c-probe");
    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path();

    // The build script as an author runs it: wit-bindgen c, clang-19, and the
    // node's componentizer.
    let build = run(Command::new("bash")
        .arg(example.join("build.sh"))
        .current_dir(&example)
        .env("OUT", out)
        .env("WASMLET", BIN));
    assert!(
        build.status.success(),
        "build.sh (tools: examples/plugins/c-probe/tools.sh): {}",
        text(&build)
    );
    let core = std::fs::read(out.join("c-probe.core.wasm")).unwrap();
    let component = out.join("c-probe.component.wasm");

    // The adapter `wasmlet plugin adapter` writes, used by another componentizer
    // (wit-component as a library), gives the same component.
    let adapter = out.join("wasi_snapshot_preview1.reactor.wasm");
    let wrote = run(Command::new(BIN)
        .args(["plugin", "adapter", "--reactor", "-o"])
        .arg(&adapter));
    assert!(wrote.status.success(), "{}", text(&wrote));
    let by_library = wit_component::ComponentEncoder::default()
        .validate(true)
        .module(&core)
        .unwrap()
        .adapter("wasi_snapshot_preview1", &std::fs::read(&adapter).unwrap())
        .unwrap()
        .encode()
        .unwrap();
    assert_eq!(by_library, std::fs::read(&component).unwrap());

    let check = run(Command::new(BIN).args(["plugin", "check"]).arg(&component));
    let report = text(&check);
    assert!(check.status.success(), "{report}");
    assert!(report.contains("world:   probe-plugin"), "{report}");
    assert!(
        report.contains("exports: wasmlet:plugin/probe@0.1.0"),
        "{report}"
    );
    assert!(report.contains("loads:   yes"), "{report}");
    // A core module is refused with what to do.
    let refused = run(Command::new(BIN)
        .args(["plugin", "check"])
        .arg(out.join("c-probe.core.wasm")));
    assert!(!refused.status.success());
    assert!(
        text(&refused).contains("wasmlet plugin componentize"),
        "{}",
        text(&refused)
    );

    // One call as the node makes it, against a local server.
    let pod = out.join("pod.yaml");
    std::fs::write(
        &pod,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: default}\nspec:\n  containers: [{name: web, image: httpd}]\n",
    )
    .unwrap();
    let port = serve(r#"{"status": "ok"}"#);
    let call = |settings: &str| {
        run(Command::new(BIN)
            .args(["plugin", "run"])
            .arg(&component)
            .args(["--world", "probe-plugin", "--pod"])
            .arg(&pod)
            .args(["--settings", settings, "--target"])
            .arg(format!("http://127.0.0.1:{port}/status")))
    };
    let passed = call(r#"{"expect": "ok"}"#);
    let said = text(&passed);
    assert!(passed.status.success(), "{said}");
    assert!(said.contains("result: success"), "{said}");
    assert!(said.contains("took:"), "{said}");
    assert!(
        said.contains("plugin=\"c-probe\""),
        "its debug log line: {said}"
    );
    let failed = call(r#"{"expect": "degraded"}"#);
    let said = text(&failed);
    assert_eq!(failed.status.code(), Some(1), "{said}");
    assert!(
        said.contains("result: failure:") && said.contains("degraded"),
        "{said}"
    );

    // The node loads it and it decides an httpd pod's readiness.
    let config = format!(
        "  plugins:\n  - name: c-probe\n    world: probe-plugin\n    source: {{file: {}}}\n",
        component.display()
    );
    let node = start_with(NodeOptions {
        images: vec!["httpd".into()],
        wasmlet_config: config,
        ..Default::default()
    });
    let port = free_port();
    node.write_manifest(
        "web.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  annotations:\n    probe.wasmlet.dev/web.readiness: c-probe\n    probe.wasmlet.dev/web.readiness.settings: '{{\"port\": {port}, \"path\": \"/status\", \"expect\": \"ok\"}}'\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: web\n    image: {}\n    imagePullPolicy: IfNotPresent\n    env: [{{name: PORT, value: \"{port}\"}}]\n    readinessProbe:\n      tcpSocket: {{port: {port}}}\n      periodSeconds: 30\n",
            image("httpd")
        ),
    )
    .unwrap();
    node.wait_pod("web", LONG, ready)
        .unwrap_or_else(|e| panic!("the C plugin makes the pod Ready: {e:?}\n{}", node.log()));

    // At the container's start the readiness probe ran once per result the prober
    // recorded (a failure while httpd was still binding is fair), and succeeded once:
    // no second call on the heels of the first.
    let counts = || {
        let (_, probes) = http_get(node.read_only_port, "/metrics/probes").ok()?;
        let (_, plugins) = http_get(node.read_only_port, "/metrics/plugins").ok()?;
        let of = |result: &str| {
            sample(
                &probes,
                "prober_probe_total",
                &[
                    "pod=\"web-e2e\"",
                    "probe_type=\"Readiness\"",
                    &format!("result=\"{result}\""),
                ],
            )
            .unwrap_or(0)
        };
        let calls = sample(
            &plugins,
            "wasmlet_plugin_calls_total",
            &["plugin=\"c-probe\""],
        )?;
        Some((of("successful"), of("failed"), calls))
    };
    let (successes, failures, calls) = poll(LONG, || counts().filter(|c| c.0 >= 1))
        .unwrap_or_else(|| panic!("probe metrics: {:?}\n{}", counts(), node.log()));
    // A little later (well inside the 30 s period) nothing more has run.
    let later = poll(std::time::Duration::from_secs(2), || {
        let c = counts()?;
        (c != (successes, failures, calls)).then_some(c)
    });
    assert_eq!(
        later, None,
        "no probe after the first success within its period"
    );
    assert_eq!(successes, 1, "one successful readiness call at start");
    assert_eq!(
        calls,
        successes + failures,
        "every plugin call is a recorded probe"
    );
}

/// The same for JavaScript: `examples/plugins/js-probe` componentized with jco
/// (componentize-js, pinned in its package-lock.json) against the WIT, checked, and
/// loaded by a node where it makes an httpd pod Ready. (`wasmlet plugin run` on it
/// is part of its guide, which `scripts/plugin-guides.sh` runs as written.)
#[test]
fn a_javascript_plugin_goes_from_the_wit_to_a_ready_pod() {
    // A copy, so the build's node_modules stay out of the repository.
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("js-probe");
    std::fs::create_dir(&dir).unwrap();
    for file in ["probe.js", "package.json", "package-lock.json", "build.sh"] {
        std::fs::copy(
            repo().join("examples/plugins/js-probe").join(file),
            dir.join(file),
        )
        .unwrap();
    }
    let build = run(Command::new("bash")
        .arg("build.sh")
        .current_dir(&dir)
        .env("REPO", repo()));
    assert!(
        build.status.success(),
        "build.sh (node 20.19+, npm): {}",
        text(&build)
    );
    let component = dir.join("js-probe.component.wasm");
    assert!(
        text(&build).contains("export wasmlet:plugin/probe@0.1.0"),
        "{}",
        text(&build)
    );

    let config = format!(
        "  plugins:\n  - name: js-probe\n    world: probe-plugin\n    source: {{file: {}}}\n    limits: {{memoryBytes: 16777216}}\n",
        component.display()
    );
    let node = start_with(NodeOptions {
        images: vec!["httpd".into()],
        wasmlet_config: config,
        ..Default::default()
    });
    let port = free_port();
    node.write_manifest(
        "web.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  annotations:\n    probe.wasmlet.dev/web.readiness: js-probe\n    probe.wasmlet.dev/web.readiness.settings: '{{\"port\": {port}, \"path\": \"/status\", \"expect\": \"ok\"}}'\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: web\n    image: {}\n    imagePullPolicy: IfNotPresent\n    env: [{{name: PORT, value: \"{port}\"}}]\n    readinessProbe:\n      tcpSocket: {{port: {port}}}\n      periodSeconds: 2\n",
            image("httpd")
        ),
    )
    .unwrap();
    // The node compiles the 12 MiB component (SpiderMonkey) before its first call:
    // tens of seconds in a debug build.
    node.wait_pod("web", std::time::Duration::from_secs(240), ready)
        .unwrap_or_else(|e| panic!("the JS plugin makes the pod Ready: {e:?}\n{}", node.log()));
    let (_, plugins) = http_get(node.read_only_port, "/metrics/plugins").unwrap();
    assert!(
        sample(
            &plugins,
            "wasmlet_plugin_calls_total",
            &["plugin=\"js-probe\""]
        )
        .unwrap_or(0)
            >= 1,
        "{plugins}"
    );
}

/// `wasmlet plugin run` calls every world as the node does (an admission verdict,
/// an eviction order, a device adapter's devices and an allocation), and `pack`
/// writes the artifact `wasmlet images import` takes in.
#[test]
fn wasmlet_plugin_runs_every_world_and_packs_what_the_node_imports() {
    let built = wasmlet_testkit::images::ensure_plugins().expect("the example plugins build");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("web.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: default, labels: {team: web}}\nspec:\n  priority: 10\n  containers: [{name: web, image: x, resources: {requests: {cpu: 100m, memory: 100Mi}}}]\n",
    )
    .unwrap();
    std::fs::write(
        d.join("low.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: low, namespace: default}\nspec:\n  containers: [{name: c, image: x, resources: {requests: {memory: 100Mi}}}]\n",
    )
    .unwrap();
    std::fs::write(
        d.join("candidates.yaml"),
        "- {pod: web.yaml, usage: 50Mi, request: 100Mi}\n- {pod: low.yaml, usage: 300Mi, request: 100Mi}\n",
    )
    .unwrap();
    std::fs::write(
        d.join("admission.yaml"),
        "settings: {label: team, max-cpu-millis: \"1000\"}\n",
    )
    .unwrap();
    let plugin = |args: &[&str]| {
        let out = run(Command::new(BIN).current_dir(d).arg("plugin").args(args));
        (out.status.code(), text(&out))
    };
    let admission = built["require-label-admission"].to_str().unwrap();
    let (code, said) = plugin(&[
        "run",
        admission,
        "--pod",
        "web.yaml",
        "--config",
        "admission.yaml",
    ]);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("result: admit"), "{said}");
    let (_, said) = plugin(&[
        "run",
        admission,
        "--pod",
        "low.yaml",
        "--config",
        "admission.yaml",
    ]);
    assert!(said.contains("result: deny: MissingLabel"), "{said}");

    let eviction = built["priority-eviction"].to_str().unwrap();
    let (code, said) = plugin(&["run", eviction, "--candidates", "candidates.yaml"]);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains("1. default/low") && said.contains("2. default/web"),
        "over its request and lower priority goes first: {said}"
    );

    let device = built["widget-device"].to_str().unwrap();
    let (code, said) = plugin(&[
        "run",
        device,
        "--node-settings",
        r#"{"resource-name": "example.com/widget", "count": 2}"#,
        "--allocate",
        "widget-1",
    ]);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("result: 2 devices"), "{said}");
    assert!(said.contains("env WIDGET_IDS=widget-1"), "{said}");

    // The wrong world is refused before any call.
    let (code, said) = plugin(&[
        "run",
        eviction,
        "--world",
        "probe-plugin",
        "--pod",
        "web.yaml",
    ]);
    assert_eq!(code, Some(2), "{said}");
    assert!(
        said.contains("the component implements eviction-plugin"),
        "{said}"
    );

    let (code, said) = plugin(&[
        "pack",
        eviction,
        "-t",
        "localhost/plugins/rank:1",
        "-o",
        "rank.tar",
    ]);
    assert_eq!(code, Some(0), "{said}");
    let root = d.join("root");
    let import = run(Command::new(BIN)
        .args(["images", "--root-dir"])
        .arg(&root)
        .arg("import")
        .arg(d.join("rank.tar")));
    assert!(import.status.success(), "{}", text(&import));
    let listed = run(Command::new(BIN)
        .args(["images", "--root-dir"])
        .arg(&root)
        .arg("ls"));
    let listed = text(&listed);
    assert!(
        listed.contains("localhost/plugins/rank:1") && listed.contains("component"),
        "{listed}"
    );
}
