//! Running a built [`Node`]: its tasks started on one tracker, its servers bound, its
//! sync loop turned until cancelled; then the drain.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use wasmlet_runtime::Runtime;
use wasmlet_runtime_wasm::WasmRuntime;

use super::tasks::Tasks;
use super::{
    CGROUP_REMOVAL_DEADLINE, DRAIN_DEADLINE, Managers, Node, PodSources, Runtimes,
    SANDBOX_STOP_DEADLINE, Server, cluster,
};
use crate::config::NodeConfig;
use crate::pleg;
use crate::podconfig::SourceSnapshot;
use crate::server;
use crate::syncloop::{LoopTiming, SyncLoop};

impl Node {
    /// Starts the node's tasks and runs its sync loop until `cancel` fires; then drains
    /// the tasks (up to [`DRAIN_DEADLINE`]) while it stops the Wasm sandboxes.
    pub async fn run(self, cancel: CancellationToken) -> anyhow::Result<()> {
        let Node {
            config,
            lock,
            runtimes,
            mut managers,
            servers,
            sources,
        } = self;
        let tasks = Tasks::default();
        if let Some(host) = managers.plugins.clone() {
            let cancel = cancel.clone();
            tasks.spawn("plugin watcher", async move { host.watch(cancel).await });
        }
        tasks.spawn(
            "runtime state",
            managers
                .runtime_state
                .clone()
                .run(runtimes.router.clone(), cancel.clone()),
        );
        if let Some(logs) =
            crate::logs::ContainerLogManager::new(runtimes.router.clone(), &config.container_logs)
        {
            tasks.spawn("container log manager", logs.run(cancel.clone()));
        }
        tasks.spawn(
            "image garbage collector",
            managers.image_gc.clone().run(cancel.clone()),
        );
        if let Some(eviction) = managers.eviction.take() {
            tasks.spawn("eviction manager", eviction.run(cancel.clone()));
        }
        tasks.spawn(
            "device manager",
            managers.devices.clone().run(
                managers.plugins.clone(),
                crate::plugins::device_adapters(&config.plugins),
                config.devices.adapter_period,
                cancel.clone(),
            ),
        );
        if let Some(client) = managers.api_client.clone() {
            tasks.spawn(
                "CSINode initialization",
                crate::volumes::csi::registration::initialize_csinode(
                    client,
                    config.node_name.clone(),
                    cancel.clone(),
                ),
            );
        }
        match crate::pluginwatcher::PluginWatcher::new(&config.root_dir) {
            Ok(watcher) => {
                let devices = crate::cm::devicemanager::registration::WatcherHandler(
                    managers.devices.clone(),
                );
                let csi = crate::volumes::csi::registration::CsiRegistration {
                    drivers: managers.csi_drivers.clone(),
                    client: managers.api_client.clone(),
                    node_name: config.node_name.clone(),
                };
                tasks.spawn(
                    "plugin registry",
                    watcher
                        .handle("DevicePlugin", Arc::new(devices))
                        .handle(crate::volumes::csi::PLUGIN_TYPE, Arc::new(csi))
                        .run(cancel.clone()),
                );
            }
            Err(e) => tracing::error!("plugins cannot register through plugins_registry: {e}"),
        }
        if let Some(shutdown) = managers.shutdown.take() {
            tasks.spawn("node shutdown manager", shutdown.run(cancel.clone()));
        }
        start_servers(servers, &tasks, &cancel).await?;
        let (names, sources_tx, sources_rx) =
            start_pod_sources(&config, sources, &runtimes, &mut managers, &tasks, &cancel);
        let (pleg_tx, pleg_rx) = mpsc::channel(1024);
        tasks.spawn(
            "pleg",
            pleg::run(
                runtimes.router.clone(),
                config.pleg_relist_period,
                managers.relist_health.clone(),
                pleg_tx,
                cancel.clone(),
            ),
        );

        tracing::info!(node = %config.node_name, root_dir = %config.root_dir.display(), "wasmlet is running");
        let container_manager = managers.container_manager.clone();
        let probes = managers.probes.clone();
        let sync_loop = sync_loop(&config, managers, names);
        let workers = sync_loop.worker_tasks();
        sync_loop.run(sources_rx, pleg_rx, cancel.clone()).await;
        drop(sources_tx);

        shutdown(tasks, workers, probes, &runtimes.wasm, container_manager).await;
        drop(lock);
        Ok(())
    }
}

/// Binds every server and starts serving; a port that cannot be bound is the node's
/// end.
async fn start_servers(
    servers: Vec<Server>,
    tasks: &Tasks,
    cancel: &CancellationToken,
) -> anyhow::Result<()> {
    for s in servers {
        let handle = match s.tls {
            Some(tls) => {
                server::https::serve(s.addr, s.router, tls, Default::default(), cancel.clone())
                    .await?
            }
            None => server::serve(s.addr, s.router, cancel.clone()).await?,
        };
        tasks.spawn(s.name, async move {
            let _ = handle.await;
        });
        tracing::info!(addr = %s.addr, "{}", s.serving);
    }
    Ok(())
}

/// Starts the pod sources (and, in a cluster, the node's membership: its watches, its
/// writers, registration and the lease). Returns the sources' names and the channel
/// they send to, whose sender the node keeps until its sync loop has returned.
fn start_pod_sources(
    config: &NodeConfig,
    sources: PodSources,
    runtimes: &Runtimes,
    managers: &mut Managers,
    tasks: &Tasks,
    cancel: &CancellationToken,
) -> (
    Vec<String>,
    mpsc::Sender<SourceSnapshot>,
    mpsc::Receiver<SourceSnapshot>,
) {
    let PodSources {
        names,
        tx,
        rx,
        file,
        http,
        cluster,
    } = sources;
    if let Some((dir, source)) = file {
        tracing::info!(dir = %dir.display(), "watching static pod manifests");
        tasks.spawn(
            "static pod directory",
            source.run(config.file_check_frequency, tx.clone(), cancel.clone()),
        );
    }
    if let Some((url, source)) = http {
        tracing::info!(url = %url, "fetching static pod manifests");
        tasks.spawn("manifest URL", source.run(tx.clone(), cancel.clone()));
    }
    if let Some(membership) = cluster {
        let kubeconfig = membership.kubeconfig().to_owned();
        membership.start(
            cluster::Shared {
                node_name: config.node_name.clone(),
                router: runtimes.router.clone(),
                services: managers.services.clone(),
                statuses: managers.statuses.clone(),
                static_pods: managers.static_pods.clone(),
                events: managers.events.clone(),
                events_rx: managers.events_rx.take(),
                sources_tx: tx.clone(),
            },
            tasks,
            cancel,
        );
        tracing::info!(kubeconfig = %kubeconfig.display(), "joining the cluster");
    }
    if names.is_empty() {
        tracing::warn!(
            "no static pod path, manifest URL or API server: this node has no pod source"
        );
    }
    (names, tx, rx)
}

/// The sync loop over the managers, with admission (built-in, then the plugins').
fn sync_loop(config: &NodeConfig, mut managers: Managers, sources: Vec<String>) -> SyncLoop {
    let sync_loop = SyncLoop::new(
        managers.syncer,
        managers.statuses,
        LoopTiming {
            housekeeping_interval: config.housekeeping_interval,
            sync_frequency: config.sync_frequency,
        },
        managers.loop_health,
    )
    .with_sources(sources)
    .with_static_pods(managers.static_pods)
    .with_probes(managers.probes, managers.probe_rx);
    let sync_loop = match managers.evictions_rx.take() {
        Some(rx) => sync_loop.with_eviction(managers.pressure.clone(), rx),
        None => sync_loop,
    }
    .with_shutdown(managers.shutdown_state.clone())
    .with_container_gc(config.container_gc);
    let sync_loop = sync_loop.with_resources(managers.topology.clone(), managers.devices.clone());
    let sync_loop = match &managers.cpus {
        Some(cpus) => sync_loop.with_cpu_changes(cpus.subscribe()),
        None => sync_loop,
    };
    let sync_loop = match managers.admission {
        Some(node) => sync_loop.with_admission(node, managers.events.clone()),
        None => sync_loop,
    };
    match &managers.plugins {
        Some(host) => sync_loop.with_plugins(
            host.clone(),
            crate::plugins::admission_plugins(&config.plugins),
        ),
        None => sync_loop,
    }
}

/// Drains the node once its sync loop has returned: closes the tracker and waits, up
/// to [`DRAIN_DEADLINE`], for its tasks, its pod workers (and housekeeping) and its
/// probe workers, while the Wasm sandboxes are stopped; names what did not finish.
async fn shutdown(
    tasks: Tasks,
    workers: tokio_util::task::TaskTracker,
    probes: crate::prober::ProbeManager,
    wasm: &WasmRuntime,
    container_manager: Option<Arc<crate::cm::ContainerManager>>,
) {
    // The pod workers run on the sync loop's own tracker; the loop has returned, so
    // no worker is started any more.
    tasks.spawn("pod workers", async move {
        workers.close();
        workers.wait().await;
    });
    tasks.spawn("probe workers", async move { probes.shutdown().await });
    let (unfinished, ()) = tokio::join!(
        tasks.drain(DRAIN_DEADLINE),
        stop_wasm_pods(wasm, container_manager)
    );
    if unfinished.is_empty() {
        tracing::debug!("every task finished");
    } else {
        tracing::warn!(
            tasks = %unfinished.join(", "),
            "shutting down: tasks did not finish within {}s; they are dropped",
            DRAIN_DEADLINE.as_secs()
        );
    }
}

/// Stops every Wasm sandbox (a deliberate stop ends the node's Wasm pods; a crash
/// leaves them to be adopted) and removes their pod cgroups. Container pods keep
/// running, and their cgroups.
async fn stop_wasm_pods(
    wasm: &WasmRuntime,
    container_manager: Option<Arc<crate::cm::ContainerManager>>,
) {
    tracing::info!("shutting down: stopping Wasm sandboxes");
    let sandboxes = wasm.list_pod_sandboxes().await.unwrap_or_default();
    let stops = sandboxes.iter().map(|sb| wasm.remove_pod_sandbox(&sb.id));
    if tokio::time::timeout(SANDBOX_STOP_DEADLINE, futures::future::join_all(stops))
        .await
        .is_err()
    {
        tracing::warn!("some sandboxes did not stop within 10s; they are killed");
    }
    if let Some(cm) = container_manager {
        let uids: Vec<String> = sandboxes.iter().map(|sb| sb.metadata.uid.clone()).collect();
        // Blocking work, awaited here with its own deadline.
        let removed = tokio::task::spawn_blocking(move || {
            for uid in uids {
                if let Err(e) = cm.remove_pod(&uid) {
                    tracing::warn!(pod_uid = %uid, "removing the pod cgroup: {e}");
                }
            }
        });
        let _ = tokio::time::timeout(CGROUP_REMOVAL_DEADLINE, removed).await;
    }
}
