//! RuntimeClasses from the API server: a pod's `runtimeClassName` names a RuntimeClass
//! object whose `handler` the node runs it with, as the kubelet's RuntimeClass manager
//! resolves it.

use std::collections::BTreeMap;

use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::Api;
use kube::runtime::watcher;
use tokio_util::sync::CancellationToken;

use crate::router::RuntimeRouter;

/// Watches RuntimeClasses until cancelled and keeps `router`'s copy current.
pub async fn run(client: kube::Client, router: RuntimeRouter, cancel: CancellationToken) {
    let api: Api<RuntimeClass> = Api::all(client);
    super::watch_set(
        api,
        watcher::Config::default(),
        "RuntimeClasses",
        cancel,
        move |classes| {
            let map: BTreeMap<String, String> = classes
                .values()
                .map(|rc| {
                    (
                        rc.metadata.name.clone().unwrap_or_default(),
                        rc.handler.clone(),
                    )
                })
                .collect();
            tracing::debug!(classes = ?map, "RuntimeClasses");
            router.set_api_classes(map);
            Box::pin(async { true })
        },
    )
    .await;
}
