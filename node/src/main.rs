//! The `wasmlet` binary: parses the command line and hands over to the library.

use std::process::ExitCode;

use clap::Parser;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;
use wasmlet_node::cli::{self, Cli, Command};

fn main() -> ExitCode {
    // One TLS provider for the whole process, before any client is built.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    // A plugin author wants every line the plugin logs, and little else.
    let default_filter = match (&cli.command, cli.verbosity) {
        (Some(Command::Plugin { .. }), _) => "warn,plugin=trace",
        (_, 0) => "info",
        (_, 1) => "debug",
        _ => "trace",
    };
    init_tracing(default_filter);
    match cli.command {
        Some(Command::Plugin { action }) => wasmlet_node::plugin_tools::main(action),
        Some(Command::Sandbox { args }) => wasmlet_runtime_wasm::sandbox::main(args),
        Some(Command::Images { root_dir, action }) => cli::images(root_dir, action),
        Some(Command::Get { what }) => cli::get(what),
        None => run_node(cli),
    }
}

fn init_tracing(default: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

fn run_node(cli: Cli) -> ExitCode {
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
