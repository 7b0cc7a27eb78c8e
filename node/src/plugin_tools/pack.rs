//! `wasmlet plugin pack`: a plugin component as the OCI artifact the node loads from
//! `source.image` — the CNCF TAG Runtime Wasm artifact (config
//! `application/vnd.wasm.config.v0+json`, one `application/wasm` layer) in an OCI
//! image-layout tarball that `wasmlet images import`, `ctr images import` and
//! `skopeo copy oci-archive:` read. The bytes are a function of the input alone.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use anyhow::{Context, bail};
use oci_client::manifest::{ImageIndexEntry, OciDescriptor, OciImageIndex, OciImageManifest};
use sha2::{Digest as _, Sha256};

use super::component::Shape;

const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";
const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";

/// The Wasm artifact's config (the CNCF TAG Runtime `wasm-oci-artifact` layout).
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct WasmConfig<'a> {
    created: &'a str,
    architecture: &'a str,
    os: &'a str,
    layer_digests: Vec<String>,
    component: ComponentSummary<'a>,
}

#[derive(serde::Serialize)]
struct ComponentSummary<'a> {
    exports: &'a [String],
    imports: &'a [String],
}

struct Blob {
    media_type: &'static str,
    digest: String,
    data: Vec<u8>,
}

impl Blob {
    fn new(media_type: &'static str, data: Vec<u8>) -> Self {
        Blob {
            media_type,
            digest: format!("sha256:{}", hex::encode(Sha256::digest(&data))),
            data,
        }
    }

    fn descriptor(&self) -> OciDescriptor {
        OciDescriptor {
            media_type: self.media_type.into(),
            digest: self.digest.clone(),
            size: self.data.len() as i64,
            ..OciDescriptor::default()
        }
    }
}

/// `name` and `tag` of a `name[:tag]` reference (`latest` when it has none).
fn split_reference(reference: &str) -> anyhow::Result<(&str, &str)> {
    if reference.contains('@') {
        bail!("{reference}: a digest cannot name an image in an archive; give name:tag");
    }
    let slash = reference.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match reference[slash..].rfind(':') {
        Some(i) => (&reference[..slash + i], &reference[slash + i + 1..]),
        None => (reference, "latest"),
    };
    if name.is_empty() || tag.is_empty() {
        bail!("{reference}: not a name:tag reference");
    }
    Ok((name, tag))
}

/// Writes the artifact of `component` named `reference` to `out`; returns the
/// manifest's digest.
pub fn pack(
    component: &[u8],
    shape: &Shape,
    reference: &str,
    out: &Path,
) -> anyhow::Result<String> {
    let (name, tag) = split_reference(reference)?;
    let layer = Blob::new(WASM_LAYER_MEDIA_TYPE, component.to_vec());
    let config = WasmConfig {
        created: "1970-01-01T00:00:00Z",
        architecture: "wasm",
        os: "wasip2",
        layer_digests: vec![layer.digest.clone()],
        component: ComponentSummary {
            exports: &shape.exports,
            imports: &shape.imports,
        },
    };
    let config = Blob::new(WASM_CONFIG_MEDIA_TYPE, serde_json::to_vec(&config)?);
    let manifest = OciImageManifest {
        schema_version: 2,
        media_type: Some(MANIFEST_MEDIA_TYPE.into()),
        config: config.descriptor(),
        layers: vec![layer.descriptor()],
        subject: None,
        artifact_type: None,
        annotations: None,
    };
    let manifest = Blob::new(MANIFEST_MEDIA_TYPE, serde_json::to_vec(&manifest)?);
    // No `platform`: `ctr images import` drops what is not the host's platform.
    let index = OciImageIndex {
        schema_version: 2,
        media_type: Some(INDEX_MEDIA_TYPE.into()),
        manifests: vec![ImageIndexEntry {
            media_type: MANIFEST_MEDIA_TYPE.into(),
            digest: manifest.digest.clone(),
            size: manifest.data.len() as i64,
            platform: None,
            annotations: Some(BTreeMap::from([
                ("io.containerd.image.name".into(), format!("{name}:{tag}")),
                ("org.opencontainers.image.ref.name".into(), tag.into()),
            ])),
            artifact_type: None,
        }],
        artifact_type: None,
        annotations: None,
    };

    let mut tar = tar::Builder::new(Vec::new());
    let mut add = |path: &str, data: &[u8], kind: tar::EntryType| -> anyhow::Result<()> {
        let mut header = tar::Header::new_ustar();
        header.set_entry_type(kind);
        header.set_size(data.len() as u64);
        header.set_mode(if kind.is_dir() { 0o755 } else { 0o644 });
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        tar.append_data(&mut header, path, data)
            .with_context(|| format!("archive entry {path}"))
    };
    add(
        "oci-layout",
        br#"{"imageLayoutVersion":"1.0.0"}"#,
        tar::EntryType::Regular,
    )?;
    add(
        "index.json",
        &serde_json::to_vec(&index)?,
        tar::EntryType::Regular,
    )?;
    add("blobs/", &[], tar::EntryType::Directory)?;
    add("blobs/sha256/", &[], tar::EntryType::Directory)?;
    let mut blobs = [&manifest, &config, &layer];
    blobs.sort_by(|a, b| a.digest.cmp(&b.digest));
    for blob in blobs {
        let hex = blob.digest.trim_start_matches("sha256:");
        add(
            &format!("blobs/sha256/{hex}"),
            &blob.data,
            tar::EntryType::Regular,
        )?;
    }
    let bytes = tar.into_inner().context("finishing the archive")?;
    let tmp = out.with_extension("partial");
    let mut file = std::fs::File::create(&tmp).with_context(|| tmp.display().to_string())?;
    file.write_all(&bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, out).with_context(|| out.display().to_string())?;
    Ok(manifest.digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_split_into_name_and_tag() {
        assert_eq!(
            split_reference("localhost:5000/p/probe:1.0").unwrap(),
            ("localhost:5000/p/probe", "1.0")
        );
        assert_eq!(
            split_reference("localhost:5000/p/probe").unwrap(),
            ("localhost:5000/p/probe", "latest")
        );
        assert!(split_reference("p@sha256:00").is_err());
    }
}
