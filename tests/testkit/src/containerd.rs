//! A private, real containerd 1.6 per test run, with the CRI plugin, runc and
//! a bridge CNI network, and the busybox test images to run in it.
//!
//! [`Containerd::start`] gives each run a prefix `wl-<pid>-<n>` and a
//! directory `/tmp/wl-<pid>-<n>.XXXXXX` holding everything containerd writes:
//! `root/`, `state/`, the socket `c.sock`, `config.toml` (see
//! [`render_config`]), `containerd.log`, the CNI conflist in `cni/net.d/` and
//! host-local's allocations in `cni/ipam/`. The CRI network is a bridge named
//! after the prefix with a /24 of `10.128.0.0/9` picked from the pid (see
//! [`choose_subnet`]); network namespaces are mounted under the state
//! directory (`netns_mounts_under_state_dir`), not in `/var/run/netns`.
//!
//! [`Containerd::import_test_images`] imports [`images::BUSYBOX_IMAGE`] and
//! [`images::PAUSE_IMAGE`] (the CRI plugin's `sandbox_image`) into the
//! `k8s.io` namespace; [`Containerd::runtime_client`] and
//! [`Containerd::image_client`] speak CRI to it.
//!
//! Dropping the handle (or [`Containerd::stop`]) removes everything the run
//! made: tasks and containers in `k8s.io` (through `ctr`, so this works when
//! a test failed half-way through a pod), containerd itself (SIGTERM, then
//! SIGKILL), leftover shims and container processes, mounts under the run's
//! directory (lazily, deepest first), network namespaces, the bridge and its
//! veths, CNI result caches, shim sockets and the directory.
//! [`Footprint::leftovers`] lists whatever of that is still there; a run that
//! died without dropping its handle is swept by the next [`Containerd::start`].
//!
//! Some directories are shared by every containerd on the machine: the shim
//! socket directory `/run/containerd/s` (the runc shim of 1.6 hard-codes
//! it), libcni's result cache `/var/lib/cni/results` and the `k8s.io` parent
//! cgroup runc creates in each hierarchy when a sandbox has no
//! `cgroup_parent`. A teardown removes its own entries in them, and the
//! (empty) directories themselves when no containerd runs any more.
//!
//! ```no_run
//! # async fn f() -> anyhow::Result<()> {
//! use wasmlet_testkit::containerd::{Containerd, images};
//! let containerd = Containerd::start()?;
//! containerd.import_test_images()?;
//! let mut cri = containerd.runtime_client().await?;
//! # Ok(()) }
//! ```

mod cleanup;
pub use cleanup::mount_points;
pub use cleanup::remove_cgroup_tree;
pub(crate) use cleanup::unmount_all_under;
pub mod images;

use std::fmt;
use std::fs::File;
use std::io::Read;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tonic::transport::{Channel, Endpoint, Uri};
use wasmlet_proto::cri::v1::image_service_client::ImageServiceClient;
use wasmlet_proto::cri::v1::runtime_service_client::RuntimeServiceClient;

pub use cleanup::Footprint;

/// Deletes a bridge and the links attached to it (a test network's leftovers).
pub fn delete_bridge(name: &str) {
    cleanup::delete_bridge(name);
}

/// The containerd namespace the CRI plugin uses.
pub const CRI_NAMESPACE: &str = "k8s.io";
/// Where Debian's `containernetworking-plugins` installs the CNI plugins.
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";
/// Where runs put their directories.
pub const RUN_PARENT: &str = "/tmp";
/// The snapshotter the CRI plugin and image import use.
pub const SNAPSHOTTER: &str = "overlayfs";
/// How long [`Containerd::start`] waits for the socket to answer.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one `ctr` invocation may take.
pub const CTR_TIMEOUT: Duration = Duration::from_secs(60);

/// Plugins this build of containerd loads that a CRI test never uses.
/// `io.containerd.internal.v1.opt` would otherwise create `/opt/containerd`.
/// (`io.containerd.runtime.v1.linux` must stay: without it the tasks service,
/// and with it the CRI plugin, fail to load.)
pub const DISABLED_PLUGINS: &[&str] = &[
    "io.containerd.internal.v1.opt",
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.zfs",
];

static RUNS: AtomicU32 = AtomicU32::new(0);

/// A /24 IPv4 network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subnet(pub [u8; 3]);

impl Subnet {
    /// The network address as a `u32` (host order).
    pub fn network(self) -> u32 {
        u32::from_be_bytes([self.0[0], self.0[1], self.0[2], 0])
    }

    /// The bridge's (gateway's) address, `.1`.
    pub fn gateway(self) -> String {
        let [a, b, c] = self.0;
        format!("{a}.{b}.{c}.1")
    }

    /// Whether `ip` (dotted quad) lies in this subnet.
    pub fn contains(self, ip: &str) -> bool {
        ip.parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| u32::from(ip) & 0xffff_ff00 == self.network())
    }
}

impl fmt::Display for Subnet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c] = self.0;
        write!(f, "{a}.{b}.{c}.0/24")
    }
}

/// The `seed`-th /24 of `10.128.0.0/9` (wrapping), or the first after it
/// that overlaps none of `routes` (`(destination, mask)`, host order; the
/// default route is ignored). `None` if 256 candidates in a row overlap.
pub fn choose_subnet(seed: u32, routes: &[(u32, u32)]) -> Option<Subnet> {
    (0..256).find_map(|k| {
        let i = (seed.wrapping_add(k)) % (1 << 15);
        let subnet = Subnet([10, 128 + (i >> 8) as u8, (i & 0xff) as u8]);
        let net = subnet.network();
        let overlaps = routes
            .iter()
            .filter(|(_, mask)| *mask != 0)
            .any(|(dst, mask)| {
                let common = mask & 0xffff_ff00;
                dst & common == net & common
            });
        (!overlaps).then_some(subnet)
    })
}

/// IPv4 routes of the host, `(destination, mask)` in host order, from
/// `/proc/net/route`.
pub fn host_routes() -> Vec<(u32, u32)> {
    std::fs::read_to_string("/proc/net/route")
        .map(|table| parse_routes(&table))
        .unwrap_or_default()
}

/// Parse the text of `/proc/net/route`.
fn parse_routes(table: &str) -> Vec<(u32, u32)> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let dst = u32::from_str_radix(f.get(1)?, 16).ok()?;
            let mask = u32::from_str_radix(f.get(7)?, 16).ok()?;
            // The kernel prints the network-order bytes read as a native u32.
            let host = |v: u32| u32::from_be_bytes(v.to_ne_bytes());
            Some((host(dst), host(mask)))
        })
        .collect()
}

/// Paths and names of one run, as [`render_config`] and [`render_conflist`] use them.
#[derive(Debug, Clone)]
pub struct Layout {
    /// `wl-<pid>-<n>`: names the CNI network and the bridge.
    pub prefix: String,
    /// The run's directory.
    pub dir: PathBuf,
    /// The bridge (≤ 15 bytes).
    pub bridge: String,
    /// The pod network.
    pub subnet: Subnet,
    /// `containerd-shim-wasmlet-v1`, when the run serves the `wasmlet` runtime
    /// (`io.containerd.wasmlet.v1`, CRI handler `wasmlet`): on containerd's `PATH`.
    pub shim: Option<PathBuf>,
}

impl Layout {
    /// containerd's `root`.
    pub fn root(&self) -> PathBuf {
        self.dir.join("root")
    }
    /// containerd's `state`.
    pub fn state(&self) -> PathBuf {
        self.dir.join("state")
    }
    /// The gRPC socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("c.sock")
    }
    /// The CNI `conf_dir`.
    pub fn cni_conf_dir(&self) -> PathBuf {
        self.dir.join("cni").join("net.d")
    }
    /// host-local's `dataDir`.
    pub fn ipam_dir(&self) -> PathBuf {
        self.dir.join("cni").join("ipam")
    }
    /// The CRI registry `config_path`: `<host:port>/hosts.toml` per registry.
    pub fn registry_config_dir(&self) -> PathBuf {
        self.dir.join("certs.d")
    }
    /// runc's `--root`.
    pub fn runc_root(&self) -> PathBuf {
        self.state().join("runc")
    }
    /// The Wasm shim's compile cache (`WASMLET_SHIM_CACHE_DIR`).
    pub fn shim_cache(&self) -> PathBuf {
        self.dir.join("shim-cache")
    }
}

/// The CRI runtime handler (RuntimeClass `handler`) that runs pods with the Wasm shim.
pub const WASM_HANDLER: &str = "wasmlet";
/// The shim's runtime type.
pub const WASM_RUNTIME_TYPE: &str = "io.containerd.wasmlet.v1";

fn toml_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// containerd's `config.toml` (version 2) for `layout`.
pub fn render_config(layout: &Layout) -> String {
    let p = |path: PathBuf| toml_str(&path.to_string_lossy());
    let disabled = DISABLED_PLUGINS
        .iter()
        .map(|d| toml_str(d))
        .collect::<Vec<_>>()
        .join(", ");
    let cri = r#"plugins."io.containerd.grpc.v1.cri""#;
    let wasm = match &layout.shim {
        Some(shim) => format!(
            r#"
    [{cri}.containerd.runtimes.{WASM_HANDLER}]
      runtime_type = {runtime_type}
      runtime_path = {path}
"#,
            runtime_type = toml_str(WASM_RUNTIME_TYPE),
            path = p(shim.clone()),
        ),
        None => String::new(),
    };
    format!(
        r#"# Generated by wasmlet-testkit for run {prefix}.
version = 2
root = {root}
state = {state}
oom_score = 0
disabled_plugins = [{disabled}]

[grpc]
  address = {socket}

[debug]
  level = "info"

[{cri}]
  sandbox_image = {pause}
  # No CAP_SYS_RESOURCE here: runc cannot lower oom_score_adj.
  restrict_oom_score_adj = true
  # Network namespaces under <state>/io.containerd.grpc.v1.cri/netns, not /var/run/netns.
  netns_mounts_under_state_dir = true
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true

  [{cri}.containerd]
    snapshotter = {snapshotter}
    default_runtime_name = "runc"

    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = {runc_root}
{wasm}
  [{cri}.cni]
    bin_dir = {bin_dir}
    conf_dir = {conf_dir}
    max_conf_num = 1

  [{cri}.registry]
    config_path = {registry}
"#,
        prefix = layout.prefix,
        root = p(layout.root()),
        state = p(layout.state()),
        socket = p(layout.socket()),
        pause = toml_str(images::PAUSE_IMAGE),
        snapshotter = toml_str(SNAPSHOTTER),
        runc_root = p(layout.runc_root()),
        bin_dir = toml_str(CNI_BIN_DIR),
        conf_dir = p(layout.cni_conf_dir()),
        registry = p(layout.registry_config_dir()),
        wasm = wasm,
    )
}

/// The CNI network list: `bridge` with `host-local` IPAM. (The CRI plugin
/// sets up `lo` itself with the `loopback` plugin from the same `bin_dir`.)
pub fn render_conflist(layout: &Layout) -> serde_json::Value {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": layout.prefix,
        "plugins": [{
            "type": "bridge",
            "bridge": layout.bridge,
            "isGateway": true,
            "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "ranges": [[{
                    "subnet": layout.subnet.to_string(),
                    "gateway": layout.subnet.gateway(),
                }]],
                "routes": [{ "dst": "0.0.0.0/0" }],
                "dataDir": layout.ipam_dir(),
            },
        }],
    })
}

/// A running private containerd; see the module docs.
pub struct Containerd {
    layout: Layout,
    footprint: Footprint,
    config: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    started_in: Duration,
    torn_down: bool,
}

impl fmt::Debug for Containerd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Containerd")
            .field("prefix", &self.layout.prefix)
            .field("dir", &self.layout.dir)
            .field("pid", &self.child.as_ref().map(Child::id))
            .finish()
    }
}

/// `/run/containerd` as a containerd host has it: its daemon creates it `0711`, and
/// `ctr` (its FIFOs, `/run/containerd/fifo`) and the shims (their sockets,
/// `/run/containerd/s`) work below it. A private containerd's state is elsewhere, so
/// here the first shim made it, and containerd's runc shim makes it `0600`: only a
/// process with `CAP_DAC_OVERRIDE` could then reach a FIFO below it, which a Wasm
/// sandbox, with no capability, cannot.
fn host_state_dir() -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = Path::new("/run/containerd");
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mode = std::fs::metadata(dir)?.permissions().mode() & 0o7777;
    if mode != 0o711 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
            .with_context(|| format!("making {} 0711", dir.display()))?;
    }
    Ok(())
}

impl Containerd {
    /// Start a private containerd and wait until its socket answers.
    pub fn start() -> Result<Self> {
        Self::start_inner(None)
    }

    /// [`Containerd::start`], serving the Wasm shim at `shim` as runtime
    /// [`WASM_RUNTIME_TYPE`] (`ctr run --runtime`) and CRI handler [`WASM_HANDLER`].
    pub fn start_with_shim(shim: &Path) -> Result<Self> {
        Self::start_inner(Some(shim.to_owned()))
    }

    fn start_inner(shim: Option<PathBuf>) -> Result<Self> {
        cleanup::sweep_stale(Path::new(RUN_PARENT));
        host_state_dir()?;

        let pid = std::process::id();
        let n = RUNS.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("wl-{pid}-{n}");
        let dir = tempfile::Builder::new()
            .prefix(&format!("{prefix}."))
            .tempdir_in(RUN_PARENT)
            .with_context(|| format!("creating a run directory in {RUN_PARENT}"))?
            .keep();
        let footprint = Footprint::for_dir(&dir)
            .with_context(|| format!("{}: not a run directory name", dir.display()))?;
        // A bridge by our name can only be left from a dead process with our pid.
        cleanup::delete_bridge(&footprint.bridge);

        let seed = pid.wrapping_mul(16).wrapping_add(n);
        let Some(subnet) = choose_subnet(seed, &host_routes()) else {
            cleanup::remove_dir(&dir);
            bail!("no free /24 in 10.128.0.0/9 near candidate {seed}");
        };
        let layout = Layout {
            prefix,
            dir: dir.clone(),
            bridge: footprint.bridge.clone(),
            subnet,
            shim,
        };
        let config = dir.join("config.toml");
        let log = dir.join("containerd.log");
        let mut this = Containerd {
            layout,
            footprint,
            config,
            log,
            child: None,
            started_in: Duration::ZERO,
            torn_down: false,
        };
        // From here on, Drop cleans up.
        this.spawn()?;
        Ok(this)
    }

    fn spawn(&mut self) -> Result<()> {
        let layout = &self.layout;
        for d in [
            layout.root(),
            layout.state(),
            layout.cni_conf_dir(),
            layout.ipam_dir(),
        ] {
            std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
        }
        std::fs::write(&self.config, render_config(layout))
            .with_context(|| format!("writing {}", self.config.display()))?;
        let conflist = layout
            .cni_conf_dir()
            .join(format!("10-{}.conflist", layout.prefix));
        std::fs::write(
            &conflist,
            serde_json::to_vec_pretty(&render_conflist(layout))?,
        )
        .with_context(|| format!("writing {}", conflist.display()))?;

        let log =
            File::create(&self.log).with_context(|| format!("creating {}", self.log.display()))?;
        let started = Instant::now();
        let mut command = Command::new("containerd");
        if let Some(shim) = &layout.shim {
            // `ctr run --runtime io.containerd.wasmlet.v1` finds the shim on PATH.
            let dir = shim.parent().unwrap_or(Path::new("/"));
            let path = std::env::var_os("PATH").unwrap_or_default();
            let mut dirs = vec![dir.to_owned()];
            dirs.extend(std::env::split_paths(&path));
            command
                .env("PATH", std::env::join_paths(dirs)?)
                .env("WASMLET_SHIM_CACHE_DIR", layout.shim_cache());
        }
        let child = command
            .arg("--config")
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .spawn()
            .context("starting containerd (is the `containerd` package installed?)")?;
        self.child = Some(child);

        let deadline = started + START_TIMEOUT;
        loop {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().transpose()) {
                let status = status?;
                bail!(
                    "containerd exited with {status} before answering; its log:\n{}",
                    tail(&self.log, 40)
                );
            }
            if self.layout.socket().exists()
                && self
                    .ctr_with_timeout(["version"], Duration::from_secs(5))
                    .is_ok()
            {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "containerd did not answer on {} within {START_TIMEOUT:?}; its log:\n{}",
                    self.layout.socket().display(),
                    tail(&self.log, 40)
                );
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        self.started_in = started.elapsed();
        // The socket answers even when the CRI plugin failed to load.
        let plugins = self.ctr(["plugins", "ls"])?;
        let cri_ok = plugins.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.first() == Some(&"io.containerd.grpc.v1")
                && f.get(1) == Some(&"cri")
                && f.last() == Some(&"ok")
        });
        if !cri_ok {
            bail!(
                "containerd's CRI plugin did not load:\n{plugins}\nlog:\n{}",
                tail(&self.log, 40)
            );
        }
        Ok(())
    }

    /// Stops the daemon (SIGTERM) the way a service restart does: shims and the
    /// containers they run keep running; the socket stops answering.
    pub fn stop_daemon(&mut self) -> Result<()> {
        match self.child.take() {
            Some(child) => cleanup::stop_child(child),
            None => bail!("containerd {} is not running", self.layout.prefix),
        }
    }

    /// Kills the daemon (SIGKILL) as a crash would, and reaps it: shims and their
    /// containers keep running; whatever it was doing is cut short.
    pub fn kill_daemon(&mut self) -> Result<()> {
        match self.child.take() {
            Some(mut child) => {
                let _ = child.kill();
                child.wait()?;
                Ok(())
            }
            None => bail!("containerd {} is not running", self.layout.prefix),
        }
    }

    /// Starts the daemon again on the same root, state and socket, and waits until
    /// it answers.
    pub fn start_daemon(&mut self) -> Result<()> {
        if self.child.is_some() {
            bail!("containerd {} is already running", self.layout.prefix);
        }
        self.spawn()
    }

    /// The run's paths and network.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// What this run leaves on the machine while it lives; check it after
    /// dropping the handle with [`Footprint::leftovers`].
    pub fn footprint(&self) -> Footprint {
        self.footprint.clone()
    }

    /// `wl-<pid>-<n>`.
    pub fn prefix(&self) -> &str {
        &self.layout.prefix
    }

    /// The gRPC socket path.
    pub fn socket(&self) -> PathBuf {
        self.layout.socket()
    }

    /// `unix://<socket>`, as a kubelet's `--container-runtime-endpoint`.
    pub fn address(&self) -> String {
        format!("unix://{}", self.layout.socket().display())
    }

    /// containerd's log file (stdout and stderr).
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The last `lines` lines of the log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }

    /// The generated `config.toml`.
    pub fn config_path(&self) -> &Path {
        &self.config
    }

    /// containerd's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// How long containerd took from spawn to answering `ctr version`.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// Run `ctr --address <socket> <args>` and return its stdout; fails with
    /// its stderr when it exits non-zero or takes longer than [`CTR_TIMEOUT`].
    pub fn ctr<I, S>(&self, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        self.ctr_with_timeout(args, CTR_TIMEOUT)
    }

    /// [`Containerd::ctr`] in the `k8s.io` namespace.
    pub fn ctr_k8s<I, S>(&self, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let mut all: Vec<std::ffi::OsString> = vec!["--namespace".into(), CRI_NAMESPACE.into()];
        all.extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self.ctr(all)
    }

    fn ctr_with_timeout<I, S>(&self, args: I, timeout: Duration) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        ctr(&self.layout.socket(), args, timeout)
    }

    /// Import the OCI archive at `path` into `k8s.io`, unpacked for [`SNAPSHOTTER`].
    pub fn import_archive(&self, path: &Path) -> Result<()> {
        self.ctr_k8s([
            "images".as_ref(),
            "import".as_ref(),
            "--snapshotter".as_ref(),
            SNAPSHOTTER.as_ref(),
            path.as_os_str(),
        ])
        .with_context(|| format!("importing {}", path.display()))?;
        Ok(())
    }

    /// `(reference, manifest digest)` of every image in `k8s.io`.
    pub fn images(&self) -> Result<Vec<(String, String)>> {
        let out = self.ctr_k8s(["images", "ls"])?;
        Ok(out
            .lines()
            .skip(1)
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                Some((f.first()?.to_string(), f.get(2)?.to_string()))
            })
            .collect())
    }

    /// Build [`images::BUSYBOX_IMAGE`] and [`images::PAUSE_IMAGE`] and import
    /// them into `k8s.io`; images already there with the same digest are skipped.
    /// Makes containerd trust `ca_pem` for the registry at `host` (`host:port`), in
    /// its `hosts.toml` layout.
    pub fn trust_registry(&self, host: &str, ca_pem: &str) -> Result<()> {
        let dir = self.layout.registry_config_dir().join(host);
        std::fs::create_dir_all(&dir)?;
        let ca = dir.join("ca.crt");
        std::fs::write(&ca, ca_pem)?;
        std::fs::write(
            dir.join("hosts.toml"),
            format!(
                "server = {server}

[host.{server}]
  ca = {ca}
",
                server = toml_str(&format!("https://{host}")),
                ca = toml_str(&ca.to_string_lossy()),
            ),
        )?;
        Ok(())
    }

    pub fn import_test_images(&self) -> Result<()> {
        let dir = self.layout.dir.join("images");
        let present = self.images()?;
        let (archive, refs) = images::write_test_images(&dir)?;
        let missing = refs
            .iter()
            .any(|(reference, digest)| !present.iter().any(|(r, d)| r == reference && d == digest));
        if missing {
            self.import_archive(&archive)?;
        }
        let present = self.images()?;
        for reference in [images::BUSYBOX_IMAGE, images::PAUSE_IMAGE] {
            if !present.iter().any(|(r, _)| r == reference) {
                bail!("{reference} is not in containerd after import: {present:?}");
            }
        }
        Ok(())
    }

    /// A gRPC channel to the socket (CRI and containerd's own services).
    pub async fn channel(&self) -> Result<Channel> {
        let path = self.layout.socket();
        let channel = Endpoint::try_from("http://[::]:50051")?
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }
            }))
            .await
            .with_context(|| format!("connecting to {}", self.layout.socket().display()))?;
        Ok(channel)
    }

    /// A CRI `RuntimeService` client.
    pub async fn runtime_client(&self) -> Result<RuntimeServiceClient<Channel>> {
        Ok(RuntimeServiceClient::new(self.channel().await?))
    }

    /// A CRI `ImageService` client.
    pub async fn image_client(&self) -> Result<ImageServiceClient<Channel>> {
        Ok(ImageServiceClient::new(self.channel().await?))
    }

    /// Tear everything down now and report what could not be removed.
    pub fn stop(mut self) -> Result<()> {
        let problems = self.teardown();
        if problems.is_empty() {
            Ok(())
        } else {
            bail!(
                "tearing down {}: {}",
                self.layout.prefix,
                problems.join("; ")
            )
        }
    }

    fn teardown(&mut self) -> Vec<String> {
        if std::mem::replace(&mut self.torn_down, true) {
            return Vec::new();
        }
        let child = self.child.take();
        cleanup::teardown(&self.footprint, child)
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        for problem in self.teardown() {
            eprintln!(
                "wasmlet-testkit containerd {}: {problem}",
                self.layout.prefix
            );
        }
    }
}

/// Run `ctr --address <socket> <args>` with a deadline.
fn ctr<I, S>(socket: &Path, args: I, timeout: Duration) -> Result<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut cmd = Command::new("ctr");
    cmd.arg("--address").arg(socket).args(args);
    let shown = format!("{cmd:?}");
    let out = output_with_timeout(cmd, timeout).with_context(|| format!("running {shown}"))?;
    if !out.status.success() {
        bail!(
            "{shown}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8(out.stdout).with_context(|| format!("{shown}: output is not UTF-8"))
}

/// Run `cmd` to completion, killing it after `timeout`.
fn output_with_timeout(mut cmd: Command, timeout: Duration) -> Result<Output> {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(out) => Ok(out?),
        Err(_) => {
            cleanup::kill(pid);
            // Collect it so it does not linger as a zombie.
            let _ = rx.recv_timeout(Duration::from_secs(5));
            bail!("timed out after {timeout:?}")
        }
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let mut text = String::new();
    if let Ok(mut f) = File::open(path) {
        let _ = f.read_to_string(&mut text);
    }
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> u32 {
        u32::from(s.parse::<std::net::Ipv4Addr>().unwrap())
    }

    #[test]
    fn subnets_come_from_the_seed_and_avoid_routes() {
        let net = |s: &str| ip(s);
        type Case = (u32, Vec<(u32, u32)>, Option<&'static str>);
        let cases: &[Case] = &[
            (0, vec![], Some("10.128.0.0/24")),
            (1, vec![], Some("10.128.1.0/24")),
            (257, vec![], Some("10.129.1.0/24")),
            ((1 << 15) + 2, vec![], Some("10.128.2.0/24")),
            (u32::MAX, vec![], Some("10.255.255.0/24")),
            // The default route overlaps nothing for this purpose.
            (0, vec![(0, 0)], Some("10.128.0.0/24")),
            // A /24 route on the candidate skips it.
            (
                0,
                vec![(net("10.128.0.0"), net("255.255.255.0"))],
                Some("10.128.1.0/24"),
            ),
            // A /16 route skips the 256 candidates in it.
            (
                5,
                vec![(net("10.128.0.0"), net("255.255.0.0"))],
                Some("10.129.0.0/24"),
            ),
            // A host route inside the candidate.
            (
                3,
                vec![(net("10.128.3.7"), net("255.255.255.255"))],
                Some("10.128.4.0/24"),
            ),
            // 10.0.0.0/8 covers everything.
            (9, vec![(net("10.0.0.0"), net("255.0.0.0"))], None),
        ];
        for (seed, routes, want) in cases {
            let got = choose_subnet(*seed, routes).map(|s| s.to_string());
            assert_eq!(got.as_deref(), *want, "seed {seed} routes {routes:?}");
        }
    }

    #[test]
    fn subnet_helpers() {
        let s = Subnet([10, 130, 7]);
        assert_eq!(s.gateway(), "10.130.7.1");
        assert!(s.contains("10.130.7.42"));
        assert!(!s.contains("10.130.8.42"));
        assert!(!s.contains("nonsense"));
    }

    #[test]
    #[cfg(target_endian = "little")]
    fn routes_parse_into_host_order() {
        let table = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
            eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
            eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
            br0\t0000800A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n";
        assert_eq!(
            parse_routes(table),
            vec![
                (0, 0),
                (ip("192.0.2.0"), ip("255.255.255.0")),
                (ip("10.128.0.0"), ip("255.255.0.0")),
            ]
        );
    }

    #[test]
    fn host_routes_are_in_host_order() {
        // Every machine has a route for its own interfaces; at least parse them.
        for (dst, mask) in host_routes() {
            assert_eq!(dst & !mask, 0, "{dst:#x}/{mask:#x}");
            assert!(
                mask.leading_ones() + mask.trailing_zeros() == 32,
                "{mask:#x}"
            );
        }
    }

    #[test]
    fn config_names_the_run_paths() {
        let layout = Layout {
            prefix: "wl-1-0".into(),
            dir: "/tmp/wl-1-0.abc".into(),
            bridge: "wl-1-0".into(),
            subnet: Subnet([10, 128, 0]),
            shim: None,
        };
        let config = render_config(&layout);
        // (The pause image's name says wasmlet; the runtime table must not.)
        assert!(
            !config.contains("runtimes.wasmlet"),
            "no Wasm runtime without a shim"
        );
        let with_shim = render_config(&Layout {
            shim: Some("/x/containerd-shim-wasmlet-v1".into()),
            ..layout.clone()
        });
        assert!(
            with_shim.contains(
                "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.wasmlet]\n      \
                 runtime_type = \"io.containerd.wasmlet.v1\"\n      \
                 runtime_path = \"/x/containerd-shim-wasmlet-v1\""
            ),
            "{with_shim}"
        );
        for needle in [
            r#"root = "/tmp/wl-1-0.abc/root""#,
            r#"state = "/tmp/wl-1-0.abc/state""#,
            r#"address = "/tmp/wl-1-0.abc/c.sock""#,
            "restrict_oom_score_adj = true",
            r#"sandbox_image = "localhost/wasmlet-test/pause:latest""#,
            r#"snapshotter = "overlayfs""#,
            r#"runtime_type = "io.containerd.runc.v2""#,
            "SystemdCgroup = false",
            r#"bin_dir = "/usr/lib/cni""#,
            r#"conf_dir = "/tmp/wl-1-0.abc/cni/net.d""#,
        ] {
            assert!(config.contains(needle), "{needle} missing from\n{config}");
        }
        let conflist = render_conflist(&layout);
        assert_eq!(conflist["plugins"][0]["bridge"], "wl-1-0");
        assert_eq!(
            conflist["plugins"][0]["ipam"]["ranges"][0][0]["subnet"],
            "10.128.0.0/24"
        );
        assert_eq!(
            conflist["plugins"][0]["ipam"]["dataDir"],
            "/tmp/wl-1-0.abc/cni/ipam"
        );
        assert_eq!(toml_str(r#"a"b\c"#), r#""a\"b\\c""#);
    }
}
