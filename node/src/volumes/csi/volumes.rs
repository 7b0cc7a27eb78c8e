//! CSI volumes of pods, as the kubelet's `kubernetes.io/csi` plugin sets them up
//! (facts and sources: `docs/research/csi.md`):
//!
//! - a `persistentVolumeClaim` (or the claim a generic `ephemeral` volume owns) is
//!   followed to its bound PersistentVolume; a driver that attaches waits for its
//!   `VolumeAttachment`; the volume is staged once per node at
//!   `plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/globalmount` and published
//!   per pod at `pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount`;
//! - an inline `csi` volume is published only (lifecycle `Ephemeral`);
//! - `vol_data.json` next to each path says what is there, so a restarted node finds
//!   what is mounted (a mounted path is not staged or published again) and tears down
//!   what no pod uses any more: Unpublish per pod, then Unstage once no pod on the
//!   node has the volume.
//!
//! Every call has the kubelet's `csiTimeout` (2 m, `wasmlet.csiTimeout`), and a failed
//! operation is retried with the kubelet's back-off (500 ms doubling to 2 m 2 s).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, Pod, Volume};
use k8s_openapi::api::storage::v1::CSIDriver;
use sha2::{Digest as _, Sha256};
use tokio::time::Instant;
use tonic::transport::Channel;
use wasmlet_proto::csi::v1 as csi;
use wasmlet_proto::csi::v1::node_client::NodeClient;

use super::{Drivers, channel};

mod block;
mod expand;
mod stats;

use crate::env::ObjectSource;
use crate::volumes::HostVolume;
pub use stats::VolumeUsage;

/// The CSI plugin's directory name under a pod's `volumes/`.
pub const PLUGIN_DIR: &str = "kubernetes.io~csi";
/// The first retry of a failed volume operation, doubled up to [`BACKOFF_MAX`].
const BACKOFF_INITIAL: Duration = Duration::from_millis(500);
/// The kubelet's `maxDurationBeforeRetry`.
const BACKOFF_MAX: Duration = Duration::from_secs(122);

/// Whether `v` is a volume this module sets up.
pub fn is_csi(v: &Volume) -> bool {
    v.csi.is_some() || v.persistent_volume_claim.is_some() || v.ephemeral.is_some()
}

/// `Persistent` (a PersistentVolume) or `Ephemeral` (an inline `csi` volume).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lifecycle {
    Persistent,
    Ephemeral,
}

impl Lifecycle {
    fn as_str(self) -> &'static str {
        match self {
            Lifecycle::Persistent => "Persistent",
            Lifecycle::Ephemeral => "Ephemeral",
        }
    }
}

/// A secret's place: `(namespace, name)`.
type SecretRef = (String, String);

/// What a pod volume resolves to.
#[derive(Clone, Debug)]
struct Source {
    /// The PV's name, or the pod volume's name for an inline volume: names the
    /// volume's directories and its events.
    spec_name: String,
    driver: String,
    handle: String,
    lifecycle: Lifecycle,
    fs_type: String,
    mount_flags: Vec<String>,
    /// The first of the PV's access modes (`ReadWriteOnce` when none).
    access_mode: String,
    /// Whether the PV lists ReadWriteOnce or ReadWriteOncePod (fsGroup).
    single_node: bool,
    attributes: BTreeMap<String, String>,
    read_only: bool,
    stage_secret: Option<SecretRef>,
    publish_secret: Option<SecretRef>,
    /// The claim's name (a PVC or a generic ephemeral volume's).
    claim: Option<String>,
    /// `volumeMode: Block`: mapped as a device file, not mounted.
    block: bool,
}

/// A volume published for a pod: what its stats are asked with.
#[derive(Clone, Debug)]
struct Published {
    pod_uid: String,
    /// The pod's name for the volume.
    volume: String,
    driver: String,
    handle: String,
    /// `(namespace, claim)` of a claimed volume.
    claim: Option<(String, String)>,
}

/// Stages, publishes and tears down the CSI volumes of this node's pods.
pub struct CsiVolumes {
    drivers: Drivers,
    /// The node's `--root-dir`.
    root: PathBuf,
    node_name: String,
    timeout: Duration,
    /// One lock per volume: staging, publishing and the decision to unstage do not
    /// interleave for one volume.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The back-off of failed operations, per (volume, pod).
    retries: Mutex<HashMap<String, Retry>>,
    /// Pods whose volumes are being torn down in the background.
    tearing_down: Mutex<HashSet<String>>,
    /// What is published where (target path), for stats.
    published: Mutex<HashMap<PathBuf, Published>>,
    /// The last stats of each target and when they were read.
    stats: Mutex<HashMap<PathBuf, (Instant, VolumeUsage)>>,
    /// How long read stats are reused (`volumeStatsAggPeriod`); zero reads none.
    stats_period: Duration,
}

#[derive(Clone, Debug)]
struct Retry {
    not_before: Instant,
    delay: Duration,
    error: String,
}

impl CsiVolumes {
    pub fn new(drivers: Drivers, root: PathBuf, node_name: String, timeout: Duration) -> Self {
        CsiVolumes {
            drivers,
            root,
            node_name,
            timeout,
            locks: Mutex::default(),
            retries: Mutex::default(),
            tearing_down: Mutex::default(),
            published: Mutex::default(),
            stats: Mutex::default(),
            stats_period: Duration::from_secs(60),
        }
    }

    /// Reuses volume stats for `period` (`volumeStatsAggPeriod`); zero reads none.
    pub fn with_stats_period(mut self, period: Duration) -> Self {
        self.stats_period = period;
        self
    }

    fn remember(&self, pod: &Pod, v: &Volume, src: &Source, target: &Path) {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        self.published.lock().unwrap().insert(
            target.to_owned(),
            Published {
                pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
                volume: v.name.clone(),
                driver: src.driver.clone(),
                handle: src.handle.clone(),
                claim: src.claim.clone().map(|c| (namespace, c)),
            },
        );
    }

    /// `plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/globalmount`.
    fn global_path(&self, driver: &str, handle: &str) -> PathBuf {
        self.root
            .join("plugins/kubernetes.io/csi")
            .join(driver)
            .join(hex::encode(Sha256::digest(handle.as_bytes())))
            .join("globalmount")
    }

    /// The volume's lock. The map keeps only locks someone holds or waits for: one
    /// only the map refers to is dropped here (a volume's next lock is a new one,
    /// which is the same thing), so volumes that came and went leave no entry.
    fn lock(&self, unique: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap();
        locks.retain(|_, l| Arc::strong_count(l) > 1);
        locks.entry(unique.to_owned()).or_default().clone()
    }

    /// A new client of `driver`, or the kubelet's error for a driver that did not
    /// register.
    fn client(&self, driver: &str) -> Result<NodeClient<Channel>, String> {
        let endpoint = self
            .drivers
            .lock()
            .unwrap()
            .get(driver)
            .map(|d| d.endpoint.clone())
            .ok_or_else(|| {
                format!(
                    "kubernetes.io/csi: driver name {driver} not found in the list of registered CSI drivers"
                )
            })?;
        Ok(NodeClient::new(channel(&endpoint)))
    }

    /// One CSI call with the timeout; the error in gRPC's words.
    async fn call<T, F>(&self, rpc: F) -> Result<T, CallError>
    where
        F: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        match tokio::time::timeout(self.timeout, rpc).await {
            Ok(Ok(r)) => Ok(r.into_inner()),
            // The request's own deadline, as tonic reports it.
            Ok(Err(s))
                if s.code() == tonic::Code::Cancelled && s.message() == "Timeout expired" =>
            {
                Err(CallError {
                    message: "rpc error: code = DeadlineExceeded desc = context deadline exceeded"
                        .into(),
                    final_: false,
                })
            }
            Ok(Err(s)) => Err(CallError::from_status(&s)),
            Err(_) => Err(CallError {
                message: "rpc error: code = DeadlineExceeded desc = context deadline exceeded"
                    .into(),
                final_: false,
            }),
        }
    }

    async fn capabilities(&self, driver: &str) -> Result<HashSet<i32>, String> {
        let mut client = self.client(driver)?;
        let caps = self
            .call(client.node_get_capabilities(self.request(csi::NodeGetCapabilitiesRequest {})))
            .await
            .map_err(|e| e.message)?;
        Ok(caps
            .capabilities
            .iter()
            .filter_map(|c| {
                let csi::node_service_capability::Type::Rpc(r) = c.r#type.as_ref()?;
                Some(r.r#type)
            })
            .collect())
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(message);
        r.set_timeout(self.timeout);
        r
    }

    /// Sets up the CSI volume `v` of `pod`: the volume's published path for the
    /// containers. An error is the kubelet's event text (`MountVolume.SetUp failed
    /// for volume "<pv>" : …`); a failed volume is not tried again before its back-off
    /// has passed.
    pub async fn set_up(
        &self,
        pod: &Pod,
        v: &Volume,
        pod_dir: &Path,
        objects: &dyn ObjectSource,
    ) -> Result<HostVolume, String> {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let key = format!("{}/{uid}", v.name);
        if let Some(r) = self.retries.lock().unwrap().get(&key)
            && Instant::now() < r.not_before
        {
            return Err(format!(
                "{} (no retries permitted for {} ms, durationBeforeRetry {} ms)",
                r.error,
                r.not_before
                    .saturating_duration_since(Instant::now())
                    .as_millis(),
                r.delay.as_millis()
            ));
        }
        match self.set_up_now(pod, v, pod_dir, objects).await {
            Ok(host) => {
                self.retries.lock().unwrap().remove(&key);
                Ok(host)
            }
            Err(error) => {
                let mut retries = self.retries.lock().unwrap();
                let delay = retries
                    .get(&key)
                    .map_or(BACKOFF_INITIAL, |r| (r.delay * 2).min(BACKOFF_MAX));
                tracing::warn!(pod = %crate::pod::full_name(pod), volume = %v.name, retry_in_ms = delay.as_millis() as u64, "{error}");
                retries.insert(
                    key,
                    Retry {
                        not_before: Instant::now() + delay,
                        delay,
                        error: error.clone(),
                    },
                );
                Err(error)
            }
        }
    }

    async fn set_up_now(
        &self,
        pod: &Pod,
        v: &Volume,
        pod_dir: &Path,
        objects: &dyn ObjectSource,
    ) -> Result<HostVolume, String> {
        let src = resolve(pod, v, objects).await?;
        let name = &src.spec_name;
        let fail = |prefix: &str, e: String| format!("{prefix} failed for volume {name:?} : {e}");
        let dir = pod_dir.join("volumes").join(PLUGIN_DIR).join(escape(name));
        let target = dir.join("mount");
        let host = HostVolume {
            path: target.clone(),
            is_dir: true,
            content: false,
            renew_token_at: None,
            read_only: src.read_only,
            block: false,
        };
        // Published before (by this node before a restart): reconstructed from the
        // disk layout, with no call to a driver that may not have registered again yet.
        if is_mounted(&target)
            && read_vol_data(&dir.join("vol_data.json")).get("volumeHandle") == Some(&src.handle)
        {
            self.remember(pod, v, &src, &target);
            tracing::info!(pod = %crate::pod::full_name(pod), volume = %v.name, "CSI volume found published; not published again");
            return Ok(host);
        }
        let driver_object = objects
            .csi_driver(&src.driver)
            .await
            .map_err(|e| fail("MountVolume.NewMounter initialization", e))?;
        check_lifecycle(&src, driver_object.as_ref())
            .map_err(|e| fail("MountVolume.NewMounter initialization", e))?;
        let caps = self
            .capabilities(&src.driver)
            .await
            .map_err(|e| fail("MountVolume.SetUp", e))?;
        let has = |t: csi::node_service_capability::rpc::Type| caps.contains(&(t as i32));
        use csi::node_service_capability::rpc::Type as Cap;
        let fs_group = pod
            .spec
            .as_ref()
            .and_then(|s| s.security_context.as_ref())
            .and_then(|s| s.fs_group);
        let mount_group = fs_group
            .filter(|_| has(Cap::VolumeMountGroup))
            .map(|g| g.to_string())
            .unwrap_or_default();
        let capability = csi::VolumeCapability {
            access_type: Some(csi::volume_capability::AccessType::Mount(
                csi::volume_capability::MountVolume {
                    fs_type: src.fs_type.clone(),
                    mount_flags: src.mount_flags.clone(),
                    volume_mount_group: mount_group.clone(),
                },
            )),
            access_mode: Some(csi::volume_capability::AccessMode {
                mode: access_mode(&src.access_mode, has(Cap::SingleNodeMultiWriter)) as i32,
            }),
        };
        let unique = unique_name(&src, pod);
        let lock = self.lock(&unique);
        let _held = lock.lock().await;

        let mut publish_context = BTreeMap::new();
        let mut staging_path = None;
        if src.lifecycle == Lifecycle::Persistent {
            let attach = driver_object
                .as_ref()
                .is_none_or(|d| d.spec.attach_required != Some(false));
            if attach {
                publish_context = self
                    .wait_for_attach(&src, objects)
                    .await
                    .map_err(|e| fail("MountVolume.WaitForAttach", e))?;
            }
            if src.block {
                return self
                    .map_block(
                        pod,
                        v,
                        &src,
                        has(Cap::StageUnstageVolume),
                        has(Cap::SingleNodeMultiWriter),
                        &publish_context,
                        driver_object.as_ref(),
                        objects,
                    )
                    .await;
            }
            let global = self.global_path(&src.driver, &src.handle);
            self.stage(
                &src,
                &global,
                has(Cap::StageUnstageVolume),
                &publish_context,
                &capability,
                objects,
            )
            .await
            .map_err(|e| fail("MountVolume.MountDevice", e))?;
            staging_path = has(Cap::StageUnstageVolume).then_some(global);
        }

        if !is_mounted(&target) {
            // 0755 where the kubelet makes 0750: a Wasm pod's sandbox that runs as
            // the pod's user opens the volume by this path (a container is handed a
            // bind mount), and nothing here is secret (`vol_data.json` names the
            // volume and its driver).
            create_dir(&dir, 0o755).map_err(|e| fail("MountVolume.SetUp", e))?;
            write_vol_data(
                &dir.join("vol_data.json"),
                &[
                    ("specVolID", name.as_str()),
                    ("volumeHandle", &src.handle),
                    ("driverName", &src.driver),
                    ("nodeName", &self.node_name),
                    ("volumeLifecycleMode", src.lifecycle.as_str()),
                    (
                        "attachmentID",
                        &attachment_name(&src.handle, &src.driver, &self.node_name),
                    ),
                ],
            )
            .map_err(|e| fail("MountVolume.SetUp", e))?;
            let mut context = src.attributes.clone();
            if driver_object
                .as_ref()
                .and_then(|d| d.spec.pod_info_on_mount)
                == Some(true)
            {
                context.extend(pod_info(pod, src.lifecycle));
            }
            let secrets = read_secret(objects, src.publish_secret.as_ref())
                .await
                .map_err(|e| {
                    fail(
                        "MountVolume.SetUp",
                        format!("fetching NodePublishSecretRef {e}"),
                    )
                })?;
            let request = csi::NodePublishVolumeRequest {
                volume_id: src.handle.clone(),
                publish_context: publish_context.into_iter().collect(),
                staging_target_path: staging_path
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                target_path: target.display().to_string(),
                volume_capability: Some(capability),
                readonly: src.read_only,
                secrets: secrets.into_iter().collect(),
                volume_context: context.into_iter().collect(),
            };
            let mut client = self
                .client(&src.driver)
                .map_err(|e| fail("MountVolume.SetUp", e))?;
            if let Err(e) = self
                .call(client.node_publish_volume(self.request(request)))
                .await
            {
                // A final error leaves nothing mounted: the directory goes. Otherwise
                // the outcome is uncertain and the volume is unpublished at teardown.
                if e.final_ && !is_mounted(&target) {
                    let _ = std::fs::remove_dir(&target);
                    let _ = std::fs::remove_file(dir.join("vol_data.json"));
                    let _ = std::fs::remove_dir(&dir);
                }
                return Err(fail("MountVolume.SetUp", e.message));
            }
        }
        if let Some(gid) = fs_group
            && mount_group.is_empty()
            && changes_ownership(&src, driver_object.as_ref())
                .map_err(|e| fail("MountVolume.SetUp", e))?
        {
            let on_root_mismatch = pod
                .spec
                .as_ref()
                .and_then(|s| s.security_context.as_ref())
                .and_then(|s| s.fs_group_change_policy.as_deref())
                == Some("OnRootMismatch");
            apply_fs_group(&target, gid as u32, src.read_only, on_root_mismatch).map_err(|e| {
                fail(
                    "MountVolume.SetUp",
                    format!("applyFSGroup failed for vol {}: {e}", src.handle),
                )
            })?;
        }
        self.remember(pod, v, &src, &target);
        Ok(host)
    }

    /// `WaitForAttach`: one read of the volume's `VolumeAttachment`; its
    /// `attachmentMetadata` is the publish context.
    async fn wait_for_attach(
        &self,
        src: &Source,
        objects: &dyn ObjectSource,
    ) -> Result<BTreeMap<String, String>, String> {
        let id = attachment_name(&src.handle, &src.driver, &self.node_name);
        let va = objects
            .volume_attachment(&id)
            .await
            .map_err(|e| {
                format!(
                    "volume {} has GET error for volume attachment {id}: {e}",
                    src.handle
                )
            })?
            .ok_or_else(|| {
                format!(
                    "volume {} has GET error for volume attachment {id}: volumeattachments.storage.k8s.io {id:?} not found",
                    src.handle
                )
            })?;
        if va.metadata.deletion_timestamp.is_some() {
            return Err("volume attachment is being deleted".into());
        }
        let status = va.status.unwrap_or_default();
        if let Some(message) = status.attach_error.and_then(|e| e.message) {
            return Err(message);
        }
        if !status.attached {
            return Err(format!(
                "volume {} is not attached for volume attachment {id}",
                src.handle
            ));
        }
        Ok(status.attachment_metadata.unwrap_or_default())
    }

    /// `MountDevice`: the global directory and its `vol_data.json`, then
    /// `NodeStageVolume` when the driver stages and the path is not staged already.
    async fn stage(
        &self,
        src: &Source,
        global: &Path,
        stages: bool,
        publish_context: &BTreeMap<String, String>,
        capability: &csi::VolumeCapability,
        objects: &dyn ObjectSource,
    ) -> Result<(), String> {
        if is_mounted(global) {
            return Ok(());
        }
        create_dir(global, 0o750)?;
        let parent = global.parent().expect("globalmount has a parent");
        write_vol_data(
            &parent.join("vol_data.json"),
            &[("volumeHandle", &src.handle), ("driverName", &src.driver)],
        )?;
        if !stages {
            return Ok(());
        }
        let secrets = read_secret(objects, src.stage_secret.as_ref())
            .await
            .map_err(|e| format!("fetching NodeStageSecretRef {e}"))?;
        let mut client = self.client(&src.driver)?;
        let request = csi::NodeStageVolumeRequest {
            volume_id: src.handle.clone(),
            publish_context: publish_context.clone().into_iter().collect(),
            staging_target_path: global.display().to_string(),
            volume_capability: Some(capability.clone()),
            secrets: secrets.into_iter().collect(),
            volume_context: src.attributes.clone().into_iter().collect(),
        };
        self.call(client.node_stage_volume(self.request(request)))
            .await
            .map_err(|e| e.message)?;
        Ok(())
    }

    /// Tears down the CSI volumes of the pod whose directory is `pod_dir`:
    /// `NodeUnpublishVolume` for each, then `NodeUnstageVolume` for each persistent
    /// volume no other pod on the node has. What failed stays on disk (and is named in
    /// the error) to be tried again.
    pub async fn tear_down(&self, pod_dir: &Path) -> Result<(), String> {
        // The pod's set-up back-offs (`<volume>/<uid>`) go with it.
        if let Some(uid) = pod_dir.file_name().and_then(|n| n.to_str()) {
            let suffix = format!("/{uid}");
            self.retries
                .lock()
                .unwrap()
                .retain(|key, _| !key.ends_with(&suffix));
        }
        let mut errors = Vec::new();
        let devices_dir = pod_dir.join("volumeDevices").join(PLUGIN_DIR);
        for entry in std::fs::read_dir(&devices_dir)
            .into_iter()
            .flatten()
            .flatten()
        {
            if let Err(e) = self.unmap_block(&entry.path()).await {
                errors.push(e);
            }
        }
        let _ = std::fs::remove_dir(&devices_dir);
        let plugin_dir = pod_dir.join("volumes").join(PLUGIN_DIR);
        let Ok(entries) = std::fs::read_dir(&plugin_dir) else {
            return if errors.is_empty() {
                Ok(())
            } else {
                Err(errors.join("; "))
            };
        };
        for entry in entries.flatten() {
            if let Err(e) = self.tear_down_one(&entry.path()).await {
                errors.push(e);
            }
        }
        if errors.is_empty() {
            let _ = std::fs::remove_dir(&plugin_dir);
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }

    async fn tear_down_one(&self, dir: &Path) -> Result<(), String> {
        let target = dir.join("mount");
        let data = read_vol_data(&dir.join("vol_data.json"));
        let (Some(driver), Some(handle)) = (
            data.get("driverName").cloned(),
            data.get("volumeHandle").cloned(),
        ) else {
            // Nothing was published here (or it is not ours to unpublish): only an
            // unmounted directory is removed.
            if is_mounted(&target) {
                return Err(format!(
                    "{} is mounted but has no vol_data.json",
                    target.display()
                ));
            }
            remove_mount_dir(dir);
            return Ok(());
        };
        let spec = data.get("specVolID").cloned().unwrap_or_default();
        let persistent = data.get("volumeLifecycleMode").map(String::as_str) != Some("Ephemeral");
        let unique = if persistent {
            format!("kubernetes.io/csi/{driver}^{handle}")
        } else {
            dir.display().to_string()
        };
        let lock = self.lock(&unique);
        let _held = lock.lock().await;
        let fail = |e: String| format!("UnmountVolume.TearDown failed for volume {spec:?} : {e}");
        let mut client = self.client(&driver).map_err(fail)?;
        self.call(
            client.node_unpublish_volume(self.request(csi::NodeUnpublishVolumeRequest {
                volume_id: handle.clone(),
                target_path: target.display().to_string(),
            })),
        )
        .await
        .map_err(|e| fail(e.message))?;
        if is_mounted(&target) {
            return Err(fail(format!(
                "{} is still mounted after NodeUnpublishVolume",
                target.display()
            )));
        }
        remove_mount_dir(dir);
        self.published.lock().unwrap().remove(&target);
        self.stats.lock().unwrap().remove(&target);
        if persistent && !self.in_use(&driver, &handle) {
            self.unstage(&driver, &handle)
                .await
                .map_err(|e| format!("UnmountDevice failed for volume {spec:?} : {e}"))?;
        }
        Ok(())
    }

    /// Whether a pod on this node still has the volume published (a `vol_data.json`
    /// naming it under some pod's directory).
    fn in_use(&self, driver: &str, handle: &str) -> bool {
        let Ok(pods) = std::fs::read_dir(self.root.join("pods")) else {
            return false;
        };
        pods.flatten().any(|pod| {
            std::fs::read_dir(pod.path().join("volumes").join(PLUGIN_DIR))
                .into_iter()
                .flatten()
                .flatten()
                .any(|v| {
                    let d = read_vol_data(&v.path().join("vol_data.json"));
                    d.get("driverName").map(String::as_str) == Some(driver)
                        && d.get("volumeHandle").map(String::as_str) == Some(handle)
                })
        })
    }

    /// `UnmountDevice`: `NodeUnstageVolume` (when the driver stages), then the global
    /// directory goes.
    async fn unstage(&self, driver: &str, handle: &str) -> Result<(), String> {
        let global = self.global_path(driver, handle);
        let parent = global
            .parent()
            .expect("globalmount has a parent")
            .to_owned();
        if !parent.join("vol_data.json").exists() {
            return Ok(());
        }
        let caps = self.capabilities(driver).await?;
        let stages =
            caps.contains(&(csi::node_service_capability::rpc::Type::StageUnstageVolume as i32));
        if stages {
            let mut client = self.client(driver)?;
            self.call(
                client.node_unstage_volume(self.request(csi::NodeUnstageVolumeRequest {
                    volume_id: handle.to_owned(),
                    staging_target_path: global.display().to_string(),
                })),
            )
            .await
            .map_err(|e| e.message)?;
        }
        if is_mounted(&global) {
            return Err(format!(
                "{} is still mounted after NodeUnstageVolume",
                global.display()
            ));
        }
        let _ = std::fs::remove_dir(&global);
        let _ = std::fs::remove_file(parent.join("vol_data.json"));
        let _ = std::fs::remove_dir(&parent);
        Ok(())
    }

    /// Starts tearing down the CSI volumes of a pod that is gone, in the background,
    /// then removes its directory; `false` when it is already being torn down or has
    /// no CSI volumes (the caller removes the directory itself).
    pub fn tear_down_in_background(self: &Arc<Self>, pod_dir: PathBuf) -> bool {
        if !pod_dir.join("volumes").join(PLUGIN_DIR).is_dir()
            && !pod_dir.join("volumeDevices").join(PLUGIN_DIR).is_dir()
        {
            return false;
        }
        let key = pod_dir.display().to_string();
        if !self.tearing_down.lock().unwrap().insert(key.clone()) {
            return true;
        }
        let this = self.clone();
        tokio::spawn(async move {
            match this.tear_down(&pod_dir).await {
                Ok(()) => {
                    crate::volumes::tear_down(&pod_dir);
                    crate::volumes::remove_pod_dir(&pod_dir);
                }
                Err(e) => {
                    tracing::warn!(dir = %pod_dir.display(), "tearing down the volumes of a pod that is gone: {e}")
                }
            }
            this.tearing_down.lock().unwrap().remove(&key);
        });
        true
    }

    /// The unique names (`kubernetes.io/csi/<driver>^<handle>`) of the persistent
    /// volumes staged on this node: the Node's `status.volumesInUse`.
    pub fn volumes_in_use(&self) -> Vec<String> {
        let mut out: Vec<String> = std::fs::read_dir(self.root.join("plugins/kubernetes.io/csi"))
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|driver| {
                std::fs::read_dir(driver.path())
                    .into_iter()
                    .flatten()
                    .flatten()
            })
            .filter_map(|vol| {
                let d = read_vol_data(&vol.path().join("vol_data.json"));
                Some(format!(
                    "kubernetes.io/csi/{}^{}",
                    d.get("driverName")?,
                    d.get("volumeHandle")?
                ))
            })
            .collect();
        // Block volumes: `volumeDevices/<pv>/data/vol_data.json`.
        out.extend(
            std::fs::read_dir(self.root.join("plugins/kubernetes.io/csi/volumeDevices"))
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|spec| {
                    let d = read_vol_data(&spec.path().join("data/vol_data.json"));
                    Some(format!(
                        "kubernetes.io/csi/{}^{}",
                        d.get("driverName")?,
                        d.get("volumeHandle")?
                    ))
                }),
        );
        out.sort();
        out
    }
}

/// A failed CSI call: its text, and whether it is final (nothing was done) or
/// uncertain (the driver may have done it; teardown undoes it).
struct CallError {
    message: String,
    final_: bool,
}

impl CallError {
    fn from_status(s: &tonic::Status) -> Self {
        use tonic::Code;
        CallError {
            message: format!("rpc error: code = {:?} desc = {}", s.code(), s.message()),
            final_: !matches!(
                s.code(),
                Code::Cancelled
                    | Code::DeadlineExceeded
                    | Code::Unavailable
                    | Code::ResourceExhausted
                    | Code::Aborted
            ),
        }
    }
}

/// The kubelet's unique volume name: `kubernetes.io/csi/<driver>^<handle>` for a
/// PersistentVolume; an inline volume is the pod's own.
fn unique_name(src: &Source, pod: &Pod) -> String {
    match src.lifecycle {
        Lifecycle::Persistent => format!("kubernetes.io/csi/{}^{}", src.driver, src.handle),
        Lifecycle::Ephemeral => format!(
            "kubernetes.io/csi/{}-{}",
            pod.metadata.uid.as_deref().unwrap_or_default(),
            src.spec_name
        ),
    }
}

/// The VolumeAttachment's name: `csi-<sha256(handle + driver + node)>`.
pub fn attachment_name(handle: &str, driver: &str, node: &str) -> String {
    let mut h = Sha256::new();
    h.update(handle.as_bytes());
    h.update(driver.as_bytes());
    h.update(node.as_bytes());
    format!("csi-{}", hex::encode(h.finalize()))
}

/// `EscapeQualifiedName`: `/` becomes `~`.
fn escape(name: &str) -> String {
    name.replace('/', "~")
}

/// The CSI access mode of a Kubernetes one.
fn access_mode(k8s: &str, multi_writer: bool) -> csi::volume_capability::access_mode::Mode {
    use csi::volume_capability::access_mode::Mode;
    match (k8s, multi_writer) {
        ("ReadWriteOnce", false) => Mode::SingleNodeWriter,
        ("ReadWriteOnce", true) => Mode::SingleNodeMultiWriter,
        ("ReadOnlyMany", _) => Mode::MultiNodeReaderOnly,
        ("ReadWriteMany", _) => Mode::MultiNodeMultiWriter,
        ("ReadWriteOncePod", false) => Mode::SingleNodeWriter,
        ("ReadWriteOncePod", true) => Mode::SingleNodeSingleWriter,
        _ => Mode::Unknown,
    }
}

/// What the volume `v` of `pod` is: the PV bound to its claim (the claim a generic
/// ephemeral volume owns), or the inline volume. Errors in the kubelet's words.
async fn resolve(pod: &Pod, v: &Volume, objects: &dyn ObjectSource) -> Result<Source, String> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    if let Some(inline) = &v.csi {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        return Ok(Source {
            spec_name: v.name.clone(),
            driver: inline.driver.clone(),
            handle: format!(
                "csi-{}",
                hex::encode(Sha256::digest(format!("{uid}{}", v.name).as_bytes()))
            ),
            lifecycle: Lifecycle::Ephemeral,
            fs_type: inline.fs_type.clone().unwrap_or_default(),
            mount_flags: Vec::new(),
            access_mode: "ReadWriteOnce".into(),
            single_node: true,
            attributes: inline.volume_attributes.clone().unwrap_or_default(),
            read_only: inline.read_only.unwrap_or(false),
            stage_secret: None,
            publish_secret: inline
                .node_publish_secret_ref
                .as_ref()
                .map(|r| (namespace.to_owned(), r.name.clone())),
            claim: None,
            block: false,
        });
    }
    let (claim, read_only, owned_by_pod) = if let Some(c) = &v.persistent_volume_claim {
        (c.claim_name.clone(), c.read_only.unwrap_or(false), false)
    } else {
        // A generic ephemeral volume: the claim the ephemeral volume controller made.
        (
            format!(
                "{}-{}",
                pod.metadata.name.as_deref().unwrap_or_default(),
                v.name
            ),
            false,
            true,
        )
    };
    let wrap = |e: String| format!("error processing PVC {namespace}/{claim}: {e}");
    let pvc = objects
        .persistent_volume_claim(namespace, &claim)
        .await
        .map_err(wrap)?
        .ok_or_else(|| {
            wrap(format!(
                "failed to fetch PVC from API server: persistentvolumeclaims {claim:?} not found"
            ))
        })?;
    if owned_by_pod {
        let owned = pvc.metadata.owner_references.iter().flatten().any(|o| {
            o.controller == Some(true) && Some(o.uid.as_str()) == pod.metadata.uid.as_deref()
        });
        if !owned {
            return Err(format!(
                "PVC {namespace}/{claim} was not created for pod {namespace}/{} (pod is not owner)",
                pod.metadata.name.as_deref().unwrap_or_default()
            ));
        }
    }
    if pvc.metadata.deletion_timestamp.is_some() {
        return Err(wrap("PVC is being deleted".into()));
    }
    if pvc.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
        return Err(wrap("PVC is not bound".into()));
    }
    let pv_name = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| wrap("PVC has empty pvc.Spec.VolumeName".into()))?;
    let pv = objects
        .persistent_volume(&pv_name)
        .await
        .map_err(wrap)?
        .ok_or_else(|| {
            wrap(format!(
                "failed to fetch PV {pv_name} from API server: persistentvolumes {pv_name:?} not found"
            ))
        })?;
    check_claim_ref(&pv, pvc.metadata.uid.as_deref()).map_err(wrap)?;
    let spec = pv.spec.clone().unwrap_or_default();
    // The kubelet's volumeMode checks against how the containers use the volume.
    let block = spec.volume_mode.as_deref() == Some("Block");
    let containers = || crate::pod::containers(pod);
    if block && containers().any(|c| c.volume_mounts.iter().flatten().any(|m| m.name == v.name)) {
        return Err(format!(
            "volume {} has volumeMode Block, but is specified in volumeMounts",
            v.name
        ));
    }
    if !block && containers().any(|c| c.volume_devices.iter().flatten().any(|d| d.name == v.name)) {
        return Err(format!(
            "volume {} has volumeMode Filesystem, but is specified in volumeDevices",
            v.name
        ));
    }
    let Some(source) = spec.csi else {
        return Err(format!(
            "PersistentVolume {pv_name} is not a CSI volume: this node mounts PersistentVolumes through CSI drivers only"
        ));
    };
    let modes = spec.access_modes.clone().unwrap_or_default();
    let secret = |r: &Option<k8s_openapi::api::core::v1::SecretReference>| {
        r.as_ref().map(|r| {
            (
                r.namespace.clone().unwrap_or_else(|| namespace.to_owned()),
                r.name.clone().unwrap_or_default(),
            )
        })
    };
    Ok(Source {
        spec_name: pv_name,
        driver: source.driver.clone(),
        handle: source.volume_handle.clone(),
        lifecycle: Lifecycle::Persistent,
        fs_type: source.fs_type.clone().unwrap_or_default(),
        mount_flags: spec.mount_options.clone().unwrap_or_default(),
        access_mode: modes
            .first()
            .cloned()
            .unwrap_or_else(|| "ReadWriteOnce".into()),
        single_node: modes
            .iter()
            .any(|m| m == "ReadWriteOnce" || m == "ReadWriteOncePod"),
        attributes: source.volume_attributes.clone().unwrap_or_default(),
        read_only,
        stage_secret: secret(&source.node_stage_secret_ref),
        publish_secret: secret(&source.node_publish_secret_ref),
        claim: Some(claim),
        block,
    })
}

fn check_claim_ref(pv: &PersistentVolume, claim_uid: Option<&str>) -> Result<(), String> {
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    let Some(claim_ref) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return Err(format!(
            "found PV object {name} but it has a nil pv.Spec.ClaimRef indicating it is not yet bound to the claim"
        ));
    };
    if claim_ref.uid.as_deref() != claim_uid {
        return Err(format!(
            "found PV object {name} but its pv.Spec.ClaimRef.UID {} does not point to claim.UID {}",
            claim_ref.uid.as_deref().unwrap_or_default(),
            claim_uid.unwrap_or_default()
        ));
    }
    Ok(())
}

/// The CSIDriver's `volumeLifecycleModes` must allow the volume's (only
/// `Persistent` when there is no CSIDriver).
fn check_lifecycle(src: &Source, driver: Option<&CSIDriver>) -> Result<(), String> {
    let mode = src.lifecycle.as_str();
    let Some(driver) = driver else {
        return match src.lifecycle {
            Lifecycle::Persistent => Ok(()),
            Lifecycle::Ephemeral => Err(format!(
                "kubernetes.io/csi: volume mode {mode:?} not supported by driver {} (no CSIDriver object)",
                src.driver
            )),
        };
    };
    let modes = driver
        .spec
        .volume_lifecycle_modes
        .clone()
        .unwrap_or_else(|| vec!["Persistent".into()]);
    if modes.iter().any(|m| m == mode) {
        Ok(())
    } else {
        Err(format!(
            "kubernetes.io/csi: volume mode {mode:?} not supported by driver {} (only supports {modes:?})",
            src.driver
        ))
    }
}

/// The `csi.storage.k8s.io/*` volume context of a driver with `podInfoOnMount`.
fn pod_info(pod: &Pod, lifecycle: Lifecycle) -> BTreeMap<String, String> {
    let m = &pod.metadata;
    [
        ("pod.name", m.name.clone().unwrap_or_default()),
        ("pod.namespace", m.namespace.clone().unwrap_or_default()),
        ("pod.uid", m.uid.clone().unwrap_or_default()),
        (
            "serviceAccount.name",
            pod.spec
                .as_ref()
                .and_then(|s| s.service_account_name.clone())
                .unwrap_or_default(),
        ),
        ("ephemeral", (lifecycle == Lifecycle::Ephemeral).to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (format!("csi.storage.k8s.io/{k}"), v))
    .collect()
}

/// The secret a CSI call takes, its data as strings; none without a reference.
async fn read_secret(
    objects: &dyn ObjectSource,
    r: Option<&SecretRef>,
) -> Result<BTreeMap<String, String>, String> {
    let Some((namespace, name)) = r else {
        return Ok(BTreeMap::new());
    };
    let secret = objects
        .secret(namespace, name)
        .await
        .map_err(|e| format!("{namespace}/{name} failed: {e}"))?
        .ok_or_else(|| format!("{namespace}/{name} failed: secrets {name:?} not found"))?;
    Ok(secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
        .chain(secret.string_data.unwrap_or_default())
        .collect())
}

/// Whether the kubelet changes the volume's group to the pod's `fsGroup`: never for
/// `fsGroupPolicy: None` or a read-only volume; always for `File`; for
/// `ReadWriteOnceWithFSType` (the default) when there is an fsType and the volume is
/// single-node.
fn changes_ownership(src: &Source, driver: Option<&CSIDriver>) -> Result<bool, String> {
    if src.read_only {
        return Ok(false);
    }
    let policy = driver
        .and_then(|d| d.spec.fs_group_policy.clone())
        .unwrap_or_else(|| "ReadWriteOnceWithFSType".into());
    match policy.as_str() {
        "None" => Ok(false),
        "File" => Ok(true),
        "ReadWriteOnceWithFSType" => Ok(!src.fs_type.is_empty() && src.single_node),
        other => Err(format!("expected valid fsGroupPolicy, received {other:?}")),
    }
}

/// `SetVolumeOwnership`: every file and directory under `root` (symlinks not
/// followed) gets the group `gid` and group read (and write unless `read_only`)
/// permission, directories also the setgid bit and group search. With
/// `on_root_mismatch`, nothing is walked when the root already has them.
pub fn apply_fs_group(
    root: &Path,
    gid: u32,
    read_only: bool,
    on_root_mismatch: bool,
) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let (mask, dir_mask) = if read_only {
        (0o440, 0o550)
    } else {
        (0o660, 0o770)
    };
    if on_root_mismatch {
        let m = std::fs::metadata(root)?;
        if m.gid() == gid && m.mode() & dir_mask == dir_mask && m.mode() & 0o2000 != 0 {
            return Ok(());
        }
    }
    fn walk(path: &Path, gid: u32, mask: u32) -> std::io::Result<()> {
        let meta = std::fs::symlink_metadata(path)?;
        if meta.is_dir() {
            for entry in std::fs::read_dir(path)? {
                walk(&entry?.path(), gid, mask)?;
            }
        }
        std::os::unix::fs::lchown(path, None, Some(gid))?;
        if meta.file_type().is_symlink() {
            return Ok(());
        }
        let mut mode = meta.mode() & 0o7777 | mask;
        if meta.is_dir() {
            mode |= 0o2000 | 0o110;
        }
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
    }
    walk(root, gid, mask)
}

fn create_dir(path: &Path, mode: u32) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
        .map_err(|e| {
            format!(
                "kubernetes.io/csi: failed to create dir {}: {e}",
                path.display()
            )
        })
}

/// `vol_data.json`: a flat object of strings, keys sorted, as Go's encoder writes it.
fn write_vol_data(path: &Path, entries: &[(&str, &str)]) -> Result<(), String> {
    let map: BTreeMap<&str, &str> = entries.iter().copied().collect();
    let mut text = serde_json::to_string(&map).map_err(|e| e.to_string())?;
    text.push('\n');
    std::fs::write(path, text).map_err(|e| {
        format!(
            "kubernetes.io/csi: failed to save volume info data: {}: {e}",
            path.display()
        )
    })
}

fn read_vol_data(path: &Path) -> BTreeMap<String, String> {
    std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// `removeMountDir`: the target, `vol_data.json` and the volume's directory, when the
/// target is not mounted.
fn remove_mount_dir(dir: &Path) {
    let _ = std::fs::remove_dir(dir.join("mount"));
    let _ = std::fs::remove_file(dir.join("vol_data.json"));
    let _ = std::fs::remove_dir(dir);
}

/// Whether `path` is a mount point, by the mount table (a bind mount on the same
/// filesystem has its parent's device number).
pub fn is_mounted(path: &Path) -> bool {
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    crate::volumes::mount_points().contains(&path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn locks_and_back_offs_of_volumes_that_went_are_forgotten() {
        let root = tempfile::tempdir().unwrap();
        let v = CsiVolumes::new(
            Default::default(),
            root.path().to_owned(),
            "n1".into(),
            Duration::from_secs(1),
        );
        let held = v.lock("kubernetes.io/csi/d^a");
        let guard = held.lock().await;
        for i in 0..100 {
            drop(v.lock(&format!("kubernetes.io/csi/d^inline-{i}")));
        }
        let again = v.lock("kubernetes.io/csi/d^b");
        assert_eq!(
            v.locks.lock().unwrap().len(),
            2,
            "only the held lock and the new one stay"
        );
        assert!(
            Arc::ptr_eq(&held, &v.lock("kubernetes.io/csi/d^a")),
            "a held lock is the one handed out again"
        );
        drop((guard, again));

        let retry = || Retry {
            not_before: Instant::now(),
            delay: BACKOFF_INITIAL,
            error: "failed".into(),
        };
        v.retries.lock().unwrap().extend([
            ("data/uid-1".to_owned(), retry()),
            ("cache/uid-1".to_owned(), retry()),
            ("data/uid-2".to_owned(), retry()),
        ]);
        v.tear_down(&root.path().join("pods/uid-1")).await.unwrap();
        let left: Vec<String> = v.retries.lock().unwrap().keys().cloned().collect();
        assert_eq!(left, ["data/uid-2"]);
    }

    #[test]
    fn names_and_paths_are_the_kubelets() {
        // sha256("handle" + "driver" + "node"), as the attach/detach controller names it.
        let name = attachment_name("vol-1", "hostpath.csi.k8s.io", "n1");
        let mut h = Sha256::new();
        h.update(b"vol-1hostpath.csi.k8s.ion1");
        assert_eq!(name, format!("csi-{}", hex::encode(h.finalize())));
        assert_eq!(name.len(), 4 + 64);
        let v = CsiVolumes::new(
            Default::default(),
            PathBuf::from("/var/lib/kubelet"),
            "n1".into(),
            Duration::from_secs(1),
        );
        let global = v.global_path("d.example.com", "h1");
        assert_eq!(
            global,
            PathBuf::from(format!(
                "/var/lib/kubelet/plugins/kubernetes.io/csi/d.example.com/{}/globalmount",
                hex::encode(Sha256::digest(b"h1"))
            ))
        );
        assert_eq!(escape("a/b"), "a~b");
        use csi::volume_capability::access_mode::Mode;
        assert_eq!(access_mode("ReadWriteOnce", false), Mode::SingleNodeWriter);
        assert_eq!(
            access_mode("ReadWriteOncePod", true),
            Mode::SingleNodeSingleWriter
        );
        assert_eq!(access_mode("ReadOnlyMany", true), Mode::MultiNodeReaderOnly);
        assert_eq!(access_mode("Other", false), Mode::Unknown);
    }

    #[test]
    fn vol_data_is_sorted_json_with_a_newline() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("vol_data.json");
        write_vol_data(&p, &[("volumeHandle", "h"), ("driverName", "d")]).unwrap();
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            "{\"driverName\":\"d\",\"volumeHandle\":\"h\"}\n"
        );
        assert_eq!(read_vol_data(&p)["volumeHandle"], "h");
    }

    #[test]
    fn fs_group_is_applied_to_the_tree_and_skipped_when_the_root_already_matches() {
        use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("v");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/f"), "x").unwrap();
        std::fs::set_permissions(root.join("sub/f"), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        std::os::unix::fs::symlink("/etc/hostname", root.join("link")).unwrap();
        apply_fs_group(&root, 4242, false, false).unwrap();
        let f = std::fs::metadata(root.join("sub/f")).unwrap();
        assert_eq!((f.gid(), f.mode() & 0o7777), (4242, 0o660));
        let d = std::fs::metadata(root.join("sub")).unwrap();
        assert_eq!(d.gid(), 4242);
        assert_eq!(d.mode() & 0o2770, 0o2770, "{:o}", d.mode());
        assert_eq!(
            std::fs::symlink_metadata(root.join("link")).unwrap().gid(),
            4242
        );
        assert_ne!(
            std::fs::metadata("/etc/hostname").unwrap().gid(),
            4242,
            "not followed"
        );
        // OnRootMismatch: the root matches, so a file changed since is left alone.
        std::fs::set_permissions(root.join("sub/f"), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        apply_fs_group(&root, 4242, false, true).unwrap();
        let f = std::fs::metadata(root.join("sub/f")).unwrap();
        assert_eq!(f.mode() & 0o777, 0o600);
        apply_fs_group(&root, 4242, false, false).unwrap();
        let f = std::fs::metadata(root.join("sub/f")).unwrap();
        assert_eq!(f.mode() & 0o777, 0o660);
    }

    fn source(lifecycle: Lifecycle, fs_type: &str, read_only: bool) -> Source {
        Source {
            spec_name: "pv".into(),
            driver: "d".into(),
            handle: "h".into(),
            lifecycle,
            fs_type: fs_type.into(),
            mount_flags: vec![],
            access_mode: "ReadWriteOnce".into(),
            single_node: true,
            attributes: BTreeMap::new(),
            read_only,
            stage_secret: None,
            publish_secret: None,
            claim: None,
            block: false,
        }
    }

    #[test]
    fn lifecycle_modes_and_fs_group_policies_follow_the_csidriver() {
        let driver = |spec: serde_json::Value| -> CSIDriver {
            serde_json::from_value(serde_json::json!({"metadata": {"name": "d"}, "spec": spec}))
                .unwrap()
        };
        let inline = source(Lifecycle::Ephemeral, "", false);
        let e = check_lifecycle(&inline, None).unwrap_err();
        assert!(e.contains("no CSIDriver object"), "{e}");
        let e = check_lifecycle(&inline, Some(&driver(serde_json::json!({})))).unwrap_err();
        assert!(e.contains("only supports [\"Persistent\"]"), "{e}");
        let both = driver(serde_json::json!({"volumeLifecycleModes": ["Persistent", "Ephemeral"]}));
        assert!(check_lifecycle(&inline, Some(&both)).is_ok());
        assert!(check_lifecycle(&source(Lifecycle::Persistent, "", false), None).is_ok());

        let ext4 = source(Lifecycle::Persistent, "ext4", false);
        assert!(changes_ownership(&ext4, None).unwrap());
        assert!(!changes_ownership(&source(Lifecycle::Persistent, "", false), None).unwrap());
        assert!(!changes_ownership(&source(Lifecycle::Persistent, "ext4", true), None).unwrap());
        let file = driver(serde_json::json!({"fsGroupPolicy": "File"}));
        assert!(changes_ownership(&source(Lifecycle::Persistent, "", false), Some(&file)).unwrap());
        let none = driver(serde_json::json!({"fsGroupPolicy": "None"}));
        assert!(!changes_ownership(&ext4, Some(&none)).unwrap());
    }
}
