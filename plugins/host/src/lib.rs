//! `wasmlet-plugin-host`: loads, limits and calls the node's Wasm plugins.
//!
//! Plugins are components of the WIT package `wasmlet:plugin@0.1.0`
//! (`plugins/wit`, compiled into the crate as [`WIT`]); each implements one
//! [`World`]: probe, admission, eviction or device adapter. Start reading at
//! [`PluginHost`]: [`PluginHost::load`] compiles a plugin once and pre-links it
//! ([`config`] says how the node configures it); each call
//! ([`PluginHost::probe`], [`PluginHost::admit`], [`PluginHost::rank`],
//! [`PluginHost::discover`]...) instantiates it fresh from the pooling allocator in
//! a store of its own, under a deadline (epoch interruption), a memory cap and a
//! WASI sandbox with nothing granted but what the configuration says. A call that
//! fails is a [`CallError`]; the non-`try_` methods apply the world's failure
//! policy (see `docs/plugins.md`), and repeated failures disable a plugin with
//! back-off ([`BackoffPolicy`]). The ABI's types are in [`types`].
//!
//! ```no_run
//! # async fn f() -> anyhow::Result<()> {
//! use wasmlet_plugin_host::{HostOptions, PluginConfig, PluginHost};
//! let host = PluginHost::new(HostOptions::default())?;
//! let config: PluginConfig = serde_json::from_str(
//!     r#"{"name": "grpc", "world": "probe-plugin", "source": {"file": "/plugins/grpc.wasm"}}"#,
//! )?;
//! host.load(config).await?;
//! # Ok(()) }
//! ```

mod bindings;
pub mod config;
mod engine;
mod error;
mod health;
mod host;
mod metrics;
mod network;
mod policy;
pub mod results;
mod state;
pub mod types;
mod watch;

use wit_parser::{PackageId, Resolve};

pub use config::{
    ConfigError, FailurePolicy, FilesystemGrant, Grants, Limits, PluginConfig, PluginSource, World,
    validate_plugins,
};
pub use error::{CallError, Error, Result};
pub use health::BackoffPolicy;
pub use host::{EventSink, HostOptions, PluginEvent, PluginEventKind, PluginHost, PluginInfo};
pub use metrics::{DURATION_BUCKETS, PluginMetrics};
pub use policy::builtin_rank;
pub use results::RESULT_MAX;

/// The WIT source of the plugin ABI.
pub const WIT: &str = include_str!("../../wit/plugin.wit");

/// The worlds a plugin can target.
pub const WORLDS: [&str; 4] = [
    "probe-plugin",
    "admission-plugin",
    "eviction-plugin",
    "device-adapter-plugin",
];

/// Parses the ABI and returns it with the package's id.
pub fn abi() -> anyhow::Result<(Resolve, PackageId)> {
    let mut resolve = Resolve::default();
    let pkg = resolve.push_str("plugin.wit", WIT)?;
    Ok((resolve, pkg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_abi_parses_and_has_every_world() {
        let (resolve, pkg) = abi().unwrap();
        let package = &resolve.packages[pkg];
        assert_eq!(package.name.to_string(), "wasmlet:plugin@0.1.0");
        for world in WORLDS {
            assert!(package.worlds.contains_key(world), "missing world {world}");
        }
        for iface in [
            "types",
            "host",
            "pod-network",
            "probe",
            "admission",
            "eviction",
            "device-adapter",
        ] {
            assert!(
                package.interfaces.contains_key(iface),
                "missing interface {iface}"
            );
        }
        for world in World::ALL {
            assert!(WORLDS.contains(&world.as_str()));
        }
    }
}
