//! The device manager (the kubelet's `cm/devicemanager`): device plugins register
//! on `<root-dir>/device-plugins/kubelet.sock`, stream their devices with
//! `ListAndWatch`, and get `Allocate` calls when a pod asking for their resource is
//! admitted. Wasm `device-adapter` plugins are resources of the same kind, polled
//! instead of streamed.
//!
//! ```text
//! plugin ──Register──▶ registration ──▶ endpoint ──ListAndWatch──▶ devices
//!                                                                    │
//! node status ◀── capacity/allocatable ◀─────────────────────────────┤
//! admission: topology manager ─▶ hints / allocate ─▶ Allocate ───────┤
//! container start ─▶ run_options (env, mounts, devices) ◀────────────┘
//!                                          checkpoint: kubelet_internal_checkpoint
//! ```
//!
//! As the kubelet: a plugin whose stream ends has all its devices marked unhealthy,
//! and the resource goes from the Node (capacity 0) when it has not come back
//! within [`ENDPOINT_STOP_GRACE_PERIOD`]; allocations are kept in the checkpoint, so
//! a node restart neither loses them nor hands the same devices out twice.

pub mod checkpoint;
pub mod endpoint;
pub mod registration;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use wasmlet_proto::deviceplugin::v1beta1 as api;

use super::topologymanager::{
    BitMask, HintProvider, ProviderHints, TopologyHint, bitmask::all_masks, container_request,
    pod_request,
};
use crate::pod::uid;
pub use endpoint::Endpoint;

/// The kubelet's socket for plugin registration, in the device plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// The kubelet's checkpoint file name, in the device plugin directory.
pub const CHECKPOINT_FILE: &str = "kubelet_internal_checkpoint";
/// The kubelet's `endpointStopGracePeriod`: how long a resource whose plugin went
/// away stays on the Node (all its devices unhealthy) before it is removed.
pub const ENDPOINT_STOP_GRACE_PERIOD: Duration = Duration::from_secs(5 * 60);
/// `v1beta1.Healthy` and `v1beta1.Unhealthy`.
pub const HEALTHY: &str = "Healthy";
pub const UNHEALTHY: &str = "Unhealthy";

/// One device as the node knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub healthy: bool,
    /// The NUMA nodes it is attached to; empty when the plugin gave no topology.
    pub numa: Vec<u32>,
}

/// What a resource's devices amount to on the Node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Capacity {
    pub capacity: BTreeMap<String, i64>,
    pub allocatable: BTreeMap<String, i64>,
    /// Resources whose plugin has been gone longer than the grace period: the Node
    /// shows them with 0.
    pub removed: Vec<String>,
}

impl Capacity {
    /// (capacity, allocatable) by resource, as the Node shows them: a removed
    /// resource at (0, 0), as the kubelet zeroes it.
    pub fn per_resource(&self) -> BTreeMap<String, (i64, i64)> {
        let mut out: BTreeMap<String, (i64, i64)> = self
            .capacity
            .iter()
            .map(|(name, n)| {
                let allocatable = self.allocatable.get(name).copied().unwrap_or(0);
                (name.clone(), (*n, allocatable))
            })
            .collect();
        for name in &self.removed {
            out.insert(name.clone(), (0, 0));
        }
        out
    }
}

/// What a container gets from its devices at start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunOptions {
    pub envs: BTreeMap<String, String>,
    pub mounts: Vec<api::Mount>,
    pub devices: Vec<api::DeviceSpec>,
    pub annotations: BTreeMap<String, String>,
    pub cdi_devices: Vec<String>,
}

struct Resource {
    devices: BTreeMap<String, DeviceInfo>,
    endpoint: Option<Arc<dyn Endpoint>>,
    /// Set when the plugin went away (or, after a restart, until it registers again).
    stopped_at: Option<Instant>,
    /// Bumped by every registration, so that a replaced endpoint's stream ending does
    /// not mark its successor's devices unhealthy.
    generation: u64,
}

/// One container's devices of one resource.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContainerDevices {
    /// Device ids by the NUMA node they sit on (-1: none known), as the checkpoint
    /// keeps them.
    pub by_numa: BTreeMap<i64, Vec<String>>,
    pub response: api::ContainerAllocateResponse,
}

impl ContainerDevices {
    pub fn ids(&self) -> BTreeSet<String> {
        self.by_numa.values().flatten().cloned().collect()
    }
}

/// (pod UID, container) → resource → devices.
type PodDevices = BTreeMap<(String, String), BTreeMap<String, ContainerDevices>>;

#[derive(Default)]
struct State {
    resources: BTreeMap<String, Resource>,
    pod_devices: PodDevices,
    /// Resources removed after the grace period: reported at 0 until a plugin
    /// registers them again.
    removed: BTreeSet<String>,
}

impl State {
    fn allocated(&self, resource: &str) -> BTreeSet<String> {
        self.pod_devices
            .values()
            .filter_map(|r| r.get(resource))
            .flat_map(ContainerDevices::ids)
            .collect()
    }

    fn healthy(&self, resource: &str) -> BTreeSet<String> {
        self.resources
            .get(resource)
            .map(|r| {
                r.devices
                    .iter()
                    .filter(|(_, d)| d.healthy)
                    .map(|(id, _)| id.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Devices of `resource` allocated to the pod's init containers: the app
    /// containers may reuse them, as init containers have finished by then.
    fn reusable(&self, pod: &Pod, resource: &str, container: &str) -> BTreeSet<String> {
        let pod_uid = uid(pod);
        let spec = pod.spec.as_ref();
        let mut reusable = BTreeSet::new();
        for init in spec
            .and_then(|s| s.init_containers.as_ref())
            .into_iter()
            .flatten()
        {
            if init.name == container {
                break;
            }
            // A sidecar (restartPolicy Always) keeps running beside the app
            // containers: its devices are not free for them.
            if init.restart_policy.as_deref() == Some("Always") {
                continue;
            }
            let Some(devices) = self
                .pod_devices
                .get(&(pod_uid.to_owned(), init.name.clone()))
                .and_then(|r| r.get(resource))
            else {
                continue;
            };
            reusable.extend(devices.ids());
        }
        // Devices that app containers already hold are not reusable.
        for c in spec.map(|s| s.containers.as_slice()).unwrap_or_default() {
            if let Some(devices) = self
                .pod_devices
                .get(&(pod_uid.to_owned(), c.name.clone()))
                .and_then(|r| r.get(resource))
            {
                for id in devices.ids() {
                    reusable.remove(&id);
                }
            }
        }
        reusable
    }

    fn numa_of(&self, resource: &str, id: &str) -> Vec<u32> {
        self.resources
            .get(resource)
            .and_then(|r| r.devices.get(id))
            .map(|d| d.numa.clone())
            .unwrap_or_default()
    }

    fn has_topology(&self, resource: &str) -> bool {
        self.resources
            .get(resource)
            .is_some_and(|r| r.devices.values().any(|d| !d.numa.is_empty()))
    }
}

struct Inner {
    dir: PathBuf,
    numa_nodes: Vec<u32>,
    state: Mutex<State>,
    /// Bumped whenever capacity or allocatable may have changed.
    changed: watch::Sender<u64>,
    cancel: CancellationToken,
    events: Option<(crate::cluster::events::EventRecorder, String)>,
}

/// The device manager. Cheap to clone.
#[derive(Clone)]
pub struct DeviceManager {
    inner: Arc<Inner>,
}

/// Is `name` a resource a device plugin may serve (an extended resource name:
/// `domain/name`, outside `kubernetes.io`)?
pub fn valid_resource_name(name: &str) -> bool {
    let Some((domain, rest)) = name.split_once('/') else {
        return false;
    };
    crate::resources::is_extended(name)
        && !domain.is_empty()
        && !rest.is_empty()
        && !rest.contains('/')
        && domain
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && rest
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
}

impl DeviceManager {
    /// A device manager over `dir` (`<root-dir>/device-plugins`), with the allocations
    /// and registered resources of its checkpoint restored: a restored resource has
    /// no healthy device until its plugin registers again.
    pub fn new(
        dir: &Path,
        numa_nodes: Vec<u32>,
        cancel: CancellationToken,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let mut state = State::default();
        let path = dir.join(CHECKPOINT_FILE);
        match checkpoint::read(&path) {
            Ok(Some(cp)) => {
                let now = Instant::now();
                for (resource, ids) in cp.registered {
                    state.resources.insert(
                        resource,
                        Resource {
                            devices: ids
                                .into_iter()
                                .map(|id| {
                                    (
                                        id,
                                        DeviceInfo {
                                            healthy: false,
                                            numa: Vec::new(),
                                        },
                                    )
                                })
                                .collect(),
                            endpoint: None,
                            stopped_at: Some(now),
                            generation: 0,
                        },
                    );
                }
                state.pod_devices = cp.pod_devices;
                tracing::info!(
                    checkpoint = %path.display(),
                    containers = state.pod_devices.len(),
                    "device allocations restored from the checkpoint"
                );
            }
            Ok(None) => {}
            Err(e) => {
                // As the kubelet: a corrupt checkpoint is reported and started over.
                tracing::error!(checkpoint = %path.display(), "the device manager checkpoint cannot be used, starting without it: {e}");
            }
        }
        let (changed, _) = watch::channel(0);
        Ok(DeviceManager {
            inner: Arc::new(Inner {
                dir: dir.to_owned(),
                numa_nodes,
                state: Mutex::new(state),
                changed,
                cancel,
                events: None,
            }),
        })
    }

    /// Records adapter failures as Node events.
    pub fn with_events(
        mut self,
        events: crate::cluster::events::EventRecorder,
        node_name: String,
    ) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.events = Some((events, node_name));
        }
        self
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    pub fn socket_path(&self) -> PathBuf {
        self.inner.dir.join(KUBELET_SOCKET)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A receiver that sees a new value whenever capacity may have changed.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.changed.subscribe()
    }

    fn notify(&self) {
        self.inner.changed.send_modify(|n| *n += 1);
    }

    /// The resources' capacity and allocatable, as the Node shows them.
    pub fn capacity(&self) -> Capacity {
        let mut state = self.lock();
        let now = Instant::now();
        let mut out = Capacity::default();
        let mut expired = Vec::new();
        for (name, r) in &state.resources {
            if r.stopped_at
                .is_some_and(|t| now.duration_since(t) >= ENDPOINT_STOP_GRACE_PERIOD)
            {
                expired.push(name.clone());
                continue;
            }
            let healthy = r.devices.values().filter(|d| d.healthy).count();
            out.capacity.insert(name.clone(), r.devices.len() as i64);
            out.allocatable.insert(name.clone(), healthy as i64);
        }
        if !expired.is_empty() {
            for name in &expired {
                tracing::info!(resource = %name, "the device plugin did not come back within 5m; its resource is removed");
                state.resources.remove(name);
                state.removed.insert(name.clone());
            }
            let snapshot = checkpoint::Checkpoint::of(&state.pod_devices, &registered(&state));
            out.removed = state.removed.iter().cloned().collect();
            drop(state);
            self.write_checkpoint(snapshot);
            return out;
        }
        out.removed = state.removed.iter().cloned().collect();
        out
    }

    /// Allocatable of every device resource as admission counts it: never below
    /// what the admitted pods already hold (the kubelet's `sanitizeNodeAllocatable`,
    /// so that a device turning unhealthy under a running pod refuses new pods, not
    /// the pods it already has).
    pub fn admission_allocatable(&self) -> BTreeMap<String, i64> {
        let mut allocatable = self.capacity().allocatable;
        let state = self.lock();
        for (name, n) in allocatable.iter_mut() {
            *n = (*n).max(state.allocated(name).len() as i64);
        }
        allocatable
    }

    /// Serves plugin registration on `kubelet.sock` and runs the Wasm device
    /// adapters named in `adapters` until `cancel`; then stops every plugin stream.
    pub async fn run(
        self,
        host: Option<wasmlet_plugin_host::PluginHost>,
        adapters: Vec<(String, Vec<PathBuf>)>,
        adapter_period: Duration,
        cancel: CancellationToken,
    ) {
        let server = match registration::serve(self.clone()).await {
            Ok(handle) => Some(handle),
            Err(e) => {
                tracing::error!("device plugins cannot register: {e}");
                None
            }
        };
        let mut tasks = Vec::new();
        if let Some(host) = host {
            for (name, allowed) in adapters {
                tasks.extend(start_wasm_adapter(
                    &self,
                    host.clone(),
                    name,
                    allowed,
                    adapter_period,
                ));
            }
        }
        cancel.cancelled().await;
        self.inner.cancel.cancel();
        if let Some(server) = server {
            let _ = server.await;
        }
        for t in tasks {
            let _ = t.await;
        }
    }

    fn write_checkpoint(&self, cp: checkpoint::Checkpoint) {
        let path = self.inner.dir.join(CHECKPOINT_FILE);
        if let Err(e) = checkpoint::write(&path, &cp) {
            tracing::error!(checkpoint = %path.display(), "writing the device manager checkpoint: {e}");
        }
    }

    fn checkpoint_now(&self, state: &State) {
        self.write_checkpoint(checkpoint::Checkpoint::of(
            &state.pod_devices,
            &registered(state),
        ));
    }

    /// A plugin (re-)registered for `resource`: `endpoint` replaces any earlier one.
    /// Returns the registration's generation for [`Self::update_devices`] and
    /// [`Self::disconnected`].
    pub fn connect(&self, resource: &str, endpoint: Arc<dyn Endpoint>) -> u64 {
        let mut state = self.lock();
        let r = state
            .resources
            .entry(resource.to_owned())
            .or_insert_with(|| Resource {
                devices: BTreeMap::new(),
                endpoint: None,
                stopped_at: None,
                generation: 0,
            });
        r.generation += 1;
        r.endpoint = Some(endpoint);
        r.stopped_at = None;
        let generation = r.generation;
        state.removed.remove(resource);
        generation
    }

    /// The plugin's current devices (a `ListAndWatch` answer or an adapter's
    /// `discover`): they replace what the node knew.
    pub fn update_devices(
        &self,
        resource: &str,
        generation: u64,
        devices: BTreeMap<String, DeviceInfo>,
    ) {
        let mut state = self.lock();
        let Some(r) = state.resources.get_mut(resource) else {
            return;
        };
        if r.generation != generation {
            return;
        }
        let healthy = devices.values().filter(|d| d.healthy).count();
        if r.devices != devices {
            tracing::info!(
                resource,
                devices = devices.len(),
                healthy,
                "device plugin reported its devices"
            );
            r.devices = devices;
            self.checkpoint_now(&state);
            drop(state);
            self.notify();
        }
    }

    /// The plugin of `generation` went away: its devices are unhealthy from now on,
    /// and the resource is removed after the grace period unless it registers again.
    pub fn disconnected(&self, resource: &str, generation: u64, why: &str) {
        let mut state = self.lock();
        let Some(r) = state.resources.get_mut(resource) else {
            return;
        };
        if r.generation != generation {
            return;
        }
        tracing::warn!(
            resource,
            "device plugin disconnected, its devices are unhealthy: {why}"
        );
        r.endpoint = None;
        r.stopped_at = Some(Instant::now());
        for d in r.devices.values_mut() {
            d.healthy = false;
        }
        drop(state);
        self.notify();
    }

    /// The plugin of `resource` at `socket` is gone (its registry socket was
    /// removed): as a stream that ended. A newer registration of the resource on
    /// another socket is left alone.
    pub fn deregister(&self, resource: &str, socket: &Path) {
        let generation = self.lock().resources.get(resource).and_then(|r| {
            let current = r.endpoint.as_ref()?.socket()?;
            (current == socket).then_some(r.generation)
        });
        if let Some(generation) = generation {
            self.disconnected(resource, generation, "its plugin socket was removed");
        }
    }

    /// Moves the resource's stop time back by `by` (tests of the grace period).
    #[cfg(test)]
    fn age_stop(&self, resource: &str, by: Duration) {
        if let Some(r) = self.lock().resources.get_mut(resource) {
            r.stopped_at = r.stopped_at.and_then(|t| t.checked_sub(by));
        }
    }

    /// Records a warning about the node (a failing adapter).
    pub fn node_warning(&self, reason: &'static str, message: &str) {
        if let Some((events, node)) = &self.inner.events {
            events.node(node, crate::cluster::events::WARNING, reason, message);
        }
    }

    pub fn cancel_token(&self) -> CancellationToken {
        self.inner.cancel.clone()
    }

    fn is_device_resource(&self, resource: &str) -> bool {
        self.lock().resources.contains_key(resource)
    }

    /// Drops the allocations of pods that are not in `active` (UIDs), as the kubelet's
    /// `UpdateAllocatedDevices` does before it allocates.
    pub fn retain_pods(&self, active: &HashSet<String>) {
        let mut state = self.lock();
        let before = state.pod_devices.len();
        state.pod_devices.retain(|(pod, _), _| active.contains(pod));
        if state.pod_devices.len() != before {
            self.checkpoint_now(&state);
        }
    }

    /// The devices allocated to one container, by resource.
    pub fn container_devices(
        &self,
        pod_uid: &str,
        container: &str,
    ) -> BTreeMap<String, ContainerDevices> {
        self.lock()
            .pod_devices
            .get(&(pod_uid.to_owned(), container.to_owned()))
            .cloned()
            .unwrap_or_default()
    }

    /// What the container gets from its devices (every resource's `Allocate` answer
    /// merged), after `PreStartContainer` where a plugin asked for it. `None` when it
    /// has no devices.
    pub async fn run_options(
        &self,
        pod_uid: &str,
        container: &str,
    ) -> Result<Option<RunOptions>, String> {
        let (devices, endpoints) = {
            let state = self.lock();
            let Some(devices) = state
                .pod_devices
                .get(&(pod_uid.to_owned(), container.to_owned()))
                .cloned()
            else {
                return Ok(None);
            };
            let endpoints: BTreeMap<String, Option<Arc<dyn Endpoint>>> = devices
                .keys()
                .map(|r| {
                    (
                        r.clone(),
                        state.resources.get(r).and_then(|r| r.endpoint.clone()),
                    )
                })
                .collect();
            (devices, endpoints)
        };
        let mut out = RunOptions::default();
        let mut mount_paths = BTreeSet::new();
        let mut device_paths = BTreeSet::new();
        for (resource, d) in &devices {
            if let Some(Some(endpoint)) = endpoints.get(resource)
                && endpoint.options().pre_start_required
            {
                endpoint
                    .pre_start(d.ids().into_iter().collect())
                    .await
                    .map_err(|e| format!("{resource}: {e}"))?;
            }
            let r = &d.response;
            for (k, v) in &r.envs {
                if let Some(old) = out.envs.get(k)
                    && old != v
                {
                    tracing::warn!(env = %k, "two device resources set the same variable; the first one stays");
                    continue;
                }
                out.envs.insert(k.clone(), v.clone());
            }
            for m in &r.mounts {
                if mount_paths.insert(m.container_path.clone()) {
                    out.mounts.push(m.clone());
                }
            }
            for dev in &r.devices {
                if device_paths.insert(dev.container_path.clone()) {
                    out.devices.push(dev.clone());
                }
            }
            for (k, v) in &r.annotations {
                out.annotations
                    .entry(k.clone())
                    .or_insert_with(|| v.clone());
            }
            for cdi in &r.cdi_devices {
                if !out.cdi_devices.contains(&cdi.name) {
                    out.cdi_devices.push(cdi.name.clone());
                }
            }
        }
        Ok(Some(out))
    }

    /// Hints for `needed` devices of `resource`, the kubelet's
    /// `generateDeviceTopologyHints`.
    fn device_hints(
        &self,
        state: &State,
        resource: &str,
        available: &BTreeSet<String>,
        reusable: &BTreeSet<String>,
        needed: usize,
    ) -> Vec<TopologyHint> {
        let numa = |id: &str| BitMask::new(&state.numa_of(resource, id));
        let all: Vec<String> = state
            .resources
            .get(resource)
            .map(|r| r.devices.keys().cloned().collect())
            .unwrap_or_default();
        let mut min_size = self.inner.numa_nodes.len() as u32;
        let mut hints = Vec::new();
        'masks: for mask in all_masks(&self.inner.numa_nodes) {
            let in_mask = |id: &str| !numa(id).and(mask).is_empty();
            let total = all.iter().filter(|id| in_mask(id)).count();
            if total >= needed && mask.count() < min_size {
                min_size = mask.count();
            }
            let mut matching = 0;
            for id in reusable {
                if state.numa_of(resource, id).is_empty() {
                    continue;
                }
                if !in_mask(id) {
                    continue 'masks;
                }
                matching += 1;
            }
            matching += available.iter().filter(|id| in_mask(id)).count();
            if matching >= needed {
                hints.push(TopologyHint {
                    affinity: Some(mask),
                    preferred: false,
                });
            }
        }
        for h in &mut hints {
            h.preferred = h.affinity.is_some_and(|m| m.count() == min_size);
        }
        hints
    }

    /// Hints for one container's (or, with `pod_level`, the whole pod's) device
    /// resources.
    fn hints(&self, pod: &Pod, container: Option<&Container>) -> ProviderHints {
        let state = self.lock();
        let mut out = ProviderHints::new();
        let resources: BTreeSet<String> = match container {
            Some(c) => requested_resources(std::slice::from_ref(c)),
            None => {
                let spec = pod.spec.clone().unwrap_or_default();
                let mut all = spec.containers;
                all.extend(spec.init_containers.unwrap_or_default());
                requested_resources(&all)
            }
        };
        for resource in resources {
            if !state.resources.contains_key(&resource) {
                continue;
            }
            let needed = match container {
                Some(c) => container_request(c, &resource).unwrap_or(0),
                None => pod_request(pod, &resource),
            };
            let needed = usize::try_from(needed).unwrap_or(0);
            if needed == 0 {
                continue;
            }
            if !state.has_topology(&resource) {
                out.insert(resource, None);
                continue;
            }
            // Already allocated (a restart, or a container started again): hints
            // that keep what it has.
            let held: BTreeSet<String> = match container {
                Some(c) => state
                    .pod_devices
                    .get(&(uid(pod).to_owned(), c.name.clone()))
                    .and_then(|r| r.get(&resource))
                    .map(ContainerDevices::ids)
                    .unwrap_or_default(),
                None => state
                    .pod_devices
                    .iter()
                    .filter(|((p, _), _)| p == uid(pod))
                    .filter_map(|(_, r)| r.get(&resource))
                    .flat_map(ContainerDevices::ids)
                    .collect(),
            };
            if !held.is_empty() {
                if held.len() != needed {
                    out.insert(resource, Some(Vec::new()));
                    continue;
                }
                let hints = self.device_hints(&state, &resource, &held, &BTreeSet::new(), needed);
                out.insert(resource, Some(hints));
                continue;
            }
            let reusable = match container {
                Some(c) => state.reusable(pod, &resource, &c.name),
                None => BTreeSet::new(),
            };
            let allocated = state.allocated(&resource);
            let available: BTreeSet<String> = state
                .healthy(&resource)
                .difference(&allocated)
                .filter(|id| !reusable.contains(*id))
                .cloned()
                .collect();
            if available.len() + reusable.len() < needed {
                tracing::warn!(
                    resource,
                    needed,
                    available = available.len() + reusable.len(),
                    "not enough devices to generate topology hints"
                );
                out.insert(resource, Some(Vec::new()));
                continue;
            }
            let hints = self.device_hints(&state, &resource, &available, &reusable, needed);
            out.insert(resource, Some(hints));
        }
        out
    }

    /// Picks and allocates the container's devices of every device resource it asks
    /// for (the kubelet's `allocateContainerResources`).
    pub async fn allocate_container(
        &self,
        pod: &Pod,
        c: &Container,
        hint: TopologyHint,
    ) -> Result<(), String> {
        let pod_uid = uid(pod).to_owned();
        for resource in requested_resources(std::slice::from_ref(c)) {
            if !self.is_device_resource(&resource) {
                continue;
            }
            let needed = usize::try_from(container_request(c, &resource).unwrap_or(0)).unwrap_or(0);
            if needed == 0 {
                continue;
            }
            let (input, endpoint) = {
                let state = self.lock();
                if let Some(held) = state
                    .pod_devices
                    .get(&(pod_uid.clone(), c.name.clone()))
                    .and_then(|r| r.get(&resource))
                {
                    let held = held.ids().len();
                    if held != needed {
                        return Err(format!(
                            "pod {pod_uid:?} container {:?} changed request for resource {resource:?} from {held} to {needed}",
                            c.name
                        ));
                    }
                    continue;
                }
                let Some(endpoint) = state
                    .resources
                    .get(&resource)
                    .and_then(|r| r.endpoint.clone())
                else {
                    return Err(format!(
                        "no device plugin serves {resource} (it is not registered or went away)"
                    ));
                };
                let reusable = state.reusable(pod, &resource, &c.name);
                let allocated = state.allocated(&resource);
                let available: BTreeSet<String> = state
                    .healthy(&resource)
                    .difference(&allocated)
                    .cloned()
                    .collect();
                let reuse: Vec<String> = reusable.iter().take(needed).cloned().collect();
                let still = needed - reuse.len();
                if available.len() < still {
                    return Err(format!(
                        "requested number of devices unavailable for {resource}. Requested: {still}, Available: {}",
                        available.len()
                    ));
                }
                let (ordered, aligned) =
                    self.order_by_affinity(&state, &resource, &available, hint);
                (
                    PickInput {
                        reuse,
                        ordered,
                        aligned,
                        still,
                    },
                    endpoint,
                )
            };
            let picked = pick(&resource, &input, &*endpoint, needed).await?;
            let response = endpoint.allocate(picked.clone()).await?;
            let mut state = self.lock();
            // Another allocation may have taken one of them meanwhile.
            let allocated = state.allocated(&resource);
            if let Some(taken) = picked
                .iter()
                .find(|id| allocated.contains(*id) && !input.reuse.contains(*id))
            {
                return Err(format!("device {taken} of {resource} was allocated twice"));
            }
            let mut by_numa: BTreeMap<i64, Vec<String>> = BTreeMap::new();
            for id in &picked {
                let numa = state.numa_of(&resource, id);
                let key = numa.first().map_or(-1, |n| i64::from(*n));
                by_numa.entry(key).or_default().push(id.clone());
            }
            tracing::info!(pod = %crate::pod::full_name(pod), container = %c.name, resource, devices = ?picked, "devices allocated");
            state
                .pod_devices
                .entry((pod_uid.clone(), c.name.clone()))
                .or_default()
                .insert(resource.clone(), ContainerDevices { by_numa, response });
            self.checkpoint_now(&state);
        }
        Ok(())
    }

    /// The available devices, those within the hint's NUMA nodes first, then those
    /// with no NUMA node, then the rest; and how many lead the list as aligned with
    /// the hint (all of them without one).
    fn order_by_affinity(
        &self,
        state: &State,
        resource: &str,
        available: &BTreeSet<String>,
        hint: TopologyHint,
    ) -> (Vec<String>, usize) {
        let Some(affinity) = hint.affinity else {
            return (available.iter().cloned().collect(), available.len());
        };
        let (mut aligned, mut none, mut unaligned) = (Vec::new(), Vec::new(), Vec::new());
        for id in available {
            let numa = state.numa_of(resource, id);
            if numa.is_empty() {
                none.push(id.clone());
            } else if numa.iter().any(|n| affinity.is_set(*n)) {
                aligned.push(id.clone());
            } else {
                unaligned.push(id.clone());
            }
        }
        let count = aligned.len();
        aligned.extend(none);
        aligned.extend(unaligned);
        (aligned, count)
    }

    /// Forgets the pod's allocations.
    pub fn remove_pod_devices(&self, pod_uid: &str) {
        let mut state = self.lock();
        let before = state.pod_devices.len();
        state.pod_devices.retain(|(p, _), _| p != pod_uid);
        if state.pod_devices.len() != before {
            self.checkpoint_now(&state);
        }
    }
}

/// What [`pick`] chooses from.
struct PickInput {
    /// Devices of earlier init containers this container takes over.
    reuse: Vec<String>,
    /// Free devices, those aligned with the admitted hint first.
    ordered: Vec<String>,
    /// How many of `ordered` are aligned.
    aligned: usize,
    /// How many of `ordered` are needed besides `reuse`.
    still: usize,
}

/// The devices for a container, as the kubelet's `devicesToAllocate` picks them:
/// when the aligned devices suffice, only they are offered (to the plugin's
/// `GetPreferredAllocation`, if it has one; else the first of them are taken);
/// otherwise every aligned device is taken and the plugin chooses the rest. An
/// answer that is not usable (wrong size, unknown or repeated ids, a required device
/// left out) falls back to the ordered pick; a failed call fails the allocation.
async fn pick(
    resource: &str,
    input: &PickInput,
    endpoint: &dyn Endpoint,
    needed: usize,
) -> Result<Vec<String>, String> {
    if input.still == 0 {
        return Ok(input.reuse.clone());
    }
    let (offered, must): (Vec<String>, Vec<String>) = if input.aligned >= input.still {
        let mut offered = input.reuse.clone();
        offered.extend(input.ordered[..input.aligned].iter().cloned());
        (offered, input.reuse.clone())
    } else {
        let mut must = input.reuse.clone();
        must.extend(input.ordered[..input.aligned].iter().cloned());
        let mut offered = must.clone();
        offered.extend(input.ordered[input.aligned..].iter().cloned());
        (offered, must)
    };
    let fallback = || -> Vec<String> {
        let mut ids = must.clone();
        ids.extend(
            offered
                .iter()
                .filter(|id| !must.contains(id))
                .take(needed.saturating_sub(must.len()))
                .cloned(),
        );
        ids
    };
    if !endpoint.options().get_preferred_allocation_available {
        return Ok(fallback());
    }
    let ids = endpoint
        .preferred_allocation(offered.clone(), must.clone(), needed)
        .await
        .map_err(|e| format!("device plugin GetPreferredAllocation rpc failed with err: {e}"))?;
    let unique: BTreeSet<&String> = ids.iter().collect();
    let sane = ids.len() == needed
        && unique.len() == ids.len()
        && ids.iter().all(|id| offered.contains(id))
        && must.iter().all(|id| ids.contains(id));
    if sane {
        Ok(ids)
    } else {
        tracing::warn!(resource, answer = ?ids, "the plugin's preferred allocation is not usable; picking in order");
        Ok(fallback())
    }
}

/// The extended resources the containers ask for (limits, as device resources
/// cannot be overcommitted, or requests).
fn requested_resources(containers: &[Container]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for c in containers {
        let Some(r) = &c.resources else { continue };
        for map in [&r.limits, &r.requests].into_iter().flatten() {
            out.extend(
                map.keys()
                    .filter(|k| crate::resources::is_extended(k))
                    .cloned(),
            );
        }
    }
    out
}

fn registered(state: &State) -> BTreeMap<String, Vec<String>> {
    state
        .resources
        .iter()
        .map(|(name, r)| (name.clone(), r.devices.keys().cloned().collect()))
        .collect()
}

#[async_trait::async_trait]
impl HintProvider for DeviceManager {
    fn container_hints(&self, pod: &Pod, container: &Container) -> ProviderHints {
        self.hints(pod, Some(container))
    }

    fn pod_hints(&self, pod: &Pod) -> ProviderHints {
        self.hints(pod, None)
    }

    async fn allocate(
        &self,
        pod: &Pod,
        container: &Container,
        hint: TopologyHint,
    ) -> Result<(), String> {
        self.allocate_container(pod, container, hint).await
    }

    fn remove_pod(&self, pod_uid: &str) {
        self.remove_pod_devices(pod_uid);
    }

    fn retain_pods(&self, active: &HashSet<String>) {
        DeviceManager::retain_pods(self, active);
    }
}

/// Devices from a `ListAndWatch` answer.
pub fn devices_from_plugin(devices: Vec<api::Device>) -> BTreeMap<String, DeviceInfo> {
    devices
        .into_iter()
        .map(|d| {
            let numa = d
                .topology
                .map(|t| {
                    t.nodes
                        .iter()
                        .filter_map(|n| u32::try_from(n.id).ok())
                        .collect()
                })
                .unwrap_or_default();
            (
                d.id,
                DeviceInfo {
                    healthy: d.health == HEALTHY,
                    numa,
                },
            )
        })
        .collect()
}

/// Starts a Wasm device adapter as a resource: its devices are discovered now and
/// then every `period`; a failing adapter has its devices unhealthy, with a Node
/// event.
pub fn start_wasm_adapter(
    manager: &DeviceManager,
    host: wasmlet_plugin_host::PluginHost,
    plugin: String,
    allowed: Vec<PathBuf>,
    period: Duration,
) -> Option<tokio::task::JoinHandle<()>> {
    let Some(resource) = host.resource_name(&plugin) else {
        tracing::error!(
            plugin,
            "device adapter has no resource name; it is not used"
        );
        return None;
    };
    if !valid_resource_name(&resource) {
        tracing::error!(
            plugin,
            resource,
            "device adapter's resource name is not an extended resource name; it is not used"
        );
        return None;
    }
    let endpoint = Arc::new(endpoint::WasmEndpoint {
        host: host.clone(),
        plugin: plugin.clone(),
        allowed,
    });
    let generation = manager.connect(&resource, endpoint);
    let manager = manager.clone();
    let cancel = manager.cancel_token();
    tracing::info!(plugin, resource, "device adapter serves its resource");
    Some(tokio::spawn(async move {
        let mut failing = false;
        loop {
            let devices = match host.try_discover(&plugin).await {
                Ok(devices) => {
                    if failing {
                        tracing::info!(plugin, "device adapter answers again");
                    }
                    failing = false;
                    devices
                }
                Err(e) => {
                    if !failing {
                        manager.node_warning(
                            "DeviceAdapterFailed",
                            &format!("device adapter {plugin} ({resource}) failed, its devices are unhealthy: {e}"),
                        );
                    }
                    failing = true;
                    host.discover(&plugin).await
                }
            };
            let devices = devices
                .into_iter()
                .map(|d| {
                    (
                        d.id,
                        DeviceInfo {
                            healthy: d.healthy && !failing,
                            numa: d.numa_node.into_iter().collect(),
                        },
                    )
                })
                .collect();
            manager.update_devices(&resource, generation, devices);
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(period) => {}
            }
        }
    }))
}

#[cfg(test)]
mod tests;
