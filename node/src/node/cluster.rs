//! The node's membership of its cluster: what it registers, and the tasks that start
//! with it (the API pod source, the Service and RuntimeClass watches, the event,
//! status and mirror pod writers, registration with the status loop, the lease).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::tasks::Tasks;
use super::{ApiClients, MachineFacts};
use crate::cluster::events::{EventRecorder, Record};
use crate::cluster::node_status::StatusInputs;
use crate::cluster::registration::NodeFacts;
use crate::config::{ClusterSettings, NodeConfig};
use crate::pleg::RelistHealth;
use crate::podconfig::SourceSnapshot;
use crate::router::RuntimeRouter;
use crate::runtime_state::RuntimeState;
use crate::status::StatusStore;

/// What the Node's Ready condition is computed from.
pub(super) struct Health {
    pub runtime_state: RuntimeState,
    pub relist_health: RelistHealth,
    /// When the node started: the PLEG's grace for its first relist counts from here.
    pub started: Instant,
    pub pleg_threshold: Duration,
    /// The eviction manager's pressure conditions.
    pub pressure: crate::eviction::Pressure,
    /// Whether the node is shutting down (not ready then).
    pub shutdown: crate::shutdown::ShutdownState,
    /// The device plugins' resources.
    pub devices: crate::cm::devicemanager::DeviceManager,
    /// The CSI volumes staged on the node.
    pub csi: Arc<crate::volumes::csi::CsiVolumes>,
}

/// The node's parts the cluster's tasks share.
pub(super) struct Shared {
    pub node_name: String,
    pub router: RuntimeRouter,
    pub services: crate::cluster::ServiceCache,
    pub statuses: StatusStore,
    pub static_pods: crate::cluster::mirror::StaticPods,
    pub events: EventRecorder,
    pub events_rx: Option<mpsc::Receiver<Record>>,
    pub sources_tx: mpsc::Sender<SourceSnapshot>,
}

/// Membership of the cluster, built, not started.
pub(super) struct Membership {
    settings: ClusterSettings,
    api: ApiClients,
    facts: NodeFacts,
    inputs: StatusInputs,
}

impl Membership {
    /// What the node registers and reports, from its machine and runtimes.
    pub(super) async fn build(
        config: &NodeConfig,
        settings: &ClusterSettings,
        api: ApiClients,
        machine: &MachineFacts,
        router: &RuntimeRouter,
        health: Health,
    ) -> Self {
        Membership {
            settings: settings.clone(),
            api,
            facts: node_facts(config, settings, machine, router).await,
            inputs: status_inputs(health, router.clone()),
        }
    }

    /// The kubeconfig the node joins with.
    pub(super) fn kubeconfig(&self) -> &Path {
        &self.settings.kubeconfig
    }

    /// Starts the cluster's tasks on `tasks`.
    pub(super) fn start(self, shared: Shared, tasks: &Tasks, cancel: &CancellationToken) {
        let Membership {
            settings,
            api:
                ApiClients {
                    client,
                    watch,
                    certificates,
                },
            facts,
            inputs,
        } = self;
        for rotation in certificates.take() {
            tasks.spawn(rotation.name(), rotation.run(cancel.clone()));
        }
        let api_pods = crate::cluster::ApiPods::default();
        let node_handle = crate::cluster::NodeHandle::default();
        tasks.spawn(
            "API pod source",
            crate::cluster::pod_source::run(
                watch.clone(),
                shared.node_name.clone(),
                api_pods.clone(),
                shared.sources_tx,
                cancel.clone(),
            ),
        );
        tasks.spawn(
            "Service watch",
            crate::cluster::watch_services(watch.clone(), shared.services, cancel.clone()),
        );
        tasks.spawn(
            "RuntimeClass watch",
            crate::cluster::runtime_classes::run(watch, shared.router, cancel.clone()),
        );
        if let Some(rx) = shared.events_rx {
            tasks.spawn(
                "event writer",
                crate::cluster::events::run(
                    client.clone(),
                    shared.node_name.clone(),
                    rx,
                    cancel.clone(),
                ),
            );
        }
        tasks.spawn(
            "status manager",
            crate::cluster::status_manager::StatusManager::new(
                client.clone(),
                shared.statuses,
                api_pods.clone(),
                node_handle.clone(),
            )
            .run(cancel.clone()),
        );
        tasks.spawn(
            "mirror pod manager",
            crate::cluster::mirror::MirrorManager {
                client: client.clone(),
                static_pods: shared.static_pods,
                api_pods,
                node: node_handle.clone(),
            }
            .run(cancel.clone()),
        );
        let status = crate::cluster::node_status::NodeStatusLoop {
            client,
            facts,
            inputs,
            node: node_handle,
            update_frequency: settings.status_update_frequency,
            report_frequency: settings.status_report_frequency,
        };
        tasks.spawn(
            "node registration and status",
            register_and_report(
                settings,
                status,
                shared.events,
                tasks.clone(),
                cancel.clone(),
            ),
        );
    }
}

/// Registers the Node (with `registerNode`), then starts its lease and keeps its
/// status until cancelled.
async fn register_and_report(
    settings: ClusterSettings,
    status: crate::cluster::node_status::NodeStatusLoop,
    events: EventRecorder,
    tasks: Tasks,
    cancel: CancellationToken,
) {
    if settings.register_node {
        match crate::cluster::registration::register(&status.client, &status.facts, &cancel).await {
            Some(node) => {
                status.node.set(node);
                events.node(
                    &status.facts.name,
                    crate::cluster::events::NORMAL,
                    "Starting",
                    "Starting kubelet.",
                );
            }
            None => return,
        }
    }
    let lease = crate::cluster::lease::LeaseController::new(
        status.client.clone(),
        &status.facts.name,
        settings.lease_duration_seconds,
        status.node.clone(),
    );
    tasks.spawn("node lease", lease.run(cancel.clone()));
    status.run(cancel).await;
}

/// What the status loop asks the rest of the node: whether it is ready (the runtimes
/// answer, the PLEG relists) and which images it has.
fn status_inputs(health: Health, router: RuntimeRouter) -> StatusInputs {
    let Health {
        runtime_state,
        relist_health,
        started,
        pleg_threshold,
        pressure,
        shutdown,
        devices,
        csi,
    } = health;
    StatusInputs {
        volumes_in_use: Some(Arc::new(move || csi.volumes_in_use())),
        devices: Some(crate::cluster::node_status::DeviceResources {
            changes: devices.subscribe(),
            amounts: Arc::new(move || devices.capacity().per_resource()),
        }),
        pressure: Arc::new(move || pressure.conditions()),
        nudge: Some(shutdown.subscribe()),
        readiness: Arc::new(move || {
            let mut problems = Vec::new();
            if let Err(e) = shutdown.status() {
                problems.push(e);
            }
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
}

/// What the node registers: the machine, its resources, its runtimes.
async fn node_facts(
    config: &NodeConfig,
    cluster: &ClusterSettings,
    machine: &MachineFacts,
    router: &RuntimeRouter,
) -> NodeFacts {
    // The default runtime's version: the CRI runtime's when there is one.
    let mut runtime_version = String::new();
    if let Some(r) = router.default_runtime() {
        match r.version().await {
            Ok(v) => runtime_version = format!("{}://{}", v.runtime_name, v.runtime_version),
            Err(e) => tracing::warn!("cannot read the runtime's version for the Node: {e}"),
        }
    }
    let (capacity, allocatable) = machine.resources.clone().unwrap_or_default();
    NodeFacts {
        name: config.node_name.clone(),
        hostname: config.node_name.clone(),
        extra_labels: cluster.node_labels.clone(),
        taints: cluster.taints.clone(),
        addresses: machine.ips.clone(),
        machine: machine.info.clone().unwrap_or_default(),
        capacity,
        allocatable,
        runtime_version,
        runtime_handlers: router.handler_names(),
        kubelet_port: config.port,
    }
}
