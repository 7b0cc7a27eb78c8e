//! The API pod source: the pods bound to this node (`spec.nodeName=<node>`), watched
//! with kube-runtime's watcher (which lists again after a 410 Gone or a dropped watch).
//!
//! Every change sends PodConfig the complete set, as the other sources do. Mirror pods
//! are the API's copies of static pods: they are kept in [`ApiPods`] for the mirror and
//! status managers, never run.

use std::collections::{BTreeMap, HashMap};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{ApiPods, is_mirror};
use crate::podconfig::SourceSnapshot;
use crate::podconfig::static_pod::CONFIG_SOURCE_ANNOTATION;

/// The source's name in PodConfig and in `kubernetes.io/config.source`.
pub const SOURCE: &str = "api";

/// The pods to run: every non-mirror pod, marked as coming from the API.
pub fn desired(pods: &HashMap<String, Pod>) -> Vec<Pod> {
    let mut out: Vec<Pod> = pods
        .values()
        .filter(|p| !is_mirror(p))
        .cloned()
        .map(|mut p| {
            p.metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(CONFIG_SOURCE_ANNOTATION.into(), SOURCE.into());
            p
        })
        .collect();
    out.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    out
}

fn key(pod: &Pod) -> String {
    ApiPods::key(
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or(""),
    )
}

/// Watches the node's pods until cancelled, publishing them to `store` and `tx`.
pub async fn run(
    client: kube::Client,
    node_name: String,
    store: ApiPods,
    tx: mpsc::Sender<SourceSnapshot>,
    cancel: CancellationToken,
) {
    let api: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    let mut pods: HashMap<String, Pod> = HashMap::new();
    let mut init: Option<HashMap<String, Pod>> = None;
    let mut synced = false;
    let mut failing = false;
    loop {
        let event = tokio::select! {
            () = cancel.cancelled() => return,
            e = stream.next() => match e {
                Some(e) => e,
                None => return,
            },
        };
        let changed = match event {
            Ok(Event::Init) => {
                init = Some(HashMap::new());
                false
            }
            Ok(Event::InitApply(pod)) => {
                init.get_or_insert_with(HashMap::new).insert(key(&pod), pod);
                false
            }
            Ok(Event::InitDone) => {
                pods = init.take().unwrap_or_default();
                if failing {
                    tracing::info!("watching pods again");
                }
                failing = false;
                synced = true;
                true
            }
            Ok(Event::Apply(pod)) => {
                pods.insert(key(&pod), pod);
                true
            }
            Ok(Event::Delete(pod)) => {
                pods.remove(&key(&pod));
                true
            }
            Err(e) => {
                // The watcher backs off and lists again; the node keeps running what
                // it runs meanwhile.
                if !failing {
                    tracing::error!("watching the node's pods: {e}; retrying");
                }
                failing = true;
                false
            }
        };
        if changed && synced {
            store.replace(pods.clone());
            let snapshot = SourceSnapshot {
                source: SOURCE.into(),
                pods: desired(&pods),
            };
            if tx.send(snapshot).await.is_err() {
                return;
            }
        }
    }
}
