//! CSI on the node (the kubelet's `kubernetes.io/csi` volume plugin): drivers register
//! through the plugin watcher ([`registration`]), which records their endpoints and
//! publishes what `NodeGetInfo` says in the `CSINode` object and on the Node; the
//! pods' volumes are staged and published through them ([`volumes`]).

pub mod registration;
pub mod volumes;

pub use volumes::CsiVolumes;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tonic::transport::Channel;

/// The plugin type CSI drivers register with (`pluginregistration.CSIPlugin`).
pub const PLUGIN_TYPE: &str = "CSIPlugin";
/// The kubelet's `csiTimeout`: how long a CSI call may take.
pub const CSI_TIMEOUT: Duration = Duration::from_secs(120);

/// A registered driver: where it listens and the CSI version it was taken with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Driver {
    pub endpoint: PathBuf,
    pub version: (u64, u64, u64),
}

/// The registered drivers by name, shared by registration and the volumes.
pub type Drivers = Arc<Mutex<BTreeMap<String, Driver>>>;

/// A channel to the driver at `endpoint` (a unix socket), connected on first use.
pub fn channel(endpoint: &std::path::Path) -> Channel {
    wasmlet_proto::transport::unix_channel(endpoint.to_owned(), Duration::from_secs(10))
}
