//! Integration tests of the CRI backend.
//!
//! One test binary with a module per topic, so the link step is paid once:
//! [`fake`] is an in-process CRI server on a unix socket; [`seam`] drives
//! [`wasmlet_runtime_cri::CriRuntime`] against it (lazy connection, recovery,
//! version negotiation, deadlines, error codes, idempotency, field usage);
//! [`events`] covers the `GetContainerEvents` follower; [`containerd`] runs a
//! busybox pod through a real, private containerd (wasmlet-testkit).

mod containerd;
mod events;
mod fake;
mod seam;

use std::path::{Path, PathBuf};
use std::time::Duration;

use tempfile::TempDir;
use wasmlet_runtime_cri::{CriConfig, CriRuntime};

use crate::fake::{Fake, Server};

/// The fake's socket in a fresh directory; nothing listens on it yet.
pub fn socket_dir() -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("cri.sock");
    (dir, path)
}

pub fn config(path: &Path) -> CriConfig {
    CriConfig {
        runtime_endpoint: format!("unix://{}", path.display()),
        image_endpoint: None,
        request_timeout: Duration::from_secs(10),
        handler: "runc".into(),
    }
}

/// A fake serving on a fresh socket and a runtime connected to it.
pub struct Setup {
    pub fake: Fake,
    pub server: Server,
    pub runtime: CriRuntime,
    pub path: PathBuf,
    _dir: TempDir,
}

pub fn setup(fake: Fake) -> Setup {
    let (dir, path) = socket_dir();
    let server = fake.serve(&path);
    let runtime = CriRuntime::connect(config(&path)).expect("connect");
    Setup {
        fake,
        server,
        runtime,
        path,
        _dir: dir,
    }
}

/// Waits until `done` holds, failing the test after ten seconds.
pub async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
