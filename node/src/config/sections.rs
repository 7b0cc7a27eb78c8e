//! [`NodeFlags::resolve`]'s sections: each resolves one part of the configuration from
//! the flags and the file, pushes what is wrong with it onto the one list of errors,
//! and returns a usable value (the default where a value is bad) so that the sections
//! after it still run and every problem is reported at once.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{
    CgroupSettings, ClusterSettings, ContainerLogSettings, CriSettings, KubeletConfiguration,
    LoadedFile, ManifestUrl, NodeFlags, WasmletSection, hostname, load_file, node_label_allowed,
    parse_taint,
};
use crate::duration;
use crate::pod::is_dns_subdomain;

/// Every duration the node is configured with.
pub(super) struct Timing {
    pub file_check_frequency: Duration,
    pub sync_frequency: Duration,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    pub housekeeping_interval: Duration,
    pub pleg_relist_period: Duration,
    pub http_check_frequency: Duration,
    pub status_update_frequency: Duration,
    pub status_report_frequency: Duration,
    pub runtime_request_timeout: Duration,
    pub volume_stats_agg_period: Duration,
}

/// Where the node's servers listen.
pub(super) struct Servers {
    pub address: IpAddr,
    pub read_only_port: u16,
    /// The authenticated node API's port, as reported in the Node.
    pub port: u16,
    pub healthz_bind_address: IpAddr,
    pub healthz_port: u16,
}

/// The program Wasm sandboxes run as, and its arguments.
pub(super) struct Sandbox {
    pub program: PathBuf,
    pub args: Vec<String>,
}

/// Every field of the kubelet's `KubeletConfiguration` (v1beta1, 1.33): a key among
/// them that wasmlet does not read is ignored with a note; any other key is a mistake.
const UPSTREAM_FIELDS: &[&str] = &[
    "enableServer",
    "staticPodPath",
    "podLogsDir",
    "syncFrequency",
    "fileCheckFrequency",
    "httpCheckFrequency",
    "staticPodURL",
    "staticPodURLHeader",
    "address",
    "port",
    "readOnlyPort",
    "tlsCertFile",
    "tlsPrivateKeyFile",
    "tlsCipherSuites",
    "tlsMinVersion",
    "rotateCertificates",
    "serverTLSBootstrap",
    "authentication",
    "authorization",
    "registryPullQPS",
    "registryBurst",
    "imagePullCredentialsVerificationPolicy",
    "preloadedImagesVerificationAllowlist",
    "eventRecordQPS",
    "eventBurst",
    "enableDebuggingHandlers",
    "enableContentionProfiling",
    "healthzPort",
    "healthzBindAddress",
    "oomScoreAdj",
    "clusterDomain",
    "clusterDNS",
    "streamingConnectionIdleTimeout",
    "nodeStatusUpdateFrequency",
    "nodeStatusReportFrequency",
    "nodeLeaseDurationSeconds",
    "imageMinimumGCAge",
    "imageMaximumGCAge",
    "imageGCHighThresholdPercent",
    "imageGCLowThresholdPercent",
    "volumeStatsAggPeriod",
    "kubeletCgroups",
    "systemCgroups",
    "cgroupRoot",
    "cgroupsPerQOS",
    "cgroupDriver",
    "cpuManagerPolicy",
    "singleProcessOOMKill",
    "cpuManagerPolicyOptions",
    "cpuManagerReconcilePeriod",
    "memoryManagerPolicy",
    "topologyManagerPolicy",
    "topologyManagerScope",
    "topologyManagerPolicyOptions",
    "qosReserved",
    "runtimeRequestTimeout",
    "hairpinMode",
    "maxPods",
    "podCIDR",
    "podPidsLimit",
    "resolvConf",
    "runOnce",
    "cpuCFSQuota",
    "cpuCFSQuotaPeriod",
    "nodeStatusMaxImages",
    "maxOpenFiles",
    "contentType",
    "kubeAPIQPS",
    "kubeAPIBurst",
    "serializeImagePulls",
    "maxParallelImagePulls",
    "evictionHard",
    "evictionSoft",
    "evictionSoftGracePeriod",
    "evictionPressureTransitionPeriod",
    "evictionMaxPodGracePeriod",
    "evictionMinimumReclaim",
    "mergeDefaultEvictionSettings",
    "podsPerCore",
    "enableControllerAttachDetach",
    "protectKernelDefaults",
    "makeIPTablesUtilChains",
    "iptablesMasqueradeBit",
    "iptablesDropBit",
    "featureGates",
    "failSwapOn",
    "memorySwap",
    "containerLogMaxSize",
    "containerLogMaxFiles",
    "containerLogMaxWorkers",
    "containerLogMonitorInterval",
    "configMapAndSecretChangeDetectionStrategy",
    "systemReserved",
    "kubeReserved",
    "reservedSystemCPUs",
    "showHiddenMetricsForVersion",
    "systemReservedCgroup",
    "kubeReservedCgroup",
    "enforceNodeAllocatable",
    "allowedUnsafeSysctls",
    "volumePluginDir",
    "providerID",
    "kernelMemcgNotification",
    "logging",
    "enableSystemLogHandler",
    "enableSystemLogQuery",
    "shutdownGracePeriod",
    "shutdownGracePeriodCriticalPods",
    "shutdownGracePeriodByPodPriority",
    "crashLoopBackOff",
    "reservedMemory",
    "enableProfilingHandler",
    "enableDebugFlagsHandler",
    "seccompDefault",
    "memoryThrottlingFactor",
    "registerWithTaints",
    "registerNode",
    "tracing",
    "localStorageCapacityIsolation",
    "containerRuntimeEndpoint",
    "imageServiceEndpoint",
    "failCgroupV1",
    "userNamespaces",
    "apiVersion",
    "kind",
];

/// The keys of wasmlet's own section (`wasmlet:`), for the hint when one is written
/// at the top level.
const WASMLET_FIELDS: &[&str] = &[
    "restartBackoff",
    "housekeepingInterval",
    "plegRelistPeriod",
    "evictionMonitoringPeriod",
    "imageGCPeriod",
    "runtimeHandlers",
    "plugins",
    "registryCertsDir",
    "insecureRegistries",
    "cniConfDir",
    "cniBinDir",
    "sysfsRoot",
    "deviceAdapterPeriod",
    "csiTimeout",
    "sandboxZygote",
];

/// Levenshtein distance, case-insensitive.
fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.to_lowercase().chars().collect();
    let b: Vec<char> = b.to_lowercase().chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// What an unknown top-level key probably meant: `wasmlet.<key>` for a key of
/// wasmlet's section, else the nearest KubeletConfiguration or wasmlet field.
pub(super) fn nearest_field(key: &str) -> Option<String> {
    if WASMLET_FIELDS.iter().any(|f| f.eq_ignore_ascii_case(key)) {
        return Some(format!("wasmlet.{key}"));
    }
    let candidates = UPSTREAM_FIELDS
        .iter()
        .map(|f| (f.to_string(), distance(key, f)))
        .chain(
            WASMLET_FIELDS
                .iter()
                .map(|f| (format!("wasmlet.{f}"), distance(key, f))),
        );
    candidates
        .filter(|(_, d)| *d <= (key.len() / 3).max(2))
        .min_by_key(|(_, d)| *d)
        .map(|(f, _)| f)
}

/// The file's header: the file read (a default one without `--config`) and its
/// `apiVersion` and `kind` checked. A KubeletConfiguration field wasmlet does not
/// use is noted; a key that is no field at all is a warning naming the field it
/// probably meant, or with `strict` an error.
pub(super) fn read_file(
    path: Option<&Path>,
    strict: bool,
    errors: &mut Vec<String>,
) -> KubeletConfiguration {
    let LoadedFile {
        file,
        ignored,
        deprecated_worlds,
    } = match path {
        Some(path) => load_file(path).unwrap_or_else(|e| {
            errors.push(e);
            LoadedFile::default()
        }),
        None => LoadedFile::default(),
    };
    if let Some(v) = &file.api_version
        && v != "kubelet.config.k8s.io/v1beta1"
    {
        errors.push(format!(
            "apiVersion: {v:?} is not kubelet.config.k8s.io/v1beta1"
        ));
    }
    if let Some(k) = &file.kind
        && k != "KubeletConfiguration"
    {
        errors.push(format!("kind: {k:?} is not KubeletConfiguration"));
    }
    let mut unknown = |message: String| {
        if strict {
            errors.push(message);
        } else {
            tracing::warn!("config: {message} (ignored; --strict-config makes this an error)");
        }
    };
    for key in file.other.keys() {
        if UPSTREAM_FIELDS.contains(&key.as_str()) {
            tracing::info!(
                "config: ignoring KubeletConfiguration field {key:?}, which wasmlet does not use"
            );
            continue;
        }
        let hint = match nearest_field(key) {
            Some(f) => format!("; did you mean {f:?}?"),
            None => String::new(),
        };
        unknown(format!("unknown KubeletConfiguration field {key:?}{hint}"));
    }
    for path in ignored {
        let hint = match nearest_nested(&path) {
            Some(f) => format!("; did you mean {f:?}?"),
            None => String::new(),
        };
        unknown(format!("unknown field {path:?}{hint}"));
    }
    for (path, alias) in deprecated_worlds {
        if let Some(world) = wasmlet_plugin_host::World::from_deprecated_alias(&alias) {
            tracing::warn!(
                "config: {path}: {alias:?} is the deprecated name of {:?}, the WIT world's name",
                world.as_str()
            );
        }
    }
    file
}

/// The key a nested unknown key (`wasmlet.plugins.0.limit`) probably meant, among
/// the keys of its own section: `wasmlet.plugins.0.limits`.
pub(super) fn nearest_nested(path: &str) -> Option<String> {
    use wasmlet_plugin_host::config::{
        FILESYSTEM_GRANT_KEYS, GRANTS_KEYS, LIMITS_KEYS, PLUGIN_KEYS,
    };
    let (parent, key) = path.rsplit_once('.')?;
    let parts: Vec<&str> = parent.split('.').collect();
    let index = |p: &str| p.parse::<usize>().is_ok();
    let known: &[&str] = match parts[..] {
        ["wasmlet"] => WASMLET_FIELDS,
        ["wasmlet", "restartBackoff"] => &["initial", "max"],
        ["wasmlet", "plugins", i] if index(i) => PLUGIN_KEYS,
        ["wasmlet", "plugins", i, "limits"] if index(i) => LIMITS_KEYS,
        ["wasmlet", "plugins", i, "grants"] if index(i) => GRANTS_KEYS,
        ["wasmlet", "plugins", i, "grants", "filesystem", j] if index(i) && index(j) => {
            FILESYSTEM_GRANT_KEYS
        }
        _ => return None,
    };
    known
        .iter()
        .map(|f| (*f, distance(key, f)))
        .filter(|(_, d)| *d <= (key.len() / 3).max(2))
        .min_by_key(|(_, d)| *d)
        .map(|(f, _)| format!("{parent}.{f}"))
}

/// A duration: the flag's, else the file's, else `default` (also when it is bad).
pub(super) fn duration_of(
    errors: &mut Vec<String>,
    name: &str,
    value: Option<&String>,
    default: Duration,
) -> Duration {
    match value {
        None => default,
        Some(s) => duration::parse(s).unwrap_or_else(|e| {
            errors.push(format!("{name}: {e}"));
            default
        }),
    }
}

/// A port: the flag's, else the file's, else `default` (also when it is out of range).
fn port_of(
    errors: &mut Vec<String>,
    name: &str,
    flag: Option<u16>,
    field: Option<i64>,
    default: u16,
) -> u16 {
    match (flag, field) {
        (Some(p), _) => p,
        (None, None) => default,
        (None, Some(p)) => u16::try_from(p).unwrap_or_else(|_| {
            errors.push(format!("{name}: {p} is not a port number (0-65535)"));
            default
        }),
    }
}

/// An IP address: the flag's, else the file's, else `default` (also when it is bad).
fn ip_of(
    errors: &mut Vec<String>,
    name: &str,
    flag: Option<IpAddr>,
    field: Option<&str>,
    default: &str,
) -> IpAddr {
    flag.unwrap_or_else(|| {
        let s = field.unwrap_or(default);
        s.parse().unwrap_or_else(|_| {
            errors.push(format!("{name}: {s:?} is not an IP address"));
            default.parse().expect("default IPs parse")
        })
    })
}

impl NodeFlags {
    /// Image pulls: `serializeImagePulls` (default true unless
    /// `maxParallelImagePulls` is 2 or more), `maxParallelImagePulls`,
    /// `registryPullQPS` and `registryBurst`; flags win.
    pub(super) fn pulls(
        &self,
        file: &KubeletConfiguration,
        errors: &mut Vec<String>,
    ) -> crate::images::puller::PullSettings {
        let d = crate::images::puller::PullSettings::default();
        let max_parallel = file.max_parallel_image_pulls.map(|n| n.max(0) as usize);
        if file.max_parallel_image_pulls.is_some_and(|n| n < 1) {
            errors.push(format!(
                "maxParallelImagePulls {} must be a positive number",
                file.max_parallel_image_pulls.unwrap_or_default()
            ));
        }
        let burst = self.registry_burst.or(file.registry_burst);
        if burst.is_some_and(|b| b < 0) {
            errors.push(format!(
                "registryBurst (--registry-burst) {} must not be a negative number",
                burst.unwrap_or_default()
            ));
        }
        let settings = crate::images::puller::PullSettings {
            serialize: self
                .serialize_image_pulls
                .or(file.serialize_image_pulls)
                .unwrap_or(max_parallel.is_none_or(|n| n < 2)),
            max_parallel: max_parallel.filter(|n| *n >= 1),
            qps: self
                .registry_qps
                .or(file.registry_pull_qps)
                .unwrap_or(d.qps),
            burst: burst
                .map(|b| b.clamp(0, i64::from(u32::MAX)) as u32)
                .unwrap_or(d.burst),
        };
        settings.check(errors);
        settings
    }

    /// The credential provider plugins of `--image-credential-provider-config` and
    /// `--image-credential-provider-bin-dir` (both or neither), validated.
    pub(super) fn credential_providers(
        &self,
        errors: &mut Vec<String>,
    ) -> Vec<crate::images::providers::Provider> {
        match (
            &self.image_credential_provider_config,
            &self.image_credential_provider_bin_dir,
        ) {
            (None, None) => Vec::new(),
            (Some(config), Some(bin_dir)) => crate::images::providers::load(config, bin_dir)
                .unwrap_or_else(|e| {
                    errors.extend(e);
                    Vec::new()
                }),
            _ => {
                errors.push(
                    "--image-credential-provider-config and --image-credential-provider-bin-dir                      go together"
                        .into(),
                );
                Vec::new()
            }
        }
    }

    /// The pod network of Wasm pods: `--cni-conf-dir` and `--cni-bin-dir` (the
    /// kubelet's flags of its built-in CNI days), or `wasmlet.cniConfDir` and
    /// `wasmlet.cniBinDir`, else their defaults.
    pub(super) fn network(
        &self,
        section: &WasmletSection,
    ) -> wasmlet_runtime_wasm::network::NetworkSettings {
        let default = wasmlet_runtime_wasm::network::NetworkSettings::default();
        wasmlet_runtime_wasm::network::NetworkSettings {
            conf_dir: self
                .cni_conf_dir
                .clone()
                .or_else(|| section.cni_conf_dir.clone())
                .unwrap_or(default.conf_dir),
            bin_dirs: Some(self.cni_bin_dir.clone())
                .filter(|d| !d.is_empty())
                .or_else(|| section.cni_bin_dir.clone())
                .unwrap_or(default.bin_dirs),
            netns_dir: default.netns_dir,
        }
    }

    /// Container GC's policy, from the kubelet's flags of the same names (no
    /// `KubeletConfiguration` field has it).
    pub(super) fn container_gc(
        &self,
        errors: &mut Vec<String>,
    ) -> crate::kuberuntime::gc::ContainerGcPolicy {
        let default = crate::kuberuntime::gc::ContainerGcPolicy::default();
        crate::kuberuntime::gc::ContainerGcPolicy {
            min_age: duration_of(
                errors,
                "--minimum-container-ttl-duration",
                self.minimum_container_ttl_duration.as_ref(),
                default.min_age,
            ),
            max_per_pod_container: self
                .maximum_dead_containers_per_container
                .unwrap_or(default.max_per_pod_container),
            max_containers: self
                .maximum_dead_containers
                .unwrap_or(default.max_containers),
        }
    }

    pub(super) fn timing(
        &self,
        file: &KubeletConfiguration,
        section: &WasmletSection,
        errors: &mut Vec<String>,
    ) -> Timing {
        let either = |flag: &Option<String>, field: &Option<String>| -> Option<String> {
            flag.as_ref().or(field.as_ref()).cloned()
        };
        let backoff = section.restart_backoff.as_ref();
        let mut dur = |name: &str, value: Option<String>, default: u64| {
            duration_of(errors, name, value.as_ref(), Duration::from_secs(default))
        };
        Timing {
            file_check_frequency: dur(
                "fileCheckFrequency",
                either(&self.file_check_frequency, &file.file_check_frequency),
                20,
            ),
            sync_frequency: dur(
                "syncFrequency",
                either(&self.sync_frequency, &file.sync_frequency),
                60,
            ),
            backoff_initial: dur(
                "wasmlet.restartBackoff.initial",
                backoff.and_then(|b| b.initial.clone()),
                10,
            ),
            backoff_max: dur(
                "wasmlet.restartBackoff.max",
                backoff.and_then(|b| b.max.clone()),
                300,
            ),
            housekeeping_interval: dur(
                "wasmlet.housekeepingInterval",
                section.housekeeping_interval.clone(),
                2,
            ),
            pleg_relist_period: dur(
                "wasmlet.plegRelistPeriod",
                section.pleg_relist_period.clone(),
                1,
            ),
            http_check_frequency: dur(
                "httpCheckFrequency",
                either(&self.http_check_frequency, &file.http_check_frequency),
                20,
            ),
            status_update_frequency: dur(
                "nodeStatusUpdateFrequency",
                file.node_status_update_frequency.clone(),
                10,
            ),
            status_report_frequency: dur(
                "nodeStatusReportFrequency",
                file.node_status_report_frequency.clone(),
                300,
            ),
            runtime_request_timeout: dur(
                "runtimeRequestTimeout",
                either(&self.runtime_request_timeout, &file.runtime_request_timeout),
                120,
            ),
            volume_stats_agg_period: dur(
                "volumeStatsAggPeriod",
                file.volume_stats_agg_period.clone(),
                60,
            ),
        }
    }

    /// Servers and ports: the read-only port, the node API's port and the healthz
    /// port, and the addresses they bind to.
    pub(super) fn servers(&self, file: &KubeletConfiguration, errors: &mut Vec<String>) -> Servers {
        let read_only_port = port_of(
            errors,
            "readOnlyPort",
            self.read_only_port,
            file.read_only_port,
            0,
        );
        let port = port_of(errors, "port", self.port, file.port, 10250);
        let healthz_port = port_of(
            errors,
            "healthzPort",
            self.healthz_port,
            file.healthz_port,
            10248,
        );
        let address = ip_of(
            errors,
            "address",
            self.address,
            file.address.as_deref(),
            "0.0.0.0",
        );
        let healthz_bind_address = ip_of(
            errors,
            "healthzBindAddress",
            self.healthz_bind_address,
            file.healthz_bind_address.as_deref(),
            "127.0.0.1",
        );
        Servers {
            address,
            read_only_port,
            port,
            healthz_bind_address,
            healthz_port,
        }
    }

    /// cgroups: the QoS and pod cgroup hierarchy (`cgroupsPerQOS`, on by default),
    /// its driver and root, CFS quota, PID limit and what it enforces.
    pub(super) fn cgroups(
        &self,
        file: &KubeletConfiguration,
        errors: &mut Vec<String>,
    ) -> Option<CgroupSettings> {
        if !self
            .cgroups_per_qos
            .or(file.cgroups_per_qos)
            .unwrap_or(true)
        {
            return None;
        }
        let driver_name = self
            .cgroup_driver
            .clone()
            .or(file.cgroup_driver.clone())
            .unwrap_or_else(|| "cgroupfs".into());
        let driver = driver_name.parse().unwrap_or_else(|_| {
            errors.push(format!(
                "cgroupDriver: {driver_name:?} is neither cgroupfs nor systemd"
            ));
            crate::cm::cgroup::Driver::Cgroupfs
        });
        let root = self
            .cgroup_root
            .clone()
            .or(file.cgroup_root.clone())
            .filter(|r| !r.is_empty())
            .unwrap_or_else(|| "/".into());
        if !root.starts_with('/') {
            errors.push(format!(
                "cgroupRoot: {root:?} is not an absolute cgroup path"
            ));
        }
        let period = match file.cpu_cfs_quota_period.as_deref().map(duration::parse) {
            None => Duration::from_millis(100),
            Some(Ok(d)) if d >= Duration::from_millis(1) && d <= Duration::from_secs(1) => d,
            Some(_) => {
                errors.push("cpuCFSQuotaPeriod: must be between 1ms and 1s".into());
                Duration::from_millis(100)
            }
        };
        let enforce = file
            .enforce_node_allocatable
            .clone()
            .unwrap_or_else(|| vec!["pods".into()]);
        for e in &enforce {
            if !matches!(
                e.as_str(),
                "pods" | "none" | "system-reserved" | "kube-reserved"
            ) {
                errors.push(format!("enforceNodeAllocatable: {e:?} is not pods, system-reserved, kube-reserved or none"));
            }
        }
        Some(CgroupSettings {
            driver,
            root,
            cpu_cfs_quota: file.cpu_cfs_quota.unwrap_or(true),
            cpu_cfs_quota_period: period,
            pod_pids_limit: file.pod_pids_limit.filter(|n| *n > 0),
            enforce_node_allocatable: enforce,
        })
    }

    /// The node's name: `--hostname-override`, else the hostname, lower-cased; it
    /// must be a DNS subdomain.
    pub(super) fn node_name(&self, errors: &mut Vec<String>) -> String {
        let node_name = match &self.hostname_override {
            Some(n) => n.trim().to_lowercase(),
            None => hostname().to_lowercase(),
        };
        if node_name.is_empty() || !is_dns_subdomain(&node_name) {
            errors.push(format!(
                "node name {node_name:?} is not a valid DNS subdomain (use --hostname-override)"
            ));
        }
        node_name
    }

    /// Runtimes: the CRI runtime's endpoints, when one is configured.
    pub(super) fn cri(
        &self,
        file: &KubeletConfiguration,
        request_timeout: Duration,
    ) -> Option<CriSettings> {
        self.container_runtime_endpoint
            .clone()
            .or(file.container_runtime_endpoint.clone())
            .filter(|e| !e.trim().is_empty())
            .map(|runtime_endpoint| CriSettings {
                runtime_endpoint,
                image_endpoint: self
                    .image_service_endpoint
                    .clone()
                    .or(file.image_service_endpoint.clone())
                    .filter(|e| !e.trim().is_empty()),
                request_timeout,
            })
    }

    /// Runtimes: the program Wasm sandboxes run as (this binary's `sandbox` command
    /// unless `--sandbox-program` names another).
    pub(super) fn sandbox(&self, errors: &mut Vec<String>) -> Sandbox {
        match &self.sandbox_program {
            Some(p) => Sandbox {
                program: p.clone(),
                args: Vec::new(),
            },
            None => Sandbox {
                program: std::env::current_exe().unwrap_or_else(|e| {
                    errors.push(format!("cannot find the wasmlet binary for sandboxes: {e}"));
                    PathBuf::new()
                }),
                args: vec!["sandbox".to_owned()],
            },
        }
    }

    /// Cluster and registration, with a kubeconfig: the labels, taints and IPs the
    /// node registers with, how often it reports its status, and its lease.
    pub(super) fn cluster(
        &self,
        file: &KubeletConfiguration,
        timing: &Timing,
        errors: &mut Vec<String>,
    ) -> Option<ClusterSettings> {
        let Some(kubeconfig) = self.kubeconfig.clone() else {
            if self.bootstrap_kubeconfig.is_some() {
                errors.push(
                    "--bootstrap-kubeconfig needs --kubeconfig, the file it writes".to_owned(),
                );
            }
            if file.server_tls_bootstrap == Some(true) {
                errors.push("serverTLSBootstrap needs an API server (--kubeconfig)".to_owned());
            }
            return None;
        };
        let node_labels = self.node_labels(errors);
        let mut taints = file.register_with_taints.clone().unwrap_or_default();
        for t in &self.register_with_taints {
            match parse_taint(t) {
                Ok(t) => taints.push(t),
                Err(e) => errors.push(format!("--register-with-taints: {e}")),
            }
        }
        let mut families = std::collections::HashSet::new();
        for ip in &self.node_ip {
            if !families.insert(ip.is_ipv4()) {
                errors.push(format!(
                    "--node-ip: at most one address per family ({ip} is a second one)"
                ));
            }
        }
        let lease_duration_seconds = match file.node_lease_duration_seconds {
            None => 40,
            Some(n) if n > 0 && n <= i32::MAX as i64 => n as i32,
            Some(n) => {
                errors.push(format!("nodeLeaseDurationSeconds: {n} must be positive"));
                40
            }
        };
        if timing.status_report_frequency < timing.status_update_frequency {
            errors.push(format!(
                "nodeStatusReportFrequency ({}) is less than nodeStatusUpdateFrequency ({})",
                duration::format(timing.status_report_frequency),
                duration::format(timing.status_update_frequency)
            ));
        }
        Some(ClusterSettings {
            kubeconfig,
            register_node: self.register_node.or(file.register_node).unwrap_or(true),
            node_labels,
            taints,
            node_ips: self.node_ip.clone(),
            status_update_frequency: timing.status_update_frequency,
            status_report_frequency: timing.status_report_frequency,
            lease_duration_seconds,
            certificates: super::CertificateSettings {
                bootstrap_kubeconfig: self.bootstrap_kubeconfig.clone(),
                rotate_certificates: self
                    .rotate_certificates
                    .or(file.rotate_certificates)
                    .unwrap_or(false),
                server_tls_bootstrap: file.server_tls_bootstrap.unwrap_or(false),
            },
        })
    }

    /// `--node-labels`, as `key=value`, within what NodeRestriction lets a node set.
    fn node_labels(&self, errors: &mut Vec<String>) -> BTreeMap<String, String> {
        let mut node_labels = BTreeMap::new();
        for label in &self.node_labels {
            match label.split_once('=') {
                Some((k, _)) if !node_label_allowed(k.trim()) => errors.push(format!(
                    "--node-labels: {k:?} is in a kubernetes.io or k8s.io namespace a node may not set on itself (NodeRestriction); allowed there: kubelet.kubernetes.io/*, node.kubernetes.io/* and the kubelet's own labels"
                )),
                Some((k, v)) if !k.trim().is_empty() => {
                    node_labels.insert(k.trim().to_owned(), v.trim().to_owned());
                }
                _ => errors.push(format!("--node-labels: {label:?} is not key=value")),
            }
        }
        node_labels
    }

    /// Sources: the HTTP static pod source (`--manifest-url` or `staticPodURL`), with
    /// its headers.
    pub(super) fn manifest_url(
        &self,
        file: &KubeletConfiguration,
        check_frequency: Duration,
        errors: &mut Vec<String>,
    ) -> Option<ManifestUrl> {
        let url = self
            .manifest_url
            .clone()
            .or(file.static_pod_url.clone())
            .filter(|u| !u.trim().is_empty())?;
        let mut headers = Vec::new();
        for (k, values) in file.static_pod_url_header.iter().flatten() {
            for v in values {
                headers.push((k.clone(), v.clone()));
            }
        }
        for h in &self.manifest_url_header {
            match h.split_once(':') {
                Some((k, v)) if !k.trim().is_empty() => {
                    headers.push((k.trim().to_owned(), v.trim().to_owned()))
                }
                _ => errors.push(format!("--manifest-url-header: {h:?} is not key:value")),
            }
        }
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            errors.push(format!("manifest URL {url:?} is not an http(s) URL"));
        }
        Some(ManifestUrl {
            url,
            headers,
            check_frequency,
        })
    }
}

impl Timing {
    /// Timing: the frequencies and periods are more than zero, and the restart
    /// back-off's maximum is not less than its first delay.
    pub(super) fn check(&self, errors: &mut Vec<String>) {
        for (name, d) in [
            ("httpCheckFrequency", self.http_check_frequency),
            ("nodeStatusUpdateFrequency", self.status_update_frequency),
            ("fileCheckFrequency", self.file_check_frequency),
            ("syncFrequency", self.sync_frequency),
            ("wasmlet.housekeepingInterval", self.housekeeping_interval),
            ("wasmlet.plegRelistPeriod", self.pleg_relist_period),
            ("wasmlet.restartBackoff.initial", self.backoff_initial),
        ] {
            if d.is_zero() {
                errors.push(format!("{name}: must be greater than zero"));
            }
        }
        if self.backoff_max < self.backoff_initial {
            errors.push(format!(
                "wasmlet.restartBackoff.max ({}) is less than initial ({})",
                duration::format(self.backoff_max),
                duration::format(self.backoff_initial)
            ));
        }
    }
}

/// Resources: `maxPods`, positive, 110 by default.
pub(super) fn max_pods(file: &KubeletConfiguration, errors: &mut Vec<String>) -> u32 {
    match file.max_pods {
        None => 110,
        Some(n) if n > 0 && n <= u32::MAX as i64 => n as u32,
        Some(n) => {
            errors.push(format!("maxPods: {n} must be positive"));
            110
        }
    }
}

/// Pods' DNS: `clusterDNS` (IP addresses), `clusterDomain` and `resolvConf` (the
/// kubelet's default; an empty string means no host configuration).
pub(super) fn cluster_dns(
    file: &KubeletConfiguration,
    errors: &mut Vec<String>,
) -> crate::podspec::ClusterDns {
    let mut servers = Vec::new();
    for server in file.cluster_dns.iter().flatten() {
        match server.parse::<IpAddr>() {
            Ok(_) => servers.push(server.clone()),
            Err(_) => errors.push(format!("clusterDNS: {server:?} is not an IP address")),
        }
    }
    crate::podspec::ClusterDns {
        servers,
        domain: file
            .cluster_domain
            .clone()
            .unwrap_or_default()
            .trim_end_matches('.')
            .to_owned(),
        resolv_conf: match file.resolv_conf.as_deref() {
            None => Some(crate::podspec::default_resolv_conf().to_owned()),
            Some("") => None,
            Some(path) => Some(PathBuf::from(path)),
        },
    }
}

/// Resources: `kubeReserved`, `systemReserved` (quantities) and `evictionHard`
/// (which, when set, replaces the defaults, as in the kubelet).
pub(super) fn reservations(
    file: &KubeletConfiguration,
    errors: &mut Vec<String>,
) -> crate::allocatable::Reservations {
    let mut reserved = |what: &str, map: &Option<BTreeMap<String, String>>| {
        let mut out = BTreeMap::new();
        for (name, value) in map.iter().flatten() {
            let q = k8s_openapi::apimachinery::pkg::api::resource::Quantity(value.clone());
            match crate::quantity::parse(&q) {
                Ok(v) if v >= 0.0 => {
                    out.insert(name.clone(), q);
                }
                _ => errors.push(format!("{what}.{name}: {value:?} is not a quantity")),
            }
        }
        out
    };
    let kube_reserved = reserved("kubeReserved", &file.kube_reserved);
    let system_reserved = reserved("systemReserved", &file.system_reserved);
    let eviction_hard = match &file.eviction_hard {
        Some(map) => {
            crate::allocatable::parse_thresholds("evictionHard", map).unwrap_or_else(|e| {
                errors.extend(e);
                Default::default()
            })
        }
        None => crate::allocatable::default_eviction_hard(),
    };
    crate::allocatable::Reservations {
        kube_reserved,
        system_reserved,
        eviction_hard,
    }
}

/// The eviction manager's settings (the kubelet's `ParseThresholdConfig`): the hard
/// thresholds already read into `reservations`, the soft ones, their grace periods and
/// minimum reclaims, and the timings.
pub(super) fn eviction(
    file: &KubeletConfiguration,
    section: &WasmletSection,
    reservations: &crate::allocatable::Reservations,
    cgroups: Option<&CgroupSettings>,
    errors: &mut Vec<String>,
) -> crate::thresholds::EvictionConfig {
    let fields = crate::thresholds::EvictionFields {
        hard: Some(&reservations.eviction_hard),
        soft: file.eviction_soft.as_ref(),
        soft_grace_period: file.eviction_soft_grace_period.as_ref(),
        minimum_reclaim: file.eviction_minimum_reclaim.as_ref(),
        max_pod_grace_period: file.eviction_max_pod_grace_period,
        pressure_transition_period: file.eviction_pressure_transition_period.as_ref(),
        monitoring_period: section.eviction_monitoring_period.as_ref(),
        allocatable_pods: cgroups
            .is_some_and(|c| c.enforce_node_allocatable.iter().any(|e| e == "pods")),
    };
    let mut config = crate::thresholds::eviction_config(fields, errors);
    config.memcg_notification = file.kernel_memcg_notification.unwrap_or(true);
    config
}

/// Image GC: `imageGCHighThresholdPercent`, `imageGCLowThresholdPercent`,
/// `imageMinimumGCAge`, `imageMaximumGCAge`, and `wasmlet.imageGCPeriod`.
pub(super) fn image_gc(
    file: &KubeletConfiguration,
    section: &WasmletSection,
    errors: &mut Vec<String>,
) -> crate::images::ImageGcPolicy {
    let d = crate::images::ImageGcPolicy::default();
    let mut percent = |name: &str, v: Option<i64>, default: u8| match v {
        None => default,
        Some(p @ 0..=100) => p as u8,
        Some(p) => {
            errors.push(format!("{name}: {p} is not between 0 and 100"));
            default
        }
    };
    let high = percent(
        "imageGCHighThresholdPercent",
        file.image_gc_high_threshold_percent,
        d.high_threshold_percent,
    );
    let low = percent(
        "imageGCLowThresholdPercent",
        file.image_gc_low_threshold_percent,
        d.low_threshold_percent,
    );
    let policy = crate::images::ImageGcPolicy {
        high_threshold_percent: high,
        low_threshold_percent: low,
        min_age: duration_of(
            errors,
            "imageMinimumGCAge",
            file.image_minimum_gc_age.as_ref(),
            d.min_age,
        ),
        max_age: duration_of(
            errors,
            "imageMaximumGCAge",
            file.image_maximum_gc_age.as_ref(),
            d.max_age,
        ),
        period: duration_of(
            errors,
            "wasmlet.imageGCPeriod",
            section.image_gc_period.as_ref(),
            d.period,
        ),
    };
    if let Err(e) = policy.check() {
        errors.push(e);
    }
    if policy.period.is_zero() {
        errors.push("wasmlet.imageGCPeriod: must be above zero".into());
    }
    policy
}

/// One entry of `shutdownGracePeriodByPodPriority`.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ShutdownGracePeriodByPodPriority {
    priority: i32,
    shutdown_grace_period_seconds: i64,
}

/// Graceful node shutdown: `shutdownGracePeriod`, `shutdownGracePeriodCriticalPods`
/// and `shutdownGracePeriodByPodPriority`, with the kubelet's validation.
pub(super) fn shutdown(
    file: &KubeletConfiguration,
    errors: &mut Vec<String>,
) -> crate::shutdown::ShutdownConfig {
    let config = crate::shutdown::ShutdownConfig {
        grace_period: duration_of(
            errors,
            "shutdownGracePeriod",
            file.shutdown_grace_period.as_ref(),
            Duration::ZERO,
        ),
        grace_period_critical_pods: duration_of(
            errors,
            "shutdownGracePeriodCriticalPods",
            file.shutdown_grace_period_critical_pods.as_ref(),
            Duration::ZERO,
        ),
        by_pod_priority: file
            .shutdown_grace_period_by_pod_priority
            .iter()
            .flatten()
            .map(|g| crate::shutdown::PriorityGrace {
                priority: g.priority,
                grace_seconds: g.shutdown_grace_period_seconds,
            })
            .collect(),
    };
    if let Err(e) = config.check() {
        errors.push(e);
    }
    config
}

/// The topology manager (`topologyManagerPolicy`, `topologyManagerScope`,
/// `topologyManagerPolicyOptions`, the kubelet's defaults `none` and `container`),
/// and where the machine's topology is read.
pub(super) fn devices(
    file: &KubeletConfiguration,
    section: &WasmletSection,
    errors: &mut Vec<String>,
) -> super::DeviceSettings {
    use crate::cm::topologymanager::{Config, Policy, PolicyOptions, Scope};
    let policy = match file.topology_manager_policy.as_deref() {
        None => Policy::None,
        Some(name) => Policy::parse(name).unwrap_or_else(|e| {
            errors.push(format!("topologyManagerPolicy: {e}"));
            Policy::None
        }),
    };
    let scope = match file.topology_manager_scope.as_deref() {
        None => Scope::Container,
        Some(name) => Scope::parse(name).unwrap_or_else(|e| {
            errors.push(format!("topologyManagerScope: {e}"));
            Scope::Container
        }),
    };
    let options = match &file.topology_manager_policy_options {
        None => PolicyOptions::default(),
        Some(map) => PolicyOptions::parse(map).unwrap_or_else(|e| {
            errors.push(format!("topologyManagerPolicyOptions: {e}"));
            PolicyOptions::default()
        }),
    };
    let cpu_manager_static = match file.cpu_manager_policy.as_deref() {
        None | Some("none") => false,
        Some("static") => true,
        Some(other) => {
            errors.push(format!(
                "cpuManagerPolicy: unknown policy {other:?} (none, static)"
            ));
            false
        }
    };
    let reserved_system_cpus = file.reserved_system_cpus.as_deref().and_then(|s| {
        s.parse::<crate::cm::cpuset::CpuSet>()
            .map_err(|e| errors.push(format!("reservedSystemCPUs: {e}")))
            .ok()
    });
    super::DeviceSettings {
        cpu_manager_static,
        reserved_system_cpus,
        topology: Config {
            policy,
            scope,
            options,
        },
        sysfs_root: section
            .sysfs_root
            .clone()
            .unwrap_or_else(|| std::path::PathBuf::from("/sys")),
        adapter_period: duration_of(
            errors,
            "wasmlet.deviceAdapterPeriod",
            section.device_adapter_period.as_ref(),
            Duration::from_secs(10),
        ),
    }
}

/// wasmlet's own section: its plugins (validated) and its RuntimeClass handlers
/// (`wasmtime` always; any other needs a CRI runtime).
pub(super) fn wasmlet_section(
    section: WasmletSection,
    has_cri: bool,
    errors: &mut Vec<String>,
) -> (
    Vec<wasmlet_plugin_host::PluginConfig>,
    BTreeMap<String, String>,
) {
    let plugins = section.plugins;
    for e in wasmlet_plugin_host::validate_plugins(
        &plugins,
        wasmlet_plugin_host::HostOptions::default().max_memory_bytes,
    ) {
        errors.push(format!("wasmlet.plugins: {e}"));
    }
    let mut runtime_handlers = section.runtime_handlers.unwrap_or_default();
    runtime_handlers
        .entry(wasmlet_runtime_wasm::HANDLER.to_owned())
        .or_insert_with(|| wasmlet_runtime_wasm::HANDLER.to_owned());
    for (class, handler) in &runtime_handlers {
        if handler != wasmlet_runtime_wasm::HANDLER && !has_cri {
            errors.push(format!(
                "wasmlet.runtimeHandlers.{class}: handler {handler:?} needs a CRI runtime, which this node does not have configured"
            ));
        }
    }
    (plugins, runtime_handlers)
}

/// Container log rotation, with the kubelet's defaults (`10Mi`, 5 files, every 10s, one
/// worker) and its bounds: at least 2 files, an interval of at least 3s, one worker or
/// more. A negative size turns rotation off, as in the kubelet.
pub(super) fn container_logs(
    file: &KubeletConfiguration,
    errors: &mut Vec<String>,
) -> ContainerLogSettings {
    let max_size = match file.container_log_max_size.as_deref() {
        None => Some(10 << 20),
        Some(s) => {
            let q = k8s_openapi::apimachinery::pkg::api::resource::Quantity(s.to_owned());
            match crate::quantity::parse(&q) {
                Ok(v) if v < 0.0 => None,
                Ok(v) if v.fract() == 0.0 && v <= i64::MAX as f64 => Some(v as u64),
                _ => {
                    errors.push(format!(
                        "containerLogMaxSize: {s:?} is not a whole quantity of bytes"
                    ));
                    Some(10 << 20)
                }
            }
        }
    };
    let max_files = match file.container_log_max_files {
        None => 5,
        Some(n) if n > 1 && n <= u32::MAX as i64 => n as usize,
        Some(n) => {
            errors.push(format!("containerLogMaxFiles: {n} must be greater than 1"));
            5
        }
    };
    let monitor_interval = duration_of(
        errors,
        "containerLogMonitorInterval",
        file.container_log_monitor_interval.as_ref(),
        Duration::from_secs(10),
    );
    let monitor_interval = if monitor_interval < Duration::from_secs(3) {
        errors.push(format!(
            "containerLogMonitorInterval: {} must be at least 3s",
            duration::format(monitor_interval)
        ));
        Duration::from_secs(10)
    } else {
        monitor_interval
    };
    let max_workers = match file.container_log_max_workers {
        None => 1,
        Some(n) if n >= 1 && n <= u32::MAX as i64 => n as usize,
        Some(n) => {
            errors.push(format!(
                "containerLogMaxWorkers: {n} must be greater than or equal to 1"
            ));
            1
        }
    };
    ContainerLogSettings {
        max_size,
        max_files,
        monitor_interval,
        max_workers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logs_of(yaml: &str) -> (ContainerLogSettings, Vec<String>) {
        let file: KubeletConfiguration = serde_saphyr::from_str(yaml).unwrap();
        let mut errors = Vec::new();
        (container_logs(&file, &mut errors), errors)
    }

    #[test]
    fn container_log_rotation_has_the_kubelets_defaults() {
        let (logs, errors) = logs_of("kind: KubeletConfiguration\n");
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            logs,
            ContainerLogSettings {
                max_size: Some(10 * 1024 * 1024),
                max_files: 5,
                monitor_interval: Duration::from_secs(10),
                max_workers: 1,
            }
        );
    }

    #[test]
    fn container_log_rotation_reads_its_fields_and_a_negative_size_turns_it_off() {
        let (logs, errors) = logs_of(
            "containerLogMaxSize: 2Ki\n\
             containerLogMaxFiles: 3\n\
             containerLogMonitorInterval: 3s\n\
             containerLogMaxWorkers: 4\n",
        );
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(logs.max_size, Some(2048));
        assert_eq!(logs.max_files, 3);
        assert_eq!(logs.monitor_interval, Duration::from_secs(3));
        assert_eq!(logs.max_workers, 4);
        let (off, errors) = logs_of("containerLogMaxSize: \"-1\"\n");
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(off.max_size, None);
    }

    #[test]
    fn bad_container_log_values_are_all_reported() {
        let (logs, errors) = logs_of(
            "containerLogMaxSize: lots\n\
             containerLogMaxFiles: 1\n\
             containerLogMonitorInterval: 2s\n\
             containerLogMaxWorkers: 0\n",
        );
        assert_eq!(errors.len(), 4, "{errors:?}");
        for (error, field) in errors.iter().zip([
            "containerLogMaxSize",
            "containerLogMaxFiles",
            "containerLogMonitorInterval",
            "containerLogMaxWorkers",
        ]) {
            assert!(error.starts_with(field), "{error}");
        }
        assert_eq!(logs.max_files, 5, "the default where a value is bad");
    }
}
