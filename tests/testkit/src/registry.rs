//! A loopback OCI registry for tests: Debian's `docker-registry` (the CNCF
//! distribution registry) over TLS from a test CA, with htpasswd basic auth, and
//! pushes of Wasm artifacts to it.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use oci_client::Reference;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig};
use oci_client::secrets::RegistryAuth;
use sha2::Digest as _;

use crate::node::poll;
use crate::pki::Ca;

/// The user the registry accepts, and its password.
pub const USER: &str = "wasmlet";
pub const PASSWORD: &str = "pull-secret-42";

pub struct Registry {
    child: Child,
    dir: tempfile::TempDir,
    /// `127.0.0.1:<port>`.
    pub host: String,
    pub ca: Ca,
}

impl Registry {
    /// Starts a registry on a free loopback port; ready when this returns.
    pub fn start() -> Result<Registry> {
        let dir = tempfile::Builder::new()
            .prefix("wasmlet-registry-")
            .tempdir()?;
        let port = crate::node::free_port();
        let host = format!("127.0.0.1:{port}");
        let ca = Ca::new("wasmlet test registry CA");
        let (cert, key) =
            ca.issue_server(&["127.0.0.1", "localhost"], Duration::from_secs(3600))?;
        std::fs::write(dir.path().join("server.crt"), cert)?;
        std::fs::write(dir.path().join("server.key"), key)?;
        let certs = dir.path().join("certs.d").join(&host);
        std::fs::create_dir_all(&certs)?;
        std::fs::write(certs.join("ca.crt"), ca.pem())?;
        let htpasswd = Command::new("htpasswd")
            .args(["-Bbn", USER, PASSWORD])
            .output()
            .context("running htpasswd (Debian package apache2-utils)")?;
        if !htpasswd.status.success() {
            bail!("htpasswd: {}", String::from_utf8_lossy(&htpasswd.stderr));
        }
        std::fs::write(dir.path().join("htpasswd"), htpasswd.stdout)?;
        let d = dir.path().display();
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {d}/data\n\
                 http:\n  addr: {host}\n  tls:\n    certificate: {d}/server.crt\n    key: {d}/server.key\n\
                 auth:\n  htpasswd:\n    realm: wasmlet-test\n    path: {d}/htpasswd\n"
            ),
        )?;
        let log = std::fs::File::create(dir.path().join("registry.log"))?;
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting docker-registry (Debian package docker-registry)")?;
        let mut registry = Registry {
            child,
            dir,
            host,
            ca,
        };
        let up = poll(Duration::from_secs(20), || {
            std::net::TcpStream::connect(&registry.host)
                .ok()
                .map(|_| ())
        });
        if up.is_none() {
            let _ = registry.child.kill();
            bail!(
                "docker-registry did not listen within 20 s: {}",
                registry.log()
            );
        }
        Ok(registry)
    }

    /// What the registry logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// A directory in the `/etc/containers/certs.d` layout that trusts this registry.
    pub fn certs_dir(&self) -> PathBuf {
        self.dir.path().join("certs.d")
    }

    /// Pushes `wasm` as a CNCF Wasm artifact to `<host>/<repository>:<tag>`: its
    /// manifest digest.
    pub async fn push_wasm(&self, repository: &str, tag: &str, wasm: &[u8]) -> Result<String> {
        let config = br#"{"architecture":"wasm","os":"wasip1","layerDigests":[]}"#.to_vec();
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "artifactType": "application/wasm",
            "config": {
                "mediaType": "application/vnd.wasm.config.v0+json",
                "digest": digest(&config),
                "size": config.len(),
            },
            "layers": [{
                "mediaType": "application/wasm",
                "digest": digest(wasm),
                "size": wasm.len(),
            }],
        }))?;
        self.push(repository, tag, &[&config, wasm], manifest).await
    }

    /// Pushes a test image (config, layers, manifest) to `<host>/<repository>:<tag>`:
    /// its manifest digest.
    pub async fn push_image(
        &self,
        repository: &str,
        tag: &str,
        image: &crate::images::OciImage,
    ) -> Result<String> {
        let mut blobs: Vec<&[u8]> = vec![&image.config.data];
        blobs.extend(image.layers.iter().map(|l| l.data.as_slice()));
        self.push(repository, tag, &blobs, image.manifest.data.clone())
            .await
    }

    /// Pushes `blobs`, then `manifest` (an OCI image manifest naming them) as the tag.
    async fn push(
        &self,
        repository: &str,
        tag: &str,
        blobs: &[&[u8]],
        manifest: Vec<u8>,
    ) -> Result<String> {
        let reference: Reference = format!("{}/{repository}:{tag}", self.host).parse()?;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = oci_client::Client::new(ClientConfig {
            extra_root_certificates: vec![Certificate {
                encoding: CertificateEncoding::Pem,
                data: self.ca.pem().as_bytes().to_vec(),
            }],
            ..Default::default()
        });
        let auth = RegistryAuth::Basic(USER.into(), PASSWORD.into());
        client
            .auth(&reference, &auth, oci_client::RegistryOperation::Push)
            .await?;
        for blob in blobs {
            client
                .push_blob(&reference, blob.to_vec(), &digest(blob))
                .await?;
        }
        let manifest_digest = digest(&manifest);
        client
            .push_manifest_raw(
                &reference,
                manifest,
                hyper::http::HeaderValue::from_static("application/vnd.oci.image.manifest.v1+json"),
            )
            .await?;
        Ok(manifest_digest)
    }
}

fn digest(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(data)))
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
