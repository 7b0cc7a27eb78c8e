//! Placing a sandbox process in its pod's cgroup, and setting its OOM score.
//!
//! The node creates the pod cgroup (`cgroup_parent`: `/kubepods/burstable/pod<uid>`, or
//! `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice` with the
//! systemd driver, below any `--cgroup-root`) and sets its limits; the Wasm runtime only
//! puts the sandbox process in it. [`PodCgroup::open`] finds and opens every
//! `cgroup.procs` file to write, *before* the sandbox is spawned, so that a missing
//! cgroup is an error with no process to clean up:
//!
//! - **cgroup v2** (`<mount root>/cgroup.controllers` exists): `<mount root><parent>`.
//! - **cgroup v1**: the pod's directory in every hierarchy mounted under the mount root
//!   (`cpu`, `cpuacct`, `memory`, `pids`, ... — whatever directory holds `<parent>`,
//!   co-mounted hierarchies such as `cpu,cpuacct` once). The `cpu` and `memory`
//!   hierarchies must hold it, as the node always creates it there; elsewhere (`freezer`,
//!   `systemd`, the hybrid `unified` tree) it is joined only where it exists.
//!
//! [`PodCgroup::join_on_spawn`] then makes the child write `0` (itself) to each file
//! between `fork` and `exec`, so the sandbox program starts in the pod cgroup and every
//! thread it makes is born there — long before a Create request can run guest code. The
//! parent closes its descriptors once the child is spawned. An adopted sandbox (after a
//! node restart) was placed when it was started; nothing is done again.
//!
//! **The pod cgroup, not per-container cgroups.** A pod's containers are async tasks on
//! the sandbox's one shared thread pool: a task migrates between threads from one poll to
//! the next, so no thread-level cgroup could hold it, and v1 charges memory to the
//! process anyway. So the whole sandbox is in the pod cgroup: the containers' CPU limits
//! add up to the pod cgroup's CFS quota, as the node computes it, and each container's
//! memory limit is enforced inside the process by its wasmtime store's limiter.
//!
//! **OOM score.** [`set_oom_score_adj`] writes `/proc/<pid>/oom_score_adj` from the node
//! once the sandbox is spawned (again before any guest runs). A value lower than the
//! sandbox's inherited floor needs `CAP_SYS_RESOURCE`; without it the kernel refuses and
//! the sandbox keeps its current value, with a warning.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use tokio::process::Command;

/// Where the cgroup filesystem is mounted on a node.
pub const DEFAULT_MOUNT_ROOT: &str = "/sys/fs/cgroup";

/// The v1 hierarchies a pod cgroup must exist in.
const REQUIRED_V1: [&str; 2] = ["cpu", "memory"];
const PROCS: &str = "cgroup.procs";

/// The range of `oom_score_adj`.
pub const OOM_SCORE_ADJ_RANGE: std::ops::RangeInclusive<i64> = -1000..=1000;

/// Why a sandbox cannot be placed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `cgroup_parent` is not an absolute path below the root of the hierarchy.
    #[error("invalid cgroup parent {parent:?}: {reason}")]
    InvalidParent {
        parent: String,
        reason: &'static str,
    },
    /// The node has not created the pod cgroup (or removed it).
    #[error("pod cgroup {parent} does not exist: no directory {}", .path.display())]
    Missing { parent: String, path: PathBuf },
    /// A cgroup or `/proc` file could not be read, listed or opened.
    #[error("{op} {}: {source}", .path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A pod cgroup's `cgroup.procs` files, open for writing.
#[derive(Debug)]
pub struct PodCgroup {
    parent: String,
    procs: Vec<(PathBuf, File)>,
}

impl PodCgroup {
    /// Opens the `cgroup.procs` files of `parent` under `mount_root` (see the module
    /// docs for which). Fails if the pod cgroup is missing.
    pub fn open(mount_root: &Path, parent: &str) -> Result<Self> {
        let rel = relative(parent)?;
        let missing = |path: PathBuf| Error::Missing {
            parent: parent.to_owned(),
            path,
        };
        let dirs = if mount_root.join("cgroup.controllers").is_file() {
            let dir = mount_root.join(&rel);
            if !dir.is_dir() {
                return Err(missing(dir));
            }
            vec![dir]
        } else {
            for hierarchy in REQUIRED_V1 {
                let dir = mount_root.join(hierarchy).join(&rel);
                if !dir.is_dir() {
                    return Err(missing(dir));
                }
            }
            v1_hierarchies(mount_root)?
                .into_iter()
                .map(|h| h.join(&rel))
                .filter(|dir| dir.join(PROCS).is_file())
                .collect()
        };
        let procs = dirs
            .into_iter()
            .map(|dir| {
                let path = dir.join(PROCS);
                // std opens close-on-exec: the sandbox program never inherits these.
                match OpenOptions::new().write(true).open(&path) {
                    Ok(file) => Ok((path, file)),
                    Err(source) => Err(Error::Io {
                        op: "opening",
                        path,
                        source,
                    }),
                }
            })
            .collect::<Result<_>>()?;
        Ok(PodCgroup {
            parent: parent.to_owned(),
            procs,
        })
    }

    /// The pod cgroup, as `cgroup_parent` named it.
    pub fn parent(&self) -> &str {
        &self.parent
    }

    /// The `cgroup.procs` files the child will write, in order.
    pub fn procs_paths(&self) -> impl Iterator<Item = &Path> {
        self.procs.iter().map(|(p, _)| p.as_path())
    }

    /// Makes the process `cmd` spawns join the pod cgroup before it execs. The files are
    /// handed to `cmd` and closed when it is dropped: drop it once it has spawned.
    pub fn join_on_spawn(self, cmd: &mut Command) {
        let fds: Vec<OwnedFd> = self.procs.into_iter().map(|(_, f)| f.into()).collect();
        crate::sys::write_before_exec(cmd, fds, b"0");
    }
}

/// `parent` relative to a hierarchy's root, checked to stay below it.
fn relative(parent: &str) -> Result<PathBuf> {
    let invalid = |reason| Error::InvalidParent {
        parent: parent.to_owned(),
        reason,
    };
    if !parent.starts_with('/') {
        return Err(invalid("not an absolute path"));
    }
    let mut rel = PathBuf::new();
    for part in parent.split('/').filter(|p| !p.is_empty()) {
        if part == "." || part == ".." {
            return Err(invalid("has a '.' or '..' component"));
        }
        rel.push(part);
    }
    if rel.as_os_str().is_empty() {
        return Err(invalid("names the root cgroup, not a pod's"));
    }
    Ok(rel)
}

/// Every v1 hierarchy mounted under `mount_root`: its subdirectories that are cgroup
/// directories, sorted, each hierarchy once (a co-mount's symlinks, like `cpu` and
/// `cpuacct` pointing at `cpu,cpuacct`, folded).
fn v1_hierarchies(mount_root: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(mount_root).map_err(|source| Error::Io {
        op: "listing",
        path: mount_root.to_owned(),
        source,
    })?;
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join(PROCS).is_file())
        .collect();
    dirs.sort();
    let mut seen = std::collections::BTreeSet::new();
    dirs.retain(|d| seen.insert(std::fs::canonicalize(d).unwrap_or_else(|_| d.clone())));
    Ok(dirs)
}

/// What [`set_oom_score_adj`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OomScore {
    /// The value was written.
    Set(i64),
    /// The kernel refused to lower it (no `CAP_SYS_RESOURCE`); this is the value kept.
    Kept(i64),
}

/// Writes `value` (within [`OOM_SCORE_ADJ_RANGE`]) to `/proc/<pid>/oom_score_adj`. A
/// refusal to lower it is no error: the process keeps its current value, which is
/// returned as [`OomScore::Kept`] (and logged).
pub fn set_oom_score_adj(pid: u32, value: i64) -> Result<OomScore> {
    let path = PathBuf::from(format!("/proc/{pid}/oom_score_adj"));
    match std::fs::write(&path, value.to_string()) {
        Ok(()) => Ok(OomScore::Set(value)),
        Err(e) if matches!(e.kind(), io::ErrorKind::PermissionDenied) => {
            let current = std::fs::read_to_string(&path)
                .map_err(|source| Error::Io {
                    op: "reading",
                    path: path.clone(),
                    source,
                })?
                .trim()
                .parse()
                .unwrap_or(0);
            tracing::warn!(
                pid,
                requested = value,
                current,
                "cannot lower the sandbox's oom_score_adj ({e}: it needs CAP_SYS_RESOURCE); keeping its current value"
            );
            Ok(OomScore::Kept(current))
        }
        Err(source) => Err(Error::Io {
            op: "writing",
            path,
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch hierarchy: `dirs` created under the root, each with a `cgroup.procs`.
    fn layout(dirs: &[&str]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        for d in dirs {
            let dir = root.path().join(d);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(PROCS), "").unwrap();
        }
        root
    }

    fn found(root: &Path, parent: &str) -> Result<Vec<String>> {
        Ok(PodCgroup::open(root, parent)?
            .procs_paths()
            .map(|p| p.strip_prefix(root).unwrap().display().to_string())
            .collect())
    }

    #[test]
    fn parents_must_be_absolute_and_below_the_root() {
        let cases = [
            ("kubepods/pod1", "not an absolute path"),
            ("", "not an absolute path"),
            ("/", "names the root cgroup, not a pod's"),
            ("//", "names the root cgroup, not a pod's"),
            ("/kubepods/../pod1", "has a '.' or '..' component"),
            ("/kubepods/./pod1", "has a '.' or '..' component"),
        ];
        for (parent, want) in cases {
            match relative(parent) {
                Err(Error::InvalidParent { reason, .. }) => assert_eq!(reason, want, "{parent:?}"),
                other => panic!("{parent:?}: {other:?}"),
            }
        }
        assert_eq!(
            relative("/kubepods.slice/kubepods-pod1.slice").unwrap(),
            Path::new("kubepods.slice/kubepods-pod1.slice")
        );
        assert_eq!(relative("/a//b/").unwrap(), Path::new("a/b"));
    }

    #[test]
    fn v2_is_the_one_directory() {
        let root = layout(&["", "kubepods/burstable/pod1"]);
        std::fs::write(root.path().join("cgroup.controllers"), "cpu memory pids").unwrap();
        assert_eq!(
            found(root.path(), "/kubepods/burstable/pod1").unwrap(),
            ["kubepods/burstable/pod1/cgroup.procs"]
        );
        let err = found(root.path(), "/kubepods/burstable/pod2").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("pod cgroup /kubepods/burstable/pod2 does not exist"),
            "{err}"
        );
    }

    #[test]
    fn v1_joins_every_hierarchy_holding_the_pod() {
        let pod = "kubepods/pod1";
        let root = layout(&[
            "cpu",
            "cpu/kubepods/pod1",
            "cpuacct",
            "cpuacct/kubepods/pod1",
            "memory",
            "memory/kubepods/pod1",
            "pids",
            "pids/kubepods/pod1",
            // Mounted, without the pod: not joined.
            "freezer",
            "systemd",
            "unified",
            // The pod's directory where a runtime made it: joined.
            "devices",
            "devices/kubepods/pod1",
        ]);
        // Not a hierarchy.
        std::fs::create_dir_all(root.path().join("stray/kubepods/pod1")).unwrap();
        assert_eq!(
            found(root.path(), &format!("/{pod}")).unwrap(),
            [
                "cpu/kubepods/pod1/cgroup.procs",
                "cpuacct/kubepods/pod1/cgroup.procs",
                "devices/kubepods/pod1/cgroup.procs",
                "memory/kubepods/pod1/cgroup.procs",
                "pids/kubepods/pod1/cgroup.procs",
            ]
        );
    }

    #[test]
    fn v1_folds_co_mounted_hierarchies() {
        let root = layout(&["cpu,cpuacct", "cpu,cpuacct/pod1", "memory", "memory/pod1"]);
        for link in ["cpu", "cpuacct"] {
            std::os::unix::fs::symlink("cpu,cpuacct", root.path().join(link)).unwrap();
        }
        assert_eq!(
            found(root.path(), "/pod1").unwrap(),
            ["cpu/pod1/cgroup.procs", "memory/pod1/cgroup.procs"]
        );
    }

    #[test]
    fn v1_needs_the_pod_in_cpu_and_memory() {
        for (dirs, missing) in [
            (&["cpu", "memory", "memory/pod1"][..], "cpu/pod1"),
            (
                &["cpu", "cpu/pod1", "memory", "pids", "pids/pod1"][..],
                "memory/pod1",
            ),
            (&["cpu", "pids", "pids/pod1"][..], "cpu/pod1"),
        ] {
            let root = layout(dirs);
            match found(root.path(), "/pod1") {
                Err(Error::Missing { parent, path }) => {
                    assert_eq!(parent, "/pod1");
                    assert_eq!(path, root.path().join(missing), "{dirs:?}");
                }
                other => panic!("{dirs:?}: {other:?}"),
            }
        }
    }
}
