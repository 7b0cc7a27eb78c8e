//! Guest stdout and stderr: a container's go straight into its CRI log file, an
//! exec's into a capped buffer that goes back to the node with the exec's reply.

use bytes::Bytes;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError, StreamResult};

use crate::crilog::{CriLog, Stream};

/// One of a guest's output streams. Writes are synchronous and small (a line at a
/// time), so the output is complete the moment the guest exits.
#[derive(Clone)]
pub enum GuestOutput {
    /// A container's stream, into its CRI log.
    Log { log: CriLog, stream: Stream },
    /// An exec's stream, into a buffer.
    Capture(Capture),
}

impl GuestOutput {
    fn put(&self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            GuestOutput::Log { log, stream } => log.write(*stream, bytes),
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
