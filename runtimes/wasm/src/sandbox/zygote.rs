//! The zygote: one process that has built what every sandbox builds the same way (the
//! engine and its linkers, [`Prebuilt`]) and forks a sandbox per request, instead of
//! each sandbox being a new program that loads, relocates and builds them again.
//! Every sandbox forked from it shares those pages with it until it writes them.
//!
//! The node starts it as `<program> [args] --zygote --socket PATH` with its standard
//! input a pipe the node holds (the zygote ends when the node does: the pipe's end of
//! file) and its standard output a pipe it says it listens on ([`super::LISTENING`]).
//! A request is one `SOCK_SEQPACKET` message: the sandbox's command line as JSON
//! ([`Request`]) with its standard output and standard error beside it (two
//! descriptors, `SCM_RIGHTS`). The zygote forks; the child becomes the sandbox (it joins
//! its pod cgroup first, `--join-cgroup`, then runs as an exec'd one does) and the
//! zygote answers `ok <pid>` with a pidfd of the child beside it, which lets the node
//! wait for the sandbox's end and signal it without racing a reuse of its pid. The
//! zygote does not wait for its children: the kernel reaps them (`SA_NOCLDWAIT`).
//!
//! Only the zygote's own user may ask (`SO_PEERCRED`), and its socket lives in the
//! node's state directory.
#![allow(unsafe_code)] // reason: fork, descriptors received over a socket, the pidfd system calls and their registration with tokio; see the SAFETY notes.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use nix::sys::socket::{
    self, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType,
    UnixAddr, sockopt,
};

use super::{Options, Prebuilt, ready, run_sandbox};

/// The first argument that makes the sandbox program a zygote.
pub const FLAG: &str = "--zygote";
/// The largest request: a command line.
const MAX_REQUEST: usize = 64 * 1024;

/// What the node asks the zygote for: a sandbox with this command line (the
/// arguments after the program and its own arguments, as an exec'd sandbox gets them).
#[derive(serde::Serialize, serde::Deserialize)]
pub struct Request {
    pub args: Vec<String>,
}

/// A sandbox the zygote forked.
#[derive(Debug)]
pub struct Forked {
    pub pid: u32,
    /// Readable once the process has ended; signals reach it and never a later
    /// process with the same pid.
    pub pidfd: OwnedFd,
}

/// The zygote's entry point; `args` follow [`FLAG`]. Returns in a forked child too,
/// with the child's sandbox's exit code.
pub fn main(args: impl IntoIterator<Item = String>) -> ExitCode {
    let mut socket = None;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--socket" => socket = args.next().map(PathBuf::from),
            other => {
                eprintln!("wasmlet zygote: unknown argument {other:?}");
                return ExitCode::from(2);
            }
        }
    }
    let Some(socket) = socket else {
        eprintln!("wasmlet zygote: --socket is required");
        return ExitCode::from(2);
    };
    match serve(&socket) {
        Ok(Served::NodeGone) => ExitCode::SUCCESS,
        Ok(Served::Child(code)) => code,
        Err(e) => {
            eprintln!("wasmlet zygote: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// How [`serve`] returned: in the zygote once the node is gone, or in a forked
/// child once its sandbox ended.
enum Served {
    NodeGone,
    Child(ExitCode),
}

fn serve(socket: &Path) -> anyhow::Result<Served> {
    use anyhow::Context;
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    // The kernel reaps the children: nobody here waits for them.
    let ignore = SigAction::new(SigHandler::SigIgn, SaFlags::SA_NOCLDWAIT, SigSet::empty());
    // SAFETY: installs SIG_IGN, no handler function runs.
    unsafe { sigaction(Signal::SIGCHLD, &ignore) }.context("ignoring SIGCHLD")?;
    let prebuilt = Prebuilt::build(false)
        .map_err(|e| anyhow::anyhow!("building the engine and linkers: {e:#}"))?;
    let _ = std::fs::remove_file(socket);
    let listener = socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .context("a socket")?;
    socket::bind(listener.as_raw_fd(), &UnixAddr::new(socket)?)
        .with_context(|| format!("binding {}", socket.display()))?;
    socket::listen(&listener, socket::Backlog::MAXCONN)
        .with_context(|| format!("listening on {}", socket.display()))?;
    ready::announce();
    let me = nix::unistd::geteuid();
    loop {
        let stdin = std::io::stdin();
        let mut fds = [
            nix::poll::PollFd::new(listener.as_fd(), nix::poll::PollFlags::POLLIN),
            nix::poll::PollFd::new(stdin.as_fd(), nix::poll::PollFlags::POLLIN),
        ];
        match nix::poll::poll(&mut fds, nix::poll::PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e).context("waiting for requests"),
        }
        // The node never writes to the pipe: anything there is its end.
        if fds[1].any().unwrap_or(false) {
            return Ok(Served::NodeGone);
        }
        if !fds[0].any().unwrap_or(false) {
            continue;
        }
        let conn = match socket::accept4(listener.as_raw_fd(), SockFlag::SOCK_CLOEXEC) {
            // SAFETY: accept4 returned a new descriptor that nothing else owns.
            Ok(fd) => unsafe { OwnedFd::from_raw_fd(fd) },
            Err(e) => {
                eprintln!("wasmlet zygote: accepting a request: {e}");
                continue;
            }
        };
        match socket::getsockopt(&conn, sockopt::PeerCredentials) {
            Ok(peer) if peer.uid() == me.as_raw() => {}
            Ok(peer) => {
                answer(
                    &conn,
                    &format!("error uid {} may not ask", peer.uid()),
                    None,
                );
                continue;
            }
            Err(e) => {
                eprintln!("wasmlet zygote: the requester's credentials: {e}");
                continue;
            }
        }
        let (request, stdio) = match receive(&conn) {
            Ok(r) => r,
            Err(e) => {
                answer(&conn, &format!("error {e}"), None);
                continue;
            }
        };
        // SAFETY: this process has one thread (it starts none), so the child starts
        // with every lock free and every allocation consistent.
        match unsafe { nix::unistd::fork() } {
            Ok(nix::unistd::ForkResult::Child) => {
                drop(conn);
                drop(listener);
                return Ok(Served::Child(become_sandbox(request, stdio, prebuilt)));
            }
            Ok(nix::unistd::ForkResult::Parent { child }) => {
                let pidfd = pidfd_open(child.as_raw());
                match &pidfd {
                    Ok(fd) => answer(&conn, &format!("ok {child}"), Some(fd.as_fd())),
                    Err(e) => {
                        let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
                        answer(&conn, &format!("error a pidfd for {child}: {e}"), None);
                    }
                }
            }
            Err(e) => answer(&conn, &format!("error fork: {e}"), None),
        }
    }
}

/// In the forked child: standard streams as asked, a process group of its own, then
/// the sandbox.
fn become_sandbox(request: Request, stdio: [OwnedFd; 2], prebuilt: Prebuilt) -> ExitCode {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    let [stdout, stderr] = stdio;
    let streams = (|| -> std::io::Result<()> {
        let null = std::fs::File::open("/dev/null")?;
        nix::unistd::dup2_stdin(&null)?;
        nix::unistd::dup2_stdout(&stdout)?;
        nix::unistd::dup2_stderr(&stderr)?;
        Ok(())
    })();
    drop((stdout, stderr));
    if let Err(e) = streams {
        // Standard error may be the zygote's still: the node finds it there.
        eprintln!("wasmlet zygote: a forked sandbox's standard streams: {e}");
        return ExitCode::FAILURE;
    }
    let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    // SAFETY: restores the default action, no handler function runs.
    let _ = unsafe { sigaction(Signal::SIGCHLD, &default) };
    // Its own process group, as an exec'd sandbox has: a signal to the node's group
    // does not reach the pods.
    let _ = nix::unistd::setpgid(nix::unistd::Pid::from_raw(0), nix::unistd::Pid::from_raw(0));
    match Options::parse(request.args) {
        Ok(options) => run_sandbox(options, Some(prebuilt)),
        Err(code) => code,
    }
}

/// Reads one request and the two descriptors beside it.
fn receive(conn: &OwnedFd) -> std::io::Result<(Request, [OwnedFd; 2])> {
    let mut buf = vec![0u8; MAX_REQUEST];
    let (len, fds) = receive_with_fds::<2>(conn, &mut buf)?;
    let stdio: [OwnedFd; 2] = fds.try_into().map_err(|fds: Vec<OwnedFd>| {
        std::io::Error::other(format!(
            "{} descriptors came with the request, not 2",
            fds.len()
        ))
    })?;
    let request = serde_json::from_slice(&buf[..len])
        .map_err(|e| std::io::Error::other(format!("the request: {e}")))?;
    Ok((request, stdio))
}

/// Receives one message into `buf` with up to `N` descriptors beside it (close on
/// exec): its length and the descriptors. A message longer than `buf` is an error.
fn receive_with_fds<const N: usize>(
    conn: &OwnedFd,
    buf: &mut [u8],
) -> std::io::Result<(usize, Vec<OwnedFd>)> {
    let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; N]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = socket::recvmsg::<()>(
        conn.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(received) = c {
            // SAFETY: descriptors just received are this process's and nobody else's.
            fds.extend(
                received
                    .into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    if msg.flags.contains(MsgFlags::MSG_TRUNC) {
        return Err(std::io::Error::other("the message is too long"));
    }
    Ok((msg.bytes, fds))
}

/// Answers a request, with a descriptor beside the text.
fn answer(conn: &OwnedFd, text: &str, fd: Option<BorrowedFd<'_>>) {
    let raw = fd.map(|fd| [fd.as_raw_fd()]);
    let cmsgs: Vec<ControlMessage<'_>> = raw.iter().map(|r| ControlMessage::ScmRights(r)).collect();
    if let Err(e) = socket::sendmsg::<()>(
        conn.as_raw_fd(),
        &[IoSlice::new(text.as_bytes())],
        &cmsgs,
        MsgFlags::MSG_NOSIGNAL,
        None,
    ) {
        eprintln!("wasmlet zygote: answering a request: {e}");
    }
}

/// Asks the zygote listening at `socket` for a sandbox with command line `args`,
/// standard output `stdout` and standard error `stderr`. Blocks for the fork (a
/// fraction of a millisecond), not for the sandbox's start.
pub fn fork(
    socket: &Path,
    args: Vec<String>,
    stdout: BorrowedFd<'_>,
    stderr: BorrowedFd<'_>,
) -> std::io::Result<Forked> {
    let conn = socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    socket::connect(conn.as_raw_fd(), &UnixAddr::new(socket)?)?;
    let request = serde_json::to_vec(&Request { args }).expect("requests encode");
    if request.len() > MAX_REQUEST {
        return Err(std::io::Error::other(
            "the sandbox's command line is too long",
        ));
    }
    let fds = [stdout.as_raw_fd(), stderr.as_raw_fd()];
    socket::sendmsg::<()>(
        conn.as_raw_fd(),
        &[IoSlice::new(&request)],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    let mut buf = [0u8; 4096];
    let (len, fds) = receive_with_fds::<1>(&conn, &mut buf)?;
    let pidfd = fds.into_iter().next();
    let text = String::from_utf8_lossy(&buf[..len]).into_owned();
    if len == 0 {
        return Err(std::io::Error::other(
            "the zygote closed the connection without an answer",
        ));
    }
    match (text.strip_prefix("ok "), pidfd) {
        (Some(pid), Some(pidfd)) => Ok(Forked {
            pid: pid
                .trim()
                .parse()
                .map_err(|e| std::io::Error::other(format!("the zygote answered {text:?}: {e}")))?,
            pidfd,
        }),
        _ => Err(std::io::Error::other(format!(
            "the zygote: {}",
            text.strip_prefix("error ").unwrap_or(&text)
        ))),
    }
}

/// A pidfd of process `pid` (Linux 5.3).
fn pidfd_open(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the descriptor was just made and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `pidfd` registered with the tokio reactor: readable once its process has ended.
/// Call it within a tokio runtime.
pub fn watch_pidfd(pidfd: OwnedFd) -> std::io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: the descriptor is owned by the `AsyncFd` from here on, which neither
    // replaces nor closes it while it is registered.
    let registered = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE)
    };
    registered.map_err(std::io::Error::from)
}

/// Sends `signal` to the process behind `pidfd` (Linux 5.1); a process that has ended
/// is not an error.
pub fn pidfd_kill(pidfd: BorrowedFd<'_>, signal: nix::sys::signal::Signal) -> std::io::Result<()> {
    // SAFETY: pidfd_send_signal takes a descriptor, a signal number, a null siginfo
    // and flags; it touches no memory of this process.
    let r = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal as i32,
            std::ptr::null::<nix::libc::siginfo_t>(),
            0,
        )
    };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(nix::libc::ESRCH) {
            return Err(e);
        }
    }
    Ok(())
}
