//! What the node offers every plugin: its log, the plugin's settings, the clock.
//!
//! Log with the macros [`trace!`](crate::trace), [`debug!`](crate::debug),
//! [`info!`](crate::info), [`warn!`](crate::warn) and [`error!`](crate::error)
//! (also re-exported here, `wasmlet_plugin_sdk::host::info!`), or call [`log`].
//!
//! Off `wasm32` (a plugin's unit tests on the build machine) these functions do not
//! reach a node: [`log`] prints to stderr, [`settings`] is empty and [`now_ms`]
//! reads the system clock.

use std::fmt;
use std::str::FromStr;

use crate::types::{Pair, lookup};

pub use crate::bindings::probe_world::wasmlet::plugin::host::Level;
pub use crate::{debug, error, info, trace, warn};

/// Writes `message` to the node's log at `level`, tagged with the plugin's name.
///
/// The node cuts lines longer than 4 KiB and drops lines after the 100th of one call.
pub fn log(level: Level, message: &str) {
    #[cfg(target_arch = "wasm32")]
    crate::bindings::probe_world::wasmlet::plugin::host::log(level, message);
    #[cfg(not(target_arch = "wasm32"))]
    eprintln!("[{}] {message}", level_name(level));
}

/// The level's name as the node's log prints it.
pub fn level_name(level: Level) -> &'static str {
    match level {
        Level::Trace => "trace",
        Level::Debug => "debug",
        Level::Info => "info",
        Level::Warn => "warn",
        Level::Error => "error",
    }
}

/// The plugin's `settings` from the node configuration.
pub fn settings() -> Settings {
    #[cfg(target_arch = "wasm32")]
    let pairs = crate::bindings::probe_world::wasmlet::plugin::host::settings();
    #[cfg(not(target_arch = "wasm32"))]
    let pairs = Vec::new();
    Settings::new(pairs)
}

/// Wall-clock time, milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    #[cfg(target_arch = "wasm32")]
    let now = crate::bindings::probe_world::wasmlet::plugin::host::now_ms();
    #[cfg(not(target_arch = "wasm32"))]
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    now
}

/// Key/value settings, looked up by key; an earlier pair wins over a later one
/// with the same key, which is how [`Settings::or`] layers them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    pairs: Vec<Pair>,
}

impl Settings {
    /// Settings from pairs, in precedence order.
    pub fn new(pairs: Vec<Pair>) -> Self {
        Settings { pairs }
    }

    /// These settings, falling back to `fallback` for keys they lack. A probe uses
    /// it to layer the pod's settings over the node's:
    /// `Settings::new(request.settings.clone()).or(host::settings())`.
    pub fn or(mut self, fallback: Settings) -> Self {
        self.pairs.extend(fallback.pairs);
        self
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        lookup(&self.pairs, key)
    }

    /// The value of `key`, or `default`.
    pub fn get_or<'a>(&'a self, key: &str, default: &'a str) -> &'a str {
        self.get(key).unwrap_or(default)
    }

    /// The value of `key`, or [`SettingError::Missing`].
    pub fn require(&self, key: &str) -> Result<&str, SettingError> {
        self.get(key).ok_or_else(|| SettingError::Missing {
            key: key.to_string(),
        })
    }

    /// The value of `key` parsed as `T`: `Ok(None)` when absent,
    /// [`SettingError::Invalid`] when it does not parse.
    pub fn parse<T>(&self, key: &str) -> Result<Option<T>, SettingError>
    where
        T: FromStr,
        T::Err: fmt::Display,
    {
        self.get(key)
            .map(|value| {
                value
                    .trim()
                    .parse::<T>()
                    .map_err(|e| SettingError::Invalid {
                        key: key.to_string(),
                        value: value.to_string(),
                        reason: e.to_string(),
                    })
            })
            .transpose()
    }

    /// The value of `key` parsed as `T`, or `default` when absent.
    pub fn parse_or<T>(&self, key: &str, default: T) -> Result<T, SettingError>
    where
        T: FromStr,
        T::Err: fmt::Display,
    {
        Ok(self.parse(key)?.unwrap_or(default))
    }

    /// Every pair, in precedence order (a shadowed key appears more than once).
    pub fn pairs(&self) -> &[Pair] {
        &self.pairs
    }

    /// Whether there are no settings at all.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }
}

/// Settings from `(key, value)` tuples, e.g. in a plugin's unit tests.
impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Settings {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(pairs: I) -> Self {
        Settings::new(pairs.into_iter().map(|(k, v)| Pair::new(k, v)).collect())
    }
}

/// A setting that is missing or does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettingError {
    /// A required key is not set.
    Missing {
        /// The key.
        key: String,
    },
    /// The value does not parse as the type the plugin wants.
    Invalid {
        /// The key.
        key: String,
        /// The value as configured.
        value: String,
        /// Why it does not parse.
        reason: String,
    },
}

impl fmt::Display for SettingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SettingError::Missing { key } => write!(f, "setting `{key}` is not set"),
            SettingError::Invalid { key, value, reason } => {
                write!(f, "setting `{key}` = {value:?} is invalid: {reason}")
            }
        }
    }
}

impl std::error::Error for SettingError {}

/// Logs a `format!` message at [`Level::Trace`].
#[macro_export]
macro_rules! trace {
    ($($arg:tt)*) => {
        $crate::host::log($crate::host::Level::Trace, &::std::format!($($arg)*))
    };
}

/// Logs a `format!` message at [`Level::Debug`].
#[macro_export]
macro_rules! debug {
    ($($arg:tt)*) => {
        $crate::host::log($crate::host::Level::Debug, &::std::format!($($arg)*))
    };
}

/// Logs a `format!` message at [`Level::Info`].
#[macro_export]
macro_rules! info {
    ($($arg:tt)*) => {
        $crate::host::log($crate::host::Level::Info, &::std::format!($($arg)*))
    };
}

/// Logs a `format!` message at [`Level::Warn`].
#[macro_export]
macro_rules! warn {
    ($($arg:tt)*) => {
        $crate::host::log($crate::host::Level::Warn, &::std::format!($($arg)*))
    };
}

/// Logs a `format!` message at [`Level::Error`].
#[macro_export]
macro_rules! error {
    ($($arg:tt)*) => {
        $crate::host::log($crate::host::Level::Error, &::std::format!($($arg)*))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earlier_settings_win_and_fallbacks_fill_in() {
        let pod = Settings::from_iter([("path", "/ready"), ("port", "8080")]);
        let node = Settings::from_iter([("path", "/healthz"), ("field", "status")]);
        let s = pod.or(node);
        assert_eq!(s.get("path"), Some("/ready"));
        assert_eq!(s.get("field"), Some("status"));
        assert_eq!(s.get("expect"), None);
        assert_eq!(s.get_or("expect", "ok"), "ok");
        assert_eq!(s.parse::<u16>("port"), Ok(Some(8080)));
        assert_eq!(s.parse_or::<u16>("missing", 80), Ok(80));
    }

    #[test]
    fn bad_and_missing_settings_name_the_key() {
        let s = Settings::from_iter([("port", "http")]);
        let err = s.parse::<u16>("port").unwrap_err();
        assert!(matches!(err, SettingError::Invalid { ref key, .. } if key == "port"));
        assert!(err.to_string().contains("`port` = \"http\""), "{err}");
        assert_eq!(
            s.require("label").unwrap_err().to_string(),
            "setting `label` is not set"
        );
    }

    #[test]
    fn off_wasm_the_host_functions_work_locally() {
        info!("logging {} works off wasm", 1);
        assert!(settings().is_empty());
        assert!(now_ms() > 1_600_000_000_000);
    }
}
