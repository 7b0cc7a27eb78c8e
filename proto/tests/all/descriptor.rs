//! Checks of the compiled `FileDescriptorSet` against facts copied from the
//! upstream definitions (CRI v1 of k8s.io/cri-api v0.33, deviceplugin v1beta1
//! and pluginregistration v1 of k8s.io/kubelet v0.33, CSI spec v1.9.0).

use std::collections::BTreeSet;

use prost::Message as _;
use prost_types::{DescriptorProto, FileDescriptorProto, FileDescriptorSet};

fn descriptor_set() -> FileDescriptorSet {
    FileDescriptorSet::decode(wasmlet_proto::FILE_DESCRIPTOR_SET)
        .expect("FILE_DESCRIPTOR_SET decodes")
}

fn file<'a>(set: &'a FileDescriptorSet, package: &str) -> &'a FileDescriptorProto {
    set.file
        .iter()
        .find(|file| file.package() == package)
        .unwrap_or_else(|| panic!("no file with package {package}"))
}

/// Finds a message by its dotted path inside a package, e.g.
/// `VolumeCapability.MountVolume`.
fn message<'a>(file: &'a FileDescriptorProto, path: &str) -> &'a DescriptorProto {
    let mut parts = path.split('.');
    let first = parts.next().expect("non-empty path");
    let mut found = file
        .message_type
        .iter()
        .find(|m| m.name() == first)
        .unwrap_or_else(|| panic!("no message {first} in {}", file.package()));
    for part in parts {
        found = found
            .nested_type
            .iter()
            .find(|m| m.name() == part)
            .unwrap_or_else(|| panic!("no nested message {part} in {path}"));
    }
    found
}

/// Asserts `message.field` has `number` in the given package.
fn assert_fields(package: &str, facts: &[(&str, &str, i32)]) {
    let set = descriptor_set();
    let file = file(&set, package);
    let mut wrong = Vec::new();
    for &(msg, field, number) in facts {
        let descriptor = message(file, msg);
        match descriptor.field.iter().find(|f| f.name() == field) {
            Some(f) if f.number() == number => {}
            Some(f) => wrong.push(format!(
                "{package}.{msg}.{field}: got {} want {number}",
                f.number()
            )),
            None => wrong.push(format!("{package}.{msg}.{field}: missing")),
        }
    }
    assert!(
        wrong.is_empty(),
        "field numbers differ from upstream:\n{}",
        wrong.join("\n")
    );
}

/// Returns the method names of a service, in declaration order.
fn methods(package: &str, service: &str) -> Vec<String> {
    let set = descriptor_set();
    let file = file(&set, package);
    let service = file
        .service
        .iter()
        .find(|s| s.name() == service)
        .unwrap_or_else(|| panic!("no service {service} in {package}"));
    service.method.iter().map(|m| m.name().to_owned()).collect()
}

/// Every RuntimeService RPC of k8s.io/cri-api v0.33.x, in upstream order.
pub const RUNTIME_SERVICE_RPCS: &[&str] = &[
    "Version",
    "RunPodSandbox",
    "StopPodSandbox",
    "RemovePodSandbox",
    "PodSandboxStatus",
    "ListPodSandbox",
    "CreateContainer",
    "StartContainer",
    "StopContainer",
    "RemoveContainer",
    "ListContainers",
    "ContainerStatus",
    "UpdateContainerResources",
    "ReopenContainerLog",
    "ExecSync",
    "Exec",
    "Attach",
    "PortForward",
    "ContainerStats",
    "ListContainerStats",
    "PodSandboxStats",
    "ListPodSandboxStats",
    "UpdateRuntimeConfig",
    "Status",
    "CheckpointContainer",
    "GetContainerEvents",
    "ListMetricDescriptors",
    "ListPodSandboxMetrics",
    "RuntimeConfig",
    "UpdatePodSandboxResources",
];

/// Every ImageService RPC of k8s.io/cri-api v0.33.x, in upstream order.
pub const IMAGE_SERVICE_RPCS: &[&str] = &[
    "ListImages",
    "ImageStatus",
    "PullImage",
    "RemoveImage",
    "ImageFsInfo",
];

#[test]
fn cri_services_have_exactly_the_upstream_rpcs() {
    assert_eq!(
        methods("runtime.v1", "RuntimeService"),
        RUNTIME_SERVICE_RPCS
    );
    assert_eq!(methods("runtime.v1", "ImageService"), IMAGE_SERVICE_RPCS);
}

#[test]
fn other_services_have_exactly_the_upstream_rpcs() {
    assert_eq!(methods("v1beta1", "Registration"), ["Register"]);
    assert_eq!(
        methods("v1beta1", "DevicePlugin"),
        [
            "GetDevicePluginOptions",
            "ListAndWatch",
            "GetPreferredAllocation",
            "Allocate",
            "PreStartContainer",
        ]
    );
    assert_eq!(
        methods("pluginregistration", "Registration"),
        ["GetInfo", "NotifyRegistrationStatus"]
    );
    assert_eq!(
        methods("csi.v1", "Identity"),
        ["GetPluginInfo", "GetPluginCapabilities", "Probe"]
    );
    assert_eq!(
        methods("csi.v1", "Node"),
        [
            "NodeStageVolume",
            "NodeUnstageVolume",
            "NodePublishVolume",
            "NodeUnpublishVolume",
            "NodeGetVolumeStats",
            "NodeExpandVolume",
            "NodeGetCapabilities",
            "NodeGetInfo",
        ]
    );
}

#[test]
fn full_method_paths_exist() {
    let set = descriptor_set();
    let paths: BTreeSet<String> = set
        .file
        .iter()
        .flat_map(|file| {
            file.service.iter().flat_map(move |service| {
                service.method.iter().map(move |method| {
                    format!("/{}.{}/{}", file.package(), service.name(), method.name())
                })
            })
        })
        .collect();
    for path in [
        "/runtime.v1.RuntimeService/RunPodSandbox",
        "/runtime.v1.ImageService/PullImage",
        "/v1beta1.Registration/Register",
        "/v1beta1.DevicePlugin/Allocate",
        "/csi.v1.Node/NodePublishVolume",
        "/csi.v1.Identity/Probe",
        "/pluginregistration.Registration/GetInfo",
    ] {
        assert!(paths.contains(path), "{path} missing from {paths:#?}");
    }
}

#[test]
fn streaming_rpcs_are_server_streaming_only() {
    let set = descriptor_set();
    let streaming: Vec<String> = set
        .file
        .iter()
        .filter(|file| !file.package().starts_with("google."))
        .flat_map(|file| {
            file.service.iter().flat_map(move |service| {
                service
                    .method
                    .iter()
                    .filter(|m| m.client_streaming() || m.server_streaming())
                    .map(move |m| {
                        assert!(!m.client_streaming(), "{} is client-streaming", m.name());
                        format!("{}.{}/{}", file.package(), service.name(), m.name())
                    })
            })
        })
        .collect();
    assert_eq!(
        streaming,
        [
            "runtime.v1.RuntimeService/GetContainerEvents",
            "v1beta1.DevicePlugin/ListAndWatch",
            "grpc.health.v1.Health/Watch",
        ]
    );
}

#[test]
fn cri_field_numbers_match_upstream() {
    assert_fields(
        "runtime.v1",
        &[
            ("ContainerConfig", "metadata", 1),
            ("ContainerConfig", "image", 2),
            ("ContainerConfig", "command", 3),
            ("ContainerConfig", "args", 4),
            ("ContainerConfig", "working_dir", 5),
            ("ContainerConfig", "envs", 6),
            ("ContainerConfig", "mounts", 7),
            ("ContainerConfig", "devices", 8),
            ("ContainerConfig", "labels", 9),
            ("ContainerConfig", "annotations", 10),
            ("ContainerConfig", "log_path", 11),
            ("ContainerConfig", "stdin", 12),
            ("ContainerConfig", "stdin_once", 13),
            ("ContainerConfig", "tty", 14),
            ("ContainerConfig", "linux", 15),
            ("ContainerConfig", "windows", 16),
            ("ContainerConfig", "CDI_devices", 17),
            ("ContainerConfig", "stop_signal", 18),
            ("PodSandboxConfig", "metadata", 1),
            ("PodSandboxConfig", "hostname", 2),
            ("PodSandboxConfig", "log_directory", 3),
            ("PodSandboxConfig", "dns_config", 4),
            ("PodSandboxConfig", "port_mappings", 5),
            ("PodSandboxConfig", "labels", 6),
            ("PodSandboxConfig", "annotations", 7),
            ("PodSandboxConfig", "linux", 8),
            ("PodSandboxConfig", "windows", 9),
            ("PodSandboxMetadata", "attempt", 4),
            ("LinuxPodSandboxConfig", "cgroup_parent", 1),
            ("LinuxPodSandboxConfig", "security_context", 2),
            ("LinuxPodSandboxConfig", "sysctls", 3),
            ("LinuxPodSandboxConfig", "overhead", 4),
            ("LinuxPodSandboxConfig", "resources", 5),
            ("LinuxSandboxSecurityContext", "run_as_user", 3),
            ("LinuxSandboxSecurityContext", "readonly_rootfs", 4),
            ("LinuxSandboxSecurityContext", "supplemental_groups", 5),
            ("LinuxSandboxSecurityContext", "privileged", 6),
            ("LinuxSandboxSecurityContext", "seccomp_profile_path", 7),
            ("LinuxSandboxSecurityContext", "run_as_group", 8),
            ("LinuxSandboxSecurityContext", "seccomp", 9),
            ("LinuxSandboxSecurityContext", "apparmor", 10),
            (
                "LinuxSandboxSecurityContext",
                "supplemental_groups_policy",
                11,
            ),
            ("LinuxContainerSecurityContext", "capabilities", 1),
            ("LinuxContainerSecurityContext", "run_as_username", 6),
            ("LinuxContainerSecurityContext", "apparmor_profile", 9),
            ("LinuxContainerSecurityContext", "no_new_privs", 11),
            ("LinuxContainerSecurityContext", "run_as_group", 12),
            ("LinuxContainerSecurityContext", "masked_paths", 13),
            ("LinuxContainerSecurityContext", "readonly_paths", 14),
            ("LinuxContainerSecurityContext", "seccomp", 15),
            ("LinuxContainerSecurityContext", "apparmor", 16),
            (
                "LinuxContainerSecurityContext",
                "supplemental_groups_policy",
                17,
            ),
            ("LinuxContainerResources", "cpu_period", 1),
            ("LinuxContainerResources", "cpu_quota", 2),
            ("LinuxContainerResources", "cpu_shares", 3),
            ("LinuxContainerResources", "memory_limit_in_bytes", 4),
            ("LinuxContainerResources", "oom_score_adj", 5),
            ("LinuxContainerResources", "cpuset_cpus", 6),
            ("LinuxContainerResources", "cpuset_mems", 7),
            ("LinuxContainerResources", "hugepage_limits", 8),
            ("LinuxContainerResources", "unified", 9),
            ("LinuxContainerResources", "memory_swap_limit_in_bytes", 10),
            ("Mount", "uidMappings", 6),
            ("Mount", "gidMappings", 7),
            ("Mount", "recursive_read_only", 8),
            ("Mount", "image", 9),
            ("Mount", "image_sub_path", 10),
            ("ImageSpec", "annotations", 2),
            ("ImageSpec", "user_specified_image", 18),
            ("ImageSpec", "runtime_handler", 19),
            ("RunPodSandboxRequest", "runtime_handler", 2),
            ("CreateContainerRequest", "sandbox_config", 3),
            ("Container", "image_ref", 5),
            ("Container", "image_id", 10),
            ("ContainerStatus", "exit_code", 7),
            ("ContainerStatus", "reason", 10),
            ("ContainerStatus", "log_path", 15),
            ("ContainerStatus", "resources", 16),
            ("ContainerStatus", "image_id", 17),
            ("ContainerStatus", "user", 18),
            ("ContainerStatus", "stop_signal", 19),
            ("PodSandboxStatus", "runtime_handler", 9),
            ("PodSandboxStatusResponse", "containers_statuses", 3),
            ("PodSandboxStatusResponse", "timestamp", 4),
            ("ExecSyncResponse", "exit_code", 3),
            ("AuthConfig", "identity_token", 5),
            ("AuthConfig", "registry_token", 6),
            ("PullImageRequest", "sandbox_config", 3),
            ("Image", "spec", 7),
            ("Image", "pinned", 8),
            ("StatusResponse", "runtime_handlers", 3),
            ("StatusResponse", "features", 4),
            ("ImageFsInfoResponse", "container_filesystems", 2),
            ("ContainerStats", "swap", 5),
            ("ContainerStats", "io", 6),
            ("LinuxPodSandboxStats", "io", 6),
            ("CpuUsage", "psi", 4),
            ("MemoryUsage", "psi", 8),
            ("PsiStats", "Full", 1),
            ("PsiStats", "Some", 2),
            ("PsiData", "Avg300", 4),
            ("WindowsContainerResources", "affinity_cpus", 6),
            ("ContainerEventResponse", "containers_statuses", 5),
            ("Metric", "value", 5),
            ("CheckpointContainerRequest", "timeout", 3),
            ("UpdatePodSandboxResourcesRequest", "pod_sandbox_id", 1),
            ("UpdatePodSandboxResourcesRequest", "overhead", 2),
            ("UpdatePodSandboxResourcesRequest", "resources", 3),
        ],
    );
}

#[test]
fn plugin_api_field_numbers_match_upstream() {
    assert_fields(
        "v1beta1",
        &[
            ("RegisterRequest", "version", 1),
            ("RegisterRequest", "endpoint", 2),
            ("RegisterRequest", "resource_name", 3),
            ("RegisterRequest", "options", 4),
            ("DevicePluginOptions", "pre_start_required", 1),
            (
                "DevicePluginOptions",
                "get_preferred_allocation_available",
                2,
            ),
            ("Device", "ID", 1),
            ("Device", "health", 2),
            ("Device", "topology", 3),
            ("NUMANode", "ID", 1),
            (
                "ContainerPreferredAllocationRequest",
                "available_deviceIDs",
                1,
            ),
            (
                "ContainerPreferredAllocationRequest",
                "must_include_deviceIDs",
                2,
            ),
            ("ContainerPreferredAllocationRequest", "allocation_size", 3),
            ("ContainerAllocateResponse", "envs", 1),
            ("ContainerAllocateResponse", "mounts", 2),
            ("ContainerAllocateResponse", "devices", 3),
            ("ContainerAllocateResponse", "annotations", 4),
            ("ContainerAllocateResponse", "cdi_devices", 5),
            ("Mount", "read_only", 3),
            ("DeviceSpec", "permissions", 3),
        ],
    );
    assert_fields(
        "pluginregistration",
        &[
            ("PluginInfo", "type", 1),
            ("PluginInfo", "name", 2),
            ("PluginInfo", "endpoint", 3),
            ("PluginInfo", "supported_versions", 4),
            ("RegistrationStatus", "plugin_registered", 1),
            ("RegistrationStatus", "error", 2),
        ],
    );
}

#[test]
fn csi_field_numbers_match_upstream() {
    assert_fields(
        "csi.v1",
        &[
            ("GetPluginInfoResponse", "vendor_version", 2),
            ("GetPluginInfoResponse", "manifest", 3),
            ("GetPluginCapabilitiesResponse", "capabilities", 1),
            ("PluginCapability", "service", 1),
            ("PluginCapability", "volume_expansion", 2),
            ("ProbeResponse", "ready", 1),
            ("VolumeCapability", "block", 1),
            ("VolumeCapability", "mount", 2),
            ("VolumeCapability", "access_mode", 3),
            ("VolumeCapability.MountVolume", "fs_type", 1),
            ("VolumeCapability.MountVolume", "mount_flags", 2),
            ("VolumeCapability.MountVolume", "volume_mount_group", 3),
            ("NodeStageVolumeRequest", "volume_id", 1),
            ("NodeStageVolumeRequest", "publish_context", 2),
            ("NodeStageVolumeRequest", "staging_target_path", 3),
            ("NodeStageVolumeRequest", "volume_capability", 4),
            ("NodeStageVolumeRequest", "secrets", 5),
            ("NodeStageVolumeRequest", "volume_context", 6),
            ("NodeUnstageVolumeRequest", "staging_target_path", 2),
            ("NodePublishVolumeRequest", "volume_id", 1),
            ("NodePublishVolumeRequest", "publish_context", 2),
            ("NodePublishVolumeRequest", "staging_target_path", 3),
            ("NodePublishVolumeRequest", "target_path", 4),
            ("NodePublishVolumeRequest", "volume_capability", 5),
            ("NodePublishVolumeRequest", "readonly", 6),
            ("NodePublishVolumeRequest", "secrets", 7),
            ("NodePublishVolumeRequest", "volume_context", 8),
            ("NodeUnpublishVolumeRequest", "target_path", 2),
            ("NodeGetVolumeStatsRequest", "staging_target_path", 3),
            ("NodeGetVolumeStatsResponse", "usage", 1),
            ("NodeGetVolumeStatsResponse", "volume_condition", 2),
            ("VolumeUsage", "available", 1),
            ("VolumeUsage", "total", 2),
            ("VolumeUsage", "used", 3),
            ("VolumeUsage", "unit", 4),
            ("NodeGetInfoResponse", "node_id", 1),
            ("NodeGetInfoResponse", "max_volumes_per_node", 2),
            ("NodeGetInfoResponse", "accessible_topology", 3),
            ("NodeExpandVolumeRequest", "capacity_range", 3),
            ("NodeExpandVolumeRequest", "staging_target_path", 4),
            ("NodeExpandVolumeRequest", "volume_capability", 5),
            ("NodeExpandVolumeRequest", "secrets", 6),
            ("NodeExpandVolumeResponse", "capacity_bytes", 1),
        ],
    );
}

#[test]
fn csi_probe_uses_the_bool_wrapper() {
    let set = descriptor_set();
    let file = file(&set, "csi.v1");
    let ready = &message(file, "ProbeResponse").field[0];
    assert_eq!(ready.type_name(), ".google.protobuf.BoolValue");
}

#[test]
fn grpc_health_v1_matches_upstream() {
    assert_fields(
        "grpc.health.v1",
        &[
            ("HealthCheckRequest", "service", 1),
            ("HealthCheckResponse", "status", 1),
        ],
    );
    let set = descriptor_set();
    let file = file(&set, "grpc.health.v1");
    let status = &message(file, "HealthCheckResponse").enum_type[0];
    let values: Vec<(&str, i32)> = status
        .value
        .iter()
        .map(|v| (v.name(), v.number()))
        .collect();
    assert_eq!(
        values,
        [
            ("UNKNOWN", 0),
            ("SERVING", 1),
            ("NOT_SERVING", 2),
            ("SERVICE_UNKNOWN", 3)
        ]
    );
    let service = &file.service[0];
    assert_eq!(service.name(), "Health");
    let methods: Vec<&str> = service.method.iter().map(|m| m.name()).collect();
    assert_eq!(methods, ["Check", "Watch"]);
}
