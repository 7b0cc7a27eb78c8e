//! Turning WASI preview 1 modules into components: commands (the workloads)
//! into `wasi:cli/command` components, libraries (the plugins) into components
//! that export what their embedded world says.

use anyhow::{Context, bail};
use wasi_preview1_component_adapter_provider::{
    WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME, WASI_SNAPSHOT_PREVIEW1_COMMAND_ADAPTER,
    WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER,
};
use wit_component::{ComponentEncoder, DecodedWasm};

use super::oci::ComponentInfo;

/// wasmlet's guest lifecycle interface (the cooperative stop signal).
const LIFECYCLE_WIT: &str = include_str!("../../../../runtimes/wasm/wit/lifecycle.wit");

/// Wrap a `wasm32-wasip1` command module (one exporting `_start` and its
/// memory) into a `wasi:cli/command` component, with the command adapter
/// that ships inside `wasi-preview1-component-adapter-provider`. A module that
/// imports from `wasmlet:lifecycle` gets that package's WIT embedded first, so
/// the component imports the interface by name.
pub fn componentize_command(module: &[u8]) -> anyhow::Result<Vec<u8>> {
    if !wasmparser::Parser::is_core_wasm(module) {
        bail!("componentize_command: input is not a core Wasm module");
    }
    let mut module = module.to_vec();
    if imports_lifecycle(&module)? {
        let mut resolve = wit_parser::Resolve::default();
        let package = resolve
            .push_str("lifecycle.wit", LIFECYCLE_WIT)
            .context("parsing wasmlet:lifecycle")?;
        let world = resolve.select_world(&[package], Some("guest"))?;
        wit_component::embed_component_metadata(
            &mut module,
            &resolve,
            world,
            wit_component::StringEncoding::UTF8,
        )
        .context("embedding the wasmlet:lifecycle world")?;
    }
    ComponentEncoder::default()
        .validate(true)
        .module(&module)
        .context("reading the core module")?
        .adapter(
            WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME,
            WASI_SNAPSHOT_PREVIEW1_COMMAND_ADAPTER,
        )
        .context("adding the wasi_snapshot_preview1 command adapter")?
        .encode()
        .context("encoding the component")
}

/// Wrap a `wasm32-wasip1` library module (a `cdylib` built with the plugin
/// SDK) into a component, with the reactor adapter that ships inside
/// `wasi-preview1-component-adapter-provider`. The world comes from the
/// module's `component-type` custom sections (wit-bindgen puts them there);
/// imports it does not use are dropped, and the component is validated.
pub fn componentize_library(module: &[u8]) -> anyhow::Result<Vec<u8>> {
    if !wasmparser::Parser::is_core_wasm(module) {
        bail!("componentize_library: input is not a core Wasm module");
    }
    ComponentEncoder::default()
        .validate(true)
        .module(module)
        .context("reading the core module and its component-type sections")?
        .adapter(
            WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME,
            WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER,
        )
        .context("adding the wasi_snapshot_preview1 reactor adapter")?
        .encode()
        .context("encoding the component")
}

fn imports_lifecycle(module: &[u8]) -> anyhow::Result<bool> {
    for payload in wasmparser::Parser::new(0).parse_all(module) {
        if let wasmparser::Payload::ImportSection(imports) = payload? {
            for import in imports.into_imports() {
                if import?.module.starts_with("wasmlet:lifecycle/") {
                    return Ok(true);
                }
            }
        }
    }
    Ok(false)
}

/// The imports and exports of a component's world, named as the CNCF Wasm
/// artifact config lists them (`wasi:cli/run@0.2.6`, ...).
pub fn component_info(component: &[u8]) -> anyhow::Result<ComponentInfo> {
    let (resolve, world) = match wit_component::decode(component).context("decoding component")? {
        DecodedWasm::Component(resolve, world) => (resolve, world),
        DecodedWasm::WitPackage(..) => bail!("binary is a WIT package, not a component"),
    };
    let world = &resolve.worlds[world];
    Ok(ComponentInfo {
        exports: world
            .exports
            .keys()
            .map(|key| resolve.name_world_key(key))
            .collect(),
        imports: world
            .imports
            .keys()
            .map(|key| resolve.name_world_key(key))
            .collect(),
        target: None,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `(module (memory (export "memory") 1) (func (export "_start")))`,
    /// hand-assembled: the smallest command module the adapter accepts.
    pub(crate) const START_MODULE: &[u8] = &[
        0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version 1
        0x01, 0x04, 0x01, 0x60, 0x00, 0x00, // type: [] -> []
        0x03, 0x02, 0x01, 0x00, // function: type 0
        0x05, 0x03, 0x01, 0x00, 0x01, // memory: min 1 page
        0x07, 0x13, 0x02, // export, 19 bytes, 2 entries
        0x06, b'm', b'e', b'm', b'o', b'r', b'y', 0x02, 0x00, // "memory" = memory 0
        0x06, b'_', b's', b't', b'a', b'r', b't', 0x00, 0x00, // "_start" = func 0
        0x0a, 0x04, 0x01, 0x02, 0x00, 0x0b, // code: empty body
    ];

    #[test]
    fn start_module_is_valid() {
        wasmparser::Validator::new()
            .validate_all(START_MODULE)
            .unwrap();
    }

    #[test]
    fn componentize_produces_a_command_component() {
        let component = componentize_command(START_MODULE).unwrap();
        assert!(wasmparser::Parser::is_component(&component));
        wasmparser::Validator::new_with_features(wasmparser::WasmFeatures::all())
            .validate_all(&component)
            .unwrap();
        let info = component_info(&component).unwrap();
        assert!(
            info.exports.iter().any(|e| e.starts_with("wasi:cli/run@")),
            "exports: {:?}",
            info.exports
        );
    }

    #[test]
    fn componentize_refuses_components() {
        let component = componentize_command(START_MODULE).unwrap();
        assert!(componentize_command(&component).is_err());
    }
}
