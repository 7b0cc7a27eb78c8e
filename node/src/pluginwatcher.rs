//! The plugin watcher (the kubelet's `pluginmanager`): plugins put a socket in
//! `<root-dir>/plugins_registry/`; the node asks it `GetInfo` (plugin registration
//! v1), hands it to the handler of its type (`DevicePlugin`; `CSIPlugin` later),
//! and tells the plugin with `NotifyRegistrationStatus` whether it was taken. A
//! socket that goes away deregisters its plugin.
//!
//! The directory is read every second, the kubelet's reconciler period; a socket is
//! registered once while it stays the same file (a plugin that restarts makes a new
//! socket, which is registered again).

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use wasmlet_proto::pluginregistration::v1 as api;
use wasmlet_proto::pluginregistration::v1::registration_client::RegistrationClient;

/// The kubelet's `plugins_registry` directory name, under the root directory.
pub const REGISTRY_DIR: &str = "plugins_registry";
/// How often the directory is read.
pub const PERIOD: Duration = Duration::from_secs(1);
/// How long a plugin has to answer `GetInfo`.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a plugin has to take `NotifyRegistrationStatus` (the kubelet's 5 s).
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);

/// What takes plugins of one type.
#[async_trait::async_trait]
pub trait PluginHandler: Send + Sync {
    /// Whether the plugin can be taken: its name and versions.
    fn validate(&self, name: &str, endpoint: &Path, versions: &[String]) -> Result<(), String>;
    /// Takes the plugin.
    async fn register(
        &self,
        name: &str,
        endpoint: &Path,
        versions: &[String],
    ) -> Result<(), String>;
    /// The plugin's socket went away; `endpoint` is where it was registered.
    fn deregister(&self, name: &str, endpoint: &Path);
}

/// A registered plugin: its socket file (by inode and change time, so a new socket at the same path
/// is a new plugin), type and name.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Registered {
    inode: FileId,
    kind: String,
    name: String,
    endpoint: PathBuf,
}

/// A socket whose registration failed: tried again after `delay` (doubling up to
/// [`MAX_RETRY`]), or at once when it is replaced.
struct Failed {
    inode: FileId,
    retry_at: std::time::Instant,
    delay: Duration,
}

/// The longest wait before a failed registration is tried again.
const MAX_RETRY: Duration = Duration::from_secs(60);

/// Watches the registry directory and registers what appears there.
pub struct PluginWatcher {
    dir: PathBuf,
    handlers: BTreeMap<String, Arc<dyn PluginHandler>>,
}

fn client(socket: &Path) -> RegistrationClient<tonic::transport::Channel> {
    RegistrationClient::new(wasmlet_proto::transport::unix_channel(
        socket.to_owned(),
        CALL_TIMEOUT,
    ))
}

/// Which file a socket is: its inode and change time (an inode number alone can be
/// reused at once by a plugin's new socket).
type FileId = (u64, i64, i64);

/// The sockets in `dir` and one level of subdirectories (as the kubelet walks it),
/// hidden files left out, with their identities.
fn sockets(dir: &Path) -> BTreeMap<PathBuf, FileId> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![(dir.to_owned(), 0)];
    while let Some((d, depth)) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let Ok(meta) = e.metadata() else { continue };
            if meta.file_type().is_socket() {
                out.insert(e.path(), (meta.ino(), meta.ctime(), meta.ctime_nsec()));
            } else if meta.is_dir() && depth == 0 {
                dirs.push((e.path(), depth + 1));
            }
        }
    }
    out
}

impl PluginWatcher {
    /// A watcher of `<root>/plugins_registry`, which it makes.
    pub fn new(root: &Path) -> std::io::Result<Self> {
        let dir = root.join(REGISTRY_DIR);
        std::fs::create_dir_all(&dir)?;
        Ok(PluginWatcher {
            dir,
            handlers: BTreeMap::new(),
        })
    }

    /// Plugins of type `kind` (`DevicePlugin`, `CSIPlugin`) go to `handler`.
    pub fn handle(mut self, kind: &str, handler: Arc<dyn PluginHandler>) -> Self {
        self.handlers.insert(kind.to_owned(), handler);
        self
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Registers and deregisters plugins until `cancel`.
    pub async fn run(self, cancel: CancellationToken) {
        tracing::info!(dir = %self.dir.display(), "watching for plugins");
        let mut registered: BTreeMap<PathBuf, Registered> = BTreeMap::new();
        let mut failed: BTreeMap<PathBuf, Failed> = BTreeMap::new();
        loop {
            let now = sockets(&self.dir);
            let gone: Vec<PathBuf> = registered
                .iter()
                .filter(|(path, r)| now.get(*path) != Some(&r.inode))
                .map(|(path, _)| path.clone())
                .collect();
            for path in gone {
                if let Some(r) = registered.remove(&path) {
                    tracing::info!(socket = %path.display(), kind = %r.kind, name = %r.name, "plugin socket gone; deregistering");
                    if let Some(h) = self.handlers.get(&r.kind) {
                        h.deregister(&r.name, &r.endpoint);
                    }
                }
            }
            failed.retain(|path, f| now.get(path) == Some(&f.inode));
            let at = std::time::Instant::now();
            for (path, inode) in &now {
                if registered.contains_key(path)
                    || failed.get(path).is_some_and(|f| at < f.retry_at)
                {
                    continue;
                }
                match self.register(path).await {
                    Ok((kind, name, endpoint)) => {
                        failed.remove(path);
                        registered.insert(
                            path.clone(),
                            Registered {
                                inode: *inode,
                                kind,
                                name,
                                endpoint,
                            },
                        );
                    }
                    Err(e) => {
                        let delay = failed
                            .get(path)
                            .map_or(PERIOD, |f| (f.delay * 2).min(MAX_RETRY));
                        tracing::warn!(socket = %path.display(), retry_in = ?delay, "plugin registration failed: {e}");
                        failed.insert(
                            path.clone(),
                            Failed {
                                inode: *inode,
                                retry_at: std::time::Instant::now() + delay,
                                delay,
                            },
                        );
                    }
                }
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(PERIOD) => {}
            }
        }
    }

    /// `GetInfo`, the handler's validation and registration, then
    /// `NotifyRegistrationStatus` with the outcome.
    async fn register(&self, socket: &Path) -> Result<(String, String, PathBuf), String> {
        let mut c = client(socket);
        let mut request = tonic::Request::new(api::InfoRequest {});
        request.set_timeout(CALL_TIMEOUT);
        let info = c
            .get_info(request)
            .await
            .map_err(|s| format!("GetInfo: {}: {}", s.code(), s.message()))?
            .into_inner();
        let endpoint = if info.endpoint.is_empty() {
            socket.to_owned()
        } else {
            PathBuf::from(&info.endpoint)
        };
        let outcome = match self.handlers.get(&info.r#type) {
            None => Err(format!("no handler for plugin type {:?}", info.r#type)),
            Some(h) => match h.validate(&info.name, &endpoint, &info.supported_versions) {
                Err(e) => Err(e),
                Ok(()) => {
                    h.register(&info.name, &endpoint, &info.supported_versions)
                        .await
                }
            },
        };
        let status = api::RegistrationStatus {
            plugin_registered: outcome.is_ok(),
            error: outcome.as_ref().err().cloned().unwrap_or_default(),
        };
        let mut notify = tonic::Request::new(status);
        notify.set_timeout(NOTIFY_TIMEOUT);
        if let Err(s) = c.notify_registration_status(notify).await {
            tracing::warn!(socket = %socket.display(), "NotifyRegistrationStatus: {}: {}", s.code(), s.message());
        }
        outcome.map(|()| {
            tracing::info!(kind = %info.r#type, name = %info.name, endpoint = %endpoint.display(), "plugin registered");
            (info.r#type, info.name, endpoint)
        })
    }
}
