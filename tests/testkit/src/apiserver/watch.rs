//! Watch responses: newline-delimited JSON events, with bookmarks and a timeout.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::{Instant, Interval, MissedTickBehavior};

use super::errors::ApiError;
use super::lock;
use super::resources::ResourceType;
use super::store::{Change, Filter, Store, WatchSetup};

/// How often an idle watch that allows bookmarks gets one.
pub(crate) const BOOKMARK_INTERVAL: Duration = Duration::from_secs(1);

/// The annotation on the bookmark that ends a streaming list's initial events.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// How a watch response behaves.
pub(crate) struct WatchOptions {
    pub bookmarks: bool,
    /// Send the `initial-events-end` bookmark after the initial events.
    pub initial_events_end: bool,
    pub timeout: Duration,
}

/// One encoded watch event line.
pub(crate) fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line =
        serde_json::to_vec(&json!({ "type": kind, "object": object })).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

fn bookmark(res: &ResourceType, rv: u64, initial_end: bool) -> Bytes {
    let mut object = json!({
        "kind": res.kind,
        "apiVersion": res.api_version(),
        "metadata": { "resourceVersion": rv.to_string() },
    });
    if initial_end {
        object["metadata"]["annotations"] = json!({ INITIAL_EVENTS_END: "true" });
    }
    event_line("BOOKMARK", &object)
}

/// A stream that sends one `ERROR` event (e.g. 410 Expired) and ends.
pub(crate) fn error_body(err: &ApiError) -> Body {
    Body::from(event_line("ERROR", &err.to_status()))
}

/// What woke an idle watch.
enum Wake {
    Change(Option<Arc<Change>>),
    Deadline,
    Tick,
}

struct WatchState {
    res: &'static ResourceType,
    pending: VecDeque<Bytes>,
    live: mpsc::UnboundedReceiver<Arc<Change>>,
    filter: Filter,
    store: Arc<Mutex<Store>>,
    /// Fires while idle when bookmarks are allowed.
    ticks: Option<Interval>,
    deadline: Instant,
    project: fn(Value) -> Value,
}

impl WatchState {
    fn push(&mut self, change: &Change) {
        if let Some((kind, object)) = self.filter.project(change) {
            let object = (self.project)(object);
            self.pending.push_back(event_line(kind, &object));
        }
    }

    /// Queues every change already delivered, then a bookmark at the current RV:
    /// all changes up to that RV are in the channel, since both happen under the lock.
    fn push_bookmark(&mut self) {
        let rv = lock(&self.store).rv();
        while let Ok(change) = self.live.try_recv() {
            self.push(&change);
        }
        self.pending.push_back(bookmark(self.res, rv, false));
    }
}

/// The response body of a registered watch. `project` shapes each object (full
/// object or metadata only).
pub(crate) fn body(
    res: &'static ResourceType,
    setup: WatchSetup,
    filter: Filter,
    store: Arc<Mutex<Store>>,
    options: &WatchOptions,
    project: fn(Value) -> Value,
) -> Body {
    let mut pending: VecDeque<Bytes> = setup
        .initial
        .into_iter()
        .map(|(kind, obj)| event_line(kind, &project(obj)))
        .collect();
    if options.initial_events_end {
        pending.push_back(bookmark(res, setup.rv, true));
    }
    let ticks = options.bookmarks.then(|| {
        let mut ticks =
            tokio::time::interval_at(Instant::now() + BOOKMARK_INTERVAL, BOOKMARK_INTERVAL);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        ticks
    });
    let state = WatchState {
        res,
        pending,
        live: setup.live,
        filter,
        store,
        ticks,
        deadline: Instant::now() + options.timeout,
        project,
    };
    let stream = futures::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(line) = st.pending.pop_front() {
                if let Some(ticks) = st.ticks.as_mut() {
                    ticks.reset();
                }
                return Some((Ok::<_, Infallible>(line), st));
            }
            let ticks = &mut st.ticks;
            let tick = async move {
                match ticks {
                    Some(ticks) => ticks.tick().await,
                    None => std::future::pending().await,
                }
            };
            let wake = tokio::select! {
                biased;
                change = st.live.recv() => Wake::Change(change),
                _ = tokio::time::sleep_until(st.deadline) => Wake::Deadline,
                _ = tick => Wake::Tick,
            };
            match wake {
                Wake::Change(Some(change)) => st.push(&change),
                // The server dropped the watch, or its time is up.
                Wake::Change(None) | Wake::Deadline => return None,
                Wake::Tick => st.push_bookmark(),
            }
        }
    });
    Body::from_stream(stream)
}
