//! Drives every generated client method through a recording transport and
//! checks the HTTP/2 `:path` each one puts on the wire.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codegen::http;
use tonic::codegen::{Service, StdError};

use wasmlet_proto::cri::v1 as cri;
use wasmlet_proto::csi::v1 as csi;
use wasmlet_proto::deviceplugin::v1beta1 as dp;
use wasmlet_proto::pluginregistration::v1 as reg;

use crate::descriptor::{IMAGE_SERVICE_RPCS, RUNTIME_SERVICE_RPCS};

/// A gRPC "channel" that records request paths and answers UNIMPLEMENTED.
#[derive(Clone, Default)]
struct Recorder {
    paths: Arc<Mutex<Vec<String>>>,
}

impl Recorder {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.paths.lock().unwrap())
    }
}

impl Service<http::Request<Body>> for Recorder {
    type Response = http::Response<Body>;
    type Error = StdError;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        self.paths
            .lock()
            .unwrap()
            .push(request.uri().path().to_owned());
        let response = tonic::Status::unimplemented("recorder").into_http::<Body>();
        std::future::ready(Ok::<_, Infallible>(response).map_err(StdError::from))
    }
}

fn expected(service: &str, rpcs: &[&str]) -> Vec<String> {
    rpcs.iter().map(|rpc| format!("/{service}/{rpc}")).collect()
}

/// Calls each listed client method with a default request; every call must
/// fail with UNIMPLEMENTED, proving it went through the recorder.
macro_rules! call_all {
    ($client:expr, $($method:ident),+ $(,)?) => {
        $(
            let status = $client.$method(tonic::Request::new(Default::default())).await.err().expect("recorder refuses");
            assert_eq!(status.code(), tonic::Code::Unimplemented, "{}", stringify!($method));
        )+
    };
}

#[tokio::test]
async fn runtime_service_client_paths() {
    let recorder = Recorder::default();
    let mut client = cri::runtime_service_client::RuntimeServiceClient::new(recorder.clone());
    call_all!(
        client,
        version,
        run_pod_sandbox,
        stop_pod_sandbox,
        remove_pod_sandbox,
        pod_sandbox_status,
        list_pod_sandbox,
        create_container,
        start_container,
        stop_container,
        remove_container,
        list_containers,
        container_status,
        update_container_resources,
        reopen_container_log,
        exec_sync,
        exec,
        attach,
        port_forward,
        container_stats,
        list_container_stats,
        pod_sandbox_stats,
        list_pod_sandbox_stats,
        update_runtime_config,
        status,
        checkpoint_container,
        get_container_events,
        list_metric_descriptors,
        list_pod_sandbox_metrics,
        runtime_config,
        update_pod_sandbox_resources,
    );
    assert_eq!(
        recorder.take(),
        expected("runtime.v1.RuntimeService", RUNTIME_SERVICE_RPCS)
    );
}

#[tokio::test]
async fn image_service_client_paths() {
    let recorder = Recorder::default();
    let mut client = cri::image_service_client::ImageServiceClient::new(recorder.clone());
    call_all!(
        client,
        list_images,
        image_status,
        pull_image,
        remove_image,
        image_fs_info
    );
    assert_eq!(
        recorder.take(),
        expected("runtime.v1.ImageService", IMAGE_SERVICE_RPCS)
    );
}

#[tokio::test]
async fn plugin_client_paths() {
    let recorder = Recorder::default();

    let mut registration = dp::registration_client::RegistrationClient::new(recorder.clone());
    call_all!(registration, register);
    let mut plugin = dp::device_plugin_client::DevicePluginClient::new(recorder.clone());
    call_all!(
        plugin,
        get_device_plugin_options,
        list_and_watch,
        get_preferred_allocation,
        allocate,
        pre_start_container
    );
    let mut watcher = reg::registration_client::RegistrationClient::new(recorder.clone());
    call_all!(watcher, get_info, notify_registration_status);

    assert_eq!(
        recorder.take(),
        [
            "/v1beta1.Registration/Register",
            "/v1beta1.DevicePlugin/GetDevicePluginOptions",
            "/v1beta1.DevicePlugin/ListAndWatch",
            "/v1beta1.DevicePlugin/GetPreferredAllocation",
            "/v1beta1.DevicePlugin/Allocate",
            "/v1beta1.DevicePlugin/PreStartContainer",
            "/pluginregistration.Registration/GetInfo",
            "/pluginregistration.Registration/NotifyRegistrationStatus",
        ]
    );
}

#[tokio::test]
async fn csi_client_paths() {
    let recorder = Recorder::default();
    let mut identity = csi::identity_client::IdentityClient::new(recorder.clone());
    call_all!(identity, get_plugin_info, get_plugin_capabilities, probe);
    let mut node = csi::node_client::NodeClient::new(recorder.clone());
    call_all!(
        node,
        node_stage_volume,
        node_unstage_volume,
        node_publish_volume,
        node_unpublish_volume,
        node_get_volume_stats,
        node_expand_volume,
        node_get_capabilities,
        node_get_info,
    );
    assert_eq!(
        recorder.take(),
        [
            "/csi.v1.Identity/GetPluginInfo",
            "/csi.v1.Identity/GetPluginCapabilities",
            "/csi.v1.Identity/Probe",
            "/csi.v1.Node/NodeStageVolume",
            "/csi.v1.Node/NodeUnstageVolume",
            "/csi.v1.Node/NodePublishVolume",
            "/csi.v1.Node/NodeUnpublishVolume",
            "/csi.v1.Node/NodeGetVolumeStats",
            "/csi.v1.Node/NodeExpandVolume",
            "/csi.v1.Node/NodeGetCapabilities",
            "/csi.v1.Node/NodeGetInfo",
        ]
    );
}

#[test]
fn server_names_match_upstream_packages() {
    assert_eq!(
        cri::runtime_service_server::SERVICE_NAME,
        "runtime.v1.RuntimeService"
    );
    assert_eq!(
        cri::image_service_server::SERVICE_NAME,
        "runtime.v1.ImageService"
    );
    assert_eq!(
        dp::registration_server::SERVICE_NAME,
        "v1beta1.Registration"
    );
    assert_eq!(
        dp::device_plugin_server::SERVICE_NAME,
        "v1beta1.DevicePlugin"
    );
    assert_eq!(
        reg::registration_server::SERVICE_NAME,
        "pluginregistration.Registration"
    );
    assert_eq!(csi::identity_server::SERVICE_NAME, "csi.v1.Identity");
    assert_eq!(csi::node_server::SERVICE_NAME, "csi.v1.Node");
}
