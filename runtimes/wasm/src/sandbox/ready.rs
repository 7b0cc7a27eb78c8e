//! How whoever starts a sandbox process (the node, the containerd shim) learns that it
//! listens: the process writes [`LISTENING`] to its standard output, a pipe, once its
//! control socket accepts connections, then points its standard output at `/dev/null`.
//! The starter reads the pipe: no polling of the socket, and the end of the pipe
//! without the line means the process is gone.

use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::Child;

/// The line a sandbox process writes once it listens.
pub const LISTENING: &[u8] = b"listening\n";

/// Why a sandbox process did not come to listen.
#[derive(Debug, thiserror::Error)]
pub enum NotListening {
    /// How it ended, as far as its starter can see ([`Starting::ended`]).
    #[error("ended ({0}) before listening")]
    Ended(String),
    #[error("did not listen within {0:?}")]
    Timeout(Duration),
    #[error("wrote {0:?} instead of saying it listens")]
    Unexpected(String),
    #[error("reading its standard output: {0}")]
    Io(#[from] std::io::Error),
}

/// A sandbox process as its starter holds it: its own child, or one a zygote forked.
pub trait Starting {
    /// Waits until it has ended; how, as far as the starter can see.
    fn ended(&mut self) -> impl Future<Output = String>;
    /// Sends it SIGKILL; [`Starting::ended`] waits for it.
    fn sigkill(&mut self);
}

impl Starting for Child {
    async fn ended(&mut self) -> String {
        match self.wait().await {
            Ok(status) => status.to_string(),
            Err(e) => format!("wait failed: {e}"),
        }
    }

    fn sigkill(&mut self) {
        let _ = self.start_kill();
    }
}

/// Tells the process's starter that it listens (see the module's documentation).
/// Nothing is written to standard output afterwards; `/dev/null` takes its place so
/// that a stray write later neither blocks nor fails on a pipe nobody reads.
pub(crate) fn announce() {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    // A starter that does not read (a pipe it closed, `/dev/null`) changes nothing.
    let _ = out.write_all(LISTENING).and_then(|()| out.flush());
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        let _ = nix::unistd::dup2_stdout(&null);
    }
}

/// What a sandbox process's standard output said before [`wait_listening`]'s deadline.
#[derive(Debug)]
enum Said {
    /// [`LISTENING`].
    Listening,
    /// Nothing, and the pipe closed: the process is ending.
    Closed,
    /// Something else.
    Unexpected(String),
    /// Nothing yet at the deadline.
    Nothing,
}

/// Reads what the sandbox process whose standard output is `out` says until
/// `deadline` (see the module's documentation).
async fn read_listening(
    mut out: impl tokio::io::AsyncRead + Unpin,
    deadline: tokio::time::Instant,
) -> std::io::Result<Said> {
    let read = tokio::time::timeout_at(deadline, async {
        let mut said = Vec::with_capacity(LISTENING.len());
        let mut buf = [0u8; 64];
        while said.len() < LISTENING.len() {
            let n = out.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            said.extend_from_slice(&buf[..n]);
        }
        std::io::Result::Ok(said)
    })
    .await;
    Ok(match read {
        Err(_) => Said::Nothing,
        Ok(said) => {
            let said = said?;
            if said == LISTENING {
                Said::Listening
            } else if said.is_empty() {
                Said::Closed
            } else {
                Said::Unexpected(String::from_utf8_lossy(&said).into_owned())
            }
        }
    })
}

/// Waits until `child`, a sandbox process started with its standard output piped, says
/// it listens (see [`wait_listening_of`]).
pub async fn wait_listening(child: &mut Child, timeout: Duration) -> Result<(), NotListening> {
    let Some(out) = child.stdout.take() else {
        return Err(std::io::Error::other("its standard output is not a pipe").into());
    };
    wait_listening_of(child, out, timeout).await
}

/// Waits until `process`, whose standard output is `out`, says it listens. It is
/// killed when it has not within `timeout`, or when it wrote anything else; when it
/// ends first, how it ended is the error.
pub async fn wait_listening_of(
    process: &mut impl Starting,
    out: impl tokio::io::AsyncRead + Unpin,
    timeout: Duration,
) -> Result<(), NotListening> {
    let deadline = tokio::time::Instant::now() + timeout;
    let outcome = match read_listening(out, deadline).await {
        Ok(Said::Listening) => return Ok(()),
        Ok(Said::Closed) => match tokio::time::timeout_at(deadline, process.ended()).await {
            Ok(how) => return Err(NotListening::Ended(how)),
            Err(_) => NotListening::Timeout(timeout),
        },
        Ok(Said::Unexpected(said)) => NotListening::Unexpected(said),
        Ok(Said::Nothing) => NotListening::Timeout(timeout),
        Err(e) => NotListening::Io(e),
    };
    process.sigkill();
    let _ = process.ended().await;
    Err(outcome)
}
