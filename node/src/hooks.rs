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

use k8s_openapi::api::core::v1::{Container, HTTPGetAction, LifecycleHandler};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use wasmlet_runtime::Runtime;

use crate::http_get;

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
            http_get_hook(http, container, pod_ip).await
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

/// The `httpGet` handler: `Err` for a transport error or a status outside 200–399.
async fn http_get_hook(
    http: &HTTPGetAction,
    container: &Container,
    pod_ip: Option<&str>,
) -> Result<(), String> {
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
    let url = format!("http://{}{path}", http_get::host_port(&host, port));
    // The action's headers as they are; no redirect followed, no body read; the hook's
    // own timeout bounds it.
    let headers = http_get::Headers::as_given(
        http.http_headers
            .iter()
            .flatten()
            .map(|h| (h.name.as_str(), h.value.as_str())),
    );
    let options = http_get::Options {
        redirects: http_get::Redirects::None,
        max_body: 0,
        timeout: None,
    };
    let resp = http_get::get(&url, &headers, options)
        .await
        .map_err(|e| format!("httpGet {url}: {}", e.cause()))?;
    let status = resp.status;
    if (200..400).contains(&status) {
        Ok(())
    } else {
        Err(format!("httpGet {url}: HTTP {status}"))
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::HTTPHeader;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;
    use crate::http_get::testing::{path_of, reply, server};

    fn action(path: Option<&str>, port: IntOrString, headers: &[(&str, &str)]) -> HTTPGetAction {
        HTTPGetAction {
            host: Some("127.0.0.1".into()),
            path: path.map(str::to_owned),
            port,
            http_headers: Some(
                headers
                    .iter()
                    .map(|(n, v)| HTTPHeader {
                        name: (*n).into(),
                        value: (*v).into(),
                    })
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn an_http_get_hook_fails_outside_200_to_399_and_follows_no_redirect() {
        let s = server(|head| match path_of(head) {
            "/" | "/ok" => Some(reply("200 OK", "", "fine")),
            "/here" => Some(reply("302 Found", "Location: /missing\r\n", "")),
            "/missing" => Some(reply("404 Not Found", "", "")),
            _ => Some(reply("500 Internal Server Error", "", "")),
        })
        .await;
        let c = Container::default();
        let port = IntOrString::Int(s.port.into());
        let get = |path: Option<&str>| action(path, port.clone(), &[]);
        assert_eq!(http_get_hook(&get(Some("/ok")), &c, None).await, Ok(()));
        assert_eq!(http_get_hook(&get(None), &c, None).await, Ok(()));
        assert_eq!(http_get_hook(&get(Some("/here")), &c, None).await, Ok(()));
        assert_eq!(
            http_get_hook(&get(Some("/missing")), &c, None).await,
            Err(format!(
                "httpGet http://127.0.0.1:{}/missing: HTTP 404",
                s.port
            ))
        );
        assert_eq!(
            http_get_hook(&get(Some("/broken?x=1")), &c, None).await,
            Err(format!(
                "httpGet http://127.0.0.1:{}/broken?x=1: HTTP 500",
                s.port
            ))
        );
        assert_eq!(s.paths(), ["/ok", "/", "/here", "/missing", "/broken?x=1"]);
    }

    #[tokio::test]
    async fn an_http_get_hook_sends_the_actions_headers_as_they_are() {
        let s = server(|_| Some(reply("200 OK", "", ""))).await;
        let port = IntOrString::Int(s.port.into());
        let c = Container::default();
        let plain = action(Some("/"), port.clone(), &[("X-A", "1"), ("x-a", "2")]);
        assert_eq!(http_get_hook(&plain, &c, None).await, Ok(()));
        let hosted = action(Some("/"), port, &[("Host", "example.test")]);
        assert_eq!(http_get_hook(&hosted, &c, None).await, Ok(()));
        let heads: Vec<String> = s
            .heads
            .lock()
            .unwrap()
            .iter()
            .map(|h| h.to_lowercase())
            .collect();
        assert!(
            heads[0].contains(&format!("host: 127.0.0.1:{}", s.port)),
            "{}",
            heads[0]
        );
        assert!(
            heads[0].contains("x-a: 1") && heads[0].contains("x-a: 2"),
            "{}",
            heads[0]
        );
        for head in &heads {
            assert!(
                !head.contains("user-agent") && !head.contains("accept"),
                "{head}"
            );
        }
        assert!(heads[1].contains("host: example.test"), "{}", heads[1]);
        assert_eq!(heads[1].matches("host:").count(), 1, "{}", heads[1]);
    }

    #[tokio::test]
    async fn an_http_get_hook_takes_a_named_port_and_the_pods_ip() {
        let s = server(|_| Some(reply("200 OK", "", ""))).await;
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "c", "ports": [{"name": "http", "containerPort": s.port}],
        }))
        .unwrap();
        let mut named = action(Some("/"), IntOrString::String("http".into()), &[]);
        named.host = None;
        assert_eq!(http_get_hook(&named, &c, Some("127.0.0.1")).await, Ok(()));
        assert_eq!(
            http_get_hook(&named, &c, None).await,
            Err("the pod has no IP for the httpGet hook".into())
        );
        let unknown = action(Some("/"), IntOrString::String("grpc".into()), &[]);
        assert_eq!(
            http_get_hook(&unknown, &c, None).await,
            Err("no container port named \"grpc\"".into())
        );
        let mut https = action(Some("/"), IntOrString::Int(s.port.into()), &[]);
        https.scheme = Some("HTTPS".into());
        assert_eq!(
            http_get_hook(&https, &c, None).await,
            Err("httpGet hook scheme HTTPS is not supported yet".into())
        );
        assert_eq!(s.paths(), ["/"]);
    }

    #[tokio::test]
    async fn an_http_get_hook_reports_a_transport_error_and_reads_no_body() {
        let free = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = free.local_addr().unwrap().port();
        drop(free);
        let c = Container::default();
        let refused =
            http_get_hook(&action(None, IntOrString::Int(port.into()), &[]), &c, None).await;
        let prefix = format!("httpGet http://127.0.0.1:{port}/: ");
        assert!(
            refused.as_ref().is_err_and(|e| e.starts_with(&prefix)),
            "{refused:?}"
        );
        // A status whose body never ends is the hook's answer, not a hang.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 8192];
            let _ = s.read(&mut buf).await;
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nab")
                .await;
            // Hang until the client goes away.
            while let Ok(n) = s.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        });
        let hung = action(None, IntOrString::Int(port.into()), &[]);
        let answer =
            tokio::time::timeout(Duration::from_secs(5), http_get_hook(&hung, &c, None)).await;
        assert_eq!(answer, Ok(Ok(())));
    }
}
