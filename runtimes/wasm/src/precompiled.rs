//! Loading precompiled artifacts: one of the three places this crate uses `unsafe` (the
//! others are [`crate::sys`] and [`crate::sandbox::zygote`]).
#![allow(unsafe_code)] // reason: wasmtime's deserialize is unsafe; see the SAFETY note below.

use std::path::Path;

use wasmtime::component::Component;
use wasmtime::{Engine, Module};

use crate::image::WasmKind;

/// A compiled binary, ready to be linked.
pub enum Compiled {
    Module(Module),
    Component(Component),
}

/// Maps a precompiled artifact from the node's compile cache.
pub fn load(engine: &Engine, path: &Path, kind: WasmKind) -> wasmtime::Result<Compiled> {
    // SAFETY: the compile cache is a directory under the node's root dir, written only by
    // `engine::load` from `Module::serialize`/`Component::serialize` of an engine with
    // the same configuration (the file name carries the engine's compatibility hash, and
    // wasmtime re-checks version and flags on load). Files are written to a temporary
    // name and renamed into place, so a reader never maps a partial file.
    unsafe {
        Ok(match kind {
            WasmKind::Module => Compiled::Module(Module::deserialize_file(engine, path)?),
            WasmKind::Component => Compiled::Component(Component::deserialize_file(engine, path)?),
        })
    }
}
