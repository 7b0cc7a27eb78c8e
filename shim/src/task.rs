//! The task API over the pod's sandbox process.
//!
//! A task is a container of this shim's pod: the pause container of a CRI pod is a
//! *virtual* task, running from `Start` to `Kill`, that runs no engine (the sandbox
//! process holds the pod's network namespace); every other task is a Wasm container
//! in the sandbox process. An exec is a new instance of its container's program with
//! the exec's args, streamed over the sandbox's stream socket (the node's exec model),
//! so `ctr task exec`, `crictl exec` and `kubectl exec` work.
//!
//! States move Created → Running → Stopped; `Delete` forgets a task that is not
//! running. The first `Create` starts the sandbox process in the task's cgroup and
//! network namespace; the last `Delete` ends it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use containerd_shim_protos::api;
use containerd_shim_protos::events::task::{
    TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskExit, TaskIO, TaskOOM, TaskStart,
};
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::well_known_types::empty::Empty;
use containerd_shim_protos::protobuf::{Message as _, MessageField};
use containerd_shim_protos::shim_async::Task;
use containerd_shim_protos::topics;
use containerd_shim_protos::types::task::{ProcessInfo, Status};
use jiff::Timestamp;
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;
use tokio::sync::{Notify, mpsc, watch};
use tokio_util::sync::CancellationToken;
use ttrpc::Code;
use ttrpc::asynchronous::TtrpcContext;
use wasmlet_runtime_wasm::protocol::{
    ContainerSpec, ErrorKind, Exit, Fifos, KILLED_EXIT_CODE, Op, StreamKind, StreamRequest, frame,
};

use crate::bootstrap::{Flags, SANDBOX_PID_FILE};
use crate::cgroup::{MOUNT_ROOT, TaskCgroup};
use crate::events::{Publisher, timestamp};
use crate::sandbox::{self, CallError, Event, SandboxProcess};
use crate::spec::{self, Spec};

/// Where compiled modules are cached, shared by every shim of the node.
pub const DEFAULT_CACHE_DIR: &str = "/var/lib/containerd-shim-wasmlet/cache";
/// How long a `Create` may take: compiling a large module on a slow node.
const CREATE_TIMEOUT: Duration = Duration::from_secs(120);
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// A graceful stop (SIGTERM) waits for the guest for as long as the caller does:
/// containerd sends SIGKILL after its own grace period.
const GRACEFUL_STOP_MS: u64 = 24 * 3600 * 1000;

type TtrpcResult<T> = ttrpc::Result<T>;

fn error(code: Code, message: impl ToString) -> ttrpc::Error {
    ttrpc::Error::RpcStatus(ttrpc::get_status(code, message))
}

fn from_call(what: &str, e: CallError) -> ttrpc::Error {
    let code = match e.kind {
        Some(ErrorKind::FailedPrecondition) => Code::FAILED_PRECONDITION,
        Some(ErrorKind::InvalidArgument) => Code::INVALID_ARGUMENT,
        Some(ErrorKind::DeadlineExceeded) => Code::DEADLINE_EXCEEDED,
        None => Code::INTERNAL,
    };
    error(code, format!("{what}: {e}"))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Created,
    Running,
    Stopped,
}

impl State {
    fn status(self) -> Status {
        match self {
            State::Created => Status::CREATED,
            State::Running => Status::RUNNING,
            State::Stopped => Status::STOPPED,
        }
    }
}

#[derive(Clone, Debug, Default)]
struct Io {
    stdin: String,
    stdout: String,
    stderr: String,
    terminal: bool,
}

#[derive(Clone, Copy, Debug)]
struct Ended {
    code: u32,
    at: Timestamp,
}

impl Ended {
    fn now(code: u32) -> Ended {
        Ended {
            code,
            at: Timestamp::now(),
        }
    }

    fn delete_response(self, pid: u32) -> api::DeleteResponse {
        api::DeleteResponse {
            pid,
            exit_status: self.code,
            exited_at: MessageField::some(timestamp(self.at)),
            ..Default::default()
        }
    }
}

/// A process: a task's init (its container) or an exec.
struct Process {
    state: State,
    io: Io,
    ended: Option<Ended>,
    exited: watch::Sender<bool>,
    /// The signal `Kill` sent, which names the exit of a guest it cancelled.
    killed_by: Option<u32>,
    /// `Start` is between its request and its `TaskStart`: an exit waits for it.
    starting: bool,
    deferred_exit: Option<(Timestamp, Exit)>,
}

impl Process {
    fn new(io: Io) -> Process {
        Process {
            state: State::Created,
            io,
            ended: None,
            exited: watch::channel(false).0,
            killed_by: None,
            starting: false,
            deferred_exit: None,
        }
    }

    /// Records the end; `false` if it had ended already.
    fn end(&mut self, code: u32, at: Timestamp) -> bool {
        if self.ended.is_some() {
            return false;
        }
        self.state = State::Stopped;
        self.ended = Some(Ended { code, at });
        // `send` stores nothing while no `Wait` subscribes; the exit must stay.
        self.exited.send_replace(true);
        true
    }
}

struct ExecProcess {
    process: Process,
    argv: Vec<String>,
    cancel: CancellationToken,
    close_stdin: CancellationToken,
}

struct TaskEntry {
    bundle: PathBuf,
    /// The pause container of a CRI pod: no engine runs it.
    pause: bool,
    init: Process,
    execs: HashMap<String, ExecProcess>,
}

struct Group {
    process: Arc<SandboxProcess>,
    cgroup: Option<TaskCgroup>,
    /// The task whose spec made the cgroup (its `Update`s resize it).
    cgroup_owner: String,
    oom_score_adj: Option<i64>,
}

pub struct Service {
    this: Weak<Service>,
    run_dir: PathBuf,
    group_name: String,
    cache_dir: PathBuf,
    publisher: Publisher,
    tasks: Mutex<HashMap<String, TaskEntry>>,
    group: tokio::sync::Mutex<Option<Group>>,
    events: mpsc::UnboundedSender<Event>,
    finished: Notify,
}

impl Service {
    pub fn new(flags: &Flags, socket: &Path, publisher: Publisher) -> Arc<Service> {
        let name = socket
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or(&flags.id);
        let (tx, rx) = mpsc::unbounded_channel();
        let service = Arc::new_cyclic(|this| Service {
            this: this.clone(),
            run_dir: Path::new(sandbox::RUN_DIR).join(&name[..16.min(name.len())]),
            group_name: flags.id.clone(),
            cache_dir: std::env::var_os("WASMLET_SHIM_CACHE_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| DEFAULT_CACHE_DIR.into()),
            publisher,
            tasks: Mutex::default(),
            group: tokio::sync::Mutex::new(None),
            events: tx,
            finished: Notify::new(),
        });
        tokio::spawn(handle_events(Arc::downgrade(&service), rx));
        service
    }

    /// Resolves once `Shutdown` found no task left.
    pub async fn finished(&self) {
        self.finished.notified().await
    }

    fn publish(&self, topic: &'static str, event: &dyn protobuf::MessageDyn) {
        self.publisher.publish(topic, event);
    }

    fn publish_exit(&self, container_id: &str, id: &str, pid: u32, ended: Ended) {
        self.publish(
            topics::TASK_EXIT_EVENT_TOPIC,
            &TaskExit {
                container_id: container_id.to_owned(),
                id: id.to_owned(),
                pid,
                exit_status: ended.code,
                exited_at: MessageField::some(timestamp(ended.at)),
                ..Default::default()
            },
        );
    }

    async fn sandbox_pid(&self) -> u32 {
        self.group
            .lock()
            .await
            .as_ref()
            .map_or(0, |g| g.process.pid)
    }

    async fn sandbox(&self) -> TtrpcResult<Arc<SandboxProcess>> {
        match self.group.lock().await.as_ref() {
            Some(g) => Ok(g.process.clone()),
            None => Err(error(
                Code::FAILED_PRECONDITION,
                "the pod's sandbox process is not running",
            )),
        }
    }

    /// The pod's sandbox process, started for the first task in its cgroup and
    /// network namespace.
    async fn ensure_group(&self, id: &str, spec: &Spec, bundle: &Path) -> anyhow::Result<u32> {
        let mut group = self.group.lock().await;
        let adj = spec.process().oom_score_adj;
        if let Some(g) = group.as_mut() {
            // The pod's process is as killable as its most killable container.
            if let Some(adj) = adj
                && g.oom_score_adj.is_none_or(|a| adj > a)
            {
                wasmlet_runtime_wasm::cgroup::set_oom_score_adj(g.process.pid, adj)?;
                g.oom_score_adj = Some(adj);
            }
            return Ok(g.process.pid);
        }
        let cgroup = match spec.cgroups_path() {
            Some(path) => {
                let cgroup = TaskCgroup::create(Path::new(MOUNT_ROOT), path)?;
                cgroup.apply(&spec.resources())?;
                Some(cgroup)
            }
            None => None,
        };
        let join = match &cgroup {
            Some(c) => Some(wasmlet_runtime_wasm::cgroup::PodCgroup::open(
                Path::new(MOUNT_ROOT),
                &c.parent_for_join()?,
            )?),
            None => None,
        };
        // Before the sandbox's mount namespace is made from this one: the shared
        // directory must be in it as a shared mount to receive later tasks' rootfs.
        if let Err(e) = crate::mount::make_shared(&crate::mount::shared_dir(&self.run_dir)) {
            if let Some(c) = &cgroup {
                c.remove();
            }
            crate::mount::release_run_dir(&self.run_dir);
            return Err(e);
        }
        let process = SandboxProcess::spawn(
            sandbox::Options {
                dir: self.run_dir.clone(),
                cache_dir: &self.cache_dir,
                group: &self.group_name,
                network: spec.network(),
                cgroup: join,
                oom_score_adj: adj,
            },
            self.events.clone(),
        )
        .await;
        let process = match process {
            Ok(p) => p,
            Err(e) => {
                if let Some(c) = &cgroup {
                    c.remove();
                }
                crate::mount::release_run_dir(&self.run_dir);
                return Err(e);
            }
        };
        let _ = std::fs::write(bundle.join(SANDBOX_PID_FILE), process.pid.to_string());
        tracing::info!(pid = process.pid, cgroup = ?cgroup.as_ref().map(|c| &c.name), "started the sandbox process");
        let pid = process.pid;
        *group = Some(Group {
            process,
            cgroup,
            cgroup_owner: id.to_owned(),
            oom_score_adj: adj,
        });
        Ok(pid)
    }

    /// Forgets a container in the sandbox process; a sandbox that is gone has
    /// forgotten it already.
    async fn remove_from_sandbox(&self, id: &str) {
        if let Ok(sandbox) = self.sandbox().await {
            let op = Op::Remove {
                container_id: id.to_owned(),
            };
            let _ = sandbox.call(op, CALL_TIMEOUT).await;
        }
    }

    /// Ends the sandbox process once no task is left.
    async fn end_group_if_idle(&self) {
        if !self.tasks.lock().unwrap().is_empty() {
            return;
        }
        let Some(group) = self.group.lock().await.take() else {
            return;
        };
        group.process.shutdown().await;
        if let Some(c) = &group.cgroup {
            c.remove();
        }
        tracing::info!("stopped the sandbox process");
    }

    fn with_task<T>(
        &self,
        id: &str,
        f: impl FnOnce(&mut TaskEntry) -> TtrpcResult<T>,
    ) -> TtrpcResult<T> {
        let mut tasks = self.tasks.lock().unwrap();
        match tasks.get_mut(id) {
            Some(t) => f(t),
            None => Err(error(Code::NOT_FOUND, format!("task {id} not found"))),
        }
    }

    fn with_process<T>(
        &self,
        id: &str,
        exec_id: &str,
        f: impl FnOnce(&mut Process) -> TtrpcResult<T>,
    ) -> TtrpcResult<T> {
        self.with_task(id, |t| {
            if exec_id.is_empty() {
                return f(&mut t.init);
            }
            match t.execs.get_mut(exec_id) {
                Some(e) => f(&mut e.process),
                None => Err(error(
                    Code::NOT_FOUND,
                    format!("exec {exec_id} of task {id} not found"),
                )),
            }
        })
    }

    /// A container of the sandbox exited.
    async fn on_exit(&self, container_id: &str, at: Timestamp, exit: Exit) {
        let pid = self.sandbox_pid().await;
        let oom = exit.reason == "OOMKilled";
        let ended = {
            let mut tasks = self.tasks.lock().unwrap();
            let Some(task) = tasks.get_mut(container_id) else {
                return;
            };
            if task.init.starting {
                task.init.deferred_exit = Some((at, exit));
                return;
            }
            let code = exit_status(&exit, task.init.killed_by);
            if !task.init.end(code, at) {
                return;
            }
            Ended { code, at }
        };
        tracing::info!(container = container_id, code = ended.code, reason = %exit.reason, message = %exit.message, "task exited");
        if oom {
            self.publish(
                topics::TASK_OOM_EVENT_TOPIC,
                &TaskOOM {
                    container_id: container_id.to_owned(),
                    ..Default::default()
                },
            );
        }
        self.publish_exit(container_id, container_id, pid, ended);
    }

    /// The sandbox process ended: so did every task and exec in it.
    async fn on_sandbox_gone(&self, how: String) {
        let (pid, oom) = {
            let group = self.group.lock().await;
            match group.as_ref() {
                Some(g) => (
                    g.process.pid,
                    g.cgroup.as_ref().is_some_and(TaskCgroup::oom_killed),
                ),
                None => (0, false),
            }
        };
        tracing::warn!(pid, oom, "the sandbox process ended: {how}");
        let at = Timestamp::now();
        let mut ended = Vec::new();
        {
            let mut tasks = self.tasks.lock().unwrap();
            for (id, task) in tasks.iter_mut() {
                for (exec_id, exec) in task.execs.iter_mut() {
                    exec.cancel.cancel();
                    if exec.process.end(KILLED_EXIT_CODE as u32, at) {
                        ended.push((id.clone(), exec_id.clone(), false));
                    }
                }
                if task.init.end(KILLED_EXIT_CODE as u32, at) {
                    ended.push((id.clone(), id.clone(), !task.pause && oom));
                }
            }
        }
        let code = KILLED_EXIT_CODE as u32;
        for (container_id, id, oom) in ended {
            if oom {
                self.publish(
                    topics::TASK_OOM_EVENT_TOPIC,
                    &TaskOOM {
                        container_id: container_id.clone(),
                        ..Default::default()
                    },
                );
            }
            self.publish_exit(&container_id, &id, pid, Ended { code, at });
        }
    }

    fn wasm_spec(
        &self,
        id: &str,
        req: &api::CreateTaskRequest,
        spec: &Spec,
        bundle: &Path,
    ) -> anyhow::Result<ContainerSpec> {
        // The sandbox process sees the rootfs and the directories the task mounts
        // where they are shared with it (see `crate::mount::shared_dir`).
        let mut preopens = spec.preopens(&spec.rootfs(bundle));
        let sources: Vec<&Path> = preopens.iter().map(|p| p.host_path.as_path()).collect();
        let shared = crate::mount::shared_dir(&self.run_dir);
        let seen = crate::mount::share_task(bundle, &shared, id, &sources)?;
        for (preopen, path) in preopens.iter_mut().zip(seen) {
            preopen.host_path = path;
        }
        let rootfs = preopens[0].host_path.clone();
        let env = spec.env();
        let process = spec.process();
        let module = spec::find_module(&rootfs, &process, &env)?;
        let digest = {
            let bytes = std::fs::read(&module.path)?;
            format!("sha256:{}", hex::encode(Sha256::digest(&bytes)))
        };
        let stdout = fifo_path(&req.stdout)?;
        let stderr = if req.terminal {
            stdout.clone()
        } else {
            fifo_path(&req.stderr)?
        };
        Ok(ContainerSpec {
            name: spec
                .annotations
                .get(spec::CONTAINER_NAME)
                .cloned()
                .unwrap_or_else(|| id.to_owned()),
            wasm_path: module.path,
            wasm_digest: digest,
            kind: module.kind,
            argv: process.args.clone(),
            env,
            preopens,
            log_path: bundle.join("wasmlet-unused.log"),
            fifos: Some(Fifos {
                stdin: None,
                stdout,
                stderr,
            }),
            memory_limit_bytes: spec.memory_limit(),
            program_names: Vec::new(),
            stdin: false,
            stdin_once: false,
            tty: req.terminal,
            ports: Vec::new(),
        })
    }

    async fn start_exec(&self, id: &str, exec_id: &str) -> TtrpcResult<api::StartResponse> {
        let (argv, io, cancel, close_stdin) = self.with_task(id, |t| {
            let Some(exec) = t.execs.get_mut(exec_id) else {
                return Err(error(
                    Code::NOT_FOUND,
                    format!("exec {exec_id} of task {id} not found"),
                ));
            };
            if exec.process.state != State::Created {
                return Err(error(
                    Code::FAILED_PRECONDITION,
                    format!("exec {exec_id} was started already"),
                ));
            }
            exec.process.state = State::Running;
            Ok((
                exec.argv.clone(),
                exec.process.io.clone(),
                exec.cancel.clone(),
                exec.close_stdin.clone(),
            ))
        })?;
        let sandbox = self.sandbox().await?;
        let request = StreamRequest {
            container_id: id.to_owned(),
            kind: StreamKind::Exec { argv },
            stdin: !io.stdin.is_empty(),
            stdout: true,
            stderr: true,
            tty: io.terminal,
        };
        let (read, write) = match sandbox.stream(&request).await {
            Ok(s) => s,
            Err(e) => {
                let _ = self.with_process(id, exec_id, |p| {
                    p.state = State::Created;
                    Ok(())
                });
                return Err(from_call(&format!("exec {exec_id} in task {id}"), e));
            }
        };
        let pid = sandbox.pid;
        self.publish(
            topics::TASK_EXEC_STARTED_EVENT_TOPIC,
            &TaskExecStarted {
                container_id: id.to_owned(),
                exec_id: exec_id.to_owned(),
                pid,
                ..Default::default()
            },
        );
        let this = self.this.upgrade().expect("the service outlives its calls");
        let (id, exec_id) = (id.to_owned(), exec_id.to_owned());
        tokio::spawn(async move {
            let code = pump_exec(read, write, &io, cancel, close_stdin).await;
            let at = Timestamp::now();
            let ended = this.with_process(&id, &exec_id, |p| {
                let code = match (code, p.killed_by) {
                    (None, Some(signal)) => 128 + signal,
                    (None, None) => KILLED_EXIT_CODE as u32,
                    (Some(code), _) => code,
                };
                Ok(p.end(code, at).then_some(Ended { code, at }))
            });
            if let Ok(Some(ended)) = ended {
                this.publish_exit(&id, &exec_id, pid, ended);
            }
        });
        Ok(api::StartResponse {
            pid,
            ..Default::default()
        })
    }
}

async fn handle_events(service: Weak<Service>, mut rx: mpsc::UnboundedReceiver<Event>) {
    while let Some(event) = rx.recv().await {
        let Some(service) = service.upgrade() else {
            return;
        };
        match event {
            Event::Exited {
                container_id,
                at,
                exit,
            } => service.on_exit(&container_id, at, exit).await,
            Event::Gone(how) => service.on_sandbox_gone(how).await,
        }
    }
}

/// The exit status containerd sees: the guest's code, or for a guest `Kill`
/// cancelled, 128 + the signal (as a process the signal ended).
fn exit_status(exit: &Exit, killed_by: Option<u32>) -> u32 {
    match killed_by {
        Some(signal) if exit.code == KILLED_EXIT_CODE && exit.reason != "OOMKilled" => 128 + signal,
        _ => u32::try_from(exit.code).unwrap_or(255),
    }
}

/// A stdio path as containerd hands it: a FIFO path or a `file://` URI.
fn fifo_path(uri: &str) -> anyhow::Result<Option<PathBuf>> {
    if uri.is_empty() {
        return Ok(None);
    }
    if let Some(path) = uri.strip_prefix("file://") {
        return Ok(Some(path.into()));
    }
    if uri.contains("://") {
        anyhow::bail!("stdio {uri:?}: only FIFOs and file:// are supported");
    }
    Ok(Some(uri.into()))
}

fn open_output(path: &str) -> Option<tokio::fs::File> {
    let path = fifo_path(path).ok()??;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .ok()
        .map(tokio::fs::File::from_std)
}

/// Relays an exec's frames to its FIFOs (and its stdin FIFO to the sandbox) until
/// it ends; its exit code, or `None` when it was cut off.
async fn pump_exec(
    mut read: tokio::io::BufReader<tokio::net::unix::OwnedReadHalf>,
    mut write: tokio::net::unix::OwnedWriteHalf,
    io: &Io,
    cancel: CancellationToken,
    close_stdin: CancellationToken,
) -> Option<u32> {
    use tokio::io::AsyncWriteExt;
    let mut stdout = open_output(&io.stdout);
    let mut stderr = if io.terminal {
        None
    } else {
        open_output(&io.stderr)
    };
    let stdin_path = fifo_path(&io.stdin).ok().flatten();
    let stdin_task = tokio::spawn(async move {
        if let Some(path) = stdin_path
            && let Ok(mut stdin) = tokio::net::unix::pipe::OpenOptions::new()
                .read_write(true)
                .open_receiver(&path)
        {
            let mut buf = vec![0u8; 32 * 1024];
            loop {
                tokio::select! {
                    read = stdin.read(&mut buf) => match read {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if frame::write(&mut write, frame::STDIN, &buf[..n]).await.is_err() {
                                return write;
                            }
                        }
                    },
                    () = close_stdin.cancelled() => break,
                }
            }
            let _ = frame::write(&mut write, frame::STDIN_CLOSED, &[]).await;
        }
        write
    });
    let code = loop {
        let next = tokio::select! {
            next = frame::read(&mut read) => next,
            () = cancel.cancelled() => break None,
        };
        match next {
            Ok(Some((frame::STDOUT, bytes))) => {
                if let Some(out) = stdout.as_mut() {
                    let _ = out.write_all(&bytes).await;
                }
            }
            Ok(Some((frame::STDERR, bytes))) => {
                if let Some(err) = stderr.as_mut().or(stdout.as_mut()) {
                    let _ = err.write_all(&bytes).await;
                }
            }
            Ok(Some((frame::EXIT, payload))) => {
                break serde_json::from_slice::<Exit>(&payload)
                    .ok()
                    .map(|e| u32::try_from(e.code).unwrap_or(255));
            }
            Ok(Some((frame::ERROR, payload))) => {
                tracing::warn!("exec ended: {}", String::from_utf8_lossy(&payload));
                break Some(255);
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => break None,
        }
    };
    // Dropping the connection ends an exec that is still running.
    stdin_task.abort();
    drop(read);
    code
}

fn empty() -> Empty {
    Empty::new()
}

#[async_trait::async_trait]
impl Task for Service {
    async fn create(
        &self,
        _ctx: &TtrpcContext,
        req: api::CreateTaskRequest,
    ) -> TtrpcResult<api::CreateTaskResponse> {
        let id = req.id.clone();
        if self.tasks.lock().unwrap().contains_key(&id) {
            return Err(error(Code::ALREADY_EXISTS, format!("task {id} exists")));
        }
        let bundle = PathBuf::from(&req.bundle);
        let spec =
            Spec::load(&bundle).map_err(|e| error(Code::INVALID_ARGUMENT, format!("{e:#}")))?;
        let rootfs = spec.rootfs(&bundle);
        crate::mount::mount_rootfs(&req.rootfs, &rootfs)
            .map_err(|e| error(Code::INTERNAL, format!("task {id}: {e:#}")))?;
        let fail = |code, e: String| {
            crate::mount::unmount_rootfs(&bundle);
            error(code, format!("task {id}: {e}"))
        };
        let pause = spec.is_pod_sandbox();
        let wasm = if pause {
            None
        } else {
            Some(
                self.wasm_spec(&id, &req, &spec, &bundle)
                    .map_err(|e| fail(Code::INVALID_ARGUMENT, format!("{e:#}")))?,
            )
        };
        let pid = self
            .ensure_group(&id, &spec, &bundle)
            .await
            .map_err(|e| fail(Code::INTERNAL, format!("{e:#}")))?;
        if let Some(wasm) = wasm {
            let sandbox = self.sandbox().await?;
            let op = Op::Create {
                container_id: id.clone(),
                spec: Box::new(wasm),
            };
            if let Err(e) = sandbox.call(op, CREATE_TIMEOUT).await {
                crate::mount::unmount_rootfs(&bundle);
                // The sandbox process was started for this task alone: it goes too.
                self.end_group_if_idle().await;
                return Err(from_call(&format!("task {id}"), e));
            }
        }
        let io = Io {
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
            terminal: req.terminal,
        };
        self.tasks.lock().unwrap().insert(
            id.clone(),
            TaskEntry {
                bundle: bundle.clone(),
                pause,
                init: Process::new(io.clone()),
                execs: HashMap::new(),
            },
        );
        self.publish(
            topics::TASK_CREATE_EVENT_TOPIC,
            &TaskCreate {
                container_id: id.clone(),
                bundle: req.bundle.clone(),
                io: MessageField::some(TaskIO {
                    stdin: io.stdin,
                    stdout: io.stdout,
                    stderr: io.stderr,
                    terminal: io.terminal,
                    ..Default::default()
                }),
                pid,
                ..Default::default()
            },
        );
        Ok(api::CreateTaskResponse {
            pid,
            ..Default::default()
        })
    }

    async fn start(
        &self,
        _ctx: &TtrpcContext,
        req: api::StartRequest,
    ) -> TtrpcResult<api::StartResponse> {
        if !req.exec_id.is_empty() {
            return self.start_exec(&req.id, &req.exec_id).await;
        }
        let id = req.id;
        let pause = self.with_task(&id, |t| {
            if t.init.state != State::Created {
                return Err(error(
                    Code::FAILED_PRECONDITION,
                    format!("task {id} is not in the created state"),
                ));
            }
            t.init.starting = true;
            Ok(t.pause)
        })?;
        let pid = self.sandbox_pid().await;
        if !pause {
            let started = match self.sandbox().await {
                Ok(sandbox) => sandbox
                    .call(
                        Op::Start {
                            container_id: id.clone(),
                        },
                        CALL_TIMEOUT,
                    )
                    .await
                    .map_err(|e| from_call(&format!("starting task {id}"), e)),
                Err(e) => Err(e),
            };
            if let Err(e) = started {
                let _ = self.with_task(&id, |t| {
                    t.init.starting = false;
                    Ok(())
                });
                return Err(e);
            }
        }
        let deferred = self.with_task(&id, |t| {
            t.init.starting = false;
            if t.init.state == State::Created {
                t.init.state = State::Running;
            }
            Ok(t.init.deferred_exit.take())
        })?;
        self.publish(
            topics::TASK_START_EVENT_TOPIC,
            &TaskStart {
                container_id: id.clone(),
                pid,
                ..Default::default()
            },
        );
        if let Some((at, exit)) = deferred {
            self.on_exit(&id, at, exit).await;
        }
        Ok(api::StartResponse {
            pid,
            ..Default::default()
        })
    }

    async fn kill(&self, _ctx: &TtrpcContext, req: api::KillRequest) -> TtrpcResult<Empty> {
        let (id, signal) = (req.id.clone(), req.signal);
        if !req.exec_id.is_empty() {
            return self.with_task(&id, |t| match t.execs.get_mut(&req.exec_id) {
                Some(exec) if exec.process.ended.is_none() => {
                    if signal != 0 {
                        exec.process.killed_by = Some(signal);
                        exec.cancel.cancel();
                    }
                    Ok(empty())
                }
                Some(_) => Err(error(Code::NOT_FOUND, "process already finished")),
                None => Err(error(
                    Code::NOT_FOUND,
                    format!("exec {} of task {id} not found", req.exec_id),
                )),
            });
        }
        let pid = self.sandbox_pid().await;
        enum Then {
            Nothing,
            Ended(Ended),
            Stop(u64),
        }
        let then = self.with_task(&id, |t| {
            if t.init.ended.is_some() {
                return Err(error(Code::NOT_FOUND, "process already finished"));
            }
            if signal == 0 {
                return Ok(Then::Nothing);
            }
            let at = Timestamp::now();
            // The pause container ends as `pause` does: 0 on SIGINT/SIGTERM.
            if t.pause || t.init.state == State::Created {
                let code = if t.pause && matches!(signal, 2 | 15) {
                    0
                } else {
                    128 + signal
                };
                t.init.end(code, at);
                return Ok(Then::Ended(Ended { code, at }));
            }
            let timeout_ms = match signal {
                9 => 0,
                1 | 2 | 3 | 15 => GRACEFUL_STOP_MS,
                // Other signals have no meaning to a Wasm guest.
                _ => return Ok(Then::Nothing),
            };
            t.init.killed_by = Some(signal);
            Ok(Then::Stop(timeout_ms))
        })?;
        match then {
            Then::Nothing => {}
            Then::Ended(ended) => {
                // A created Wasm container is dropped from the sandbox.
                if !self.with_task(&id, |t| Ok(t.pause))? {
                    self.remove_from_sandbox(&id).await;
                }
                self.publish_exit(&id, &id, pid, ended);
            }
            Then::Stop(timeout_ms) => {
                let sandbox = self.sandbox().await?;
                // The reply comes when the guest has exited: Kill returns at once, and
                // the exit is reported as it happens.
                tokio::spawn(async move {
                    let op = Op::Stop {
                        container_id: id.clone(),
                        timeout_ms,
                    };
                    if let Err(e) = sandbox
                        .call(
                            op,
                            Duration::from_millis(timeout_ms).saturating_add(CALL_TIMEOUT),
                        )
                        .await
                    {
                        tracing::warn!(task = %id, "stopping: {e}");
                    }
                });
            }
        }
        Ok(empty())
    }

    async fn delete(
        &self,
        _ctx: &TtrpcContext,
        req: api::DeleteRequest,
    ) -> TtrpcResult<api::DeleteResponse> {
        let id = req.id.clone();
        let pid = self.sandbox_pid().await;
        if !req.exec_id.is_empty() {
            let ended = self.with_task(&id, |t| {
                match t.execs.get(&req.exec_id).map(|e| e.process.state) {
                    None => Err(error(
                        Code::NOT_FOUND,
                        format!("exec {} of task {id} not found", req.exec_id),
                    )),
                    Some(State::Running) => Err(error(
                        Code::FAILED_PRECONDITION,
                        format!("exec {} is running", req.exec_id),
                    )),
                    Some(_) => Ok(t.execs.remove(&req.exec_id).and_then(|e| e.process.ended)),
                }
            })?;
            return Ok(ended.unwrap_or(Ended::now(0)).delete_response(pid));
        }
        let (pause, bundle, ended) = self.with_task(&id, |t| {
            if t.init.state == State::Running {
                return Err(error(
                    Code::FAILED_PRECONDITION,
                    format!("task {id} is running: kill it first"),
                ));
            }
            Ok((
                t.pause,
                t.bundle.clone(),
                t.init.ended.unwrap_or(Ended::now(0)),
            ))
        })?;
        if !pause {
            self.remove_from_sandbox(&id).await;
        }
        crate::mount::unmount_rootfs(&bundle);
        self.tasks.lock().unwrap().remove(&id);
        self.publish(
            topics::TASK_DELETE_EVENT_TOPIC,
            &TaskDelete {
                container_id: id.clone(),
                id: id.clone(),
                pid,
                exit_status: ended.code,
                exited_at: MessageField::some(timestamp(ended.at)),
                ..Default::default()
            },
        );
        self.end_group_if_idle().await;
        let _ = std::fs::remove_file(bundle.join(SANDBOX_PID_FILE));
        Ok(ended.delete_response(pid))
    }

    async fn wait(
        &self,
        _ctx: &TtrpcContext,
        req: api::WaitRequest,
    ) -> TtrpcResult<api::WaitResponse> {
        let mut exited = self.with_process(&req.id, &req.exec_id, |p| Ok(p.exited.subscribe()))?;
        let _ = exited.wait_for(|e| *e).await;
        let ended = self.with_process(&req.id, &req.exec_id, |p| {
            p.ended
                .ok_or_else(|| error(Code::INTERNAL, "the process ended with no exit recorded"))
        });
        // Deleted in the meantime: it had ended.
        let ended = ended.unwrap_or(Ended::now(KILLED_EXIT_CODE as u32));
        Ok(api::WaitResponse {
            exit_status: ended.code,
            exited_at: MessageField::some(timestamp(ended.at)),
            ..Default::default()
        })
    }

    async fn state(
        &self,
        _ctx: &TtrpcContext,
        req: api::StateRequest,
    ) -> TtrpcResult<api::StateResponse> {
        let pid = self.sandbox_pid().await;
        let bundle = self.with_task(&req.id, |t| Ok(t.bundle.display().to_string()))?;
        self.with_process(&req.id, &req.exec_id, |p| {
            Ok(api::StateResponse {
                id: req.id.clone(),
                bundle,
                pid,
                status: p.state.status().into(),
                stdin: p.io.stdin.clone(),
                stdout: p.io.stdout.clone(),
                stderr: p.io.stderr.clone(),
                terminal: p.io.terminal,
                exit_status: p.ended.map_or(0, |e| e.code),
                exited_at: p
                    .ended
                    .map(|e| timestamp(e.at))
                    .map_or(MessageField::none(), MessageField::some),
                exec_id: req.exec_id.clone(),
                ..Default::default()
            })
        })
    }

    async fn pids(
        &self,
        _ctx: &TtrpcContext,
        req: api::PidsRequest,
    ) -> TtrpcResult<api::PidsResponse> {
        self.with_task(&req.id, |_| Ok(()))?;
        let pid = self.sandbox_pid().await;
        let processes = (pid != 0)
            .then(|| ProcessInfo {
                pid,
                ..Default::default()
            })
            .into_iter()
            .collect();
        Ok(api::PidsResponse {
            processes,
            ..Default::default()
        })
    }

    async fn exec(&self, _ctx: &TtrpcContext, req: api::ExecProcessRequest) -> TtrpcResult<Empty> {
        #[derive(serde::Deserialize)]
        struct ProcessSpec {
            #[serde(default)]
            args: Vec<String>,
            #[serde(default)]
            terminal: bool,
        }
        let process: ProcessSpec = serde_json::from_slice(&req.spec.value).map_err(|e| {
            error(
                Code::INVALID_ARGUMENT,
                format!("exec {}: the process spec: {e}", req.exec_id),
            )
        })?;
        if process.args.is_empty() {
            return Err(error(Code::INVALID_ARGUMENT, "an exec needs args"));
        }
        self.with_task(&req.id, |t| {
            if t.pause {
                return Err(error(
                    Code::FAILED_PRECONDITION,
                    "the pod sandbox runs no program to exec",
                ));
            }
            if t.init.state != State::Running {
                return Err(error(
                    Code::FAILED_PRECONDITION,
                    format!("task {} is not running", req.id),
                ));
            }
            if t.execs.contains_key(&req.exec_id) {
                return Err(error(
                    Code::ALREADY_EXISTS,
                    format!("exec {} exists", req.exec_id),
                ));
            }
            t.execs.insert(
                req.exec_id.clone(),
                ExecProcess {
                    process: Process::new(Io {
                        stdin: req.stdin.clone(),
                        stdout: req.stdout.clone(),
                        stderr: req.stderr.clone(),
                        terminal: req.terminal || process.terminal,
                    }),
                    argv: process.args.clone(),
                    cancel: CancellationToken::new(),
                    close_stdin: CancellationToken::new(),
                },
            );
            Ok(())
        })?;
        self.publish(
            topics::TASK_EXEC_ADDED_EVENT_TOPIC,
            &TaskExecAdded {
                container_id: req.id.clone(),
                exec_id: req.exec_id.clone(),
                ..Default::default()
            },
        );
        Ok(empty())
    }

    async fn resize_pty(
        &self,
        _ctx: &TtrpcContext,
        req: api::ResizePtyRequest,
    ) -> TtrpcResult<Empty> {
        // WASI has no terminal size: nothing to resize, but the process must exist.
        self.with_process(&req.id, &req.exec_id, |_| Ok(empty()))
    }

    async fn close_io(&self, _ctx: &TtrpcContext, req: api::CloseIORequest) -> TtrpcResult<Empty> {
        self.with_task(&req.id, |t| {
            if let Some(exec) = t.execs.get(&req.exec_id) {
                exec.close_stdin.cancel();
            }
            Ok(empty())
        })
    }

    async fn update(&self, _ctx: &TtrpcContext, req: api::UpdateTaskRequest) -> TtrpcResult<Empty> {
        let resources: spec::Resources = serde_json::from_slice(&req.resources.value)
            .map_err(|e| error(Code::INVALID_ARGUMENT, format!("the resources: {e}")))?;
        let pause = self.with_task(&req.id, |t| Ok(t.pause))?;
        {
            let group = self.group.lock().await;
            if let Some(g) = group.as_ref()
                && g.cgroup_owner == req.id
                && let Some(c) = &g.cgroup
            {
                c.apply(&resources)
                    .map_err(|e| error(Code::INTERNAL, format!("{e:#}")))?;
            }
        }
        if !pause && let Some(limit) = resources.memory_limit() {
            self.sandbox()
                .await?
                .call(
                    Op::Update {
                        container_id: req.id.clone(),
                        memory_limit_bytes: Some(limit),
                    },
                    CALL_TIMEOUT,
                )
                .await
                .map_err(|e| from_call(&format!("updating task {}", req.id), e))?;
        }
        Ok(empty())
    }

    async fn stats(
        &self,
        _ctx: &TtrpcContext,
        req: api::StatsRequest,
    ) -> TtrpcResult<api::StatsResponse> {
        self.with_task(&req.id, |_| Ok(()))?;
        let metrics = {
            let group = self.group.lock().await;
            match group.as_ref().and_then(|g| g.cgroup.as_ref()) {
                Some(c) => c.metrics(),
                None => {
                    return Err(error(
                        Code::NOT_FOUND,
                        format!("task {} has no cgroup (no linux.cgroupsPath)", req.id),
                    ));
                }
            }
        };
        let value = metrics
            .write_to_bytes()
            .map_err(|e| error(Code::INTERNAL, e))?;
        Ok(api::StatsResponse {
            stats: MessageField::some(Any {
                type_url: "io.containerd.cgroups.v1.Metrics".into(),
                value,
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    async fn connect(
        &self,
        _ctx: &TtrpcContext,
        req: api::ConnectRequest,
    ) -> TtrpcResult<api::ConnectResponse> {
        self.with_task(&req.id, |_| Ok(()))?;
        Ok(api::ConnectResponse {
            shim_pid: std::process::id(),
            task_pid: self.sandbox_pid().await,
            version: env!("CARGO_PKG_VERSION").into(),
            ..Default::default()
        })
    }

    async fn shutdown(&self, _ctx: &TtrpcContext, req: api::ShutdownRequest) -> TtrpcResult<Empty> {
        // containerd asks after every Delete; the shim ends with its last task.
        if !req.now && !self.tasks.lock().unwrap().is_empty() {
            return Ok(empty());
        }
        self.end_group_if_idle().await;
        self.finished.notify_one();
        Ok(empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(code: i32, reason: &str) -> Exit {
        Exit {
            code,
            reason: reason.into(),
            message: String::new(),
        }
    }

    #[test]
    fn a_guest_kill_cancelled_exits_as_the_signal_would() {
        assert_eq!(exit_status(&exit(0, "Completed"), None), 0);
        assert_eq!(
            exit_status(&exit(3, "Error"), Some(15)),
            3,
            "its own code when it exited by itself"
        );
        assert_eq!(exit_status(&exit(137, "Error"), Some(15)), 143);
        assert_eq!(exit_status(&exit(137, "Error"), Some(9)), 137);
        assert_eq!(exit_status(&exit(137, "OOMKilled"), Some(15)), 137);
        assert_eq!(exit_status(&exit(-1, "Error"), None), 255);
    }

    #[test]
    fn stdio_is_a_fifo_or_a_file_uri() {
        assert_eq!(fifo_path("").unwrap(), None);
        assert_eq!(
            fifo_path("/run/x/stdout").unwrap(),
            Some("/run/x/stdout".into())
        );
        assert_eq!(
            fifo_path("file:///var/log/a").unwrap(),
            Some("/var/log/a".into())
        );
        assert!(fifo_path("binary:///usr/bin/logger").is_err());
    }
}
