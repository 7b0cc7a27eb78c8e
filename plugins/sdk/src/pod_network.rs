//! How a probe reaches the container it checks (the `probe-plugin` world only).
//!
//! Only the addresses in the probe request's `pod_ips` are reachable, only within
//! the probe's deadline; the node refuses any other address before connecting.
//! Off `wasm32` both functions return an error: there is no node to ask.

use crate::types::Pair;

pub use crate::bindings::probe_world::wasmlet::plugin::pod_network::HttpResponse;

/// `GET http://<ip>:<port><path>` with extra request `headers`. Redirects are not
/// followed; the body is cut at 64 KiB. `Err` carries the node's reason (refused
/// address, connection error, deadline).
pub fn http_get(
    ip: &str,
    port: u16,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<HttpResponse, String> {
    let headers: Vec<Pair> = headers.iter().map(|&(k, v)| Pair::new(k, v)).collect();
    #[cfg(target_arch = "wasm32")]
    let response = crate::bindings::probe_world::wasmlet::plugin::pod_network::http_get(
        ip, port, path, &headers,
    );
    #[cfg(not(target_arch = "wasm32"))]
    let response = {
        let _ = (path, headers);
        Err(off_wasm("GET", ip, port))
    };
    response
}

/// Opens and closes a TCP connection to `<ip>:<port>`, as a tcpSocket probe does.
pub fn tcp_connect(ip: &str, port: u16) -> Result<(), String> {
    #[cfg(target_arch = "wasm32")]
    let connected =
        crate::bindings::probe_world::wasmlet::plugin::pod_network::tcp_connect(ip, port);
    #[cfg(not(target_arch = "wasm32"))]
    let connected = Err(off_wasm("connect", ip, port));
    connected
}

#[cfg(not(target_arch = "wasm32"))]
fn off_wasm(what: &str, ip: &str, port: u16) -> String {
    format!("{what} {ip}:{port}: pod-network is only available inside the node")
}

impl HttpResponse {
    /// Whether the status counts as a probe success (200–399, as the kubelet's).
    pub fn is_success(&self) -> bool {
        (200..400).contains(&self.status)
    }

    /// The first header named `name`, compared case-insensitively.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|h| h.key.eq_ignore_ascii_case(name))
            .map(|h| h.value.as_str())
    }

    /// The body as text, with invalid UTF-8 replaced.
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn success_is_2xx_and_3xx() {
        let response = |status| HttpResponse {
            status,
            headers: vec![Pair::new("Content-Type", "application/json")],
            body: b"{}".to_vec(),
        };
        assert!(response(200).is_success());
        assert!(response(302).is_success());
        assert!(!response(199).is_success());
        assert!(!response(404).is_success());
        assert_eq!(
            response(200).header("content-type"),
            Some("application/json")
        );
        assert_eq!(response(200).text(), "{}");
    }

    #[test]
    fn off_wasm_the_network_is_an_error() {
        assert!(
            http_get("10.0.0.1", 80, "/", &[])
                .unwrap_err()
                .contains("inside the node")
        );
        assert!(tcp_connect("10.0.0.1", 80).is_err());
    }
}
