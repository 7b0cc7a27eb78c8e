//! A private containerd that serves the shim, the shim's images in it, and ways to
//! watch what the shim does.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use wasmlet_testkit::containerd::{CRI_NAMESPACE, Containerd, WASM_RUNTIME_TYPE};
use wasmlet_testkit::images::{BuiltImage, ensure_shim_images};
pub use wasmlet_testkit::node::processes_matching as processes;

pub const SHIM: &str = env!("CARGO_BIN_EXE_containerd-shim-wasmlet-v1");

/// A containerd serving the shim, with the `<workload>-linux` images imported.
pub struct Harness {
    pub containerd: Containerd,
    pub images: Vec<BuiltImage>,
}

impl Harness {
    pub fn start() -> Result<Harness> {
        let images = ensure_shim_images()?;
        let containerd = Containerd::start_with_shim(Path::new(SHIM))?;
        for image in &images {
            containerd.import_archive(&image.archive)?;
        }
        Ok(Harness { containerd, images })
    }

    /// The reference of the `<workload>-linux` image.
    pub fn image(&self, workload: &str) -> String {
        let name = format!("{workload}-linux");
        self.images
            .iter()
            .find(|i| i.name == name)
            .map(|i| i.reference.clone())
            .unwrap_or_else(|| panic!("no image {name}"))
    }

    /// `ctr -n k8s.io <args>`, its stdout; an error with its stderr on failure.
    pub fn ctr<S: AsRef<str>>(&self, args: &[S]) -> Result<String> {
        self.containerd.ctr_k8s(args.iter().map(|a| a.as_ref()))
    }

    /// `ctr -n k8s.io <args>` left running, its stdout read line by line.
    pub fn ctr_spawn<S: AsRef<str>>(&self, args: &[S]) -> Result<Running> {
        let mut child = Command::new("ctr")
            .arg("--address")
            .arg(self.containerd.socket())
            .args(["--namespace", CRI_NAMESPACE])
            .args(args.iter().map(|a| a.as_ref()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("running ctr")?;
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().expect("piped");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Running {
            child,
            lines,
            seen: Vec::new(),
        })
    }

    /// `run --runtime io.containerd.wasmlet.v1 <extra> <image of workload> <id> <args>`.
    pub fn run_args(&self, extra: &[&str], workload: &str, id: &str, args: &[&str]) -> Vec<String> {
        let mut all: Vec<String> = vec!["run".into(), "--runtime".into(), WASM_RUNTIME_TYPE.into()];
        all.extend(extra.iter().map(|s| s.to_string()));
        all.push(self.image(workload));
        all.push(id.into());
        all.extend(args.iter().map(|s| s.to_string()));
        all
    }

    /// The status column of `ctr task ls` for `id`.
    pub fn task_status(&self, id: &str) -> Result<Option<String>> {
        let out = self.ctr(&["task", "ls"])?;
        Ok(out.lines().skip(1).find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.first() == Some(&id)).then(|| f.last().unwrap_or(&"").to_string())
        }))
    }

    /// The shim's ttrpc address of task `id`, from its bundle.
    pub fn shim_address(&self, id: &str) -> Result<String> {
        let path = self
            .containerd
            .layout()
            .state()
            .join("io.containerd.runtime.v2.task")
            .join(CRI_NAMESPACE)
            .join(id)
            .join("address");
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
    }

    /// Pids of this run's shim and sandbox processes.
    pub fn shim_processes(&self) -> Vec<u32> {
        let dir = self.containerd.layout().dir.to_string_lossy().into_owned();
        processes(|cmdline| cmdline.contains(SHIM) && cmdline.contains(&dir))
    }
}

/// A `ctr` left running.
pub struct Running {
    pub child: Child,
    lines: mpsc::Receiver<String>,
    pub seen: Vec<String>,
}

impl Running {
    /// Waits up to `timeout` for a line of stdout that `f` accepts.
    pub fn wait_line(&mut self, timeout: Duration, f: impl Fn(&str) -> bool) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if f(&line) {
                        return Ok(line);
                    }
                }
                Err(_) => {
                    // A `ctr` that ended says why on its stderr.
                    let mut stderr = String::new();
                    let ended = Instant::now() + Duration::from_secs(5);
                    while self.child.try_wait()?.is_none() && Instant::now() < ended {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    if self.child.try_wait()?.is_some()
                        && let Some(mut e) = self.child.stderr.take()
                    {
                        let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
                    }
                    bail!(
                        "no such line within {timeout:?}; saw {:?}; ctr's stderr: {stderr:?}",
                        self.seen
                    )
                }
            }
        }
    }

    /// Waits up to `timeout` for `ctr` to exit; its exit code and stderr.
    pub fn wait(mut self, timeout: Duration) -> Result<(i32, String)> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                let mut stderr = String::new();
                if let Some(mut e) = self.child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
                }
                while let Ok(line) = self.lines.try_recv() {
                    self.seen.push(line);
                }
                return Ok((status.code().unwrap_or(-1), stderr));
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                bail!("ctr did not exit within {timeout:?}; saw {:?}", self.seen);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `f` every 20 ms until it returns `Some`, for up to `timeout`.
pub fn poll<T>(
    timeout: Duration,
    what: &str,
    mut f: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    let mut last = None;
    loop {
        match f() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last = Some(format!("{e:#}")),
        }
        if Instant::now() > deadline {
            bail!("{what}: not within {timeout:?} (last error: {last:?})");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A temporary file path under the run directory.
pub fn run_file(h: &Harness, name: &str) -> PathBuf {
    h.containerd.layout().dir.join(name)
}
