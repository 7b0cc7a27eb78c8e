//! What a pod worker keeps about its pod between syncs ([`PodState`]), and the
//! labels the kubelet puts on sandboxes and containers so the node finds its own.
//!
//! Written by the pod sync, read by the status computation, the PLEG and the sync
//! loop: a module of its own below all of them.

use std::collections::BTreeMap;
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ResourceRequirements;
use wasmlet_runtime::{ContainerResources, ContainerStatus, PodSandboxConfig, Runtime};

use crate::probe_results::{ProbeKind, ProbeResult};

/// Labels the kubelet puts on sandboxes and containers; the node finds its own by them.
pub mod labels {
    pub const POD_NAME: &str = "io.kubernetes.pod.name";
    pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
    pub const POD_UID: &str = "io.kubernetes.pod.uid";
    pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
    pub const CONTAINER_HASH: &str = "io.kubernetes.container.hash";
    pub const CONTAINER_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
    pub const CONTAINER_TERMINATION_MESSAGE_PATH: &str =
        "io.kubernetes.container.terminationMessagePath";
    pub const CONTAINER_TERMINATION_MESSAGE_POLICY: &str =
        "io.kubernetes.container.terminationMessagePolicy";
    pub const POD_TERMINATION_GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";
}

/// Why a container is not running, as shown in `state.waiting`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    pub reason: String,
    pub message: String,
}

impl Waiting {
    pub(crate) fn new(reason: &str, message: impl Into<String>) -> Self {
        Waiting {
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// What the node knows of one container of the pod.
#[derive(Clone, Debug, Default)]
pub struct ContainerRecord {
    /// The latest instance.
    pub current: Option<ContainerStatus>,
    /// The instance before it, once it has been replaced.
    pub last_terminated: Option<ContainerStatus>,
    pub restart_count: u32,
    pub waiting: Option<Waiting>,
    /// The current instance was killed for a failed liveness or startup probe: it is
    /// restarted unless the policy is Never, whatever its exit code.
    pub probe_killed: bool,
    /// The resources the current instance runs with, as the runtime was given them
    /// and as the spec said them (`status.containerStatuses[].resources`); `None` for
    /// an adopted instance until the node has set them once.
    pub applied: Option<(ContainerResources, Option<ResourceRequirements>)>,
    /// Why changing the running instance's resources in place failed.
    pub resize_error: Option<String>,
}

/// The pod's sandbox as last seen.
#[derive(Clone, Debug)]
pub struct SandboxRecord {
    pub id: String,
    pub ready: bool,
    /// The pod's IP, when the runtime gave it a network of its own.
    pub ip: Option<String>,
    /// Its other IPs (another family), from the same network.
    pub additional_ips: Vec<String>,
    pub config: PodSandboxConfig,
}

/// Everything a pod worker keeps about its pod between syncs.
#[derive(Clone, Default)]
pub struct PodState {
    pub runtime: Option<Arc<dyn Runtime>>,
    pub runtime_name: String,
    pub handler: String,
    pub sandbox: Option<SandboxRecord>,
    pub sandbox_attempts: u32,
    pub start_time: Option<Timestamp>,
    pub containers: BTreeMap<String, ContainerRecord>,
    /// Why the pod has no sandbox, if creating one failed.
    pub sandbox_error: Option<String>,
    /// Whether the runtime has been searched for what an earlier run of the node
    /// left of this pod.
    pub adopted: bool,
    /// Why the whole pod failed (`status.reason`, `status.message`): it ran past
    /// `activeDeadlineSeconds`. Nothing runs again.
    pub failure: Option<(String, String)>,
    /// Whether every init container succeeded (and every sidecar started) in the
    /// current sandbox; the regular containers start only then.
    pub initialized: bool,
    /// The sandbox the pod was initialized in.
    pub initialized_in: Option<String>,
    /// The pod's volumes on the host, by name, once set up.
    pub volumes: Vec<(String, crate::volumes::HostVolume)>,
    /// When the content volumes were last written.
    pub volumes_refreshed: Option<tokio::time::Instant>,
    /// The probe results of the running instances, by container name and type.
    pub probe_results: BTreeMap<(String, ProbeKind), ProbeResult>,
}

/// Why the node itself stops a pod and fails it (the kubelet's `killPodFunc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KillCause {
    /// The eviction manager's: reason `Evicted`, with an `Evicted` event.
    Evicted,
    /// The node is shutting down: reason `Terminated` (the kubelet's shutdown manager's).
    NodeShutdown,
}

impl KillCause {
    /// The reason the failed pod's status carries.
    pub const fn reason(self) -> &'static str {
        match self {
            KillCause::Evicted => crate::thresholds::EVICTED,
            KillCause::NodeShutdown => "Terminated",
        }
    }

    /// Whether a pod failed with `reason` was stopped by the node: it carries a
    /// `DisruptionTarget` condition (reason `TerminationByKubelet`).
    pub fn is_disruption(reason: &str) -> bool {
        [KillCause::Evicted, KillCause::NodeShutdown]
            .iter()
            .any(|c| c.reason() == reason)
    }
}
