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
        spec: Box<ContainerSpec>,
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
    /// Absolute path of the CRI log file (unused with `fifos`).
    pub log_path: PathBuf,
    /// Raw stdio instead of a CRI log file: the FIFOs a containerd shim is handed,
    /// which containerd reads (and, under CRI, turns into the log file itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fifos: Option<Fifos>,
    /// Cap on the container's linear memories, in bytes.
    pub memory_limit_bytes: Option<u64>,
    /// The names an exec's `command[0]` may give this program (see
    /// `sandbox::program_names`); empty: those of `argv[0]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub program_names: Vec<String>,
    /// The guest's stdin stays open for attached clients (else it reads end of file).
    #[serde(default)]
    pub stdin: bool,
    /// The guest's stdin closes when the first attached client that wrote to it leaves.
    #[serde(default)]
    pub stdin_once: bool,
    /// The guest's stdio report themselves as a terminal.
    #[serde(default)]
    pub tty: bool,
    /// The container's TCP ports: a `wasi:http/proxy` component is served on the
    /// first ([`crate::sandbox::DEFAULT_HTTP_PORT`] without one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
}

/// A container's stdio as named pipes; a stream without one is dropped (stdout,
/// stderr) or reads end of file (stdin).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fifos {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<PathBuf>,
}

/// A host directory the guest may open at a path of its own.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preopen {
    pub host_path: PathBuf,
    pub guest_path: String,
    pub readonly: bool,
}

/// The first line a node writes on a connection to the sandbox's *stream* socket: an
/// interactive exec, or an attach to a running container's own stdio. The sandbox
/// answers with one [`StreamReply`] line; after an accepted one, both sides speak
/// [`frame`]s until the process ends (the sandbox sends [`frame::EXIT`] or
/// [`frame::ERROR`] and closes) or the node closes the connection, which ends an exec
/// and detaches an attach.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StreamRequest {
    pub container_id: String,
    #[serde(flatten)]
    pub kind: StreamKind,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    /// stderr's bytes go out as stdout's, as on a terminal.
    pub tty: bool,
}

/// What a stream connection is for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "stream", rename_all = "snake_case")]
pub enum StreamKind {
    /// A new instance of the container's program with `argv`, as [`Op::Exec`].
    Exec { argv: Vec<String> },
    /// The running container's own stdio.
    Attach,
}

/// The sandbox's answer to a [`StreamRequest`]: accepted, or why not.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamReply {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<ErrorKind>,
}

/// The binary frames of a stream connection: a tag byte, the payload's length as a
/// big-endian `u32`, the payload.
pub mod frame {
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

    /// Node to sandbox: bytes for the process's stdin.
    pub const STDIN: u8 = 0;
    /// Sandbox to node: the process's stdout.
    pub const STDOUT: u8 = 1;
    /// Sandbox to node: the process's stderr.
    pub const STDERR: u8 = 2;
    /// Sandbox to node, last: the process ended; the payload is its [`super::Exit`]
    /// as JSON.
    pub const EXIT: u8 = 3;
    /// Node to sandbox: the client closed its stdin (empty payload).
    pub const STDIN_CLOSED: u8 = 4;
    /// Sandbox to node, last: the session ended without an exit (the payload says why).
    pub const ERROR: u8 = 5;

    /// The largest payload either side sends or accepts.
    pub const MAX_PAYLOAD: usize = 1 << 20;

    pub async fn write<W: AsyncWrite + Unpin>(
        w: &mut W,
        tag: u8,
        payload: &[u8],
    ) -> std::io::Result<()> {
        for chunk in payload
            .chunks(MAX_PAYLOAD)
            .chain(payload.is_empty().then_some(&[][..]))
        {
            let mut head = [0u8; 5];
            head[0] = tag;
            head[1..].copy_from_slice(&(chunk.len() as u32).to_be_bytes());
            w.write_all(&head).await?;
            w.write_all(chunk).await?;
        }
        w.flush().await
    }

    /// The next frame; `None` at a clean end of the connection.
    pub async fn read<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<Option<(u8, Vec<u8>)>> {
        let mut head = [0u8; 5];
        match r.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        }
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        if len > MAX_PAYLOAD {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a stream frame of {len} bytes is over the {MAX_PAYLOAD}-byte limit"),
            ));
        }
        let mut payload = vec![0u8; len];
        r.read_exact(&mut payload).await?;
        Ok(Some((head[0], payload)))
    }
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
    fn a_stream_request_names_its_kind() {
        let request = StreamRequest {
            container_id: "c1".into(),
            kind: StreamKind::Exec {
                argv: vec!["ticker".into(), "cat".into()],
            },
            stdin: true,
            stdout: true,
            stderr: false,
            tty: false,
        };
        let line = serde_json::to_string(&request).unwrap();
        assert_eq!(
            line,
            r#"{"container_id":"c1","stream":"exec","argv":["ticker","cat"],"stdin":true,"stdout":true,"stderr":false,"tty":false}"#
        );
        assert_eq!(
            serde_json::from_str::<StreamRequest>(&line).unwrap(),
            request
        );
    }

    #[tokio::test]
    async fn frames_round_trip_and_a_big_payload_is_cut_into_several() {
        let mut buf = Vec::new();
        frame::write(&mut buf, frame::STDOUT, b"hello")
            .await
            .unwrap();
        frame::write(&mut buf, frame::STDIN_CLOSED, b"")
            .await
            .unwrap();
        let big = vec![7u8; frame::MAX_PAYLOAD + 3];
        frame::write(&mut buf, frame::STDERR, &big).await.unwrap();
        let mut r = &buf[..];
        assert_eq!(
            frame::read(&mut r).await.unwrap(),
            Some((frame::STDOUT, b"hello".to_vec()))
        );
        assert_eq!(
            frame::read(&mut r).await.unwrap(),
            Some((frame::STDIN_CLOSED, Vec::new()))
        );
        let (tag, first) = frame::read(&mut r).await.unwrap().unwrap();
        assert_eq!((tag, first.len()), (frame::STDERR, frame::MAX_PAYLOAD));
        assert_eq!(
            frame::read(&mut r).await.unwrap(),
            Some((frame::STDERR, vec![7u8; 3]))
        );
        assert_eq!(frame::read(&mut r).await.unwrap(), None, "a clean end");
        let mut over = vec![frame::STDOUT];
        over.extend_from_slice(&((frame::MAX_PAYLOAD as u32) + 1).to_be_bytes());
        assert!(frame::read(&mut &over[..]).await.is_err(), "over the limit");
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
