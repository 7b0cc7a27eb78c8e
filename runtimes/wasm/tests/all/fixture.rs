//! What every test starts from: a [`WasmRuntime`] in a temporary directory, the
//! example images, a pod sandbox whose logs land in that directory, and waits that
//! end on an event or a deadline, never on a fixed sleep.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use tempfile::TempDir;
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;
use wasmlet_runtime::{
    ContainerConfig, ContainerMetadata, ContainerState, ContainerStatus, PodMetadata,
    PodSandboxConfig, Runtime,
};
use wasmlet_runtime_wasm::cgroup;
use wasmlet_runtime_wasm::crilog::{self, Record, Stream};
use wasmlet_runtime_wasm::image::ImageEntry;
use wasmlet_runtime_wasm::network::NetworkSettings;
use wasmlet_runtime_wasm::registry::RegistrySettings;
use wasmlet_runtime_wasm::{HANDLER, SandboxCommand, WasmRuntime, WasmRuntimeConfig};

/// The longest any single wait may take. A passing run never comes close; it only
/// bounds how long a broken runtime keeps a test hanging.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// How often a poll of something that sends no event (a log file, `/proc`) looks again.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// `target/images`, with the example archives built.
pub fn examples_dir() -> PathBuf {
    wasmlet_testkit::images::ensure_example_images().expect("example images build")
}

/// `localhost/wasmlet-examples/<name>:latest`.
pub fn example_ref(name: &str) -> String {
    wasmlet_testkit::images::example_reference(name)
}

/// The bytes of `target/images/<name>.wasm`, the binary in `<name>.tar`.
pub fn example_wasm(name: &str) -> Vec<u8> {
    let path = examples_dir().join(format!("{name}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A runtime of its own, with its image store and compile cache in a tempdir.
pub struct Fixture {
    pub runtime: WasmRuntime,
    dir: TempDir,
    cgroup_mount_root: PathBuf,
    network: Option<NetworkSettings>,
}

impl Fixture {
    /// A runtime with an empty image store.
    pub fn new() -> Result<Self> {
        Self::with_cgroup_mount_root(Path::new(cgroup::DEFAULT_MOUNT_ROOT))
    }

    /// A runtime with an empty image store that finds pod cgroups below `mount_root`.
    pub fn with_cgroup_mount_root(mount_root: &Path) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let runtime = WasmRuntime::new(Self::config(dir.path(), mount_root))?;
        Ok(Fixture {
            runtime,
            dir,
            cgroup_mount_root: mount_root.to_owned(),
            network: None,
        })
    }

    /// A runtime with an empty image store whose sandboxes get `args` first.
    pub fn with_sandbox_args(args: &[&str]) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let mount_root = Path::new(cgroup::DEFAULT_MOUNT_ROOT);
        let mut config = Self::config(dir.path(), mount_root);
        config.sandbox.args = args.iter().map(|a| (*a).to_owned()).collect();
        Ok(Fixture {
            runtime: WasmRuntime::new(config)?,
            dir,
            cgroup_mount_root: mount_root.to_owned(),
            network: None,
        })
    }

    /// A runtime whose sandboxes are forked from a zygote, with the named example
    /// images imported.
    pub fn forked_with_images(names: &[&str]) -> Result<Self> {
        let fixture = Self::forked_with_sandbox_args(&[])?;
        for name in names {
            fixture.import(name)?;
        }
        Ok(fixture)
    }

    /// A runtime whose sandboxes are forked from a zygote, which gets `args` first.
    pub fn forked_with_sandbox_args(args: &[&str]) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let mount_root = Path::new(cgroup::DEFAULT_MOUNT_ROOT);
        let mut config = Self::config(dir.path(), mount_root);
        config.sandbox.zygote = true;
        config.sandbox.args = args.iter().map(|a| (*a).to_owned()).collect();
        Ok(Fixture {
            runtime: WasmRuntime::new(config)?,
            dir,
            cgroup_mount_root: mount_root.to_owned(),
            network: None,
        })
    }

    /// A runtime that attaches pods to the CNI network `settings` describe.
    pub fn with_network(settings: NetworkSettings) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let mount_root = Path::new(cgroup::DEFAULT_MOUNT_ROOT);
        let runtime = WasmRuntime::new(WasmRuntimeConfig {
            network: Some(settings.clone()),
            ..Self::config(dir.path(), mount_root)
        })?;
        Ok(Fixture {
            runtime,
            dir,
            cgroup_mount_root: mount_root.to_owned(),
            network: Some(settings),
        })
    }

    /// A runtime with an empty image store that pulls with `registry`.
    pub fn with_registry(registry: RegistrySettings) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let mount_root = Path::new(cgroup::DEFAULT_MOUNT_ROOT);
        let runtime = WasmRuntime::new(WasmRuntimeConfig {
            registry,
            ..Self::config(dir.path(), mount_root)
        })?;
        Ok(Fixture {
            runtime,
            dir,
            cgroup_mount_root: mount_root.to_owned(),
            network: None,
        })
    }

    fn config(dir: &Path, cgroup_mount_root: &Path) -> WasmRuntimeConfig {
        WasmRuntimeConfig {
            image_dir: dir.join("images"),
            compile_cache_dir: dir.join("compile-cache"),
            state_dir: dir.join("sandboxes"),
            sandbox: SandboxCommand {
                program: env!("CARGO_BIN_EXE_wasmlet-sandbox").into(),
                args: vec![],
                zygote: false,
            },
            cgroup_mount_root: cgroup_mount_root.to_owned(),
            registry: Default::default(),
            network: None,
        }
    }

    /// A second runtime on the same directories, as the node's next run after a crash
    /// would make; call [`WasmRuntime::restore`] on it to adopt the sandboxes.
    pub fn reopen(&self) -> Result<WasmRuntime> {
        Ok(WasmRuntime::new(WasmRuntimeConfig {
            network: self.network.clone(),
            ..Self::config(self.path(), &self.cgroup_mount_root)
        })?)
    }

    /// A runtime with the named example images imported.
    pub fn with_images(names: &[&str]) -> Result<Self> {
        let fixture = Self::new()?;
        for name in names {
            fixture.import(name)?;
        }
        Ok(fixture)
    }

    /// The fixture's temporary directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Imports `target/images/<name>.tar`.
    pub fn import(&self, name: &str) -> Result<Vec<ImageEntry>> {
        let archive = examples_dir().join(format!("{name}.tar"));
        self.runtime
            .images()
            .import_archive(&archive)
            .with_context(|| format!("importing {}", archive.display()))
    }

    /// Starts a pod sandbox named `name`, logging under `<tempdir>/logs/<name>`.
    pub async fn pod(&self, name: &str) -> Result<Pod> {
        self.start_pod(self.pod_config(name)).await
    }

    /// Starts a pod sandbox with `config`.
    pub async fn start_pod(&self, config: PodSandboxConfig) -> Result<Pod> {
        let id = self.runtime.run_pod_sandbox(&config).await?;
        Ok(Pod { id, config })
    }

    /// The config [`Fixture::pod`] starts a pod `name` with, for a test to add to.
    pub fn pod_config(&self, name: &str) -> PodSandboxConfig {
        PodSandboxConfig {
            metadata: PodMetadata {
                name: name.into(),
                namespace: "default".into(),
                uid: format!("uid-{name}"),
                attempt: 0,
            },
            hostname: name.into(),
            log_directory: self.path().join("logs").join(name),
            runtime_handler: HANDLER.into(),
            ..Default::default()
        }
    }

    /// Creates and starts a container; returns its id.
    pub async fn run(&self, pod: &Pod, config: &ContainerConfig) -> Result<String> {
        let id = self
            .runtime
            .create_container(&pod.id, config, &pod.config)
            .await
            .with_context(|| format!("creating container {}", config.metadata.name))?;
        self.runtime
            .start_container(&id)
            .await
            .with_context(|| format!("starting container {}", config.metadata.name))?;
        Ok(id)
    }

    /// Waits until the container is in `want`. Every state change of a container comes
    /// with an event, so this wakes on events and gives up at [`DEADLINE`].
    pub async fn wait_for_state(&self, id: &str, want: ContainerState) -> Result<ContainerStatus> {
        let mut events = self.runtime.subscribe();
        let deadline = Instant::now() + DEADLINE;
        loop {
            // Subscribed before reading, so a change between the two is not missed.
            let status = self.runtime.container_status(id).await?;
            if status.state == want {
                return Ok(status);
            }
            match tokio::time::timeout_at(deadline, events.recv()).await {
                Ok(Ok(_) | Err(RecvError::Lagged(_))) => {}
                Ok(Err(RecvError::Closed)) => bail!("the runtime's event stream closed"),
                Err(_) => bail!(
                    "container {} is still {:?} after {DEADLINE:?}, waiting for {want:?}: {status:#?}",
                    status.metadata.name,
                    status.state
                ),
            }
        }
    }

    /// Waits until the container has exited and returns its final status.
    pub async fn wait_exited(&self, id: &str) -> Result<ContainerStatus> {
        self.wait_for_state(id, ContainerState::Exited).await
    }
}

/// A running pod sandbox and the config it was made with.
pub struct Pod {
    pub id: String,
    pub config: PodSandboxConfig,
}

impl Pod {
    /// A container `name` of the example image `image`, logging to `<name>/0.log`.
    pub fn container(&self, name: &str, image: &str) -> ContainerConfig {
        ContainerConfig {
            metadata: ContainerMetadata {
                name: name.into(),
                attempt: 0,
            },
            image: example_ref(image),
            log_path: PathBuf::from(name).join("0.log"),
            ..Default::default()
        }
    }
}

/// Builds a container config with `env` set, in order.
pub fn with_env(mut config: ContainerConfig, env: &[(&str, &str)]) -> ContainerConfig {
    config.env = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    config
}

/// Every record of a CRI log file; fails on a line that does not parse.
pub fn log_records(path: &Path) -> Result<Vec<Record>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| path.display().to_string()),
    };
    text.lines()
        .map(|line| {
            crilog::parse_line(line)
                .with_context(|| format!("{}: not a CRI log record: {line:?}", path.display()))
        })
        .collect()
}

/// The text of the full records of one stream.
pub fn lines(records: &[Record], stream: Stream) -> Vec<String> {
    records
        .iter()
        .filter(|r| r.stream == stream)
        .inspect(|r| assert!(!r.partial, "unexpected partial record {r:?}"))
        .map(|r| r.text.clone())
        .collect()
}

/// Polls a log file until its stdout has a line equal to `line`.
pub async fn wait_for_stdout_line(path: &Path, line: &str) -> Result<Vec<Record>> {
    poll_until(&format!("{line:?} in {}", path.display()), async || {
        let records = log_records(path)?;
        let found = lines(&records, Stream::Stdout).iter().any(|l| l == line);
        Ok(found.then_some(records))
    })
    .await
}

/// Calls `check` until it returns `Some`, at most until [`DEADLINE`].
pub async fn poll_until<T>(
    what: &str,
    mut check: impl AsyncFnMut() -> Result<Option<T>>,
) -> Result<T> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(value) = check().await? {
            return Ok(value);
        }
        ensure!(
            Instant::now() < deadline,
            "gave up waiting for {what} after {DEADLINE:?}"
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Whether a process with this id exists (a zombie counts: it has not been reaped).
pub fn process_exists(pid: u32) -> bool {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid fits i32"));
    nix::sys::signal::kill(pid, None).is_ok()
}

/// Awaits `fut`, failing after [`DEADLINE`] instead of hanging the test binary.
pub async fn within<T>(what: &str, fut: impl Future<Output = T>) -> Result<T> {
    tokio::time::timeout(DEADLINE, fut)
        .await
        .with_context(|| format!("{what} did not finish within {DEADLINE:?}"))
}
