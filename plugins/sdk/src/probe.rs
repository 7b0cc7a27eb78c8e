//! The `probe-plugin` world: check one container.
//!
//! Implement [`Probe`] and export it with [`export_probe!`](crate::export_probe).
//! The node calls [`Probe::check`] under the probe's deadline
//! ([`ProbeRequest::timeout_ms`]); a plugin that traps or runs out of time counts
//! as a failed check. Reach the pod with [`crate::pod_network`].
//!
//! ```no_run
//! use wasmlet_plugin_sdk::pod_network;
//! use wasmlet_plugin_sdk::probe::{Probe, ProbeRequest, ProbeResult};
//!
//! struct PortOpen;
//!
//! impl Probe for PortOpen {
//!     fn check(request: ProbeRequest) -> ProbeResult {
//!         let settings = request.settings();
//!         let port = match settings.parse_or("port", 8080u16) {
//!             Ok(port) => port,
//!             Err(e) => return ProbeResult::failure(e),
//!         };
//!         let Some(ip) = request.pod_ips.first() else {
//!             return ProbeResult::failure("the pod has no IP yet");
//!         };
//!         match pod_network::tcp_connect(ip, port) {
//!             Ok(()) => ProbeResult::Success,
//!             Err(e) => ProbeResult::failure(format!("connect {ip}:{port}: {e}")),
//!         }
//!     }
//! }
//!
//! wasmlet_plugin_sdk::export_probe!(PortOpen);
//! ```

use crate::host::{self, Settings};

pub use crate::bindings::probe_world::exports::wasmlet::plugin::probe::{
    ProbeRequest, ProbeResult,
};

/// A probe plugin.
pub trait Probe {
    /// Checks the container `request.container` of `request.pod`.
    fn check(request: ProbeRequest) -> ProbeResult;
}

impl ProbeRequest {
    /// The probe's settings: the pod's (from the request) first, then the node's
    /// ([`host::settings`]) for keys the pod does not set.
    pub fn settings(&self) -> Settings {
        Settings::new(self.settings.clone()).or(host::settings())
    }
}

impl ProbeResult {
    /// A failure with `message` for the event and the log.
    pub fn failure(message: impl std::fmt::Display) -> Self {
        ProbeResult::Failure(message.to_string())
    }

    /// Whether the container passed.
    pub fn is_success(&self) -> bool {
        matches!(self, ProbeResult::Success)
    }
}

/// Exports a [`Probe`] implementation as the plugin's `wasmlet:plugin/probe`
/// interface. Use it once, at the crate's top level:
/// `wasmlet_plugin_sdk::export_probe!(MyProbe);`.
#[macro_export]
macro_rules! export_probe {
    ($ty:ty) => {
        const _: () = {
            struct __WasmletProbeExport;
            impl $crate::bindings::probe_world::exports::wasmlet::plugin::probe::Guest
                for __WasmletProbeExport
            {
                fn check(request: $crate::probe::ProbeRequest) -> $crate::probe::ProbeResult {
                    <$ty as $crate::probe::Probe>::check(request)
                }
            }
            $crate::bindings::probe_world::__export_probe_plugin!(
                __WasmletProbeExport with_types_in $crate::bindings::probe_world
            );
        };
    };
}
