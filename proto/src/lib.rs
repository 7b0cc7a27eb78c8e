//! wasmlet-proto: the gRPC wire contracts wasmlet speaks, compiled from the
//! `.proto` files in this crate by `build.rs` (protox + tonic-prost-build) into
//! prost messages and tonic clients and servers.
//!
//! - [`cri::v1`]: Kubernetes CRI v1 (`runtime.v1`), `RuntimeService` and
//!   `ImageService`, matching k8s.io/cri-api v0.33.x (Kubernetes v1.33).
//!   wasmlet is the client; containerd and CRI-O are the servers.
//! - [`deviceplugin::v1beta1`]: the device plugin API (`v1beta1`),
//!   `Registration` (served by wasmlet) and `DevicePlugin` (served by plugins),
//!   matching k8s.io/kubelet v0.33.x.
//! - [`pluginregistration::v1`]: plugin discovery (`pluginregistration`),
//!   `Registration` served by plugins on their registry socket, matching
//!   k8s.io/kubelet v0.33.x.
//! - [`csi::v1`]: CSI (`csi.v1`) `Identity` and `Node` services, matching the
//!   CSI specification v1.9.0 (the Controller-side services are not included).
//! - [`grpc::health::v1`]: the gRPC health checking protocol (`grpc.health.v1`),
//!   which the node's gRPC probes call.
//!
//! Field numbers are the upstream ones, so these types interoperate with real
//! runtimes and plugins. Google well-known types map to [`prost_types`].
//! [`FILE_DESCRIPTOR_SET`] holds the encoded descriptors of all the files.
//!
//! Start reading at the `.proto` files; each names its upstream source and
//! what (if anything) was left out.

/// Kubernetes Container Runtime Interface.
pub mod cri {
    /// CRI v1, protobuf package `runtime.v1`.
    pub mod v1 {
        tonic::include_proto!("runtime.v1");
    }
}

/// Kubernetes device plugin API.
pub mod deviceplugin {
    /// Device plugin API v1beta1, protobuf package `v1beta1`.
    pub mod v1beta1 {
        tonic::include_proto!("v1beta1");
    }
}

/// Kubernetes plugin registration (pluginwatcher) API.
pub mod pluginregistration {
    /// Plugin registration v1, protobuf package `pluginregistration`.
    pub mod v1 {
        tonic::include_proto!("pluginregistration");
    }
}

/// Container Storage Interface.
pub mod csi {
    /// CSI v1, protobuf package `csi.v1` (Identity and Node services).
    pub mod v1 {
        tonic::include_proto!("csi.v1");
    }
}

/// gRPC's own services.
pub mod grpc {
    /// gRPC health checking.
    pub mod health {
        /// Protobuf package `grpc.health.v1`.
        pub mod v1 {
            tonic::include_proto!("grpc.health.v1");
        }
    }
}

/// How the node reaches the servers of these contracts: CRI runtimes, device
/// plugins, CSI drivers and registration sockets all listen on unix sockets.
pub mod transport {
    use std::path::PathBuf;
    use std::time::Duration;

    use hyper_util::rt::TokioIo;
    use tokio::net::UnixStream;
    use tonic::transport::{Channel, Endpoint, Uri};

    /// A gRPC channel to the unix socket at `path` that connects on first use and
    /// again after the socket went away. A failed connection names the socket.
    pub fn unix_channel(path: PathBuf, connect_timeout: Duration) -> Channel {
        // The authority is not used by a unix socket; `localhost` is what the
        // kubelet sends.
        Endpoint::from_static("http://localhost")
            .connect_timeout(connect_timeout)
            .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    let stream = UnixStream::connect(&path).await.map_err(|e| {
                        std::io::Error::new(
                            e.kind(),
                            format!("connecting to {}: {e}", path.display()),
                        )
                    })?;
                    Ok::<_, std::io::Error>(TokioIo::new(stream))
                }
            }))
    }
}

/// Encoded `google.protobuf.FileDescriptorSet` of every `.proto` file of this
/// crate (with the well-known types they import), as compiled by `build.rs`.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/wasmlet_proto_descriptor.bin"));
