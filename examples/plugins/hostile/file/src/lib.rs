//! `hostile-file`: a probe that reads a host file, `path` (setting, default
//! `/etc/passwd`). Without a filesystem grant the plugin host gives it no
//! preopened directory, so the read must fail: the probe then reports
//! `Failure("denied: <error>")`. `Success` means the file was read: a sandbox hole
//! (or a grant that covers the path).

use wasmlet_plugin_sdk::probe::{Probe, ProbeRequest, ProbeResult};

struct ReadFile;

impl Probe for ReadFile {
    fn check(request: ProbeRequest) -> ProbeResult {
        let settings = request.settings();
        let path = settings.get_or("path", "/etc/passwd");
        match std::fs::read(path) {
            Ok(data) => {
                wasmlet_plugin_sdk::warn!("read {} bytes of {path}", data.len());
                ProbeResult::Success
            }
            Err(e) => ProbeResult::failure(format!("denied: reading {path}: {e}")),
        }
    }
}

wasmlet_plugin_sdk::export_probe!(ReadFile);
