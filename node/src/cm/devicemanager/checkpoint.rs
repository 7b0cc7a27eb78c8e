//! `kubelet_internal_checkpoint`, in the kubelet's format: the allocations (with
//! each container's `Allocate` answer, protobuf-encoded) and the devices each
//! resource had registered, with the kubelet's checksum over them
//! ([`crate::cm::spew`]).

use std::collections::BTreeMap;
use std::path::Path;

use prost::Message;
use serde::{Deserialize, Serialize};
use wasmlet_proto::deviceplugin::v1beta1 as api;

use super::{ContainerDevices, PodDevices};
use crate::cm::spew::{self, Value};

/// The file as JSON.
#[derive(Serialize, Deserialize)]
struct File {
    #[serde(rename = "Data")]
    data: Data,
    #[serde(rename = "Checksum")]
    checksum: u32,
}

#[derive(Serialize, Deserialize, Default)]
struct Data {
    /// `null` when there is none, as Go writes a nil slice.
    #[serde(rename = "PodDeviceEntries")]
    entries: Option<Vec<Entry>>,
    #[serde(rename = "RegisteredDevices")]
    registered: Option<BTreeMap<String, Option<Vec<String>>>>,
}

#[derive(Serialize, Deserialize, Clone)]
struct Entry {
    #[serde(rename = "PodUID")]
    pod_uid: String,
    #[serde(rename = "ContainerName")]
    container: String,
    #[serde(rename = "ResourceName")]
    resource: String,
    /// NUMA node (as a decimal string key) → device ids.
    #[serde(rename = "DeviceIDs")]
    device_ids: Option<BTreeMap<i64, Option<Vec<String>>>>,
    /// The protobuf-encoded `ContainerAllocateResponse`, base64 as Go's `[]byte`.
    #[serde(rename = "AllocResp", with = "base64_bytes")]
    alloc_resp: Option<Vec<u8>>,
}

mod base64_bytes {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(bytes) => {
                s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
            }
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        let s: Option<String> = Option::deserialize(d)?;
        s.map(|s| {
            base64::engine::general_purpose::STANDARD
                .decode(s)
                .map_err(serde::de::Error::custom)
        })
        .transpose()
    }
}

/// What the checkpoint holds, in the manager's terms.
#[derive(Debug, Default, PartialEq)]
pub struct Checkpoint {
    pub pod_devices: PodDevices,
    pub registered: BTreeMap<String, Vec<String>>,
}

impl Checkpoint {
    pub fn of(pod_devices: &PodDevices, registered: &BTreeMap<String, Vec<String>>) -> Self {
        Checkpoint {
            pod_devices: pod_devices.clone(),
            registered: registered.clone(),
        }
    }

    fn to_data(&self) -> Data {
        let mut entries = Vec::new();
        for ((pod, container), resources) in &self.pod_devices {
            for (resource, devices) in resources {
                entries.push(Entry {
                    pod_uid: pod.clone(),
                    container: container.clone(),
                    resource: resource.clone(),
                    device_ids: Some(
                        devices
                            .by_numa
                            .iter()
                            .map(|(n, ids)| (*n, Some(ids.clone())))
                            .collect(),
                    ),
                    alloc_resp: Some(devices.response.encode_to_vec()),
                });
            }
        }
        Data {
            entries: (!entries.is_empty()).then_some(entries),
            registered: Some(
                self.registered
                    .iter()
                    .map(|(r, ids)| (r.clone(), Some(ids.clone())))
                    .collect(),
            ),
        }
    }

    fn from_data(data: Data) -> Result<Self, String> {
        let mut pod_devices = PodDevices::new();
        for e in data.entries.unwrap_or_default() {
            let response =
                api::ContainerAllocateResponse::decode(e.alloc_resp.as_deref().unwrap_or_default())
                    .map_err(|err| {
                        format!(
                            "the Allocate answer of {}/{}: {err}",
                            e.pod_uid, e.container
                        )
                    })?;
            let by_numa = e
                .device_ids
                .unwrap_or_default()
                .into_iter()
                .map(|(n, ids)| (n, ids.unwrap_or_default()))
                .collect();
            pod_devices
                .entry((e.pod_uid, e.container))
                .or_default()
                .insert(e.resource, ContainerDevices { by_numa, response });
        }
        let registered = data
            .registered
            .unwrap_or_default()
            .into_iter()
            .map(|(r, ids)| (r, ids.unwrap_or_default()))
            .collect();
        Ok(Checkpoint {
            pod_devices,
            registered,
        })
    }
}

/// The kubelet's checksum of the data: fnv32a over its spew rendering, with the Go
/// types' names (`checkpoint.Data`, …).
fn checksum(data: &Data) -> u32 {
    spew::fnv32a(&render(data))
}

fn strings(list: &Option<Vec<String>>) -> Value {
    match list {
        None => Value::Nil,
        Some(l) => Value::List(l.iter().map(|s| Value::Str(s.clone())).collect()),
    }
}

fn render(data: &Data) -> String {
    let entries = match &data.entries {
        None => Value::Nil,
        Some(list) => Value::List(
            list.iter()
                .map(|e| {
                    Value::Struct(
                        "checkpoint.PodDevicesEntry",
                        vec![
                            ("PodUID", "string", Value::Str(e.pod_uid.clone())),
                            ("ContainerName", "string", Value::Str(e.container.clone())),
                            ("ResourceName", "string", Value::Str(e.resource.clone())),
                            (
                                "DeviceIDs",
                                "checkpoint.DevicesPerNUMA",
                                match &e.device_ids {
                                    None => Value::Nil,
                                    Some(m) => Value::Map(
                                        m.iter()
                                            .map(|(n, ids)| (Value::Int(*n), strings(ids)))
                                            .collect(),
                                    ),
                                },
                            ),
                            (
                                "AllocResp",
                                "[]uint8",
                                match &e.alloc_resp {
                                    None => Value::Nil,
                                    Some(b) => Value::List(
                                        b.iter().map(|x| Value::Int(i64::from(*x))).collect(),
                                    ),
                                },
                            ),
                        ],
                    )
                })
                .collect(),
        ),
    };
    let registered = match &data.registered {
        None => Value::Nil,
        Some(m) => Value::Map(
            m.iter()
                .map(|(r, ids)| (Value::Str(r.clone()), strings(ids)))
                .collect(),
        ),
    };
    spew::format(
        &Value::Struct(
            "checkpoint.checkpointData",
            vec![
                ("PodDeviceEntries", "[]checkpoint.PodDevicesEntry", entries),
                ("RegisteredDevices", "map[string][]string", registered),
            ],
        ),
        "checkpoint.checkpointData",
    )
}

/// Reads the checkpoint; `None` when there is none. A checksum that does not match
/// is an error, as with the kubelet.
pub fn read(path: &Path) -> Result<Option<Checkpoint>, String> {
    let Some(bytes) = crate::private_file::read_if_present(path)? else {
        return Ok(None);
    };
    let file: File =
        serde_json::from_slice(&bytes).map_err(|e| format!("parsing {}: {e}", path.display()))?;
    let want = checksum(&file.data);
    if want != file.checksum {
        return Err(format!(
            "checkpoint is corrupted: checksum {} does not match the data's {want}",
            file.checksum
        ));
    }
    Checkpoint::from_data(file.data).map(Some)
}

/// Writes the checkpoint atomically (a temporary file renamed over it).
pub fn write(path: &Path, cp: &Checkpoint) -> Result<(), String> {
    let data = cp.to_data();
    let file = File {
        checksum: checksum(&data),
        data,
    };
    let bytes = serde_json::to_vec(&file).map_err(|e| e.to_string())?;
    crate::private_file::write(path, &bytes).map_err(|e| format!("writing {}: {e}", path.display()))
}
