//! The node's configuration: the kubelet's flags and its `KubeletConfiguration` file,
//! merged (flags win) and validated into one [`NodeConfig`].
//!
//! Every bad value is reported at once; the binary exits with a usage error rather
//! than starting with half a configuration. Fields wasmlet adds live under a
//! `wasmlet:` key in the same YAML document.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use serde::Deserialize;

mod node_api;
mod sections;

pub use node_api::{
    AuthnConfig, AuthzMode, DEFAULT_CACHE_AUTHORIZED_TTL, DEFAULT_CACHE_UNAUTHORIZED_TTL,
    DEFAULT_TOKEN_CACHE_TTL, NodeApiSettings, TlsSettings,
};

/// The kubelet flags wasmlet shares, plus its own.
#[derive(Args, Clone, Debug, Default)]
pub struct NodeFlags {
    /// A KubeletConfiguration YAML (or JSON) file; flags override its values.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// An unknown or misplaced key in the configuration file is an error rather
    /// than a warning.
    #[arg(long)]
    pub strict_config: bool,
    /// Directory for the node's state: image store, compile cache, checkpoints.
    #[arg(long, value_name = "DIR")]
    pub root_dir: Option<PathBuf>,
    /// Directory of static pod manifests (same as staticPodPath).
    #[arg(long, value_name = "DIR")]
    pub pod_manifest_path: Option<PathBuf>,
    /// The node's name instead of the hostname.
    #[arg(long, value_name = "NAME")]
    pub hostname_override: Option<String>,
    /// IP address the node's servers bind to (same as address).
    #[arg(long, value_name = "IP")]
    pub address: Option<IpAddr>,
    /// Unauthenticated read-only port serving /pods and /healthz; 0 disables it.
    #[arg(long, value_name = "PORT")]
    pub read_only_port: Option<u16>,
    /// Port of the /healthz endpoint; 0 disables it.
    #[arg(long, value_name = "PORT")]
    pub healthz_port: Option<u16>,
    /// The port of the node's authenticated API (reported in the Node object).
    #[arg(long, value_name = "PORT")]
    pub port: Option<u16>,
    /// IP address the /healthz endpoint binds to.
    #[arg(long, value_name = "IP")]
    pub healthz_bind_address: Option<IpAddr>,
    /// Where container log files go (podLogsDir).
    #[arg(long, value_name = "DIR")]
    pub pod_logs_dir: Option<PathBuf>,
    /// How often the static pod directory is rescanned, besides inotify (e.g. 20s).
    #[arg(long, value_name = "DURATION")]
    pub file_check_frequency: Option<String>,
    /// How often every pod is synced even without a change (e.g. 1m).
    #[arg(long, value_name = "DURATION")]
    pub sync_frequency: Option<String>,
    /// The CRI runtime's socket (unix:///run/containerd/containerd.sock); without it the
    /// node runs Wasm pods only.
    #[arg(long, value_name = "ENDPOINT")]
    pub container_runtime_endpoint: Option<String>,
    /// The CRI image service's socket, if it differs from the runtime's.
    #[arg(long, value_name = "ENDPOINT")]
    pub image_service_endpoint: Option<String>,
    /// Deadline of CRI calls except long-running ones (e.g. 2m).
    #[arg(long, value_name = "DURATION")]
    pub runtime_request_timeout: Option<String>,
    /// The program that runs Wasm pod sandboxes (default: this binary, `sandbox`).
    #[arg(long, value_name = "FILE", hide = true)]
    pub sandbox_program: Option<PathBuf>,
    /// Kubeconfig for the API server; without it the node runs standalone.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig whose credentials request the node's client certificate when
    /// `--kubeconfig` is missing or its certificate expired (TLS bootstrap); the
    /// kubeconfig is then written to use the issued certificate.
    #[arg(long, value_name = "FILE")]
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// Rotate the client certificate through CSRs as it nears expiry (rotateCertificates).
    #[arg(long, value_name = "BOOL")]
    pub rotate_certificates: Option<bool>,
    /// Labels to add when registering the node (`key=value,...`).
    #[arg(long, value_name = "LABELS", value_delimiter = ',')]
    pub node_labels: Vec<String>,
    /// Taints to register the node with (`key=value:Effect,...`).
    #[arg(long, value_name = "TAINTS", value_delimiter = ',')]
    pub register_with_taints: Vec<String>,
    /// Register the node with the API server (default true).
    #[arg(long, value_name = "BOOL")]
    pub register_node: Option<bool>,
    /// IP address(es) of the node (`InternalIP`), comma-separated, at most one per family.
    #[arg(long, value_name = "IP", value_delimiter = ',')]
    pub node_ip: Vec<IpAddr>,
    /// URL to fetch static pod manifests from.
    #[arg(long, value_name = "URL")]
    pub manifest_url: Option<String>,
    /// Headers for `--manifest-url` requests (`key:value,...`; repeatable).
    #[arg(long, value_name = "HEADERS", value_delimiter = ',')]
    pub manifest_url_header: Vec<String>,
    /// How often the manifest URL is checked (e.g. 20s).
    #[arg(long, value_name = "DURATION")]
    pub http_check_frequency: Option<String>,
    /// `cgroupfs` or `systemd` naming of the node's cgroups.
    #[arg(long, value_name = "DRIVER")]
    pub cgroup_driver: Option<String>,
    /// The cgroup the node's `kubepods` hierarchy lives under (default `/`).
    #[arg(long, value_name = "PATH")]
    pub cgroup_root: Option<String>,
    /// Make the QoS and pod cgroup hierarchy (default true).
    #[arg(long, value_name = "BOOL")]
    pub cgroups_per_qos: Option<bool>,
    /// Where the node API's certificates are kept (default `<root-dir>/pki`).
    #[arg(long, value_name = "DIR")]
    pub cert_dir: Option<PathBuf>,
    /// The node API's serving certificate (PEM; with `--tls-private-key-file`).
    #[arg(long, value_name = "FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// The key of `--tls-cert-file` (PEM).
    #[arg(long, value_name = "FILE")]
    pub tls_private_key_file: Option<PathBuf>,
    /// CA bundle that client certificates of the node API are verified against.
    #[arg(long, value_name = "FILE")]
    pub client_ca_file: Option<PathBuf>,
    /// Serve node API requests without credentials as `system:anonymous`.
    #[arg(long, value_name = "BOOL")]
    pub anonymous_auth: Option<bool>,
    /// Authenticate bearer tokens through the API server's TokenReview.
    #[arg(long, value_name = "BOOL")]
    pub authentication_token_webhook: Option<bool>,
    /// `AlwaysAllow` or `Webhook` (SubjectAccessReview).
    #[arg(long, value_name = "MODE")]
    pub authorization_mode: Option<String>,
    /// How long an exec, attach or port-forward stream may carry nothing before the
    /// node ends it (e.g. 4h).
    #[arg(long, value_name = "DURATION")]
    pub streaming_connection_idle_timeout: Option<String>,
    /// Container GC keeps a dead container younger than this (default 0).
    #[arg(long, value_name = "DURATION")]
    pub minimum_container_ttl_duration: Option<String>,
    /// The most dead instances container GC keeps per container (default 1;
    /// negative: no limit).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub maximum_dead_containers_per_container: Option<i32>,
    /// The most dead containers container GC keeps on the node (default -1: no
    /// limit).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub maximum_dead_containers: Option<i32>,
    /// The CNI network configuration Wasm pods are attached with (default
    /// `/etc/cni/net.d`; share containerd's so both kinds of pods share one network).
    #[arg(long, value_name = "DIR")]
    pub cni_conf_dir: Option<PathBuf>,
    /// Where CNI plugin binaries are found, comma-separated (default `/opt/cni/bin`,
    /// then `/usr/lib/cni`).
    #[arg(long, value_name = "DIRS", value_delimiter = ',')]
    pub cni_bin_dir: Vec<PathBuf>,
    /// Pull one image at a time (serializeImagePulls, default true).
    #[arg(long, value_name = "BOOL")]
    pub serialize_image_pulls: Option<bool>,
    /// Image pulls per second the node starts; 0 is unlimited (registryPullQPS, 5).
    #[arg(long, value_name = "QPS")]
    pub registry_qps: Option<f64>,
    /// Pulls allowed in a burst above --registry-qps (registryBurst, 10).
    #[arg(long, value_name = "N")]
    pub registry_burst: Option<i64>,
    /// A CredentialProviderConfig: kubelet credential provider plugins for image pulls.
    #[arg(long, value_name = "FILE")]
    pub image_credential_provider_config: Option<PathBuf>,
    /// Where the credential provider plugins of --image-credential-provider-config are.
    #[arg(long, value_name = "DIR")]
    pub image_credential_provider_bin_dir: Option<PathBuf>,
}

/// The fields of `KubeletConfiguration` (kubelet.config.k8s.io/v1beta1) wasmlet reads.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct KubeletConfiguration {
    api_version: Option<String>,
    kind: Option<String>,
    static_pod_path: Option<PathBuf>,
    file_check_frequency: Option<String>,
    sync_frequency: Option<String>,
    address: Option<String>,
    read_only_port: Option<i64>,
    port: Option<i64>,
    healthz_port: Option<i64>,
    healthz_bind_address: Option<String>,
    pod_logs_dir: Option<PathBuf>,
    max_pods: Option<i64>,
    container_runtime_endpoint: Option<String>,
    image_service_endpoint: Option<String>,
    runtime_request_timeout: Option<String>,
    #[serde(rename = "clusterDNS")]
    cluster_dns: Option<Vec<String>>,
    cluster_domain: Option<String>,
    resolv_conf: Option<String>,
    kube_reserved: Option<BTreeMap<String, String>>,
    system_reserved: Option<BTreeMap<String, String>>,
    eviction_hard: Option<BTreeMap<String, String>>,
    eviction_soft: Option<BTreeMap<String, String>>,
    eviction_soft_grace_period: Option<BTreeMap<String, String>>,
    eviction_minimum_reclaim: Option<BTreeMap<String, String>>,
    eviction_max_pod_grace_period: Option<i64>,
    eviction_pressure_transition_period: Option<String>,
    kernel_memcg_notification: Option<bool>,
    shutdown_grace_period: Option<String>,
    shutdown_grace_period_critical_pods: Option<String>,
    shutdown_grace_period_by_pod_priority: Option<Vec<sections::ShutdownGracePeriodByPodPriority>>,
    #[serde(rename = "imageGCHighThresholdPercent")]
    image_gc_high_threshold_percent: Option<i64>,
    #[serde(rename = "imageGCLowThresholdPercent")]
    image_gc_low_threshold_percent: Option<i64>,
    #[serde(rename = "imageMinimumGCAge")]
    image_minimum_gc_age: Option<String>,
    #[serde(rename = "imageMaximumGCAge")]
    image_maximum_gc_age: Option<String>,
    serialize_image_pulls: Option<bool>,
    max_parallel_image_pulls: Option<i64>,
    #[serde(rename = "registryPullQPS")]
    registry_pull_qps: Option<f64>,
    registry_burst: Option<i64>,
    #[serde(rename = "staticPodURL")]
    static_pod_url: Option<String>,
    #[serde(rename = "staticPodURLHeader")]
    static_pod_url_header: Option<BTreeMap<String, Vec<String>>>,
    http_check_frequency: Option<String>,
    node_status_update_frequency: Option<String>,
    node_status_report_frequency: Option<String>,
    node_lease_duration_seconds: Option<i64>,
    register_node: Option<bool>,
    register_with_taints: Option<Vec<k8s_openapi::api::core::v1::Taint>>,
    cgroup_driver: Option<String>,
    cgroup_root: Option<String>,
    #[serde(rename = "cgroupsPerQOS")]
    cgroups_per_qos: Option<bool>,
    #[serde(rename = "cpuCFSQuota")]
    cpu_cfs_quota: Option<bool>,
    #[serde(rename = "cpuCFSQuotaPeriod")]
    cpu_cfs_quota_period: Option<String>,
    pod_pids_limit: Option<i64>,
    enforce_node_allocatable: Option<Vec<String>>,
    tls_cert_file: Option<PathBuf>,
    tls_private_key_file: Option<PathBuf>,
    tls_cipher_suites: Option<Vec<String>>,
    tls_min_version: Option<String>,
    rotate_certificates: Option<bool>,
    #[serde(rename = "serverTLSBootstrap")]
    server_tls_bootstrap: Option<bool>,
    container_log_max_size: Option<String>,
    container_log_max_files: Option<i64>,
    container_log_monitor_interval: Option<String>,
    container_log_max_workers: Option<i64>,
    volume_stats_agg_period: Option<String>,
    enable_system_log_handler: Option<bool>,
    enable_debugging_handlers: Option<bool>,
    streaming_connection_idle_timeout: Option<String>,
    authentication: Option<node_api::AuthenticationSection>,
    authorization: Option<node_api::AuthorizationSection>,
    topology_manager_policy: Option<String>,
    topology_manager_scope: Option<String>,
    topology_manager_policy_options: Option<BTreeMap<String, String>>,
    cpu_manager_policy: Option<String>,
    #[serde(rename = "reservedSystemCPUs")]
    reserved_system_cpus: Option<String>,
    wasmlet: Option<WasmletSection>,
    #[serde(flatten)]
    other: BTreeMap<String, serde_json::Value>,
}

/// wasmlet's own settings, under `wasmlet:` in the config file.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WasmletSection {
    /// Container restart back-off: first delay, doubled per crash up to `max`.
    restart_backoff: Option<BackoffSection>,
    housekeeping_interval: Option<String>,
    pleg_relist_period: Option<String>,
    /// How often the eviction manager observes its signals (the kubelet's fixed 10 s).
    eviction_monitoring_period: Option<String>,
    /// How often image GC runs (the kubelet's fixed 5 m).
    #[serde(rename = "imageGCPeriod")]
    image_gc_period: Option<String>,
    /// RuntimeClass name -> handler. `wasmtime` is always there.
    runtime_handlers: Option<BTreeMap<String, String>>,
    /// The node's Wasm plugins (`docs/plugins.md`).
    #[serde(default)]
    plugins: Vec<wasmlet_plugin_host::PluginConfig>,
    /// Per-registry CA files for Wasm image pulls, `<dir>/<host[:port]>/*.crt`
    /// (default `/etc/containers/certs.d`).
    registry_certs_dir: Option<PathBuf>,
    /// Registries (`host[:port]`) Wasm images are pulled from over plain HTTP.
    #[serde(default)]
    insecure_registries: Vec<String>,
    /// `--cni-conf-dir` in the file.
    cni_conf_dir: Option<PathBuf>,
    /// `--cni-bin-dir` in the file.
    cni_bin_dir: Option<Vec<PathBuf>>,
    /// Where the machine's topology is read (`/sys`); tests lay out a NUMA machine.
    sysfs_root: Option<PathBuf>,
    /// How often Wasm device adapters are asked for their devices (10 s).
    device_adapter_period: Option<String>,
    /// How long one CSI call may take (the kubelet's fixed `csiTimeout`, 2 m).
    csi_timeout: Option<String>,
    /// Whether Wasm sandboxes are forked from a zygote (default false): see
    /// `docs/decisions.md`, "Speed and density".
    sandbox_zygote: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
struct BackoffSection {
    initial: Option<String>,
    max: Option<String>,
}

/// The device and topology managers' settings.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceSettings {
    pub topology: crate::cm::topologymanager::Config,
    /// The sysfs the machine's topology is read from (`/sys`).
    pub sysfs_root: PathBuf,
    /// How often Wasm device adapters are asked for their devices.
    pub adapter_period: Duration,
    /// `cpuManagerPolicy: static`.
    pub cpu_manager_static: bool,
    /// `reservedSystemCPUs`, when given; otherwise the CPU manager reserves
    /// `kubeReserved` + `systemReserved` cpu, rounded up to whole CPUs.
    pub reserved_system_cpus: Option<crate::cm::cpuset::CpuSet>,
}

/// How the node joins a cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterSettings {
    pub kubeconfig: PathBuf,
    pub register_node: bool,
    pub node_labels: BTreeMap<String, String>,
    pub taints: Vec<k8s_openapi::api::core::v1::Taint>,
    pub node_ips: Vec<IpAddr>,
    /// How often NodeStatus is computed (and written if it changed).
    pub status_update_frequency: Duration,
    /// How often NodeStatus is written even when nothing changed.
    pub status_report_frequency: Duration,
    pub lease_duration_seconds: i32,
    /// The node's certificates from the cluster's CSRs.
    pub certificates: CertificateSettings,
}

/// `--bootstrap-kubeconfig`, `rotateCertificates` and `serverTLSBootstrap` (both off
/// by default, as in `KubeletConfiguration` v1beta1).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CertificateSettings {
    pub bootstrap_kubeconfig: Option<PathBuf>,
    pub rotate_certificates: bool,
    pub server_tls_bootstrap: bool,
}

/// The HTTP static pod source.
#[derive(Clone, Debug, PartialEq)]
pub struct ManifestUrl {
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub check_frequency: Duration,
}

/// The validated configuration the node runs with.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeConfig {
    pub node_name: String,
    pub root_dir: PathBuf,
    pub pod_logs_dir: PathBuf,
    pub static_pod_path: Option<PathBuf>,
    pub file_check_frequency: Duration,
    pub sync_frequency: Duration,
    pub address: IpAddr,
    pub read_only_port: u16,
    /// The port of the authenticated node API, as reported in the Node's
    /// `daemonEndpoints`.
    pub port: u16,
    pub healthz_bind_address: IpAddr,
    pub healthz_port: u16,
    pub max_pods: u32,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    pub housekeeping_interval: Duration,
    pub pleg_relist_period: Duration,
    /// The PLEG is unhealthy when no relist succeeded for this long.
    pub pleg_unhealthy_after: Duration,
    pub runtime_handlers: BTreeMap<String, String>,
    /// The CRI runtime, when one is configured.
    pub cri: Option<CriSettings>,
    /// `clusterDNS`, `clusterDomain` and `resolvConf`.
    pub dns: crate::podspec::ClusterDns,
    /// `kubeReserved`, `systemReserved` and `evictionHard`.
    pub reservations: crate::allocatable::Reservations,
    /// The eviction manager's thresholds and timings.
    pub eviction: crate::thresholds::EvictionConfig,
    /// Image garbage collection.
    pub image_gc: crate::images::ImageGcPolicy,
    /// Container garbage collection.
    pub container_gc: crate::kuberuntime::gc::ContainerGcPolicy,
    /// How many image pulls run at once and how often one starts.
    pub pulls: crate::images::puller::PullSettings,
    /// The credential provider plugins, validated.
    pub credential_providers: Vec<crate::images::providers::Provider>,
    /// How the Wasm runtime reaches registries.
    pub registry: wasmlet_runtime_wasm::registry::RegistrySettings,
    /// How Wasm pods get their pod network.
    pub network: wasmlet_runtime_wasm::network::NetworkSettings,
    /// Graceful node shutdown's grace periods (all zero: off).
    pub shutdown: crate::shutdown::ShutdownConfig,
    /// Membership of a cluster; `None` runs standalone.
    pub cluster: Option<ClusterSettings>,
    /// The HTTP manifest source.
    pub manifest_url: Option<ManifestUrl>,
    pub sandbox_program: PathBuf,
    pub sandbox_args: Vec<String>,
    /// `wasmlet.sandboxZygote`: sandboxes forked from a zygote.
    pub sandbox_zygote: bool,
    /// The QoS and pod cgroups; `None` with `cgroupsPerQOS: false`.
    pub cgroups: Option<CgroupSettings>,
    /// The Wasm plugins to load (`wasmlet.plugins`).
    pub plugins: Vec<wasmlet_plugin_host::PluginConfig>,
    /// The device manager and the topology manager.
    pub devices: DeviceSettings,
    /// The authenticated node API on `address:port`.
    pub node_api: NodeApiSettings,
    /// Container log rotation.
    pub container_logs: ContainerLogSettings,
    /// How long a volume's measured disk usage is reused (`volumeStatsAggPeriod`,
    /// 1m); zero measures no volume.
    pub volume_stats_agg_period: Duration,
    /// How long one CSI call may take (`wasmlet.csiTimeout`, the kubelet's 2 m).
    pub csi_timeout: Duration,
}

/// Container log rotation: `containerLogMaxSize`, `containerLogMaxFiles`,
/// `containerLogMonitorInterval` and `containerLogMaxWorkers`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerLogSettings {
    /// A log at least this large is rotated; `None` (a negative size) turns rotation off.
    pub max_size: Option<u64>,
    /// The most files a container's log is kept in, the current one included (> 1).
    pub max_files: usize,
    /// How often every running container's log is looked at (≥ 3s).
    pub monitor_interval: Duration,
    /// How many logs are rotated at once (≥ 1).
    pub max_workers: usize,
}

/// How the node lays out and enforces its cgroups.
#[derive(Clone, Debug, PartialEq)]
pub struct CgroupSettings {
    pub driver: crate::cm::cgroup::Driver,
    /// The cgroup `kubepods` lives under, `/` by default.
    pub root: String,
    pub cpu_cfs_quota: bool,
    pub cpu_cfs_quota_period: Duration,
    /// `podPidsLimit`; `None` is unlimited.
    pub pod_pids_limit: Option<i64>,
    /// `enforceNodeAllocatable` (`pods` limits `kubepods` to the allocatable).
    pub enforce_node_allocatable: Vec<String>,
}

/// How to reach the CRI runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CriSettings {
    pub runtime_endpoint: String,
    pub image_endpoint: Option<String>,
    pub request_timeout: Duration,
}

impl NodeConfig {
    /// The image store under a root directory (for `wasmlet images`).
    pub fn image_store_dir_under(root: &std::path::Path) -> PathBuf {
        root.join("image-store")
    }

    /// The directory where OCI archives dropped by an operator are imported at start.
    pub fn image_drop_dir(&self) -> PathBuf {
        self.root_dir.join("images")
    }

    /// The content-addressed image store.
    pub fn image_store_dir(&self) -> PathBuf {
        Self::image_store_dir_under(&self.root_dir)
    }

    /// The compile cache of precompiled Wasm.
    pub fn compile_cache_dir(&self) -> PathBuf {
        self.root_dir.join("wasm-cache")
    }

    /// Where Wasm sandboxes keep their sockets and the node's records of them.
    pub fn wasm_state_dir(&self) -> PathBuf {
        self.root_dir.join("wasm-sandboxes")
    }
}

/// The kubelet's defaults, with the paths wasmlet uses.
pub const DEFAULT_ROOT_DIR: &str = "/var/lib/wasmlet";
pub const DEFAULT_POD_LOGS_DIR: &str = "/var/log/pods";

/// Every problem found in the configuration, reported together.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration:\n  - {}", .0.join("\n  - "))]
pub struct ConfigErrors(pub Vec<String>);

impl NodeFlags {
    /// Merges the config file (if any) and the flags into a validated [`NodeConfig`].
    ///
    /// Each section is resolved by a function of its own (in `config/sections.rs`); all
    /// push onto one list, so every bad value is reported at once, in this order.
    pub fn resolve(&self) -> Result<NodeConfig, ConfigErrors> {
        let mut errors = Vec::new();
        let mut file = sections::read_file(self.config.as_deref(), self.strict_config, &mut errors);
        let section = file.wasmlet.take().unwrap_or_default();
        let timing = self.timing(&file, &section, &mut errors);
        let servers = self.servers(&file, &mut errors);
        let max_pods = sections::max_pods(&file, &mut errors);
        timing.check(&mut errors);
        let dns = sections::cluster_dns(&file, &mut errors);
        let reservations = sections::reservations(&file, &mut errors);
        let cgroups = self.cgroups(&file, &mut errors);
        let eviction = sections::eviction(
            &file,
            &section,
            &reservations,
            cgroups.as_ref(),
            &mut errors,
        );
        let image_gc = sections::image_gc(&file, &section, &mut errors);
        let container_gc = self.container_gc(&mut errors);
        let pulls = self.pulls(&file, &mut errors);
        let credential_providers = self.credential_providers(&mut errors);
        let shutdown = sections::shutdown(&file, &mut errors);
        let node_name = self.node_name(&mut errors);
        let cri = self.cri(&file, timing.runtime_request_timeout);
        let registry = wasmlet_runtime_wasm::registry::RegistrySettings {
            certs_dir: section.registry_certs_dir.clone().unwrap_or_else(|| {
                wasmlet_runtime_wasm::registry::RegistrySettings::default().certs_dir
            }),
            insecure: section.insecure_registries.clone(),
            ..Default::default()
        };
        let network = self.network(&section);
        let devices = sections::devices(&file, &section, &mut errors);
        let csi_timeout = sections::duration_of(
            &mut errors,
            "wasmlet.csiTimeout",
            section.csi_timeout.as_ref(),
            crate::volumes::csi::CSI_TIMEOUT,
        );
        let sandbox_zygote = section.sandbox_zygote.unwrap_or(false);
        let (plugins, runtime_handlers) =
            sections::wasmlet_section(section, cri.is_some(), &mut errors);
        let cluster = self.cluster(&file, &timing, &mut errors);
        let manifest_url = self.manifest_url(&file, timing.http_check_frequency, &mut errors);
        let sandbox = self.sandbox(&mut errors);
        let root_dir = self
            .root_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_ROOT_DIR));
        let node_api = self.node_api(&mut file, &root_dir, cluster.is_none(), &mut errors);
        let container_logs = sections::container_logs(&file, &mut errors);
        if !errors.is_empty() {
            return Err(ConfigErrors(errors));
        }
        Ok(NodeConfig {
            node_name,
            root_dir,
            pod_logs_dir: self
                .pod_logs_dir
                .clone()
                .or(file.pod_logs_dir)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_POD_LOGS_DIR)),
            static_pod_path: self.pod_manifest_path.clone().or(file.static_pod_path),
            file_check_frequency: timing.file_check_frequency,
            sync_frequency: timing.sync_frequency,
            address: servers.address,
            read_only_port: servers.read_only_port,
            port: servers.port,
            healthz_bind_address: servers.healthz_bind_address,
            healthz_port: servers.healthz_port,
            max_pods,
            backoff_initial: timing.backoff_initial,
            backoff_max: timing.backoff_max,
            housekeeping_interval: timing.housekeeping_interval,
            pleg_relist_period: timing.pleg_relist_period,
            pleg_unhealthy_after: Duration::from_secs(180),
            runtime_handlers,
            cri,
            dns,
            reservations,
            eviction,
            image_gc,
            container_gc,
            pulls,
            credential_providers,
            registry,
            network,
            shutdown,
            cluster,
            manifest_url,
            sandbox_program: sandbox.program,
            sandbox_args: sandbox.args,
            sandbox_zygote,
            cgroups,
            plugins,
            devices,
            node_api,
            container_logs,
            volume_stats_agg_period: timing.volume_stats_agg_period,
            csi_timeout,
        })
    }
}

/// Whether a node may set this label on itself: labels in the `kubernetes.io` and
/// `k8s.io` namespaces only from the kubelet's list (`IsKubeletLabel`), never under
/// `node-restriction.kubernetes.io/`.
pub fn node_label_allowed(key: &str) -> bool {
    const KUBELET_LABELS: &[&str] = &[
        "kubernetes.io/hostname",
        "kubernetes.io/os",
        "kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/arch",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "failure-domain.beta.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
    ];
    let Some((prefix, _)) = key.split_once('/') else {
        return true;
    };
    let restricted = |ns: &str| prefix == ns || prefix.ends_with(&format!(".{ns}"));
    if !(restricted("kubernetes.io") || restricted("k8s.io")) {
        return true;
    }
    if prefix == "node-restriction.kubernetes.io"
        || prefix.ends_with(".node-restriction.kubernetes.io")
    {
        return false;
    }
    KUBELET_LABELS.contains(&key)
        || ["kubelet.kubernetes.io", "node.kubernetes.io"]
            .iter()
            .any(|ns| prefix == *ns || prefix.ends_with(&format!(".{ns}")))
}

/// Parses a `--register-with-taints` entry: `key[=value]:Effect`.
pub fn parse_taint(s: &str) -> Result<k8s_openapi::api::core::v1::Taint, String> {
    let (kv, effect) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("{s:?} is not key=value:Effect"))?;
    if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
        return Err(format!(
            "{s:?}: effect {effect:?} is not NoSchedule, PreferNoSchedule or NoExecute"
        ));
    }
    let (key, value) = match kv.split_once('=') {
        Some((k, v)) => (k, Some(v.to_owned())),
        None => (kv, None),
    };
    if key.is_empty() {
        return Err(format!("{s:?} has no key"));
    }
    Ok(k8s_openapi::api::core::v1::Taint {
        key: key.to_owned(),
        value,
        effect: effect.to_owned(),
        time_added: None,
    })
}

/// The config file as read: the parsed file, the path of every key no field took
/// (`wasmlet.plugins.0.limit`; keys at the top level land in `other` instead, as the
/// KubeletConfiguration fields wasmlet does not use are among them), and the
/// plugins whose `world:` has a deprecated short name.
#[derive(Default)]
struct LoadedFile {
    file: KubeletConfiguration,
    ignored: Vec<String>,
    /// `(wasmlet.plugins.<i>.world, the short name)`.
    deprecated_worlds: Vec<(String, String)>,
}

fn load_file(path: &Path) -> Result<LoadedFile, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut ignored = Vec::new();
    let file = serde_saphyr::with_deserializer_from_str(&text, |de| {
        // `?` stands for an `Option`'s content in the path; the file has no such level.
        serde_ignored::deserialize(de, |key| {
            ignored.push(key.to_string().replace(".?", "").replace("?.", ""))
        })
    })
    .map_err(|e| format!("{}: {e}", path.display()))?;
    // The world's spelling is gone once parsed; read it from the tree.
    let tree: serde_json::Value = serde_saphyr::from_str(&text).unwrap_or_default();
    let deprecated_worlds = tree["wasmlet"]["plugins"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .filter_map(|(i, p)| {
            let name = p["world"].as_str()?;
            wasmlet_plugin_host::World::from_deprecated_alias(name)
                .map(|_| (format!("wasmlet.plugins.{i}.world"), name.to_string()))
        })
        .collect();
    Ok(LoadedFile {
        file,
        ignored,
        deprecated_worlds,
    })
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags_with_file(yaml: &str) -> (tempfile::TempDir, NodeFlags) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, yaml).unwrap();
        let flags = NodeFlags {
            config: Some(path),
            hostname_override: Some("node-a".into()),
            ..Default::default()
        };
        (dir, flags)
    }

    #[test]
    fn defaults_are_the_kubelets() {
        let flags = NodeFlags {
            hostname_override: Some("Node-A".into()),
            ..Default::default()
        };
        let c = flags.resolve().unwrap();
        assert_eq!(c.node_name, "node-a");
        assert_eq!(c.file_check_frequency, Duration::from_secs(20));
        assert_eq!(c.sync_frequency, Duration::from_secs(60));
        assert_eq!(c.read_only_port, 0);
        assert_eq!(c.healthz_port, 10248);
        assert_eq!(c.healthz_bind_address.to_string(), "127.0.0.1");
        assert_eq!(c.max_pods, 110);
        assert_eq!(c.backoff_initial, Duration::from_secs(10));
        assert_eq!(c.backoff_max, Duration::from_secs(300));
        assert_eq!(c.housekeeping_interval, Duration::from_secs(2));
        assert_eq!(c.pleg_relist_period, Duration::from_secs(1));
        assert_eq!(c.root_dir, PathBuf::from("/var/lib/wasmlet"));
        assert_eq!(c.pod_logs_dir, PathBuf::from("/var/log/pods"));
        assert_eq!(c.sandbox_args, ["sandbox"]);
        assert!(c.dns.servers.is_empty());
        assert_eq!(
            c.reservations.eviction_hard,
            crate::allocatable::default_eviction_hard()
        );
        assert_eq!(
            c.dns.resolv_conf.as_deref(),
            Some(std::path::Path::new("/etc/resolv.conf"))
        );
    }

    #[test]
    fn a_misplaced_or_misspelt_key_names_the_field_it_meant_and_fails_when_strict() {
        let yaml = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nplugins: []\nevictonHard: {}\nenableServer: true\n";
        let (_dir, flags) = flags_with_file(yaml);
        // Warned about, not fatal, by default (and enableServer, an upstream field
        // wasmlet does not read, is only noted).
        assert!(flags.clone().resolve().is_ok());
        let strict = NodeFlags {
            strict_config: true,
            ..flags
        };
        let errors = strict.resolve().unwrap_err().to_string();
        assert!(
            errors.contains(
                r#"unknown KubeletConfiguration field "plugins"; did you mean "wasmlet.plugins"?"#
            ),
            "{errors}"
        );
        assert!(
            errors.contains(
                r#"unknown KubeletConfiguration field "evictonHard"; did you mean "evictionHard"?"#
            ),
            "{errors}"
        );
        assert!(!errors.contains("enableServer"), "{errors}");
        assert_eq!(
            sections::nearest_field("csiTimeout").as_deref(),
            Some("wasmlet.csiTimeout")
        );
        assert_eq!(sections::nearest_field("zzzzzzzzzz"), None);
    }

    #[test]
    fn unknown_keys_in_every_section_are_named_with_their_path() {
        let yaml = "wasmlet:\n  csiTimout: 1m\n  restartBackoff: {initial: 1s, maks: 10s}\n  plugins:\n  - name: p\n    world: probe\n    source: {file: /p.wasm}\n    limit: {timeoutMillis: 5}\n    grants: {netwrk: true, filesystem: [{hostPath: /a, guestPath: /b, readonly: true}]}\nauthentication:\n  anonymus: {enabled: false}\n";
        let (_dir, flags) = flags_with_file(yaml);
        let config = flags.clone().resolve().unwrap();
        assert_eq!(
            config.plugins.len(),
            1,
            "the deprecated world name still reads"
        );
        let strict = NodeFlags {
            strict_config: true,
            ..flags
        };
        let errors = strict.resolve().unwrap_err().to_string();
        for expected in [
            r#"unknown field "wasmlet.csiTimout"; did you mean "wasmlet.csiTimeout"?"#,
            r#"unknown field "wasmlet.restartBackoff.maks"; did you mean "wasmlet.restartBackoff.max"?"#,
            r#"unknown field "wasmlet.plugins.0.limit"; did you mean "wasmlet.plugins.0.limits"?"#,
            r#"unknown field "wasmlet.plugins.0.grants.netwrk"; did you mean "wasmlet.plugins.0.grants.network"?"#,
            r#"unknown field "wasmlet.plugins.0.grants.filesystem.0.readonly"; did you mean "wasmlet.plugins.0.grants.filesystem.0.readOnly"?"#,
            r#"unknown field "authentication.anonymus""#,
        ] {
            assert!(errors.contains(expected), "{expected} in {errors}");
        }
    }

    #[test]
    fn container_gc_takes_the_kubelets_flags() {
        use clap::Parser as _;
        let cli = crate::cli::Cli::try_parse_from([
            "wasmlet",
            "--hostname-override=a",
            "--minimum-container-ttl-duration=90s",
            "--maximum-dead-containers-per-container",
            "-1",
            "--maximum-dead-containers=7",
        ])
        .unwrap();
        let c = cli.node.resolve().unwrap();
        assert_eq!(c.container_gc.min_age, Duration::from_secs(90));
        assert_eq!(c.container_gc.max_per_pod_container, -1);
        assert_eq!(c.container_gc.max_containers, 7);
        let defaults = NodeFlags {
            hostname_override: Some("a".into()),
            ..Default::default()
        }
        .resolve()
        .unwrap();
        assert_eq!(defaults.container_gc, Default::default());
        let bad = NodeFlags {
            hostname_override: Some("a".into()),
            minimum_container_ttl_duration: Some("soon".into()),
            ..Default::default()
        }
        .resolve()
        .unwrap_err();
        assert!(
            bad.to_string().contains("--minimum-container-ttl-duration"),
            "{bad}"
        );
    }

    #[test]
    fn the_file_is_read_and_flags_win() {
        let (_dir, mut flags) = flags_with_file(
            "apiVersion: kubelet.config.k8s.io/v1beta1\n\
             kind: KubeletConfiguration\n\
             staticPodPath: /etc/manifests\n\
             fileCheckFrequency: 5s\n\
             syncFrequency: 30s\n\
             readOnlyPort: 10255\n\
             healthzPort: 0\n\
             maxPods: 20\n\
             podLogsDir: /tmp/pods\n\
             clusterDNS: [10.96.0.10]\n\
             clusterDomain: cluster.local.\n\
             kubeReserved: {cpu: 100m, memory: 256Mi}\n\
             evictionHard: {memory.available: 200Mi}\n\
             resolvConf: \"\"\n\
             wasmlet:\n  restartBackoff: {initial: 100ms, max: 1s}\n",
        );
        flags.read_only_port = Some(10300);
        let c = flags.resolve().unwrap();
        assert_eq!(c.static_pod_path, Some(PathBuf::from("/etc/manifests")));
        assert_eq!(c.file_check_frequency, Duration::from_secs(5));
        assert_eq!(c.sync_frequency, Duration::from_secs(30));
        assert_eq!(c.read_only_port, 10300);
        assert_eq!(c.healthz_port, 0);
        assert_eq!(c.max_pods, 20);
        assert_eq!(c.pod_logs_dir, PathBuf::from("/tmp/pods"));
        assert_eq!(c.backoff_initial, Duration::from_millis(100));
        assert_eq!(c.backoff_max, Duration::from_secs(1));
        assert_eq!(c.dns.servers, ["10.96.0.10"]);
        assert_eq!(c.dns.domain, "cluster.local");
        assert_eq!(c.dns.resolv_conf, None, "an empty resolvConf means none");
        assert_eq!(c.reservations.kube_reserved["memory"].0, "256Mi");
        assert_eq!(
            c.reservations.eviction_hard,
            BTreeMap::from([(
                "memory.available".to_owned(),
                crate::allocatable::Threshold::Bytes(200 << 20)
            )]),
            "evictionHard replaces the defaults"
        );
    }

    #[test]
    fn every_bad_value_is_reported_at_once() {
        let (_dir, flags) = flags_with_file(
            "kind: Pod\n\
             fileCheckFrequency: often\n\
             readOnlyPort: 70000\n\
             address: not-an-ip\n\
             maxPods: -1\n\
             clusterDNS: [kube-dns]\n\
             systemReserved: {memory: much}\n\
             evictionHard: {memory.free: 1Gi}\n\
             wasmlet:\n  restartBackoff: {initial: 10s, max: 1s}\n",
        );
        let errors = flags.resolve().unwrap_err().0;
        let text = errors.join("\n");
        for want in [
            "kind",
            "fileCheckFrequency",
            "readOnlyPort: 70000",
            "clusterDNS: \"kube-dns\"",
            "systemReserved.memory: \"much\"",
            "evictionHard: unknown signal \"memory.free\"",
            "address",
            "maxPods",
            "restartBackoff.max",
        ] {
            assert!(text.contains(want), "missing {want:?} in:\n{text}");
        }
        assert_eq!(errors.len(), 9, "{text}");
    }

    #[test]
    fn errors_come_in_the_order_of_the_sections() {
        let (_dir, mut flags) = flags_with_file(
            "kind: Pod\n\
             fileCheckFrequency: often\n\
             syncFrequency: 0s\n\
             readOnlyPort: 70000\n\
             address: not-an-ip\n\
             maxPods: 0\n\
             clusterDNS: [kube-dns]\n\
             systemReserved: {memory: much}\n\
             cgroupDriver: upstart\n\
             nodeStatusUpdateFrequency: 1m\n\
             nodeStatusReportFrequency: 30s\n\
             staticPodURL: ftp://example.com/pods\n\
             wasmlet:\n  runtimeHandlers: {gvisor: runsc}\n",
        );
        flags.hostname_override = Some("not_a_name".into());
        flags.kubeconfig = Some("/k".into());
        flags.node_labels = vec!["no-value".into()];
        let errors = flags.resolve().unwrap_err().0;
        let starts: Vec<&str> = errors
            .iter()
            .map(|e| e.split([':', ' ']).next().unwrap_or_default())
            .collect();
        assert_eq!(
            starts,
            [
                "kind",
                "fileCheckFrequency",
                "readOnlyPort",
                "address",
                "maxPods",
                "syncFrequency",
                "clusterDNS",
                "systemReserved.memory",
                "cgroupDriver",
                "node",
                "wasmlet.runtimeHandlers.gvisor",
                "--node-labels",
                "nodeStatusReportFrequency",
                "manifest",
            ],
            "{errors:#?}"
        );
    }

    #[test]
    fn certificate_settings_default_off_and_need_a_kubeconfig() {
        let (_dir, mut flags) = flags_with_file("kind: KubeletConfiguration\n");
        flags.kubeconfig = Some("/k".into());
        let c = flags.resolve().unwrap().cluster.unwrap();
        assert_eq!(c.certificates, CertificateSettings::default());

        let (_dir, mut flags) = flags_with_file(
            "kind: KubeletConfiguration\nrotateCertificates: true\nserverTLSBootstrap: true\n",
        );
        flags.kubeconfig = Some("/k".into());
        flags.bootstrap_kubeconfig = Some("/b".into());
        let c = flags.resolve().unwrap().cluster.unwrap();
        assert_eq!(
            c.certificates,
            CertificateSettings {
                bootstrap_kubeconfig: Some("/b".into()),
                rotate_certificates: true,
                server_tls_bootstrap: true,
            }
        );
        flags.rotate_certificates = Some(false);
        let c = flags.resolve().unwrap().cluster.unwrap();
        assert!(!c.certificates.rotate_certificates, "the flag wins");

        flags.kubeconfig = None;
        let text = flags.resolve().unwrap_err().0.join("\n");
        assert!(
            text.contains("--bootstrap-kubeconfig needs --kubeconfig"),
            "{text}"
        );
        assert!(
            text.contains("serverTLSBootstrap needs an API server"),
            "{text}"
        );
    }

    #[test]
    fn an_unknown_wasmlet_field_is_an_error_when_strict() {
        let (_dir, flags) = flags_with_file("wasmlet:\n  restartBackof: {initial: 1s}\n");
        assert!(flags.clone().resolve().is_ok());
        let strict = NodeFlags {
            strict_config: true,
            ..flags
        };
        let text = strict.resolve().unwrap_err().0.join("\n");
        assert!(text.contains("restartBackof"), "{text}");
    }

    #[test]
    fn node_labels_follow_node_restriction() {
        for ok in [
            "example.com/tier",
            "tier",
            "node.kubernetes.io/role",
            "x.kubelet.kubernetes.io/y",
            "topology.kubernetes.io/zone",
        ] {
            assert!(node_label_allowed(ok), "{ok}");
        }
        for bad in [
            "node-role.kubernetes.io/worker",
            "kubernetes.io/custom",
            "example.k8s.io/x",
            "node-restriction.kubernetes.io/pool",
        ] {
            assert!(!node_label_allowed(bad), "{bad}");
        }
        let flags = NodeFlags {
            hostname_override: Some("n".into()),
            kubeconfig: Some("/k".into()),
            node_labels: vec!["node-role.kubernetes.io/worker=".into()],
            ..Default::default()
        };
        let err = flags.resolve().unwrap_err().0.join("\n");
        assert!(err.contains("NodeRestriction"), "{err}");
    }
}
