//! Guest stdio. A container's stdout and stderr go straight into its CRI log file and
//! to the clients attached to it ([`AttachHub`]); an `Op::Exec`'s into a capped
//! buffer that goes back to the node with the exec's reply; a streamed exec's into
//! pipes the sandbox relays (wasmtime-wasi's own async streams, which hold a guest
//! back while its reader is behind).

use bytes::Bytes;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::{AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::sync::mpsc;
use wasmtime_wasi::cli::{IsTerminal, StdinStream, StdoutStream};
use wasmtime_wasi::p2::{InputStream, OutputStream, Pollable, StreamError, StreamResult};

use crate::crilog::{CriLog, Stream};

/// One of a guest's output streams. Writes are synchronous and small (a line at a
/// time), so the output is complete the moment the guest exits.
#[derive(Clone)]
pub enum GuestOutput {
    /// A container's stream, into its CRI log and to its attached clients.
    Log {
        log: CriLog,
        stream: Stream,
        attached: Arc<AttachHub>,
    },
    /// An exec's stream, into a buffer.
    Capture(Capture),
}

impl GuestOutput {
    fn put(&self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            GuestOutput::Log {
                log,
                stream,
                attached,
            } => {
                attached.publish(*stream, bytes);
                log.write(*stream, bytes)
            }
            GuestOutput::Capture(capture) => {
                capture.write(bytes);
                Ok(())
            }
        }
    }
}

/// A buffer that keeps the first `limit` bytes written to it and drops the rest, so a
/// chatty exec neither fails nor grows the sandbox.
#[derive(Clone)]
pub struct Capture {
    buffer: Arc<Mutex<Vec<u8>>>,
    limit: usize,
}

impl Capture {
    pub fn new(limit: usize) -> Self {
        Capture {
            buffer: Arc::default(),
            limit,
        }
    }

    /// What was kept so far.
    pub fn contents(&self) -> Vec<u8> {
        self.buffer.lock().unwrap().clone()
    }

    fn write(&self, bytes: &[u8]) {
        let mut buffer = self.buffer.lock().unwrap();
        let room = self.limit.saturating_sub(buffer.len());
        buffer.extend_from_slice(&bytes[..room.min(bytes.len())]);
    }
}

/// How many chunks of output an attached client may fall behind before the ones that
/// follow are dropped for it: a slow client never holds the container back.
pub const ATTACH_BACKLOG: usize = 256;

/// A running container's attached clients: each gets the output written from the
/// moment it attached, and — when the container keeps its stdin open — writes to the
/// guest's stdin.
pub struct AttachHub {
    listeners: Mutex<Vec<mpsc::Sender<(Stream, Bytes)>>>,
    /// The writing end of the guest's stdin; `None` without one, or once closed.
    stdin: tokio::sync::Mutex<Option<DuplexStream>>,
    /// Whether the container has a stdin at all.
    pub has_stdin: bool,
    /// Whether the stdin closes when the first client that wrote to it leaves.
    pub stdin_once: bool,
}

impl AttachHub {
    /// A hub for a container, and the guest's end of its stdin when `stdin`.
    pub fn new(stdin: bool, stdin_once: bool) -> (Arc<Self>, Option<DuplexStream>) {
        let (reader, writer) = if stdin {
            let (r, w) = tokio::io::duplex(PIPE_CAPACITY);
            (Some(r), Some(w))
        } else {
            (None, None)
        };
        let hub = AttachHub {
            listeners: Mutex::default(),
            stdin: tokio::sync::Mutex::new(writer),
            has_stdin: stdin,
            stdin_once,
        };
        (Arc::new(hub), reader)
    }

    /// A new client's view of the output from now on.
    pub fn subscribe(&self) -> mpsc::Receiver<(Stream, Bytes)> {
        let (tx, rx) = mpsc::channel(ATTACH_BACKLOG);
        self.listeners.lock().unwrap().push(tx);
        rx
    }

    fn publish(&self, stream: Stream, bytes: &[u8]) {
        let mut listeners = self.listeners.lock().unwrap();
        if listeners.is_empty() {
            return;
        }
        let chunk = Bytes::copy_from_slice(bytes);
        listeners.retain(|tx| {
            !matches!(
                tx.try_send((stream, chunk.clone())),
                Err(mpsc::error::TrySendError::Closed(_))
            )
        });
    }

    /// Writes a client's bytes to the guest's stdin; `false` once it is closed.
    pub async fn write_stdin(&self, bytes: &[u8]) -> bool {
        let mut stdin = self.stdin.lock().await;
        match stdin.as_mut() {
            Some(w) => {
                if w.write_all(bytes).await.is_err() {
                    *stdin = None;
                    return false;
                }
                true
            }
            None => false,
        }
    }

    /// Closes the guest's stdin: it reads end of file once it has read what was written.
    pub async fn close_stdin(&self) {
        if let Some(mut w) = self.stdin.lock().await.take() {
            let _ = w.shutdown().await;
        }
    }
}

/// How many bytes a stdio pipe buffers before the writer waits.
pub const PIPE_CAPACITY: usize = 64 * 1024;

/// A stdio stream that says it is a terminal (`tty` in the spec or the exec): the
/// bytes are the same, only `isatty` changes — WASI has no terminal size or modes.
pub struct Terminal<T>(pub T);

impl<T> IsTerminal for Terminal<T> {
    fn is_terminal(&self) -> bool {
        true
    }
}

impl<T: StdinStream> StdinStream for Terminal<T> {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncRead + Send + Sync> {
        self.0.async_stream()
    }

    fn p2_stream(&self) -> Box<dyn InputStream> {
        self.0.p2_stream()
    }
}

impl<T: StdoutStream> StdoutStream for Terminal<T> {
    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        self.0.async_stream()
    }

    fn p2_stream(&self) -> Box<dyn OutputStream> {
        self.0.p2_stream()
    }
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for GuestOutput {
    async fn ready(&mut self) {}
}

impl OutputStream for GuestOutput {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.put(&bytes)
            .map_err(|e| StreamError::LastOperationFailed(wasmtime::format_err!(e)))
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

impl AsyncWrite for GuestOutput {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Poll::Ready(self.put(buf).map(|()| buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capture_keeps_the_first_bytes_up_to_its_limit() {
        let capture = Capture::new(5);
        let out = GuestOutput::Capture(capture.clone());
        for (write, kept) in [
            (&b"abc"[..], &b"abc"[..]),
            (b"defg", b"abcde"),
            (b"h", b"abcde"),
            (b"", b"abcde"),
        ] {
            out.put(write).unwrap();
            assert_eq!(capture.contents(), kept, "after writing {write:?}");
        }
    }
}
