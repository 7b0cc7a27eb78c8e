//! Wiring: builds the node's parts from a [`NodeConfig`] and runs them until cancelled.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use wasmlet_runtime::Runtime;
use wasmlet_runtime_cri::{CriConfig, CriRuntime};
use wasmlet_runtime_wasm::{ImageStore, SandboxCommand, WasmRuntime, WasmRuntimeConfig};

use crate::cluster::events::EventRecorder;
use crate::config::NodeConfig;
use crate::pleg::{self, RelistHealth};
use crate::podconfig::file::FileSource;
use crate::router::RuntimeRouter;
use crate::runtime_state::RuntimeState;
use crate::server::{self, Check, ServerState};
use crate::status::StatusStore;
use crate::sync::PodSyncer;
use crate::syncloop::{LoopHealth, LoopTiming, SyncLoop};

/// Imports every OCI archive in the drop directory. A bad archive is reported by name
/// and skipped; the others are imported.
pub fn import_drop_dir(store: &ImageStore, dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut paths: Vec<_> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            !name.starts_with('.')
                && (name.ends_with(".tar") || name.ends_with(".tar.gz") || name.ends_with(".tgz"))
        })
        .collect();
    paths.sort();
    let mut imported = 0;
    for path in paths {
        match store.import_archive(&path) {
            Ok(entries) => {
                for e in entries {
                    tracing::info!(archive = %path.display(), image = %e.reference, id = %e.image.manifest_digest, "imported image");
                    imported += 1;
                }
            }
            Err(e) => tracing::error!("cannot import image archive: {e}"),
        }
    }
    imported
}

/// What the node registers: the machine, its resources, its runtimes.
async fn node_facts(
    config: &NodeConfig,
    cluster: &crate::config::ClusterSettings,
    addresses: Vec<std::net::IpAddr>,
    machine: Option<crate::machine::MachineInfo>,
    resources: Option<(
        BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
        BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    )>,
    router: &RuntimeRouter,
) -> crate::cluster::registration::NodeFacts {
    let hostname = config.node_name.clone();
    // The default runtime's version: the CRI runtime's when there is one.
    let mut runtime_version = String::new();
    if let Some(r) = router.default_runtime() {
        match r.version().await {
            Ok(v) => runtime_version = format!("{}://{}", v.runtime_name, v.runtime_version),
            Err(e) => tracing::warn!("cannot read the runtime's version for the Node: {e}"),
        }
    }
    let (capacity, allocatable) = resources.unwrap_or_default();
    crate::cluster::registration::NodeFacts {
        name: config.node_name.clone(),
        hostname,
        extra_labels: cluster.node_labels.clone(),
        taints: cluster.taints.clone(),
        addresses,
        machine: machine.unwrap_or_default(),
        capacity,
        allocatable,
        runtime_version,
        runtime_handlers: router.handler_names(),
        kubelet_port: config.port,
    }
}

/// Loads the configured plugins (`wasmlet.plugins`), if any, and watches their files.
/// A plugin that cannot be loaded is an error in the log and a `PluginLoadFailed`
/// event, not the node's end: calls to it fail by its world's policy. Disables,
/// re-enables and reloads become events on the Node.
async fn start_plugins(
    config: &NodeConfig,
    images: &wasmlet_runtime_wasm::image::ImageStore,
    events: &EventRecorder,
    cancel: CancellationToken,
) -> Option<wasmlet_plugin_host::PluginHost> {
    use wasmlet_plugin_host::{PluginEventKind, PluginSource};
    if config.plugins.is_empty() {
        return None;
    }
    let node_name = config.node_name.clone();
    let recorder = events.clone();
    let sink: wasmlet_plugin_host::EventSink = Arc::new(move |event| {
        let (type_, reason, message) = match &event.kind {
            PluginEventKind::Disabled {
                failures,
                backoff,
                last_error,
            } => (
                crate::cluster::events::WARNING,
                "PluginDisabled",
                format!(
                    "plugin {} disabled for {backoff:?} after {failures} failures in a row: {last_error}",
                    event.plugin
                ),
            ),
            PluginEventKind::Enabled => (
                crate::cluster::events::NORMAL,
                "PluginEnabled",
                format!("plugin {} answers again", event.plugin),
            ),
            PluginEventKind::Reloaded => (
                crate::cluster::events::NORMAL,
                "PluginReloaded",
                format!("plugin {} reloaded from its changed file", event.plugin),
            ),
            PluginEventKind::ReloadFailed { error } => (
                crate::cluster::events::WARNING,
                "PluginReloadFailed",
                format!(
                    "plugin {}: its changed file cannot be loaded; the previous version keeps running: {error}",
                    event.plugin
                ),
            ),
        };
        tracing::warn!(plugin = %event.plugin, reason, "{message}");
        recorder.node(&node_name, type_, reason, &message);
    });
    let host = match wasmlet_plugin_host::PluginHost::new(wasmlet_plugin_host::HostOptions {
        events: Some(sink),
        ..Default::default()
    }) {
        Ok(host) => host,
        Err(e) => {
            tracing::error!("plugins: cannot start the plugin host: {e:#}; no plugin runs");
            return None;
        }
    };
    for plugin in &config.plugins {
        let name = plugin.name.clone();
        let loaded = match &plugin.source {
            PluginSource::File(_) => host
                .load(plugin.clone())
                .await
                .map_err(|e| format!("{e:#}")),
            // An image in the node's Wasm image store (imported or pulled for a pod).
            PluginSource::Image(reference) => match images.resolve(reference) {
                Ok(entry) => match std::fs::read(images.blob_path(&entry.image.wasm_digest)) {
                    Ok(bytes) => host
                        .load_bytes(plugin.clone(), bytes)
                        .await
                        .map_err(|e| format!("{e:#}")),
                    Err(e) => Err(format!("reading image {reference}: {e}")),
                },
                Err(e) => Err(format!("image {reference}: {e}")),
            },
        };
        match loaded {
            Ok(()) => {
                tracing::info!(plugin = %name, world = %plugin.world.as_str(), "plugin loaded")
            }
            Err(e) => {
                tracing::error!(plugin = %name, "plugin not loaded: {e}");
                events.node(
                    &config.node_name,
                    crate::cluster::events::WARNING,
                    "PluginLoadFailed",
                    &format!("plugin {name} not loaded: {e}"),
                );
            }
        }
    }
    let watcher = host.clone();
    tokio::spawn(async move { watcher.watch(cancel).await });
    Some(host)
}

/// Runs the node until `cancel` fires, then stops its Wasm sandboxes.
pub async fn run(config: NodeConfig, cancel: CancellationToken) -> anyhow::Result<()> {
    let started = Instant::now();
    for dir in [&config.root_dir, &config.pod_logs_dir] {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    // One node per root directory: two would adopt each other's sandboxes.
    let lock_path = config.root_dir.join("wasmlet.lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .with_context(|| format!("opening {}", lock_path.display()))?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => anyhow::bail!(
            "another wasmlet is running with root directory {} (it holds {})",
            config.root_dir.display(),
            lock_path.display()
        ),
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("locking {}", lock_path.display()));
        }
    }
    let mut machine = None;
    let mut node_resources = None;
    match crate::machine::MachineInfo::read(&crate::machine::HostPaths::default()) {
        Ok(m) => {
            machine = Some(m.clone());
            tracing::info!(
                cpus = m.cpus,
                memory_mib = m.memory_bytes >> 20,
                kernel = %m.kernel_version,
                os = %m.os_image,
                arch = %m.architecture,
                "machine"
            );
            let fs = crate::machine::fs_stats(&config.root_dir).ok();
            let capacity = crate::allocatable::Resources::capacity(&m, fs, config.max_pods);
            match capacity.allocatable(&config.reservations) {
                Ok(a) => {
                    tracing::info!(
                        capacity = ?capacity.to_list().iter().map(|(k, v)| format!("{k}={}", v.0)).collect::<Vec<_>>(),
                        allocatable = ?a.to_list().iter().map(|(k, v)| format!("{k}={}", v.0)).collect::<Vec<_>>(),
                        "node resources"
                    );
                    node_resources = Some((capacity.to_list(), a.to_list()));
                }
                Err(e) => tracing::warn!("cannot compute allocatable resources: {e}"),
            }
        }
        Err(e) => tracing::warn!("cannot read the machine's resources: {e}"),
    }
    // The kubelet's own `--oom-score-adj` (-999): the node is the last thing the OOM
    // killer should pick. Without CAP_SYS_RESOURCE the kernel refuses; that is fine.
    if std::fs::write("/proc/self/oom_score_adj", "-999").is_err() {
        tracing::debug!("cannot lower the node's oom_score_adj (no CAP_SYS_RESOURCE)");
    }
    if let Some(settings) = &config.cgroups
        && settings.driver == crate::cm::cgroup::Driver::Systemd
        && std::path::Path::new("/run/systemd/system").exists()
    {
        tracing::warn!(
            "cgroupDriver systemd: the node names its cgroups as systemd slices but writes them itself; systemd may reset their limits when it manages the slices (docs/decisions.md)"
        );
    }
    let container_manager = match (&config.cgroups, &machine) {
        (Some(settings), Some(m)) => {
            let cm =
                crate::cm::ContainerManager::new(cgroup_config(settings, m, &config.reservations))
                    .context("cgroups")?;
            cm.start()
                .with_context(|| format!("creating the node's cgroups under {}", settings.root))?;
            tracing::info!(root = %settings.root, driver = %settings.driver, "pod cgroups enforced");
            Some(Arc::new(cm))
        }
        (Some(_), None) => {
            anyhow::bail!("cgroupsPerQOS needs the machine's resources, which could not be read")
        }
        (None, _) => None,
    };
    let wasm = WasmRuntime::new(WasmRuntimeConfig {
        image_dir: config.image_store_dir(),
        compile_cache_dir: config.compile_cache_dir(),
        state_dir: config.wasm_state_dir(),
        sandbox: SandboxCommand {
            program: config.sandbox_program.clone(),
            args: config.sandbox_args.clone(),
        },
        cgroup_mount_root: std::path::PathBuf::from(
            wasmlet_runtime_wasm::cgroup::DEFAULT_MOUNT_ROOT,
        ),
    })
    .context("starting the Wasm runtime")?;
    import_drop_dir(wasm.images(), &config.image_drop_dir());
    // Sandboxes left running by an earlier run of the node (it crashed or was killed)
    // are adopted with their containers; the pod workers find them by their labels.
    let adopted = wasm.restore().await;
    if adopted > 0 {
        tracing::info!(sandboxes = adopted, "adopted running Wasm sandboxes");
    }

    let wasm_dyn: Arc<dyn Runtime> = Arc::new(wasm.clone());
    let mut handlers = BTreeMap::from([(wasmlet_runtime_wasm::HANDLER.to_owned(), wasm_dyn)]);
    let mut default_handler = wasmlet_runtime_wasm::HANDLER.to_owned();
    if let Some(cri) = &config.cri {
        let runtime = CriRuntime::connect(CriConfig {
            runtime_endpoint: cri.runtime_endpoint.clone(),
            image_endpoint: cri.image_endpoint.clone(),
            request_timeout: cri.request_timeout,
            handler: String::new(),
        })
        .with_context(|| format!("container runtime endpoint {}", cri.runtime_endpoint))?;
        match runtime.version().await {
            Ok(v) => {
                tracing::info!(endpoint = %cri.runtime_endpoint, runtime = %v.runtime_name, version = %v.runtime_version, "connected to the CRI runtime")
            }
            // The node keeps running its Wasm pods; container pods wait for the runtime.
            Err(e) => {
                tracing::error!(endpoint = %cri.runtime_endpoint, "CRI runtime not usable yet: {e}")
            }
        }
        let cri_dyn: Arc<dyn Runtime> = Arc::new(runtime);
        // The default handler (empty) and every RuntimeClass handler other than
        // wasmtime go to the CRI runtime, which is told the handler per sandbox.
        handlers.insert(String::new(), cri_dyn.clone());
        for handler in config.runtime_handlers.values() {
            if handler != wasmlet_runtime_wasm::HANDLER {
                handlers.insert(handler.clone(), cri_dyn.clone());
            }
        }
        default_handler = String::new();
    }
    let router = RuntimeRouter::new(config.runtime_handlers.clone(), handlers, default_handler)
        .with_wasm_images(wasm.images().clone());
    let (events, events_rx) = if config.cluster.is_some() {
        let (r, rx) = EventRecorder::channel();
        (r, Some(rx))
    } else {
        (EventRecorder::default(), None)
    };
    // The node's IPs: `--node-ip`, else the default route's (the downward API's
    // `status.hostIP` and the Node's InternalIP).
    let node_ips: Vec<std::net::IpAddr> = match config.cluster.as_ref().map(|c| &c.node_ips) {
        Some(ips) if !ips.is_empty() => ips.clone(),
        _ => crate::cluster::registration::detect_node_ip(&config.node_name)
            .into_iter()
            .collect(),
    };
    // Requests have a deadline; watches (which idle for minutes) use their own client.
    let (client, watch_client) = match &config.cluster {
        Some(cluster) => (
            Some(
                crate::cluster::client_from_kubeconfig(
                    &cluster.kubeconfig,
                    Some(crate::cluster::REQUEST_TIMEOUT),
                )
                .await?,
            ),
            Some(crate::cluster::client_from_kubeconfig(&cluster.kubeconfig, None).await?),
        ),
        None => (None, None),
    };
    let static_pods = crate::cluster::mirror::StaticPods::default();
    // What admission checks pods against: the labels the node registers with, its
    // allocatable resources and its taints. Without known resources, nothing is
    // checked (rather than every pod refused).
    let admission_node = node_resources.as_ref().map(|(_, allocatable)| {
        let arch = machine
            .as_ref()
            .map(|m| m.architecture.clone())
            .unwrap_or_else(|| crate::machine::go_arch(std::env::consts::ARCH).to_owned());
        let labels = crate::cluster::registration::kubelet_labels(
            &config.node_name,
            &arch,
            &config
                .cluster
                .as_ref()
                .map(|c| c.node_labels.clone())
                .unwrap_or_default(),
        );
        crate::admission::NodeInfo {
            name: config.node_name.clone(),
            allocatable: allocatable.clone(),
            labels,
            taints: config
                .cluster
                .as_ref()
                .map(|c| c.taints.clone())
                .unwrap_or_default(),
            os: "linux".into(),
            arch,
        }
    });
    let plugins = start_plugins(&config, wasm.images(), &events, cancel.clone()).await;
    let statuses = StatusStore::default();
    let (probe_tx, probe_rx) = mpsc::unbounded_channel();
    let probes = crate::prober::ProbeManager::new(
        statuses.clone(),
        Some(router.clone()),
        Arc::new(match &plugins {
            Some(host) => crate::prober::RealRunner::with_plugins(host.clone()),
            None => crate::prober::RealRunner::default(),
        }),
        events.clone(),
        probe_tx,
    );
    let mut syncer = PodSyncer::new(
        router.clone(),
        config.backoff_initial,
        config.backoff_max,
        config.pod_logs_dir.clone(),
    )
    .with_dns(config.dns.clone())
    .with_events(events.clone())
    .with_pods_dir(config.root_dir.join("pods"))
    .with_probes(probes.clone())
    .with_node(
        node_ips.iter().map(|ip| ip.to_string()).collect(),
        node_resources.clone().map(|(_, a)| a).unwrap_or_default(),
    );
    let services = crate::cluster::ServiceCache::default();
    if let Some(client) = &client {
        syncer = syncer.with_objects(Arc::new(crate::cluster::ApiObjects {
            client: client.clone(),
            services: services.clone(),
        }));
    }
    if let Some(m) = &machine {
        match crate::cm::OomScores::new(m.memory_bytes) {
            Ok(scores) => syncer = syncer.with_oom_scores(scores),
            Err(e) => {
                tracing::warn!("containers get no oom_score_adj: reading this process's own: {e}")
            }
        }
    }
    if let Some(cm) = &container_manager {
        syncer = syncer.with_cgroups(cm.clone());
    }
    let syncer = Arc::new(syncer);
    let loop_health = LoopHealth::default();
    let relist_health = RelistHealth::default();

    let loop_threshold = (config.sync_frequency * 2).max(Duration::from_secs(300));
    let pleg_threshold = config.pleg_unhealthy_after;
    let checks: Vec<(&'static str, Check)> = vec![
        ("syncloop", {
            let h = loop_health.clone();
            Arc::new(move || h.check(loop_threshold))
        }),
        ("pleg", {
            let h = relist_health.clone();
            Arc::new(move || h.check(started, pleg_threshold))
        }),
    ];
    let runtime_state = RuntimeState::new(&router);
    tokio::spawn(runtime_state.clone().run(router.clone(), cancel.clone()));
    let ready_checks: Vec<(&'static str, Check)> = vec![("runtime", {
        let s = runtime_state.clone();
        Arc::new(move || s.check())
    })];
    let state = ServerState {
        statuses: statuses.clone(),
        probes: Some(probes.clone()),
        plugins: plugins.clone(),
        checks,
        ready_checks,
    };
    let mut servers = Vec::new();
    if config.read_only_port != 0 {
        let addr = SocketAddr::new(config.address, config.read_only_port);
        servers.push(
            server::serve(
                addr,
                server::read_only_router(state.clone()),
                cancel.clone(),
            )
            .await?,
        );
        tracing::info!(%addr, "serving the read-only API (/pods, /healthz, /readyz)");
    }
    if config.healthz_port != 0 {
        let addr = SocketAddr::new(config.healthz_bind_address, config.healthz_port);
        servers.push(
            server::serve(addr, server::healthz_router(state.clone()), cancel.clone()).await?,
        );
        tracing::info!(%addr, "serving /healthz and /readyz");
    }

    let (sources_tx, sources_rx) = mpsc::channel(16);
    let mut sources = Vec::new();
    if let Some(dir) = &config.static_pod_path {
        tracing::info!(dir = %dir.display(), "watching static pod manifests");
        let source = FileSource::new(dir, &config.node_name);
        sources.push(crate::podconfig::file::SOURCE.to_owned());
        tokio::spawn(source.run(
            config.file_check_frequency,
            sources_tx.clone(),
            cancel.clone(),
        ));
    }
    if let Some(m) = &config.manifest_url {
        tracing::info!(url = %m.url, "fetching static pod manifests");
        sources.push(crate::podconfig::http::SOURCE.to_owned());
        let source = crate::podconfig::http::HttpSource::new(m.clone(), &config.node_name);
        tokio::spawn(source.run(sources_tx.clone(), cancel.clone()));
    }
    if let (Some(cluster), Some(client), Some(watch_client)) =
        (&config.cluster, client, watch_client)
    {
        sources.push(crate::cluster::pod_source::SOURCE.to_owned());
        let facts = node_facts(
            &config,
            cluster,
            node_ips.clone(),
            machine.clone(),
            node_resources.clone(),
            &router,
        )
        .await;
        let inputs = {
            let runtime_state = runtime_state.clone();
            let relist_health = relist_health.clone();
            let router = router.clone();
            crate::cluster::node_status::StatusInputs {
                readiness: Arc::new(move || {
                    let mut problems = Vec::new();
                    if let Err(e) = runtime_state.check() {
                        problems.push(e);
                    }
                    if let Err(e) = relist_health.check(started, pleg_threshold) {
                        problems.push(format!("PLEG is not healthy: {e}"));
                    }
                    if problems.is_empty() {
                        Ok(())
                    } else {
                        Err(problems.join(", "))
                    }
                }),
                images: Arc::new(move || {
                    let router = router.clone();
                    Box::pin(async move {
                        let mut all = Vec::new();
                        for r in router.runtimes() {
                            all.extend(r.list_images().await.unwrap_or_default());
                        }
                        all
                    })
                }),
            }
        };
        let api_pods = crate::cluster::ApiPods::default();
        let node_handle = crate::cluster::NodeHandle::default();
        tokio::spawn(crate::cluster::pod_source::run(
            watch_client.clone(),
            config.node_name.clone(),
            api_pods.clone(),
            sources_tx.clone(),
            cancel.clone(),
        ));
        tokio::spawn(crate::cluster::watch_services(
            watch_client.clone(),
            services,
            cancel.clone(),
        ));
        tokio::spawn(crate::cluster::runtime_classes::run(
            watch_client,
            router.clone(),
            cancel.clone(),
        ));
        if let Some(rx) = events_rx {
            tokio::spawn(crate::cluster::events::run(
                client.clone(),
                config.node_name.clone(),
                rx,
                cancel.clone(),
            ));
        }
        tokio::spawn(
            crate::cluster::status_manager::StatusManager::new(
                client.clone(),
                statuses.clone(),
                api_pods.clone(),
                node_handle.clone(),
            )
            .run(cancel.clone()),
        );
        tokio::spawn(
            crate::cluster::mirror::MirrorManager {
                client: client.clone(),
                static_pods: static_pods.clone(),
                api_pods,
                node: node_handle.clone(),
            }
            .run(cancel.clone()),
        );
        let cancel = cancel.clone();
        let cluster = cluster.clone();
        let events = events.clone();
        tokio::spawn(async move {
            if cluster.register_node {
                match crate::cluster::registration::register(&client, &facts, &cancel).await {
                    Some(node) => {
                        node_handle.set(node);
                        events.node(
                            &facts.name,
                            crate::cluster::events::NORMAL,
                            "Starting",
                            "Starting kubelet.",
                        );
                    }
                    None => return,
                }
            }
            let lease = crate::cluster::lease::LeaseController::new(
                client.clone(),
                &facts.name,
                cluster.lease_duration_seconds,
                node_handle.clone(),
            );
            tokio::spawn(lease.run(cancel.clone()));
            crate::cluster::node_status::NodeStatusLoop {
                client,
                facts,
                inputs,
                node: node_handle,
                update_frequency: cluster.status_update_frequency,
                report_frequency: cluster.status_report_frequency,
            }
            .run(cancel)
            .await;
        });
        tracing::info!(kubeconfig = %cluster.kubeconfig.display(), "joining the cluster");
    }
    if sources.is_empty() {
        tracing::warn!(
            "no static pod path, manifest URL or API server: this node has no pod source"
        );
    }
    let (pleg_tx, pleg_rx) = mpsc::channel(1024);
    tokio::spawn(pleg::run(
        router.clone(),
        config.pleg_relist_period,
        relist_health,
        pleg_tx,
        cancel.clone(),
    ));

    tracing::info!(node = %config.node_name, root_dir = %config.root_dir.display(), "wasmlet is running");
    let sync_loop = SyncLoop::new(
        syncer,
        statuses,
        LoopTiming {
            housekeeping_interval: config.housekeeping_interval,
            sync_frequency: config.sync_frequency,
        },
        loop_health,
    )
    .with_sources(sources)
    .with_static_pods(static_pods)
    .with_probes(probes, probe_rx);
    let sync_loop = match admission_node {
        Some(node) => sync_loop.with_admission(node, events.clone()),
        None => sync_loop,
    };
    let sync_loop = match &plugins {
        Some(host) => sync_loop.with_plugins(
            host.clone(),
            crate::plugins::admission_plugins(&config.plugins),
        ),
        None => sync_loop,
    };
    sync_loop.run(sources_rx, pleg_rx, cancel.clone()).await;
    drop(sources_tx);

    tracing::info!("shutting down: stopping Wasm sandboxes");
    let sandboxes = wasm.list_pod_sandboxes().await.unwrap_or_default();
    // A deliberate stop ends the node's Wasm pods (a crash leaves them to be adopted).
    let stops = sandboxes.iter().map(|sb| wasm.remove_pod_sandbox(&sb.id));
    if tokio::time::timeout(Duration::from_secs(10), futures::future::join_all(stops))
        .await
        .is_err()
    {
        tracing::warn!("some sandboxes did not stop within 10s; they are killed");
    }
    // Their pod cgroups go with them (container pods keep running, and their cgroups).
    if let Some(cm) = container_manager.clone() {
        let uids: Vec<String> = sandboxes.iter().map(|sb| sb.metadata.uid.clone()).collect();
        let removed = tokio::task::spawn_blocking(move || {
            for uid in uids {
                if let Err(e) = cm.remove_pod(&uid) {
                    tracing::warn!(pod_uid = %uid, "removing the pod cgroup: {e}");
                }
            }
        });
        let _ = tokio::time::timeout(Duration::from_secs(15), removed).await;
    }
    for s in servers {
        let _ = tokio::time::timeout(Duration::from_secs(2), s).await;
    }
    drop(lock);
    Ok(())
}

/// The container manager's settings from the node's configuration and machine.
fn cgroup_config(
    settings: &crate::config::CgroupSettings,
    machine: &crate::machine::MachineInfo,
    reservations: &crate::allocatable::Reservations,
) -> crate::cm::Config {
    use crate::cm::formulas::NodeResources;
    let resources = |map: &std::collections::BTreeMap<
        String,
        k8s_openapi::apimachinery::pkg::api::resource::Quantity,
    >| NodeResources {
        milli_cpu: map
            .get("cpu")
            .and_then(|q| crate::quantity::parse(q).ok())
            .map(|cores| (cores * 1000.0).ceil() as u64)
            .unwrap_or(0),
        memory_bytes: map
            .get("memory")
            .and_then(|q| crate::quantity::bytes(q).ok())
            .unwrap_or(0),
    };
    crate::cm::Config {
        driver: settings.driver,
        cgroup_root: settings.root.clone(),
        mount_root: std::path::PathBuf::from("/sys/fs/cgroup"),
        cpu_cfs_quota: settings.cpu_cfs_quota,
        cpu_cfs_quota_period_us: settings.cpu_cfs_quota_period.as_micros() as u64,
        pod_pids_limit: settings.pod_pids_limit,
        enforce_node_allocatable: settings.enforce_node_allocatable.clone(),
        capacity: NodeResources {
            milli_cpu: u64::from(machine.cpus) * 1000,
            memory_bytes: machine.memory_bytes,
        },
        kube_reserved: resources(&reservations.kube_reserved),
        system_reserved: resources(&reservations.system_reserved),
    }
}
