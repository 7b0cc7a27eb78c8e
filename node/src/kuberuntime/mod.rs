//! The kubelet's `pkg/kubelet/kuberuntime`: what a sync of a pod decides
//! ([`actions`], pure) and the effects [`crate::sync::PodSyncer`] executes, by
//! concern.

pub mod actions;
mod adoption;
mod container_config;
mod containers;
pub mod gc;
mod images;
pub mod instrumented;
mod sandbox;
pub mod termination;

/// The sandbox or container holding the name in a runtime's "failed to reserve
/// sandbox/container name" error (containerd's CRI plugin: `name "<name>" is reserved
/// for "<id>"`). Such a holder is what a create left that the runtime carried out
/// after its caller lost the reply (the runtime restarted under the call, the call
/// timed out): containerd releases a name only when its holder is removed.
pub(crate) fn name_reserved_for(message: &str) -> Option<&str> {
    const HELD: &str = "is reserved for \"";
    let rest = &message[message.find(HELD)? + HELD.len()..];
    let id = &rest[..rest.find('"')?];
    (!id.is_empty()).then_some(id)
}
