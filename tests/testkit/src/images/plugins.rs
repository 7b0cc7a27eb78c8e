//! Building the plugin workspace `examples/plugins` into components.
//!
//! Every crate there is a `cdylib` built with the plugin SDK: the guest build
//! ([`build_guest_workspace`] with [`GuestLink::Library`]) makes a core module
//! per crate, and [`componentize_library`] wraps each with the WASI preview 1
//! reactor adapter into `<out_dir>/<crate-name>.component.wasm`.
//!
//! Host tests call [`ensure_plugins`]: one build per process, serialised across
//! processes, output in `<workspace root>/target/plugins`.
//!
//! ```no_run
//! use wasmlet_testkit::images::{ensure_plugins, EXAMPLE_PLUGINS};
//! let plugins = ensure_plugins()?;
//! let probe = &plugins["http-json-probe"]; // target/plugins/http-json-probe.component.wasm
//! let component = std::fs::read(probe)?;
//! # anyhow::Ok(())
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::Context;

use super::component::componentize_library;
use super::guests::{GuestLink, build_guest_workspace};
use super::oci::write_atomic;

/// The plugin ABI package the examples are built against.
pub const PLUGIN_PACKAGE: &str = "wasmlet:plugin@0.1.0";

/// The worlds of the plugin ABI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PluginWorld {
    /// `probe-plugin`: exports `probe`, imports `host` and `pod-network`.
    Probe,
    /// `admission-plugin`: exports `admission`.
    Admission,
    /// `eviction-plugin`: exports `eviction`.
    Eviction,
    /// `device-adapter-plugin`: exports `device-adapter`.
    DeviceAdapter,
}

impl PluginWorld {
    /// Every world.
    pub const ALL: [PluginWorld; 4] = [
        PluginWorld::Probe,
        PluginWorld::Admission,
        PluginWorld::Eviction,
        PluginWorld::DeviceAdapter,
    ];

    /// The world's name in the WIT package, e.g. `probe-plugin`.
    pub fn world_name(self) -> &'static str {
        match self {
            PluginWorld::Probe => "probe-plugin",
            PluginWorld::Admission => "admission-plugin",
            PluginWorld::Eviction => "eviction-plugin",
            PluginWorld::DeviceAdapter => "device-adapter-plugin",
        }
    }

    /// The one interface a component of this world exports, fully named:
    /// `wasmlet:plugin/probe@0.1.0`, ...
    pub fn export(self) -> &'static str {
        match self {
            PluginWorld::Probe => "wasmlet:plugin/probe@0.1.0",
            PluginWorld::Admission => "wasmlet:plugin/admission@0.1.0",
            PluginWorld::Eviction => "wasmlet:plugin/eviction@0.1.0",
            PluginWorld::DeviceAdapter => "wasmlet:plugin/device-adapter@0.1.0",
        }
    }

    /// The `wasmlet:plugin` interfaces the world may import.
    pub fn imports(self) -> &'static [&'static str] {
        match self {
            PluginWorld::Probe => &[
                "wasmlet:plugin/types@0.1.0",
                "wasmlet:plugin/host@0.1.0",
                "wasmlet:plugin/pod-network@0.1.0",
            ],
            _ => &["wasmlet:plugin/types@0.1.0", "wasmlet:plugin/host@0.1.0"],
        }
    }
}

/// A crate of `examples/plugins`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExamplePlugin {
    /// The crate's name, also the file name: `<name>.component.wasm`.
    pub name: &'static str,
    /// The world it implements.
    pub world: PluginWorld,
    /// Whether it misbehaves on purpose, for the host's limit tests.
    pub hostile: bool,
}

const fn example(name: &'static str, world: PluginWorld) -> ExamplePlugin {
    ExamplePlugin {
        name,
        world,
        hostile: false,
    }
}

const fn hostile(name: &'static str) -> ExamplePlugin {
    ExamplePlugin {
        name,
        world: PluginWorld::Probe,
        hostile: true,
    }
}

/// Every plugin of `examples/plugins`. The hostile ones are probes, each
/// breaking one limit in `check` (settings in parentheses, read from the probe
/// request's `settings`, then the node's):
///
/// - `hostile-loop`: never returns;
/// - `hostile-membomb`: allocates and touches `bytes` (1 GiB) in `step` (1 MiB) chunks;
/// - `hostile-trap`: traps; `mode` = `panic` (default), `unreachable`, `divide`, `abort`;
/// - `hostile-huge`: returns a failure message of `bytes` (64 MiB);
/// - `hostile-file`: reads `path` (`/etc/passwd`): `Success` if it could,
///   `Failure("denied: ...")` if not;
/// - `hostile-socket`: connects to `ip`:`port` (`127.0.0.1`:`80`) with
///   `wasi:sockets`: `Success` if it could, `Failure("denied: ...")` if not.
pub const EXAMPLE_PLUGINS: [ExamplePlugin; 10] = [
    example("http-json-probe", PluginWorld::Probe),
    example("require-label-admission", PluginWorld::Admission),
    example("priority-eviction", PluginWorld::Eviction),
    example("widget-device", PluginWorld::DeviceAdapter),
    hostile("hostile-loop"),
    hostile("hostile-membomb"),
    hostile("hostile-trap"),
    hostile("hostile-huge"),
    hostile("hostile-file"),
    hostile("hostile-socket"),
];

/// `<name>.component.wasm`.
pub fn plugin_file_name(name: &str) -> String {
    format!("{name}.component.wasm")
}

/// Build `<workspace_root>/examples/plugins` and write every
/// [`EXAMPLE_PLUGINS`] component to `<workspace_root>/target/plugins`.
/// Returns crate name → `<root>/target/plugins/<name>.component.wasm`.
/// Incremental; not serialised: tests use [`ensure_plugins`].
pub fn build_plugins(workspace_root: &Path) -> anyhow::Result<BTreeMap<String, PathBuf>> {
    build_plugins_into(
        workspace_root,
        &workspace_root.join("target").join("plugins"),
    )
}

/// [`build_plugins`] writing to `out_dir`. Files whose content is unchanged
/// are left alone; changed ones are replaced atomically.
pub fn build_plugins_into(
    workspace_root: &Path,
    out_dir: &Path,
) -> anyhow::Result<BTreeMap<String, PathBuf>> {
    let workspace = workspace_root.join("examples").join("plugins");
    let modules = build_guest_workspace(&workspace, GuestLink::Library)?;
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let mut built = BTreeMap::new();
    for plugin in EXAMPLE_PLUGINS {
        // cargo names a cdylib after the crate, with `-` turned into `_`.
        let module_path = modules.join(format!("{}.wasm", plugin.name.replace('-', "_")));
        let module = std::fs::read(&module_path)
            .with_context(|| format!("reading plugin module {}", module_path.display()))?;
        let component = componentize_library(&module)
            .with_context(|| format!("componentizing {}", module_path.display()))?;
        let path = out_dir.join(plugin_file_name(plugin.name));
        write_atomic(&path, &component)?;
        built.insert(plugin.name.to_string(), path);
    }
    Ok(built)
}

/// Make sure `<workspace root>/target/plugins` holds up-to-date components of
/// [`EXAMPLE_PLUGINS`] and return crate name → path. Safe to call from many
/// tests at once: one build per process, and an exclusive lock on
/// `target/plugins/.lock` across processes.
pub fn ensure_plugins() -> anyhow::Result<BTreeMap<String, PathBuf>> {
    static DONE: OnceLock<Result<BTreeMap<String, PathBuf>, String>> = OnceLock::new();
    DONE.get_or_init(|| ensure_plugins_locked().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(|e| anyhow::anyhow!("building example plugins: {e}"))
}

fn ensure_plugins_locked() -> anyhow::Result<BTreeMap<String, PathBuf>> {
    let root = super::workspace_root()?;
    let out_dir = root.join("target").join("plugins");
    super::with_build_lock(&out_dir, || build_plugins_into(&root, &out_dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::images::component_info;

    /// The `[workspace] members` of `examples/plugins`, by package name.
    fn workspace_packages(root: &Path) -> Vec<String> {
        let dir = root.join("examples/plugins");
        let toml = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        let members = toml
            .split_once("members = [")
            .and_then(|(_, rest)| rest.split_once(']'))
            .map(|(list, _)| list)
            .expect("a members list");
        let mut names: Vec<String> = members
            .lines()
            .map(|l| l.split('#').next().unwrap().trim().trim_end_matches(','))
            .filter(|l| !l.is_empty())
            .map(|member| {
                let member = member.trim_matches('"');
                let manifest =
                    std::fs::read_to_string(dir.join(member).join("Cargo.toml")).unwrap();
                manifest
                    .lines()
                    .find_map(|l| l.strip_prefix("name = "))
                    .unwrap()
                    .trim_matches('"')
                    .to_string()
            })
            .collect();
        names.sort();
        names
    }

    #[test]
    fn every_workspace_crate_is_listed_once() {
        let root = crate::images::workspace_root().unwrap();
        let mut listed: Vec<String> = EXAMPLE_PLUGINS.iter().map(|p| p.name.to_string()).collect();
        listed.sort();
        assert_eq!(listed, workspace_packages(&root));
        assert!(
            EXAMPLE_PLUGINS
                .iter()
                .all(|p| p.hostile == p.name.starts_with("hostile-"))
        );
    }

    /// The real thing: build the plugins with the Debian toolchain, then check
    /// that each is a valid component exporting exactly its world's interface
    /// and importing nothing beyond its world and WASI. Slow only the first
    /// time (about 5 minutes on 2 cores).
    #[test]
    fn plugins_are_components_of_their_world() {
        let built = ensure_plugins().unwrap();
        assert_eq!(built.len(), EXAMPLE_PLUGINS.len());
        for plugin in EXAMPLE_PLUGINS {
            let path = &built[plugin.name];
            assert_eq!(
                path.file_name().unwrap().to_str().unwrap(),
                plugin_file_name(plugin.name)
            );
            let wasm = std::fs::read(path).unwrap();
            assert!(wasmparser::Parser::is_component(&wasm), "{}", plugin.name);
            wasmparser::Validator::new_with_features(wasmparser::WasmFeatures::all())
                .validate_all(&wasm)
                .unwrap_or_else(|e| panic!("{}: {e}", plugin.name));
            let info = component_info(&wasm).unwrap();
            assert_eq!(
                info.exports,
                vec![plugin.world.export().to_string()],
                "{}",
                plugin.name
            );
            for import in &info.imports {
                assert!(
                    plugin.world.imports().contains(&import.as_str())
                        || import.starts_with("wasi:"),
                    "{} imports {import}",
                    plugin.name
                );
            }
        }
        let imports = |name: &str| component_info(&std::fs::read(&built[name]).unwrap()).unwrap();
        let probe = imports("http-json-probe");
        assert!(
            probe
                .imports
                .contains(&"wasmlet:plugin/pod-network@0.1.0".to_string()),
            "{probe:?}"
        );
        let admission = imports("require-label-admission");
        assert!(
            admission
                .imports
                .contains(&"wasmlet:plugin/host@0.1.0".to_string()),
            "{admission:?}"
        );
        let socket = imports("hostile-socket");
        assert!(
            socket
                .imports
                .iter()
                .any(|i| i.starts_with("wasi:sockets/tcp@0.2.")),
            "{socket:?}"
        );
    }
}
