//! `hostile-loop`: a probe whose `check` never returns. The plugin host must stop
//! it at the probe's deadline (epoch interruption or fuel) and keep working.

use wasmlet_plugin_sdk::probe::{Probe, ProbeRequest, ProbeResult};

struct Loop;

impl Probe for Loop {
    fn check(_request: ProbeRequest) -> ProbeResult {
        let mut spins: u64 = 0;
        loop {
            // black_box: the optimiser may not prove the loop does nothing.
            spins = std::hint::black_box(spins.wrapping_add(1));
        }
    }
}

wasmlet_plugin_sdk::export_probe!(Loop);
