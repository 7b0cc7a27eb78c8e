//! `hostile-huge`: a probe whose answer is huge: a failure message of `bytes`
//! (setting, default 64 MiB). The plugin host must refuse to copy it out (a
//! result-size limit, or the memory cap) and report an error instead.

use wasmlet_plugin_sdk::probe::{Probe, ProbeRequest, ProbeResult};

struct Huge;

impl Probe for Huge {
    fn check(request: ProbeRequest) -> ProbeResult {
        let bytes: usize = request
            .settings()
            .parse_or("bytes", 64 << 20)
            .unwrap_or(64 << 20);
        ProbeResult::Failure("x".repeat(bytes))
    }
}

wasmlet_plugin_sdk::export_probe!(Huge);
