//! `/configz`: the configuration the node runs with, as the kubelet serves it
//! (`{"kubeletconfig": {...}}`, the `KubeletConfiguration` fields by their JSON names,
//! durations in Go's format). Only the fields wasmlet reads are there; wasmlet's own
//! are under `wasmlet`. No secret is in a node's configuration: file paths only.

use serde_json::{Map, Value, json};

use crate::config::{AuthzMode, NodeConfig};
use crate::duration::format as go;

/// The body of `/configz`.
pub fn configz(config: &NodeConfig) -> Value {
    let mut c = Map::new();
    let mut put = |key: &str, value: Value| {
        c.insert(key.to_owned(), value);
    };
    let path = |p: &std::path::Path| json!(p.display().to_string());
    put("enableServer", json!(true));
    put(
        "enableSystemLogHandler",
        json!(config.node_api.system_log_handler),
    );
    put(
        "enableDebuggingHandlers",
        json!(config.node_api.debugging_handlers),
    );
    put(
        "streamingConnectionIdleTimeout",
        json!(go(config.node_api.streaming_idle_timeout)),
    );
    if let Some(p) = &config.static_pod_path {
        put("staticPodPath", path(p));
    }
    put("podLogsDir", path(&config.pod_logs_dir));
    put("syncFrequency", json!(go(config.sync_frequency)));
    put("fileCheckFrequency", json!(go(config.file_check_frequency)));
    if let Some(m) = &config.manifest_url {
        put("staticPodURL", json!(m.url));
        put("httpCheckFrequency", json!(go(m.check_frequency)));
    }
    put("address", json!(config.address.to_string()));
    put("port", json!(config.port));
    put("readOnlyPort", json!(config.read_only_port));
    put("healthzPort", json!(config.healthz_port));
    put(
        "healthzBindAddress",
        json!(config.healthz_bind_address.to_string()),
    );
    let api = &config.node_api;
    if let Some(p) = &api.tls.cert_file {
        put("tlsCertFile", path(p));
    }
    if let Some(p) = &api.tls.key_file {
        put("tlsPrivateKeyFile", path(p));
    }
    if !api.tls.cipher_suites.is_empty() {
        put("tlsCipherSuites", json!(api.tls.cipher_suites));
    }
    if let Some(v) = &api.tls.min_version {
        put("tlsMinVersion", json!(v));
    }
    let mut x509 = Map::new();
    if let Some(p) = &api.tls.client_ca_file {
        x509.insert("clientCAFile".into(), path(p));
    }
    let webhook = match api.authn.webhook {
        Some(ttl) => json!({"enabled": true, "cacheTTL": go(ttl)}),
        None => json!({"enabled": false}),
    };
    put(
        "authentication",
        json!({
            "x509": x509,
            "webhook": webhook,
            "anonymous": {"enabled": api.authn.anonymous},
        }),
    );
    put(
        "authorization",
        match api.authz {
            AuthzMode::AlwaysAllow => json!({"mode": "AlwaysAllow", "webhook": {}}),
            AuthzMode::Webhook {
                authorized_ttl,
                unauthorized_ttl,
            } => json!({
                "mode": "Webhook",
                "webhook": {
                    "cacheAuthorizedTTL": go(authorized_ttl),
                    "cacheUnauthorizedTTL": go(unauthorized_ttl),
                },
            }),
        },
    );
    if let Some(cri) = &config.cri {
        put("containerRuntimeEndpoint", json!(cri.runtime_endpoint));
        if let Some(image) = &cri.image_endpoint {
            put("imageServiceEndpoint", json!(image));
        }
        put("runtimeRequestTimeout", json!(go(cri.request_timeout)));
    }
    put("clusterDomain", json!(config.dns.domain));
    put("clusterDNS", json!(config.dns.servers));
    if let Some(p) = &config.dns.resolv_conf {
        put("resolvConf", path(p));
    }
    put("maxPods", json!(config.max_pods));
    put(
        "volumeStatsAggPeriod",
        json!(go(config.volume_stats_agg_period)),
    );
    let quantities = |m: &std::collections::BTreeMap<
        String,
        k8s_openapi::apimachinery::pkg::api::resource::Quantity,
    >| {
        Value::Object(
            m.iter()
                .map(|(k, q)| (k.clone(), json!(q.0)))
                .collect::<Map<String, Value>>(),
        )
    };
    if !config.reservations.kube_reserved.is_empty() {
        put(
            "kubeReserved",
            quantities(&config.reservations.kube_reserved),
        );
    }
    if !config.reservations.system_reserved.is_empty() {
        put(
            "systemReserved",
            quantities(&config.reservations.system_reserved),
        );
    }
    put(
        "evictionHard",
        Value::Object(
            config
                .reservations
                .eviction_hard
                .iter()
                .map(|(k, t)| {
                    let v = match t {
                        crate::allocatable::Threshold::Bytes(b) => b.to_string(),
                        crate::allocatable::Threshold::Fraction(f) => {
                            format!("{}%", (f * 100.0 * 1000.0).round() / 1000.0)
                        }
                    };
                    (k.clone(), json!(v))
                })
                .collect(),
        ),
    );
    let shutdown = &config.shutdown;
    put("shutdownGracePeriod", json!(go(shutdown.grace_period)));
    put(
        "shutdownGracePeriodCriticalPods",
        json!(go(shutdown.grace_period_critical_pods)),
    );
    if !shutdown.by_pod_priority.is_empty() {
        put(
            "shutdownGracePeriodByPodPriority",
            Value::Array(
                shutdown
                    .by_pod_priority
                    .iter()
                    .map(|g| json!({"priority": g.priority, "shutdownGracePeriodSeconds": g.grace_seconds}))
                    .collect(),
            ),
        );
    }
    match &config.cluster {
        Some(cluster) => {
            put("registerNode", json!(cluster.register_node));
            put(
                "nodeStatusUpdateFrequency",
                json!(go(cluster.status_update_frequency)),
            );
            put(
                "nodeStatusReportFrequency",
                json!(go(cluster.status_report_frequency)),
            );
            put(
                "nodeLeaseDurationSeconds",
                json!(cluster.lease_duration_seconds),
            );
            if !cluster.taints.is_empty() {
                put("registerWithTaints", json!(cluster.taints));
            }
        }
        None => put("registerNode", json!(false)),
    }
    match &config.cgroups {
        Some(cg) => {
            put("cgroupsPerQOS", json!(true));
            put(
                "cgroupDriver",
                json!(match cg.driver {
                    crate::cm::cgroup::Driver::Cgroupfs => "cgroupfs",
                    crate::cm::cgroup::Driver::Systemd => "systemd",
                }),
            );
            put("cgroupRoot", json!(cg.root));
            put("cpuCFSQuota", json!(cg.cpu_cfs_quota));
            put("cpuCFSQuotaPeriod", json!(go(cg.cpu_cfs_quota_period)));
            put("podPidsLimit", json!(cg.pod_pids_limit.unwrap_or(-1)));
            put("enforceNodeAllocatable", json!(cg.enforce_node_allocatable));
        }
        None => put("cgroupsPerQOS", json!(false)),
    }
    put(
        "wasmlet",
        json!({
            "restartBackoff": {
                "initial": go(config.backoff_initial),
                "max": go(config.backoff_max),
            },
            "housekeepingInterval": go(config.housekeeping_interval),
            "plegRelistPeriod": go(config.pleg_relist_period),
            "runtimeHandlers": config.runtime_handlers,
            "plugins": config.plugins.iter().map(|p| p.name.clone()).collect::<Vec<_>>(),
        }),
    );
    json!({ "kubeletconfig": Value::Object(c) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubelets_field_names_and_go_durations() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.yaml");
        std::fs::write(
            &file,
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             staticPodPath: /etc/kubernetes/manifests\nsyncFrequency: 90s\n\
             authentication:\n  x509:\n    clientCAFile: /etc/ca.crt\n",
        )
        .unwrap();
        let config = crate::config::NodeFlags {
            config: Some(file),
            hostname_override: Some("edge-1".into()),
            kubeconfig: Some("/k".into()),
            ..Default::default()
        }
        .resolve()
        .unwrap();
        let z = configz(&config);
        let c = &z["kubeletconfig"];
        assert_eq!(c["staticPodPath"], "/etc/kubernetes/manifests");
        assert_eq!(c["syncFrequency"], "1m30s");
        assert_eq!(c["port"], 10250);
        assert_eq!(c["authentication"]["x509"]["clientCAFile"], "/etc/ca.crt");
        assert_eq!(c["authentication"]["webhook"]["cacheTTL"], "2m0s");
        assert_eq!(c["authentication"]["anonymous"]["enabled"], false);
        assert_eq!(c["authorization"]["mode"], "Webhook");
        assert_eq!(c["authorization"]["webhook"]["cacheUnauthorizedTTL"], "30s");
        assert_eq!(c["evictionHard"]["memory.available"], "104857600");
        assert_eq!(c["nodeLeaseDurationSeconds"], 40);
        assert_eq!(c["maxPods"], 110);
    }
}
