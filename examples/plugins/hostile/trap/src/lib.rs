//! `hostile-trap`: a probe that traps. Setting `mode`: `panic` (default; with
//! `panic = "abort"` a panic ends in a trap), `unreachable` (the Wasm
//! `unreachable` instruction), `divide` (an integer division by zero) or
//! `abort` (`std::process::abort`). The plugin host must turn the trap into an
//! error result and keep the plugin usable for the next call.

use wasmlet_plugin_sdk::probe::{Probe, ProbeRequest, ProbeResult};

struct Trap;

impl Probe for Trap {
    fn check(request: ProbeRequest) -> ProbeResult {
        let settings = request.settings();
        match settings.get_or("mode", "panic") {
            "unreachable" => unreachable_instruction(),
            "divide" => {
                let zero = std::hint::black_box(0u32);
                ProbeResult::failure(format!("{}", 1 / zero))
            }
            "abort" => std::process::abort(),
            _ => panic!("hostile-trap panics on purpose"),
        }
    }
}

#[cfg(target_arch = "wasm32")]
fn unreachable_instruction() -> ! {
    core::arch::wasm32::unreachable()
}

#[cfg(not(target_arch = "wasm32"))]
fn unreachable_instruction() -> ! {
    std::process::abort()
}

wasmlet_plugin_sdk::export_probe!(Trap);
