//! The pod network of Wasm pods: each sandbox that does not use the node's network
//! gets a network namespace of its own, attached with the node's CNI configuration
//! and plugins exactly as containerd's CRI plugin attaches a container pod's (the same
//! configuration directory, the same plugin binaries, so one IPAM range serves both).
//! The sandbox process enters the namespace before it runs any guest
//! (`--netns`, [`netns::enter`]).
//!
//! What an attachment needs to be undone is recorded in the sandbox's directory
//! (`network.json`) *before* the namespace is made, and its result after the ADD, so a
//! teardown after a failed setup, a stop, or a node that crashed in between removes
//! exactly what was made: CNI DEL with the recorded configuration and result, then the
//! namespace. A teardown that fails keeps the record, to be retried.

pub mod cni;
pub mod netns;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use wasmlet_runtime::PodSandboxConfig;

pub use cni::{Attachment, NetworkList};

/// The interface a pod's network is attached on.
pub const IFNAME: &str = "eth0";

/// The file in a sandbox's directory that records its attachment.
pub const RECORD: &str = "network.json";

/// Where the CNI configuration and plugins are, and where namespaces are made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkSettings {
    /// `--cni-conf-dir` (the kubelet's default, `/etc/cni/net.d`).
    pub conf_dir: PathBuf,
    /// `--cni-bin-dir` (`/opt/cni/bin`, then Debian's `/usr/lib/cni`).
    pub bin_dirs: Vec<PathBuf>,
    /// Where the namespaces' files go (`/var/run/netns`, where `ip netns` looks).
    pub netns_dir: PathBuf,
}

impl Default for NetworkSettings {
    fn default() -> Self {
        NetworkSettings {
            conf_dir: "/etc/cni/net.d".into(),
            bin_dirs: vec!["/opt/cni/bin".into(), "/usr/lib/cni".into()],
            netns_dir: "/var/run/netns".into(),
        }
    }
}

/// A failure to attach or detach a pod.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Cni(#[from] cni::Error),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the CNI result gave the pod no IP address: {0}")]
    NoAddress(String),
}

/// A sandbox's attachment, as recorded in its directory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub netns: PathBuf,
    pub network: NetworkList,
    pub attachment: Attachment,
    /// The ADD's result; `None` until it succeeded.
    pub result: Option<Value>,
    /// The pod's addresses from the result, primary first.
    pub ips: Vec<String>,
}

/// The Wasm runtime's CNI attachments.
#[derive(Clone, Debug)]
pub struct PodNetwork {
    settings: NetworkSettings,
    plugins: cni::Plugins,
}

impl PodNetwork {
    pub fn new(settings: NetworkSettings) -> Self {
        let plugins = cni::Plugins {
            bin_dirs: settings.bin_dirs.clone(),
        };
        PodNetwork { settings, plugins }
    }

    pub fn settings(&self) -> &NetworkSettings {
        &self.settings
    }

    /// The network pods are attached to now, if the configuration directory has one.
    pub fn network(&self) -> Result<Option<NetworkList>, Error> {
        Ok(cni::default_network(&self.settings.conf_dir)?)
    }

    /// Attaches sandbox `id` (directory `dir`) to `network` in a new namespace: the
    /// recorded attachment, with the pod's addresses. On failure nothing is left: what
    /// was made is torn down again before the error is returned.
    pub async fn attach(
        &self,
        dir: &Path,
        id: &str,
        config: &PodSandboxConfig,
        network: NetworkList,
    ) -> Result<Record, Error> {
        let netns = self.settings.netns_dir.join(format!("wasmlet-{id}"));
        let mut record = Record {
            attachment: Attachment {
                container_id: id.to_owned(),
                netns: netns.clone(),
                ifname: IFNAME.into(),
                args: cni_args(id, config),
                capability_args: capability_args(config),
            },
            netns,
            network,
            result: None,
            ips: Vec::new(),
        };
        write_record(dir, &record)?;
        match self.attach_recorded(dir, &mut record).await {
            Ok(()) => Ok(record),
            Err(e) => {
                if let Err(undo) = self.detach(dir).await {
                    tracing::warn!(sandbox = %id, "undoing a failed pod network setup: {undo}");
                }
                Err(e)
            }
        }
    }

    async fn attach_recorded(&self, dir: &Path, record: &mut Record) -> Result<(), Error> {
        netns::create(&record.netns).map_err(|source| Error::Io {
            what: "creating the network namespace",
            path: record.netns.clone(),
            source,
        })?;
        // The pod's loopback first, as containerd brings it up.
        self.plugins
            .add(&loopback(), &loopback_attachment(&record.attachment))
            .await?;
        let result = self
            .plugins
            .add(&record.network, &record.attachment)
            .await?;
        let ips = cni::result_ips(&result, IFNAME);
        record.result = Some(result.clone());
        record.ips = ips;
        write_record(dir, record)?;
        if record.ips.is_empty() {
            return Err(Error::NoAddress(result.to_string()));
        }
        Ok(())
    }

    /// CNI CHECK of a recorded attachment (for an adopted sandbox).
    pub async fn check(&self, record: &Record) -> Result<(), Error> {
        let Some(result) = &record.result else {
            return Ok(());
        };
        Ok(self
            .plugins
            .check(&record.network, &record.attachment, result)
            .await?)
    }

    /// Undoes the attachment recorded in `dir`, if any: CNI DEL, the namespace, the
    /// record. Nothing recorded is nothing to do. A DEL that fails keeps everything
    /// for the next try.
    pub async fn detach(&self, dir: &Path) -> Result<(), Error> {
        let Some(record) = load(dir) else {
            return Ok(());
        };
        self.plugins
            .del(&record.network, &record.attachment, record.result.as_ref())
            .await?;
        netns::remove(&record.netns).map_err(|source| Error::Io {
            what: "removing the network namespace",
            path: record.netns.clone(),
            source,
        })?;
        let file = dir.join(RECORD);
        match std::fs::remove_file(&file) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(Error::Io {
                what: "removing",
                path: file,
                source,
            }),
        }
    }
}

/// The attachment recorded in a sandbox's directory.
pub fn load(dir: &Path) -> Option<Record> {
    let file = dir.join(RECORD);
    let bytes = std::fs::read(&file).ok()?;
    match serde_json::from_slice(&bytes) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!(file = %file.display(), "an unreadable pod network record: {e}");
            None
        }
    }
}

fn write_record(dir: &Path, record: &Record) -> Result<(), Error> {
    let file = dir.join(RECORD);
    let tmp = dir.join(format!(".{RECORD}.tmp"));
    let bytes = serde_json::to_vec_pretty(record).expect("records serialize");
    std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, &file))
        .map_err(|source| Error::Io {
            what: "recording the pod network in",
            path: file,
            source,
        })
}

/// `CNI_ARGS` as containerd's CRI plugin gives them.
fn cni_args(id: &str, config: &PodSandboxConfig) -> Vec<(String, String)> {
    vec![
        ("IgnoreUnknown".into(), "1".into()),
        (
            "K8S_POD_NAMESPACE".into(),
            config.metadata.namespace.clone(),
        ),
        ("K8S_POD_NAME".into(), config.metadata.name.clone()),
        ("K8S_POD_INFRA_CONTAINER_ID".into(), id.to_owned()),
        ("K8S_POD_UID".into(), config.metadata.uid.clone()),
    ]
}

/// The capability arguments: `portMappings` for the pod's host ports (given to a
/// `portmap` plugin that declares the capability).
fn capability_args(config: &PodSandboxConfig) -> BTreeMap<String, Value> {
    let mappings: Vec<Value> = config
        .port_mappings
        .iter()
        .filter(|m| m.host_port > 0)
        .map(|m| {
            let mut v = json!({
                "hostPort": m.host_port,
                "containerPort": m.container_port,
                "protocol": m.protocol.to_ascii_lowercase(),
            });
            if !m.host_ip.is_empty() {
                v["hostIP"] = Value::String(m.host_ip.clone());
            }
            v
        })
        .collect();
    let mut args = BTreeMap::new();
    if !mappings.is_empty() {
        args.insert("portMappings".into(), Value::Array(mappings));
    }
    args
}

fn loopback() -> NetworkList {
    NetworkList {
        name: "cni-loopback".into(),
        cni_version: "0.3.1".into(),
        plugins: vec![
            json!({"type": "loopback"})
                .as_object()
                .expect("an object")
                .clone(),
        ],
        source: PathBuf::new(),
    }
}

fn loopback_attachment(at: &Attachment) -> Attachment {
    Attachment {
        ifname: "lo".into(),
        capability_args: BTreeMap::new(),
        ..at.clone()
    }
}
