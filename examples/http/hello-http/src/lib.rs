//! `hello-http`: a `wasi:http/proxy` component. The node serves it on its container's
//! port and makes a new instance of it per request.
//!
//! Routes (any method):
//! - `/`: 200 `hello from wasi:http`;
//! - `/echo`: 200, the method, the path and query, and the request body, one per line;
//!   also prints `echo <path>` to stdout (the container's log);
//! - `/env?name=NAME`: 200, the value of the environment variable (the container's
//!   environment reaches every request), 404 when it is not set;
//! - `/alloc?mib=N`: allocates and touches N MiB, then 200 `allocated N MiB` (past the
//!   container's memory limit the instance traps and the node answers 500);
//! - anything else: 404.

use std::io::{Read as _, Write as _};

use wasi::http::types::{
    Fields, IncomingRequest, Method, OutgoingBody, OutgoingResponse, ResponseOutparam,
};

wasi::http::proxy::export!(Hello);

struct Hello;

impl wasi::exports::http::incoming_handler::Guest for Hello {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let target = request.path_with_query().unwrap_or_else(|| "/".into());
        let (path, query) = target.split_once('?').unwrap_or((&target, ""));
        let param = |name: &str| {
            query
                .split('&')
                .filter_map(|kv| kv.split_once('='))
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_owned())
        };
        let (status, body) = match path {
            "/" => (200, "hello from wasi:http\n".to_owned()),
            "/echo" => {
                let method = method_name(&request.method());
                let mut body = Vec::new();
                if let Ok(incoming) = request.consume()
                    && let Ok(mut stream) = incoming.stream()
                {
                    let _ = stream.read_to_end(&mut body);
                }
                println!("echo {target}");
                (
                    200,
                    format!("{method}\n{target}\n{}\n", String::from_utf8_lossy(&body)),
                )
            }
            "/env" => match param("name").and_then(|n| std::env::var(n).ok()) {
                Some(v) => (200, format!("{v}\n")),
                None => (404, "not set\n".to_owned()),
            },
            "/alloc" => {
                let mib: usize = param("mib").and_then(|m| m.parse().ok()).unwrap_or(1);
                let mut block = vec![0u8; mib << 20];
                for i in (0..block.len()).step_by(4096) {
                    block[i] = 1;
                }
                (200, format!("allocated {} MiB\n", block.len() >> 20))
            }
            _ => (404, "not found\n".to_owned()),
        };
        respond(out, status, body.as_bytes());
    }
}

fn method_name(m: &Method) -> String {
    match m {
        Method::Get => "GET".into(),
        Method::Head => "HEAD".into(),
        Method::Post => "POST".into(),
        Method::Put => "PUT".into(),
        Method::Delete => "DELETE".into(),
        Method::Connect => "CONNECT".into(),
        Method::Options => "OPTIONS".into(),
        Method::Trace => "TRACE".into(),
        Method::Patch => "PATCH".into(),
        Method::Other(other) => other.clone(),
    }
}

fn respond(out: ResponseOutparam, status: u16, body: &[u8]) {
    let headers = Fields::new();
    let _ = headers.set("content-type", &[b"text/plain".to_vec()]);
    let _ = headers.set("content-length", &[body.len().to_string().into_bytes()]);
    let response = OutgoingResponse::new(headers);
    let _ = response.set_status_code(status);
    let outgoing = response.body().expect("a response has one body");
    ResponseOutparam::set(out, Ok(response));
    let mut stream = outgoing.write().expect("a body has one stream");
    let _ = stream.write_all(body);
    let _ = stream.flush();
    drop(stream);
    let _ = OutgoingBody::finish(outgoing, None);
}
