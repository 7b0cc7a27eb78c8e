//! The bodies of wasmlet's fuzz targets: one function per input the node takes from
//! strangers, each feeding arbitrary bytes to the code that parses and checks that
//! input, exactly as the node calls it. `fuzz/` (cargo-fuzz, libFuzzer) wraps each in a
//! `fuzz_target!`; this crate's tests replay every seed (`fuzz/seeds/<target>`) and
//! every input a fuzzer found to crash (`fuzz/regressions/<target>`) through the same
//! functions, so a fixed crash stays fixed without a fuzzer.
//!
//! A target must not panic, hang or grow without bound on any input: an error is an
//! answer, a panic is a bug.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

mod plugin_results;

pub use plugin_results::plugin_results;

/// What a target may keep between inputs: a scratch directory and a runtime for the
/// async parsers.
pub struct Context {
    scratch: PathBuf,
    /// Held so the directory goes with the context (tests); `None` when the directory
    /// was given (a fuzzer, whose process ends without dropping its statics: the
    /// directory is its runner's to remove).
    _owned: Option<tempfile::TempDir>,
    runtime: tokio::runtime::Runtime,
    images: Mutex<Option<wasmlet_runtime_wasm::image::ImageStore>>,
}

impl Context {
    /// A context in `$WASMLET_FUZZ_SCRATCH`, else in a new temporary directory.
    pub fn new() -> Context {
        match std::env::var_os("WASMLET_FUZZ_SCRATCH") {
            Some(dir) => Context::in_dir(PathBuf::from(dir), None),
            None => {
                let dir = tempfile::tempdir().expect("a temporary directory");
                Context::in_dir(dir.path().to_owned(), Some(dir))
            }
        }
    }

    fn in_dir(scratch: PathBuf, owned: Option<tempfile::TempDir>) -> Context {
        std::fs::create_dir_all(&scratch).expect("the scratch directory");
        Context {
            scratch,
            _owned: owned,
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime"),
            images: Mutex::new(None),
        }
    }

    fn file(&self, name: &str, data: &[u8]) -> PathBuf {
        let path = self.scratch.join(name);
        std::fs::write(&path, data).expect("writing the scratch file");
        path
    }
}

impl Default for Context {
    fn default() -> Self {
        Context::new()
    }
}

/// A target's body: one input, in a context kept between inputs.
pub type Target = fn(&Context, &[u8]);

/// Every target, by the name `fuzz/` and its seed directories use.
pub const TARGETS: &[(&str, Target)] = &[
    ("pod_manifest", pod_manifest),
    ("kubelet_config", kubelet_config),
    ("oci_archive", oci_archive),
    ("cri_log", cri_log),
    ("node_api", node_api),
    ("spdy_frames", spdy_frames),
    ("websocket_frames", websocket_frames),
    ("plugin_results", plugin_results),
];

/// A static pod manifest (a file of the manifest directory, YAML or JSON by its
/// first byte) and a manifest URL's body (a Pod, a PodList or a List): decoded,
/// defaulted and validated as the file and HTTP sources do, then what the node reads
/// of an accepted pod (QoS class, resources, security, DNS, ports, sysctls).
pub fn pod_manifest(_: &Context, data: &[u8]) {
    use wasmlet_node::podconfig::static_pod::{self, Origin};
    let path = if data.first() == Some(&b'{') {
        Path::new("/etc/kubernetes/manifests/fuzz.json")
    } else {
        Path::new("/etc/kubernetes/manifests/fuzz.yaml")
    };
    let mut accepted = Vec::new();
    if let Ok(mut pod) = static_pod::decode(path, data) {
        static_pod::apply_defaults(&mut pod, Origin::File(path), "fuzz-node");
        if static_pod::validate(&pod).is_ok() {
            accepted.push(pod);
        }
    }
    if let Ok(pods) = static_pod::decode_pods(data) {
        for mut pod in pods {
            static_pod::apply_defaults(&mut pod, Origin::Url("http://fuzz/pods"), "fuzz-node");
            if static_pod::validate(&pod).is_ok() {
                accepted.push(pod);
            }
        }
    }
    for pod in &accepted {
        read_accepted_pod(pod);
    }
}

fn read_accepted_pod(pod: &k8s_openapi::api::core::v1::Pod) {
    use wasmlet_node::{podspec, qos, quantity};
    let _ = qos::qos_class(pod);
    let _ = wasmlet_node::pod::grace_period(pod);
    let Some(spec) = &pod.spec else { return };
    let _ = podspec::port_mappings(spec);
    let _ = podspec::sandbox_security(spec);
    let _ = podspec::sysctls(spec);
    let _ = podspec::dns_config(pod, &Default::default());
    for c in wasmlet_node::pod::containers(pod) {
        let _ = podspec::container_security(spec, c);
        let _ = podspec::cpu_resources(c);
        let resources = c.resources.iter();
        for r in resources {
            for q in r
                .limits
                .iter()
                .chain(r.requests.iter())
                .flat_map(|m| m.values())
            {
                let _ = quantity::parse(q);
                let _ = quantity::bytes(q);
            }
        }
    }
}

/// The `--config` file (KubeletConfiguration with its `wasmlet:` section), strict or
/// not by the first byte, resolved into the node's configuration.
pub fn kubelet_config(cx: &Context, data: &[u8]) {
    let (strict, text) = match data.split_first() {
        Some((b, rest)) => (b & 1 == 1, rest),
        None => (false, data),
    };
    let path = cx.file("config.yaml", text);
    let flags = wasmlet_node::config::NodeFlags {
        config: Some(path),
        strict_config: strict,
        hostname_override: Some("fuzz-node".into()),
        sandbox_program: Some("/usr/bin/wasmlet".into()),
        root_dir: Some(cx.scratch.join("root")),
        ..Default::default()
    };
    let _ = flags.resolve();
    if let Ok(text) = std::str::from_utf8(text) {
        let _ = wasmlet_node::duration::parse(text);
        let _ = wasmlet_node::config::parse_taint(text);
    }
}

/// An OCI archive (a tar, plain or gzipped, with `oci-layout`, `index.json`, nested
/// indexes, manifests, configs and layers of every media type the store reads)
/// imported into the Wasm image store.
pub fn oci_archive(cx: &Context, data: &[u8]) {
    let archive = cx.file("image.tar", data);
    let mut images = cx.images.lock().unwrap_or_else(|e| e.into_inner());
    let store = images.get_or_insert_with(|| {
        wasmlet_runtime_wasm::image::ImageStore::open(cx.scratch.join("images"))
            .expect("the image store opens")
    });
    let _ = store.import_archive(&archive);
}

/// A container's log file as `kubectl logs` reads it through the node API: the input's
/// first line is the query (`tailLines`, `sinceTime`, `limitBytes`, `timestamps`,
/// `stream`, …), the rest the file (CRI lines, docker JSON lines, or neither).
pub fn cri_log(cx: &Context, data: &[u8]) {
    use futures::TryStreamExt as _;
    let (query, file) = match data.iter().position(|b| *b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&data[..0], data),
    };
    if let Ok(text) = std::str::from_utf8(file) {
        for line in text.lines() {
            let _ = wasmlet_runtime_wasm::crilog::parse_line(line);
        }
    }
    let query = String::from_utf8_lossy(query);
    let now = jiff::Timestamp::from_second(1_800_000_000).expect("a fixed time");
    let Ok(mut opts) = wasmlet_node::server::logs::LogOptions::from_query(&query, now) else {
        return;
    };
    // A follow waits for more; a fuzzer wants the file's end.
    opts.follow = false;
    let path = cx.file("0.log", file);
    cx.runtime.block_on(async {
        if let Ok(stream) =
            wasmlet_node::server::logs::open(&path, &opts, std::future::pending()).await
        {
            let _: Result<Vec<_>, _> = stream.try_collect().await;
        }
    });
}

/// A node API request line's path and query: every parser the routes use on them
/// (log options, exec/attach streams and commands, port-forward ports, stats, the
/// `/logs/` path cleaner) and the authorization attributes the path maps to.
pub fn node_api(_: &Context, data: &[u8]) {
    use wasmlet_node::server::{auth, authz, logs, node_logs, stats, streaming};
    let text = String::from_utf8_lossy(data);
    let (path, query) = text.split_once('?').unwrap_or((&text, ""));
    let now = jiff::Timestamp::from_second(1_800_000_000).expect("a fixed time");
    let _ = logs::LogOptions::from_query(query, now);
    let _ = streaming::streams_of(query);
    let _ = streaming::values(query, "command");
    let _ = streaming::ports_of(query, true);
    let _ = stats::only_cpu_and_memory(query);
    let _ = node_logs::clean(path);
    for method in [axum::http::Method::GET, axum::http::Method::POST] {
        for fine_grained in [false, true] {
            let _ = authz::request_attributes(
                "fuzz-node",
                &auth::User::anonymous(),
                &method,
                path,
                fine_grained,
            );
        }
    }
    // A client certificate's DER, as the x509 authenticator reads it.
    let _ = auth::user_from_certificate(data);
}

/// The bytes a client sends on a SPDY/3.1 stream connection (exec, attach,
/// port-forward): frames read one after another, header blocks inflated with the
/// SPDY dictionary, until the input ends or a frame is refused.
pub fn spdy_frames(cx: &Context, data: &[u8]) {
    use wasmlet_node::server::spdy;
    cx.runtime.block_on(async {
        let mut input = data;
        let mut headers = spdy::HeaderCodec::new();
        while let Ok(Some(frame)) = spdy::read_frame(&mut input, &mut headers).await {
            // What is read back must encode again.
            let mut out = spdy::HeaderCodec::new();
            let _ = spdy::encode_frame(&frame, &mut out);
        }
    });
}

/// The bytes a client sends on a WebSocket stream connection (the `channel.k8s.io`
/// protocols, binary and base64): frames decoded by tungstenite as the node's server
/// does, each message read for its channel and data by the node's framing.
pub fn websocket_frames(cx: &Context, data: &[u8]) {
    use futures::StreamExt as _;
    use tokio::io::AsyncWriteExt as _;
    use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
    use wasmlet_node::server::websocket::Framing;
    let (base64, frames) = match data.split_first() {
        Some((b, rest)) => (b & 1 == 1, rest),
        None => (false, data),
    };
    let framing = if base64 {
        Framing::of("v5.base64.channel.k8s.io")
    } else {
        Framing::of("v5.channel.k8s.io")
    };
    cx.runtime.block_on(async {
        let (mut client, server) = tokio::io::duplex(frames.len().max(1) + 64);
        let _ = client.write_all(frames).await;
        let _ = client.shutdown().await;
        let config = WebSocketConfig::default()
            .max_message_size(Some(1 << 20))
            .max_frame_size(Some(1 << 20));
        let mut ws =
            tokio_tungstenite::WebSocketStream::from_raw_socket(server, Role::Server, Some(config))
                .await;
        while let Some(Ok(message)) = ws.next().await {
            if framing.read(message).is_err() {
                break;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `fuzz/<dir>/<target>`.
    fn inputs(dir: &str, target: &str) -> Vec<PathBuf> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fuzz")
            .join(dir);
        let mut files: Vec<PathBuf> = std::fs::read_dir(root.join(target))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        files
    }

    #[test]
    fn every_target_has_seeds_and_takes_them_and_the_empty_input() {
        let cx = Context::new();
        for (name, target) in TARGETS {
            let seeds = inputs("seeds", name);
            assert!(!seeds.is_empty(), "fuzz/seeds/{name} has no seed");
            target(&cx, b"");
            for seed in seeds {
                target(&cx, &std::fs::read(&seed).unwrap());
            }
        }
    }

    /// Every input a fuzzer found to crash a target, kept in
    /// `fuzz/regressions/<target>/` once the crash was fixed.
    #[test]
    fn every_crash_found_stays_fixed() {
        let cx = Context::new();
        for (name, target) in TARGETS {
            for input in inputs("regressions", name) {
                eprintln!("{}", input.display());
                target(&cx, &std::fs::read(&input).unwrap());
            }
        }
    }
}
