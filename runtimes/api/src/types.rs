//! The data the node and runtimes exchange.
//!
//! Names follow the kubelet's vocabulary. Times are [`jiff::Timestamp`]s; labels and
//! annotations are sorted maps so that hashes and comparisons are stable.

use std::collections::BTreeMap;
use std::path::PathBuf;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// Labels or annotations.
pub type Labels = BTreeMap<String, String>;

/// The runtime's identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeVersion {
    /// e.g. `wasmtime` or `containerd`.
    pub runtime_name: String,
    /// e.g. `48.0.8`.
    pub runtime_version: String,
    /// The API version spoken, e.g. `v1` for CRI.
    pub runtime_api_version: String,
}

/// Readiness of a runtime, as in CRI's `RuntimeReady` / `NetworkReady` conditions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeStatus {
    pub runtime_ready: bool,
    pub network_ready: bool,
    /// Why a condition is false, empty when both are true.
    pub message: String,
}

/// Who a sandbox or container belongs to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PodMetadata {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    /// How many sandboxes were created for this pod before this one.
    pub attempt: u32,
}

/// Everything a runtime needs to create a pod sandbox.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PodSandboxConfig {
    pub metadata: PodMetadata,
    pub hostname: String,
    /// The pod's log directory, `<logs-root>/<ns>_<name>_<uid>`.
    pub log_directory: PathBuf,
    pub labels: Labels,
    pub annotations: Labels,
    /// The RuntimeClass handler; empty for the runtime's default.
    pub runtime_handler: String,
    /// The pod's cgroup, if the node manages cgroups.
    pub cgroup_parent: Option<String>,
    /// The `oom_score_adj` of the pod's processes, for runtimes whose sandbox process
    /// runs the containers itself, like the Wasm runtime. CRI ignores it: a CRI
    /// runtime sets each container's own score from the container's config.
    pub oom_score_adj: Option<i64>,
    /// `hostNetwork`: the node's network namespace.
    pub host_network: bool,
    /// `hostPID`: the node's PID namespace.
    pub host_pid: bool,
    /// `hostIPC`: the node's IPC namespace.
    pub host_ipc: bool,
    /// `shareProcessNamespace`: one PID namespace for the pod's containers.
    pub share_process_namespace: bool,
    /// The pod's resolv.conf as the node resolved its DNS policy; `None` lets the
    /// runtime copy the host's.
    pub dns: Option<DnsConfig>,
    /// Container ports with a `hostPort`.
    pub port_mappings: Vec<PortMapping>,
    /// Namespaced sysctls from `securityContext.sysctls`.
    pub sysctls: Labels,
    pub security: SandboxSecurity,
}

/// A pod's resolv.conf.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DnsConfig {
    pub servers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

/// A container port published on the node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortMapping {
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    pub container_port: i32,
    pub host_port: i32,
    /// Empty for every address.
    pub host_ip: String,
}

/// The pod-level security settings a sandbox needs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SandboxSecurity {
    pub run_as_user: Option<i64>,
    pub run_as_group: Option<i64>,
    pub supplemental_groups: Vec<i64>,
    /// Some container of the pod is privileged.
    pub privileged: bool,
    /// The `runAsUser` every container of the pod (init containers included) runs as,
    /// its own or the pod's, when they all name the same one. A runtime that runs all
    /// of a pod's containers in one process (the Wasm sandbox) runs that process as
    /// this user; a container runtime has no use for it.
    pub containers_run_as_user: Option<i64>,
    /// Likewise the `runAsGroup` they all name.
    pub containers_run_as_group: Option<i64>,
}

/// A container's security settings, pod defaults already applied.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerSecurity {
    pub privileged: bool,
    pub run_as_user: Option<i64>,
    pub run_as_group: Option<i64>,
    pub supplemental_groups: Vec<i64>,
    pub readonly_rootfs: bool,
    /// `allowPrivilegeEscalation: false`.
    pub no_new_privs: bool,
    pub capabilities_add: Vec<String>,
    pub capabilities_drop: Vec<String>,
    /// Paths hidden in the container (`/proc/kcore`, …), per `procMount`.
    pub masked_paths: Vec<String>,
    /// Paths mounted read-only in the container (`/proc/sys`, …), per `procMount`.
    pub readonly_paths: Vec<String>,
}

/// A host device made available in a container.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    pub container_path: String,
    pub host_path: PathBuf,
    /// cgroup permissions: some of `r`, `w`, `m`.
    pub permissions: String,
}

/// Lifecycle state of a sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SandboxState {
    Ready,
    NotReady,
}

/// A sandbox as listed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PodSandbox {
    pub id: String,
    pub metadata: PodMetadata,
    pub state: SandboxState,
    pub created_at: Timestamp,
    pub labels: Labels,
    pub annotations: Labels,
    pub runtime_handler: String,
}

/// The detailed status of a sandbox.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PodSandboxStatus {
    pub id: String,
    pub metadata: PodMetadata,
    pub state: SandboxState,
    pub created_at: Timestamp,
    /// The pod's primary IP, if it has a network of its own.
    pub ip: Option<String>,
    pub additional_ips: Vec<String>,
    /// The network namespace the runtime made for the pod, for a runtime whose pods
    /// the node reaches inside it (the Wasm runtime's port-forward); CRI gives none.
    pub network_namespace: Option<std::path::PathBuf>,
    pub labels: Labels,
    pub annotations: Labels,
    pub runtime_handler: String,
}

/// A volume or file bind-mounted (or, for Wasm, preopened) into a container.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    pub container_path: String,
    pub host_path: PathBuf,
    pub readonly: bool,
}

/// Resource settings for one container, already computed by the node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerResources {
    pub cpu_shares: Option<u64>,
    pub cpu_quota: Option<i64>,
    pub cpu_period: Option<u64>,
    pub memory_limit_bytes: Option<u64>,
    pub oom_score_adj: Option<i64>,
    /// The CPUs the container may run on (`0-1,3`), from the CPU manager's static
    /// policy; `None` leaves it to the runtime.
    #[serde(default)]
    pub cpuset_cpus: Option<String>,
}

/// Who a container is: its name in the pod and its attempt (restart count).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ContainerMetadata {
    pub name: String,
    pub attempt: u32,
}

/// Everything a runtime needs to create a container.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ContainerConfig {
    pub metadata: ContainerMetadata,
    /// The image reference as written in the pod, or the image id.
    pub image: String,
    /// Replaces the image's entrypoint when non-empty (`command` in the PodSpec).
    pub command: Vec<String>,
    /// Replaces the image's arguments when non-empty (`args` in the PodSpec).
    pub args: Vec<String>,
    pub working_dir: Option<String>,
    /// Environment in order; later duplicates win.
    pub env: Vec<(String, String)>,
    pub mounts: Vec<Mount>,
    /// Relative to the sandbox's log directory: `<container>/<attempt>.log`.
    pub log_path: PathBuf,
    pub labels: Labels,
    pub annotations: Labels,
    pub resources: ContainerResources,
    pub devices: Vec<Device>,
    /// CDI devices by fully qualified name (`vendor.com/class=name`), from device
    /// plugins; the runtime resolves them.
    pub cdi_devices: Vec<String>,
    pub security: ContainerSecurity,
    /// The container's stdin stays open for attach (`stdin` in the PodSpec).
    pub stdin: bool,
    /// Its stdin closes when the first attached client closes its own (`stdinOnce`).
    #[serde(default)]
    pub stdin_once: bool,
    pub tty: bool,
    /// The container's declared TCP ports (`ports[].containerPort`), in order: where the
    /// Wasm runtime serves a `wasi:http/proxy` component. CRI has no use for them.
    #[serde(default)]
    pub ports: Vec<u16>,
}

/// Lifecycle state of a container.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ContainerState {
    Created,
    Running,
    Exited,
    Unknown,
}

/// A container as listed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Container {
    pub id: String,
    pub sandbox_id: String,
    pub metadata: ContainerMetadata,
    pub image: String,
    pub image_ref: String,
    pub state: ContainerState,
    pub created_at: Timestamp,
    pub labels: Labels,
    pub annotations: Labels,
}

/// The detailed status of a container.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ContainerStatus {
    pub id: String,
    pub sandbox_id: String,
    pub metadata: ContainerMetadata,
    pub state: ContainerState,
    pub created_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    pub exit_code: i32,
    pub image: String,
    /// The image id (digest) the container runs.
    pub image_ref: String,
    /// Machine-readable reason for the exit: `Completed`, `Error`, `OOMKilled`.
    pub reason: String,
    pub message: String,
    pub labels: Labels,
    pub annotations: Labels,
    /// Absolute path of the container's log file.
    pub log_path: PathBuf,
}

/// Credentials for one image pull (CRI's `AuthConfig`): a user name and password,
/// or `auth` (base64 of `user:password`), or a token. Its `Debug` shows no secret.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct AuthConfig {
    pub username: String,
    pub password: String,
    pub auth: String,
    pub server_address: String,
    pub identity_token: String,
    pub registry_token: String,
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = |s: &str| if s.is_empty() { "" } else { "<redacted>" };
        f.debug_struct("AuthConfig")
            .field("username", &self.username)
            .field("password", &set(&self.password))
            .field("auth", &set(&self.auth))
            .field("server_address", &self.server_address)
            .field("identity_token", &set(&self.identity_token))
            .field("registry_token", &set(&self.registry_token))
            .finish()
    }
}

/// An image in the runtime's local store.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Image {
    /// The image id: the digest of its manifest (or config, for CRI runtimes).
    pub id: String,
    pub repo_tags: Vec<String>,
    pub repo_digests: Vec<String>,
    pub size: u64,
    /// The numeric user the image runs as, when it names one.
    pub uid: Option<i64>,
    /// The image's user when it is not numeric.
    pub username: String,
    /// Pinned by the runtime (its sandbox image): image GC never removes it.
    #[serde(default)]
    pub pinned: bool,
}

/// The outcome of [`crate::Runtime::exec_sync`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecResult {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// What happened to a container, pushed by the runtime as it happens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ContainerEventKind {
    Created,
    Started,
    Stopped,
    Deleted,
}

/// One lifecycle event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeEvent {
    pub container_id: String,
    pub sandbox_id: String,
    /// The pod the container belongs to, so the node can route the event cheaply.
    pub pod_uid: String,
    pub kind: ContainerEventKind,
    pub at: Timestamp,
}

/// What the images on one filesystem use.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilesystemUsage {
    /// When it was measured.
    pub timestamp: Timestamp,
    /// Where the filesystem (or the store's directory on it) is mounted.
    pub mountpoint: PathBuf,
    pub used_bytes: Option<u64>,
    pub inodes_used: Option<u64>,
}

/// Which of a streaming session's streams the client wants (the remotecommand
/// options). With `tty`, stderr is merged into stdout and must be off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Streams {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// What one container's writable layer uses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerFsUsage {
    pub container_id: String,
    pub writable_layer: FilesystemUsage,
}

/// The kind of images a runtime runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ImageKind {
    /// OCI container images: a root filesystem and a process.
    #[default]
    Container,
    /// Wasm images: a module or component (the CNCF Wasm artifact layout and its kin).
    Wasm,
}

/// What a runtime can do, and where it differs from an OCI container runtime.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// The images it runs.
    pub images: ImageKind,
    /// Mounts are preopened directories (WASI): every volume mount must be a
    /// directory, and a file (the termination message) is mounted through its
    /// directory.
    pub directory_mounts_only: bool,
    /// Memory the sandbox itself needs besides its containers, in bytes: charged to
    /// the pod cgroup as a RuntimeClass `overhead` would be, when the pod sets none.
    pub sandbox_memory_overhead: Option<u64>,
    /// Its images name the user they run as, which `runAsNonRoot` is checked against.
    pub image_user: bool,
    /// The scheme of `containerStatuses[].containerID` (`wasm://…`); `None`: the
    /// runtime name its version reports (`containerd://…`), as the kubelet does.
    pub container_id_scheme: Option<String>,
    /// [`crate::Runtime::exec_sync`] runs commands in containers.
    pub exec: bool,
    /// Streaming into a running container's stdio (`kubectl attach`).
    pub attach: bool,
    /// Forwarding a pod's ports (`kubectl port-forward`).
    pub port_forward: bool,
    /// Container and pod resource statistics.
    pub stats: bool,
}

impl Default for Capabilities {
    /// An OCI container runtime that can exec and nothing more.
    fn default() -> Self {
        Capabilities {
            images: ImageKind::Container,
            directory_mounts_only: false,
            sandbox_memory_overhead: None,
            image_user: true,
            container_id_scheme: None,
            exec: true,
            attach: false,
            port_forward: false,
            stats: false,
        }
    }
}
