//! Least privilege for the sandbox process: defence in depth around wasmtime.
//!
//! A guest is confined by the engine: it reaches the host only through the WASI calls
//! the sandbox links, with the directories and network its container was granted. What
//! this module adds is for the day the engine has a bug and a guest gets to run host
//! code: that code should find a process that cannot become root on the node. Before
//! its first guest runs (while it is still the only thread), [`confine`]
//!
//! - optionally gives the process a mount namespace of its own, whose mounts receive
//!   the host's (`rslave`) and never propagate back;
//! - in a network namespace of the pod's own, lets the pod bind ports below 1024
//!   (`net.ipv4.ip_unprivileged_port_start=0`, as container runtimes do), since the
//!   capability that used to allow it is gone;
//! - sets `no_new_privs`, so nothing it could ever execute gains privileges;
//! - drops every capability from every set, the bounding set included (the process
//!   still runs as uid 0 and so owns the node's root-owned files it was handed: its
//!   log files, the compile cache, the pod's volumes);
//! - installs seccomp filters ([`filters`]): the system calls wasmtime, WASI, tokio and
//!   the C library need are allowed; a call that only a compromised process makes
//!   (creating a process, `execve`, `ptrace`, mounting, loading kernel modules or BPF,
//!   switching namespaces, …) kills the whole process; anything else fails with `EPERM`,
//!   so a workload that reaches an unusual corner gets an error rather than a crash.
//!
//! The node sees a killed sandbox as it sees any sandbox that ends: the connection
//! closes, the pod's containers are reported exited with the process's status
//! (`signal: 31 (SIGSYS)`), and the node and every other pod carry on.

use std::collections::BTreeMap;

use nix::libc;
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// What [`confine`] does beyond what it always does.
#[derive(Clone, Debug, Default)]
pub struct Confinement {
    /// A mount namespace of the sandbox's own.
    pub mount_namespace: bool,
    /// The process is in a network namespace of the pod's own (not the node's).
    pub own_network_namespace: bool,
    /// The user and groups to run as (the pod's `runAsUser`, `runAsGroup`,
    /// `fsGroup` and `supplementalGroups`).
    pub credentials: Credentials,
}

/// Whom the sandbox runs as. With nothing set it stays uid 0 (without capabilities)
/// and keeps the node's groups.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Credentials {
    pub uid: Option<u32>,
    /// The primary group; with a `uid` but no `gid`, group 0, as a container runtime
    /// runs an image whose user has no entry in its `/etc/passwd`.
    pub gid: Option<u32>,
    /// The supplementary groups (the node's are dropped once `uid` or `gid` is set).
    pub groups: Vec<u32>,
}

impl Credentials {
    fn any(&self) -> bool {
        self.uid.is_some() || self.gid.is_some() || !self.groups.is_empty()
    }

    /// The sandbox's arguments that ask for these credentials
    /// (`--user U --group G --groups A,B`).
    pub fn args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(uid) = self.uid {
            args.extend(["--user".to_owned(), uid.to_string()]);
        }
        if let Some(gid) = self.gid {
            args.extend(["--group".to_owned(), gid.to_string()]);
        }
        if !self.groups.is_empty() {
            let list: Vec<_> = self.groups.iter().map(u32::to_string).collect();
            args.extend(["--groups".to_owned(), list.join(",")]);
        }
        args
    }
}

/// Why the process could not be confined. The sandbox does not run unconfined: it
/// exits with this message, and the node reports the pod's sandbox as failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("a mount namespace of its own: {0}")]
    MountNamespace(nix::Error),
    #[error("no_new_privs: {0}")]
    NoNewPrivs(nix::Error),
    #[error("switching to {what}: {source}")]
    Credentials {
        what: &'static str,
        source: nix::Error,
    },
    #[error("dropping capabilities: {0}")]
    Capabilities(caps::errors::CapsError),
    #[error("building the seccomp filter: {0}")]
    Filter(seccompiler::BackendError),
    #[error("installing the seccomp filter: {0}")]
    Install(seccompiler::Error),
    #[error("seccomp filters are built for x86_64 and aarch64, not {0}")]
    Arch(&'static str),
}

/// Confines the calling process (see the module docs). Call it while the process has
/// one thread: the namespace change needs that, and every thread started afterwards
/// inherits the filters and the empty capability sets.
pub fn confine(how: &Confinement) -> Result<(), Error> {
    if how.mount_namespace {
        use nix::mount::{MsFlags, mount};
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).map_err(Error::MountNamespace)?;
        mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_REC | MsFlags::MS_SLAVE,
            None::<&str>,
        )
        .map_err(Error::MountNamespace)?;
    }
    if how.own_network_namespace {
        // The namespace is the pod's alone, so the setting is too. A kernel without the
        // knob (before 4.11) leaves low ports to root with the capability, which is gone.
        if let Err(e) = std::fs::write("/proc/sys/net/ipv4/ip_unprivileged_port_start", "0") {
            eprintln!("wasmlet sandbox: ports below 1024 stay closed to the pod: {e}");
        }
    }
    nix::sys::prctl::set_no_new_privs().map_err(Error::NoNewPrivs)?;
    // The bounding set first: clearing it needs CAP_SETPCAP, the last to go.
    for set in [
        caps::CapSet::Bounding,
        caps::CapSet::Ambient,
        caps::CapSet::Inheritable,
    ] {
        caps::clear(None, set).map_err(Error::Capabilities)?;
    }
    // Then the user (needing CAP_SETGID and CAP_SETUID, still effective): leaving uid
    // 0 for another clears the permitted and effective sets on its own.
    if how.credentials.any() {
        switch_user(&how.credentials)?;
    }
    for set in [caps::CapSet::Effective, caps::CapSet::Permitted] {
        caps::clear(None, set).map_err(Error::Capabilities)?;
    }
    for filter in filters(std::process::id())? {
        seccompiler::apply_filter(&filter).map_err(Error::Install)?;
    }
    Ok(())
}

/// Sets the supplementary groups, then the real, effective and saved group and user
/// ids. The raw calls switch the calling thread only, which is the process's one.
fn switch_user(to: &Credentials) -> Result<(), Error> {
    use nix::unistd::{Gid, Uid, setgroups, setresgid, setresuid};
    let groups: Vec<Gid> = to.groups.iter().copied().map(Gid::from_raw).collect();
    setgroups(&groups).map_err(|source| Error::Credentials {
        what: "supplementary groups",
        source,
    })?;
    let gid = Gid::from_raw(to.gid.unwrap_or(0));
    setresgid(gid, gid, gid).map_err(|source| Error::Credentials {
        what: "the group",
        source,
    })?;
    if let Some(uid) = to.uid {
        let uid = Uid::from_raw(uid);
        setresuid(uid, uid, uid).map_err(|source| Error::Credentials {
            what: "the user",
            source,
        })?;
    }
    Ok(())
}

/// `EPERM`, what a call outside the allowed set fails with.
const EPERM: u32 = libc::EPERM as u32;
/// `ENOSYS` for `clone3`: its flags are behind a pointer a filter cannot read, and the
/// C library falls back to `clone`, whose flags it can.
const ENOSYS: u32 = libc::ENOSYS as u32;

/// The three filters, in the order they are installed. For each call the kernel runs
/// them all and takes the strictest answer (a kill over an error over an allow), so
/// the order decides nothing but this: installing a filter is itself a call (`prctl`,
/// `seccomp`) the allowed set leaves out, so that set comes last.
///
/// 1. `clone3` answers `ENOSYS` (threads are then made with `clone`).
/// 2. Calls no confined sandbox makes kill the process, `clone` that would make a
///    process rather than a thread among them.
/// 3. Allowed calls (some only with certain arguments); everything else `EPERM`.
pub fn filters(own_pid: u32) -> Result<Vec<BpfProgram>, Error> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|_| Error::Arch(std::env::consts::ARCH))?;
    let build = |rules, mismatch, matched| -> Result<BpfProgram, Error> {
        SeccompFilter::new(rules, mismatch, matched, arch)
            .and_then(BpfProgram::try_from)
            .map_err(Error::Filter)
    };
    Ok(vec![
        build(
            BTreeMap::from([(libc::SYS_clone3, vec![])]),
            SeccompAction::Allow,
            SeccompAction::Errno(ENOSYS),
        )?,
        build(fatal()?, SeccompAction::Allow, SeccompAction::KillProcess)?,
        build(
            allowed(own_pid)?,
            SeccompAction::Errno(EPERM),
            SeccompAction::Allow,
        )?,
    ])
}

/// The low 32 bits of `arg` (an `int` or `unsigned int` argument) equal `value`.
fn arg_eq(arg: u8, value: u64) -> Result<SeccompCondition, Error> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, value)
        .map_err(Error::Filter)
}

/// The bits of `mask` in `arg` equal `value`.
fn arg_masked(arg: u8, mask: u64, value: u64) -> Result<SeccompCondition, Error> {
    SeccompCondition::new(
        arg,
        SeccompCmpArgLen::Qword,
        SeccompCmpOp::MaskedEq(mask),
        value,
    )
    .map_err(Error::Filter)
}

/// One rule per value: the call is matched when `arg` (32 bits) is any of `values`.
fn any_of(arg: u8, values: &[u64]) -> Result<Vec<SeccompRule>, Error> {
    values
        .iter()
        .map(|v| SeccompRule::new(vec![arg_eq(arg, *v)?]).map_err(Error::Filter))
        .collect()
}

const CLONE_THREAD: u64 = libc::CLONE_THREAD as u64;

/// What the sandbox may call: file and socket I/O on what it holds, memory management
/// (wasmtime maps, protects and remaps guest memories and code), threads, time,
/// randomness and signals to itself.
fn allowed(own_pid: u32) -> Result<BTreeMap<i64, Vec<SeccompRule>>, Error> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for nr in UNCONDITIONAL {
        rules.insert(*nr, vec![]);
    }
    #[cfg(target_arch = "x86_64")]
    for nr in UNCONDITIONAL_X86_64 {
        rules.insert(*nr, vec![]);
    }
    // Threads, never processes.
    rules.insert(
        libc::SYS_clone,
        vec![
            SeccompRule::new(vec![arg_masked(0, CLONE_THREAD, CLONE_THREAD)?])
                .map_err(Error::Filter)?,
        ],
    );
    // Signals to itself only (abort, a thread waking another).
    let pid = u64::from(own_pid);
    rules.insert(libc::SYS_kill, any_of(0, &[pid])?);
    rules.insert(libc::SYS_tgkill, any_of(0, &[pid])?);
    // Its own limits, read or lowered.
    rules.insert(libc::SYS_prlimit64, any_of(0, &[0, pid])?);
    // The sockets WASI and the sandbox's own control sockets use; netlink for the C
    // library's address lookups.
    rules.insert(
        libc::SYS_socket,
        any_of(
            0,
            &[
                libc::AF_UNIX as u64,
                libc::AF_INET as u64,
                libc::AF_INET6 as u64,
                libc::AF_NETLINK as u64,
            ],
        )?,
    );
    // Thread names and the C library's own probes.
    rules.insert(
        libc::SYS_prctl,
        any_of(
            0,
            &[
                libc::PR_SET_NAME as u64,
                libc::PR_GET_NAME as u64,
                libc::PR_GET_DUMPABLE as u64,
                libc::PR_GET_NO_NEW_PRIVS as u64,
                libc::PR_GET_SECCOMP as u64,
                // PR_SET_VMA: the C library names its anonymous mappings.
                0x5356_4d41,
            ],
        )?,
    );
    // The terminal and non-blocking queries of the standard library and tokio.
    rules.insert(
        libc::SYS_ioctl,
        any_of(
            1,
            &[
                libc::FIONBIO,
                libc::FIOCLEX,
                libc::FIONCLEX,
                libc::FIONREAD,
                libc::TCGETS,
                libc::TIOCGWINSZ,
            ],
        )?,
    );
    Ok(rules)
}

/// Calls the sandbox makes with any arguments.
const UNCONDITIONAL: &[i64] = &[
    // Files and descriptors.
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_preadv,
    libc::SYS_pwritev,
    libc::SYS_preadv2,
    libc::SYS_pwritev2,
    libc::SYS_openat,
    libc::SYS_openat2,
    libc::SYS_close,
    libc::SYS_close_range,
    libc::SYS_fstat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    libc::SYS_statfs,
    libc::SYS_fstatfs,
    libc::SYS_lseek,
    libc::SYS_getdents64,
    libc::SYS_fcntl,
    libc::SYS_flock,
    libc::SYS_dup,
    libc::SYS_dup3,
    libc::SYS_pipe2,
    libc::SYS_ftruncate,
    libc::SYS_fallocate,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_sync_file_range,
    libc::SYS_fadvise64,
    libc::SYS_readahead,
    libc::SYS_copy_file_range,
    libc::SYS_sendfile,
    libc::SYS_splice,
    libc::SYS_mkdirat,
    libc::SYS_unlinkat,
    libc::SYS_renameat,
    libc::SYS_renameat2,
    libc::SYS_linkat,
    libc::SYS_symlinkat,
    libc::SYS_readlinkat,
    libc::SYS_fchmod,
    libc::SYS_fchmodat,
    libc::SYS_utimensat,
    libc::SYS_faccessat,
    libc::SYS_faccessat2,
    libc::SYS_truncate,
    libc::SYS_getcwd,
    libc::SYS_chdir,
    libc::SYS_fchdir,
    libc::SYS_umask,
    libc::SYS_memfd_create,
    libc::SYS_eventfd2,
    libc::SYS_timerfd_create,
    libc::SYS_timerfd_settime,
    libc::SYS_timerfd_gettime,
    // Waiting.
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
    libc::SYS_ppoll,
    libc::SYS_pselect6,
    libc::SYS_futex,
    libc::SYS_nanosleep,
    libc::SYS_clock_nanosleep,
    libc::SYS_sched_yield,
    // Sockets (created by the rule on `socket` only).
    libc::SYS_socketpair,
    libc::SYS_bind,
    libc::SYS_listen,
    libc::SYS_accept,
    libc::SYS_accept4,
    libc::SYS_connect,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_getsockopt,
    libc::SYS_setsockopt,
    libc::SYS_sendto,
    libc::SYS_recvfrom,
    libc::SYS_sendmsg,
    libc::SYS_recvmsg,
    libc::SYS_sendmmsg,
    libc::SYS_recvmmsg,
    libc::SYS_shutdown,
    // Memory: guest memories, compiled code, the allocator.
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mprotect,
    libc::SYS_mremap,
    libc::SYS_madvise,
    libc::SYS_brk,
    libc::SYS_msync,
    libc::SYS_mincore,
    libc::SYS_membarrier,
    // Threads and signals.
    libc::SYS_set_robust_list,
    libc::SYS_get_robust_list,
    libc::SYS_rseq,
    libc::SYS_set_tid_address,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_sigaltstack,
    libc::SYS_restart_syscall,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_sched_getaffinity,
    libc::SYS_getcpu,
    // Who and where it is, and the time.
    libc::SYS_getpid,
    libc::SYS_gettid,
    libc::SYS_getppid,
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
    libc::SYS_getresuid,
    libc::SYS_getresgid,
    libc::SYS_getgroups,
    libc::SYS_capget,
    libc::SYS_uname,
    libc::SYS_sysinfo,
    libc::SYS_getrusage,
    libc::SYS_getrlimit,
    libc::SYS_clock_gettime,
    libc::SYS_clock_getres,
    libc::SYS_gettimeofday,
    libc::SYS_getrandom,
    // Let through to be answered `ENOSYS` by the first filter.
    libc::SYS_clone3,
];

/// The x86_64 calls older code still makes under their first names.
#[cfg(target_arch = "x86_64")]
const UNCONDITIONAL_X86_64: &[i64] = &[
    libc::SYS_open,
    libc::SYS_stat,
    libc::SYS_lstat,
    libc::SYS_access,
    libc::SYS_pipe,
    libc::SYS_dup2,
    libc::SYS_poll,
    libc::SYS_select,
    libc::SYS_mkdir,
    libc::SYS_rmdir,
    libc::SYS_unlink,
    libc::SYS_rename,
    libc::SYS_link,
    libc::SYS_symlink,
    libc::SYS_readlink,
    libc::SYS_chmod,
    libc::SYS_getdents,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_create,
    libc::SYS_eventfd,
    libc::SYS_time,
    libc::SYS_arch_prctl,
];

/// Calls that end the process: the ways out of a sandbox (new programs and
/// processes, other processes' memory, namespaces, mounts, the kernel's own code and
/// state). `clone` is among them when it would make a process, not a thread.
fn fatal() -> Result<BTreeMap<i64, Vec<SeccompRule>>, Error> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = FATAL.iter().map(|nr| (*nr, vec![])).collect();
    #[cfg(target_arch = "x86_64")]
    for nr in FATAL_X86_64 {
        rules.insert(*nr, vec![]);
    }
    rules.insert(
        libc::SYS_clone,
        vec![SeccompRule::new(vec![arg_masked(0, CLONE_THREAD, 0)?]).map_err(Error::Filter)?],
    );
    Ok(rules)
}

const FATAL: &[i64] = &[
    libc::SYS_execve,
    libc::SYS_execveat,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_process_madvise,
    libc::SYS_pidfd_getfd,
    libc::SYS_kcmp,
    libc::SYS_setns,
    libc::SYS_unshare,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_mount_setattr,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_syslog,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_sethostname,
    libc::SYS_setdomainname,
    libc::SYS_capset,
    libc::SYS_setuid,
    libc::SYS_setgid,
    libc::SYS_setreuid,
    libc::SYS_setregid,
    libc::SYS_setresuid,
    libc::SYS_setresgid,
    libc::SYS_setfsuid,
    libc::SYS_setfsgid,
    libc::SYS_setgroups,
    libc::SYS_personality,
];

#[cfg(target_arch = "x86_64")]
const FATAL_X86_64: &[i64] = &[
    libc::SYS_fork,
    libc::SYS_vfork,
    libc::SYS_iopl,
    libc::SYS_ioperm,
    libc::SYS_uselib,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filters_build_for_this_machine() {
        let filters = filters(4242).expect("filters build");
        assert_eq!(filters.len(), 3);
        assert!(filters.iter().all(|f| !f.is_empty()));
    }

    #[test]
    fn no_call_is_both_allowed_unconditionally_and_fatal() {
        let allowed = allowed(1).unwrap();
        for (nr, conditions) in fatal().unwrap() {
            if let Some(allowed_if) = allowed.get(&nr) {
                // Only a call with conditions on both sides (clone: thread or process)
                // may be in both.
                assert!(
                    !conditions.is_empty() && !allowed_if.is_empty(),
                    "syscall {nr} is both allowed and fatal"
                );
            }
        }
    }
}
