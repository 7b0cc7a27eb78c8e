//! Guest stdout and stderr, written straight into the container's CRI log file.

use bytes::Bytes;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError, StreamResult};

use crate::crilog::{CriLog, Stream};

/// One of a guest's output streams. Writes are synchronous and small (a line at a
/// time), so the log is complete the moment the guest exits.
#[derive(Clone)]
pub struct CriOutput {
    log: CriLog,
    stream: Stream,
}

impl CriOutput {
    pub fn new(log: CriLog, stream: Stream) -> Self {
        CriOutput { log, stream }
    }
}

impl IsTerminal for CriOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CriOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CriOutput {
    async fn ready(&mut self) {}
}

impl OutputStream for CriOutput {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.log
            .write(self.stream, &bytes)
            .map_err(|e| StreamError::LastOperationFailed(wasmtime::format_err!(e)))
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

impl AsyncWrite for CriOutput {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Poll::Ready(self.log.write(self.stream, buf).map(|()| buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
