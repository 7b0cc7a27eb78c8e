//! wasmlet-runtime
