//! Whether the container runtimes are up: the kubelet's `runtimeState`, fed by asking
//! each runtime's `Status` every few seconds (`updateRuntimeUp`).
//!
//! A runtime that is down, or reports `RuntimeReady=false` or `NetworkReady=false`,
//! makes the node not ready (`/readyz`, and the NodeReady condition once the node
//! reports to an API server). Pods on the other runtimes keep running.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use wasmlet_runtime::{Runtime, RuntimeStatus};

use crate::router::RuntimeRouter;

/// How often the runtimes are asked, as the kubelet's `updateRuntimeUp`.
pub const STATUS_PERIOD: Duration = Duration::from_secs(5);

/// What one runtime said last.
#[derive(Clone, Debug)]
struct Entry {
    runtime: String,
    /// `None` until the first answer.
    problem: Option<Option<String>>,
}

/// The last known readiness of every runtime.
#[derive(Clone)]
pub struct RuntimeState {
    entries: Arc<Mutex<Vec<Entry>>>,
}

/// Why a runtime's answer makes the node not ready, in the kubelet's words; `None`
/// when it is ready.
pub fn problem(status: Result<RuntimeStatus, wasmlet_runtime::Error>) -> Option<String> {
    match status {
        Err(e) => Some(format!("container runtime is down: {e}")),
        Ok(s) if !s.runtime_ready => Some(format!(
            "container runtime not ready: RuntimeReady=false message:{}",
            s.message
        )),
        Ok(s) if !s.network_ready => Some(format!(
            "container runtime network not ready: NetworkReady=false message:{}",
            s.message
        )),
        Ok(_) => None,
    }
}

impl RuntimeState {
    /// The state of `router`'s runtimes, none of them asked yet (so not ready).
    pub fn new(router: &RuntimeRouter) -> Self {
        let entries = router
            .runtimes()
            .iter()
            .map(|r| Entry {
                runtime: r.name().to_owned(),
                problem: None,
            })
            .collect();
        RuntimeState {
            entries: Arc::new(Mutex::new(entries)),
        }
    }

    /// `Ok` with a line per runtime when every runtime is ready, else `Err` naming the
    /// ones that are not and why.
    pub fn check(&self) -> Result<String, String> {
        let entries = self.entries.lock().unwrap();
        let mut ok = Vec::new();
        let mut bad = Vec::new();
        for e in entries.iter() {
            match &e.problem {
                None => bad.push(format!("{}: not asked yet", e.runtime)),
                Some(None) => ok.push(format!("{}: ready", e.runtime)),
                Some(Some(p)) => bad.push(format!("{}: {p}", e.runtime)),
            }
        }
        if bad.is_empty() {
            Ok(ok.join("; "))
        } else {
            bad.extend(ok);
            Err(bad.join("; "))
        }
    }

    fn set(&self, i: usize, problem: Option<String>) {
        let mut entries = self.entries.lock().unwrap();
        let entry = &mut entries[i];
        let was = entry.problem.replace(problem.clone());
        match (was.flatten(), &problem) {
            (None, Some(p)) => tracing::error!(runtime = %entry.runtime, "runtime not ready: {p}"),
            (Some(_), None) => tracing::info!(runtime = %entry.runtime, "runtime ready"),
            _ => {}
        }
    }

    /// Asks every runtime now and then every [`STATUS_PERIOD`] until cancelled.
    /// `router` must be the one this state was made from.
    pub async fn run(self, router: RuntimeRouter, cancel: CancellationToken) {
        // The same runtimes, in the same order, as [`RuntimeState::new`] listed.
        let runtimes: Vec<Arc<dyn Runtime>> = router.runtimes();
        let mut tick = tokio::time::interval(STATUS_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = tick.tick() => {
                    for (i, runtime) in runtimes.iter().enumerate() {
                        self.set(i, problem(runtime.status().await));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(runtime_ready: bool, network_ready: bool) -> RuntimeStatus {
        RuntimeStatus {
            runtime_ready,
            network_ready,
            message: "cni config uninitialized".into(),
        }
    }

    #[test]
    fn problems_are_named_like_the_kubelet_names_them() {
        assert_eq!(problem(Ok(status(true, true))), None);
        assert_eq!(
            problem(Ok(status(true, false))).unwrap(),
            "container runtime network not ready: NetworkReady=false message:cni config uninitialized"
        );
        assert!(
            problem(Ok(status(false, false)))
                .unwrap()
                .starts_with("container runtime not ready: RuntimeReady=false")
        );
        let down = problem(Err(wasmlet_runtime::Error::unavailable(
            "Status: connecting to /run/x.sock: No such file",
        )))
        .unwrap();
        assert!(down.starts_with("container runtime is down: "), "{down}");
        assert!(down.contains("No such file"), "{down}");
    }

    #[test]
    fn the_check_names_every_runtime_that_is_not_ready() {
        let state = RuntimeState {
            entries: Arc::default(),
        };
        *state.entries.lock().unwrap() = vec![
            Entry {
                runtime: "wasm".into(),
                problem: None,
            },
            Entry {
                runtime: "cri".into(),
                problem: None,
            },
        ];
        assert!(state.check().is_err(), "not asked yet is not ready");
        state.set(0, None);
        state.set(1, Some("container runtime is down: gone".into()));
        assert_eq!(
            state.check().unwrap_err(),
            "cri: container runtime is down: gone; wasm: ready"
        );
        state.set(1, None);
        assert_eq!(state.check().unwrap(), "wasm: ready; cri: ready");
    }
}
