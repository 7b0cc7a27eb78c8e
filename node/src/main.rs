//! The `wasmlet` binary: parses the command line and hands over to the library.

use std::process::ExitCode;

use clap::Parser;
use tokio_util::sync::CancellationToken;
use tracing_log::AsLog;
use tracing_subscriber::EnvFilter;
use wasmlet_node::cli::{self, Cli, Command};

/// The hidden command the node runs its Wasm sandboxes as ([`Command::Sandbox`]).
const SANDBOX: &str = "sandbox";

fn main() -> ExitCode {
    // One TLS provider for the whole process, before any client is built.
    let _ = rustls::crypto::ring::default_provider().install_default();
    // The node starts every Wasm pod as `wasmlet sandbox ...`: straight there, without
    // the command line parser or the node's logging, which it does not use.
    let mut args = std::env::args_os();
    if args.nth(1).is_some_and(|a| a == SANDBOX) {
        let args: Result<Vec<String>, _> = args.map(|a| a.into_string()).collect();
        return match args {
            Ok(args) => wasmlet_runtime_wasm::sandbox::main(args),
            Err(arg) => {
                eprintln!("wasmlet sandbox: argument {arg:?} is not UTF-8");
                ExitCode::from(2)
            }
        };
    }
    let cli = Cli::parse();
    // A plugin author wants every line the plugin logs, and little else.
    use tracing_log::log::LevelFilter;
    let (default_filter, dependencies) = match (&cli.command, cli.verbosity) {
        (Some(Command::Plugin { .. }), _) => ("warn,plugin=trace", LevelFilter::Warn),
        (_, 0) => ("info", LevelFilter::Info),
        (_, 1) => ("debug", LevelFilter::Debug),
        _ => ("trace", LevelFilter::Trace),
    };
    init_tracing(default_filter, dependencies);
    match cli.command {
        Some(Command::Plugin { action }) => wasmlet_node::plugin_tools::main(action),
        Some(Command::Sandbox { args }) => wasmlet_runtime_wasm::sandbox::main(args),
        Some(Command::Images { root_dir, action }) => cli::images(root_dir, action),
        Some(Command::Get { what }) => cli::get(what),
        None => run_node(cli),
    }
}

/// A node holds a few descriptors per pod (its sandbox's connections, log files,
/// watches): the soft limit on open files goes up to the hard one, as Go programs
/// (the kubelet, containerd) do at start. The sandboxes inherit it.
fn raise_open_files_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => {
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                tracing::warn!("keeping the open files limit at {soft} (hard {hard}): {e}");
            }
        }
        Ok(_) => {}
        Err(e) => tracing::warn!("reading the open files limit: {e}"),
    }
}

/// Logs to stderr through `RUST_LOG`'s filter, or `default` without it.
///
/// Crates that log through `log` (Cranelift, regalloc2, rustls) are bridged at
/// `dependencies` at most: a filter's most verbose directive (the plugin tools'
/// `plugin=trace`) would otherwise send every `log::trace!` of the compiler
/// through the filter, a quarter of a debug build's compile time. A `RUST_LOG` of
/// the user's own is bridged at its most verbose level.
fn init_tracing(default: &str, dependencies: tracing_log::log::LevelFilter) {
    let (filter, bridged) = match EnvFilter::try_from_default_env() {
        Ok(filter) => {
            let level = filter.max_level_hint().map_or(dependencies, |l| l.as_log());
            (filter, level)
        }
        Err(_) => (EnvFilter::new(default), dependencies),
    };
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .finish();
    tracing::subscriber::set_global_default(subscriber).expect("the first subscriber");
    if let Err(e) = tracing_log::LogTracer::builder()
        .with_max_level(bridged)
        .init()
    {
        tracing::warn!("records of crates that log through `log` are lost: {e}");
    }
}

fn run_node(cli: Cli) -> ExitCode {
    raise_open_files_limit();
    let config = match cli.node.resolve() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("wasmlet: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("wasmlet: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async {
        let cancel = CancellationToken::new();
        let on_signal = cancel.clone();
        tokio::spawn(async move {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut term), Ok(mut int)) = (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) else {
                return;
            };
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM received"),
                _ = int.recv() => tracing::info!("SIGINT received"),
            }
            on_signal.cancel();
        });
        match wasmlet_node::node::run(config, cancel).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!("{e:#}");
                ExitCode::FAILURE
            }
        }
    })
}
