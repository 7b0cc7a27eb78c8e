//! The probe handlers, as the kubelet's prober runs them: `exec` through the runtime,
//! `httpGet`, `tcpSocket` and `grpc` from the node to the pod's address. Each is
//! bounded by the probe's `timeoutSeconds` and leaves no task, socket or process
//! behind when it ends, however it ends.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, HTTPGetAction, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use wasmlet_runtime::Runtime;

use super::{Outcome, ProbeResult};
use crate::http_get::{self, host_port};

/// The User-Agent of the kubelet's HTTP probes (`kube-probe/<major>.<minor>`).
pub const USER_AGENT: &str = "kube-probe/1.33";

/// What a probe is run against.
pub struct Target<'a> {
    pub probe: &'a Probe,
    /// Which of the container's probes this is (a pod annotation may give it a plugin).
    pub kind: super::ProbeKind,
    pub container: &'a Container,
    /// The container's id in its runtime, for `exec`.
    pub container_id: &'a str,
    /// Where `httpGet`, `tcpSocket` and `grpc` connect when the probe names no host.
    pub pod_ip: &'a str,
    pub runtime: Option<Arc<dyn Runtime>>,
    pub timeout: Duration,
}

/// Runs the probe's handler.
pub async fn run(t: &Target<'_>) -> Outcome {
    let p = t.probe;
    if let Some(exec) = &p.exec {
        let command = exec.command.clone().unwrap_or_default();
        let Some(runtime) = &t.runtime else {
            return Outcome::unknown("no runtime for the exec probe");
        };
        return exec_probe(&**runtime, t.container_id, &command, t.timeout).await;
    }
    if let Some(http) = &p.http_get {
        return match port(&http.port, t.container) {
            Ok(port) => http_probe(http, t.pod_ip, port, t.timeout).await,
            Err(e) => Outcome::unknown(e),
        };
    }
    if let Some(tcp) = &p.tcp_socket {
        let host = tcp
            .host
            .as_deref()
            .filter(|h| !h.is_empty())
            .unwrap_or(t.pod_ip);
        return match port(&tcp.port, t.container) {
            Ok(port) => tcp_probe(host, port, t.timeout).await,
            Err(e) => Outcome::unknown(e),
        };
    }
    if let Some(grpc) = &p.grpc {
        let service = grpc.service.clone().unwrap_or_default();
        return grpc_probe(t.pod_ip, grpc.port, &service, t.timeout).await;
    }
    Outcome::unknown("the probe has no handler (exec, httpGet, tcpSocket, grpc)")
}

/// A numbered port, or a named container port.
pub fn port(port: &IntOrString, c: &Container) -> Result<u16, String> {
    let n = match port {
        IntOrString::Int(p) => *p,
        IntOrString::String(name) => match name.parse::<i32>() {
            Ok(p) => p,
            Err(_) => c
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .map(|p| p.container_port)
                .ok_or_else(|| format!("no container port named {name:?}"))?,
        },
    };
    u16::try_from(n)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("invalid port number: {n}"))
}

async fn exec_probe(
    runtime: &dyn Runtime,
    container_id: &str,
    command: &[String],
    timeout: Duration,
) -> Outcome {
    let run = runtime.exec_sync(container_id, command, timeout);
    // The runtime enforces the timeout; this bound is for a runtime that does not.
    match tokio::time::timeout(timeout + Duration::from_secs(1), run).await {
        Err(_) => Outcome::failure(format!("command {command:?} timed out after {timeout:?}")),
        Ok(Err(e)) => exec_error(command, e),
        Ok(Ok(r)) => {
            let mut output = String::from_utf8_lossy(&r.stdout).into_owned();
            output.push_str(&String::from_utf8_lossy(&r.stderr));
            if r.exit_code == 0 {
                Outcome::success(output)
            } else {
                Outcome::failure(if output.trim().is_empty() {
                    format!("command {command:?} exited with {}", r.exit_code)
                } else {
                    output
                })
            }
        }
    }
}

/// An `ExecSync` error, as the kubelet's exec prober takes it: the runtime's timeout
/// is a failure; any other error means the probe could not be run (Unknown).
fn exec_error(command: &[String], e: wasmlet_runtime::Error) -> Outcome {
    match e {
        wasmlet_runtime::Error::Timeout { .. } => {
            Outcome::failure(format!("command {command:?} timed out: {e}"))
        }
        e => Outcome::unknown(format!("exec {command:?}: {e}")),
    }
}

async fn tcp_probe(host: &str, port: u16, timeout: Duration) -> Outcome {
    let addr = host_port(host, port);
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(&addr)).await {
        Ok(Ok(stream)) => {
            drop(stream);
            Outcome::success(String::new())
        }
        Ok(Err(e)) => Outcome::failure(format!("dial tcp {addr}: {e}")),
        Err(_) => Outcome::failure(format!("dial tcp {addr}: i/o timeout")),
    }
}

async fn http_probe(http: &HTTPGetAction, pod_ip: &str, port: u16, timeout: Duration) -> Outcome {
    let scheme = http.scheme.as_deref().unwrap_or("HTTP").to_lowercase();
    let host = http
        .host
        .clone()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| pod_ip.to_owned());
    let mut path = http.path.clone().unwrap_or_default();
    if !path.starts_with('/') {
        path.insert(0, '/');
    }
    let url = format!("{scheme}://{}{path}", host_port(&host, port));
    let headers = http_get::Headers::kubelet(
        USER_AGENT,
        http.http_headers
            .iter()
            .flatten()
            .map(|h| (h.name.as_str(), h.value.as_str())),
    );
    match http_get::get(&url, &headers, http_get::Options::probe(timeout)).await {
        Err(e) => Outcome::failure(e.to_string()),
        Ok(http_get::Response { status, body }) => {
            if (200..300).contains(&status) {
                Outcome::success(body)
            } else if (300..400).contains(&status) {
                // A redirect that was not followed (another host, a code that is not
                // followed, no Location): the kubelet's probe.Warning.
                Outcome::warning(format!("Probe terminated redirects, Response body: {body}"))
            } else {
                Outcome::failure(format!("HTTP probe failed with statuscode: {status}"))
            }
        }
    }
}

async fn grpc_probe(host: &str, port: i32, service: &str, timeout: Duration) -> Outcome {
    use wasmlet_proto::grpc::health::v1::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
    };
    let addr = format!("http://{}", host_port(host, port.clamp(0, 65535) as u16));
    let check = async {
        let channel = match tonic::transport::Endpoint::from_shared(addr.clone()) {
            Ok(e) => e.connect_timeout(timeout).connect().await,
            Err(e) => return Err((false, e.to_string())),
        }
        .map_err(|_| {
            (
                false,
                format!("timeout: failed to connect service {addr:?} within {timeout:?}"),
            )
        })?;
        let mut client = HealthClient::new(channel);
        let request = HealthCheckRequest {
            service: service.to_owned(),
        };
        client
            .check(request)
            .await
            .map(|r| r.into_inner().status)
            .map_err(|s| {
                (
                    true,
                    format!("rpc error: code = {:?} desc = {}", s.code(), s.message()),
                )
            })
    };
    match tokio::time::timeout(timeout, check).await {
        Err(_) => Outcome::failure(format!(
            "timeout: health rpc did not complete within {timeout:?}"
        )),
        Ok(Err((_, message))) => Outcome::failure(message),
        Ok(Ok(status)) => {
            let status = ServingStatus::try_from(status).unwrap_or(ServingStatus::Unknown);
            if status == ServingStatus::Serving {
                Outcome::success(String::new())
            } else {
                Outcome::failure(format!(
                    "service unhealthy (responded with {:?})",
                    status.as_str_name()
                ))
            }
        }
    }
}

impl Outcome {
    pub fn success(output: impl Into<String>) -> Self {
        Outcome {
            result: ProbeResult::Success,
            output: output.into(),
            warning: false,
        }
    }

    /// A success the kubelet reports with a warning (a redirect it did not follow).
    pub fn warning(output: impl Into<String>) -> Self {
        Outcome {
            result: ProbeResult::Success,
            output: output.into(),
            warning: true,
        }
    }

    pub fn failure(output: impl Into<String>) -> Self {
        Outcome {
            result: ProbeResult::Failure,
            output: output.into(),
            warning: false,
        }
    }

    /// The probe could not be run (a missing named port, a runtime error): reported,
    /// but neither counted nor a result.
    pub fn unknown(output: impl Into<String>) -> Self {
        Outcome {
            result: ProbeResult::Unknown,
            output: output.into(),
            warning: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{HTTPHeader, TCPSocketAction};
    use tokio::net::TcpListener;

    use super::*;
    use crate::http_get::MAX_BODY;
    use crate::http_get::testing::{Server, path_of, reply, server};

    fn http(path: &str, port: u16, headers: &[(&str, &str)]) -> HTTPGetAction {
        HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(port.into()),
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

    async fn routes() -> Server {
        server(|head| match path_of(head).split('?').next().unwrap_or("") {
            "/ok" => Some(reply("200 OK", "", "fine")),
            "/missing" => Some(reply("404 Not Found", "", "")),
            "/here" => Some(reply("302 Found", "Location: /ok\r\n", "")),
            "/away" => Some(reply(
                "302 Found",
                "Location: http://elsewhere.invalid:9/\r\n",
                "",
            )),
            "/away-relative-scheme" => Some(reply(
                "301 Moved Permanently",
                "Location: //elsewhere.invalid:9/ok\r\n",
                "",
            )),
            "/loop" => Some(reply("302 Found", "Location: /loop\r\n", "")),
            "/temporary" => Some(reply("307 Temporary Redirect", "Location: ok\r\n", "")),
            "/permanent" => Some(reply(
                "308 Permanent Redirect",
                "Location: ./a/../ok?x=1#frag\r\n",
                "",
            )),
            "/see-other" => Some(reply("303 See Other", "Location: /ok\r\n", "")),
            "/choices" => Some(reply("300 Multiple Choices", "Location: /ok\r\n", "pick")),
            "/not-modified" => Some(reply("304 Not Modified", "Location: /ok\r\n", "")),
            "/no-location" => Some(reply("302 Found", "", "nowhere")),
            "/big" => Some(reply("200 OK", "", &"x".repeat(100_000))),
            _ => None,
        })
        .await
    }

    const SECOND: Duration = Duration::from_secs(1);

    fn paths(s: &Server) -> Vec<String> {
        s.heads
            .lock()
            .unwrap()
            .iter()
            .map(|h| path_of(h).to_owned())
            .collect()
    }

    #[tokio::test]
    async fn http_probes_follow_the_kubelets_rules() {
        let s = routes().await;
        let probe = |path: &str| http(path, s.port, &[]);
        let ok = http_probe(&probe("/ok"), "127.0.0.1", s.port, SECOND).await;
        assert_eq!(
            (ok.result, ok.output.as_str(), ok.warning),
            (ProbeResult::Success, "fine", false)
        );
        let missing = http_probe(&probe("/missing"), "127.0.0.1", s.port, SECOND).await;
        assert_eq!(
            missing,
            Outcome::failure("HTTP probe failed with statuscode: 404")
        );
        // A redirect on the same host is followed; one to another host is not, and is
        // a success with a warning.
        let here = http_probe(&probe("/here"), "127.0.0.1", s.port, SECOND).await;
        assert_eq!((here.result, here.warning), (ProbeResult::Success, false));
        let away = http_probe(&probe("/away"), "127.0.0.1", s.port, SECOND).await;
        assert_eq!((away.result, away.warning), (ProbeResult::Success, true));
        assert!(
            away.output.starts_with("Probe terminated redirects"),
            "{away:?}"
        );
        let big = http_probe(&probe("/big"), "127.0.0.1", s.port, SECOND).await;
        assert_eq!(
            (big.result, big.output.len()),
            (ProbeResult::Success, MAX_BODY)
        );
        let paths = paths(&s);
        assert!(
            paths.contains(&"/ok".to_owned()) && !paths.iter().any(|p| p == "/"),
            "{paths:?}"
        );
    }

    #[tokio::test]
    async fn an_http_probe_sends_at_most_ten_requests() {
        let s = routes().await;
        let looping = http_probe(&http("/loop", s.port, &[]), "127.0.0.1", s.port, SECOND).await;
        assert_eq!(
            looping,
            Outcome::failure("Get \"/loop\": stopped after 10 redirects")
        );
        // Go's checkRedirect `len(via) >= 10`: the first request and 9 redirects.
        assert_eq!(paths(&s), vec!["/loop".to_owned(); 10]);
    }

    #[tokio::test]
    async fn only_the_redirect_codes_go_follows_are_followed() {
        let s = routes().await;
        for path in ["/temporary", "/permanent", "/see-other"] {
            let out = http_probe(&http(path, s.port, &[]), "127.0.0.1", s.port, SECOND).await;
            assert_eq!(out, Outcome::success("fine"), "{path}");
        }
        assert_eq!(
            paths(&s),
            [
                "/temporary",
                "/ok",
                "/permanent",
                "/ok?x=1",
                "/see-other",
                "/ok"
            ]
        );
        // Other 3xx codes, and a redirect without a Location, are the final response:
        // a success with a warning.
        s.heads.lock().unwrap().clear();
        for (path, body) in [
            ("/choices", "pick"),
            ("/not-modified", ""),
            ("/no-location", "nowhere"),
        ] {
            let out = http_probe(&http(path, s.port, &[]), "127.0.0.1", s.port, SECOND).await;
            assert_eq!(
                out,
                Outcome::warning(format!("Probe terminated redirects, Response body: {body}")),
                "{path}"
            );
        }
        assert_eq!(paths(&s), ["/choices", "/not-modified", "/no-location"]);
    }

    #[tokio::test]
    async fn a_scheme_relative_location_keeps_the_scheme_and_the_host_rule() {
        let target = routes().await;
        let port = target.port;
        let s = server(move |head| match path_of(head) {
            "/other-port" => Some(reply(
                "302 Found",
                &format!("Location: //127.0.0.1:{port}/ok\r\n"),
                "",
            )),
            _ => None,
        })
        .await;
        // The same host name on another port is followed.
        let out = http_probe(
            &http("/other-port", s.port, &[]),
            "127.0.0.1",
            s.port,
            SECOND,
        )
        .await;
        assert_eq!(out, Outcome::success("fine"));
        assert_eq!(paths(&target), ["/ok"]);
        // Another host is not.
        let away = http_probe(
            &http("/away-relative-scheme", port, &[]),
            "127.0.0.1",
            port,
            SECOND,
        )
        .await;
        assert_eq!((away.result, away.warning), (ProbeResult::Success, true));
        assert_eq!(paths(&target), ["/ok", "/away-relative-scheme"]);
    }

    #[tokio::test]
    async fn http_probes_send_the_kubelets_headers_and_the_probes_own() {
        let s = routes().await;
        let p = http(
            "/ok",
            s.port,
            &[
                ("X-Custom", "yes"),
                ("Host", "example.test"),
                ("X-Multi", "a"),
                ("x-multi", "b"),
            ],
        );
        assert_eq!(
            http_probe(&p, "127.0.0.1", s.port, SECOND).await.result,
            ProbeResult::Success
        );
        let head = s.heads.lock().unwrap()[0].to_lowercase();
        assert!(head.contains("user-agent: kube-probe/1.33"), "{head}");
        assert!(head.contains("accept: */*"), "{head}");
        assert!(head.contains("x-custom: yes"), "{head}");
        assert!(
            head.contains("x-multi: a") && head.contains("x-multi: b"),
            "every value is sent: {head}"
        );
        assert!(
            head.contains("host: example.test") && !head.contains("host: 127.0.0.1"),
            "{head}"
        );
        assert_eq!(head.matches("host:").count(), 1, "{head}");
        let p = http(
            "/ok",
            s.port,
            &[("User-Agent", "mine"), ("Accept", "text/plain")],
        );
        http_probe(&p, "127.0.0.1", s.port, SECOND).await;
        let head = s.heads.lock().unwrap()[1].to_lowercase();
        assert!(
            head.contains("user-agent: mine") && !head.contains("kube-probe"),
            "{head}"
        );
        assert!(
            head.contains("accept: text/plain") && !head.contains("*/*"),
            "{head}"
        );
        // An empty Accept removes the header; an empty User-Agent sends none.
        let p = http("/ok", s.port, &[("Accept", ""), ("User-Agent", "")]);
        http_probe(&p, "127.0.0.1", s.port, SECOND).await;
        let head = s.heads.lock().unwrap()[2].to_lowercase();
        assert!(
            !head.contains("accept:") && !head.contains("user-agent:"),
            "{head}"
        );
    }

    #[tokio::test]
    async fn a_redirect_carries_the_headers_a_referer_and_a_custom_host_if_relative() {
        let s = routes().await;
        let p = http(
            "/here",
            s.port,
            &[("Host", "example.test"), ("X-Custom", "yes")],
        );
        assert_eq!(
            http_probe(&p, "127.0.0.1", s.port, SECOND).await,
            Outcome::success("fine")
        );
        let heads = s.heads.lock().unwrap().clone();
        assert_eq!(heads.len(), 2);
        let second = heads[1].to_lowercase();
        assert!(second.starts_with("get /ok "), "{second}");
        assert!(
            second.contains("host: example.test") && second.contains("x-custom: yes"),
            "{second}"
        );
        assert!(
            second.contains(&format!("referer: http://127.0.0.1:{}/here", s.port)),
            "{second}"
        );
    }

    #[test]
    fn exec_errors_are_unknown_except_the_runtimes_timeout() {
        let command = vec!["check".to_owned()];
        let timeout = wasmlet_runtime::Error::Timeout {
            operation: "ExecSync",
            after: SECOND,
        };
        assert_eq!(exec_error(&command, timeout).result, ProbeResult::Failure);
        // Whatever its text says.
        for e in [
            wasmlet_runtime::Error::internal("context deadline exceeded"),
            wasmlet_runtime::Error::unavailable("timeout dialing"),
            wasmlet_runtime::Error::not_found("container", "c1"),
        ] {
            assert_eq!(exec_error(&command, e).result, ProbeResult::Unknown);
        }
    }

    #[tokio::test]
    async fn a_hung_http_probe_fails_at_its_timeout_and_closes_its_connection() {
        let s = routes().await;
        let began = std::time::Instant::now();
        let out = http_probe(
            &http("/hang", s.port, &[]),
            "127.0.0.1",
            s.port,
            Duration::from_millis(300),
        )
        .await;
        let took = began.elapsed();
        assert_eq!(out.result, ProbeResult::Failure);
        assert!(out.output.contains("context deadline exceeded"), "{out:?}");
        assert!(took < Duration::from_secs(2), "{took:?}");
        // The probe's connection is closed, not left open (no leaked socket or task).
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while *s.closed.lock().unwrap() == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the connection stayed open"
            );
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn tcp_probes_connect_and_close() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        assert_eq!(
            tcp_probe("127.0.0.1", port, SECOND).await.result,
            ProbeResult::Success
        );
        drop(listener);
        let refused = tcp_probe("127.0.0.1", port, SECOND).await;
        assert_eq!(refused.result, ProbeResult::Failure);
        assert!(refused.output.contains("refused"), "{refused:?}");
    }

    #[test]
    fn ports_are_numbers_or_container_port_names() {
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "c", "ports": [{"name": "http", "containerPort": 8080}],
        }))
        .unwrap();
        assert_eq!(port(&IntOrString::Int(80), &c), Ok(80));
        assert_eq!(port(&IntOrString::String("http".into()), &c), Ok(8080));
        assert_eq!(port(&IntOrString::String("81".into()), &c), Ok(81));
        assert!(
            port(&IntOrString::String("grpc".into()), &c)
                .unwrap_err()
                .contains("no container port named")
        );
        assert!(port(&IntOrString::Int(0), &c).is_err());
        assert!(port(&IntOrString::Int(70000), &c).is_err());
    }

    #[tokio::test]
    async fn a_probe_with_an_unknown_port_name_is_unknown_not_failed() {
        let c = Container::default();
        let probe = Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::String("nope".into()),
                host: None,
            }),
            ..Default::default()
        };
        let t = Target {
            probe: &probe,
            kind: crate::probe_results::ProbeKind::Liveness,
            container: &c,
            container_id: "id",
            pod_ip: "127.0.0.1",
            runtime: None,
            timeout: SECOND,
        };
        assert_eq!(run(&t).await.result, ProbeResult::Unknown);
    }

    #[tokio::test]
    async fn grpc_probes_call_the_health_service() {
        let server = wasmlet_testkit::health::HealthServer::start(true).unwrap();
        let port = i32::from(server.port);
        let serving = grpc_probe("127.0.0.1", port, "", SECOND).await;
        assert_eq!(serving.result, ProbeResult::Success, "{serving:?}");
        let down = grpc_probe("127.0.0.1", port, "db", SECOND).await;
        assert_eq!(
            down,
            Outcome::failure("service unhealthy (responded with \"NOT_SERVING\")")
        );
        let unknown = grpc_probe("127.0.0.1", port, "other", SECOND).await;
        assert_eq!(unknown.result, ProbeResult::Failure);
        assert!(unknown.output.contains("NotFound"), "{unknown:?}");
        let free = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let nobody = i32::from(free.local_addr().unwrap().port());
        drop(free);
        let refused = grpc_probe("127.0.0.1", nobody, "", SECOND).await;
        assert_eq!(refused.result, ProbeResult::Failure);
        assert!(refused.output.contains("failed to connect"), "{refused:?}");
    }
}
