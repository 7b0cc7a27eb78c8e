//! The wasmtime engine every plugin of a host shares: the pooling allocator and
//! the epoch ticker that enforces call deadlines.

use std::sync::mpsc;
use std::time::Duration;

use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::error::{Error, Result};

/// Core instances, memories and tables one plugin component may hold: a module
/// built for `wasm32-wasip1` and componentized with the preview 1 adapter has about
/// five core instances (the module, the adapter, the shims), one or two memories.
pub(crate) const MAX_CORE_INSTANCES_PER_COMPONENT: u32 = 32;
pub(crate) const MAX_MEMORIES_PER_COMPONENT: u32 = 4;
pub(crate) const MAX_TABLES_PER_COMPONENT: u32 = 8;
pub(crate) const MAX_TABLE_ELEMENTS: usize = 100_000;

/// Builds the engine: component model, epoch interruption, and a pool sized for
/// `instances` plugin instances alive at once, each memory capped at `max_memory`,
/// the first `keep_resident` bytes of a used memory or table reset by rewriting its
/// dirty pages rather than by `madvise`.
pub(crate) fn engine(instances: u32, max_memory: u64, keep_resident: usize) -> Result<Engine> {
    let mut pool = PoolingAllocationConfig::new();
    pool.total_component_instances(instances)
        .total_core_instances(instances * 8)
        .total_memories(instances * 2)
        .total_tables(instances * 4)
        .total_stacks(instances)
        .max_core_instances_per_component(MAX_CORE_INSTANCES_PER_COMPONENT)
        .max_memories_per_component(MAX_MEMORIES_PER_COMPONENT)
        .max_tables_per_component(MAX_TABLES_PER_COMPONENT)
        .table_elements(MAX_TABLE_ELEMENTS)
        .max_memory_size(usize::try_from(max_memory).unwrap_or(usize::MAX))
        .linear_memory_keep_resident(keep_resident)
        .table_keep_resident(keep_resident)
        .pagemap_scan(Enabled::Auto);
    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .epoch_interruption(true)
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    Engine::new(&config).map_err(|e| Error::Engine(format!("{e:#}")))
}

/// Increments the engine's epoch every tick on a thread of its own, until dropped.
pub(crate) struct EpochTicker {
    _stop: mpsc::Sender<()>,
}

impl EpochTicker {
    pub(crate) fn start(engine: Engine, tick: Duration) -> Result<Self> {
        let (stop, stopped) = mpsc::channel::<()>();
        std::thread::Builder::new()
            .name("plugin-epoch".into())
            .spawn(move || {
                // Ends when the sender is dropped (recv_timeout reports Disconnected).
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(tick) {
                    engine.increment_epoch();
                }
            })
            .map_err(|e| Error::Engine(format!("starting the epoch thread: {e}")))?;
        Ok(EpochTicker { _stop: stop })
    }
}
