//! The shim daemon: serves the task API on its socket until its last task is gone.

use std::time::Duration;

use anyhow::Context;
use containerd_shim_protos::shim_async::create_task;
use tracing_subscriber::EnvFilter;

use crate::bootstrap::Flags;
use crate::events::Publisher;
use crate::task::Service;

/// The task service's name on the wire, by containerd version: 1.6 and 1.7 call v2,
/// 2.x v3 (the same messages under a new package name).
const TASK_V2: &str = "containerd.task.v2.Task";
const TASK_V3: &str = "containerd.task.v3.Task";

pub fn run(flags: Flags) -> anyhow::Result<()> {
    let socket = flags
        .socket
        .clone()
        .context("-socket is required to serve (the daemon is started by `start`)")?;
    init_logging(flags.debug);
    // One thread: the shim only relays; the engine runs in the sandbox process.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(async move {
        let publisher = Publisher::start(
            std::env::var("TTRPC_ADDRESS")
                .ok()
                .filter(|a| !a.is_empty()),
            flags.namespace.clone(),
        );
        let service = Service::new(&flags, &socket, publisher);
        let mut services = create_task(service.clone());
        let v3 = services
            .remove(TASK_V3)
            .context("the generated task service has an unexpected name")?;
        services.insert(TASK_V2.to_owned(), v3);
        services.extend(create_task(service.clone()));
        let address = format!("unix://{}", socket.display());
        let mut server = ttrpc::asynchronous::Server::new()
            .bind(&address)
            .with_context(|| format!("listening on {address}"))?
            .register_service(services);
        server.start().await.context("starting the ttrpc server")?;
        tracing::info!(%address, id = %flags.id, "serving the task API");
        release_start();
        service.finished().await;
        // The reply to the last Shutdown goes out before the connections close.
        let _ = tokio::time::timeout(Duration::from_secs(2), server.shutdown()).await;
        let _ = std::fs::remove_file(&socket);
        tracing::info!("no task left: exiting");
        Ok(())
    })
}

/// `start` waits for our stdout to close: we listen now.
fn release_start() {
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        let _ = nix::unistd::dup2_stdout(&null);
    }
}

/// Logs go to the bundle's `log` pipe, which containerd reads into its own log;
/// non-blocking, so a containerd that is away never holds the shim up.
fn init_logging(debug: bool) {
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(pipe) = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open("log")
    else {
        return;
    };
    let filter = EnvFilter::try_from_env("WASMLET_SHIM_LOG")
        .unwrap_or_else(|_| EnvFilter::new(if debug { "debug" } else { "info" }));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(Mutex(std::sync::Mutex::new(pipe)))
        .try_init();
}

/// A writer that drops what the pipe cannot take right now.
struct Mutex(std::sync::Mutex<std::fs::File>);

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Mutex {
    type Writer = Lossy<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        Lossy(self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

struct Lossy<'a>(std::sync::MutexGuard<'a, std::fs::File>);

impl std::io::Write for Lossy<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::Write::write(&mut *self.0, buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
