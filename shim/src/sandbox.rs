//! The pod's sandbox process: wasmlet's own sandbox (this binary, `sandbox …`),
//! started in the pod's cgroup and network namespace, driven over wasmlet's sandbox
//! protocol ([`wasmlet_runtime_wasm::protocol`]) exactly as the node drives it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use jiff::Timestamp;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot, watch};
use wasmlet_runtime_wasm::cgroup::PodCgroup;
use wasmlet_runtime_wasm::protocol::{
    ErrorKind, ExecOutput, Exit, Message, Op, Request, StreamReply, StreamRequest,
};

use crate::spec::Network;

/// Where sandbox processes keep their sockets: one directory per shim.
pub const RUN_DIR: &str = "/run/containerd-wasmlet";
const SOCKET: &str = "sandbox.sock";
const STREAM_SOCKET: &str = "stream.sock";
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// What the sandbox process reports by itself.
#[derive(Debug)]
pub enum Event {
    Exited {
        container_id: String,
        at: Timestamp,
        exit: Exit,
    },
    /// The process ended (how, as far as known): every container in it ended too.
    Gone(String),
}

/// A refused or failed request.
#[derive(Debug)]
pub struct CallError {
    pub message: String,
    pub kind: Option<ErrorKind>,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

pub struct Options<'a> {
    pub dir: PathBuf,
    pub cache_dir: &'a Path,
    pub group: &'a str,
    pub network: Network,
    pub cgroup: Option<PodCgroup>,
    pub oom_score_adj: Option<i64>,
}

type Pending = Mutex<HashMap<u64, oneshot::Sender<Result<Option<ExecOutput>, CallError>>>>;

pub struct SandboxProcess {
    pub pid: u32,
    pub dir: PathBuf,
    conn: tokio::sync::Mutex<OwnedWriteHalf>,
    pending: Arc<Pending>,
    next: AtomicU64,
    child: tokio::sync::Mutex<Child>,
    gone: watch::Receiver<bool>,
}

impl SandboxProcess {
    /// Starts the sandbox process and connects to it; its reports go to `events`.
    pub async fn spawn(
        opts: Options<'_>,
        events: mpsc::UnboundedSender<Event>,
    ) -> anyhow::Result<Arc<SandboxProcess>> {
        let dir = opts.dir;
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let socket = dir.join(SOCKET);
        let _ = std::fs::remove_file(&socket);
        let log = std::fs::File::create(dir.join("sandbox.log"))
            .with_context(|| format!("creating the sandbox log in {}", dir.display()))?;
        let exe = std::env::current_exe().context("finding this program")?;
        let mut cmd = Command::new(exe);
        cmd.arg("sandbox")
            .arg("--cache-dir")
            .arg(opts.cache_dir)
            .arg("--pod-uid")
            .arg(opts.group)
            .arg("--socket")
            .arg(&socket)
            .arg("--stream-socket")
            .arg(dir.join(STREAM_SOCKET))
            // Later tasks' root filesystems reach it through the shim's shared
            // directory (`crate::mount::shared_dir`).
            .arg("--mount-namespace")
            .stdin(Stdio::null())
            // Where it says it listens (`wasmlet_runtime_wasm::sandbox::wait_listening`).
            .stdout(Stdio::piped())
            .stderr(log)
            .process_group(0);
        match &opts.network {
            Network::Host => {}
            Network::Join(path) => {
                cmd.arg("--netns").arg(path);
            }
            Network::New => {
                cmd.arg("--unshare-net");
            }
        }
        if let Some(cgroup) = opts.cgroup {
            cgroup.join_on_spawn(&mut cmd);
        }
        let spawned = cmd.spawn();
        drop(cmd);
        let mut child = spawned.context("starting the sandbox process")?;
        let pid = child.id().context("the sandbox process has no pid")?;
        if let Some(adj) = opts.oom_score_adj
            && let Err(e) = wasmlet_runtime_wasm::cgroup::set_oom_score_adj(pid, adj)
        {
            let _ = child.start_kill();
            bail!("setting the sandbox's oom_score_adj to {adj}: {e}");
        }
        if let Err(e) =
            wasmlet_runtime_wasm::sandbox::wait_listening(&mut child, START_TIMEOUT).await
        {
            let log = std::fs::read_to_string(dir.join("sandbox.log")).unwrap_or_default();
            bail!("the sandbox process {e}: {}", log.trim());
        }
        let stream = UnixStream::connect(&socket)
            .await
            .with_context(|| format!("connecting to the sandbox at {}", socket.display()))?;
        let (read, write) = stream.into_split();
        let (gone_tx, gone) = watch::channel(false);
        let pending: Arc<Pending> = Arc::default();
        tokio::spawn(read_messages(read, pending.clone(), events, gone_tx));
        Ok(Arc::new(SandboxProcess {
            pid,
            dir,
            conn: tokio::sync::Mutex::new(write),
            pending,
            next: AtomicU64::new(1),
            child: tokio::sync::Mutex::new(child),
            gone,
        }))
    }

    /// Sends `op` and waits up to `timeout` for its reply.
    pub async fn call(&self, op: Op, timeout: Duration) -> Result<Option<ExecOutput>, CallError> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap().insert(id, tx);
        let mut line = serde_json::to_vec(&Request { id, op }).expect("requests encode");
        line.push(b'\n');
        let internal = |message: String| CallError {
            message,
            kind: None,
        };
        if let Err(e) = self.conn.lock().await.write_all(&line).await {
            self.pending.lock().unwrap().remove(&id);
            return Err(internal(format!("the sandbox process is gone: {e}")));
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) => Err(internal("the sandbox process is gone".into())),
            Err(_) => {
                self.pending.lock().unwrap().remove(&id);
                Err(internal(format!(
                    "the sandbox did not answer within {timeout:?}"
                )))
            }
        }
    }

    /// Opens a stream session (an exec with its stdio): after the sandbox accepted it,
    /// both halves speak `protocol::frame`s.
    pub async fn stream(
        &self,
        request: &StreamRequest,
    ) -> Result<(BufReader<OwnedReadHalf>, OwnedWriteHalf), CallError> {
        let internal = |what: &str, e: std::io::Error| CallError {
            message: format!("{what} the sandbox's stream socket: {e}"),
            kind: None,
        };
        let stream = UnixStream::connect(self.dir.join(STREAM_SOCKET))
            .await
            .map_err(|e| internal("connecting to", e))?;
        let (read, mut write) = stream.into_split();
        let mut line = serde_json::to_vec(request).expect("requests encode");
        line.push(b'\n');
        write
            .write_all(&line)
            .await
            .map_err(|e| internal("writing to", e))?;
        let mut read = BufReader::new(read);
        let mut answer = String::new();
        read.read_line(&mut answer)
            .await
            .map_err(|e| internal("reading from", e))?;
        let reply: StreamReply = serde_json::from_str(&answer).map_err(|e| CallError {
            message: format!("the sandbox's stream reply {answer:?}: {e}"),
            kind: None,
        })?;
        if let Some(message) = reply.error {
            return Err(CallError {
                message,
                kind: reply.error_kind,
            });
        }
        Ok((read, write))
    }

    /// Stops every container and ends the process (killing it if it does not end).
    pub async fn shutdown(&self) {
        if !*self.gone.borrow() {
            let _ = self.call(Op::Shutdown, Duration::from_secs(10)).await;
        }
        let mut child = self.child.lock().await;
        if tokio::time::timeout(Duration::from_secs(5), child.wait())
            .await
            .is_err()
        {
            let _ = child.kill().await;
        }
        crate::mount::release_run_dir(&self.dir);
    }
}

async fn read_messages(
    read: OwnedReadHalf,
    pending: Arc<Pending>,
    events: mpsc::UnboundedSender<Event>,
    gone: watch::Sender<bool>,
) {
    let mut lines = BufReader::new(read).lines();
    let how = loop {
        let line = match lines.next_line().await {
            Ok(Some(line)) => line,
            Ok(None) => break "its connection closed".to_owned(),
            Err(e) => break format!("reading from it failed: {e}"),
        };
        match serde_json::from_str::<Message>(&line) {
            Ok(Message::Reply {
                id,
                error,
                error_kind,
                exec,
                ..
            }) => {
                if let Some(tx) = pending.lock().unwrap().remove(&id) {
                    let _ = tx.send(match error {
                        Some(message) => Err(CallError {
                            message,
                            kind: error_kind,
                        }),
                        None => Ok(exec),
                    });
                }
            }
            Ok(Message::Started { .. }) => {}
            Ok(Message::Exited {
                container_id,
                at,
                exit,
            }) => {
                let _ = events.send(Event::Exited {
                    container_id,
                    at,
                    exit,
                });
            }
            Err(e) => tracing::warn!("the sandbox said {line:?}, which is not a message: {e}"),
        }
    };
    pending.lock().unwrap().clear();
    gone.send_replace(true);
    let _ = events.send(Event::Gone(how));
}

/// Whether `pid` is a sandbox process of this shim (its command line names the run
/// directory), so that a recorded pid reused by another process is never killed.
pub fn is_sandbox_process(pid: i32) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    args.get(1) == Some(&&b"sandbox"[..]) && args.iter().any(|a| a.starts_with(RUN_DIR.as_bytes()))
}
