//! A real gRPC health server (`grpc.health.v1.Health/Check`) on loopback, for the
//! node's gRPC probes to ask. Wasm pods share the node's network, so a probe of a Wasm
//! pod's port reaches it there.
//!
//! Services: `""` answers SERVING once [`HealthServer::set_serving`] was called with
//! `true` (NOT_SERVING before), `live` is always SERVING, `db` always NOT_SERVING, any
//! other name is `NotFound`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use wasmlet_proto::grpc::health::v1::{
    HealthCheckRequest, HealthCheckResponse,
    health_check_response::ServingStatus,
    health_server::{Health, HealthServer as Service},
};

/// The server; it stops when dropped.
pub struct HealthServer {
    pub port: u16,
    serving: Arc<AtomicBool>,
    runtime: Option<tokio::runtime::Runtime>,
}

struct Checks(Arc<AtomicBool>);

#[tonic::async_trait]
impl Health for Checks {
    async fn check(
        &self,
        request: tonic::Request<HealthCheckRequest>,
    ) -> Result<tonic::Response<HealthCheckResponse>, tonic::Status> {
        let up = self.0.load(Ordering::SeqCst);
        let status = match request.into_inner().service.as_str() {
            "live" => ServingStatus::Serving,
            "db" => ServingStatus::NotServing,
            "" if up => ServingStatus::Serving,
            "" => ServingStatus::NotServing,
            other => return Err(tonic::Status::not_found(format!("unknown service {other}"))),
        };
        Ok(tonic::Response::new(HealthCheckResponse {
            status: status as i32,
        }))
    }

    type WatchStream = futures::stream::Empty<Result<HealthCheckResponse, tonic::Status>>;

    async fn watch(
        &self,
        _: tonic::Request<HealthCheckRequest>,
    ) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("watch"))
    }
}

impl HealthServer {
    /// Serves on a free loopback port from a runtime of its own.
    pub fn start(serving: bool) -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        // Bound here (no blocking on the new runtime: the caller may be async).
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let flag = Arc::new(AtomicBool::new(serving));
        let checks = Checks(flag.clone());
        runtime.spawn(async move {
            let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                return;
            };
            let incoming = futures::stream::unfold(listener, |l| async move {
                let conn = l.accept().await.map(|(s, _)| s);
                Some((conn, l))
            });
            let _ = tonic::transport::Server::builder()
                .add_service(Service::new(checks))
                .serve_with_incoming(incoming)
                .await;
        });
        Ok(HealthServer {
            port,
            serving: flag,
            runtime: Some(runtime),
        })
    }

    /// What the server as a whole (`""`) answers from now on.
    pub fn set_serving(&self, serving: bool) {
        self.serving.store(serving, Ordering::SeqCst);
    }
}

impl Drop for HealthServer {
    fn drop(&mut self) {
        // Without waiting: the server may be dropped inside an async test.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
