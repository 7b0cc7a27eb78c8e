//! The wasmtime engine every Wasm pod runs on, and the node's compile cache.
//!
//! Modules and components are compiled once per node and kept as precompiled
//! artifacts keyed by the binary's digest and the engine's compatibility hash, so a
//! restart or a second pod with the same image loads in milliseconds.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};

use wasmtime::component::Component;
use wasmtime::error::Context as _;
use wasmtime::{Config, Engine, Module, OptLevel};

use crate::image::WasmKind;
use crate::precompiled;
pub use crate::precompiled::Compiled;

/// The engine configuration shared by sandboxes (and the shim): epoch interruption, so
/// an async guest yields (and can be cancelled) at every tick, and the component model
/// for `wasi:cli/command` components.
pub fn config() -> Config {
    let mut config = Config::new();
    config
        .epoch_interruption(true)
        .wasm_component_model(true)
        .cranelift_opt_level(OptLevel::Speed);
    config
}

/// A new engine with [`config`].
pub fn new_engine() -> wasmtime::Result<Engine> {
    Engine::new(&config())
}

/// Loads `wasm_path` from the compile cache in `cache_dir`, compiling and caching it
/// on a miss. The binary's digest is checked before it is compiled.
pub fn load(
    engine: &Engine,
    cache_dir: &Path,
    wasm_path: &Path,
    wasm_digest: &str,
    kind: WasmKind,
) -> wasmtime::Result<Compiled> {
    let cached = cache_path(engine, cache_dir, wasm_digest);
    if cached.exists() {
        match precompiled::load(engine, &cached, kind) {
            Ok(compiled) => return Ok(compiled),
            Err(e) => {
                tracing::warn!(path = %cached.display(), "ignoring unusable compile cache entry: {e:#}")
            }
        }
    }
    let bytes =
        std::fs::read(wasm_path).with_context(|| format!("reading {}", wasm_path.display()))?;
    let actual = format!("sha256:{}", crate::image::sha256_hex(&bytes));
    wasmtime::ensure!(
        actual == wasm_digest,
        "{} has digest {actual}, expected {wasm_digest}: the image store is corrupt",
        wasm_path.display()
    );
    let (compiled, serialized) = match kind {
        WasmKind::Module => {
            let m = Module::new(engine, &bytes).context("compiling the Wasm module")?;
            let s = m.serialize()?;
            (Compiled::Module(m), s)
        }
        WasmKind::Component => {
            let c = Component::new(engine, &bytes).context("compiling the Wasm component")?;
            let s = c.serialize()?;
            (Compiled::Component(c), s)
        }
    };
    if let Err(e) = write_cache(&cached, &serialized) {
        tracing::warn!(path = %cached.display(), "cannot write compile cache entry: {e}");
    }
    Ok(compiled)
}

/// Where the precompiled artifact for a binary lives.
pub fn cache_path(engine: &Engine, cache_dir: &Path, wasm_digest: &str) -> PathBuf {
    let mut h = DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    let hex = wasm_digest.trim_start_matches("sha256:");
    cache_dir.join(format!("{hex}-{:016x}.cwasm", h.finish()))
}

fn write_cache(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().expect("cache paths have a parent");
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".tmp-{}-{}", std::process::id(), rand_suffix()));
    std::fs::write(&tmp, data)?;
    std::fs::rename(&tmp, path)
}

fn rand_suffix() -> u64 {
    let mut h = DefaultHasher::new();
    std::time::SystemTime::now().hash(&mut h);
    std::thread::current().id().hash(&mut h);
    h.finish()
}
