//! What one call's `Store` holds: the WASI sandbox, the memory limiter, captured
//! stdio, and the implementation of the `host` and `pod-network` interfaces.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use crate::bindings::probe::wasmlet::plugin::{host, pod_network, types};
use crate::config::PluginConfig;
use crate::engine::{MAX_CORE_INSTANCES_PER_COMPONENT, MAX_MEMORIES_PER_COMPONENT};
use crate::network::PodNetwork;
use crate::types::{HttpResponse, Level, Pair};

/// `host.log` cuts longer lines.
pub(crate) const LOG_LINE_MAX: usize = 4096;
/// `host.log` drops lines beyond this many per call; stdout and stderr too.
pub(crate) const LOG_LINES_PER_CALL: u32 = 100;
/// Stdout and stderr keep this much of one call's output.
pub(crate) const STDIO_CAPTURE_MAX: usize = 64 * 1024;

/// The store data of one call.
pub(crate) struct CallState {
    plugin: Arc<str>,
    settings: Arc<Vec<Pair>>,
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) limiter: MemoryLimiter,
    log_lines: u32,
    pod_network: Option<PodNetwork>,
    stdout: Captured,
    stderr: Captured,
}

impl CallState {
    /// The sandbox for one call of `config`'s plugin: nothing but what its grants say.
    pub(crate) fn new(
        plugin: Arc<str>,
        config: &PluginConfig,
        settings: Arc<Vec<Pair>>,
        pod_network: Option<PodNetwork>,
    ) -> Result<Self, String> {
        let stdout = Captured::default();
        let stderr = Captured::default();
        let mut wasi = WasiCtxBuilder::new();
        wasi.stdout(stdout.clone()).stderr(stderr.clone());
        if config.grants.network {
            wasi.inherit_network()
                .allow_tcp(true)
                .allow_udp(true)
                .allow_ip_name_lookup(true);
        } else {
            wasi.allow_tcp(false)
                .allow_udp(false)
                .allow_ip_name_lookup(false)
                .socket_addr_check(|_, _| Box::pin(async { false }));
        }
        for grant in &config.grants.filesystem {
            let perms = if grant.read_only {
                FsPerms::ReadOnly
            } else {
                FsPerms::ReadWrite
            };
            wasi.preopened_dir(&grant.host_path, &grant.guest_path, perms)
                .map_err(|e| {
                    format!(
                        "opening the granted directory {}: {e:#}",
                        grant.host_path.display()
                    )
                })?;
        }
        Ok(CallState {
            plugin,
            settings,
            wasi: wasi.build(),
            table: {
                // Handles (streams, pollables, sockets) a call may hold at once:
                // beyond this, a plugin's resource leak traps instead of growing
                // the node's memory.
                let mut table = ResourceTable::new();
                table.set_max_capacity(RESOURCE_TABLE_MAX);
                table
            },
            limiter: MemoryLimiter::new(config.limits.memory_bytes),
            log_lines: 0,
            pod_network,
            stdout,
            stderr,
        })
    }

    /// Gives the call the pod network it may reach (a probe's pod IPs), or none.
    pub(crate) fn set_pod_network(&mut self, network: Option<PodNetwork>) {
        self.pod_network = network;
    }

    /// Writes what the plugin printed to the node's log, tagged with its name.
    pub(crate) fn flush_stdio(&self) {
        self.stdout.drain_to_log(&self.plugin, "stdout");
        self.stderr.drain_to_log(&self.plugin, "stderr");
    }
}

/// The most resource handles one call may hold.
const RESOURCE_TABLE_MAX: usize = 10_000;

impl WasiView for CallState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl types::Host for CallState {}

impl host::Host for CallState {
    async fn log(&mut self, level: Level, message: String) -> wasmtime::Result<()> {
        self.log_lines += 1;
        if self.log_lines > LOG_LINES_PER_CALL {
            if self.log_lines == LOG_LINES_PER_CALL + 1 {
                tracing::warn!(plugin = %self.plugin, "more than {LOG_LINES_PER_CALL} log lines in one call, dropping the rest");
            }
            return Ok(());
        }
        let message = cut(&message, LOG_LINE_MAX);
        let plugin = &*self.plugin;
        match level {
            Level::Trace => tracing::trace!(target: "plugin", plugin, "{message}"),
            Level::Debug => tracing::debug!(target: "plugin", plugin, "{message}"),
            Level::Info => tracing::info!(target: "plugin", plugin, "{message}"),
            Level::Warn => tracing::warn!(target: "plugin", plugin, "{message}"),
            Level::Error => tracing::error!(target: "plugin", plugin, "{message}"),
        }
        Ok(())
    }

    async fn settings(&mut self) -> wasmtime::Result<Vec<Pair>> {
        Ok(self.settings.as_ref().clone())
    }

    async fn now_ms(&mut self) -> wasmtime::Result<u64> {
        Ok(std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
            .as_millis() as u64)
    }
}

/// What `pod-network` answers outside a probe call.
const NO_NETWORK: &str = "pod-network is only offered to probe calls";

impl pod_network::Host for CallState {
    async fn http_get(
        &mut self,
        ip: String,
        port: u16,
        path: String,
        headers: Vec<Pair>,
    ) -> wasmtime::Result<Result<HttpResponse, String>> {
        let Some(net) = &self.pod_network else {
            return Ok(Err(NO_NETWORK.into()));
        };
        let result = net.http_get(&ip, port, &path, &headers).await;
        if let Err(e) = &result {
            tracing::debug!(plugin = %self.plugin, "http-get refused or failed: {e}");
        }
        Ok(result)
    }

    async fn tcp_connect(&mut self, ip: String, port: u16) -> wasmtime::Result<Result<(), String>> {
        let Some(net) = &self.pod_network else {
            return Ok(Err(NO_NETWORK.into()));
        };
        Ok(net.tcp_connect(&ip, port).await)
    }
}

/// `s` cut to at most `max` bytes, at a character boundary.
pub(crate) fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The plugin grew its memory past its cap.
#[derive(Debug, thiserror::Error)]
#[error("memory cap of {cap} bytes exceeded: the plugin asked for {asked} bytes in all")]
pub(crate) struct MemoryCapExceeded {
    pub(crate) cap: u64,
    pub(crate) asked: u64,
}

/// Caps the total of the component's linear memories; a grow past the cap traps
/// with [`MemoryCapExceeded`].
pub(crate) struct MemoryLimiter {
    cap: u64,
    total: u64,
    pub(crate) exceeded: bool,
}

impl MemoryLimiter {
    fn new(cap: u64) -> Self {
        MemoryLimiter {
            cap,
            total: 0,
            exceeded: false,
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
        let asked = self.total - current as u64 + desired as u64;
        if asked > self.cap {
            self.exceeded = true;
            return Err(MemoryCapExceeded {
                cap: self.cap,
                asked,
            }
            .into());
        }
        self.total = asked;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= crate::engine::MAX_TABLE_ELEMENTS)
    }

    fn instances(&self) -> usize {
        MAX_CORE_INSTANCES_PER_COMPONENT as usize
    }

    fn tables(&self) -> usize {
        64
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES_PER_COMPONENT as usize
    }
}

/// A plugin's stdout or stderr: the first [`STDIO_CAPTURE_MAX`] bytes of a call are
/// kept and logged when the call ends; the rest is dropped.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn append(&self, bytes: &[u8]) {
        let mut buf = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let room = STDIO_CAPTURE_MAX.saturating_sub(buf.len());
        buf.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    fn drain_to_log(&self, plugin: &str, stream: &'static str) {
        let buf = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        if buf.is_empty() {
            return;
        }
        let text = String::from_utf8_lossy(&buf);
        for line in text.lines().take(LOG_LINES_PER_CALL as usize) {
            tracing::info!(target: "plugin", plugin, stream, "{}", cut(line, LOG_LINE_MAX));
        }
    }
}

impl IsTerminal for Captured {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Captured {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for Captured {
    fn write(&mut self, bytes: Bytes) -> Result<(), StreamError> {
        self.append(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(STDIO_CAPTURE_MAX)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for Captured {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for Captured {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.append(buf);
        Poll::Ready(Ok(buf.len()))
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
    fn cut_keeps_whole_characters() {
        assert_eq!(cut("abc", 5), "abc");
        assert_eq!(cut("abc", 2), "ab");
        assert_eq!(cut("aé", 2), "a");
    }

    #[test]
    fn the_limiter_caps_all_memories_together() {
        let mut l = MemoryLimiter::new(10 << 16);
        assert!(l.memory_growing(0, 6 << 16, None).unwrap());
        assert!(l.memory_growing(0, 3 << 16, None).unwrap());
        let err = l.memory_growing(3 << 16, 5 << 16, None).unwrap_err();
        assert!(err.downcast_ref::<MemoryCapExceeded>().is_some());
        assert!(l.exceeded);
        assert!(l.memory_growing(3 << 16, 4 << 16, None).unwrap());
    }

    #[test]
    fn captured_output_is_bounded() {
        let c = Captured::default();
        c.append(&vec![b'x'; STDIO_CAPTURE_MAX + 10]);
        c.append(b"more");
        assert_eq!(c.0.lock().unwrap().len(), STDIO_CAPTURE_MAX);
    }
}
