//! wasmlet-node
