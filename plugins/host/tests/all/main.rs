//! The plugin host's integration tests: real components in a real engine.

mod calls;
mod components;
mod examples;
mod load;
mod policy;
mod reload;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use wasmlet_plugin_host::types::{Candidate, PodInfo};
use wasmlet_plugin_host::{
    BackoffPolicy, Grants, HostOptions, Limits, PluginConfig, PluginEvent, PluginHost,
    PluginSource, World,
};

/// A host with a small pool, recording its events.
pub fn host() -> (PluginHost, Events) {
    host_with(BackoffPolicy::default())
}

pub fn host_with(backoff: BackoffPolicy) -> (PluginHost, Events) {
    let events = Events::default();
    let sink = events.clone();
    let host = PluginHost::new(HostOptions {
        max_instances: 8,
        max_memory_bytes: 64 << 20,
        backoff,
        events: Some(Arc::new(move |e| sink.0.lock().unwrap().push(e))),
        ..HostOptions::default()
    })
    .unwrap();
    (host, events)
}

#[derive(Clone, Default)]
pub struct Events(Arc<Mutex<Vec<PluginEvent>>>);

impl Events {
    pub fn take(&self) -> Vec<PluginEvent> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }

    /// Waits up to 10 s for an event matching `f`.
    pub async fn wait_for(&self, f: impl Fn(&PluginEvent) -> bool) -> PluginEvent {
        for _ in 0..200 {
            if let Some(e) = self.0.lock().unwrap().iter().find(|e| f(e)) {
                return e.clone();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("no such event in {:?}", self.0.lock().unwrap());
    }
}

pub fn config(name: &str, world: World) -> PluginConfig {
    PluginConfig {
        name: name.into(),
        world,
        source: PluginSource::Image(format!("test.example/{name}:1")),
        limits: Limits {
            timeout_millis: 500,
            memory_bytes: 16 << 20,
        },
        grants: Grants::default(),
        settings: BTreeMap::new(),
        failure_policy: None,
    }
}

pub fn pod(name: &str, priority: i32) -> PodInfo {
    PodInfo {
        namespace: "default".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        labels: vec![],
        annotations: vec![],
        qos_class: "Burstable".into(),
        priority,
        runtime_class: String::new(),
        containers: vec![],
    }
}

pub fn candidates() -> Vec<Candidate> {
    vec![
        Candidate {
            pod: pod("within", 0),
            usage: 50,
            request: 100,
        },
        Candidate {
            pod: pod("exceeds", 0),
            usage: 900,
            request: 100,
        },
        Candidate {
            pod: pod("exceeds-high", 1000),
            usage: 300,
            request: 100,
        },
    ]
}

/// Loads a good eviction plugin `good` returning `[2]`, to check the host still
/// works after something bad happened.
pub async fn load_good(host: &PluginHost) {
    host.load_bytes(config("good", World::Eviction), components::ranking(&[2]))
        .await
        .unwrap();
}

pub async fn good_still_works(host: &PluginHost) {
    let order = host
        .try_rank("good", "memory.available", &candidates())
        .await;
    assert_eq!(order.unwrap(), [2, 1, 0]);
}
