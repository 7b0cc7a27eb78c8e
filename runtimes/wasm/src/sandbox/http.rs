//! Serving a `wasi:http/proxy` component: a container whose component exports
//! `wasi:http/incoming-handler@0.2` is an HTTP server, not a command. The sandbox
//! listens on the container's first TCP port ([`DEFAULT_HTTP_PORT`] without one) in
//! the pod's network, serves HTTP/1.1 with keep-alive (hyper), and hands each request
//! to a new instance of the component, made from the container's pre-linked
//! `ProxyPre` in a store of its own:
//!
//! - with the container's memory limit (as it is at that moment) for that request's
//!   memories, its environment and preopens, its stdout and stderr into the
//!   container's log;
//! - at most [`MAX_CONCURRENCY`] requests of one container at a time (the rest wait
//!   for a slot);
//! - a request whose handler has not answered within [`REQUEST_TIMEOUT`] gets a 504
//!   and its instance is dropped at its next epoch tick. CPU is the pod cgroup's to
//!   limit, as for every other guest of the pod.
//!
//! Each request is logged to the container's stdout as
//! `<method> <path> <status> <milliseconds>ms`. The server runs until the container
//! is stopped; a handler that traps answers 500 and the server goes on.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::server::conn::http1;
use tokio::sync::Semaphore;
use wasmtime::{Engine, Store};
use wasmtime_wasi::WasiCtxBuilder;
use wasmtime_wasi_http::WasiHttpView;
use wasmtime_wasi_http::p2::bindings::ProxyPre;
use wasmtime_wasi_http::p2::bindings::http::types::{ErrorCode, Scheme};

use super::{MemoryCap, P2State};
use crate::crilog::{CriLog, Stream};
use crate::protocol::Exit;
use crate::stdio::{AttachHub, GuestOutput};

/// Where a proxy component is served when its container declares no port.
pub const DEFAULT_HTTP_PORT: u16 = 8080;
/// Requests of one container handled at once.
pub const MAX_CONCURRENCY: usize = 64;
/// How long a handler has to answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

type Body = UnsyncBoxBody<Bytes, wasmtime_wasi_http::Error>;

/// What the server needs for each request.
pub(super) struct Proxy {
    pub engine: Engine,
    pub epoch: super::Epoch,
    pub pre: ProxyPre<P2State>,
    /// The container's WASI context, less its stdio, made anew per request.
    pub wasi: Box<dyn Fn() -> wasmtime::Result<WasiCtxBuilder> + Send + Sync>,
    pub log: CriLog,
    /// The container's attached clients, who see its output.
    pub attached: Arc<AttachHub>,
    /// The container's memory cap (its current limit applies to each new request).
    pub memory: Arc<MemoryCap>,
    pub slots: Semaphore,
}

/// Serves until the listener fails; the caller cancels it to stop the container.
pub(super) async fn serve(proxy: Arc<Proxy>, port: u16) -> Exit {
    let addr = SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            return Exit {
                code: 1,
                reason: "Error".into(),
                message: format!("wasi:http/proxy: cannot listen on {addr}: {e}"),
            };
        }
    };
    let _ = proxy.log.write(
        Stream::Stdout,
        format!("wasi:http/proxy serving on {addr}\n").as_bytes(),
    );
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors or the like: the next accept may work.
                tracing::warn!("wasi:http/proxy: accept: {e}");
                tokio::task::yield_now().await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let proxy = proxy.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let proxy = proxy.clone();
                async move { Ok::<_, std::convert::Infallible>(handle(&proxy, req).await) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            if let Err(e) = http1::Builder::new()
                .keep_alive(true)
                .serve_connection(io, service)
                .await
            {
                tracing::debug!("wasi:http/proxy: connection: {e}");
            }
        });
    }
}

/// One request: a slot, a new instance, its answer (or the server's own error
/// answer), and the log line.
async fn handle(
    proxy: &Proxy,
    req: hyper::Request<hyper::body::Incoming>,
) -> hyper::Response<Body> {
    let began = Instant::now();
    let method = req.method().clone();
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "/".into());
    let response = match proxy.slots.acquire().await {
        Ok(_permit) => match tokio::time::timeout(REQUEST_TIMEOUT, call(proxy, req)).await {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => {
                let _ = proxy.log.write(
                    Stream::Stderr,
                    format!("wasi:http/proxy: {method} {path}: {e:#}\n").as_bytes(),
                );
                plain(500, "the handler failed\n")
            }
            Err(_) => plain(504, "the handler did not answer in time\n"),
        },
        Err(_) => plain(503, "the server is stopping\n"),
    };
    let line = format!(
        "{method} {path} {} {}ms\n",
        response.status().as_u16(),
        began.elapsed().as_millis()
    );
    let _ = proxy.log.write(Stream::Stdout, line.as_bytes());
    response
}

/// Runs the component's handler on `req` in a new instance; its response (whose body
/// the instance goes on writing after this returns).
async fn call(
    proxy: &Proxy,
    req: hyper::Request<hyper::body::Incoming>,
) -> wasmtime::Result<hyper::Response<Body>> {
    let mut wasi = (proxy.wasi)()?;
    let output = |stream| GuestOutput::Log {
        log: proxy.log.clone(),
        stream,
        attached: proxy.attached.clone(),
    };
    wasi.stdout(output(Stream::Stdout))
        .stderr(output(Stream::Stderr));
    let memory = Arc::new(MemoryCap::new(proxy.memory.limit()));
    let mut store = Store::new(&proxy.engine, P2State::new(wasi.build(), memory));
    store.limiter(|s| &mut s.limiter);
    proxy.epoch.yield_at_ticks(&mut store);
    let (sender, receiver) = tokio::sync::oneshot::channel();
    let incoming = store
        .data_mut()
        .http()
        .new_incoming_request(Scheme::Http, req)?;
    let out = store.data_mut().http().new_response_outparam(sender)?;
    let instance = proxy.pre.instantiate_async(&mut store).await?;
    let task = tokio::spawn(async move {
        instance
            .wasi_http_incoming_handler()
            .call_handle(&mut store, incoming, out)
            .await
    });
    match receiver.await {
        Ok(Ok(response)) => Ok(response),
        Ok(Err(code)) => Ok(error_response(&code)),
        // The handler returned (or trapped) without answering.
        Err(_) => match task.await {
            Ok(Ok(())) => wasmtime::bail!("the handler returned without a response"),
            Ok(Err(e)) => Err(e),
            Err(e) => wasmtime::bail!("the handler's task ended: {e}"),
        },
    }
}

fn error_response(code: &ErrorCode) -> hyper::Response<Body> {
    plain(
        500,
        &format!("the handler answered with an error: {code:?}\n"),
    )
}

fn plain(status: u16, text: &str) -> hyper::Response<Body> {
    let body = http_body_util::Full::new(Bytes::from(text.to_owned()))
        .map_err(|never| match never {})
        .boxed_unsync();
    hyper::Response::builder()
        .status(status)
        .header("content-type", "text/plain")
        .body(body)
        .expect("a valid response")
}
