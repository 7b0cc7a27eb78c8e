//! The crate's two error boundaries: loading a plugin ([`Error`]) and calling one
//! ([`CallError`]).

use std::path::PathBuf;
use std::time::Duration;

use crate::config::{ConfigError, World};

/// Loading, reloading or unloading a plugin failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid plugin configuration: {}", join(.0))]
    InvalidConfig(Vec<ConfigError>),
    #[error("plugin {name}: reading {}: {source}", path.display())]
    Read {
        name: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("plugin {name}: not a valid Wasm component: {reason}")]
    InvalidComponent { name: String, reason: String },
    #[error("plugin {name}: not for the {world} world: {reason}")]
    WrongWorld {
        name: String,
        world: World,
        reason: String,
    },
    #[error("plugin {name}: {source}")]
    Init { name: String, source: CallError },
    #[error("plugin {0} is already loaded")]
    AlreadyLoaded(String),
    #[error("plugin {0} is not loaded")]
    NotLoaded(String),
    #[error(
        "plugin {0}: an image source is resolved by the node, which loads the bytes with load_bytes"
    )]
    ImageSource(String),
    #[error("plugin {0}: its source is not a file")]
    NotAFile(String),
    #[error("plugin engine: {0}")]
    Engine(String),
}

fn join(errors: &[ConfigError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A call into a plugin that did not return a valid answer.
///
/// Every kind but [`NotLoaded`](CallError::NotLoaded),
/// [`WrongWorld`](CallError::WrongWorld), [`Disabled`](CallError::Disabled) and
/// [`Busy`](CallError::Busy) is the plugin's fault: it is counted as a failure and, repeated, disables the
/// plugin for a while.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    #[error("plugin {0} is not loaded")]
    NotLoaded(String),
    #[error("plugin {plugin} is for the {actual} world, not {expected}")]
    WrongWorld {
        plugin: String,
        expected: World,
        actual: World,
    },
    /// After repeated failures; calls are refused until `until`.
    #[error("plugin {plugin} is disabled for {remaining:?} after {failures} consecutive failures")]
    Disabled {
        plugin: String,
        until: tokio::time::Instant,
        remaining: Duration,
        failures: u32,
    },
    /// The call ran past its deadline (the epoch deadline, or a host call that did).
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The plugin tried to grow its memory past its cap.
    #[error("out of memory: the plugin's cap is {cap} bytes")]
    OutOfMemory { cap: u64 },
    /// The plugin trapped (a panic, `unreachable`, an out-of-bounds access...).
    #[error("trapped: {0}")]
    Trap(String),
    /// The plugin answered something the ABI forbids (too big, an index out of range...).
    #[error("invalid result: {0}")]
    InvalidResult(String),
    /// A fresh instance could not be made (the host's instance pool is exhausted or
    /// instantiation failed).
    #[error("instantiation failed: {0}")]
    Instantiate(String),
    /// Every instance slot of the host stayed taken until the call's deadline: the
    /// node is busy, the plugin never ran (not counted against it).
    #[error("no free plugin instance within {0:?}: the node's plugins are all busy")]
    Busy(Duration),
}

impl CallError {
    /// The metrics label: `timeout`, `out_of_memory`, `trap`, `invalid_result`,
    /// `instantiate`, `disabled`, `not_loaded`, `wrong_world`.
    pub fn kind(&self) -> &'static str {
        match self {
            CallError::NotLoaded(_) => "not_loaded",
            CallError::WrongWorld { .. } => "wrong_world",
            CallError::Disabled { .. } => "disabled",
            CallError::Timeout(_) => "timeout",
            CallError::OutOfMemory { .. } => "out_of_memory",
            CallError::Trap(_) => "trap",
            CallError::InvalidResult(_) => "invalid_result",
            CallError::Instantiate(_) => "instantiate",
            CallError::Busy(_) => "busy",
        }
    }

    /// Whether the plugin is to blame, so the failure counts toward disabling it.
    pub fn is_plugin_failure(&self) -> bool {
        !matches!(
            self,
            CallError::NotLoaded(_)
                | CallError::WrongWorld { .. }
                | CallError::Disabled { .. }
                | CallError::Busy(_)
        )
    }
}
