//! RuntimeClasses from the API server: a pod's `runtimeClassName` names a RuntimeClass
//! object whose `handler` the node runs it with, as the kubelet's RuntimeClass manager
//! resolves it.

use std::collections::{BTreeMap, HashMap};

use futures::StreamExt as _;
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use tokio_util::sync::CancellationToken;

use crate::router::RuntimeRouter;

/// Watches RuntimeClasses until cancelled and keeps `router`'s copy current.
pub async fn run(client: kube::Client, router: RuntimeRouter, cancel: CancellationToken) {
    let api: Api<RuntimeClass> = Api::all(client);
    let mut stream = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut classes: HashMap<String, String> = HashMap::new();
    let mut init: Option<HashMap<String, String>> = None;
    let mut failing = false;
    loop {
        let event = tokio::select! {
            () = cancel.cancelled() => return,
            e = stream.next() => match e {
                Some(e) => e,
                None => return,
            },
        };
        let entry = |rc: &RuntimeClass| {
            (
                rc.metadata.name.clone().unwrap_or_default(),
                rc.handler.clone(),
            )
        };
        let changed = match event {
            Ok(Event::Init) => {
                init = Some(HashMap::new());
                false
            }
            Ok(Event::InitApply(rc)) => {
                let (k, v) = entry(&rc);
                init.get_or_insert_with(HashMap::new).insert(k, v);
                false
            }
            Ok(Event::InitDone) => {
                classes = init.take().unwrap_or_default();
                failing = false;
                true
            }
            Ok(Event::Apply(rc)) => {
                let (k, v) = entry(&rc);
                classes.insert(k, v);
                true
            }
            Ok(Event::Delete(rc)) => {
                classes.remove(rc.metadata.name.as_deref().unwrap_or_default());
                true
            }
            Err(e) => {
                if !failing {
                    tracing::warn!("watching RuntimeClasses: {e}; retrying");
                }
                failing = true;
                false
            }
        };
        if changed {
            let map: BTreeMap<String, String> = classes.clone().into_iter().collect();
            tracing::debug!(classes = ?map, "RuntimeClasses");
            router.set_api_classes(map);
        }
    }
}
