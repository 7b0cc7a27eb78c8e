//! Events, as the kubelet records them: core/v1 Events with the kubelet's reasons,
//! `source.component: kubelet`, repeated events counted on one object.
//!
//! Recording never blocks a pod worker: events go through a channel to a task that
//! writes them; when the API server is unreachable they are dropped after being
//! logged, as client-go's broadcaster drops them.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use kube::api::{Api, Patch, PostParams};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::registration::patch_params;

pub const NORMAL: &str = "Normal";
/// Events waiting to be written beyond this are dropped.
pub const QUEUE: usize = 1000;
pub const WARNING: &str = "Warning";

/// One event to record.
#[derive(Clone, Debug)]
pub struct Record {
    pub object: ObjectReference,
    pub type_: &'static str,
    pub reason: &'static str,
    pub message: String,
}

/// Hands events to the writer; a default recorder (standalone node) only logs them.
#[derive(Clone, Default)]
pub struct EventRecorder {
    tx: Option<mpsc::Sender<Record>>,
}

/// The reference an event about `pod` (and optionally one of its containers) carries.
pub fn pod_reference(pod: &Pod, container: Option<&str>) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: pod.metadata.namespace.clone(),
        name: pod.metadata.name.clone(),
        uid: pod.metadata.uid.clone(),
        field_path: container.map(|c| format!("spec.containers{{{c}}}")),
        ..Default::default()
    }
}

impl EventRecorder {
    /// A recorder whose events are taken from the returned receiver.
    /// Like client-go's broadcaster, at most [`QUEUE`] events wait to be written;
    /// more are dropped.
    pub fn channel() -> (Self, mpsc::Receiver<Record>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        (EventRecorder { tx: Some(tx) }, rx)
    }

    /// Records an event about a pod or one of its containers.
    pub fn pod(
        &self,
        pod: &Pod,
        container: Option<&str>,
        type_: &'static str,
        reason: &'static str,
        message: impl Into<String>,
    ) {
        let record = Record {
            object: pod_reference(pod, container),
            type_,
            reason,
            message: message.into(),
        };
        tracing::debug!(pod = ?record.object.name, reason, message = %record.message, "event");
        if let Some(tx) = &self.tx {
            let _ = tx.try_send(record);
        }
    }

    /// Records an event about the node.
    pub fn node(&self, node_name: &str, type_: &'static str, reason: &'static str, message: &str) {
        let record = Record {
            object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node_name.into()),
                // The kubelet refers to its node by name in events.
                uid: Some(node_name.into()),
                ..Default::default()
            },
            type_,
            reason,
            message: message.into(),
        };
        if let Some(tx) = &self.tx {
            let _ = tx.try_send(record);
        }
    }
}

/// What makes two events the same: (uid, fieldPath, reason, message).
type EventKey = (String, String, String, String);
/// Where repeats of an event are counted: (namespace, event name, count).
type Aggregate = (String, String, i32);

/// Writes recorded events until cancelled.
pub async fn run(
    client: kube::Client,
    node_name: String,
    mut rx: mpsc::Receiver<Record>,
    cancel: CancellationToken,
) {
    // (uid, fieldPath, reason, message) -> (namespace, event name, count).
    let mut seen: HashMap<EventKey, Aggregate> = HashMap::new();
    let mut failing = false;
    loop {
        let record = tokio::select! {
            () = cancel.cancelled() => return,
            r = rx.recv() => match r {
                Some(r) => r,
                None => return,
            },
        };
        let namespace = record
            .object
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let api: Api<Event> = Api::namespaced(client.clone(), &namespace);
        let key = (
            record.object.uid.clone().unwrap_or_default(),
            record.object.field_path.clone().unwrap_or_default(),
            record.reason.to_owned(),
            record.message.clone(),
        );
        let now = jiff::Timestamp::now();
        let result = match seen.get(&key) {
            Some((ns, name, count)) if *ns == namespace => {
                let patch = serde_json::json!({
                    "count": count + 1,
                    "lastTimestamp": Time(jiff::Timestamp::from_second(now.as_second()).unwrap_or(now)),
                });
                let name = name.clone();
                api.patch(&name, &patch_params(), &Patch::Merge(patch))
                    .await
                    .map(|_| (name, count + 1))
            }
            _ => {
                let name = format!(
                    "{}.{:x}",
                    record.object.name.as_deref().unwrap_or("event"),
                    now.as_nanosecond()
                );
                let second = Time(jiff::Timestamp::from_second(now.as_second()).unwrap_or(now));
                let event = Event {
                    metadata: kube::api::ObjectMeta {
                        name: Some(name.clone()),
                        namespace: Some(namespace.clone()),
                        ..Default::default()
                    },
                    involved_object: record.object.clone(),
                    reason: Some(record.reason.into()),
                    message: Some(record.message.clone()),
                    type_: Some(record.type_.into()),
                    count: Some(1),
                    first_timestamp: Some(second.clone()),
                    last_timestamp: Some(second),
                    event_time: None::<MicroTime>,
                    source: Some(EventSource {
                        component: Some("kubelet".into()),
                        host: Some(node_name.clone()),
                    }),
                    reporting_component: Some("kubelet".into()),
                    reporting_instance: Some(node_name.clone()),
                    ..Default::default()
                };
                api.create(&PostParams::default(), &event)
                    .await
                    .map(|_| (name, 1))
            }
        };
        match result {
            Ok((name, count)) => {
                failing = false;
                if seen.len() > 4096 {
                    seen.clear();
                }
                seen.insert(key, (namespace, name, count));
            }
            Err(e) => {
                if super::is_not_found(&e) {
                    // The aggregated event was removed (TTL): start a new one next time.
                    seen.remove(&key);
                }
                if !failing {
                    tracing::warn!(reason = record.reason, "cannot record event: {e}");
                }
                failing = true;
            }
        }
    }
}
