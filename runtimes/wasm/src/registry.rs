//! Registry pulls into the image store (the OCI distribution API, through
//! `oci-client`): tags and digests, image indexes resolved to their `wasi`/`wasm`
//! platform, the CNCF Wasm artifact layout and every layer type the store imports.
//! Each blob's digest is checked against its descriptor; connection failures and
//! server errors are retried with back-off, refusals (unauthorized, unknown) are not.
//!
//! What a pull fetches is handed to the store as an OCI image layout, so a pulled
//! image and an imported archive are stored by the same code.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use oci_client::Reference;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::manifest::{
    IMAGE_MANIFEST_LIST_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE, OCI_IMAGE_INDEX_MEDIA_TYPE,
    OCI_IMAGE_MEDIA_TYPE, OciDescriptor, OciImageIndex, OciImageManifest,
};
use oci_client::secrets::RegistryAuth;
use wasmlet_runtime::AuthConfig;

use crate::image::sha256_hex;

/// How the node reaches registries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegistrySettings {
    /// Per-registry CA certificates, `<certs_dir>/<host[:port]>/*.crt`, trusted beside
    /// the system's (the `/etc/containers/certs.d` layout).
    pub certs_dir: PathBuf,
    /// Registries (`host[:port]`) reached over plain HTTP.
    pub insecure: Vec<String>,
    /// Attempts per request that failed to connect or with a server error.
    pub attempts: u32,
    /// The first wait between attempts, doubled after each.
    pub retry_after: Duration,
}

impl Default for RegistrySettings {
    fn default() -> Self {
        RegistrySettings {
            certs_dir: PathBuf::from("/etc/containers/certs.d"),
            insecure: Vec::new(),
            attempts: 4,
            retry_after: Duration::from_millis(500),
        }
    }
}

/// Why a pull failed, in words a pod's `ErrImagePull` can show.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("invalid image reference {0:?}: {1}")]
    BadReference(String, String),
    #[error("{0}")]
    Registry(String),
    #[error("{0}")]
    BadImage(String),
}

/// The manifests a pull accepts.
const ACCEPTED: &[&str] = &[
    OCI_IMAGE_MEDIA_TYPE,
    OCI_IMAGE_INDEX_MEDIA_TYPE,
    IMAGE_MANIFEST_MEDIA_TYPE,
    IMAGE_MANIFEST_LIST_MEDIA_TYPE,
];

/// Pulls images. Each pull has a client of its own: a client keeps the first
/// credentials it was given for a registry, and pods bring different ones.
pub struct Puller {
    settings: RegistrySettings,
}

/// A pulled image as an OCI image layout: `index.json` and `blobs/sha256/<hex>`.
pub type Layout = BTreeMap<String, Vec<u8>>;

/// What a pull brought.
#[derive(Debug)]
pub enum Pulled {
    /// The registry resolved the reference to the manifest the store already has
    /// (its digest): nothing was downloaded.
    Unchanged(String),
    /// A new image to import.
    Image(Layout),
}

/// Blobs at least this large are reported in the node's log as they arrive.
const PROGRESS_FROM: u64 = 4 << 20;

impl Puller {
    pub fn new(settings: RegistrySettings) -> Self {
        // reqwest is built without a crypto provider: ring is the node's one.
        let _ = rustls::crypto::ring::default_provider().install_default();
        Puller { settings }
    }

    /// Fetches `image` (a tag or a digest) with `auth`: the layout to import, named
    /// `image`. With `known`, the manifest digest the store holds for `image`, a tag
    /// the registry still resolves to it downloads nothing more ([`Pulled::Unchanged`]).
    pub async fn pull(
        &self,
        image: &str,
        auth: Option<&AuthConfig>,
        known: Option<&str>,
    ) -> Result<Pulled, PullError> {
        let reference: Reference = image.parse().map_err(|e: oci_client::ParseError| {
            PullError::BadReference(image.into(), e.to_string())
        })?;
        let auth = registry_auth(auth)?;
        let client = self.client(reference.resolve_registry())?;
        let (bytes, digest) = self
            .retry(|| client.pull_manifest_raw(&reference, &auth, ACCEPTED))
            .await
            .map_err(|e| registry_error(image, e))?;
        check_digest(&bytes, &digest, "manifest")?;
        if let Some(wanted) = reference.digest()
            && wanted != digest
        {
            return Err(PullError::BadImage(format!(
                "the registry answered {image} with {digest}"
            )));
        }
        let mut layout = Layout::new();
        let (mut manifest_digest, mut manifest_bytes, mut media_type) =
            (digest, bytes.to_vec(), media_type_of(&bytes));
        if is_index(&media_type) {
            let index: OciImageIndex = serde_json::from_slice(&manifest_bytes)
                .map_err(|e| PullError::BadImage(format!("image index of {image}: {e}")))?;
            let entry = pick_platform(&index).ok_or_else(|| {
                PullError::BadImage(format!("the image index of {image} lists no manifest"))
            })?;
            let by_digest = reference.clone_with_digest(entry.digest.clone());
            let (bytes, digest) = self
                .retry(|| client.pull_manifest_raw(&by_digest, &auth, ACCEPTED))
                .await
                .map_err(|e| registry_error(image, e))?;
            check_digest(&bytes, &entry.digest, "manifest")?;
            (manifest_digest, manifest_bytes, media_type) =
                (digest, bytes.to_vec(), entry.media_type.clone());
        }
        if known == Some(manifest_digest.as_str()) {
            return Ok(Pulled::Unchanged(manifest_digest));
        }
        let manifest: OciImageManifest = serde_json::from_slice(&manifest_bytes)
            .map_err(|e| PullError::BadImage(format!("manifest of {image}: {e}")))?;
        let blobs: Vec<&OciDescriptor> = std::iter::once(&manifest.config)
            .chain(&manifest.layers)
            .collect();
        let total: u64 = blobs.iter().map(|d| d.size.max(0) as u64).sum();
        let mut done = 0u64;
        for (i, desc) in blobs.iter().enumerate() {
            let data = self.blob(&client, &reference, desc, image).await?;
            done += data.len() as u64;
            if total >= PROGRESS_FROM {
                tracing::info!(
                    image,
                    blob = i + 1,
                    blobs = blobs.len(),
                    bytes = done,
                    of = total,
                    "pulling: {:.1} of {:.1} MiB",
                    done as f64 / f64::from(1 << 20),
                    total as f64 / f64::from(1 << 20)
                );
            }
            layout.insert(blob_key(&desc.digest)?, data);
        }
        layout.insert(blob_key(&manifest_digest)?, manifest_bytes.clone());
        let index = serde_json::json!({
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": if media_type.is_empty() { OCI_IMAGE_MEDIA_TYPE.to_owned() } else { media_type },
                "digest": manifest_digest,
                "size": manifest_bytes.len(),
                "annotations": { "io.containerd.image.name": image },
            }],
        });
        layout.insert(
            "index.json".into(),
            serde_json::to_vec(&index).expect("serializes"),
        );
        Ok(Pulled::Image(layout))
    }

    /// One blob, its digest checked.
    async fn blob(
        &self,
        client: &oci_client::Client,
        reference: &Reference,
        desc: &OciDescriptor,
        image: &str,
    ) -> Result<Vec<u8>, PullError> {
        let data = self
            .retry(|| async {
                let mut out = Vec::with_capacity(usize::try_from(desc.size).unwrap_or(0));
                client.pull_blob(reference, desc, &mut out).await?;
                Ok(out)
            })
            .await
            .map_err(|e| registry_error(image, e))?;
        check_digest(&data, &desc.digest, "blob")?;
        Ok(data)
    }

    /// A client for `registry`, trusting its CAs.
    fn client(&self, registry: &str) -> Result<oci_client::Client, PullError> {
        let config = ClientConfig {
            protocol: if self.settings.insecure.iter().any(|r| r == registry) {
                ClientProtocol::Http
            } else {
                ClientProtocol::Https
            },
            extra_root_certificates: registry_cas(&self.settings.certs_dir, registry)?,
            platform_resolver: None,
            connect_timeout: Some(Duration::from_secs(30)),
            read_timeout: Some(Duration::from_secs(60)),
            ..Default::default()
        };
        Ok(oci_client::Client::new(config))
    }

    /// Runs `op` until it succeeds, fails for good, or the attempts are used up.
    async fn retry<T, F, Fut>(&self, mut op: F) -> Result<T, OciDistributionError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, OciDistributionError>>,
    {
        let mut wait = self.settings.retry_after;
        let mut attempt = 1;
        loop {
            match op().await {
                Ok(v) => return Ok(v),
                Err(e) if attempt < self.settings.attempts && transient(&e) => {
                    tracing::warn!(
                        attempt,
                        "registry request failed, retrying in {wait:?}: {e}"
                    );
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// Whether a failure may pass: no connection, a timeout, a server error.
fn transient(e: &OciDistributionError) -> bool {
    match e {
        OciDistributionError::RequestError(e) => e.is_connect() || e.is_timeout() || e.is_request(),
        OciDistributionError::ServerError { code, .. } => *code >= 500 || *code == 429,
        _ => false,
    }
}

/// The error a pod shows: what the registry said, without any credential.
fn registry_error(image: &str, e: OciDistributionError) -> PullError {
    let said = match &e {
        OciDistributionError::UnauthorizedError { .. }
        | OciDistributionError::AuthenticationFailure(_) => {
            format!("unauthorized: the registry refused the credentials for {image} ({e})")
        }
        OciDistributionError::ImageManifestNotFoundError(_) => {
            format!("{image}: not found ({e})")
        }
        OciDistributionError::RequestError(inner) => {
            // reqwest's chain names the cause (TLS, DNS, refused).
            let mut text = inner.to_string();
            let mut source = std::error::Error::source(inner);
            while let Some(s) = source {
                text.push_str(": ");
                text.push_str(&s.to_string());
                source = s.source();
            }
            text
        }
        _ => e.to_string(),
    };
    PullError::Registry(format!("pulling {image}: {said}"))
}

/// The registry credentials CRI's `AuthConfig` carries.
fn registry_auth(auth: Option<&AuthConfig>) -> Result<RegistryAuth, PullError> {
    let Some(a) = auth else {
        return Ok(RegistryAuth::Anonymous);
    };
    if !a.registry_token.is_empty() {
        return Ok(RegistryAuth::Bearer(a.registry_token.clone()));
    }
    if !a.username.is_empty() {
        return Ok(RegistryAuth::Basic(a.username.clone(), a.password.clone()));
    }
    if !a.auth.is_empty() {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(a.auth.trim())
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(|| {
                PullError::Registry(
                    "the pull credentials' auth is not base64 of user:password".into(),
                )
            })?;
        let (user, password) = decoded.split_once(':').ok_or_else(|| {
            PullError::Registry("the pull credentials' auth is not base64 of user:password".into())
        })?;
        return Ok(RegistryAuth::Basic(user.to_owned(), password.to_owned()));
    }
    if !a.identity_token.is_empty() {
        return Err(PullError::Registry(
            "identity tokens (OAuth2 refresh tokens) are not supported for Wasm image pulls".into(),
        ));
    }
    Ok(RegistryAuth::Anonymous)
}

/// The CA certificates of `<certs_dir>/<registry>/*.crt`.
fn registry_cas(certs_dir: &Path, registry: &str) -> Result<Vec<Certificate>, PullError> {
    let dir = certs_dir.join(registry);
    let mut certs = Vec::new();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(certs);
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "crt") {
            let data = std::fs::read(&path).map_err(|e| {
                PullError::Registry(format!("reading the CA file {}: {e}", path.display()))
            })?;
            certs.push(Certificate {
                encoding: CertificateEncoding::Pem,
                data,
            });
        }
    }
    Ok(certs)
}

/// Of an image index, the manifest for Wasm (`wasi` OS or `wasm` architecture),
/// else the only one.
fn pick_platform(index: &OciImageIndex) -> Option<&oci_client::manifest::ImageIndexEntry> {
    index
        .manifests
        .iter()
        .find(|m| {
            m.platform.as_ref().is_some_and(|p| {
                p.architecture.to_string() == "wasm" || p.os.to_string().starts_with("wasi")
            })
        })
        .or_else(|| (index.manifests.len() == 1).then(|| &index.manifests[0]))
}

fn is_index(media_type: &str) -> bool {
    media_type == OCI_IMAGE_INDEX_MEDIA_TYPE || media_type == IMAGE_MANIFEST_LIST_MEDIA_TYPE
}

/// The `mediaType` a manifest names itself with ("" when it names none).
fn media_type_of(bytes: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Typed {
        #[serde(rename = "mediaType", default)]
        media_type: String,
        #[serde(default)]
        manifests: Option<serde_json::Value>,
    }
    match serde_json::from_slice::<Typed>(bytes) {
        Ok(t) if t.media_type.is_empty() && t.manifests.is_some() => {
            OCI_IMAGE_INDEX_MEDIA_TYPE.into()
        }
        Ok(t) => t.media_type,
        Err(_) => String::new(),
    }
}

fn check_digest(data: &[u8], digest: &str, what: &str) -> Result<(), PullError> {
    let actual = format!("sha256:{}", sha256_hex(data));
    if actual != digest {
        return Err(PullError::BadImage(format!(
            "{what} {digest} arrived with digest {actual}"
        )));
    }
    Ok(())
}

fn blob_key(digest: &str) -> Result<String, PullError> {
    let hex = digest
        .strip_prefix("sha256:")
        .ok_or_else(|| PullError::BadImage(format!("unsupported digest {digest:?}")))?;
    Ok(format!("blobs/sha256/{hex}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_become_registry_auth_without_showing_secrets() {
        let basic = AuthConfig {
            username: "u".into(),
            password: "p".into(),
            ..Default::default()
        };
        assert!(
            matches!(registry_auth(Some(&basic)).unwrap(), RegistryAuth::Basic(u, p) if u == "u" && p == "p")
        );
        let encoded = AuthConfig {
            auth: base64::engine::general_purpose::STANDARD.encode("me:s3cret:x"),
            ..Default::default()
        };
        assert!(
            matches!(registry_auth(Some(&encoded)).unwrap(), RegistryAuth::Basic(u, p) if u == "me" && p == "s3cret:x")
        );
        let token = AuthConfig {
            registry_token: "t".into(),
            ..Default::default()
        };
        assert!(
            matches!(registry_auth(Some(&token)).unwrap(), RegistryAuth::Bearer(t) if t == "t")
        );
        assert!(matches!(
            registry_auth(None).unwrap(),
            RegistryAuth::Anonymous
        ));
        let bad = AuthConfig {
            auth: "!!".into(),
            ..Default::default()
        };
        assert!(registry_auth(Some(&bad)).is_err());
        let shown = format!("{basic:?} {encoded:?}");
        assert!(
            !shown.contains("s3cret") && !shown.contains("\"p\""),
            "{shown}"
        );
    }

    #[test]
    fn an_index_resolves_to_its_wasm_manifest() {
        let index: OciImageIndex = serde_json::from_value(serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_IMAGE_INDEX_MEDIA_TYPE,
            "manifests": [
                {"mediaType": OCI_IMAGE_MEDIA_TYPE, "digest": "sha256:aa", "size": 1,
                 "platform": {"architecture": "amd64", "os": "linux"}},
                {"mediaType": OCI_IMAGE_MEDIA_TYPE, "digest": "sha256:bb", "size": 1,
                 "platform": {"architecture": "wasm", "os": "wasip1"}},
            ],
        }))
        .unwrap();
        assert_eq!(pick_platform(&index).unwrap().digest, "sha256:bb");
        assert_eq!(
            media_type_of(&serde_json::to_vec(&index).unwrap()),
            OCI_IMAGE_INDEX_MEDIA_TYPE
        );
    }

    #[test]
    fn a_blob_with_another_digest_is_refused() {
        let data = b"hello";
        let good = format!("sha256:{}", sha256_hex(data));
        assert!(check_digest(data, &good, "blob").is_ok());
        let err = check_digest(b"hellO", &good, "blob").unwrap_err();
        assert!(err.to_string().contains("arrived with digest"), "{err}");
    }
}
