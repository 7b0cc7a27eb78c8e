//! Wiring: a [`Node`] is built from a [`NodeConfig`] ([`Node::build`]), run until
//! cancelled ([`Node::run`]), then drained.
//!
//! Building goes in phases, one function each, in this order: the root directory's
//! lock, the machine's facts, the node's cgroups, the runtimes and their router, the
//! API clients (with a kubeconfig), the managers (events, plugins, statuses, probes,
//! the pod syncer, health), the servers and the pod sources. Nothing runs yet.
//!
//! Running (`node/run.rs`) starts every task on one tracker (`node/tasks.rs`), binds
//! the servers and turns the sync loop until cancelled. Then the tracker is closed and
//! the node waits, up to [`DRAIN_DEADLINE`], for its tasks and its pod workers to
//! finish what they are in (a status write, a sync) while it stops its Wasm sandboxes;
//! what did not finish is named in the log.

mod cluster;
mod node_api;
mod plugin_host;
mod run;
mod tasks;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use wasmlet_runtime::Runtime;
use wasmlet_runtime_cri::{CriConfig, CriRuntime};
use wasmlet_runtime_wasm::{ImageStore, SandboxCommand, WasmRuntime, WasmRuntimeConfig};

use crate::cluster::events::{EventRecorder, Record};
use crate::config::NodeConfig;
use crate::machine::MachineInfo;
use crate::pleg::RelistHealth;
use crate::podconfig::SourceSnapshot;
use crate::podconfig::file::FileSource;
use crate::podconfig::http::HttpSource;
use crate::router::RuntimeRouter;
use crate::runtime_state::RuntimeState;
use crate::server::{self, Check, ServerState};
use crate::status::StatusStore;
use crate::sync::PodSyncer;
use crate::syncloop::LoopHealth;

/// How long shutdown waits for the node's tasks and pod workers to finish.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(10);

/// How long shutdown waits for the Wasm sandboxes to stop.
const SANDBOX_STOP_DEADLINE: Duration = Duration::from_secs(10);

/// How long shutdown waits for the stopped pods' cgroups to be removed.
const CGROUP_REMOVAL_DEADLINE: Duration = Duration::from_secs(15);

/// Resource name to quantity, as in a Node's capacity.
type ResourceList = BTreeMap<String, Quantity>;

/// Builds the node and runs it until `cancel` fires, then drains it and stops its Wasm
/// sandboxes.
pub async fn run(config: NodeConfig, cancel: CancellationToken) -> anyhow::Result<()> {
    // Building waits for the TLS bootstrap's certificate: a signal ends the wait.
    let node = tokio::select! {
        node = Node::build(config) => node?,
        () = cancel.cancelled() => return Ok(()),
    };
    node.run(cancel).await
}

/// A node built from its configuration: every part made, no task started.
pub struct Node {
    config: NodeConfig,
    /// Held while the node runs: one node per root directory.
    lock: std::fs::File,
    runtimes: Runtimes,
    managers: Managers,
    servers: Vec<Server>,
    sources: PodSources,
}

/// What the node knows of its machine.
struct MachineFacts {
    /// `None` when the machine could not be read.
    info: Option<MachineInfo>,
    /// Capacity and allocatable, when they could be computed.
    resources: Option<(ResourceList, ResourceList)>,
    /// `--node-ip`, else the default route's (`status.hostIP`, the Node's InternalIP).
    ips: Vec<IpAddr>,
}

/// The container runtimes and the router that picks one per pod.
struct Runtimes {
    wasm: WasmRuntime,
    router: RuntimeRouter,
}

/// Clients of the API server.
struct ApiClients {
    /// For requests, which have a deadline.
    client: kube::Client,
    /// For watches, which idle for minutes.
    watch: kube::Client,
    /// The certificate rotations to start with the cluster membership.
    certificates: crate::cluster::certificates::Rotations,
}

/// The parts that keep the node's pods, shared by its tasks.
struct Managers {
    container_manager: Option<Arc<crate::cm::ContainerManager>>,
    events: EventRecorder,
    /// The recorded events, for the writer that runs with a cluster.
    events_rx: Option<mpsc::Receiver<Record>>,
    plugins: Option<wasmlet_plugin_host::PluginHost>,
    statuses: StatusStore,
    probes: crate::prober::ProbeManager,
    /// UIDs of pods whose probe results changed.
    probe_rx: mpsc::UnboundedReceiver<String>,
    syncer: Arc<PodSyncer>,
    services: crate::cluster::ServiceCache,
    static_pods: crate::cluster::mirror::StaticPods,
    /// What admission checks pods against; `None` admits every pod.
    admission: Option<crate::admission::NodeInfo>,
    loop_health: LoopHealth,
    relist_health: RelistHealth,
    runtime_state: RuntimeState,
    /// The Summary's source, for the node API and the eviction manager.
    stats: Arc<crate::stats::StatsProvider>,
    /// The node's pressure conditions, for NodeStatus and admission.
    pressure: crate::eviction::Pressure,
    /// The eviction manager, to start, and where its evictions reach the sync loop.
    eviction: Option<crate::eviction::EvictionManager>,
    evictions_rx: Option<mpsc::Receiver<crate::eviction::Eviction>>,
    /// Image garbage collection, to start.
    image_gc: Arc<crate::images::ImageGc>,
    /// Graceful node shutdown, to start, and whether the node is shutting down.
    shutdown: Option<crate::shutdown::ShutdownManager>,
    shutdown_state: crate::shutdown::ShutdownState,
    /// The device manager (device plugins and Wasm device adapters).
    devices: crate::cm::devicemanager::DeviceManager,
    /// The topology manager, whose providers allocate at admission.
    topology: Arc<crate::cm::topologymanager::TopologyManager>,
    /// The CPU manager's static policy, if configured.
    cpus: Option<crate::cm::cpumanager::CpuManager>,
    /// The API client, for what the node writes besides its pods (CSINode).
    api_client: Option<kube::Client>,
    /// The registered CSI drivers.
    csi_drivers: crate::volumes::csi::Drivers,
    /// The pods' CSI volumes (the Node's `volumesInUse`).
    csi_volumes: Arc<crate::volumes::csi::CsiVolumes>,
}

/// An HTTP server, bound when the node runs.
struct Server {
    name: &'static str,
    addr: SocketAddr,
    router: axum::Router,
    /// What the log says once it is bound.
    serving: &'static str,
    /// Served over TLS with this configuration (the node API); plain HTTP without.
    tls: Option<Arc<crate::server::tls::ServerTls>>,
}

/// Where the node's pods come from, ready to start.
struct PodSources {
    /// The sources' names: housekeeping waits for a first snapshot of each.
    names: Vec<String>,
    tx: mpsc::Sender<SourceSnapshot>,
    rx: mpsc::Receiver<SourceSnapshot>,
    file: Option<(std::path::PathBuf, FileSource)>,
    http: Option<(String, HttpSource)>,
    cluster: Option<cluster::Membership>,
}

impl Node {
    /// Builds every part of the node, phase by phase; starts no task. Fails when the
    /// root directory is another node's, a runtime or the cgroups cannot be set up,
    /// or the kubeconfig cannot be read.
    pub async fn build(config: NodeConfig) -> anyhow::Result<Node> {
        let started = Instant::now();
        let lock = lock_root_dir(&config)?;
        let machine = machine_facts(&config);
        lower_oom_score();
        let container_manager = container_manager(&config, &machine)?;
        let runtimes = runtimes(&config).await?;
        let api = api_clients(&config).await?;
        let managers = managers(
            &config,
            &machine,
            &runtimes,
            api.as_ref(),
            container_manager,
        )
        .await?;
        let servers = servers(&config, &managers, &runtimes, api.as_ref(), started)?;
        let sources = pod_sources(&config, &machine, &runtimes, &managers, api, started).await;
        Ok(Node {
            config,
            lock,
            runtimes,
            managers,
            servers,
            sources,
        })
    }
}

/// The root directory and the pod logs directory, created, and the root's lock file,
/// held: one node per root directory, as two would adopt each other's sandboxes.
fn lock_root_dir(config: &NodeConfig) -> anyhow::Result<std::fs::File> {
    for dir in [&config.root_dir, &config.pod_logs_dir] {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let lock_path = config.root_dir.join("wasmlet.lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .with_context(|| format!("opening {}", lock_path.display()))?;
    // A node killed while it was starting a process leaves the lock with that child
    // for the moment between its fork and its exec (the descriptor closes on exec):
    // a node started again at once waits that moment out rather than refusing to run.
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        match lock.try_lock() {
            Ok(()) => return Ok(lock),
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(std::fs::TryLockError::WouldBlock) => anyhow::bail!(
                "another wasmlet is running with root directory {} (it has held {} for {LOCK_WAIT:?})",
                config.root_dir.display(),
                lock_path.display()
            ),
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("locking {}", lock_path.display()));
            }
        }
    }
}

/// How long a starting node waits for the root directory's lock.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The machine's facts: its hardware and OS, its capacity and allocatable resources
/// (after `kubeReserved`, `systemReserved` and `evictionHard`), and the node's IPs.
/// What cannot be read is a warning and left out.
fn machine_facts(config: &NodeConfig) -> MachineFacts {
    let mut info = None;
    let mut resources = None;
    match MachineInfo::read(&crate::machine::HostPaths::default()) {
        Ok(m) => {
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
                    resources = Some((capacity.to_list(), a.to_list()));
                }
                Err(e) => tracing::warn!("cannot compute allocatable resources: {e}"),
            }
            info = Some(m);
        }
        Err(e) => tracing::warn!("cannot read the machine's resources: {e}"),
    }
    let ips = match config.cluster.as_ref().map(|c| &c.node_ips) {
        Some(ips) if !ips.is_empty() => ips.clone(),
        _ => crate::cluster::registration::detect_node_ip(&config.node_name)
            .into_iter()
            .collect(),
    };
    MachineFacts {
        info,
        resources,
        ips,
    }
}

/// The kubelet's own `--oom-score-adj` (-999): the node is the last thing the OOM
/// killer should pick. Without CAP_SYS_RESOURCE the kernel refuses; that is fine.
fn lower_oom_score() {
    if std::fs::write("/proc/self/oom_score_adj", "-999").is_err() {
        tracing::debug!("cannot lower the node's oom_score_adj (no CAP_SYS_RESOURCE)");
    }
}

/// The container manager and the node's QoS cgroups, created, with `cgroupsPerQOS`;
/// `None` without it.
fn container_manager(
    config: &NodeConfig,
    machine: &MachineFacts,
) -> anyhow::Result<Option<Arc<crate::cm::ContainerManager>>> {
    if let Some(settings) = &config.cgroups
        && settings.driver == crate::cm::cgroup::Driver::Systemd
        && std::path::Path::new("/run/systemd/system").exists()
    {
        tracing::warn!(
            "cgroupDriver systemd: the node names its cgroups as systemd slices but writes them itself; systemd may reset their limits when it manages the slices (docs/decisions.md)"
        );
    }
    match (&config.cgroups, &machine.info) {
        (Some(settings), Some(m)) => {
            let cm =
                crate::cm::ContainerManager::new(cgroup_config(settings, m, &config.reservations))
                    .context("cgroups")?;
            cm.start()
                .with_context(|| format!("creating the node's cgroups under {}", settings.root))?;
            tracing::info!(root = %settings.root, driver = %settings.driver, "pod cgroups enforced");
            Ok(Some(Arc::new(cm)))
        }
        (Some(_), None) => {
            anyhow::bail!("cgroupsPerQOS needs the machine's resources, which could not be read")
        }
        (None, _) => Ok(None),
    }
}

/// The runtimes and the router between them: the Wasm runtime always, and the CRI
/// runtime when one is configured, which then takes the default handler and every
/// RuntimeClass handler other than wasmtime.
async fn runtimes(config: &NodeConfig) -> anyhow::Result<Runtimes> {
    // Each runtime is wrapped once, so the router's handlers share one instrumented
    // runtime per backend and every call through them is measured.
    let instrumented = |runtime: Arc<dyn Runtime>| -> Arc<dyn Runtime> {
        use crate::kuberuntime::instrumented::InstrumentedRuntime;
        Arc::new(InstrumentedRuntime::new(runtime, crate::metrics::global()))
    };
    let wasm = wasm_runtime(config).await?;
    let wasm_dyn = instrumented(Arc::new(wasm.clone()));
    let mut handlers = BTreeMap::from([(wasmlet_runtime_wasm::HANDLER.to_owned(), wasm_dyn)]);
    let mut default_handler = wasmlet_runtime_wasm::HANDLER.to_owned();
    if let Some(cri) = &config.cri {
        let cri_dyn = instrumented(cri_runtime(cri).await?);
        // The CRI runtime is told the handler per sandbox.
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
    Ok(Runtimes { wasm, router })
}

/// The Wasm runtime, with the drop directory's images imported and the sandboxes an
/// earlier run left running adopted.
async fn wasm_runtime(config: &NodeConfig) -> anyhow::Result<WasmRuntime> {
    let wasm = WasmRuntime::new(WasmRuntimeConfig {
        image_dir: config.image_store_dir(),
        compile_cache_dir: config.compile_cache_dir(),
        state_dir: config.wasm_state_dir(),
        sandbox: SandboxCommand {
            program: config.sandbox_program.clone(),
            args: config.sandbox_args.clone(),
            zygote: config.sandbox_zygote,
        },
        cgroup_mount_root: std::path::PathBuf::from(
            wasmlet_runtime_wasm::cgroup::DEFAULT_MOUNT_ROOT,
        ),
        registry: config.registry.clone(),
        network: Some(config.network.clone()),
    })
    .context("starting the Wasm runtime")?;
    import_drop_dir(wasm.images(), &config.image_drop_dir());
    // Sandboxes left running by an earlier run of the node (it crashed or was killed)
    // are adopted with their containers; the pod workers find them by their labels.
    let adopted = wasm.restore().await;
    if adopted > 0 {
        tracing::info!(sandboxes = adopted, "adopted running Wasm sandboxes");
    }
    Ok(wasm)
}

/// The CRI runtime at its endpoint. One that does not answer yet is an error in the
/// log, not the node's end: the node keeps running its Wasm pods, container pods wait.
async fn cri_runtime(cri: &crate::config::CriSettings) -> anyhow::Result<Arc<dyn Runtime>> {
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
        Err(e) => {
            tracing::error!(endpoint = %cri.runtime_endpoint, "CRI runtime not usable yet: {e}")
        }
    }
    Ok(Arc::new(runtime))
}

/// The API server's clients, when the node has a kubeconfig: after the TLS bootstrap
/// with `--bootstrap-kubeconfig` (which waits for the client certificate), and over
/// swappable slots with `rotateCertificates` (`cluster/certificates.rs`), whose
/// rotation then starts with the cluster membership.
async fn api_clients(config: &NodeConfig) -> anyhow::Result<Option<ApiClients>> {
    use crate::cluster::certificates;
    let Some(cluster) = &config.cluster else {
        return Ok(None);
    };
    let kubeconfig = &cluster.kubeconfig;
    let cert_dir = &config.node_api.tls.cert_dir;
    if let Some(bootstrap) = &cluster.certificates.bootstrap_kubeconfig {
        certificates::bootstrap_client(kubeconfig, bootstrap, cert_dir, &config.node_name)
            .await
            .context("TLS bootstrap")?;
    }
    let rotations = certificates::Rotations::default();
    if !cluster.certificates.rotate_certificates {
        return Ok(Some(ApiClients {
            client: crate::cluster::client_from_kubeconfig(
                kubeconfig,
                Some(crate::cluster::REQUEST_TIMEOUT),
            )
            .await?,
            watch: crate::cluster::client_from_kubeconfig(kubeconfig, None).await?,
            certificates: rotations,
        }));
    }
    let clients = certificates::NodeClients::new(kubeconfig, crate::cluster::REQUEST_TIMEOUT)
        .await
        .context("the API clients")?;
    rotations.push(certificates::client_rotation(
        &clients,
        kubeconfig,
        cert_dir,
        &config.node_name,
    ));
    Ok(Some(ApiClients {
        client: clients.requests.client(),
        watch: clients.watches.client(),
        certificates: rotations,
    }))
}

/// The managers: the event recorder (writing to the API in a cluster), the plugins,
/// the status store, the prober, the pod syncer over them, admission's view of the
/// node and the health the servers report.
async fn managers(
    config: &NodeConfig,
    machine: &MachineFacts,
    runtimes: &Runtimes,
    api: Option<&ApiClients>,
    container_manager: Option<Arc<crate::cm::ContainerManager>>,
) -> anyhow::Result<Managers> {
    let (events, events_rx) = if config.cluster.is_some() {
        let (r, rx) = EventRecorder::channel();
        (r, Some(rx))
    } else {
        (EventRecorder::default(), None)
    };
    let plugins = plugin_host::load_plugins(config, runtimes.wasm.images(), &events).await;
    let statuses = StatusStore::default();
    let (probe_tx, probe_rx) = mpsc::unbounded_channel();
    let probes = crate::prober::ProbeManager::new(
        statuses.clone(),
        Some(runtimes.router.clone()),
        Arc::new(match &plugins {
            Some(host) => crate::prober::RealRunner::with_plugins(host.clone()),
            None => crate::prober::RealRunner::default(),
        }),
        events.clone(),
        probe_tx,
    );
    let services = crate::cluster::ServiceCache::default();
    let (devices, cpus, topology) = device_managers(config, &events)?;
    let mut syncer = pod_syncer(config, machine, &runtimes.router, &events, &probes)
        .with_devices(devices.clone());
    if let Some(cpus) = &cpus {
        syncer = syncer.with_cpus(cpus.clone());
    }
    if let Some(api) = api {
        syncer = syncer.with_objects(Arc::new(crate::cluster::ApiObjects {
            client: api.client.clone(),
            services: services.clone(),
        }));
    }
    if let Some(cm) = &container_manager {
        syncer = syncer.with_cgroups(cm.clone());
    }
    let csi_drivers = crate::volumes::csi::Drivers::default();
    let csi_volumes = Arc::new(
        crate::volumes::csi::CsiVolumes::new(
            csi_drivers.clone(),
            config.root_dir.clone(),
            config.node_name.clone(),
            config.csi_timeout,
        )
        .with_stats_period(config.volume_stats_agg_period),
    );
    syncer = syncer.with_csi(csi_volumes.clone());
    let stats = Arc::new(
        node_api::stats_provider(config, container_manager.as_deref())
            .with_csi(csi_volumes.clone()),
    );
    let pressure = crate::eviction::Pressure::default();
    let (evictions, evictions_rx) = mpsc::channel(4);
    let image_gc = Arc::new(crate::images::ImageGc::new(
        config.image_gc.clone(),
        runtimes.router.clone(),
    ));
    let shutdown_state = crate::shutdown::ShutdownState::default();
    let shutdown = crate::shutdown::ShutdownManager {
        config: config.shutdown.clone(),
        state: shutdown_state.clone(),
        statuses: statuses.clone(),
        kills: evictions.clone(),
        events: events.clone(),
        node_name: config.node_name.clone(),
        root_dir: config.root_dir.clone(),
    };
    let eviction = crate::eviction::EvictionManager {
        config: config.eviction.clone(),
        stats: stats.clone(),
        statuses: statuses.clone(),
        router: runtimes.router.clone(),
        allocatable_memory: allocatable_memory(config, machine),
        pressure: pressure.clone(),
        evictions,
        memory_cgroups: memory_cgroups(container_manager.as_deref()),
        memory_cgroups_v2: container_manager
            .as_deref()
            .is_some_and(|cm| cm.cgroups().version() == crate::cm::cgroup::Version::V2),
        image_gc: Some(image_gc.clone()),
        container_gc: config.container_gc,
        root_dir: config.root_dir.clone(),
        plugin: plugins
            .clone()
            .zip(crate::plugins::eviction_plugin(&config.plugins)),
        events: events.clone(),
        node_name: config.node_name.clone(),
    };
    Ok(Managers {
        container_manager,
        events,
        events_rx,
        plugins,
        statuses,
        probes,
        probe_rx,
        syncer: Arc::new(syncer),
        services,
        static_pods: crate::cluster::mirror::StaticPods::default(),
        admission: admission_node(config, machine),
        loop_health: LoopHealth::default(),
        relist_health: RelistHealth::default(),
        runtime_state: RuntimeState::new(&runtimes.router),
        stats,
        pressure,
        eviction: Some(eviction),
        evictions_rx: Some(evictions_rx),
        image_gc,
        shutdown: Some(shutdown),
        shutdown_state,
        devices,
        topology,
        cpus,
        api_client: api.map(|a| a.client.clone()),
        csi_drivers,
        csi_volumes,
    })
}

/// The device manager over `<root-dir>/device-plugins`, the CPU manager (static
/// policy only) and the topology manager with both as hint providers, on the
/// machine's topology as sysfs tells it. A topology manager the machine cannot have
/// (more NUMA nodes than allowed) is reported and replaced by policy `none`, so that
/// the node still runs; a CPU manager whose checkpoint is not usable is an error, as
/// with the kubelet.
fn device_managers(
    config: &NodeConfig,
    events: &EventRecorder,
) -> anyhow::Result<(
    crate::cm::devicemanager::DeviceManager,
    Option<crate::cm::cpumanager::CpuManager>,
    Arc<crate::cm::topologymanager::TopologyManager>,
)> {
    use crate::cm::cputopology::CpuTopology;
    use crate::cm::topologymanager::{NumaInfo, TopologyManager};
    let settings = &config.devices;
    let machine = match CpuTopology::read(&settings.sysfs_root) {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!(sysfs = %settings.sysfs_root.display(), "reading the machine's topology, taking one NUMA node: {e}");
            None
        }
    };
    let numa = match &machine {
        Some(t) => NumaInfo {
            nodes: t.numa_nodes(),
            distances: t.distances.clone(),
        },
        None => NumaInfo::new(vec![0]),
    };
    let dir = config.root_dir.join("device-plugins");
    let devices = crate::cm::devicemanager::DeviceManager::new(
        &dir,
        numa.nodes.clone(),
        tokio_util::sync::CancellationToken::new(),
    )
    .map_err(|e| anyhow::anyhow!("the device manager's directory {}: {e}", dir.display()))?
    .with_events(events.clone(), config.node_name.clone());
    let cpus = if settings.cpu_manager_static {
        let topology = machine.clone().ok_or_else(|| {
            anyhow::anyhow!(
                "the CPU manager's static policy needs the machine's CPU topology from {}",
                settings.sysfs_root.display()
            )
        })?;
        let reserved = match &settings.reserved_system_cpus {
            Some(set) => set.clone(),
            None => reserved_cpus(config, &topology),
        };
        let m =
            crate::cm::cpumanager::CpuManager::new(&config.root_dir, topology, reserved.clone())
                .map_err(|e| anyhow::anyhow!("CPU manager: {e}"))?;
        tracing::info!(reserved = %reserved, shared = %m.state().default, "CPU manager: static policy");
        Some(m)
    } else {
        None
    };
    let mut topology = match TopologyManager::new(settings.topology.clone(), numa.clone()) {
        Ok(t) => t,
        Err(e) => {
            tracing::error!("topology manager: {e}; running with policy none");
            TopologyManager::new(Default::default(), numa).expect("policy none fits any machine")
        }
    };
    tracing::info!(policy = settings.topology.policy.name(), scope = ?settings.topology.scope, "topology manager");
    if let Some(cpus) = &cpus {
        topology.add_provider(Arc::new(cpus.clone()));
    }
    topology.add_provider(Arc::new(devices.clone()));
    Ok((devices, cpus, Arc::new(topology)))
}

/// The CPUs the static policy keeps for the system without `reservedSystemCPUs`:
/// `kubeReserved` + `systemReserved` cpu rounded up to whole CPUs, the lowest ones,
/// whole cores first (the kubelet's `takeByTopology` on an idle machine).
fn reserved_cpus(
    config: &NodeConfig,
    topology: &crate::cm::cputopology::CpuTopology,
) -> crate::cm::cpuset::CpuSet {
    let millis: f64 = [
        &config.reservations.kube_reserved,
        &config.reservations.system_reserved,
    ]
    .into_iter()
    .filter_map(|m| m.get("cpu"))
    .filter_map(|q| crate::quantity::parse(q).ok())
    .sum();
    let n = millis.ceil() as usize;
    let mut cpus: Vec<(u32, u32)> = topology
        .cpus
        .iter()
        .map(|(cpu, i)| (i.core, *cpu))
        .collect();
    cpus.sort();
    cpus.into_iter().take(n).map(|(_, cpu)| cpu).collect()
}

/// Node allocatable memory as the eviction manager reads `allocatableMemory.available`
/// against it: the capacity less `kubeReserved` and `systemReserved` (not the hard
/// eviction threshold, which the signal's own threshold is).
fn allocatable_memory(config: &NodeConfig, machine: &MachineFacts) -> Option<u64> {
    let m = machine.info.as_ref()?;
    let capacity = crate::allocatable::Resources::capacity(m, None, config.max_pods);
    let reservations = crate::allocatable::Reservations {
        eviction_hard: Default::default(),
        ..config.reservations.clone()
    };
    capacity.allocatable(&reservations).ok().map(|a| a.memory)
}

/// The memory cgroups the eviction manager watches: the root for `memory.available`,
/// the node allocatable cgroup for `allocatableMemory.available` (on v1 their
/// directories in the memory hierarchy, on v2 in the unified one).
fn memory_cgroups(
    cm: Option<&crate::cm::ContainerManager>,
) -> Vec<(&'static str, std::path::PathBuf)> {
    let Some(cm) = cm else {
        return vec![(
            "memory.available",
            std::path::PathBuf::from("/sys/fs/cgroup/memory"),
        )];
    };
    let root = match cm.cgroups().version() {
        crate::cm::cgroup::Version::V1 => cm.cgroups().mount_root().join("memory"),
        crate::cm::cgroup::Version::V2 => cm.cgroups().mount_root().to_owned(),
    };
    let kubepods = cm.cgroups().path(cm.kubepods());
    vec![
        ("memory.available", root.clone()),
        (
            "allocatableMemory.available",
            root.join(kubepods.trim_start_matches('/')),
        ),
    ]
}

/// The pod syncer: back-off, DNS, events, pod directories, probes, the node's IPs and
/// allocatable for the downward API, and the kubelet's oom_score_adj when the machine's
/// memory is known.
fn pod_syncer(
    config: &NodeConfig,
    machine: &MachineFacts,
    router: &RuntimeRouter,
    events: &EventRecorder,
    probes: &crate::prober::ProbeManager,
) -> PodSyncer {
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
    .with_pulls(
        crate::images::puller::PullLimits::new(config.pulls),
        Arc::new(crate::images::providers::NodeKeyring::new(
            config.root_dir.clone(),
            (!config.credential_providers.is_empty()).then(|| {
                crate::images::providers::CredentialProviders::new(
                    config.credential_providers.clone(),
                )
            }),
        )),
    )
    .with_node(
        machine.ips.iter().map(|ip| ip.to_string()).collect(),
        machine
            .resources
            .clone()
            .map(|(_, a)| a)
            .unwrap_or_default(),
    );
    if let Some(m) = &machine.info {
        match crate::cm::OomScores::new(m.memory_bytes) {
            Ok(scores) => syncer = syncer.with_oom_scores(scores),
            Err(e) => {
                tracing::warn!("containers get no oom_score_adj: reading this process's own: {e}")
            }
        }
    }
    syncer
}

/// What admission checks pods against: the labels the node registers with, its
/// allocatable resources and its taints. Without known resources, nothing is checked
/// (rather than every pod refused).
fn admission_node(
    config: &NodeConfig,
    machine: &MachineFacts,
) -> Option<crate::admission::NodeInfo> {
    let (_, allocatable) = machine.resources.as_ref()?;
    let arch = machine
        .info
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
    Some(crate::admission::NodeInfo {
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
    })
}

/// The servers the configuration enables: the read-only port (`/pods`, metrics,
/// health), the healthz port, and the node API (`node/node_api.rs`). The first two
/// answer liveness (the sync loop turns, the PLEG relists) and readiness (the
/// runtimes answer).
fn servers(
    config: &NodeConfig,
    managers: &Managers,
    runtimes: &Runtimes,
    api: Option<&ApiClients>,
    started: Instant,
) -> anyhow::Result<Vec<Server>> {
    let client = api.map(|a| &a.client);
    let certificates = api.map(|a| (&a.certificates, &a.watch));
    let loop_threshold = (config.sync_frequency * 2).max(Duration::from_secs(300));
    let pleg_threshold = config.pleg_unhealthy_after;
    let checks: Vec<(&'static str, Check)> = vec![
        ("syncloop", {
            let h = managers.loop_health.clone();
            Arc::new(move || h.check(loop_threshold))
        }),
        ("pleg", {
            let h = managers.relist_health.clone();
            Arc::new(move || h.check(started, pleg_threshold))
        }),
    ];
    let ready_checks: Vec<(&'static str, Check)> = vec![("runtime", {
        let s = managers.runtime_state.clone();
        Arc::new(move || s.check())
    })];
    let state = ServerState {
        statuses: managers.statuses.clone(),
        probes: Some(managers.probes.clone()),
        plugins: managers.plugins.clone(),
        checks,
        ready_checks,
    };
    let mut servers = Vec::new();
    if config.read_only_port != 0 {
        servers.push(Server {
            name: "read-only server",
            addr: SocketAddr::new(config.address, config.read_only_port),
            router: server::read_only_router(state.clone()),
            serving: "serving the read-only API (/pods, /healthz, /readyz)",
            tls: None,
        });
    }
    if config.healthz_port != 0 {
        servers.push(Server {
            name: "healthz server",
            addr: SocketAddr::new(config.healthz_bind_address, config.healthz_port),
            router: server::healthz_router(state.clone()),
            serving: "serving /healthz and /readyz",
            tls: None,
        });
    }
    if let Some(api) = node_api::server(
        config,
        &runtimes.router,
        client,
        certificates,
        managers.stats.clone(),
        state,
    )? {
        servers.push(api);
    }
    Ok(servers)
}

/// The pod sources the configuration names: the static pod directory, the manifest
/// URL and, with a kubeconfig, the API server (with the node's membership of the
/// cluster), and the channel they all send to.
async fn pod_sources(
    config: &NodeConfig,
    machine: &MachineFacts,
    runtimes: &Runtimes,
    managers: &Managers,
    api: Option<ApiClients>,
    started: Instant,
) -> PodSources {
    let (tx, rx) = mpsc::channel(16);
    let mut names = Vec::new();
    let file = config.static_pod_path.as_ref().map(|dir| {
        names.push(crate::podconfig::file::SOURCE.to_owned());
        (dir.clone(), FileSource::new(dir, &config.node_name))
    });
    let http = config.manifest_url.as_ref().map(|m| {
        names.push(crate::podconfig::http::SOURCE.to_owned());
        (m.url.clone(), HttpSource::new(m.clone(), &config.node_name))
    });
    let cluster = match (&config.cluster, api) {
        (Some(settings), Some(api)) => {
            names.push(crate::cluster::pod_source::SOURCE.to_owned());
            let health = cluster::Health {
                runtime_state: managers.runtime_state.clone(),
                relist_health: managers.relist_health.clone(),
                started,
                pleg_threshold: config.pleg_unhealthy_after,
                pressure: managers.pressure.clone(),
                shutdown: managers.shutdown_state.clone(),
                devices: managers.devices.clone(),
                csi: managers.csi_volumes.clone(),
            };
            Some(
                cluster::Membership::build(
                    config,
                    settings,
                    api,
                    machine,
                    &runtimes.router,
                    health,
                )
                .await,
            )
        }
        _ => None,
    };
    PodSources {
        names,
        tx,
        rx,
        file,
        http,
        cluster,
    }
}

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

/// The container manager's settings from the node's configuration and machine.
fn cgroup_config(
    settings: &crate::config::CgroupSettings,
    machine: &MachineInfo,
    reservations: &crate::allocatable::Reservations,
) -> crate::cm::Config {
    use crate::cm::formulas::NodeResources;
    let resources = |map: &ResourceList| NodeResources {
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
