//! The node's content-addressed store of Wasm images.
//!
//! Layout under the store root:
//!
//! ```text
//! blobs/sha256/<hex>   every blob by digest (manifests, configs, wasm binaries)
//! index.json           reference -> resolved image (manifest digest, wasm digest, ...)
//! .lock                taken while the index is rewritten
//! ```
//!
//! Images arrive as OCI image-layout archives (`ctr images export` / `skopeo copy
//! oci-archive:` output). Three shapes are accepted: the CNCF Wasm artifact (config
//! `application/vnd.wasm.config.v0+json`, layer `application/wasm`), an image whose
//! layer has a Wasm media type (runwasi's component layer and friends), and a plain OCI
//! image whose filesystem layers hold the `.wasm` file its entrypoint names.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use wasmlet_runtime::reference;

/// The config media type of the CNCF Wasm OCI artifact.
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// The layer media type of the CNCF Wasm OCI artifact.
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";
/// The layer media type runwasi uses for components.
pub const RUNWASI_COMPONENT_LAYER_MEDIA_TYPE: &str =
    "application/vnd.bytecodealliance.wasm.component.layer.v0+wasm";

/// Errors of the image store.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{archive}: {message}")]
    BadArchive { archive: PathBuf, message: String },
    #[error("{image}: {message}")]
    BadImage { image: String, message: String },
    #[error("image {0:?} is not in the node's image store")]
    NotFound(String),
    #[error("invalid image reference: {0}")]
    BadReference(String),
    #[error("image index {path} is corrupt: {message}")]
    CorruptIndex { path: PathBuf, message: String },
}

type Result<T, E = ImageError> = std::result::Result<T, E>;

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> ImageError + '_ {
    move |source| ImageError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Whether a binary is a core module or a component.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WasmKind {
    Module,
    Component,
}

impl WasmKind {
    /// Reads the kind from the binary's preamble; `None` if it is not Wasm.
    pub fn detect(bytes: &[u8]) -> Option<Self> {
        match bytes.get(..8)? {
            [0, b'a', b's', b'm', 1, 0, 0, 0] => Some(WasmKind::Module),
            [0, b'a', b's', b'm', _, _, 1, 0] => Some(WasmKind::Component),
            _ => None,
        }
    }
}

/// An image as the store resolves it for running.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredImage {
    /// `sha256:<hex>` of the manifest: the image id.
    pub manifest_digest: String,
    /// `sha256:<hex>` of the Wasm binary.
    pub wasm_digest: String,
    pub kind: WasmKind,
    /// From the image config, if it has one.
    #[serde(default)]
    pub entrypoint: Vec<String>,
    #[serde(default)]
    pub cmd: Vec<String>,
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub working_dir: Option<String>,
    /// Sum of the sizes of the blobs the image holds.
    pub size: u64,
    /// Digests of every blob this image keeps alive.
    pub blobs: BTreeSet<String>,
}

#[derive(Default, Serialize, Deserialize)]
struct Index {
    images: BTreeMap<String, StoredImage>,
}

/// One reference in the store, for listings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageEntry {
    pub reference: String,
    pub image: StoredImage,
}

/// The content-addressed store.
#[derive(Clone, Debug)]
pub struct ImageStore {
    root: PathBuf,
}

impl ImageStore {
    /// Opens (creating if needed) a store rooted at `root`.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        let blobs = root.join("blobs/sha256");
        fs::create_dir_all(&blobs).map_err(io_err(&blobs))?;
        Ok(ImageStore { root })
    }

    /// The store's root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The path of a blob by digest (`sha256:<hex>`).
    /// Bytes and inodes the store uses (every file and directory under its root).
    pub fn usage(&self) -> std::io::Result<(u64, u64)> {
        fn walk(dir: &Path, bytes: &mut u64, inodes: &mut u64) -> std::io::Result<()> {
            for entry in std::fs::read_dir(dir)? {
                let entry = entry?;
                let meta = entry.metadata()?;
                *inodes += 1;
                if meta.is_dir() {
                    walk(&entry.path(), bytes, inodes)?;
                } else {
                    *bytes += meta.len();
                }
            }
            Ok(())
        }
        let (mut bytes, mut inodes) = (0, 1);
        walk(&self.root, &mut bytes, &mut inodes)?;
        Ok((bytes, inodes))
    }

    pub fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        self.root.join("blobs/sha256").join(hex)
    }

    /// Every reference in the store.
    pub fn list(&self) -> Result<Vec<ImageEntry>> {
        Ok(self
            .read_index()?
            .images
            .into_iter()
            .map(|(reference, image)| ImageEntry { reference, image })
            .collect())
    }

    /// Resolves a reference (any form), an image id, or `repo@digest`.
    pub fn resolve(&self, image: &str) -> Result<ImageEntry> {
        let index = self.read_index()?;
        let by_id = |digest: &str| {
            index
                .images
                .iter()
                .find(|(_, i)| i.manifest_digest == digest)
                .map(|(r, i)| ImageEntry {
                    reference: r.clone(),
                    image: i.clone(),
                })
        };
        if image.starts_with("sha256:") {
            return by_id(image).ok_or_else(|| ImageError::NotFound(image.to_owned()));
        }
        let normalized = reference::normalize(image).map_err(ImageError::BadReference)?;
        if let Some(i) = index.images.get(&normalized) {
            return Ok(ImageEntry {
                reference: normalized,
                image: i.clone(),
            });
        }
        if let Some((repo, digest)) = normalized.split_once('@')
            && let Some(entry) =
                by_id(digest).filter(|e| reference::repository(&e.reference) == repo)
        {
            return Ok(entry);
        }
        Err(ImageError::NotFound(image.to_owned()))
    }

    /// Removes a reference, or every reference of an image id. Blobs no other image
    /// holds are deleted. Returns the references removed (empty if none matched).
    pub fn remove(&self, image: &str) -> Result<Vec<String>> {
        let _lock = self.lock()?;
        let mut index = self.read_index()?;
        let targets: Vec<String> = match self.resolve(image) {
            Ok(entry) if image.starts_with("sha256:") => index
                .images
                .iter()
                .filter(|(_, i)| i.manifest_digest == entry.image.manifest_digest)
                .map(|(r, _)| r.clone())
                .collect(),
            Ok(entry) => vec![entry.reference],
            Err(ImageError::NotFound(_)) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        for t in &targets {
            index.images.remove(t);
        }
        self.write_index(&index)?;
        self.collect_garbage(&index)?;
        Ok(targets)
    }

    /// Imports every image of an OCI image-layout archive (tar, optionally gzipped).
    /// Returns the references imported.
    pub fn import_archive(&self, archive: &Path) -> Result<Vec<ImageEntry>> {
        let bad = |message: String| ImageError::BadArchive {
            archive: archive.to_owned(),
            message,
        };
        let files = read_tar(archive).map_err(|e| bad(format!("cannot read archive: {e}")))?;
        self.import_layout(&files, &bad)
    }

    /// Imports what a registry pull fetched (an OCI image layout in memory), as
    /// [`Self::import_archive`] imports an archive.
    pub fn import_pulled(
        &self,
        image: &str,
        files: &BTreeMap<String, Vec<u8>>,
    ) -> Result<Vec<ImageEntry>> {
        let bad = |message: String| ImageError::BadImage {
            image: image.to_owned(),
            message,
        };
        self.import_layout(files, &bad)
    }

    /// Imports every image of an OCI image layout given as its files.
    fn import_layout(
        &self,
        files: &BTreeMap<String, Vec<u8>>,
        bad: &dyn Fn(String) -> ImageError,
    ) -> Result<Vec<ImageEntry>> {
        let blob = |digest: &str| -> Result<&Vec<u8>> {
            let hex = digest
                .strip_prefix("sha256:")
                .ok_or_else(|| bad(format!("unsupported digest {digest:?}")))?;
            let data = files
                .get(&format!("blobs/sha256/{hex}"))
                .ok_or_else(|| bad(format!("blob {digest} is missing")))?;
            let actual = sha256_hex(data);
            if actual != hex {
                return Err(bad(format!("blob {digest} has digest sha256:{actual}")));
            }
            Ok(data)
        };
        let index_bytes = files
            .get("index.json")
            .ok_or_else(|| bad("no index.json: not an OCI image layout".into()))?;
        let index: OciIndex =
            serde_json::from_slice(index_bytes).map_err(|e| bad(format!("index.json: {e}")))?;
        if index.manifests.is_empty() {
            return Err(bad("index.json lists no manifests".into()));
        }

        // Held from the first blob written to the index update: a remove's garbage
        // collection in between would delete blobs the index is about to name.
        let _lock = self.lock()?;
        let mut imported = Vec::new();
        let mut new_blobs: BTreeMap<String, &Vec<u8>> = BTreeMap::new();
        for desc in &index.manifests {
            let name = image_name(desc).ok_or_else(|| {
                bad(format!(
                    "manifest {} has no image name (annotation io.containerd.image.name or a full org.opencontainers.image.ref.name)",
                    desc.digest
                ))
            })?;
            let reference = reference::normalize(&name).map_err(bad)?;
            let manifest_desc = self.pick_manifest(desc, &blob, bad)?;
            let manifest_bytes = blob(&manifest_desc.digest)?;
            let manifest: OciManifest = serde_json::from_slice(manifest_bytes)
                .map_err(|e| bad(format!("manifest {}: {e}", manifest_desc.digest)))?;
            let config_bytes = blob(&manifest.config.digest)?;
            let mut blobs =
                BTreeSet::from([manifest_desc.digest.clone(), manifest.config.digest.clone()]);
            new_blobs.insert(manifest_desc.digest.clone(), manifest_bytes);
            new_blobs.insert(manifest.config.digest.clone(), config_bytes);

            let config: ImageConfig = if manifest.config.media_type == WASM_CONFIG_MEDIA_TYPE {
                ImageConfig::default()
            } else {
                serde_json::from_slice(config_bytes)
                    .map_err(|e| bad(format!("image config {}: {e}", manifest.config.digest)))?
            };
            let runtime_config = config.config.unwrap_or_default();
            let entrypoint = runtime_config.entrypoint.unwrap_or_default();
            let cmd = runtime_config.cmd.unwrap_or_default();

            let wasm_layer = manifest
                .layers
                .iter()
                .find(|l| is_wasm_media_type(&l.media_type));
            let wasm: Vec<u8> = match wasm_layer {
                Some(layer) => blob(&layer.digest)?.clone(),
                None => {
                    let path = entrypoint.first().or(cmd.first()).ok_or_else(|| {
                        bad(format!(
                            "{reference}: no Wasm layer and no entrypoint naming a .wasm file"
                        ))
                    })?;
                    let mut found = None;
                    for layer in &manifest.layers {
                        let data = blob(&layer.digest)?;
                        if let Some(bytes) = file_in_layer(&layer.media_type, data, path)
                            .map_err(|e| bad(format!("layer {}: {e}", layer.digest)))?
                        {
                            found = Some(bytes);
                        }
                    }
                    found.ok_or_else(|| {
                        bad(format!(
                            "{reference}: entrypoint {path:?} is not in any layer"
                        ))
                    })?
                }
            };
            let kind = WasmKind::detect(&wasm)
                .ok_or_else(|| bad(format!("{reference}: the Wasm layer is not a Wasm binary")))?;
            let wasm_digest = format!("sha256:{}", sha256_hex(&wasm));
            blobs.insert(wasm_digest.clone());
            let size = (manifest_bytes.len() + config_bytes.len() + wasm.len()) as u64;
            let image = StoredImage {
                manifest_digest: manifest_desc.digest.clone(),
                wasm_digest: wasm_digest.clone(),
                kind,
                entrypoint,
                cmd,
                env: runtime_config.env.unwrap_or_default(),
                working_dir: runtime_config.working_dir.filter(|w| !w.is_empty()),
                size,
                blobs,
            };
            self.write_blob(&wasm_digest, &wasm)?;
            imported.push(ImageEntry { reference, image });
        }
        for (digest, data) in new_blobs {
            self.write_blob(&digest, data)?;
        }

        let mut index = self.read_index()?;
        for entry in &imported {
            index
                .images
                .insert(entry.reference.clone(), entry.image.clone());
        }
        self.write_index(&index)?;
        self.collect_garbage(&index)?;
        Ok(imported)
    }

    /// Follows a nested image index to the manifest for Wasm (or the only one).
    fn pick_manifest<'a>(
        &self,
        desc: &'a Descriptor,
        blob: &dyn Fn(&str) -> Result<&'a Vec<u8>>,
        bad: &dyn Fn(String) -> ImageError,
    ) -> Result<Descriptor> {
        if !desc.media_type.contains("index") && !desc.media_type.contains("manifest.list") {
            return Ok(desc.clone());
        }
        let nested: OciIndex = serde_json::from_slice(blob(&desc.digest)?)
            .map_err(|e| bad(format!("index {}: {e}", desc.digest)))?;
        let pick = nested
            .manifests
            .iter()
            .find(|m| {
                m.platform
                    .as_ref()
                    .is_some_and(|p| p.architecture == "wasm" || p.os.starts_with("wasi"))
            })
            .or(nested.manifests.first())
            .ok_or_else(|| bad(format!("index {} is empty", desc.digest)))?;
        Ok(pick.clone())
    }

    fn write_blob(&self, digest: &str, data: &[u8]) -> Result<()> {
        let path = self.blob_path(digest);
        if path.exists() {
            return Ok(());
        }
        write_atomic(&path, data)
    }

    fn collect_garbage(&self, index: &Index) -> Result<()> {
        let live: BTreeSet<String> = index
            .images
            .values()
            .flat_map(|i| {
                i.blobs
                    .iter()
                    .map(|d| d.trim_start_matches("sha256:").to_owned())
            })
            .collect();
        let dir = self.root.join("blobs/sha256");
        for entry in fs::read_dir(&dir).map_err(io_err(&dir))? {
            let entry = entry.map_err(io_err(&dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !live.contains(&name) && !name.starts_with('.') {
                let path = entry.path();
                fs::remove_file(&path).map_err(io_err(&path))?;
            }
        }
        Ok(())
    }

    fn index_path(&self) -> PathBuf {
        self.root.join("index.json")
    }

    fn read_index(&self) -> Result<Index> {
        let path = self.index_path();
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| ImageError::CorruptIndex {
                path,
                message: e.to_string(),
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Index::default()),
            Err(e) => Err(io_err(&path)(e)),
        }
    }

    fn write_index(&self, index: &Index) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(index).expect("index serializes");
        write_atomic(&self.index_path(), &bytes)
    }

    fn lock(&self) -> Result<File> {
        let path = self.root.join(".lock");
        let file = File::create(&path).map_err(io_err(&path))?;
        file.lock().map_err(io_err(&path))?;
        Ok(file)
    }
}

/// Writes via a temporary file and a rename, so readers never see half a file.
fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    let dir = path.parent().expect("store paths have a parent");
    let tmp = dir.join(format!(
        ".tmp-{}-{}",
        std::process::id(),
        path.file_name().unwrap_or_default().to_string_lossy()
    ));
    fs::write(&tmp, data).map_err(io_err(&tmp))?;
    fs::rename(&tmp, path).map_err(io_err(path))
}

/// `sha256` of data, lower-case hex.
pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

fn is_wasm_media_type(media_type: &str) -> bool {
    media_type == WASM_LAYER_MEDIA_TYPE || media_type.ends_with("+wasm")
}

fn image_name(desc: &Descriptor) -> Option<String> {
    let ann = &desc.annotations;
    if let Some(name) = ann.get("io.containerd.image.name") {
        return Some(name.clone());
    }
    // The OCI annotation usually holds only a tag; it names an image only when it is
    // a full reference.
    ann.get("org.opencontainers.image.ref.name")
        .filter(|r| r.contains('/'))
        .cloned()
}

/// Reads every regular file of a tar (or tar.gz) into memory, by normalised path.
fn read_tar(path: &Path) -> io::Result<BTreeMap<String, Vec<u8>>> {
    let mut raw = Vec::new();
    File::open(path)?.read_to_end(&mut raw)?;
    let reader: Box<dyn Read> = if raw.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::read::GzDecoder::new(&raw[..]))
    } else {
        Box::new(&raw[..])
    };
    let mut files = BTreeMap::new();
    let mut archive = tar::Archive::new(reader);
    for entry in archive.entries()? {
        let mut entry = entry?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = entry
            .path()?
            .to_string_lossy()
            .trim_start_matches("./")
            .to_owned();
        let mut data = Vec::new();
        entry.read_to_end(&mut data)?;
        files.insert(name, data);
    }
    Ok(files)
}

/// Finds `path` in a filesystem layer; `Ok(None)` if the layer does not hold it.
fn file_in_layer(media_type: &str, data: &[u8], path: &str) -> io::Result<Option<Vec<u8>>> {
    let reader: Box<dyn Read + '_> =
        if media_type.ends_with("gzip") || data.starts_with(&[0x1f, 0x8b]) {
            Box::new(flate2::read::GzDecoder::new(data))
        } else if media_type.ends_with("tar") {
            Box::new(data)
        } else {
            return Err(io::Error::other(format!(
                "unsupported layer media type {media_type}"
            )));
        };
    let want = path.trim_start_matches('/');
    let mut found = None;
    let mut archive = tar::Archive::new(reader);
    for entry in archive.entries()? {
        let mut entry = entry?;
        let name = entry
            .path()?
            .to_string_lossy()
            .trim_start_matches("./")
            .trim_start_matches('/')
            .to_owned();
        if name == want && entry.header().entry_type().is_file() {
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes)?;
            found = Some(bytes);
        }
    }
    Ok(found)
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    #[serde(default)]
    media_type: String,
    digest: String,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Clone, Debug, Deserialize)]
struct Platform {
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    os: String,
}

#[derive(Deserialize)]
struct OciIndex {
    #[serde(default)]
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct OciManifest {
    config: Descriptor,
    #[serde(default)]
    layers: Vec<Descriptor>,
}

#[derive(Default, Deserialize)]
struct ImageConfig {
    #[serde(default)]
    config: Option<RuntimeConfig>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RuntimeConfig {
    entrypoint: Option<Vec<String>>,
    cmd: Option<Vec<String>>,
    env: Option<Vec<String>>,
    working_dir: Option<String>,
}
