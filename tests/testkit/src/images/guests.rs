//! Building the guest workspace `examples/workloads` for `wasm32-wasip1`.
//!
//! rustup cannot add wasm32 targets on these machines, so the guests are
//! built with Debian's toolchain (DESIGN.md, "Building Wasm guests"):
//! `/usr/bin/cargo` and `/usr/bin/rustc` with `RUSTC_BOOTSTRAP=1` and
//! `-Zbuild-std`, linked by `wasm-ld-19` against wasi-libc's `crt1-command.o`.
//! A rustup toolchain that already has the `wasm32-wasip1` target is used
//! only when the Debian packages are missing. The guests' crates.io
//! dependencies are fetched first (a no-op, and no network, once they are in
//! cargo's cache); the build itself runs offline.

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
const KEPT_ENV: &[&str] = &["PATH", "HOME", "TMPDIR", "CARGO_HOME", "LANG", "LC_ALL"];

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

    /// `cargo fetch`: downloads the guests' crates.io dependencies (the `wasi`
    /// bindings) that are not in the local cache yet; without network access it
    /// succeeds as long as they are.
    fn fetch_command(&self, workloads: &Path) -> Command {
        let mut cmd = self.cargo(workloads);
        cmd.arg("fetch")
            .arg("--locked")
            .arg("--target")
            .arg(GUEST_TARGET);
        cmd
    }

    /// The `cargo build` command, offline: [`Self::fetch_command`] ran first.
    fn build_command(&self, workloads: &Path) -> Command {
        let mut cmd = self.cargo(workloads);
        cmd.arg("build")
            .arg("--release")
            .arg("--offline")
            .arg("--target")
            .arg(GUEST_TARGET);
        if *self == GuestToolchain::Debian {
            cmd.arg("-Zbuild-std=std,panic_abort");
        }
        cmd
    }

    /// This toolchain's cargo in `workloads`, with a scrubbed environment.
    fn cargo(&self, workloads: &Path) -> Command {
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
        match self {
            GuestToolchain::Debian => {
                cmd.env("RUSTC", DEBIAN_RUSTC)
                    .env("RUSTC_BOOTSTRAP", "1")
                    .env("CARGO_TARGET_WASM32_WASIP1_LINKER", WASM_LD)
                    .env(
                        "CARGO_TARGET_WASM32_WASIP1_RUSTFLAGS",
                        format!(
                            "-C link-self-contained=no -L {WASI_LIBC} -C link-arg={CRT1_COMMAND}"
                        ),
                    )
                    .env("CARGO_TARGET_DIR", workloads.join("target"));
            }
            GuestToolchain::Rustup { rustc, .. } => {
                cmd.env("RUSTC", rustc)
                    .env("CARGO_TARGET_DIR", workloads.join("target").join("rustup"));
            }
        }
        cmd.current_dir(workloads);
        // A wrapper or target dir from a parent .cargo/config.toml must not apply.
        cmd.env("RUSTC_WRAPPER", "")
            .env("RUSTC_WORKSPACE_WRAPPER", "")
            .env("CARGO_TERM_COLOR", "never");
        cmd
    }

    /// Where this toolchain's release `.wasm` files land.
    fn output_dir(&self, workloads: &Path) -> PathBuf {
        let target = match self {
            GuestToolchain::Debian => workloads.join("target"),
            GuestToolchain::Rustup { .. } => workloads.join("target").join("rustup"),
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
    let workloads = workspace_root.join("examples").join("workloads");
    if !workloads.join("Cargo.toml").is_file() {
        bail!("no guest workspace at {}", workloads.display());
    }
    let toolchain = GuestToolchain::detect()?;
    for (step, mut cmd) in [
        ("fetching dependencies", toolchain.fetch_command(&workloads)),
        ("build", toolchain.build_command(&workloads)),
    ] {
        let output = cmd.output().with_context(|| {
            format!("running {:?} in {}", cmd.get_program(), workloads.display())
        })?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let tail: Vec<&str> = stderr.lines().rev().take(40).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!(
                "guest {step} ({toolchain:?}) failed with {} in {}:\n{}",
                output.status,
                workloads.display(),
                tail.join("\n")
            );
        }
    }
    Ok(toolchain.output_dir(&workloads))
}
