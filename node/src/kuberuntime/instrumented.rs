//! The kubelet's instrumented runtime service (`instrumented_services.go`): a
//! [`Runtime`] that forwards every call to the one it wraps and records, per
//! operation, the `kubelet_runtime_operations_*` metrics — one count and one duration
//! for every call, and one error for every call that returned an error.
//!
//! The node wraps each runtime once, before the router hands it out, so every caller
//! (pod workers, PLEG, probes, image GC, log rotation) is measured alike. Every trait
//! method is forwarded explicitly, those with default bodies included: falling back
//! to a default would hide the wrapped runtime's own implementation. `name`,
//! `capabilities` and `subscribe` are not runtime operations and are only forwarded.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::broadcast;
use wasmlet_runtime::{
    AuthConfig, Capabilities, Container, ContainerConfig, ContainerFsUsage, ContainerResources,
    ContainerStatus, ExecResult, FilesystemUsage, Image, PodSandbox, PodSandboxConfig,
    PodSandboxStatus, Result, Runtime, RuntimeEvent, RuntimeStatus, RuntimeVersion, StdioSession,
    Streams,
};

use crate::metrics::NodeMetrics;

/// A [`Runtime`] that records the kubelet's runtime operation metrics for the one
/// it wraps.
pub struct InstrumentedRuntime {
    inner: Arc<dyn Runtime>,
    metrics: &'static NodeMetrics,
}

impl InstrumentedRuntime {
    /// Wraps `inner`, recording into `metrics` (the process's are
    /// [`crate::metrics::global`]).
    pub fn new(inner: Arc<dyn Runtime>, metrics: &'static NodeMetrics) -> InstrumentedRuntime {
        InstrumentedRuntime { inner, metrics }
    }

    /// Awaits `call`, then records it as `operation` (the kubelet's `operation_type`).
    async fn record<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let start = Instant::now();
        let result = call.await;
        self.metrics
            .runtime_operation(operation, start.elapsed(), result.is_err());
        result
    }
}

#[async_trait]
impl Runtime for InstrumentedRuntime {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn version(&self) -> Result<RuntimeVersion> {
        self.record("version", self.inner.version()).await
    }

    async fn status(&self) -> Result<RuntimeStatus> {
        self.record("status", self.inner.status()).await
    }

    async fn run_pod_sandbox(&self, config: &PodSandboxConfig) -> Result<String> {
        self.record("run_podsandbox", self.inner.run_pod_sandbox(config))
            .await
    }

    async fn stop_pod_sandbox(&self, sandbox_id: &str) -> Result<()> {
        self.record("stop_podsandbox", self.inner.stop_pod_sandbox(sandbox_id))
            .await
    }

    async fn remove_pod_sandbox(&self, sandbox_id: &str) -> Result<()> {
        self.record(
            "remove_podsandbox",
            self.inner.remove_pod_sandbox(sandbox_id),
        )
        .await
    }

    async fn pod_sandbox_status(&self, sandbox_id: &str) -> Result<PodSandboxStatus> {
        self.record(
            "podsandbox_status",
            self.inner.pod_sandbox_status(sandbox_id),
        )
        .await
    }

    async fn list_pod_sandboxes(&self) -> Result<Vec<PodSandbox>> {
        self.record("list_podsandbox", self.inner.list_pod_sandboxes())
            .await
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: &ContainerConfig,
        sandbox_config: &PodSandboxConfig,
    ) -> Result<String> {
        let call = self
            .inner
            .create_container(sandbox_id, config, sandbox_config);
        self.record("create_container", call).await
    }

    async fn start_container(&self, container_id: &str) -> Result<()> {
        self.record("start_container", self.inner.start_container(container_id))
            .await
    }

    async fn stop_container(&self, container_id: &str, timeout: Duration) -> Result<()> {
        let call = self.inner.stop_container(container_id, timeout);
        self.record("stop_container", call).await
    }

    async fn remove_container(&self, container_id: &str) -> Result<()> {
        self.record(
            "remove_container",
            self.inner.remove_container(container_id),
        )
        .await
    }

    async fn update_container_resources(
        &self,
        container_id: &str,
        resources: &ContainerResources,
    ) -> Result<()> {
        let call = self
            .inner
            .update_container_resources(container_id, resources);
        self.record("update_container", call).await
    }

    async fn reopen_container_log(&self, container_id: &str) -> Result<()> {
        let call = self.inner.reopen_container_log(container_id);
        self.record("reopen_container_log", call).await
    }

    async fn list_containers(&self) -> Result<Vec<Container>> {
        self.record("list_containers", self.inner.list_containers())
            .await
    }

    async fn container_status(&self, container_id: &str) -> Result<ContainerStatus> {
        self.record(
            "container_status",
            self.inner.container_status(container_id),
        )
        .await
    }

    async fn pull_image(&self, image: &str, auth: Option<&AuthConfig>) -> Result<String> {
        self.record("pull_image", self.inner.pull_image(image, auth))
            .await
    }

    async fn image_status(&self, image: &str) -> Result<Option<Image>> {
        self.record("image_status", self.inner.image_status(image))
            .await
    }

    async fn list_images(&self) -> Result<Vec<Image>> {
        self.record("list_images", self.inner.list_images()).await
    }

    async fn remove_image(&self, image: &str) -> Result<()> {
        self.record("remove_image", self.inner.remove_image(image))
            .await
    }

    async fn image_fs_info(&self) -> Result<Vec<FilesystemUsage>> {
        self.record("image_fs_info", self.inner.image_fs_info())
            .await
    }

    async fn exec(&self, container_id: &str, cmd: &[String], streams: Streams) -> Result<String> {
        let call = self.inner.exec(container_id, cmd, streams);
        self.record("exec", call).await
    }

    async fn attach(&self, container_id: &str, streams: Streams) -> Result<String> {
        let call = self.inner.attach(container_id, streams);
        self.record("attach", call).await
    }

    async fn exec_stdio(
        &self,
        container_id: &str,
        cmd: &[String],
        streams: Streams,
    ) -> Result<StdioSession> {
        let call = self.inner.exec_stdio(container_id, cmd, streams);
        self.record("exec", call).await
    }

    async fn attach_stdio(&self, container_id: &str, streams: Streams) -> Result<StdioSession> {
        let call = self.inner.attach_stdio(container_id, streams);
        self.record("attach", call).await
    }

    async fn port_forward(&self, sandbox_id: &str, ports: &[u16]) -> Result<String> {
        let call = self.inner.port_forward(sandbox_id, ports);
        self.record("port_forward", call).await
    }

    async fn container_fs_usage(&self) -> Result<Vec<ContainerFsUsage>> {
        let call = self.inner.container_fs_usage();
        self.record("list_container_stats", call).await
    }

    async fn exec_sync(
        &self,
        container_id: &str,
        command: &[String],
        timeout: Duration,
    ) -> Result<ExecResult> {
        let call = self.inner.exec_sync(container_id, command, timeout);
        self.record("exec_sync", call).await
    }

    fn subscribe(&self) -> broadcast::Receiver<RuntimeEvent> {
        self.inner.subscribe()
    }
}

#[cfg(test)]
#[path = "instrumented_tests.rs"]
mod tests;
