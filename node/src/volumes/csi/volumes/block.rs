//! Raw block volumes (`volumeMode: Block`) in the kubelet's `volumeDevices` layout.

use super::*;

/// `pods/<uid>/volumeDevices/kubernetes.io~csi/<pv>`: the pod's link to its device.
fn block_link(root: &Path, uid: &str, spec: &str) -> PathBuf {
    root.join("pods")
        .join(uid)
        .join("volumeDevices")
        .join(PLUGIN_DIR)
        .join(escape(spec))
}

impl CsiVolumes {
    /// The kubelet's block layout of the volume `spec` under
    /// `plugins/kubernetes.io/csi/volumeDevices`: (staging path, publish directory,
    /// data directory).
    fn block_paths(&self, spec: &str) -> (PathBuf, PathBuf, PathBuf) {
        let base = self.root.join("plugins/kubernetes.io/csi/volumeDevices");
        let spec = escape(spec);
        (
            base.join("staging").join(&spec),
            base.join("publish").join(&spec),
            base.join(&spec).join("data"),
        )
    }

    /// A raw block volume: staged once at the kubelet's block staging path, published
    /// per pod as the device file `publish/<pv>/<pod uid>` (the driver makes it), and
    /// linked from `pods/<uid>/volumeDevices/kubernetes.io~csi/<pv>`.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn map_block(
        &self,
        pod: &Pod,
        v: &Volume,
        src: &Source,
        stages: bool,
        multi_writer: bool,
        publish_context: &BTreeMap<String, String>,
        driver_object: Option<&CSIDriver>,
        objects: &dyn ObjectSource,
    ) -> Result<HostVolume, String> {
        let name = &src.spec_name;
        let fail = |prefix: &str, e: String| format!("{prefix} failed for volume {name:?} : {e}");
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let (staging, publish_dir, data_dir) = self.block_paths(name);
        let target = publish_dir.join(uid);
        let capability = csi::VolumeCapability {
            access_type: Some(csi::volume_capability::AccessType::Block(
                csi::volume_capability::BlockVolume {},
            )),
            access_mode: Some(csi::volume_capability::AccessMode {
                mode: access_mode(&src.access_mode, multi_writer) as i32,
            }),
        };
        // Staged once per node: the data file is written once staging succeeded.
        if !data_dir.join("vol_data.json").exists() {
            create_dir(&staging, 0o750).map_err(|e| fail("MapVolume.SetUpDevice", e))?;
            if stages {
                let secrets = read_secret(objects, src.stage_secret.as_ref())
                    .await
                    .map_err(|e| {
                        fail(
                            "MapVolume.SetUpDevice",
                            format!("fetching NodeStageSecretRef {e}"),
                        )
                    })?;
                let mut client = self
                    .client(&src.driver)
                    .map_err(|e| fail("MapVolume.SetUpDevice", e))?;
                let request = csi::NodeStageVolumeRequest {
                    volume_id: src.handle.clone(),
                    publish_context: publish_context.clone().into_iter().collect(),
                    staging_target_path: staging.display().to_string(),
                    volume_capability: Some(capability.clone()),
                    secrets: secrets.into_iter().collect(),
                    volume_context: src.attributes.clone().into_iter().collect(),
                };
                self.call(client.node_stage_volume(self.request(request)))
                    .await
                    .map_err(|e| fail("MapVolume.SetUpDevice", e.message))?;
            }
            create_dir(&data_dir, 0o750).map_err(|e| fail("MapVolume.SetUpDevice", e))?;
            write_vol_data(
                &data_dir.join("vol_data.json"),
                &[
                    ("specVolID", name.as_str()),
                    ("volumeHandle", &src.handle),
                    ("driverName", &src.driver),
                    ("nodeName", &self.node_name),
                    (
                        "attachmentID",
                        &attachment_name(&src.handle, &src.driver, &self.node_name),
                    ),
                ],
            )
            .map_err(|e| fail("MapVolume.SetUpDevice", e))?;
        }
        if !is_mounted(&target) {
            create_dir(&publish_dir, 0o750).map_err(|e| fail("MapVolume.MapPodDevice", e))?;
            let mut context = src.attributes.clone();
            if driver_object.and_then(|d| d.spec.pod_info_on_mount) == Some(true) {
                context.extend(pod_info(pod, src.lifecycle));
            }
            let secrets = read_secret(objects, src.publish_secret.as_ref())
                .await
                .map_err(|e| {
                    fail(
                        "MapVolume.MapPodDevice",
                        format!("fetching NodePublishSecretRef {e}"),
                    )
                })?;
            let mut client = self
                .client(&src.driver)
                .map_err(|e| fail("MapVolume.MapPodDevice", e))?;
            let request = csi::NodePublishVolumeRequest {
                volume_id: src.handle.clone(),
                publish_context: publish_context.clone().into_iter().collect(),
                staging_target_path: if stages {
                    staging.display().to_string()
                } else {
                    String::new()
                },
                target_path: target.display().to_string(),
                volume_capability: Some(capability),
                readonly: src.read_only,
                secrets: secrets.into_iter().collect(),
                volume_context: context.into_iter().collect(),
            };
            self.call(client.node_publish_volume(self.request(request)))
                .await
                .map_err(|e| fail("MapVolume.MapPodDevice", e.message))?;
        }
        let link = block_link(&self.root, uid, name);
        if std::fs::symlink_metadata(&link).is_err() {
            create_dir(link.parent().expect("a parent"), 0o750)
                .map_err(|e| fail("MapVolume.MapPodDevice", e))?;
            std::os::unix::fs::symlink(&target, &link).map_err(|e| {
                fail(
                    "MapVolume.MapPodDevice",
                    format!("linking {}: {e}", link.display()),
                )
            })?;
        }
        self.remember(pod, v, src, &target);
        Ok(HostVolume {
            path: target,
            is_dir: false,
            content: false,
            renew_token_at: None,
            read_only: src.read_only,
            block: true,
        })
    }

    /// Unmaps the block volume linked at `link` for its pod (`NodeUnpublishVolume` of
    /// the device file), then unstages it once no pod has it published.
    pub(super) async fn unmap_block(&self, link: &Path) -> Result<(), String> {
        let spec = link
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .replace('~', "/");
        let (staging, publish_dir, data_dir) = self.block_paths(&spec);
        let target = std::fs::read_link(link).unwrap_or_default();
        let data = read_vol_data(&data_dir.join("vol_data.json"));
        let (Some(driver), Some(handle)) = (
            data.get("driverName").cloned(),
            data.get("volumeHandle").cloned(),
        ) else {
            let _ = std::fs::remove_file(link);
            return Ok(());
        };
        let lock = self.lock(&format!("kubernetes.io/csi/{driver}^{handle}"));
        let _held = lock.lock().await;
        let fail = |prefix: &str, e: String| format!("{prefix} failed for volume {spec:?} : {e}");
        let mut client = self
            .client(&driver)
            .map_err(|e| fail("UnmapVolume.UnmapPodDevice", e))?;
        self.call(
            client.node_unpublish_volume(self.request(csi::NodeUnpublishVolumeRequest {
                volume_id: handle.clone(),
                target_path: target.display().to_string(),
            })),
        )
        .await
        .map_err(|e| fail("UnmapVolume.UnmapPodDevice", e.message))?;
        if is_mounted(&target) {
            return Err(fail(
                "UnmapVolume.UnmapPodDevice",
                format!(
                    "{} is still mounted after NodeUnpublishVolume",
                    target.display()
                ),
            ));
        }
        let _ = std::fs::remove_file(&target);
        let _ = std::fs::remove_file(link);
        self.published.lock().unwrap().remove(&target);
        self.stats.lock().unwrap().remove(&target);
        let others = std::fs::read_dir(&publish_dir)
            .map(|mut d| d.next().is_some())
            .unwrap_or(false);
        if others {
            return Ok(());
        }
        let caps = self
            .capabilities(&driver)
            .await
            .map_err(|e| fail("UnmapVolume.UnmapDevice", e))?;
        if caps.contains(&(csi::node_service_capability::rpc::Type::StageUnstageVolume as i32)) {
            self.call(
                client.node_unstage_volume(self.request(csi::NodeUnstageVolumeRequest {
                    volume_id: handle.clone(),
                    staging_target_path: staging.display().to_string(),
                })),
            )
            .await
            .map_err(|e| fail("UnmapVolume.UnmapDevice", e.message))?;
        }
        let _ = std::fs::remove_dir(&staging);
        let _ = std::fs::remove_dir(&publish_dir);
        let _ = std::fs::remove_file(data_dir.join("vol_data.json"));
        let _ = std::fs::remove_dir(&data_dir);
        if let Some(parent) = data_dir.parent() {
            let _ = std::fs::remove_dir(parent);
        }
        Ok(())
    }
}
