//! The node's tasks: every one spawned on one [`TaskTracker`] under a name, so that
//! shutdown waits for them all and can say which did not finish.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::task::TaskTracker;

/// The tracker and the names of the tasks still running on it.
#[derive(Clone, Default)]
pub(crate) struct Tasks {
    tracker: TaskTracker,
    /// Name -> how many tasks of that name are running.
    running: Arc<Mutex<BTreeMap<&'static str, usize>>>,
}

/// Counts its task as running until it is dropped: when the task ends, panics or is
/// dropped unfinished.
struct Running {
    name: &'static str,
    running: Arc<Mutex<BTreeMap<&'static str, usize>>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = running.get_mut(self.name) {
            *n -= 1;
            if *n == 0 {
                running.remove(self.name);
            }
        }
    }
}

impl Tasks {
    /// Spawns `task` on the tracker as `name`.
    pub(crate) fn spawn<F>(&self, name: &'static str, task: F)
    where
        F: Future + Send + 'static,
    {
        *self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(name)
            .or_default() += 1;
        let guard = Running {
            name,
            running: self.running.clone(),
        };
        self.tracker.spawn(async move {
            let _guard = guard;
            task.await;
        });
    }

    /// The names of the tasks still running, one per task.
    pub(crate) fn running(&self) -> Vec<&'static str> {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        running
            .iter()
            .flat_map(|(name, n)| std::iter::repeat_n(*name, *n))
            .collect()
    }

    /// Closes the tracker and waits up to `deadline` for every task on it (those
    /// spawned meanwhile too). Returns the names of the tasks that did not finish.
    pub(crate) async fn drain(&self, deadline: Duration) -> Vec<&'static str> {
        self.tracker.close();
        match tokio::time::timeout(deadline, self.tracker.wait()).await {
            Ok(()) => Vec::new(),
            Err(_) => self.running(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn drain_waits_for_every_task_and_names_those_that_did_not_finish() {
        let tasks = Tasks::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tasks.spawn("quick", async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
        });
        tasks.spawn("waits for its write", async move {
            let _ = rx.await;
        });
        tasks.spawn("stuck", std::future::pending::<()>());
        tasks.spawn("stuck", std::future::pending::<()>());
        // A task spawned by a task while draining is waited for too.
        let inner = tasks.clone();
        tasks.spawn("spawner", async move {
            inner.spawn("spawned", async {});
        });
        drop(tx);
        let unfinished = tasks.drain(Duration::from_millis(200)).await;
        assert_eq!(unfinished, ["stuck", "stuck"]);
    }

    #[tokio::test]
    async fn drain_returns_at_once_when_every_task_is_done() {
        let tasks = Tasks::default();
        tasks.spawn("done", async {});
        let started = std::time::Instant::now();
        assert!(tasks.drain(Duration::from_secs(10)).await.is_empty());
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(tasks.running().is_empty());
    }

    #[tokio::test]
    async fn a_task_that_panics_is_not_reported_as_running() {
        let tasks = Tasks::default();
        tasks.spawn("panics", async { panic!("on purpose") });
        assert!(tasks.drain(Duration::from_secs(10)).await.is_empty());
    }
}
