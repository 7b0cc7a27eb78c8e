//! What a probe found: the three probe types and a probe's result.
//!
//! Shared by the prober that produces results, the status computation and the pod
//! sync that act on them, and probe plugins; apart from the prober so none of them
//! imports it for its vocabulary (the kubelet's `prober/results`).

use k8s_openapi::api::core::v1::{Container, Probe};

/// The three probe types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProbeKind {
    Liveness,
    Readiness,
    Startup,
}

impl ProbeKind {
    pub const ALL: [ProbeKind; 3] = [
        ProbeKind::Liveness,
        ProbeKind::Readiness,
        ProbeKind::Startup,
    ];

    /// As in the kubelet's metrics and events.
    pub fn name(self) -> &'static str {
        match self {
            ProbeKind::Liveness => "Liveness",
            ProbeKind::Readiness => "Readiness",
            ProbeKind::Startup => "Startup",
        }
    }

    /// The container's probe of this type.
    pub fn of(self, c: &Container) -> Option<&Probe> {
        match self {
            ProbeKind::Liveness => c.liveness_probe.as_ref(),
            ProbeKind::Readiness => c.readiness_probe.as_ref(),
            ProbeKind::Startup => c.startup_probe.as_ref(),
        }
    }

    /// The result a new container instance starts with.
    pub(crate) fn initial(self) -> ProbeResult {
        match self {
            ProbeKind::Liveness => ProbeResult::Success,
            ProbeKind::Readiness => ProbeResult::Failure,
            ProbeKind::Startup => ProbeResult::Unknown,
        }
    }
}

/// A probe's result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProbeResult {
    Success,
    Failure,
    Unknown,
}

impl ProbeResult {
    /// The `result` label of `prober_probe_total`.
    pub(crate) fn metric(self) -> &'static str {
        match self {
            ProbeResult::Success => "successful",
            ProbeResult::Failure => "failed",
            ProbeResult::Unknown => "unknown",
        }
    }
}
