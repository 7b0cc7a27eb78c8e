//! The command line: configuration errors, and the `images` commands.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_wasmlet");

#[test]
fn every_bad_configuration_value_is_reported_and_the_exit_code_is_2() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.yaml");
    std::fs::write(
        &config,
        "readOnlyPort: 99999\nsyncFrequency: soon\nwasmlet: {restartBackoff: {initial: 0s}}\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .arg("--config")
        .arg(&config)
        .args(["--hostname-override", "n", "--root-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for want in [
        "readOnlyPort: 99999",
        "syncFrequency",
        "restartBackoff.initial",
    ] {
        assert!(stderr.contains(want), "missing {want:?}: {stderr}");
    }
}

#[test]
fn a_second_node_on_the_same_root_directory_is_refused() {
    let node = crate::start(&[]);
    let out = Command::new(BIN)
        .args([
            "--hostname-override",
            "n2",
            "--healthz-port",
            "0",
            "--root-dir",
        ])
        .arg(&node.root)
        .arg("--pod-manifest-path")
        .arg(&node.manifests)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("another wasmlet is running with root directory"),
        "{stderr}"
    );
    assert_eq!(
        wasmlet_testkit::node::http_get(node.healthz_port, "/healthz")
            .unwrap()
            .0,
        200,
        "the first node is unaffected"
    );
}

#[test]
fn images_import_list_and_rm() {
    let images = wasmlet_testkit::images::ensure_example_images().unwrap();
    let root = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(BIN)
            .arg("images")
            .arg("--root-dir")
            .arg(root.path())
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let hello = images.join("hello.tar");
    let component = images.join("hello-component.tar");
    let (ok, out, err) = run(&[
        "import",
        hello.to_str().unwrap(),
        component.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("imported localhost/wasmlet-examples/hello:latest sha256:"),
        "{out}"
    );

    let (ok, out, _) = run(&["list"]);
    assert!(ok);
    assert!(
        out.lines()
            .any(|l| l.starts_with("localhost/wasmlet-examples/hello:latest")
                && l.contains("module")),
        "{out}"
    );
    assert!(
        out.lines().any(
            |l| l.starts_with("localhost/wasmlet-examples/hello-component:latest")
                && l.contains("component")
        ),
        "{out}"
    );

    let (ok, out, _) = run(&["rm", "localhost/wasmlet-examples/hello:latest"]);
    assert!(ok);
    assert!(out.contains("removed localhost/wasmlet-examples/hello:latest"));
    let (_, out, _) = run(&["list"]);
    assert!(!out.contains("wasmlet-examples/hello:latest"), "{out}");

    let (ok, _, err) = run(&["rm", "localhost/nope:v1"]);
    assert!(!ok);
    assert!(err.contains("not in the store"), "{err}");

    let junk = root.path().join("junk.tar");
    std::fs::write(&junk, b"not a tar").unwrap();
    let (ok, _, err) = run(&["import", junk.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains("junk.tar"),
        "the error names the archive: {err}"
    );
}
