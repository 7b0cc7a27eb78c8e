//! `containerd-shim-wasmlet-v1`: a containerd shim v2 (runtime type
//! `io.containerd.wasmlet.v1`) that runs Wasm containers on wasmlet's engine, for
//! clusters that keep the upstream kubelet.
//!
//! containerd runs this binary three ways, as it runs `containerd-shim-runc-v2`:
//! - `… -id ID start` in the bundle: find or start the shim of the container's pod
//!   (grouped by `io.kubernetes.cri.sandbox-id`) and print its ttrpc address
//!   ([`bootstrap::start`]);
//! - `… -id ID -bundle B delete`: clean up after a shim that died
//!   ([`bootstrap::delete`]);
//! - with no action, from `start`: the daemon serving the task API ([`serve`]).
//!
//! The daemon runs no Wasm itself: it starts one *sandbox process* per pod — this
//! binary again, `sandbox …`, which is wasmlet's own sandbox
//! ([`wasmlet_runtime_wasm::sandbox`]) — in the pod's cgroup and network namespace,
//! and drives it over the same protocol as the node does ([`sandbox`]). Tasks map onto
//! its containers in [`task`].

mod bootstrap;
mod cgroup;
mod events;
mod mount;
mod sandbox;
mod serve;
mod spec;
mod task;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("sandbox") {
        return wasmlet_runtime_wasm::sandbox::main(args.into_iter().skip(1));
    }
    let flags = match bootstrap::Flags::parse(&args) {
        Ok(flags) => flags,
        Err(e) => {
            eprintln!("containerd-shim-wasmlet-v1: {e}");
            return ExitCode::from(2);
        }
    };
    if flags.version {
        println!(
            "containerd-shim-wasmlet-v1 {} (task API v2 and v3, wasmtime engine)",
            env!("CARGO_PKG_VERSION")
        );
        return ExitCode::SUCCESS;
    }
    let result = match flags.action.as_deref() {
        Some("start") => bootstrap::start(&flags),
        Some("delete") => bootstrap::delete(&flags),
        None => serve::run(flags),
        Some(other) => Err(anyhow::anyhow!(
            "unknown action {other:?} (start, delete, or none to serve)"
        )),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("containerd-shim-wasmlet-v1: {e:#}");
            ExitCode::FAILURE
        }
    }
}
