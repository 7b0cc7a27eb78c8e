//! `NodeExpandVolume`: a claim whose PersistentVolume grew is expanded on the node.

use super::*;

impl CsiVolumes {
    /// Expands the filesystem of each claimed volume of `pod` whose PersistentVolume
    /// grew past the claim's capacity (the external resizer's `ControllerExpandVolume`
    /// done), with `NodeExpandVolume`, then records the new size in the claim's
    /// status. Each outcome is `Ok(message)` for a `FileSystemResizeSuccessful` event
    /// or `Err(message)` for a `VolumeResizeFailed` one; nothing to do is nothing.
    pub async fn expand(
        &self,
        pod: &Pod,
        objects: &dyn ObjectSource,
    ) -> Vec<Result<String, String>> {
        let mut out = Vec::new();
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            if v.persistent_volume_claim.is_none() && v.ephemeral.is_none() {
                continue;
            }
            let published = self
                .published
                .lock()
                .unwrap()
                .iter()
                .find(|(_, p)| p.pod_uid == uid && p.volume == v.name)
                .map(|(t, _)| t.clone());
            let Some(target) = published else { continue };
            match self.expand_one(pod, v, &target, objects).await {
                Ok(None) => {}
                Ok(Some(done)) => out.push(Ok(done)),
                Err(e) => out.push(Err(e)),
            }
        }
        out
    }

    async fn expand_one(
        &self,
        pod: &Pod,
        v: &Volume,
        target: &Path,
        objects: &dyn ObjectSource,
    ) -> Result<Option<String>, String> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let claim = match &v.persistent_volume_claim {
            Some(c) => c.claim_name.clone(),
            None => format!(
                "{}-{}",
                pod.metadata.name.as_deref().unwrap_or_default(),
                v.name
            ),
        };
        let (Ok(Some(pvc)), src) = (
            objects.persistent_volume_claim(namespace, &claim).await,
            resolve(pod, v, objects).await,
        ) else {
            return Ok(None);
        };
        let src = src?;
        if src.read_only {
            return Ok(None);
        }
        let Ok(Some(pv)) = objects.persistent_volume(&src.spec_name).await else {
            return Ok(None);
        };
        let storage = |m: Option<
            &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
        >| {
            m.and_then(|m| m.get("storage"))
                .and_then(|q| crate::quantity::bytes(q).ok())
        };
        let status = pvc.status.clone().unwrap_or_default();
        let (Some(wanted), Some(have)) = (
            storage(pv.spec.as_ref().and_then(|s| s.capacity.as_ref())),
            storage(status.capacity.as_ref()),
        ) else {
            return Ok(None);
        };
        let resize_status = status
            .allocated_resource_statuses
            .as_ref()
            .and_then(|s| s.get("storage"))
            .map(String::as_str)
            .unwrap_or_default();
        if wanted <= have
            || !matches!(
                resize_status,
                "" | "NodeResizePending" | "NodeResizeInProgress"
            )
        {
            return Ok(None);
        }
        let name = &src.spec_name;
        let caps = self.capabilities(&src.driver).await.map_err(|e| {
            format!("MountVolume.NodeExpandVolume failed for volume {name:?} : {e}")
        })?;
        use csi::node_service_capability::rpc::Type as Cap;
        if caps.contains(&(Cap::ExpandVolume as i32)) {
            let staged = caps.contains(&(Cap::StageUnstageVolume as i32));
            let mut client = self.client(&src.driver).map_err(|e| {
                format!("MountVolume.NodeExpandVolume failed for volume {name:?} : {e}")
            })?;
            let request = csi::NodeExpandVolumeRequest {
                volume_id: src.handle.clone(),
                volume_path: target.display().to_string(),
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: i64::try_from(wanted).unwrap_or(i64::MAX),
                    limit_bytes: 0,
                }),
                staging_target_path: if staged {
                    self.global_path(&src.driver, &src.handle)
                        .display()
                        .to_string()
                } else {
                    String::new()
                },
                volume_capability: Some(csi::VolumeCapability {
                    access_type: Some(csi::volume_capability::AccessType::Mount(
                        csi::volume_capability::MountVolume {
                            fs_type: src.fs_type.clone(),
                            mount_flags: src.mount_flags.clone(),
                            volume_mount_group: String::new(),
                        },
                    )),
                    access_mode: Some(csi::volume_capability::AccessMode {
                        mode: access_mode(
                            &src.access_mode,
                            caps.contains(&(Cap::SingleNodeMultiWriter as i32)),
                        ) as i32,
                    }),
                }),
                secrets: Default::default(),
            };
            self.call(client.node_expand_volume(self.request(request)))
                .await
                .map_err(|e| {
                    format!(
                        "MountVolume.NodeExpandVolume failed for volume {name:?} : {}",
                        e.message
                    )
                })?;
        } else {
            // Nothing for the node to do: the controller's expansion is all there is.
            tracing::info!(volume = %name, driver = %src.driver, "NodeExpand is not supported by the CSI driver; the claim takes the volume's size");
        }
        let conditions: Vec<_> = status
            .conditions
            .iter()
            .flatten()
            .filter(|c| c.type_ != "FileSystemResizePending" && c.type_ != "Resizing")
            .collect();
        let patch = serde_json::json!({"status": {
            "capacity": {"storage": pv.spec.as_ref().and_then(|s| s.capacity.as_ref()).and_then(|c| c.get("storage"))},
            "conditions": conditions,
            "allocatedResourceStatuses": {"storage": null},
        }});
        objects
            .patch_claim_status(namespace, &claim, patch)
            .await
            .map_err(|e| {
                format!("MountVolume.NodeExpandVolume failed for volume {name:?} : {e}")
            })?;
        Ok(Some(format!(
            "MountVolume.NodeExpandVolume succeeded for volume {name:?} {}",
            self.node_name
        )))
    }
}
