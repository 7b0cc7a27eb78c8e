//! `wasmlet-runtime`: the one trait the node drives to run pods, and the types it speaks.
//!
//! The shape follows the kubelet's internal container-runtime interface rather than
//! CRI's wire messages: a pod runs in a *sandbox*, containers are created, started,
//! stopped and removed inside it, images are pulled by reference, and the runtime
//! reports lifecycle changes on an event stream. Two backends implement [`Runtime`]:
//! the CRI backend (containerd, CRI-O) and the native Wasm backend (wasmtime).
//!
//! Start with [`Runtime`]; the data it takes and returns lives in [`types`].

pub mod error;
pub mod reference;
pub mod stdio;
pub mod types;

pub use error::{BoxError, Error, Result};
pub use stdio::StdioSession;
pub use types::*;

use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::broadcast;

/// A container runtime as the node sees it.
///
/// Every method is safe to call concurrently. Identifiers are opaque strings chosen by
/// the runtime. Methods that act on an object that is already gone return
/// [`Error::NotFound`]; stop and remove are idempotent in the CRI sense (stopping a
/// stopped container succeeds).
#[async_trait]
pub trait Runtime: Send + Sync + 'static {
    /// A short name for logs and metrics, e.g. `wasm` or `cri`.
    fn name(&self) -> &str;

    /// What the runtime can do and how it differs, for the node to ask instead of
    /// comparing names. The default is an OCI container runtime with nothing more
    /// than [`Runtime::exec_sync`].
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// The runtime's name and version, as reported in `nodeInfo.containerRuntimeVersion`.
    async fn version(&self) -> Result<RuntimeVersion>;

    /// Whether the runtime and its network are ready to run pods.
    async fn status(&self) -> Result<RuntimeStatus>;

    /// Creates and starts a pod sandbox. Returns the sandbox id.
    async fn run_pod_sandbox(&self, config: &PodSandboxConfig) -> Result<String>;

    /// Stops a sandbox and every container in it, forcibly. Idempotent.
    async fn stop_pod_sandbox(&self, sandbox_id: &str) -> Result<()>;

    /// Removes a stopped sandbox and its containers. Idempotent.
    async fn remove_pod_sandbox(&self, sandbox_id: &str) -> Result<()>;

    /// The current status of one sandbox.
    async fn pod_sandbox_status(&self, sandbox_id: &str) -> Result<PodSandboxStatus>;

    /// Every sandbox the runtime knows, ready or not.
    async fn list_pod_sandboxes(&self) -> Result<Vec<PodSandbox>>;

    /// Creates a container in a running sandbox. Returns the container id.
    async fn create_container(
        &self,
        sandbox_id: &str,
        config: &ContainerConfig,
        sandbox_config: &PodSandboxConfig,
    ) -> Result<String>;

    /// Starts a created container.
    async fn start_container(&self, container_id: &str) -> Result<()>;

    /// Stops a running container, forcibly after `timeout`. Idempotent.
    async fn stop_container(&self, container_id: &str, timeout: Duration) -> Result<()>;

    /// Removes a container that is not running. Idempotent.
    async fn remove_container(&self, container_id: &str) -> Result<()>;

    /// Changes a created or running container's resources in place (CRI's
    /// UpdateContainerResources: in-place pod resize). What the runtime cannot
    /// change is refused with [`Error::FailedPrecondition`].
    async fn update_container_resources(
        &self,
        container_id: &str,
        resources: &ContainerResources,
    ) -> Result<()> {
        let _ = (container_id, resources);
        Err(Error::Unsupported {
            runtime: self.name().to_owned(),
            operation: "update_container_resources",
        })
    }

    /// Makes a running container's output go to a new file at its log path (CRI's
    /// ReopenContainerLog): the node has renamed the old file aside to rotate it, and
    /// records written from now on go to a fresh file at the same path. No record is
    /// lost or split between the two files. A container that is not running is
    /// refused with [`Error::FailedPrecondition`].
    async fn reopen_container_log(&self, container_id: &str) -> Result<()> {
        let _ = container_id;
        Err(Error::Unsupported {
            runtime: self.name().to_owned(),
            operation: "reopen_container_log",
        })
    }

    /// Every container the runtime knows, in any state.
    async fn list_containers(&self) -> Result<Vec<Container>>;

    /// The detailed status of one container.
    async fn container_status(&self, container_id: &str) -> Result<ContainerStatus>;

    /// Makes `image` available locally and returns its image id (a digest), pulling
    /// it with `auth` when the registry wants credentials.
    async fn pull_image(&self, image: &str, auth: Option<&AuthConfig>) -> Result<String>;

    /// The local image that `image` refers to, if there is one.
    async fn image_status(&self, image: &str) -> Result<Option<Image>>;

    /// Every image stored locally.
    async fn list_images(&self) -> Result<Vec<Image>>;

    /// Removes a local image by reference or id. Idempotent.
    async fn remove_image(&self, image: &str) -> Result<()>;

    /// How much the filesystems holding images use (image GC and eviction read it).
    async fn image_fs_info(&self) -> Result<Vec<FilesystemUsage>> {
        Err(Error::Unsupported {
            runtime: self.name().to_owned(),
            operation: "image_fs_info",
        })
    }

    /// What each container's writable layer uses on disk (CRI ListContainerStats'
    /// `writable_layer`): the Summary's container `rootfs` and the pods' ephemeral
    /// storage (eviction reads it). A runtime whose containers write to no layer of
    /// their own answers an empty list.
    async fn container_fs_usage(&self) -> Result<Vec<ContainerFsUsage>> {
        Err(Error::Unsupported {
            runtime: self.name().to_owned(),
            operation: "container_fs_usage",
        })
    }

    /// Runs a command in a container and waits for it (probes, hooks).
    async fn exec_sync(
        &self,
        container_id: &str,
        command: &[String],
        timeout: Duration,
    ) -> Result<ExecResult> {
        let _ = (container_id, command, timeout);
        Err(Error::Unsupported {
            runtime: self.name().to_owned(),
            operation: "exec_sync",
        })
    }

    /// Prepares a streaming `cmd` run in a running container (CRI Exec) and returns
    /// the URL of the runtime's streaming server that serves it: the node proxies the
    /// client's upgraded connection there, as the kubelet does.
    async fn exec(&self, container_id: &str, cmd: &[String], streams: Streams) -> Result<String> {
        let _ = (container_id, cmd, streams);
        Err(Error::Unsupported {
            runtime: self.name().to_owned(),
            operation: "exec",
        })
    }

    /// As [`Self::exec`], for the running container's own stdio (CRI Attach).
    async fn attach(&self, container_id: &str, streams: Streams) -> Result<String> {
        let _ = (container_id, streams);
        Err(Error::Unsupported {
            runtime: self.name().to_owned(),
            operation: "attach",
        })
    }

    /// As [`Self::exec`], forwarding TCP to `ports` of the sandbox (CRI
    /// PortForward; none: the client names them per stream).
    async fn port_forward(&self, sandbox_id: &str, ports: &[u16]) -> Result<String> {
        let _ = (sandbox_id, ports);
        Err(Error::Unsupported {
            runtime: self.name().to_owned(),
            operation: "port_forward",
        })
    }

    /// Starts `cmd` in a running container with its stdio connected to the returned
    /// session, for a runtime that serves streams itself rather than through a
    /// streaming server (the Wasm runtime): the node speaks the client's protocol and
    /// relays. Dropping the session ends the command.
    async fn exec_stdio(
        &self,
        container_id: &str,
        cmd: &[String],
        streams: Streams,
    ) -> Result<StdioSession> {
        let _ = (container_id, cmd, streams);
        Err(Error::Unsupported {
            runtime: self.name().to_owned(),
            operation: "exec_stdio",
        })
    }

    /// As [`Self::exec_stdio`], connected to the running container's own stdio: its
    /// output from now on, and its stdin when the container keeps one open. The
    /// session's exit is the container's. Dropping the session detaches.
    async fn attach_stdio(&self, container_id: &str, streams: Streams) -> Result<StdioSession> {
        let _ = (container_id, streams);
        Err(Error::Unsupported {
            runtime: self.name().to_owned(),
            operation: "attach_stdio",
        })
    }

    /// Lifecycle events as they happen. Events are hints that make the node react
    /// sooner; the node still relists, so a lagging receiver loses nothing that matters.
    fn subscribe(&self) -> broadcast::Receiver<RuntimeEvent>;
}
