//! The system call the node makes in a sandbox process between `fork` and `exec`: the
//! second place this crate uses `unsafe` (the first is [`crate::precompiled`]).
#![allow(unsafe_code)] // reason: `Command::pre_exec` is unsafe; see the SAFETY note below.

use std::os::fd::OwnedFd;

use tokio::process::Command;

/// Makes the child of `cmd` write `bytes` to each of `fds`, in order, after `fork` and
/// before `exec`; a failed write fails the spawn with that write's error (`spawn`
/// returns it, and no program is run). The fds are owned by the hook and closed when
/// `cmd` is dropped; open them close-on-exec (as `std::fs` does) so the program never
/// inherits them.
pub(crate) fn write_before_exec(cmd: &mut Command, fds: Vec<OwnedFd>, bytes: &'static [u8]) {
    let hook = move || -> std::io::Result<()> {
        for fd in &fds {
            nix::unistd::write(fd, bytes)?;
        }
        Ok(())
    };
    // SAFETY: the hook runs in the forked child, where only async-signal-safe calls are
    // allowed. It makes only write(2) calls, on descriptors it owns (so they cannot be
    // closed and reused behind its back), from a buffer with a static lifetime; iterating
    // a `Vec` built before the fork does not allocate, and an error is an `Errno`
    // converted into an `io::Error` without allocating. It takes no locks.
    unsafe {
        cmd.pre_exec(hook);
    }
}
