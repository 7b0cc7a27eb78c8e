//! The `wasmlet` command line: run the node, manage images, list pods.

use std::io::{Read as _, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use k8s_openapi::api::core::v1::Pod;
use wasmlet_runtime_wasm::ImageStore;

use crate::config::{DEFAULT_ROOT_DIR, NodeConfig, NodeFlags};

/// wasmlet: a Kubernetes node agent that runs OCI containers and WebAssembly.
#[derive(Parser, Debug)]
#[command(name = "wasmlet", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub node: NodeFlags,
    /// Log verbosity: 0 info, 1 debug, 2+ trace (RUST_LOG overrides).
    #[arg(long = "v", short = 'v', global = true, default_value_t = 0)]
    pub verbosity: u8,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Manage the node's local image store.
    Images {
        /// The node's root directory.
        #[arg(long, default_value = DEFAULT_ROOT_DIR)]
        root_dir: PathBuf,
        #[command(subcommand)]
        action: ImagesAction,
    },
    /// Ask a running node for its pods (over the read-only port).
    Get {
        #[command(subcommand)]
        what: GetWhat,
    },
    /// Tools for plugin authors: the adapter, componentize, check, run once, pack.
    Plugin {
        #[command(subcommand)]
        action: crate::plugin_tools::PluginAction,
    },
    /// The per-pod Wasm sandbox process (started by the node, not by hand).
    #[command(hide = true)]
    Sandbox {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum ImagesAction {
    /// Import OCI image-layout archives (Wasm artifacts or images with a .wasm entrypoint).
    Import {
        #[arg(required = true)]
        archives: Vec<PathBuf>,
    },
    /// List stored images.
    #[command(alias = "ls")]
    List,
    /// Remove images by reference or id.
    #[command(alias = "remove")]
    Rm {
        #[arg(required = true)]
        images: Vec<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum GetWhat {
    /// List pods with their status, as `kubectl get pods` shows them.
    Pods {
        /// Address of the node's read-only port.
        #[arg(long, default_value = "127.0.0.1:10255")]
        server: String,
    },
}

/// Runs an `images` action.
pub fn images(root_dir: PathBuf, action: ImagesAction) -> ExitCode {
    let store = match ImageStore::open(NodeConfig::image_store_dir_under(&root_dir)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("wasmlet: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut failed = false;
    match action {
        ImagesAction::Import { archives } => {
            for archive in archives {
                match store.import_archive(&archive) {
                    Ok(entries) => {
                        for e in entries {
                            println!("imported {} {}", e.reference, e.image.manifest_digest);
                        }
                    }
                    Err(e) => {
                        eprintln!("wasmlet: {e}");
                        failed = true;
                    }
                }
            }
        }
        ImagesAction::List => match store.list() {
            Ok(entries) => {
                println!("{:<60} {:<10} {:<20} {:>10}", "IMAGE", "KIND", "ID", "SIZE");
                for e in entries {
                    let id = e.image.manifest_digest.trim_start_matches("sha256:");
                    println!(
                        "{:<60} {:<10} {:<20} {:>10}",
                        e.reference,
                        format!("{:?}", e.image.kind).to_lowercase(),
                        &id[..id.len().min(12)],
                        human_size(e.image.size)
                    );
                }
            }
            Err(e) => {
                eprintln!("wasmlet: {e}");
                failed = true;
            }
        },
        ImagesAction::Rm { images } => {
            for image in images {
                match store.remove(&image) {
                    Ok(removed) if removed.is_empty() => {
                        eprintln!("wasmlet: image {image:?} is not in the store");
                        failed = true;
                    }
                    Ok(removed) => removed.iter().for_each(|r| println!("removed {r}")),
                    Err(e) => {
                        eprintln!("wasmlet: {e}");
                        failed = true;
                    }
                }
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn human_size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{:.1}MiB", b as f64 / (1 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1}KiB", b as f64 / (1 << 10) as f64),
        b => format!("{b}B"),
    }
}

/// Runs `get pods`.
pub fn get(what: GetWhat) -> ExitCode {
    let GetWhat::Pods { server } = what;
    match fetch_pods(&server) {
        Ok(pods) => {
            print!("{}", pod_table(&pods, jiff::Timestamp::now()));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("wasmlet: {e}");
            ExitCode::FAILURE
        }
    }
}

fn fetch_pods(server: &str) -> Result<Vec<Pod>, String> {
    let mut stream =
        std::net::TcpStream::connect(server).map_err(|e| format!("cannot reach {server}: {e}"))?;
    write!(stream, "GET /pods HTTP/1.0\r\nHost: {server}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or("malformed HTTP response")?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return Err(format!(
            "{server}/pods: {}",
            head.lines().next().unwrap_or("")
        ));
    }
    let list: k8s_openapi::List<Pod> =
        serde_json::from_str(body).map_err(|e| format!("{server}/pods: {e}"))?;
    Ok(list.items)
}

/// The `kubectl get pods` columns: READY, STATUS (the most telling container reason),
/// RESTARTS and AGE.
pub fn pod_table(pods: &[Pod], now: jiff::Timestamp) -> String {
    let mut out = format!(
        "{:<12} {:<40} {:<7} {:<20} {:<9} {}\n",
        "NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE"
    );
    for pod in pods {
        let status = pod.status.clone().unwrap_or_default();
        let cs = status.container_statuses.clone().unwrap_or_default();
        let ready = cs.iter().filter(|c| c.ready).count();
        let restarts: i32 = cs.iter().map(|c| c.restart_count).sum();
        let mut reason = status.phase.clone().unwrap_or_else(|| "Unknown".into());
        for c in &cs {
            let state = c.state.clone().unwrap_or_default();
            if let Some(r) = state
                .waiting
                .and_then(|w| w.reason)
                .filter(|r| r != "ContainerCreating" || reason == "Pending")
            {
                reason = r;
            } else if let Some(t) = state.terminated {
                reason = t
                    .reason
                    .unwrap_or_else(|| format!("ExitCode:{}", t.exit_code));
            }
        }
        let age = status
            .start_time
            .map(|t| {
                crate::duration::format(std::time::Duration::from_secs(
                    now.duration_since(t.0).as_secs().max(0) as u64,
                ))
            })
            .unwrap_or_else(|| "-".into());
        out.push_str(&format!(
            "{:<12} {:<40} {:<7} {:<20} {:<9} {}\n",
            pod.metadata.namespace.as_deref().unwrap_or(""),
            pod.metadata.name.as_deref().unwrap_or(""),
            format!("{ready}/{}", cs.len()),
            reason,
            restarts,
            age
        ));
    }
    out
}
