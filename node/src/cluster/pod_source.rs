//! The API pod source: the pods bound to this node (`spec.nodeName=<node>`), watched
//! with kube-runtime's watcher (which lists again after a 410 Gone or a dropped watch).
//!
//! Every change sends PodConfig the complete set, as the other sources do. Mirror pods
//! are the API's copies of static pods: they are kept in [`ApiPods`] for the mirror and
//! status managers, never run.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::watcher;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::ApiPods;
use crate::pod::CONFIG_SOURCE_ANNOTATION;
use crate::pod::is_mirror;
use crate::podconfig::SourceSnapshot;

/// The source's name in PodConfig and in `kubernetes.io/config.source`.
pub const SOURCE: &str = crate::pod::API_SOURCE;

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
    super::watch_set(api, config, "the node's pods", cancel, move |pods| {
        // The store is keyed like [`ApiPods::key`]: `namespace/name`.
        let snapshot = SourceSnapshot {
            source: SOURCE.into(),
            pods: desired(&pods),
        };
        store.replace(pods);
        let tx = tx.clone();
        Box::pin(async move { tx.send(snapshot).await.is_ok() })
    })
    .await;
}
