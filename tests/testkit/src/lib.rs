//! wasmlet-testkit
