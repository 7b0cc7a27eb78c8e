//! `wasmlet-plugin-sdk`: what plugin authors build against.
//!
//! Today it carries the ABI's WIT source, the same file the host compiles in, so a
//! plugin and the node always agree on it. The trait-per-world API and the export
//! macro (built with `wit-bindgen` for `wasm32-wasip1`) come with the plugin platform.

/// The WIT source of the plugin ABI (`wasmlet:plugin`).
pub const WIT: &str = include_str!("../../wit/plugin.wit");

/// The ABI version this SDK targets.
pub const ABI_VERSION: &str = "0.1.0";

#[cfg(test)]
mod tests {
    #[test]
    fn the_sdk_targets_the_packaged_abi_version() {
        assert!(super::WIT.contains(&format!("package wasmlet:plugin@{};", super::ABI_VERSION)));
    }
}
