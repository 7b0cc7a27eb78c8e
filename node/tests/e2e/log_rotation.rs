//! Container log rotation: a node with `containerLogMaxSize: 2Ki`, three files at
//! most and a 3s monitor interval rotates a fast ticker's log while it runs, a Wasm
//! pod's (the sandbox reopens the file) and a containerd pod's; the rotated files
//! keep every tick once, in order, the older ones gzipped.

use std::io::Read;
use std::path::{Path, PathBuf};

use wasmlet_testkit::containerd::{Containerd, images::BUSYBOX_IMAGE};
use wasmlet_testkit::node::{CriRecord, NodeOptions, poll};

use crate::{Fixture, LONG, is_running, manifest, start_with};

/// A log directory's files, oldest first: the rotated ones by name (their
/// timestamps), the current `0.log` last.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort_by_key(|n| (n == "0.log", n.clone()));
    names
}

/// The ticks of one log file, gzipped or not; `None` when it went away meanwhile.
/// A last line still being written is left out.
fn ticks(path: &Path) -> Option<Vec<u64>> {
    let mut text = String::new();
    let file = std::fs::File::open(path).ok()?;
    if path.extension().is_some_and(|e| e == "gz") {
        flate2::read::GzDecoder::new(file)
            .read_to_string(&mut text)
            .ok()?;
    } else {
        (&file).read_to_string(&mut text).ok()?;
    }
    let complete = match text.rfind('\n') {
        Some(end) => &text[..=end],
        None => "",
    };
    complete
        .lines()
        .map(|line| {
            let record = CriRecord::parse(line).expect("CRI records");
            assert!(!record.partial, "no partial record: {line:?}");
            let n = record.text.strip_prefix("tick ")?.parse().ok()?;
            Some(n)
        })
        .collect::<Option<Vec<u64>>>()
        .or_else(|| panic!("{}: not ticks", path.display()))
}

/// Every file of the log and its ticks, read while no rotation happened (the listing
/// is the same before and after).
fn snapshot(dir: &Path) -> Option<Vec<(String, Vec<u64>)>> {
    let before = listing(dir);
    let files = before
        .iter()
        .map(|name| Some((name.clone(), ticks(&dir.join(name))?)))
        .collect::<Option<Vec<_>>>()?;
    (listing(dir) == before).then_some(files)
}

/// The rotation settings of every test here: 2Ki logs, three files, every 3s.
const ROTATION: &str = "containerLogMaxSize: 2Ki\n\
                        containerLogMaxFiles: 3\n\
                        containerLogMonitorInterval: 3s\n";

#[test]
fn a_running_wasm_containers_log_is_rotated_compressed_and_capped_losing_no_tick() {
    let node = start_with(NodeOptions {
        images: vec!["ticker".into()],
        kubelet_config: ROTATION.into(),
        ..Default::default()
    });
    node.write_manifest(
        "rotate.yaml",
        &manifest(
            "rotate",
            "ticker",
            "Always",
            "    env:\n    - name: INTERVAL_MS\n      value: \"5\"\n",
        ),
    )
    .unwrap();
    assert_rotates(&node, "rotate");
}

/// containerd's ReopenContainerLog, for real: a busybox shell counting as fast as it
/// can sleep.
#[test]
fn a_running_cri_containers_log_is_rotated_compressed_and_capped_losing_no_tick() {
    let containerd = Containerd::start().expect("containerd starts");
    containerd.import_test_images().expect("test images import");
    let node = start_with(
        NodeOptions {
            kubelet_config: ROTATION.into(),
            ..Default::default()
        }
        .with_cri(containerd.address()),
    );
    node.write_manifest(
        "rotate.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: rotate}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    image: {BUSYBOX_IMAGE}\n    imagePullPolicy: Never\n    command: [sh, -c, 'i=0; while true; do i=$((i+1)); echo \"tick $i\"; usleep 5000; done']\n"
        ),
    )
    .unwrap();
    assert_rotates(&node, "rotate");
}

/// Waits for the third rotation of the pod's `main` log and checks the files: at
/// most three, the older rotated one gzipped, the newer plain, named by their UTC
/// timestamp, and the ticks continuous across them.
fn assert_rotates(node: &Fixture, pod: &str) {
    let pod = node.wait_pod(pod, LONG, is_running).unwrap();
    let uid = pod.metadata.uid.clone().unwrap();
    let name = pod.metadata.name.clone().unwrap();
    let dir: PathBuf = node.logs.join(format!("default_{name}_{uid}/main"));

    // Three rotations at least: the oldest rotated file has been removed (the first
    // tick kept is past 1) and the one after it compressed.
    let files = poll(LONG, || {
        let files = snapshot(&dir)?;
        assert!(files.len() <= 3, "at most containerLogMaxFiles: {files:?}");
        let gz = files.iter().filter(|(n, _)| n.ends_with(".gz")).count();
        let first = files.first()?.1.first().copied()?;
        // Between the rename and the runtime's reopen there is no `0.log` yet: a
        // listing in that window is not the end state.
        let live = files.iter().any(|(n, _)| n == "0.log");
        (gz >= 1 && first > 1 && live).then_some(files)
    })
    .unwrap_or_else(|| {
        panic!(
            "no third rotation within {LONG:?}: {:?}\nnode log:\n{}",
            listing(&dir),
            wasmlet_testkit::node::tail(&node.log(), 30)
        )
    });

    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(
        names[0].starts_with("0.log.") && names[0].ends_with(".gz"),
        "{names:?}"
    );
    assert!(
        names[1].starts_with("0.log.") && !names[1].ends_with(".gz"),
        "{names:?}"
    );
    assert_eq!(names[2], "0.log", "{names:?}");
    for name in &names[..2] {
        let stamp = name.trim_start_matches("0.log.").trim_end_matches(".gz");
        assert!(
            jiff::fmt::strtime::parse("%Y%m%d-%H%M%S", stamp).is_ok(),
            "a YYYYMMDD-HHMMSS suffix: {name}"
        );
    }
    let all: Vec<u64> = files.iter().flat_map(|(_, t)| t.iter().copied()).collect();
    let first = all[0];
    let expected: Vec<u64> = (first..first + all.len() as u64).collect();
    assert!(
        all == expected,
        "ticks continue across {names:?} with none lost or repeated"
    );
    for (name, t) in &files[..2] {
        assert!(!t.is_empty(), "{name} has ticks");
    }
}
