//! The sandbox process: one per Wasm pod, running each container as a wasmtime store.
//!
//! The node starts it as `<program> [args] --cache-dir DIR --pod-uid UID --socket PATH
//! [--netns PATH]`, reads [`LISTENING`] on its standard output once it listens
//! ([`wait_listening`]), and speaks the [`crate::protocol`] over that socket. The sandbox outlives the node's
//! connection (the node may crash and come back to adopt it) and ends on
//! [`Op::Shutdown`]. Guests run as async tasks; the engine's epoch advances every
//! [`EPOCH_TICK`] while a guest runs Wasm (slower, up to [`IDLE_TICK`], while none
//! does: `epoch`), and at each tick a guest yields, so a stop cancels even a guest that
//! never makes a host call. A guest that imports [`STOP_INTERFACE`] handles its stop
//! itself, as a process that installed a SIGTERM handler: a stop raises its flag and
//! waits for the guest to exit until the grace period is spent, then cancels it. A guest
//! that does not import it is cancelled at once, as SIGTERM's default action ends a
//! process. A guest that traps ends its own container; one that brings
//! the process down (the kernel's OOM killer, a crash in the host) ends this pod's
//! sandbox only — the node sees the connection close and reports it.
//!
//! The node starts the process already in the pod's cgroup, with the pod's
//! `oom_score_adj` ([`crate::cgroup`]): all of a pod's containers share that one cgroup,
//! since they are tasks on this process's thread pool, not processes of their own.
//!
//! An exec ([`Op::Exec`]: exec probes, exec lifecycle hooks) runs a *new instance* of
//! a running container's own program — the module or component its image holds, already
//! linked when the container was created — in this process, with the exec's command as
//! `argv` (`command[0]` is `argv[0]`), the container's environment, its preopened
//! directories with the same permissions, and the same network grants. The instance has
//! a store of its own with the container's memory limit, its stdout and stderr are
//! captured (the first [`EXEC_OUTPUT_LIMIT`] bytes of each; the rest is dropped) and sent
//! back with its exit code, mapped as a container's is. It is no container: it is never
//! listed and sends no `Started`/`Exited`. At its timeout, when the container ends, or
//! when the node's connection closes, it is dropped at its next epoch tick as a stop
//! cancels a guest; it never sees the stop signal (as an exec'd process does not get the
//! SIGTERM sent to a container's first process).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use wasmtime::component::ResourceTable;
use wasmtime::error::Context as _;
use wasmtime::{Engine, ResourceLimiter, Store};
use wasmtime_wasi::cli::AsyncStdinStream;
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::bindings::CommandPre;
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use crate::crilog::{CriLog, Stream};
use crate::engine::{self, Compiled};
use crate::protocol::{
    ContainerReport, ContainerSpec, EXEC_OUTPUT_LIMIT, ErrorKind, ExecOutput, Exit,
    KILLED_EXIT_CODE, Message, Op, ReportState, Request, TRAP_EXIT_CODE,
};
use crate::stdio::{AttachHub, Capture, GuestOutput, Terminal};

mod epoch;
mod http;
mod ready;
mod stream;
pub mod zygote;

pub use http::{DEFAULT_HTTP_PORT, MAX_CONCURRENCY as HTTP_MAX_CONCURRENCY};
pub use ready::{LISTENING, NotListening, Starting, wait_listening, wait_listening_of};

use epoch::Epoch;
pub use epoch::{EPOCH_TICK, IDLE_TICK};

/// The cooperative stop signal a guest may import: `requested: func() -> bool` (for a
/// core module, a function of no parameters returning an `i32`, 1 once a stop was
/// requested). The WIT is `runtimes/wasm/wit/lifecycle.wit`.
pub const STOP_INTERFACE: &str = "wasmlet:lifecycle/stop@0.1.0";
/// Whether an import names [`STOP_INTERFACE`] at a compatible version (`0.1.x`: a
/// component linked against a later patch release links through semver matching).
fn imports_stop(name: &str) -> bool {
    name.strip_prefix("wasmlet:lifecycle/stop@0.1.")
        .is_some_and(|patch| !patch.is_empty() && patch.chars().all(|c| c.is_ascii_digit()))
}

/// The one function of [`STOP_INTERFACE`].
pub const STOP_FUNCTION: &str = "requested";

/// A host module linked only in debug builds started with `--fault-injection`: its
/// [`FAULT_SYSCALL`] `(i64) -> i64` makes the system call of that number with every
/// argument zero and returns its result (`-errno` on failure). It stands in for host
/// code an engine bug let a guest run, to show what [`crate::confine`] does with it.
pub const FAULT_INTERFACE: &str = "wasmlet:fault/host";
/// The one function of [`FAULT_INTERFACE`].
pub const FAULT_SYSCALL: &str = "syscall";

/// Entry point of the sandbox process. `args` excludes the program name. Started
/// with [`zygote::FLAG`] first, the process is a zygote instead, which forks
/// sandboxes (see [`zygote`]).
pub fn main(args: impl IntoIterator<Item = String>) -> ExitCode {
    let mut args = args.into_iter().peekable();
    if args.peek().map(String::as_str) == Some(zygote::FLAG) {
        args.next();
        return zygote::main(args);
    }
    match Options::parse(args) {
        Ok(options) => run_sandbox(options, None),
        Err(code) => code,
    }
}

/// A sandbox's command line.
struct Options {
    cache_dir: PathBuf,
    socket: PathBuf,
    stream_socket: Option<PathBuf>,
    pod_uid: String,
    netns: Option<PathBuf>,
    unshare_net: bool,
    mount_namespace: bool,
    credentials: crate::confine::Credentials,
    fault_injection: bool,
    /// The pod cgroup's `cgroup.procs` files, one per hierarchy, that a forked sandbox
    /// joins first thing (one the node starts itself is placed before it runs).
    join_cgroup: Vec<PathBuf>,
}

impl Options {
    /// Parses the command line; on an error, says what is wrong and gives the exit code.
    fn parse(args: impl IntoIterator<Item = String>) -> Result<Self, ExitCode> {
        let mut cache_dir = None;
        let mut socket = None;
        let mut stream_socket = None;
        let mut pod_uid = String::new();
        let mut netns = None;
        let mut unshare_net = false;
        let mut mount_namespace = false;
        let mut credentials = crate::confine::Credentials::default();
        let mut fault_injection = false;
        let mut join_cgroup = Vec::new();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--cache-dir" => cache_dir = args.next().map(PathBuf::from),
                "--pod-uid" => pod_uid = args.next().unwrap_or_default(),
                "--socket" => socket = args.next().map(PathBuf::from),
                "--stream-socket" => stream_socket = args.next().map(PathBuf::from),
                "--netns" => netns = args.next().map(PathBuf::from),
                // A new network namespace of its own (a container runtime's when the
                // spec asks for one without naming it).
                "--unshare-net" => unshare_net = true,
                // A mount namespace of its own (see `crate::confine`). The node and the
                // containerd shim pass it; the shim shares the root filesystems it mounts
                // later through a mount with shared propagation.
                "--mount-namespace" => mount_namespace = true,
                "--join-cgroup" => join_cgroup.extend(args.next().map(PathBuf::from)),
                // Whom to run as (the pod's runAsUser, runAsGroup, fsGroup and
                // supplementalGroups), switched to before the first guest runs.
                "--user" | "--group" | "--groups" => {
                    let value = args.next().unwrap_or_default();
                    let id = |v: &str| v.parse::<u32>().map_err(|e| format!("{arg} {v:?}: {e}"));
                    let parsed = match arg.as_str() {
                        "--user" => id(&value).map(|uid| credentials.uid = Some(uid)),
                        "--group" => id(&value).map(|gid| credentials.gid = Some(gid)),
                        _ => value
                            .split(',')
                            .map(id)
                            .collect::<Result<_, _>>()
                            .map(|groups| credentials.groups = groups),
                    };
                    if let Err(e) = parsed {
                        eprintln!("wasmlet sandbox: {e}");
                        return Err(ExitCode::from(2));
                    }
                }
                // Debug builds only: links `FAULT_INTERFACE` for the tests that show what
                // the confinement does when host code misbehaves.
                "--fault-injection" if cfg!(debug_assertions) => fault_injection = true,
                other => {
                    eprintln!("wasmlet sandbox: unknown argument {other:?}");
                    return Err(ExitCode::from(2));
                }
            }
        }
        let Some(cache_dir) = cache_dir else {
            eprintln!("wasmlet sandbox: --cache-dir is required");
            return Err(ExitCode::from(2));
        };
        let Some(socket) = socket else {
            eprintln!("wasmlet sandbox: --socket is required");
            return Err(ExitCode::from(2));
        };
        Ok(Options {
            cache_dir,
            socket,
            stream_socket,
            pod_uid,
            netns,
            unshare_net,
            mount_namespace,
            credentials,
            fault_injection,
            join_cgroup,
        })
    }
}

/// Runs a sandbox until it is shut down, with the engine and linkers `prebuilt` by
/// a zygote it was forked from, or built here.
fn run_sandbox(options: Options, prebuilt: Option<Prebuilt>) -> ExitCode {
    let Options {
        cache_dir,
        socket,
        stream_socket,
        pod_uid,
        netns,
        unshare_net,
        mount_namespace,
        credentials,
        fault_injection,
        join_cgroup,
    } = options;
    // Into the pod cgroup before anything is charged to it, or to another.
    for procs in &join_cgroup {
        if let Err(e) = std::fs::write(procs, b"0") {
            eprintln!(
                "wasmlet sandbox for pod {pod_uid}: joining the pod cgroup through {}: {e}",
                procs.display()
            );
            return ExitCode::FAILURE;
        }
    }
    // The pod's network namespace, entered while this is the only thread: every thread
    // started later, and so every guest, is in it.
    if let Some(netns) = &netns
        && let Err(e) = crate::network::netns::enter(netns)
    {
        eprintln!(
            "wasmlet sandbox for pod {pod_uid}: entering the network namespace {}: {e}",
            netns.display()
        );
        return ExitCode::FAILURE;
    }
    if unshare_net && let Err(e) = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET) {
        eprintln!("wasmlet sandbox for pod {pod_uid}: a new network namespace: {e}");
        return ExitCode::FAILURE;
    }
    let listeners = match Listeners::bind(socket, stream_socket) {
        Ok(listeners) => listeners,
        Err(e) => {
            eprintln!("wasmlet sandbox for pod {pod_uid}: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    // Still the only thread: every thread started below inherits the confinement.
    let confinement = crate::confine::Confinement {
        mount_namespace,
        own_network_namespace: netns.is_some() || unshare_net,
        credentials,
    };
    if let Err(e) = crate::confine::confine(&confinement) {
        eprintln!("wasmlet sandbox for pod {pod_uid}: confining the process: {e}");
        return ExitCode::FAILURE;
    }
    // The zygote's linkers lack the fault-injection function a test asks for.
    let prebuilt = match prebuilt.filter(|_| !fault_injection) {
        Some(p) => p,
        None => match Prebuilt::build(fault_injection) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("wasmlet sandbox for pod {pod_uid}: {e:#}");
                return ExitCode::FAILURE;
            }
        },
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("wasmlet sandbox: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(serve(cache_dir, listeners, prebuilt)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wasmlet sandbox for pod {pod_uid}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// What every sandbox builds before it serves, the same in all: the engine and the
/// linkers. A zygote builds them once, and every sandbox forked from it shares them.
pub(crate) struct Prebuilt {
    engine: Engine,
    linkers: Linkers,
}

impl Prebuilt {
    pub(crate) fn build(fault_injection: bool) -> wasmtime::Result<Self> {
        let engine = engine::new_engine()?;
        let mut module = wasmtime::Linker::new(&engine);
        wasmtime_wasi::p1::add_to_linker_async(&mut module, |s: &mut P1State| &mut s.wasi)?;
        if fault_injection {
            module.func_wrap(FAULT_INTERFACE, FAULT_SYSCALL, |number: i64| -> i64 {
                crate::sys::raw_syscall(number)
            })?;
        }
        module.func_wrap(
            STOP_INTERFACE,
            STOP_FUNCTION,
            |caller: wasmtime::Caller<'_, P1State>| -> i32 {
                caller.data().stop.load(Ordering::Relaxed).into()
            },
        )?;
        let mut component = wasmtime::component::Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut component)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut component)?;
        component.root().instance(STOP_INTERFACE)?.func_wrap(
            STOP_FUNCTION,
            |store: wasmtime::StoreContextMut<'_, P2State>, (): ()| {
                Ok((store.data().stop.load(Ordering::Relaxed),))
            },
        )?;
        Ok(Prebuilt {
            engine,
            linkers: Linkers { module, component },
        })
    }
}

struct Sandbox {
    engine: Engine,
    epoch: Epoch,
    cache_dir: PathBuf,
    linkers: Linkers,
    containers: Mutex<HashMap<String, Slot>>,
    out: mpsc::UnboundedSender<Outgoing>,
    /// Fired by [`Op::Shutdown`] once every container has stopped.
    shutdown: CancellationToken,
}

struct Linkers {
    module: wasmtime::Linker<P1State>,
    component: wasmtime::component::Linker<P2State>,
}

enum Slot {
    Created(Box<Prepared>),
    Running {
        /// Cancelled to stop the guest, and once it has ended, so its execs end with it.
        cancel: CancellationToken,
        /// Raised by a stop; `Some` when the guest observes it.
        stop: Option<Arc<AtomicBool>>,
        exited: watch::Receiver<bool>,
        started_at: Timestamp,
        /// The container's program and spec, which an exec runs again.
        prepared: Arc<Prepared>,
        /// The guest's memory cap and use, which an update changes in place.
        memory: Arc<MemoryCap>,
        /// Its log file, which a rotation reopens.
        log: CriLog,
        /// Its attached clients and its stdin.
        attached: Arc<AttachHub>,
    },
    Exited {
        started_at: Timestamp,
        finished_at: Timestamp,
        exit: Exit,
    },
}

struct Prepared {
    spec: ContainerSpec,
    program: Program,
    /// Whether the guest imports [`STOP_INTERFACE`].
    observes_stop: bool,
}

enum Program {
    Module(wasmtime::InstancePre<P1State>),
    Component(CommandPre<P2State>),
    /// A `wasi:http/proxy` component, served over HTTP ([`http`]).
    Proxy(wasmtime_wasi_http::p2::bindings::ProxyPre<P2State>),
}

/// Whether a component export names `wasi:http/incoming-handler` at 0.2.x.
fn exports_incoming_handler(name: &str) -> bool {
    name.starts_with("wasi:http/incoming-handler@0.2.")
}

/// What a successful request answers.
#[derive(Default)]
struct Answer {
    /// For [`Op::List`].
    containers: Vec<ContainerReport>,
    /// For [`Op::Exec`].
    exec: Option<ExecOutput>,
    /// For [`Op::Start`]: fired once the reply is written, which lets the guest run.
    /// A guest that ends its sandbox at once (a forbidden system call, say) must not
    /// take the answer with it: the node would see a failed start of a container that
    /// did start.
    after_reply: Option<oneshot::Sender<()>>,
}

/// A message for the node and, when the sender waits for it, a signal fired once it
/// is written (or dropped because no node is connected).
struct Outgoing {
    message: Message,
    written: Option<oneshot::Sender<()>>,
}

impl Sandbox {
    fn send(&self, message: Message) {
        let _ = self.out.send(Outgoing {
            message,
            written: None,
        });
    }
}

/// A failure the node tells apart from an internal one (see [`ErrorKind`]).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
struct Refusal {
    kind: ErrorKind,
    message: String,
}

fn refuse(kind: ErrorKind, message: impl Into<String>) -> wasmtime::Error {
    wasmtime::Error::new(Refusal {
        kind,
        message: message.into(),
    })
}

/// The sandbox's sockets: the node's control connection, and its streams (attach,
/// exec with a terminal). Bound while the process may still make files where the node
/// asked (the sandbox's directory is the node's, closed to a pod's user), listening
/// only once it is confined: the node, which waits until it can connect, never talks
/// to a sandbox that is not.
struct Listeners {
    socket: PathBuf,
    control: std::os::fd::OwnedFd,
    streams: Option<(std::os::fd::OwnedFd, PathBuf)>,
}

impl Listeners {
    fn bind(socket: PathBuf, stream_socket: Option<PathBuf>) -> wasmtime::Result<Self> {
        use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr};
        let bind = |path: &PathBuf| {
            let _ = std::fs::remove_file(path);
            let fd = nix::sys::socket::socket(
                AddressFamily::Unix,
                SockType::Stream,
                SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
                None,
            )?;
            let addr = UnixAddr::new(path.as_path())?;
            nix::sys::socket::bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr)
                .with_context(|| format!("binding {}", path.display()))?;
            wasmtime::Result::<_>::Ok(fd)
        };
        let control = bind(&socket)?;
        let streams = match stream_socket {
            Some(path) => Some((bind(&path)?, path)),
            None => None,
        };
        Ok(Listeners {
            socket,
            control,
            streams,
        })
    }
}

/// Starts listening on a bound socket.
fn listen(
    fd: std::os::fd::OwnedFd,
    path: &std::path::Path,
) -> wasmtime::Result<tokio::net::UnixListener> {
    nix::sys::socket::listen(&fd, nix::sys::socket::Backlog::MAXCONN)
        .with_context(|| format!("listening on {}", path.display()))?;
    Ok(tokio::net::UnixListener::from_std(
        std::os::unix::net::UnixListener::from(fd),
    )?)
}

async fn serve(
    cache_dir: PathBuf,
    listeners: Listeners,
    prebuilt: Prebuilt,
) -> wasmtime::Result<()> {
    let Listeners {
        socket,
        control,
        streams,
    } = listeners;
    let Prebuilt { engine, linkers } = prebuilt;

    let epoch = Epoch::start(&engine).context("starting the epoch thread")?;

    // The node's side of the socket is the only one to answer; messages sent while no
    // node is connected are dropped (its next run asks for the states with `List`).
    // The stream socket first: the node connects to it only after the control socket.
    let (stream_socket, streams) = match streams {
        Some((fd, path)) => {
            let l = listen(fd, &path)?;
            (Some(path), Some(l))
        }
        None => (None, None),
    };
    let listener = listen(control, &socket)?;
    ready::announce();
    let connection: Arc<tokio::sync::Mutex<Option<OwnedWriteHalf>>> = Arc::default();
    let (out, mut out_rx) = mpsc::unbounded_channel::<Outgoing>();
    let shutdown = CancellationToken::new();
    let writer = tokio::spawn({
        let connection = connection.clone();
        let shutdown = shutdown.clone();
        async move {
            loop {
                let msg = tokio::select! {
                    biased;
                    msg = out_rx.recv() => msg,
                    // Everything sent before the shutdown (its reply last) is queued:
                    // write it out and stop.
                    () = shutdown.cancelled() => out_rx.try_recv().ok(),
                };
                let Some(Outgoing { message, written }) = msg else {
                    return;
                };
                let mut line = serde_json::to_vec(&message).expect("messages serialize");
                line.push(b'\n');
                let mut conn = connection.lock().await;
                if let Some(w) = conn.as_mut()
                    && (w.write_all(&line).await.is_err() || w.flush().await.is_err())
                {
                    *conn = None;
                }
                if let Some(written) = written {
                    let _ = written.send(());
                }
            }
        }
    });

    let sandbox = Arc::new(Sandbox {
        engine,
        epoch,
        cache_dir,
        linkers,
        containers: Mutex::new(HashMap::new()),
        out,
        shutdown: shutdown.clone(),
    });

    if let Some(streams) = streams {
        let sandbox = sandbox.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    accepted = streams.accept() => match accepted {
                        Ok((conn, _)) => {
                            tokio::spawn(stream::serve(sandbox.clone(), conn));
                        }
                        Err(e) => eprintln!("wasmlet sandbox: accepting a stream connection: {e}"),
                    },
                }
            }
        });
    }

    loop {
        let stream = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    eprintln!("wasmlet sandbox: accepting a connection: {e}");
                    continue;
                }
            },
        };
        let (read, write) = stream.into_split();
        // A new node replaces the old one's connection.
        *connection.lock().await = Some(write);
        tokio::spawn(read_requests(sandbox.clone(), read));
    }

    // Shutdown: every container has been stopped; flush the last messages and leave.
    drop(sandbox);
    let _ = tokio::time::timeout(Duration::from_secs(1), writer).await;
    if let Some(mut w) = connection.lock().await.take() {
        let _ = w.shutdown().await;
    }
    let _ = std::fs::remove_file(&socket);
    if let Some(path) = &stream_socket {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// Serves one connection's requests until it closes. The pods keep running.
async fn read_requests(sandbox: Arc<Sandbox>, read: OwnedReadHalf) {
    // Cancelled when the connection closes: an exec whose answer nobody can hear ends.
    let closed = CancellationToken::new();
    let _close = closed.clone().drop_guard();
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let request: Request = match serde_json::from_str(&line) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("wasmlet sandbox: ignoring malformed request {line:?}: {e}");
                continue;
            }
        };
        let sandbox = sandbox.clone();
        let closed = closed.clone();
        tokio::spawn(async move {
            let id = request.id;
            let shutdown = request.op == Op::Shutdown;
            let (answer, error, error_kind) = match sandbox.handle(request.op, &closed).await {
                Ok(answer) => (answer, None, None),
                Err(e) => (
                    Answer::default(),
                    Some(format!("{e:#}")),
                    e.downcast_ref::<Refusal>().map(|r| r.kind),
                ),
            };
            if let Some(error) = error.as_ref().filter(|_| closed.is_cancelled()) {
                // Its node is gone; the log is the only place left to say it.
                eprintln!(
                    "wasmlet sandbox: request {id} ended after its connection closed: {error}"
                );
            }
            let _ = sandbox.out.send(Outgoing {
                message: Message::Reply {
                    id,
                    error,
                    error_kind,
                    containers: answer.containers,
                    exec: answer.exec,
                },
                written: answer.after_reply,
            });
            if shutdown {
                sandbox.shutdown.cancel();
            }
        });
    }
}

impl Sandbox {
    async fn handle(
        self: &Arc<Self>,
        op: Op,
        closed: &CancellationToken,
    ) -> wasmtime::Result<Answer> {
        match op {
            Op::List => Ok(Answer {
                containers: self.report(),
                ..Answer::default()
            }),
            Op::Exec {
                container_id,
                argv,
                timeout_ms,
            } => {
                let timeout = (timeout_ms > 0).then(|| Duration::from_millis(timeout_ms));
                let exec = self.exec(&container_id, argv, timeout, closed).await?;
                Ok(Answer {
                    exec: Some(exec),
                    ..Answer::default()
                })
            }
            Op::Shutdown => {
                let running: Vec<_> = self
                    .containers
                    .lock()
                    .unwrap()
                    .values()
                    .filter_map(|s| match s {
                        Slot::Running { cancel, exited, .. } => {
                            Some((cancel.clone(), exited.clone()))
                        }
                        _ => None,
                    })
                    .collect();
                self.epoch.hurry();
                for (cancel, mut exited) in running {
                    cancel.cancel();
                    let _ = exited.wait_for(|e| *e).await;
                }
                Ok(Answer::default())
            }
            Op::Create { container_id, spec } => {
                if self.containers.lock().unwrap().contains_key(&container_id) {
                    wasmtime::bail!("container {container_id} already exists");
                }
                let this = self.clone();
                let prepared = tokio::task::spawn_blocking(move || this.prepare(*spec))
                    .await
                    .context("preparing the container panicked")??;
                let mut containers = self.containers.lock().unwrap();
                if containers.contains_key(&container_id) {
                    wasmtime::bail!("container {container_id} already exists");
                }
                containers.insert(container_id, Slot::Created(Box::new(prepared)));
                Ok(Answer::default())
            }
            Op::Start { container_id } => self.start(container_id).map(|go| Answer {
                after_reply: Some(go),
                ..Answer::default()
            }),
            Op::ReopenLog { container_id } => {
                self.reopen_log(&container_id).map(|()| Answer::default())
            }
            Op::Update {
                container_id,
                memory_limit_bytes,
            } => self
                .update(&container_id, memory_limit_bytes)
                .map(|()| Answer::default()),
            Op::Stop {
                container_id,
                timeout_ms,
            } => {
                // A guest that observes the stop signal gets the grace period to exit
                // by itself; then (or at once, for one that does not) it is cancelled at
                // its next epoch tick.
                let running = {
                    let containers = self.containers.lock().unwrap();
                    match containers.get(&container_id) {
                        None => wasmtime::bail!("container {container_id} not found"),
                        Some(Slot::Running {
                            cancel,
                            stop,
                            exited,
                            ..
                        }) => Some((cancel.clone(), stop.clone(), exited.clone())),
                        Some(_) => None,
                    }
                };
                if let Some((cancel, stop, mut exited)) = running {
                    if let Some(stop) = stop {
                        stop.store(true, Ordering::Relaxed);
                        let grace = Duration::from_millis(timeout_ms);
                        let _ = tokio::time::timeout(grace, exited.wait_for(|e| *e)).await;
                    }
                    self.epoch.hurry();
                    cancel.cancel();
                    let _ = exited.wait_for(|e| *e).await;
                }
                Ok(Answer::default())
            }
            Op::Remove { container_id } => {
                let mut containers = self.containers.lock().unwrap();
                match containers.get(&container_id) {
                    Some(Slot::Running { .. }) => {
                        wasmtime::bail!("container {container_id} is running; stop it first")
                    }
                    _ => {
                        containers.remove(&container_id);
                        Ok(Answer::default())
                    }
                }
            }
        }
    }

    /// Every container's state, for a node that (re)connects.
    fn report(&self) -> Vec<ContainerReport> {
        let containers = self.containers.lock().unwrap();
        let mut reports: Vec<ContainerReport> = containers
            .iter()
            .map(|(id, slot)| {
                let (state, started_at, finished_at, exit) = match slot {
                    Slot::Created(_) => (ReportState::Created, None, None, None),
                    Slot::Running { started_at, .. } => {
                        (ReportState::Running, Some(*started_at), None, None)
                    }
                    Slot::Exited {
                        started_at,
                        finished_at,
                        exit,
                    } => (
                        ReportState::Exited,
                        Some(*started_at),
                        Some(*finished_at),
                        Some(exit.clone()),
                    ),
                };
                ContainerReport {
                    container_id: id.clone(),
                    state,
                    started_at,
                    finished_at,
                    exit,
                }
            })
            .collect();
        reports.sort_by(|a, b| a.container_id.cmp(&b.container_id));
        reports
    }

    fn prepare(&self, spec: ContainerSpec) -> wasmtime::Result<Prepared> {
        let compiled = engine::load(
            &self.engine,
            &self.cache_dir,
            &spec.wasm_path,
            &spec.wasm_digest,
            spec.kind,
        )?;
        let observes_stop = match &compiled {
            Compiled::Module(m) => m.imports().any(|i| imports_stop(i.module())),
            Compiled::Component(c) => c
                .component_type()
                .imports(&self.engine)
                .any(|(name, _)| imports_stop(name)),
        };
        let program = match compiled {
            Compiled::Module(m) => Program::Module(
                self.linkers
                    .module
                    .instantiate_pre(&m)
                    .context("linking the module against WASI preview 1")?,
            ),
            Compiled::Component(c) => {
                let pre = self
                    .linkers
                    .component
                    .instantiate_pre(&c)
                    .context("linking the component against WASI preview 2")?;
                let proxy = c
                    .component_type()
                    .exports(&self.engine)
                    .any(|(name, _)| exports_incoming_handler(name));
                if proxy {
                    Program::Proxy(
                        wasmtime_wasi_http::p2::bindings::ProxyPre::new(pre)
                            .context("the component is not a wasi:http/proxy")?,
                    )
                } else {
                    Program::Component(CommandPre::new(pre).context(
                        "the component is neither a wasi:cli/command nor a wasi:http/proxy",
                    )?)
                }
            }
        };
        Ok(Prepared {
            spec,
            program,
            observes_stop,
        })
    }

    /// Changes a container's memory limit: a created one's spec, a running one's cap
    /// in place.
    fn update(&self, container_id: &str, limit: Option<u64>) -> wasmtime::Result<()> {
        let mut containers = self.containers.lock().unwrap();
        match containers.get_mut(container_id) {
            Some(Slot::Created(prepared)) => {
                prepared.spec.memory_limit_bytes = limit;
                Ok(())
            }
            Some(Slot::Running { memory, .. }) => memory.set_limit(limit).map_err(|used| {
                refuse(
                    ErrorKind::FailedPrecondition,
                    format!(
                        "container {container_id}: a memory limit of {} bytes is below the {used} \
                         bytes its linear memories use, and Wasm memory cannot shrink",
                        limit.unwrap_or_default()
                    ),
                )
            }),
            Some(Slot::Exited { .. }) => Err(refuse(
                ErrorKind::FailedPrecondition,
                format!("container {container_id} has exited"),
            )),
            None => Err(refuse(
                ErrorKind::FailedPrecondition,
                format!("container {container_id} is not in this sandbox"),
            )),
        }
    }

    /// Reopens a running container's log file at its path (see [`CriLog::reopen`]).
    /// Refused unless the container runs: one that has exited writes nothing more.
    fn reopen_log(&self, container_id: &str) -> wasmtime::Result<()> {
        let log = match self.containers.lock().unwrap().get(container_id) {
            Some(Slot::Running { log, .. }) => log.clone(),
            Some(_) => {
                return Err(refuse(
                    ErrorKind::FailedPrecondition,
                    format!("container {container_id} is not running"),
                ));
            }
            None => {
                return Err(refuse(
                    ErrorKind::FailedPrecondition,
                    format!("container {container_id} is not in this sandbox"),
                ));
            }
        };
        log.reopen()
            .with_context(|| format!("reopening the log of container {container_id}"))
    }

    /// Starts the container's guest once the returned sender fires (or is dropped).
    fn start(self: &Arc<Self>, container_id: String) -> wasmtime::Result<oneshot::Sender<()>> {
        let mut containers = self.containers.lock().unwrap();
        let prepared = match containers.remove(&container_id) {
            Some(Slot::Created(p)) => p,
            Some(other) => {
                containers.insert(container_id.clone(), other);
                wasmtime::bail!("container {container_id} is not in the created state");
            }
            None => wasmtime::bail!("container {container_id} not found"),
        };
        let opened = match &prepared.spec.fifos {
            Some(fifos) => open_fifos(fifos),
            None => CriLog::create(&prepared.spec.log_path).map_err(|e| {
                format!(
                    "cannot open log file {}: {e}",
                    prepared.spec.log_path.display()
                )
            }),
        };
        let log = match opened {
            Ok(log) => log,
            Err(e) => {
                containers.insert(container_id, Slot::Created(prepared));
                wasmtime::bail!("{e}");
            }
        };
        let prepared: Arc<Prepared> = Arc::from(prepared);
        let memory = Arc::new(MemoryCap::new(prepared.spec.memory_limit_bytes));
        let cancel = CancellationToken::new();
        let stop = Arc::new(AtomicBool::new(false));
        let (exited_tx, exited_rx) = watch::channel(false);
        let (attached, stdin) = AttachHub::new(prepared.spec.stdin, prepared.spec.stdin_once);
        let started_at = Timestamp::now();
        containers.insert(
            container_id.clone(),
            Slot::Running {
                cancel: cancel.clone(),
                stop: prepared.observes_stop.then(|| stop.clone()),
                exited: exited_rx,
                started_at,
                prepared: prepared.clone(),
                memory: memory.clone(),
                log: log.clone(),
                attached: attached.clone(),
            },
        );
        drop(containers);

        let this = self.clone();
        self.send(Message::Started {
            container_id: container_id.clone(),
            at: started_at,
        });
        let (go, ready) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let exit = tokio::select! {
                exit = async {
                    let _ = ready.await;
                    run(&this, &prepared, &log, attached, stdin, stop, memory).await
                } => exit,
                () = cancel.cancelled() => Exit {
                    code: KILLED_EXIT_CODE,
                    reason: "Error".into(),
                    message: "stopped by the node".into(),
                },
            };
            // Its execs end with it.
            cancel.cancel();
            let _ = log.close();
            let finished_at = Timestamp::now();
            this.containers.lock().unwrap().insert(
                container_id.clone(),
                Slot::Exited {
                    started_at,
                    finished_at,
                    exit: exit.clone(),
                },
            );
            this.send(Message::Exited {
                container_id,
                at: finished_at,
                exit,
            });
            let _ = exited_tx.send(true);
        });
        Ok(go)
    }

    /// What an exec of `argv` in `container_id` runs: refused unless the container
    /// runs and `argv[0]` names its program ([`program_names`]).
    fn exec_target(&self, container_id: &str, argv: &[String]) -> wasmtime::Result<ExecTarget> {
        let Some(command) = argv.first() else {
            return Err(refuse(
                ErrorKind::InvalidArgument,
                "an exec needs a command",
            ));
        };
        let containers = self.containers.lock().unwrap();
        let (prepared, ended, limit) = match containers.get(container_id) {
            Some(Slot::Running {
                prepared,
                cancel,
                memory,
                ..
            }) => (prepared.clone(), cancel.clone(), memory.limit()),
            Some(_) => {
                return Err(refuse(
                    ErrorKind::FailedPrecondition,
                    format!("container {container_id} is not running: cannot exec in it"),
                ));
            }
            None => {
                return Err(refuse(
                    ErrorKind::FailedPrecondition,
                    format!("container {container_id} is not in this sandbox"),
                ));
            }
        };
        if matches!(prepared.program, Program::Proxy(_)) {
            return Err(refuse(
                ErrorKind::InvalidArgument,
                format!(
                    "container {}: a wasi:http/proxy component has no command to exec",
                    prepared.spec.name
                ),
            ));
        }
        let names = if prepared.spec.program_names.is_empty() {
            program_names(prepared.spec.argv.first().map_or("", String::as_str))
        } else {
            prepared.spec.program_names.clone()
        };
        if !names.iter().any(|n| n == command) {
            return Err(refuse(
                ErrorKind::InvalidArgument,
                format!(
                    "container {}: {command:?} is not a program its image holds; it holds one, \
                     run as {}",
                    prepared.spec.name,
                    names
                        .iter()
                        .map(|n| format!("{n:?}"))
                        .collect::<Vec<_>>()
                        .join(" or ")
                ),
            ));
        }
        Ok(ExecTarget {
            prepared,
            ended,
            limit,
        })
    }

    /// Runs `argv` as a new instance of a running container's program (see the module
    /// docs) and says how it ended. Refused when the container is not running; a
    /// [`ErrorKind::DeadlineExceeded`] refusal at `timeout`.
    async fn exec(
        &self,
        container_id: &str,
        argv: Vec<String>,
        timeout: Option<Duration>,
        closed: &CancellationToken,
    ) -> wasmtime::Result<ExecOutput> {
        let ExecTarget {
            prepared,
            ended,
            limit,
        } = self.exec_target(container_id, &argv)?;
        let stdout = Capture::new(EXEC_OUTPUT_LIMIT);
        let stderr = Capture::new(EXEC_OUTPUT_LIMIT);
        let mut wasi = wasi_builder(&prepared.spec, &argv)?;
        wasi.stdout(GuestOutput::Capture(stdout.clone()))
            .stderr(GuestOutput::Capture(stderr.clone()));
        // An exec is a new instance with the container's current limit (its own
        // memory counted apart).
        let run = run_guest(
            &self.engine,
            &self.epoch,
            &prepared.program,
            wasi,
            Arc::new(MemoryCap::new(limit)),
            Arc::default(),
        );
        let deadline = async {
            match timeout {
                Some(timeout) => tokio::time::sleep(timeout).await,
                None => std::future::pending().await,
            }
        };
        // Whichever comes first, the rest is dropped: the instance and its store with it.
        let exit = tokio::select! {
            exit = run => exit,
            () = deadline => {
                return Err(refuse(
                    ErrorKind::DeadlineExceeded,
                    format!(
                        "exec {argv:?} in container {container_id} timed out after {:?}",
                        timeout.unwrap_or_default()
                    ),
                ));
            }
            () = ended.cancelled() => {
                return Err(refuse(
                    ErrorKind::FailedPrecondition,
                    format!("container {container_id} exited while exec {argv:?} ran"),
                ));
            }
            () = closed.cancelled() => {
                wasmtime::bail!("the node's connection closed while exec {argv:?} ran")
            }
        };
        Ok(ExecOutput {
            exit_code: exit.code,
            stdout: stdout.contents(),
            stderr: stderr.contents(),
        })
    }
}

/// What an exec runs: the container's program, until the container ends, with the
/// container's memory limit.
struct ExecTarget {
    prepared: Arc<Prepared>,
    ended: CancellationToken,
    limit: Option<u64>,
}

/// A container's stdout and stderr written raw to the FIFOs a containerd shim was
/// handed. Opened read-write: the open never waits for a reader, and a reader that
/// goes away (containerd restarting) never turns the guest's writes into errors.
fn open_fifos(fifos: &crate::protocol::Fifos) -> Result<CriLog, String> {
    let open = |path: &Option<PathBuf>| -> Result<Option<std::fs::File>, String> {
        path.as_ref()
            .map(|p| {
                // A `file://` log is made if need be and appended to.
                std::fs::OpenOptions::new()
                    .read(true)
                    .append(true)
                    .create(true)
                    .open(p)
                    .map_err(|e| format!("cannot open stdio pipe {}: {e}", p.display()))
            })
            .transpose()
    };
    let (stdout, stderr) = (open(&fifos.stdout)?, open(&fifos.stderr)?);
    CriLog::raw(stdout, stderr).map_err(|e| format!("cannot open /dev/null: {e}"))
}

/// The names a path gives a program: the path, its file name, and the file name
/// without `.wasm` — so `ticker`, `ticker.wasm` and `/bin/ticker.wasm` all name
/// `/bin/ticker.wasm`. The node adds the image's (see `ContainerSpec::program_names`).
pub fn program_names(argv0: &str) -> Vec<String> {
    let mut names = vec![argv0.to_owned()];
    let file = argv0.rsplit('/').next().unwrap_or(argv0);
    for name in [file, file.strip_suffix(".wasm").unwrap_or(file)] {
        if !name.is_empty() && !names.iter().any(|n| n == name) {
            names.push(name.to_owned());
        }
    }
    names
}

/// Runs one container's guest to the end and says how it ended.
async fn run(
    sandbox: &Sandbox,
    prepared: &Prepared,
    log: &CriLog,
    attached: Arc<AttachHub>,
    stdin: Option<tokio::io::DuplexStream>,
    stop: Arc<AtomicBool>,
    memory: Arc<MemoryCap>,
) -> Exit {
    let spec = &prepared.spec;
    if let Program::Proxy(pre) = &prepared.program {
        let wasi_spec = spec.clone();
        let proxy = Arc::new(http::Proxy {
            engine: sandbox.engine.clone(),
            epoch: sandbox.epoch.clone(),
            pre: pre.clone(),
            wasi: Box::new(move || wasi_builder(&wasi_spec, &wasi_spec.argv)),
            log: log.clone(),
            attached,
            memory,
            slots: tokio::sync::Semaphore::new(http::MAX_CONCURRENCY),
        });
        let port = spec.ports.first().copied().unwrap_or(DEFAULT_HTTP_PORT);
        return http::serve(proxy, port).await;
    }
    let output = |stream| GuestOutput::Log {
        log: log.clone(),
        stream,
        attached: attached.clone(),
    };
    match wasi_builder(spec, &spec.argv) {
        Ok(mut wasi) => {
            let (out, err) = (output(Stream::Stdout), output(Stream::Stderr));
            if spec.tty {
                wasi.stdout(Terminal(out)).stderr(Terminal(err));
            } else {
                wasi.stdout(out).stderr(err);
            }
            if let Some(stdin) = stdin {
                let stdin = AsyncStdinStream::new(stdin);
                if spec.tty {
                    wasi.stdin(Terminal(stdin));
                } else {
                    wasi.stdin(stdin);
                }
            }
            run_guest(
                &sandbox.engine,
                &sandbox.epoch,
                &prepared.program,
                wasi,
                memory,
                stop,
            )
            .await
        }
        Err(e) => Exit {
            code: 128,
            reason: "StartError".into(),
            message: format!("{e:#}"),
        },
    }
}

/// Instantiates `program` in a store of its own, with `wasi` and a limiter held to
/// `memory`, and runs it to the end: a container's guest or an exec.
async fn run_guest(
    engine: &Engine,
    epoch: &Epoch,
    program: &Program,
    mut wasi: WasiCtxBuilder,
    memory: Arc<MemoryCap>,
    stop: Arc<AtomicBool>,
) -> Exit {
    let limiter = MemoryLimiter::new(memory);
    let (result, limiter) = match program {
        Program::Module(pre) => {
            let mut store = Store::new(
                engine,
                P1State {
                    wasi: wasi.build_p1(),
                    limiter,
                    stop,
                },
            );
            store.limiter(|s| &mut s.limiter);
            epoch.yield_at_ticks(&mut store);
            let result = async {
                let instance = pre.instantiate_async(&mut store).await?;
                let start = instance.get_typed_func::<(), ()>(&mut store, "_start")?;
                start.call_async(&mut store, ()).await
            }
            .await
            .map(|()| 0);
            (result, store.into_data().limiter)
        }
        Program::Component(pre) => {
            let mut store = Store::new(
                engine,
                P2State {
                    ctx: wasi.build(),
                    table: ResourceTable::new(),
                    limiter,
                    stop,
                    http: wasmtime_wasi_http::WasiHttpCtx::new(),
                },
            );
            store.limiter(|s| &mut s.limiter);
            epoch.yield_at_ticks(&mut store);
            let result = async {
                let command = pre.instantiate_async(&mut store).await?;
                command.wasi_cli_run().call_run(&mut store).await
            }
            .await
            .map(|r| if r.is_ok() { 0 } else { 1 });
            (result, store.into_data().limiter)
        }
        // Refused before it gets here (`exec_target`); a proxy is served, not run.
        Program::Proxy(_) => (
            Err(wasmtime::format_err!(
                "a wasi:http/proxy component has no command to run"
            )),
            limiter,
        ),
    };
    exit_of(result, &limiter)
}

/// Maps a guest's result to a container exit, the way a container runtime reports a
/// process: `proc_exit(n)` is exit code n; a trap is an abort (134) unless the guest
/// had just been refused memory above its limit, which is an OOM kill (137).
fn exit_of(result: wasmtime::Result<i32>, limiter: &MemoryLimiter) -> Exit {
    match result {
        Ok(code) => Exit::code(code),
        Err(e) => {
            if let Some(I32Exit(code)) = e.downcast_ref::<I32Exit>() {
                return Exit::code(*code);
            }
            let message = format!("{e:#}");
            if limiter.refused {
                Exit {
                    code: KILLED_EXIT_CODE,
                    reason: "OOMKilled".into(),
                    message: format!(
                        "memory limit of {} bytes reached: {message}",
                        limiter.cap.limit().unwrap_or_default()
                    ),
                }
            } else {
                Exit {
                    code: TRAP_EXIT_CODE,
                    reason: "Error".into(),
                    message,
                }
            }
        }
    }
}

/// The WASI context of a container's guest, or of an exec in it, without its stdio
/// (each caller sets its own): `argv` differs, everything else is the container's.
fn wasi_builder(spec: &ContainerSpec, argv: &[String]) -> wasmtime::Result<WasiCtxBuilder> {
    let mut b = WasiCtx::builder();
    b.args(argv)
        .envs(&spec.env)
        // A workload has the pod's network as a container has; Wasm pods share the
        // node's network namespace (docs/decisions.md): TCP, UDP and name lookups
        // through wasi:sockets.
        .inherit_network()
        .allow_tcp(true)
        .allow_udp(true)
        .allow_ip_name_lookup(true);
    for p in &spec.preopens {
        let perms = if p.readonly {
            FsPerms::ReadOnly
        } else {
            FsPerms::ReadWrite
        };
        b.preopened_dir(&p.host_path, &p.guest_path, perms)
            .with_context(|| format!("preopening {} at {}", p.host_path.display(), p.guest_path))?;
    }
    Ok(b)
}

struct P1State {
    wasi: WasiP1Ctx,
    limiter: MemoryLimiter,
    stop: Arc<AtomicBool>,
}

struct P2State {
    ctx: WasiCtx,
    table: ResourceTable,
    limiter: MemoryLimiter,
    stop: Arc<AtomicBool>,
    http: wasmtime_wasi_http::WasiHttpCtx,
}

impl P2State {
    /// A store's state for one instance held to `memory`.
    fn new(ctx: WasiCtx, memory: Arc<MemoryCap>) -> Self {
        P2State {
            ctx,
            table: ResourceTable::new(),
            limiter: MemoryLimiter::new(memory),
            stop: Arc::default(),
            http: wasmtime_wasi_http::WasiHttpCtx::new(),
        }
    }
}

impl wasmtime_wasi_http::WasiHttpView for P2State {
    fn http(&mut self) -> wasmtime_wasi_http::WasiHttpCtxView<'_> {
        wasmtime_wasi_http::WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: Default::default(),
        }
    }
}

impl WasiView for P2State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.ctx,
            table: &mut self.table,
        }
    }
}

/// A container's memory cap and what its linear memories use, shared between its
/// store's limiter and the sandbox, which changes the cap in place.
#[derive(Debug)]
struct MemoryCap {
    /// The cap in bytes; `u64::MAX` is none.
    limit: AtomicU64,
    used: AtomicU64,
}

impl MemoryCap {
    fn new(limit: Option<u64>) -> Self {
        MemoryCap {
            limit: AtomicU64::new(limit.unwrap_or(u64::MAX)),
            used: AtomicU64::new(0),
        }
    }

    fn limit(&self) -> Option<u64> {
        Some(self.limit.load(Ordering::SeqCst)).filter(|l| *l != u64::MAX)
    }

    /// Sets a new cap, unless the memories already use more: they cannot shrink. The
    /// cap is set first and the use read after, as a growth adds its use first and
    /// reads the cap after (both `SeqCst`): either the growth sees the new cap, or
    /// this sees the growth and puts the old cap back.
    fn set_limit(&self, limit: Option<u64>) -> Result<(), u64> {
        let new = limit.unwrap_or(u64::MAX);
        let old = self.limit.swap(new, Ordering::SeqCst);
        let used = self.used.load(Ordering::SeqCst);
        if used > new {
            self.limit.store(old, Ordering::SeqCst);
            return Err(used);
        }
        Ok(())
    }

    /// Takes `grow` bytes more, unless that passes the cap.
    fn grow(&self, grow: u64) -> bool {
        let before = self.used.fetch_add(grow, Ordering::SeqCst);
        if before + grow > self.limit.load(Ordering::SeqCst) {
            self.used.fetch_sub(grow, Ordering::SeqCst);
            return false;
        }
        true
    }
}

/// Caps the sum of a container's linear memories and remembers a refusal, so a trap
/// that follows can be reported as an OOM kill.
struct MemoryLimiter {
    cap: Arc<MemoryCap>,
    refused: bool,
}

impl MemoryLimiter {
    fn new(cap: Arc<MemoryCap>) -> Self {
        MemoryLimiter {
            cap,
            refused: false,
        }
    }
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if !self.cap.grow((desired - current) as u64) {
            self.refused = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        _desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_memory_cap_changes_in_place_but_never_below_what_is_used() {
        let cap = super::MemoryCap::new(Some(100));
        assert!(cap.grow(60));
        assert!(!cap.grow(50), "past the cap");
        assert_eq!(cap.set_limit(Some(50)), Err(60), "below the use");
        assert_eq!(cap.limit(), Some(100), "the old cap stays");
        assert_eq!(cap.set_limit(Some(200)), Ok(()));
        assert!(cap.grow(50));
        assert_eq!(cap.set_limit(None), Ok(()));
        assert_eq!(cap.limit(), None);
        assert!(cap.grow(1 << 40));
    }

    #[test]
    fn an_exec_names_the_program_by_its_path_its_file_name_or_its_stem() {
        assert_eq!(
            super::program_names("/bin/ticker.wasm"),
            ["/bin/ticker.wasm", "ticker.wasm", "ticker"]
        );
        assert_eq!(
            super::program_names("ticker.wasm"),
            ["ticker.wasm", "ticker"]
        );
        assert_eq!(super::program_names("ticker"), ["ticker"]);
    }

    #[test]
    fn the_stop_interface_is_recognised_at_compatible_versions() {
        for name in [
            "wasmlet:lifecycle/stop@0.1.0",
            "wasmlet:lifecycle/stop@0.1.7",
        ] {
            assert!(super::imports_stop(name), "{name}");
        }
        for name in [
            "wasmlet:lifecycle/stop@0.2.0",
            "wasmlet:lifecycle/stop@0.1.",
            "wasmlet:lifecycle/stop",
            "wasi:cli/run@0.2.0",
        ] {
            assert!(!super::imports_stop(name), "{name}");
        }
    }
}
