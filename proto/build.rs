//! Compiles the `.proto` files under this crate with `protox` (a pure-Rust
//! protobuf compiler, so no `protoc` is needed) and generates prost messages
//! plus tonic clients and servers with `tonic-prost-build`.
//!
//! The compiled `FileDescriptorSet` is also written to
//! `$OUT_DIR/wasmlet_proto_descriptor.bin`, which the crate exposes as
//! `FILE_DESCRIPTOR_SET` (for tests, gRPC reflection and debugging tools).

use std::env;
use std::path::PathBuf;

use prost::Message as _;

/// The `.proto` files, relative to this crate's root (the include root).
const PROTOS: &[&str] = &[
    "cri/v1/api.proto",
    "deviceplugin/v1beta1/api.proto",
    "pluginregistration/v1/api.proto",
    "csi/v1/csi.proto",
    "grpc/health/v1/health.proto",
];

/// Directories holding the `.proto` files, watched for changes.
const PROTO_DIRS: &[&str] = &["cri", "deviceplugin", "pluginregistration", "csi", "grpc"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for dir in PROTO_DIRS {
        println!("cargo:rerun-if-changed={dir}");
    }
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }

    // protox resolves `google/protobuf/*.proto` imports from its bundled copies.
    let fds = protox::compile(PROTOS, ["."])?;

    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("wasmlet_proto_descriptor.bin"),
        fds.encode_to_vec(),
    )?;

    // The imported well-known types (google.protobuf.*) are part of `fds`, so
    // prost-build can see their shape, but it maps them to prost-types
    // instead of generating code for them.
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;

    Ok(())
}
