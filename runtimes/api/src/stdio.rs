//! A live connection to a process's stdio, for the runtimes that serve `exec` and
//! `attach` streams themselves.

use std::future::Future;
use std::pin::Pin;

use tokio::io::{AsyncRead, AsyncWrite};

use crate::Result;

/// The stdio of one process in a container, as [`crate::Runtime::exec_stdio`] and
/// [`crate::Runtime::attach_stdio`] give it. Each stream is there when the client
/// asked for it (with a TTY, stderr is merged into stdout and is `None`).
pub struct StdioSession {
    /// The process's stdin; shutting it down is the client's half-close.
    pub stdin: Option<Box<dyn AsyncWrite + Send + Unpin>>,
    /// Ends when the process (or the attached container) closes its stdout.
    pub stdout: Option<Box<dyn AsyncRead + Send + Unpin>>,
    pub stderr: Option<Box<dyn AsyncRead + Send + Unpin>>,
    /// Resolves when the process has ended, with its exit code (mapped as a
    /// container's); an error when the session broke before that.
    pub exit: Pin<Box<dyn Future<Output = Result<i32>> + Send>>,
}

impl std::fmt::Debug for StdioSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StdioSession")
            .field("stdin", &self.stdin.is_some())
            .field("stdout", &self.stdout.is_some())
            .field("stderr", &self.stderr.is_some())
            .finish_non_exhaustive()
    }
}
