//! PodConfig: the desired pods, merged from every source into one stream of changes.
//!
//! Each source (the static manifest directory now; the API server and a manifest URL
//! later) sends its complete current set of pods. [`PodConfig::merge`] diffs it against
//! what that source sent before and yields ADD / UPDATE / DELETE / RECONCILE updates
//! for the sync loop. A UID belongs to the first source that sent it.

pub mod file;
pub mod http;
pub mod static_pod;

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::pod::{CONFIG_SEEN_ANNOTATION, full_name, uid};

/// What happened to a set of pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodOp {
    /// New pods to run.
    Add,
    /// Pods whose spec or metadata changed.
    Update,
    /// Pods no source wants any more.
    Delete,
    /// Pods whose status (only) changed at the source.
    Reconcile,
}

/// One change for the sync loop.
#[derive(Clone, Debug)]
pub struct PodUpdate {
    pub op: PodOp,
    pub source: String,
    pub pods: Vec<Pod>,
}

/// A source's complete set of pods.
#[derive(Clone, Debug)]
pub struct SourceSnapshot {
    pub source: String,
    pub pods: Vec<Pod>,
}

/// The merge state: the last set of pods per source.
#[derive(Default)]
pub struct PodConfig {
    sources: BTreeMap<String, HashMap<String, Pod>>,
}

/// Whether two versions of a pod have the same metadata, apart from what every write
/// changes (resourceVersion, managedFields): a status write is not an update.
fn same_meta(a: &Pod, b: &Pod) -> bool {
    let strip = |p: &Pod| {
        let mut m = p.metadata.clone();
        m.resource_version = None;
        m.managed_fields = None;
        m
    };
    strip(a) == strip(b)
}

impl PodConfig {
    /// Whether every one of `sources` has sent its first snapshot: until then the
    /// desired set is incomplete and nothing may be removed for not being in it.
    pub fn seen_all<'a>(&self, mut sources: impl Iterator<Item = &'a str>) -> bool {
        sources.all(|s| self.sources.contains_key(s))
    }

    /// The UIDs of every pod some source has now, finished or not.
    pub fn uids(&self) -> impl Iterator<Item = &str> {
        self.sources
            .values()
            .flat_map(|pods| pods.keys().map(String::as_str))
    }

    /// Takes a source's new snapshot and returns the updates it implies, in the order
    /// the sync loop should apply them: deletes first, then adds, updates, reconciles.
    pub fn merge(&mut self, snapshot: SourceSnapshot) -> Vec<PodUpdate> {
        let SourceSnapshot { source, pods } = snapshot;
        let owned_elsewhere: std::collections::HashSet<String> = self
            .sources
            .iter()
            .filter(|(s, _)| **s != source)
            .flat_map(|(_, pods)| pods.keys().cloned())
            .collect();
        let old = self.sources.remove(&source).unwrap_or_default();
        let mut new: HashMap<String, Pod> = HashMap::new();
        for mut pod in pods {
            let id = uid(&pod).to_owned();
            if owned_elsewhere.contains(&id) {
                tracing::warn!(pod = %full_name(&pod), %source, "pod UID {id} is already provided by another source; ignoring this copy");
                continue;
            }
            if new.contains_key(&id) {
                tracing::warn!(pod = %full_name(&pod), %source, "duplicate pod UID {id} in one source; keeping the first");
                continue;
            }
            let seen = old
                .get(&id)
                .and_then(|p| {
                    p.metadata
                        .annotations
                        .as_ref()?
                        .get(CONFIG_SEEN_ANNOTATION)
                        .cloned()
                })
                .unwrap_or_else(|| jiff::Timestamp::now().to_string());
            pod.metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(CONFIG_SEEN_ANNOTATION.into(), seen);
            new.insert(id, pod);
        }

        let mut deletes = Vec::new();
        let (mut adds, mut updates, mut reconciles) = (Vec::new(), Vec::new(), Vec::new());
        for (id, pod) in &old {
            if !new.contains_key(id) {
                let mut pod = pod.clone();
                pod.metadata
                    .deletion_timestamp
                    .get_or_insert_with(|| Time(jiff::Timestamp::now()));
                deletes.push(pod);
            }
        }
        for (id, pod) in &new {
            match old.get(id) {
                None => adds.push(pod.clone()),
                Some(prev) if prev.spec != pod.spec || !same_meta(prev, pod) => {
                    updates.push(pod.clone())
                }
                Some(prev) if prev.status != pod.status => reconciles.push(pod.clone()),
                Some(_) => {}
            }
        }
        self.sources.insert(source.clone(), new);
        [
            (PodOp::Delete, deletes),
            (PodOp::Add, adds),
            (PodOp::Update, updates),
            (PodOp::Reconcile, reconciles),
        ]
        .into_iter()
        .filter(|(_, pods)| !pods.is_empty())
        .map(|(op, mut pods)| {
            pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
            PodUpdate {
                op,
                source: source.clone(),
                pods,
            }
        })
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec};

    fn pod(uid: &str, image: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(format!("p-{uid}"));
        p.metadata.uid = Some(uid.into());
        p.spec = Some(PodSpec {
            containers: vec![Container {
                name: "c".into(),
                image: Some(image.into()),
                ..Default::default()
            }],
            ..Default::default()
        });
        p
    }

    fn ops(updates: &[PodUpdate]) -> Vec<(PodOp, Vec<String>)> {
        updates
            .iter()
            .map(|u| (u.op, u.pods.iter().map(|p| uid(p).to_owned()).collect()))
            .collect()
    }

    fn snap(source: &str, pods: Vec<Pod>) -> SourceSnapshot {
        SourceSnapshot {
            source: source.into(),
            pods,
        }
    }

    #[test]
    fn diffs_snapshots_into_updates() {
        let mut pc = PodConfig::default();
        let u = pc.merge(snap("file", vec![pod("a", "x"), pod("b", "x")]));
        assert_eq!(ops(&u), [(PodOp::Add, vec!["a".into(), "b".into()])]);
        assert!(
            pc.merge(snap("file", vec![pod("a", "x"), pod("b", "x")]))
                .is_empty()
        );
        let u = pc.merge(snap("file", vec![pod("a", "y"), pod("c", "x")]));
        assert_eq!(
            ops(&u),
            [
                (PodOp::Delete, vec!["b".into()]),
                (PodOp::Add, vec!["c".into()]),
                (PodOp::Update, vec!["a".into()]),
            ]
        );
        let mut with_status = pod("c", "x");
        with_status.status = Some(Default::default());
        let u = pc.merge(snap("file", vec![pod("a", "y"), with_status]));
        assert_eq!(ops(&u), [(PodOp::Reconcile, vec!["c".into()])]);
    }

    #[test]
    fn deleted_pods_carry_a_deletion_timestamp_and_seen_is_kept() {
        let mut pc = PodConfig::default();
        let first = pc.merge(snap("file", vec![pod("a", "x")]));
        let seen =
            first[0].pods[0].metadata.annotations.as_ref().unwrap()[CONFIG_SEEN_ANNOTATION].clone();
        assert!(
            pc.merge(snap("file", vec![pod("a", "x")])).is_empty(),
            "seen is stable"
        );
        let u = pc.merge(snap("file", vec![]));
        assert_eq!(u[0].op, PodOp::Delete);
        assert!(u[0].pods[0].metadata.deletion_timestamp.is_some());
        assert_eq!(
            u[0].pods[0].metadata.annotations.as_ref().unwrap()[CONFIG_SEEN_ANNOTATION],
            seen
        );
    }

    #[test]
    fn a_uid_belongs_to_the_first_source() {
        let mut pc = PodConfig::default();
        pc.merge(snap("file", vec![pod("a", "x")]));
        assert!(
            pc.merge(snap("http", vec![pod("a", "y"), pod("a", "z")]))
                .is_empty()
        );
        let u = pc.merge(snap("http", vec![pod("b", "y"), pod("b", "z")]));
        assert_eq!(ops(&u), [(PodOp::Add, vec!["b".into()])]);
        assert_eq!(
            u[0].pods[0].spec.as_ref().unwrap().containers[0]
                .image
                .as_deref(),
            Some("y")
        );
    }
}
