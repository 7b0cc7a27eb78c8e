//! The pod network: with a CNI configuration, each sandbox gets a network namespace
//! of its own, attached with the real `bridge`, `host-local` and `portmap` plugins
//! (Debian's), and its guests listen there. What the network had is gone after the
//! pod, after a failed setup, and after a restart of the runtime.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;

use anyhow::{Context, Result, ensure};
use wasmlet_runtime::{ContainerState, PortMapping, Runtime};
use wasmlet_runtime_wasm::network::NetworkSettings;
use wasmlet_testkit::cni::CniNetwork;

use crate::fixture::{DEADLINE, Fixture, wait_for_stdout_line, with_env};

fn settings(net: &CniNetwork) -> NetworkSettings {
    NetworkSettings {
        conf_dir: net.conf_dir(),
        bin_dirs: net.bin_dirs(),
        netns_dir: net.netns_dir(),
    }
}

/// `GET /healthz` from the node to `addr`: the status code.
fn healthz(addr: SocketAddr) -> Result<u16> {
    let mut s = TcpStream::connect_timeout(&addr, DEADLINE)
        .with_context(|| format!("connecting to {addr}"))?;
    s.set_read_timeout(Some(DEADLINE))?;
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: pod\r\n\r\n")?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    raw.get(9..12)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("no status line in {raw:?}"))
}

const PORT: u16 = 8080;

#[tokio::test]
async fn a_wasm_pod_serves_on_its_own_ip_and_leaves_nothing_behind() -> Result<()> {
    let net = CniNetwork::new()?;
    let fx = Fixture::with_network(settings(&net))?;
    fx.import("httpd")?;
    let host_port = crate::network::free_port()?;
    let mut config = fx.pod_config("web");
    config.port_mappings = vec![PortMapping {
        protocol: "TCP".into(),
        container_port: PORT.into(),
        host_port: host_port.into(),
        host_ip: String::new(),
    }];
    let pod = fx.start_pod(config).await?;
    let status = fx.runtime.pod_sandbox_status(&pod.id).await?;
    let ip = status.ip.clone().context("the pod has an IP")?;
    ensure!(net.subnet.contains(&ip), "{ip} is not in {}", net.subnet);
    let netns = status.network_namespace.clone().context("a namespace")?;
    ensure!(wasmlet_runtime_wasm::network::netns::is_namespace(&netns));
    assert_eq!(net.allocations(), std::slice::from_ref(&ip));

    let web = with_env(
        pod.container("httpd", "httpd"),
        &[("PORT", &PORT.to_string())],
    );
    let id = fx.run(&pod, &web).await?;
    let log = fx
        .wait_for_state(&id, ContainerState::Running)
        .await?
        .log_path;
    wait_for_stdout_line(&log, &format!("listening on {PORT}")).await?;

    // From the node: at the pod's IP across the bridge, and at the host port through
    // portmap; not on the node's own loopback, which is not the pod's.
    let pod_addr: SocketAddr = format!("{ip}:{PORT}").parse()?;
    let healthz_at = |addr| tokio::task::spawn_blocking(move || healthz(addr));
    assert_eq!(healthz_at(pod_addr).await??, 200);
    let gateway: SocketAddr = format!("{}:{host_port}", net.subnet.gateway()).parse()?;
    assert_eq!(healthz_at(gateway).await??, 200, "through the host port");
    let node_loopback: SocketAddr = ([127, 0, 0, 1], PORT).into();
    assert!(
        TcpStream::connect_timeout(&node_loopback, DEADLINE).is_err(),
        "the pod's port answered on the node's loopback"
    );
    // Inside the namespace its loopback is the pod's, as port-forward dials it.
    let mut inside = wasmlet_runtime_wasm::network::netns::connect(
        &netns,
        ([127, 0, 0, 1], PORT).into(),
        DEADLINE,
    )
    .await?;
    tokio::io::AsyncWriteExt::write_all(&mut inside, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await?;
    let mut answer = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut inside, &mut answer).await?;
    ensure!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    ensure!(
        !net.iptables_rules().is_empty(),
        "portmap's rules are there"
    );

    // Stopped: the network is released (the status keeps the address it had).
    fx.runtime.stop_pod_sandbox(&pod.id).await?;
    assert_eq!(net.leftovers(), Vec::<String>::new());
    assert_eq!(
        fx.runtime.pod_sandbox_status(&pod.id).await?.ip,
        Some(ip),
        "the stopped pod's status keeps its address"
    );
    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    assert_eq!(net.leftovers(), Vec::<String>::new());
    Ok(())
}

#[tokio::test]
async fn a_host_network_pod_gets_no_namespace() -> Result<()> {
    let net = CniNetwork::new()?;
    let fx = Fixture::with_network(settings(&net))?;
    let mut config = fx.pod_config("host");
    config.host_network = true;
    let pod = fx.start_pod(config).await?;
    let status = fx.runtime.pod_sandbox_status(&pod.id).await?;
    assert_eq!((status.ip, status.network_namespace), (None, None));
    assert_eq!(net.leftovers(), Vec::<String>::new());
    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    Ok(())
}

/// A plugin chained after the bridge that fails every ADD (and succeeds at DEL, as a
/// plugin must for what it never made).
fn failing_plugin(dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("refuse");
    std::fs::write(
        &path,
        "#!/bin/sh\ncat >/dev/null\nif [ \"$CNI_COMMAND\" = ADD ]; then\n  echo '{\"cniVersion\":\"1.0.0\",\"code\":999,\"msg\":\"refused by the test\",\"details\":\"always\"}'\n  exit 1\nfi\nexit 0\n",
    )?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

#[tokio::test]
async fn a_failed_network_setup_fails_the_sandbox_and_leaves_nothing() -> Result<()> {
    let net = CniNetwork::with_plugins(&[serde_json::json!({"type": "refuse"})])?;
    let bin = tempfile::tempdir()?;
    failing_plugin(bin.path())?;
    let mut settings = settings(&net);
    settings.bin_dirs.insert(0, bin.path().to_owned());
    let fx = Fixture::with_network(settings)?;
    let err = fx
        .runtime
        .run_pod_sandbox(&fx.pod_config("refused"))
        .await
        .expect_err("the sandbox cannot start");
    let message = err.to_string();
    ensure!(
        message.contains("refused by the test: always (code 999)") && message.contains("refuse"),
        "{message}"
    );
    // The bridge plugin's address, veth and the namespace were undone.
    assert_eq!(net.leftovers(), Vec::<String>::new());
    assert!(fx.runtime.list_pod_sandboxes().await?.is_empty());
    assert!(
        std::fs::read_dir(fx.path().join("sandboxes"))?
            .next()
            .is_none(),
        "no sandbox directory is left"
    );
    Ok(())
}

#[tokio::test]
async fn after_a_restart_the_pod_keeps_its_ip_and_its_removal_releases_it() -> Result<()> {
    let net = CniNetwork::new()?;
    let fx = Fixture::with_network(settings(&net))?;
    fx.import("httpd")?;
    let pod = fx.pod("kept").await?;
    let web = with_env(
        pod.container("httpd", "httpd"),
        &[("PORT", &PORT.to_string())],
    );
    let id = fx.run(&pod, &web).await?;
    let log = fx
        .wait_for_state(&id, ContainerState::Running)
        .await?
        .log_path;
    wait_for_stdout_line(&log, &format!("listening on {PORT}")).await?;
    let ip = fx
        .runtime
        .pod_sandbox_status(&pod.id)
        .await?
        .ip
        .context("an IP")?;

    // The node's next run adopts the sandbox with its network.
    let next = fx.reopen()?;
    assert_eq!(next.restore().await, 1);
    let status = next.pod_sandbox_status(&pod.id).await?;
    assert_eq!(status.ip.as_deref(), Some(ip.as_str()));
    let addr: SocketAddr = format!("{ip}:{PORT}").parse()?;
    assert_eq!(
        tokio::task::spawn_blocking(move || healthz(addr)).await??,
        200
    );
    assert_eq!(net.allocations(), [ip]);

    next.remove_pod_sandbox(&pod.id).await?;
    assert_eq!(net.leftovers(), Vec::<String>::new());
    Ok(())
}

#[tokio::test]
async fn one_wasm_pod_reaches_another_at_its_ip() -> Result<()> {
    let net = CniNetwork::new()?;
    let fx = Fixture::with_network(settings(&net))?;
    fx.import("httpd")?;
    let server = fx.pod("server").await?;
    let web = with_env(
        server.container("httpd", "httpd"),
        &[("PORT", &PORT.to_string())],
    );
    let id = fx.run(&server, &web).await?;
    let log = fx
        .wait_for_state(&id, ContainerState::Running)
        .await?
        .log_path;
    wait_for_stdout_line(&log, &format!("listening on {PORT}")).await?;
    let ip = fx
        .runtime
        .pod_sandbox_status(&server.id)
        .await?
        .ip
        .context("an IP")?;

    let client = fx.pod("client").await?;
    let mut fetch = client.container("fetch", "httpd");
    fetch.args = vec!["fetch".into(), format!("{ip}:{PORT}"), "/healthz".into()];
    let id = fx.run(&client, &fetch).await?;
    let done = fx.wait_exited(&id).await?;
    let out = crate::fixture::lines(
        &crate::fixture::log_records(&done.log_path)?,
        wasmlet_runtime_wasm::crilog::Stream::Stdout,
    );
    let err = crate::fixture::lines(
        &crate::fixture::log_records(&done.log_path)?,
        wasmlet_runtime_wasm::crilog::Stream::Stderr,
    );
    assert_eq!(done.exit_code, 0, "{out:?} {err:?} {done:?}");
    assert_eq!(out, ["HTTP/1.1 200 OK", "ok"]);
    for pod in [client, server] {
        fx.runtime.remove_pod_sandbox(&pod.id).await?;
    }
    assert_eq!(net.leftovers(), Vec::<String>::new());
    Ok(())
}
