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
