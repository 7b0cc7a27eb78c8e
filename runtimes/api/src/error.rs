//! Errors a runtime returns to the node.

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
    ImagePull { image: String, message: String },

    /// The request makes no sense for the object's state or is malformed.
    #[error("invalid request: {0}")]
    InvalidArgument(String),

    /// The object is not in a state that allows the operation.
    #[error("{0}")]
    FailedPrecondition(String),

    /// The runtime cannot be reached or is not ready; the caller retries.
    #[error("runtime unavailable: {0}")]
    Unavailable(String),

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
    #[error("{0}")]
    Internal(String),
}

impl Error {
    /// Shorthand for [`Error::NotFound`].
    pub fn not_found(kind: &'static str, id: impl Into<String>) -> Self {
        Error::NotFound {
            kind,
            id: id.into(),
        }
    }

    /// Whether the error says the object is gone.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound { .. })
    }
}
