//! `wasmlet-plugin-sdk`: what plugin authors build against.
//!
//! A wasmlet plugin is a Wasm component that exports one world of the
//! `wasmlet:plugin` ABI ([`WIT`]). With this crate a plugin is a `cdylib` crate
//! with one trait impl and one export macro:
//!
//! | world | trait | macro |
//! | --- | --- | --- |
//! | `probe-plugin` | [`probe::Probe`] | [`export_probe!`] |
//! | `admission-plugin` | [`admission::Admission`] | [`export_admission!`] |
//! | `eviction-plugin` | [`eviction::Eviction`] | [`export_eviction!`] |
//! | `device-adapter-plugin` | [`device::DeviceAdapter`] | [`export_device_adapter!`] |
//!
//! ```no_run
//! use wasmlet_plugin_sdk::probe::{Probe, ProbeRequest, ProbeResult};
//!
//! struct AlwaysReady;
//!
//! impl Probe for AlwaysReady {
//!     fn check(request: ProbeRequest) -> ProbeResult {
//!         wasmlet_plugin_sdk::info!("checking {}", request.container);
//!         ProbeResult::Success
//!     }
//! }
//!
//! wasmlet_plugin_sdk::export_probe!(AlwaysReady);
//! ```
//!
//! Every world may use the node's [`host`] functions (log, settings, clock);
//! probes also reach their pod through [`pod_network`]. Build for
//! `wasm32-wasip1` and turn the module into a component with the preview 1
//! reactor adapter: `plugins/README.md` walks through it.
//!
//! Start reading at the world module you need; [`bindings`] holds the
//! `wit-bindgen` output everything else re-exports. On targets other than
//! `wasm32` the crate builds too (for unit tests of a plugin's logic), but
//! calling a host import there panics.

// The generated export macros name `wasmlet_plugin_sdk::...` paths; this makes
// the same paths resolve inside the SDK itself.
extern crate self as wasmlet_plugin_sdk;

pub mod admission;
// The generated code lowers and lifts values across the component ABI with raw
// pointers and `export_name` functions: that is what `unsafe` is for here, and it
// is confined to this one generated module.
#[allow(unsafe_code)]
pub mod bindings;
pub mod device;
pub mod eviction;
pub mod host;
pub mod pod_network;
pub mod probe;
pub mod types;

/// The WIT source of the plugin ABI (`wasmlet:plugin`).
pub const WIT: &str = include_str!("../../wit/plugin.wit");

/// The ABI version this SDK targets.
pub const ABI_VERSION: &str = "0.1.0";

/// The WIT package this SDK targets, with its version: `wasmlet:plugin@0.1.0`.
pub const PACKAGE: &str = "wasmlet:plugin@0.1.0";

#[cfg(test)]
mod tests {
    #[test]
    fn the_sdk_targets_the_packaged_abi_version() {
        assert!(super::WIT.contains(&format!("package wasmlet:plugin@{};", super::ABI_VERSION)));
        assert_eq!(
            super::PACKAGE,
            format!("wasmlet:plugin@{}", super::ABI_VERSION)
        );
    }
}
