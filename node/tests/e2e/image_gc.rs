//! Image garbage collection by disk usage, on a real filesystem: a standalone node whose
//! root directory (and so its Wasm image store) is on a 128 MiB loop-mounted ext4. Four
//! images of 5 MiB each: A never used, B used and then not, C used after B, D in use
//! throughout. Each time the test fills the filesystem past the high threshold, one
//! pass frees down to the low threshold, least recently used first, and D stays.

use std::path::{Path, PathBuf};
use std::time::Duration;

use wasmlet_testkit::images::ensure_example_images;
use wasmlet_testkit::images::{WasmImage, WasmLayout, manifest_digest, write_oci_archive};
use wasmlet_testkit::node::{NodeOptions, poll};

use crate::eviction::LoopFs;
use crate::*;

const MIB: usize = 1 << 20;
const HIGH: u64 = 50;
const LOW: u64 = 48;

/// `wasm` with a custom section `name` of `pad` bytes appended: the same program,
/// another binary (and image digest) of a chosen size.
fn padded(wasm: &[u8], name: &str, pad: usize) -> Vec<u8> {
    fn leb(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let mut payload = Vec::new();
    leb(name.len(), &mut payload);
    payload.extend_from_slice(name.as_bytes());
    payload.resize(payload.len() + pad, 0);
    let mut out = wasm.to_vec();
    out.push(0);
    leb(payload.len(), &mut out);
    out.extend(payload);
    out
}

/// The filesystem's capacity and available bytes, as image GC reads them.
fn usage(path: &Path) -> (u64, u64) {
    let s = nix::sys::statvfs::statvfs(path).unwrap();
    let frsize = s.fragment_size() as u64;
    (
        s.blocks() as u64 * frsize,
        s.blocks_available() as u64 * frsize,
    )
}

/// Writes a file that brings the filesystem's use to `percent` of its capacity.
fn fill_to(fs: &Path, file: &str, percent: u64) {
    use std::io::Write as _;
    let (capacity, available) = usage(fs);
    let target_available = capacity * (100 - percent) / 100;
    let mut left = available.saturating_sub(target_available) as usize;
    let mut f = std::fs::File::create(fs.join(file)).unwrap();
    let chunk = vec![0x5a_u8; MIB];
    while left > 0 {
        let n = left.min(MIB);
        f.write_all(&chunk[..n]).unwrap();
        left -= n;
    }
    f.sync_all().unwrap();
}

fn percent_used(fs: &Path) -> u64 {
    let (capacity, available) = usage(fs);
    (capacity - available) * 100 / capacity
}

/// The image ids the node's log says image GC removed, in order.
fn removed(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains("image garbage collection: removed an image"))
        .filter_map(|l| {
            let at = l.find("image=")? + "image=".len();
            Some(l[at..].split_whitespace().next()?.to_owned())
        })
        .collect()
}

/// The image GC detection passes in the node's log, as the images each found in use.
fn detections(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains("image garbage collection: detected"))
        .map(str::to_owned)
        .collect()
}

/// Waits for a detection pass, begun after this call, that finds exactly `in_use`
/// (image names) in use: from then on the images' last uses are ordered.
fn wait_detection(node: &crate::Fixture, in_use: &[&str]) {
    let before = detections(&node.log()).len();
    let found = poll(LONG, || {
        let all = detections(&node.log());
        all.into_iter().skip(before + 1).find(|l| {
            let Some(list) = l.split("in_use=").nth(1) else {
                return false;
            };
            let names = list.split(']').next().unwrap_or_default();
            let count = names.matches("wasmlet-examples/").count();
            count == in_use.len() && in_use.iter().all(|n| names.contains(&image(n)))
        })
    });
    assert!(
        found.is_some(),
        "no image GC pass found exactly {in_use:?} in use; log tail:\n{}",
        wasmlet_testkit::node::tail(&node.log(), 20)
    );
}

#[test]
fn image_gc_frees_to_the_low_threshold_least_recently_used_first_and_keeps_images_in_use() {
    let fs = LoopFs::new(128);
    let examples = ensure_example_images().expect("example images");
    let hello = std::fs::read(examples.join("hello.wasm")).unwrap();
    let ticker = std::fs::read(examples.join("ticker.wasm")).unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let mut archives: Vec<PathBuf> = Vec::new();
    let mut digests = std::collections::BTreeMap::new();
    for (name, wasm) in [
        ("gc-a", &hello),
        ("gc-b", &hello),
        ("gc-c", &hello),
        ("gc-d", &ticker),
    ] {
        let img = WasmImage::new(
            image(name),
            padded(wasm, name, 5 * MIB),
            WasmLayout::Artifact,
        );
        let out = scratch.path().join(format!("{name}.tar"));
        write_oci_archive(&img, &out).unwrap();
        digests.insert(manifest_digest(&img).unwrap(), name);
        archives.push(out);
    }
    let node = start_with(NodeOptions {
        image_archives: archives,
        base_dir: Some(fs.path()),
        kubelet_config: format!(
            "imageGCHighThresholdPercent: {HIGH}\nimageGCLowThresholdPercent: {LOW}\nimageMinimumGCAge: 0s\n"
        ),
        wasmlet_config: "  imageGCPeriod: 1s\n".into(),
        ..Default::default()
    });
    // The archives were imported at start; the store holds the images from then on.
    poll(LONG, || {
        (node.log().matches("imported image").count() == 4).then_some(())
    })
    .expect("the four images imported");
    for entry in std::fs::read_dir(node.root.join("images")).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }
    let names_removed = || -> Vec<&str> {
        removed(&node.log())
            .iter()
            .map(|id| digests.get(id.as_str()).copied().unwrap_or("?"))
            .collect()
    };

    // D runs throughout; B runs to completion and goes, then C does.
    node.write_manifest("d.yaml", &manifest("d", "gc-d", "Always", ""))
        .unwrap();
    node.wait_pod("d", LONG, is_running).unwrap();
    for (pod, img) in [("b", "gc-b"), ("c", "gc-c")] {
        node.write_manifest(&format!("{pod}.yaml"), &manifest(pod, img, "Never", ""))
            .unwrap();
        node.wait_pod(pod, LONG, |p| phase(p) == "Succeeded")
            .unwrap();
        wait_detection(&node, &["gc-d", img]);
        node.remove_manifest(&format!("{pod}.yaml")).unwrap();
        node.wait_gone(pod, LONG).unwrap();
        wait_detection(&node, &["gc-d"]);
    }
    assert!(
        percent_used(&fs.path()) < HIGH,
        "the test's filesystem is {}% used before it is filled",
        percent_used(&fs.path())
    );
    assert_eq!(
        names_removed(),
        Vec::<&str>::new(),
        "removed below the high threshold"
    );

    // Each fill past the high threshold costs the least recently used image, and one
    // is enough to get below the low threshold.
    for (round, expected) in [
        ["gc-a"].as_slice(),
        &["gc-a", "gc-b"],
        &["gc-a", "gc-b", "gc-c"],
    ]
    .into_iter()
    .enumerate()
    {
        fill_to(&fs.path(), &format!("fill-{round}"), HIGH + 1);
        let got = poll(LONG, || {
            let now = names_removed();
            (now.len() >= expected.len()).then_some(now)
        })
        .unwrap_or_else(|| {
            panic!(
                "round {round}: image GC removed {:?}; log tail:\n{}",
                names_removed(),
                wasmlet_testkit::node::tail(&node.log(), 20)
            )
        });
        assert_eq!(got, expected, "round {round}");
        poll(Duration::from_secs(10), || {
            (percent_used(&fs.path()) <= LOW).then_some(())
        })
        .unwrap_or_else(|| {
            panic!(
                "round {round}: {}% used after image GC, above the low threshold {LOW}%",
                percent_used(&fs.path())
            )
        });
    }

    // Over the threshold again with only D left: D is in use and stays, and the node
    // says it could not free enough.
    fill_to(&fs.path(), "fill-last", HIGH + 1);
    poll(LONG, || {
        node.log()
            .contains("Failed to garbage collect required amount of images")
            .then_some(())
    })
    .expect("the node to report that it could not free enough");
    assert_eq!(names_removed(), ["gc-a", "gc-b", "gc-c"]);
    assert!(is_running(&node.pod("d").unwrap()));
    drop(node);
    drop(fs);
}
