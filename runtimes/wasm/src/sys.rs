//! The system call the node makes in a sandbox process between `fork` and `exec`, and
//! the sandbox's fault-injection call: one of the three places this crate uses `unsafe`
//! (the others are [`crate::precompiled`] and [`crate::sandbox::zygote`]).
#![allow(unsafe_code)] // reason: `Command::pre_exec` and `syscall` are unsafe; see the SAFETY notes.

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

/// Makes system call `number` with every argument zero; its result, or `-errno`. Only
/// the sandbox's debug-build fault injection calls it (see
/// [`crate::sandbox::FAULT_INTERFACE`]).
pub(crate) fn raw_syscall(number: i64) -> i64 {
    // SAFETY: no pointer the call could write through is passed (every argument is
    // zero, which the kernel reads as NULL or 0), so it cannot corrupt this process's
    // memory through its arguments. What the call itself does to the process is the
    // point of a fault-injection test, and the seccomp filters decide it; this is
    // linked only in debug builds, on request.
    let ret = unsafe { nix::libc::syscall(number, 0, 0, 0, 0, 0, 0) };
    if ret == -1 {
        -i64::from(nix::errno::Errno::last_raw())
    } else {
        ret
    }
}
