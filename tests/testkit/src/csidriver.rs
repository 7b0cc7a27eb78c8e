//! A small hostpath-style CSI driver (Identity and Node, CSI v1) for the node's tests:
//! a real gRPC server on a unix socket in the node's `plugins_registry`, answering
//! plugin registration (`GetInfo`, type `CSIPlugin`) on the same socket. A volume is
//! a directory under the driver's data directory; staging bind-mounts it at the
//! staging path, publishing bind-mounts that (read-only when asked) at the target.
//! Every call is recorded, in order.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tonic::{Request, Response, Status};
use wasmlet_proto::csi::v1 as csi;
use wasmlet_proto::csi::v1::identity_server::{Identity, IdentityServer};
use wasmlet_proto::csi::v1::node_server::{Node, NodeServer};
use wasmlet_proto::pluginregistration::v1 as watcher;
use wasmlet_proto::pluginregistration::v1::registration_server::{
    Registration, RegistrationServer,
};

/// What a `NodePublishVolume` carried besides its paths.
#[derive(Clone, Debug)]
pub struct Published {
    pub volume_id: String,
    pub volume_context: BTreeMap<String, String>,
    pub secrets: BTreeMap<String, String>,
    pub readonly: bool,
}

/// What the driver says about the node.
#[derive(Clone, Debug)]
pub struct CsiDriverOptions {
    pub name: String,
    pub node_id: String,
    pub max_volumes: i64,
    pub topology: BTreeMap<String, String>,
    /// Whether it has STAGE_UNSTAGE_VOLUME.
    pub stage: bool,
    pub versions: Vec<String>,
    /// `NodePublishVolume` fails with `Internal` and this message.
    pub fail_publish: Option<String>,
    /// `NodePublishVolume` never answers.
    pub hang_publish: bool,
}

impl CsiDriverOptions {
    pub fn new(name: &str) -> Self {
        CsiDriverOptions {
            name: name.to_owned(),
            node_id: format!("{name}-node"),
            max_volumes: 16,
            topology: BTreeMap::new(),
            stage: true,
            versions: vec!["1.0.0".into()],
            fail_publish: None,
            hang_publish: false,
        }
    }
}

struct Shared {
    options: CsiDriverOptions,
    socket: PathBuf,
    data: PathBuf,
    calls: Mutex<Vec<(std::time::Instant, String)>>,
    /// The loop device of each block volume (an 8 MiB image in the data directory).
    loops: Mutex<BTreeMap<String, String>>,
    /// What it mounted and has not unmounted: unmounted when the driver is dropped,
    /// so a test that ends with volumes in use leaves no mount behind.
    mounts: Mutex<std::collections::BTreeSet<PathBuf>>,
    /// The volume context and secret keys of each NodePublishVolume, in order.
    publishes: Mutex<Vec<Published>>,
    statuses: Mutex<Vec<(bool, String)>>,
}

#[derive(Clone)]
struct Driver(Arc<Shared>);

fn is_block(c: &Option<csi::VolumeCapability>) -> bool {
    matches!(
        c.as_ref().and_then(|c| c.access_type.as_ref()),
        Some(csi::volume_capability::AccessType::Block(_))
    )
}

impl Driver {
    /// The loop device of block volume `id`, attached on first use.
    fn loop_device(&self, id: &str) -> Result<String, Status> {
        let mut loops = self.0.loops.lock().unwrap();
        if let Some(dev) = loops.get(id) {
            return Ok(dev.clone());
        }
        let image = self.0.data.join(format!("{id}.img"));
        if !image.exists() {
            let f = std::fs::File::create(&image).map_err(|e| Status::internal(e.to_string()))?;
            f.set_len(8 << 20)
                .map_err(|e| Status::internal(e.to_string()))?;
        }
        let out = std::process::Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&image)
            .output()
            .map_err(|e| Status::internal(format!("losetup: {e}")))?;
        if !out.status.success() {
            return Err(Status::internal(format!(
                "losetup: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        loops.insert(id.to_owned(), dev.clone());
        Ok(dev)
    }

    fn detach(&self, id: &str) {
        if let Some(dev) = self.0.loops.lock().unwrap().remove(id) {
            let _ = std::process::Command::new("losetup")
                .args(["-d", &dev])
                .status();
        }
    }

    fn track(&self, path: &str, mounted: bool) {
        let mut mounts = self.0.mounts.lock().unwrap();
        if mounted {
            mounts.insert(PathBuf::from(path));
        } else {
            mounts.remove(Path::new(path));
        }
    }

    fn record(&self, call: String) {
        self.0
            .calls
            .lock()
            .unwrap()
            .push((std::time::Instant::now(), call));
    }
}

fn bind(source: &Path, target: &Path, read_only: bool) -> Result<(), Status> {
    use nix::mount::{MsFlags, mount};
    std::fs::create_dir_all(target)
        .map_err(|e| Status::internal(format!("{}: {e}", target.display())))?;
    mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| {
        Status::internal(format!(
            "bind {} at {}: {e}",
            source.display(),
            target.display()
        ))
    })?;
    if read_only {
        mount(
            None::<&str>,
            target,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            None::<&str>,
        )
        .map_err(|e| Status::internal(format!("read-only {}: {e}", target.display())))?;
    }
    Ok(())
}

fn unmount(target: &Path) -> Result<(), Status> {
    match nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => Ok(()),
        Err(e) => Err(Status::internal(format!(
            "unmount {}: {e}",
            target.display()
        ))),
    }
}

#[tonic::async_trait]
impl Identity for Driver {
    async fn get_plugin_info(
        &self,
        _r: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: self.0.options.name.clone(),
            vendor_version: "0.1.0".into(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _r: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(csi::GetPluginCapabilitiesResponse::default()))
    }

    async fn probe(
        &self,
        _r: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        Ok(Response::new(csi::ProbeResponse { ready: Some(true) }))
    }
}

#[tonic::async_trait]
impl Node for Driver {
    async fn node_stage_volume(
        &self,
        r: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        let r = r.into_inner();
        self.record(format!(
            "NodeStageVolume {} {}",
            r.volume_id, r.staging_target_path
        ));
        if is_block(&r.volume_capability) {
            self.loop_device(&r.volume_id)?;
            return Ok(Response::new(csi::NodeStageVolumeResponse {}));
        }
        let data = self.0.data.join(&r.volume_id);
        std::fs::create_dir_all(&data).map_err(|e| Status::internal(e.to_string()))?;
        bind(&data, Path::new(&r.staging_target_path), false)?;
        self.track(&r.staging_target_path, true);
        Ok(Response::new(csi::NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        r: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        let r = r.into_inner();
        self.record(format!(
            "NodeUnstageVolume {} {}",
            r.volume_id, r.staging_target_path
        ));
        unmount(Path::new(&r.staging_target_path))?;
        self.track(&r.staging_target_path, false);
        self.detach(&r.volume_id);
        Ok(Response::new(csi::NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        r: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let r = r.into_inner();
        self.record(format!(
            "NodePublishVolume {} {} readonly={}",
            r.volume_id, r.target_path, r.readonly
        ));
        self.0.publishes.lock().unwrap().push(Published {
            volume_id: r.volume_id.clone(),
            volume_context: r.volume_context.clone().into_iter().collect(),
            secrets: r.secrets.clone().into_iter().collect(),
            readonly: r.readonly,
        });
        if let Some(message) = &self.0.options.fail_publish {
            return Err(Status::internal(message.clone()));
        }
        if self.0.options.hang_publish {
            std::future::pending::<()>().await;
        }
        if is_block(&r.volume_capability) {
            // The device file: an empty file the loop device is bind-mounted on.
            let dev = self.loop_device(&r.volume_id)?;
            std::fs::File::create(&r.target_path)
                .map_err(|e| Status::internal(format!("{}: {e}", r.target_path)))?;
            nix::mount::mount(
                Some(Path::new(&dev)),
                Path::new(&r.target_path),
                None::<&str>,
                nix::mount::MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(|e| Status::internal(format!("bind {dev} at {}: {e}", r.target_path)))?;
            self.track(&r.target_path, true);
            return Ok(Response::new(csi::NodePublishVolumeResponse {}));
        }
        // An inline (ephemeral) volume is never staged: it is published straight from
        // the driver's data.
        let source = if self.0.options.stage && !r.staging_target_path.is_empty() {
            PathBuf::from(&r.staging_target_path)
        } else {
            let data = self.0.data.join(&r.volume_id);
            std::fs::create_dir_all(&data).map_err(|e| Status::internal(e.to_string()))?;
            data
        };
        bind(&source, Path::new(&r.target_path), r.readonly)?;
        self.track(&r.target_path, true);
        Ok(Response::new(csi::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        r: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let r = r.into_inner();
        self.record(format!(
            "NodeUnpublishVolume {} {}",
            r.volume_id, r.target_path
        ));
        unmount(Path::new(&r.target_path))?;
        self.track(&r.target_path, false);
        let _ = std::fs::remove_dir(&r.target_path);
        let _ = std::fs::remove_file(&r.target_path);
        Ok(Response::new(csi::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        r: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        let r = r.into_inner();
        let stat = nix::sys::statvfs::statvfs(Path::new(&r.volume_path))
            .map_err(|e| Status::not_found(format!("{}: {e}", r.volume_path)))?;
        let block = stat.fragment_size() as i64;
        let total = stat.blocks() as i64 * block;
        let available = stat.blocks_available() as i64 * block;
        Ok(Response::new(csi::NodeGetVolumeStatsResponse {
            usage: vec![csi::VolumeUsage {
                available,
                total,
                used: total - stat.blocks_free() as i64 * block,
                unit: csi::volume_usage::Unit::Bytes.into(),
            }],
            volume_condition: None,
        }))
    }

    async fn node_expand_volume(
        &self,
        r: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        let r = r.into_inner();
        let bytes = r
            .capacity_range
            .map(|c| c.required_bytes)
            .unwrap_or_default();
        self.record(format!(
            "NodeExpandVolume {} {} {bytes}",
            r.volume_id, r.volume_path
        ));
        Ok(Response::new(csi::NodeExpandVolumeResponse {
            capacity_bytes: bytes,
        }))
    }

    async fn node_get_capabilities(
        &self,
        _r: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        use csi::node_service_capability::{Rpc, Type, rpc::Type as RpcType};
        let mut types = vec![RpcType::GetVolumeStats, RpcType::ExpandVolume];
        if self.0.options.stage {
            types.push(RpcType::StageUnstageVolume);
        }
        Ok(Response::new(csi::NodeGetCapabilitiesResponse {
            capabilities: types
                .into_iter()
                .map(|t| csi::NodeServiceCapability {
                    r#type: Some(Type::Rpc(Rpc { r#type: t.into() })),
                })
                .collect(),
        }))
    }

    async fn node_get_info(
        &self,
        _r: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        self.record("NodeGetInfo".into());
        let o = &self.0.options;
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: o.node_id.clone(),
            max_volumes_per_node: o.max_volumes,
            accessible_topology: (!o.topology.is_empty()).then(|| csi::Topology {
                segments: o.topology.clone().into_iter().collect(),
            }),
        }))
    }
}

#[tonic::async_trait]
impl Registration for Driver {
    async fn get_info(
        &self,
        _r: Request<watcher::InfoRequest>,
    ) -> Result<Response<watcher::PluginInfo>, Status> {
        Ok(Response::new(watcher::PluginInfo {
            r#type: "CSIPlugin".into(),
            name: self.0.options.name.clone(),
            endpoint: self.0.socket.display().to_string(),
            supported_versions: self.0.options.versions.clone(),
        }))
    }

    async fn notify_registration_status(
        &self,
        r: Request<watcher::RegistrationStatus>,
    ) -> Result<Response<watcher::RegistrationStatusResponse>, Status> {
        let s = r.into_inner();
        self.0
            .statuses
            .lock()
            .unwrap()
            .push((s.plugin_registered, s.error));
        Ok(Response::new(watcher::RegistrationStatusResponse {}))
    }
}

/// The running driver; it stops (and removes its socket) when dropped.
pub struct TestCsiDriver {
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
    _data: tempfile::TempDir,
}

impl TestCsiDriver {
    /// Serves on `<registry>/<name>.sock`.
    pub fn start(registry: &Path, options: CsiDriverOptions) -> anyhow::Result<Self> {
        let runtime = crate::grpc::runtime()?;
        let socket = registry.join(format!("{}.sock", options.name));
        let listener = crate::grpc::bind(&socket)?;
        let data = tempfile::Builder::new().prefix("wasmlet-csi-").tempdir()?;
        let shared = Arc::new(Shared {
            options,
            socket,
            data: data.path().to_owned(),
            calls: Mutex::new(Vec::new()),
            loops: Mutex::new(BTreeMap::new()),
            mounts: Mutex::default(),
            publishes: Mutex::default(),
            statuses: Mutex::new(Vec::new()),
        });
        let driver = Driver(shared.clone());
        crate::grpc::serve(
            &runtime,
            listener,
            tonic::transport::Server::builder()
                .add_service(IdentityServer::new(driver.clone()))
                .add_service(NodeServer::new(driver.clone()))
                .add_service(RegistrationServer::new(driver)),
        );
        Ok(TestCsiDriver {
            shared,
            runtime: Some(runtime),
            _data: data,
        })
    }

    /// Every call so far, in order (`NodeStageVolume <id> <path>`, …).
    pub fn calls(&self) -> Vec<String> {
        self.calls_at().into_iter().map(|(_, c)| c).collect()
    }

    /// Every call so far with when it came.
    pub fn calls_at(&self) -> Vec<(std::time::Instant, String)> {
        self.shared.calls.lock().unwrap().clone()
    }

    /// What each `NodePublishVolume` carried, in order.
    pub fn publishes(&self) -> Vec<Published> {
        self.shared.publishes.lock().unwrap().clone()
    }

    /// Where the driver keeps the volume `id`'s files.
    pub fn volume_dir(&self, id: &str) -> PathBuf {
        self.shared.data.join(id)
    }

    /// The node's `NotifyRegistrationStatus` answers (registered, error).
    pub fn statuses(&self) -> Vec<(bool, String)> {
        self.shared.statuses.lock().unwrap().clone()
    }
}

impl Drop for TestCsiDriver {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
        // Publishes (deeper paths) go before the stagings they were bound from.
        let mounts: Vec<PathBuf> = std::mem::take(&mut *self.shared.mounts.lock().unwrap())
            .into_iter()
            .rev()
            .collect();
        for m in mounts {
            let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
        }
        let ids: Vec<String> = self.shared.loops.lock().unwrap().keys().cloned().collect();
        for id in ids {
            Driver(self.shared.clone()).detach(&id);
        }
        let _ = std::fs::remove_file(&self.shared.socket);
    }
}
