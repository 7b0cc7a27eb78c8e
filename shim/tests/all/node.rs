//! wasmlet itself routing a RuntimeClass to containerd and this shim: a pod of two
//! Wasm containers beside a runc pod, on one node.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use wasmlet_testkit::containerd::WASM_HANDLER;
use wasmlet_testkit::containerd::images::BUSYBOX_IMAGE;
use wasmlet_testkit::node::{NodeOptions, TestNode};

use crate::harness::{Harness, poll, processes};

const T: Duration = Duration::from_secs(90);

/// The `wasmlet` binary `cargo test --workspace` built beside this test.
fn wasmlet_binary() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("wasmlet"))
        .context("the target directory")?;
    anyhow::ensure!(
        bin.is_file(),
        "{} is not built: run `cargo build --bin wasmlet` (or the whole \
         workspace's tests) first",
        bin.display()
    );
    Ok(bin)
}

fn status<'a>(pod: &'a Pod, name: &str) -> Option<&'a ContainerStatus> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == name)
}

fn running(pod: &Pod, name: &str) -> bool {
    status(pod, name).is_some_and(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
}

#[test]
fn a_runtime_class_routes_a_wasm_pod_through_containerd_to_the_shim_beside_a_runc_pod() -> Result<()>
{
    let wasmlet = wasmlet_binary()?;
    let h = Harness::start()?;
    h.containerd.import_test_images()?;
    let mut node = TestNode::start(
        &wasmlet,
        NodeOptions {
            wasmlet_config: format!("  runtimeHandlers: {{wasm-shim: {WASM_HANDLER}}}\n"),
            ..Default::default()
        }
        .with_cri(h.containerd.address()),
    )?;

    node.write_manifest(
        "shim.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: shimpod}}\nspec:\n  runtimeClassName: wasm-shim\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: ticker\n    image: {ticker}\n    imagePullPolicy: Never\n    env: [{{name: INTERVAL_MS, value: \"50\"}}]\n    resources: {{limits: {{memory: 64Mi}}}}\n    readinessProbe:\n      exec: {{command: [/app.wasm, check]}}\n      periodSeconds: 1\n  - name: hello\n    image: {hello}\n    imagePullPolicy: Never\n    args: [from-node]\n",
            ticker = h.image("ticker"),
            hello = h.image("hello"),
        ),
    )?;
    node.write_manifest(
        "box.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: box}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    image: {BUSYBOX_IMAGE}\n    imagePullPolicy: Never\n    command: [sh, -c, 'exec sleep 1000']\n"
        ),
    )?;

    // The ticker runs and its exec readiness probe (ExecSync through the shim) passes;
    // hello runs to the end and is restarted, as a runc container would be.
    let pod = node.wait_pod("shimpod", T, |p| {
        status(p, "ticker").is_some_and(|c| c.ready)
            && status(p, "hello").is_some_and(|c| c.restart_count >= 1)
    })?;
    let ticker = status(&pod, "ticker").unwrap();
    assert!(
        ticker
            .container_id
            .as_deref()
            .is_some_and(|id| id.starts_with("containerd://")),
        "{ticker:?}"
    );
    node.wait_pod("box", T, |p| running(p, "main"))?;

    // Logs as the kubelet reads them: containerd wrote them from the shim's FIFOs.
    poll(T, "the ticker's log", || {
        let log = node.container_log(&pod, "ticker", 0)?;
        Ok(log.iter().any(|r| r.text == "tick 3").then_some(()))
    })?;
    let hello = node.container_log(&pod, "hello", 0)?;
    assert!(
        hello.iter().any(|r| r.text == "arg[1]=from-node"),
        "{:?}",
        hello.iter().map(|r| &r.text).collect::<Vec<_>>()
    );

    // The pod's Wasm containers run in one sandbox process, inside the pod's cgroup.
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let dir = h.containerd.layout().dir.to_string_lossy().into_owned();
    let sandboxes = processes(|c| c.contains(" sandbox ") && c.contains(&dir));
    assert_eq!(sandboxes.len(), 1, "{sandboxes:?}");
    let cgroups = std::fs::read_to_string(format!("/proc/{}/cgroup", sandboxes[0]))?;
    let pod_cgroup = format!("pod{uid}");
    assert!(
        cgroups
            .lines()
            .any(|l| l.contains(":memory:") && l.contains(&pod_cgroup)),
        "the sandbox process is not in {pod_cgroup}: {cgroups}"
    );

    // Deleting the pod stops it: the shim and its sandbox process go.
    node.remove_manifest("shim.yaml")?;
    node.wait_gone("shimpod", T)?;
    poll(T, "the shim to exit with its pod", || {
        Ok(h.shim_processes().is_empty().then_some(()))
    })?;
    node.remove_manifest("box.yaml")?;
    node.wait_gone("box", T)?;
    node.stop();
    Ok(())
}
