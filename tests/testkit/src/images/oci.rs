//! OCI image-layout archives holding one Wasm module or component.
//!
//! [`WasmImage::to_oci`] renders the blobs (config, layers, manifest) of one of
//! the three [`WasmLayout`]s; [`OciImage::write_archive`] packs them with an
//! `oci-layout` file and an `index.json` into the tarball that
//! `ctr images import` and `skopeo copy oci-archive:` read. Every byte is a
//! function of the input: timestamps are the Unix epoch, tar entries carry
//! mtime 0 and uid/gid 0, JSON is written from structs and sorted maps, and
//! the gzip layer of [`WasmLayout::PlainImage`] uses stored deflate blocks so
//! the digest does not depend on which flate2 backend a build happens to
//! enable.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use anyhow::{Context, bail, ensure};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::component::component_info;

/// `mediaType` of an OCI image manifest.
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// `mediaType` of an OCI image index (`index.json`).
pub const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";
/// Config media type of a runnable OCI image.
pub const IMAGE_CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
/// Layer media type of a gzipped filesystem layer.
pub const TAR_GZIP_LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// Config media type of the CNCF TAG Runtime Wasm OCI artifact.
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// Layer media type of the CNCF Wasm OCI artifact (module or component).
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";
/// Layer media type runwasi's `oci-tar-builder` gives Wasm layers (modules
/// and components alike) and its `Engine::supported_layers_types` accepts.
pub const RUNWASI_WASM_LAYER_MEDIA_TYPE: &str =
    "application/vnd.bytecodealliance.wasm.component.layer.v0+wasm";
/// Image-config label runwasi sets so configs of different modules differ
/// (their `rootfs.diff_ids` is empty): sha256 of the layer digests' hex joined.
pub const RUNWASI_LAYERS_LABEL: &str = "containerd.runwasi.layers";
/// Index annotation containerd reads as the full image name on import.
pub const ANNOTATION_IMAGE_NAME: &str = "io.containerd.image.name";
/// Index annotation the OCI image layout uses for the tag.
pub const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";
/// Where [`WasmLayout::PlainImage`] puts the Wasm file, and its entrypoint.
pub const PLAIN_IMAGE_ENTRYPOINT: &str = "/app.wasm";
/// `Env` of the [`WasmLayout::PlainImage`] config, as a container image would carry.
pub const PLAIN_IMAGE_ENV: &[&str] = &["PATH=/"];
/// `architecture` of every config written here.
pub const WASM_ARCHITECTURE: &str = "wasm";
/// `os` for core modules (WASI preview 1).
pub const MODULE_OS: &str = "wasip1";
/// `os` for components (WASI preview 2).
pub const COMPONENT_OS: &str = "wasip2";
/// `created` of every config written here: fixed, so digests are stable.
pub const CREATED: &str = "1970-01-01T00:00:00Z";
/// `author` of the Wasm artifact config.
pub const AUTHOR: &str = "wasmlet-testkit";

/// How a Wasm binary is packaged as an OCI image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WasmLayout {
    /// The CNCF TAG Runtime Wasm OCI artifact: config
    /// [`WASM_CONFIG_MEDIA_TYPE`], one raw [`WASM_LAYER_MEDIA_TYPE`] layer.
    Artifact,
    /// runwasi's image: an OCI image config (`os` `wasip1`, `architecture`
    /// `wasm`, empty `rootfs.diff_ids`) and one raw
    /// [`RUNWASI_WASM_LAYER_MEDIA_TYPE`] layer.
    RunwasiComponentLayer,
    /// A plain container image: one gzipped tar layer holding the binary at
    /// [`PLAIN_IMAGE_ENTRYPOINT`], which is also the config's `Entrypoint`.
    PlainImage,
    /// [`WasmLayout::PlainImage`] for the machine's own platform (`linux` and its
    /// architecture): an image containerd 1.6 imports and unpacks as any other, for
    /// a containerd shim to find the binary in the rootfs. Not in [`WasmLayout::ALL`]
    /// (a Wasm runtime's own image store expects `wasm`).
    HostImage,
}

impl WasmLayout {
    /// Every layout, in a fixed order.
    pub const ALL: [WasmLayout; 3] = [
        WasmLayout::Artifact,
        WasmLayout::RunwasiComponentLayer,
        WasmLayout::PlainImage,
    ];

    /// The config media type this layout writes.
    pub fn config_media_type(self) -> &'static str {
        match self {
            WasmLayout::Artifact => WASM_CONFIG_MEDIA_TYPE,
            WasmLayout::RunwasiComponentLayer | WasmLayout::PlainImage | WasmLayout::HostImage => {
                IMAGE_CONFIG_MEDIA_TYPE
            }
        }
    }

    /// The media type of this layout's single layer.
    pub fn layer_media_type(self) -> &'static str {
        match self {
            WasmLayout::Artifact => WASM_LAYER_MEDIA_TYPE,
            WasmLayout::RunwasiComponentLayer => RUNWASI_WASM_LAYER_MEDIA_TYPE,
            WasmLayout::PlainImage | WasmLayout::HostImage => TAR_GZIP_LAYER_MEDIA_TYPE,
        }
    }
}

/// A Wasm binary and the name and layout to package it under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WasmImage {
    /// Full reference, e.g. `localhost/wasmlet-examples/hello:latest`; a
    /// missing tag means `latest`.
    pub reference: String,
    /// The module or component bytes.
    pub wasm: Vec<u8>,
    /// How to package it.
    pub layout: WasmLayout,
    /// Whether `wasm` is a component (`os` `wasip2`) rather than a core
    /// module (`os` `wasip1`). Must agree with the binary's header.
    pub component: bool,
}

impl WasmImage {
    /// An image of `wasm`, its `component` flag read from the binary's header.
    pub fn new(reference: impl Into<String>, wasm: Vec<u8>, layout: WasmLayout) -> Self {
        let component = wasmparser::Parser::is_component(&wasm);
        Self {
            reference: reference.into(),
            wasm,
            layout,
            component,
        }
    }

    /// Render the image's blobs.
    pub fn to_oci(&self) -> anyhow::Result<OciImage> {
        let (name, tag) = split_reference(&self.reference)?;
        self.check_header()?;
        let os = if self.component {
            COMPONENT_OS
        } else {
            MODULE_OS
        };

        let (config, layer) = match self.layout {
            WasmLayout::Artifact => {
                let layer = Blob::new(WASM_LAYER_MEDIA_TYPE, self.wasm.clone());
                let component = if self.component {
                    Some(component_info(&self.wasm)?)
                } else {
                    None
                };
                let config = WasmConfig {
                    created: CREATED.into(),
                    author: Some(AUTHOR.into()),
                    architecture: WASM_ARCHITECTURE.into(),
                    os: os.into(),
                    layer_digests: vec![layer.digest.clone()],
                    component,
                };
                (Blob::json(WASM_CONFIG_MEDIA_TYPE, &config)?, layer)
            }
            WasmLayout::RunwasiComponentLayer => {
                let layer = Blob::new(RUNWASI_WASM_LAYER_MEDIA_TYPE, self.wasm.clone());
                let unique = sha256_hex(layer.hex().as_bytes());
                let file = format!("{}.wasm", repository_basename(&name));
                let config = ImageConfig {
                    created: CREATED.into(),
                    architecture: WASM_ARCHITECTURE.into(),
                    // runwasi writes `wasip1` for modules and components alike.
                    os: MODULE_OS.into(),
                    config: ExecConfig {
                        env: Vec::new(),
                        entrypoint: vec![file],
                        cmd: Vec::new(),
                        labels: BTreeMap::from([(RUNWASI_LAYERS_LABEL.into(), unique)]),
                    },
                    rootfs: RootFs::layers(Vec::new()),
                };
                (Blob::json(IMAGE_CONFIG_MEDIA_TYPE, &config)?, layer)
            }
            WasmLayout::PlainImage | WasmLayout::HostImage => {
                let tar = plain_layer_tar(&self.wasm)?;
                let diff_id = sha256_digest(&tar);
                let layer = Blob::new(TAR_GZIP_LAYER_MEDIA_TYPE, gzip_stored(&tar));
                let (architecture, os) = match self.layout {
                    WasmLayout::HostImage => (host_architecture(), "linux"),
                    _ => (WASM_ARCHITECTURE, os),
                };
                let config = ImageConfig {
                    created: CREATED.into(),
                    architecture: architecture.into(),
                    os: os.into(),
                    config: ExecConfig {
                        env: PLAIN_IMAGE_ENV.iter().map(|e| e.to_string()).collect(),
                        entrypoint: vec![PLAIN_IMAGE_ENTRYPOINT.into()],
                        cmd: Vec::new(),
                        labels: BTreeMap::new(),
                    },
                    rootfs: RootFs::layers(vec![diff_id]),
                };
                (Blob::json(IMAGE_CONFIG_MEDIA_TYPE, &config)?, layer)
            }
        };

        let manifest = ImageManifest {
            schema_version: 2,
            media_type: MANIFEST_MEDIA_TYPE.into(),
            config: config.descriptor(),
            layers: vec![layer.descriptor()],
        };
        let manifest = Blob::json(MANIFEST_MEDIA_TYPE, &manifest)?;
        Ok(OciImage {
            name: format!("{name}:{tag}"),
            tag,
            manifest,
            config,
            layers: vec![layer],
        })
    }

    fn check_header(&self) -> anyhow::Result<()> {
        let header_says = if wasmparser::Parser::is_component(&self.wasm) {
            Some(true)
        } else if wasmparser::Parser::is_core_wasm(&self.wasm) {
            Some(false)
        } else {
            None
        };
        match header_says {
            Some(component) if component != self.component => bail!(
                "{}: `component` is {} but the binary is a {}",
                self.reference,
                self.component,
                if component {
                    "component"
                } else {
                    "core module"
                }
            ),
            Some(_) => Ok(()),
            None => bail!("{}: not a Wasm binary (bad header)", self.reference),
        }
    }
}

/// One content-addressed blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    /// Media type its descriptor carries.
    pub media_type: String,
    /// `sha256:<hex>` of `data`.
    pub digest: String,
    /// The bytes.
    pub data: Vec<u8>,
}

impl Blob {
    /// A blob of `data`, digest computed.
    pub fn new(media_type: &str, data: Vec<u8>) -> Self {
        Self {
            media_type: media_type.into(),
            digest: sha256_digest(&data),
            data,
        }
    }

    fn json<T: Serialize>(media_type: &str, value: &T) -> anyhow::Result<Self> {
        let data = serde_json::to_vec(value).context("serialising OCI JSON")?;
        Ok(Self::new(media_type, data))
    }

    /// The hex part of the digest.
    pub fn hex(&self) -> &str {
        self.digest.trim_start_matches("sha256:")
    }

    /// Its descriptor, without annotations.
    pub fn descriptor(&self) -> Descriptor {
        Descriptor {
            media_type: self.media_type.clone(),
            digest: self.digest.clone(),
            size: self.data.len() as u64,
            annotations: BTreeMap::new(),
        }
    }
}

/// A rendered image: what a registry stores (push `layers`, `config`, then
/// `manifest` under `tag`) or an archive carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OciImage {
    /// Full name with tag, as written to `io.containerd.image.name`.
    pub name: String,
    /// The tag, as written to `org.opencontainers.image.ref.name`.
    pub tag: String,
    /// The manifest; its digest is the image's.
    pub manifest: Blob,
    /// The config blob.
    pub config: Blob,
    /// The layers, in manifest order.
    pub layers: Vec<Blob>,
}

impl OciImage {
    /// `sha256:<hex>` of the manifest.
    pub fn manifest_digest(&self) -> &str {
        &self.manifest.digest
    }

    /// The `index.json` of the archive: one manifest descriptor annotated
    /// with the image name and tag. It has no `platform`: `ctr images import`
    /// drops descriptors whose platform is not the host's unless told
    /// `--all-platforms`, and `wasm/wasip1` never is.
    pub fn index_json(&self) -> anyhow::Result<Vec<u8>> {
        let mut manifest = self.manifest.descriptor();
        manifest.annotations = BTreeMap::from([
            (ANNOTATION_IMAGE_NAME.into(), self.name.clone()),
            (ANNOTATION_REF_NAME.into(), self.tag.clone()),
        ]);
        let index = ImageIndex {
            schema_version: 2,
            media_type: INDEX_MEDIA_TYPE.into(),
            manifests: vec![manifest],
        };
        serde_json::to_vec(&index).context("serialising index.json")
    }

    /// All blobs, keyed and ordered by digest.
    pub fn blobs(&self) -> BTreeMap<&str, &Blob> {
        std::iter::once(&self.manifest)
            .chain(std::iter::once(&self.config))
            .chain(&self.layers)
            .map(|b| (b.digest.as_str(), b))
            .collect()
    }

    /// Write the OCI image-layout tarball to `w`.
    pub fn write_tar<W: Write>(&self, w: W) -> anyhow::Result<W> {
        let mut tar = tar::Builder::new(w);
        append_file(&mut tar, "oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
        append_file(&mut tar, "index.json", &self.index_json()?)?;
        append_dir(&mut tar, "blobs/")?;
        append_dir(&mut tar, "blobs/sha256/")?;
        for blob in self.blobs().values() {
            append_file(
                &mut tar,
                &format!("blobs/sha256/{}", blob.hex()),
                &blob.data,
            )?;
        }
        tar.into_inner().context("finishing OCI archive")
    }

    /// Write the archive to `out`, atomically (a temporary file in the same
    /// directory, then a rename), so concurrent readers never see half of it.
    pub fn write_archive(&self, out: &Path) -> anyhow::Result<()> {
        let tar = self.write_tar(Vec::new())?;
        write_atomic(out, &tar)
    }
}

/// Write `image` as an OCI image-layout tarball to `out`.
pub fn write_oci_archive(image: &WasmImage, out: &Path) -> anyhow::Result<()> {
    image
        .to_oci()?
        .write_archive(out)
        .with_context(|| format!("writing {} to {}", image.reference, out.display()))
}

/// The manifest digest (`sha256:<hex>`) [`write_oci_archive`] gives `image`.
pub fn manifest_digest(image: &WasmImage) -> anyhow::Result<String> {
    Ok(image.to_oci()?.manifest.digest)
}

/// An OCI content descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// Media type of the referenced content.
    pub media_type: String,
    /// `sha256:<hex>`.
    pub digest: String,
    /// Size in bytes.
    pub size: u64,
    /// Annotations (omitted when empty).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// An OCI image manifest, as written here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageManifest {
    /// Always 2.
    pub schema_version: u32,
    /// [`MANIFEST_MEDIA_TYPE`].
    pub media_type: String,
    /// The config blob.
    pub config: Descriptor,
    /// The layers.
    pub layers: Vec<Descriptor>,
}

/// An OCI image index (`index.json`), as written here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageIndex {
    /// Always 2.
    pub schema_version: u32,
    /// [`INDEX_MEDIA_TYPE`].
    pub media_type: String,
    /// One descriptor per image.
    pub manifests: Vec<Descriptor>,
}

/// The config of the CNCF Wasm OCI artifact ([`WASM_CONFIG_MEDIA_TYPE`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WasmConfig {
    /// RFC 3339 creation time.
    pub created: String,
    /// Optional author.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
    /// Always `wasm`.
    pub architecture: String,
    /// `wasip1` for modules, `wasip2` for components.
    pub os: String,
    /// Digests of the manifest's layers, in manifest order.
    pub layer_digests: Vec<String>,
    /// The component's world; present for components.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub component: Option<ComponentInfo>,
}

/// What a component imports and exports, by interface name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ComponentInfo {
    /// Exported interfaces and functions, e.g. `wasi:cli/run@0.2.6`.
    pub exports: Vec<String>,
    /// Imported interfaces and functions.
    pub imports: Vec<String>,
    /// Optional world reference for indexing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// An OCI image config ([`IMAGE_CONFIG_MEDIA_TYPE`]), the fields written here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    /// RFC 3339 creation time.
    pub created: String,
    /// `wasm`.
    pub architecture: String,
    /// `wasip1` or `wasip2`.
    pub os: String,
    /// Execution parameters.
    pub config: ExecConfig,
    /// Layer diff IDs.
    pub rootfs: RootFs,
}

/// The `config` object of an OCI image config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExecConfig {
    /// `KEY=VALUE` entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Entrypoint argv.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entrypoint: Vec<String>,
    /// Default arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cmd: Vec<String>,
    /// Labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// The `rootfs` object of an OCI image config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootFs {
    /// Always `layers`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `sha256:<hex>` of each uncompressed layer.
    pub diff_ids: Vec<String>,
}

impl RootFs {
    fn layers(diff_ids: Vec<String>) -> Self {
        Self {
            kind: "layers".into(),
            diff_ids,
        }
    }
}

/// Split `name[:tag]` into name and tag (default `latest`); digests are refused.
fn split_reference(reference: &str) -> anyhow::Result<(String, String)> {
    ensure!(
        !reference.contains('@'),
        "{reference}: digest references cannot name an image in an archive"
    );
    let last_slash = reference.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match reference[last_slash..].rfind(':') {
        Some(i) => (
            &reference[..last_slash + i],
            &reference[last_slash + i + 1..],
        ),
        None => (reference, "latest"),
    };
    ensure!(
        !name.is_empty() && !tag.is_empty(),
        "{reference}: not a `name:tag` reference"
    );
    Ok((name.to_string(), tag.to_string()))
}

fn repository_basename(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

/// This machine's architecture as OCI (Go) names it.
pub fn host_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// `sha256:<hex>` of `data`.
pub fn sha256_digest(data: &[u8]) -> String {
    format!("sha256:{}", sha256_hex(data))
}

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

fn plain_layer_tar(wasm: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    let path = PLAIN_IMAGE_ENTRYPOINT.trim_start_matches('/');
    append_file_mode(&mut tar, path, wasm, 0o644)?;
    tar.into_inner().context("finishing layer tar")
}

fn header(kind: tar::EntryType, size: usize, mode: u32) -> tar::Header {
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(kind);
    header.set_size(size as u64);
    header.set_mode(mode);
    header.set_mtime(0);
    header.set_uid(0);
    header.set_gid(0);
    header
}

fn append_file<W: Write>(tar: &mut tar::Builder<W>, path: &str, data: &[u8]) -> anyhow::Result<()> {
    append_file_mode(tar, path, data, 0o644)
}

fn append_file_mode<W: Write>(
    tar: &mut tar::Builder<W>,
    path: &str,
    data: &[u8],
    mode: u32,
) -> anyhow::Result<()> {
    let mut header = header(tar::EntryType::Regular, data.len(), mode);
    tar.append_data(&mut header, path, data)
        .with_context(|| format!("adding {path} to tar"))
}

fn append_dir<W: Write>(tar: &mut tar::Builder<W>, path: &str) -> anyhow::Result<()> {
    let mut header = header(tar::EntryType::Directory, 0, 0o755);
    tar.append_data(&mut header, path, std::io::empty())
        .with_context(|| format!("adding {path} to tar"))
}

/// gzip of `data` using stored (uncompressed) deflate blocks: valid gzip whose
/// bytes depend on nothing but `data`.
fn gzip_stored(data: &[u8]) -> Vec<u8> {
    const MAX_BLOCK: usize = u16::MAX as usize;
    let mut out = Vec::with_capacity(data.len() + data.len() / MAX_BLOCK * 5 + 32);
    // ID1 ID2, CM=deflate, FLG=0, MTIME=0, XFL=0, OS=unknown.
    out.extend_from_slice(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff]);
    let mut blocks = data.chunks(MAX_BLOCK).peekable();
    if blocks.peek().is_none() {
        out.extend_from_slice(&[1, 0, 0, 0xff, 0xff]);
    }
    while let Some(block) = blocks.next() {
        let last = blocks.peek().is_none();
        let len = block.len() as u16;
        out.push(u8::from(last)); // BFINAL, BTYPE=00 (stored)
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(block);
    }
    let mut crc = flate2::Crc::new();
    crc.update(data);
    out.extend_from_slice(&crc.sum().to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out
}

/// Write `data` to `path` through a temporary file and a rename; leave the
/// file alone when it already holds exactly `data`.
pub(crate) fn write_atomic(path: &Path, data: &[u8]) -> anyhow::Result<()> {
    if std::fs::read(path).is_ok_and(|old| old == data) {
        return Ok(());
    }
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    tmp.write_all(data)
        .with_context(|| format!("writing {}", tmp.path().display()))?;
    // tempfile creates 0600; these files are read by containerd, ctr and
    // other users' tools.
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))
        .with_context(|| format!("chmod {}", tmp.path().display()))?;
    tmp.persist(path)
        .with_context(|| format!("renaming into {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    /// `(module)`: the smallest valid core module.
    const EMPTY_MODULE: &[u8] = b"\0asm\x01\0\0\0";

    #[test]
    fn references_split_into_name_and_tag() {
        let cases = [
            ("localhost/a/hello:latest", ("localhost/a/hello", "latest")),
            (
                "localhost:5000/a/hello:v1",
                ("localhost:5000/a/hello", "v1"),
            ),
            (
                "localhost:5000/a/hello",
                ("localhost:5000/a/hello", "latest"),
            ),
            ("hello", ("hello", "latest")),
        ];
        for (reference, (name, tag)) in cases {
            let got = split_reference(reference).unwrap();
            assert_eq!(got, (name.to_string(), tag.to_string()), "{reference}");
        }
        assert!(split_reference("localhost/a/hello@sha256:00").is_err());
        assert!(split_reference("localhost/a/hello:").is_err());
    }

    #[test]
    fn gzip_stored_round_trips() {
        for len in [0, 1, 65_535, 65_536, 200_000] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let gz = gzip_stored(&data);
            let mut back = Vec::new();
            flate2::read::GzDecoder::new(&gz[..])
                .read_to_end(&mut back)
                .unwrap();
            assert_eq!(back, data, "len {len}");
        }
    }

    #[test]
    fn component_flag_must_match_the_binary() {
        let mut image = WasmImage::new("x/y:z", EMPTY_MODULE.to_vec(), WasmLayout::Artifact);
        assert!(!image.component);
        image.component = true;
        assert!(image.to_oci().is_err());
        let not_wasm = WasmImage::new("x/y:z", b"hello".to_vec(), WasmLayout::Artifact);
        assert!(not_wasm.to_oci().is_err());
    }

    #[test]
    fn output_is_deterministic() {
        for layout in WasmLayout::ALL {
            let image = WasmImage::new("x/y:z", EMPTY_MODULE.to_vec(), layout);
            let a = image.to_oci().unwrap().write_tar(Vec::new()).unwrap();
            let b = image.to_oci().unwrap().write_tar(Vec::new()).unwrap();
            assert_eq!(a, b, "{layout:?}");
        }
    }
}
