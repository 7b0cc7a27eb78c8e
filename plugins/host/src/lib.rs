//! wasmlet-plugin-host
