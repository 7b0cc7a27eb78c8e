//! wasmlet-plugin-sdk
