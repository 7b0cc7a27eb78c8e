//! The static pod source: a directory of manifests, one pod per file.
//!
//! Changes are seen at once through inotify and, as a backstop, on every
//! `fileCheckFrequency` rescan. Only events that mean a change wake a rescan
//! (create, write, close after writing, rename, delete, metadata): the opens, reads
//! and closes that the rescan itself causes must not, or the source would wake
//! itself for ever. Dotfiles and directories are ignored. A file that
//! cannot be decoded is reported with its path and what is wrong; if it held a good
//! pod before, that pod keeps running unchanged rather than being deleted — bad input
//! loses nothing.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use notify::{RecursiveMode, Watcher};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::SourceSnapshot;
use super::static_pod;

/// The source name used in annotations and logs.
pub const SOURCE: &str = crate::pod::FILE_SOURCE;

/// A problem with one manifest file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestError {
    pub path: PathBuf,
    pub message: String,
}

impl std::fmt::Display for ManifestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "static pod manifest {}: {}",
            self.path.display(),
            self.message
        )
    }
}

/// Scans a manifest directory, remembering the last good pod of every file.
pub struct FileSource {
    dir: PathBuf,
    node_name: String,
    /// path -> (digest of the content, the pod it decoded to).
    good: HashMap<PathBuf, ([u8; 32], Pod)>,
    /// path -> digest of content that failed, so each bad version is reported once.
    reported: HashMap<PathBuf, [u8; 32]>,
}

impl FileSource {
    pub fn new(dir: impl Into<PathBuf>, node_name: impl Into<String>) -> Self {
        FileSource {
            dir: dir.into(),
            node_name: node_name.into(),
            good: HashMap::new(),
            reported: HashMap::new(),
        }
    }

    /// Reads the directory and returns the pods it defines now, and the errors that
    /// are new since the last scan.
    pub fn scan(&mut self) -> (Vec<Pod>, Vec<ManifestError>) {
        let mut errors = Vec::new();
        let mut files = BTreeMap::new();
        match std::fs::read_dir(&self.dir) {
            Ok(entries) => {
                for entry in entries.flatten() {
                    let name = entry.file_name();
                    if name.to_string_lossy().starts_with('.') {
                        continue;
                    }
                    let path = entry.path();
                    // Follow symlinks, as the kubelet does (ConfigMap-style layouts).
                    match std::fs::metadata(&path) {
                        Ok(m) if m.is_file() => {}
                        _ => continue,
                    }
                    match std::fs::read(&path) {
                        Ok(bytes) => {
                            files.insert(path, bytes);
                        }
                        Err(e) => errors.push(ManifestError {
                            path,
                            message: format!("cannot read: {e}"),
                        }),
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // Not an error: the kubelet waits for the directory to appear.
            }
            Err(e) => errors.push(ManifestError {
                path: self.dir.clone(),
                message: format!("cannot list the static pod directory: {e}"),
            }),
        }

        self.good.retain(|path, _| files.contains_key(path));
        self.reported.retain(|path, _| files.contains_key(path));
        for (path, bytes) in files {
            let digest: [u8; 32] = Sha256::digest(&bytes).into();
            if self.good.get(&path).is_some_and(|(d, _)| *d == digest) {
                continue;
            }
            match self.load(&path, &bytes) {
                Ok(pod) => {
                    self.reported.remove(&path);
                    self.good.insert(path, (digest, pod));
                }
                Err(message) => {
                    if self.reported.insert(path.clone(), digest) != Some(digest) {
                        let kept = if self.good.contains_key(&path) {
                            " (the pod from its last good version keeps running)"
                        } else {
                            ""
                        };
                        errors.push(ManifestError {
                            path,
                            message: format!("{message}{kept}"),
                        });
                    }
                }
            }
        }
        let mut pods: Vec<(PathBuf, Pod)> = self
            .good
            .iter()
            .map(|(path, (_, pod))| (path.clone(), pod.clone()))
            .collect();
        pods.sort_by(|a, b| a.0.cmp(&b.0));
        (pods.into_iter().map(|(_, p)| p).collect(), errors)
    }

    fn load(&self, path: &Path, bytes: &[u8]) -> Result<Pod, String> {
        let mut pod = static_pod::decode(path, bytes)?;
        static_pod::apply_defaults(&mut pod, static_pod::Origin::File(path), &self.node_name);
        static_pod::validate(&pod)?;
        Ok(pod)
    }

    /// Runs the source until cancelled, sending a snapshot whenever the set changes.
    pub async fn run(
        mut self,
        period: Duration,
        tx: mpsc::Sender<SourceSnapshot>,
        cancel: CancellationToken,
    ) {
        let (wake_tx, mut wake_rx) = mpsc::unbounded_channel::<()>();
        let mut watcher: Option<notify::RecommendedWatcher> = None;
        let mut last: Option<Vec<Pod>> = None;
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if watcher.is_none() {
                watcher = self.watch(wake_tx.clone());
            }
            let (pods, errors) = self.scan();
            if !self.dir.is_dir() {
                // A removed directory's watch is gone with it: watch the new one when
                // it appears.
                watcher = None;
            }
            for e in &errors {
                tracing::error!("{e}");
            }
            if last.as_ref() != Some(&pods) {
                last = Some(pods.clone());
                let snapshot = SourceSnapshot {
                    source: SOURCE.into(),
                    pods,
                };
                if tx.send(snapshot).await.is_err() {
                    return;
                }
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = tick.tick() => {}
                Some(()) = wake_rx.recv() => {
                    // Coalesce a burst of events (an editor writes, renames, chmods).
                    while wake_rx.try_recv().is_ok() {}
                }
            }
        }
    }

    fn watch(&self, wake: mpsc::UnboundedSender<()>) -> Option<notify::RecommendedWatcher> {
        if !self.dir.is_dir() {
            return None;
        }
        let handler = move |res: notify::Result<notify::Event>| {
            if res.is_ok_and(|event| is_change(&event.kind)) {
                let _ = wake.send(());
            }
        };
        match notify::recommended_watcher(handler) {
            Ok(mut w) => match w.watch(&self.dir, RecursiveMode::NonRecursive) {
                Ok(()) => Some(w),
                Err(e) => {
                    tracing::warn!(dir = %self.dir.display(), "cannot watch the static pod directory, rescanning periodically only: {e}");
                    None
                }
            },
            Err(e) => {
                tracing::warn!("inotify unavailable, rescanning periodically only: {e}");
                None
            }
        }
    }
}

/// Whether an inotify event on the manifest directory can mean that its manifests
/// changed. Opening, reading and closing a file without writing it cannot: those are
/// the events a rescan causes itself.
fn is_change(kind: &notify::EventKind) -> bool {
    use notify::EventKind;
    use notify::event::{AccessKind, AccessMode};
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        // Create, Modify (data, rename, metadata), Remove; Any and Other (a queue
        // overflow asks for a rescan) are taken as changes.
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: NAME\nspec:\n  containers:\n  - name: c\n    image: x:1\n";

    fn names(pods: &[Pod]) -> Vec<String> {
        pods.iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect()
    }

    #[test]
    fn scans_one_pod_per_file_ignoring_dotfiles() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), POD.replace("NAME", "a")).unwrap();
        std::fs::write(dir.path().join(".swp"), "junk").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let mut src = FileSource::new(dir.path(), "n");
        let (pods, errors) = src.scan();
        assert_eq!(names(&pods), ["a-n"]);
        assert!(errors.is_empty(), "{errors:?}");
    }

    #[test]
    fn a_broken_edit_keeps_the_last_good_pod_and_is_reported_once() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.yaml");
        std::fs::write(&a, POD.replace("NAME", "a")).unwrap();
        std::fs::write(dir.path().join("bad.yaml"), "kind: Pod\nspec: [").unwrap();
        let mut src = FileSource::new(dir.path(), "n");
        let (pods, errors) = src.scan();
        assert_eq!(names(&pods), ["a-n"]);
        assert_eq!(errors.len(), 1);
        assert!(errors[0].path.ends_with("bad.yaml"));
        assert!(errors[0].to_string().contains("bad.yaml"), "{}", errors[0]);
        let uid = pods[0].metadata.uid.clone();

        std::fs::write(
            &a,
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {}\n",
        )
        .unwrap();
        let (pods, errors) = src.scan();
        assert_eq!(pods[0].metadata.uid, uid, "the last good pod is kept");
        assert_eq!(
            errors.len(),
            1,
            "only the new problem is reported: {errors:?}"
        );
        assert!(
            errors[0].message.contains("at least one container"),
            "{}",
            errors[0]
        );
        assert!(errors[0].message.contains("keeps running"), "{}", errors[0]);

        let (_, errors) = src.scan();
        assert!(errors.is_empty(), "reported once: {errors:?}");

        std::fs::remove_file(&a).unwrap();
        let (pods, _) = src.scan();
        assert!(pods.is_empty());
    }

    #[test]
    fn only_events_that_mean_a_change_wake_a_rescan() {
        use notify::EventKind;
        use notify::event::{
            AccessKind, AccessMode, CreateKind, DataChange, MetadataKind, ModifyKind, RemoveKind,
            RenameMode,
        };
        let table = [
            (EventKind::Create(CreateKind::File), true),
            (EventKind::Modify(ModifyKind::Data(DataChange::Any)), true),
            (EventKind::Modify(ModifyKind::Name(RenameMode::To)), true),
            (EventKind::Modify(ModifyKind::Name(RenameMode::From)), true),
            (
                EventKind::Modify(ModifyKind::Metadata(MetadataKind::Any)),
                true,
            ),
            (EventKind::Remove(RemoveKind::File), true),
            (EventKind::Remove(RemoveKind::Folder), true),
            (
                EventKind::Access(AccessKind::Close(AccessMode::Write)),
                true,
            ),
            (EventKind::Other, true),
            (EventKind::Access(AccessKind::Open(AccessMode::Any)), false),
            (EventKind::Access(AccessKind::Read), false),
            (
                EventKind::Access(AccessKind::Close(AccessMode::Read)),
                false,
            ),
            (EventKind::Access(AccessKind::Any), false),
        ];
        for (kind, want) in table {
            assert_eq!(is_change(&kind), want, "{kind:?}");
        }
    }

    /// The source's own scan of a watched directory must not wake it again; a new
    /// manifest does.
    #[tokio::test]
    async fn a_scan_does_not_wake_the_source_that_made_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), POD.replace("NAME", "a")).unwrap();
        let mut src = FileSource::new(dir.path(), "n");
        let (wake_tx, mut wake_rx) = mpsc::unbounded_channel();
        let _watcher = src.watch(wake_tx).expect("inotify watches the directory");
        for _ in 0..3 {
            let (pods, _) = src.scan();
            assert_eq!(names(&pods), ["a-n"]);
        }
        // The scans' own events (open, read, close) arrive within milliseconds.
        assert!(
            tokio::time::timeout(Duration::from_millis(500), wake_rx.recv())
                .await
                .is_err(),
            "a scan woke the source"
        );
        std::fs::write(dir.path().join("b.yaml"), POD.replace("NAME", "b")).unwrap();
        tokio::time::timeout(Duration::from_secs(10), wake_rx.recv())
            .await
            .expect("a new manifest wakes the source")
            .unwrap();
        let (pods, _) = src.scan();
        assert_eq!(names(&pods), ["a-n", "b-n"]);
    }

    #[test]
    fn a_missing_directory_is_empty_not_an_error() {
        let mut src = FileSource::new("/nonexistent/wasmlet-test", "n");
        let (pods, errors) = src.scan();
        assert!(pods.is_empty() && errors.is_empty());
    }
}
