//! A CNI client, as libcni and containerd's CRI plugin drive plugins: the network
//! configuration is the first valid file of the configuration directory, each plugin
//! of its list is executed in turn with the `CNI_*` environment and its configuration
//! (with `name`, `cniVersion`, the previous plugin's result and the runtime
//! configuration it declared capabilities for) on stdin, and the last plugin's result
//! is the attachment's. DEL runs the list in reverse with the cached result.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio::io::AsyncWriteExt;

/// How long one plugin may run before it is killed.
pub const PLUGIN_TIMEOUT: Duration = Duration::from_secs(60);

/// A CNI failure, naming the file or plugin it came from.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading the CNI configuration directory {dir}: {source}")]
    ConfDir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("no CNI plugin binary {plugin:?} in {dirs}")]
    MissingPlugin { plugin: String, dirs: String },
    #[error("CNI plugin {plugin} ({command}) could not be run: {source}")]
    Exec {
        plugin: String,
        command: &'static str,
        source: std::io::Error,
    },
    #[error("CNI plugin {plugin} ({command}) did not finish within {PLUGIN_TIMEOUT:?}")]
    Timeout {
        plugin: String,
        command: &'static str,
    },
    #[error("CNI plugin {plugin} ({command}) failed: {message}")]
    Plugin {
        plugin: String,
        command: &'static str,
        message: String,
    },
    #[error("CNI plugin {plugin} ({command}) gave a result that is not valid JSON: {reason}")]
    BadResult {
        plugin: String,
        command: &'static str,
        reason: String,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A network configuration list (a `.conflist`, or a single `.conf` wrapped in one).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NetworkList {
    pub name: String,
    #[serde(rename = "cniVersion")]
    pub cni_version: String,
    /// Each plugin's configuration as written.
    pub plugins: Vec<Map<String, Value>>,
    /// The file it came from.
    #[serde(default)]
    pub source: PathBuf,
}

impl NetworkList {
    /// Parses a `.conflist` (`plugins`), or a single plugin's `.conf`/`.json`.
    pub fn parse(bytes: &[u8], source: &Path) -> Result<Self, String> {
        let v: Map<String, Value> =
            serde_json::from_slice(bytes).map_err(|e| format!("not a JSON object: {e}"))?;
        let name = v
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or("no \"name\"")?
            .to_owned();
        let cni_version = v
            .get("cniVersion")
            .and_then(Value::as_str)
            .unwrap_or("0.1.0")
            .to_owned();
        let is_list = source.extension().is_some_and(|e| e == "conflist");
        let plugins = if is_list {
            let list = v
                .get("plugins")
                .and_then(Value::as_array)
                .ok_or("a .conflist without \"plugins\"")?;
            let mut plugins = Vec::new();
            for p in list {
                let p = p.as_object().ok_or("a plugin that is not an object")?;
                plugins.push(p.clone());
            }
            plugins
        } else {
            vec![v]
        };
        if plugins.is_empty() {
            return Err("no plugins".into());
        }
        for p in &plugins {
            if p.get("type")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                return Err("a plugin without \"type\"".into());
            }
        }
        Ok(NetworkList {
            name,
            cni_version,
            plugins,
            source: source.to_owned(),
        })
    }

    /// The plugin types, in order.
    pub fn types(&self) -> Vec<&str> {
        self.plugins
            .iter()
            .filter_map(|p| p.get("type").and_then(Value::as_str))
            .collect()
    }
}

/// The network the runtime attaches pods to: the first file (by name) of `dir` with
/// the extension `.conf`, `.conflist` or `.json` that parses as a network, as libcni's
/// `ConfFiles` and containerd's default network pick it. Files that do not parse are
/// skipped with a warning. `Ok(None)`: the directory is missing or holds none.
pub fn default_network(dir: &Path) -> Result<Option<NetworkList>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(Error::ConfDir {
                dir: dir.to_owned(),
                source,
            });
        }
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .is_some_and(|e| e == "conf" || e == "conflist" || e == "json")
                && p.is_file()
        })
        .collect();
    files.sort();
    for file in files {
        let bytes = match std::fs::read(&file) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(file = %file.display(), "skipping a CNI configuration: {e}");
                continue;
            }
        };
        match NetworkList::parse(&bytes, &file) {
            Ok(list) => return Ok(Some(list)),
            Err(reason) => {
                tracing::warn!(file = %file.display(), "skipping a CNI configuration: {reason}")
            }
        }
    }
    Ok(None)
}

/// One attachment of a container (here: a sandbox) to a network.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Attachment {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_NETNS`.
    pub netns: PathBuf,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_ARGS`, in order.
    pub args: Vec<(String, String)>,
    /// Capability arguments (`portMappings`, ...), given to the plugins that declare
    /// the capability, as `runtimeConfig`.
    pub capability_args: BTreeMap<String, Value>,
}

/// Where the plugins are found and what they are told: `CNI_PATH`.
#[derive(Clone, Debug)]
pub struct Plugins {
    pub bin_dirs: Vec<PathBuf>,
}

impl Plugins {
    fn find(&self, plugin: &str) -> Result<PathBuf> {
        self.bin_dirs
            .iter()
            .map(|d| d.join(plugin))
            .find(|p| p.is_file())
            .ok_or_else(|| Error::MissingPlugin {
                plugin: plugin.to_owned(),
                dirs: self.path_var(),
            })
    }

    fn path_var(&self) -> String {
        self.bin_dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(":")
    }

    /// ADD: each plugin in order, each given the previous one's result; the last
    /// result.
    pub async fn add(&self, list: &NetworkList, at: &Attachment) -> Result<Value> {
        let mut prev: Option<Value> = None;
        for plugin in &list.plugins {
            let config = plugin_config(list, plugin, prev.as_ref(), at);
            let result = self.exec("ADD", plugin_type(plugin), &config, at).await?;
            prev = Some(result);
        }
        Ok(prev.unwrap_or(Value::Null))
    }

    /// CHECK: each plugin in order with the cached result (CNI 0.4.0 and later;
    /// earlier versions have no CHECK and pass).
    pub async fn check(&self, list: &NetworkList, at: &Attachment, result: &Value) -> Result<()> {
        if !version_at_least(&list.cni_version, (0, 4, 0)) {
            return Ok(());
        }
        for plugin in &list.plugins {
            let config = plugin_config(list, plugin, Some(result), at);
            self.exec("CHECK", plugin_type(plugin), &config, at).await?;
        }
        Ok(())
    }

    /// DEL: each plugin in reverse order with the cached result, if there is one (a
    /// DEL after a failed or interrupted ADD has none; plugins must cope).
    pub async fn del(
        &self,
        list: &NetworkList,
        at: &Attachment,
        result: Option<&Value>,
    ) -> Result<()> {
        let prev = result.filter(|_| version_at_least(&list.cni_version, (0, 4, 0)));
        for plugin in list.plugins.iter().rev() {
            let config = plugin_config(list, plugin, prev, at);
            self.exec("DEL", plugin_type(plugin), &config, at).await?;
        }
        Ok(())
    }

    async fn exec(
        &self,
        command: &'static str,
        plugin: &str,
        config: &Value,
        at: &Attachment,
    ) -> Result<Value> {
        let binary = self.find(plugin)?;
        let args = at
            .args
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(";");
        let exec_error = |source| Error::Exec {
            plugin: plugin.to_owned(),
            command,
            source,
        };
        let mut child = tokio::process::Command::new(&binary)
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", &at.container_id)
            .env("CNI_NETNS", &at.netns)
            .env("CNI_IFNAME", &at.ifname)
            .env("CNI_ARGS", args)
            .env("CNI_PATH", self.path_var())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(exec_error)?;
        let stdin = serde_json::to_vec(config).expect("a JSON value serializes");
        let mut pipe = child.stdin.take().expect("stdin is piped");
        let run = async move {
            pipe.write_all(&stdin).await?;
            drop(pipe);
            child.wait_with_output().await
        };
        let out = match tokio::time::timeout(PLUGIN_TIMEOUT, run).await {
            Ok(out) => out.map_err(exec_error)?,
            Err(_) => {
                return Err(Error::Timeout {
                    plugin: plugin.to_owned(),
                    command,
                });
            }
        };
        if !out.status.success() {
            return Err(Error::Plugin {
                plugin: plugin.to_owned(),
                command,
                message: failure_message(&out.stdout, &out.stderr, out.status),
            });
        }
        if command != "ADD" || out.stdout.iter().all(u8::is_ascii_whitespace) {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&out.stdout).map_err(|e| Error::BadResult {
            plugin: plugin.to_owned(),
            command,
            reason: e.to_string(),
        })
    }
}

fn plugin_type(plugin: &Map<String, Value>) -> &str {
    plugin
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// A plugin's stdin, as libcni's `buildOneConfig` makes it: its own configuration with
/// the list's `name` and `cniVersion`, the previous result as `prevResult`, and, for
/// each capability it declares true that the runtime has arguments for, those
/// arguments under `runtimeConfig`.
fn plugin_config(
    list: &NetworkList,
    plugin: &Map<String, Value>,
    prev: Option<&Value>,
    at: &Attachment,
) -> Value {
    let mut config = plugin.clone();
    config.insert("name".into(), Value::String(list.name.clone()));
    config.insert("cniVersion".into(), Value::String(list.cni_version.clone()));
    if let Some(prev) = prev.filter(|p| !p.is_null()) {
        config.insert("prevResult".into(), prev.clone());
    }
    let declared = plugin.get("capabilities").and_then(Value::as_object);
    let mut runtime = Map::new();
    for (capability, args) in &at.capability_args {
        if declared
            .and_then(|d| d.get(capability))
            .and_then(Value::as_bool)
            == Some(true)
        {
            runtime.insert(capability.clone(), args.clone());
        }
    }
    if !runtime.is_empty() {
        config.insert("runtimeConfig".into(), Value::Object(runtime));
    }
    Value::Object(config)
}

/// What a failed plugin said: the CNI error's `msg` and `details` when it wrote one,
/// else its stderr, else its exit status.
fn failure_message(stdout: &[u8], stderr: &[u8], status: std::process::ExitStatus) -> String {
    #[derive(Deserialize)]
    struct CniError {
        #[serde(default)]
        code: u32,
        #[serde(default)]
        msg: String,
        #[serde(default)]
        details: String,
    }
    if let Ok(e) = serde_json::from_slice::<CniError>(stdout)
        && !e.msg.is_empty()
    {
        let mut m = e.msg;
        if !e.details.is_empty() {
            m.push_str(": ");
            m.push_str(&e.details);
        }
        if e.code != 0 {
            m.push_str(&format!(" (code {})", e.code));
        }
        return m;
    }
    let err = String::from_utf8_lossy(stderr).trim().to_owned();
    if !err.is_empty() {
        return err;
    }
    format!("exited with {status}")
}

/// Whether a `cniVersion` is at least `min` (an unparsable one is taken as current).
fn version_at_least(version: &str, min: (u32, u32, u32)) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>());
    match (parts.next(), parts.next(), parts.next()) {
        (Some(Ok(a)), Some(Ok(b)), Some(Ok(c))) => (a, b, c) >= min,
        _ => true,
    }
}

/// The addresses a result gives the attachment's interface, primary first: the
/// `ips` of a 0.3.0+ result (those on `ifname` in the sandbox, or with no interface),
/// IPv4 before IPv6 as containerd orders them; or `ip4`/`ip6` of a 0.1/0.2 result.
pub fn result_ips(result: &Value, ifname: &str) -> Vec<String> {
    let addr = |a: &str| a.split('/').next().unwrap_or_default().to_owned();
    let mut ips: Vec<String> = Vec::new();
    if let Some(list) = result.get("ips").and_then(Value::as_array) {
        let interfaces = result.get("interfaces").and_then(Value::as_array);
        for ip in list {
            let on_ours = match ip.get("interface").and_then(Value::as_u64) {
                None => true,
                Some(i) => interfaces
                    .and_then(|ifs| ifs.get(i as usize))
                    .is_some_and(|iface| {
                        iface.get("name").and_then(Value::as_str) == Some(ifname)
                            && iface
                                .get("sandbox")
                                .and_then(Value::as_str)
                                .is_some_and(|s| !s.is_empty())
                    }),
            };
            if on_ours && let Some(a) = ip.get("address").and_then(Value::as_str) {
                ips.push(addr(a));
            }
        }
    } else {
        for key in ["ip4", "ip6"] {
            if let Some(a) = result
                .get(key)
                .and_then(|v| v.get("ip"))
                .and_then(Value::as_str)
            {
                ips.push(addr(a));
            }
        }
    }
    ips.sort_by_key(|ip| ip.contains(':'));
    ips
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at() -> Attachment {
        Attachment {
            container_id: "c1".into(),
            netns: "/var/run/netns/x".into(),
            ifname: "eth0".into(),
            args: vec![("IgnoreUnknown".into(), "1".into())],
            capability_args: BTreeMap::from([(
                "portMappings".into(),
                json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]),
            )]),
        }
    }

    #[test]
    fn the_first_valid_file_by_name_is_the_network() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("00-broken.conflist"), "{").unwrap();
        std::fs::write(dir.path().join("05-notes.txt"), "{}").unwrap();
        std::fs::write(
            dir.path().join("10-b.conf"),
            r#"{"cniVersion":"0.4.0","name":"b","type":"bridge"}"#,
        )
        .unwrap();
        std::fs::write(
            dir.path().join("20-a.conflist"),
            r#"{"cniVersion":"1.0.0","name":"a","plugins":[{"type":"bridge"}]}"#,
        )
        .unwrap();
        let net = default_network(dir.path()).unwrap().unwrap();
        assert_eq!((net.name.as_str(), net.types()), ("b", vec!["bridge"]));
        assert_eq!(default_network(&dir.path().join("missing")).unwrap(), None);
    }

    #[test]
    fn a_plugin_gets_the_lists_name_version_previous_result_and_its_capabilities() {
        let list = NetworkList::parse(
            br#"{"cniVersion":"1.0.0","name":"pods","plugins":[
                {"type":"bridge","bridge":"cni0"},
                {"type":"portmap","capabilities":{"portMappings":true,"bandwidth":true}}]}"#,
            Path::new("x.conflist"),
        )
        .unwrap();
        let first = plugin_config(&list, &list.plugins[0], None, &at());
        assert_eq!(
            first,
            json!({"type":"bridge","bridge":"cni0","name":"pods","cniVersion":"1.0.0"})
        );
        let prev = json!({"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/24"}]});
        let second = plugin_config(&list, &list.plugins[1], Some(&prev), &at());
        assert_eq!(second["prevResult"], prev);
        assert_eq!(
            second["runtimeConfig"],
            json!({"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]})
        );
    }

    #[test]
    fn result_addresses_are_those_of_the_sandbox_interface_ipv4_first() {
        let result = json!({
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "cni0", "mac": "aa"},
                {"name": "veth1", "mac": "bb"},
                {"name": "eth0", "mac": "cc", "sandbox": "/var/run/netns/x"}
            ],
            "ips": [
                {"address": "fd00::5/64", "interface": 2},
                {"address": "10.22.0.5/24", "gateway": "10.22.0.1", "interface": 2},
                {"address": "10.22.0.1/24", "interface": 0}
            ]
        });
        assert_eq!(result_ips(&result, "eth0"), ["10.22.0.5", "fd00::5"]);
        let old = json!({"cniVersion": "0.2.0", "ip4": {"ip": "10.1.0.7/16"}});
        assert_eq!(result_ips(&old, "eth0"), ["10.1.0.7"]);
    }

    #[test]
    fn a_plugins_error_is_its_message_and_details() {
        use std::os::unix::process::ExitStatusExt;
        let status = std::process::ExitStatus::from_raw(1 << 8);
        let m = failure_message(
            br#"{"cniVersion":"1.0.0","code":11,"msg":"failed to allocate","details":"range is full"}"#,
            b"",
            status,
        );
        assert_eq!(m, "failed to allocate: range is full (code 11)");
        assert_eq!(failure_message(b"", b"boom\n", status), "boom");
        assert_eq!(
            failure_message(b"", b"", status),
            "exited with exit status: 1"
        );
    }

    #[test]
    fn check_and_prev_result_on_del_need_cni_0_4() {
        assert!(version_at_least("0.4.0", (0, 4, 0)));
        assert!(version_at_least("1.0.0", (0, 4, 0)));
        assert!(!version_at_least("0.3.1", (0, 4, 0)));
    }
}
