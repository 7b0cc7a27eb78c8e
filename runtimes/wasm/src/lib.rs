//! wasmlet-runtime-wasm
