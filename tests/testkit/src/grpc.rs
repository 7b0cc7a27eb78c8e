//! gRPC servers of the testkit on unix sockets (device plugins, CSI drivers): each
//! runs on a runtime of its own, so a synchronous test can start and drop it.

use std::path::Path;

use tonic::transport::server::Router;

/// A fresh unix socket at `socket` (a stale one removed), bound now so that a client
/// can connect as soon as this returns.
pub fn bind(socket: &Path) -> anyhow::Result<std::os::unix::net::UnixListener> {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let _ = std::fs::remove_file(socket);
    let listener = std::os::unix::net::UnixListener::bind(socket)?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// A one-thread runtime for a server.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?)
}

/// Serves `router` on `listener` from `runtime` until the runtime is dropped.
pub fn serve(
    runtime: &tokio::runtime::Runtime,
    listener: std::os::unix::net::UnixListener,
    router: Router,
) {
    runtime.spawn(async move {
        let Ok(listener) = tokio::net::UnixListener::from_std(listener) else {
            return;
        };
        let incoming = futures::stream::unfold(listener, |l| async move {
            let conn = l.accept().await.map(|(s, _)| s);
            Some((conn, l))
        });
        let _ = router.serve_with_incoming(incoming).await;
    });
}
