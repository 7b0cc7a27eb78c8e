//! What the node's configuration says about each plugin (`plugins:` in its config
//! file), and the checks run on it before anything is loaded.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The default per-call deadline when `limits.timeoutMillis` is not set.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// The longest per-call deadline a configuration may ask for.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);
/// The default memory cap when `limits.memoryBytes` is not set.
pub const DEFAULT_MEMORY_BYTES: u64 = 64 << 20;
/// The smallest memory cap a configuration may ask for (a component with the
/// WASI adapter needs a few pages before it runs any plugin code).
pub const MIN_MEMORY_BYTES: u64 = 1 << 20;

/// One plugin, as the node's configuration declares it.
///
/// ```yaml
/// plugins:
/// - name: grpc-health
///   world: probe-plugin
///   source: { file: /etc/wasmlet/plugins/grpc_health.wasm }
///   limits: { timeoutMillis: 500, memoryBytes: 33554432 }
///   settings: { service: health }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginConfig {
    /// Unique among the node's plugins; a DNS label (it names the plugin in logs,
    /// events, metrics and pod annotations).
    pub name: String,
    /// Which world the component implements.
    pub world: World,
    /// Where the component comes from.
    pub source: PluginSource,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub grants: Grants,
    /// Returned to the plugin by `host.settings`.
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
    /// Admission plugins only: what a failed call decides [default: `Fail`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_policy: Option<FailurePolicy>,
}

/// The keys of one `plugins:` entry, for the node's hint on a misspelt one.
pub const PLUGIN_KEYS: &[&str] = &[
    "name",
    "world",
    "source",
    "limits",
    "grants",
    "settings",
    "failurePolicy",
];
/// The keys of `limits:`.
pub const LIMITS_KEYS: &[&str] = &["timeoutMillis", "memoryBytes"];
/// The keys of `grants:`.
pub const GRANTS_KEYS: &[&str] = &["filesystem", "network"];
/// The keys of one `grants.filesystem` entry.
pub const FILESYSTEM_GRANT_KEYS: &[&str] = &["hostPath", "guestPath", "readOnly"];

/// The world a plugin implements, named as the WIT names it (`probe-plugin`, ...):
/// one name in the WIT, the configuration, the metrics and the docs.
///
/// The short names of the first releases (`probe`, `admission`, `eviction`,
/// `device-adapter`) are still read, as deprecated aliases; the node warns about
/// them ([`World::from_deprecated_alias`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum World {
    #[serde(rename = "probe-plugin", alias = "probe")]
    Probe,
    #[serde(rename = "admission-plugin", alias = "admission")]
    Admission,
    #[serde(rename = "eviction-plugin", alias = "eviction")]
    Eviction,
    #[serde(rename = "device-adapter-plugin", alias = "device-adapter")]
    DeviceAdapter,
}

impl World {
    /// Every world, in the ABI's order.
    pub const ALL: [World; 4] = [
        World::Probe,
        World::Admission,
        World::Eviction,
        World::DeviceAdapter,
    ];

    /// The WIT world's name, which is also the configuration's spelling:
    /// `probe-plugin`, `admission-plugin`, `eviction-plugin`, `device-adapter-plugin`.
    pub fn as_str(self) -> &'static str {
        match self {
            World::Probe => "probe-plugin",
            World::Admission => "admission-plugin",
            World::Eviction => "eviction-plugin",
            World::DeviceAdapter => "device-adapter-plugin",
        }
    }

    /// The world a name denotes: the WIT name, or a deprecated short one.
    pub fn parse(name: &str) -> Option<World> {
        World::ALL
            .into_iter()
            .find(|w| w.as_str() == name)
            .or_else(|| World::from_deprecated_alias(name))
    }

    /// The world a deprecated short name (`probe`, ...) denotes, if `name` is one.
    pub fn from_deprecated_alias(name: &str) -> Option<World> {
        World::ALL
            .into_iter()
            .find(|w| w.as_str().strip_suffix("-plugin") == Some(name))
    }

    /// The interface the component must export, with its version.
    pub fn export(self) -> &'static str {
        match self {
            World::Probe => "wasmlet:plugin/probe@0.1.0",
            World::Admission => "wasmlet:plugin/admission@0.1.0",
            World::Eviction => "wasmlet:plugin/eviction@0.1.0",
            World::DeviceAdapter => "wasmlet:plugin/device-adapter@0.1.0",
        }
    }
}

impl std::str::FromStr for World {
    type Err = String;

    fn from_str(name: &str) -> Result<World, String> {
        World::parse(name).ok_or_else(|| {
            let names: Vec<&str> = World::ALL.iter().map(|w| w.as_str()).collect();
            format!("unknown world `{name}`: one of {}", names.join(", "))
        })
    }
}

impl fmt::Display for World {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a plugin's component comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum PluginSource {
    /// A component file on the node; the host reads it and reloads it when it changes.
    File(PathBuf),
    /// An OCI image reference; the node pulls it and hands the bytes to
    /// [`PluginHost::load_bytes`](crate::PluginHost::load_bytes).
    Image(String),
}

/// The limits every call of the plugin runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// The deadline of one call, in milliseconds (a probe call uses the probe's
    /// `timeoutSeconds` instead) [default: 1000].
    #[serde(default = "default_timeout_millis")]
    pub timeout_millis: u64,
    /// The cap on the plugin's linear memory, all memories of the component
    /// together [default: 64 MiB].
    #[serde(default = "default_memory_bytes")]
    pub memory_bytes: u64,
}

fn default_timeout_millis() -> u64 {
    DEFAULT_TIMEOUT.as_millis() as u64
}

fn default_memory_bytes() -> u64 {
    DEFAULT_MEMORY_BYTES
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout_millis: default_timeout_millis(),
            memory_bytes: default_memory_bytes(),
        }
    }
}

impl Limits {
    /// The per-call deadline.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_millis)
    }
}

/// What the sandbox lets the plugin reach beyond the ABI. Nothing by default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Grants {
    /// Host directories preopened for the plugin.
    #[serde(default)]
    pub filesystem: Vec<FilesystemGrant>,
    /// WASI sockets (TCP, UDP, name lookup) to any address.
    #[serde(default)]
    pub network: bool,
}

/// A host directory the plugin sees at `guestPath`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FilesystemGrant {
    /// An absolute directory on the node.
    pub host_path: PathBuf,
    /// Where the plugin finds it, e.g. `/data`.
    pub guest_path: String,
    /// [default: true]
    #[serde(default = "default_true")]
    pub read_only: bool,
}

fn default_true() -> bool {
    true
}

/// What an admission plugin's failed call decides.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailurePolicy {
    /// Deny the pod with reason `PluginError` (fail closed).
    #[default]
    Fail,
    /// Admit the pod as if the plugin had not been asked.
    Ignore,
}

/// One bad value in a plugin's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The field's path in the config file, e.g. `plugins[1].limits.memoryBytes`.
    pub field: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl PluginConfig {
    /// Every bad value of this plugin's configuration, with field paths relative to
    /// the plugin (`limits.memoryBytes`). `max_memory_bytes` is the host's cap
    /// ([`HostOptions::max_memory_bytes`](crate::HostOptions::max_memory_bytes)).
    pub fn validate(&self, max_memory_bytes: u64) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        let mut bad = |field: &str, message: String| {
            errors.push(ConfigError {
                field: field.to_string(),
                message,
            })
        };
        if !is_dns_label(&self.name) {
            bad(
                "name",
                format!(
                    "{:?} is not a DNS label (1-63 lowercase letters, digits and '-', starting and ending with an alphanumeric)",
                    self.name
                ),
            );
        }
        match &self.source {
            PluginSource::File(path) if !path.is_absolute() => bad(
                "source.file",
                format!("{} is not an absolute path", path.display()),
            ),
            PluginSource::Image(image) if image.trim().is_empty() => {
                bad("source.image", "is empty".into())
            }
            _ => {}
        }
        let max_timeout = MAX_TIMEOUT.as_millis() as u64;
        if self.limits.timeout_millis == 0 || self.limits.timeout_millis > max_timeout {
            bad(
                "limits.timeoutMillis",
                format!(
                    "{} is not between 1 and {max_timeout}",
                    self.limits.timeout_millis
                ),
            );
        }
        if self.limits.memory_bytes < MIN_MEMORY_BYTES
            || self.limits.memory_bytes > max_memory_bytes
        {
            bad(
                "limits.memoryBytes",
                format!(
                    "{} is not between {MIN_MEMORY_BYTES} and the host's cap {max_memory_bytes}",
                    self.limits.memory_bytes
                ),
            );
        }
        let mut guest_paths = HashSet::new();
        for (i, grant) in self.grants.filesystem.iter().enumerate() {
            if !grant.host_path.is_absolute() {
                bad(
                    &format!("grants.filesystem[{i}].hostPath"),
                    format!("{} is not an absolute path", grant.host_path.display()),
                );
            }
            if grant.guest_path.is_empty() {
                bad(
                    &format!("grants.filesystem[{i}].guestPath"),
                    "is empty".into(),
                );
            } else if !guest_paths.insert(grant.guest_path.as_str()) {
                bad(
                    &format!("grants.filesystem[{i}].guestPath"),
                    format!("{} is granted twice", grant.guest_path),
                );
            }
        }
        for key in self.settings.keys() {
            if key.is_empty() {
                bad("settings", "has an empty key".into());
            }
        }
        if self.failure_policy.is_some() && self.world != World::Admission {
            bad(
                "failurePolicy",
                format!(
                    "only admission plugins have one; a failed {} call has a fixed policy",
                    self.world
                ),
            );
        }
        errors
    }

    /// The admission failure policy in force.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.failure_policy.unwrap_or_default()
    }
}

/// Checks the node's whole `plugins:` list: each plugin, and that names are unique.
/// Field paths start with `plugins[i].`.
pub fn validate_plugins(plugins: &[PluginConfig], max_memory_bytes: u64) -> Vec<ConfigError> {
    let mut errors = Vec::new();
    let mut names = HashSet::new();
    for (i, plugin) in plugins.iter().enumerate() {
        for e in plugin.validate(max_memory_bytes) {
            errors.push(ConfigError {
                field: format!("plugins[{i}].{}", e.field),
                message: e.message,
            });
        }
        if !names.insert(plugin.name.as_str()) {
            errors.push(ConfigError {
                field: format!("plugins[{i}].name"),
                message: format!("{:?} is used by an earlier plugin", plugin.name),
            });
        }
    }
    errors
}

fn is_dns_label(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plugin(name: &str, world: World) -> PluginConfig {
        PluginConfig {
            name: name.into(),
            world,
            source: PluginSource::File("/plugins/p.wasm".into()),
            limits: Limits::default(),
            grants: Grants::default(),
            settings: BTreeMap::new(),
            failure_policy: None,
        }
    }

    #[test]
    fn the_config_file_shape_parses_with_defaults() {
        let yaml = "
- name: grpc-health
  world: probe-plugin
  source: { file: /etc/wasmlet/plugins/grpc.wasm }
  settings: { service: health }
- name: labels
  world: admission-plugin
  source: { image: registry.example/labels:1 }
  limits: { timeoutMillis: 200, memoryBytes: 16777216 }
  grants:
    network: true
    filesystem:
    - { hostPath: /var/lib/x, guestPath: /x }
  failurePolicy: Ignore
- name: widgets
  world: device-adapter-plugin
  source: { file: /p/w.wasm }
";
        let plugins: Vec<PluginConfig> = serde_saphyr::from_str(yaml).unwrap();
        assert_eq!(plugins[0].limits, Limits::default());
        assert_eq!(plugins[0].settings["service"], "health");
        assert_eq!(plugins[0].failure_policy(), FailurePolicy::Fail);
        assert_eq!(
            plugins[1].source,
            PluginSource::Image("registry.example/labels:1".into())
        );
        assert_eq!(plugins[1].limits.timeout(), Duration::from_millis(200));
        assert!(plugins[1].grants.network);
        assert!(plugins[1].grants.filesystem[0].read_only);
        assert_eq!(plugins[1].failure_policy(), FailurePolicy::Ignore);
        assert_eq!(plugins[2].world, World::DeviceAdapter);
        assert!(validate_plugins(&plugins, 256 << 20).is_empty());
    }

    #[test]
    fn the_key_lists_name_every_field() {
        let full = PluginConfig {
            grants: Grants {
                filesystem: vec![FilesystemGrant {
                    host_path: "/a".into(),
                    guest_path: "/b".into(),
                    read_only: true,
                }],
                network: true,
            },
            failure_policy: Some(FailurePolicy::Fail),
            ..plugin("a", World::Admission)
        };
        let value = serde_json::to_value(&full).unwrap();
        let keys = |v: &serde_json::Value| -> Vec<String> {
            let mut keys: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            keys.sort();
            keys
        };
        let sorted = |k: &[&str]| -> Vec<String> {
            let mut k: Vec<String> = k.iter().map(|s| s.to_string()).collect();
            k.sort();
            k
        };
        assert_eq!(keys(&value), sorted(PLUGIN_KEYS));
        assert_eq!(keys(&value["limits"]), sorted(LIMITS_KEYS));
        assert_eq!(keys(&value["grants"]), sorted(GRANTS_KEYS));
        assert_eq!(
            keys(&value["grants"]["filesystem"][0]),
            sorted(FILESYSTEM_GRANT_KEYS)
        );
    }

    #[test]
    fn worlds_are_named_as_the_wit_names_them_and_the_short_names_still_read() {
        for world in World::ALL {
            let wit: World = serde_saphyr::from_str(world.as_str()).unwrap();
            assert_eq!(wit, world);
            let short = world.as_str().strip_suffix("-plugin").unwrap();
            let alias: World = serde_saphyr::from_str(short).unwrap();
            assert_eq!(alias, world);
            assert_eq!(World::from_deprecated_alias(short), Some(world));
            assert_eq!(World::from_deprecated_alias(world.as_str()), None);
            assert_eq!(short.parse::<World>(), Ok(world));
        }
        assert!(
            "probes"
                .parse::<World>()
                .unwrap_err()
                .contains("probe-plugin")
        );
    }

    #[test]
    fn validation_names_every_bad_field() {
        let mut a = plugin("Bad_Name", World::Probe);
        a.source = PluginSource::File("relative.wasm".into());
        a.limits = Limits {
            timeout_millis: 0,
            memory_bytes: 1 << 40,
        };
        a.grants.filesystem = vec![
            FilesystemGrant {
                host_path: "data".into(),
                guest_path: "/d".into(),
                read_only: true,
            },
            FilesystemGrant {
                host_path: "/data".into(),
                guest_path: "/d".into(),
                read_only: true,
            },
        ];
        a.failure_policy = Some(FailurePolicy::Ignore);
        let b = plugin("ok", World::Eviction);
        let c = plugin("ok", World::Eviction);
        let fields: Vec<String> = validate_plugins(&[a, b, c], 256 << 20)
            .into_iter()
            .map(|e| e.field)
            .collect();
        assert_eq!(
            fields,
            [
                "plugins[0].name",
                "plugins[0].source.file",
                "plugins[0].limits.timeoutMillis",
                "plugins[0].limits.memoryBytes",
                "plugins[0].grants.filesystem[0].hostPath",
                "plugins[0].grants.filesystem[1].guestPath",
                "plugins[0].failurePolicy",
                "plugins[2].name",
            ]
        );
    }

    #[test]
    fn dns_labels() {
        for (name, ok) in [
            ("a", true),
            ("grpc-health2", true),
            ("", false),
            ("-a", false),
            ("a-", false),
            ("A", false),
            ("a.b", false),
            (&"a".repeat(64), false),
        ] {
            assert_eq!(is_dns_label(name), ok, "{name}");
        }
    }
}
