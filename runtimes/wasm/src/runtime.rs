//! The node side of the Wasm runtime: [`WasmRuntime`] implements [`Runtime`] by
//! starting one sandbox process per pod and speaking [`crate::protocol`] to it over
//! the sandbox's unix socket.
//!
//! Each sandbox has a directory under the state dir: `sandbox.json` (its config, id,
//! creation time and pid), `containers/<id>.json` (each container as created),
//! `sandbox.sock` and `sandbox.log` (the process's stderr). A node that restarts after
//! a crash finds them there ([`WasmRuntime::restore`]), connects again and asks each
//! sandbox for its containers' states, so that its pods are adopted, not rerun.
//!
//! **Cgroups.** With a `cgroup_parent` the sandbox process is started in that pod cgroup
//! (it joins between `fork` and `exec`, see [`crate::cgroup`]), and with an
//! `oom_score_adj` it gets that score right after it is spawned; both happen before the
//! sandbox can receive a Create request, so no guest ever runs outside them. The whole
//! pod shares the one cgroup: its containers are async tasks on the sandbox's shared
//! thread pool, which no per-container cgroup could hold (a task moves between threads,
//! and v1 charges memory per process). A container's memory limit is enforced by its
//! wasmtime store's limiter; the containers' CPU limits add up to the pod cgroup's CFS
//! quota. An adopted sandbox is already in place.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::process::Command;
use tokio::sync::{broadcast, oneshot, watch};
use wasmlet_runtime::{
    AuthConfig, Capabilities, Container, ContainerConfig, ContainerEventKind, ContainerFsUsage,
    ContainerResources, ContainerState, ContainerStatus, Error, ExecResult, FilesystemUsage, Image,
    ImageKind, PodSandbox, PodSandboxConfig, PodSandboxStatus, Result, Runtime, RuntimeEvent,
    RuntimeStatus, RuntimeVersion, SandboxState, StdioSession, Streams,
};

use crate::cgroup::{self, PodCgroup};
use crate::confine::Credentials;
use crate::image::{ImageError, ImageStore, StoredImage};
use crate::protocol::{
    ContainerReport, ContainerSpec, ErrorKind, ExecOutput, Exit, KILLED_EXIT_CODE, Message, Op,
    Preopen, ReportState, Request, StreamKind, StreamReply, StreamRequest, frame,
};
use crate::sandbox::Starting;

/// The RuntimeClass handler name that selects this runtime.
pub const HANDLER: &str = "wasmtime";
/// The wasmtime release the runtime embeds.
pub const WASMTIME_VERSION: &str = "48.0.8";

/// How the node starts a sandbox process: a program and its leading arguments.
/// The node passes its own binary with `sandbox`; tests pass `wasmlet-sandbox`.
#[derive(Clone, Debug)]
pub struct SandboxCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
    /// Whether sandboxes are forked from a zygote started once with this program
    /// (`crate::sandbox::zygote`) instead of each running it anew.
    pub zygote: bool,
}

/// Settings of the Wasm runtime.
#[derive(Clone, Debug)]
pub struct WasmRuntimeConfig {
    /// Where the image store lives.
    pub image_dir: PathBuf,
    /// Where precompiled modules are cached.
    pub compile_cache_dir: PathBuf,
    /// Where each sandbox keeps its socket, log and the node's record of it.
    pub state_dir: PathBuf,
    pub sandbox: SandboxCommand,
    /// Where the cgroup filesystem is mounted, [`cgroup::DEFAULT_MOUNT_ROOT`] on a node;
    /// a pod's `cgroup_parent` is found below it.
    pub cgroup_mount_root: PathBuf,
    /// How images missing from the store are pulled.
    pub registry: crate::registry::RegistrySettings,
    /// The pod network: `None` runs every Wasm pod on the node's network.
    pub network: Option<crate::network::NetworkSettings>,
}

/// The native Wasm runtime.
#[derive(Clone)]
pub struct WasmRuntime {
    inner: Arc<Inner>,
}

struct Inner {
    images: ImageStore,
    puller: crate::registry::Puller,
    network: Option<crate::network::PodNetwork>,
    config: WasmRuntimeConfig,
    sandboxes: Mutex<HashMap<String, Arc<SandboxHandle>>>,
    containers: Mutex<HashMap<String, ContainerStatus>>,
    events: broadcast::Sender<RuntimeEvent>,
    /// Each sandbox's containers' cpusets (the CPU manager's static policy): its
    /// process is pinned to their union.
    pins: Mutex<HashMap<String, HashMap<String, Vec<usize>>>>,
    /// The zygote sandboxes are forked from, when [`SandboxCommand::zygote`]: started
    /// on first use, and again when it has gone.
    zygote: tokio::sync::Mutex<Option<Zygote>>,
}

/// The directory of `state_dir` the zygote keeps its socket and log in; no sandbox's
/// directory has this name (theirs are hexadecimal).
const ZYGOTE_DIR: &str = "zygote";

/// A running zygote (`crate::sandbox::zygote`).
struct Zygote {
    child: tokio::process::Child,
    socket: PathBuf,
    /// Its standard input: it ends when this closes, with the node.
    _stdin: Option<tokio::process::ChildStdin>,
}

/// A sandbox process the node started: its own child, or forked by the zygote. Either
/// is killed when this is dropped (a node that dies runs no destructors, and its
/// sandboxes live on to be adopted).
enum Started {
    Child(tokio::process::Child),
    Forked(Forked),
}

/// A sandbox the zygote forked, held by its pidfd: it is not the node's child, so
/// its exit status is not the node's to see.
struct Forked {
    pid: u32,
    pidfd: tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
}

impl Forked {
    /// SIGKILL through the pidfd: never a later process with the same pid.
    fn kill(&self) {
        use std::os::fd::AsFd;
        let _ = crate::sandbox::zygote::pidfd_kill(
            self.pidfd.get_ref().as_fd(),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

impl Drop for Forked {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Started {
    fn pid(&self) -> Option<u32> {
        match self {
            Started::Child(c) => c.id(),
            Started::Forked(f) => Some(f.pid),
        }
    }
}

impl crate::sandbox::Starting for Started {
    /// A forked sandbox's exit status is the zygote's to see, not the node's.
    async fn ended(&mut self) -> String {
        match self {
            Started::Child(c) => c.ended().await,
            Started::Forked(f) => match f.pidfd.readable().await {
                Ok(_) => "its exit status is the zygote's".to_owned(),
                Err(e) => format!("waiting on its pidfd failed: {e}"),
            },
        }
    }

    fn sigkill(&mut self) {
        match self {
            Started::Child(c) => c.sigkill(),
            Started::Forked(f) => f.kill(),
        }
    }
}

/// A reply: what the sandbox answered, or its error.
type Reply = std::result::Result<Answer, Refused>;

/// A sandbox's answer: the containers' states for `List`, the outcome of an `Exec`.
#[derive(Default)]
struct Answer {
    containers: Vec<ContainerReport>,
    exec: Option<ExecOutput>,
}

/// A sandbox's error reply.
struct Refused {
    kind: Option<ErrorKind>,
    message: String,
}

impl Refused {
    /// The error for a caller that has nothing to add. A deadline is the request's own
    /// (an exec's), which only its caller can name.
    fn into_error(self) -> Error {
        match self.kind {
            Some(ErrorKind::FailedPrecondition) => Error::FailedPrecondition(self.message),
            Some(ErrorKind::InvalidArgument) => Error::InvalidArgument(self.message),
            Some(ErrorKind::DeadlineExceeded) | None => Error::internal(self.message),
        }
    }
}

struct SandboxHandle {
    id: String,
    config: PodSandboxConfig,
    created_at: Timestamp,
    dir: PathBuf,
    conn: tokio::sync::Mutex<Option<OwnedWriteHalf>>,
    pending: Mutex<HashMap<u64, oneshot::Sender<Reply>>>,
    next_request: AtomicU64,
    /// `true` once the sandbox process has exited.
    exited: watch::Receiver<bool>,
    pid: Option<u32>,
    /// Its pod network, when it has one of its own (kept after the teardown at stop,
    /// as the addresses the pod had).
    network: Option<crate::network::Record>,
    /// Whom its process runs as; `None` for a sandbox an earlier version of the node
    /// started, which runs as uid 0 and makes its own log files, and whose containers
    /// are not held to one user.
    credentials: Option<Credentials>,
}

/// What the node writes to `sandbox.json`.
#[derive(Debug, Serialize, Deserialize)]
struct SandboxFile {
    id: String,
    config: PodSandboxConfig,
    created_at: Timestamp,
    pid: Option<u32>,
    /// Absent from the records of earlier versions (see [`SandboxHandle::credentials`]).
    #[serde(default)]
    credentials: Option<Credentials>,
}

/// The longest path a unix socket may have (`sun_path` less its NUL).
const MAX_SOCKET_PATH: usize = 107;

impl WasmRuntime {
    /// Pins the sandbox process (every thread) to the CPUs of its containers'
    /// cpusets so far, as runc pins a container to its cpuset: a Wasm pod's
    /// containers share one process. A list that does not parse, or a process that
    /// cannot be pinned, is logged; the container runs unpinned.
    fn pin(&self, sandbox: &SandboxHandle, container_id: &str, list: &str) {
        let Some(pid) = sandbox.pid else { return };
        let cpus = match parse_cpu_list(list) {
            Ok(cpus) if !cpus.is_empty() => cpus,
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(sandbox = %sandbox.id, list, "cpuset: {e}");
                return;
            }
        };
        let all: std::collections::BTreeSet<usize> = {
            let mut pins = self.inner.pins.lock().unwrap();
            let entry = pins.entry(sandbox.id.clone()).or_default();
            entry.insert(container_id.to_owned(), cpus);
            entry.values().flatten().copied().collect()
        };
        let mut set = nix::sched::CpuSet::new();
        for cpu in &all {
            if let Err(e) = set.set(*cpu) {
                tracing::warn!(sandbox = %sandbox.id, cpu, "cpuset: {e}");
                return;
            }
        }
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        for tid in tasks {
            if let Err(e) = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(tid), &set) {
                tracing::warn!(sandbox = %sandbox.id, tid, "pinning the sandbox to its CPUs: {e}");
            }
        }
        tracing::debug!(sandbox = %sandbox.id, cpus = ?all, "sandbox pinned");
    }

    /// Opens the image store and returns a runtime with no sandboxes.
    pub fn new(config: WasmRuntimeConfig) -> Result<Self> {
        let images = ImageStore::open(&config.image_dir).map_err(Error::internal_source)?;
        std::fs::create_dir_all(&config.compile_cache_dir)
            .map_err(|e| Error::internal_from(config.compile_cache_dir.display(), e))?;
        std::fs::create_dir_all(&config.state_dir)
            .map_err(|e| Error::internal_from(config.state_dir.display(), e))?;
        let (events, _) = broadcast::channel(1024);
        Ok(WasmRuntime {
            inner: Arc::new(Inner {
                images,
                puller: crate::registry::Puller::new(config.registry.clone()),
                network: config.network.clone().map(crate::network::PodNetwork::new),
                config,
                sandboxes: Mutex::default(),
                containers: Mutex::default(),
                events,
                pins: Mutex::default(),
                zygote: tokio::sync::Mutex::default(),
            }),
        })
    }

    /// The image store the runtime runs from.
    pub fn images(&self) -> &ImageStore {
        &self.inner.images
    }

    /// The process id of a sandbox, for tests and diagnostics.
    pub fn sandbox_pid(&self, sandbox_id: &str) -> Option<u32> {
        self.sandbox(sandbox_id).ok().and_then(|s| s.pid)
    }

    fn sandbox(&self, id: &str) -> Result<Arc<SandboxHandle>> {
        self.inner
            .sandboxes
            .lock()
            .unwrap()
            .get(id)
            .cloned()
            .ok_or_else(|| Error::not_found("sandbox", id))
    }

    fn container(&self, id: &str) -> Result<ContainerStatus> {
        self.inner
            .containers
            .lock()
            .unwrap()
            .get(id)
            .cloned()
            .ok_or_else(|| Error::not_found("container", id))
    }

    fn emit(&self, status: &ContainerStatus, kind: ContainerEventKind, at: Timestamp) {
        let pod_uid = self
            .sandbox(&status.sandbox_id)
            .map(|s| s.config.metadata.uid.clone())
            .unwrap_or_default();
        let _ = self.inner.events.send(RuntimeEvent {
            container_id: status.id.clone(),
            sandbox_id: status.sandbox_id.clone(),
            pod_uid,
            kind,
            at,
        });
    }

    /// Applies a message from a sandbox to the node's view.
    fn on_message(&self, sandbox: &SandboxHandle, msg: Message) {
        match msg {
            Message::Reply {
                id,
                error,
                error_kind,
                containers,
                exec,
            } => {
                if let Some(tx) = sandbox.pending.lock().unwrap().remove(&id) {
                    let reply = match error {
                        None => Ok(Answer { containers, exec }),
                        Some(message) => Err(Refused {
                            kind: error_kind,
                            message,
                        }),
                    };
                    let _ = tx.send(reply);
                }
            }
            Message::Started { container_id, at } => {
                let status = {
                    let mut containers = self.inner.containers.lock().unwrap();
                    let Some(c) = containers.get_mut(&container_id) else {
                        return;
                    };
                    c.state = ContainerState::Running;
                    c.started_at = Some(at);
                    c.clone()
                };
                self.emit(&status, ContainerEventKind::Started, at);
            }
            Message::Exited {
                container_id,
                at,
                exit,
            } => self.mark_exited(&container_id, at, exit),
        }
    }

    fn mark_exited(&self, container_id: &str, at: Timestamp, exit: Exit) {
        let status = {
            let mut containers = self.inner.containers.lock().unwrap();
            let Some(c) = containers.get_mut(container_id) else {
                return;
            };
            if c.state == ContainerState::Exited {
                return;
            }
            c.state = ContainerState::Exited;
            c.finished_at = Some(at);
            c.exit_code = exit.code;
            c.reason = exit.reason;
            c.message = exit.message;
            c.clone()
        };
        self.emit(&status, ContainerEventKind::Stopped, at);
    }

    /// Called once the sandbox process is gone: whatever still ran in it has died.
    fn on_sandbox_exit(&self, sandbox: &SandboxHandle, how: String) {
        for (_, tx) in sandbox.pending.lock().unwrap().drain() {
            let _ = tx.send(Err(Refused {
                kind: None,
                message: format!("sandbox process exited ({how})"),
            }));
        }
        let victims: Vec<String> = self
            .inner
            .containers
            .lock()
            .unwrap()
            .values()
            .filter(|c| c.sandbox_id == sandbox.id && c.state != ContainerState::Exited)
            .map(|c| c.id.clone())
            .collect();
        let now = Timestamp::now();
        for id in victims {
            self.mark_exited(
                &id,
                now,
                Exit {
                    code: KILLED_EXIT_CODE,
                    reason: "Error".into(),
                    message: format!("the pod's sandbox process exited ({how})"),
                },
            );
        }
    }

    /// Opens a stream connection to the sandbox of running container `container_id`
    /// for `kind` (see [`crate::sandbox`]'s stream socket) and gives its stdio as a
    /// session. The connection's tasks end with the session: dropping it closes the
    /// connection, which ends an exec and detaches an attach.
    async fn open_stdio(
        &self,
        container_id: &str,
        kind: StreamKind,
        streams: Streams,
    ) -> Result<StdioSession> {
        let c = self.container(container_id)?;
        if c.state != ContainerState::Running {
            return Err(Error::FailedPrecondition(format!(
                "container {container_id} is not running ({:?})",
                c.state
            )));
        }
        let sandbox = self.sandbox(&c.sandbox_id)?;
        let path = sandbox.dir.join(STREAM_SOCKET);
        let conn = UnixStream::connect(&path).await.map_err(|e| {
            Error::unavailable_from(
                format_args!(
                    "sandbox {}: its stream socket {} (a sandbox started by an older node has none)",
                    sandbox.id,
                    path.display()
                ),
                e,
            )
        })?;
        let (read, mut write) = conn.into_split();
        let request = StreamRequest {
            container_id: container_id.to_owned(),
            kind,
            stdin: streams.stdin,
            stdout: streams.stdout,
            stderr: streams.stderr && !streams.tty,
            tty: streams.tty,
        };
        let mut line = serde_json::to_vec(&request).expect("requests serialize");
        line.push(b'\n');
        let mut read = BufReader::new(read);
        let answered = async {
            write.write_all(&line).await?;
            let mut reply = String::new();
            read.read_line(&mut reply).await?;
            Ok::<_, std::io::Error>(reply)
        };
        let reply = match tokio::time::timeout(REQUEST_TIMEOUT, answered).await {
            Ok(Ok(reply)) if !reply.is_empty() => reply,
            Ok(Ok(_)) => {
                return Err(Error::Unavailable {
                    message: format!("sandbox {} closed the stream before answering", sandbox.id),
                    source: None,
                });
            }
            Ok(Err(e)) => {
                return Err(Error::unavailable_from(
                    format_args!("sandbox {}", sandbox.id),
                    e,
                ));
            }
            Err(_) => {
                return Err(Error::Timeout {
                    operation: "opening a stream",
                    after: REQUEST_TIMEOUT,
                });
            }
        };
        let reply: StreamReply = serde_json::from_str(&reply).map_err(|e| {
            Error::internal(format!(
                "sandbox {}: a malformed stream reply: {e}",
                sandbox.id
            ))
        })?;
        if let Some(message) = reply.error {
            return Err(Refused {
                kind: reply.error_kind,
                message,
            }
            .into_error());
        }
        Ok(stdio_session(read, write, request))
    }

    /// Sends `op` and waits up to `timeout` for the answer; an error reply is an error.
    async fn call(&self, sandbox: &SandboxHandle, op: Op, timeout: Duration) -> Result<Answer> {
        self.request(sandbox, op, timeout)
            .await?
            .map_err(Refused::into_error)
    }

    /// Sends `op` and waits up to `timeout` for the reply, which may be an error.
    async fn request(&self, sandbox: &SandboxHandle, op: Op, timeout: Duration) -> Result<Reply> {
        let id = sandbox.next_request.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        sandbox.pending.lock().unwrap().insert(id, tx);
        let mut line = serde_json::to_vec(&Request { id, op }).expect("requests serialize");
        line.push(b'\n');
        {
            let mut conn = sandbox.conn.lock().await;
            let Some(w) = conn.as_mut() else {
                sandbox.pending.lock().unwrap().remove(&id);
                return Err(Error::FailedPrecondition(format!(
                    "sandbox {} is stopped",
                    sandbox.id
                )));
            };
            if let Err(e) = w.write_all(&line).await {
                sandbox.pending.lock().unwrap().remove(&id);
                return Err(Error::unavailable_from(
                    format_args!("sandbox {}", sandbox.id),
                    e,
                ));
            }
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(closed)) => Err(Error::Unavailable {
                message: format!("sandbox {} went away", sandbox.id),
                source: Some(closed.into()),
            }),
            Err(_) => {
                sandbox.pending.lock().unwrap().remove(&id);
                Err(Error::Timeout {
                    operation: "sandbox request",
                    after: timeout,
                })
            }
        }
    }

    /// The directory of a sandbox. Named by a prefix of the id, which is plenty to be
    /// unique and keeps the socket's path within the kernel's limit.
    fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.inner.config.state_dir.join(&id[..16.min(id.len())])
    }

    /// Takes the connection to a sandbox: its messages update the node's view until it
    /// closes, which means the sandbox process has ended (`child`, if the node started
    /// it, is reaped then).
    fn attach(
        &self,
        handle: Arc<SandboxHandle>,
        read: OwnedReadHalf,
        child: Option<Started>,
        exited_tx: watch::Sender<bool>,
    ) {
        let this = self.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(read).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                match serde_json::from_str::<Message>(&line) {
                    Ok(msg) => this.on_message(&handle, msg),
                    Err(e) => {
                        tracing::warn!(sandbox = %handle.id, "unreadable sandbox message {line:?}: {e}")
                    }
                }
            }
            handle.conn.lock().await.take();
            let how = match child {
                Some(mut child) => child.ended().await,
                None => "its connection closed".to_owned(),
            };
            tracing::debug!(sandbox = %handle.id, pod = %handle.config.metadata.uid, "sandbox process ended: {how}");
            this.on_sandbox_exit(&handle, how);
            let _ = exited_tx.send(true);
        });
    }

    /// Finds the sandboxes an earlier run of the node left (see the module docs) and
    /// adopts those still running: their containers are listed again with the states
    /// the sandboxes report. A sandbox whose process is gone is listed as not ready,
    /// with its containers exited, for the node to clean up. Returns how many sandboxes
    /// are running.
    pub async fn restore(&self) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.inner.config.state_dir) else {
            return 0;
        };
        let mut running = 0;
        for entry in entries.flatten() {
            if entry.file_name() == ZYGOTE_DIR {
                continue;
            }
            let dir = entry.path();
            match self.restore_one(&dir).await {
                Ok(true) => running += 1,
                Ok(false) => {}
                Err(e) => {
                    // Without a record the pod cannot be adopted; a process still serving
                    // the socket would run the pod a second time.
                    tracing::warn!(dir = %dir.display(), "cannot restore a Wasm sandbox: {e}; stopping it and removing its record");
                    kill_processes_serving(&dir.join("sandbox.sock"));
                    self.discard_sandbox_dir(&dir).await;
                }
            }
        }
        running
    }

    async fn restore_one(&self, dir: &std::path::Path) -> std::result::Result<bool, String> {
        let file = dir.join("sandbox.json");
        let record: SandboxFile = serde_json::from_slice(
            &std::fs::read(&file).map_err(|e| format!("{}: {e}", file.display()))?,
        )
        .map_err(|e| format!("{}: {e}", file.display()))?;
        let mut containers: Vec<ContainerStatus> = Vec::new();
        if let Ok(entries) = std::fs::read_dir(dir.join("containers")) {
            for e in entries.flatten() {
                let parsed = std::fs::read(e.path())
                    .ok()
                    .and_then(|b| serde_json::from_slice::<ContainerStatus>(&b).ok());
                match parsed {
                    Some(c) => containers.push(c),
                    None => {
                        tracing::warn!(file = %e.path().display(), "unreadable container record; ignored")
                    }
                }
            }
        }
        let socket = dir.join("sandbox.sock");
        let stream = UnixStream::connect(&socket).await.ok();
        if stream.is_none() {
            // Unreachable: whatever still serves it cannot be adopted, only duplicated.
            self.kill_unreachable(&socket, record.pid);
        }
        let (exited_tx, exited_rx) = watch::channel(stream.is_none());
        let (read, write) = match stream {
            Some(s) => {
                let (r, w) = s.into_split();
                (Some(r), Some(w))
            }
            None => (None, None),
        };
        let handle = Arc::new(SandboxHandle {
            id: record.id.clone(),
            credentials: record.credentials,
            config: record.config,
            created_at: record.created_at,
            dir: dir.to_owned(),
            conn: tokio::sync::Mutex::new(write),
            pending: Mutex::default(),
            next_request: AtomicU64::new(1),
            exited: exited_rx,
            pid: record.pid,
            network: crate::network::load(dir),
        });
        {
            let mut map = self.inner.containers.lock().unwrap();
            for c in containers {
                map.insert(c.id.clone(), c);
            }
        }
        self.inner
            .sandboxes
            .lock()
            .unwrap()
            .insert(record.id.clone(), handle.clone());
        let Some(read) = read else {
            self.on_sandbox_exit(&handle, "it was gone when the node started".into());
            tracing::info!(sandbox = %record.id, "found a Wasm sandbox whose process is gone");
            return Ok(false);
        };
        self.attach(handle.clone(), read, None, exited_tx);
        // A live sandbox answers at once; restores run before the node serves anything.
        let reports = match self.call(&handle, Op::List, RESTORE_TIMEOUT).await {
            Ok(answer) => answer.containers,
            Err(e) => {
                // A sandbox that does not answer is ended, and reported not ready (its
                // connection closes) for the node to replace; its record stays until then.
                tracing::warn!(sandbox = %record.id, "listing the containers of an adopted sandbox: {e}; stopping it");
                self.kill_unreachable(&socket, record.pid);
                return Ok(false);
            }
        };
        // The adopted pod's network as CNI sees it (CHECK, as containerd does on
        // restore): a failure is reported, the pod keeps running as it is.
        if let (Some(net), Some(record)) = (&self.inner.network, &handle.network)
            && let Err(e) = net.check(record).await
        {
            tracing::warn!(sandbox = %handle.id, "CNI CHECK of the adopted sandbox's network failed: {e}");
        }
        let now = Timestamp::now();
        let mut map = self.inner.containers.lock().unwrap();
        let mut known = std::collections::HashSet::new();
        for r in reports {
            known.insert(r.container_id.clone());
            let Some(c) = map.get_mut(&r.container_id) else {
                continue;
            };
            let reported = match r.state {
                ReportState::Created => ContainerState::Created,
                ReportState::Running => ContainerState::Running,
                ReportState::Exited => ContainerState::Exited,
            };
            // A Started or Exited message that arrived after the report was made has
            // already moved the container on; states only move forward.
            if progress(reported) < progress(c.state) {
                continue;
            }
            c.started_at = r.started_at;
            c.finished_at = r.finished_at;
            c.state = reported;
            if let Some(exit) = r.exit {
                c.exit_code = exit.code;
                c.reason = exit.reason;
                c.message = exit.message;
            }
        }
        // Recorded by the node but unknown to the sandbox: lost before it was created.
        for c in map.values_mut() {
            if c.sandbox_id == record.id
                && !known.contains(&c.id)
                && c.state != ContainerState::Exited
            {
                c.state = ContainerState::Exited;
                c.exit_code = KILLED_EXIT_CODE;
                c.reason = "ContainerStatusUnknown".into();
                c.message = "the sandbox does not know this container".into();
                c.finished_at = Some(now);
            }
        }
        tracing::info!(sandbox = %record.id, pod = %handle.config.metadata.uid, "adopted a running Wasm sandbox");
        Ok(true)
    }

    /// The socket of the zygote, started now when none runs (see
    /// `crate::sandbox::zygote`). One that has ended is replaced, its log's last lines
    /// logged.
    async fn zygote_socket(&self) -> Result<PathBuf> {
        let mut slot = self.inner.zygote.lock().await;
        let dir = self.inner.config.state_dir.join(ZYGOTE_DIR);
        if let Some(z) = slot.as_mut() {
            match z.child.try_wait() {
                Ok(None) => return Ok(z.socket.clone()),
                ended => {
                    let log = std::fs::read_to_string(dir.join("zygote.log")).unwrap_or_default();
                    tracing::warn!(
                        "the sandbox zygote ended ({ended:?}); starting another. Its log: {}",
                        log.trim()
                    );
                }
            }
        }
        *slot = None;
        let internal = |what: &str, e: std::io::Error| {
            Error::internal_from(format!("{what} {}", dir.display()), e)
        };
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .map_err(|e| internal("creating the zygote's directory", e))?;
        }
        let socket = dir.join("zygote.sock");
        let log = std::fs::File::create(dir.join("zygote.log"))
            .map_err(|e| internal("creating the zygote's log in", e))?;
        let cmd = &self.inner.config.sandbox;
        let mut child = Command::new(&cmd.program)
            .args(&cmd.args)
            .arg(crate::sandbox::zygote::FLAG)
            .arg("--socket")
            .arg(&socket)
            // It ends when this pipe does: with the node.
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                Error::internal_from(
                    format!("cannot start the sandbox zygote {}", cmd.program.display()),
                    e,
                )
            })?;
        let stdin = child.stdin.take();
        if let Err(e) = crate::sandbox::wait_listening(&mut child, SANDBOX_START_TIMEOUT).await {
            let log = std::fs::read_to_string(dir.join("zygote.log")).unwrap_or_default();
            return Err(Error::internal(format!(
                "the sandbox zygote {e}: {}",
                log.trim()
            )));
        }
        tracing::info!(pid = ?child.id(), "started the sandbox zygote");
        *slot = Some(Zygote {
            child,
            socket: socket.clone(),
            _stdin: stdin,
        });
        Ok(socket)
    }

    /// Starts the sandbox process of sandbox `id` in `dir` (already made, with its
    /// network attached when it has one of its own), waits for it to listen, and
    /// registers it. On error the caller discards the directory and the network.
    async fn start_sandbox_process(
        &self,
        id: &str,
        dir: &std::path::Path,
        config: &PodSandboxConfig,
        credentials: Credentials,
        pod_cgroup: Option<PodCgroup>,
        network: Option<&crate::network::Record>,
    ) -> Result<()> {
        let socket = dir.join("sandbox.sock");
        let id = id.to_owned();
        let dir = dir.to_owned();
        let internal = |what: &str, e: std::io::Error| {
            Error::internal_from(format!("{what} {}", dir.display()), e)
        };
        let log = std::fs::File::create(dir.join("sandbox.log"))
            .map_err(|e| internal("creating the sandbox log in", e))?;
        let cmd = &self.inner.config.sandbox;
        let mut args: Vec<std::ffi::OsString> =
            credentials.args().into_iter().map(Into::into).collect();
        for arg in [
            "--cache-dir".as_ref(),
            self.inner.config.compile_cache_dir.as_os_str(),
            "--pod-uid".as_ref(),
            config.metadata.uid.as_ref(),
            "--socket".as_ref(),
            socket.as_os_str(),
            "--stream-socket".as_ref(),
            dir.join(STREAM_SOCKET).as_os_str(),
            // The pod's volumes are mounted before its sandbox starts, so a mount
            // namespace of its own loses nothing (see `crate::confine`).
            "--mount-namespace".as_ref(),
        ] {
            args.push(arg.to_owned());
        }
        if let Some(record) = network {
            args.push("--netns".into());
            args.push(record.netns.clone().into());
        }
        let cgroup_parent = pod_cgroup.as_ref().map(|c| c.parent().to_owned());
        if let Some(pod_cgroup) = &pod_cgroup {
            let files: Vec<_> = pod_cgroup.procs_paths().collect();
            tracing::debug!(pod = %config.metadata.uid, ?files, "the sandbox joins its pod cgroup");
        }
        let cannot_start = |e: std::io::Error| {
            let placed = match &cgroup_parent {
                Some(parent) => format!(" in pod cgroup {parent}"),
                None => String::new(),
            };
            let how = if cmd.zygote {
                " (forked by the zygote)"
            } else {
                ""
            };
            Error::internal_from(
                format!(
                    "cannot start sandbox process {}{how}{placed}",
                    cmd.program.display()
                ),
                e,
            )
        };
        let (mut started, stdout) = if cmd.zygote {
            // It joins the pod cgroup itself, first thing, as the files name it.
            if let Some(pod_cgroup) = &pod_cgroup {
                for procs in pod_cgroup.procs_paths() {
                    args.push("--join-cgroup".into());
                    args.push(procs.into());
                }
            }
            drop(pod_cgroup);
            let args = args
                .into_iter()
                .map(|a| {
                    a.into_string().map_err(|a| {
                        Error::InvalidArgument(format!(
                            "the sandbox argument {a:?} is not UTF-8, which a zygote needs"
                        ))
                    })
                })
                .collect::<Result<Vec<String>>>()?;
            let zygote = self.zygote_socket().await?;
            let (out_read, out_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
                .map_err(|e| cannot_start(e.into()))?;
            let forked = tokio::task::spawn_blocking(move || {
                use std::os::fd::AsFd;
                // The pipe's and the log's ends here close once the zygote has its
                // copies, which are the sandbox's.
                crate::sandbox::zygote::fork(&zygote, args, out_write.as_fd(), log.as_fd())
            })
            .await
            .map_err(|e| Error::internal(format!("forking a sandbox: {e}")))?
            .map_err(cannot_start)?;
            let pid = forked.pid;
            let pidfd = crate::sandbox::zygote::watch_pidfd(forked.pidfd).map_err(cannot_start)?;
            let stdout =
                tokio::net::unix::pipe::Receiver::from_owned_fd(out_read).map_err(cannot_start)?;
            (
                Started::Forked(Forked { pid, pidfd }),
                Box::new(stdout) as Box<dyn tokio::io::AsyncRead + Send + Unpin>,
            )
        } else {
            let mut command = Command::new(&cmd.program);
            command
                .args(&cmd.args)
                .args(&args)
                .stdin(Stdio::null())
                // Where it says it listens (`crate::sandbox::wait_listening`).
                .stdout(Stdio::piped())
                .stderr(log)
                // Its own process group: a terminal's Ctrl-C stops the node, and the node
                // stops its pods; pods never see the signal directly.
                .process_group(0)
                // Tests that drop a runtime take its sandboxes with it; a node that dies
                // runs no destructors, and its sandboxes live on to be adopted.
                .kill_on_drop(true);
            if let Some(pod_cgroup) = pod_cgroup {
                pod_cgroup.join_on_spawn(&mut command);
            }
            let spawned = command.spawn();
            // Closes the pod cgroup's files the child wrote to.
            drop(command);
            let mut child = spawned.map_err(cannot_start)?;
            let stdout = child
                .stdout
                .take()
                .ok_or_else(|| Error::internal("the sandbox's standard output is not a pipe"))?;
            (
                Started::Child(child),
                Box::new(stdout) as Box<dyn tokio::io::AsyncRead + Send + Unpin>,
            )
        };
        let pid = started.pid();
        // Before the sandbox is even listening, so before any guest can run.
        if let (Some(adj), Some(pid)) = (config.oom_score_adj, pid) {
            match cgroup::set_oom_score_adj(pid, adj) {
                Ok(_) => {}
                // Gone already: the wait below reports how it ended.
                Err(cgroup::Error::Io { source, .. })
                    if source.raw_os_error() == Some(nix::errno::Errno::ESRCH as i32)
                        || source.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    started.sigkill();
                    let _ = started.ended().await;
                    return Err(Error::internal_from(format!("sandbox process {pid}"), e));
                }
            }
        }
        let created_at = Timestamp::now();
        let record = SandboxFile {
            id: id.clone(),
            config: config.clone(),
            created_at,
            pid,
            credentials: Some(credentials.clone()),
        };
        write_atomically(
            &dir.join("sandbox.json"),
            &serde_json::to_vec_pretty(&record).expect("records serialize"),
        )
        .map_err(|e| internal("recording the sandbox in", e))?;

        // The sandbox says when it listens, or dies trying.
        match crate::sandbox::wait_listening_of(&mut started, stdout, SANDBOX_START_TIMEOUT).await {
            Ok(()) => {}
            Err(crate::sandbox::NotListening::Timeout(after)) => {
                return Err(Error::Timeout {
                    operation: "starting a sandbox",
                    after,
                });
            }
            Err(e) => {
                let log = std::fs::read_to_string(dir.join("sandbox.log")).unwrap_or_default();
                return Err(Error::internal(format!(
                    "sandbox process {e}: {}",
                    log.trim()
                )));
            }
        }
        let stream = UnixStream::connect(&socket)
            .await
            .map_err(|e| internal("connecting to the sandbox listening in", e))?;
        let (read, write) = stream.into_split();
        let (exited_tx, exited_rx) = watch::channel(false);
        let handle = Arc::new(SandboxHandle {
            id: id.clone(),
            config: config.clone(),
            created_at,
            dir,
            conn: tokio::sync::Mutex::new(Some(write)),
            pending: Mutex::default(),
            next_request: AtomicU64::new(1),
            exited: exited_rx,
            pid,
            network: network.cloned(),
            credentials: Some(credentials),
        });
        self.inner
            .sandboxes
            .lock()
            .unwrap()
            .insert(id.clone(), handle.clone());
        self.attach(handle, read, Some(started), exited_tx);
        Ok(())
    }

    /// Detaches a stopped sandbox's pod network (CNI DEL, the namespace), once: an
    /// error is the runtime's, for the node to retry the stop.
    async fn detach_network(&self, sandbox: &SandboxHandle) -> Result<()> {
        match &self.inner.network {
            Some(n) if sandbox.network.is_some() => n.detach(&sandbox.dir).await.map_err(|e| {
                Error::internal(format!(
                    "tearing down the pod network of sandbox {}: {e}",
                    sandbox.id
                ))
            }),
            _ => Ok(()),
        }
    }

    /// Removes a sandbox's directory after detaching its pod network (the record of
    /// which is in the directory); a detach that fails is logged and the directory
    /// kept, for the next restore to try again.
    async fn discard_sandbox_dir(&self, dir: &std::path::Path) {
        if let Some(n) = &self.inner.network
            && let Err(e) = n.detach(dir).await
        {
            tracing::warn!(dir = %dir.display(), "detaching a sandbox's pod network: {e}; its directory is kept to try again");
            return;
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    fn write_container_record(&self, sandbox: &SandboxHandle, status: &ContainerStatus) {
        let dir = sandbox.dir.join("containers");
        let written = std::fs::create_dir_all(&dir).and_then(|()| {
            write_atomically(
                &dir.join(format!("{}.json", status.id)),
                &serde_json::to_vec(status).expect("statuses serialize"),
            )
        });
        if let Err(e) = written {
            tracing::warn!(container = %status.id, "cannot record the container in {}: {e}", dir.display());
        }
    }

    fn container_spec(
        &self,
        config: &ContainerConfig,
        sandbox: &PodSandboxConfig,
        image: &StoredImage,
    ) -> ContainerSpec {
        let (argv0, rest): (String, Vec<String>) =
            if let Some((first, tail)) = config.command.split_first() {
                (first.clone(), [tail, &config.args[..]].concat())
            } else if let Some((first, tail)) = image.entrypoint.split_first() {
                let args = if config.args.is_empty() {
                    &image.cmd
                } else {
                    &config.args
                };
                (first.clone(), [tail, &args[..]].concat())
            } else {
                let args = if config.args.is_empty() {
                    &image.cmd
                } else {
                    &config.args
                };
                (config.metadata.name.clone(), args.clone())
            };
        let mut argv = vec![argv0];
        argv.extend(rest);

        let mut env: Vec<(String, String)> = Vec::new();
        let mut set = |k: &str, v: &str| match env.iter_mut().find(|(key, _)| key == k) {
            Some(slot) => slot.1 = v.to_owned(),
            None => env.push((k.to_owned(), v.to_owned())),
        };
        for kv in &image.env {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            set(k, v);
        }
        for (k, v) in &config.env {
            set(k, v);
        }
        if let Some(dir) = config.working_dir.as_ref().or(image.working_dir.as_ref())
            && !env.iter().any(|(k, _)| k == "PWD")
        {
            env.push(("PWD".into(), dir.clone()));
        }
        // What an exec may call the program: what it runs as, the image's entrypoint,
        // and the image's name (`ticker` for `example.com/wasm/ticker:1.0`), the one
        // program a Wasm image holds.
        let mut program_names = crate::sandbox::program_names(&argv[0]);
        let image_name = wasmlet_runtime::reference::repository(&config.image)
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        for name in image
            .entrypoint
            .first()
            .map(|e| crate::sandbox::program_names(e))
            .unwrap_or_default()
            .into_iter()
            .chain([image_name])
        {
            if !name.is_empty() && !program_names.contains(&name) {
                program_names.push(name);
            }
        }
        ContainerSpec {
            program_names,
            name: config.metadata.name.clone(),
            wasm_path: self.inner.images.blob_path(&image.wasm_digest),
            wasm_digest: image.wasm_digest.clone(),
            kind: image.kind,
            argv,
            env,
            preopens: config
                .mounts
                .iter()
                .map(|m| Preopen {
                    host_path: m.host_path.clone(),
                    guest_path: m.container_path.clone(),
                    readonly: m.readonly,
                })
                .collect(),
            log_path: sandbox.log_directory.join(&config.log_path),
            fifos: None,
            memory_limit_bytes: config.resources.memory_limit_bytes,
            stdin: config.stdin,
            stdin_once: config.stdin_once,
            tty: config.tty,
            ports: config.ports.clone(),
        }
    }
}

impl WasmRuntime {
    /// Kills the sandbox process serving `socket` that cannot be adopted: those whose
    /// command line names it, and the recorded `pid` when its command line names this
    /// runtime's state directory (a sandbox forked by the zygote carries the zygote's
    /// command line, which does; a pid reused by another process does not).
    fn kill_unreachable(&self, socket: &std::path::Path, pid: Option<u32>) {
        kill_processes_serving(socket);
        let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) else {
            return;
        };
        if cmdline_names(pid, &self.inner.config.state_dir) {
            kill_unreachable_process(pid, socket);
        }
    }
}

/// SIGKILLs every process whose command line names `socket` (a sandbox is started
/// with `--socket <path>`), so that an unreachable sandbox never runs beside its
/// replacement.
fn kill_processes_serving(socket: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for pid in entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
    {
        if cmdline_names(pid, socket) {
            kill_unreachable_process(pid, socket);
        }
    }
}

/// Whether process `pid`'s command line names `path` (and it is not this process).
fn cmdline_names(pid: i32, path: &std::path::Path) -> bool {
    let needle = path.as_os_str().as_encoded_bytes();
    pid != std::process::id() as i32
        && std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| c.windows(needle.len()).any(|w| w == needle))
}

fn kill_unreachable_process(pid: i32, socket: &std::path::Path) {
    tracing::warn!(pid, socket = %socket.display(), "killing an unreachable sandbox process");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
}

/// How far along its life a container is.
fn progress(state: ContainerState) -> u8 {
    match state {
        ContainerState::Created => 1,
        ContainerState::Running => 2,
        ContainerState::Exited => 3,
        ContainerState::Unknown => 0,
    }
}

/// Writes `bytes` to a temporary file beside `path` and renames it over `path`.
fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

fn new_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = Sha256::new();
    h.update(Timestamp::now().as_nanosecond().to_le_bytes());
    h.update(std::process::id().to_le_bytes());
    h.update(COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    hex::encode(h.finalize())
}

/// Whom a pod's sandbox process runs as: the `runAsUser` and `runAsGroup` all its
/// containers share, its `fsGroup` and `supplementalGroups`. Nothing set: uid 0,
/// without capabilities (see `crate::confine`).
fn sandbox_credentials(security: &wasmlet_runtime::SandboxSecurity) -> Result<Credentials> {
    let id = |what: &str, v: i64| {
        u32::try_from(v)
            .map_err(|_| Error::InvalidArgument(format!("{what} {v} is not a valid id")))
    };
    Ok(Credentials {
        uid: security
            .containers_run_as_user
            .map(|v| id("runAsUser", v))
            .transpose()?,
        gid: security
            .containers_run_as_group
            .map(|v| id("runAsGroup", v))
            .transpose()?,
        groups: security
            .supplemental_groups
            .iter()
            .map(|&v| id("supplemental group", v))
            .collect::<Result<_>>()?,
    })
}

/// A pod's containers are tasks of its one sandbox process, which runs as the user
/// and group they all share ([`sandbox_credentials`]): a container that asks for
/// another one (its own or the pod's) cannot have it.
fn check_container_user(
    name: &str,
    container: &wasmlet_runtime::ContainerSecurity,
    sandbox: &PodSandboxConfig,
) -> Result<()> {
    let shared = &sandbox.security;
    for (what, asked, runs_as) in [
        (
            "runAsUser",
            container.run_as_user,
            shared.containers_run_as_user,
        ),
        (
            "runAsGroup",
            container.run_as_group,
            shared.containers_run_as_group,
        ),
    ] {
        let Some(asked) = asked else { continue };
        if asked == runs_as.unwrap_or(0) {
            continue;
        }
        let runs_as = match runs_as {
            Some(id) => id.to_string(),
            None => "0, as its containers name no one value".into(),
        };
        return Err(Error::InvalidArgument(format!(
            "container {name} asks for {what} {asked}, but a Wasm pod's containers run in \
             one sandbox process, which runs as {what} {runs_as}: give every container of \
             the pod the same {what} (or set it on the pod only)"
        )));
    }
    Ok(())
}

/// Whether a sandbox running as `who` can reach `path` (a container's program in the
/// image store, or a volume it mounts) by the permission bits of it and every
/// directory above it: a root directory made `0700` closes the images to a pod that
/// runs as its own user, and the node says so rather than the guest's failed start.
/// A path that does not exist is left for the sandbox to report.
fn reachable_by(path: &std::path::Path, what: &str, who: &Credentials) -> Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    let Some(uid) = who.uid.filter(|&uid| uid != 0) else {
        return Ok(());
    };
    let gid = who.gid.unwrap_or(0);
    let allows = |meta: &std::fs::Metadata, bits: u32| {
        let shift = if meta.uid() == uid {
            6
        } else if meta.gid() == gid || who.groups.contains(&meta.gid()) {
            3
        } else {
            0
        };
        (meta.mode() >> shift) & bits == bits
    };
    let Ok(leaf) = std::fs::metadata(path) else {
        return Ok(());
    };
    // A file is read; a directory is entered.
    let needs = if leaf.is_dir() { 0o1 } else { 0o4 };
    let closed = std::iter::once((path, leaf, needs))
        .chain(
            path.ancestors()
                .skip(1)
                .filter_map(|dir| Some((dir, std::fs::metadata(dir).ok()?, 0o1))),
        )
        .find(|(_, meta, needs)| !allows(meta, *needs));
    match closed {
        None => Ok(()),
        Some((at, meta, _)) => Err(Error::FailedPrecondition(format!(
            "the pod's sandbox runs as uid {uid} (its runAsUser), which cannot reach {what} \
             {}: {} (mode {:o}, owner {}:{}) is closed to it",
            path.display(),
            at.display(),
            meta.mode() & 0o7777,
            meta.uid(),
            meta.gid()
        ))),
    }
}

/// Makes a container's log file before its sandbox opens it, when the sandbox runs as
/// the pod's user: the file is that user's, its directory stays the node's (so the
/// sandbox can write the one file it is given, and a rotation's new file comes from
/// here too). A sandbox that runs as uid 0 makes its own.
fn prepare_log_file(path: &std::path::Path, credentials: &Credentials) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    if credentials.uid.is_none_or(|uid| uid == 0) && credentials.gid.is_none() {
        return Ok(());
    }
    let internal = |what: &str, e: std::io::Error| {
        Error::internal_from(format!("{what} {}", path.display()), e)
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| internal("creating the directory of", e))?;
    }
    let file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o640)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| internal("creating the log file", e))?;
    std::os::unix::fs::fchown(&file, credentials.uid, Some(credentials.gid.unwrap_or(0)))
        .map_err(|e| internal("handing the log file to the pod's user:", e))
}

fn cgroup_error(e: cgroup::Error) -> Error {
    match e {
        cgroup::Error::InvalidParent { .. } => Error::InvalidArgument(e.to_string()),
        // The node makes the pod cgroup before the sandbox; it retries after it has.
        cgroup::Error::Missing { .. } => Error::FailedPrecondition(e.to_string()),
        cgroup::Error::Io { .. } => Error::internal_source(e),
    }
}

/// Removes the compile cache's artifacts of the Wasm binary `digest` (one per engine
/// configuration: `<hex>-<engine hash>.cwasm`).
fn remove_compiled(cache_dir: &std::path::Path, digest: &str) {
    let prefix = format!("{}-", digest.trim_start_matches("sha256:"));
    for entry in std::fs::read_dir(cache_dir).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(&prefix)
            && name.ends_with(".cwasm")
            && let Err(e) = std::fs::remove_file(entry.path())
        {
            tracing::warn!(path = %entry.path().display(), "removing a compiled artifact: {e}");
        }
    }
}

fn image_error(image: &str, e: ImageError) -> Error {
    match e {
        ImageError::NotFound(_) => Error::not_found("image", image),
        ImageError::BadReference(m) => Error::InvalidArgument(m),
        other => Error::internal_source(other),
    }
}

/// The memory a pod's sandbox process needs besides its guests (the runtime, the
/// compiled code, the stores' bookkeeping), charged to the pod cgroup as a
/// RuntimeClass `overhead` would be (docs/decisions.md).
pub const SANDBOX_MEMORY_OVERHEAD: u64 = 64 << 20;

const CREATE_TIMEOUT: Duration = Duration::from_secs(300);
const SANDBOX_START_TIMEOUT: Duration = Duration::from_secs(30);
const RESTORE_TIMEOUT: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

#[async_trait]
impl Runtime for WasmRuntime {
    fn name(&self) -> &str {
        "wasm"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            images: ImageKind::Wasm,
            directory_mounts_only: true,
            sandbox_memory_overhead: Some(SANDBOX_MEMORY_OVERHEAD),
            image_user: false,
            container_id_scheme: Some("wasm".into()),
            exec: true,
            attach: true,
            port_forward: false,
            stats: false,
        }
    }

    async fn version(&self) -> Result<RuntimeVersion> {
        Ok(RuntimeVersion {
            runtime_name: "wasmtime".into(),
            runtime_version: WASMTIME_VERSION.into(),
            runtime_api_version: "v1".into(),
        })
    }

    async fn status(&self) -> Result<RuntimeStatus> {
        Ok(RuntimeStatus {
            runtime_ready: true,
            network_ready: true,
            message: String::new(),
        })
    }

    async fn run_pod_sandbox(&self, config: &PodSandboxConfig) -> Result<String> {
        let id = new_id();
        let dir = self.sandbox_dir(&id);
        let socket = dir.join("sandbox.sock");
        if socket.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(Error::InvalidArgument(format!(
                "the sandbox socket {} is longer than {MAX_SOCKET_PATH} bytes: use a shorter root directory",
                socket.display()
            )));
        }
        if let Some(adj) = config.oom_score_adj
            && !cgroup::OOM_SCORE_ADJ_RANGE.contains(&adj)
        {
            return Err(Error::InvalidArgument(format!(
                "oom_score_adj {adj} is outside {:?}",
                cgroup::OOM_SCORE_ADJ_RANGE
            )));
        }
        let credentials = sandbox_credentials(&config.security)?;
        // Opened before anything is made: a pod cgroup that is missing leaves nothing.
        let pod_cgroup = match &config.cgroup_parent {
            Some(parent) => Some(
                PodCgroup::open(&self.inner.config.cgroup_mount_root, parent)
                    .map_err(cgroup_error)?,
            ),
            None => None,
        };
        // Likewise the network's configuration, read before anything is made.
        let network = match &self.inner.network {
            Some(n) if !config.host_network => n
                .network()
                .map_err(|e| Error::internal(format!("pod network: {e}")))?,
            _ => None,
        };
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::internal_from(format!("creating {}", dir.display()), e))?;
        let attached = match (network, &self.inner.network) {
            (Some(list), Some(pod_network)) => {
                match pod_network.attach(&dir, &id, config, list).await {
                    Ok(record) => Some(record),
                    Err(e) => {
                        let _ = std::fs::remove_dir_all(&dir);
                        return Err(Error::internal(format!(
                            "setting up the pod network of sandbox {id}: {e}"
                        )));
                    }
                }
            }
            _ => None,
        };
        match self
            .start_sandbox_process(
                &id,
                &dir,
                config,
                credentials,
                pod_cgroup,
                attached.as_ref(),
            )
            .await
        {
            Ok(()) => Ok(id),
            Err(e) => {
                self.discard_sandbox_dir(&dir).await;
                Err(e)
            }
        }
    }

    async fn stop_pod_sandbox(&self, sandbox_id: &str) -> Result<()> {
        let sandbox = match self.sandbox(sandbox_id) {
            Ok(s) => s,
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut exited = sandbox.exited.clone();
        if *exited.borrow() {
            // Its process is gone; what it held in the network goes now.
            return self.detach_network(&sandbox).await;
        }
        // The sandbox stops every container, answers, and exits.
        if let Err(e) = self.call(&sandbox, Op::Shutdown, REQUEST_TIMEOUT).await {
            tracing::warn!(sandbox = %sandbox.id, "sandbox shutdown: {e}");
        }
        if tokio::time::timeout(REQUEST_TIMEOUT, exited.wait_for(|e| *e))
            .await
            .is_err()
        {
            if let Some(pid) = sandbox.pid {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            let _ = exited.wait_for(|e| *e).await;
        }
        self.detach_network(&sandbox).await
    }

    async fn remove_pod_sandbox(&self, sandbox_id: &str) -> Result<()> {
        self.stop_pod_sandbox(sandbox_id).await?;
        self.inner.pins.lock().unwrap().remove(sandbox_id);
        let removed: Vec<ContainerStatus> = {
            let mut containers = self.inner.containers.lock().unwrap();
            let ids: Vec<String> = containers
                .values()
                .filter(|c| c.sandbox_id == sandbox_id)
                .map(|c| c.id.clone())
                .collect();
            ids.iter().filter_map(|id| containers.remove(id)).collect()
        };
        for c in &removed {
            self.emit(c, ContainerEventKind::Deleted, Timestamp::now());
        }
        let removed = self.inner.sandboxes.lock().unwrap().remove(sandbox_id);
        if let Some(s) = removed {
            self.discard_sandbox_dir(&s.dir).await;
        }
        Ok(())
    }

    async fn pod_sandbox_status(&self, sandbox_id: &str) -> Result<PodSandboxStatus> {
        let s = self.sandbox(sandbox_id)?;
        Ok(PodSandboxStatus {
            id: s.id.clone(),
            metadata: s.config.metadata.clone(),
            state: sandbox_state(&s),
            created_at: s.created_at,
            ip: s.network.as_ref().and_then(|n| n.ips.first().cloned()),
            additional_ips: s
                .network
                .as_ref()
                .map(|n| n.ips.iter().skip(1).cloned().collect())
                .unwrap_or_default(),
            network_namespace: s.network.as_ref().map(|n| n.netns.clone()),
            labels: s.config.labels.clone(),
            annotations: s.config.annotations.clone(),
            runtime_handler: s.config.runtime_handler.clone(),
        })
    }

    async fn list_pod_sandboxes(&self) -> Result<Vec<PodSandbox>> {
        let sandboxes = self.inner.sandboxes.lock().unwrap();
        Ok(sandboxes
            .values()
            .map(|s| PodSandbox {
                id: s.id.clone(),
                metadata: s.config.metadata.clone(),
                state: sandbox_state(s),
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
        sandbox_config: &PodSandboxConfig,
    ) -> Result<String> {
        let sandbox = self.sandbox(sandbox_id)?;
        if sandbox.credentials.is_some() {
            check_container_user(&config.metadata.name, &config.security, &sandbox.config)?;
        }
        let entry = self
            .inner
            .images
            .resolve(&config.image)
            .map_err(|e| image_error(&config.image, e))?;
        let spec = self.container_spec(config, sandbox_config, &entry.image);
        let log_path = spec.log_path.clone();
        if let Some(credentials) = &sandbox.credentials {
            reachable_by(&spec.wasm_path, "its program", credentials)?;
            for preopen in &spec.preopens {
                let what = format!("the volume it mounts at {}", preopen.guest_path);
                reachable_by(&preopen.host_path, &what, credentials)?;
            }
            prepare_log_file(&log_path, credentials)?;
        }
        let id = new_id();
        let status = ContainerStatus {
            id: id.clone(),
            sandbox_id: sandbox_id.to_owned(),
            metadata: config.metadata.clone(),
            state: ContainerState::Created,
            created_at: Timestamp::now(),
            started_at: None,
            finished_at: None,
            exit_code: 0,
            image: entry.reference.clone(),
            image_ref: entry.image.manifest_digest.clone(),
            reason: String::new(),
            message: String::new(),
            labels: config.labels.clone(),
            annotations: config.annotations.clone(),
            log_path,
        };
        self.inner
            .containers
            .lock()
            .unwrap()
            .insert(id.clone(), status.clone());
        let created = self
            .call(
                &sandbox,
                Op::Create {
                    container_id: id.clone(),
                    spec: Box::new(spec),
                },
                CREATE_TIMEOUT,
            )
            .await;
        if let Err(e) = created {
            self.inner.containers.lock().unwrap().remove(&id);
            return Err(e);
        }
        self.write_container_record(&sandbox, &status);
        self.emit(&status, ContainerEventKind::Created, status.created_at);
        if let Some(list) = &config.resources.cpuset_cpus {
            self.pin(&sandbox, &id, list);
        }
        Ok(id)
    }

    async fn start_container(&self, container_id: &str) -> Result<()> {
        let c = self.container(container_id)?;
        let sandbox = self.sandbox(&c.sandbox_id)?;
        self.call(
            &sandbox,
            Op::Start {
                container_id: container_id.to_owned(),
            },
            REQUEST_TIMEOUT,
        )
        .await
        .map(drop)
    }

    /// Only the memory limit applies to a Wasm container: its store's cap changes in
    /// place. CPU shares and quota are the pod cgroup's, which the node sets (the
    /// containers of a pod share one sandbox process); the oom_score_adj is the
    /// sandbox's.
    async fn update_container_resources(
        &self,
        container_id: &str,
        resources: &ContainerResources,
    ) -> Result<()> {
        let c = self.container(container_id)?;
        let sandbox = self.sandbox(&c.sandbox_id)?;
        if let Some(list) = &resources.cpuset_cpus {
            self.pin(&sandbox, container_id, list);
        }
        self.call(
            &sandbox,
            Op::Update {
                container_id: container_id.to_owned(),
                memory_limit_bytes: resources.memory_limit_bytes,
            },
            REQUEST_TIMEOUT,
        )
        .await
        .map(drop)
    }

    async fn stop_container(&self, container_id: &str, timeout: Duration) -> Result<()> {
        let c = self.container(container_id)?;
        if c.state == ContainerState::Exited {
            return Ok(());
        }
        let sandbox = self.sandbox(&c.sandbox_id)?;
        if *sandbox.exited.borrow() {
            return Ok(());
        }
        self.call(
            &sandbox,
            Op::Stop {
                container_id: container_id.to_owned(),
                timeout_ms: timeout.as_millis() as u64,
            },
            timeout + REQUEST_TIMEOUT,
        )
        .await
        .map(drop)
    }

    async fn remove_container(&self, container_id: &str) -> Result<()> {
        let c = match self.container(container_id) {
            Ok(c) => c,
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e),
        };
        if let Some(containers) = self.inner.pins.lock().unwrap().get_mut(&c.sandbox_id) {
            containers.remove(container_id);
        }
        if c.state == ContainerState::Running {
            return Err(Error::FailedPrecondition(format!(
                "container {container_id} is running; stop it first"
            )));
        }
        if let Ok(sandbox) = self.sandbox(&c.sandbox_id)
            && !*sandbox.exited.borrow()
        {
            self.call(
                &sandbox,
                Op::Remove {
                    container_id: container_id.to_owned(),
                },
                REQUEST_TIMEOUT,
            )
            .await?;
        }
        self.inner.containers.lock().unwrap().remove(container_id);
        if let Ok(sandbox) = self.sandbox(&c.sandbox_id) {
            let _ = std::fs::remove_file(
                sandbox
                    .dir
                    .join("containers")
                    .join(format!("{container_id}.json")),
            );
        }
        self.emit(&c, ContainerEventKind::Deleted, Timestamp::now());
        Ok(())
    }

    /// The sandbox reopens the container's log file at its path, between two records.
    async fn reopen_container_log(&self, container_id: &str) -> Result<()> {
        let c = self.container(container_id)?;
        if c.state != ContainerState::Running {
            return Err(Error::FailedPrecondition(format!(
                "container {container_id} is not running"
            )));
        }
        let sandbox = self.sandbox(&c.sandbox_id)?;
        if let Some(credentials) = &sandbox.credentials {
            prepare_log_file(&c.log_path, credentials)?;
        }
        self.call(
            &sandbox,
            Op::ReopenLog {
                container_id: container_id.to_owned(),
            },
            REQUEST_TIMEOUT,
        )
        .await
        .map(drop)
    }

    async fn list_containers(&self) -> Result<Vec<Container>> {
        let containers = self.inner.containers.lock().unwrap();
        Ok(containers
            .values()
            .map(|c| Container {
                id: c.id.clone(),
                sandbox_id: c.sandbox_id.clone(),
                metadata: c.metadata.clone(),
                image: c.image.clone(),
                image_ref: c.image_ref.clone(),
                state: c.state,
                created_at: c.created_at,
                labels: c.labels.clone(),
                annotations: c.annotations.clone(),
            })
            .collect())
    }

    async fn container_status(&self, container_id: &str) -> Result<ContainerStatus> {
        self.container(container_id)
    }

    async fn pull_image(&self, image: &str, auth: Option<&AuthConfig>) -> Result<String> {
        // A digest names one image for good: held, it is the same. A tag is asked of
        // its registry every time (`imagePullPolicy: Always`), which downloads nothing
        // when the tag still names the image held.
        let known = match self.inner.images.resolve(image) {
            Ok(entry) if image.contains('@') => return Ok(entry.image.manifest_digest),
            Ok(entry) => Some(entry.image.manifest_digest),
            Err(ImageError::NotFound(_)) => None,
            Err(e) => return Err(image_error(image, e)),
        };
        let started = std::time::Instant::now();
        let pulled = self
            .inner
            .puller
            .pull(image, auth, known.as_deref())
            .await
            .map_err(|e| {
                Error::image_pull(
                    image,
                    format!(
                        "{e} (an image no registry serves is imported with `wasmlet images \
                         import` or by placing its OCI archive in <root-dir>/images)"
                    ),
                )
            })?;
        let layout = match pulled {
            crate::registry::Pulled::Unchanged(digest) => {
                tracing::info!(image, id = %digest, "the registry still names the image held; nothing pulled");
                return Ok(digest);
            }
            crate::registry::Pulled::Image(layout) => layout,
        };
        let size: usize = layout.values().map(Vec::len).sum();
        let store = self.inner.images.clone();
        let name = image.to_owned();
        let entries = tokio::task::spawn_blocking(move || store.import_pulled(&name, &layout))
            .await
            .map_err(Error::internal_source)?
            .map_err(|e| Error::image_pull(image, e.to_string()))?;
        let entry = entries
            .into_iter()
            .next()
            .ok_or_else(|| Error::image_pull(image, "the pulled layout held no image"))?;
        tracing::info!(image, id = %entry.image.manifest_digest, bytes = size, elapsed = ?started.elapsed(), "pulled a Wasm image");
        // Compiled now, so the first start does not wait for it.
        let (wasm, digest, kind) = (
            self.inner.images.blob_path(&entry.image.wasm_digest),
            entry.image.wasm_digest.clone(),
            entry.image.kind,
        );
        let cache_dir = self.inner.config.compile_cache_dir.clone();
        let compiled = tokio::task::spawn_blocking(move || {
            let engine = crate::engine::new_engine()?;
            crate::engine::load(&engine, &cache_dir, &wasm, &digest, kind).map(|_| ())
        })
        .await
        .map_err(Error::internal_source)?;
        if let Err(e) = compiled {
            // The sandbox compiles it on the first start instead, and says why it cannot.
            tracing::warn!(image, "precompiling the pulled image: {e:#}");
        }
        Ok(entry.image.manifest_digest)
    }

    async fn image_status(&self, image: &str) -> Result<Option<Image>> {
        match self.inner.images.resolve(image) {
            Ok(entry) => Ok(self
                .list_images()
                .await?
                .into_iter()
                .find(|i| i.id == entry.image.manifest_digest)),
            Err(ImageError::NotFound(_)) => Ok(None),
            Err(e) => Err(image_error(image, e)),
        }
    }

    async fn list_images(&self) -> Result<Vec<Image>> {
        let entries = self.inner.images.list().map_err(Error::internal_source)?;
        let mut by_id: HashMap<String, Image> = HashMap::new();
        for e in entries {
            let image = by_id
                .entry(e.image.manifest_digest.clone())
                .or_insert_with(|| Image {
                    id: e.image.manifest_digest.clone(),
                    repo_tags: Vec::new(),
                    repo_digests: Vec::new(),
                    size: e.image.size,
                    // A Wasm guest has no user of its own.
                    uid: None,
                    username: String::new(),
                    pinned: false,
                });
            let repo = wasmlet_runtime::reference::repository(&e.reference).to_owned();
            image.repo_tags.push(e.reference);
            let digest = format!("{repo}@{}", e.image.manifest_digest);
            if !image.repo_digests.contains(&digest) {
                image.repo_digests.push(digest);
            }
        }
        let mut images: Vec<Image> = by_id.into_values().collect();
        images.sort_by(|a, b| a.repo_tags.cmp(&b.repo_tags));
        Ok(images)
    }

    async fn image_fs_info(&self) -> Result<Vec<FilesystemUsage>> {
        let images = self.inner.images.clone();
        let (bytes, inodes) = tokio::task::spawn_blocking(move || images.usage())
            .await
            .map_err(|e| Error::internal_from("measuring the image store", e))?
            .map_err(|e| Error::internal_from("measuring the image store", e))?;
        Ok(vec![FilesystemUsage {
            timestamp: Timestamp::now(),
            mountpoint: self.inner.images.root().to_owned(),
            used_bytes: Some(bytes),
            inodes_used: Some(inodes),
        }])
    }

    /// A Wasm container has no writable layer: it writes only to the volumes
    /// preopened for it, which the node measures as volumes.
    async fn container_fs_usage(&self) -> Result<Vec<ContainerFsUsage>> {
        Ok(Vec::new())
    }

    /// Removes the image and, once no image left holds its Wasm binary, the binary's
    /// compiled artifacts in the compile cache (image GC reclaims both).
    async fn remove_image(&self, image: &str) -> Result<()> {
        let images = &self.inner.images;
        let digest = images.resolve(image).ok().map(|e| e.image.wasm_digest);
        images.remove(image).map_err(|e| image_error(image, e))?;
        let Some(digest) = digest else {
            return Ok(());
        };
        let still_held = images
            .list()
            .map_err(|e| image_error(image, e))?
            .iter()
            .any(|e| e.image.wasm_digest == digest);
        if !still_held {
            remove_compiled(&self.inner.config.compile_cache_dir, &digest);
        }
        Ok(())
    }

    /// Runs `command` as a new instance of the container's own program in its sandbox
    /// (see [`crate::sandbox`]). A zero `timeout` means none, as in CRI.
    async fn exec_sync(
        &self,
        container_id: &str,
        command: &[String],
        timeout: Duration,
    ) -> Result<ExecResult> {
        let c = self.container(container_id)?;
        if c.state != ContainerState::Running {
            return Err(Error::FailedPrecondition(format!(
                "container {container_id} is not running ({:?}): cannot exec in it",
                c.state
            )));
        }
        if command.is_empty() {
            return Err(Error::InvalidArgument("an exec needs a command".into()));
        }
        let sandbox = self.sandbox(&c.sandbox_id)?;
        let op = Op::Exec {
            container_id: container_id.to_owned(),
            argv: command.to_vec(),
            // 0 is "none": a timeout under a millisecond is one millisecond.
            timeout_ms: match u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX) {
                0 if !timeout.is_zero() => 1,
                ms => ms,
            },
        };
        let wait = if timeout.is_zero() {
            Duration::MAX
        } else {
            timeout.saturating_add(REQUEST_TIMEOUT)
        };
        match self.request(&sandbox, op, wait).await? {
            Ok(Answer {
                exec: Some(out), ..
            }) => Ok(ExecResult {
                exit_code: out.exit_code,
                stdout: out.stdout,
                stderr: out.stderr,
            }),
            Ok(_) => Err(Error::internal(format!(
                "sandbox {}: an exec reply without its outcome",
                sandbox.id
            ))),
            Err(Refused {
                kind: Some(ErrorKind::DeadlineExceeded),
                ..
            }) => Err(Error::Timeout {
                operation: "exec_sync",
                after: timeout,
            }),
            Err(refused) => Err(refused.into_error()),
        }
    }

    /// An interactive exec: a new instance of the container's program, as
    /// [`Self::exec_sync`] runs it, with its stdio live on the session.
    async fn exec_stdio(
        &self,
        container_id: &str,
        cmd: &[String],
        streams: Streams,
    ) -> Result<StdioSession> {
        if cmd.is_empty() {
            return Err(Error::InvalidArgument("an exec needs a command".into()));
        }
        let kind = StreamKind::Exec { argv: cmd.to_vec() };
        self.open_stdio(container_id, kind, streams).await
    }

    async fn attach_stdio(&self, container_id: &str, streams: Streams) -> Result<StdioSession> {
        self.open_stdio(container_id, StreamKind::Attach, streams)
            .await
    }

    fn subscribe(&self) -> broadcast::Receiver<RuntimeEvent> {
        self.inner.events.subscribe()
    }
}

/// The name of a sandbox's stream socket in its directory.
const STREAM_SOCKET: &str = "stream.sock";

/// The node's side of an accepted stream connection: pipes for the session's streams,
/// one task writing the client's stdin as frames and one reading the sandbox's frames
/// into the output pipes, both aborted when the session is dropped.
fn stdio_session(
    mut read: BufReader<OwnedReadHalf>,
    mut write: OwnedWriteHalf,
    request: StreamRequest,
) -> StdioSession {
    const PIPE: usize = 64 * 1024;
    let (stdin, from_client) = if request.stdin {
        let (from_client, to_sandbox) = tokio::io::duplex(PIPE);
        (
            Some(Box::new(to_sandbox) as Box<dyn tokio::io::AsyncWrite + Send + Unpin>),
            Some(from_client),
        )
    } else {
        (None, None)
    };
    let writer = tokio::spawn(async move {
        if let Some(mut from_client) = from_client {
            let mut buf = vec![0u8; 32 * 1024];
            loop {
                match from_client.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if frame::write(&mut write, frame::STDIN, &buf[..n])
                            .await
                            .is_err()
                        {
                            break;
                        }
                    }
                }
            }
            let _ = frame::write(&mut write, frame::STDIN_CLOSED, &[]).await;
        }
        // The connection stays open until the session is dropped: its end would end
        // the exec.
        std::future::pending::<()>().await;
        drop(write);
    });
    let (stdout, mut stdout_w) = if request.stdout {
        let (r, w) = tokio::io::duplex(PIPE);
        (Some(r), Some(w))
    } else {
        (None, None)
    };
    let (stderr, mut stderr_w) = if request.stderr {
        let (r, w) = tokio::io::duplex(PIPE);
        (Some(r), Some(w))
    } else {
        (None, None)
    };
    let (exit_tx, exit_rx) = oneshot::channel::<Result<i32>>();
    let reader = tokio::spawn(async move {
        let outcome = loop {
            let (tag, payload) = match frame::read(&mut read).await {
                Ok(Some(f)) => f,
                Ok(None) => {
                    break Err(Error::internal(
                        "the sandbox closed the stream before the process ended",
                    ));
                }
                Err(e) => break Err(Error::internal_from("reading the sandbox's stream", e)),
            };
            let pipe = match tag {
                frame::STDOUT => &mut stdout_w,
                frame::STDERR => &mut stderr_w,
                frame::EXIT => {
                    break serde_json::from_slice::<Exit>(&payload)
                        .map(|exit| exit.code)
                        .map_err(|e| {
                            Error::internal(format!("a malformed exit from the sandbox: {e}"))
                        });
                }
                frame::ERROR => {
                    break Err(Error::FailedPrecondition(
                        String::from_utf8_lossy(&payload).into_owned(),
                    ));
                }
                _ => continue,
            };
            // A reader that went away no longer wants the stream.
            if let Some(w) = pipe.as_mut()
                && w.write_all(&payload).await.is_err()
            {
                *pipe = None;
            }
        };
        // The output ends before the exit is told.
        for mut w in [stdout_w, stderr_w].into_iter().flatten() {
            let _ = w.shutdown().await;
        }
        let _ = exit_tx.send(outcome);
    });
    let guards = [reader, writer].map(tokio_util::task::AbortOnDropHandle::new);
    StdioSession {
        stdin,
        stdout: stdout.map(|r| Box::new(r) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        stderr: stderr.map(|r| Box::new(r) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        exit: Box::pin(async move {
            let _guards = guards;
            exit_rx.await.unwrap_or_else(|_| {
                Err(Error::internal(
                    "the stream's reader ended without an outcome",
                ))
            })
        }),
    }
}

fn sandbox_state(s: &SandboxHandle) -> SandboxState {
    if *s.exited.borrow() {
        SandboxState::NotReady
    } else {
        SandboxState::Ready
    }
}

/// The kernel's CPU list format (`0-2,5`).
fn parse_cpu_list(list: &str) -> std::result::Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let parse = |s: &str| {
            s.trim()
                .parse::<usize>()
                .map_err(|_| format!("bad CPU list {list:?}"))
        };
        let (a, b) = (parse(a)?, parse(b)?);
        if a > b {
            return Err(format!("bad CPU list {list:?}"));
        }
        out.extend(a..=b);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_lists_parse_in_the_kernels_format() {
        assert_eq!(super::parse_cpu_list("0-2,5").unwrap(), [0, 1, 2, 5]);
        assert_eq!(super::parse_cpu_list("").unwrap(), Vec::<usize>::new());
        assert!(super::parse_cpu_list("3-1").is_err());
        assert!(super::parse_cpu_list("a").is_err());
    }

    use std::error::Error as _;
    use std::path::Path;

    use super::*;

    fn config(dir: &Path) -> WasmRuntimeConfig {
        WasmRuntimeConfig {
            image_dir: dir.join("images"),
            compile_cache_dir: dir.join("compile-cache"),
            state_dir: dir.join("sandboxes"),
            sandbox: SandboxCommand {
                program: "/nonexistent/wasmlet-sandbox".into(),
                args: vec![],
                zygote: false,
            },
            cgroup_mount_root: dir.join("cgroup"),
            registry: Default::default(),
            network: None,
        }
    }

    /// The first `io::Error` in `err`'s chain of causes.
    fn io_cause(err: &Error) -> Option<&std::io::Error> {
        let mut cause = err.source();
        while let Some(e) = cause {
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                return Some(io);
            }
            cause = e.source();
        }
        None
    }

    #[test]
    fn an_image_dir_that_is_a_file_keeps_its_io_error() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        std::fs::write(&config.image_dir, b"not a directory").unwrap();
        let Err(err) = WasmRuntime::new(config) else {
            panic!("an image dir that is a file must fail");
        };
        assert!(matches!(err, Error::Internal { .. }), "{err:?}");
        let store = err
            .source()
            .and_then(|s| s.downcast_ref::<ImageError>())
            .unwrap_or_else(|| panic!("the image store's error is the source: {err:?}"));
        assert!(matches!(store, ImageError::Io { .. }), "{store:?}");
        let io = io_cause(&err).expect("an io::Error below");
        assert_eq!(io.kind(), std::io::ErrorKind::NotADirectory, "{io:?}");
        // The text still says it all.
        assert_eq!(err.to_string(), store.to_string());
        assert!(err.to_string().contains(&io.to_string()), "{err}");
    }

    #[test]
    fn a_state_dir_that_is_a_file_keeps_its_io_error() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        std::fs::write(&config.state_dir, b"not a directory").unwrap();
        let state_dir = config.state_dir.clone();
        let Err(err) = WasmRuntime::new(config) else {
            panic!("a state dir that is a file must fail");
        };
        let io = err
            .source()
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .unwrap_or_else(|| panic!("the io::Error is the source: {err:?}"));
        assert_eq!(io.kind(), std::io::ErrorKind::AlreadyExists, "{io:?}");
        assert_eq!(err.to_string(), format!("{}: {io}", state_dir.display()));
    }
}
