//! A real `wasmlet` node process for end-to-end tests.
//!
//! [`TestNode::start`] runs the binary standalone with its own temporary root, log
//! and manifest directories and free loopback ports, waits for `/healthz`, and stops
//! it (SIGTERM, then SIGKILL) when dropped. Tests drive it the way an operator does:
//! by writing manifests and reading `/pods`, the log files and the node's own log.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;

/// How a test node is set up.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    pub node_name: String,
    /// Example images (names in `target/images`) placed in the node's drop directory.
    pub images: Vec<String>,
    /// More OCI archives placed in the node's drop directory.
    pub image_archives: Vec<PathBuf>,
    /// Container restart back-off: initial and maximum.
    pub backoff: (Duration, Duration),
    /// Extra command-line flags.
    pub extra_args: Vec<String>,
    /// More top-level `KubeletConfiguration` fields, as YAML lines each ending in a
    /// newline (e.g. `containerLogMaxSize: 2Ki\n`).
    pub kubelet_config: String,
    /// More of the config file's `wasmlet:` section, as YAML lines indented by two
    /// spaces (e.g. `  plugins:\n  - name: ...`).
    pub wasmlet_config: String,
    /// Whether the node watches its manifest directory (`--pod-manifest-path`); the
    /// directory is made either way.
    pub static_pods: bool,
    /// Where the node's directory (its root dir, pod logs, manifests) is made: the
    /// system's temporary directory by default (a test's small filesystem, say).
    pub base_dir: Option<PathBuf>,
    /// Where the node's root dir and pod logs go instead (`<dir>/root`, `<dir>/pods`),
    /// when only they should be on a test's filesystem: the node's own log and its
    /// manifests stay in its directory.
    pub state_dir: Option<PathBuf>,
    /// More environment variables for the node process (`DBUS_SYSTEM_BUS_ADDRESS`).
    pub env: Vec<(String, String)>,
    /// The CNI configuration Wasm pods are attached with (`--cni-conf-dir`). Without
    /// it the node is given an empty one, so a test node never picks up the
    /// machine's `/etc/cni/net.d`, and its Wasm pods share the node's network.
    pub cni_conf_dir: Option<PathBuf>,
}

impl NodeOptions {
    /// Runs container pods through the CRI runtime at `endpoint` (`unix://…`), with a
    /// request timeout that suits two busy cores.
    pub fn with_cri(mut self, endpoint: String) -> Self {
        self.extra_args.extend([
            "--container-runtime-endpoint".into(),
            endpoint,
            "--runtime-request-timeout".into(),
            "30s".into(),
        ]);
        self
    }
}

impl Default for NodeOptions {
    fn default() -> Self {
        NodeOptions {
            node_name: "e2e".into(),
            images: Vec::new(),
            image_archives: Vec::new(),
            backoff: (Duration::from_millis(500), Duration::from_secs(2)),
            extra_args: Vec::new(),
            kubelet_config: String::new(),
            wasmlet_config: String::new(),
            static_pods: true,
            base_dir: None,
            state_dir: None,
            env: Vec::new(),
            cni_conf_dir: None,
        }
    }
}

/// Image GC by disk usage is off on test nodes unless a test sets it: they share a
/// containerd whose test images were imported and cannot be pulled again, and the
/// machine's disk may well be past the 85 % GC starts at. (Disk-pressure reclaim,
/// which ignores these thresholds, still works.)
const IMAGE_GC_OFF: &str = "imageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 99\n";

/// Disk-pressure eviction likewise, unless a test sets `evictionHard`: with the
/// kubelet's defaults a test node on a machine whose disk is more than 90 % full has
/// DiskPressure from its first pass and refuses every API pod (static pods are
/// critical and still run), which failed every cluster test on such a machine. The
/// kubelet's memory threshold stays; the disk tests set theirs on a filesystem of
/// their own.
const EVICTION_MEMORY_ONLY: &str = "evictionHard: {memory.available: 100Mi}\n";

/// The test node's defaults that the test's own `kubelet_config` does not set.
fn test_defaults(kubelet_config: &str) -> String {
    let sets = |key: &str| {
        kubelet_config
            .lines()
            .any(|l| l.trim_start().starts_with(&format!("{key}:")))
    };
    let mut defaults = String::new();
    if !sets("imageGCHighThresholdPercent") && !sets("imageGCLowThresholdPercent") {
        defaults.push_str(IMAGE_GC_OFF);
    }
    if !sets("evictionHard") {
        defaults.push_str(EVICTION_MEMORY_ONLY);
    }
    defaults
}

/// A running node.
pub struct TestNode {
    dir: tempfile::TempDir,
    pub manifests: PathBuf,
    pub root: PathBuf,
    pub logs: PathBuf,
    pub read_only_port: u16,
    pub healthz_port: u16,
    /// The node API's port (TLS; served when something can authenticate).
    pub api_port: u16,
    pub node_name: String,
    /// The node's `cgroupRoot` (`/wasmlet-e2e-<pid>-<n>`): its `kubepods` is below it.
    pub cgroup_root: String,
    stderr_path: PathBuf,
    binary: PathBuf,
    args: Vec<std::ffi::OsString>,
    env: Vec<(String, String)>,
    child: Option<Child>,
}

/// A free port on loopback, for a process started right after to bind.
///
/// Taken below the kernel's ephemeral range (`net.ipv4.ip_local_port_range`), so no
/// outgoing connection of a test running beside this one can take it between this check
/// and that bind (a port from `bind(:0)` could be, and the node then failed to start
/// with "Address already in use"). Each process hands out each port once, from an offset
/// of its own, so two test binaries running at once do not pick the same one either.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static HANDED_OUT: AtomicU32 = AtomicU32::new(0);
    const LOWEST: u32 = 10_000;
    let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    if ephemeral_start <= LOWEST + 1_000 {
        // No room below the ephemeral range: a port the kernel picks is the best there is.
        return TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free loopback port");
    }
    let span = ephemeral_start - LOWEST;
    let offset = std::process::id().wrapping_mul(7_919) % span;
    loop {
        let n = HANDED_OUT.fetch_add(1, Ordering::Relaxed);
        assert!(
            n < span,
            "no free loopback port left below {ephemeral_start}"
        );
        let port = u16::try_from(LOWEST + (offset + n) % span).expect("ports fit in u16");
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// The status code and body of a whole HTTP/1 response.
fn status_and_body(raw: Vec<u8>) -> Result<(u16, String)> {
    let text = String::from_utf8(raw).context("response is not UTF-8")?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("malformed HTTP response")?;
    let code: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("no status code")?;
    Ok((code, body.to_owned()))
}

/// A plain HTTP/1.0 GET on loopback: status code and body.
pub fn http_get(port: u16, path: &str) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    status_and_body(raw)
}

/// How a request to the node API authenticates.
#[derive(Clone, Copy, Debug)]
pub enum NodeApiAuth<'a> {
    /// No credentials.
    None,
    /// `Authorization: Bearer <token>`.
    Token(&'a str),
    /// A client certificate and its key (PEM).
    ClientCert { cert_pem: &'a str, key_pem: &'a str },
}

/// A GET over TLS to `127.0.0.1:port`, trusting `ca_pem` for the server: status code
/// and body (`None` when the handshake or the connection failed before an answer).
pub fn https_get(
    port: u16,
    ca_pem: &str,
    path: &str,
    auth: NodeApiAuth<'_>,
) -> Result<(u16, String)> {
    https_request(port, ca_pem, "GET", path, auth)
}

/// [`https_get`] with another method (and no body).
/// A TLS connection to the node API on `port`, its serving certificate checked
/// against `ca_pem`; no client certificate (send a bearer token in the request).
pub fn https_connect(
    port: u16,
    ca_pem: &str,
) -> Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, ServerName};
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name)?;
    let tcp = TcpStream::connect(("127.0.0.1", port))?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    Ok(rustls::StreamOwned::new(conn, tcp))
}

pub fn https_request(
    port: u16,
    ca_pem: &str,
    method: &str,
    path: &str,
    auth: NodeApiAuth<'_>,
) -> Result<(u16, String)> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let config = match auth {
        NodeApiAuth::ClientCert { cert_pem, key_pem } => {
            let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()?;
            let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())?;
            builder.with_client_auth_cert(chain, key)?
        }
        _ => builder.with_no_client_auth(),
    };
    let name = ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name)?;
    let tcp = TcpStream::connect(("127.0.0.1", port))?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let bearer = match auth {
        NodeApiAuth::Token(t) => format!("Authorization: Bearer {t}\r\n"),
        _ => String::new(),
    };
    write!(
        tls,
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n{bearer}\r\n"
    )?;
    let mut raw = Vec::new();
    match tls.read_to_end(&mut raw) {
        Ok(_) => {}
        // A server that closes without close_notify still answered.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
        Err(e) => return Err(e.into()),
    }
    status_and_body(raw)
}

/// Polls `f` every 20 ms until it returns `Some` or `timeout` passes.
pub fn poll<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl TestNode {
    /// Starts `binary` and waits until it serves `/healthz`.
    pub fn start(binary: &Path, opts: NodeOptions) -> Result<Self> {
        let dir = match &opts.base_dir {
            Some(base) => tempfile::Builder::new()
                .prefix("wasmlet-e2e-")
                .tempdir_in(base)?,
            None => tempfile::Builder::new().prefix("wasmlet-e2e-").tempdir()?,
        };
        let manifests = dir.path().join("manifests");
        let state = opts.state_dir.as_deref().unwrap_or(dir.path());
        let root = state.join("root");
        let logs = state.join("pods");
        for d in [&manifests, &root.join("images"), &logs] {
            std::fs::create_dir_all(d)?;
        }
        for archive in &opts.image_archives {
            let name = archive
                .file_name()
                .context("an image archive has a file name")?;
            std::fs::copy(archive, root.join("images").join(name))
                .with_context(|| format!("copying {}", archive.display()))?;
        }
        if !opts.images.is_empty() {
            let images = crate::images::ensure_example_images()?;
            for name in &opts.images {
                let from = images.join(format!("{name}.tar"));
                std::fs::copy(&from, root.join("images").join(format!("{name}.tar")))
                    .with_context(|| format!("copying {}", from.display()))?;
            }
        }
        let read_only_port = free_port();
        let healthz_port = free_port();
        let api_port = free_port();
        // Every node's cgroups under a root of its own, removed when it is dropped.
        static NODES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let cgroup_root = format!(
            "/wasmlet-e2e-{}-{}",
            std::process::id(),
            NODES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let config = dir.path().join("config.yaml");
        std::fs::write(
            &config,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\n\
                 kind: KubeletConfiguration\n\
                 address: 127.0.0.1\n\
                 readOnlyPort: {read_only_port}\n\
                 healthzPort: {healthz_port}\n\
                 port: {api_port}\n\
                 fileCheckFrequency: 2s\n\
                 cgroupRoot: {cgroup_root}\n\
                 podLogsDir: {}\n\
                 {}\
                 {}\
                 wasmlet:\n  housekeepingInterval: 1s\n  restartBackoff:\n    initial: {}ms\n    max: {}ms\n{}",
                logs.display(),
                test_defaults(&opts.kubelet_config),
                opts.kubelet_config,
                opts.backoff.0.as_millis(),
                opts.backoff.1.as_millis(),
                opts.wasmlet_config,
            ),
        )?;
        let stderr_path = dir.path().join("wasmlet.log");
        let mut args: Vec<std::ffi::OsString> = vec![
            "--config".into(),
            config.into(),
            "--root-dir".into(),
            root.clone().into(),
            "--hostname-override".into(),
            opts.node_name.clone().into(),
        ];
        if opts.static_pods {
            args.extend(["--pod-manifest-path".into(), manifests.clone().into()]);
        }
        let cni_conf_dir = opts
            .cni_conf_dir
            .clone()
            .unwrap_or_else(|| dir.path().join("no-cni-config"));
        args.extend([
            "--cni-conf-dir".into(),
            cni_conf_dir.into(),
            "--cni-bin-dir".into(),
            crate::containerd::CNI_BIN_DIR.into(),
        ]);
        args.extend(opts.extra_args.iter().map(Into::into));
        let mut node = TestNode {
            dir,
            manifests,
            root,
            logs,
            read_only_port,
            healthz_port,
            api_port,
            node_name: opts.node_name,
            cgroup_root,
            stderr_path,
            binary: binary.to_owned(),
            args,
            env: opts.env,
            child: None,
        };
        node.spawn()?;
        Ok(node)
    }

    /// Starts the process (appending to its log) and waits until it serves `/healthz`.
    fn spawn(&mut self) -> Result<()> {
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.stderr_path)?;
        let child = Command::new(&self.binary)
            .args(&self.args)
            .env("RUST_LOG", "info,wasmlet_node=debug")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("starting {}", self.binary.display()))?;
        self.child = Some(child);
        let port = self.healthz_port;
        // The node is healthy once its configured plugins are compiled: a JavaScript
        // plugin (a whole JS engine) took over 30 s in a debug build on a loaded CI
        // machine. The poll ends as soon as it answers.
        let healthy = poll(Duration::from_secs(120), || {
            if !self.is_running() {
                return Some(false);
            }
            matches!(http_get(port, "/healthz"), Ok((200, _))).then_some(true)
        });
        if healthy != Some(true) {
            bail!("the node did not become healthy; its log:\n{}", self.log());
        }
        Ok(())
    }

    /// Kills the node with SIGKILL, as a crash or an OOM kill would, and waits for it.
    /// Its Wasm sandboxes and the container runtime's containers keep running.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the node again with the same flags, root and directories (after
    /// [`TestNode::kill`] or [`TestNode::stop`]).
    pub fn restart(&mut self) -> Result<()> {
        if self.child.is_some() {
            bail!("the node is still running");
        }
        self.spawn()
    }

    /// The node's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Whether the node process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// The node's own log (stderr) so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// The scratch directory of this node.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a manifest atomically (via a dotfile the node ignores, then a rename).
    pub fn write_manifest(&self, file: &str, yaml: &str) -> Result<PathBuf> {
        let tmp = self.manifests.join(format!(".{file}.tmp"));
        let path = self.manifests.join(file);
        std::fs::write(&tmp, yaml)?;
        std::fs::rename(&tmp, &path)?;
        Ok(path)
    }

    /// Deletes a manifest.
    pub fn remove_manifest(&self, file: &str) -> Result<()> {
        Ok(std::fs::remove_file(self.manifests.join(file))?)
    }

    /// The CA of the node's self-signed serving certificate (`<root>/pki/kubelet.crt`,
    /// the certificate then its CA), once the node has made it.
    pub fn serving_ca(&self) -> Result<String> {
        let chain = std::fs::read_to_string(self.root.join("pki/kubelet.crt"))?;
        let end = "-----END CERTIFICATE-----";
        let (_, ca) = chain
            .split_once(end)
            .context("kubelet.crt holds one certificate, not the certificate and its CA")?;
        Ok(ca.trim_start().to_owned())
    }

    /// A GET on the node API, its serving certificate verified against
    /// [`Self::serving_ca`].
    pub fn api_get(&self, path: &str, auth: NodeApiAuth<'_>) -> Result<(u16, String)> {
        https_get(self.api_port, &self.serving_ca()?, path, auth)
    }

    /// A TLS connection to the node API, for requests a test writes itself
    /// ([`https_connect`]).
    pub fn api_connect(&self) -> Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
        https_connect(self.api_port, &self.serving_ca()?)
    }

    /// A POST without a body on the node API (see [`Self::api_get`]).
    pub fn api_post(&self, path: &str, auth: NodeApiAuth<'_>) -> Result<(u16, String)> {
        https_request(self.api_port, &self.serving_ca()?, "POST", path, auth)
    }

    /// `/pods` from the read-only port, parsed as a `v1.PodList`.
    pub fn pods(&self) -> Result<Vec<Pod>> {
        let (code, body) = http_get(self.read_only_port, "/pods")?;
        if code != 200 {
            bail!("/pods answered {code}: {body}");
        }
        let list: k8s_openapi::List<Pod> =
            serde_json::from_str(&body).context("/pods is not a PodList")?;
        Ok(list.items)
    }

    /// The pod whose manifest name is `name` (the node appends `-<nodeName>`).
    pub fn pod(&self, name: &str) -> Option<Pod> {
        let full = format!("{name}-{}", self.node_name);
        self.pods()
            .ok()?
            .into_iter()
            .find(|p| p.metadata.name.as_deref() == Some(full.as_str()))
    }

    /// Waits until the pod `name` satisfies `pred`; the error shows the last status.
    pub fn wait_pod(
        &self,
        name: &str,
        timeout: Duration,
        pred: impl Fn(&Pod) -> bool,
    ) -> Result<Pod> {
        let mut last = None;
        let found = poll(timeout, || {
            let pod = self.pod(name);
            let hit = pod.as_ref().is_some_and(&pred);
            last = pod.clone();
            if hit { pod } else { None }
        });
        found.with_context(|| {
            format!(
                "pod {name} did not reach the expected state within {timeout:?}; last seen:\n{}\nnode log tail:\n{}",
                serde_json::to_string_pretty(&last).unwrap_or_default(),
                tail(&self.log(), 30)
            )
        })
    }

    /// Waits until the pod `name` is no longer listed.
    pub fn wait_gone(&self, name: &str, timeout: Duration) -> Result<()> {
        poll(timeout, || self.pod(name).is_none().then_some(()))
            .with_context(|| format!("pod {name} still listed after {timeout:?}"))
    }

    /// The text of every record in a container's CRI log file.
    pub fn container_log(
        &self,
        pod: &Pod,
        container: &str,
        attempt: u32,
    ) -> Result<Vec<CriRecord>> {
        let dir = self.logs.join(format!(
            "{}_{}_{}",
            pod.metadata.namespace.as_deref().unwrap_or("default"),
            pod.metadata.name.as_deref().unwrap_or(""),
            pod.metadata.uid.as_deref().unwrap_or("")
        ));
        let path = dir.join(container).join(format!("{attempt}.log"));
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        text.lines().map(CriRecord::parse).collect()
    }

    /// The node's Wasm sandbox processes: its children, and sandboxes it adopted.
    pub fn sandbox_pids(&self) -> Vec<u32> {
        let pid = self.pid();
        // No node process (killed and not restarted): no children to look for.
        let mut pids = if pid == 0 {
            Vec::new()
        } else {
            children_of(pid)
        };
        // Sandboxes adopted after a restart are not the node's children, nor are
        // those its zygote forked (`wasmlet.sandboxZygote`), which carry the zygote's
        // command line.
        for p in processes_mentioning(&self.root) {
            if p != pid && !pids.contains(&p) {
                pids.push(p);
            }
        }
        // The zygote itself runs no pod.
        pids.retain(|p| !is_zygote_of(*p, pid));
        pids
    }

    /// The sandbox zygote the node started, if it runs one (`wasmlet.sandboxZygote`).
    pub fn zygote_pid(&self) -> Option<u32> {
        let node = self.pid();
        children_of(node)
            .into_iter()
            .find(|p| is_zygote_of(*p, node))
    }

    /// Stops the node (SIGTERM, SIGKILL after 15 s) and returns its exit status.
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        let done = poll(Duration::from_secs(15), || child.try_wait().ok().flatten());
        match done {
            Some(status) => Some(status),
            None => {
                let _ = child.kill();
                child.wait().ok()
            }
        }
    }
}

/// Processes whose command line mentions `path` (a node's sandboxes name its root).
pub fn processes_mentioning(path: &Path) -> Vec<u32> {
    let needle = path.to_string_lossy();
    processes_matching(|cmdline| cmdline.contains(&*needle))
}

/// Pids of the processes whose command line, its arguments joined by spaces,
/// satisfies `f`.
pub fn processes_matching(f: impl Fn(&str) -> bool) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|raw| f(&String::from_utf8_lossy(&raw).replace('\0', " ")))
        })
        .collect()
}

impl Drop for TestNode {
    fn drop(&mut self) {
        let sandboxes = self.sandbox_pids();
        self.stop();
        // Whatever is left in the node's cgroups (containers of pods still running
        // in a container runtime) is killed, and the hierarchy removed.
        if let Err(e) = crate::containerd::remove_cgroup_tree(&self.cgroup_root) {
            eprintln!(
                "wasmlet-testkit: removing cgroups under {}: {e:#}",
                self.cgroup_root
            );
        }
        // A stopped node ends its sandboxes; make sure none is left behind.
        for p in sandboxes {
            if poll(Duration::from_secs(5), || {
                (!Path::new(&format!("/proc/{p}")).exists()).then_some(())
            })
            .is_none()
            {
                let _ = Command::new("kill")
                    .arg("-KILL")
                    .arg(p.to_string())
                    .status();
            }
        }
        // A node leaves its pods' volumes mounted and its Wasm pods' network
        // namespaces in place when it stops (as the kubelet leaves its pods: the next
        // start finds them through the root dir). The test's directory goes, so they
        // go first (Secret and projected tmpfs mounts, and the namespaces of a node
        // stopped with pods, were left behind otherwise).
        for netns in wasm_netns(&self.root) {
            let _ = nix::mount::umount2(&netns, nix::mount::MntFlags::MNT_DETACH);
            let _ = std::fs::remove_file(&netns);
        }
        if let Err(e) = crate::containerd::unmount_all_under(self.dir.path()) {
            eprintln!(
                "wasmlet-testkit: unmounting under {}: {e}",
                self.dir.path().display()
            );
        }
    }
}

/// The network namespaces the node's Wasm sandboxes recorded
/// (`<root>/wasm-sandboxes/<id>/network.json`).
fn wasm_netns(root: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(root.join("wasm-sandboxes"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("network.json")).ok())
        .filter_map(|raw| serde_json::from_slice::<serde_json::Value>(&raw).ok())
        .filter_map(|record| record.get("netns")?.as_str().map(PathBuf::from))
        .collect()
}

/// One record of a CRI log file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CriRecord {
    /// RFC 3339 with nanoseconds.
    pub time: String,
    pub stream: String,
    pub partial: bool,
    pub text: String,
}

impl CriRecord {
    /// Parses `<time> <stream> <F|P> <text>`; an error names the line.
    pub fn parse(line: &str) -> Result<Self> {
        let mut parts = line.splitn(4, ' ');
        let (Some(time), Some(stream), Some(tag)) = (parts.next(), parts.next(), parts.next())
        else {
            bail!("not a CRI log line: {line:?}");
        };
        if !matches!(stream, "stdout" | "stderr") || !matches!(tag, "F" | "P") {
            bail!("not a CRI log line: {line:?}");
        }
        Ok(CriRecord {
            time: time.to_owned(),
            stream: stream.to_owned(),
            partial: tag == "P",
            text: parts.next().unwrap_or("").to_owned(),
        })
    }
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The fields of `/proc/<pid>/stat` after the command (which may hold spaces and
/// parentheses): the first is the state (field 3).
fn stat_fields(pid: u32) -> Result<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .with_context(|| format!("malformed /proc/{pid}/stat"))?;
    Ok(rest.split_whitespace().map(str::to_owned).collect())
}

/// The CPU time (user and system, all threads) a process has used so far.
pub fn cpu_time(pid: u32) -> Result<Duration> {
    let fields = stat_fields(pid)?;
    // utime and stime are fields 14 and 15, in clock ticks.
    let ticks = |i: usize| -> Result<u64> {
        fields
            .get(i - 3)
            .and_then(|f| f.parse().ok())
            .with_context(|| format!("no field {i} in /proc/{pid}/stat"))
    };
    let per_second = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|t| *t > 0)
        .unwrap_or(100) as f64;
    Ok(Duration::from_secs_f64(
        (ticks(14)? + ticks(15)?) as f64 / per_second,
    ))
}

/// The share of one core a process used over the next `window` (0.25 = 25 %).
pub fn cpu_share(pid: u32, window: Duration) -> Result<f64> {
    let before = cpu_time(pid)?;
    let started = Instant::now();
    std::thread::sleep(window);
    let used = cpu_time(pid)?.saturating_sub(before);
    Ok(used.as_secs_f64() / started.elapsed().as_secs_f64())
}

/// How many file descriptors process `pid` holds (0 when it is gone).
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// A process's resident set (`VmRSS`) in KiB; 0 if it is gone.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// The parent of a process, from `/proc/<pid>/stat`.
pub fn parent_of(pid: u32) -> Option<u32> {
    stat_fields(pid).ok()?.get(1)?.parse().ok()
}

/// Whether `pid` is the sandbox zygote node `node` started (a sandbox it forked has
/// the same command line, and the zygote for a parent).
fn is_zygote_of(pid: u32, node: u32) -> bool {
    let zygote = std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| c.split(|b| *b == 0).any(|arg| arg == b"--zygote"));
    zygote && parent_of(pid) == Some(node)
}

/// Direct children of a process, from `/proc/*/stat`.
pub fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in entries.flatten() {
        let Ok(child) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(fields) = stat_fields(child) else {
            continue;
        };
        let ppid = fields.get(1).and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push(child);
        }
    }
    out.sort();
    out
}
