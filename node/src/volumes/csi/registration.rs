//! CSI driver registration, as the kubelet's `csi_plugin.go` and `nodeinfomanager`
//! do it: the driver's versions are checked (the highest `1.x`), `NodeGetInfo` is
//! asked, and its node id, volume limit and topology go to the `CSINode` object (one
//! entry per driver), to the Node's `csi.volume.kubernetes.io/nodeid` annotation and
//! to the Node's labels. Deregistration removes the CSINode entry and the annotation
//! key; topology labels stay, as with the kubelet.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeNodeResources};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, Patch, PatchParams, PostParams};
use wasmlet_proto::csi::v1 as csi;
use wasmlet_proto::csi::v1::node_client::NodeClient;

use super::{CSI_TIMEOUT, Driver, Drivers, channel};

/// The Node annotation mapping each driver to its node id.
pub const NODE_ID_ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";

/// `version.ParseGeneric`: two or more dotted numbers, an optional leading `v`,
/// anything after the numbers ignored.
fn parse_version(v: &str) -> Option<(u64, u64, u64)> {
    let v = v.trim().strip_prefix('v').unwrap_or(v.trim());
    let numeric: String = v
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let parts: Vec<u64> = numeric
        .split('.')
        .filter(|p| !p.is_empty())
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    if parts.len() < 2 {
        return None;
    }
    Some((parts[0], parts[1], parts.get(2).copied().unwrap_or(0)))
}

/// The highest `1.x` of `versions` (versions above 1 are skipped, 0.x refused).
pub fn highest_supported(name: &str, versions: &[String]) -> Result<(u64, u64, u64), String> {
    if versions.is_empty() {
        return Err(format!(
            "CSI driver {name:?}: the plugin returned an empty list for supported versions"
        ));
    }
    let best = versions
        .iter()
        .filter_map(|v| parse_version(v))
        .filter(|v| v.0 <= 1)
        .max()
        .ok_or_else(|| {
            format!(
                "could not find a highest supported version from versions ({versions:?}) reported"
            )
        })?;
    if best.0 != 1 {
        return Err(format!(
            "highest supported version reported is {}.{}.{}, must be v1.x",
            best.0, best.1, best.2
        ));
    }
    Ok(best)
}

/// What `NodeGetInfo` said.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    pub node_id: String,
    pub max_volumes: i64,
    pub topology: BTreeMap<String, String>,
}

async fn node_get_info(endpoint: &Path) -> Result<NodeInfo, String> {
    let mut request = tonic::Request::new(csi::NodeGetInfoRequest {});
    request.set_timeout(CSI_TIMEOUT);
    let info = NodeClient::new(channel(endpoint))
        .node_get_info(request)
        .await
        .map_err(|s| {
            format!(
                "NodeGetInfo: rpc error: code = {:?} desc = {}",
                s.code(),
                s.message()
            )
        })?
        .into_inner();
    Ok(NodeInfo {
        node_id: info.node_id,
        max_volumes: info.max_volumes_per_node,
        topology: info
            .accessible_topology
            .map(|t| t.segments.into_iter().collect())
            .unwrap_or_default(),
    })
}

/// The Node's annotation and labels after installing (`Some`) or uninstalling
/// (`None`) `driver`: the merge patch to apply, or `None` when nothing changes.
pub fn node_patch(
    node: &Node,
    driver: &str,
    install: Option<&NodeInfo>,
) -> Result<Option<serde_json::Value>, String> {
    let annotations = node.metadata.annotations.clone().unwrap_or_default();
    let mut ids: BTreeMap<String, String> = match annotations.get(NODE_ID_ANNOTATION) {
        None => BTreeMap::new(),
        Some(v) => serde_json::from_str(v).map_err(|e| {
            format!(
                "failed to parse node's {NODE_ID_ANNOTATION:?} annotation value ({v:?}) err={e}"
            )
        })?,
    };
    let before = ids.clone();
    let mut labels = serde_json::Map::new();
    match install {
        Some(info) => {
            ids.insert(driver.to_owned(), info.node_id.clone());
            let existing = node.metadata.labels.clone().unwrap_or_default();
            for (k, v) in &info.topology {
                match existing.get(k) {
                    Some(old) if old != v => {
                        return Err(format!(
                            "detected topology value collision: driver reported {k:?}:{v:?} but existing label is {k:?}:{old:?}"
                        ));
                    }
                    Some(_) => {}
                    None => {
                        labels.insert(k.clone(), serde_json::Value::String(v.clone()));
                    }
                }
            }
        }
        None => {
            ids.remove(driver);
        }
    }
    if ids == before && labels.is_empty() {
        return Ok(None);
    }
    let annotation = if ids.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::Value::String(serde_json::to_string(&ids).map_err(|e| e.to_string())?)
    };
    let mut metadata = serde_json::json!({ "annotations": { NODE_ID_ANNOTATION: annotation } });
    if !labels.is_empty() {
        metadata["labels"] = serde_json::Value::Object(labels);
    }
    Ok(Some(serde_json::json!({ "metadata": metadata })))
}

/// The CSINode's drivers after installing (`Some`) or uninstalling (`None`) `driver`;
/// `None` when nothing changes.
pub fn csinode_drivers(
    drivers: &[CSINodeDriver],
    driver: &str,
    install: Option<&NodeInfo>,
) -> Option<Vec<CSINodeDriver>> {
    let old = drivers.iter().find(|d| d.name == driver);
    let mut out: Vec<CSINodeDriver> = drivers
        .iter()
        .filter(|d| d.name != driver)
        .cloned()
        .collect();
    match install {
        None => {
            old?;
        }
        Some(info) => {
            let mut keys: Vec<String> = info.topology.keys().cloned().collect();
            keys.sort();
            let entry = CSINodeDriver {
                name: driver.to_owned(),
                node_id: info.node_id.clone(),
                topology_keys: Some(keys),
                allocatable: (info.max_volumes > 0).then(|| VolumeNodeResources {
                    count: Some(i32::try_from(info.max_volumes).unwrap_or(i32::MAX)),
                }),
            };
            let same = old.is_some_and(|o| {
                o.node_id == entry.node_id
                    && o.topology_keys.clone().unwrap_or_default()
                        == entry.topology_keys.clone().unwrap_or_default()
                    && o.allocatable.as_ref().and_then(|a| a.count)
                        == entry.allocatable.as_ref().and_then(|a| a.count)
            });
            if same {
                return None;
            }
            out.push(entry);
        }
    }
    Some(out)
}

/// Takes CSI drivers from the plugin watcher.
pub struct CsiRegistration {
    pub drivers: Drivers,
    /// `None` on a standalone node: there are no objects to update.
    pub client: Option<kube::Client>,
    pub node_name: String,
}

/// An empty CSINode for `node`, owned by it.
async fn create_csinode(csinodes: &Api<CSINode>, node: &Node) -> Result<CSINode, String> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let created = CSINode {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name,
                uid: node.metadata.uid.clone().unwrap_or_default(),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: CSINodeSpec {
            drivers: Vec::new(),
        },
    };
    match csinodes.create(&PostParams::default(), &created).await {
        Ok(c) => Ok(c),
        // Made meanwhile (by a driver's registration or the initialization).
        Err(kube::Error::Api(e)) if e.code == 409 => csinodes
            .get(&created.metadata.name.unwrap_or_default())
            .await
            .map_err(|e| format!("error reading CSINode object: {e}")),
        Err(e) => Err(format!("error creating CSINode object: {e}")),
    }
}

/// The kubelet's `initializeCSINode`: once the Node is registered, its CSINode exists
/// (empty until a driver registers), so the cluster sees the node's CSI state even
/// with no driver. Tried every second until done or cancelled.
pub async fn initialize_csinode(
    client: kube::Client,
    node_name: String,
    cancel: tokio_util::sync::CancellationToken,
) {
    let nodes: Api<Node> = Api::all(client.clone());
    let csinodes: Api<CSINode> = Api::all(client);
    let mut last_error = String::new();
    loop {
        let outcome = async {
            let Some(node) = nodes
                .get_opt(&node_name)
                .await
                .map_err(|e| format!("reading Node {node_name}: {e}"))?
            else {
                return Ok(false);
            };
            match csinodes.get_opt(&node_name).await {
                Ok(Some(_)) => Ok(true),
                Ok(None) => create_csinode(&csinodes, &node).await.map(|_| true),
                Err(e) => Err(format!("reading CSINode {node_name}: {e}")),
            }
        }
        .await;
        match outcome {
            Ok(true) => return,
            Ok(false) => {}
            Err(e) if e != last_error => {
                tracing::warn!("initializing the CSINode, will retry: {e}");
                last_error = e;
            }
            Err(_) => {}
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
        }
    }
}

impl CsiRegistration {
    async fn install(&self, driver: &str, info: Option<&NodeInfo>) -> Result<(), String> {
        let Some(client) = &self.client else {
            return Ok(());
        };
        let nodes: Api<Node> = Api::all(client.clone());
        let node = nodes
            .get(&self.node_name)
            .await
            .map_err(|e| format!("reading Node {}: {e}", self.node_name))?;
        if let Some(patch) = node_patch(&node, driver, info)
            .map_err(|e| format!("error updating Node object with CSI driver node info: {e}"))?
        {
            nodes
                .patch(
                    &self.node_name,
                    &PatchParams::default(),
                    &Patch::Merge(patch),
                )
                .await
                .map_err(|e| {
                    format!("error updating Node object with CSI driver node info: {e}")
                })?;
        }
        let csinodes: Api<CSINode> = Api::all(client.clone());
        let existing = match csinodes.get_opt(&self.node_name).await {
            Ok(found) => found,
            Err(e) => {
                return Err(format!(
                    "error updating CSINode object with CSI driver node info: {e}"
                ));
            }
        };
        let mut csinode = match existing {
            Some(c) => c,
            None if info.is_none() => return Ok(()),
            None => create_csinode(&csinodes, &node).await?,
        };
        if let Some(drivers) = csinode_drivers(&csinode.spec.drivers, driver, info) {
            csinode.spec.drivers = drivers;
            csinodes
                .replace(&self.node_name, &PostParams::default(), &csinode)
                .await
                .map_err(|e| {
                    format!("error updating CSINode object with CSI driver node info: {e}")
                })?;
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl crate::pluginwatcher::PluginHandler for CsiRegistration {
    fn validate(&self, name: &str, endpoint: &Path, versions: &[String]) -> Result<(), String> {
        let version = highest_supported(name, versions).map_err(|e| {
            format!(
                "validation failed for CSI Driver {name} at endpoint {}: {e}",
                endpoint.display()
            )
        })?;
        if let Some(existing) = self.drivers.lock().unwrap().get(name)
            && existing.version >= version
        {
            return Err(format!(
                "validation failed for CSI Driver {name} at endpoint {}: another driver with the same name is already registered with a higher supported version: \"{}.{}.{}\"",
                endpoint.display(),
                existing.version.0,
                existing.version.1,
                existing.version.2
            ));
        }
        Ok(())
    }

    async fn register(
        &self,
        name: &str,
        endpoint: &Path,
        versions: &[String],
    ) -> Result<(), String> {
        let version = highest_supported(name, versions)?;
        self.drivers.lock().unwrap().insert(
            name.to_owned(),
            Driver {
                endpoint: endpoint.to_owned(),
                version,
            },
        );
        let outcome = match node_get_info(endpoint).await {
            Ok(info) if info.node_id.is_empty() => {
                Err("error adding CSI driver node info: driverNodeID must not be empty".to_owned())
            }
            Ok(info) => self.install(name, Some(&info)).await.map(|()| info),
            Err(e) => Err(e),
        };
        match outcome {
            Ok(info) => {
                tracing::info!(driver = name, node_id = %info.node_id, max_volumes = info.max_volumes, topology = ?info.topology, "CSI driver registered");
                Ok(())
            }
            Err(e) => {
                self.drivers.lock().unwrap().remove(name);
                if let Err(e) = self.install(name, None).await {
                    tracing::warn!(driver = name, "removing the driver's node info: {e}");
                }
                Err(e)
            }
        }
    }

    fn deregister(&self, name: &str, _endpoint: &Path) {
        self.drivers.lock().unwrap().remove(name);
        let this = CsiRegistration {
            drivers: self.drivers.clone(),
            client: self.client.clone(),
            node_name: self.node_name.clone(),
        };
        let name = name.to_owned();
        tokio::spawn(async move {
            match this.install(&name, None).await {
                Ok(()) => tracing::info!(driver = %name, "CSI driver deregistered"),
                Err(e) => {
                    tracing::warn!(driver = %name, "removing the CSI driver's node info: {e}")
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(id: &str, max: i64, topology: &[(&str, &str)]) -> NodeInfo {
        NodeInfo {
            node_id: id.into(),
            max_volumes: max,
            topology: topology
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn versions_are_taken_as_the_kubelet_takes_them() {
        let v = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            highest_supported("d", &v(&["1.0.0", "v1.2", "2.0.0"])).unwrap(),
            (1, 2, 0)
        );
        assert!(
            highest_supported("d", &v(&["0.3.0"]))
                .unwrap_err()
                .contains("must be v1.x")
        );
        assert!(
            highest_supported("d", &v(&["x"]))
                .unwrap_err()
                .contains("could not find")
        );
        assert!(
            highest_supported("d", &v(&[]))
                .unwrap_err()
                .contains("empty list")
        );
    }

    #[test]
    fn the_node_gets_the_id_annotation_and_topology_labels() {
        let mut node = Node::default();
        let patch = node_patch(&node, "b.csi", Some(&info("n1", 0, &[("zone", "a")])))
            .unwrap()
            .unwrap();
        assert_eq!(
            patch["metadata"]["annotations"][NODE_ID_ANNOTATION],
            r#"{"b.csi":"n1"}"#
        );
        assert_eq!(patch["metadata"]["labels"]["zone"], "a");
        // A second driver joins the map, keys sorted.
        node.metadata.annotations = Some(
            [(
                NODE_ID_ANNOTATION.to_string(),
                r#"{"b.csi":"n1"}"#.to_string(),
            )]
            .into(),
        );
        node.metadata.labels = Some([("zone".to_string(), "a".to_string())].into());
        let patch = node_patch(&node, "a.csi", Some(&info("n2", 0, &[("zone", "a")])))
            .unwrap()
            .unwrap();
        assert_eq!(
            patch["metadata"]["annotations"][NODE_ID_ANNOTATION],
            r#"{"a.csi":"n2","b.csi":"n1"}"#
        );
        assert!(patch["metadata"].get("labels").is_none());
        // Nothing changes: no patch.
        assert_eq!(
            node_patch(&node, "b.csi", Some(&info("n1", 0, &[("zone", "a")]))).unwrap(),
            None
        );
        // A collision is refused.
        let err = node_patch(&node, "c.csi", Some(&info("n3", 0, &[("zone", "b")]))).unwrap_err();
        assert_eq!(
            err,
            r#"detected topology value collision: driver reported "zone":"b" but existing label is "zone":"a""#
        );
        // The last driver gone: the annotation goes.
        let patch = node_patch(&node, "b.csi", None).unwrap().unwrap();
        assert!(patch["metadata"]["annotations"][NODE_ID_ANNOTATION].is_null());
    }

    #[test]
    fn the_csinode_has_one_entry_per_driver() {
        let drivers = csinode_drivers(
            &[],
            "a.csi",
            Some(&info("n1", 16, &[("z", "1"), ("r", "2")])),
        )
        .unwrap();
        assert_eq!(drivers.len(), 1);
        assert_eq!(
            drivers[0].topology_keys.as_deref(),
            Some(&["r".to_string(), "z".to_string()][..])
        );
        assert_eq!(
            drivers[0].allocatable.as_ref().and_then(|a| a.count),
            Some(16)
        );
        assert_eq!(
            csinode_drivers(
                &drivers,
                "a.csi",
                Some(&info("n1", 16, &[("z", "1"), ("r", "2")]))
            ),
            None
        );
        let unlimited = csinode_drivers(&drivers, "a.csi", Some(&info("n1", 0, &[]))).unwrap();
        assert!(unlimited[0].allocatable.is_none());
        assert_eq!(csinode_drivers(&drivers, "a.csi", None), Some(vec![]));
        assert_eq!(csinode_drivers(&drivers, "b.csi", None), None);
    }
}
