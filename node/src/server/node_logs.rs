//! `/logs/`: the node's own logs, as the kubelet serves them with
//! `enableSystemLogHandler` (on by default) — a file server over `/var/log`, with Go's
//! `http.FileServer` behaviour where clients can see it: a directory is listed as
//! `<pre>` links (subdirectories with a trailing `/`, sorted by name), a directory
//! asked for without its trailing slash is redirected (301) to it, a file asked for
//! with one is redirected to the name without, a file is streamed as it is.
//!
//! The path is cleaned as Go cleans it (`.` dropped, `..` never above the root, the
//! request's percent-encoding already undone), so no request names a file outside the
//! root. Unlike Go's, a symbolic link is followed only when its target is inside the
//! root too: otherwise the answer is 403, so a link under `/var/log` cannot hand out
//! files the node's administrator did not put there. `enableSystemLogQuery` (the
//! `?query=` interface of the NodeLogQuery gate) is off, as it is by default: query
//! parameters are ignored, as the kubelet ignores them then.
//!
//! Authorized as `nodes/log` (see [`super::authz`]).

use std::path::{Path, PathBuf};

use axum::body::Body;
use axum::extract::State;
use axum::http::Uri;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::{NOT_FOUND_TEXT, not_found, text};

/// The directory the kubelet serves.
pub const SYSTEM_LOG_DIR: &str = "/var/log";

/// Where `/logs/` reads.
#[derive(Clone, Debug)]
pub struct NodeLogs {
    pub root: PathBuf,
}

fn redirect(to: &str) -> Response {
    (StatusCode::MOVED_PERMANENTLY, [(header::LOCATION, to)]).into_response()
}

/// The routes of `/logs/` (the bare `/logs` is redirected to it), reading `logs`.
pub fn router(logs: NodeLogs) -> axum::Router {
    use axum::routing::get;
    axum::Router::new()
        .route("/logs", get(serve))
        .route("/logs/", get(serve))
        .route("/logs/{*path}", get(serve))
        .with_state(logs)
}

/// The segments of `path` below the root, cleaned as Go's `path.Clean("/" + path)`.
pub fn clean(path: &str) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            s => out.push(s),
        }
    }
    out
}

/// `GET /logs/{path}`: what is below `/logs/` in the request's (decoded) path.
pub async fn serve(State(logs): State<NodeLogs>, uri: Uri) -> Response {
    let raw = uri.path();
    let Some(rest) = raw.strip_prefix("/logs") else {
        return not_found();
    };
    let decoded = match percent_decode(rest) {
        Some(d) => d,
        None => return text(StatusCode::BAD_REQUEST, "invalid URL escape in the path\n"),
    };
    let segments = clean(&decoded);
    let target = segments.iter().fold(logs.root.clone(), |p, s| p.join(s));
    let trailing_slash = decoded.ends_with('/');
    let last = segments.last().copied().unwrap_or("logs");
    match tokio::task::spawn_blocking(move || resolve(&logs.root, &target)).await {
        Ok(Ok(Entry::Dir(_))) if !trailing_slash => redirect(&format!("{last}/")),
        Ok(Ok(Entry::Dir(path))) => listing(&path).await,
        Ok(Ok(Entry::File(_))) if trailing_slash => redirect(&format!("../{last}")),
        Ok(Ok(Entry::File(path))) => file(&path).await,
        Ok(Err((code, message))) => text(code, message),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
    }
}

enum Entry {
    Dir(PathBuf),
    File(PathBuf),
}

/// What `target` is, its symbolic links resolved and kept inside `root`; or the
/// status and message of the refusal.
fn resolve(root: &Path, target: &Path) -> Result<Entry, (StatusCode, &'static str)> {
    const NOT_FOUND: (StatusCode, &str) = (StatusCode::NOT_FOUND, NOT_FOUND_TEXT);
    let root = std::fs::canonicalize(root).map_err(|_| NOT_FOUND)?;
    let real = match std::fs::canonicalize(target) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Err((StatusCode::FORBIDDEN, "403 Forbidden\n"));
        }
        Err(_) => return Err(NOT_FOUND),
    };
    if !real.starts_with(&root) {
        return Err((
            StatusCode::FORBIDDEN,
            "403 Forbidden: a symbolic link out of the log directory\n",
        ));
    }
    match std::fs::metadata(&real) {
        Ok(m) if m.is_dir() => Ok(Entry::Dir(real)),
        Ok(_) => Ok(Entry::File(real)),
        Err(_) => Err(NOT_FOUND),
    }
}

/// Go's `dirList`: the entries as links, directories with a trailing slash.
async fn listing(dir: &Path) -> Response {
    let mut read = match tokio::fs::read_dir(dir).await {
        Ok(r) => r,
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
    };
    let mut names: Vec<String> = Vec::new();
    while let Ok(Some(entry)) = read.next_entry().await {
        let mut name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type().await.is_ok_and(|t| t.is_dir()) {
            name.push('/');
        }
        names.push(name);
    }
    names.sort();
    let mut body = String::from(
        "<!doctype html>\n<meta name=\"viewport\" content=\"width=device-width\">\n<pre>\n",
    );
    for name in names {
        body.push_str(&format!(
            "<a href=\"{}\">{}</a>\n",
            percent_encode(&name),
            html_escape(&name)
        ));
    }
    body.push_str("</pre>\n");
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response()
}

/// The file, streamed; its type sniffed from the first bytes as text or not.
async fn file(path: &Path) -> Response {
    use tokio::io::AsyncReadExt;
    let mut f = match tokio::fs::File::open(path).await {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return text(StatusCode::FORBIDDEN, "403 Forbidden\n");
        }
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
    };
    let len = f.metadata().await.map(|m| m.len()).ok();
    let mut head = vec![0u8; 512];
    let n = f.read(&mut head).await.unwrap_or(0);
    head.truncate(n);
    let kind = if head.contains(&0) {
        "application/octet-stream"
    } else {
        "text/plain; charset=utf-8"
    };
    let rest = tokio_util::io::ReaderStream::new(f);
    let stream = futures::StreamExt::chain(
        futures::stream::once(std::future::ready(Ok::<_, std::io::Error>(
            bytes::Bytes::from(head),
        ))),
        rest,
    );
    let mut resp = Response::new(Body::from_stream(stream));
    let headers = resp.headers_mut();
    headers.insert(header::CONTENT_TYPE, header::HeaderValue::from_static(kind));
    if let Some(len) = len {
        headers.insert(header::CONTENT_LENGTH, len.into());
    }
    resp
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&#34;")
        .replace('\'', "&#39;")
}

/// A path segment for an `href` (Go's `url.URL{Path: name}.String()`): everything but
/// unreserved characters and `/` escaped.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The path's `%XX` escapes undone; `None` for a malformed one or bytes that are not
/// UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
#[path = "node_logs_tests.rs"]
mod tests;
