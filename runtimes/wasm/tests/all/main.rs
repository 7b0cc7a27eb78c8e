//! Integration tests of the Wasm runtime against real guests.
