//! Faults a test can inject: an unreachable server, slow responses, failing
//! requests, dropped watches and an expired watch history.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use super::lock;
use super::store::Store;
use super::tcp::ListenerSlot;

/// Fault injection for an [`ApiServer`](super::ApiServer); get it with
/// [`ApiServer::faults`](super::ApiServer::faults).
pub struct Faults {
    store: Arc<Mutex<Store>>,
    down: watch::Sender<bool>,
    delay: Mutex<Option<Duration>>,
    /// (requests left to fail, status to fail them with)
    failures: Mutex<(usize, u16)>,
    listeners: Mutex<Vec<Arc<ListenerSlot>>>,
}

impl Faults {
    pub(crate) fn new(store: Arc<Mutex<Store>>) -> Faults {
        Faults {
            store,
            down: watch::Sender::new(false),
            delay: Mutex::new(None),
            failures: Mutex::new((0, 500)),
            listeners: Mutex::new(Vec::new()),
        }
    }

    /// Makes the server unreachable (`true`) or reachable again (`false`).
    ///
    /// Down, TCP listeners are closed (connections are refused) and open
    /// connections, watches included, are dropped; up, the same ports are bound
    /// again. In-process clients get a connection-refused service error and their
    /// watches end.
    pub fn set_down(&self, down: bool) {
        self.down.send_replace(down);
        for listener in lock(&self.listeners).iter() {
            if down {
                listener.close();
            } else {
                listener.reopen();
            }
        }
        if down {
            self.drop_watches();
        }
    }

    /// Whether [`set_down`](Self::set_down) made the server unreachable.
    pub fn is_down(&self) -> bool {
        *self.down.borrow()
    }

    /// Delays every request by `delay` (Tokio time, so paused clocks apply).
    pub fn set_delay(&self, delay: Option<Duration>) {
        *lock(&self.delay) = delay;
    }

    /// Fails the next `n` non-watch requests with `status` and a `Status` body.
    pub fn fail_next(&self, n: usize, status: u16) {
        *lock(&self.failures) = (n, status);
    }

    /// Ends every open watch stream now (cleanly, as when the apiserver closes it).
    pub fn drop_watches(&self) {
        lock(&self.store).drop_watches();
    }

    /// Forgets the event history: watches resuming from any resourceVersion handed
    /// out so far get a 410 Expired `ERROR` event, which makes kube's watcher relist.
    pub fn expire_history(&self) {
        lock(&self.store).expire_history();
    }

    pub(crate) fn delay(&self) -> Option<Duration> {
        *lock(&self.delay)
    }

    /// Consumes one injected failure, if any are left.
    pub(crate) fn take_failure(&self) -> Option<u16> {
        let mut failures = lock(&self.failures);
        if failures.0 == 0 {
            return None;
        }
        failures.0 -= 1;
        Some(failures.1)
    }

    pub(crate) fn down_signal(&self) -> watch::Receiver<bool> {
        self.down.subscribe()
    }

    pub(crate) fn add_listener(&self, listener: Arc<ListenerSlot>) {
        if self.is_down() {
            listener.close();
        }
        lock(&self.listeners).push(listener);
    }
}
