//! wasmlet-proto
