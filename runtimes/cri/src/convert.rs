//! Pure conversions between the seam's types and CRI v1 messages, filled in the
//! way the kubelet fills them (`pkg/kubelet/kuberuntime`).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use jiff::Timestamp;
use wasmlet_proto::cri::v1 as cri;
use wasmlet_runtime::{
    Container, ContainerConfig, ContainerEventKind, ContainerMetadata, ContainerResources,
    ContainerSecurity, ContainerState, ContainerStatus, Device, DnsConfig, Error, Image, Labels,
    PodMetadata, PodSandbox, PodSandboxConfig, PodSandboxStatus, PortMapping, Result, RuntimeEvent,
    RuntimeStatus, SandboxSecurity, SandboxState,
};

/// CRI times are nanoseconds since the Unix epoch; every `i64` fits a [`Timestamp`].
pub(crate) fn timestamp(nanos: i64) -> Timestamp {
    Timestamp::from_nanosecond(i128::from(nanos)).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// Like [`timestamp`], with CRI's "0 means not yet" (`started_at`, `finished_at`).
pub(crate) fn optional_timestamp(nanos: i64) -> Option<Timestamp> {
    (nanos != 0).then(|| timestamp(nanos))
}

/// A timeout as CRI's whole seconds, rounded up so that a sub-second grace period is
/// not turned into an immediate kill.
pub(crate) fn whole_seconds(timeout: Duration) -> i64 {
    let secs = timeout
        .as_secs()
        .saturating_add(u64::from(timeout.subsec_nanos() > 0));
    i64::try_from(secs).unwrap_or(i64::MAX)
}

pub(crate) fn container_state(state: i32) -> ContainerState {
    match cri::ContainerState::try_from(state) {
        Ok(cri::ContainerState::ContainerCreated) => ContainerState::Created,
        Ok(cri::ContainerState::ContainerRunning) => ContainerState::Running,
        Ok(cri::ContainerState::ContainerExited) => ContainerState::Exited,
        Ok(cri::ContainerState::ContainerUnknown) | Err(_) => ContainerState::Unknown,
    }
}

pub(crate) fn sandbox_state(state: i32) -> SandboxState {
    match cri::PodSandboxState::try_from(state) {
        Ok(cri::PodSandboxState::SandboxReady) => SandboxState::Ready,
        Ok(cri::PodSandboxState::SandboxNotready) | Err(_) => SandboxState::NotReady,
    }
}

pub(crate) fn event_kind(kind: i32) -> Option<ContainerEventKind> {
    match cri::ContainerEventType::try_from(kind).ok()? {
        cri::ContainerEventType::ContainerCreatedEvent => Some(ContainerEventKind::Created),
        cri::ContainerEventType::ContainerStartedEvent => Some(ContainerEventKind::Started),
        cri::ContainerEventType::ContainerStoppedEvent => Some(ContainerEventKind::Stopped),
        cri::ContainerEventType::ContainerDeletedEvent => Some(ContainerEventKind::Deleted),
    }
}

/// A `GetContainerEvents` message as a seam event; `None` for an event type newer
/// than this client.
pub(crate) fn event(e: &cri::ContainerEventResponse) -> Option<RuntimeEvent> {
    let kind = event_kind(e.container_event_type)?;
    let sandbox = e.pod_sandbox_status.as_ref();
    Some(RuntimeEvent {
        container_id: e.container_id.clone(),
        sandbox_id: sandbox.map(|s| s.id.clone()).unwrap_or_default(),
        pod_uid: sandbox
            .and_then(|s| s.metadata.as_ref())
            .map(|m| m.uid.clone())
            .unwrap_or_default(),
        kind,
        at: timestamp(e.created_at),
    })
}

fn saturating_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The node's computed resources as CRI's Linux resources; unset values are 0, which
/// CRI runtimes read as "no limit" / "the default".
pub(crate) fn linux_resources(r: &ContainerResources) -> cri::LinuxContainerResources {
    cri::LinuxContainerResources {
        cpu_period: r.cpu_period.map_or(0, saturating_i64),
        cpu_quota: r.cpu_quota.unwrap_or(0),
        cpu_shares: r.cpu_shares.map_or(0, saturating_i64),
        memory_limit_in_bytes: r.memory_limit_bytes.map_or(0, saturating_i64),
        oom_score_adj: r.oom_score_adj.unwrap_or(0),
        cpuset_cpus: r.cpuset_cpus.clone().unwrap_or_default(),
        ..Default::default()
    }
}

/// The kubelet's namespace choice for a pod (`NamespacesForPod`), used for the
/// sandbox and, unchanged, for each of its containers:
///
/// - network: the node's with `hostNetwork`, else the pod's;
/// - PID: the node's with `hostPID`, else the pod's with `shareProcessNamespace`,
///   else each container's own (sent explicitly as `CONTAINER`);
/// - IPC: the node's with `hostIPC`, else the pod's.
pub(crate) fn namespace_options(pod: &PodSandboxConfig) -> cri::NamespaceOption {
    use cri::NamespaceMode as M;
    let node_or_pod = |host| if host { M::Node } else { M::Pod };
    let pid = if pod.host_pid {
        M::Node
    } else if pod.share_process_namespace {
        M::Pod
    } else {
        M::Container
    };
    cri::NamespaceOption {
        network: node_or_pod(pod.host_network).into(),
        pid: pid.into(),
        ipc: node_or_pod(pod.host_ipc).into(),
        ..Default::default()
    }
}

fn int64_value(v: Option<i64>) -> Option<cri::Int64Value> {
    v.map(|value| cri::Int64Value { value })
}

pub(crate) fn dns_config(d: &DnsConfig) -> cri::DnsConfig {
    cri::DnsConfig {
        servers: d.servers.clone(),
        searches: d.searches.clone(),
        options: d.options.clone(),
    }
}

/// A port protocol by its Kubernetes name (`TCP`, `UDP`, `SCTP`, case-sensitive as
/// in the API). The kubelet falls back to TCP with a warning; publishing a port under
/// a protocol the pod did not ask for is worse than refusing, so this rejects it.
pub(crate) fn protocol(name: &str) -> Result<cri::Protocol> {
    match name {
        "TCP" => Ok(cri::Protocol::Tcp),
        "UDP" => Ok(cri::Protocol::Udp),
        "SCTP" => Ok(cri::Protocol::Sctp),
        other => Err(Error::InvalidArgument(format!(
            "unknown port protocol {other:?}: want TCP, UDP or SCTP"
        ))),
    }
}

pub(crate) fn port_mapping(p: &PortMapping) -> Result<cri::PortMapping> {
    Ok(cri::PortMapping {
        protocol: protocol(&p.protocol)?.into(),
        container_port: p.container_port,
        host_port: p.host_port,
        host_ip: p.host_ip.clone(),
    })
}

/// The pod-level security context, as `generatePodSandboxLinuxConfig` fills it.
pub(crate) fn sandbox_security_context(
    pod: &PodSandboxConfig,
    s: &SandboxSecurity,
) -> cri::LinuxSandboxSecurityContext {
    cri::LinuxSandboxSecurityContext {
        namespace_options: Some(namespace_options(pod)),
        run_as_user: int64_value(s.run_as_user),
        run_as_group: int64_value(s.run_as_group),
        supplemental_groups: s.supplemental_groups.clone(),
        privileged: s.privileged,
        ..Default::default()
    }
}

/// A container's security context, as `determineEffectiveSecurityContext` fills it;
/// capabilities are sent only when there is something to add or drop.
pub(crate) fn container_security_context(
    s: &ContainerSecurity,
    pod: &PodSandboxConfig,
) -> cri::LinuxContainerSecurityContext {
    let capabilities =
        (!s.capabilities_add.is_empty() || !s.capabilities_drop.is_empty()).then(|| {
            cri::Capability {
                add_capabilities: s.capabilities_add.clone(),
                drop_capabilities: s.capabilities_drop.clone(),
                ..Default::default()
            }
        });
    cri::LinuxContainerSecurityContext {
        capabilities,
        privileged: s.privileged,
        namespace_options: Some(namespace_options(pod)),
        run_as_user: int64_value(s.run_as_user),
        run_as_group: int64_value(s.run_as_group),
        readonly_rootfs: s.readonly_rootfs,
        supplemental_groups: s.supplemental_groups.clone(),
        no_new_privs: s.no_new_privs,
        // containerd applies exactly these (an empty list masks nothing).
        masked_paths: s.masked_paths.clone(),
        readonly_paths: s.readonly_paths.clone(),
        ..Default::default()
    }
}

pub(crate) fn device(d: &Device) -> Result<cri::Device> {
    Ok(cri::Device {
        container_path: d.container_path.clone(),
        host_path: path_str("device", &d.host_path)?.to_owned(),
        permissions: d.permissions.clone(),
    })
}

fn to_map(labels: &Labels) -> HashMap<String, String> {
    labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn from_map(labels: HashMap<String, String>) -> Labels {
    labels.into_iter().collect::<BTreeMap<_, _>>()
}

/// CRI carries paths as protobuf strings, which must be UTF-8.
fn path_str<'a>(what: &str, path: &'a Path) -> Result<&'a str> {
    path.to_str()
        .ok_or_else(|| Error::InvalidArgument(format!("{what} {path:?} is not valid UTF-8")))
}

pub(crate) fn sandbox_config(c: &PodSandboxConfig) -> Result<cri::PodSandboxConfig> {
    Ok(cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: c.metadata.name.clone(),
            uid: c.metadata.uid.clone(),
            namespace: c.metadata.namespace.clone(),
            attempt: c.metadata.attempt,
        }),
        hostname: c.hostname.clone(),
        log_directory: path_str("log directory", &c.log_directory)?.to_owned(),
        // Unset, the runtime copies the host's resolv.conf.
        dns_config: c.dns.as_ref().map(dns_config),
        port_mappings: c
            .port_mappings
            .iter()
            .map(port_mapping)
            .collect::<Result<_>>()?,
        labels: to_map(&c.labels),
        annotations: to_map(&c.annotations),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: c.cgroup_parent.clone().unwrap_or_default(),
            security_context: Some(sandbox_security_context(c, &c.security)),
            sysctls: to_map(&c.sysctls),
            ..Default::default()
        }),
        windows: None,
    })
}

pub(crate) fn container_config(
    c: &ContainerConfig,
    sandbox: &PodSandboxConfig,
) -> Result<cri::ContainerConfig> {
    let mounts = c
        .mounts
        .iter()
        .map(|m| {
            Ok(cri::Mount {
                container_path: m.container_path.clone(),
                host_path: path_str("mount source", &m.host_path)?.to_owned(),
                readonly: m.readonly,
                propagation: cri::MountPropagation::PropagationPrivate.into(),
                ..Default::default()
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let devices = c.devices.iter().map(device).collect::<Result<Vec<_>>>()?;
    Ok(cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: c.metadata.name.clone(),
            attempt: c.metadata.attempt,
        }),
        image: Some(image_spec(&c.image)),
        command: c.command.clone(),
        args: c.args.clone(),
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs: c
            .env
            .iter()
            .map(|(key, value)| cri::KeyValue {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
        mounts,
        devices,
        cdi_devices: c
            .cdi_devices
            .iter()
            .map(|name| cri::CdiDevice { name: name.clone() })
            .collect(),
        labels: to_map(&c.labels),
        annotations: to_map(&c.annotations),
        log_path: path_str("log path", &c.log_path)?.to_owned(),
        stdin: c.stdin,
        stdin_once: c.stdin_once,
        tty: c.tty,
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(linux_resources(&c.resources)),
            security_context: Some(container_security_context(&c.security, sandbox)),
        }),
        ..Default::default()
    })
}

pub(crate) fn image_spec(image: &str) -> cri::ImageSpec {
    cri::ImageSpec {
        image: image.to_owned(),
        user_specified_image: image.to_owned(),
        ..Default::default()
    }
}

/// Pull credentials as CRI carries them.
pub(crate) fn auth_config(a: &wasmlet_runtime::AuthConfig) -> cri::AuthConfig {
    cri::AuthConfig {
        username: a.username.clone(),
        password: a.password.clone(),
        auth: a.auth.clone(),
        server_address: a.server_address.clone(),
        identity_token: a.identity_token.clone(),
        registry_token: a.registry_token.clone(),
    }
}

fn pod_metadata(m: Option<cri::PodSandboxMetadata>) -> PodMetadata {
    let m = m.unwrap_or_default();
    PodMetadata {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        attempt: m.attempt,
    }
}

fn container_metadata(m: Option<cri::ContainerMetadata>) -> ContainerMetadata {
    let m = m.unwrap_or_default();
    ContainerMetadata {
        name: m.name,
        attempt: m.attempt,
    }
}

pub(crate) fn pod_sandbox(s: cri::PodSandbox) -> PodSandbox {
    PodSandbox {
        id: s.id,
        metadata: pod_metadata(s.metadata),
        state: sandbox_state(s.state),
        created_at: timestamp(s.created_at),
        labels: from_map(s.labels),
        annotations: from_map(s.annotations),
        runtime_handler: s.runtime_handler,
    }
}

pub(crate) fn pod_sandbox_status(s: cri::PodSandboxStatus) -> PodSandboxStatus {
    let network = s.network.unwrap_or_default();
    PodSandboxStatus {
        id: s.id,
        metadata: pod_metadata(s.metadata),
        state: sandbox_state(s.state),
        created_at: timestamp(s.created_at),
        ip: (!network.ip.is_empty()).then_some(network.ip),
        additional_ips: network.additional_ips.into_iter().map(|ip| ip.ip).collect(),
        network_namespace: None,
        labels: from_map(s.labels),
        annotations: from_map(s.annotations),
        runtime_handler: s.runtime_handler,
    }
}

pub(crate) fn container(c: cri::Container) -> Container {
    Container {
        id: c.id,
        sandbox_id: c.pod_sandbox_id,
        metadata: container_metadata(c.metadata),
        image: c.image.map(|i| i.image).unwrap_or_default(),
        image_ref: c.image_ref,
        state: container_state(c.state),
        created_at: timestamp(c.created_at),
        labels: from_map(c.labels),
        annotations: from_map(c.annotations),
    }
}

/// A CRI container status; `sandbox_id` comes from the caller because CRI's
/// `ContainerStatus` does not carry it.
pub(crate) fn container_status(s: cri::ContainerStatus, sandbox_id: String) -> ContainerStatus {
    ContainerStatus {
        id: s.id,
        sandbox_id,
        metadata: container_metadata(s.metadata),
        state: container_state(s.state),
        created_at: timestamp(s.created_at),
        started_at: optional_timestamp(s.started_at),
        finished_at: optional_timestamp(s.finished_at),
        exit_code: s.exit_code,
        image: s.image.map(|i| i.image).unwrap_or_default(),
        image_ref: s.image_ref,
        reason: s.reason,
        message: s.message,
        labels: from_map(s.labels),
        annotations: from_map(s.annotations),
        log_path: s.log_path.into(),
    }
}

pub(crate) fn image(i: cri::Image) -> Image {
    Image {
        id: i.id,
        repo_tags: i.repo_tags,
        repo_digests: i.repo_digests,
        size: i.size,
        uid: i.uid.map(|u| u.value),
        username: i.username,
        pinned: i.pinned,
    }
}

/// Readiness from the `RuntimeReady` and `NetworkReady` conditions. A missing
/// condition counts as false, as in the kubelet; the message lists every condition
/// that is not true with its reason and message.
pub(crate) fn runtime_status(status: Option<cri::RuntimeStatus>) -> RuntimeStatus {
    const RUNTIME_READY: &str = "RuntimeReady";
    const NETWORK_READY: &str = "NetworkReady";
    let conditions = status.map(|s| s.conditions).unwrap_or_default();
    let find = |kind: &str| conditions.iter().find(|c| c.r#type == kind);
    let mut problems = Vec::new();
    let mut ready = |kind: &str| match find(kind) {
        Some(c) if c.status => true,
        Some(c) => {
            let mut text = format!("{kind}=false");
            if !c.reason.is_empty() {
                text.push_str(&format!(" reason:{}", c.reason));
            }
            if !c.message.is_empty() {
                text.push_str(&format!(" message:{}", c.message));
            }
            problems.push(text);
            false
        }
        None => {
            problems.push(format!("{kind} condition missing"));
            false
        }
    };
    let runtime_ready = ready(RUNTIME_READY);
    let network_ready = ready(NETWORK_READY);
    RuntimeStatus {
        runtime_ready,
        network_ready,
        message: problems.join("; "),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use wasmlet_runtime::Mount;

    #[test]
    fn container_states() {
        let table = [
            (0, ContainerState::Created),
            (1, ContainerState::Running),
            (2, ContainerState::Exited),
            (3, ContainerState::Unknown),
            (42, ContainerState::Unknown),
        ];
        for (wire, state) in table {
            assert_eq!(container_state(wire), state, "wire value {wire}");
        }
    }

    #[test]
    fn sandbox_states() {
        assert_eq!(sandbox_state(0), SandboxState::Ready);
        assert_eq!(sandbox_state(1), SandboxState::NotReady);
        assert_eq!(sandbox_state(7), SandboxState::NotReady);
    }

    #[test]
    fn event_kinds() {
        let table = [
            (0, Some(ContainerEventKind::Created)),
            (1, Some(ContainerEventKind::Started)),
            (2, Some(ContainerEventKind::Stopped)),
            (3, Some(ContainerEventKind::Deleted)),
            (4, None),
        ];
        for (wire, kind) in table {
            assert_eq!(event_kind(wire), kind, "wire value {wire}");
        }
    }

    #[test]
    fn events_carry_the_pod_uid() {
        let e = cri::ContainerEventResponse {
            container_id: "c1".into(),
            container_event_type: cri::ContainerEventType::ContainerStoppedEvent.into(),
            created_at: 1_700_000_000_123_456_789,
            pod_sandbox_status: Some(cri::PodSandboxStatus {
                id: "s1".into(),
                metadata: Some(cri::PodSandboxMetadata {
                    uid: "uid-1".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            containers_statuses: Vec::new(),
        };
        let got = event(&e).unwrap();
        assert_eq!(got.container_id, "c1");
        assert_eq!(got.sandbox_id, "s1");
        assert_eq!(got.pod_uid, "uid-1");
        assert_eq!(got.kind, ContainerEventKind::Stopped);
        assert_eq!(got.at.as_nanosecond(), 1_700_000_000_123_456_789);

        let bare = cri::ContainerEventResponse {
            container_id: "c2".into(),
            ..Default::default()
        };
        let got = event(&bare).unwrap();
        assert_eq!((got.sandbox_id.as_str(), got.pod_uid.as_str()), ("", ""));
    }

    #[test]
    fn timestamps() {
        assert_eq!(timestamp(0), Timestamp::UNIX_EPOCH);
        let t = timestamp(1_700_000_000_000_000_001);
        assert_eq!(t.as_second(), 1_700_000_000);
        assert_eq!(t.subsec_nanosecond(), 1);
        assert_eq!(timestamp(-1_000_000_000).as_second(), -1);
        // The whole i64 range is representable.
        assert!(timestamp(i64::MAX) > timestamp(0));
        assert!(timestamp(i64::MIN) < timestamp(0));
        assert_eq!(optional_timestamp(0), None);
        assert_eq!(optional_timestamp(5), Some(timestamp(5)));
    }

    #[test]
    fn timeouts_round_up_to_seconds() {
        let table = [
            (Duration::ZERO, 0),
            (Duration::from_millis(1), 1),
            (Duration::from_secs(30), 30),
            (Duration::from_millis(30_001), 31),
            (Duration::MAX, i64::MAX),
        ];
        for (d, secs) in table {
            assert_eq!(whole_seconds(d), secs, "{d:?}");
        }
    }

    #[test]
    fn resources() {
        assert_eq!(
            linux_resources(&ContainerResources::default()),
            cri::LinuxContainerResources::default()
        );
        let r = ContainerResources {
            cpu_shares: Some(512),
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            memory_limit_bytes: Some(128 << 20),
            oom_score_adj: Some(-997),
            cpuset_cpus: Some("1-2".into()),
        };
        let got = linux_resources(&r);
        assert_eq!(got.cpuset_cpus, "1-2");
        assert_eq!(got.cpu_shares, 512);
        assert_eq!(got.cpu_quota, 50_000);
        assert_eq!(got.cpu_period, 100_000);
        assert_eq!(got.memory_limit_in_bytes, 128 << 20);
        assert_eq!(got.oom_score_adj, -997);
        let huge = ContainerResources {
            memory_limit_bytes: Some(u64::MAX),
            ..Default::default()
        };
        assert_eq!(linux_resources(&huge).memory_limit_in_bytes, i64::MAX);
    }

    #[test]
    fn namespaces() {
        use cri::NamespaceMode as M;
        // (hostNetwork, hostPID, shareProcessNamespace, hostIPC) -> (network, pid, ipc)
        let table = [
            ((false, false, false, false), (M::Pod, M::Container, M::Pod)),
            ((true, false, false, false), (M::Node, M::Container, M::Pod)),
            ((false, true, false, false), (M::Pod, M::Node, M::Pod)),
            ((false, false, true, false), (M::Pod, M::Pod, M::Pod)),
            // hostPID wins over shareProcessNamespace.
            ((false, true, true, false), (M::Pod, M::Node, M::Pod)),
            ((false, false, false, true), (M::Pod, M::Container, M::Node)),
            ((false, false, true, true), (M::Pod, M::Pod, M::Node)),
            ((true, true, false, true), (M::Node, M::Node, M::Node)),
            ((true, true, true, true), (M::Node, M::Node, M::Node)),
        ];
        for ((net, pid, share, ipc), want) in table {
            let p = PodSandboxConfig {
                host_network: net,
                host_pid: pid,
                share_process_namespace: share,
                host_ipc: ipc,
                ..Default::default()
            };
            let ns = namespace_options(&p);
            let case = format!("net={net} pid={pid} share={share} ipc={ipc}");
            assert_eq!((ns.network(), ns.pid(), ns.ipc()), want, "{case}");
            assert!(ns.target_id.is_empty(), "{case}");
            assert!(ns.userns_options.is_none(), "{case}");

            // The sandbox and its containers get the same options.
            let sandbox = sandbox_config(&p).unwrap();
            let sandbox_ns = sandbox
                .linux
                .unwrap()
                .security_context
                .unwrap()
                .namespace_options;
            assert_eq!(sandbox_ns.as_ref(), Some(&ns), "{case}");
            let container = container_config(&ContainerConfig::default(), &p).unwrap();
            let container_ns = container
                .linux
                .unwrap()
                .security_context
                .unwrap()
                .namespace_options;
            assert_eq!(container_ns.as_ref(), Some(&ns), "{case}");
        }
    }

    #[test]
    fn protocols() {
        let table = [
            ("TCP", cri::Protocol::Tcp),
            ("UDP", cri::Protocol::Udp),
            ("SCTP", cri::Protocol::Sctp),
        ];
        for (name, want) in table {
            assert_eq!(protocol(name).unwrap(), want, "{name}");
        }
        for bad in ["", "tcp", "QUIC"] {
            match protocol(bad) {
                Err(Error::InvalidArgument(msg)) => {
                    assert!(msg.contains(&format!("{bad:?}")), "{msg}")
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn bad_port_protocol_fails_the_sandbox() {
        let mut p = pod();
        p.port_mappings.push(PortMapping {
            protocol: "QUIC".into(),
            container_port: 443,
            host_port: 443,
            host_ip: String::new(),
        });
        match sandbox_config(&p) {
            Err(Error::InvalidArgument(msg)) => assert!(msg.contains("\"QUIC\""), "{msg}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unset_security_is_minimal() {
        let sandbox = sandbox_config(&PodSandboxConfig::default()).unwrap();
        assert!(sandbox.dns_config.is_none());
        assert!(sandbox.port_mappings.is_empty());
        let linux = sandbox.linux.unwrap();
        assert!(linux.sysctls.is_empty());
        let sc = linux.security_context.unwrap();
        assert_eq!(
            sc,
            cri::LinuxSandboxSecurityContext {
                namespace_options: sc.namespace_options.clone(),
                ..Default::default()
            }
        );
        assert!(sc.run_as_user.is_none() && sc.run_as_group.is_none());

        let container =
            container_config(&ContainerConfig::default(), &PodSandboxConfig::default()).unwrap();
        assert!(container.devices.is_empty());
        let sc = container.linux.unwrap().security_context.unwrap();
        assert_eq!(
            sc,
            cri::LinuxContainerSecurityContext {
                namespace_options: sc.namespace_options.clone(),
                ..Default::default()
            }
        );
        assert!(sc.capabilities.is_none());

        // Only dropping is enough to send capabilities.
        let drop_all = ContainerConfig {
            security: ContainerSecurity {
                capabilities_drop: vec!["ALL".into()],
                ..Default::default()
            },
            ..Default::default()
        };
        let got = container_config(&drop_all, &PodSandboxConfig::default()).unwrap();
        let caps = got.linux.unwrap().security_context.unwrap().capabilities;
        assert_eq!(
            caps,
            Some(cri::Capability {
                drop_capabilities: vec!["ALL".into()],
                ..Default::default()
            })
        );
        // Root is a real value, not "unset".
        let root = ContainerConfig {
            security: ContainerSecurity {
                run_as_user: Some(0),
                ..Default::default()
            },
            ..Default::default()
        };
        let got = container_config(&root, &PodSandboxConfig::default()).unwrap();
        let sc = got.linux.unwrap().security_context.unwrap();
        assert_eq!(sc.run_as_user, Some(cri::Int64Value { value: 0 }));
        assert_eq!(sc.run_as_group, None);
    }

    fn pod() -> PodSandboxConfig {
        PodSandboxConfig {
            metadata: PodMetadata {
                name: "web".into(),
                namespace: "default".into(),
                uid: "uid-1".into(),
                attempt: 2,
            },
            hostname: "web".into(),
            log_directory: "/var/log/pods/default_web_uid-1".into(),
            labels: [("app".to_owned(), "web".to_owned())].into(),
            annotations: [("a".to_owned(), "b".to_owned())].into(),
            runtime_handler: String::new(),
            cgroup_parent: Some("/kubepods/burstable/poduid-1".into()),
            oom_score_adj: None,
            host_network: true,
            host_pid: false,
            host_ipc: true,
            share_process_namespace: true,
            dns: Some(DnsConfig {
                servers: vec!["10.96.0.10".into()],
                searches: vec!["default.svc.cluster.local".into(), "cluster.local".into()],
                options: vec!["ndots:5".into()],
            }),
            port_mappings: vec![
                PortMapping {
                    protocol: "TCP".into(),
                    container_port: 8080,
                    host_port: 80,
                    host_ip: String::new(),
                },
                PortMapping {
                    protocol: "UDP".into(),
                    container_port: 53,
                    host_port: 5353,
                    host_ip: "127.0.0.1".into(),
                },
                PortMapping {
                    protocol: "SCTP".into(),
                    container_port: 9,
                    host_port: 9009,
                    host_ip: "::1".into(),
                },
            ],
            sysctls: [
                (
                    "net.ipv4.ip_unprivileged_port_start".to_owned(),
                    "0".to_owned(),
                ),
                ("kernel.shm_rmid_forced".to_owned(), "1".to_owned()),
            ]
            .into(),
            security: SandboxSecurity {
                run_as_user: Some(1000),
                run_as_group: Some(3000),
                supplemental_groups: vec![2000, 4000],
                privileged: true,
                // A pod-wide process's user: nothing of CRI's (the pause container
                // runs as the pod's own runAsUser above).
                containers_run_as_user: Some(1000),
                containers_run_as_group: Some(3000),
            },
        }
    }

    #[test]
    fn sandbox_config_is_complete() {
        let c = sandbox_config(&pod()).unwrap();
        let m = c.metadata.unwrap();
        assert_eq!(
            (
                m.name.as_str(),
                m.namespace.as_str(),
                m.uid.as_str(),
                m.attempt
            ),
            ("web", "default", "uid-1", 2)
        );
        assert_eq!(c.hostname, "web");
        assert_eq!(c.log_directory, "/var/log/pods/default_web_uid-1");
        assert_eq!(c.labels["app"], "web");
        assert_eq!(c.annotations["a"], "b");
        assert_eq!(
            c.dns_config,
            Some(cri::DnsConfig {
                servers: vec!["10.96.0.10".into()],
                searches: vec!["default.svc.cluster.local".into(), "cluster.local".into()],
                options: vec!["ndots:5".into()],
            })
        );
        assert_eq!(
            c.port_mappings,
            [
                cri::PortMapping {
                    protocol: cri::Protocol::Tcp.into(),
                    container_port: 8080,
                    host_port: 80,
                    host_ip: String::new(),
                },
                cri::PortMapping {
                    protocol: cri::Protocol::Udp.into(),
                    container_port: 53,
                    host_port: 5353,
                    host_ip: "127.0.0.1".into(),
                },
                cri::PortMapping {
                    protocol: cri::Protocol::Sctp.into(),
                    container_port: 9,
                    host_port: 9009,
                    host_ip: "::1".into(),
                },
            ]
        );
        assert_eq!(c.port_mappings[1].protocol, 1, "UDP on the wire");
        assert_eq!(c.port_mappings[2].protocol, 2, "SCTP on the wire");
        let linux = c.linux.unwrap();
        assert_eq!(linux.cgroup_parent, "/kubepods/burstable/poduid-1");
        assert_eq!(linux.sysctls.len(), 2);
        assert_eq!(linux.sysctls["net.ipv4.ip_unprivileged_port_start"], "0");
        assert_eq!(linux.sysctls["kernel.shm_rmid_forced"], "1");
        let sc = linux.security_context.unwrap();
        assert_eq!(sc.run_as_user, Some(cri::Int64Value { value: 1000 }));
        assert_eq!(sc.run_as_group, Some(cri::Int64Value { value: 3000 }));
        assert_eq!(sc.supplemental_groups, [2000, 4000]);
        assert!(sc.privileged);
        assert!(!sc.readonly_rootfs);
        let ns = sc.namespace_options.unwrap();
        use cri::NamespaceMode as M;
        // hostNetwork, shareProcessNamespace and hostIPC in pod().
        assert_eq!(
            (ns.network(), ns.pid(), ns.ipc()),
            (M::Node, M::Pod, M::Node)
        );
        assert_eq!(ns, namespace_options(&pod()));
    }

    #[test]
    fn container_config_is_complete() {
        let c = ContainerConfig {
            metadata: ContainerMetadata {
                name: "app".into(),
                attempt: 3,
            },
            image: "docker.io/library/busybox:latest".into(),
            command: vec!["sh".into(), "-c".into()],
            args: vec!["exit 3".into()],
            working_dir: Some("/tmp".into()),
            env: vec![("A".into(), "1".into()), ("A".into(), "2".into())],
            mounts: vec![Mount {
                container_path: "/data".into(),
                host_path: "/var/lib/wasmlet/pods/uid-1/volumes/data".into(),
                readonly: true,
            }],
            log_path: "app/3.log".into(),
            labels: [("l".to_owned(), "1".to_owned())].into(),
            annotations: [("n".to_owned(), "2".to_owned())].into(),
            resources: ContainerResources {
                cpu_shares: Some(2),
                cpu_quota: Some(20_000),
                cpu_period: Some(100_000),
                memory_limit_bytes: Some(64 << 20),
                oom_score_adj: Some(1000),
                cpuset_cpus: None,
            },
            devices: vec![
                Device {
                    container_path: "/dev/fuse".into(),
                    host_path: "/dev/fuse".into(),
                    permissions: "rwm".into(),
                },
                Device {
                    container_path: "/dev/gpu0".into(),
                    host_path: "/dev/nvidia0".into(),
                    permissions: "rw".into(),
                },
            ],
            cdi_devices: vec!["vendor.com/gpu=gpu0".into()],
            security: ContainerSecurity {
                privileged: true,
                run_as_user: Some(1001),
                run_as_group: Some(3001),
                supplemental_groups: vec![5000],
                readonly_rootfs: true,
                no_new_privs: true,
                capabilities_add: vec!["NET_ADMIN".into(), "SYS_TIME".into()],
                capabilities_drop: vec!["ALL".into()],
                masked_paths: vec!["/proc/kcore".into()],
                readonly_paths: vec!["/proc/sys".into()],
            },
            stdin: true,
            stdin_once: true,
            tty: true,
            ports: vec![8080],
        };
        let mut sandbox = pod();
        sandbox.host_network = false;
        sandbox.host_pid = true;
        sandbox.host_ipc = false;
        let got = container_config(&c, &sandbox).unwrap();
        assert_eq!(got.metadata.as_ref().unwrap().attempt, 3);
        let image = got.image.unwrap();
        assert_eq!(image.image, "docker.io/library/busybox:latest");
        assert_eq!(
            image.user_specified_image,
            "docker.io/library/busybox:latest"
        );
        assert_eq!(got.command, ["sh", "-c"]);
        assert_eq!(got.args, ["exit 3"]);
        assert_eq!(got.working_dir, "/tmp");
        let envs: Vec<_> = got
            .envs
            .iter()
            .map(|kv| (kv.key.as_str(), kv.value.as_str()))
            .collect();
        assert_eq!(envs, [("A", "1"), ("A", "2")], "order is kept");
        assert_eq!(got.mounts.len(), 1);
        assert_eq!(got.mounts[0].container_path, "/data");
        assert_eq!(
            got.mounts[0].host_path,
            "/var/lib/wasmlet/pods/uid-1/volumes/data"
        );
        assert!(got.mounts[0].readonly);
        assert_eq!(got.log_path, "app/3.log");
        assert_eq!(got.labels["l"], "1");
        assert_eq!(got.annotations["n"], "2");
        assert!(got.stdin && got.stdin_once && got.tty);
        assert_eq!(got.cdi_devices[0].name, "vendor.com/gpu=gpu0");
        assert_eq!(
            got.devices,
            [
                cri::Device {
                    container_path: "/dev/fuse".into(),
                    host_path: "/dev/fuse".into(),
                    permissions: "rwm".into(),
                },
                cri::Device {
                    container_path: "/dev/gpu0".into(),
                    host_path: "/dev/nvidia0".into(),
                    permissions: "rw".into(),
                },
            ]
        );
        let linux = got.linux.unwrap();
        assert_eq!(linux.resources, Some(linux_resources(&c.resources)));
        let r = linux.resources.unwrap();
        assert_eq!(
            (
                r.cpu_shares,
                r.cpu_quota,
                r.cpu_period,
                r.memory_limit_in_bytes,
                r.oom_score_adj
            ),
            (2, 20_000, 100_000, 64 << 20, 1000)
        );
        let sc = linux.security_context.unwrap();
        assert!(sc.privileged);
        assert_eq!(sc.run_as_user, Some(cri::Int64Value { value: 1001 }));
        assert_eq!(sc.run_as_group, Some(cri::Int64Value { value: 3001 }));
        assert_eq!(sc.supplemental_groups, [5000]);
        assert!(sc.readonly_rootfs);
        assert!(sc.no_new_privs);
        assert_eq!(sc.masked_paths, ["/proc/kcore"]);
        assert_eq!(sc.readonly_paths, ["/proc/sys"]);
        assert_eq!(
            sc.capabilities,
            Some(cri::Capability {
                add_capabilities: vec!["NET_ADMIN".into(), "SYS_TIME".into()],
                drop_capabilities: vec!["ALL".into()],
                add_ambient_capabilities: Vec::new(),
            })
        );
        assert!(sc.run_as_username.is_empty());
        let ns = sc.namespace_options.unwrap();
        use cri::NamespaceMode as M;
        assert_eq!(
            (ns.network(), ns.pid(), ns.ipc()),
            (M::Pod, M::Node, M::Pod)
        );
        assert_eq!(ns, namespace_options(&sandbox));
    }

    #[test]
    fn non_utf8_paths_are_rejected() {
        use std::os::unix::ffi::OsStrExt;
        let mut p = pod();
        p.log_directory = PathBuf::from(std::ffi::OsStr::from_bytes(b"/var/log/\xff"));
        assert!(matches!(sandbox_config(&p), Err(Error::InvalidArgument(_))));
        let c = ContainerConfig {
            devices: vec![Device {
                container_path: "/dev/x".into(),
                host_path: PathBuf::from(std::ffi::OsStr::from_bytes(b"/dev/\xff")),
                permissions: "r".into(),
            }],
            ..Default::default()
        };
        assert!(matches!(
            container_config(&c, &pod()),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn container_status_conversion() {
        let s = cri::ContainerStatus {
            id: "c1".into(),
            metadata: Some(cri::ContainerMetadata {
                name: "app".into(),
                attempt: 1,
            }),
            state: cri::ContainerState::ContainerExited.into(),
            created_at: 1_000_000_000,
            started_at: 2_000_000_000,
            finished_at: 3_000_000_000,
            exit_code: 3,
            image: Some(image_spec("busybox:latest")),
            image_ref: "sha256:abc".into(),
            reason: "Error".into(),
            message: "bye".into(),
            log_path: "/var/log/pods/x/app/1.log".into(),
            ..Default::default()
        };
        let got = container_status(s, "s1".into());
        assert_eq!(got.sandbox_id, "s1");
        assert_eq!(got.metadata.name, "app");
        assert_eq!(got.state, ContainerState::Exited);
        assert_eq!(got.created_at.as_second(), 1);
        assert_eq!(got.started_at.unwrap().as_second(), 2);
        assert_eq!(got.finished_at.unwrap().as_second(), 3);
        assert_eq!(got.exit_code, 3);
        assert_eq!(got.image, "busybox:latest");
        assert_eq!(got.image_ref, "sha256:abc");
        assert_eq!(
            (got.reason.as_str(), got.message.as_str()),
            ("Error", "bye")
        );
        assert_eq!(got.log_path, PathBuf::from("/var/log/pods/x/app/1.log"));

        let created = cri::ContainerStatus {
            state: cri::ContainerState::ContainerCreated.into(),
            created_at: 1,
            ..Default::default()
        };
        let got = container_status(created, String::new());
        assert_eq!(got.state, ContainerState::Created);
        assert_eq!((got.started_at, got.finished_at), (None, None));
    }

    #[test]
    fn sandbox_status_conversion() {
        let s = cri::PodSandboxStatus {
            id: "s1".into(),
            state: cri::PodSandboxState::SandboxNotready.into(),
            network: Some(cri::PodSandboxNetworkStatus {
                ip: "10.88.0.5".into(),
                additional_ips: vec![cri::PodIp {
                    ip: "fd00::5".into(),
                }],
            }),
            runtime_handler: "runc".into(),
            ..Default::default()
        };
        let got = pod_sandbox_status(s);
        assert_eq!(got.state, SandboxState::NotReady);
        assert_eq!(got.ip.as_deref(), Some("10.88.0.5"));
        assert_eq!(got.additional_ips, ["fd00::5"]);
        assert_eq!(got.runtime_handler, "runc");
        let host = pod_sandbox_status(cri::PodSandboxStatus::default());
        assert_eq!(host.ip, None);
    }

    #[test]
    fn readiness_from_conditions() {
        let cond = |t: &str, status: bool, reason: &str, message: &str| cri::RuntimeCondition {
            r#type: t.into(),
            status,
            reason: reason.into(),
            message: message.into(),
        };
        let all = |conditions| Some(cri::RuntimeStatus { conditions });

        let ok = runtime_status(all(vec![
            cond("RuntimeReady", true, "", ""),
            cond("NetworkReady", true, "", ""),
        ]));
        assert!(ok.runtime_ready && ok.network_ready);
        assert_eq!(ok.message, "");

        let no_cni = runtime_status(all(vec![
            cond("RuntimeReady", true, "", ""),
            cond(
                "NetworkReady",
                false,
                "NetworkPluginNotReady",
                "cni plugin not initialized",
            ),
        ]));
        assert!(no_cni.runtime_ready);
        assert!(!no_cni.network_ready);
        assert_eq!(
            no_cni.message,
            "NetworkReady=false reason:NetworkPluginNotReady message:cni plugin not initialized"
        );

        let empty = runtime_status(None);
        assert!(!empty.runtime_ready && !empty.network_ready);
        assert!(empty.message.contains("RuntimeReady condition missing"));
    }
}
