//! `pod-network`: how a probe plugin reaches the pod it checks, and only it.
//!
//! The call's store (`state::CallState`) offers it to probe plugins as the
//! `pod-network` interface.

use std::net::{IpAddr, SocketAddr};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::header::{HOST, HeaderName, HeaderValue, USER_AGENT};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::types::{HttpResponse, Pair};

/// `http-get` keeps this much of a body.
pub(crate) const BODY_MAX: usize = 64 * 1024;
/// The `User-Agent` of `http-get` unless the plugin sets one.
const USER_AGENT_VALUE: &str = "wasmlet-plugin-probe/0.1";

/// The addresses a probe call may reach, and until when.
pub(crate) struct PodNetwork {
    ips: Vec<IpAddr>,
    deadline: Instant,
}

impl PodNetwork {
    /// `pod_ips` as the probe request lists them; ones that do not parse are ignored.
    pub(crate) fn new(pod_ips: &[String], deadline: Instant) -> Self {
        PodNetwork {
            ips: pod_ips.iter().filter_map(|ip| ip.parse().ok()).collect(),
            deadline,
        }
    }

    fn check(&self, ip: &str) -> Result<IpAddr, String> {
        let addr: IpAddr = ip
            .parse()
            .map_err(|_| format!("{ip:?} is not an IP address"))?;
        if !self.ips.contains(&addr) {
            return Err(format!("{ip} is not one of the pod's IPs"));
        }
        Ok(addr)
    }

    pub(crate) async fn http_get(
        &self,
        ip: &str,
        port: u16,
        path: &str,
        headers: &[Pair],
    ) -> Result<HttpResponse, String> {
        let addr = SocketAddr::new(self.check(ip)?, port);
        if !path.starts_with('/') {
            return Err(format!("path {path:?} does not start with '/'"));
        }
        let mut request = hyper::Request::get(path)
            .body(Empty::<Bytes>::new())
            .map_err(|e| format!("bad request: {e}"))?;
        let map = request.headers_mut();
        map.insert(
            HOST,
            HeaderValue::from_str(&addr.to_string()).map_err(|e| e.to_string())?,
        );
        map.insert(USER_AGENT, HeaderValue::from_static(USER_AGENT_VALUE));
        let mut set = Vec::new();
        for pair in headers {
            let name = HeaderName::from_bytes(pair.key.as_bytes())
                .map_err(|_| format!("bad header name {:?}", pair.key))?;
            let value = HeaderValue::from_str(&pair.value)
                .map_err(|_| format!("bad value for header {}", pair.key))?;
            // The plugin's headers replace the defaults; repeated ones are all sent.
            if !set.contains(&name) {
                map.remove(&name);
                set.push(name.clone());
            }
            map.append(name, value);
        }
        let exchange = async {
            let stream = TcpStream::connect(addr)
                .await
                .map_err(|e| format!("connecting to {addr}: {e}"))?;
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| format!("HTTP handshake with {addr}: {e}"))?;
            let conn = AbortOnDrop(tokio::spawn(conn));
            let response = sender
                .send_request(request)
                .await
                .map_err(|e| format!("GET http://{addr}{path}: {e}"))?;
            let status = response.status().as_u16();
            let headers = response
                .headers()
                .iter()
                .map(|(k, v)| Pair {
                    key: k.as_str().to_string(),
                    value: String::from_utf8_lossy(v.as_bytes()).into_owned(),
                })
                .collect();
            let mut body = response.into_body();
            let mut bytes = Vec::new();
            while bytes.len() < BODY_MAX {
                match body.frame().await {
                    None => break,
                    Some(Ok(frame)) => {
                        if let Some(data) = frame.data_ref() {
                            let room = BODY_MAX - bytes.len();
                            bytes.extend_from_slice(&data[..data.len().min(room)]);
                        }
                    }
                    Some(Err(e)) => return Err(format!("reading the body from {addr}: {e}")),
                }
            }
            drop(conn);
            Ok(HttpResponse {
                status,
                headers,
                body: bytes,
            })
        };
        tokio::time::timeout_at(self.deadline, exchange)
            .await
            .map_err(|_| format!("GET http://{addr}{path}: the probe's deadline passed"))?
    }

    pub(crate) async fn tcp_connect(&self, ip: &str, port: u16) -> Result<(), String> {
        let addr = SocketAddr::new(self.check(ip)?, port);
        match tokio::time::timeout_at(self.deadline, TcpStream::connect(addr)).await {
            Ok(Ok(_stream)) => Ok(()),
            Ok(Err(e)) => Err(format!("connecting to {addr}: {e}")),
            Err(_) => Err(format!("connecting to {addr}: the probe's deadline passed")),
        }
    }
}

struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn net(ips: &[&str]) -> PodNetwork {
        let ips: Vec<String> = ips.iter().map(|s| s.to_string()).collect();
        PodNetwork::new(&ips, Instant::now() + Duration::from_secs(5))
    }

    #[tokio::test]
    async fn other_addresses_are_refused_before_connecting() {
        let n = net(&["127.0.0.1"]);
        let err = n.tcp_connect("10.1.2.3", 80).await.unwrap_err();
        assert!(err.contains("not one of the pod's IPs"), "{err}");
        let err = n.http_get("localhost", 80, "/", &[]).await.unwrap_err();
        assert!(err.contains("not an IP address"), "{err}");
        let err = n.http_get("::1", 80, "/", &[]).await.unwrap_err();
        assert!(err.contains("not one of the pod's IPs"), "{err}");
    }

    #[tokio::test]
    async fn http_get_caps_the_body_and_does_not_follow_redirects() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut req = vec![0; 4096];
            let n = s.read(&mut req).await.unwrap();
            let req = String::from_utf8_lossy(&req[..n]).into_owned();
            let body = vec![b'a'; 100_000];
            let head = format!(
                "HTTP/1.1 302 Found\r\nLocation: http://10.9.9.9/\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            s.write_all(head.as_bytes()).await.unwrap();
            let _ = s.write_all(&body).await;
            req
        });
        let n = net(&["127.0.0.1"]);
        let headers = [Pair {
            key: "x-probe".into(),
            value: "1".into(),
        }];
        let r = n
            .http_get("127.0.0.1", port, "/healthz", &headers)
            .await
            .unwrap();
        assert_eq!(r.status, 302);
        assert_eq!(r.body.len(), BODY_MAX);
        assert!(r.headers.iter().any(|p| p.key == "location"));
        let req = server.await.unwrap();
        assert!(req.starts_with("GET /healthz HTTP/1.1\r\n"), "{req}");
        assert!(req.contains("x-probe: 1"), "{req}");
        assert!(req.contains(&format!("host: 127.0.0.1:{port}")), "{req}");
    }

    #[tokio::test]
    async fn calls_end_by_the_deadline() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        // Accepts and never answers.
        let _server = tokio::spawn(async move {
            let (_s, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(60)).await;
        });
        let n = PodNetwork::new(
            &["127.0.0.1".into()],
            Instant::now() + Duration::from_millis(100),
        );
        let started = std::time::Instant::now();
        let err = n.http_get("127.0.0.1", port, "/", &[]).await.unwrap_err();
        assert!(err.contains("deadline"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
