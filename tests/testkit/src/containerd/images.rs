//! Container images for the private containerd, built from `busybox-static`.
//!
//! Nothing can be pulled here, so the two images every CRI test needs are
//! made on the spot from `/bin/busybox` (Debian package `busybox-static`),
//! rendered with the OCI types of [`crate::images`] ([`OciImage`], [`Blob`],
//! [`ImageConfig`]) and packed into one OCI image-layout archive
//! ([`test_images_archive`], once per process) that one `ctr images import`
//! loads:
//!
//! - [`BUSYBOX_IMAGE`]: `/bin/busybox` plus a symlink per applet the binary
//!   lists (`sh`, `sleep`, `echo`, `cat`, `wget`, `nc`, `httpd`, ...), empty
//!   `/etc`, `/tmp` (mode 1777) and `/root`; `Cmd ["sh"]`, `Env PATH=/bin`.
//! - [`PAUSE_IMAGE`]: the same layer with [`PAUSE_ENTRYPOINT`], the CRI
//!   plugin's `sandbox_image`. It does the two jobs of the real pause: as
//!   PID 1 of a pod's shared PID namespace (`NamespaceMode::POD`, which is
//!   also what an unset `namespace_options` means) it reaps orphans (ash's
//!   `wait` calls `waitpid(-1)`), and it exits on SIGTERM and SIGINT (a
//!   trapped signal interrupts `wait`). A bare `sleep infinity` would do
//!   neither: PID 1 ignores signals it has no handler for, so only SIGKILL
//!   stops it (which is what containerd 1.6's `StopPodSandbox` sends anyway),
//!   and zombies would pile up under it.
//!
//! Both are `linux/amd64` images with one uncompressed tar layer
//! ([`TAR_LAYER_MEDIA_TYPE`]) whose entries carry mtime 0 and uid/gid 0, so
//! the archives (and the manifest digests) depend only on the busybox binary.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, bail, ensure};

use crate::images::{
    Blob, CREATED, ExecConfig, IMAGE_CONFIG_MEDIA_TYPE, INDEX_MEDIA_TYPE, ImageConfig, ImageIndex,
    ImageManifest, MANIFEST_MEDIA_TYPE, OciImage, RootFs, sha256_digest,
};

/// Reference of the busybox image.
pub const BUSYBOX_IMAGE: &str = "localhost/wasmlet-test/busybox:latest";
/// Reference of the pause (sandbox) image.
pub const PAUSE_IMAGE: &str = "localhost/wasmlet-test/pause:latest";
/// Where the layer comes from: Debian's `busybox-static`.
pub const BUSYBOX_BINARY: &str = "/bin/busybox";
/// Entrypoint of [`PAUSE_IMAGE`]: sleep forever, reap every child, exit 0
/// on SIGTERM or SIGINT.
pub const PAUSE_ENTRYPOINT: &[&str] = &[
    "/bin/sh",
    "-c",
    "trap 'exit 0' TERM INT; while :; do sleep 86400 & wait $!; done",
];
/// Layer media type of an uncompressed filesystem layer.
pub const TAR_LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar";
/// `Env` of both images.
pub const IMAGE_ENV: &[&str] = &["PATH=/bin"];
/// Applets the images must have a symlink for; [`busybox_layer`] fails if
/// the binary lacks one.
pub const REQUIRED_APPLETS: &[&str] = &[
    "sh", "sleep", "echo", "cat", "true", "false", "env", "ls", "wget", "nc", "httpd", "kill",
    "ps", "id", "hostname", "ip",
];

/// One test image: its reference and its rendered blobs.
#[derive(Debug, Clone)]
pub struct TestImage {
    /// Full reference, e.g. [`BUSYBOX_IMAGE`].
    pub reference: &'static str,
    /// Blobs, ready for [`OciImage::write_archive`].
    pub oci: OciImage,
}

/// The applets `busybox --list` prints.
pub fn busybox_applets(busybox: &Path) -> anyhow::Result<Vec<String>> {
    let out = Command::new(busybox)
        .arg("--list")
        .output()
        .with_context(|| {
            format!(
                "running {} --list (is busybox-static installed?)",
                busybox.display()
            )
        })?;
    ensure!(
        out.status.success(),
        "{} --list: {}",
        busybox.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut applets: Vec<String> = String::from_utf8(out.stdout)
        .context("busybox --list is not UTF-8")?
        .lines()
        .map(str::trim)
        .filter(|a| !a.is_empty() && !a.contains('/') && *a != "busybox")
        .map(String::from)
        .collect();
    applets.sort();
    applets.dedup();
    Ok(applets)
}

/// The uncompressed layer tar: `bin/busybox`, one `bin/<applet>` symlink to
/// `busybox` per applet, and the directories `etc`, `root`, `tmp`.
pub fn busybox_layer(busybox: &Path) -> anyhow::Result<Vec<u8>> {
    let binary =
        std::fs::read(busybox).with_context(|| format!("reading {}", busybox.display()))?;
    let applets = busybox_applets(busybox)?;
    for required in REQUIRED_APPLETS {
        if !applets.iter().any(|a| a == required) {
            bail!("{} has no `{required}` applet", busybox.display());
        }
    }

    let mut tar = tar::Builder::new(Vec::new());
    for (dir, mode) in [
        ("bin/", 0o755),
        ("etc/", 0o755),
        ("root/", 0o700),
        ("tmp/", 0o1777),
    ] {
        let mut h = header(tar::EntryType::Directory, 0, mode);
        tar.append_data(&mut h, dir, std::io::empty())
            .with_context(|| format!("adding {dir}"))?;
    }
    let mut h = header(tar::EntryType::Regular, binary.len(), 0o755);
    tar.append_data(&mut h, "bin/busybox", &binary[..])
        .context("adding bin/busybox")?;
    for applet in &applets {
        let mut h = header(tar::EntryType::Symlink, 0, 0o777);
        tar.append_link(&mut h, format!("bin/{applet}"), "busybox")
            .with_context(|| format!("adding bin/{applet}"))?;
    }
    tar.into_inner().context("finishing the busybox layer")
}

fn header(kind: tar::EntryType, size: usize, mode: u32) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(kind);
    h.set_size(size as u64);
    h.set_mode(mode);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h
}

/// Render a `linux/amd64` image of one uncompressed `layer` under `reference`
/// (`name:tag`) with the given entrypoint and cmd and `Env` [`IMAGE_ENV`].
pub fn linux_image(
    reference: &str,
    layer: Vec<u8>,
    entrypoint: &[&str],
    cmd: &[&str],
) -> anyhow::Result<OciImage> {
    let (name, tag) = reference
        .rsplit_once(':')
        .filter(|(name, tag)| !name.is_empty() && !tag.is_empty() && !tag.contains('/'))
        .with_context(|| format!("{reference}: not a `name:tag` reference"))?;
    let diff_id = sha256_digest(&layer);
    let layer = Blob::new(TAR_LAYER_MEDIA_TYPE, layer);
    let config = ImageConfig {
        created: CREATED.into(),
        architecture: "amd64".into(),
        os: "linux".into(),
        config: ExecConfig {
            env: IMAGE_ENV.iter().map(|e| e.to_string()).collect(),
            entrypoint: entrypoint.iter().map(|e| e.to_string()).collect(),
            cmd: cmd.iter().map(|e| e.to_string()).collect(),
            labels: Default::default(),
        },
        rootfs: RootFs {
            kind: "layers".into(),
            diff_ids: vec![diff_id],
        },
    };
    let config = Blob::new(
        IMAGE_CONFIG_MEDIA_TYPE,
        serde_json::to_vec(&config).context("serialising image config")?,
    );
    let manifest = ImageManifest {
        schema_version: 2,
        media_type: MANIFEST_MEDIA_TYPE.into(),
        config: config.descriptor(),
        layers: vec![layer.descriptor()],
    };
    let manifest = Blob::new(
        MANIFEST_MEDIA_TYPE,
        serde_json::to_vec(&manifest).context("serialising manifest")?,
    );
    Ok(OciImage {
        name: format!("{name}:{tag}"),
        tag: tag.into(),
        manifest,
        config,
        layers: vec![layer],
    })
}

/// [`BUSYBOX_IMAGE`] and [`PAUSE_IMAGE`], rendered from `busybox`.
pub fn test_images(busybox: &Path) -> anyhow::Result<Vec<TestImage>> {
    let layer = busybox_layer(busybox)?;
    Ok(vec![
        TestImage {
            reference: BUSYBOX_IMAGE,
            oci: linux_image(BUSYBOX_IMAGE, layer.clone(), &[], &["sh"])?,
        },
        TestImage {
            reference: PAUSE_IMAGE,
            oci: linux_image(PAUSE_IMAGE, layer, PAUSE_ENTRYPOINT, &[])?,
        },
    ])
}

/// `images` as one OCI image-layout archive: one `index.json` entry per
/// image (each annotated with its name), blobs they share stored once. One
/// `ctr images import` of it is quicker than one per image.
pub fn multi_archive(images: &[TestImage]) -> anyhow::Result<Vec<u8>> {
    let mut manifests = Vec::new();
    let mut blobs = BTreeMap::new();
    for image in images {
        let index: ImageIndex =
            serde_json::from_slice(&image.oci.index_json()?).context("re-reading an index.json")?;
        manifests.extend(index.manifests);
        blobs.extend(image.oci.blobs());
    }
    let index = ImageIndex {
        schema_version: 2,
        media_type: INDEX_MEDIA_TYPE.into(),
        manifests,
    };
    let mut tar = tar::Builder::new(Vec::new());
    let file = |tar: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8]| {
        let mut h = header(tar::EntryType::Regular, data.len(), 0o644);
        tar.append_data(&mut h, path, data)
            .with_context(|| format!("adding {path}"))
    };
    file(&mut tar, "oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    file(&mut tar, "index.json", &serde_json::to_vec(&index)?)?;
    for dir in ["blobs/", "blobs/sha256/"] {
        let mut h = header(tar::EntryType::Directory, 0, 0o755);
        tar.append_data(&mut h, dir, std::io::empty())?;
    }
    for blob in blobs.values() {
        file(
            &mut tar,
            &format!("blobs/sha256/{}", blob.hex()),
            &blob.data,
        )?;
    }
    tar.into_inner().context("finishing the archive")
}

/// Write [`multi_archive`] of `images` to `out`.
pub fn write_multi_archive(images: &[TestImage], out: &Path) -> anyhow::Result<()> {
    let tar = multi_archive(images)?;
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(out, tar).with_context(|| format!("writing {}", out.display()))
}

/// The archive of [`test_images`] of [`BUSYBOX_BINARY`] (see
/// [`multi_archive`]) and each image's `(reference, manifest digest)`.
/// Rendered once per process (hashing the layer takes a while in debug
/// builds).
pub fn test_images_archive() -> anyhow::Result<&'static TestArchive> {
    static CACHE: OnceLock<TestArchive> = OnceLock::new();
    if let Some(cached) = CACHE.get() {
        return Ok(cached);
    }
    let images = test_images(Path::new(BUSYBOX_BINARY))?;
    let archive = TestArchive {
        tar: multi_archive(&images)?,
        images: images
            .iter()
            .map(|i| (i.reference, i.oci.manifest_digest().to_string()))
            .collect(),
    };
    Ok(CACHE.get_or_init(|| archive))
}

/// What [`test_images_archive`] returns.
#[derive(Debug)]
pub struct TestArchive {
    /// The OCI image-layout tarball.
    pub tar: Vec<u8>,
    /// `(reference, manifest digest)` of each image in it.
    pub images: Vec<(&'static str, String)>,
}

/// Write [`test_images_archive`] to `dir/test-images.tar`; returns the path
/// and each image's `(reference, manifest digest)`.
pub fn write_test_images(dir: &Path) -> anyhow::Result<(PathBuf, Vec<(&'static str, String)>)> {
    let archive = test_images_archive()?;
    let path = dir.join("test-images.tar");
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(&path, &archive.tar).with_context(|| format!("writing {}", path.display()))?;
    Ok((path, archive.images.clone()))
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn entries(tar: &[u8]) -> BTreeMap<String, (tar::EntryType, Option<String>, u32)> {
        let mut archive = tar::Archive::new(tar);
        let mut out = BTreeMap::new();
        for entry in archive.entries().unwrap() {
            let entry = entry.unwrap();
            let path = entry.path().unwrap().to_string_lossy().into_owned();
            let link = entry
                .link_name()
                .unwrap()
                .map(|l| l.to_string_lossy().into_owned());
            let h = entry.header();
            out.insert(path, (h.entry_type(), link, h.mode().unwrap()));
        }
        out
    }

    #[test]
    fn layer_has_busybox_and_applet_links() {
        let layer = busybox_layer(Path::new(BUSYBOX_BINARY)).unwrap();
        let e = entries(&layer);
        assert_eq!(e["bin/busybox"].0, tar::EntryType::Regular);
        assert_eq!(e["bin/busybox"].2, 0o755);
        assert_eq!(e["tmp/"].2, 0o1777);
        for applet in REQUIRED_APPLETS {
            let (kind, link, _) = &e[&format!("bin/{applet}")];
            assert_eq!(*kind, tar::EntryType::Symlink, "{applet}");
            assert_eq!(link.as_deref(), Some("busybox"), "{applet}");
        }
    }

    #[test]
    fn images_are_linux_amd64_with_diff_ids_and_are_deterministic() {
        let a = test_images(Path::new(BUSYBOX_BINARY)).unwrap();
        let b = test_images(Path::new(BUSYBOX_BINARY)).unwrap();
        for (a, b) in a.iter().zip(&b) {
            assert_eq!(a.oci, b.oci, "{}", a.reference);
            let config: serde_json::Value = serde_json::from_slice(&a.oci.config.data).unwrap();
            assert_eq!(config["architecture"], "amd64");
            assert_eq!(config["os"], "linux");
            assert_eq!(config["config"]["Env"][0], "PATH=/bin");
            let diff_id = sha256_digest(&a.oci.layers[0].data);
            assert_eq!(config["rootfs"]["diff_ids"][0], diff_id.as_str());
            assert_eq!(a.oci.name, a.reference);
        }
        let busybox: serde_json::Value = serde_json::from_slice(&a[0].oci.config.data).unwrap();
        assert_eq!(busybox["config"]["Cmd"], serde_json::json!(["sh"]));
        let pause: serde_json::Value = serde_json::from_slice(&a[1].oci.config.data).unwrap();
        assert_eq!(
            pause["config"]["Entrypoint"],
            serde_json::json!(PAUSE_ENTRYPOINT)
        );
        // Same layer, different configs.
        assert_eq!(a[0].oci.layers, a[1].oci.layers);
        assert_ne!(a[0].oci.manifest_digest(), a[1].oci.manifest_digest());
    }

    #[test]
    fn one_archive_carries_both_images_and_each_blob_once() {
        let dir = tempfile::tempdir().unwrap();
        let (path, refs) = write_test_images(dir.path()).unwrap();
        assert_eq!(refs.len(), 2);
        let mut archive = tar::Archive::new(std::fs::File::open(&path).unwrap());
        let mut index = String::new();
        let mut blobs = Vec::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let name = entry.path().unwrap().to_string_lossy().into_owned();
            if name == "index.json" {
                entry.read_to_string(&mut index).unwrap();
            } else if let Some(hex) = name.strip_prefix("blobs/sha256/")
                && !hex.is_empty()
            {
                let mut data = Vec::new();
                entry.read_to_end(&mut data).unwrap();
                assert_eq!(sha256_digest(&data), format!("sha256:{hex}"));
                blobs.push(hex.to_string());
            }
        }
        let index: ImageIndex = serde_json::from_str(&index).unwrap();
        assert_eq!(index.manifests.len(), 2);
        for ((reference, digest), manifest) in refs.iter().zip(&index.manifests) {
            assert_eq!(&manifest.digest, digest);
            assert_eq!(
                manifest.annotations[crate::images::ANNOTATION_IMAGE_NAME],
                *reference
            );
        }
        // Two manifests, two configs, one shared layer.
        assert_eq!(blobs.len(), 5, "{blobs:?}");
    }
}
