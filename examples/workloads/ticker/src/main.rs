//! `ticker`: prints `tick N` (N from 1) every `INTERVAL_MS` milliseconds
//! (default 1000), flushing each line. With `TICKS=N` it stops after N ticks
//! and exits 0; otherwise it runs until killed.
//!
//! Its first argument makes it answer an exec (an exec runs the container's own
//! program again): `check` prints `ok` and exits with `CHECK_EXIT` (default 0), as
//! an exec probe would; `hang` sleeps forever, for exec timeouts; `cat` answers
//! each line of stdin with `got: LINE` on stdout and `err: LINE` on stderr as it
//! comes, then `eof` at its end, and exits with `CAT_EXIT` (default 0) — for
//! interactive execs and for attaching to a container that reads its stdin.

use std::io::Write;
use std::time::Duration;

fn env_number(name: &str) -> Option<u64> {
    let raw = std::env::var(name).ok()?;
    match raw.trim().parse() {
        Ok(n) => Some(n),
        Err(_) => {
            eprintln!("ignoring {name}={raw:?}: not a non-negative integer");
            None
        }
    }
}

fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("check") => {
            println!("ok");
            std::process::exit(env_number("CHECK_EXIT").unwrap_or(0) as i32);
        }
        Some("cat") => {
            for line in std::io::stdin().lines() {
                let Ok(line) = line else { break };
                println!("got: {line}");
                eprintln!("err: {line}");
            }
            println!("eof");
            std::process::exit(env_number("CAT_EXIT").unwrap_or(0) as i32);
        }
        Some("hang") => loop {
            std::thread::sleep(Duration::from_secs(3600));
        },
        _ => {}
    }
    let ticks = env_number("TICKS");
    let interval = Duration::from_millis(env_number("INTERVAL_MS").unwrap_or(1000));
    let stdout = std::io::stdout();
    let mut n: u64 = 0;
    loop {
        if ticks.is_some_and(|max| n >= max) {
            return;
        }
        n += 1;
        let mut out = stdout.lock();
        let _ = writeln!(out, "tick {n}");
        let _ = out.flush();
        drop(out);
        std::thread::sleep(interval);
    }
}
