//! Reloading file plugins when their file changes.

use std::collections::{BTreeSet, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::host::PluginHost;

/// Events closer together than this are handled as one change (an editor or a
/// deploy tool writes, renames and chmods a file in a burst).
const SETTLE: Duration = Duration::from_millis(100);

impl PluginHost {
    /// Watches the files of the file plugins (their directories, so a file replaced
    /// by a rename is seen) and reloads a plugin when its file changes, until
    /// `cancel`. A new version that does not load leaves the old one running (see
    /// [`reload`](Self::reload)). Plugins loaded later are watched too.
    pub async fn watch(&self, cancel: CancellationToken) {
        let (tx, mut rx) = mpsc::unbounded_channel::<Vec<PathBuf>>();
        let handler = move |res: notify::Result<notify::Event>| {
            if let Ok(event) = res {
                let _ = tx.send(event.paths);
            }
        };
        let mut watcher = match notify::recommended_watcher(handler) {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!("cannot watch plugin files, they are not reloaded: {e}");
                return;
            }
        };
        let mut watched: BTreeSet<PathBuf> = BTreeSet::new();
        loop {
            let dirs: BTreeSet<PathBuf> = self
                .watched_files()
                .into_iter()
                .filter_map(|(_, path)| path.parent().map(|p| p.to_path_buf()))
                .collect();
            for dir in watched.difference(&dirs) {
                let _ = watcher.unwatch(dir);
            }
            for dir in dirs.difference(&watched) {
                if let Err(e) = watcher.watch(dir, RecursiveMode::NonRecursive) {
                    tracing::warn!(dir = %dir.display(), "cannot watch a plugin directory, its plugins are not reloaded: {e}");
                }
            }
            watched = dirs;
            tokio::select! {
                () = cancel.cancelled() => return,
                () = self.changed().notified() => continue,
                Some(paths) = rx.recv() => {
                    let mut changed: HashSet<PathBuf> = paths.into_iter().collect();
                    tokio::time::sleep(SETTLE).await;
                    while let Ok(paths) = rx.try_recv() {
                        changed.extend(paths);
                    }
                    for (name, path) in self.watched_files() {
                        if changed.contains(&path) && path.exists() {
                            // Errors are logged and sent as events by reload.
                            let _ = self.reload(&name).await;
                        }
                    }
                }
            }
        }
    }
}
