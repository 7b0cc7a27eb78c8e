//! What a plugin component is made of, for `wasmlet plugin adapter`, `componentize`
//! and `check`: the preview-1 adapter the node embeds, the core module made a
//! component, and the component's world read back against the ABI.

use std::fmt::Write as _;

use anyhow::{Context, bail};
use wasi_preview1_component_adapter_provider::{
    WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME, WASI_SNAPSHOT_PREVIEW1_COMMAND_ADAPTER,
    WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER,
};
use wasmlet_plugin_host::{Grants, World};

/// The ABI package this node speaks.
pub const ABI_PACKAGE: &str = "wasmlet:plugin@0.1.0";

/// The WASI preview 1 adapter of the node's wasmtime: the reactor one (plugins are
/// libraries) or the command one (a `_start` program).
pub fn adapter(command: bool) -> &'static [u8] {
    if command {
        WASI_SNAPSHOT_PREVIEW1_COMMAND_ADAPTER
    } else {
        WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER
    }
}

/// A core module (with its world in `component-type` custom sections, as
/// wit-bindgen's generators put it there) made a component with the preview 1
/// adapter. A component is returned as it is.
pub fn componentize(wasm: &[u8], command: bool) -> anyhow::Result<Vec<u8>> {
    if wasmparser::Parser::is_component(wasm) {
        return Ok(wasm.to_vec());
    }
    if !wasmparser::Parser::is_core_wasm(wasm) {
        bail!("not a Wasm binary (bad header)");
    }
    wit_component::ComponentEncoder::default()
        .validate(true)
        .module(wasm)
        .context("reading the module's component-type sections (was it linked with its wit-bindgen `*_component_type.o` or built with wit-bindgen?)")?
        .adapter(WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME, adapter(command))
        .context("the preview 1 adapter")?
        .encode()
        .context("encoding the component")
}

/// A component's imports and exports by name (`wasi:cli/environment@0.2.3`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    pub imports: Vec<String>,
    pub exports: Vec<String>,
}

/// Reads a component's shape; a core module or anything else is an error that says
/// what to do.
pub fn shape(wasm: &[u8]) -> anyhow::Result<Shape> {
    if wasmparser::Parser::is_core_wasm(wasm) {
        bail!(
            "a core module, not a component: make it one with `wasmlet plugin componentize FILE -o OUT` \
             (or `wasm-tools component new FILE --adapt wasi_snapshot_preview1=<wasmlet plugin adapter --reactor> -o OUT`)"
        );
    }
    if !wasmparser::Parser::is_component(wasm) {
        bail!("not a Wasm binary (bad header)");
    }
    let (resolve, world) = match wit_component::decode(wasm).context("decoding the component")? {
        wit_component::DecodedWasm::Component(resolve, world) => (resolve, world),
        wit_component::DecodedWasm::WitPackage(..) => {
            bail!("a WIT package, not a component")
        }
    };
    let world = &resolve.worlds[world];
    let names = |items: &wit_parser::IndexMap<wit_parser::WorldKey, wit_parser::WorldItem>| {
        items
            .iter()
            .filter(|(_, item)| !matches!(item, wit_parser::WorldItem::Type { .. }))
            .map(|(key, _)| resolve.name_world_key(key))
            .collect()
    };
    Ok(Shape {
        imports: names(&world.imports),
        exports: names(&world.exports),
    })
}

/// The world a component implements, from its exports; an error names what is
/// wrong (another ABI version, no plugin export, several).
pub fn world_of(shape: &Shape) -> anyhow::Result<World> {
    let ours: Vec<World> = World::ALL
        .into_iter()
        .filter(|w| shape.exports.iter().any(|e| e == w.export()))
        .collect();
    match ours[..] {
        [world] => Ok(world),
        [] => {
            if let Some(other) = shape
                .exports
                .iter()
                .find(|e| e.starts_with("wasmlet:plugin/"))
            {
                bail!(
                    "it exports {other}, which is not this node's ABI ({ABI_PACKAGE}): rebuild it against the node's plugins/wit"
                );
            }
            bail!(
                "it exports no plugin interface (exports: {}); a plugin exports one of {}",
                list_or_none(&shape.exports),
                World::ALL.map(World::export).join(", ")
            )
        }
        _ => bail!(
            "it exports the interfaces of several worlds ({}); a plugin implements exactly one",
            ours.iter()
                .map(|w| w.export())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".into()
    } else {
        items.join(", ")
    }
}

/// What the node gives an import of a `world` plugin under `grants`: `Ok` with a
/// note, or `Err` when the node does not offer it (the component will not link).
pub fn import_verdict(import: &str, world: World, grants: &Grants) -> Result<String, String> {
    let (interface, version) = import.split_once('@').unwrap_or((import, ""));
    let wasi_02 = version.starts_with("0.2.");
    match interface {
        "wasmlet:plugin/host" if version == "0.1.0" => {
            Ok("the node's log, settings and clock".into())
        }
        "wasmlet:plugin/types" if version == "0.1.0" => Ok("the ABI's types".into()),
        "wasmlet:plugin/pod-network" if version == "0.1.0" => {
            if world == World::Probe {
                Ok(
                    "HTTP GET and TCP connect to the pod's own IPs, within the probe's deadline"
                        .into(),
                )
            } else {
                Err(format!(
                    "only probe plugins get pod-network, not the {world} world"
                ))
            }
        }
        i if i.starts_with("wasmlet:plugin/") => Err(format!(
            "not in this node's ABI ({ABI_PACKAGE}): rebuild against the node's plugins/wit"
        )),
        i if i.starts_with("wasi:sockets/") && wasi_02 => Ok(if grants.network {
            "granted (grants.network)".into()
        } else {
            "linked, but every socket call is denied: grants.network is false".into()
        }),
        "wasi:filesystem/preopens" | "wasi:filesystem/types" if wasi_02 => {
            Ok(if grants.filesystem.is_empty() {
                "linked, with no directory: grants.filesystem is empty".into()
            } else {
                let dirs: Vec<String> = grants
                    .filesystem
                    .iter()
                    .map(|g| format!("{}{}", g.guest_path, if g.read_only { " (ro)" } else { "" }))
                    .collect();
                format!("directories {}", dirs.join(", "))
            })
        }
        "wasi:cli/environment" if wasi_02 => Ok("an empty environment and no arguments".into()),
        "wasi:cli/stdout" | "wasi:cli/stderr" if wasi_02 => {
            Ok("to the node's log, line by line, tagged with the plugin's name".into())
        }
        "wasi:cli/stdin" if wasi_02 => Ok("empty".into()),
        i if wasi_02
            && ["wasi:io/", "wasi:clocks/", "wasi:random/", "wasi:cli/"]
                .iter()
                .any(|p| i.starts_with(p)) =>
        {
            Ok("offered".into())
        }
        _ => Err("the node does not offer it".into()),
    }
}

/// The `check` report: the world, the imports with what the node gives each, and
/// whether anything keeps the component from linking.
pub fn report(shape: &Shape, world: World, grants: &Grants) -> (String, bool) {
    let mut out = String::new();
    let mut ok = true;
    let _ = writeln!(out, "world:   {} ({ABI_PACKAGE})", world.as_str());
    let _ = writeln!(out, "exports: {}", list_or_none(&shape.exports));
    let _ = writeln!(out, "imports:");
    let width = shape.imports.iter().map(String::len).max().unwrap_or(0);
    for import in &shape.imports {
        match import_verdict(import, world, grants) {
            Ok(note) => {
                let _ = writeln!(out, "  {import:<width$}  ok: {note}");
            }
            Err(why) => {
                ok = false;
                let _ = writeln!(out, "  {import:<width$}  REFUSED: {why}");
            }
        }
    }
    (out, ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imports_are_judged_by_world_and_grants() {
        let none = Grants::default();
        assert!(import_verdict("wasmlet:plugin/host@0.1.0", World::Admission, &none).is_ok());
        assert!(import_verdict("wasmlet:plugin/pod-network@0.1.0", World::Probe, &none).is_ok());
        let err = import_verdict("wasmlet:plugin/pod-network@0.1.0", World::Admission, &none)
            .unwrap_err();
        assert!(err.contains("only probe plugins"), "{err}");
        assert!(import_verdict("wasmlet:plugin/host@0.2.0", World::Probe, &none).is_err());
        let sockets = import_verdict("wasi:sockets/tcp@0.2.3", World::Probe, &none).unwrap();
        assert!(sockets.contains("denied"), "{sockets}");
        let granted = Grants {
            network: true,
            ..Grants::default()
        };
        assert!(
            import_verdict("wasi:sockets/tcp@0.2.3", World::Probe, &granted)
                .unwrap()
                .starts_with("granted")
        );
        assert!(import_verdict("wasi:http/outgoing-handler@0.2.0", World::Probe, &none).is_err());
        assert!(import_verdict("wasi:io/streams@0.2.6", World::Probe, &none).is_ok());
    }

    #[test]
    fn a_core_module_is_told_to_be_componentized() {
        let module = wat_module();
        let err = shape(&module).unwrap_err().to_string();
        assert!(err.contains("wasmlet plugin componentize"), "{err}");
        assert!(shape(b"not wasm").is_err());
    }

    #[test]
    fn the_world_comes_from_the_exports() {
        let shape = |exports: &[&str]| Shape {
            imports: vec![],
            exports: exports.iter().map(|s| s.to_string()).collect(),
        };
        assert_eq!(
            world_of(&shape(&["wasmlet:plugin/eviction@0.1.0"])).unwrap(),
            World::Eviction
        );
        let err = world_of(&shape(&["wasmlet:plugin/probe@0.2.0"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("not this node's ABI"), "{err}");
        assert!(world_of(&shape(&[])).is_err());
        assert!(
            world_of(&shape(&[
                "wasmlet:plugin/probe@0.1.0",
                "wasmlet:plugin/admission@0.1.0"
            ]))
            .is_err()
        );
    }

    /// `(module)`: the smallest core module.
    fn wat_module() -> Vec<u8> {
        vec![0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00]
    }
}
