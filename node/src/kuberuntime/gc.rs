//! What container GC removes besides what the pod workers remove as they go (the
//! kubelet's `kuberuntime_gc.go`), on every housekeeping pass once the sources are
//! ready:
//!
//! - dead sandboxes of a pod that runs in a newer one (their containers go with
//!   them), for every runtime;
//! - the log directories of pods the node no longer has (`evictPodLogsDirectories`):
//!   a deleted or evicted-and-deleted pod's logs do not outlive it.
//!
//! A pod's dead container instances are kept to one per container by its worker
//! (`MaxPerPodContainer` 1; `MinAge` 0 and no `MaxContainers` cap, the kubelet's
//! defaults), and the sandboxes and cgroups of pods the node no longer has are
//! housekeeping's.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use wasmlet_runtime::{PodSandbox, SandboxState};

use crate::pod_state::labels;

/// The sandboxes to remove: for each pod the node has, those not ready and holding
/// no container while a ready one runs it (the kubelet's `evictSandboxes` keeps a
/// sandbox that is ready or still has containers).
pub fn stale_sandboxes<'a>(
    sandboxes: &'a [PodSandbox],
    with_containers: &HashSet<String>,
    live: &HashSet<String>,
) -> Vec<&'a PodSandbox> {
    let mut by_pod: HashMap<&str, Vec<&PodSandbox>> = HashMap::new();
    for sb in sandboxes {
        if let Some(uid) = sb.labels.get(labels::POD_UID)
            && live.contains(uid)
        {
            by_pod.entry(uid.as_str()).or_default().push(sb);
        }
    }
    by_pod
        .into_values()
        .filter(|sbs| sbs.iter().any(|s| s.state == SandboxState::Ready))
        .flat_map(|sbs| sbs.into_iter().filter(|s| s.state != SandboxState::Ready))
        .filter(|s| !with_containers.contains(&s.id))
        .collect()
}

/// The pod UID a pod log directory (`<namespace>_<name>_<uid>`) belongs to.
fn log_dir_uid(name: &str) -> Option<&str> {
    let (_, uid) = name.rsplit_once('_')?;
    (!uid.is_empty()).then_some(uid)
}

/// Removes the log directories below `pod_logs_dir` of pods not in `live`: their
/// names.
pub fn remove_pod_log_dirs(pod_logs_dir: &Path, live: &HashSet<String>) -> Vec<String> {
    let mut removed = Vec::new();
    for entry in std::fs::read_dir(pod_logs_dir)
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(uid) = log_dir_uid(&name) else {
            continue;
        };
        if live.contains(uid) || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        match std::fs::remove_dir_all(entry.path()) {
            Ok(()) => removed.push(name),
            Err(e) => {
                tracing::warn!(dir = %entry.path().display(), "removing a pod's log directory: {e}")
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(id: &str, uid: &str, state: SandboxState) -> PodSandbox {
        PodSandbox {
            id: id.into(),
            metadata: Default::default(),
            state,
            created_at: jiff::Timestamp::now(),
            labels: [(labels::POD_UID.to_owned(), uid.to_owned())].into(),
            annotations: Default::default(),
            runtime_handler: String::new(),
        }
    }

    #[test]
    fn dead_sandboxes_go_once_a_newer_one_runs_the_pod() {
        let all = [
            sandbox("a-old", "a", SandboxState::NotReady),
            sandbox("a-new", "a", SandboxState::Ready),
            sandbox("b-dead", "b", SandboxState::NotReady),
            sandbox("a-kept", "a", SandboxState::NotReady),
            sandbox("gone", "c", SandboxState::NotReady),
        ];
        let live: HashSet<String> = ["a".into(), "b".into()].into();
        let with_containers: HashSet<String> = ["a-kept".into()].into();
        let stale: Vec<&str> = stale_sandboxes(&all, &with_containers, &live)
            .iter()
            .map(|s| s.id.as_str())
            .collect();
        // b's only sandbox is dead: it holds its final statuses; a-kept still holds a
        // container (a previous instance); c is housekeeping's.
        assert_eq!(stale, ["a-old"]);
    }

    #[test]
    fn log_directories_of_pods_gone_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "default_web_uid-1",
            "kube-system_dns_uid-2",
            "stray-file_x_uid-3",
        ] {
            std::fs::create_dir(dir.path().join(name)).unwrap();
        }
        std::fs::write(dir.path().join("default_web_uid-1").join("0.log"), "x").unwrap();
        std::fs::write(dir.path().join("not_a_uid_dir.txt"), "x").unwrap();
        let live: HashSet<String> = ["uid-1".into()].into();
        let mut removed = remove_pod_log_dirs(dir.path(), &live);
        removed.sort();
        assert_eq!(removed, ["kube-system_dns_uid-2", "stray-file_x_uid-3"]);
        assert!(dir.path().join("default_web_uid-1/0.log").exists());
        assert!(
            dir.path().join("not_a_uid_dir.txt").exists(),
            "files are not pod dirs"
        );
    }
}
