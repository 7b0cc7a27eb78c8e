use super::*;
use axum::http::Request;
use http_body_util::BodyExt;
use tower::ServiceExt;

/// A log directory: `syslog`, `sub/app.log`, `a b&c.log`, and a link out of it.
fn fixture() -> (tempfile::TempDir, tempfile::TempDir) {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("syslog"), "line 1\nline 2\n").unwrap();
    std::fs::create_dir(root.path().join("sub")).unwrap();
    std::fs::write(root.path().join("sub/app.log"), "app\n").unwrap();
    std::fs::write(root.path().join("a b&c.log"), "odd\n").unwrap();
    std::fs::write(outside.path().join("secret"), "not a log\n").unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret"), root.path().join("escape")).unwrap();
    std::os::unix::fs::symlink("sub/app.log", root.path().join("inside")).unwrap();
    (root, outside)
}

async fn get_path(root: &Path, path: &str) -> (StatusCode, Option<String>, String) {
    let app = router(NodeLogs {
        root: root.to_path_buf(),
    });
    let resp = app
        .oneshot(Request::get(path).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let location = resp
        .headers()
        .get(header::LOCATION)
        .map(|v| v.to_str().unwrap().to_owned());
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        location,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

#[test]
fn paths_are_cleaned_as_go_cleans_them() {
    assert_eq!(clean("/a/./b/../c/"), ["a", "c"]);
    assert_eq!(clean("/../../etc/passwd"), ["etc", "passwd"]);
    assert!(clean("/").is_empty());
}

#[tokio::test]
async fn the_root_is_listed_with_directories_marked_and_names_escaped() {
    let (root, _outside) = fixture();
    let (status, _, body) = get_path(root.path(), "/logs/").await;
    assert_eq!(status, StatusCode::OK);
    let links: Vec<&str> = body.lines().filter(|l| l.starts_with("<a ")).collect();
    assert_eq!(
        links,
        [
            "<a href=\"a%20b%26c.log\">a b&amp;c.log</a>",
            "<a href=\"escape\">escape</a>",
            "<a href=\"inside\">inside</a>",
            "<a href=\"sub/\">sub/</a>",
            "<a href=\"syslog\">syslog</a>",
        ]
    );
}

#[tokio::test]
async fn files_are_served_and_slashes_redirected_as_go_does() {
    let (root, _outside) = fixture();
    let (status, _, body) = get_path(root.path(), "/logs/syslog").await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::OK, "line 1\nline 2\n")
    );
    let (status, _, body) = get_path(root.path(), "/logs/a%20b%26c.log").await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "odd\n"));
    let (status, location, _) = get_path(root.path(), "/logs/sub").await;
    assert_eq!(status, StatusCode::MOVED_PERMANENTLY);
    assert_eq!(location.as_deref(), Some("sub/"));
    let (status, location, _) = get_path(root.path(), "/logs").await;
    assert_eq!(status, StatusCode::MOVED_PERMANENTLY);
    assert_eq!(location.as_deref(), Some("logs/"));
    let (status, location, _) = get_path(root.path(), "/logs/syslog/").await;
    assert_eq!(status, StatusCode::MOVED_PERMANENTLY);
    assert_eq!(location.as_deref(), Some("../syslog"));
    let (status, _, body) = get_path(root.path(), "/logs/sub/").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("<a href=\"app.log\">app.log</a>"), "{body}");
}

#[tokio::test]
async fn nothing_outside_the_root_is_served() {
    let (root, _outside) = fixture();
    for path in [
        "/logs/../secret",
        "/logs/%2e%2e/secret",
        "/logs/sub/%2E%2E/%2E%2E/secret",
    ] {
        let (status, _, body) = get_path(root.path(), path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
    }
    let (status, _, body) = get_path(root.path(), "/logs/escape").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(!body.contains("not a log"));
    let (status, _, body) = get_path(root.path(), "/logs/inside").await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "app\n"));
    let (status, _, _) = get_path(root.path(), "/logs/missing.log").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, _) = get_path(root.path(), "/logs/bad%zz").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}
