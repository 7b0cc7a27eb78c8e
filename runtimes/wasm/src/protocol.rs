//! The line protocol between the node and a pod's sandbox process.
//!
//! The sandbox listens on a unix socket of its own; the node connects and writes one
//! JSON [`Request`] per line; the sandbox writes one JSON [`Message`] per line: a
//! [`Message::Reply`] to each request, in any order, and [`Message::Started`] /
//! [`Message::Exited`] as containers start and exit. An exec ([`Op::Exec`]) is answered
//! by its reply alone (`exec`): it is no container and is never listed.
//!
//! A sandbox outlives the connection, as a containerd shim outlives containerd: when
//! the node dies, its pods keep running, and the node's next run connects again,
//! asks for the containers' states ([`Op::List`]) and adopts them. A new connection
//! replaces the previous one. Only [`Op::Shutdown`] ends a sandbox.

use std::path::PathBuf;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::image::WasmKind;

/// A request from the node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub id: u64,
    #[serde(flatten)]
    pub op: Op,
}

/// What the node asks of the sandbox.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Compile (or load from the cache) and prepare a container; does not run it.
    Create {
        container_id: String,
        spec: ContainerSpec,
    },
    /// Run a created container.
    Start { container_id: String },
    /// Stop a running container; the reply comes once it has exited.
    Stop {
        container_id: String,
        timeout_ms: u64,
    },
    /// Forget a container that is not running.
    Remove { container_id: String },
    /// Run a new instance of a running container's program with `argv` (program name
    /// first) and wait for it; the reply's `exec` carries its exit code and output.
    /// `timeout_ms` 0 means no timeout (as CRI's ExecSync).
    Exec {
        container_id: String,
        argv: Vec<String>,
        timeout_ms: u64,
    },
    /// Change a container's memory limit in place (CRI's UpdateContainerResources):
    /// a running guest's stores are held to the new cap from their next growth. A
    /// limit below what its linear memories already use is refused: Wasm memory
    /// cannot shrink.
    Update {
        container_id: String,
        memory_limit_bytes: Option<u64>,
    },
    /// Close a running container's log file and open the one at its path, creating
    /// it (CRI's ReopenContainerLog): after the node renamed the file aside, the next
    /// records go to a new one. Records are whole in one file or the other.
    ReopenLog { container_id: String },
    /// Report every container's state (the reply's `containers`).
    List,
    /// Stop every container, reply, and exit.
    Shutdown,
}

/// Everything the sandbox needs to run one container.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ContainerSpec {
    pub name: String,
    /// The Wasm binary, a blob in the node's image store.
    pub wasm_path: PathBuf,
    /// Its digest, the key of the compile cache.
    pub wasm_digest: String,
    pub kind: WasmKind,
    /// `argv`, program name first.
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub preopens: Vec<Preopen>,
    /// Absolute path of the CRI log file.
    pub log_path: PathBuf,
    /// Cap on the container's linear memories, in bytes.
    pub memory_limit_bytes: Option<u64>,
}

/// A host directory the guest may open at a path of its own.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preopen {
    pub host_path: PathBuf,
    pub guest_path: String,
    pub readonly: bool,
}

/// What the sandbox says.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Message {
    /// The answer to request `id`: `error` is set when it failed, and `error_kind`
    /// when the failure is one the node reports as more than an internal error.
    Reply {
        id: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error_kind: Option<ErrorKind>,
        /// The answer to [`Op::List`].
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        containers: Vec<ContainerReport>,
        /// The answer to [`Op::Exec`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exec: Option<ExecOutput>,
    },
    /// A container started running guest code.
    Started { container_id: String, at: Timestamp },
    /// A container's guest finished, for any reason.
    Exited {
        container_id: String,
        at: Timestamp,
        exit: Exit,
    },
}

/// What kind of failure a reply's `error` is (a failure without one is internal).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The container is not in a state that allows the request.
    #[error("failed precondition")]
    FailedPrecondition,
    /// The request itself is malformed.
    #[error("invalid argument")]
    InvalidArgument,
    /// The request's own timeout passed (an exec's).
    #[error("deadline exceeded")]
    DeadlineExceeded,
}

/// How an exec ended: its exit code (mapped as a container's) and its captured output,
/// each stream cut at [`EXEC_OUTPUT_LIMIT`] bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecOutput {
    pub exit_code: i32,
    #[serde(default, with = "hex_bytes")]
    pub stdout: Vec<u8>,
    #[serde(default, with = "hex_bytes")]
    pub stderr: Vec<u8>,
}

/// The most of each of an exec's output streams that is kept; the rest is dropped.
pub const EXEC_OUTPUT_LIMIT: usize = 16 * 1024;

/// Bytes as a hex string: half the size of JSON's array of numbers, and readable.
mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        hex::decode(text).map_err(serde::de::Error::custom)
    }
}

/// Where a container is, as the sandbox knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReportState {
    Created,
    Running,
    Exited,
}

/// One container in the answer to [`Op::List`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerReport {
    pub container_id: String,
    pub state: ReportState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<Exit>,
}

/// How a container ended, in the terms of a container status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exit {
    pub code: i32,
    /// `Completed`, `Error` or `OOMKilled`.
    pub reason: String,
    pub message: String,
}

impl Exit {
    /// A normal exit with `code`.
    pub fn code(code: i32) -> Self {
        Exit {
            code,
            reason: if code == 0 { "Completed" } else { "Error" }.to_owned(),
            message: String::new(),
        }
    }
}

/// The exit code given to a guest that trapped (as a native process killed by SIGABRT).
pub const TRAP_EXIT_CODE: i32 = 134;
/// The exit code given to a guest that was killed (as by SIGKILL).
pub const KILLED_EXIT_CODE: i32 = 137;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reopen_request_reads_as_its_op_name() {
        let request = Request {
            id: 3,
            op: Op::ReopenLog {
                container_id: "c1".into(),
            },
        };
        let line = serde_json::to_string(&request).unwrap();
        assert_eq!(line, r#"{"id":3,"op":"reopen_log","container_id":"c1"}"#);
        assert_eq!(serde_json::from_str::<Request>(&line).unwrap(), request);
    }

    #[test]
    fn a_reply_without_the_exec_fields_still_parses() {
        let old = r#"{"type":"reply","id":7,"error":"boom"}"#;
        assert_eq!(
            serde_json::from_str::<Message>(old).unwrap(),
            Message::Reply {
                id: 7,
                error: Some("boom".into()),
                error_kind: None,
                containers: Vec::new(),
                exec: None,
            }
        );
    }

    #[test]
    fn an_exec_reply_carries_its_output_as_hex() {
        let reply = Message::Reply {
            id: 1,
            error: None,
            error_kind: None,
            containers: Vec::new(),
            exec: Some(ExecOutput {
                exit_code: 3,
                stdout: b"ok\n".to_vec(),
                stderr: vec![0xff],
            }),
        };
        let line = serde_json::to_string(&reply).unwrap();
        assert_eq!(
            line,
            r#"{"type":"reply","id":1,"exec":{"exit_code":3,"stdout":"6f6b0a","stderr":"ff"}}"#
        );
        assert_eq!(serde_json::from_str::<Message>(&line).unwrap(), reply);
        let refused = r#"{"type":"reply","id":2,"error":"late","error_kind":"deadline_exceeded"}"#;
        assert!(matches!(
            serde_json::from_str::<Message>(refused).unwrap(),
            Message::Reply {
                error_kind: Some(ErrorKind::DeadlineExceeded),
                ..
            }
        ));
    }
}
