//! Building the guest workspaces (`examples/workloads`, `examples/plugins`)
//! for `wasm32-wasip1`.
//!
//! rustup cannot add wasm32 targets on these machines, so the guests are
//! built with Debian's toolchain (DESIGN.md, "Building Wasm guests"):
//! `/usr/bin/cargo` and `/usr/bin/rustc` with `RUSTC_BOOTSTRAP=1` and
//! `-Zbuild-std`, linked by `wasm-ld-19` against wasi-libc; a workload (a
//! command) also links wasi-libc's `crt1-command.o`, see [`GuestLink`].
//! A rustup toolchain that already has the `wasm32-wasip1` target is used
//! only when the Debian packages are missing.
//!
//! Everything a guest build compiles is fetched first: the guests' crates.io
//! dependencies and, with `-Zbuild-std`, the standard library's own (`cfg-if`,
//! `hashbrown`, `libc`, ...); the build itself then runs offline. The guests use a
//! cargo home of their own, `target/guest-cargo-home` in the host workspace
//! (`WASMLET_GUEST_CARGO_HOME` overrides it), so a clean checkout starts with an
//! empty one and every download the build needs is made by the build itself, not
//! found in a cache left by earlier work.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// The guest target triple.
pub const GUEST_TARGET: &str = "wasm32-wasip1";

const DEBIAN_CARGO: &str = "/usr/bin/cargo";
const DEBIAN_RUSTC: &str = "/usr/bin/rustc";
const DEBIAN_STD_SRC: &str = "/usr/lib/rustlib/src/rust/library/std";
const WASM_LD: &str = "/usr/bin/wasm-ld-19";
const WASI_LIBC: &str = "/usr/lib/wasm32-wasi";
const CRT1_COMMAND: &str = "/usr/lib/wasm32-wasi/crt1-command.o";

/// How a guest workspace's crates are linked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestLink {
    /// Programs (`[[bin]]`, `examples/workloads`): wasi-libc's `crt1-command.o`
    /// supplies `_start`, which runs the constructors, `main` and the destructors.
    Command,
    /// Libraries (`cdylib`, `examples/plugins`): no start-up object, as rustc's
    /// own `wasm32-wasip1` target links a cdylib. `crt1-command.o` would demand a
    /// `main`; `crt1-reactor.o` would export `_initialize`, which runs the
    /// constructors a second time after wit-bindgen's exports already run them
    /// once, on the first call (`run_ctors_once`).
    Library,
}

impl GuestLink {
    /// The start-up object the Debian route passes to wasm-ld, if any.
    fn crt1(self) -> Option<&'static str> {
        match self {
            GuestLink::Command => Some(CRT1_COMMAND),
            GuestLink::Library => None,
        }
    }
}

/// Files of the Debian route and the package that installs each.
const DEBIAN_PARTS: &[(&str, &str)] = &[
    (DEBIAN_RUSTC, "rustc-web"),
    (DEBIAN_CARGO, "cargo-web"),
    (DEBIAN_STD_SRC, "rust-web-src"),
    (WASM_LD, "lld-19"),
    (CRT1_COMMAND, "wasi-libc"),
];

/// Variables the guest build keeps from the caller's environment; everything
/// else (`CARGO_*`, `RUSTUP_TOOLCHAIN`, `RUSTFLAGS`, `RUSTC_WRAPPER`, ... set
/// by an outer `cargo test` or `cargo run`) is dropped so the outer rustup
/// toolchain cannot leak into the guest build.
/// `CARGO_HOME` is not kept: see [`guest_cargo_home`].
const KEPT_ENV: &[&str] = &["PATH", "HOME", "TMPDIR", "LANG", "LC_ALL"];

/// The variable that names the guests' cargo home instead of the default.
pub const GUEST_CARGO_HOME_ENV: &str = "WASMLET_GUEST_CARGO_HOME";

/// The cargo home of every guest build: `$WASMLET_GUEST_CARGO_HOME`, else
/// `<host workspace>/target/guest-cargo-home`.
pub fn guest_cargo_home() -> anyhow::Result<PathBuf> {
    if let Some(home) = std::env::var_os(GUEST_CARGO_HOME_ENV).filter(|h| !h.is_empty()) {
        return Ok(PathBuf::from(home));
    }
    Ok(super::workspace_root()?
        .join("target")
        .join("guest-cargo-home"))
}

/// The standard library crates `-Zbuild-std` builds for the guests.
const BUILD_STD: &str = "-Zbuild-std=std,panic_abort";

/// Which compiler builds the guests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuestToolchain {
    /// Debian's `rustc-web` + `-Zbuild-std` + `wasm-ld-19` + wasi-libc.
    Debian,
    /// A rustup toolchain whose sysroot has the `wasm32-wasip1` std.
    Rustup {
        /// `<sysroot>/bin/cargo`.
        cargo: PathBuf,
        /// `<sysroot>/bin/rustc`.
        rustc: PathBuf,
    },
}

impl GuestToolchain {
    /// The Debian toolchain when all its packages are installed, else a
    /// rustup toolchain with the target, else an error naming the missing
    /// Debian packages.
    pub fn detect() -> anyhow::Result<Self> {
        let missing: Vec<_> = DEBIAN_PARTS
            .iter()
            .filter(|(path, _)| !Path::new(path).exists())
            .collect();
        if missing.is_empty() {
            return Ok(GuestToolchain::Debian);
        }
        if let Some(rustup) = rustup_with_target() {
            return Ok(rustup);
        }
        let list: Vec<String> = missing
            .iter()
            .map(|(path, package)| format!("{path} (Debian package `{package}`)"))
            .collect();
        let packages: Vec<&str> = missing.iter().map(|(_, package)| *package).collect();
        bail!(
            "cannot build the Wasm guests: missing {}; install with `apt-get install {}` \
             (or add rustup's {GUEST_TARGET} target)",
            list.join(", "),
            packages.join(" ")
        )
    }

    /// `cargo fetch`: downloads what the build compiles and the guest cargo home
    /// lacks: the guests' crates.io dependencies (the `wasi` bindings) and, for
    /// `-Zbuild-std`, the standard library's. Without network access it succeeds
    /// as long as they are all there.
    fn fetch_command(&self, workspace: &Path, link: GuestLink, home: &Path) -> Command {
        let mut cmd = self.cargo(workspace, link, home);
        cmd.arg("fetch")
            .arg("--locked")
            .arg("--target")
            .arg(GUEST_TARGET);
        if *self == GuestToolchain::Debian {
            cmd.arg(BUILD_STD);
        }
        cmd
    }

    /// The `cargo build` command, offline: [`Self::fetch_command`] ran first.
    fn build_command(&self, workspace: &Path, link: GuestLink, home: &Path) -> Command {
        let mut cmd = self.cargo(workspace, link, home);
        cmd.arg("build")
            .arg("--release")
            .arg("--offline")
            .arg("--target")
            .arg(GUEST_TARGET);
        if *self == GuestToolchain::Debian {
            cmd.arg(BUILD_STD);
        }
        cmd
    }

    /// This toolchain's cargo in `workspace` with the cargo home `home`, with a
    /// scrubbed environment.
    fn cargo(&self, workspace: &Path, link: GuestLink, home: &Path) -> Command {
        let mut cmd = Command::new(match self {
            GuestToolchain::Debian => Path::new(DEBIAN_CARGO),
            GuestToolchain::Rustup { cargo, .. } => cargo.as_path(),
        });
        cmd.env_clear();
        for key in KEPT_ENV {
            if let Some(value) = std::env::var_os(key) {
                cmd.env(key, value);
            }
        }
        cmd.env("CARGO_HOME", home);
        match self {
            GuestToolchain::Debian => {
                let mut rustflags = format!("-C link-self-contained=no -L {WASI_LIBC}");
                if let Some(crt1) = link.crt1() {
                    rustflags.push_str(&format!(" -C link-arg={crt1}"));
                }
                cmd.env("RUSTC", DEBIAN_RUSTC)
                    .env("RUSTC_BOOTSTRAP", "1")
                    .env("CARGO_TARGET_WASM32_WASIP1_LINKER", WASM_LD)
                    .env("CARGO_TARGET_WASM32_WASIP1_RUSTFLAGS", rustflags)
                    .env("CARGO_TARGET_DIR", workspace.join("target"));
            }
            GuestToolchain::Rustup { rustc, .. } => {
                // rustc's own target picks the start-up object per crate type.
                cmd.env("RUSTC", rustc)
                    .env("CARGO_TARGET_DIR", workspace.join("target").join("rustup"));
            }
        }
        cmd.current_dir(workspace);
        // A wrapper or target dir from a parent .cargo/config.toml must not apply.
        cmd.env("RUSTC_WRAPPER", "")
            .env("RUSTC_WORKSPACE_WRAPPER", "")
            .env("CARGO_TERM_COLOR", "never");
        cmd
    }

    /// Where this toolchain's release `.wasm` files land.
    fn output_dir(&self, workspace: &Path) -> PathBuf {
        let target = match self {
            GuestToolchain::Debian => workspace.join("target"),
            GuestToolchain::Rustup { .. } => workspace.join("target").join("rustup"),
        };
        target.join(GUEST_TARGET).join("release")
    }
}

/// A rustup toolchain (the one `rustc` on PATH resolves to) that has the
/// `wasm32-wasip1` standard library installed.
fn rustup_with_target() -> Option<GuestToolchain> {
    let out = Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let sysroot = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    if sysroot == Path::new("/usr") {
        return None; // Debian's own rustc, without build-std parts.
    }
    let has_target = sysroot
        .join("lib/rustlib")
        .join(GUEST_TARGET)
        .join("lib")
        .is_dir();
    let cargo = sysroot.join("bin/cargo");
    let rustc = sysroot.join("bin/rustc");
    (has_target && cargo.is_file() && rustc.is_file())
        .then_some(GuestToolchain::Rustup { cargo, rustc })
}

/// Build every crate of `<workspace_root>/examples/workloads` for
/// `wasm32-wasip1` in release mode and return the directory holding the
/// `.wasm` files. Incremental: quick when nothing changed.
pub fn build_guests(workspace_root: &Path) -> anyhow::Result<PathBuf> {
    build_guest_workspace(
        &workspace_root.join("examples").join("workloads"),
        GuestLink::Command,
    )
}

/// Build every crate of the guest workspace `workspace` (a directory with its
/// own `Cargo.toml` and `Cargo.lock`) for `wasm32-wasip1` in release mode,
/// linked as `link` says, and return the directory holding the `.wasm` files:
/// `<workspace>/target/wasm32-wasip1/release` (under `target/rustup` when a
/// rustup toolchain builds). Dependencies are fetched with `--locked`, then
/// the build runs `--offline`. Incremental: quick when nothing changed.
pub fn build_guest_workspace(workspace: &Path, link: GuestLink) -> anyhow::Result<PathBuf> {
    if !workspace.join("Cargo.toml").is_file() {
        bail!("no guest workspace at {}", workspace.display());
    }
    let toolchain = GuestToolchain::detect()?;
    let home = guest_cargo_home()?;
    std::fs::create_dir_all(&home).with_context(|| format!("creating {}", home.display()))?;

    // The fetch shows what it downloads (cargo prints `Downloaded <crate>` on stderr).
    let mut fetch = toolchain.fetch_command(workspace, link, &home);
    let status = fetch.status().with_context(|| {
        format!(
            "running {:?} in {}",
            fetch.get_program(),
            workspace.display()
        )
    })?;
    if !status.success() {
        bail!(
            "fetching the guests' dependencies ({toolchain:?}, cargo home {}) failed with {status} in {}",
            home.display(),
            workspace.display()
        );
    }

    let mut build = toolchain.build_command(workspace, link, &home);
    let output = build.output().with_context(|| {
        format!(
            "running {:?} in {}",
            build.get_program(),
            workspace.display()
        )
    })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(40).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!(
            "guest build ({toolchain:?}) failed with {} in {}:\n{}",
            output.status,
            workspace.display(),
            tail.join("\n")
        );
    }
    Ok(toolchain.output_dir(workspace))
}
