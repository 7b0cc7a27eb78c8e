//! wasmlet-testkit: the real parts wasmlet's tests run against.
//!
//! [`images`] builds the example Wasm guests (`examples/workloads`) with the
//! Debian toolchain and packages them as OCI archives in the layouts the node
//! must pull and import; start at [`images::ensure_example_images`].
//! [`node`] runs the real `wasmlet` binary for end-to-end tests.
//! [`apiserver`] is an in-process Kubernetes API server for the node's API client.
//! [`fake_runtime`] is a recording, scriptable in-memory runtime for unit tests.
//! [`pki`] is a test certificate authority (client, serving and CSR certificates).
//! [`dbus`] is a private system bus with a test playing systemd-logind.

pub mod apiserver;
pub mod cni;
pub mod containerd;
pub mod csidriver;
pub mod dbus;
pub mod deviceplugin;
pub mod fake_runtime;
pub mod grpc;
pub mod health;
pub mod images;
pub mod node;
pub mod pki;
pub mod registry;
