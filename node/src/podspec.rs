//! From a PodSpec to the runtime seam's sandbox and container settings, with the
//! kubelet's rules: DNS policy (`pkg/kubelet/network/dns`), the effective security
//! context (`determineEffectiveSecurityContext`), host ports, sysctls, and CPU shares
//! and CFS quota from requests and limits (`helpers_linux.go`).

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use wasmlet_runtime::{ContainerSecurity, DnsConfig, PortMapping, SandboxSecurity};

use crate::quantity;

/// Cluster DNS settings from the node's configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterDns {
    /// `clusterDNS`: the cluster's DNS servers.
    pub servers: Vec<String>,
    /// `clusterDomain`, e.g. `cluster.local`.
    pub domain: String,
    /// `resolvConf`: the host resolver configuration pods with `Default` get.
    pub resolv_conf: Option<std::path::PathBuf>,
}

/// The kubelet's limit on nameservers in a pod's resolv.conf.
pub const MAX_NAMESERVERS: usize = 3;
/// The kubelet's limit on search domains.
pub const MAX_SEARCHES: usize = 32;

/// A resolv.conf's servers, searches and options.
pub fn parse_resolv_conf(text: &str) -> DnsConfig {
    let mut dns = DnsConfig::default();
    for line in text.lines() {
        let line = line.split(['#', ';']).next().unwrap_or("");
        let mut fields = line.split_whitespace();
        match fields.next() {
            Some("nameserver") => dns.servers.extend(fields.next().map(str::to_owned)),
            // The last `search` line wins, as in the resolver.
            Some("search") => dns.searches = fields.map(str::to_owned).collect(),
            Some("options") => dns.options.extend(fields.map(str::to_owned)),
            _ => {}
        }
    }
    dns
}

fn push_unique(list: &mut Vec<String>, items: impl IntoIterator<Item = String>) {
    for item in items {
        if !list.contains(&item) {
            list.push(item);
        }
    }
}

/// The pod's resolv.conf under its `dnsPolicy` and `dnsConfig`, or an error (the
/// host's resolv.conf cannot be read).
pub fn dns_config(pod: &Pod, cluster: &ClusterDns) -> Result<DnsConfig, String> {
    let spec = pod.spec.clone().unwrap_or_default();
    let host_network = spec.host_network.unwrap_or(false);
    let host = || -> Result<DnsConfig, String> {
        match &cluster.resolv_conf {
            // `resolvConf: ""`: the kubelet disables lookups through the host's
            // resolver rather than let the runtime copy /etc/resolv.conf.
            None => Ok(DnsConfig {
                servers: vec!["127.0.0.1".into()],
                searches: vec![".".into()],
                options: Vec::new(),
            }),
            Some(path) => std::fs::read_to_string(path)
                .map(|t| parse_resolv_conf(&t))
                .map_err(|e| {
                    format!(
                        "reading the host's resolver configuration {}: {e}",
                        path.display()
                    )
                }),
        }
    };
    let policy = spec.dns_policy.as_deref().unwrap_or("ClusterFirst");
    let cluster_first = match policy {
        "ClusterFirstWithHostNet" => true,
        "ClusterFirst" => !host_network,
        "Default" | "None" => false,
        other => return Err(format!("unknown dnsPolicy {other:?}")),
    };
    let mut dns = if policy == "None" {
        DnsConfig::default()
    } else if cluster_first && !cluster.servers.is_empty() {
        let host = host()?;
        let mut searches = Vec::new();
        if !cluster.domain.is_empty() {
            let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
            searches = vec![
                format!("{ns}.svc.{}", cluster.domain),
                format!("svc.{}", cluster.domain),
                cluster.domain.clone(),
            ];
        }
        push_unique(&mut searches, host.searches);
        DnsConfig {
            servers: cluster.servers.clone(),
            searches,
            options: vec!["ndots:5".into()],
        }
    } else {
        if cluster_first {
            tracing::warn!(pod = %crate::pod::full_name(pod), "dnsPolicy {policy} but no clusterDNS is configured: using the host's resolver configuration");
        }
        host()?
    };
    if let Some(extra) = &spec.dns_config {
        push_unique(
            &mut dns.servers,
            extra.nameservers.clone().unwrap_or_default(),
        );
        push_unique(
            &mut dns.searches,
            extra.searches.clone().unwrap_or_default(),
        );
        for opt in extra.options.iter().flatten() {
            let Some(name) = opt.name.clone() else {
                continue;
            };
            // An option in the pod overrides the same option from the policy.
            dns.options
                .retain(|o| o.split(':').next() != Some(name.as_str()));
            dns.options.push(match &opt.value {
                Some(v) => format!("{name}:{v}"),
                None => name,
            });
        }
    }
    dns.servers.truncate(MAX_NAMESERVERS);
    dns.searches.truncate(MAX_SEARCHES);
    Ok(dns)
}

/// Every container port, as the kubelet passes them (the CNI portmap plugin
/// publishes those with a host port).
pub fn port_mappings(spec: &PodSpec) -> Vec<PortMapping> {
    spec.containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .map(|p| PortMapping {
            protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
            container_port: p.container_port,
            host_port: p.host_port.unwrap_or(0),
            host_ip: p.host_ip.clone().unwrap_or_default(),
        })
        .collect()
}

/// The sandbox's security settings: the pod's, and whether any container is privileged.
pub fn sandbox_security(spec: &PodSpec) -> SandboxSecurity {
    let sc = spec.security_context.clone().unwrap_or_default();
    let privileged = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .any(|c| {
            c.security_context
                .as_ref()
                .and_then(|s| s.privileged)
                .unwrap_or(false)
        });
    let containers = || {
        spec.init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
    };
    let shared = |of: fn(&k8s_openapi::api::core::v1::SecurityContext) -> Option<i64>,
                  pod: Option<i64>| {
        let mut each = containers().map(|c| c.security_context.as_ref().and_then(of).or(pod));
        let first = each.next().flatten()?;
        each.all(|id| id == Some(first)).then_some(first)
    };
    let mut user = shared(|s| s.run_as_user, sc.run_as_user);
    let mut group = shared(|s| s.run_as_group, sc.run_as_group);
    // A process of the whole pod has no image to take a user from: asked to run as
    // non-root and given no user, it runs as nobody rather than root.
    let non_root = containers().any(|c| {
        c.security_context
            .as_ref()
            .and_then(|s| s.run_as_non_root)
            .or(sc.run_as_non_root)
            == Some(true)
    });
    if user.is_none() && non_root {
        user = Some(NON_ROOT_DEFAULT_ID);
        group = group.or(Some(NON_ROOT_DEFAULT_ID));
    }
    SandboxSecurity {
        run_as_user: sc.run_as_user,
        run_as_group: sc.run_as_group,
        supplemental_groups: supplemental_groups(spec),
        privileged,
        containers_run_as_user: user,
        containers_run_as_group: group,
    }
}

/// The user (and group) a pod-wide process (a Wasm pod's sandbox) runs as when the pod
/// asks for `runAsNonRoot` and names no user: `nobody`.
pub const NON_ROOT_DEFAULT_ID: i64 = 65534;

/// The pod's fsGroup, then its supplemental groups, as the kubelet passes them.
fn supplemental_groups(spec: &PodSpec) -> Vec<i64> {
    let sc = spec.security_context.clone().unwrap_or_default();
    sc.fs_group
        .into_iter()
        .chain(sc.supplemental_groups.unwrap_or_default())
        .collect()
}

/// What the kubelet hides in a container with the default `procMount`.
pub const DEFAULT_MASKED_PATHS: [&str; 11] = [
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

/// What the kubelet mounts read-only in a container with the default `procMount`.
pub const DEFAULT_READONLY_PATHS: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// A container's effective security context: its own settings over the pod's.
pub fn container_security(spec: &PodSpec, c: &Container) -> ContainerSecurity {
    let pod = spec.security_context.clone().unwrap_or_default();
    let own = c.security_context.clone().unwrap_or_default();
    let caps = own.capabilities.clone().unwrap_or_default();
    ContainerSecurity {
        privileged: own.privileged.unwrap_or(false),
        run_as_user: own.run_as_user.or(pod.run_as_user),
        run_as_group: own.run_as_group.or(pod.run_as_group),
        supplemental_groups: supplemental_groups(spec),
        readonly_rootfs: own.read_only_root_filesystem.unwrap_or(false),
        no_new_privs: own.allow_privilege_escalation == Some(false),
        capabilities_add: caps.add.unwrap_or_default(),
        capabilities_drop: caps.drop.unwrap_or_default(),
        masked_paths: masked_or_none(&own, &DEFAULT_MASKED_PATHS),
        readonly_paths: masked_or_none(&own, &DEFAULT_READONLY_PATHS),
    }
}

/// `procMount: Unmasked` masks nothing; the default masks the kubelet's list.
fn masked_or_none(sc: &k8s_openapi::api::core::v1::SecurityContext, paths: &[&str]) -> Vec<String> {
    if sc.proc_mount.as_deref() == Some("Unmasked") {
        Vec::new()
    } else {
        paths.iter().map(|p| (*p).to_owned()).collect()
    }
}

/// `runAsNonRoot` checked as the kubelet does before a container is created: an
/// explicit `runAsUser` decides; otherwise the image's user must be numeric and not
/// 0, and an image that names no user runs as root. `image_user` is the image's
/// `(uid, username)` from the runtime.
pub fn verify_run_as_non_root(
    spec: &PodSpec,
    c: &Container,
    image_user: (Option<i64>, &str),
) -> Result<(), String> {
    let pod = spec.security_context.clone().unwrap_or_default();
    let own = c.security_context.clone().unwrap_or_default();
    if own.run_as_non_root.or(pod.run_as_non_root) != Some(true) {
        return Ok(());
    }
    match own.run_as_user.or(pod.run_as_user) {
        Some(0) => {
            return Err(format!(
                "container's runAsUser breaks non-root policy (container: {})",
                c.name
            ));
        }
        Some(_) => return Ok(()),
        None => {}
    }
    match image_user {
        (Some(0), _) | (None, "") => Err(format!(
            "container has runAsNonRoot and image will run as root (container: {})",
            c.name
        )),
        (None, name) => Err(format!(
            "container has runAsNonRoot and image has non-numeric user ({name}), cannot verify user is non-root (container: {})",
            c.name
        )),
        (Some(_), _) => Ok(()),
    }
}

/// The CFS period the kubelet uses (`cpuCFSQuotaPeriod`, 100 ms), in microseconds.
pub const CPU_PERIOD_US: u64 = 100_000;
const MIN_SHARES: u64 = 2;
const MIN_QUOTA_US: i64 = 1_000;

const MAX_SHARES: u64 = 262_144;

/// CPU shares for a request in millicores (`MilliCPUToShares`).
pub fn milli_cpu_to_shares(milli: u64) -> u64 {
    (milli.saturating_mul(1024) / 1000).clamp(MIN_SHARES, MAX_SHARES)
}

/// CFS quota for a limit in millicores (`milliCPUToQuota`); 0 when there is none.
pub fn milli_cpu_to_quota(milli: u64, period_us: u64) -> i64 {
    if milli == 0 {
        return 0;
    }
    ((milli * period_us / 1000) as i64).max(MIN_QUOTA_US)
}

type Resources = BTreeMap<String, Quantity>;

fn milli_cpu(
    c: &Container,
    which: fn(&ResourceRequirements) -> Option<&Resources>,
) -> Result<Option<u64>, String> {
    let Some(q) = c
        .resources
        .as_ref()
        .and_then(which)
        .and_then(|m| m.get("cpu"))
    else {
        return Ok(None);
    };
    let cores = quantity::parse(q).map_err(|e| format!("cpu: {e}"))?;
    if cores < 0.0 {
        return Err(format!("cpu: negative quantity {:?}", q.0));
    }
    // Up to the next millicore as `MilliValue` does, without float noise (0.3 * 1000).
    Ok(Some(((cores * 1e9).round() / 1e6).ceil() as u64))
}

/// The container's CPU limit in millicores, if it sets one.
pub fn milli_cpu_limit(c: &Container) -> Option<u64> {
    milli_cpu(c, |r| r.limits.as_ref()).ok().flatten()
}

/// `(cpu_shares, cpu_quota, cpu_period)` for a container: shares from the request
/// (or the limit when only a limit is set), quota and period from the limit.
pub fn cpu_resources(c: &Container) -> Result<(u64, Option<(i64, u64)>), String> {
    let request = milli_cpu(c, |r| r.requests.as_ref())?;
    let limit = milli_cpu(c, |r| r.limits.as_ref())?;
    // A zero (or missing) request with a limit takes the limit, as the kubelet does.
    let shares = milli_cpu_to_shares(match request {
        Some(r) if r > 0 => r,
        _ => limit.unwrap_or(0),
    });
    let quota = limit.map(|l| (milli_cpu_to_quota(l, CPU_PERIOD_US), CPU_PERIOD_US));
    Ok((shares, quota))
}

/// The sysctls of `securityContext.sysctls`.
pub fn sysctls(spec: &PodSpec) -> BTreeMap<String, String> {
    spec.security_context
        .iter()
        .flat_map(|sc| sc.sysctls.iter().flatten())
        .map(|s| (s.name.clone(), s.value.clone()))
        .collect()
}

/// Where the kubelet reads the host's resolver configuration by default.
pub fn default_resolv_conf() -> &'static Path {
    Path::new("/etc/resolv.conf")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Capabilities, ContainerPort, PodDNSConfig, PodDNSConfigOption, PodSecurityContext,
        SecurityContext, Sysctl,
    };

    fn pod(yaml_spec: PodSpec) -> Pod {
        let mut p = Pod {
            spec: Some(yaml_spec),
            ..Default::default()
        };
        p.metadata.namespace = Some("shop".into());
        p.metadata.name = Some("web".into());
        p
    }

    fn host_resolv(dir: &Path) -> std::path::PathBuf {
        let path = dir.join("resolv.conf");
        std::fs::write(
            &path,
            "# generated\nnameserver 10.0.0.2\nnameserver 10.0.0.3\nsearch corp.example lab.example\noptions edns0 ndots:2\n",
        )
        .unwrap();
        path
    }

    #[test]
    fn resolv_conf_is_parsed() {
        let dns = parse_resolv_conf(
            "nameserver 1.1.1.1 # comment\nsearch a b\nsearch c\noptions ndots:1 rotate\n; x\n",
        );
        assert_eq!(dns.servers, ["1.1.1.1"]);
        assert_eq!(dns.searches, ["c"], "the last search line wins");
        assert_eq!(dns.options, ["ndots:1", "rotate"]);
    }

    #[test]
    fn dns_policies_follow_the_kubelet() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = ClusterDns {
            servers: vec!["10.96.0.10".into()],
            domain: "cluster.local".into(),
            resolv_conf: Some(host_resolv(dir.path())),
        };
        // ClusterFirst (the default): cluster servers, cluster searches then the host's.
        let dns = dns_config(&pod(PodSpec::default()), &cluster).unwrap();
        assert_eq!(dns.servers, ["10.96.0.10"]);
        assert_eq!(
            dns.searches,
            [
                "shop.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local",
                "corp.example",
                "lab.example"
            ]
        );
        assert_eq!(dns.options, ["ndots:5"]);

        // hostNetwork with ClusterFirst falls back to the host's configuration...
        let host_net = PodSpec {
            host_network: Some(true),
            ..Default::default()
        };
        let dns = dns_config(&pod(host_net.clone()), &cluster).unwrap();
        assert_eq!(dns.servers, ["10.0.0.2", "10.0.0.3"]);
        assert_eq!(dns.options, ["edns0", "ndots:2"]);
        // ...unless it asks for ClusterFirstWithHostNet.
        let with_host_net = PodSpec {
            dns_policy: Some("ClusterFirstWithHostNet".into()),
            ..host_net
        };
        assert_eq!(
            dns_config(&pod(with_host_net), &cluster).unwrap().servers,
            ["10.96.0.10"]
        );

        // Default is the host's; ClusterFirst without clusterDNS too.
        let default = PodSpec {
            dns_policy: Some("Default".into()),
            ..Default::default()
        };
        assert_eq!(
            dns_config(&pod(default), &cluster).unwrap().searches,
            ["corp.example", "lab.example"]
        );
        let no_cluster = ClusterDns {
            servers: vec![],
            ..cluster.clone()
        };
        assert_eq!(
            dns_config(&pod(PodSpec::default()), &no_cluster)
                .unwrap()
                .servers,
            ["10.0.0.2", "10.0.0.3"]
        );

        // None: only the pod's dnsConfig, whose options override by name.
        let none = PodSpec {
            dns_policy: Some("None".into()),
            dns_config: Some(PodDNSConfig {
                nameservers: Some(vec![
                    "1.1.1.1".into(),
                    "8.8.8.8".into(),
                    "9.9.9.9".into(),
                    "1.0.0.1".into(),
                ]),
                searches: Some(vec!["a.example".into()]),
                options: Some(vec![PodDNSConfigOption {
                    name: Some("ndots".into()),
                    value: Some("1".into()),
                }]),
            }),
            ..Default::default()
        };
        let dns = dns_config(&pod(none), &cluster).unwrap();
        assert_eq!(
            dns.servers,
            ["1.1.1.1", "8.8.8.8", "9.9.9.9"],
            "at most three nameservers"
        );
        assert_eq!(dns.searches, ["a.example"]);
        assert_eq!(dns.options, ["ndots:1"]);
        let merged = PodSpec {
            dns_config: Some(PodDNSConfig {
                options: Some(vec![PodDNSConfigOption {
                    name: Some("ndots".into()),
                    value: Some("2".into()),
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            dns_config(&pod(merged), &cluster).unwrap().options,
            ["ndots:2"]
        );

        let bad = PodSpec {
            dns_policy: Some("Sometimes".into()),
            ..Default::default()
        };
        assert!(dns_config(&pod(bad), &cluster).is_err());
        let unreadable = ClusterDns {
            resolv_conf: Some(dir.path().join("missing")),
            ..cluster
        };
        let err = dns_config(&pod(PodSpec::default()), &unreadable).unwrap_err();
        assert!(err.contains("missing"), "{err}");
        let no_resolv_conf = ClusterDns {
            servers: vec![],
            domain: "cluster.local".into(),
            resolv_conf: None,
        };
        let dns = dns_config(&pod(PodSpec::default()), &no_resolv_conf).unwrap();
        assert_eq!(
            (dns.servers, dns.searches),
            (vec!["127.0.0.1".to_owned()], vec![".".to_owned()])
        );
    }

    #[test]
    fn cpu_shares_and_quota_use_the_kubelet_formulas() {
        let with = |requests: &[(&str, &str)], limits: &[(&str, &str)]| Container {
            resources: Some(ResourceRequirements {
                requests: Some(
                    requests
                        .iter()
                        .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                        .collect(),
                ),
                limits: Some(
                    limits
                        .iter()
                        .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(cpu_resources(&Container::default()).unwrap(), (2, None));
        assert_eq!(
            cpu_resources(&with(&[("cpu", "250m")], &[])).unwrap(),
            (256, None)
        );
        assert_eq!(
            cpu_resources(&with(&[("cpu", "100m")], &[("cpu", "1500m")])).unwrap(),
            (102, Some((150_000, 100_000)))
        );
        // Only a limit: the request defaults to it.
        assert_eq!(
            cpu_resources(&with(&[], &[("cpu", "2")])).unwrap(),
            (2048, Some((200_000, 100_000)))
        );
        // The smallest quota is 1 ms.
        assert_eq!(
            cpu_resources(&with(&[], &[("cpu", "1m")])).unwrap(),
            (2, Some((1_000, 100_000)))
        );
        assert!(cpu_resources(&with(&[("cpu", "lots")], &[])).is_err());
        assert_eq!(
            cpu_resources(&with(&[("cpu", "0")], &[("cpu", "1")]))
                .unwrap()
                .0,
            1024,
            "a zero request takes the limit"
        );
        assert_eq!(milli_cpu_to_shares(1_000_000), 262_144, "clamped");
    }

    #[test]
    fn security_contexts_merge_like_the_kubelets() {
        let c = Container {
            name: "app".into(),
            security_context: Some(SecurityContext {
                run_as_user: Some(1000),
                read_only_root_filesystem: Some(true),
                allow_privilege_escalation: Some(false),
                capabilities: Some(Capabilities {
                    add: Some(vec!["NET_ADMIN".into()]),
                    drop: Some(vec!["ALL".into()]),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let privileged = Container {
            name: "debug".into(),
            security_context: Some(SecurityContext {
                privileged: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        };
        let spec = PodSpec {
            containers: vec![c.clone(), privileged],
            security_context: Some(PodSecurityContext {
                run_as_user: Some(2000),
                run_as_group: Some(3000),
                supplemental_groups: Some(vec![4000]),
                fs_group: Some(5000),
                sysctls: Some(vec![Sysctl {
                    name: "net.ipv4.ip_unprivileged_port_start".into(),
                    value: "0".into(),
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let sc = container_security(&spec, &c);
        assert_eq!(sc.run_as_user, Some(1000), "the container's own wins");
        assert_eq!(sc.run_as_group, Some(3000), "the pod's fills in");
        assert_eq!(sc.supplemental_groups, [5000, 4000], "fsGroup first");
        assert!(sc.readonly_rootfs && sc.no_new_privs && !sc.privileged);
        assert_eq!(sc.capabilities_add, ["NET_ADMIN"]);
        assert_eq!(sc.capabilities_drop, ["ALL"]);
        assert!(sc.masked_paths.contains(&"/proc/kcore".to_owned()));
        assert!(sc.readonly_paths.contains(&"/proc/sys".to_owned()));
        let unmasked = Container {
            security_context: Some(SecurityContext {
                proc_mount: Some("Unmasked".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let sc = container_security(&spec, &unmasked);
        assert!(sc.masked_paths.is_empty() && sc.readonly_paths.is_empty());
        let sandbox = sandbox_security(&spec);
        assert_eq!(sandbox.run_as_user, Some(2000));
        assert!(sandbox.privileged, "one container is privileged");
        assert_eq!(sysctls(&spec)["net.ipv4.ip_unprivileged_port_start"], "0");
        // `app` runs as 1000, `debug` as the pod's 2000: no one user; one group.
        assert_eq!(sandbox.containers_run_as_user, None);
        assert_eq!(sandbox.containers_run_as_group, Some(3000));
    }

    #[test]
    fn the_user_every_container_shares_is_the_sandboxs_to_run_as() {
        let with = |uid: Option<i64>| Container {
            security_context: uid.map(|uid| SecurityContext {
                run_as_user: Some(uid),
                ..Default::default()
            }),
            ..Default::default()
        };
        let pod = |pod_uid: Option<i64>, containers: Vec<Container>| PodSpec {
            init_containers: Some(vec![containers[0].clone()]),
            containers: containers[1..].to_vec(),
            security_context: Some(PodSecurityContext {
                run_as_user: pod_uid,
                ..Default::default()
            }),
            ..Default::default()
        };
        let user = |spec: &PodSpec| sandbox_security(spec).containers_run_as_user;
        assert_eq!(
            user(&pod(None, vec![with(Some(7)), with(Some(7))])),
            Some(7)
        );
        assert_eq!(user(&pod(Some(7), vec![with(None), with(None)])), Some(7));
        assert_eq!(
            user(&pod(Some(8), vec![with(Some(7)), with(Some(7))])),
            Some(7)
        );
        assert_eq!(user(&pod(None, vec![with(Some(7)), with(None)])), None);
        assert_eq!(user(&pod(Some(8), vec![with(Some(7)), with(None)])), None);
        assert_eq!(user(&pod(None, vec![with(None), with(None)])), None);

        // runAsNonRoot with no user: nobody, in nobody's group unless one is named.
        let mut non_root = pod(None, vec![with(None), with(None)]);
        non_root.security_context.as_mut().unwrap().run_as_non_root = Some(true);
        let sandbox = sandbox_security(&non_root);
        assert_eq!(sandbox.containers_run_as_user, Some(NON_ROOT_DEFAULT_ID));
        assert_eq!(sandbox.containers_run_as_group, Some(NON_ROOT_DEFAULT_ID));
        non_root.security_context.as_mut().unwrap().run_as_user = Some(7);
        assert_eq!(user(&non_root), Some(7), "a named user wins");
    }

    #[test]
    fn run_as_non_root_follows_the_kubelet() {
        let with_user = |uid: Option<i64>| Container {
            name: "app".into(),
            security_context: Some(SecurityContext {
                run_as_user: uid,
                ..Default::default()
            }),
            ..Default::default()
        };
        let strict = PodSpec {
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        };
        let image_user_1000 = (Some(1000), "");
        assert!(verify_run_as_non_root(&strict, &with_user(Some(0)), image_user_1000).is_err());
        assert!(verify_run_as_non_root(&strict, &with_user(Some(7)), (Some(0), "")).is_ok());
        assert!(verify_run_as_non_root(&strict, &with_user(None), image_user_1000).is_ok());
        let root = verify_run_as_non_root(&strict, &with_user(None), (None, "")).unwrap_err();
        assert!(root.contains("image will run as root"), "{root}");
        assert!(verify_run_as_non_root(&strict, &with_user(None), (Some(0), "")).is_err());
        let named = verify_run_as_non_root(&strict, &with_user(None), (None, "nginx")).unwrap_err();
        assert!(named.contains("non-numeric user (nginx)"), "{named}");
        assert!(
            verify_run_as_non_root(&PodSpec::default(), &with_user(Some(0)), (Some(0), "")).is_ok()
        );
    }

    #[test]
    fn ports_map_with_tcp_by_default() {
        let spec = PodSpec {
            containers: vec![Container {
                ports: Some(vec![
                    ContainerPort {
                        container_port: 80,
                        host_port: Some(8080),
                        ..Default::default()
                    },
                    ContainerPort {
                        container_port: 53,
                        protocol: Some("UDP".into()),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }],
            ..Default::default()
        };
        let ports = port_mappings(&spec);
        assert_eq!(
            ports[0],
            PortMapping {
                protocol: "TCP".into(),
                container_port: 80,
                host_port: 8080,
                host_ip: String::new()
            }
        );
        assert_eq!(ports[1].protocol, "UDP");
        assert_eq!(ports[1].host_port, 0);
    }
}
