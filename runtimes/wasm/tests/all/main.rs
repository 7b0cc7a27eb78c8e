//! Integration tests of the Wasm runtime against real guests.
//!
//! One test binary with a module per topic, so the link step is paid once:
//! [`images`] (the image store), [`lifecycle`] (running the example guests),
//! [`limits`] (memory limits, a sandbox dying), [`errors`] (missing images),
//! [`exec`] (exec in running containers), [`adoption`] (a new node adopting sandboxes),
//! [`cgroups`] (the sandbox in its pod cgroup, its `oom_score_adj`), [`confinement`]
//! (the sandbox's capabilities, `no_new_privs`, seccomp, mount namespace), [`logs`] (log
//! rotation: a container's log reopened at its path), [`stdio`] (interactive execs and
//! attaching to a container's stdio), [`registry`] (pulls from a loopback registry),
//! [`zygote`] (sandboxes forked from a zygote).
//! [`fixture`] holds the shared setup: a runtime in a tempdir, a pod, and waits
//! that end on an event or a deadline.

mod adoption;
mod cgroups;
mod confinement;
mod errors;
mod exec;
mod fixture;
mod http;
mod images;
mod lifecycle;
mod limits;
mod logs;
mod network;
mod pod_network;
mod registry;
mod stdio;
mod zygote;
