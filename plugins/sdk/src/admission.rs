//! The `admission-plugin` world: admit or deny a pod before it starts.
//!
//! Implement [`Admission`] and export it with
//! [`export_admission!`](crate::export_admission). The node asks every admission
//! plugin after its own checks; the first denial wins and becomes the pod's status
//! (`reason`, `message`) and an event.
//!
//! ```no_run
//! use wasmlet_plugin_sdk::admission::{Admission, Decision, NodeState};
//! use wasmlet_plugin_sdk::types::PodInfo;
//!
//! struct NoDefaultNamespace;
//!
//! impl Admission for NoDefaultNamespace {
//!     fn admit(pod: PodInfo, _node: NodeState) -> Decision {
//!         if pod.namespace == "default" {
//!             return Decision::deny("DefaultNamespace", "pods may not run in `default` here");
//!         }
//!         Decision::Admit
//!     }
//! }
//!
//! wasmlet_plugin_sdk::export_admission!(NoDefaultNamespace);
//! ```

use crate::types::{PodInfo, amount, lookup};

pub use crate::bindings::admission_world::exports::wasmlet::plugin::admission::{
    Decision, Denial, NodeState,
};

/// An admission plugin.
pub trait Admission {
    /// Admits `pod` onto `node`, or denies it with a reason and a message.
    fn admit(pod: PodInfo, node: NodeState) -> Decision;
}

impl Decision {
    /// A denial: `reason` in CamelCase (`MissingLabel`), `message` a sentence.
    pub fn deny(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Decision::Deny(Denial {
            reason: reason.into(),
            message: message.into(),
        })
    }

    /// Whether the pod is admitted.
    pub fn is_admit(&self) -> bool {
        matches!(self, Decision::Admit)
    }
}

impl NodeState {
    /// The node's allocatable amount of `resource` (0 when absent).
    pub fn allocatable(&self, resource: &str) -> u64 {
        amount(&self.allocatable, resource)
    }

    /// What admitted pods already request of `resource`, summed.
    pub fn requested(&self, resource: &str) -> u64 {
        amount(&self.requested, resource)
    }

    /// The node's label `key`.
    pub fn label(&self, key: &str) -> Option<&str> {
        lookup(&self.labels, key)
    }
}

/// Exports an [`Admission`] implementation as the plugin's
/// `wasmlet:plugin/admission` interface. Use it once, at the crate's top level.
#[macro_export]
macro_rules! export_admission {
    ($ty:ty) => {
        const _: () = {
            struct __WasmletAdmissionExport;
            impl $crate::bindings::admission_world::exports::wasmlet::plugin::admission::Guest
                for __WasmletAdmissionExport
            {
                fn admit(
                    pod: $crate::types::PodInfo,
                    node: $crate::admission::NodeState,
                ) -> $crate::admission::Decision {
                    <$ty as $crate::admission::Admission>::admit(pod, node)
                }
            }
            $crate::bindings::admission_world::__export_admission_plugin!(
                __WasmletAdmissionExport with_types_in $crate::bindings::admission_world
            );
        };
    };
}
