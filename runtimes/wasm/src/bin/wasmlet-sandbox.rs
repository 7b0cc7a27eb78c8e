//! The sandbox process as a stand-alone binary, for this crate's tests. The node itself
//! runs the same code as `wasmlet sandbox`.

fn main() -> std::process::ExitCode {
    wasmlet_runtime_wasm::sandbox::main(std::env::args().skip(1))
}
