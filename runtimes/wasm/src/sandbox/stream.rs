//! The sandbox's stream socket: interactive execs and attaches ([`StreamRequest`]).
//!
//! An exec runs a new instance of the container's program as [`Op::Exec`] does
//! (`super::Sandbox::exec_target` decides what it may run), with its stdio on the
//! connection: stdin frames feed a pipe the guest reads, the guest's stdout and stderr
//! are pipes relayed as frames, each of [`PIPE_CAPACITY`] bytes, so a guest whose
//! client reads slowly waits rather than grows the sandbox. When the guest ends, its
//! output is relayed to the end and its [`Exit`] follows. The node closing the
//! connection (its client went away) drops the instance at its next epoch tick, as
//! a stop cancels a guest; so does the container ending, with [`frame::ERROR`].
//!
//! An attach subscribes to the running container's output ([`AttachHub`]) from the
//! moment it attaches and, when the container keeps its stdin open, writes the
//! client's stdin into it; with `stdin_once` the first client that closes its stdin
//! (or leaves) closes the guest's. It ends with the container's exit, or when the
//! node closes the connection, which detaches and leaves the container running.
//!
//! [`Op::Exec`]: crate::protocol::Op::Exec

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use wasmtime_wasi::cli::{AsyncStdinStream, AsyncStdoutStream};

use super::{ExecTarget, MemoryCap, Refusal, Sandbox, Slot, run_guest, wasi_builder};
use crate::crilog::Stream;
use crate::protocol::{ErrorKind, Exit, StreamKind, StreamReply, StreamRequest, frame};
use crate::stdio::{AttachHub, PIPE_CAPACITY, Terminal};

/// How long a connection may take to say what it wants.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves one stream connection to its end.
pub(super) async fn serve(sandbox: Arc<Sandbox>, conn: UnixStream) {
    let (read, mut write) = conn.into_split();
    let mut read = BufReader::new(read);
    let mut line = String::new();
    let request = match tokio::time::timeout(REQUEST_TIMEOUT, read.read_line(&mut line)).await {
        Ok(Ok(n)) if n > 0 => serde_json::from_str::<StreamRequest>(&line).map_err(|e| {
            (
                ErrorKind::InvalidArgument,
                format!("a malformed stream request: {e}"),
            )
        }),
        // Gone, or silent: nobody to answer.
        _ => return,
    };
    let accepted = match request {
        Ok(request) => match &request.kind {
            StreamKind::Exec { argv } => sandbox
                .exec_target(&request.container_id, argv)
                .map(|t| Accepted::Exec(request.clone(), t)),
            StreamKind::Attach => attach_target(&sandbox, &request).map(Accepted::Attach),
        }
        .map_err(|e| {
            let kind = e.downcast_ref::<Refusal>().map(|r| r.kind);
            (kind, format!("{e:#}"))
        }),
        Err((kind, message)) => Err((Some(kind), message)),
    };
    let reply = match &accepted {
        Ok(_) => StreamReply::default(),
        Err((kind, message)) => StreamReply {
            error: Some(message.clone()),
            error_kind: *kind,
        },
    };
    let mut reply = serde_json::to_vec(&reply).expect("replies serialize");
    reply.push(b'\n');
    if write.write_all(&reply).await.is_err() {
        return;
    }
    match accepted {
        Ok(Accepted::Exec(request, target)) => exec(&sandbox, request, target, read, write).await,
        Ok(Accepted::Attach(target)) => attach(target, read, write).await,
        Err(_) => {
            let _ = write.shutdown().await;
        }
    }
}

enum Accepted {
    Exec(StreamRequest, ExecTarget),
    Attach(AttachTarget),
}

/// A running container to attach to.
struct AttachTarget {
    request: StreamRequest,
    hub: Arc<AttachHub>,
    exited: tokio::sync::watch::Receiver<bool>,
    sandbox: Arc<Sandbox>,
}

fn attach_target(
    sandbox: &Arc<Sandbox>,
    request: &StreamRequest,
) -> wasmtime::Result<AttachTarget> {
    let id = &request.container_id;
    let containers = sandbox.containers.lock().unwrap();
    let Some(Slot::Running {
        attached, exited, ..
    }) = containers.get(id)
    else {
        return Err(super::refuse(
            ErrorKind::FailedPrecondition,
            format!("container {id} is not running: cannot attach to it"),
        ));
    };
    if request.stdin && !attached.has_stdin {
        return Err(super::refuse(
            ErrorKind::InvalidArgument,
            format!("container {id} keeps no stdin open (its spec does not set stdin: true)"),
        ));
    }
    Ok(AttachTarget {
        request: request.clone(),
        hub: attached.clone(),
        exited: exited.clone(),
        sandbox: sandbox.clone(),
    })
}

/// Relays the node's frames to `stdin` until the client closes it (or the
/// connection ends); then waits for the connection's end, which it returns.
async fn feed_stdin(
    read: &mut BufReader<OwnedReadHalf>,
    mut stdin: Option<tokio::io::DuplexStream>,
) {
    loop {
        match frame::read(read).await {
            Ok(Some((frame::STDIN, bytes))) => {
                if let Some(w) = stdin.as_mut()
                    && w.write_all(&bytes).await.is_err()
                {
                    stdin = None;
                }
            }
            Ok(Some((frame::STDIN_CLOSED, _))) => {
                if let Some(mut w) = stdin.take() {
                    let _ = w.shutdown().await;
                }
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => return,
        }
    }
}

/// Relays the guest's two output pipes as frames until both end.
async fn relay_output(
    write: &mut OwnedWriteHalf,
    mut stdout: Option<impl AsyncRead + Unpin>,
    mut stderr: Option<impl AsyncRead + Unpin>,
    tty: bool,
) -> std::io::Result<()> {
    let mut out_buf = vec![0u8; 32 * 1024];
    let mut err_buf = vec![0u8; 32 * 1024];
    let err_tag = if tty { frame::STDOUT } else { frame::STDERR };
    while stdout.is_some() || stderr.is_some() {
        tokio::select! {
            n = async { stdout.as_mut().unwrap().read(&mut out_buf).await }, if stdout.is_some() => match n {
                Ok(0) | Err(_) => stdout = None,
                Ok(n) => frame::write(write, frame::STDOUT, &out_buf[..n]).await?,
            },
            n = async { stderr.as_mut().unwrap().read(&mut err_buf).await }, if stderr.is_some() => match n {
                Ok(0) | Err(_) => stderr = None,
                Ok(n) => frame::write(write, err_tag, &err_buf[..n]).await?,
            },
        }
    }
    Ok(())
}

async fn exec(
    sandbox: &Sandbox,
    request: StreamRequest,
    target: ExecTarget,
    mut read: BufReader<OwnedReadHalf>,
    mut write: OwnedWriteHalf,
) {
    let StreamKind::Exec { argv } = &request.kind else {
        return;
    };
    let ExecTarget {
        prepared,
        ended,
        limit,
    } = target;
    let mut wasi = match wasi_builder(&prepared.spec, argv) {
        Ok(w) => w,
        Err(e) => {
            let _ = frame::write(&mut write, frame::ERROR, format!("{e:#}").as_bytes()).await;
            return;
        }
    };
    let pipe = || tokio::io::duplex(PIPE_CAPACITY);
    let mut stdin_writer = None;
    if request.stdin {
        let (r, w) = pipe();
        stdin_writer = Some(w);
        let stdin = AsyncStdinStream::new(r);
        if request.tty {
            wasi.stdin(Terminal(stdin));
        } else {
            wasi.stdin(stdin);
        }
    }
    // A stream the client did not ask for stays WASI's default, a sink. With a TTY
    // stderr's bytes go out on stdout.
    let mut out_r = None;
    if request.stdout {
        let (r, w) = pipe();
        out_r = Some(r);
        let out = AsyncStdoutStream::new(PIPE_CAPACITY, w);
        if request.tty {
            wasi.stdout(Terminal(out));
        } else {
            wasi.stdout(out);
        }
    }
    let mut err_r = None;
    if request.stderr || (request.tty && request.stdout) {
        let (r, w) = pipe();
        err_r = Some(r);
        let err = AsyncStdoutStream::new(PIPE_CAPACITY, w);
        if request.tty {
            wasi.stderr(Terminal(err));
        } else {
            wasi.stderr(err);
        }
    }
    let guest = async {
        // The instance (and with it the writing ends of its pipes) is dropped when
        // this ends, so the relay below sees the end of its output.
        tokio::select! {
            exit = run_guest(
                &sandbox.engine,
                &sandbox.epoch,
                &prepared.program,
                wasi,
                Arc::new(MemoryCap::new(limit)),
                Arc::default(),
            ) => Ok(exit),
            () = ended.cancelled() => Err(format!(
                "container {} exited while exec {argv:?} ran",
                prepared.spec.name
            )),
        }
    };
    let session = async {
        let (outcome, relayed) =
            tokio::join!(guest, relay_output(&mut write, out_r, err_r, request.tty));
        (outcome, relayed, write)
    };
    tokio::select! {
        (outcome, relayed, mut write) = session => {
            if relayed.is_err() {
                return;
            }
            let _ = match outcome {
                Ok(exit) => frame::write(&mut write, frame::EXIT, &serde_json::to_vec(&exit).expect("exits serialize")).await,
                Err(message) => frame::write(&mut write, frame::ERROR, message.as_bytes()).await,
            };
            let _ = write.shutdown().await;
        }
        // The node closed the connection: its client is gone, and so is the exec.
        () = feed_stdin(&mut read, stdin_writer) => {}
    }
}

async fn attach(
    target: AttachTarget,
    mut read: BufReader<OwnedReadHalf>,
    mut write: OwnedWriteHalf,
) {
    let AttachTarget {
        request,
        hub,
        mut exited,
        sandbox,
    } = target;
    let mut output = hub.subscribe();
    let tag = |stream: Stream| match stream {
        Stream::Stdout => Some(frame::STDOUT).filter(|_| request.stdout),
        Stream::Stderr if request.tty => Some(frame::STDOUT).filter(|_| request.stdout),
        Stream::Stderr => Some(frame::STDERR).filter(|_| request.stderr),
    };
    let mut stdin_open = request.stdin;
    let mut ended = *exited.borrow();
    while !ended {
        tokio::select! {
            chunk = output.recv() => {
                let Some((stream, bytes)) = chunk else { break };
                if let Some(tag) = tag(stream)
                    && frame::write(&mut write, tag, &bytes).await.is_err()
                {
                    detach(&hub, &request).await;
                    return;
                }
            }
            input = frame::read(&mut read) => match input {
                Ok(Some((frame::STDIN, bytes))) if stdin_open => {
                    if !hub.write_stdin(&bytes).await {
                        stdin_open = false;
                    }
                }
                Ok(Some((frame::STDIN_CLOSED, _))) if stdin_open => {
                    stdin_open = false;
                    if hub.stdin_once {
                        hub.close_stdin().await;
                    }
                }
                Ok(Some(_)) => {}
                // Detached: the container runs on.
                Ok(None) | Err(_) => {
                    detach(&hub, &request).await;
                    return;
                }
            },
            changed = exited.changed() => ended = changed.is_err() || *exited.borrow(),
        }
    }
    // The container ended: what it wrote before is sent, then how it ended.
    while let Ok((stream, bytes)) = output.try_recv() {
        if let Some(tag) = tag(stream) {
            let _ = frame::write(&mut write, tag, &bytes).await;
        }
    }
    let exit = match sandbox
        .containers
        .lock()
        .unwrap()
        .get(&request.container_id)
    {
        Some(Slot::Exited { exit, .. }) => exit.clone(),
        _ => Exit::code(0),
    };
    let _ = frame::write(
        &mut write,
        frame::EXIT,
        &serde_json::to_vec(&exit).expect("exits serialize"),
    )
    .await;
    let _ = write.shutdown().await;
}

/// A client leaves: with `stdin_once`, one that had the stdin closes it.
async fn detach(hub: &AttachHub, request: &StreamRequest) {
    if request.stdin && hub.stdin_once {
        hub.close_stdin().await;
    }
}
