//! `graceful`: a guest that handles wasmlet's cooperative stop signal
//! (`wasmlet:lifecycle/stop`, see `runtimes/wasm/wit/lifecycle.wit`), the Wasm
//! equivalent of a process with a SIGTERM handler.
//!
//! It prints `working N` every `INTERVAL_MS` milliseconds (default 100). Once the
//! node asks it to stop it prints `stop requested`, spends `CLEANUP_MS` (default 0)
//! "cleaning up", prints `clean exit` and exits with `EXIT_CODE` (default 0). A
//! cleanup longer than the grace period is cut short by the node (exit code 137).
//!
//! With `check` as its first argument (an exec runs the container's own program
//! again) it prints `ok` and exits with `CHECK_EXIT` (default 0), as an exec probe
//! would, without looking at the stop signal.
//!
//! It imports a wasmlet-only function, so other runtimes refuse to link it.

use std::io::Write;
use std::time::Duration;

#[link(wasm_import_module = "wasmlet:lifecycle/stop@0.1.0")]
unsafe extern "C" {
    #[link_name = "requested"]
    fn stop_requested() -> i32;
}

fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(raw) => raw.trim().parse().unwrap_or_else(|_| {
            eprintln!("ignoring {name}={raw:?}: not a non-negative integer");
            default
        }),
        Err(_) => default,
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("check") {
        say("ok");
        std::process::exit(env_number("CHECK_EXIT", 0) as i32);
    }
    let interval = Duration::from_millis(env_number("INTERVAL_MS", 100));
    let cleanup = Duration::from_millis(env_number("CLEANUP_MS", 0));
    let code = env_number("EXIT_CODE", 0) as i32;
    let mut n: u64 = 0;
    // SAFETY: the import takes nothing and returns 0 or 1; the host provides it.
    while unsafe { stop_requested() } == 0 {
        n += 1;
        say(&format!("working {n}"));
        std::thread::sleep(interval);
    }
    say("stop requested");
    std::thread::sleep(cleanup);
    say("clean exit");
    std::process::exit(code);
}
