//! `hello`: reports what the runtime handed it, then exits with a chosen code.
//!
//! stdout gets one line per argument (`arg[i]=...`), one per environment
//! variable sorted by key (`env KEY=VALUE`) and the working directory
//! (`cwd=...`) when WASI exposes one; stderr gets `hello on stderr`. With
//! `WRITE_FILE=path` it writes `FILE_TEXT` (default `hello`) and a newline to
//! that file; with `READ_FILE=path` it prints `read <path>: <content>` (a file
//! it cannot read is exit code 1). The exit code is otherwise the value of
//! `EXIT_CODE` (default 0).

use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for (i, arg) in std::env::args_os().enumerate() {
        let _ = writeln!(out, "arg[{i}]={}", arg.to_string_lossy());
    }
    let mut vars: Vec<(String, String)> = std::env::vars_os()
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            )
        })
        .collect();
    vars.sort();
    for (key, value) in &vars {
        let _ = writeln!(out, "env {key}={value}");
    }
    if let Ok(cwd) = std::env::current_dir() {
        let _ = writeln!(out, "cwd={}", cwd.display());
    }
    let _ = out.flush();
    drop(out);

    eprintln!("hello on stderr");

    if let Ok(path) = std::env::var("WRITE_FILE") {
        let text = std::env::var("FILE_TEXT").unwrap_or_else(|_| "hello".into());
        if let Err(e) = std::fs::write(&path, format!("{text}\n")) {
            eprintln!("writing {path}: {e}");
            return ExitCode::from(1);
        }
    }
    if let Ok(path) = std::env::var("READ_FILE") {
        match std::fs::read_to_string(&path) {
            Ok(content) => println!("read {path}: {}", content.trim_end()),
            Err(e) => {
                eprintln!("reading {path}: {e}");
                return ExitCode::from(1);
            }
        }
    }

    let code = match std::env::var("EXIT_CODE") {
        Ok(raw) => match raw.trim().parse::<u8>() {
            Ok(code) => code,
            Err(_) => {
                eprintln!("EXIT_CODE={raw:?} is not an integer in 0..=255");
                2
            }
        },
        Err(_) => 0,
    };
    ExitCode::from(code)
}
