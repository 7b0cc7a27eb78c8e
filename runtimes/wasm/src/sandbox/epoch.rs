//! The engine's epoch, which makes a guest running Wasm without host calls yield to
//! the sandbox's executor: the pod's other containers, the node's requests and a stop
//! get their turn, and a cancelled guest is dropped at its next yield.
//!
//! A thread of its own advances it: every [`EPOCH_TICK`] while a guest yields at the
//! ticks (it ran Wasm across one); while none does, the period doubles up to
//! [`IDLE_TICK`]. The guests of an idle pod wait in host calls (sleeping, reading),
//! where no tick is needed to cancel them, and a fixed 10 ms tick cost each sandbox a
//! hundred wakeups a second: at a thousand pods on a node, most of its two cores. A
//! guest's first yield after a quiet spell wakes the thread, and so does a stop
//! ([`Epoch::hurry`]), so a guest that spins is still cut into 10 ms slices (and not
//! finer: a yield wakes the thread only while it sleeps longer than a tick).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::Thread;
use std::time::Duration;

use wasmtime::{Engine, Store, UpdateDeadline};

/// The epoch's period while a guest runs Wasm: the granularity of cancellation.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// The longest period, reached while no guest runs Wasm across a tick.
pub const IDLE_TICK: Duration = Duration::from_millis(250);

/// The handle of a sandbox's epoch thread.
#[derive(Clone)]
pub(super) struct Epoch {
    state: Arc<State>,
    ticker: Thread,
}

#[derive(Default)]
struct State {
    /// Raised by a guest's yield (or a hurry) since the thread last looked.
    busy: AtomicBool,
    /// Whether the thread sleeps longer than [`EPOCH_TICK`]: only then does a yield
    /// wake it (waking it at every yield would advance the epoch at once, which makes
    /// the guest yield again at its next check, and so on).
    slow: AtomicBool,
}

impl Epoch {
    /// Starts the thread; it ends once the engine is gone.
    pub fn start(engine: &Engine) -> std::io::Result<Epoch> {
        let engine = engine.weak();
        let state = Arc::new(State::default());
        let seen = state.clone();
        let thread = std::thread::Builder::new()
            .name("epoch".into())
            .spawn(move || {
                let mut period = EPOCH_TICK;
                while let Some(engine) = engine.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    seen.slow.store(period > EPOCH_TICK, Ordering::Relaxed);
                    std::thread::park_timeout(period);
                    period = if seen.busy.swap(false, Ordering::Relaxed) {
                        EPOCH_TICK
                    } else {
                        (period * 2).min(IDLE_TICK)
                    };
                }
            })?;
        Ok(Epoch {
            state,
            ticker: thread.thread().clone(),
        })
    }

    /// Makes `store`'s guest yield to the executor at each tick (its first epoch check
    /// yields at once, as `epoch_deadline_async_yield_and_update(1)` does).
    pub fn yield_at_ticks<T: 'static>(&self, store: &mut Store<T>) {
        let epoch = self.clone();
        store.epoch_deadline_callback(move |_| {
            epoch.hurry();
            Ok(UpdateDeadline::Yield(1))
        });
    }

    /// Back to [`EPOCH_TICK`]: a guest yielded, or one is being cancelled. Wakes the
    /// thread if it sleeps longer than that.
    pub fn hurry(&self) {
        self.state.busy.store(true, Ordering::Relaxed);
        if self.state.slow.swap(false, Ordering::Relaxed) {
            self.ticker.unpark();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use wasmtime::{Instance, Module};

    use super::*;

    /// A guest that never makes a host call, started after the epoch thread has slowed
    /// to its idle period, still yields: a timeout around its call ends it (without
    /// yields the call would never return and the test would hang).
    #[test]
    fn a_spinning_guest_started_in_a_quiet_spell_still_yields() {
        let engine = crate::engine::new_engine().unwrap();
        let epoch = Epoch::start(&engine).unwrap();
        let wasm = wat::parse_str(r#"(module (func (export "spin") (loop br 0)))"#).unwrap();
        let module = Module::new(&engine, wasm).unwrap();
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap();
            let outcome: wasmtime::Result<bool> = rt.block_on(async {
                // Long enough for the period to have doubled up to IDLE_TICK.
                tokio::time::sleep(IDLE_TICK * 3).await;
                let mut store = Store::new(&engine, ());
                epoch.yield_at_ticks(&mut store);
                let instance = Instance::new_async(&mut store, &module, &[]).await?;
                let spin = instance.get_typed_func::<(), ()>(&mut store, "spin")?;
                let cut = tokio::time::timeout(EPOCH_TICK * 5, spin.call_async(&mut store, ()));
                Ok(cut.await.is_err())
            });
            let _ = done.send(outcome);
        });
        let timed_out = finished
            .recv_timeout(Duration::from_secs(30))
            .expect("the spinning guest yields to the executor")
            .unwrap();
        assert!(timed_out, "the timeout, not the guest, ended the call");
    }
}
