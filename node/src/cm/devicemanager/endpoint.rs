//! What the device manager talks to for one resource: a device plugin over gRPC
//! (v1beta1 `DevicePlugin` on its unix socket) or a Wasm `device-adapter` plugin.
//! Both answer the same four questions; allocation results are the v1beta1
//! `ContainerAllocateResponse` either way (it is also what the checkpoint keeps).

use std::path::PathBuf;
use std::time::Duration;

use tonic::transport::Channel;
use wasmlet_proto::deviceplugin::v1beta1 as api;
use wasmlet_proto::deviceplugin::v1beta1::device_plugin_client::DevicePluginClient;

/// How long the node waits for a plugin's `Allocate`, `GetPreferredAllocation`
/// (the kubelet has no deadline of its own for these; a stuck plugin must not hold
/// admission forever).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The kubelet's `KubeletPreStartContainerRPCTimeoutInSecs`.
pub const PRE_START_TIMEOUT: Duration = Duration::from_secs(30);

/// One resource's plugin.
#[async_trait::async_trait]
pub trait Endpoint: Send + Sync {
    /// What the plugin asked for at registration.
    fn options(&self) -> api::DevicePluginOptions;
    /// The plugin's socket, for a gRPC plugin.
    fn socket(&self) -> Option<&std::path::Path> {
        None
    }
    /// `GetPreferredAllocation` for one container.
    async fn preferred_allocation(
        &self,
        available: Vec<String>,
        must_include: Vec<String>,
        size: usize,
    ) -> Result<Vec<String>, String>;
    /// `Allocate` for one container.
    async fn allocate(&self, ids: Vec<String>) -> Result<api::ContainerAllocateResponse, String>;
    /// `PreStartContainer`.
    async fn pre_start(&self, ids: Vec<String>) -> Result<(), String>;
}

/// A device plugin served over gRPC on a unix socket.
pub struct GrpcEndpoint {
    pub socket: PathBuf,
    pub options: api::DevicePluginOptions,
    pub client: DevicePluginClient<Channel>,
}

impl GrpcEndpoint {
    /// A client for the plugin at `socket`; it connects on first use.
    pub fn new(socket: PathBuf, options: api::DevicePluginOptions) -> Self {
        let channel =
            wasmlet_proto::transport::unix_channel(socket.clone(), Duration::from_secs(10));
        GrpcEndpoint {
            socket,
            options,
            client: DevicePluginClient::new(channel),
        }
    }
}

fn status_message(call: &str, s: tonic::Status) -> String {
    format!("{call}: {}: {}", s.code(), s.message())
}

#[async_trait::async_trait]
impl Endpoint for GrpcEndpoint {
    fn options(&self) -> api::DevicePluginOptions {
        self.options
    }

    fn socket(&self) -> Option<&std::path::Path> {
        Some(&self.socket)
    }

    async fn preferred_allocation(
        &self,
        available: Vec<String>,
        must_include: Vec<String>,
        size: usize,
    ) -> Result<Vec<String>, String> {
        let request = api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: available,
                must_include_device_i_ds: must_include,
                allocation_size: i32::try_from(size).unwrap_or(i32::MAX),
            }],
        };
        let mut request = tonic::Request::new(request);
        request.set_timeout(CALL_TIMEOUT);
        let response = self
            .client
            .clone()
            .get_preferred_allocation(request)
            .await
            .map_err(|s| status_message("GetPreferredAllocation", s))?
            .into_inner();
        Ok(response
            .container_responses
            .into_iter()
            .next()
            .map(|r| r.device_i_ds)
            .unwrap_or_default())
    }

    async fn allocate(&self, ids: Vec<String>) -> Result<api::ContainerAllocateResponse, String> {
        let mut request = tonic::Request::new(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest { devices_ids: ids }],
        });
        request.set_timeout(CALL_TIMEOUT);
        let response = self
            .client
            .clone()
            .allocate(request)
            .await
            .map_err(|s| status_message("Allocate", s))?
            .into_inner();
        // The kubelet asks for one container and expects one answer.
        let n = response.container_responses.len();
        if n != 1 {
            return Err(format!(
                "Allocate: the plugin answered {n} container responses for 1 request"
            ));
        }
        Ok(response
            .container_responses
            .into_iter()
            .next()
            .unwrap_or_default())
    }

    async fn pre_start(&self, ids: Vec<String>) -> Result<(), String> {
        let mut request = tonic::Request::new(api::PreStartContainerRequest { devices_ids: ids });
        request.set_timeout(PRE_START_TIMEOUT);
        self.client
            .clone()
            .pre_start_container(request)
            .await
            .map_err(|s| status_message("PreStartContainer", s))?;
        Ok(())
    }
}

/// A Wasm `device-adapter` plugin, called through the plugin host (with the limits
/// its configuration gives it).
pub struct WasmEndpoint {
    pub host: wasmlet_plugin_host::PluginHost,
    pub plugin: String,
    /// The host paths the adapter may hand to containers (mounts, device nodes): its
    /// filesystem grants. An adapter gets no host path it was not granted.
    pub allowed: Vec<PathBuf>,
}

/// Whether `path` is absolute, has no `..`, and lies within one of `allowed`: the check
/// every host path of a device adapter's allocation passes.
pub fn granted(path: &str, allowed: &[PathBuf]) -> bool {
    let p = std::path::Path::new(path);
    p.is_absolute()
        && !p
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
        && allowed.iter().any(|a| p.starts_with(a))
}

#[async_trait::async_trait]
impl Endpoint for WasmEndpoint {
    fn options(&self) -> api::DevicePluginOptions {
        api::DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }
    }

    async fn preferred_allocation(
        &self,
        available: Vec<String>,
        must_include: Vec<String>,
        size: usize,
    ) -> Result<Vec<String>, String> {
        Ok(self
            .host
            .preferred_allocation(
                &self.plugin,
                &available,
                &must_include,
                u32::try_from(size).unwrap_or(u32::MAX),
            )
            .await)
    }

    async fn allocate(&self, ids: Vec<String>) -> Result<api::ContainerAllocateResponse, String> {
        let allocation = self
            .host
            .allocate(&self.plugin, ids)
            .await
            .map_err(|e| format!("device adapter {}: {e}", self.plugin))?
            .map_err(|e| format!("device adapter {} refused: {e}", self.plugin))?;
        let paths = allocation
            .mounts
            .iter()
            .map(|m| &m.host_path)
            .chain(allocation.devices.iter().map(|d| &d.host_path));
        for path in paths {
            if !granted(path, &self.allowed) {
                return Err(format!(
                    "device adapter {} answered the host path {path:?}, which its filesystem grants do not cover",
                    self.plugin
                ));
            }
        }
        Ok(api::ContainerAllocateResponse {
            envs: allocation
                .envs
                .into_iter()
                .map(|p| (p.key, p.value))
                .collect(),
            mounts: allocation
                .mounts
                .into_iter()
                .map(|m| api::Mount {
                    container_path: m.container_path,
                    host_path: m.host_path,
                    read_only: m.read_only,
                })
                .collect(),
            devices: allocation
                .devices
                .into_iter()
                .map(|d| api::DeviceSpec {
                    container_path: d.container_path,
                    host_path: d.host_path,
                    permissions: d.permissions,
                })
                .collect(),
            annotations: allocation
                .annotations
                .into_iter()
                .map(|p| (p.key, p.value))
                .collect(),
            cdi_devices: Vec::new(),
        })
    }

    async fn pre_start(&self, _ids: Vec<String>) -> Result<(), String> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    #[test]
    fn an_adapter_hands_out_only_granted_host_paths() {
        let allowed = [
            PathBuf::from("/dev/widgets"),
            PathBuf::from("/var/lib/widgets"),
        ];
        assert!(super::granted("/dev/widgets/w0", &allowed));
        assert!(super::granted("/var/lib/widgets", &allowed));
        assert!(!super::granted("/dev/mem", &allowed));
        assert!(!super::granted("/dev/widgets/../mem", &allowed));
        assert!(!super::granted("dev/widgets/w0", &allowed));
        assert!(!super::granted("/dev/widgetsX", &allowed));
    }
}
