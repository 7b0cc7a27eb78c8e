//! `wasmlet plugin`: tools for plugin authors that need no node and no cluster —
//! the preview 1 adapter the node embeds, componentizing a core module, checking a
//! component against the ABI, calling it once as the node would, and packing it as
//! the OCI artifact the node loads.

pub mod call;
pub mod component;
pub mod pack;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use clap::Subcommand;
use wasmlet_plugin_host::{HostOptions, PluginConfig, PluginHost, PluginSource};

pub use call::RunArgs;

#[derive(Subcommand, Debug)]
pub enum PluginAction {
    /// Write the WASI preview 1 adapter of the node's wasmtime, to componentize a
    /// core module with any tool (`wasm-tools component new --adapt`).
    Adapter {
        /// The reactor adapter, for libraries: what plugins are [default].
        #[arg(long, conflicts_with = "command")]
        reactor: bool,
        /// The command adapter, for programs with `_start`.
        #[arg(long)]
        command: bool,
        #[arg(short = 'o', long = "output")]
        output: PathBuf,
    },
    /// Make a core module (built with wit-bindgen, its world in `component-type`
    /// sections) a component, with the adapter `adapter` writes.
    Componentize {
        module: PathBuf,
        #[arg(short = 'o', long = "output")]
        output: PathBuf,
        /// Use the command adapter (a program with `_start`) instead of the reactor one.
        #[arg(long)]
        command: bool,
    },
    /// Check a component against the node's plugin ABI: its world and ABI version,
    /// what it exports, each import against what the node offers and the grants
    /// allow; then load it in the node's plugin host.
    Check {
        file: PathBuf,
        /// The plugin's entry from the node's configuration (YAML), for its grants
        /// and limits.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Call a plugin once as the node would, under the same limits, and print the
    /// result, the plugin's log lines and the time the call took.
    Run(Box<RunArgs>),
    /// Pack a component as the OCI artifact the node loads from `source.image`
    /// (an OCI image-layout tarball: `wasmlet images import`, `ctr images import`).
    Pack {
        file: PathBuf,
        /// The image reference, `name[:tag]`.
        #[arg(short = 't', long = "tag")]
        reference: String,
        #[arg(short = 'o', long = "output")]
        output: PathBuf,
    },
}

/// Runs a `plugin` action; the exit code is 1 when the plugin is refused or its
/// call fails, 2 for bad arguments or files.
pub fn main(action: PluginAction) -> ExitCode {
    let result = match action {
        PluginAction::Adapter {
            output, command, ..
        } => write(&output, component::adapter(command)).map(|()| {
            println!(
                "wrote the {} adapter (wasmtime {}) to {}",
                if command { "command" } else { "reactor" },
                WASMTIME_VERSION,
                output.display()
            );
            true
        }),
        PluginAction::Componentize {
            module,
            output,
            command,
        } => std::fs::read(&module)
            .with_context(|| module.display().to_string())
            .and_then(|wasm| component::componentize(&wasm, command))
            .and_then(|c| write(&output, &c))
            .map(|()| {
                println!("wrote {}", output.display());
                true
            }),
        PluginAction::Check { file, config } => block_on(check(file, config)),
        PluginAction::Run(args) => block_on(call::run(*args)),
        PluginAction::Pack {
            file,
            reference,
            output,
        } => std::fs::read(&file)
            .with_context(|| file.display().to_string())
            .and_then(|bytes| {
                let shape = component::shape(&bytes)?;
                component::world_of(&shape)?;
                pack::pack(&bytes, &shape, &reference, &output)
            })
            .map(|digest| {
                println!("wrote {reference} ({digest}) to {}", output.display());
                true
            }),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("wasmlet plugin: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// The wasmtime whose adapter and engine the node uses.
const WASMTIME_VERSION: &str = "48.0.8";

fn write(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    std::fs::write(path, bytes).with_context(|| path.display().to_string())
}

fn block_on<F: Future<Output = anyhow::Result<bool>>>(f: F) -> anyhow::Result<bool> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("the async runtime")?
        .block_on(f)
}

async fn check(file: PathBuf, config: Option<PathBuf>) -> anyhow::Result<bool> {
    let bytes = std::fs::read(&file).with_context(|| file.display().to_string())?;
    println!("{}: {} KiB", file.display(), bytes.len().div_ceil(1024));
    let shape = match component::shape(&bytes) {
        Ok(shape) => shape,
        Err(e) => {
            println!("REFUSED: {e:#}");
            return Ok(false);
        }
    };
    let world = match component::world_of(&shape) {
        Ok(world) => world,
        Err(e) => {
            println!("REFUSED: {e:#}");
            return Ok(false);
        }
    };
    let args = RunArgs {
        world: Some(world),
        config,
        ..RunArgs::for_file(file.clone())
    };
    let config: PluginConfig = call::plugin_config(&args, world)?;
    let (report, imports_ok) = component::report(&shape, world, &config.grants);
    print!("{report}");
    let host = PluginHost::new(HostOptions::default())?;
    let started = Instant::now();
    let name = config.name.clone();
    debug_assert!(matches!(config.source, PluginSource::File(_)));
    match host.load_bytes(config, bytes).await {
        Ok(()) => {
            let resource = host
                .resource_name(&name)
                .map(|r| format!(", resource {r}"))
                .unwrap_or_default();
            println!(
                "loads:   yes, compiled and linked in {:.0} ms{resource}",
                started.elapsed().as_secs_f64() * 1e3
            );
            Ok(imports_ok)
        }
        Err(e) => {
            println!("loads:   NO: {e:#}");
            Ok(false)
        }
    }
}
