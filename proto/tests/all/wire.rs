//! Encodes and decodes generated messages and compares the bytes with
//! protobuf keys computed by hand from upstream field numbers:
//! key = field_number << 3 | wire_type (0 = varint, 2 = length-delimited).

use prost::Message as _;
use wasmlet_proto::cri::v1 as cri;
use wasmlet_proto::csi::v1 as csi;
use wasmlet_proto::deviceplugin::v1beta1 as dp;
use wasmlet_proto::pluginregistration::v1 as reg;

/// A length-delimited field holding `payload`, for fields 1..=15.
fn len_field(field: u8, payload: &[u8]) -> Vec<u8> {
    assert!((1..=15).contains(&field));
    let mut out = vec![field << 3 | 2, u8::try_from(payload.len()).unwrap()];
    out.extend_from_slice(payload);
    out
}

#[test]
fn version_request_is_field_1() {
    let msg = cri::VersionRequest {
        version: "v1".into(),
    };
    assert_eq!(msg.encode_to_vec(), len_field(1, b"v1"));
}

#[test]
fn container_config_log_path_is_field_11() {
    let msg = cri::ContainerConfig {
        log_path: "app/0.log".into(),
        ..Default::default()
    };
    assert_eq!(msg.encode_to_vec(), len_field(11, b"app/0.log"));
    assert_eq!(msg.encode_to_vec()[0], 0x5a);
}

#[test]
fn container_config_stop_signal_is_field_18() {
    let mut msg = cri::ContainerConfig::default();
    msg.set_stop_signal(cri::Signal::Sigterm);
    // Field 18, varint: key 144 = 0x90 0x01; SIGTERM is 23 upstream.
    assert_eq!(msg.encode_to_vec(), [0x90, 0x01, 23]);
}

#[test]
fn pod_sandbox_config_log_directory_and_cgroup_parent() {
    let msg = cri::PodSandboxConfig {
        log_directory: "/var/log/pods/ns_p_u".into(),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: "kubepods".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut want = len_field(3, b"/var/log/pods/ns_p_u");
    want.extend(len_field(8, &len_field(1, b"kubepods")));
    assert_eq!(msg.encode_to_vec(), want);
}

#[test]
fn container_security_context_run_as_group_is_field_12() {
    let msg = cri::LinuxContainerSecurityContext {
        run_as_group: Some(cri::Int64Value { value: 1000 }),
        ..Default::default()
    };
    // Int64Value { value = 1 } holding 1000 = varint 0xe8 0x07.
    assert_eq!(msg.encode_to_vec(), len_field(12, &[0x08, 0xe8, 0x07]));
}

#[test]
fn image_spec_runtime_handler_is_field_19() {
    let msg = cri::ImageSpec {
        runtime_handler: "wasmtime".into(),
        ..Default::default()
    };
    // Field 19, length-delimited: key 154 = 0x9a 0x01.
    let mut want = vec![0x9a, 0x01, 8];
    want.extend_from_slice(b"wasmtime");
    assert_eq!(msg.encode_to_vec(), want);
}

#[test]
fn container_status_from_a_peer_decodes() {
    // What a runtime sends for an OOM-killed container. Upstream numbers:
    // state = 3, exit_code = 7, reason = 10, image_id = 17; EXITED = 2.
    let mut bytes = vec![0x18, 0x02]; // state: CONTAINER_EXITED
    bytes.extend([0x38, 0x89, 0x01]); // exit_code: 137
    bytes.extend(len_field(10, b"OOMKilled"));
    bytes.extend([0x8a, 0x01, 6]); // field 17, length-delimited
    bytes.extend_from_slice(b"sha256");
    let status = cri::ContainerStatus::decode(bytes.as_slice()).unwrap();
    assert_eq!(status.state(), cri::ContainerState::ContainerExited);
    assert_eq!(status.exit_code, 137);
    assert_eq!(status.reason, "OOMKilled");
    assert_eq!(status.image_id, "sha256");
}

#[test]
fn cri_enum_values_match_upstream() {
    assert_eq!(cri::Signal::Sigkill as i32, 13);
    assert_eq!(cri::Signal::Sigterm as i32, 23);
    assert_eq!(cri::Signal::Sigrtmax as i32, 65);
    assert_eq!(cri::NamespaceMode::Target as i32, 3);
    assert_eq!(cri::ContainerState::ContainerUnknown as i32, 3);
    assert_eq!(cri::PodSandboxState::SandboxNotready as i32, 1);
    assert_eq!(cri::CgroupDriver::Cgroupfs as i32, 1);
    assert_eq!(cri::SupplementalGroupsPolicy::Strict as i32, 1);
    assert_eq!(cri::MountPropagation::PropagationBidirectional as i32, 2);
    assert_eq!(cri::Protocol::Sctp as i32, 2);
    assert_eq!(cri::ContainerEventType::ContainerDeletedEvent as i32, 3);
    assert_eq!(cri::MetricType::Gauge as i32, 1);
    assert_eq!(cri::security_profile::ProfileType::Localhost as i32, 2);
}

#[test]
fn device_plugin_register_request() {
    let msg = dp::RegisterRequest {
        version: "v1beta1".into(),
        endpoint: "gpu.sock".into(),
        resource_name: "example.com/gpu".into(),
        options: Some(dp::DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }),
    };
    let mut want = len_field(1, b"v1beta1");
    want.extend(len_field(2, b"gpu.sock"));
    want.extend(len_field(3, b"example.com/gpu"));
    want.extend(len_field(4, &[0x10, 0x01]));
    assert_eq!(msg.encode_to_vec(), want);
}

#[test]
fn device_plugin_cdi_devices_is_field_5() {
    let msg = dp::ContainerAllocateResponse {
        cdi_devices: vec![dp::CdiDevice {
            name: "v.com/gpu=0".into(),
        }],
        ..Default::default()
    };
    assert_eq!(
        msg.encode_to_vec(),
        len_field(5, &len_field(1, b"v.com/gpu=0"))
    );
}

#[test]
fn plugin_info_supported_versions_is_field_4() {
    let msg = reg::PluginInfo {
        r#type: "CSIPlugin".into(),
        supported_versions: vec!["1.0.0".into()],
        ..Default::default()
    };
    let mut want = len_field(1, b"CSIPlugin");
    want.extend(len_field(4, b"1.0.0"));
    assert_eq!(msg.encode_to_vec(), want);
}

#[test]
fn csi_node_publish_volume_request() {
    let msg = csi::NodePublishVolumeRequest {
        volume_id: "vol".into(),
        target_path: "/t".into(),
        readonly: true,
        ..Default::default()
    };
    let mut want = len_field(1, b"vol");
    want.extend(len_field(4, b"/t"));
    want.extend([6 << 3, 0x01]);
    assert_eq!(msg.encode_to_vec(), want);
}

#[test]
fn csi_probe_ready_is_a_bool_wrapper() {
    let msg = csi::ProbeResponse { ready: Some(true) };
    // BoolValue { value = 1 } inside field 1.
    assert_eq!(msg.encode_to_vec(), len_field(1, &[0x08, 0x01]));
    // An explicit `false` is still sent, unlike a plain proto3 bool.
    let not_ready = csi::ProbeResponse { ready: Some(false) };
    assert_eq!(not_ready.encode_to_vec(), len_field(1, &[]));
    assert_eq!(
        csi::ProbeResponse::decode(len_field(1, &[]).as_slice())
            .unwrap()
            .ready,
        Some(false)
    );
}

#[test]
fn csi_mount_volume_group_is_field_3() {
    let msg = csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Mount(
            csi::volume_capability::MountVolume {
                volume_mount_group: "2000".into(),
                ..Default::default()
            },
        )),
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: csi::volume_capability::access_mode::Mode::SingleNodeMultiWriter as i32,
        }),
    };
    let mut want = len_field(2, &len_field(3, b"2000"));
    want.extend(len_field(3, &[0x08, 7]));
    assert_eq!(msg.encode_to_vec(), want);
}
