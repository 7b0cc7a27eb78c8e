//! `wasmlet-runtime-wasm`: the native Wasm runtime of wasmlet.
//!
//! Each Wasm pod runs in its own *sandbox process* ([`sandbox`]), started by the node,
//! with one wasmtime store per container. WASI preview 1 modules and preview 2
//! `wasi:cli/command` components both run; stdout and stderr go to CRI-format log
//! files ([`crilog`]); images come from a content-addressed store ([`image`]). The
//! sandbox process runs in the pod's cgroup, placed there before it execs ([`cgroup`]).
//!
//! Start reading at [`WasmRuntime`], the node's side, then [`sandbox`], the process
//! side, and [`protocol`], what they say to each other.

pub mod cgroup;
pub mod confine;
pub mod crilog;
pub mod engine;
pub mod image;
pub mod mountinfo;
pub mod network;
mod precompiled;
pub mod protocol;
pub mod registry;
pub mod runtime;
pub mod sandbox;
mod stdio;
mod sys;

pub use image::{ImageStore, WasmKind};
pub use runtime::{HANDLER, SandboxCommand, WasmRuntime, WasmRuntimeConfig};
