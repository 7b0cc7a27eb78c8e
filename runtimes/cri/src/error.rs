//! The one place where CRI's gRPC status codes become [`wasmlet_runtime::Error`]s.

use std::error::Error as _;
use std::time::{Duration, Instant};

use tonic::Code;
use wasmlet_runtime::Error;

/// What a call was about, so that an error can name it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Op<'a> {
    /// The CRI method, e.g. `StopContainer`.
    pub rpc: &'static str,
    /// The kind of object acted on: `sandbox`, `container` or `image`.
    pub kind: &'static str,
    /// The object's id or reference; empty for calls about no object.
    pub id: &'a str,
    /// The deadline the call ran under, if any.
    pub timeout: Option<Duration>,
    /// When the call was made, to tell whether its deadline has passed.
    pub started: Instant,
}

impl<'a> Op<'a> {
    pub(crate) fn new(rpc: &'static str, kind: &'static str, id: &'a str) -> Self {
        Op {
            rpc,
            kind,
            id,
            timeout: None,
            started: Instant::now(),
        }
    }

    /// Whether the call has run past its deadline. A `Cancelled` status then means
    /// the deadline, whichever side noticed it first: tonic's client reports it with a
    /// local `TimeoutExpired` source, while a server that honours `grpc-timeout` may
    /// answer `Cancelled` itself.
    fn deadline_passed(&self) -> bool {
        self.timeout.is_some_and(|t| self.started.elapsed() >= t)
    }

    pub(crate) fn timeout(mut self, timeout: Option<Duration>) -> Self {
        self.timeout = timeout;
        self
    }
}

/// Maps a failed CRI call to the runtime seam's error.
///
/// - `NotFound` names the object ([`Error::NotFound`]);
/// - `Unavailable`, and errors that never reached the runtime (the socket is absent,
///   the connection broke: tonic reports those as `Unknown`, or as `Cancelled` when
///   the connection closed under the call, with a local source), become
///   [`Error::Unavailable`], which the node retries;
/// - `DeadlineExceeded`, and the client's own deadline, become [`Error::Timeout`];
/// - `Unimplemented` becomes [`Error::Unsupported`];
/// - `InvalidArgument` and `FailedPrecondition` keep their meaning;
/// - anything else is [`Error::Internal`] with the code and the runtime's message.
///
/// [`Error::Unavailable`] and [`Error::Internal`] keep the `Status` itself as their
/// [`source`](std::error::Error::source), so a caller can still read its code.
pub(crate) fn from_status(op: &Op<'_>, status: tonic::Status) -> Error {
    let message = status.message().to_owned();
    let timeout = || Error::Timeout {
        operation: op.rpc,
        after: op.timeout.unwrap_or_default(),
    };
    match status.code() {
        Code::NotFound => Error::not_found(op.kind, op.id),
        Code::Unavailable => Error::Unavailable {
            message: format!("{}: {message}", op.rpc),
            source: Some(status.into()),
        },
        Code::DeadlineExceeded => timeout(),
        Code::Cancelled if caused_by::<tonic::TimeoutExpired>(&status) || op.deadline_passed() => {
            timeout()
        }
        // A Cancelled the client made itself (it carries the local error: hyper's
        // "operation was canceled: connection closed") is a connection that went away
        // under the call, as when the runtime restarts: retried like any other.
        Code::Cancelled if status.source().is_some() => Error::Unavailable {
            message: format!("{}: {}", op.rpc, describe(&status)),
            source: Some(status.into()),
        },
        // A status that carries a source was made by the client from a local error
        // (connect, I/O, HTTP/2), not sent by the runtime: the runtime is unreachable.
        Code::Unknown if status.source().is_some() => Error::Unavailable {
            message: format!("{}: {}", op.rpc, describe(&status)),
            source: Some(status.into()),
        },
        Code::InvalidArgument => Error::InvalidArgument(format!("{}: {message}", op.rpc)),
        Code::FailedPrecondition => Error::FailedPrecondition(format!("{}: {message}", op.rpc)),
        Code::Unimplemented => Error::Unsupported {
            runtime: "cri".to_owned(),
            operation: op.rpc,
        },
        code => Error::Internal {
            message: format!("{} failed ({code:?}): {message}", op.rpc),
            source: Some(status.into()),
        },
    }
}

fn caused_by<E: std::error::Error + 'static>(status: &tonic::Status) -> bool {
    let mut source = status.source();
    while let Some(err) = source {
        if err.is::<E>() {
            return true;
        }
        source = err.source();
    }
    false
}

/// The status message followed by its chain of causes, which is where a transport
/// error says what actually happened (`No such file or directory`).
fn describe(status: &tonic::Status) -> String {
    let mut text = status.message().to_owned();
    let mut source = status.source();
    while let Some(err) = source {
        let cause = err.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
        source = err.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op() -> Op<'static> {
        Op::new("StopContainer", "container", "c1").timeout(Some(Duration::from_secs(3)))
    }

    /// What the mapped error must look like.
    type Expect = fn(&Error) -> bool;

    #[test]
    fn codes_map_to_seam_errors() {
        let cases: Vec<(tonic::Status, Expect)> = vec![
            (
                tonic::Status::not_found("gone"),
                |e| matches!(e, Error::NotFound { kind: "container", id } if id == "c1"),
            ),
            (
                tonic::Status::unavailable("down"),
                |e| matches!(e, Error::Unavailable { message: m, .. } if m.contains("down") && m.contains("StopContainer")),
            ),
            (
                tonic::Status::deadline_exceeded("slow"),
                |e| matches!(e, Error::Timeout { operation: "StopContainer", after } if *after == Duration::from_secs(3)),
            ),
            (
                tonic::Status::invalid_argument("bad"),
                |e| matches!(e, Error::InvalidArgument(m) if m.contains("bad")),
            ),
            (
                tonic::Status::failed_precondition("running"),
                |e| matches!(e, Error::FailedPrecondition(m) if m.contains("running")),
            ),
            (tonic::Status::unimplemented("no"), |e| {
                matches!(
                    e,
                    Error::Unsupported {
                        operation: "StopContainer",
                        ..
                    }
                )
            }),
            (
                tonic::Status::internal("boom"),
                |e| matches!(e, Error::Internal { message: m, .. } if m.contains("boom") && m.contains("Internal")),
            ),
            // Sent by the runtime as Unknown: no source, so it is the runtime's error.
            (
                tonic::Status::unknown("runc failed"),
                |e| matches!(e, Error::Internal { message: m, .. } if m.contains("runc failed")),
            ),
            // A plain Cancelled from the runtime is not our deadline.
            (tonic::Status::cancelled("ctx"), |e| {
                matches!(e, Error::Internal { .. })
            }),
        ];
        for (status, expect) in cases {
            let shown = format!("{status:?}");
            let err = from_status(&op(), status);
            assert!(expect(&err), "{shown} became {err:?}");
        }
    }

    #[test]
    fn local_transport_errors_are_unavailable() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory");
        let status = tonic::Status::from_error(Box::new(io));
        assert_eq!(status.code(), Code::Unknown);
        let err = from_status(&op(), status);
        assert!(
            matches!(&err, Error::Unavailable { message: m, .. } if m.contains("No such file")),
            "{err:?}"
        );
    }

    #[test]
    fn connect_errors_are_unavailable() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let status = tonic::Status::from_error(Box::new(tonic::ConnectError(Box::new(io))));
        let err = from_status(&op(), status);
        assert!(matches!(&err, Error::Unavailable { .. }), "{err:?}");
    }

    /// What the client makes of a connection closed under a call (hyper's canceled
    /// error, which tonic turns into `Cancelled` and keeps as the source).
    #[derive(Debug)]
    struct ConnectionClosed(tonic::Status);

    impl std::fmt::Display for ConnectionClosed {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("operation was canceled: connection closed")
        }
    }

    impl std::error::Error for ConnectionClosed {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_connection_closed_under_a_call_is_unavailable() {
        let status = tonic::Status::from_error(Box::new(ConnectionClosed(
            tonic::Status::cancelled("operation was canceled: connection closed"),
        )));
        assert_eq!(status.code(), Code::Cancelled);
        let err = from_status(&op(), status);
        assert!(
            matches!(&err, Error::Unavailable { message: m, .. } if m.contains("connection closed")),
            "{err:?}"
        );
    }

    #[test]
    fn client_deadline_is_timeout() {
        let status = tonic::Status::from_error(Box::new(tonic::TimeoutExpired(())));
        assert_eq!(status.code(), Code::Cancelled);
        let err = from_status(&op(), status);
        assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    }

    /// A server that honours `grpc-timeout` (tonic does) may answer `Cancelled` before
    /// the client's own timer fires; past the deadline that is still the deadline.
    #[test]
    fn a_cancelled_answer_past_the_deadline_is_timeout() {
        let past = Op {
            started: Instant::now() - Duration::from_secs(4),
            ..op()
        };
        let err = from_status(&past, tonic::Status::cancelled("Timeout expired"));
        assert!(
            matches!(err, Error::Timeout { operation: "StopContainer", after } if after == Duration::from_secs(3)),
            "{err:?}"
        );
    }

    /// The `Status` a mapped error came from, as its source.
    fn status_of(err: &Error) -> &tonic::Status {
        err.source()
            .and_then(|s| s.downcast_ref::<tonic::Status>())
            .unwrap_or_else(|| panic!("{err:?} does not keep its Status"))
    }

    #[test]
    fn mapped_errors_keep_the_status_as_their_source() {
        for status in [
            tonic::Status::unavailable("down"),
            tonic::Status::internal("boom"),
            tonic::Status::unknown("runc failed"),
            tonic::Status::resource_exhausted("no space"),
        ] {
            let (code, message) = (status.code(), status.message().to_owned());
            let err = from_status(&op(), status);
            assert!(
                matches!(err, Error::Unavailable { .. } | Error::Internal { .. }),
                "{err:?}"
            );
            let source = status_of(&err);
            assert_eq!(source.code(), code);
            assert_eq!(source.message(), message);
            // The text is still the one the node shows: the runtime's message in it.
            assert!(err.to_string().contains(&message), "{err}");
        }
    }

    #[test]
    fn transport_errors_keep_their_cause_reachable() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory");
        let status = tonic::Status::from_error(Box::new(io));
        let err = from_status(&op(), status);
        assert_eq!(status_of(&err).code(), Code::Unknown);
        // Status -> io::Error: the ErrorKind is still there for a caller that asks.
        let mut cause = err.source();
        let mut kind = None;
        while let Some(e) = cause {
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                kind = Some(io.kind());
            }
            cause = e.source();
        }
        assert_eq!(kind, Some(std::io::ErrorKind::NotFound), "{err:?}");
    }
}
