//! Container GC (the kubelet's `kuberuntime_gc.go`), on every housekeeping pass once
//! the sources are ready:
//!
//! - dead container instances, grouped per pod and container ("evict units") and
//!   kept to `MaxPerPodContainer` (1) per unit and `MaxContainers` (unlimited) in
//!   all, older than `MinAge` (0) only; every dead instance of a pod whose content
//!   may go (gone from the node, or evicted and stopped); their log files with them;
//! - dead sandboxes of a pod that runs in a newer one, or whose content may go
//!   (their containers go with them), for every runtime;
//! - the log directories of pods the node no longer has (`evictPodLogsDirectories`):
//!   a deleted or evicted-and-deleted pod's logs do not outlive it.
//!
//! The pod workers only forget the instances they no longer show; removing them is
//! this pass's. The sandboxes and cgroups of pods the node no longer has are
//! housekeeping's.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use jiff::Timestamp;
use wasmlet_runtime::{Container, ContainerState, PodSandbox, SandboxState};

use crate::pod_state::labels;

/// The kubelet's container GC policy (`--minimum-container-ttl-duration`,
/// `--maximum-dead-containers-per-container`, `--maximum-dead-containers`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContainerGcPolicy {
    /// A dead instance younger than this (by creation) is kept.
    pub min_age: Duration,
    /// The most dead instances kept per pod and container; negative: no limit.
    pub max_per_pod_container: i32,
    /// The most dead instances kept on the node; negative: no limit.
    pub max_containers: i32,
}

impl Default for ContainerGcPolicy {
    fn default() -> Self {
        ContainerGcPolicy {
            min_age: Duration::ZERO,
            max_per_pod_container: 1,
            max_containers: -1,
        }
    }
}

/// The pod UID a container or sandbox was made for.
fn pod_uid(labels: &wasmlet_runtime::Labels) -> Option<&str> {
    labels.get(labels::POD_UID).map(String::as_str)
}

/// The container name a container instance was made for.
fn container_name(c: &Container) -> &str {
    c.labels
        .get(labels::CONTAINER_NAME)
        .map(String::as_str)
        .unwrap_or(&c.metadata.name)
}

/// The dead container instances to remove (the kubelet's `evictContainers`), of one
/// runtime's `containers`, at `now`:
///
/// - every dead instance of a pod `removable` names (gone from the node, or evicted
///   and stopped), young or not;
/// - of the others, those older than `min_age`, grouped per pod and container and
///   newest first: beyond `max_per_pod_container` in each group, then, while more than
///   `max_containers` are left, beyond an equal share per group (at least one), then
///   the oldest of all.
///
/// Running and created instances are never taken, nor the newest instance of a
/// container of a pod the node still has (the pod's current instance, whose state
/// the pod's status shows): the kubelet keeps only what is running, but here a pod
/// worker reads its current instance back from the runtime.
pub fn collectable_containers<'a>(
    containers: &'a [Container],
    policy: &ContainerGcPolicy,
    now: Timestamp,
    removable: &dyn Fn(&str) -> bool,
) -> Vec<&'a Container> {
    let mut units: HashMap<(&str, &str), Vec<&Container>> = HashMap::new();
    for c in containers {
        let Some(uid) = pod_uid(&c.labels) else {
            continue; // not made by a kubelet
        };
        units.entry((uid, container_name(c))).or_default().push(c);
    }
    let newest_first = |cs: &mut Vec<&Container>| {
        cs.sort_by_key(|c| std::cmp::Reverse((c.metadata.attempt, c.created_at)))
    };
    let young = |c: &Container| {
        let age = now.duration_since(c.created_at);
        age < jiff::SignedDuration::try_from(policy.min_age).unwrap_or(jiff::SignedDuration::MAX)
    };
    let dead = |c: &Container| matches!(c.state, ContainerState::Exited | ContainerState::Unknown);
    let mut remove = Vec::new();
    let mut kept: Vec<Vec<&Container>> = Vec::new();
    for ((uid, _), mut unit) in units {
        newest_first(&mut unit);
        if removable(uid) {
            remove.extend(unit.into_iter().filter(|c| dead(c)));
            continue;
        }
        let evictable: Vec<&Container> = unit
            .into_iter()
            .enumerate()
            .filter(|(i, c)| *i > 0 && dead(c) && !young(c))
            .map(|(_, c)| c)
            .collect();
        if !evictable.is_empty() {
            kept.push(evictable);
        }
    }
    let trim =
        |units: &mut Vec<Vec<&'a Container>>, keep: usize, remove: &mut Vec<&'a Container>| {
            for unit in units.iter_mut() {
                if unit.len() > keep {
                    remove.extend(unit.drain(keep..));
                }
            }
        };
    if let Ok(keep) = usize::try_from(policy.max_per_pod_container) {
        trim(&mut kept, keep, &mut remove);
    }
    if let Ok(max) = usize::try_from(policy.max_containers) {
        let total = |units: &Vec<Vec<&Container>>| units.iter().map(Vec::len).sum::<usize>();
        kept.retain(|u| !u.is_empty());
        if total(&kept) > max {
            let share = (max / kept.len().max(1)).max(1);
            trim(&mut kept, share, &mut remove);
            let left = total(&kept);
            if left > max {
                let mut all: Vec<&Container> = kept.into_iter().flatten().collect();
                all.sort_by_key(|c| std::cmp::Reverse(c.created_at));
                remove.extend(all.drain(max..));
            }
        }
    }
    remove
}

/// The sandboxes to remove: for each pod the node has, those not ready and holding
/// no container while a ready one runs it; for a pod whose content may go
/// (`removable`), every one not ready and holding no container (the kubelet's
/// `evictSandboxes` keeps a sandbox that is ready or still has containers).
pub fn stale_sandboxes<'a>(
    sandboxes: &'a [PodSandbox],
    with_containers: &HashSet<String>,
    live: &HashSet<String>,
    removable: &dyn Fn(&str) -> bool,
) -> Vec<&'a PodSandbox> {
    let mut by_pod: HashMap<&str, Vec<&PodSandbox>> = HashMap::new();
    for sb in sandboxes {
        if let Some(uid) = pod_uid(&sb.labels)
            && live.contains(uid)
        {
            by_pod.entry(uid).or_default().push(sb);
        }
    }
    by_pod
        .into_iter()
        .filter(|(uid, sbs)| removable(uid) || sbs.iter().any(|s| s.state == SandboxState::Ready))
        .flat_map(|(_, sbs)| sbs.into_iter().filter(|s| s.state != SandboxState::Ready))
        .filter(|s| !with_containers.contains(&s.id))
        .collect()
}

/// Removes a container instance's log file and its rotated files (`<log>.*`), as
/// the kubelet's container log manager cleans a removed container's logs.
pub fn remove_container_logs(log_path: &Path) {
    if !log_path.is_absolute() {
        return;
    }
    let mut paths = vec![log_path.to_path_buf()];
    if let (Some(dir), Some(name)) = (log_path.parent(), log_path.file_name()) {
        let prefix = format!("{}.", name.to_string_lossy());
        paths.extend(
            std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .map(|e| e.path()),
        );
    }
    for path in paths {
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(path = %path.display(), "removing a container log: {e}"),
        }
    }
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

/// Removes the dead container instances container GC picks of one runtime's
/// `containers`, with their log files: the ids removed.
pub async fn remove_dead_containers(
    runtime: &dyn wasmlet_runtime::Runtime,
    containers: &[wasmlet_runtime::Container],
    policy: &ContainerGcPolicy,
    removable: &(dyn Fn(&str) -> bool + Sync),
) -> HashSet<String> {
    let now = jiff::Timestamp::now();
    let mut gone = HashSet::new();
    for c in collectable_containers(containers, policy, now, removable) {
        // The log path is the runtime's to tell, and only while the container exists.
        let log = runtime
            .container_status(&c.id)
            .await
            .ok()
            .map(|s| s.log_path);
        match runtime.remove_container(&c.id).await {
            Ok(()) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => {
                tracing::warn!(container = %c.id, "container GC: removing a dead container: {e}");
                continue;
            }
        }
        tracing::info!(container = %c.id, name = %c.metadata.name, attempt = c.metadata.attempt, "container GC: removed a dead container");
        if let Some(log) = log {
            remove_container_logs(&log);
        }
        gone.insert(c.id.clone());
    }
    gone
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
        let stale: Vec<&str> = stale_sandboxes(&all, &with_containers, &live, &|_| false)
            .iter()
            .map(|s| s.id.as_str())
            .collect();
        // b's only sandbox is dead: it holds its final statuses; a-kept still holds a
        // container (a previous instance); c is housekeeping's.
        assert_eq!(stale, ["a-old"]);

        // b was evicted: its dead sandbox goes too.
        let mut stale: Vec<&str> =
            stale_sandboxes(&all, &with_containers, &live, &|uid| uid == "b")
                .iter()
                .map(|s| s.id.as_str())
                .collect();
        stale.sort();
        assert_eq!(stale, ["a-old", "b-dead"]);
    }

    /// An instance `attempt` of container `name` of pod `uid`, made `age_s` ago.
    fn instance(
        uid: &str,
        name: &str,
        attempt: u32,
        state: ContainerState,
        age_s: i64,
    ) -> Container {
        Container {
            id: format!("{uid}-{name}-{attempt}"),
            sandbox_id: format!("{uid}-sb"),
            metadata: wasmlet_runtime::ContainerMetadata {
                name: name.into(),
                attempt,
            },
            image: String::new(),
            image_ref: String::new(),
            state,
            created_at: now() - jiff::SignedDuration::from_secs(age_s),
            labels: [
                (labels::POD_UID.to_owned(), uid.to_owned()),
                (labels::CONTAINER_NAME.to_owned(), name.to_owned()),
            ]
            .into(),
            annotations: Default::default(),
        }
    }

    fn now() -> Timestamp {
        "2026-12-03T12:00:00Z".parse().unwrap()
    }

    fn collected(
        cs: &[Container],
        policy: ContainerGcPolicy,
        removable: &dyn Fn(&str) -> bool,
    ) -> Vec<String> {
        let mut ids: Vec<String> = collectable_containers(cs, &policy, now(), removable)
            .into_iter()
            .map(|c| c.id.clone())
            .collect();
        ids.sort();
        ids
    }

    use ContainerState::{Created, Exited, Running};

    #[test]
    fn one_dead_instance_per_container_is_kept_by_default() {
        // A crash-looping app: attempt 3 runs, 0..=2 are dead; a sidecar never restarted.
        let cs = [
            instance("p", "app", 0, Exited, 40),
            instance("p", "app", 1, Exited, 30),
            instance("p", "app", 2, Exited, 20),
            instance("p", "app", 3, Running, 10),
            instance("p", "side", 0, Running, 40),
        ];
        assert_eq!(
            collected(&cs, ContainerGcPolicy::default(), &|_| false),
            ["p-app-0", "p-app-1"]
        );
    }

    #[test]
    fn the_current_instance_is_kept_even_when_it_is_dead() {
        // Waiting to restart (or finished for good): the newest is the pod's status.
        let cs = [
            instance("p", "app", 0, Exited, 30),
            instance("p", "app", 1, Exited, 20),
            instance("p", "app", 2, Exited, 10),
            instance("p", "new", 0, Created, 5),
        ];
        let none = ContainerGcPolicy {
            max_per_pod_container: 0,
            max_containers: 0,
            ..Default::default()
        };
        assert_eq!(
            collected(&cs, ContainerGcPolicy::default(), &|_| false),
            ["p-app-0"]
        );
        assert_eq!(collected(&cs, none, &|_| false), ["p-app-0", "p-app-1"]);
    }

    #[test]
    fn young_instances_stay_until_min_age() {
        let cs = [
            instance("p", "app", 0, Exited, 600),
            instance("p", "app", 1, Exited, 120),
            instance("p", "app", 2, Exited, 60),
            instance("p", "app", 3, Running, 1),
        ];
        let policy = ContainerGcPolicy {
            min_age: Duration::from_secs(90),
            max_per_pod_container: 0,
            ..Default::default()
        };
        assert_eq!(collected(&cs, policy, &|_| false), ["p-app-0", "p-app-1"]);
    }

    #[test]
    fn max_containers_takes_an_equal_share_per_container_then_the_oldest() {
        // Three containers with 4, 2 and 1 dead instances each (behind a running one).
        let mut cs = Vec::new();
        for (name, dead) in [("a", 4u32), ("b", 2), ("c", 1)] {
            for attempt in 0..dead {
                cs.push(instance(
                    "p",
                    name,
                    attempt,
                    Exited,
                    100 - i64::from(attempt) * 10 - name.len() as i64,
                ));
            }
            cs.push(instance("p", name, dead, Running, 1));
        }
        let unlimited_per_container = ContainerGcPolicy {
            max_per_pod_container: 1,
            max_containers: 4,
            ..Default::default()
        };
        // A share of 4 / 3 = 1 each leaves a-3, b-1, c-0: three, within four.
        assert_eq!(
            collected(&cs, unlimited_per_container, &|_| false),
            ["p-a-0", "p-a-1", "p-a-2", "p-b-0"]
        );
        let two = ContainerGcPolicy {
            max_containers: 2,
            ..unlimited_per_container
        };
        // A share of at least one each leaves three: the oldest of those goes too.
        let left_after_share = ["p-a-3", "p-b-1", "p-c-0"];
        let oldest = left_after_share
            .iter()
            .min_by_key(|id| cs.iter().find(|c| c.id == **id).unwrap().created_at)
            .unwrap();
        let mut want = vec!["p-a-0", "p-a-1", "p-a-2", "p-b-0", oldest];
        want.sort();
        assert_eq!(collected(&cs, two, &|_| false), want);
        assert_eq!(*oldest, "p-c-0");
    }

    #[test]
    fn a_pod_whose_content_may_go_loses_every_dead_instance() {
        let cs = [
            instance("evicted", "app", 0, Exited, 30),
            instance("evicted", "app", 1, Exited, 1),
            instance("kept", "app", 0, Exited, 30),
            instance("kept", "app", 1, Exited, 1),
        ];
        let young_kept = ContainerGcPolicy {
            min_age: Duration::from_secs(3600),
            ..Default::default()
        };
        assert_eq!(
            collected(&cs, young_kept, &|uid| uid == "evicted"),
            ["evicted-app-0", "evicted-app-1"]
        );
    }

    #[test]
    fn a_removed_containers_log_and_its_rotated_files_go() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "0.log",
            "0.log.20261203-120000",
            "0.log.20261203-110000.gz",
            "1.log",
        ] {
            std::fs::write(dir.path().join(name), "x").unwrap();
        }
        remove_container_logs(&dir.path().join("0.log"));
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["1.log"]);
        remove_container_logs(Path::new(""));
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
