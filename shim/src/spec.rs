//! The part of an OCI bundle's `config.json` a Wasm task needs, and how it maps onto
//! wasmlet's container spec: the module from the rootfs, args, env, mounts as
//! preopens, the memory limit, the cgroup and network namespace of the pod.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Deserialize;
use wasmlet_runtime_wasm::WasmKind;
use wasmlet_runtime_wasm::protocol::Preopen;

/// CRI's annotation naming a container's pod sandbox (the pause container's own id
/// for the sandbox itself): the shim's grouping key.
pub const SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";
/// CRI's annotation: `sandbox` for the pause container, `container` for the others.
pub const CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
/// CRI's annotation with the container's name in its pod.
pub const CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";
/// runc's grouping annotation, honoured first as the runc shim does.
pub const RUNC_GROUP: &str = "io.containerd.runc.v2.group";

#[derive(Debug, Default, Deserialize)]
pub struct Spec {
    #[serde(default)]
    pub process: Option<Process>,
    #[serde(default)]
    pub root: Option<Root>,
    #[serde(default)]
    pub mounts: Vec<Mount>,
    #[serde(default)]
    pub annotations: HashMap<String, String>,
    #[serde(default)]
    pub linux: Option<Linux>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Process {
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub cwd: String,
    #[serde(default)]
    pub oom_score_adj: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Root {
    pub path: String,
    #[serde(default)]
    pub readonly: bool,
}

#[derive(Debug, Default, Deserialize)]
pub struct Mount {
    pub destination: String,
    #[serde(default, rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub source: String,
    #[serde(default)]
    pub options: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Linux {
    #[serde(default)]
    pub cgroups_path: Option<String>,
    #[serde(default)]
    pub resources: Option<Resources>,
    #[serde(default)]
    pub namespaces: Vec<Namespace>,
}

/// `linux.resources`, and the body of an `Update` (runtime-spec `LinuxResources`).
#[derive(Debug, Default, Clone, Deserialize)]
pub struct Resources {
    #[serde(default)]
    pub memory: Option<Memory>,
    #[serde(default)]
    pub cpu: Option<Cpu>,
}

#[derive(Debug, Default, Clone, Deserialize)]
pub struct Memory {
    #[serde(default)]
    pub limit: Option<i64>,
}

#[derive(Debug, Default, Clone, Deserialize)]
pub struct Cpu {
    #[serde(default)]
    pub shares: Option<u64>,
    #[serde(default)]
    pub quota: Option<i64>,
    #[serde(default)]
    pub period: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Namespace {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub path: Option<String>,
}

/// Where the sandbox process's network is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Network {
    /// The node's (no network namespace in the spec: `hostNetwork`).
    Host,
    /// A namespace that exists (the pod's, set up by CNI).
    Join(PathBuf),
    /// A new, empty one (`ctr run` without `--net-host`).
    New,
}

impl Spec {
    /// Reads `<bundle>/config.json`.
    pub fn load(bundle: &Path) -> anyhow::Result<Spec> {
        let path = bundle.join("config.json");
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_slice(&bytes).with_context(|| format!("parsing {}", path.display()))
    }

    /// The shim group this task belongs to: its pod, when CRI made it.
    pub fn group(&self) -> Option<&str> {
        [RUNC_GROUP, SANDBOX_ID]
            .iter()
            .find_map(|k| self.annotations.get(*k))
            .map(String::as_str)
            .filter(|g| !g.is_empty())
    }

    /// The pause container of a CRI pod: run by no engine.
    pub fn is_pod_sandbox(&self) -> bool {
        self.annotations.get(CONTAINER_TYPE).map(String::as_str) == Some("sandbox")
    }

    pub fn process(&self) -> Process {
        self.process.clone().unwrap_or_default()
    }

    pub fn cgroups_path(&self) -> Option<&str> {
        self.linux
            .as_ref()
            .and_then(|l| l.cgroups_path.as_deref())
            .filter(|p| !p.is_empty())
    }

    pub fn resources(&self) -> Resources {
        self.linux
            .as_ref()
            .and_then(|l| l.resources.clone())
            .unwrap_or_default()
    }

    pub fn memory_limit(&self) -> Option<u64> {
        self.resources().memory_limit()
    }

    pub fn network(&self) -> Network {
        let Some(ns) = self
            .linux
            .as_ref()
            .and_then(|l| l.namespaces.iter().find(|n| n.kind == "network"))
        else {
            return Network::Host;
        };
        match ns.path.as_deref().filter(|p| !p.is_empty()) {
            Some(path) => Network::Join(path.into()),
            None => Network::New,
        }
    }

    /// The rootfs directory: `root.path`, relative to the bundle unless absolute.
    pub fn rootfs(&self, bundle: &Path) -> PathBuf {
        match &self.root {
            Some(root) if !root.path.is_empty() => bundle.join(&root.path),
            _ => bundle.join("rootfs"),
        }
    }

    /// The env as pairs; entries without `=` are dropped, as runc drops them.
    pub fn env(&self) -> Vec<(String, String)> {
        self.process()
            .env
            .iter()
            .filter_map(|e| e.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    /// The directories the guest may open: the rootfs at `/` (read-only when the
    /// spec says so) and every bind mount of a directory at its destination. Kernel
    /// filesystems and file binds (`/etc/hosts`, a termination log) have no WASI form.
    pub fn preopens(&self, rootfs: &Path) -> Vec<Preopen> {
        let mut preopens = vec![Preopen {
            host_path: rootfs.to_owned(),
            guest_path: "/".into(),
            readonly: self.root.as_ref().is_some_and(|r| r.readonly),
        }];
        for m in &self.mounts {
            let bind = m.kind == "bind" || m.options.iter().any(|o| o == "bind" || o == "rbind");
            if !bind || !Path::new(&m.source).is_dir() {
                continue;
            }
            preopens.push(Preopen {
                host_path: m.source.clone().into(),
                guest_path: m.destination.clone(),
                readonly: m.options.iter().any(|o| o == "ro"),
            });
        }
        preopens
    }
}

impl Resources {
    pub fn memory_limit(&self) -> Option<u64> {
        self.memory
            .as_ref()
            .and_then(|m| m.limit)
            .filter(|l| *l > 0)
            .map(|l| l as u64)
    }
}

/// The Wasm binary a task runs: `args[0]` found in the rootfs (a path, absolute or
/// from the working directory, or a name looked up in `PATH` and then at the root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Module {
    pub path: PathBuf,
    pub kind: WasmKind,
}

/// Finds `args[0]` in `rootfs`. Symbolic links are followed inside the rootfs: an
/// absolute target is the image's, never the host's.
pub fn find_module(
    rootfs: &Path,
    process: &Process,
    env: &[(String, String)],
) -> anyhow::Result<Module> {
    let Some(program) = process.args.first().filter(|a| !a.is_empty()) else {
        bail!("the spec has no process.args: nothing to run");
    };
    let candidates: Vec<String> = if program.contains('/') {
        if program.starts_with('/') {
            vec![program.clone()]
        } else {
            let cwd = if process.cwd.is_empty() {
                "/"
            } else {
                &process.cwd
            };
            vec![format!("{}/{program}", cwd.trim_end_matches('/'))]
        }
    } else {
        let path = env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.as_str())
            .unwrap_or("/usr/local/bin:/usr/bin:/bin");
        path.split(':')
            .filter(|d| d.starts_with('/'))
            .chain(["/"])
            .map(|d| format!("{}/{program}", d.trim_end_matches('/')))
            .fold(Vec::new(), |mut seen, c| {
                if !seen.contains(&c) {
                    seen.push(c);
                }
                seen
            })
    };
    for candidate in &candidates {
        let Some(host) = resolve_in(rootfs, candidate) else {
            continue;
        };
        let mut head = [0u8; 8];
        let read = std::fs::File::open(&host)
            .and_then(|mut f| std::io::Read::read(&mut f, &mut head))
            .with_context(|| format!("reading {program:?} ({})", host.display()))?;
        return match WasmKind::detect(&head[..read]) {
            Some(kind) => Ok(Module { path: host, kind }),
            None => bail!(
                "{program:?} ({candidate} in the image) is not a Wasm module or component: \
                 this runtime runs Wasm only (use runc for other programs)"
            ),
        };
    }
    bail!(
        "{program:?} is not in the image (looked at {})",
        candidates.join(", ")
    )
}

/// `path` (absolute, as the image sees it) as a host path under `rootfs`, following
/// symbolic links within the rootfs; `None` if it does not name a regular file.
fn resolve_in(rootfs: &Path, path: &str) -> Option<PathBuf> {
    let mut parts: Vec<String> = path
        .split('/')
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect();
    let mut done = PathBuf::new();
    let mut hops = 0;
    parts.reverse();
    while let Some(part) = parts.pop() {
        match part.as_str() {
            "." => continue,
            ".." => {
                done.pop();
                continue;
            }
            _ => {}
        }
        let host = rootfs.join(&done).join(&part);
        let meta = std::fs::symlink_metadata(&host).ok()?;
        if meta.file_type().is_symlink() {
            hops += 1;
            if hops > 40 {
                return None;
            }
            let target = std::fs::read_link(&host).ok()?;
            let target = target.to_str()?;
            if target.starts_with('/') {
                done = PathBuf::new();
            }
            parts.extend(
                target
                    .split('/')
                    .filter(|p| !p.is_empty())
                    .rev()
                    .map(str::to_owned),
            );
        } else {
            done.push(&part);
        }
    }
    let host = rootfs.join(&done);
    host.is_file().then_some(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CRI_APP: &str = r#"{
      "ociVersion": "1.0.2-dev",
      "process": {"terminal": false, "args": ["/hello.wasm", "a b"], "env": ["PATH=/usr/bin", "A=1=2", "junk"],
                  "cwd": "/", "oomScoreAdj": 1000},
      "root": {"path": "rootfs", "readonly": true},
      "mounts": [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/data", "type": "bind", "source": "SRC", "options": ["rbind", "rprivate", "ro"]},
        {"destination": "/etc/hosts", "type": "bind", "source": "/etc/hosts", "options": ["rbind"]}
      ],
      "annotations": {"io.kubernetes.cri.container-type": "container",
                      "io.kubernetes.cri.sandbox-id": "pod123",
                      "io.kubernetes.cri.container-name": "hello"},
      "linux": {"cgroupsPath": "/kubepods/burstable/podu/abc",
                "resources": {"memory": {"limit": 67108864}, "cpu": {"shares": 102, "quota": 50000, "period": 100000}},
                "namespaces": [{"type": "pid"}, {"type": "network", "path": "/proc/42/ns/net"}]}
    }"#;

    #[test]
    fn a_cri_container_spec_maps_onto_a_wasm_container() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        let spec: Spec =
            serde_json::from_str(&CRI_APP.replace("SRC", data.to_str().unwrap())).unwrap();
        assert_eq!(spec.group(), Some("pod123"));
        assert!(!spec.is_pod_sandbox());
        assert_eq!(spec.cgroups_path(), Some("/kubepods/burstable/podu/abc"));
        assert_eq!(spec.memory_limit(), Some(64 << 20));
        assert_eq!(spec.network(), Network::Join("/proc/42/ns/net".into()));
        assert_eq!(spec.process().oom_score_adj, Some(1000));
        assert_eq!(
            spec.env(),
            [
                ("PATH".into(), "/usr/bin".into()),
                ("A".into(), "1=2".into())
            ]
        );
        let rootfs = spec.rootfs(Path::new("/b"));
        assert_eq!(rootfs, Path::new("/b/rootfs"));
        let preopens = spec.preopens(&rootfs);
        assert_eq!(
            preopens,
            [
                Preopen {
                    host_path: "/b/rootfs".into(),
                    guest_path: "/".into(),
                    readonly: true
                },
                Preopen {
                    host_path: data,
                    guest_path: "/data".into(),
                    readonly: true
                },
            ],
            "proc and the /etc/hosts file bind have no preopen"
        );
    }

    #[test]
    fn namespaces_and_groups_without_cri() {
        let spec: Spec = serde_json::from_str(
            r#"{"linux": {"namespaces": [{"type": "network"}]}, "annotations": {}}"#,
        )
        .unwrap();
        assert_eq!(spec.network(), Network::New);
        assert_eq!(spec.group(), None);
        let spec: Spec = serde_json::from_str(r#"{"linux": {"namespaces": []}}"#).unwrap();
        assert_eq!(spec.network(), Network::Host);
        let spec: Spec = serde_json::from_str(
            r#"{"annotations": {"io.kubernetes.cri.container-type": "sandbox",
                                 "io.kubernetes.cri.sandbox-id": "p",
                                 "io.containerd.runc.v2.group": "g"}}"#,
        )
        .unwrap();
        assert!(spec.is_pod_sandbox());
        assert_eq!(spec.group(), Some("g"), "runc's group annotation first");
    }

    #[test]
    fn the_module_is_found_in_the_rootfs_only() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join("bin")).unwrap();
        std::fs::write(r.join("app.wasm"), b"\0asm\x01\0\0\0rest").unwrap();
        std::fs::write(r.join("bin/comp.wasm"), b"\0asm\x0d\0\x01\0rest").unwrap();
        std::fs::write(r.join("sh"), b"\x7fELF....").unwrap();
        std::os::unix::fs::symlink("/app.wasm", r.join("bin/app")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", r.join("escape")).unwrap();
        let process = |args: &[&str], cwd: &str| Process {
            args: args.iter().map(|s| s.to_string()).collect(),
            cwd: cwd.into(),
            ..Default::default()
        };
        let path = vec![("PATH".to_owned(), "/bin".to_owned())];

        let m = find_module(r, &process(&["/app.wasm"], "/"), &[]).unwrap();
        assert_eq!((m.path, m.kind), (r.join("app.wasm"), WasmKind::Module));
        let m = find_module(r, &process(&["comp.wasm"], "/"), &path).unwrap();
        assert_eq!(
            (m.path, m.kind),
            (r.join("bin/comp.wasm"), WasmKind::Component)
        );
        let m = find_module(r, &process(&["app"], "/"), &path).unwrap();
        assert_eq!(
            m.path,
            r.join("app.wasm"),
            "a link to an absolute path stays in the image"
        );
        let m = find_module(r, &process(&["./comp.wasm"], "/bin"), &[]).unwrap();
        assert_eq!(m.path, r.join("bin/comp.wasm"));
        let m = find_module(r, &process(&["app.wasm"], "/"), &path).unwrap();
        assert_eq!(m.path, r.join("app.wasm"), "then the image's root");

        let e = find_module(r, &process(&["/sh"], "/"), &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a Wasm module or component"), "{e}");
        let e = find_module(r, &process(&["/escape"], "/"), &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("not in the image"), "{e}");
        let e = find_module(r, &process(&[], "/"), &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("no process.args"), "{e}");
    }
}
