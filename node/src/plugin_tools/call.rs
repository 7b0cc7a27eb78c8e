//! `wasmlet plugin run`: one call of a plugin, made as the node makes it (the same
//! host, limits and grants), with the result, the plugin's log lines and the time.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use wasmlet_plugin_host::types::{Candidate, Decision, ProbeRequest, ProbeResult};
use wasmlet_plugin_host::{HostOptions, PluginConfig, PluginHost, PluginSource, World};

use crate::admission::NodeInfo;
use crate::plugins::{node_state, pod_info, settings_from_json};

/// `wasmlet plugin run`'s arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// The plugin's component.
    pub file: PathBuf,
    /// The world to call (`probe-plugin`, `admission-plugin`, `eviction-plugin`,
    /// `device-adapter-plugin`) [default: the one the component exports].
    #[arg(long)]
    pub world: Option<World>,
    /// The plugin's entry as the node's configuration would have it under
    /// `wasmlet.plugins` (YAML: `name`, `limits`, `grants`, `settings`); its
    /// `source` is FILE.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The node-wide settings (`host.settings()`), a JSON object; over `--config`'s.
    #[arg(long)]
    pub node_settings: Option<String>,
    /// The pod, a YAML or JSON manifest (probe and admission).
    #[arg(long)]
    pub pod: Option<PathBuf>,
    /// Probe: the per-pod settings, a JSON object as the pod's
    /// `<container>.<probe>.settings` annotation carries it (numbers become text).
    #[arg(long)]
    pub settings: Option<String>,
    /// Probe: where the pod answers, `http://IP[:PORT][/PATH]` or `IP`: IP is the
    /// pod's IP; PORT and PATH become the `port` and `path` settings unless
    /// `--settings` has them. [default: the manifest's `status.podIPs`]
    #[arg(long)]
    pub target: Option<String>,
    /// Probe: the container [default: the pod's first].
    #[arg(long)]
    pub container: Option<String>,
    /// Probe: `readiness`, `liveness` or `startup`.
    #[arg(long, default_value = "readiness")]
    pub probe_type: String,
    /// Probe: the probe's `timeoutSeconds`, the call's deadline.
    #[arg(long, default_value_t = 1)]
    pub timeout_seconds: u32,
    /// Admission: the node, a Node manifest (`status.allocatable`, labels)
    /// [default: this machine's CPUs and memory, 110 pods].
    #[arg(long)]
    pub node: Option<PathBuf>,
    /// Eviction: the candidates, a YAML list of `{pod: MANIFEST-FILE, usage: QUANTITY,
    /// request: QUANTITY}`, in the built-in order.
    #[arg(long)]
    pub candidates: Option<PathBuf>,
    /// Eviction: the signal being relieved.
    #[arg(long, default_value = "memory.available")]
    pub signal: String,
    /// Device adapter: after listing the devices, allocate these (comma-separated ids).
    #[arg(long, value_delimiter = ',')]
    pub allocate: Vec<String>,
}

impl RunArgs {
    /// The arguments for FILE with every default.
    pub fn for_file(file: PathBuf) -> Self {
        RunArgs {
            file,
            world: None,
            config: None,
            node_settings: None,
            pod: None,
            settings: None,
            target: None,
            container: None,
            probe_type: "readiness".into(),
            timeout_seconds: 1,
            node: None,
            candidates: None,
            signal: "memory.available".into(),
            allocate: Vec::new(),
        }
    }
}

/// Runs the call and prints what happened; `Ok(false)` when the plugin answered
/// with a failure or its call failed.
pub async fn run(args: RunArgs) -> anyhow::Result<bool> {
    let bytes = std::fs::read(&args.file).with_context(|| args.file.display().to_string())?;
    let shape = super::component::shape(&bytes)?;
    let exported = super::component::world_of(&shape)?;
    let world = args.world.unwrap_or(exported);
    if world != exported {
        bail!(
            "--world {}: the component implements {}",
            world.as_str(),
            exported.as_str()
        );
    }
    let config = plugin_config(&args, world)?;
    let name = config.name.clone();
    let host = PluginHost::new(HostOptions::default())?;
    let started = Instant::now();
    host.load_bytes(config.clone(), bytes)
        .await
        .with_context(|| format!("loading {}", args.file.display()))?;
    println!(
        "loaded {name} ({}) in {}",
        world.as_str(),
        ms(started.elapsed())
    );
    match world {
        World::Probe => probe(&host, &name, &args).await,
        World::Admission => admit(&host, &name, &args).await,
        World::Eviction => rank(&host, &name, &args).await,
        World::DeviceAdapter => devices(&host, &name, &args).await,
    }
}

/// The plugin's configuration: `--config`'s entry with FILE as its source, the
/// world, a name, and `--node-settings` over its settings.
pub(super) fn plugin_config(args: &RunArgs, world: World) -> anyhow::Result<PluginConfig> {
    let mut entry = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
            serde_saphyr::from_str::<serde_json::Value>(&text)
                .with_context(|| path.display().to_string())?
        }
        None => serde_json::json!({}),
    };
    let Some(map) = entry.as_object_mut() else {
        bail!("--config: not a mapping");
    };
    let stem = args
        .file
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.split('.').next())
        .unwrap_or("plugin");
    let fallback: String = stem
        .to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    map.entry("name")
        .or_insert(fallback.trim_matches('-').into());
    map.insert("world".into(), world.as_str().into());
    let file = std::path::absolute(&args.file).with_context(|| args.file.display().to_string())?;
    map.insert(
        "source".into(),
        serde_json::to_value(PluginSource::File(file))?,
    );
    let mut config: PluginConfig = serde_json::from_value(entry).context("--config")?;
    if let Some(raw) = &args.node_settings {
        for pair in settings_from_json(raw).map_err(|e| anyhow::anyhow!("--node-settings: {e}"))? {
            config.settings.insert(pair.key, pair.value);
        }
    }
    Ok(config)
}

fn read_manifest<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<T> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    serde_saphyr::from_str(&text).with_context(|| path.display().to_string())
}

fn require_pod(args: &RunArgs) -> anyhow::Result<Pod> {
    let Some(path) = &args.pod else {
        bail!("--pod POD.yaml is needed for this world");
    };
    read_manifest(path)
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// The pod's IP and the settings a `--target` URL implies.
fn target(raw: &str) -> anyhow::Result<(String, Vec<(String, String)>)> {
    let rest = raw.strip_prefix("http://").unwrap_or(raw);
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => (h, Some(p)),
        _ => (authority, None),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.parse::<std::net::IpAddr>().is_err() {
        bail!("--target {raw}: {host:?} is not an IP address (a probe reaches the pod's IPs only)");
    }
    let mut implied = Vec::new();
    if let Some(port) = port {
        port.parse::<u16>()
            .map_err(|_| anyhow::anyhow!("--target {raw}: bad port {port:?}"))?;
        implied.push(("port".to_string(), port.to_string()));
    }
    if !path.is_empty() && path != "/" {
        implied.push(("path".to_string(), path.to_string()));
    }
    Ok((host.to_string(), implied))
}

async fn probe(host: &PluginHost, name: &str, args: &RunArgs) -> anyhow::Result<bool> {
    let pod = require_pod(args)?;
    let containers = pod
        .spec
        .as_ref()
        .map(|s| &s.containers[..])
        .unwrap_or_default();
    let container = match &args.container {
        Some(c) => c.clone(),
        None => match containers.first() {
            Some(c) => c.name.clone(),
            None => bail!("the pod has no containers"),
        },
    };
    if !["readiness", "liveness", "startup"].contains(&args.probe_type.as_str()) {
        bail!(
            "--probe-type {}: readiness, liveness or startup",
            args.probe_type
        );
    }
    let mut settings = match &args.settings {
        Some(raw) => settings_from_json(raw).map_err(|e| anyhow::anyhow!("--settings: {e}"))?,
        None => Vec::new(),
    };
    let pod_ips = match &args.target {
        Some(raw) => {
            let (ip, implied) = target(raw)?;
            for (key, value) in implied {
                if !settings.iter().any(|p| p.key == key) {
                    settings.push(wasmlet_plugin_host::types::Pair { key, value });
                }
            }
            vec![ip]
        }
        None => pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ips.as_ref())
            .map(|ips| ips.iter().map(|ip| ip.ip.clone()).collect())
            .unwrap_or_default(),
    };
    if pod_ips.is_empty() {
        bail!("the pod has no IP: give --target http://IP:PORT");
    }
    let request = ProbeRequest {
        pod: pod_info(&pod),
        container: container.clone(),
        probe_type: args.probe_type.clone(),
        pod_ips,
        settings,
        timeout_ms: args.timeout_seconds.saturating_mul(1000),
    };
    println!(
        "call:   probe.check, {} probe of {container}, pod IPs {}, settings {}",
        args.probe_type,
        request.pod_ips.join(","),
        pairs(&request.settings)
    );
    let started = Instant::now();
    let outcome = host.try_probe(name, request).await;
    let took = started.elapsed();
    let ok = match outcome {
        Ok(ProbeResult::Success) => {
            println!("result: success");
            true
        }
        Ok(ProbeResult::Failure(message)) => {
            println!("result: failure: {message}");
            false
        }
        Err(e) => {
            println!("result: the call failed ({}): {e}", e.kind());
            false
        }
    };
    println!("took:   {}", ms(took));
    Ok(ok)
}

fn pairs(pairs: &[wasmlet_plugin_host::types::Pair]) -> String {
    let map: BTreeMap<&str, &str> = pairs
        .iter()
        .map(|p| (p.key.as_str(), p.value.as_str()))
        .collect();
    serde_json::to_string(&map).unwrap_or_default()
}

async fn admit(host: &PluginHost, name: &str, args: &RunArgs) -> anyhow::Result<bool> {
    let pod = require_pod(args)?;
    let node = match &args.node {
        Some(path) => node_info(read_manifest::<Node>(path)?),
        None => this_machine()?,
    };
    let state = node_state(&node, &[]);
    println!(
        "call:   admission.admit, pod {}/{} on node {}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or(""),
        node.name
    );
    let started = Instant::now();
    let outcome = host.try_admit(name, pod_info(&pod), state).await;
    let took = started.elapsed();
    let ok = match outcome {
        Ok(Decision::Admit) => {
            println!("result: admit");
            true
        }
        Ok(Decision::Deny(d)) => {
            println!("result: deny: {}: {}", d.reason, d.message);
            true
        }
        Err(e) => {
            let policy = if host
                .plugins()
                .iter()
                .any(|p| p.name == name && p.world == World::Admission)
            {
                "the node applies the plugin's failurePolicy"
            } else {
                ""
            };
            println!("result: the call failed ({}): {e}; {policy}", e.kind());
            false
        }
    };
    println!("took:   {}", ms(took));
    Ok(ok)
}

fn node_info(node: Node) -> NodeInfo {
    let status = node.status.unwrap_or_default();
    NodeInfo {
        name: node.metadata.name.unwrap_or_default(),
        allocatable: status.allocatable.unwrap_or_default(),
        labels: node.metadata.labels.unwrap_or_default(),
        taints: node.spec.and_then(|s| s.taints).unwrap_or_default(),
        os: "linux".into(),
        arch: crate::machine::go_arch(std::env::consts::ARCH).into(),
    }
}

/// A node of this machine's CPUs and memory and 110 pods, named after the host.
fn this_machine() -> anyhow::Result<NodeInfo> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let meminfo = std::fs::read_to_string("/proc/meminfo").context("/proc/meminfo")?;
    let memory = crate::machine::mem_total(&meminfo).map_err(anyhow::Error::msg)?;
    let hostname = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into());
    Ok(NodeInfo {
        name: hostname,
        allocatable: BTreeMap::from([
            ("cpu".into(), Quantity(cpus.to_string())),
            ("memory".into(), Quantity(memory.to_string())),
            ("pods".into(), Quantity("110".into())),
        ]),
        labels: BTreeMap::new(),
        taints: Vec::new(),
        os: "linux".into(),
        arch: crate::machine::go_arch(std::env::consts::ARCH).into(),
    })
}

/// One eviction candidate as `--candidates` lists it.
#[derive(serde::Deserialize)]
struct CandidateEntry {
    /// A pod manifest file, relative to the list's directory.
    pod: PathBuf,
    usage: Quantity,
    request: Quantity,
}

async fn rank(host: &PluginHost, name: &str, args: &RunArgs) -> anyhow::Result<bool> {
    let Some(path) = &args.candidates else {
        bail!("--candidates FILE is needed for the eviction-plugin world");
    };
    let entries: Vec<CandidateEntry> = read_manifest(path)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let resource = match args.signal.split('.').next() {
        Some("nodefs" | "imagefs" | "containerfs") => "ephemeral-storage",
        Some("pid") => "pods",
        Some(r) => r,
        None => "memory",
    };
    let mut candidates = Vec::new();
    let mut names = Vec::new();
    for entry in entries {
        let pod: Pod = read_manifest(&dir.join(&entry.pod))?;
        let amount = |q: &Quantity| {
            crate::plugins::canonical_amount(resource, q)
                .ok_or_else(|| anyhow::anyhow!("{}: bad quantity {:?}", entry.pod.display(), q.0))
        };
        let info = pod_info(&pod);
        names.push(format!("{}/{}", info.namespace, info.name));
        candidates.push(Candidate {
            usage: amount(&entry.usage)?,
            request: amount(&entry.request)?,
            pod: info,
        });
    }
    println!(
        "call:   eviction.rank, {} for {} candidates",
        args.signal,
        candidates.len()
    );
    let started = Instant::now();
    let outcome = host.try_rank(name, &args.signal, &candidates).await;
    let took = started.elapsed();
    let ok = match outcome {
        Ok(order) => {
            println!("result: eviction order:");
            for (place, i) in order.iter().enumerate() {
                match names.get(*i as usize) {
                    Some(pod) => println!("  {}. {pod}", place + 1),
                    None => println!("  {}. (index {i}: no such candidate)", place + 1),
                }
            }
            true
        }
        Err(e) => {
            println!(
                "result: the call failed ({}): {e}; the node would keep its built-in order",
                e.kind()
            );
            false
        }
    };
    println!("took:   {}", ms(took));
    Ok(ok)
}

async fn devices(host: &PluginHost, name: &str, args: &RunArgs) -> anyhow::Result<bool> {
    let resource = host.resource_name(name).unwrap_or_default();
    println!("call:   device-adapter.discover, resource {resource}");
    let started = Instant::now();
    let outcome = host.try_discover(name).await;
    let took = started.elapsed();
    let mut ok = match outcome {
        Ok(devices) => {
            println!("result: {} devices", devices.len());
            for d in devices {
                println!(
                    "  {} {}{}",
                    d.id,
                    if d.healthy { "healthy" } else { "unhealthy" },
                    d.numa_node
                        .map(|n| format!(" numa {n}"))
                        .unwrap_or_default()
                );
            }
            true
        }
        Err(e) => {
            println!("result: the call failed ({}): {e}", e.kind());
            false
        }
    };
    println!("took:   {}", ms(took));
    if !args.allocate.is_empty() {
        println!(
            "call:   device-adapter.allocate {}",
            args.allocate.join(",")
        );
        let started = Instant::now();
        let outcome = host.allocate(name, args.allocate.clone()).await;
        let took = started.elapsed();
        match outcome {
            Ok(Ok(a)) => {
                println!("result: allocation");
                for p in &a.envs {
                    println!("  env {}={}", p.key, p.value);
                }
                for m in &a.mounts {
                    println!(
                        "  mount {} -> {}{}",
                        m.host_path,
                        m.container_path,
                        if m.read_only { " (ro)" } else { "" }
                    );
                }
                for d in &a.devices {
                    println!(
                        "  device {} -> {} ({})",
                        d.host_path, d.container_path, d.permissions
                    );
                }
                for p in &a.annotations {
                    println!("  annotation {}={}", p.key, p.value);
                }
            }
            Ok(Err(refused)) => {
                println!("result: refused: {refused}");
                ok = false;
            }
            Err(e) => {
                println!("result: the call failed ({}): {e}", e.kind());
                ok = false;
            }
        }
        println!("took:   {}", ms(took));
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_gives_the_pod_ip_and_the_port_and_path_settings() {
        let (ip, implied) = target("http://10.1.2.3:8080/healthz").unwrap();
        assert_eq!(ip, "10.1.2.3");
        assert_eq!(
            implied,
            vec![
                ("port".to_string(), "8080".to_string()),
                ("path".to_string(), "/healthz".to_string())
            ]
        );
        let (ip, implied) = target("127.0.0.1").unwrap();
        assert_eq!((ip.as_str(), implied.len()), ("127.0.0.1", 0));
        assert_eq!(target("http://[::1]:80/").unwrap().0, "::1");
        assert!(
            target("http://example.com:80/")
                .unwrap_err()
                .to_string()
                .contains("not an IP")
        );
    }
}
