//! [`PluginHost`]: loads plugins, calls them under their limits, applies the
//! failure policies and keeps the metrics.

use std::collections::BTreeMap;
use std::future::Future;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use wasmtime::component::{Component, HasSelf, InstancePre, Linker};
use wasmtime::{Engine, Store, UpdateDeadline};

use crate::bindings::admission::{self, AdmissionPlugin};
use crate::bindings::device_adapter::{self, DeviceAdapterPlugin};
use crate::bindings::eviction::{self, EvictionPlugin};
use crate::bindings::probe::{self, ProbePlugin};
use crate::config::{FailurePolicy, MAX_TIMEOUT, PluginConfig, PluginSource, World};
use crate::engine::{self, EpochTicker};
use crate::error::{CallError, Error, Result};
use crate::health::{BackoffPolicy, Health, Transition};
use crate::metrics::{self, PluginMetrics};
use crate::network::PodNetwork;
use crate::state::{CallState, MemoryCapExceeded};
use crate::types::{
    Allocation, Candidate, Decision, Denial, Device, EncodedSize, NodeState, Pair, PodInfo,
    ProbeRequest, ProbeResult,
};
use crate::{policy, results};
/// Added to a call's deadline before the host gives up on a call that does not
/// return (a host import stuck past its own deadline); the epoch deadline normally
/// ends the call first.
const DEADLINE_GRACE: Duration = Duration::from_millis(250);

/// Where the node hears about plugins being disabled, enabled and reloaded.
pub type EventSink = Arc<dyn Fn(PluginEvent) + Send + Sync>;

/// Something the node may turn into a Kubernetes event or a log line.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginEvent {
    pub plugin: String,
    pub kind: PluginEventKind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum PluginEventKind {
    /// Consecutive failures disabled the plugin for `backoff`.
    Disabled {
        failures: u32,
        backoff: Duration,
        last_error: CallError,
    },
    /// A call after a disable succeeded: the plugin is enabled again.
    Enabled,
    /// The plugin's file changed and the new version replaced the old one.
    Reloaded,
    /// The plugin's file changed but the new version cannot be loaded; the old one
    /// keeps running.
    ReloadFailed { error: String },
}

/// How a [`PluginHost`] is set up.
#[derive(Clone)]
pub struct HostOptions {
    /// Plugin instances alive at once, all plugins together; the pool is sized for
    /// it and further calls wait for a free slot until their deadline [default: 64].
    pub max_instances: u32,
    /// The highest `limits.memoryBytes` a plugin may have [default: 256 MiB].
    pub max_memory_bytes: u64,
    /// How often the epoch advances: the granularity of call deadlines, and how
    /// often a running plugin yields to the async runtime [default: 2 ms].
    pub epoch_tick: Duration,
    /// When failures disable a plugin.
    pub backoff: BackoffPolicy,
    /// Told about disables, enables and reloads [default: they are only logged].
    pub events: Option<EventSink>,
    /// Keep one instance of each plugin made ahead of its next call, so that the
    /// call does not wait for the instantiation (each call still gets an instance
    /// of its own, used once). Such instances take at most a quarter of
    /// `max_instances` [default: true].
    pub warm_instances: bool,
    /// How much of a used plugin memory (and table) the pool resets by rewriting
    /// its dirty pages, which stay resident for the next instance, rather than by
    /// `madvise`, which the next instance faults back in; at most this much per
    /// slot stays resident [default: 1 MiB; 0: `madvise` only].
    pub keep_resident_bytes: usize,
}

impl Default for HostOptions {
    fn default() -> Self {
        HostOptions {
            max_instances: 64,
            max_memory_bytes: 256 << 20,
            epoch_tick: Duration::from_millis(2),
            backoff: BackoffPolicy::default(),
            events: None,
            warm_instances: true,
            keep_resident_bytes: 1 << 20,
        }
    }
}

impl std::fmt::Debug for HostOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostOptions")
            .field("max_instances", &self.max_instances)
            .field("max_memory_bytes", &self.max_memory_bytes)
            .field("epoch_tick", &self.epoch_tick)
            .field("backoff", &self.backoff)
            .field("events", &self.events.is_some())
            .field("warm_instances", &self.warm_instances)
            .field("keep_resident_bytes", &self.keep_resident_bytes)
            .finish()
    }
}

/// A loaded plugin as [`PluginHost::plugins`] lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginInfo {
    pub name: String,
    pub world: World,
    pub source: PluginSource,
    /// `Some` while calls are refused after repeated failures.
    pub disabled_until: Option<Instant>,
    pub consecutive_failures: u32,
    /// How many times the component was replaced since it was loaded.
    pub reloads: u64,
    /// For a device adapter, its `resource-name`.
    pub resource_name: Option<String>,
    pub metrics: PluginMetrics,
}

/// The node's plugins: one engine, one pool, and every loaded plugin pre-linked.
///
/// Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct PluginHost {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Engine,
    linkers: Linkers,
    plugins: RwLock<BTreeMap<String, Arc<Entry>>>,
    /// One permit per instance alive, in a call or made ahead of one.
    slots: Arc<Semaphore>,
    /// One permit per instance made ahead of a call (a quarter of the slots, none
    /// when `warm_instances` is off).
    warm_slots: Arc<Semaphore>,
    backoff: BackoffPolicy,
    max_memory_bytes: u64,
    epoch_tick: Duration,
    events: Option<EventSink>,
    /// Woken when the set of plugins changes (the watcher re-reads what to watch).
    pub(crate) changed: Notify,
    _ticker: EpochTicker,
}

struct Linkers {
    probe: Linker<CallState>,
    admission: Linker<CallState>,
    eviction: Linker<CallState>,
    device_adapter: Linker<CallState>,
}

/// One loaded plugin.
struct Entry {
    name: Arc<str>,
    config: Arc<PluginConfig>,
    settings: Arc<Vec<Pair>>,
    current: RwLock<Arc<Loaded>>,
    state: Mutex<EntryState>,
}

#[derive(Default)]
struct EntryState {
    health: Health,
    metrics: PluginMetrics,
    reloads: u64,
    /// A device adapter's last `discover` answer, reported unhealthy when it fails.
    devices: Vec<Device>,
    /// A device adapter's `resource-name`.
    resource_name: Option<String>,
}

/// A compiled, pre-linked version of a plugin.
struct Loaded {
    pre: Pre,
    digest: u64,
    /// The instance of this version made ahead of its next call.
    warm: Mutex<Warm>,
}

/// A version's instance made ahead of a call.
#[derive(Default)]
enum Warm {
    #[default]
    None,
    /// Being instantiated.
    Filling,
    Ready(Box<Prepared>),
}

/// An instance in a store of its own, with the pool slot it occupies.
struct Prepared {
    store: Store<CallState>,
    exports: Exports,
    slot: OwnedSemaphorePermit,
    _warm_slot: OwnedSemaphorePermit,
}

/// One instance's exports, of whichever world.
enum Exports {
    Probe(ProbePlugin),
    Admission(AdmissionPlugin),
    Eviction(EvictionPlugin),
    DeviceAdapter(DeviceAdapterPlugin),
}

enum Pre {
    Probe(probe::ProbePluginPre<CallState>),
    Admission(admission::AdmissionPluginPre<CallState>),
    Eviction(eviction::EvictionPluginPre<CallState>),
    DeviceAdapter(device_adapter::DeviceAdapterPluginPre<CallState>),
}

/// A plugin world as the host links, pre-links and instantiates it, implemented by
/// the world's `bindgen!` bindings (a value is one instance's exports). The call
/// path ([`PluginHost::run`], [`PluginHost::call`]) is written once against it.
trait PluginWorld: Sized {
    /// The world pre-linked for one component (`bindgen!`'s `…PluginPre`).
    type Pre;

    /// Adds the world's imports of the plugin ABI to a linker that has WASI.
    fn add_imports(linker: &mut Linker<CallState>) -> wasmtime::Result<()>;
    /// The host's linker for the world.
    fn linker(linkers: &Linkers) -> &Linker<CallState>;
    /// Finds the world's exports in a pre-linked component.
    fn new_pre(pre: InstancePre<CallState>) -> wasmtime::Result<Pre>;
    /// The world's pre-link in `pre`; an error if `pre` is of another world.
    fn pre(pre: &Pre) -> wasmtime::Result<&Self::Pre>;
    /// A fresh instance in `store`.
    fn instantiate(
        pre: &Self::Pre,
        store: &mut Store<CallState>,
    ) -> impl Future<Output = wasmtime::Result<Self>> + Send;
    /// The world's exports in `exports`; `None` if they are of another world.
    fn from_exports(exports: Exports) -> Option<Self>;
}

/// Implements [`PluginWorld`] for each world's bindings `$module::$bindings`: the
/// world's pre-link is `$module::$pre`, kept as `Pre::$world`, its linker is
/// `Linkers::$module`, and `$other` is the error when it is asked of a plugin of
/// another world.
macro_rules! plugin_worlds {
    ($($world:ident: $module:ident::$bindings:ident, $pre:ident, $other:literal;)*) => {$(
        impl PluginWorld for $module::$bindings {
            type Pre = $module::$pre<CallState>;

            fn add_imports(linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
                $module::$bindings::add_to_linker::<_, HasSelf<CallState>>(linker, |s| s)
            }

            fn linker(linkers: &Linkers) -> &Linker<CallState> {
                &linkers.$module
            }

            fn new_pre(pre: InstancePre<CallState>) -> wasmtime::Result<Pre> {
                $module::$pre::new(pre).map(Pre::$world)
            }

            fn pre(pre: &Pre) -> wasmtime::Result<&Self::Pre> {
                match pre {
                    Pre::$world(p) => Ok(p),
                    _ => Err(wasmtime::format_err!($other)),
                }
            }

            fn instantiate(
                pre: &Self::Pre,
                store: &mut Store<CallState>,
            ) -> impl Future<Output = wasmtime::Result<Self>> + Send {
                pre.instantiate_async(store)
            }

            fn from_exports(exports: Exports) -> Option<Self> {
                match exports {
                    Exports::$world(e) => Some(e),
                    _ => None,
                }
            }
        }
    )*};
}

plugin_worlds! {
    Probe: probe::ProbePlugin, ProbePluginPre, "not a probe plugin";
    Admission: admission::AdmissionPlugin, AdmissionPluginPre, "not an admission plugin";
    Eviction: eviction::EvictionPlugin, EvictionPluginPre, "not an eviction plugin";
    DeviceAdapter: device_adapter::DeviceAdapterPlugin, DeviceAdapterPluginPre,
        "not a device adapter plugin";
}

/// Marks an error as raised while instantiating, not while calling.
#[derive(Debug, thiserror::Error)]
#[error("instantiating the plugin")]
struct Instantiating;

/// The epoch callback's trap when the call's deadline has passed.
#[derive(Debug, thiserror::Error)]
#[error("the call's deadline passed")]
struct DeadlineExceeded;

fn digest(bytes: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

impl PluginHost {
    /// Builds the engine and its pool and starts the epoch ticker (a thread, stopped
    /// when the last clone of the host is dropped).
    pub fn new(options: HostOptions) -> Result<Self> {
        let engine = engine::engine(
            options.max_instances,
            options.max_memory_bytes,
            options.keep_resident_bytes,
        )?;
        let warm_slots = if options.warm_instances {
            options.max_instances as usize / 4
        } else {
            0
        };
        let linkers = Linkers::new(&engine)?;
        let ticker = EpochTicker::start(engine.clone(), options.epoch_tick)?;
        Ok(PluginHost {
            inner: Arc::new(Inner {
                engine,
                linkers,
                plugins: RwLock::new(BTreeMap::new()),
                slots: Arc::new(Semaphore::new(options.max_instances as usize)),
                warm_slots: Arc::new(Semaphore::new(warm_slots)),
                backoff: options.backoff,
                max_memory_bytes: options.max_memory_bytes,
                epoch_tick: options.epoch_tick,
                events: options.events,
                changed: Notify::new(),
                _ticker: ticker,
            }),
        })
    }

    /// Loads a plugin whose source is a file: reads, validates, compiles and
    /// pre-links it. An image source is an error: the node resolves images and
    /// calls [`load_bytes`](Self::load_bytes).
    pub async fn load(&self, config: PluginConfig) -> Result<()> {
        let PluginSource::File(path) = &config.source else {
            return Err(Error::ImageSource(config.name));
        };
        let bytes = read(&config.name, path).await?;
        self.load_bytes(config, bytes).await
    }

    /// Loads a plugin from its component's bytes (whatever its configured source).
    pub async fn load_bytes(&self, config: PluginConfig, bytes: Vec<u8>) -> Result<()> {
        let errors = config.validate(self.inner.max_memory_bytes);
        if !errors.is_empty() {
            return Err(Error::InvalidConfig(errors));
        }
        for grant in &config.grants.filesystem {
            if !grant.host_path.is_dir() {
                return Err(Error::InvalidConfig(vec![crate::ConfigError {
                    field: "grants.filesystem.hostPath".into(),
                    message: format!("{} is not a directory", grant.host_path.display()),
                }]));
            }
        }
        if self.lock_plugins().contains_key(&config.name) {
            return Err(Error::AlreadyLoaded(config.name));
        }
        let name: Arc<str> = config.name.as_str().into();
        let settings = Arc::new(
            config
                .settings
                .iter()
                .map(|(k, v)| Pair {
                    key: k.clone(),
                    value: v.clone(),
                })
                .collect(),
        );
        let loaded = Arc::new(self.compile(&config, bytes).await?);
        let partial = Entry {
            name,
            settings,
            current: RwLock::new(loaded.clone()),
            state: Mutex::new(EntryState::default()),
            config: Arc::new(config),
        };
        partial.lock().resource_name = self.init(&partial, loaded).await?;
        let name = partial.config.name.clone();
        {
            let mut plugins = self.lock_plugins_mut();
            if plugins.contains_key(&name) {
                return Err(Error::AlreadyLoaded(name));
            }
            let entry = Arc::new(partial);
            self.prepare(&entry, entry.loaded(), None);
            plugins.insert(name.clone(), entry);
        }
        self.inner.changed.notify_one();
        tracing::info!(plugin = %name, "plugin loaded");
        Ok(())
    }

    /// Unloads a plugin; calls in flight finish on the version they started with.
    pub fn unload(&self, name: &str) -> Result<()> {
        self.lock_plugins_mut()
            .remove(name)
            .ok_or_else(|| Error::NotLoaded(name.to_string()))?;
        self.inner.changed.notify_one();
        tracing::info!(plugin = name, "plugin unloaded");
        Ok(())
    }

    /// Re-reads a file plugin and swaps the new version in if it changed. Returns
    /// whether it did. On error the old version stays and a
    /// [`ReloadFailed`](PluginEventKind::ReloadFailed) event is sent.
    pub async fn reload(&self, name: &str) -> Result<bool> {
        let entry = self
            .entry(name)
            .ok_or_else(|| Error::NotLoaded(name.into()))?;
        let PluginSource::File(path) = &entry.config.source else {
            return Err(Error::NotAFile(name.into()));
        };
        let result = match read(name, path).await {
            Ok(bytes) => self.reload_bytes_of(&entry, bytes).await,
            Err(e) => Err(e),
        };
        if let Err(e) = &result {
            tracing::warn!(
                plugin = name,
                "reload failed, the old version keeps running: {e}"
            );
            self.emit(
                &entry.name,
                PluginEventKind::ReloadFailed {
                    error: e.to_string(),
                },
            );
        }
        result
    }

    /// Replaces a plugin's component with `bytes` (e.g. a new image version).
    pub async fn reload_bytes(&self, name: &str, bytes: Vec<u8>) -> Result<bool> {
        let entry = self
            .entry(name)
            .ok_or_else(|| Error::NotLoaded(name.into()))?;
        self.reload_bytes_of(&entry, bytes).await
    }

    async fn reload_bytes_of(&self, entry: &Arc<Entry>, bytes: Vec<u8>) -> Result<bool> {
        if entry.loaded().digest == digest(&bytes) {
            return Ok(false);
        }
        let loaded = Arc::new(self.compile(&entry.config, bytes).await?);
        let resource_name = self.init(entry, loaded.clone()).await?;
        *entry.current.write().unwrap_or_else(|e| e.into_inner()) = loaded.clone();
        self.prepare(entry, loaded, None);
        let mut state = entry.lock();
        state.reloads += 1;
        state.resource_name = resource_name;
        drop(state);
        tracing::info!(plugin = %entry.name, "plugin reloaded");
        self.emit(&entry.name, PluginEventKind::Reloaded);
        Ok(true)
    }

    /// Compiles and pre-links `bytes` for `entry`'s world, checking that the
    /// component exports the world's interface at version 0.1.0 and imports nothing
    /// the world does not offer.
    async fn compile(&self, config: &PluginConfig, bytes: Vec<u8>) -> Result<Loaded> {
        let name = config.name.clone();
        let world = config.world;
        let invalid = |reason: String| Error::InvalidComponent {
            name: name.clone(),
            reason,
        };
        let wrong = |reason: String| Error::WrongWorld {
            name: name.clone(),
            world,
            reason,
        };
        if bytes.len() >= 8 && bytes[..4] == *b"\0asm" && bytes[4..8] == [1, 0, 0, 0] {
            return Err(invalid(
                "this is a core module, not a component (componentize it, e.g. with the preview 1 adapter)".into(),
            ));
        }
        let digest = digest(&bytes);
        let engine = self.inner.engine.clone();
        let component = tokio::task::spawn_blocking(move || Component::new(&engine, &bytes))
            .await
            .map_err(|e| invalid(format!("compilation panicked: {e}")))?
            .map_err(|e| invalid(format!("{e:#}")))?;
        let exports: Vec<String> = component
            .component_type()
            .exports(&self.inner.engine)
            .map(|(name, _)| name.to_string())
            .collect();
        if !exports.iter().any(|e| e == world.export()) {
            return Err(wrong(format!(
                "it does not export {} (it exports: {})",
                world.export(),
                if exports.is_empty() {
                    "nothing".to_string()
                } else {
                    exports.join(", ")
                }
            )));
        }
        let linkers = &self.inner.linkers;
        let link_err = |e: wasmtime::Error| {
            wrong(format!(
                "it imports something the {} world does not offer: {e:#}",
                world.as_str()
            ))
        };
        let pre = match world {
            World::Probe => pre_link::<ProbePlugin>(linkers, &component, link_err, &wrong),
            World::Admission => pre_link::<AdmissionPlugin>(linkers, &component, link_err, &wrong),
            World::Eviction => pre_link::<EvictionPlugin>(linkers, &component, link_err, &wrong),
            World::DeviceAdapter => {
                pre_link::<DeviceAdapterPlugin>(linkers, &component, link_err, &wrong)
            }
        }?;
        Ok(Loaded {
            pre,
            digest,
            warm: Mutex::default(),
        })
    }

    /// What a new version is asked once, before it is used: a device adapter's
    /// resource name (fixed for a version).
    async fn init(&self, entry: &Entry, loaded: Arc<Loaded>) -> Result<Option<String>> {
        if entry.config.world != World::DeviceAdapter {
            return Ok(None);
        }
        let resource = self
            .run(
                entry,
                loaded,
                entry.config.limits.timeout(),
                None,
                async |p: &DeviceAdapterPlugin, store| {
                    p.wasmlet_plugin_device_adapter()
                        .call_resource_name(store)
                        .await
                },
            )
            .await
            .and_then(|name| {
                if name.is_empty() || name.len() > 253 || !name.contains('/') {
                    Err(CallError::InvalidResult(format!(
                        "resource-name {:?} is not an extended resource name (domain/name)",
                        crate::state::cut(&name, 256)
                    )))
                } else {
                    Ok(name)
                }
            })
            .map_err(|source| Error::Init {
                name: entry.config.name.clone(),
                source,
            })?;
        Ok(Some(resource))
    }

    // ----- calls -----

    /// Runs a probe plugin's `check`; any failure is a failed probe with the error
    /// as its message (the probe world's failure policy).
    pub async fn probe(&self, name: &str, request: ProbeRequest) -> ProbeResult {
        match self.try_probe(name, request).await {
            Ok(r) => r,
            Err(e) => ProbeResult::Failure(format!("probe plugin {name}: {e}")),
        }
    }

    /// Runs a probe plugin's `check`. The deadline is the request's `timeout-ms`
    /// (the plugin's `limits.timeoutMillis` when 0, at most 60 s); `pod-network`
    /// reaches the request's `pod-ips` only.
    pub async fn try_probe(
        &self,
        name: &str,
        request: ProbeRequest,
    ) -> Result<ProbeResult, CallError> {
        let entry = self.callable(name, World::Probe)?;
        let timeout = if request.timeout_ms > 0 {
            Duration::from_millis(request.timeout_ms.into()).min(MAX_TIMEOUT)
        } else {
            entry.config.limits.timeout()
        };
        let network = Some(request.pod_ips.clone());
        self.call(
            &entry,
            timeout,
            network,
            async |p: &ProbePlugin, store| {
                p.wasmlet_plugin_probe().call_check(store, &request).await
            },
            |_| Ok(()),
        )
        .await
    }

    /// Asks an admission plugin about `pod`, applying its `failurePolicy` when the
    /// call fails: `Fail` denies with reason `PluginError`, `Ignore` admits.
    pub async fn admit(&self, name: &str, pod: PodInfo, node: NodeState) -> Decision {
        match self.try_admit(name, pod, node).await {
            Ok(d) => d,
            Err(e) => {
                let policy = self
                    .entry(name)
                    .map(|e| e.config.failure_policy())
                    .unwrap_or_default();
                match policy {
                    FailurePolicy::Ignore => {
                        tracing::warn!(
                            plugin = name,
                            "admission plugin failed, admitting (failurePolicy Ignore): {e}"
                        );
                        Decision::Admit
                    }
                    FailurePolicy::Fail => Decision::Deny(Denial {
                        reason: "PluginError".into(),
                        message: format!("admission plugin {name} failed: {e}"),
                    }),
                }
            }
        }
    }

    /// Asks an admission plugin about `pod`.
    pub async fn try_admit(
        &self,
        name: &str,
        pod: PodInfo,
        node: NodeState,
    ) -> Result<Decision, CallError> {
        let entry = self.callable(name, World::Admission)?;
        self.call(
            &entry,
            entry.config.limits.timeout(),
            None,
            async |p: &AdmissionPlugin, store| {
                p.wasmlet_plugin_admission()
                    .call_admit(store, &pod, &node)
                    .await
            },
            results::admission,
        )
        .await
    }

    /// Ranks eviction candidates, first to evict first: every index of `candidates`
    /// once. The plugin's order comes first, the ones it left out follow in the
    /// built-in order; if the call fails, the whole order is the built-in one.
    pub async fn rank(&self, name: &str, signal: &str, candidates: &[Candidate]) -> Vec<u32> {
        match self.try_rank(name, signal, candidates).await {
            Ok(order) => order,
            Err(e) => {
                tracing::warn!(
                    plugin = name,
                    "eviction plugin failed, using the built-in ranking: {e}"
                );
                policy::builtin_rank(candidates)
            }
        }
    }

    /// Ranks eviction candidates: the plugin's answer, checked and completed.
    pub async fn try_rank(
        &self,
        name: &str,
        signal: &str,
        candidates: &[Candidate],
    ) -> Result<Vec<u32>, CallError> {
        let entry = self.callable(name, World::Eviction)?;
        let ranked = self
            .call(
                &entry,
                entry.config.limits.timeout(),
                None,
                async |p: &EvictionPlugin, store| {
                    p.wasmlet_plugin_eviction()
                        .call_rank(store, signal, candidates)
                        .await
                },
                |r| results::ranking(r, candidates).map(|_| ()),
            )
            .await?;
        Ok(results::ranking(&ranked, candidates).unwrap_or_default())
    }

    /// A device adapter's extended resource name, asked once at load.
    pub fn resource_name(&self, name: &str) -> Option<String> {
        self.entry(name)?.lock().resource_name.clone()
    }

    /// The adapter's devices. When the call fails, the last devices it reported are
    /// returned, all unhealthy (the device-adapter world's failure policy).
    pub async fn discover(&self, name: &str) -> Vec<Device> {
        match self.try_discover(name).await {
            Ok(devices) => devices,
            Err(e) => {
                tracing::warn!(
                    plugin = name,
                    "device adapter failed, its devices are unhealthy: {e}"
                );
                let Some(entry) = self.entry(name) else {
                    return Vec::new();
                };
                let mut state = entry.lock();
                for d in &mut state.devices {
                    d.healthy = false;
                }
                state.devices.clone()
            }
        }
    }

    /// The adapter's devices, as it reports them.
    pub async fn try_discover(&self, name: &str) -> Result<Vec<Device>, CallError> {
        let entry = self.callable(name, World::DeviceAdapter)?;
        let devices = self
            .call(
                &entry,
                entry.config.limits.timeout(),
                None,
                async |p: &DeviceAdapterPlugin, store| {
                    p.wasmlet_plugin_device_adapter().call_discover(store).await
                },
                |devices| results::discovered(devices),
            )
            .await?;
        entry.lock().devices = devices.clone();
        Ok(devices)
    }

    /// Prepares `device_ids` for one container. A failed call is an error for the
    /// container (it does not start).
    pub async fn allocate(
        &self,
        name: &str,
        device_ids: Vec<String>,
    ) -> Result<Result<Allocation, String>, CallError> {
        let entry = self.callable(name, World::DeviceAdapter)?;
        self.call(
            &entry,
            entry.config.limits.timeout(),
            None,
            async |p: &DeviceAdapterPlugin, store| {
                p.wasmlet_plugin_device_adapter()
                    .call_allocate(store, &device_ids)
                    .await
            },
            |_| Ok(()),
        )
        .await
    }

    /// Picks `size` devices among `available`, keeping `must_include`. When the call
    /// fails or answers ids not available, `must_include` then the first available
    /// ones are picked.
    pub async fn preferred_allocation(
        &self,
        name: &str,
        available: &[String],
        must_include: &[String],
        size: u32,
    ) -> Vec<String> {
        match self
            .try_preferred_allocation(name, available, must_include, size)
            .await
        {
            Ok(ids) => ids,
            Err(e) => {
                tracing::warn!(
                    plugin = name,
                    "device adapter failed, picking devices in order: {e}"
                );
                let mut ids: Vec<String> = must_include.to_vec();
                for id in available {
                    if ids.len() >= size as usize {
                        break;
                    }
                    if !ids.contains(id) {
                        ids.push(id.clone());
                    }
                }
                ids
            }
        }
    }

    /// The adapter's preferred allocation, checked: only available ids, none twice,
    /// every `must_include`.
    pub async fn try_preferred_allocation(
        &self,
        name: &str,
        available: &[String],
        must_include: &[String],
        size: u32,
    ) -> Result<Vec<String>, CallError> {
        let entry = self.callable(name, World::DeviceAdapter)?;
        self.call(
            &entry,
            entry.config.limits.timeout(),
            None,
            async |p: &DeviceAdapterPlugin, store| {
                p.wasmlet_plugin_device_adapter()
                    .call_preferred_allocation(store, available, must_include, size)
                    .await
            },
            |ids| results::preferred(ids, available, must_include),
        )
        .await
    }

    // ----- listing and metrics -----

    /// Every loaded plugin with its state and metrics, by name.
    pub fn plugins(&self) -> Vec<PluginInfo> {
        let now = Instant::now();
        let entries: Vec<Arc<Entry>> = self.lock_plugins().values().cloned().collect();
        entries
            .iter()
            .map(|e| {
                let state = e.lock();
                PluginInfo {
                    name: e.config.name.clone(),
                    world: e.config.world,
                    source: e.config.source.clone(),
                    disabled_until: state.health.disabled_until(now),
                    consecutive_failures: state.health.consecutive_failures(),
                    reloads: state.reloads,
                    resource_name: state.resource_name.clone(),
                    metrics: state.metrics.clone(),
                }
            })
            .collect()
    }

    /// The metrics of every plugin in the Prometheus text format:
    /// `wasmlet_plugin_calls_total{plugin,world}`,
    /// `wasmlet_plugin_failures_total{plugin,kind}`, `wasmlet_plugin_disabled{plugin}`
    /// and the `wasmlet_plugin_call_duration_seconds{plugin,world}` histogram.
    pub fn metrics_text(&self) -> String {
        let infos = self.plugins();
        let rows: Vec<metrics::Row<'_>> = infos
            .iter()
            .map(|i| metrics::Row {
                name: &i.name,
                world: i.world,
                disabled: i.disabled_until.is_some(),
                metrics: &i.metrics,
            })
            .collect();
        metrics::render(&rows)
    }

    /// The files of the loaded file plugins, for the watcher.
    pub(crate) fn watched_files(&self) -> Vec<(String, PathBuf)> {
        self.lock_plugins()
            .values()
            .filter_map(|e| match &e.config.source {
                PluginSource::File(p) => Some((e.config.name.clone(), p.clone())),
                PluginSource::Image(_) => None,
            })
            .collect()
    }

    pub(crate) fn changed(&self) -> &Notify {
        &self.inner.changed
    }

    // ----- internals -----

    fn lock_plugins(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Arc<Entry>>> {
        self.inner.plugins.read().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_plugins_mut(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, Arc<Entry>>> {
        self.inner
            .plugins
            .write()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn entry(&self, name: &str) -> Option<Arc<Entry>> {
        self.lock_plugins().get(name).cloned()
    }

    fn emit(&self, plugin: &str, kind: PluginEventKind) {
        if let Some(sink) = &self.inner.events {
            sink(PluginEvent {
                plugin: plugin.to_string(),
                kind,
            });
        }
    }

    /// The plugin, if it is loaded, of `world`, and not disabled. Counts the call.
    fn callable(&self, name: &str, world: World) -> Result<Arc<Entry>, CallError> {
        let entry = self
            .entry(name)
            .ok_or_else(|| CallError::NotLoaded(name.to_string()))?;
        if entry.config.world != world {
            return Err(CallError::WrongWorld {
                plugin: name.to_string(),
                expected: world,
                actual: entry.config.world,
            });
        }
        let now = Instant::now();
        let mut state = entry.lock();
        state.metrics.calls += 1;
        if let Err((until, failures)) = state.health.admit(now) {
            let e = CallError::Disabled {
                plugin: name.to_string(),
                until,
                remaining: until - now,
                failures,
            };
            state.metrics.fail(e.kind());
            return Err(e);
        }
        drop(state);
        Ok(entry)
    }

    /// One call of the `W` plugin `entry` (as [`callable`](Self::callable) returned
    /// it) on its current version: [`run`](Self::run), then [`finish`](Self::finish)
    /// with `validate`.
    async fn call<W: PluginWorld, R: EncodedSize>(
        &self,
        entry: &Entry,
        timeout: Duration,
        pod_ips: Option<Vec<String>>,
        f: impl AsyncFnOnce(&W, &mut Store<CallState>) -> wasmtime::Result<R>,
        validate: impl FnOnce(&R) -> Result<(), String>,
    ) -> Result<R, CallError> {
        let result = self.run(entry, entry.loaded(), timeout, pod_ips, f).await;
        self.finish(entry, result, validate)
    }

    /// Runs one call of `loaded`, a version of the `W` plugin `entry`, on an
    /// instance of its own under the call's limits: the one made ahead of it if
    /// there is one, else a fresh one. Calls `f` with its exports, turns what went
    /// wrong into a [`CallError`], and has the next instance made.
    async fn run<W: PluginWorld, R>(
        &self,
        entry: &Entry,
        loaded: Arc<Loaded>,
        timeout: Duration,
        pod_ips: Option<Vec<String>>,
        f: impl AsyncFnOnce(&W, &mut Store<CallState>) -> wasmtime::Result<R>,
    ) -> Result<R, CallError> {
        let started = Instant::now();
        let deadline = started + timeout;
        let prepared = loaded.take_prepared::<W>();
        let was_prepared = prepared.is_some();
        let slot = match &prepared {
            Some(_) => None,
            None => Some(
                tokio::time::timeout_at(deadline, self.inner.slots.clone().acquire_owned())
                    .await
                    .map_err(|_| CallError::Busy(timeout))?
                    .map_err(|_| CallError::Instantiate("the host is shutting down".into()))?,
            ),
        };
        // The pod's network answers before the call's deadline, so a pod that hangs
        // is the plugin's answer to give (a failed check), not the plugin's timeout.
        let network_deadline = deadline - (deadline - Instant::now()) / 5;
        let network = pod_ips.map(|ips| PodNetwork::new(&ips, network_deadline));
        let (mut store, exports, slot) = match prepared {
            Some((mut store, exports, slot)) => {
                store.data_mut().set_pod_network(network);
                (store, Some(exports), slot)
            }
            None => {
                let store = new_store(
                    &self.inner.engine,
                    entry.name.clone(),
                    &entry.config,
                    entry.settings.clone(),
                    network,
                )
                .map_err(CallError::Instantiate)?;
                (store, None, slot.expect("a slot was acquired"))
            }
        };
        set_deadline(&mut store, deadline);
        let version = loaded.clone();
        let call = async move {
            let result = async {
                let exports = match exports {
                    Some(exports) => exports,
                    None => {
                        let pre = W::pre(&version.pre)?;
                        W::instantiate(pre, &mut store)
                            .await
                            .map_err(instantiating)?
                    }
                };
                f(&exports, &mut store).await
            }
            .await;
            (store, result)
        };
        let outcome =
            tokio::time::timeout_at(deadline + DEADLINE_GRACE + self.inner.epoch_tick, call).await;
        let took = started.elapsed();
        let cap = entry.config.limits.memory_bytes;
        let (used, result) = match outcome {
            Err(_) => (None, Err(CallError::Timeout(timeout))),
            Ok((store, result)) => {
                store.data().flush_stdio();
                let exceeded = store.data().limiter.exceeded;
                (
                    Some(store),
                    result.map_err(|e| classify(e, exceeded, timeout, cap)),
                )
            }
        };
        {
            let mut state = entry.lock();
            state.metrics.observe(took);
            state.metrics.prepared_calls += u64::from(was_prepared);
        }
        // The used instance goes, and the next is made, off the caller's path.
        self.prepare(entry, loaded, Some((used, slot)));
        result
    }

    /// Has an instance of `loaded`, a version of `entry`, made ahead of its next
    /// call, in the background, if there is none yet and a slot for one is free;
    /// first drops `used`, an instance a call is done with, and frees its slot.
    /// An instance that fails to instantiate is only dropped: the next call
    /// instantiates its own and reports the error.
    fn prepare(
        &self,
        entry: &Entry,
        loaded: Arc<Loaded>,
        used: Option<(Option<Store<CallState>>, OwnedSemaphorePermit)>,
    ) {
        let warm_slot = {
            let mut warm = loaded.warm.lock().unwrap_or_else(|e| e.into_inner());
            match (&*warm, self.inner.warm_slots.clone().try_acquire_owned()) {
                (Warm::None, Ok(permit)) => {
                    *warm = Warm::Filling;
                    Some(permit)
                }
                _ => None,
            }
        };
        if warm_slot.is_none() && used.is_none() {
            return;
        }
        let engine = self.inner.engine.clone();
        let slots = self.inner.slots.clone();
        let (name, config, settings) = (
            entry.name.clone(),
            entry.config.clone(),
            entry.settings.clone(),
        );
        tokio::spawn(async move {
            drop(used);
            let Some(warm_slot) = warm_slot else {
                return;
            };
            let timeout = config.limits.timeout();
            let made = async {
                let slot = slots.try_acquire_owned().ok()?;
                let mut store = new_store(&engine, name, &config, settings, None).ok()?;
                set_deadline(&mut store, Instant::now() + timeout);
                let exports = tokio::time::timeout(
                    timeout + DEADLINE_GRACE,
                    loaded.pre.instantiate(&mut store),
                )
                .await
                .ok()?
                .ok()?;
                store.data().flush_stdio();
                Some(Box::new(Prepared {
                    store,
                    exports,
                    slot,
                    _warm_slot: warm_slot,
                }))
            }
            .await;
            *loaded.warm.lock().unwrap_or_else(|e| e.into_inner()) = match made {
                Some(prepared) => Warm::Ready(prepared),
                None => Warm::None,
            };
        });
    }

    /// Checks a result's size and `validate`s it, then counts it.
    fn finish<R: EncodedSize>(
        &self,
        entry: &Entry,
        result: Result<R, CallError>,
        validate: impl FnOnce(&R) -> Result<(), String>,
    ) -> Result<R, CallError> {
        let result = result.and_then(|r| {
            results::size(&r).map_err(CallError::InvalidResult)?;
            validate(&r).map_err(CallError::InvalidResult)?;
            Ok(r)
        });
        let transition = {
            let mut state = entry.lock();
            match &result {
                Ok(_) => state.health.success(),
                Err(e) => {
                    state.metrics.fail(e.kind());
                    // A busy node is not the plugin's fault: it does not count
                    // toward disabling it.
                    if e.is_plugin_failure() {
                        state.health.failure(Instant::now(), &self.inner.backoff)
                    } else {
                        Transition::None
                    }
                }
            }
        };
        if let Err(e) = &result {
            tracing::warn!(plugin = %entry.name, kind = e.kind(), "plugin call failed: {e}");
        }
        match transition {
            Transition::None => {}
            Transition::Enabled => {
                tracing::info!(plugin = %entry.name, "plugin enabled again after a good call");
                self.emit(&entry.name, PluginEventKind::Enabled);
            }
            Transition::Disabled { backoff, failures } => {
                tracing::warn!(plugin = %entry.name, "plugin disabled for {backoff:?} after {failures} consecutive failures");
                if let Err(last_error) = &result {
                    self.emit(
                        &entry.name,
                        PluginEventKind::Disabled {
                            failures,
                            backoff,
                            last_error: last_error.clone(),
                        },
                    );
                }
            }
        }
        result
    }
}

/// `component` pre-linked with `W`'s linker: `unlinkable`'s error when it imports
/// what the world does not offer, `wrong`'s when its exports do not match.
fn pre_link<W: PluginWorld>(
    linkers: &Linkers,
    component: &Component,
    unlinkable: impl FnOnce(wasmtime::Error) -> Error,
    wrong: impl FnOnce(String) -> Error,
) -> Result<Pre> {
    let pre = W::linker(linkers)
        .instantiate_pre(component)
        .map_err(unlinkable)?;
    W::new_pre(pre).map_err(|e| wrong(format!("{e:#}")))
}

fn instantiating(e: wasmtime::Error) -> wasmtime::Error {
    e.context(Instantiating)
}

/// What went wrong in a call, from wasmtime's error.
fn classify(e: wasmtime::Error, memory_exceeded: bool, timeout: Duration, cap: u64) -> CallError {
    if e.downcast_ref::<DeadlineExceeded>().is_some()
        || matches!(
            e.downcast_ref::<wasmtime::Trap>(),
            Some(wasmtime::Trap::Interrupt)
        )
    {
        return CallError::Timeout(timeout);
    }
    if memory_exceeded || e.downcast_ref::<MemoryCapExceeded>().is_some() {
        return CallError::OutOfMemory { cap };
    }
    if let Some(trap) = e.downcast_ref::<wasmtime::Trap>() {
        let frame = e
            .downcast_ref::<wasmtime::WasmBacktrace>()
            .and_then(|bt| bt.frames().first())
            .and_then(|f| f.func_name().map(str::to_string));
        return CallError::Trap(match frame {
            Some(func) => format!("{trap} in {func}"),
            None => trap.to_string(),
        });
    }
    let message = crate::state::cut(&format!("{e:#}"), 1024).to_string();
    if e.downcast_ref::<Instantiating>().is_some() {
        CallError::Instantiate(message)
    } else {
        CallError::Trap(message)
    }
}

async fn read(name: &str, path: &Path) -> Result<Vec<u8>> {
    tokio::fs::read(path).await.map_err(|source| Error::Read {
        name: name.to_string(),
        path: path.to_path_buf(),
        source,
    })
}

/// A store for one instance of `config`'s plugin: its sandbox (see
/// [`CallState::new`]) under its memory limiter.
fn new_store(
    engine: &Engine,
    plugin: Arc<str>,
    config: &PluginConfig,
    settings: Arc<Vec<Pair>>,
    pod_network: Option<PodNetwork>,
) -> Result<Store<CallState>, String> {
    let state = CallState::new(plugin, config, settings, pod_network)?;
    let mut store = Store::new(engine, state);
    store.limiter(|s| &mut s.limiter);
    Ok(store)
}

/// Traps `store`'s calls at `deadline`; until then they yield to the runtime every
/// epoch tick, so a busy plugin does not hold a worker thread.
fn set_deadline(store: &mut Store<CallState>, deadline: Instant) {
    let wall_deadline = deadline.into_std();
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |_| {
        if std::time::Instant::now() >= wall_deadline {
            Err(DeadlineExceeded.into())
        } else {
            Ok(UpdateDeadline::Yield(1))
        }
    });
}

impl Pre {
    /// A fresh instance of whichever world in `store`.
    async fn instantiate(&self, store: &mut Store<CallState>) -> wasmtime::Result<Exports> {
        Ok(match self {
            Pre::Probe(p) => Exports::Probe(p.instantiate_async(store).await?),
            Pre::Admission(p) => Exports::Admission(p.instantiate_async(store).await?),
            Pre::Eviction(p) => Exports::Eviction(p.instantiate_async(store).await?),
            Pre::DeviceAdapter(p) => Exports::DeviceAdapter(p.instantiate_async(store).await?),
        })
    }
}

impl Loaded {
    /// The instance made ahead of a call, if it is ready and of world `W`: its
    /// store, exports and pool slot.
    fn take_prepared<W: PluginWorld>(&self) -> Option<(Store<CallState>, W, OwnedSemaphorePermit)> {
        let mut warm = self.warm.lock().unwrap_or_else(|e| e.into_inner());
        let Warm::Ready(_) = &*warm else {
            return None;
        };
        let Warm::Ready(prepared) = std::mem::take(&mut *warm) else {
            unreachable!("checked above");
        };
        let Prepared {
            store,
            exports,
            slot,
            _warm_slot,
        } = *prepared;
        Some((store, W::from_exports(exports)?, slot))
    }
}

impl Entry {
    fn loaded(&self) -> Arc<Loaded> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, EntryState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Linkers {
    fn new(engine: &Engine) -> Result<Self> {
        fn linker<W: PluginWorld>(engine: &Engine) -> wasmtime::Result<Linker<CallState>> {
            let mut l = Linker::new(engine);
            wasmtime_wasi::p2::add_to_linker_async(&mut l)?;
            W::add_imports(&mut l)?;
            Ok(l)
        }
        let build = || -> wasmtime::Result<Linkers> {
            Ok(Linkers {
                probe: linker::<ProbePlugin>(engine)?,
                admission: linker::<AdmissionPlugin>(engine)?,
                eviction: linker::<EvictionPlugin>(engine)?,
                device_adapter: linker::<DeviceAdapterPlugin>(engine)?,
            })
        };
        build().map_err(|e| Error::Engine(format!("linking the plugin ABI: {e:#}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The node runs calls on a multi-threaded runtime: their futures, the generic
    /// call path's included, must be `Send`. A compile-time check: the closure is
    /// type-checked, never called.
    #[test]
    fn calls_are_send() {
        fn send<T: Send>(_: T) {}
        let _check = |host: PluginHost,
                      config: PluginConfig,
                      request: ProbeRequest,
                      pod: PodInfo,
                      node: NodeState| {
            send(async move {
                let _ = host.load_bytes(config, Vec::new()).await;
                let _ = host.reload_bytes("p", Vec::new()).await;
                let _ = host.probe("p", request).await;
                let _ = host.admit("p", pod, node).await;
                let _ = host.rank("p", "memory.available", &[]).await;
                let _ = host.discover("p").await;
                let _ = host.allocate("p", Vec::new()).await;
                let _ = host.preferred_allocation("p", &[], &[], 1).await;
            });
        };
    }
}
