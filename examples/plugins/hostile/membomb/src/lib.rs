//! `hostile-membomb`: a probe that allocates and touches memory until it has
//! `bytes` (setting, default 1 GiB), in `step` chunks (default 1 MiB). The plugin
//! host's memory cap must stop it with an error, not the node. Should it get
//! through, it reports `Failure("allocated <n> bytes")`.

use wasmlet_plugin_sdk::probe::{Probe, ProbeRequest, ProbeResult};

struct MemBomb;

impl Probe for MemBomb {
    fn check(request: ProbeRequest) -> ProbeResult {
        let settings = request.settings();
        let total: usize = settings.parse_or("bytes", 1 << 30).unwrap_or(1 << 30);
        let step: usize = settings.parse_or("step", 1 << 20).unwrap_or(1 << 20).max(1);
        let mut chunks: Vec<Vec<u8>> = Vec::new();
        let mut allocated = 0usize;
        while allocated < total {
            // Touch every page so the memory is really used.
            let chunk = vec![0xa5u8; step];
            allocated += chunk.len();
            chunks.push(std::hint::black_box(chunk));
        }
        ProbeResult::failure(format!(
            "allocated {allocated} bytes in {} chunks",
            chunks.len()
        ))
    }
}

wasmlet_plugin_sdk::export_probe!(MemBomb);
