//! A small in-process CRI v1 server on a unix socket: just enough of
//! `RuntimeService` and `ImageService` to exercise the seam (connection handling,
//! deadlines, error codes, events), recording what it was sent.
//!
//! It is a fake for the seam only: what a real runtime does with the requests is
//! tested against containerd.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::Stream;
use tokio::net::UnixListener;
use tokio::sync::{broadcast, oneshot};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use wasmlet_proto::cri::v1 as cri;
use wasmlet_proto::cri::v1::image_service_server::{ImageService, ImageServiceServer};
use wasmlet_proto::cri::v1::runtime_service_server::{RuntimeService, RuntimeServiceServer};

/// How the fake answers `GetContainerEvents`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventsMode {
    /// Streams events until the server stops.
    Stream,
    /// Answers `Unimplemented`, like a runtime that predates the RPC.
    Unimplemented,
    /// Closes the stream at once with OK.
    EndAtOnce,
}

/// The fake's knobs and what it saw.
pub struct State {
    pub api_version: String,
    pub version_unimplemented: bool,
    pub events_mode: EventsMode,
    /// Whether stopping or removing a missing object answers `NotFound` (some
    /// runtime versions) or OK (others).
    pub missing_is_not_found: bool,
    /// Makes `StartContainer` take this long.
    pub start_delay: Duration,
    pub network_ready: bool,
    pub sandboxes: BTreeMap<String, cri::PodSandboxStatus>,
    pub containers: BTreeMap<String, (String, cri::ContainerStatus)>,
    pub images: BTreeMap<String, cri::Image>,
    /// Every call as `Method` plus its `grpc-timeout` header, in order.
    pub calls: Vec<(String, Option<String>)>,
    pub last_version: Option<cri::VersionRequest>,
    pub last_run: Option<cri::RunPodSandboxRequest>,
    pub last_create: Option<cri::CreateContainerRequest>,
    pub last_stop: Option<cri::StopContainerRequest>,
    pub last_exec: Option<cri::ExecSyncRequest>,
    pub last_pull: Option<cri::PullImageRequest>,
    pub event_calls: usize,
    pub open_event_streams: usize,
    next_id: u64,
}

impl Default for State {
    fn default() -> Self {
        State {
            api_version: "v1".into(),
            version_unimplemented: false,
            events_mode: EventsMode::Stream,
            missing_is_not_found: true,
            start_delay: Duration::ZERO,
            network_ready: true,
            sandboxes: BTreeMap::new(),
            containers: BTreeMap::new(),
            images: BTreeMap::new(),
            calls: Vec::new(),
            last_version: None,
            last_run: None,
            last_create: None,
            last_stop: None,
            last_exec: None,
            last_pull: None,
            event_calls: 0,
            open_event_streams: 0,
            next_id: 1,
        }
    }
}

/// The fake runtime; clones share state, so a test keeps one to look inside.
#[derive(Clone)]
pub struct Fake {
    pub state: Arc<Mutex<State>>,
    events: broadcast::Sender<cri::ContainerEventResponse>,
    /// Ends the event streams of the serving instance, so that it can shut down.
    stop_streams: Arc<Mutex<CancellationToken>>,
}

impl Default for Fake {
    fn default() -> Self {
        Fake {
            state: Arc::default(),
            events: broadcast::channel(64).0,
            stop_streams: Arc::default(),
        }
    }
}

/// A serving instance of the fake.
pub struct Server {
    path: PathBuf,
    shutdown: Option<oneshot::Sender<()>>,
    streams: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Stops serving, ends open streams so that connections close, and removes the
    /// socket: the runtime is gone.
    pub async fn stop(mut self) {
        self.streams.cancel();
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(Duration::from_secs(10), &mut self.task)
            .await
            .expect("the fake server shuts down")
            .expect("the fake server task");
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Fake {
    pub fn with(f: impl FnOnce(&mut State)) -> Self {
        let fake = Fake::default();
        f(&mut fake.state.lock().unwrap());
        fake
    }

    pub fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    /// Serves on `path` until [`Server::stop`].
    pub fn serve(&self, path: &Path) -> Server {
        let listener = UnixListener::bind(path).expect("bind the fake's socket");
        let incoming = futures::stream::unfold(listener, |listener| async move {
            let accepted = listener.accept().await.map(|(stream, _)| stream);
            Some((accepted, listener))
        });
        let streams = CancellationToken::new();
        *self.stop_streams.lock().unwrap() = streams.clone();
        let (tx, rx) = oneshot::channel::<()>();
        let router = tonic::transport::Server::builder()
            .add_service(RuntimeServiceServer::new(self.clone()))
            .add_service(ImageServiceServer::new(self.clone()));
        let task = tokio::spawn(async move {
            router
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = rx.await;
                })
                .await
                .expect("the fake server runs");
        });
        Server {
            path: path.to_owned(),
            shutdown: Some(tx),
            streams,
            task,
        }
    }

    /// Marks a container exited and emits the stop event.
    pub fn exit(&self, container_id: &str, code: i32) {
        let event = {
            let mut state = self.state();
            let State {
                containers,
                sandboxes,
                ..
            } = &mut *state;
            let (sandbox_id, c) = containers.get_mut(container_id).expect("known container");
            c.state = cri::ContainerState::ContainerExited.into();
            c.finished_at = now();
            c.exit_code = code;
            c.reason = if code == 0 { "Completed" } else { "Error" }.into();
            event(
                container_id,
                cri::ContainerEventType::ContainerStoppedEvent,
                sandboxes.get(sandbox_id.as_str()),
            )
        };
        let _ = self.events.send(event);
    }

    /// Sends a raw event to every open stream.
    pub fn send_event(&self, e: cri::ContainerEventResponse) {
        let _ = self.events.send(e);
    }

    fn record<T>(&self, method: &str, request: &Request<T>) {
        let timeout = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        self.state().calls.push((method.to_owned(), timeout));
    }

    fn id(state: &mut State, prefix: &str) -> String {
        let id = format!("{prefix}{}", state.next_id);
        state.next_id += 1;
        id
    }
}

fn now() -> i64 {
    jiff::Timestamp::now().as_nanosecond() as i64
}

fn event(
    container_id: &str,
    kind: cri::ContainerEventType,
    sandbox: Option<&cri::PodSandboxStatus>,
) -> cri::ContainerEventResponse {
    cri::ContainerEventResponse {
        container_id: container_id.to_owned(),
        container_event_type: kind.into(),
        created_at: now(),
        pod_sandbox_status: sandbox.cloned(),
        containers_statuses: Vec::new(),
    }
}

fn missing(state: &State, what: &str, id: &str) -> Result<(), Status> {
    if state.missing_is_not_found {
        Err(Status::not_found(format!("{what} {id:?}: not found")))
    } else {
        Ok(())
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<cri::ContainerEventResponse, Status>> + Send>>;

/// Decrements the open-stream count when the client goes away.
struct StreamGuard(Arc<Mutex<State>>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let mut state = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        state.open_event_streams -= 1;
    }
}

/// RPCs the fake does not answer. Written in the shape `async_trait` expands to,
/// because the attribute does not see into macro invocations.
macro_rules! unimplemented_rpcs {
    ($($name:ident($req:ident) -> $resp:ident;)*) => {
        $(
            fn $name<'life0, 'async_trait>(
                &'life0 self,
                _: Request<cri::$req>,
            ) -> Pin<Box<dyn Future<Output = Result<Response<cri::$resp>, Status>> + Send + 'async_trait>>
            where
                'life0: 'async_trait,
                Self: 'async_trait,
            {
                Box::pin(async {
                    Err(Status::unimplemented(concat!(stringify!($name), " is not faked")))
                })
            }
        )*
    };
}

#[tonic::async_trait]
impl RuntimeService for Fake {
    async fn version(
        &self,
        request: Request<cri::VersionRequest>,
    ) -> Result<Response<cri::VersionResponse>, Status> {
        self.record("Version", &request);
        let mut state = self.state();
        state.last_version = Some(request.into_inner());
        if state.version_unimplemented {
            return Err(Status::unimplemented(
                "unknown service runtime.v1.RuntimeService",
            ));
        }
        Ok(Response::new(cri::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "fake".into(),
            runtime_version: "1.0.0".into(),
            runtime_api_version: state.api_version.clone(),
        }))
    }

    async fn status(
        &self,
        request: Request<cri::StatusRequest>,
    ) -> Result<Response<cri::StatusResponse>, Status> {
        self.record("Status", &request);
        let network_ready = self.state().network_ready;
        let condition =
            |t: &str, status: bool, reason: &str, message: &str| cri::RuntimeCondition {
                r#type: t.into(),
                status,
                reason: reason.into(),
                message: message.into(),
            };
        let conditions = vec![
            condition("RuntimeReady", true, "", ""),
            if network_ready {
                condition("NetworkReady", true, "", "")
            } else {
                condition(
                    "NetworkReady",
                    false,
                    "NetworkPluginNotReady",
                    "cni plugin not initialized",
                )
            },
        ];
        Ok(Response::new(cri::StatusResponse {
            status: Some(cri::RuntimeStatus { conditions }),
            ..Default::default()
        }))
    }

    async fn run_pod_sandbox(
        &self,
        request: Request<cri::RunPodSandboxRequest>,
    ) -> Result<Response<cri::RunPodSandboxResponse>, Status> {
        self.record("RunPodSandbox", &request);
        let request = request.into_inner();
        let config = request
            .config
            .clone()
            .ok_or_else(|| Status::invalid_argument("no config"))?;
        let mut state = self.state();
        let id = Fake::id(&mut state, "sandbox-");
        state.sandboxes.insert(
            id.clone(),
            cri::PodSandboxStatus {
                id: id.clone(),
                metadata: config.metadata.clone(),
                state: cri::PodSandboxState::SandboxReady.into(),
                created_at: now(),
                network: Some(cri::PodSandboxNetworkStatus {
                    ip: "10.88.0.2".into(),
                    additional_ips: Vec::new(),
                }),
                labels: config.labels.clone(),
                annotations: config.annotations.clone(),
                runtime_handler: request.runtime_handler.clone(),
                ..Default::default()
            },
        );
        state.last_run = Some(request);
        Ok(Response::new(cri::RunPodSandboxResponse {
            pod_sandbox_id: id,
        }))
    }

    async fn stop_pod_sandbox(
        &self,
        request: Request<cri::StopPodSandboxRequest>,
    ) -> Result<Response<cri::StopPodSandboxResponse>, Status> {
        self.record("StopPodSandbox", &request);
        let id = request.into_inner().pod_sandbox_id;
        let mut state = self.state();
        match state.sandboxes.get_mut(&id) {
            Some(s) => s.state = cri::PodSandboxState::SandboxNotready.into(),
            None => missing(&state, "sandbox", &id)?,
        }
        Ok(Response::new(cri::StopPodSandboxResponse {}))
    }

    async fn remove_pod_sandbox(
        &self,
        request: Request<cri::RemovePodSandboxRequest>,
    ) -> Result<Response<cri::RemovePodSandboxResponse>, Status> {
        self.record("RemovePodSandbox", &request);
        let id = request.into_inner().pod_sandbox_id;
        let mut state = self.state();
        if state.sandboxes.remove(&id).is_none() {
            missing(&state, "sandbox", &id)?;
        }
        state.containers.retain(|_, (sandbox, _)| *sandbox != id);
        Ok(Response::new(cri::RemovePodSandboxResponse {}))
    }

    async fn pod_sandbox_status(
        &self,
        request: Request<cri::PodSandboxStatusRequest>,
    ) -> Result<Response<cri::PodSandboxStatusResponse>, Status> {
        self.record("PodSandboxStatus", &request);
        let id = request.into_inner().pod_sandbox_id;
        let status = self
            .state()
            .sandboxes
            .get(&id)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("sandbox {id:?}: not found")))?;
        Ok(Response::new(cri::PodSandboxStatusResponse {
            status: Some(status),
            ..Default::default()
        }))
    }

    async fn list_pod_sandbox(
        &self,
        request: Request<cri::ListPodSandboxRequest>,
    ) -> Result<Response<cri::ListPodSandboxResponse>, Status> {
        self.record("ListPodSandbox", &request);
        let items = self
            .state()
            .sandboxes
            .values()
            .map(|s| cri::PodSandbox {
                id: s.id.clone(),
                metadata: s.metadata.clone(),
                state: s.state,
                created_at: s.created_at,
                labels: s.labels.clone(),
                annotations: s.annotations.clone(),
                runtime_handler: s.runtime_handler.clone(),
            })
            .collect();
        Ok(Response::new(cri::ListPodSandboxResponse { items }))
    }

    async fn create_container(
        &self,
        request: Request<cri::CreateContainerRequest>,
    ) -> Result<Response<cri::CreateContainerResponse>, Status> {
        self.record("CreateContainer", &request);
        let request = request.into_inner();
        let config = request.config.clone().unwrap_or_default();
        let event = {
            let mut state = self.state();
            let Some(sandbox) = state.sandboxes.get(&request.pod_sandbox_id).cloned() else {
                return Err(Status::not_found("sandbox not found"));
            };
            let id = Fake::id(&mut state, "container-");
            let status = cri::ContainerStatus {
                id: id.clone(),
                metadata: config.metadata.clone(),
                state: cri::ContainerState::ContainerCreated.into(),
                created_at: now(),
                image: config.image.clone(),
                image_ref: "sha256:feedface".into(),
                labels: config.labels.clone(),
                annotations: config.annotations.clone(),
                log_path: format!(
                    "{}/{}",
                    request
                        .sandbox_config
                        .as_ref()
                        .map(|s| s.log_directory.as_str())
                        .unwrap_or_default(),
                    config.log_path
                ),
                ..Default::default()
            };
            state
                .containers
                .insert(id.clone(), (request.pod_sandbox_id.clone(), status));
            state.last_create = Some(request);
            event(
                &id,
                cri::ContainerEventType::ContainerCreatedEvent,
                Some(&sandbox),
            )
        };
        let id = event.container_id.clone();
        let _ = self.events.send(event);
        Ok(Response::new(cri::CreateContainerResponse {
            container_id: id,
        }))
    }

    async fn start_container(
        &self,
        request: Request<cri::StartContainerRequest>,
    ) -> Result<Response<cri::StartContainerResponse>, Status> {
        self.record("StartContainer", &request);
        let delay = self.state().start_delay;
        tokio::time::sleep(delay).await;
        let id = request.into_inner().container_id;
        let mut state = self.state();
        let (_, c) = state
            .containers
            .get_mut(&id)
            .ok_or_else(|| Status::not_found("container not found"))?;
        if c.state != i32::from(cri::ContainerState::ContainerCreated) {
            return Err(Status::failed_precondition("container is not created"));
        }
        c.state = cri::ContainerState::ContainerRunning.into();
        c.started_at = now();
        Ok(Response::new(cri::StartContainerResponse {}))
    }

    async fn stop_container(
        &self,
        request: Request<cri::StopContainerRequest>,
    ) -> Result<Response<cri::StopContainerResponse>, Status> {
        self.record("StopContainer", &request);
        let request = request.into_inner();
        let running = {
            let mut state = self.state();
            state.last_stop = Some(request.clone());
            match state.containers.get(&request.container_id) {
                Some((_, c)) => c.state == i32::from(cri::ContainerState::ContainerRunning),
                None => {
                    missing(&state, "container", &request.container_id)?;
                    false
                }
            }
        };
        if running {
            self.exit(&request.container_id, 137);
        }
        Ok(Response::new(cri::StopContainerResponse {}))
    }

    async fn remove_container(
        &self,
        request: Request<cri::RemoveContainerRequest>,
    ) -> Result<Response<cri::RemoveContainerResponse>, Status> {
        self.record("RemoveContainer", &request);
        let id = request.into_inner().container_id;
        let mut state = self.state();
        if state.containers.remove(&id).is_none() {
            missing(&state, "container", &id)?;
        }
        Ok(Response::new(cri::RemoveContainerResponse {}))
    }

    async fn list_containers(
        &self,
        request: Request<cri::ListContainersRequest>,
    ) -> Result<Response<cri::ListContainersResponse>, Status> {
        self.record("ListContainers", &request);
        let filter = request.into_inner().filter.unwrap_or_default();
        let containers = self
            .state()
            .containers
            .iter()
            .filter(|(id, _)| filter.id.is_empty() || **id == filter.id)
            .map(|(id, (sandbox, c))| cri::Container {
                id: id.clone(),
                pod_sandbox_id: sandbox.clone(),
                metadata: c.metadata.clone(),
                image: c.image.clone(),
                image_ref: c.image_ref.clone(),
                state: c.state,
                created_at: c.created_at,
                labels: c.labels.clone(),
                annotations: c.annotations.clone(),
                image_id: String::new(),
            })
            .collect();
        Ok(Response::new(cri::ListContainersResponse { containers }))
    }

    async fn container_status(
        &self,
        request: Request<cri::ContainerStatusRequest>,
    ) -> Result<Response<cri::ContainerStatusResponse>, Status> {
        self.record("ContainerStatus", &request);
        let id = request.into_inner().container_id;
        let status = self
            .state()
            .containers
            .get(&id)
            .map(|(_, c)| c.clone())
            .ok_or_else(|| {
                Status::not_found(format!(
                    "an error occurred when try to find container {id:?}: not found"
                ))
            })?;
        Ok(Response::new(cri::ContainerStatusResponse {
            status: Some(status),
            ..Default::default()
        }))
    }

    async fn exec_sync(
        &self,
        request: Request<cri::ExecSyncRequest>,
    ) -> Result<Response<cri::ExecSyncResponse>, Status> {
        self.record("ExecSync", &request);
        let request = request.into_inner();
        let mut state = self.state();
        if !state.containers.contains_key(&request.container_id) {
            return Err(Status::not_found("container not found"));
        }
        let stdout = request.cmd.join(" ").into_bytes();
        state.last_exec = Some(request);
        Ok(Response::new(cri::ExecSyncResponse {
            stdout,
            stderr: b"warning\n".to_vec(),
            exit_code: 7,
        }))
    }

    type GetContainerEventsStream = EventStream;

    async fn get_container_events(
        &self,
        request: Request<cri::GetEventsRequest>,
    ) -> Result<Response<EventStream>, Status> {
        self.record("GetContainerEvents", &request);
        let mode = {
            let mut state = self.state();
            state.event_calls += 1;
            state.events_mode
        };
        match mode {
            EventsMode::Unimplemented => {
                return Err(Status::unimplemented(
                    "unknown method GetContainerEvents for service runtime.v1.RuntimeService",
                ));
            }
            EventsMode::EndAtOnce => {
                return Ok(Response::new(Box::pin(futures::stream::empty())));
            }
            EventsMode::Stream => {}
        }
        self.state().open_event_streams += 1;
        let guard = StreamGuard(self.state.clone());
        let rx = self.events.subscribe();
        let stop = self.stop_streams.lock().unwrap().clone();
        let stream =
            futures::stream::unfold((rx, stop, guard), |(mut rx, stop, guard)| async move {
                loop {
                    let next = tokio::select! {
                        _ = stop.cancelled() => return None,
                        next = rx.recv() => next,
                    };
                    match next {
                        Ok(e) => return Some((Ok(e), (rx, stop, guard))),
                        Err(broadcast::error::RecvError::Lagged(_)) => continue,
                        Err(broadcast::error::RecvError::Closed) => return None,
                    }
                }
            });
        Ok(Response::new(Box::pin(stream)))
    }

    unimplemented_rpcs! {
        update_container_resources(UpdateContainerResourcesRequest) -> UpdateContainerResourcesResponse;
        reopen_container_log(ReopenContainerLogRequest) -> ReopenContainerLogResponse;
        exec(ExecRequest) -> ExecResponse;
        attach(AttachRequest) -> AttachResponse;
        port_forward(PortForwardRequest) -> PortForwardResponse;
        container_stats(ContainerStatsRequest) -> ContainerStatsResponse;
        list_container_stats(ListContainerStatsRequest) -> ListContainerStatsResponse;
        pod_sandbox_stats(PodSandboxStatsRequest) -> PodSandboxStatsResponse;
        list_pod_sandbox_stats(ListPodSandboxStatsRequest) -> ListPodSandboxStatsResponse;
        update_runtime_config(UpdateRuntimeConfigRequest) -> UpdateRuntimeConfigResponse;
        checkpoint_container(CheckpointContainerRequest) -> CheckpointContainerResponse;
        list_metric_descriptors(ListMetricDescriptorsRequest) -> ListMetricDescriptorsResponse;
        list_pod_sandbox_metrics(ListPodSandboxMetricsRequest) -> ListPodSandboxMetricsResponse;
        runtime_config(RuntimeConfigRequest) -> RuntimeConfigResponse;
        update_pod_sandbox_resources(UpdatePodSandboxResourcesRequest) -> UpdatePodSandboxResourcesResponse;
    }
}

#[tonic::async_trait]
impl ImageService for Fake {
    async fn list_images(
        &self,
        request: Request<cri::ListImagesRequest>,
    ) -> Result<Response<cri::ListImagesResponse>, Status> {
        self.record("ListImages", &request);
        let images = self.state().images.values().cloned().collect();
        Ok(Response::new(cri::ListImagesResponse { images }))
    }

    async fn image_status(
        &self,
        request: Request<cri::ImageStatusRequest>,
    ) -> Result<Response<cri::ImageStatusResponse>, Status> {
        self.record("ImageStatus", &request);
        let name = request.into_inner().image.unwrap_or_default().image;
        // As containerd: an absent image is an unset `image`, not an error.
        let image = self.state().images.get(&name).cloned();
        Ok(Response::new(cri::ImageStatusResponse {
            image,
            ..Default::default()
        }))
    }

    async fn pull_image(
        &self,
        request: Request<cri::PullImageRequest>,
    ) -> Result<Response<cri::PullImageResponse>, Status> {
        self.record("PullImage", &request);
        let request = request.into_inner();
        self.state().last_pull = Some(request.clone());
        let name = request.image.unwrap_or_default().image;
        if !name.starts_with("registry.local/") {
            return Err(Status::unknown(format!(
                "failed to pull and unpack image {name:?}: failed to resolve reference: \
                 pull access denied"
            )));
        }
        let id = "sha256:0123456789abcdef".to_owned();
        self.state().images.insert(
            name.clone(),
            cri::Image {
                id: id.clone(),
                repo_tags: vec![name],
                size: 4096,
                uid: Some(cri::Int64Value { value: 65534 }),
                ..Default::default()
            },
        );
        Ok(Response::new(cri::PullImageResponse { image_ref: id }))
    }

    async fn remove_image(
        &self,
        request: Request<cri::RemoveImageRequest>,
    ) -> Result<Response<cri::RemoveImageResponse>, Status> {
        self.record("RemoveImage", &request);
        let name = request.into_inner().image.unwrap_or_default().image;
        let mut state = self.state();
        if state.images.remove(&name).is_none() {
            missing(&state, "image", &name)?;
        }
        Ok(Response::new(cri::RemoveImageResponse {}))
    }

    async fn image_fs_info(
        &self,
        _: Request<cri::ImageFsInfoRequest>,
    ) -> Result<Response<cri::ImageFsInfoResponse>, Status> {
        // What containerd reports for its overlayfs snapshotter.
        Ok(Response::new(cri::ImageFsInfoResponse {
            image_filesystems: vec![cri::FilesystemUsage {
                timestamp: 1_700_000_000_000_000_000,
                fs_id: Some(cri::FilesystemIdentifier {
                    mountpoint: "/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs".into(),
                }),
                used_bytes: Some(cri::UInt64Value { value: 4096 }),
                inodes_used: Some(cri::UInt64Value { value: 12 }),
            }],
            container_filesystems: Vec::new(),
        }))
    }
}
