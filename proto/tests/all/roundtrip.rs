//! Real gRPC round trips over loopback TCP: a generated server and a
//! generated client talking HTTP/2, for a unary service and for the
//! server-streaming ListAndWatch.

use std::net::SocketAddr;
use std::pin::Pin;

use tokio::net::TcpListener;
use tonic::codegen::tokio_stream::{self, Stream, StreamExt as _};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status};

use wasmlet_proto::deviceplugin::v1beta1 as dp;
use wasmlet_proto::pluginregistration::v1 as reg;

/// A plugin's registration endpoint, as a CSI driver would serve it.
struct Plugin;

#[tonic::async_trait]
impl reg::registration_server::Registration for Plugin {
    async fn get_info(
        &self,
        _request: Request<reg::InfoRequest>,
    ) -> Result<Response<reg::PluginInfo>, Status> {
        Ok(Response::new(reg::PluginInfo {
            r#type: "CSIPlugin".into(),
            name: "example.csi.wasmlet.dev".into(),
            endpoint: "/var/lib/kubelet/plugins/example/csi.sock".into(),
            supported_versions: vec!["1.0.0".into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            Ok(Response::new(reg::RegistrationStatusResponse {}))
        } else {
            Err(Status::failed_precondition(status.error))
        }
    }
}

/// A device plugin with two devices.
struct Gpus;

type DeviceStream = Pin<Box<dyn Stream<Item = Result<dp::ListAndWatchResponse, Status>> + Send>>;

fn device(id: &str, health: &str) -> dp::Device {
    dp::Device {
        id: id.into(),
        health: health.into(),
        topology: None,
    }
}

#[tonic::async_trait]
impl dp::device_plugin_server::DevicePlugin for Gpus {
    type ListAndWatchStream = DeviceStream;

    async fn get_device_plugin_options(
        &self,
        _request: Request<dp::Empty>,
    ) -> Result<Response<dp::DevicePluginOptions>, Status> {
        Ok(Response::new(dp::DevicePluginOptions {
            pre_start_required: true,
            get_preferred_allocation_available: false,
        }))
    }

    async fn list_and_watch(
        &self,
        _request: Request<dp::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let updates = vec![
            Ok(dp::ListAndWatchResponse {
                devices: vec![device("gpu0", "Healthy"), device("gpu1", "Healthy")],
            }),
            Ok(dp::ListAndWatchResponse {
                devices: vec![device("gpu0", "Healthy"), device("gpu1", "Unhealthy")],
            }),
        ];
        Ok(Response::new(Box::pin(tokio_stream::iter(updates))))
    }

    async fn get_preferred_allocation(
        &self,
        _request: Request<dp::PreferredAllocationRequest>,
    ) -> Result<Response<dp::PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented("not advertised"))
    }

    async fn allocate(
        &self,
        request: Request<dp::AllocateRequest>,
    ) -> Result<Response<dp::AllocateResponse>, Status> {
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|req| dp::ContainerAllocateResponse {
                envs: [("GPUS".to_owned(), req.devices_ids.join(","))].into(),
                ..Default::default()
            })
            .collect();
        Ok(Response::new(dp::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _request: Request<dp::PreStartContainerRequest>,
    ) -> Result<Response<dp::PreStartContainerResponse>, Status> {
        Ok(Response::new(dp::PreStartContainerResponse {}))
    }
}

/// Serves the router on an ephemeral loopback port and returns a channel to it.
async fn serve(router: tonic::transport::server::Router) -> Channel {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(router.serve_with_incoming(TcpIncoming::from(listener)));
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

#[tokio::test]
async fn plugin_registration_round_trip() {
    let channel = serve(
        Server::builder().add_service(reg::registration_server::RegistrationServer::new(Plugin)),
    )
    .await;
    let mut client = reg::registration_client::RegistrationClient::new(channel);

    let info = client
        .get_info(reg::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.r#type, "CSIPlugin");
    assert_eq!(info.name, "example.csi.wasmlet.dev");
    assert_eq!(info.supported_versions, ["1.0.0"]);

    client
        .notify_registration_status(reg::RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .unwrap();
    let refused = client
        .notify_registration_status(reg::RegistrationStatus {
            plugin_registered: false,
            error: "version 0.9 unsupported".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert_eq!(refused.message(), "version 0.9 unsupported");
}

#[tokio::test]
async fn device_plugin_round_trip_with_streaming() {
    let channel = serve(
        Server::builder().add_service(dp::device_plugin_server::DevicePluginServer::new(Gpus)),
    )
    .await;
    let mut client = dp::device_plugin_client::DevicePluginClient::new(channel);

    let options = client
        .get_device_plugin_options(dp::Empty {})
        .await
        .unwrap()
        .into_inner();
    assert!(options.pre_start_required);

    let updates: Vec<dp::ListAndWatchResponse> = client
        .list_and_watch(dp::Empty {})
        .await
        .unwrap()
        .into_inner()
        .map(Result::unwrap)
        .collect()
        .await;
    assert_eq!(updates.len(), 2);
    assert_eq!(updates[1].devices[1], device("gpu1", "Unhealthy"));

    let allocated = client
        .allocate(dp::AllocateRequest {
            container_requests: vec![dp::ContainerAllocateRequest {
                devices_ids: vec!["gpu0".into(), "gpu1".into()],
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(allocated.container_responses[0].envs["GPUS"], "gpu0,gpu1");
}
