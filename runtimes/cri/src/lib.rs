//! `wasmlet-runtime-cri`: the [`Runtime`] seam over CRI v1 gRPC, for containerd and
//! CRI-O — what the kubelet's `remote_runtime.go` / `remote_image.go` are to it.
//!
//! [`CriRuntime::connect`] builds the gRPC clients over the runtime's unix socket
//! without connecting: the node starts even while containerd is down, calls fail with
//! [`Error::Unavailable`] until it is back, and every call reconnects on its own
//! (the node survives runtime restarts). Each call runs under the kubelet's deadline
//! (`--runtime-request-timeout`, doubled for `RunPodSandbox`, plus the grace period
//! for `StopContainer` and `ExecSync`, none for `PullImage`). A background task
//! follows `GetContainerEvents` and republishes it on [`Runtime::subscribe`]; a
//! runtime without that RPC (containerd 1.6) is left to the node's relisting.
//!
//! Start reading at [`CriRuntime`]; the field-by-field translation to CRI messages
//! is in `convert.rs`, and every gRPC status becomes a seam error in `error.rs`'s
//! `from_status`.
//!
//! ```no_run
//! # async fn demo() -> wasmlet_runtime::Result<()> {
//! use wasmlet_runtime::Runtime;
//! use wasmlet_runtime_cri::{CriConfig, CriRuntime};
//!
//! let runtime = CriRuntime::connect(CriConfig::default())?;
//! let version = runtime.version().await?; // fails clearly unless the runtime speaks CRI v1
//! println!("{} {}", version.runtime_name, version.runtime_version);
//! # Ok(())
//! # }
//! ```

mod convert;
mod error;
mod events;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::broadcast;
use tokio_util::sync::{CancellationToken, DropGuard};
use tonic::transport::Channel;
use wasmlet_proto::cri::v1 as cri;
use wasmlet_proto::cri::v1::image_service_client::ImageServiceClient;
use wasmlet_proto::cri::v1::runtime_service_client::RuntimeServiceClient;
use wasmlet_runtime::{
    AuthConfig, Capabilities, Container, ContainerConfig, ContainerFsUsage, ContainerResources,
    ContainerStatus, Error, ExecResult, FilesystemUsage, Image, PodSandbox, PodSandboxConfig,
    PodSandboxStatus, Result, Runtime, RuntimeEvent, RuntimeStatus, RuntimeVersion, Streams,
};

use crate::error::{Op, from_status};

/// The CRI API version this client speaks.
pub const CRI_API_VERSION: &str = "v1";

/// containerd's default CRI endpoint.
pub const DEFAULT_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";

/// The kubelet's default `--runtime-request-timeout`.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// The kubelet's limit on a CRI message (`maxMsgSize`): large `ListContainers` and
/// `ExecSync` answers exceed gRPC's 4 MiB default.
const MAX_MESSAGE_SIZE: usize = 16 << 20;

/// How to reach the CRI runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CriConfig {
    /// The runtime service socket: `unix:///run/containerd/containerd.sock` or a bare
    /// path (`--container-runtime-endpoint`).
    pub runtime_endpoint: String,
    /// The image service socket, when it differs (`--image-service-endpoint`).
    pub image_endpoint: Option<String>,
    /// The deadline of ordinary calls (`--runtime-request-timeout`).
    pub request_timeout: Duration,
    /// The RuntimeClass handler used for sandboxes whose config names none; empty for
    /// the runtime's default.
    pub handler: String,
}

impl Default for CriConfig {
    fn default() -> Self {
        CriConfig {
            runtime_endpoint: DEFAULT_ENDPOINT.to_owned(),
            image_endpoint: None,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            handler: String::new(),
        }
    }
}

/// The socket path of an endpoint: `unix://<path>` or a bare path. Other schemes
/// (`tcp://`, `npipe://`) are refused.
pub fn socket_path(endpoint: &str) -> Result<PathBuf> {
    let path = match endpoint.strip_prefix("unix://") {
        Some(path) => path,
        None if endpoint.contains("://") => {
            return Err(Error::InvalidArgument(format!(
                "CRI endpoint {endpoint:?}: only unix:// sockets are supported"
            )));
        }
        None => endpoint,
    };
    if path.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "CRI endpoint {endpoint:?} names no socket"
        )));
    }
    Ok(PathBuf::from(path))
}

/// A CRI v1 runtime (containerd, CRI-O) behind the [`Runtime`] seam.
///
/// Cheap to clone; clones share the connection and the event task, which stops when
/// the last clone is dropped.
#[derive(Clone)]
pub struct CriRuntime {
    inner: Arc<Inner>,
}

struct Inner {
    config: CriConfig,
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    events: broadcast::Sender<RuntimeEvent>,
    /// Cancels the event task when the runtime is dropped.
    _events_task: DropGuard,
}

impl std::fmt::Debug for CriRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CriRuntime")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl CriRuntime {
    /// Builds the clients without connecting, and starts following the runtime's
    /// events. Fails only on a malformed endpoint; must be called inside a Tokio
    /// runtime. Call [`Runtime::version`] to check that the runtime speaks CRI v1.
    pub fn connect(config: CriConfig) -> Result<Self> {
        let runtime_path = socket_path(&config.runtime_endpoint)?;
        let image_path = match &config.image_endpoint {
            Some(endpoint) => socket_path(endpoint)?,
            None => runtime_path.clone(),
        };
        let runtime_channel =
            wasmlet_proto::transport::unix_channel(runtime_path.clone(), config.request_timeout);
        let image_channel = if image_path == runtime_path {
            runtime_channel.clone()
        } else {
            wasmlet_proto::transport::unix_channel(image_path, config.request_timeout)
        };
        let runtime = RuntimeServiceClient::new(runtime_channel)
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_MESSAGE_SIZE);
        let images = ImageServiceClient::new(image_channel)
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_MESSAGE_SIZE);
        let (events, _) = broadcast::channel(1024);

        let stop = CancellationToken::new();
        tokio::spawn(events::follow(
            runtime.clone(),
            events.clone(),
            config.runtime_endpoint.clone(),
            stop.clone(),
        ));
        Ok(CriRuntime {
            inner: Arc::new(Inner {
                config,
                runtime,
                images,
                events,
                _events_task: stop.drop_guard(),
            }),
        })
    }

    /// The configuration the runtime was built with.
    pub fn config(&self) -> &CriConfig {
        &self.inner.config
    }

    fn rt(&self) -> RuntimeServiceClient<Channel> {
        self.inner.runtime.clone()
    }

    fn img(&self) -> ImageServiceClient<Channel> {
        self.inner.images.clone()
    }

    fn timeout(&self) -> Option<Duration> {
        Some(self.inner.config.request_timeout)
    }

    fn handler_for(&self, config: &PodSandboxConfig) -> String {
        if config.runtime_handler.is_empty() {
            self.inner.config.handler.clone()
        } else {
            config.runtime_handler.clone()
        }
    }
}

/// A request with a deadline, sent as `grpc-timeout` (so the runtime gives up too)
/// and enforced by the client.
fn request<T>(message: T, timeout: Option<Duration>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(timeout) = timeout {
        request.set_timeout(timeout);
    }
    request
}

/// Stop and remove succeed when the object is already gone: CRI runtimes answer
/// `NotFound` in some versions and OK in others.
fn idempotent(result: Result<()>) -> Result<()> {
    match result {
        Err(e) if e.is_not_found() => Ok(()),
        other => other,
    }
}

#[async_trait]
impl Runtime for CriRuntime {
    fn name(&self) -> &str {
        "cri"
    }

    fn capabilities(&self) -> Capabilities {
        // An OCI container runtime that execs: attach, port-forward and stats are CRI
        // calls this backend does not make yet.
        Capabilities::default()
    }

    async fn version(&self) -> Result<RuntimeVersion> {
        let op = Op::new("Version", "runtime", "").timeout(self.timeout());
        let endpoint = &self.inner.config.runtime_endpoint;
        let message = cri::VersionRequest {
            version: CRI_API_VERSION.to_owned(),
        };
        let v = match self.rt().version(request(message, op.timeout)).await {
            Ok(response) => response.into_inner(),
            Err(status) if status.code() == tonic::Code::Unimplemented => {
                return Err(Error::FailedPrecondition(format!(
                    "the runtime at {endpoint} does not implement CRI {CRI_API_VERSION} \
                     (runtime.v1.RuntimeService): {}; wasmlet needs a CRI v1 runtime \
                     such as containerd 1.6 or later",
                    status.message()
                )));
            }
            Err(status) => return Err(from_status(&op, status)),
        };
        if v.runtime_api_version != CRI_API_VERSION {
            return Err(Error::FailedPrecondition(format!(
                "the runtime at {endpoint} ({} {}) speaks CRI API version {:?}; \
                 wasmlet needs {CRI_API_VERSION:?}",
                v.runtime_name, v.runtime_version, v.runtime_api_version
            )));
        }
        Ok(RuntimeVersion {
            runtime_name: v.runtime_name,
            runtime_version: v.runtime_version,
            runtime_api_version: v.runtime_api_version,
        })
    }

    async fn status(&self) -> Result<RuntimeStatus> {
        let op = Op::new("Status", "runtime", "").timeout(self.timeout());
        let response = self
            .rt()
            .status(request(cri::StatusRequest { verbose: false }, op.timeout))
            .await
            .map_err(|s| from_status(&op, s))?
            .into_inner();
        Ok(convert::runtime_status(response.status))
    }

    async fn run_pod_sandbox(&self, config: &PodSandboxConfig) -> Result<String> {
        // The kubelet gives sandbox creation twice the usual deadline: it pulls the
        // pause image and runs CNI.
        let timeout = self.timeout().map(|t| t * 2);
        let op = Op::new("RunPodSandbox", "sandbox", &config.metadata.uid).timeout(timeout);
        let message = cri::RunPodSandboxRequest {
            config: Some(convert::sandbox_config(config)?),
            runtime_handler: self.handler_for(config),
        };
        let response = self
            .rt()
            .run_pod_sandbox(request(message, timeout))
            .await
            .map_err(|s| from_status(&op, s))?
            .into_inner();
        if response.pod_sandbox_id.is_empty() {
            return Err(Error::internal(format!(
                "RunPodSandbox for pod {}/{} returned no sandbox id",
                config.metadata.namespace, config.metadata.name
            )));
        }
        Ok(response.pod_sandbox_id)
    }

    async fn stop_pod_sandbox(&self, sandbox_id: &str) -> Result<()> {
        let op = Op::new("StopPodSandbox", "sandbox", sandbox_id).timeout(self.timeout());
        let message = cri::StopPodSandboxRequest {
            pod_sandbox_id: sandbox_id.to_owned(),
        };
        idempotent(
            self.rt()
                .stop_pod_sandbox(request(message, op.timeout))
                .await
                .map(drop)
                .map_err(|s| from_status(&op, s)),
        )
    }

    async fn remove_pod_sandbox(&self, sandbox_id: &str) -> Result<()> {
        let op = Op::new("RemovePodSandbox", "sandbox", sandbox_id).timeout(self.timeout());
        let message = cri::RemovePodSandboxRequest {
            pod_sandbox_id: sandbox_id.to_owned(),
        };
        idempotent(
            self.rt()
                .remove_pod_sandbox(request(message, op.timeout))
                .await
                .map(drop)
                .map_err(|s| from_status(&op, s)),
        )
    }

    async fn pod_sandbox_status(&self, sandbox_id: &str) -> Result<PodSandboxStatus> {
        let op = Op::new("PodSandboxStatus", "sandbox", sandbox_id).timeout(self.timeout());
        let message = cri::PodSandboxStatusRequest {
            pod_sandbox_id: sandbox_id.to_owned(),
            verbose: false,
        };
        let response = self
            .rt()
            .pod_sandbox_status(request(message, op.timeout))
            .await
            .map_err(|s| from_status(&op, s))?
            .into_inner();
        let status = response.status.ok_or_else(|| {
            Error::internal(format!(
                "PodSandboxStatus of {sandbox_id} returned no status"
            ))
        })?;
        Ok(convert::pod_sandbox_status(status))
    }

    async fn list_pod_sandboxes(&self) -> Result<Vec<PodSandbox>> {
        let op = Op::new("ListPodSandbox", "sandbox", "").timeout(self.timeout());
        let response = self
            .rt()
            .list_pod_sandbox(request(
                cri::ListPodSandboxRequest { filter: None },
                op.timeout,
            ))
            .await
            .map_err(|s| from_status(&op, s))?
            .into_inner();
        Ok(response
            .items
            .into_iter()
            .map(convert::pod_sandbox)
            .collect())
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: &ContainerConfig,
        sandbox_config: &PodSandboxConfig,
    ) -> Result<String> {
        let op = Op::new("CreateContainer", "sandbox", sandbox_id).timeout(self.timeout());
        let message = cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_owned(),
            config: Some(convert::container_config(config, sandbox_config)?),
            sandbox_config: Some(convert::sandbox_config(sandbox_config)?),
        };
        let response = self
            .rt()
            .create_container(request(message, op.timeout))
            .await
            .map_err(|s| from_status(&op, s))?
            .into_inner();
        if response.container_id.is_empty() {
            return Err(Error::internal(format!(
                "CreateContainer of {:?} in sandbox {sandbox_id} returned no container id",
                config.metadata.name
            )));
        }
        Ok(response.container_id)
    }

    async fn start_container(&self, container_id: &str) -> Result<()> {
        let op = Op::new("StartContainer", "container", container_id).timeout(self.timeout());
        let message = cri::StartContainerRequest {
            container_id: container_id.to_owned(),
        };
        self.rt()
            .start_container(request(message, op.timeout))
            .await
            .map(drop)
            .map_err(|s| from_status(&op, s))
    }

    async fn update_container_resources(
        &self,
        container_id: &str,
        resources: &ContainerResources,
    ) -> Result<()> {
        let op =
            Op::new("UpdateContainerResources", "container", container_id).timeout(self.timeout());
        let message = cri::UpdateContainerResourcesRequest {
            container_id: container_id.to_owned(),
            linux: Some(convert::linux_resources(resources)),
            ..Default::default()
        };
        self.rt()
            .update_container_resources(request(message, op.timeout))
            .await
            .map(drop)
            .map_err(|s| from_status(&op, s))
    }

    async fn stop_container(&self, container_id: &str, timeout: Duration) -> Result<()> {
        // The runtime waits up to `timeout` before it kills; the call may take that long.
        let deadline = self.timeout().map(|t| t.saturating_add(timeout));
        let op = Op::new("StopContainer", "container", container_id).timeout(deadline);
        let message = cri::StopContainerRequest {
            container_id: container_id.to_owned(),
            timeout: convert::whole_seconds(timeout),
        };
        idempotent(
            self.rt()
                .stop_container(request(message, deadline))
                .await
                .map(drop)
                .map_err(|s| from_status(&op, s)),
        )
    }

    async fn remove_container(&self, container_id: &str) -> Result<()> {
        let op = Op::new("RemoveContainer", "container", container_id).timeout(self.timeout());
        let message = cri::RemoveContainerRequest {
            container_id: container_id.to_owned(),
        };
        idempotent(
            self.rt()
                .remove_container(request(message, op.timeout))
                .await
                .map(drop)
                .map_err(|s| from_status(&op, s)),
        )
    }

    async fn reopen_container_log(&self, container_id: &str) -> Result<()> {
        let op = Op::new("ReopenContainerLog", "container", container_id).timeout(self.timeout());
        let message = cri::ReopenContainerLogRequest {
            container_id: container_id.to_owned(),
        };
        self.rt()
            .reopen_container_log(request(message, op.timeout))
            .await
            .map(drop)
            .map_err(|s| from_status(&op, s))
    }

    async fn list_containers(&self) -> Result<Vec<Container>> {
        let op = Op::new("ListContainers", "container", "").timeout(self.timeout());
        let response = self
            .rt()
            .list_containers(request(
                cri::ListContainersRequest { filter: None },
                op.timeout,
            ))
            .await
            .map_err(|s| from_status(&op, s))?
            .into_inner();
        Ok(response
            .containers
            .into_iter()
            .map(convert::container)
            .collect())
    }

    async fn container_status(&self, container_id: &str) -> Result<ContainerStatus> {
        let op = Op::new("ContainerStatus", "container", container_id).timeout(self.timeout());
        // CRI's ContainerStatus does not say which sandbox the container is in;
        // ListContainers filtered by id does, so ask both at once.
        let mut runtime = self.rt();
        let mut lister = self.rt();
        let status = runtime.container_status(request(
            cri::ContainerStatusRequest {
                container_id: container_id.to_owned(),
                verbose: false,
            },
            op.timeout,
        ));
        let listed = lister.list_containers(request(
            cri::ListContainersRequest {
                filter: Some(cri::ContainerFilter {
                    id: container_id.to_owned(),
                    ..Default::default()
                }),
            },
            op.timeout,
        ));
        let list_op = Op::new("ListContainers", "container", container_id).timeout(op.timeout);
        let (status, listed) = tokio::join!(status, listed);
        let status = status
            .map_err(|s| from_status(&op, s))?
            .into_inner()
            .status
            .ok_or_else(|| {
                Error::internal(format!(
                    "ContainerStatus of {container_id} returned no status"
                ))
            })?;
        let sandbox_id = listed
            .map_err(|s| from_status(&list_op, s))?
            .into_inner()
            .containers
            .into_iter()
            .find(|c| c.id == status.id || c.id == container_id)
            .map(|c| c.pod_sandbox_id)
            // Removed between the two answers.
            .ok_or_else(|| Error::not_found("container", container_id))?;
        Ok(convert::container_status(status, sandbox_id))
    }

    async fn pull_image(&self, image: &str, auth: Option<&AuthConfig>) -> Result<String> {
        // Like the kubelet, no deadline: a large image takes as long as it takes.
        let op = Op::new("PullImage", "image", image);
        let message = cri::PullImageRequest {
            image: Some(convert::image_spec(image)),
            auth: auth.map(convert::auth_config),
            sandbox_config: None,
        };
        let response = self
            .img()
            .pull_image(request(message, None))
            .await
            .map_err(|status| match from_status(&op, status) {
                // The runtime could not be asked: retry, not ErrImagePull.
                e @ (Error::Unavailable { .. } | Error::Timeout { .. }) => e,
                not_found @ Error::NotFound { .. } => Error::ImagePull {
                    image: image.to_owned(),
                    message: "not found".to_owned(),
                    source: Some(not_found.into()),
                },
                other => Error::image_pull_from(image, other),
            })?
            .into_inner();
        if response.image_ref.is_empty() {
            return Err(Error::image_pull(
                image,
                "the runtime returned no image reference",
            ));
        }
        Ok(response.image_ref)
    }

    async fn image_status(&self, image: &str) -> Result<Option<Image>> {
        let op = Op::new("ImageStatus", "image", image).timeout(self.timeout());
        let message = cri::ImageStatusRequest {
            image: Some(convert::image_spec(image)),
            verbose: false,
        };
        match self.img().image_status(request(message, op.timeout)).await {
            // CRI says "not present" with an unset image, not with an error.
            Ok(response) => Ok(response.into_inner().image.map(convert::image)),
            Err(status) => match from_status(&op, status) {
                Error::NotFound { .. } => Ok(None),
                e => Err(e),
            },
        }
    }

    async fn list_images(&self) -> Result<Vec<Image>> {
        let op = Op::new("ListImages", "image", "").timeout(self.timeout());
        let response = self
            .img()
            .list_images(request(cri::ListImagesRequest { filter: None }, op.timeout))
            .await
            .map_err(|s| from_status(&op, s))?
            .into_inner();
        Ok(response.images.into_iter().map(convert::image).collect())
    }

    async fn remove_image(&self, image: &str) -> Result<()> {
        let op = Op::new("RemoveImage", "image", image).timeout(self.timeout());
        let message = cri::RemoveImageRequest {
            image: Some(convert::image_spec(image)),
        };
        idempotent(
            self.img()
                .remove_image(request(message, op.timeout))
                .await
                .map(drop)
                .map_err(|s| from_status(&op, s)),
        )
    }

    async fn image_fs_info(&self) -> Result<Vec<FilesystemUsage>> {
        let op = Op::new("ImageFsInfo", "image", "").timeout(self.timeout());
        let response = self
            .img()
            .image_fs_info(request(cri::ImageFsInfoRequest {}, op.timeout))
            .await
            .map_err(|s| from_status(&op, s))?
            .into_inner();
        Ok(response
            .image_filesystems
            .into_iter()
            .map(filesystem_usage)
            .collect())
    }

    async fn container_fs_usage(&self) -> Result<Vec<ContainerFsUsage>> {
        let op = Op::new("ListContainerStats", "container", "").timeout(self.timeout());
        let response = self
            .rt()
            .list_container_stats(request(
                cri::ListContainerStatsRequest { filter: None },
                op.timeout,
            ))
            .await
            .map_err(|s| from_status(&op, s))?
            .into_inner();
        Ok(response
            .stats
            .into_iter()
            .filter_map(|s| {
                let layer = s.writable_layer?;
                Some(ContainerFsUsage {
                    container_id: s.attributes?.id,
                    writable_layer: filesystem_usage(layer),
                })
            })
            .collect())
    }

    async fn exec(&self, container_id: &str, cmd: &[String], streams: Streams) -> Result<String> {
        let op = Op::new("Exec", "container", container_id).timeout(self.timeout());
        let message = cri::ExecRequest {
            container_id: container_id.to_owned(),
            cmd: cmd.to_vec(),
            tty: streams.tty,
            stdin: streams.stdin,
            stdout: streams.stdout,
            stderr: streams.stderr,
        };
        let response = self
            .rt()
            .exec(request(message, op.timeout))
            .await
            .map_err(|s| from_status(&op, s))?;
        Ok(response.into_inner().url)
    }

    async fn attach(&self, container_id: &str, streams: Streams) -> Result<String> {
        let op = Op::new("Attach", "container", container_id).timeout(self.timeout());
        let message = cri::AttachRequest {
            container_id: container_id.to_owned(),
            stdin: streams.stdin,
            tty: streams.tty,
            stdout: streams.stdout,
            stderr: streams.stderr,
        };
        let response = self
            .rt()
            .attach(request(message, op.timeout))
            .await
            .map_err(|s| from_status(&op, s))?;
        Ok(response.into_inner().url)
    }

    async fn port_forward(&self, sandbox_id: &str, ports: &[u16]) -> Result<String> {
        let op = Op::new("PortForward", "sandbox", sandbox_id).timeout(self.timeout());
        let message = cri::PortForwardRequest {
            pod_sandbox_id: sandbox_id.to_owned(),
            port: ports.iter().map(|p| i32::from(*p)).collect(),
        };
        let response = self
            .rt()
            .port_forward(request(message, op.timeout))
            .await
            .map_err(|s| from_status(&op, s))?;
        Ok(response.into_inner().url)
    }

    async fn exec_sync(
        &self,
        container_id: &str,
        command: &[String],
        timeout: Duration,
    ) -> Result<ExecResult> {
        // As the kubelet: no timeout means none at all; otherwise the command's
        // timeout plus the usual deadline for the call itself.
        let deadline = if timeout.is_zero() {
            None
        } else {
            self.timeout().map(|t| t.saturating_add(timeout))
        };
        let op = Op::new("ExecSync", "container", container_id).timeout(deadline);
        let message = cri::ExecSyncRequest {
            container_id: container_id.to_owned(),
            cmd: command.to_vec(),
            timeout: convert::whole_seconds(timeout),
        };
        let response = self
            .rt()
            .exec_sync(request(message, deadline))
            .await
            .map_err(|s| from_status(&op, s))?
            .into_inner();
        Ok(ExecResult {
            exit_code: response.exit_code,
            stdout: response.stdout,
            stderr: response.stderr,
        })
    }

    fn subscribe(&self) -> broadcast::Receiver<RuntimeEvent> {
        self.inner.events.subscribe()
    }
}

fn filesystem_usage(u: cri::FilesystemUsage) -> FilesystemUsage {
    FilesystemUsage {
        timestamp: convert::timestamp(u.timestamp),
        mountpoint: u.fs_id.map(|f| f.mountpoint).unwrap_or_default().into(),
        used_bytes: u.used_bytes.map(|v| v.value),
        inodes_used: u.inodes_used.map(|v| v.value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        let table = [
            (
                "unix:///run/containerd/containerd.sock",
                Some("/run/containerd/containerd.sock"),
            ),
            ("/run/crio/crio.sock", Some("/run/crio/crio.sock")),
            ("unix://relative.sock", Some("relative.sock")),
            ("tcp://127.0.0.1:1234", None),
            ("npipe:////./pipe/containerd", None),
            ("unix://", None),
            ("", None),
        ];
        for (endpoint, want) in table {
            let got = socket_path(endpoint).ok();
            assert_eq!(got, want.map(PathBuf::from), "{endpoint:?}");
        }
    }

    #[test]
    fn defaults_are_the_kubelets() {
        let c = CriConfig::default();
        assert_eq!(c.runtime_endpoint, "unix:///run/containerd/containerd.sock");
        assert_eq!(c.image_endpoint, None);
        assert_eq!(c.request_timeout, Duration::from_secs(120));
        assert_eq!(c.handler, "");
    }

    #[test]
    fn stop_and_remove_are_idempotent() {
        assert!(idempotent(Err(Error::not_found("container", "c"))).is_ok());
        assert!(idempotent(Err(Error::unavailable("down"))).is_err());
        assert!(idempotent(Ok(())).is_ok());
    }
}
