//! `streamingConnectionIdleTimeout` (default 4 h) for the streams the node serves
//! itself: an upgraded connection on which nothing was read or written for that long
//! is ended, as spdystream's idle-aware framer and wsstream's read deadline end the
//! kubelet's. The connection is wrapped in [`Idle`]: every read or write that moves
//! bytes is activity, and a read that waits past the deadline fails with
//! `TimedOut`. The node's stream servers always have a read pending (the next SPDY
//! frame, the next WebSocket message), so that failure ends the session and, with
//! it, the exec, attach or port-forward it carried.
//!
//! Streams of container pods are relayed to the runtime's streaming server, which
//! applies its own (containerd's `stream_idle_timeout`, also 4 h by default).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// A connection that fails its reads once it has been idle for `timeout`.
pub struct Idle<T> {
    inner: T,
    timeout: Duration,
    last_activity: Instant,
    timer: Pin<Box<Sleep>>,
}

impl<T> Idle<T> {
    pub fn new(inner: T, timeout: Duration) -> Self {
        let now = Instant::now();
        Idle {
            inner,
            timeout,
            last_activity: now,
            timer: Box::pin(tokio::time::sleep_until(now + timeout)),
        }
    }

    fn touch(&mut self) {
        self.last_activity = Instant::now();
    }

    /// Ready with the error once the connection has been idle for the timeout; the
    /// timer is moved on (and its waker registered) while it has not.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        loop {
            let deadline = self.last_activity + self.timeout;
            if self.timer.deadline() != deadline {
                self.timer.as_mut().reset(deadline);
            }
            ready!(self.timer.as_mut().poll(cx));
            if self.last_activity + self.timeout <= Instant::now() {
                return Poll::Ready(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "no bytes in either direction for {:?} (streamingConnectionIdleTimeout)",
                        self.timeout
                    ),
                ));
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Idle<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    this.touch();
                }
                Poll::Ready(r)
            }
            Poll::Pending => match this.poll_idle(cx) {
                Poll::Ready(e) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Idle<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = ready!(Pin::new(&mut this.inner).poll_write(cx, data));
        if matches!(r, Ok(n) if n > 0) {
            this.touch();
        }
        Poll::Ready(r)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const TIMEOUT: Duration = Duration::from_secs(4 * 60 * 60);

    #[tokio::test(start_paused = true)]
    async fn a_connection_with_no_bytes_for_the_timeout_fails_its_read() {
        let (_client, server) = tokio::io::duplex(64);
        let mut conn = Idle::new(server, TIMEOUT);
        let started = Instant::now();
        let err = conn.read(&mut [0u8; 8]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), TIMEOUT);
        assert!(err.to_string().contains("streamingConnectionIdleTimeout"));
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_either_way_keep_it_open_and_the_timeout_counts_from_the_last() {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let (mut rd, mut wr) = tokio::io::split(Idle::new(server, TIMEOUT));
        let started = Instant::now();
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            let mut buf = [0u8; 8];
            loop {
                match rd.read(&mut buf).await {
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                    Err(e) => return (got, e.kind(), Instant::now()),
                }
            }
        });
        // The client writes at 3 h, the node writes at 6 h: the connection is never
        // idle for 4 h until the node's write is 4 h old.
        tokio::time::sleep(Duration::from_secs(3 * 3600)).await;
        client.write_all(b"in").await.unwrap();
        tokio::time::sleep(Duration::from_secs(3 * 3600)).await;
        wr.write_all(b"out").await.unwrap();
        let (got, kind, ended) = reader.await.unwrap();
        assert_eq!(got, b"in");
        assert_eq!(kind, io::ErrorKind::TimedOut);
        assert_eq!(ended - started, Duration::from_secs(10 * 3600));
        let mut out = [0u8; 3];
        client.read_exact(&mut out).await.unwrap();
        assert_eq!(&out, b"out");
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_spdy_session_ends_with_its_streams() {
        use crate::server::spdy::{Frame, HeaderCodec, Session, encode_frame};
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let mut session = Session::start(Idle::new(server, TIMEOUT));
        let open = Frame::SynStream {
            id: 1,
            headers: vec![("streamtype".into(), "stdout".into())],
            fin: false,
        };
        let bytes = encode_frame(&open, &mut HeaderCodec::new()).unwrap();
        client.write_all(&bytes).await.unwrap();
        let stream = session.accept().await.unwrap();
        let started = Instant::now();
        stream.writer.closed().await;
        assert_eq!(started.elapsed(), TIMEOUT);
        assert!(session.accept().await.is_none());
        drop(stream);
        // The client reads the SYN_REPLY, then the end of the connection.
        let mut rest = Vec::new();
        client.read_to_end(&mut rest).await.unwrap();
        assert!(!rest.is_empty());
    }
}
