//! Real Wasm guests and the OCI images tests pull and import.
//!
//! Start at [`ensure_example_images`]: it builds the guest workspace
//! `examples/workloads` for `wasm32-wasip1` ([`build_guests`]), wraps `hello`
//! into a `wasi:cli/command` component ([`componentize_command`]) and writes
//! one OCI image-layout tarball per entry of [`EXAMPLE_IMAGES`] to
//! `target/images/<name>.tar`, next to `<name>.wasm`, the binary the image
//! carries. `cargo xtask images` does the same from the command line.
//!
//! The archive writer ([`WasmImage`], [`write_oci_archive`]) supports the
//! three ways Wasm is packaged in the wild, see [`WasmLayout`]. Archives are
//! byte-for-byte reproducible, so a manifest digest is a stable name for an
//! image across runs and machines with the same toolchain.
//!
//! The plugins of `examples/plugins` are built the same way, as libraries,
//! and turned into components: see [`ensure_plugins`].
//!
//! ```no_run
//! let dir = wasmlet_testkit::images::ensure_example_images()?;
//! let hello_tar = dir.join("hello.tar"); // localhost/wasmlet-examples/hello:latest
//! let hello_wasm = dir.join("hello.wasm");
//! # anyhow::Ok(())
//! ```

mod component;
mod guests;
mod oci;
mod plugins;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, bail};

pub use component::{component_info, componentize_command, componentize_library};
pub use guests::{
    GUEST_CARGO_HOME_ENV, GUEST_TARGET, GuestLink, GuestToolchain, build_guest_workspace,
    build_guests, guest_cargo_home,
};
pub use oci::{
    ANNOTATION_IMAGE_NAME, ANNOTATION_REF_NAME, AUTHOR, Blob, COMPONENT_OS, CREATED, ComponentInfo,
    Descriptor, ExecConfig, IMAGE_CONFIG_MEDIA_TYPE, INDEX_MEDIA_TYPE, ImageConfig, ImageIndex,
    ImageManifest, MANIFEST_MEDIA_TYPE, MODULE_OS, OciImage, PLAIN_IMAGE_ENTRYPOINT,
    PLAIN_IMAGE_ENV, RUNWASI_LAYERS_LABEL, RUNWASI_WASM_LAYER_MEDIA_TYPE, RootFs,
    TAR_GZIP_LAYER_MEDIA_TYPE, WASM_ARCHITECTURE, WASM_CONFIG_MEDIA_TYPE, WASM_LAYER_MEDIA_TYPE,
    WasmConfig, WasmImage, WasmLayout, manifest_digest, sha256_digest, write_oci_archive,
};
pub use plugins::{
    EXAMPLE_PLUGINS, ExamplePlugin, PLUGIN_PACKAGE, PluginWorld, build_plugins, build_plugins_into,
    ensure_plugins, plugin_file_name,
};

/// Repository prefix of the example images.
pub const EXAMPLE_REPOSITORY: &str = "localhost/wasmlet-examples";

/// The guest crates in `examples/workloads`, one `<name>.wasm` each.
pub const WORKLOADS: [&str; 7] = [
    "hello", "ticker", "crasher", "memhog", "spin", "graceful", "httpd",
];

/// One image written by [`build_example_images`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExampleImage {
    /// Image (and file) name: `target/images/<name>.tar`, reference
    /// `localhost/wasmlet-examples/<name>:latest`.
    pub name: &'static str,
    /// The guest crate it is built from.
    pub guest: &'static str,
    /// Packaging.
    pub layout: WasmLayout,
    /// Whether the guest is componentized first.
    pub component: bool,
}

const fn module_artifact(name: &'static str) -> ExampleImage {
    ExampleImage {
        name,
        guest: name,
        layout: WasmLayout::Artifact,
        component: false,
    }
}

/// Every example image: each workload as a CNCF Wasm artifact of its core
/// module, plus `hello` as an artifact of its component
/// (`hello-component`), as runwasi's image of its component
/// (`hello-runwasi`) and as a plain container image of its module
/// (`hello-plain`). `httpd` listens through `wasi:sockets`, which only a
/// component has, so its one image is its component.
pub const EXAMPLE_IMAGES: [ExampleImage; 11] = [
    module_artifact("hello"),
    module_artifact("ticker"),
    module_artifact("crasher"),
    module_artifact("memhog"),
    module_artifact("spin"),
    module_artifact("graceful"),
    ExampleImage {
        name: "hello-component",
        guest: "hello",
        layout: WasmLayout::Artifact,
        component: true,
    },
    ExampleImage {
        name: "graceful-component",
        guest: "graceful",
        layout: WasmLayout::Artifact,
        component: true,
    },
    ExampleImage {
        name: "httpd",
        guest: "httpd",
        layout: WasmLayout::Artifact,
        component: true,
    },
    ExampleImage {
        name: "hello-runwasi",
        guest: "hello",
        layout: WasmLayout::RunwasiComponentLayer,
        component: true,
    },
    ExampleImage {
        name: "hello-plain",
        guest: "hello",
        layout: WasmLayout::PlainImage,
        component: false,
    },
];

/// `localhost/wasmlet-examples/<name>:latest`.
pub fn example_reference(name: &str) -> String {
    format!("{EXAMPLE_REPOSITORY}/{name}:latest")
}

/// An archive written by [`write_example_images`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltImage {
    /// Image name, e.g. `hello-component`.
    pub name: String,
    /// Full reference the archive is annotated with.
    pub reference: String,
    /// `<out_dir>/<name>.tar`.
    pub archive: PathBuf,
    /// `<out_dir>/<name>.wasm`: the module or component inside.
    pub wasm: PathBuf,
    /// `sha256:<hex>` of the manifest.
    pub manifest_digest: String,
    /// Packaging.
    pub layout: WasmLayout,
    /// Whether the payload is a component.
    pub component: bool,
}

/// Package already-built guests (`<guests_dir>/<guest>.wasm`) as the
/// [`EXAMPLE_IMAGES`] into `out_dir`. Files whose content is unchanged are
/// left alone; changed ones are replaced atomically.
pub fn write_example_images(guests_dir: &Path, out_dir: &Path) -> anyhow::Result<Vec<BuiltImage>> {
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let mut components = std::collections::BTreeMap::new();
    let mut built = Vec::with_capacity(EXAMPLE_IMAGES.len());
    for example in EXAMPLE_IMAGES {
        let module_path = guests_dir.join(format!("{}.wasm", example.guest));
        let module = std::fs::read(&module_path)
            .with_context(|| format!("reading guest {}", module_path.display()))?;
        let wasm = if example.component {
            match components.get(example.guest) {
                Some(component) => Vec::clone(component),
                None => {
                    let component = componentize_command(&module)
                        .with_context(|| format!("componentizing {}", module_path.display()))?;
                    components.insert(example.guest, component.clone());
                    component
                }
            }
        } else {
            module
        };
        built.push(write_image(
            out_dir,
            example.name,
            WasmImage {
                reference: example_reference(example.name),
                wasm,
                layout: example.layout,
                component: example.component,
            },
        )?);
    }
    Ok(built)
}

/// Writes `image` as `<out_dir>/<name>.tar` and its binary as `<out_dir>/<name>.wasm`
/// (each replaced atomically, left alone when unchanged).
fn write_image(out_dir: &Path, name: &str, image: WasmImage) -> anyhow::Result<BuiltImage> {
    let oci = image.to_oci()?;
    let archive = out_dir.join(format!("{name}.tar"));
    let wasm_path = out_dir.join(format!("{name}.wasm"));
    oci::write_atomic(&wasm_path, &image.wasm)?;
    oci.write_archive(&archive)
        .with_context(|| format!("writing {}", archive.display()))?;
    Ok(BuiltImage {
        name: name.to_string(),
        reference: image.reference,
        archive,
        wasm: wasm_path,
        manifest_digest: oci.manifest.digest.clone(),
        layout: image.layout,
        component: image.component,
    })
}

/// The workloads a containerd shim runs, as [`WasmLayout::HostImage`] images named
/// `<guest>-linux` (core modules).
pub const SHIM_WORKLOADS: [&str; 6] = ["hello", "ticker", "crasher", "memhog", "spin", "graceful"];

/// The [`SHIM_WORKLOADS`] images in `<workspace>/target/images/shim`, built once per
/// process (and under the build lock across processes).
pub fn ensure_shim_images() -> anyhow::Result<Vec<BuiltImage>> {
    static DONE: OnceLock<Result<Vec<BuiltImage>, String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let build = || -> anyhow::Result<Vec<BuiltImage>> {
            let root = workspace_root()?;
            let out_dir = root.join("target").join("images").join("shim");
            with_build_lock(&out_dir, || {
                let guests = build_guests(&root)?;
                SHIM_WORKLOADS
                    .iter()
                    .map(|guest| {
                        let path = guests.join(format!("{guest}.wasm"));
                        let wasm = std::fs::read(&path)
                            .with_context(|| format!("reading guest {}", path.display()))?;
                        let name = format!("{guest}-linux");
                        let reference = example_reference(&name);
                        let image = WasmImage::new(reference, wasm, WasmLayout::HostImage);
                        write_image(&out_dir, &name, image)
                    })
                    .collect()
            })
        };
        build().map_err(|e| format!("{e:#}"))
    })
    .clone()
    .map_err(|e| anyhow::anyhow!("building the shim's images: {e}"))
}

/// The `wasi:http/proxy` components of `examples/http`: each crate's library,
/// componentized with the reactor adapter, as an artifact image of the crate's name.
pub const HTTP_COMPONENTS: [&str; 1] = ["hello-http"];

/// Build the library crates of `<workspace_root>/examples/http`; the directory
/// holding their `.wasm` files (`hello_http.wasm` for `hello-http`).
pub fn build_http_guests(workspace_root: &Path) -> anyhow::Result<PathBuf> {
    build_guest_workspace(
        &workspace_root.join("examples").join("http"),
        GuestLink::Library,
    )
}

/// Componentize the [`HTTP_COMPONENTS`] built in `guests_dir` and write their images
/// to `out_dir`, as [`write_example_images`] writes the workloads'.
pub fn write_http_images(guests_dir: &Path, out_dir: &Path) -> anyhow::Result<Vec<BuiltImage>> {
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let mut built = Vec::new();
    for name in HTTP_COMPONENTS {
        let module_path = guests_dir.join(format!("{}.wasm", name.replace('-', "_")));
        let module = std::fs::read(&module_path)
            .with_context(|| format!("reading guest {}", module_path.display()))?;
        let wasm = componentize_library(&module)
            .with_context(|| format!("componentizing {}", module_path.display()))?;
        built.push(write_image(
            out_dir,
            name,
            WasmImage {
                reference: example_reference(name),
                wasm,
                layout: WasmLayout::Artifact,
                component: true,
            },
        )?);
    }
    Ok(built)
}

/// Build the guests of `<workspace_root>/examples/workloads` and `examples/http` and
/// write the [`EXAMPLE_IMAGES`] and the [`HTTP_COMPONENTS`] to `out_dir`
/// (conventionally `<root>/target/images`). Returns what was written.
pub fn build_all_example_images(
    workspace_root: &Path,
    out_dir: &Path,
) -> anyhow::Result<Vec<BuiltImage>> {
    let guests = build_guests(workspace_root)?;
    let mut built = write_example_images(&guests, out_dir)?;
    let http = build_http_guests(workspace_root)?;
    built.extend(write_http_images(&http, out_dir)?);
    Ok(built)
}

/// [`build_all_example_images`]: the archive paths.
pub fn build_example_images(workspace_root: &Path, out_dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let built = build_all_example_images(workspace_root, out_dir)?;
    Ok(built.into_iter().map(|b| b.archive).collect())
}

/// The root of the wasmlet workspace: the nearest ancestor of
/// `CARGO_MANIFEST_DIR` (at run time, else this crate's at build time) whose
/// `Cargo.toml` has a `[workspace]` table and which has an `examples/` dir.
pub fn workspace_root() -> anyhow::Result<PathBuf> {
    let start = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    for dir in start.ancestors() {
        let is_root = std::fs::read_to_string(dir.join("Cargo.toml"))
            .is_ok_and(|toml| toml.lines().any(|l| l.trim() == "[workspace]"))
            && dir.join("examples").is_dir();
        if is_root {
            return Ok(dir.to_path_buf());
        }
    }
    bail!(
        "no wasmlet workspace root (Cargo.toml with [workspace] and examples/) above {}",
        start.display()
    )
}

/// Make sure `target/images` holds up-to-date example images and return
/// that directory. Safe to call from many tests at once: one build per
/// process, and an exclusive lock on `target/images/.lock` across processes.
pub fn ensure_example_images() -> anyhow::Result<PathBuf> {
    static DONE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DONE.get_or_init(|| ensure_example_images_locked().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(|e| anyhow::anyhow!("building example images: {e}"))
}

fn ensure_example_images_locked() -> anyhow::Result<PathBuf> {
    let root = workspace_root()?;
    let out_dir = root.join("target").join("images");
    with_build_lock(&out_dir, || build_example_images(&root, &out_dir).map(drop))?;
    Ok(out_dir)
}

/// Runs `build` holding an exclusive lock on `<out_dir>/.lock` (made with the
/// directory if need be), so builds from several test processes do not overlap.
pub(crate) fn with_build_lock<T>(
    out_dir: &Path,
    build: impl FnOnce() -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let lock_path = out_dir.join(".lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .with_context(|| format!("opening {}", lock_path.display()))?;
    lock.lock()
        .with_context(|| format!("locking {}", lock_path.display()))?;
    let built = build();
    drop(lock);
    built
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::io::Read;

    use super::component::tests::START_MODULE;
    use super::*;

    /// Unpack an archive into path -> bytes.
    fn untar(archive: &Path) -> BTreeMap<String, Vec<u8>> {
        let mut files = BTreeMap::new();
        let mut tar = tar::Archive::new(std::fs::File::open(archive).unwrap());
        for entry in tar.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().to_string_lossy().into_owned();
            if entry.header().entry_type().is_dir() {
                continue;
            }
            assert_eq!(entry.header().mtime().unwrap(), 0, "{path}");
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            files.insert(path, data);
        }
        files
    }

    /// The blob a descriptor names, checked against its digest and size.
    fn blob<'a>(files: &'a BTreeMap<String, Vec<u8>>, desc: &Descriptor) -> &'a [u8] {
        let hex = desc.digest.strip_prefix("sha256:").expect("sha256 digest");
        let data = files
            .get(&format!("blobs/sha256/{hex}"))
            .unwrap_or_else(|| panic!("blob {} missing", desc.digest));
        assert_eq!(sha256_digest(data), desc.digest);
        assert_eq!(data.len() as u64, desc.size);
        data
    }

    /// Write `image`, read it back as a consumer would, return the manifest,
    /// the config bytes and the layer bytes.
    fn round_trip(image: &WasmImage) -> (ImageManifest, Vec<u8>, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("image.tar");
        write_oci_archive(image, &out).unwrap();
        let files = untar(&out);

        let layout: serde_json::Value = serde_json::from_slice(&files["oci-layout"]).unwrap();
        assert_eq!(layout["imageLayoutVersion"], "1.0.0");

        let index: ImageIndex = serde_json::from_slice(&files["index.json"]).unwrap();
        assert_eq!(index.schema_version, 2);
        assert_eq!(index.media_type, INDEX_MEDIA_TYPE);
        let [desc] = index.manifests.as_slice() else {
            panic!("one manifest expected: {index:?}")
        };
        assert_eq!(desc.media_type, MANIFEST_MEDIA_TYPE);
        assert_eq!(desc.annotations[ANNOTATION_IMAGE_NAME], image.reference);
        assert_eq!(desc.annotations[ANNOTATION_REF_NAME], "latest");
        assert_eq!(desc.digest, manifest_digest(image).unwrap());

        let manifest: ImageManifest = serde_json::from_slice(blob(&files, desc)).unwrap();
        assert_eq!(manifest.schema_version, 2);
        assert_eq!(manifest.media_type, MANIFEST_MEDIA_TYPE);
        assert_eq!(manifest.config.media_type, image.layout.config_media_type());
        let [layer] = manifest.layers.as_slice() else {
            panic!("one layer expected: {manifest:?}")
        };
        assert_eq!(layer.media_type, image.layout.layer_media_type());
        let config = blob(&files, &manifest.config).to_vec();
        let layer = blob(&files, layer).to_vec();
        (manifest, config, layer)
    }

    fn image(wasm: &[u8], layout: WasmLayout) -> WasmImage {
        WasmImage::new(
            "localhost/wasmlet-examples/test:latest",
            wasm.to_vec(),
            layout,
        )
    }

    #[test]
    fn artifact_round_trips_for_modules_and_components() {
        let component = componentize_command(START_MODULE).unwrap();
        for (wasm, os) in [
            (START_MODULE.to_vec(), MODULE_OS),
            (component, COMPONENT_OS),
        ] {
            let image = image(&wasm, WasmLayout::Artifact);
            let (manifest, config, layer) = round_trip(&image);
            assert_eq!(layer, wasm);
            let config: WasmConfig = serde_json::from_slice(&config).unwrap();
            assert_eq!(config.architecture, "wasm");
            assert_eq!(config.os, os);
            assert_eq!(config.created, CREATED);
            assert_eq!(
                config.layer_digests,
                vec![manifest.layers[0].digest.clone()]
            );
            assert_eq!(config.component.is_some(), image.component);
            if let Some(info) = config.component {
                assert!(info.exports.iter().any(|e| e.starts_with("wasi:cli/run@")));
            }
        }
    }

    #[test]
    fn runwasi_layout_round_trips() {
        let component = componentize_command(START_MODULE).unwrap();
        let image = image(&component, WasmLayout::RunwasiComponentLayer);
        let (manifest, config, layer) = round_trip(&image);
        assert_eq!(layer, component);
        let config: ImageConfig = serde_json::from_slice(&config).unwrap();
        assert_eq!(config.architecture, "wasm");
        assert_eq!(config.os, "wasip1");
        assert!(config.rootfs.diff_ids.is_empty());
        assert_eq!(config.config.entrypoint, vec!["test.wasm".to_string()]);
        let hex = manifest.layers[0].digest.trim_start_matches("sha256:");
        assert_eq!(
            config.config.labels[RUNWASI_LAYERS_LABEL],
            sha256_digest(hex.as_bytes()).trim_start_matches("sha256:")
        );
    }

    #[test]
    fn plain_image_round_trips() {
        let image = image(START_MODULE, WasmLayout::PlainImage);
        let (_, config, layer) = round_trip(&image);
        let config: ImageConfig = serde_json::from_slice(&config).unwrap();
        assert_eq!(config.architecture, "wasm");
        assert_eq!(config.os, "wasip1");
        assert_eq!(
            config.config.entrypoint,
            vec![PLAIN_IMAGE_ENTRYPOINT.to_string()]
        );
        assert_eq!(config.config.env, PLAIN_IMAGE_ENV);

        let mut tar_bytes = Vec::new();
        flate2::read::GzDecoder::new(&layer[..])
            .read_to_end(&mut tar_bytes)
            .unwrap();
        assert_eq!(config.rootfs.diff_ids, vec![sha256_digest(&tar_bytes)]);
        let mut tar = tar::Archive::new(&tar_bytes[..]);
        let mut entries: Vec<(String, u32, Vec<u8>)> = Vec::new();
        for entry in tar.entries().unwrap() {
            let mut entry = entry.unwrap();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            let path = entry.path().unwrap().to_string_lossy().into_owned();
            entries.push((path, entry.header().mode().unwrap(), data));
        }
        assert_eq!(
            entries,
            vec![("app.wasm".to_string(), 0o644, START_MODULE.to_vec())]
        );
    }

    #[test]
    fn same_input_same_manifest_digest_different_layouts_differ() {
        let digests: Vec<String> = WasmLayout::ALL
            .iter()
            .map(|&layout| manifest_digest(&image(START_MODULE, layout)).unwrap())
            .collect();
        let again: Vec<String> = WasmLayout::ALL
            .iter()
            .map(|&layout| manifest_digest(&image(START_MODULE, layout)).unwrap())
            .collect();
        assert_eq!(digests, again);
        assert_ne!(digests[0], digests[1]);
        assert_ne!(digests[1], digests[2]);
    }

    #[test]
    fn example_names_are_unique() {
        let mut names: Vec<&str> = EXAMPLE_IMAGES.iter().map(|e| e.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), EXAMPLE_IMAGES.len());
        for example in EXAMPLE_IMAGES {
            assert!(WORKLOADS.contains(&example.guest), "{}", example.name);
        }
    }

    /// The real thing: build the guests with the Debian toolchain and check
    /// every example archive. Slow only the first time (about 80 s on 2 cores).
    #[test]
    fn example_images_are_built() {
        let dir = ensure_example_images().unwrap();
        for example in EXAMPLE_IMAGES {
            let wasm = std::fs::read(dir.join(format!("{}.wasm", example.name))).unwrap();
            assert_eq!(
                wasmparser::Parser::is_component(&wasm),
                example.component,
                "{}",
                example.name
            );
            wasmparser::Validator::new_with_features(wasmparser::WasmFeatures::all())
                .validate_all(&wasm)
                .unwrap_or_else(|e| panic!("{}: {e}", example.name));
            let image = WasmImage::new(example_reference(example.name), wasm, example.layout);
            let files = untar(&dir.join(format!("{}.tar", example.name)));
            let index: ImageIndex = serde_json::from_slice(&files["index.json"]).unwrap();
            assert_eq!(index.manifests[0].digest, manifest_digest(&image).unwrap());
        }
        let component = std::fs::read(dir.join("hello-component.wasm")).unwrap();
        let info = component_info(&component).unwrap();
        assert!(
            info.exports.iter().any(|e| e.starts_with("wasi:cli/run@")),
            "{info:?}"
        );
        let httpd = component_info(&std::fs::read(dir.join("httpd.wasm")).unwrap()).unwrap();
        assert!(
            httpd
                .imports
                .iter()
                .any(|i| i.starts_with("wasi:sockets/tcp@0.2.")),
            "{httpd:?}"
        );
    }
}
