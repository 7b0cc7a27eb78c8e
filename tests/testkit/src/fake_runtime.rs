//! A recording, scriptable, in-memory [`Runtime`] for fast unit tests of the node.
//!
//! [`FakeRuntime`] keeps sandboxes, containers and images in memory, gives them ids
//! in creation order (`sandbox-0001`, `container-0002`, …), moves containers through
//! Created → Running → Exited as the calls ask, sends the [`RuntimeEvent`]s a real
//! runtime would, and records every call in order as a [`Call`]. A test scripts the
//! rest: a container exits ([`FakeRuntime::exit`]), or exits as soon as it starts
//! ([`FakeRuntime::exit_on_start`]); the next call of a kind fails
//! ([`FakeRuntime::fail_next`]) or waits until the test lets it go
//! ([`FakeRuntime::hold`]); an image cannot be pulled ([`FakeRuntime::missing_image`]).
//! Nothing sleeps and nothing touches the file system.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use jiff::Timestamp;
use sha2::{Digest, Sha256};
use tokio::sync::{Semaphore, broadcast, watch};
use wasmlet_runtime::{
    AuthConfig, Container, ContainerConfig, ContainerEventKind, ContainerResources, ContainerState,
    ContainerStatus, Error, ExecResult, FilesystemUsage, Image, PodSandbox, PodSandboxConfig,
    PodSandboxStatus, Result, Runtime, RuntimeEvent, RuntimeStatus, RuntimeVersion, SandboxState,
};

/// One call the fake received, in the order received. Reads (statuses, listings)
/// are recorded too; [`Call::is_read`] tells them apart.
#[derive(Clone, Debug, PartialEq)]
pub enum Call {
    Version,
    Status,
    RunPodSandbox {
        name: String,
        namespace: String,
        uid: String,
        attempt: u32,
    },
    StopPodSandbox(String),
    RemovePodSandbox(String),
    PodSandboxStatus(String),
    ListPodSandboxes,
    CreateContainer {
        sandbox_id: String,
        name: String,
        attempt: u32,
        image: String,
    },
    StartContainer(String),
    StopContainer(String, Duration),
    RemoveContainer(String),
    UpdateContainerResources(String, ContainerResources),
    ReopenContainerLog(String),
    ListContainers,
    ContainerStatus(String),
    PullImage(String),
    ImageStatus(String),
    ListImages,
    RemoveImage(String),
    ImageFsInfo,
    ExecSync {
        container_id: String,
        command: Vec<String>,
    },
}

/// The kind of a [`Call`], to script failures and holds by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CallKind {
    Version,
    Status,
    RunPodSandbox,
    StopPodSandbox,
    RemovePodSandbox,
    PodSandboxStatus,
    ListPodSandboxes,
    CreateContainer,
    StartContainer,
    StopContainer,
    RemoveContainer,
    UpdateContainerResources,
    ReopenContainerLog,
    ListContainers,
    ContainerStatus,
    PullImage,
    ImageStatus,
    ListImages,
    RemoveImage,
    ImageFsInfo,
    ExecSync,
}

impl Call {
    pub fn kind(&self) -> CallKind {
        match self {
            Call::Version => CallKind::Version,
            Call::Status => CallKind::Status,
            Call::RunPodSandbox { .. } => CallKind::RunPodSandbox,
            Call::StopPodSandbox(_) => CallKind::StopPodSandbox,
            Call::RemovePodSandbox(_) => CallKind::RemovePodSandbox,
            Call::PodSandboxStatus(_) => CallKind::PodSandboxStatus,
            Call::ListPodSandboxes => CallKind::ListPodSandboxes,
            Call::CreateContainer { .. } => CallKind::CreateContainer,
            Call::StartContainer(_) => CallKind::StartContainer,
            Call::StopContainer(..) => CallKind::StopContainer,
            Call::RemoveContainer(_) => CallKind::RemoveContainer,
            Call::UpdateContainerResources(..) => CallKind::UpdateContainerResources,
            Call::ReopenContainerLog(_) => CallKind::ReopenContainerLog,
            Call::ListContainers => CallKind::ListContainers,
            Call::ContainerStatus(_) => CallKind::ContainerStatus,
            Call::PullImage(_) => CallKind::PullImage,
            Call::ImageStatus(_) => CallKind::ImageStatus,
            Call::ListImages => CallKind::ListImages,
            Call::RemoveImage(_) => CallKind::RemoveImage,
            Call::ImageFsInfo => CallKind::ImageFsInfo,
            Call::ExecSync { .. } => CallKind::ExecSync,
        }
    }

    /// Whether the call only reads (a version, status or listing) and changes nothing.
    pub fn is_read(&self) -> bool {
        matches!(
            self.kind(),
            CallKind::Version
                | CallKind::Status
                | CallKind::PodSandboxStatus
                | CallKind::ListPodSandboxes
                | CallKind::ListContainers
                | CallKind::ContainerStatus
                | CallKind::ImageStatus
                | CallKind::ListImages
                | CallKind::ImageFsInfo
        )
    }
}

#[derive(Clone, Debug)]
struct FakeSandbox {
    id: String,
    config: PodSandboxConfig,
    state: SandboxState,
    created_at: Timestamp,
}

impl FakeSandbox {
    fn status(&self, ip: Option<String>) -> PodSandboxStatus {
        PodSandboxStatus {
            id: self.id.clone(),
            metadata: self.config.metadata.clone(),
            state: self.state,
            created_at: self.created_at,
            ip,
            additional_ips: Vec::new(),
            network_namespace: None,
            labels: self.config.labels.clone(),
            annotations: self.config.annotations.clone(),
            runtime_handler: self.config.runtime_handler.clone(),
        }
    }
}

#[derive(Clone, Debug)]
struct FakeContainer {
    status: ContainerStatus,
    config: ContainerConfig,
    pod_uid: String,
}

#[derive(Default)]
struct State {
    next_id: u64,
    sandboxes: BTreeMap<String, FakeSandbox>,
    containers: BTreeMap<String, FakeContainer>,
    /// By reference.
    images: BTreeMap<String, Image>,
    missing_images: HashSet<String>,
    failures: HashMap<CallKind, VecDeque<Error>>,
    holds: HashMap<CallKind, Arc<Semaphore>>,
    exit_on_start: HashMap<String, i32>,
    stop_exit_code: i32,
    sandbox_ip: Option<String>,
    /// The name of every container ever created, by id (kept after removal).
    names: HashMap<String, String>,
    calls: Vec<Call>,
}

impl State {
    fn id(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}-{:04}", self.next_id)
    }

    /// A container by id, else the newest one with that name.
    fn find(&self, target: &str) -> Option<String> {
        if self.containers.contains_key(target) {
            return Some(target.to_owned());
        }
        self.containers
            .values()
            .rev()
            .find(|c| c.status.metadata.name == target)
            .map(|c| c.status.id.clone())
    }

    fn image(&self, image: &str) -> Option<&Image> {
        if self.missing_images.contains(image) {
            return None;
        }
        self.images
            .get(image)
            .or_else(|| self.images.values().find(|i| i.id == image))
    }
}

fn image_id(reference: &str) -> String {
    format!(
        "sha256:{}",
        hex::encode(Sha256::digest(reference.as_bytes()))
    )
}

fn exit_reason(code: i32) -> &'static str {
    if code == 0 { "Completed" } else { "Error" }
}

/// An in-memory [`Runtime`] that records its calls; see the module docs.
pub struct FakeRuntime {
    name: String,
    state: Mutex<State>,
    events: broadcast::Sender<RuntimeEvent>,
    /// Bumped on every call and every scripted change, for [`Self::wait_for`].
    changed: watch::Sender<u64>,
}

impl Default for FakeRuntime {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeRuntime {
    /// A fake named `fake` (as [`Runtime::name`] and the version's runtime name),
    /// with no images: every pull succeeds unless the image is [`Self::missing_image`].
    pub fn new() -> Self {
        FakeRuntime {
            name: "fake".into(),
            state: Mutex::default(),
            events: broadcast::channel(1024).0,
            changed: watch::channel(0).0,
        }
    }

    /// The fake reports `name` as its [`Runtime::name`] and its version's runtime name
    /// (`wasm` makes the node treat it as the Wasm runtime).
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The fake as the node holds a runtime.
    pub fn into_dyn(self: Arc<Self>) -> Arc<dyn Runtime> {
        self
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    fn emit(&self, c: &FakeContainer, kind: ContainerEventKind) {
        let _ = self.events.send(RuntimeEvent {
            container_id: c.status.id.clone(),
            sandbox_id: c.status.sandbox_id.clone(),
            pod_uid: c.pod_uid.clone(),
            kind,
            at: Timestamp::now(),
        });
    }

    /// Records `call`, waits while its kind is held, then fails it if a failure is
    /// scripted for its kind.
    async fn begin(&self, call: Call) -> Result<()> {
        let kind = call.kind();
        let hold = {
            let mut st = self.state();
            st.calls.push(call);
            st.holds.get(&kind).cloned()
        };
        self.bump();
        if let Some(sem) = hold {
            // Closed by `release`.
            let _ = sem.acquire().await;
        }
        match self
            .state()
            .failures
            .get_mut(&kind)
            .and_then(VecDeque::pop_front)
        {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    // --- What the test reads ---

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }

    /// Every call so far, in order, forgetting them.
    pub fn take_calls(&self) -> Vec<Call> {
        std::mem::take(&mut self.state().calls)
    }

    /// The calls so far that change something ([`Call::is_read`] is false).
    pub fn mutations(&self) -> Vec<Call> {
        self.calls().into_iter().filter(|c| !c.is_read()).collect()
    }

    /// Every sandbox, in creation order.
    pub fn sandboxes(&self) -> Vec<PodSandboxStatus> {
        let st = self.state();
        st.sandboxes
            .values()
            .map(|s| s.status(st.sandbox_ip.clone()))
            .collect()
    }

    /// The config a sandbox was created with.
    pub fn sandbox_config(&self, sandbox_id: &str) -> Option<PodSandboxConfig> {
        self.state()
            .sandboxes
            .get(sandbox_id)
            .map(|s| s.config.clone())
    }

    /// Every container, in creation order.
    pub fn containers(&self) -> Vec<ContainerStatus> {
        self.state()
            .containers
            .values()
            .map(|c| c.status.clone())
            .collect()
    }

    /// A container by id, else the newest container with that name.
    pub fn container(&self, id_or_name: &str) -> Option<ContainerStatus> {
        let st = self.state();
        let id = st.find(id_or_name)?;
        Some(st.containers[&id].status.clone())
    }

    /// The config a container (by id, else the newest with that name) was created with.
    pub fn container_config(&self, id_or_name: &str) -> Option<ContainerConfig> {
        let st = self.state();
        let id = st.find(id_or_name)?;
        Some(st.containers[&id].config.clone())
    }

    /// The name of a container this fake ever created, removed or not.
    pub fn name_of(&self, container_id: &str) -> Option<String> {
        self.state().names.get(container_id).cloned()
    }

    /// Every image present, by reference.
    pub fn images(&self) -> Vec<String> {
        let st = self.state();
        st.images
            .keys()
            .filter(|r| !st.missing_images.contains(*r))
            .cloned()
            .collect()
    }

    /// Resolves once `pred` holds for the calls recorded so far (checked after every
    /// call and every scripted change). Wrap it in a timeout.
    pub async fn wait_for(&self, pred: impl Fn(&[Call]) -> bool) {
        let mut rx = self.changed.subscribe();
        loop {
            if pred(&self.state().calls) {
                return;
            }
            rx.changed().await.expect("the fake owns the sender");
        }
    }

    /// Resolves with the first recorded call matching `pred`, waiting for it if needed.
    pub async fn wait_for_call(&self, pred: impl Fn(&Call) -> bool) -> Call {
        self.wait_for(|calls| calls.iter().any(&pred)).await;
        self.state()
            .calls
            .iter()
            .find(|c| pred(c))
            .cloned()
            .expect("found above")
    }

    // --- What the test scripts ---

    /// The container (by id, else the newest with that name) exits now with `code`.
    /// Panics if there is no such running container. Returns its id.
    pub fn exit(&self, id_or_name: &str, code: i32) -> String {
        self.exit_at(id_or_name, code, Timestamp::now())
    }

    /// As [`Self::exit`], finishing at `finished_at` (a time in the past makes a
    /// restart back-off look elapsed).
    pub fn exit_at(&self, id_or_name: &str, code: i32, finished_at: Timestamp) -> String {
        let c = {
            let mut st = self.state();
            let id = st
                .find(id_or_name)
                .unwrap_or_else(|| panic!("fake runtime: no container {id_or_name:?}"));
            let c = st.containers.get_mut(&id).expect("found");
            assert_eq!(
                c.status.state,
                ContainerState::Running,
                "fake runtime: container {id_or_name:?} ({id}) is not running"
            );
            c.status.state = ContainerState::Exited;
            c.status.exit_code = code;
            c.status.reason = exit_reason(code).into();
            c.status.finished_at = Some(finished_at);
            c.clone()
        };
        self.emit(&c, ContainerEventKind::Stopped);
        self.bump();
        c.status.id
    }

    /// Every container named `name` started from now on exits at once with `code`
    /// (a job, or an init container that succeeds or fails).
    pub fn exit_on_start(&self, name: &str, code: i32) {
        self.state().exit_on_start.insert(name.to_owned(), code);
    }

    /// Containers named `name` keep running once started again (undoes
    /// [`Self::exit_on_start`]).
    pub fn keep_running(&self, name: &str) {
        self.state().exit_on_start.remove(name);
    }

    /// The exit code of a container stopped with [`Runtime::stop_container`]
    /// (default 0: it handled the signal). A sandbox that is stopped kills what still
    /// runs in it with 137.
    pub fn set_stop_exit_code(&self, code: i32) {
        self.state().stop_exit_code = code;
    }

    /// The next call of `kind` fails with `error` (queued: call again for the one after).
    pub fn fail_next(&self, kind: CallKind, error: Error) {
        self.state()
            .failures
            .entry(kind)
            .or_default()
            .push_back(error);
    }

    /// Calls of `kind` from now on are recorded, then wait until [`Self::release`].
    pub fn hold(&self, kind: CallKind) {
        self.state()
            .holds
            .entry(kind)
            .or_insert_with(|| Arc::new(Semaphore::new(0)));
    }

    /// Lets held calls of `kind` go on, and stops holding them.
    pub fn release(&self, kind: CallKind) {
        if let Some(sem) = self.state().holds.remove(&kind) {
            sem.close();
        }
    }

    /// `Ok` if the container exists and runs: what exec and a log reopen need.
    fn running(&self, container_id: &str) -> Result<()> {
        let st = self.state();
        let c = st
            .containers
            .get(container_id)
            .ok_or_else(|| Error::not_found("container", container_id))?;
        if c.status.state != ContainerState::Running {
            return Err(Error::FailedPrecondition(format!(
                "container {container_id} is not running"
            )));
        }
        Ok(())
    }

    /// `reference` is not present and cannot be pulled (`ErrImagePull`).
    pub fn missing_image(&self, reference: &str) {
        let mut st = self.state();
        st.missing_images.insert(reference.to_owned());
        st.images.remove(reference);
    }

    /// `reference` is present, as if pulled before (and pullable again).
    pub fn add_image(&self, reference: &str) {
        let mut st = self.state();
        st.missing_images.remove(reference);
        st.images.insert(
            reference.to_owned(),
            Image {
                id: image_id(reference),
                repo_tags: vec![reference.to_owned()],
                repo_digests: Vec::new(),
                size: 1024,
                uid: None,
                username: String::new(),
                pinned: false,
            },
        );
    }

    /// The IP sandboxes report (none by default: host network).
    pub fn set_sandbox_ip(&self, ip: Option<&str>) {
        self.state().sandbox_ip = ip.map(str::to_owned);
    }

    /// The sandbox dies behind the node's back: it is not ready and what ran in it
    /// exited with 137.
    pub fn kill_sandbox(&self, sandbox_id: &str) {
        let stopped = self.stop_sandbox_now(sandbox_id);
        for c in &stopped {
            self.emit(c, ContainerEventKind::Stopped);
        }
        self.bump();
    }

    fn stop_sandbox_now(&self, sandbox_id: &str) -> Vec<FakeContainer> {
        let mut st = self.state();
        let Some(sb) = st.sandboxes.get_mut(sandbox_id) else {
            return Vec::new();
        };
        sb.state = SandboxState::NotReady;
        let now = Timestamp::now();
        let mut stopped = Vec::new();
        for c in st.containers.values_mut() {
            if c.status.sandbox_id == sandbox_id && c.status.state != ContainerState::Exited {
                c.status.state = ContainerState::Exited;
                c.status.exit_code = 137;
                c.status.reason = "Error".into();
                c.status.finished_at = Some(now);
                stopped.push(c.clone());
            }
        }
        stopped
    }
}

#[async_trait]
impl Runtime for FakeRuntime {
    fn name(&self) -> &str {
        &self.name
    }

    async fn version(&self) -> Result<RuntimeVersion> {
        self.begin(Call::Version).await?;
        Ok(RuntimeVersion {
            runtime_name: self.name.clone(),
            runtime_version: "0.0.0-fake".into(),
            runtime_api_version: "v1".into(),
        })
    }

    async fn status(&self) -> Result<RuntimeStatus> {
        self.begin(Call::Status).await?;
        Ok(RuntimeStatus {
            runtime_ready: true,
            network_ready: true,
            message: String::new(),
        })
    }

    async fn run_pod_sandbox(&self, config: &PodSandboxConfig) -> Result<String> {
        self.begin(Call::RunPodSandbox {
            name: config.metadata.name.clone(),
            namespace: config.metadata.namespace.clone(),
            uid: config.metadata.uid.clone(),
            attempt: config.metadata.attempt,
        })
        .await?;
        let mut st = self.state();
        let id = st.id("sandbox");
        st.sandboxes.insert(
            id.clone(),
            FakeSandbox {
                id: id.clone(),
                config: config.clone(),
                state: SandboxState::Ready,
                created_at: Timestamp::now(),
            },
        );
        Ok(id)
    }

    async fn stop_pod_sandbox(&self, sandbox_id: &str) -> Result<()> {
        self.begin(Call::StopPodSandbox(sandbox_id.to_owned()))
            .await?;
        for c in &self.stop_sandbox_now(sandbox_id) {
            self.emit(c, ContainerEventKind::Stopped);
        }
        Ok(())
    }

    async fn remove_pod_sandbox(&self, sandbox_id: &str) -> Result<()> {
        self.begin(Call::RemovePodSandbox(sandbox_id.to_owned()))
            .await?;
        for c in &self.stop_sandbox_now(sandbox_id) {
            self.emit(c, ContainerEventKind::Stopped);
        }
        let removed: Vec<FakeContainer> = {
            let mut st = self.state();
            st.sandboxes.remove(sandbox_id);
            let ids: Vec<String> = st
                .containers
                .values()
                .filter(|c| c.status.sandbox_id == sandbox_id)
                .map(|c| c.status.id.clone())
                .collect();
            ids.iter()
                .filter_map(|id| st.containers.remove(id))
                .collect()
        };
        for c in &removed {
            self.emit(c, ContainerEventKind::Deleted);
        }
        Ok(())
    }

    async fn pod_sandbox_status(&self, sandbox_id: &str) -> Result<PodSandboxStatus> {
        self.begin(Call::PodSandboxStatus(sandbox_id.to_owned()))
            .await?;
        let st = self.state();
        st.sandboxes
            .get(sandbox_id)
            .map(|s| s.status(st.sandbox_ip.clone()))
            .ok_or_else(|| Error::not_found("sandbox", sandbox_id))
    }

    async fn list_pod_sandboxes(&self) -> Result<Vec<PodSandbox>> {
        self.begin(Call::ListPodSandboxes).await?;
        Ok(self
            .state()
            .sandboxes
            .values()
            .map(|s| PodSandbox {
                id: s.id.clone(),
                metadata: s.config.metadata.clone(),
                state: s.state,
                created_at: s.created_at,
                labels: s.config.labels.clone(),
                annotations: s.config.annotations.clone(),
                runtime_handler: s.config.runtime_handler.clone(),
            })
            .collect())
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: &ContainerConfig,
        _sandbox_config: &PodSandboxConfig,
    ) -> Result<String> {
        self.begin(Call::CreateContainer {
            sandbox_id: sandbox_id.to_owned(),
            name: config.metadata.name.clone(),
            attempt: config.metadata.attempt,
            image: config.image.clone(),
        })
        .await?;
        let c = {
            let mut st = self.state();
            let sandbox = st
                .sandboxes
                .get(sandbox_id)
                .ok_or_else(|| Error::not_found("sandbox", sandbox_id))?;
            if sandbox.state != SandboxState::Ready {
                return Err(Error::FailedPrecondition(format!(
                    "sandbox {sandbox_id} is not ready"
                )));
            }
            let pod_uid = sandbox.config.metadata.uid.clone();
            let log_path: PathBuf = sandbox.config.log_directory.join(&config.log_path);
            let image_ref = st
                .image(&config.image)
                .map(|i| i.id.clone())
                .ok_or_else(|| Error::not_found("image", &config.image))?;
            let id = st.id("container");
            let c = FakeContainer {
                status: ContainerStatus {
                    id: id.clone(),
                    sandbox_id: sandbox_id.to_owned(),
                    metadata: config.metadata.clone(),
                    state: ContainerState::Created,
                    created_at: Timestamp::now(),
                    started_at: None,
                    finished_at: None,
                    exit_code: 0,
                    image: config.image.clone(),
                    image_ref,
                    reason: String::new(),
                    message: String::new(),
                    labels: config.labels.clone(),
                    annotations: config.annotations.clone(),
                    log_path,
                },
                config: config.clone(),
                pod_uid,
            };
            st.names.insert(id.clone(), config.metadata.name.clone());
            st.containers.insert(id, c.clone());
            c
        };
        self.emit(&c, ContainerEventKind::Created);
        Ok(c.status.id)
    }

    async fn start_container(&self, container_id: &str) -> Result<()> {
        self.begin(Call::StartContainer(container_id.to_owned()))
            .await?;
        let (started, exited) = {
            let mut st = self.state();
            let exit_code = st
                .containers
                .get(container_id)
                .and_then(|c| st.exit_on_start.get(&c.status.metadata.name).copied());
            let Some(c) = st.containers.get_mut(container_id) else {
                return Err(Error::not_found("container", container_id));
            };
            if c.status.state != ContainerState::Created {
                return Err(Error::FailedPrecondition(format!(
                    "container {container_id} is {:?}, not created",
                    c.status.state
                )));
            }
            let now = Timestamp::now();
            c.status.state = ContainerState::Running;
            c.status.started_at = Some(now);
            let started = c.clone();
            let exited = exit_code.map(|code| {
                c.status.state = ContainerState::Exited;
                c.status.exit_code = code;
                c.status.reason = exit_reason(code).into();
                c.status.finished_at = Some(now);
                c.clone()
            });
            (started, exited)
        };
        self.emit(&started, ContainerEventKind::Started);
        if let Some(c) = exited {
            self.emit(&c, ContainerEventKind::Stopped);
        }
        Ok(())
    }

    async fn stop_container(&self, container_id: &str, timeout: Duration) -> Result<()> {
        self.begin(Call::StopContainer(container_id.to_owned(), timeout))
            .await?;
        let stopped = {
            let mut st = self.state();
            let code = st.stop_exit_code;
            let Some(c) = st.containers.get_mut(container_id) else {
                return Err(Error::not_found("container", container_id));
            };
            if c.status.state == ContainerState::Exited {
                return Ok(());
            }
            c.status.state = ContainerState::Exited;
            c.status.exit_code = code;
            c.status.reason = exit_reason(code).into();
            c.status.finished_at = Some(Timestamp::now());
            c.clone()
        };
        self.emit(&stopped, ContainerEventKind::Stopped);
        Ok(())
    }

    async fn remove_container(&self, container_id: &str) -> Result<()> {
        self.begin(Call::RemoveContainer(container_id.to_owned()))
            .await?;
        let removed = {
            let mut st = self.state();
            match st.containers.get(container_id) {
                None => return Ok(()),
                Some(c) if c.status.state == ContainerState::Running => {
                    return Err(Error::FailedPrecondition(format!(
                        "container {container_id} is running; stop it first"
                    )));
                }
                Some(_) => st.containers.remove(container_id).expect("present"),
            }
        };
        self.emit(&removed, ContainerEventKind::Deleted);
        Ok(())
    }

    async fn update_container_resources(
        &self,
        container_id: &str,
        resources: &ContainerResources,
    ) -> Result<()> {
        self.begin(Call::UpdateContainerResources(
            container_id.to_owned(),
            resources.clone(),
        ))
        .await?;
        let mut st = self.state();
        let c = st
            .containers
            .get_mut(container_id)
            .ok_or_else(|| Error::not_found("container", container_id))?;
        if c.status.state == ContainerState::Exited {
            return Err(Error::FailedPrecondition(format!(
                "container {container_id} has exited"
            )));
        }
        c.config.resources = resources.clone();
        Ok(())
    }

    /// Recorded; a running container's call succeeds (the fake writes no logs), any
    /// other's is refused as a runtime refuses it.
    async fn reopen_container_log(&self, container_id: &str) -> Result<()> {
        self.begin(Call::ReopenContainerLog(container_id.to_owned()))
            .await?;
        self.running(container_id)?;
        Ok(())
    }

    async fn list_containers(&self) -> Result<Vec<Container>> {
        self.begin(Call::ListContainers).await?;
        Ok(self
            .state()
            .containers
            .values()
            .map(|c| Container {
                id: c.status.id.clone(),
                sandbox_id: c.status.sandbox_id.clone(),
                metadata: c.status.metadata.clone(),
                image: c.status.image.clone(),
                image_ref: c.status.image_ref.clone(),
                state: c.status.state,
                created_at: c.status.created_at,
                labels: c.status.labels.clone(),
                annotations: c.status.annotations.clone(),
            })
            .collect())
    }

    async fn container_status(&self, container_id: &str) -> Result<ContainerStatus> {
        self.begin(Call::ContainerStatus(container_id.to_owned()))
            .await?;
        self.state()
            .containers
            .get(container_id)
            .map(|c| c.status.clone())
            .ok_or_else(|| Error::not_found("container", container_id))
    }

    async fn pull_image(&self, image: &str, _auth: Option<&AuthConfig>) -> Result<String> {
        self.begin(Call::PullImage(image.to_owned())).await?;
        if self.state().missing_images.contains(image) {
            return Err(Error::image_pull(image, "manifest unknown (fake runtime)"));
        }
        self.add_image(image);
        Ok(image_id(image))
    }

    async fn image_status(&self, image: &str) -> Result<Option<Image>> {
        self.begin(Call::ImageStatus(image.to_owned())).await?;
        Ok(self.state().image(image).cloned())
    }

    async fn list_images(&self) -> Result<Vec<Image>> {
        self.begin(Call::ListImages).await?;
        let st = self.state();
        Ok(st
            .images
            .iter()
            .filter(|(r, _)| !st.missing_images.contains(*r))
            .map(|(_, i)| i.clone())
            .collect())
    }

    async fn remove_image(&self, image: &str) -> Result<()> {
        self.begin(Call::RemoveImage(image.to_owned())).await?;
        self.state()
            .images
            .retain(|r, i| r != image && i.id != image);
        Ok(())
    }

    async fn image_fs_info(&self) -> Result<Vec<FilesystemUsage>> {
        self.begin(Call::ImageFsInfo).await?;
        let st = self.state();
        Ok(vec![FilesystemUsage {
            timestamp: Timestamp::now(),
            mountpoint: PathBuf::from("/fake/images"),
            used_bytes: Some(st.images.values().map(|i| i.size).sum()),
            inodes_used: Some(st.images.len() as u64),
        }])
    }

    async fn exec_sync(
        &self,
        container_id: &str,
        command: &[String],
        _timeout: Duration,
    ) -> Result<ExecResult> {
        self.begin(Call::ExecSync {
            container_id: container_id.to_owned(),
            command: command.to_vec(),
        })
        .await?;
        self.running(container_id)?;
        Ok(ExecResult {
            exit_code: 0,
            stdout: Vec::new(),
            stderr: Vec::new(),
        })
    }

    fn subscribe(&self) -> broadcast::Receiver<RuntimeEvent> {
        self.events.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox_config(uid: &str) -> PodSandboxConfig {
        let mut config = PodSandboxConfig::default();
        config.metadata.name = "web".into();
        config.metadata.namespace = "default".into();
        config.metadata.uid = uid.into();
        config.log_directory = PathBuf::from("/logs/default_web_uid");
        config
    }

    fn container_config(name: &str, image: &str) -> ContainerConfig {
        ContainerConfig {
            metadata: wasmlet_runtime::ContainerMetadata {
                name: name.into(),
                attempt: 0,
            },
            image: image.into(),
            log_path: PathBuf::from(name).join("0.log"),
            ..Default::default()
        }
    }

    /// A sandbox with one started container of image `img:1`.
    async fn running(fake: &FakeRuntime, name: &str) -> (String, String, PodSandboxConfig) {
        let sc = sandbox_config("uid-1");
        let sb = fake.run_pod_sandbox(&sc).await.unwrap();
        fake.pull_image("img:1", None).await.unwrap();
        let id = fake
            .create_container(&sb, &container_config(name, "img:1"), &sc)
            .await
            .unwrap();
        fake.start_container(&id).await.unwrap();
        (sb, id, sc)
    }

    #[tokio::test]
    async fn containers_go_created_running_exited_and_every_call_is_recorded() {
        let fake = FakeRuntime::new();
        let sc = sandbox_config("uid-1");
        let sb = fake.run_pod_sandbox(&sc).await.unwrap();
        fake.pull_image("img:1", None).await.unwrap();
        let id = fake
            .create_container(&sb, &container_config("app", "img:1"), &sc)
            .await
            .unwrap();
        assert_eq!(
            fake.container_status(&id).await.unwrap().state,
            ContainerState::Created
        );
        fake.start_container(&id).await.unwrap();
        let cs = fake.container_status(&id).await.unwrap();
        assert_eq!(cs.state, ContainerState::Running);
        assert!(cs.started_at.is_some());
        assert_eq!(
            cs.log_path,
            PathBuf::from("/logs/default_web_uid/app/0.log")
        );
        assert_eq!(cs.image_ref, image_id("img:1"));

        assert_eq!(fake.exit("app", 3), id, "found by name");
        let cs = fake.container_status(&id).await.unwrap();
        assert_eq!(
            (cs.state, cs.exit_code, cs.reason.as_str()),
            (ContainerState::Exited, 3, "Error")
        );
        assert!(cs.finished_at.is_some());
        fake.remove_container(&id).await.unwrap();
        assert!(fake.container_status(&id).await.unwrap_err().is_not_found());
        assert_eq!(
            fake.name_of(&id).as_deref(),
            Some("app"),
            "kept after removal"
        );

        assert_eq!(
            fake.take_calls(),
            [
                Call::RunPodSandbox {
                    name: "web".into(),
                    namespace: "default".into(),
                    uid: "uid-1".into(),
                    attempt: 0
                },
                Call::PullImage("img:1".into()),
                Call::CreateContainer {
                    sandbox_id: sb.clone(),
                    name: "app".into(),
                    attempt: 0,
                    image: "img:1".into()
                },
                Call::ContainerStatus(id.clone()),
                Call::StartContainer(id.clone()),
                Call::ContainerStatus(id.clone()),
                Call::ContainerStatus(id.clone()),
                Call::RemoveContainer(id.clone()),
                Call::ContainerStatus(id.clone()),
            ]
        );
        assert!(fake.calls().is_empty(), "taken");
    }

    #[tokio::test]
    async fn stop_and_remove_follow_cri_semantics() {
        let fake = FakeRuntime::new();
        let (sb, id, _) = running(&fake, "app").await;
        assert!(
            matches!(
                fake.remove_container(&id).await,
                Err(Error::FailedPrecondition(_))
            ),
            "a running container cannot be removed"
        );
        assert!(
            matches!(
                fake.start_container(&id).await,
                Err(Error::FailedPrecondition(_))
            ),
            "a running container cannot be started again"
        );
        fake.set_stop_exit_code(143);
        fake.stop_container(&id, Duration::from_secs(5))
            .await
            .unwrap();
        let cs = fake.container(&id).unwrap();
        assert_eq!((cs.state, cs.exit_code), (ContainerState::Exited, 143));
        fake.stop_container(&id, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(fake.container(&id).unwrap().exit_code, 143, "idempotent");
        assert!(
            fake.stop_container("nope", Duration::ZERO)
                .await
                .unwrap_err()
                .is_not_found()
        );
        fake.remove_pod_sandbox(&sb).await.unwrap();
        assert!(fake.sandboxes().is_empty());
        assert!(fake.containers().is_empty(), "removed with the sandbox");
        fake.remove_pod_sandbox(&sb).await.unwrap();
        fake.stop_pod_sandbox(&sb).await.unwrap();
        assert!(
            fake.mutations()
                .contains(&Call::StopContainer(id.clone(), Duration::from_secs(5)))
        );
        assert!(
            fake.mutations().iter().all(|c| !c.is_read()),
            "mutations leave the reads out"
        );
    }

    #[tokio::test]
    async fn a_stopped_or_dead_sandbox_kills_its_containers() {
        let fake = FakeRuntime::new();
        let (sb, id, sc) = running(&fake, "app").await;
        fake.kill_sandbox(&sb);
        assert_eq!(
            fake.pod_sandbox_status(&sb).await.unwrap().state,
            SandboxState::NotReady
        );
        let cs = fake.container(&id).unwrap();
        assert_eq!((cs.state, cs.exit_code), (ContainerState::Exited, 137));
        assert!(matches!(
            fake.create_container(&sb, &container_config("b", "img:1"), &sc)
                .await,
            Err(Error::FailedPrecondition(_))
        ));
    }

    #[tokio::test]
    async fn a_scripted_failure_fails_only_the_next_call_of_its_kind() {
        let fake = FakeRuntime::new();
        fake.fail_next(CallKind::RunPodSandbox, Error::unavailable("down"));
        let sc = sandbox_config("uid-1");
        let err = fake.run_pod_sandbox(&sc).await.unwrap_err();
        assert!(matches!(err, Error::Unavailable { .. }), "{err}");
        assert!(fake.sandboxes().is_empty(), "nothing made");
        fake.run_pod_sandbox(&sc).await.unwrap();
        assert_eq!(fake.sandboxes().len(), 1);
        assert_eq!(
            fake.calls()
                .iter()
                .filter(|c| c.kind() == CallKind::RunPodSandbox)
                .count(),
            2,
            "the failed call is recorded too"
        );
    }

    #[tokio::test]
    async fn missing_images_cannot_be_pulled_and_present_ones_resolve() {
        let fake = FakeRuntime::new();
        fake.missing_image("gone:1");
        assert!(matches!(
            fake.pull_image("gone:1", None).await,
            Err(Error::ImagePull { .. })
        ));
        assert_eq!(fake.image_status("gone:1").await.unwrap(), None);
        assert_eq!(
            fake.image_status("img:1").await.unwrap(),
            None,
            "not pulled"
        );
        fake.add_image("img:1");
        let image = fake.image_status("img:1").await.unwrap().unwrap();
        assert_eq!(
            fake.image_status(&image.id).await.unwrap(),
            Some(image.clone()),
            "by id too"
        );
        assert_eq!(fake.images(), ["img:1"]);
        fake.remove_image(&image.id).await.unwrap();
        assert!(fake.images().is_empty());
    }

    #[tokio::test]
    async fn lifecycle_events_are_sent() {
        let fake = FakeRuntime::new();
        let mut events = fake.subscribe();
        let (sb, id, _) = running(&fake, "app").await;
        fake.exit(&id, 0);
        fake.remove_container(&id).await.unwrap();
        let mut kinds = Vec::new();
        while let Ok(e) = events.try_recv() {
            assert_eq!(
                (e.container_id.as_str(), e.sandbox_id.as_str()),
                (&*id, &*sb)
            );
            assert_eq!(e.pod_uid, "uid-1");
            kinds.push(e.kind);
        }
        use ContainerEventKind::*;
        assert_eq!(kinds, [Created, Started, Stopped, Deleted]);
    }

    #[tokio::test]
    async fn exit_on_start_ends_every_new_instance_until_told_otherwise() {
        let fake = FakeRuntime::new();
        fake.exit_on_start("job", 1);
        let (sb, id, sc) = running(&fake, "job").await;
        let cs = fake.container(&id).unwrap();
        assert_eq!(
            (cs.state, cs.exit_code, cs.reason.as_str()),
            (ContainerState::Exited, 1, "Error")
        );
        fake.keep_running("job");
        let again = fake
            .create_container(&sb, &container_config("job", "img:1"), &sc)
            .await
            .unwrap();
        fake.start_container(&again).await.unwrap();
        assert_eq!(fake.container("job").unwrap().id, again, "newest by name");
        assert_eq!(
            fake.container("job").unwrap().state,
            ContainerState::Running
        );
    }

    #[tokio::test(start_paused = true)]
    async fn held_calls_wait_for_release() {
        let fake = Arc::new(FakeRuntime::new());
        fake.hold(CallKind::Version);
        let task = tokio::spawn({
            let fake = fake.clone();
            async move { fake.version().await }
        });
        fake.wait_for_call(|c| *c == Call::Version).await;
        assert!(!task.is_finished(), "held");
        fake.release(CallKind::Version);
        let v = tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("released")
            .unwrap()
            .unwrap();
        assert_eq!(v.runtime_name, "fake");
        fake.version().await.unwrap();
    }

    #[tokio::test]
    async fn a_log_reopen_is_recorded_and_refused_unless_running() {
        let fake = FakeRuntime::new();
        let (_, id, _) = running(&fake, "app").await;
        fake.reopen_container_log(&id).await.unwrap();
        fake.fail_next(CallKind::ReopenContainerLog, Error::unavailable("down"));
        assert!(fake.reopen_container_log(&id).await.is_err(), "scripted");
        fake.exit(&id, 0);
        let err = fake.reopen_container_log(&id).await.unwrap_err();
        assert!(matches!(err, Error::FailedPrecondition(_)), "{err}");
        let reopens: Vec<_> = fake
            .mutations()
            .into_iter()
            .filter(|c| c.kind() == CallKind::ReopenContainerLog)
            .collect();
        assert_eq!(reopens, vec![Call::ReopenContainerLog(id); 3]);
    }

    #[tokio::test]
    async fn the_name_is_the_one_set() {
        let fake = FakeRuntime::new().with_name("wasm");
        assert_eq!(fake.name(), "wasm");
        assert_eq!(fake.version().await.unwrap().runtime_name, "wasm");
        let dynamic: Arc<dyn Runtime> = Arc::new(FakeRuntime::new()).into_dyn();
        assert_eq!(dynamic.name(), "fake");
    }
}
