//! How containerd starts and cleans up a shim: the flags, `start` and `delete`.
//!
//! containerd 1.6 to 2.2 read `start`'s output as the shim's ttrpc address and speak
//! the task API to it (`containerd.task.v2.Task`; 2.x also `v3`, which the daemon
//! serves too). The daemon is started by `start`, in a session of its own so that it
//! outlives containerd, and tells `start` it listens by closing its stdout.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use protobuf::Message;
use sha2::{Digest, Sha256};

use crate::spec::Spec;

/// The directory of shim sockets, the one containerd's own runc shim uses.
pub const SOCKET_DIR: &str = "/run/containerd/s";

/// The file in a bundle that records the sandbox process a task's shim started, so
/// that `delete` can stop it when the shim died.
pub const SANDBOX_PID_FILE: &str = "wasmlet-sandbox.pid";

/// The command line, in Go's `flag` style (`-name value`, `-name=value`, `--name`).
#[derive(Debug, Default, Clone)]
pub struct Flags {
    pub namespace: String,
    pub id: String,
    /// containerd's gRPC address.
    pub address: String,
    pub publish_binary: String,
    pub bundle: Option<PathBuf>,
    /// The daemon's socket (set by `start`).
    pub socket: Option<PathBuf>,
    pub debug: bool,
    pub version: bool,
    pub action: Option<String>,
}

impl Flags {
    pub fn parse(args: &[String]) -> anyhow::Result<Flags> {
        let mut flags = Flags::default();
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let Some(name) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
                if flags.action.is_some() {
                    bail!("unexpected argument {arg:?} after the action");
                }
                flags.action = Some(arg.clone());
                continue;
            };
            let (name, inline) = match name.split_once('=') {
                Some((n, v)) => (n, Some(v.to_owned())),
                None => (name, None),
            };
            let mut value = || -> anyhow::Result<String> {
                match &inline {
                    Some(v) => Ok(v.clone()),
                    None => it
                        .next()
                        .cloned()
                        .with_context(|| format!("flag -{name} needs a value")),
                }
            };
            match name {
                "namespace" => flags.namespace = value()?,
                "id" => flags.id = value()?,
                "address" => flags.address = value()?,
                "publish-binary" => flags.publish_binary = value()?,
                "bundle" => flags.bundle = Some(value()?.into()),
                "socket" => flags.socket = Some(value()?.into()),
                "debug" => flags.debug = inline.as_deref().is_none_or(|v| v == "true"),
                "v" | "version" => flags.version = true,
                other => bail!("unknown flag -{other}"),
            }
        }
        Ok(flags)
    }
}

/// The socket of a group's shim: a digest of containerd's address, the namespace and
/// the group, as the runc shim names its own (so each containerd has its own shims).
pub fn socket_path(address: &str, namespace: &str, group: &str) -> PathBuf {
    let digest = Sha256::digest(format!("{address}/{namespace}/{group}").as_bytes());
    Path::new(SOCKET_DIR).join(hex::encode(digest))
}

/// `start`: prints the address of the shim that serves this task, starting it unless
/// the task's pod already has one.
pub fn start(flags: &Flags) -> anyhow::Result<()> {
    let bundle = std::env::current_dir().context("the bundle (current directory)")?;
    let spec = Spec::load(&bundle)?;
    let group = spec.group().unwrap_or(&flags.id).to_owned();
    let socket = socket_path(&flags.address, &flags.namespace, &group);
    let address = format!("unix://{}", socket.display());
    if UnixStream::connect(&socket).is_ok() {
        write_address(&bundle, &address)?;
        print!("{address}");
        return Ok(());
    }
    // A socket nobody answers on is a dead shim's.
    let _ = std::fs::remove_file(&socket);
    std::fs::create_dir_all(SOCKET_DIR).with_context(|| format!("creating {SOCKET_DIR}"))?;

    let exe = std::env::current_exe().context("finding this program")?;
    let mut cmd = Command::new(exe);
    cmd.arg("-namespace")
        .arg(&flags.namespace)
        .arg("-id")
        .arg(&flags.id)
        .arg("-address")
        .arg(&flags.address)
        .arg("-socket")
        .arg(&socket);
    if !flags.publish_binary.is_empty() {
        cmd.arg("-publish-binary").arg(&flags.publish_binary);
    }
    if flags.debug {
        cmd.arg("-debug");
    }
    cmd.current_dir(&bundle)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    // A process group of its own: signals to containerd's group never reach it.
    cmd.process_group(0);
    let mut child = cmd.spawn().context("starting the shim daemon")?;
    // The daemon closes its stdout once it listens (or dies): read to the end.
    let mut ready = Vec::new();
    let _ = child.stdout.take().expect("piped").read_to_end(&mut ready);
    if let Some(status) = child.try_wait().context("waiting for the shim daemon")? {
        bail!(
            "the shim daemon exited ({status}) before listening; its log is the bundle's `log` \
             pipe (containerd's log)"
        );
    }
    write_address(&bundle, &address)?;
    print!("{address}");
    std::io::stdout().flush()?;
    Ok(())
}

fn write_address(bundle: &Path, address: &str) -> anyhow::Result<()> {
    let path = bundle.join("address");
    let tmp = bundle.join("address.tmp");
    std::fs::write(&tmp, address).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))
}

/// `delete`: the shim of this task is gone (containerd saw it die, or finds its task
/// after a restart with no shim). Stops the sandbox process it had started, unmounts
/// the rootfs, and prints the task's end: killed, now.
pub fn delete(flags: &Flags) -> anyhow::Result<()> {
    let bundle = match &flags.bundle {
        Some(b) => b.clone(),
        None => std::env::current_dir().context("the bundle (current directory)")?,
    };
    if let Ok(text) = std::fs::read_to_string(bundle.join(SANDBOX_PID_FILE))
        && let Ok(pid) = text.trim().parse::<i32>()
        && crate::sandbox::is_sandbox_process(pid)
    {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    // The sandbox (the whole pod's) is gone with its shim: so is what it shared.
    let run_dir = crate::mount::recorded_run_dir(&bundle);
    crate::mount::unmount_rootfs(&bundle);
    if let Some(run_dir) = run_dir {
        crate::mount::release_run_dir(&run_dir);
    }
    let now = jiff::Timestamp::now();
    let mut response = containerd_shim_protos::api::DeleteResponse::new();
    response.exit_status = 128 + 9;
    response.exited_at = protobuf::MessageField::some(crate::events::timestamp(now));
    let bytes = response
        .write_to_bytes()
        .context("encoding the delete response")?;
    std::io::stdout().write_all(&bytes)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn flags_parse_as_containerd_passes_them() {
        let f = Flags::parse(&args(
            "-namespace k8s.io -address /run/containerd/containerd.sock \
             -publish-binary /usr/bin/containerd -id abc -debug start",
        ))
        .unwrap();
        assert_eq!(f.namespace, "k8s.io");
        assert_eq!(f.address, "/run/containerd/containerd.sock");
        assert_eq!(f.publish_binary, "/usr/bin/containerd");
        assert_eq!(f.id, "abc");
        assert!(f.debug);
        assert_eq!(f.action.as_deref(), Some("start"));

        let f = Flags::parse(&args("--id=x -bundle /b delete")).unwrap();
        assert_eq!(f.id, "x");
        assert_eq!(f.bundle.as_deref(), Some(Path::new("/b")));
        assert_eq!(f.action.as_deref(), Some("delete"));
        assert!(!f.debug);
    }

    #[test]
    fn bad_command_lines_say_what_is_wrong() {
        let e = Flags::parse(&args("-id")).unwrap_err().to_string();
        assert!(e.contains("-id needs a value"), "{e}");
        let e = Flags::parse(&args("-frobnicate 1"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown flag -frobnicate"), "{e}");
        let e = Flags::parse(&args("start delete")).unwrap_err().to_string();
        assert!(e.contains("after the action"), "{e}");
    }

    #[test]
    fn one_socket_per_containerd_namespace_and_group() {
        let a = socket_path("/run/containerd/containerd.sock", "k8s.io", "pod1");
        assert_eq!(a.parent(), Some(Path::new(SOCKET_DIR)));
        assert_eq!(a.file_name().unwrap().len(), 64);
        assert_eq!(
            a,
            socket_path("/run/containerd/containerd.sock", "k8s.io", "pod1")
        );
        assert_ne!(
            a,
            socket_path("/run/containerd/containerd.sock", "k8s.io", "pod2")
        );
        assert_ne!(a, socket_path("/tmp/other.sock", "k8s.io", "pod1"));
        assert_ne!(
            a,
            socket_path("/run/containerd/containerd.sock", "default", "pod1")
        );
    }
}
