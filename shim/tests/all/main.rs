//! `containerd-shim-wasmlet-v1` under a real containerd (the testkit's private one):
//! through `ctr` as an operator runs it, and through CRI as a kubelet does.

mod cri;
mod ctr;
mod harness;
mod node;
