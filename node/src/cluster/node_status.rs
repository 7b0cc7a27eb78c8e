//! NodeStatus: computed every `nodeStatusUpdateFrequency` (10 s) and written when it
//! changed or every `nodeStatusReportFrequency` (5 min), as the kubelet does. A Node
//! that was deleted is registered again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerImage, Node, NodeCondition, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::registration::{NodeFacts, patch_params, register, status_patch};
use super::{NodeHandle, is_not_found};

/// The kubelet's cap on `status.images`.
pub const MAX_IMAGES: usize = 50;

/// What the status loop asks the rest of the node.
pub struct StatusInputs {
    /// `Err(reason)` when the node is not ready (runtime down, PLEG unhealthy...).
    pub readiness: Arc<dyn Fn() -> Result<(), String> + Send + Sync>,
    /// The pressure conditions the eviction manager holds (`MemoryPressure`,
    /// `DiskPressure`, `PIDPressure`).
    pub pressure: Arc<dyn Fn() -> BTreeSet<&'static str> + Send + Sync>,
    /// Changes that get the status written at once rather than at the next tick (the
    /// node starting to shut down).
    pub nudge: Option<tokio::sync::watch::Receiver<bool>>,
    /// The images on the node, by every runtime.
    pub images: Arc<
        dyn Fn() -> futures::future::BoxFuture<'static, Vec<wasmlet_runtime::Image>> + Send + Sync,
    >,
    /// The device plugins' resources, when the node has a device manager: their
    /// capacity and allocatable (a resource whose plugin is gone for good at 0), and
    /// a receiver that changes with them.
    pub devices: Option<DeviceResources>,
    /// The unique names of the volumes staged on the node (`status.volumesInUse`: the
    /// attach/detach controller does not detach those).
    pub volumes_in_use: Option<Arc<dyn Fn() -> Vec<String> + Send + Sync>>,
}

/// The device plugins' side of the status: each resource's (capacity, allocatable),
/// and a receiver that changes with them.
#[derive(Clone)]
pub struct DeviceResources {
    pub amounts: Arc<dyn Fn() -> BTreeMap<String, (i64, i64)> + Send + Sync>,
    pub changes: tokio::sync::watch::Receiver<u64>,
}

/// Adds the device plugins' resources, (capacity, allocatable) by name, to `status`.
pub fn add_device_resources(status: &mut NodeStatus, amounts: &BTreeMap<String, (i64, i64)>) {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    for (name, (capacity, allocatable)) in amounts {
        status
            .capacity
            .get_or_insert_with(Default::default)
            .insert(name.clone(), Quantity(capacity.to_string()));
        status
            .allocatable
            .get_or_insert_with(Default::default)
            .insert(name.clone(), Quantity(allocatable.to_string()));
    }
}

fn time_now() -> Time {
    Time(jiff::Timestamp::from_second(jiff::Timestamp::now().as_second()).unwrap())
}

/// `status.images`: largest first, at most [`MAX_IMAGES`], names are digests then tags.
pub fn images(mut list: Vec<wasmlet_runtime::Image>) -> Vec<ContainerImage> {
    list.sort_by(|a, b| b.size.cmp(&a.size).then_with(|| a.id.cmp(&b.id)));
    list.truncate(MAX_IMAGES);
    list.into_iter()
        .filter_map(|i| {
            let names: Vec<String> = i
                .repo_digests
                .iter()
                .chain(i.repo_tags.iter())
                .cloned()
                .collect();
            let size_bytes = Some(i.size as i64);
            (!names.is_empty()).then_some(ContainerImage {
                names: Some(names),
                size_bytes,
            })
        })
        .collect()
}

/// The four conditions the kubelet sets, keeping transition times of conditions
/// whose status did not change; `pressure` holds the pressure conditions that are
/// true.
pub fn conditions(
    ready: &Result<(), String>,
    pressure: &BTreeSet<&str>,
    previous: Option<&NodeStatus>,
) -> Vec<NodeCondition> {
    let now = time_now();
    let cond = |type_: &str, status: &str, reason: &str, message: &str| {
        let kept = previous
            .and_then(|p| p.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == type_ && c.status == status))
            .and_then(|c| c.last_transition_time.clone());
        NodeCondition {
            type_: type_.into(),
            status: status.into(),
            reason: Some(reason.into()),
            message: Some(message.into()),
            last_heartbeat_time: Some(now.clone()),
            last_transition_time: Some(kept.unwrap_or_else(|| now.clone())),
        }
    };
    // (condition, reason and message when false, when true)
    let kinds = [
        (
            "MemoryPressure",
            (
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            ),
            (
                "KubeletHasInsufficientMemory",
                "kubelet has insufficient memory available",
            ),
        ),
        (
            "DiskPressure",
            ("KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            ("KubeletHasDiskPressure", "kubelet has disk pressure"),
        ),
        (
            "PIDPressure",
            (
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available",
            ),
            (
                "KubeletHasInsufficientPID",
                "kubelet has insufficient PID available",
            ),
        ),
    ];
    let mut out: Vec<NodeCondition> = kinds
        .iter()
        .map(|(kind, no, yes)| match pressure.contains(kind) {
            true => cond(kind, "True", yes.0, yes.1),
            false => cond(kind, "False", no.0, no.1),
        })
        .collect();
    out.push(match ready {
        Ok(()) => cond(
            "Ready",
            "True",
            "KubeletReady",
            "kubelet is posting ready status",
        ),
        Err(why) => cond("Ready", "False", "KubeletNotReady", why),
    });
    out
}

/// Computes and writes the node's status until cancelled.
pub struct NodeStatusLoop {
    pub client: kube::Client,
    pub facts: NodeFacts,
    pub inputs: StatusInputs,
    pub node: NodeHandle,
    pub update_frequency: Duration,
    pub report_frequency: Duration,
}

impl NodeStatusLoop {
    /// The status the node would write now.
    pub async fn compute(&self, previous: Option<&NodeStatus>) -> NodeStatus {
        let mut status = self.facts.base_status();
        status.conditions = Some(conditions(
            &(self.inputs.readiness)(),
            &(self.inputs.pressure)(),
            previous,
        ));
        status.images = Some(images((self.inputs.images)().await));
        if let Some(devices) = &self.inputs.devices {
            add_device_resources(&mut status, &(devices.amounts)());
        }
        if let Some(in_use) = &self.inputs.volumes_in_use {
            status.volumes_in_use = Some(in_use()).filter(|v| !v.is_empty());
        }
        status
    }

    pub async fn run(self, cancel: CancellationToken) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let mut last_write: Option<Instant> = None;
        let mut failing = false;
        let mut nudge = self.inputs.nudge.clone();
        let mut device_changes = self.inputs.devices.as_ref().map(|d| d.changes.clone());
        loop {
            // As the kubelet: read the Node, compute the status against what the API
            // has (a controller may have marked the node Unknown meanwhile), write it
            // when it differs or the report is due.
            let outcome = match nodes.get(&self.facts.name).await {
                Err(e) if is_not_found(&e) => {
                    tracing::warn!(node = %self.facts.name, "the Node object is gone; registering again");
                    match register(&self.client, &self.facts, &cancel).await {
                        Some(node) => self.node.set(node),
                        None => return, // cancelled
                    }
                    last_write = None;
                    continue;
                }
                Err(e) => Err(e),
                Ok(node) => {
                    let current = node.status.clone().unwrap_or_default();
                    self.node.set(node);
                    let status = self.compute(Some(&current)).await;
                    let due = last_write.is_none_or(|at| at.elapsed() >= self.report_frequency)
                        || differs(&current, &status);
                    if due {
                        let patch = status_patch(&status);
                        nodes
                            .patch_status(
                                &self.facts.name,
                                &patch_params(),
                                &Patch::Strategic(patch),
                            )
                            .await
                            .map(|node| {
                                self.node.set(node);
                                last_write = Some(Instant::now());
                            })
                    } else {
                        Ok(())
                    }
                }
            };
            match outcome {
                Ok(()) => {
                    if failing {
                        tracing::info!(node = %self.facts.name, "node status is updated again");
                    }
                    failing = false;
                }
                Err(e) => {
                    if !failing {
                        tracing::error!(node = %self.facts.name, "error updating node status, will retry: {e}");
                    }
                    failing = true;
                }
            }
            let nudged = async {
                if let Some(rx) = nudge.as_mut()
                    && rx.changed().await.is_ok()
                {
                    return;
                }
                std::future::pending::<()>().await
            };
            let devices_changed = async {
                if let Some(rx) = device_changes.as_mut()
                    && rx.changed().await.is_ok()
                {
                    return;
                }
                std::future::pending::<()>().await
            };
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(self.update_frequency) => {}
                () = nudged => {}
                () = devices_changed => {}
            }
        }
    }
}

/// Whether the API's copy of the status differs from the node's in what the node
/// owns: its four conditions (by type; heartbeat times aside), its resources (by
/// value), addresses, nodeInfo, images, daemonEndpoints and runtimeHandlers. Fields
/// controllers own (extended resources, other conditions, volumes) never count.
pub fn differs(api: &NodeStatus, ours: &NodeStatus) -> bool {
    let conditions = |s: &NodeStatus| {
        let mut v: Vec<NodeCondition> = s
            .conditions
            .iter()
            .flatten()
            .filter(|c| {
                matches!(
                    c.type_.as_str(),
                    "MemoryPressure" | "DiskPressure" | "PIDPressure" | "Ready"
                )
            })
            .map(|c| NodeCondition {
                last_heartbeat_time: None,
                ..c.clone()
            })
            .collect();
        v.sort_by(|a, b| a.type_.cmp(&b.type_));
        v
    };
    let same_values = |api: &Option<
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >,
                       ours: &Option<
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >| {
        let empty = Default::default();
        let api = api.as_ref().unwrap_or(&empty);
        ours.iter().flatten().all(|(k, q)| {
            api.get(k).is_some_and(|a| {
                a == q || crate::quantity::parse(a).ok() == crate::quantity::parse(q).ok()
            })
        })
    };
    conditions(api) != conditions(ours)
        || !same_values(&api.capacity, &ours.capacity)
        || !same_values(&api.allocatable, &ours.allocatable)
        || api.addresses != ours.addresses
        || api.node_info != ours.node_info
        || api.images != ours.images
        || api.daemon_endpoints != ours.daemon_endpoints
        || api.runtime_handlers != ours.runtime_handlers
        || api.volumes_in_use.as_deref().unwrap_or_default()
            != ours.volumes_in_use.as_deref().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_have_the_kubelets_reasons_and_keep_transition_times() {
        let ready = conditions(&Ok(()), &BTreeSet::new(), None);
        let kinds: Vec<(&str, &str, &str)> = ready
            .iter()
            .map(|c| {
                (
                    c.type_.as_str(),
                    c.status.as_str(),
                    c.reason.as_deref().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            kinds,
            [
                ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                ("PIDPressure", "False", "KubeletHasSufficientPID"),
                ("Ready", "True", "KubeletReady"),
            ]
        );
        let mut prev = NodeStatus {
            conditions: Some(ready),
            ..Default::default()
        };
        let epoch = Time(jiff::Timestamp::UNIX_EPOCH);
        for c in prev.conditions.iter_mut().flatten() {
            c.last_transition_time = Some(epoch.clone());
        }
        let not_ready = conditions(
            &Err("PLEG is not healthy".into()),
            &BTreeSet::new(),
            Some(&prev),
        );
        assert_eq!(not_ready[0].last_transition_time, Some(epoch.clone()));
        assert_eq!(not_ready[3].status, "False");
        assert_eq!(not_ready[3].message.as_deref(), Some("PLEG is not healthy"));
        assert_ne!(not_ready[3].last_transition_time, Some(epoch.clone()));

        let pressed = conditions(&Ok(()), &BTreeSet::from(["MemoryPressure"]), Some(&prev));
        assert_eq!(
            (pressed[0].status.as_str(), pressed[0].reason.as_deref()),
            ("True", Some("KubeletHasInsufficientMemory"))
        );
        assert_eq!(
            pressed[0].message.as_deref(),
            Some("kubelet has insufficient memory available")
        );
        assert_ne!(pressed[0].last_transition_time, Some(epoch.clone()));
        assert_eq!(pressed[1].last_transition_time, Some(epoch.clone()));
    }

    #[test]
    fn heartbeats_alone_are_not_a_change() {
        let a = NodeStatus {
            conditions: Some(conditions(&Ok(()), &BTreeSet::new(), None)),
            ..Default::default()
        };
        let mut b = a.clone();
        for c in b.conditions.iter_mut().flatten() {
            c.last_heartbeat_time = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        }
        assert!(!differs(&a, &b));
        // Order, other writers' conditions and equal quantities in another form are
        // not changes either.
        let mut api = b.clone();
        api.conditions.as_mut().unwrap().reverse();
        api.conditions.as_mut().unwrap().push(NodeCondition {
            type_: "NetworkUnavailable".into(),
            status: "False".into(),
            ..Default::default()
        });
        let q = k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        b.capacity = Some([("memory".to_owned(), q("1024Ki".into()))].into());
        api.capacity = Some(
            [
                ("memory".to_owned(), q("1Mi".into())),
                ("example.com/dongle".to_owned(), q("2".into())),
            ]
            .into(),
        );
        assert!(!differs(&api, &b));
        api.conditions.as_mut().unwrap()[0].status = "Unknown".into();
        assert!(differs(&api, &b), "a controller marked the node Unknown");
    }

    #[test]
    fn images_are_largest_first_and_capped() {
        let list: Vec<wasmlet_runtime::Image> = (0..60)
            .map(|i| wasmlet_runtime::Image {
                id: format!("sha256:{i:02}"),
                repo_tags: vec![format!("r/{i}:1")],
                repo_digests: vec![format!("r/{i}@sha256:{i:02}")],
                size: i,
                ..Default::default()
            })
            .collect();
        let out = images(list);
        assert_eq!(out.len(), MAX_IMAGES);
        assert_eq!(out[0].size_bytes, Some(59));
        assert_eq!(
            out[0].names.as_ref().unwrap(),
            &["r/59@sha256:59".to_owned(), "r/59:1".to_owned()]
        );
    }
}
