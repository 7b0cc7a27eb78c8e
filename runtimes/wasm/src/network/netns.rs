//! Named network namespaces, as `ip netns add` and containerd make them: a file
//! bind-mounted over a thread's `/proc/thread-self/ns/net` after that thread unshared
//! its network namespace, so the namespace lives while the mount does.

use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;

/// Creates a new network namespace held by the file `path` (which must not exist).
pub fn create(path: &Path) -> io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?;
    let target = path.to_owned();
    // A thread of its own: unshare moves only the calling thread, which then ends.
    let made = std::thread::spawn(move || -> io::Result<()> {
        nix::sched::unshare(CloneFlags::CLONE_NEWNET)?;
        nix::mount::mount(
            Some("/proc/thread-self/ns/net"),
            &target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )?;
        Ok(())
    })
    .join()
    .unwrap_or_else(|_| Err(io::Error::other("the namespace thread panicked")));
    if let Err(e) = made {
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(())
}

/// Releases the namespace held by `path` and removes the file. Nothing there, or a
/// file no longer mounted, is not an error.
pub fn remove(path: &Path) -> io::Result<()> {
    match nix::mount::umount2(path, MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => {}
        Err(e) => return Err(e.into()),
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Moves the calling thread into the namespace `path` holds. A process that calls this
/// before it starts any other thread has every later thread there too.
pub fn enter(path: &Path) -> io::Result<()> {
    let ns = std::fs::File::open(path)?;
    nix::sched::setns(ns.as_fd(), CloneFlags::CLONE_NEWNET)?;
    Ok(())
}

/// Whether `path` holds a network namespace (is a mounted nsfs file).
pub fn is_namespace(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::NSFS_MAGIC)
}

/// A TCP connection to `addr` made from inside the namespace `path` holds (so
/// `127.0.0.1` is the pod's loopback), on a thread of its own that ends after.
pub async fn connect(
    path: &Path,
    addr: std::net::SocketAddr,
    timeout: Duration,
) -> io::Result<tokio::net::TcpStream> {
    let path: PathBuf = path.to_owned();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let connected =
            enter(&path).and_then(|()| std::net::TcpStream::connect_timeout(&addr, timeout));
        let _ = tx.send(connected);
    });
    let stream = rx
        .await
        .unwrap_or_else(|_| Err(io::Error::other("the connecting thread ended")))?;
    stream.set_nonblocking(true)?;
    tokio::net::TcpStream::from_std(stream)
}
