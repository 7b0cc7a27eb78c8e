//! The Node object: what the kubelet registers, and registering it.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeDaemonEndpoints, NodeRuntimeHandler, NodeSpec,
    NodeStatus, NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, Patch, PatchParams, PostParams};

use super::{FIELD_MANAGER, is_conflict};
use crate::machine::MachineInfo;

/// The version the node reports as `kubeletVersion`: the Kubernetes API level it
/// implements, with wasmlet's own version as a pre-release tag.
pub fn kubelet_version() -> String {
    format!("v1.33.0-wasmlet.{}", env!("CARGO_PKG_VERSION"))
}

/// The labels the kubelet sets on its Node (`kubernetes.io/hostname`, `os`, `arch`
/// and the `beta.` ones), then `extra` (`--node-labels`).
pub fn kubelet_labels(
    hostname: &str,
    arch: &str,
    extra: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        ("kubernetes.io/hostname".to_owned(), hostname.to_owned()),
        ("kubernetes.io/os".to_owned(), "linux".to_owned()),
        ("kubernetes.io/arch".to_owned(), arch.to_owned()),
        ("beta.kubernetes.io/os".to_owned(), "linux".to_owned()),
        ("beta.kubernetes.io/arch".to_owned(), arch.to_owned()),
    ]);
    labels.extend(extra.clone());
    labels
}

/// What the node knows about itself when it registers.
#[derive(Clone, Debug, Default)]
pub struct NodeFacts {
    pub name: String,
    pub hostname: String,
    /// `--node-labels`.
    pub extra_labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub addresses: Vec<IpAddr>,
    pub machine: MachineInfo,
    pub capacity: BTreeMap<String, Quantity>,
    pub allocatable: BTreeMap<String, Quantity>,
    /// `<runtime>://<version>` of the default runtime.
    pub runtime_version: String,
    /// The runtime handlers pods can name in a RuntimeClass.
    pub runtime_handlers: Vec<String>,
    /// The port of the node's authenticated API.
    pub kubelet_port: u16,
}

impl NodeFacts {
    /// The labels the kubelet sets on its Node, then the `--node-labels`.
    pub fn labels(&self) -> BTreeMap<String, String> {
        kubelet_labels(
            &self.hostname,
            &self.machine.architecture,
            &self.extra_labels,
        )
    }

    /// `status.addresses`: the InternalIPs, then the Hostname.
    pub fn node_addresses(&self) -> Vec<NodeAddress> {
        let mut out: Vec<NodeAddress> = self
            .addresses
            .iter()
            .map(|ip| NodeAddress {
                type_: "InternalIP".into(),
                address: ip.to_string(),
            })
            .collect();
        out.push(NodeAddress {
            type_: "Hostname".into(),
            address: self.hostname.clone(),
        });
        out
    }

    pub fn node_info(&self) -> NodeSystemInfo {
        let m = &self.machine;
        NodeSystemInfo {
            architecture: m.architecture.clone(),
            boot_id: m.boot_id.clone(),
            container_runtime_version: self.runtime_version.clone(),
            kernel_version: m.kernel_version.clone(),
            kube_proxy_version: String::new(),
            kubelet_version: kubelet_version(),
            machine_id: m.machine_id.clone(),
            operating_system: "linux".into(),
            os_image: m.os_image.clone(),
            system_uuid: m.system_uuid.clone(),
            swap: None,
        }
    }

    /// The status fields that describe the machine (conditions and images are the
    /// status loop's).
    pub fn base_status(&self) -> NodeStatus {
        NodeStatus {
            addresses: Some(self.node_addresses()),
            allocatable: Some(self.allocatable.clone()),
            capacity: Some(self.capacity.clone()),
            daemon_endpoints: Some(NodeDaemonEndpoints {
                kubelet_endpoint: Some(DaemonEndpoint {
                    port: i32::from(self.kubelet_port),
                }),
            }),
            node_info: Some(self.node_info()),
            runtime_handlers: Some(
                self.runtime_handlers
                    .iter()
                    .map(|h| NodeRuntimeHandler {
                        name: Some(h.clone()),
                        features: None,
                    })
                    .collect(),
            ),
            ..Default::default()
        }
    }

    /// The Node to create.
    pub fn initial_node(&self) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some(self.name.clone());
        node.metadata.labels = Some(self.labels());
        node.metadata.annotations = Some(BTreeMap::from([(
            "volumes.kubernetes.io/controller-managed-attach-detach".to_owned(),
            "true".to_owned(),
        )]));
        node.spec = Some(NodeSpec {
            taints: Some(self.taints.clone()).filter(|t| !t.is_empty()),
            ..Default::default()
        });
        node.status = Some(self.base_status());
        node
    }
}

/// The labels of `existing` the node owns that differ from what it would register:
/// the kubelet reconciles these on an existing Node (others are the cluster's).
pub fn label_patch(facts: &NodeFacts, existing: &Node) -> Option<BTreeMap<String, Option<String>>> {
    let have = existing.metadata.labels.clone().unwrap_or_default();
    let mut patch = BTreeMap::new();
    // Only the labels the kubelet owns: `--node-labels` apply when the Node is
    // created; an administrator may change them afterwards.
    let mut own = facts.labels();
    own.retain(|k, _| !facts.extra_labels.contains_key(k));
    for (k, v) in own {
        if have.get(&k) != Some(&v) {
            patch.insert(k, Some(v));
        }
    }
    (!patch.is_empty()).then_some(patch)
}

/// The strategic merge patch of the node's status: addresses replace the list (they
/// merge by type otherwise, which folds two InternalIPs into one).
pub fn status_patch(status: &NodeStatus) -> serde_json::Value {
    let mut v = serde_json::to_value(status).unwrap_or_default();
    if let Some(serde_json::Value::Array(items)) = v.get_mut("addresses") {
        items.insert(0, serde_json::json!({ "$patch": "replace" }));
    }
    // No volume in use any more: the list goes (a patch without it would keep it).
    if let Some(map) = v.as_object_mut() {
        map.entry("volumesInUse").or_insert(serde_json::Value::Null);
    }
    serde_json::json!({ "status": v })
}

/// Parameters of the node's patches.
pub fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

/// Registers the node: creates it, or reconciles an existing one of the same name.
/// Returns the Node as the API server has it.
pub async fn register_once(client: &kube::Client, facts: &NodeFacts) -> kube::Result<Node> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = facts.initial_node();
    match nodes.create(&PostParams::default(), &node).await {
        Ok(created) => {
            tracing::info!(node = %facts.name, "registered the node");
            // Write the status through its subresource too, in case the API server
            // dropped it on create.
            let status = status_patch(&node.status.clone().unwrap_or_default());
            let params = patch_params();
            match nodes
                .patch_status(&facts.name, &params, &Patch::Strategic(status))
                .await
            {
                Ok(n) => Ok(n),
                Err(e) => {
                    tracing::warn!(node = %facts.name, "writing the first node status: {e}");
                    Ok(created)
                }
            }
        }
        Err(e) if is_conflict(&e) => {
            let existing = nodes.get(&facts.name).await?;
            tracing::info!(node = %facts.name, uid = ?existing.metadata.uid, "the node is already registered; reconciling it");
            let params = patch_params();
            let mut node = existing;
            if let Some(labels) = label_patch(facts, &node) {
                let patch = serde_json::json!({ "metadata": { "labels": labels } });
                node = nodes
                    .patch(&facts.name, &params, &Patch::Strategic(patch))
                    .await?;
            }
            let status = status_patch(&facts.base_status());
            nodes
                .patch_status(&facts.name, &params, &Patch::Strategic(status))
                .await
                .or(Ok(node))
        }
        Err(e) => Err(e),
    }
}

/// Registers the node, retrying with the kubelet's back-off (100 ms doubling to 7 s)
/// until it succeeds or `cancel` fires.
pub async fn register(
    client: &kube::Client,
    facts: &NodeFacts,
    cancel: &tokio_util::sync::CancellationToken,
) -> Option<Node> {
    let mut delay = Duration::from_millis(100);
    loop {
        match register_once(client, facts).await {
            Ok(node) => return Some(node),
            Err(e) => {
                tracing::warn!(node = %facts.name, retry_in = ?delay, "unable to register the node with the API server: {e}")
            }
        }
        tokio::select! {
            () = cancel.cancelled() => return None,
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(7));
    }
}

/// The node's IP when `--node-ip` is not given: the address of the interface the
/// default route leaves by, else the first non-loopback address the hostname
/// resolves to.
pub fn detect_node_ip(hostname: &str) -> Option<IpAddr> {
    // Connecting a UDP socket sends nothing; it only selects the route.
    if let Ok(sock) = std::net::UdpSocket::bind("0.0.0.0:0")
        && sock.connect("192.0.2.1:9").is_ok()
        && let Ok(addr) = sock.local_addr()
        && !addr.ip().is_unspecified()
    {
        return Some(addr.ip());
    }
    use std::net::ToSocketAddrs as _;
    (hostname, 0)
        .to_socket_addrs()
        .ok()?
        .map(|a| a.ip())
        .find(|ip| !ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> NodeFacts {
        NodeFacts {
            name: "n1".into(),
            hostname: "n1".into(),
            extra_labels: BTreeMap::from([("example.com/tier".into(), "edge".into())]),
            taints: vec![crate::config::parse_taint("wasm=only:NoSchedule").unwrap()],
            addresses: vec!["10.0.0.5".parse().unwrap()],
            machine: MachineInfo {
                architecture: "amd64".into(),
                kernel_version: "6.1.0".into(),
                os_image: "Debian GNU/Linux 12 (bookworm)".into(),
                machine_id: "m".into(),
                boot_id: "b".into(),
                ..Default::default()
            },
            runtime_version: "containerd://1.6.20".into(),
            runtime_handlers: vec!["".into(), "wasmtime".into()],
            kubelet_port: 10250,
            ..Default::default()
        }
    }

    #[test]
    fn the_node_carries_the_kubelets_fields() {
        let node = facts().initial_node();
        let labels = node.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["kubernetes.io/hostname"], "n1");
        assert_eq!(labels["kubernetes.io/os"], "linux");
        assert_eq!(labels["kubernetes.io/arch"], "amd64");
        assert_eq!(labels["example.com/tier"], "edge");
        let taints = node.spec.as_ref().unwrap().taints.as_ref().unwrap();
        assert_eq!(
            (
                taints[0].key.as_str(),
                taints[0].value.as_deref(),
                taints[0].effect.as_str()
            ),
            ("wasm", Some("only"), "NoSchedule")
        );
        let status = node.status.as_ref().unwrap();
        let addrs: Vec<(&str, &str)> = status
            .addresses
            .as_ref()
            .unwrap()
            .iter()
            .map(|a| (a.type_.as_str(), a.address.as_str()))
            .collect();
        assert_eq!(addrs, [("InternalIP", "10.0.0.5"), ("Hostname", "n1")]);
        let info = status.node_info.as_ref().unwrap();
        assert_eq!(info.container_runtime_version, "containerd://1.6.20");
        assert!(info.kubelet_version.starts_with("v1.33.0-wasmlet."));
        assert_eq!(
            status
                .daemon_endpoints
                .as_ref()
                .unwrap()
                .kubelet_endpoint
                .as_ref()
                .unwrap()
                .port,
            10250
        );
        let handlers: Vec<_> = status
            .runtime_handlers
            .as_ref()
            .unwrap()
            .iter()
            .map(|h| h.name.clone().unwrap())
            .collect();
        assert_eq!(handlers, ["", "wasmtime"]);
    }

    #[test]
    fn only_the_nodes_own_labels_are_reconciled() {
        let f = facts();
        let mut existing = f.initial_node();
        assert_eq!(label_patch(&f, &existing), None);
        let labels = existing.metadata.labels.as_mut().unwrap();
        labels.insert("kubernetes.io/arch".into(), "arm64".into());
        labels.insert("team".into(), "a".into());
        let patch = label_patch(&f, &existing).unwrap();
        assert_eq!(
            patch,
            BTreeMap::from([("kubernetes.io/arch".to_owned(), Some("amd64".to_owned()))])
        );
    }
}
