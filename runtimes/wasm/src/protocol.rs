//! The line protocol between the node and a pod's sandbox process.
//!
//! The sandbox listens on a unix socket of its own; the node connects and writes one
//! JSON [`Request`] per line; the sandbox writes one JSON [`Message`] per line: a
//! [`Message::Reply`] to each request, in any order, and [`Message::Started`] /
//! [`Message::Exited`] as containers start and exit.
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
    /// The answer to request `id`: `error` is set when it failed.
    Reply {
        id: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        /// The answer to [`Op::List`].
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        containers: Vec<ContainerReport>,
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
