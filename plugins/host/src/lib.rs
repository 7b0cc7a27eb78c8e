//! `wasmlet-plugin-host`: loads, limits and calls the node's Wasm plugins.
//!
//! So far it owns the ABI: [`abi`] parses the WIT package `wasmlet:plugin` from
//! `plugins/wit` (compiled into the crate) and names its worlds. Loading, pooling and
//! sandboxing plugins come with the plugin platform.

use wit_parser::{PackageId, Resolve};

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
        for iface in ["types", "host", "pod-network", "probe", "admission", "eviction", "device-adapter"] {
            assert!(
                package.interfaces.contains_key(iface),
                "missing interface {iface}"
            );
        }
    }
}
