//! `cpu_manager_state`, the kubelet's format (`CPUManagerCheckpointV2`): the policy,
//! the default set, the assignments by pod and container, and the kubelet's checksum
//! (computed with the checksum field at 0, over the checkpoint's pointer type).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::State;
use crate::cm::spew::{self, Value};

#[derive(Serialize, Deserialize)]
struct File {
    #[serde(rename = "policyName")]
    policy_name: String,
    #[serde(rename = "defaultCpuSet")]
    default_cpu_set: String,
    #[serde(
        rename = "entries",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    entries: BTreeMap<String, BTreeMap<String, String>>,
    checksum: u64,
}

fn checksum(f: &File) -> u64 {
    let entries = Value::Map(
        f.entries
            .iter()
            .map(|(pod, containers)| {
                (
                    Value::Str(pod.clone()),
                    Value::Map(
                        containers
                            .iter()
                            .map(|(c, set)| (Value::Str(c.clone()), Value::Str(set.clone())))
                            .collect(),
                    ),
                )
            })
            .collect(),
    );
    let rendered = spew::format(
        &Value::Struct(
            "state.CPUManagerCheckpoint",
            vec![
                ("PolicyName", "string", Value::Str(f.policy_name.clone())),
                (
                    "DefaultCPUSet",
                    "string",
                    Value::Str(f.default_cpu_set.clone()),
                ),
                ("Entries", "map[string]map[string]string", entries),
                ("Checksum", "checksum.Checksum", Value::Int(0)),
            ],
        ),
        "*state.CPUManagerCheckpoint",
    );
    u64::from(spew::fnv32a(&rendered))
}

/// The policy and state of the checkpoint at `path`; `None` when there is none.
pub fn read(path: &Path) -> Result<Option<(String, State)>, String> {
    let Some(bytes) = crate::private_file::read_if_present(path)? else {
        return Ok(None);
    };
    let file: File =
        serde_json::from_slice(&bytes).map_err(|e| format!("parsing {}: {e}", path.display()))?;
    let want = checksum(&file);
    if want != file.checksum {
        return Err(format!(
            "{}: checkpoint is corrupted: checksum {} does not match the data's {want}",
            path.display(),
            file.checksum
        ));
    }
    let parse = |s: &str| {
        s.parse()
            .map_err(|e| format!("{}: cpuset {s:?}: {e}", path.display()))
    };
    let mut assignments = BTreeMap::new();
    for (pod, containers) in &file.entries {
        let mut sets = BTreeMap::new();
        for (c, set) in containers {
            sets.insert(c.clone(), parse(set)?);
        }
        assignments.insert(pod.clone(), sets);
    }
    Ok(Some((
        file.policy_name,
        State {
            default: parse(&file.default_cpu_set)?,
            assignments,
        },
    )))
}

/// Writes the checkpoint atomically.
pub fn write(path: &Path, policy: &str, state: &State) -> Result<(), String> {
    let mut file = File {
        policy_name: policy.to_owned(),
        default_cpu_set: state.default.to_string(),
        entries: state
            .assignments
            .iter()
            .map(|(pod, containers)| {
                (
                    pod.clone(),
                    containers
                        .iter()
                        .map(|(c, set)| (c.clone(), set.to_string()))
                        .collect(),
                )
            })
            .collect(),
        checksum: 0,
    };
    file.checksum = checksum(&file);
    let bytes = serde_json::to_vec(&file).map_err(|e| e.to_string())?;
    crate::private_file::write(path, &bytes).map_err(|e| format!("writing {}: {e}", path.display()))
}
