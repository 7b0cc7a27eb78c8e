//! Lifecycle hooks (`postStart`, `preStop`): `exec`, `httpGet` and `sleep` handlers,
//! run as the kubelet's handler runner runs them.
//!
//! - `exec` runs in the container through the runtime (`ExecSync`); in a Wasm
//!   container it runs a new instance of the container's own program with the
//!   command as its arguments (docs/decisions.md, "Exec").
//! - `httpGet` sends a GET to `host` (default: the pod's IP) and `port` (a number or
//!   a named container port); a transport error or a status outside 200–399 fails.
//! - `sleep` waits the given seconds.
//!
//! Every handler is bounded by `timeout` (the grace period, for `preStop`).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, LifecycleHandler};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use wasmlet_runtime::Runtime;

/// Runs one hook handler. `Err` says why it failed.
pub async fn run(
    handler: &LifecycleHandler,
    runtime: &dyn Runtime,
    container: &Container,
    container_id: &str,
    pod_ip: Option<&str>,
    timeout: Duration,
) -> Result<(), String> {
    let work = async {
        if let Some(exec) = &handler.exec {
            let command = exec.command.clone().unwrap_or_default();
            let result = runtime
                .exec_sync(container_id, &command, timeout)
                .await
                .map_err(|e| format!("exec {command:?}: {e}"))?;
            if result.exit_code != 0 {
                return Err(format!(
                    "exec {command:?} exited with {}: {}",
                    result.exit_code,
                    String::from_utf8_lossy(&result.stdout)
                        .trim()
                        .chars()
                        .chain(String::from_utf8_lossy(&result.stderr).trim().chars())
                        .take(1024)
                        .collect::<String>()
                ));
            }
            Ok(())
        } else if let Some(http) = &handler.http_get {
            let port = match &http.port {
                IntOrString::Int(p) => *p,
                IntOrString::String(name) => container
                    .ports
                    .iter()
                    .flatten()
                    .find(|p| p.name.as_deref() == Some(name.as_str()))
                    .map(|p| p.container_port)
                    .ok_or_else(|| format!("no container port named {name:?}"))?,
            };
            let host = http
                .host
                .clone()
                .filter(|h| !h.is_empty())
                .or_else(|| pod_ip.map(str::to_owned))
                .ok_or("the pod has no IP for the httpGet hook")?;
            let scheme = http.scheme.as_deref().unwrap_or("HTTP");
            if !scheme.eq_ignore_ascii_case("http") {
                return Err(format!("httpGet hook scheme {scheme} is not supported yet"));
            }
            let path = http.path.clone().unwrap_or_else(|| "/".into());
            let host_port = if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            };
            let url = format!("http://{host_port}{path}");
            let mut req = hyper::Request::get(&url);
            for h in http.http_headers.iter().flatten() {
                req = req.header(h.name.as_str(), h.value.as_str());
            }
            let req = req
                .body(http_body_util::Empty::<bytes::Bytes>::new())
                .map_err(|e| format!("httpGet {url}: {e}"))?;
            let client =
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .build_http();
            let resp = client
                .request(req)
                .await
                .map_err(|e| format!("httpGet {url}: {e}"))?;
            let status = resp.status().as_u16();
            if (200..400).contains(&status) {
                Ok(())
            } else {
                Err(format!("httpGet {url}: HTTP {status}"))
            }
        } else if let Some(sleep) = &handler.sleep {
            tokio::time::sleep(Duration::from_secs(sleep.seconds.max(0) as u64)).await;
            Ok(())
        } else {
            Err("the hook has no handler (exec, httpGet, sleep)".into())
        }
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(format!("the hook did not finish within {timeout:?}")),
    }
}
