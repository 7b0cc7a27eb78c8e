//! `wasmlet-node`: the node agent. It does the kubelet's job for OCI containers and
//! runs WebAssembly natively.
//!
//! Data flows from pod sources ([`podconfig`]) into the [`syncloop`], which hands each
//! pod to its worker ([`workers`]); workers run [`sync::PodSyncer`] against the runtime
//! the [`router`] picks, and publish statuses ([`status`]) that the node API
//! ([`server`]) serves. [`pleg`] tells the loop when containers change. [`node::run`]
//! wires it all from a validated [`config::NodeConfig`]. Start reading there.

pub mod admission;
pub mod allocatable;
pub mod backoff;
pub mod cli;
pub mod cluster;
pub mod cm;
pub mod config;
pub mod duration;
pub mod env;
pub mod eviction;
pub mod hooks;
pub mod http_get;
pub mod images;
pub mod kuberuntime;
pub mod logs;
pub mod machine;
pub mod metrics;
pub mod node;
pub mod pleg;
pub mod plugin_tools;
pub mod plugins;
pub mod pluginwatcher;
pub mod pod;
pub mod pod_state;
pub mod podconfig;
pub mod podspec;
pub mod private_file;
pub mod probe_results;
pub mod prober;
pub mod qos;
pub mod quantity;
pub mod resources;
pub mod router;
pub mod runtime_state;
pub mod server;
pub mod shutdown;
pub mod stats;
pub mod status;
pub mod sync;
#[cfg(test)]
mod sync_tests;
pub mod syncloop;
#[cfg(test)]
mod syncloop_tests;
pub mod thresholds;
pub mod volumes;
pub mod workers;
