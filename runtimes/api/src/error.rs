//! Errors a runtime returns to the node.
//!
//! # Messages and causes
//!
//! [`Error::Unavailable`], [`Error::Internal`] and [`Error::ImagePull`] carry a
//! message and, when there is one, the error that caused them, as Go's
//! `fmt.Errorf("...: %w", err)` does in the kubelet:
//!
//! - the message already includes the cause's text, so the error's `Display` is
//!   complete on its own: it is what a pod status, an event or a log line shows, and
//!   nobody needs to walk the chain to read it;
//! - [`std::error::Error::source`] returns the cause itself (a `tonic::Status`, an
//!   `io::Error`, an image store error, ...) for a caller that inspects it: a gRPC
//!   code, an [`std::io::ErrorKind`]. It is `None` when the runtime found the problem
//!   itself and there is no underlying error.
//!
//! [`Error::internal_from`] and [`Error::unavailable_from`] build both from a context
//! and the cause (`"{context}: {cause}"`), [`Error::internal_source`] and
//! [`Error::image_pull_from`] from a cause whose text says it all; when the message
//! is worded otherwise, build the variant with its `source` field directly.

use std::fmt;

/// A cause kept in an [`Error`]: any error that can cross threads.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong in a runtime call, with enough context to put in a pod status.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The sandbox, container or image does not exist (any more).
    #[error("{kind} {id:?} not found")]
    NotFound { kind: &'static str, id: String },

    /// The image could not be found or fetched; the node reports `ErrImagePull`.
    #[error("failed to pull image {image:?}: {message}")]
    ImagePull {
        image: String,
        /// What went wrong, including the cause's text.
        message: String,
        /// The cause, if any (the runtime's error, an I/O error).
        #[source]
        source: Option<BoxError>,
    },

    /// The request makes no sense for the object's state or is malformed.
    #[error("invalid request: {0}")]
    InvalidArgument(String),

    /// The object is not in a state that allows the operation.
    #[error("{0}")]
    FailedPrecondition(String),

    /// The runtime cannot be reached or is not ready; the caller retries.
    #[error("runtime unavailable: {message}")]
    Unavailable {
        /// What could not be reached, including the cause's text.
        message: String,
        /// The cause, if any (a transport error, a `tonic::Status`).
        #[source]
        source: Option<BoxError>,
    },

    /// The runtime does not offer this operation.
    #[error("the {runtime} runtime does not support {operation}")]
    Unsupported {
        runtime: String,
        operation: &'static str,
    },

    /// The call did not finish in time.
    #[error("{operation} timed out after {after:?}")]
    Timeout {
        operation: &'static str,
        after: std::time::Duration,
    },

    /// Anything else, with its message.
    #[error("{message}")]
    Internal {
        /// What went wrong, including the cause's text.
        message: String,
        /// The cause, if any (an I/O error, a `tonic::Status`).
        #[source]
        source: Option<BoxError>,
    },
}

impl Error {
    /// Shorthand for [`Error::NotFound`].
    pub fn not_found(kind: &'static str, id: impl Into<String>) -> Self {
        Error::NotFound {
            kind,
            id: id.into(),
        }
    }

    /// An [`Error::Internal`] the runtime found itself: no underlying error.
    pub fn internal(message: impl Into<String>) -> Self {
        Error::Internal {
            message: message.into(),
            source: None,
        }
    }

    /// An [`Error::Internal`] caused by `source`: the message is
    /// `"{context}: {source}"` and [`source()`](std::error::Error::source) is `source`.
    pub fn internal_from(context: impl fmt::Display, source: impl Into<BoxError>) -> Self {
        let source = source.into();
        Error::Internal {
            message: format!("{context}: {source}"),
            source: Some(source),
        }
    }

    /// An [`Error::Internal`] that is `source` and nothing more: the message is
    /// `source`'s text, for an error that already says what it was about.
    pub fn internal_source(source: impl Into<BoxError>) -> Self {
        let source = source.into();
        Error::Internal {
            message: source.to_string(),
            source: Some(source),
        }
    }

    /// An [`Error::Unavailable`] with no underlying error.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Error::Unavailable {
            message: message.into(),
            source: None,
        }
    }

    /// An [`Error::Unavailable`] caused by `source`: the message is
    /// `"{context}: {source}"` and [`source()`](std::error::Error::source) is `source`.
    pub fn unavailable_from(context: impl fmt::Display, source: impl Into<BoxError>) -> Self {
        let source = source.into();
        Error::Unavailable {
            message: format!("{context}: {source}"),
            source: Some(source),
        }
    }

    /// An [`Error::ImagePull`] with no underlying error.
    pub fn image_pull(image: impl Into<String>, message: impl Into<String>) -> Self {
        Error::ImagePull {
            image: image.into(),
            message: message.into(),
            source: None,
        }
    }

    /// An [`Error::ImagePull`] caused by `source`, whose text is the message.
    pub fn image_pull_from(image: impl Into<String>, source: impl Into<BoxError>) -> Self {
        let source = source.into();
        Error::ImagePull {
            image: image.into(),
            message: source.to_string(),
            source: Some(source),
        }
    }

    /// Whether the error says the object is gone.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound { .. })
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn internal_from_keeps_its_cause_and_its_text() {
        let cause = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "access denied");
        let err = Error::internal_from("creating /var/lib/wasmlet", cause);
        assert_eq!(err.to_string(), "creating /var/lib/wasmlet: access denied");
        let source = err.source().expect("a source");
        let io = source
            .downcast_ref::<std::io::Error>()
            .expect("the io::Error itself");
        assert_eq!(io.kind(), std::io::ErrorKind::PermissionDenied);
        assert_eq!(io.to_string(), "access denied");
    }

    #[test]
    fn unavailable_from_keeps_its_cause_and_its_text() {
        let cause = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let err = Error::unavailable_from("sandbox s1", cause);
        assert_eq!(err.to_string(), "runtime unavailable: sandbox s1: refused");
        let io = err
            .source()
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .expect("the io::Error itself");
        assert_eq!(io.kind(), std::io::ErrorKind::ConnectionRefused);
    }

    #[test]
    fn image_pull_from_shows_its_cause() {
        let cause = Error::not_found("image", "ghost");
        let err = Error::image_pull_from("ghost", cause);
        assert_eq!(
            err.to_string(),
            r#"failed to pull image "ghost": image "ghost" not found"#
        );
        let inner = err
            .source()
            .and_then(|s| s.downcast_ref::<Error>())
            .expect("the runtime's error");
        assert!(inner.is_not_found());
    }

    #[test]
    fn errors_without_a_cause_have_no_source() {
        for err in [
            Error::internal("boom"),
            Error::unavailable("down"),
            Error::image_pull("ghost", "not found"),
        ] {
            assert!(err.source().is_none(), "{err:?}");
        }
        assert_eq!(Error::internal("boom").to_string(), "boom");
        assert_eq!(
            Error::unavailable("down").to_string(),
            "runtime unavailable: down"
        );
        assert_eq!(
            Error::image_pull("ghost", "not found").to_string(),
            r#"failed to pull image "ghost": not found"#
        );
    }
}
