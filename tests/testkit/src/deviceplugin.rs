//! A real device plugin (v1beta1) for the node's device manager: it serves
//! `DevicePlugin` on a unix socket in the node's `device-plugins` directory,
//! registers on `kubelet.sock`, streams its devices with `ListAndWatch`, and
//! registers again whenever `kubelet.sock` is replaced (a restarted node), as
//! real plugins do.
//!
//! `Allocate` gives each container `WIDGETS=<id>,<id>`, a device node
//! `/dev/<id>` per device (the host's `/dev/null`), and the annotation
//! `example.com/widget-ids`.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::Stream;
use hyper_util::rt::TokioIo;
use tokio::sync::watch;
use tonic::transport::{Endpoint, Uri};
use tonic::{Request, Response, Status};
use wasmlet_proto::deviceplugin::v1beta1 as api;
use wasmlet_proto::deviceplugin::v1beta1::device_plugin_server::{
    DevicePlugin as Service, DevicePluginServer,
};
use wasmlet_proto::deviceplugin::v1beta1::registration_client::RegistrationClient;
use wasmlet_proto::pluginregistration::v1 as watcher;
use wasmlet_proto::pluginregistration::v1::registration_server::{
    Registration as WatcherService, RegistrationServer as WatcherServer,
};

/// One device the plugin offers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestDevice {
    pub id: String,
    pub healthy: bool,
    /// Its NUMA node, if it has one.
    pub numa: Option<i64>,
}

impl TestDevice {
    pub fn new(id: &str, numa: Option<i64>) -> Self {
        TestDevice {
            id: id.to_owned(),
            healthy: true,
            numa,
        }
    }
}

struct Shared {
    devices: watch::Sender<Vec<TestDevice>>,
    /// Every `Allocate`, in order: the device ids asked for.
    allocations: Mutex<Vec<Vec<String>>>,
    /// How many times the plugin registered.
    registrations: Mutex<u32>,
    /// The node's answers to the plugin watcher path (`NotifyRegistrationStatus`).
    statuses: Mutex<Vec<(bool, String)>>,
}

/// The plugin watcher side: `GetInfo` says what the plugin is.
#[derive(Clone)]
struct Info {
    resource: String,
    shared: Arc<Shared>,
}

#[tonic::async_trait]
impl WatcherService for Info {
    async fn get_info(
        &self,
        _request: Request<watcher::InfoRequest>,
    ) -> Result<Response<watcher::PluginInfo>, Status> {
        Ok(Response::new(watcher::PluginInfo {
            r#type: "DevicePlugin".into(),
            name: self.resource.clone(),
            endpoint: String::new(),
            supported_versions: vec!["v1beta1".into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<watcher::RegistrationStatus>,
    ) -> Result<Response<watcher::RegistrationStatusResponse>, Status> {
        let s = request.into_inner();
        self.shared
            .statuses
            .lock()
            .unwrap()
            .push((s.plugin_registered, s.error));
        if s.plugin_registered {
            *self.shared.registrations.lock().unwrap() += 1;
        }
        Ok(Response::new(watcher::RegistrationStatusResponse {}))
    }
}

#[derive(Clone)]
struct Plugin(Arc<Shared>);

fn to_api(devices: &[TestDevice]) -> api::ListAndWatchResponse {
    api::ListAndWatchResponse {
        devices: devices
            .iter()
            .map(|d| api::Device {
                id: d.id.clone(),
                health: if d.healthy { "Healthy" } else { "Unhealthy" }.into(),
                topology: d.numa.map(|n| api::TopologyInfo {
                    nodes: vec![api::NumaNode { id: n }],
                }),
            })
            .collect(),
    }
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Service for Plugin {
    type ListAndWatchStream = DeviceStream;

    async fn get_device_plugin_options(
        &self,
        _request: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(api::DevicePluginOptions::default()))
    }

    async fn list_and_watch(
        &self,
        _request: Request<api::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let rx = self.0.devices.subscribe();
        let stream = futures::stream::unfold((rx, true), |(mut rx, first)| async move {
            if !first && rx.changed().await.is_err() {
                return None;
            }
            let answer = to_api(&rx.borrow_and_update());
            Some((Ok(answer), (rx, false)))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        _request: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented("no preferred allocation"))
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let mut responses = Vec::new();
        for c in request.into_inner().container_requests {
            let ids = c.devices_ids;
            self.0.allocations.lock().unwrap().push(ids.clone());
            responses.push(api::ContainerAllocateResponse {
                envs: BTreeMap::from([("WIDGETS".to_string(), ids.join(","))])
                    .into_iter()
                    .collect(),
                devices: ids
                    .iter()
                    .map(|id| api::DeviceSpec {
                        container_path: format!("/dev/{id}"),
                        host_path: "/dev/null".into(),
                        permissions: "rw".into(),
                    })
                    .collect(),
                annotations: [("example.com/widget-ids".to_string(), ids.join(","))]
                    .into_iter()
                    .collect(),
                ..Default::default()
            });
        }
        Ok(Response::new(api::AllocateResponse {
            container_responses: responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _request: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}

/// The running plugin; it stops (and removes its socket) when dropped.
pub struct TestDevicePlugin {
    shared: Arc<Shared>,
    socket: PathBuf,
    runtime: Option<tokio::runtime::Runtime>,
}

async fn register(
    kubelet_socket: PathBuf,
    endpoint: String,
    resource: String,
) -> anyhow::Result<()> {
    let channel = Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = kubelet_socket.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await?;
    RegistrationClient::new(channel)
        .register(api::RegisterRequest {
            version: "v1beta1".into(),
            endpoint,
            resource_name: resource,
            options: Some(api::DevicePluginOptions::default()),
        })
        .await?;
    Ok(())
}

/// Which file `path` is: its inode and change time (an inode number alone can be
/// reused at once by the next node's socket).
fn inode(path: &Path) -> Option<(u64, i64, i64)> {
    std::fs::metadata(path)
        .ok()
        .map(|m| (m.ino(), m.ctime(), m.ctime_nsec()))
}

impl TestDevicePlugin {
    /// Serves `resource` with `devices` on `<dir>/<name>.sock` and registers with
    /// the node's `<dir>/kubelet.sock` whenever it appears or is replaced.
    pub fn start(
        dir: &Path,
        name: &str,
        resource: &str,
        devices: Vec<TestDevice>,
    ) -> anyhow::Result<Self> {
        let mut plugin = Self::serve(dir, name, resource, devices, false)?;
        // Registers with every new kubelet.sock (a real plugin watches it with
        // inotify; polling it is the same signal).
        let kubelet = dir.join("kubelet.sock");
        let endpoint = format!("{name}.sock");
        let resource = resource.to_owned();
        let counter = plugin.shared.clone();
        plugin.runtime.as_mut().unwrap().spawn(async move {
            let mut registered: Option<(u64, i64, i64)> = None;
            loop {
                let now = inode(&kubelet);
                if now.is_some() && now != registered {
                    match register(kubelet.clone(), endpoint.clone(), resource.clone()).await {
                        Ok(()) => {
                            registered = now;
                            *counter.registrations.lock().unwrap() += 1;
                        }
                        Err(e) => eprintln!("test device plugin: registering: {e:#}"),
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Ok(plugin)
    }

    /// Serves `resource` with `devices` on `<registry>/<name>.sock`, where the node's
    /// plugin watcher finds it: the socket answers plugin registration (`GetInfo`,
    /// type `DevicePlugin`) and the device plugin API.
    pub fn start_in_registry(
        registry: &Path,
        name: &str,
        resource: &str,
        devices: Vec<TestDevice>,
    ) -> anyhow::Result<Self> {
        Self::serve(registry, name, resource, devices, true)
    }

    fn serve(
        dir: &Path,
        name: &str,
        resource: &str,
        devices: Vec<TestDevice>,
        watched: bool,
    ) -> anyhow::Result<Self> {
        let runtime = crate::grpc::runtime()?;
        let socket = dir.join(format!("{name}.sock"));
        let listener = crate::grpc::bind(&socket)?;
        let (tx, _) = watch::channel(devices);
        let shared = Arc::new(Shared {
            devices: tx,
            allocations: Mutex::new(Vec::new()),
            registrations: Mutex::new(0),
            statuses: Mutex::new(Vec::new()),
        });
        let plugin = Plugin(shared.clone());
        let info = watched.then(|| {
            WatcherServer::new(Info {
                resource: resource.to_owned(),
                shared: shared.clone(),
            })
        });
        crate::grpc::serve(
            &runtime,
            listener,
            tonic::transport::Server::builder()
                .add_service(DevicePluginServer::new(plugin))
                .add_optional_service(info),
        );
        Ok(TestDevicePlugin {
            shared,
            socket,
            runtime: Some(runtime),
        })
    }

    /// The node's `NotifyRegistrationStatus` answers (registered, error), in order.
    pub fn statuses(&self) -> Vec<(bool, String)> {
        self.shared.statuses.lock().unwrap().clone()
    }

    /// Changes a device's health; the change is streamed to the node.
    pub fn set_healthy(&self, id: &str, healthy: bool) {
        self.shared.devices.send_modify(|devices| {
            for d in devices.iter_mut().filter(|d| d.id == id) {
                d.healthy = healthy;
            }
        });
    }

    /// The device ids of every `Allocate` so far.
    pub fn allocations(&self) -> Vec<Vec<String>> {
        self.shared.allocations.lock().unwrap().clone()
    }

    /// How many times the plugin has registered.
    pub fn registrations(&self) -> u32 {
        *self.shared.registrations.lock().unwrap()
    }
}

impl Drop for TestDevicePlugin {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}
