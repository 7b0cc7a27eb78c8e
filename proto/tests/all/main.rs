//! Integration tests of the wire contracts: field numbers and RPC paths are
//! checked against values written out from the upstream `.proto` files, so a
//! wrong number or name in this crate's `.proto` files fails here.

mod client_paths;
mod descriptor;
mod roundtrip;
mod wire;
