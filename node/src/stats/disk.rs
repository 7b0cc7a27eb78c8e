//! Disk usage of a directory tree as the kubelet measures volumes and logs: bytes as
//! `du -x -s -B 1` counts them (allocated blocks, each inode once, not crossing into
//! another filesystem) and inodes as `find -xdev | wc -l` does. [`DuCache`] keeps a
//! measurement for `volumeStatsAggPeriod`, as the kubelet's volume stats calculator
//! re-measures each pod's volumes once per period.

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// What a tree uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskUsage {
    /// Allocated bytes (512-byte blocks), as `du` counts them.
    pub bytes: u64,
    /// Files, directories and links, the root included.
    pub inodes: u64,
}

/// Measures the tree at `root` without following symlinks or leaving its
/// filesystem. An entry that vanishes during the walk is skipped; a root that does not
/// exist is an error.
pub fn du(root: &Path) -> io::Result<DiskUsage> {
    let meta = std::fs::symlink_metadata(root)?;
    let dev = meta.dev();
    let mut seen = HashSet::new();
    let mut usage = DiskUsage::default();
    let mut count = |m: &std::fs::Metadata, usage: &mut DiskUsage| {
        usage.inodes += 1;
        // A file with several links is counted once, as du does.
        if m.nlink() > 1 && !m.is_dir() && !seen.insert((m.dev(), m.ino())) {
            return;
        }
        usage.bytes += m.blocks() * 512;
    };
    count(&meta, &mut usage);
    if !meta.is_dir() {
        return Ok(usage);
    }
    let mut dirs = vec![root.to_owned()];
    while let Some(dir) = dirs.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = match entry {
                Ok(e) => e,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let m = match entry.metadata() {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            // A mount point below the root is another filesystem's (`-x`).
            if m.dev() != dev {
                continue;
            }
            count(&m, &mut usage);
            if m.is_dir() {
                dirs.push(entry.path());
            }
        }
    }
    Ok(usage)
}

/// Measurements reused for a period; what was not asked for in a pass is dropped.
#[derive(Debug)]
pub struct DuCache {
    period: Duration,
    entries: Mutex<HashMap<PathBuf, (Instant, DiskUsage)>>,
}

impl DuCache {
    pub fn new(period: Duration) -> Self {
        Self {
            period,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The usage of `path`: measured at most `period` before `now`, else now. `None`
    /// when it cannot be measured (it is logged).
    pub fn get(&self, path: &Path, now: Instant) -> Option<DiskUsage> {
        let cached = self.entries.lock().unwrap().get(path).copied();
        if let Some((at, usage)) = cached
            && now.saturating_duration_since(at) < self.period
        {
            return Some(usage);
        }
        self.measure(path, now)
    }

    /// The usage of `path` measured now, kept for later [`Self::get`]s.
    pub fn measure(&self, path: &Path, now: Instant) -> Option<DiskUsage> {
        match du(path) {
            Ok(usage) => {
                self.entries
                    .lock()
                    .unwrap()
                    .insert(path.to_owned(), (now, usage));
                Some(usage)
            }
            Err(e) => {
                tracing::debug!(path = %path.display(), "measuring disk usage: {e}");
                None
            }
        }
    }

    /// Forgets every path but `keep` (the volumes of pods that are gone).
    pub fn retain(&self, keep: &HashSet<PathBuf>) {
        self.entries.lock().unwrap().retain(|p, _| keep.contains(p));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(path: &Path) -> u64 {
        std::fs::symlink_metadata(path).unwrap().blocks() * 512
    }

    #[test]
    fn du_counts_blocks_and_inodes_once_without_following_links() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("vol");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("a"), vec![1u8; 100_000]).unwrap();
        std::fs::write(root.join("sub/b"), vec![2u8; 5000]).unwrap();
        std::fs::hard_link(root.join("a"), root.join("a-again")).unwrap();
        // A link out of the tree is counted as a link, its target not at all.
        let outside = dir.path().join("big");
        std::fs::write(&outside, vec![0u8; 1 << 20]).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("out")).unwrap();

        let u = du(&root).unwrap();
        // vol, sub, a, sub/b, a-again, out
        assert_eq!(u.inodes, 6);
        let want = [
            root.clone(),
            root.join("sub"),
            root.join("a"),
            root.join("sub/b"),
            root.join("out"),
        ]
        .iter()
        .map(|p| blocks(p))
        .sum::<u64>();
        assert_eq!(u.bytes, want);
        assert!(u.bytes >= 100_000 + 5000, "{u:?}");
        assert!(u.bytes < 1 << 20, "the link's target is not counted: {u:?}");

        assert!(du(&dir.path().join("missing")).is_err());
        let file = du(&root.join("a")).unwrap();
        assert_eq!((file.inodes, file.bytes), (1, blocks(&root.join("a"))));
    }

    #[tokio::test(start_paused = true)]
    async fn the_cache_measures_again_after_the_period() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DuCache::new(Duration::from_secs(60));
        let first = cache.get(dir.path(), Instant::now()).unwrap();
        std::fs::write(dir.path().join("f"), vec![1u8; 64 * 1024]).unwrap();
        tokio::time::advance(Duration::from_secs(59)).await;
        assert_eq!(cache.get(dir.path(), Instant::now()), Some(first));
        tokio::time::advance(Duration::from_secs(1)).await;
        let second = cache.get(dir.path(), Instant::now()).unwrap();
        assert_eq!(second.inodes, first.inodes + 1);
        assert!(second.bytes >= first.bytes + 64 * 1024);

        cache.retain(&HashSet::new());
        assert!(cache.entries.lock().unwrap().is_empty());
        assert_eq!(cache.get(&dir.path().join("gone"), Instant::now()), None);
    }
}
