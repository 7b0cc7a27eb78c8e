//! The certificate files in `--cert-dir` (pairs behind a `-current.pem` link) and the
//! kubeconfig they are named in.

use super::*;

/// A certificate chain and its key, as read from a pair file.
pub struct Pair {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    pub not_before: jiff::Timestamp,
    pub not_after: jiff::Timestamp,
}

impl std::fmt::Debug for Pair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Pair")
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

/// The validity of a DER certificate.
pub(super) fn validity(der: &[u8]) -> Option<(jiff::Timestamp, jiff::Timestamp)> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let v = cert.validity();
    Some((
        jiff::Timestamp::from_second(v.not_before.timestamp()).ok()?,
        jiff::Timestamp::from_second(v.not_after.timestamp()).ok()?,
    ))
}

/// Parses PEM holding certificates then (or before) a private key.
pub fn parse_pair(pem: &[u8]) -> Result<Pair, String> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let first = chain.first().ok_or("no certificate")?;
    let (not_before, not_after) = validity(first).ok_or("the certificate does not parse")?;
    let key = PrivateKeyDer::from_pem_slice(pem).map_err(|e| format!("the key: {e}"))?;
    Ok(Pair {
        chain,
        key,
        not_before,
        not_after,
    })
}

/// The pairs of one kind in the cert dir: `<prefix>-<time>.pem` files and the
/// `<prefix>-current.pem` link to the newest (client-go's file store).
#[derive(Clone, Debug)]
pub struct Store {
    dir: PathBuf,
    prefix: &'static str,
}

impl Store {
    pub fn new(dir: &Path, kind: Kind) -> Store {
        Store {
            dir: dir.to_owned(),
            prefix: kind.prefix(),
        }
    }

    /// `<prefix>-current.pem`.
    pub fn current_path(&self) -> PathBuf {
        self.dir.join(format!("{}-current.pem", self.prefix))
    }

    /// The current pair, if there is one that parses.
    pub fn current(&self) -> Result<Pair> {
        let path = self.current_path();
        let pem = std::fs::read(&path).map_err(|e| file_error(&path, e))?;
        parse_pair(&pem).map_err(|e| file_error(&path, e))
    }

    /// Writes `cert_pem` and `key_pem` to `<prefix>-<time>.pem` (0600) and points the
    /// current link at it; returns the pair.
    pub fn update(&self, cert_pem: &str, key_pem: &str) -> Result<Pair> {
        let text = format!("{}\n{}", cert_pem.trim_end(), key_pem);
        let pair = parse_pair(text.as_bytes()).map_err(Error::Certificate)?;
        std::fs::create_dir_all(&self.dir).map_err(|e| file_error(&self.dir, e))?;
        let stamp = jiff::Timestamp::now().strftime("%Y-%m-%d-%H-%M-%S");
        let name = format!("{}-{stamp}.pem", self.prefix);
        let path = self.dir.join(&name);
        crate::private_file::write(&path, text.as_bytes()).map_err(|e| file_error(&path, e))?;
        let link = self.current_path();
        let tmp = self.dir.join(format!(".{}-current.pem.tmp", self.prefix));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&name, &tmp).map_err(|e| file_error(&tmp, e))?;
        std::fs::rename(&tmp, &link).map_err(|e| file_error(&link, e))?;
        Ok(pair)
    }
}

/// The client certificates of the kubeconfig's current user (file or data), if any.
pub fn kubeconfig_client_certs(path: &Path) -> Result<Option<Vec<CertificateDer<'static>>>> {
    let kc_error = |m: String| Error::Kubeconfig {
        path: path.to_owned(),
        message: m,
    };
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| kc_error(e.to_string()))?;
    let context = kubeconfig
        .current_context
        .as_deref()
        .and_then(|c| kubeconfig.contexts.iter().find(|n| n.name == c))
        .and_then(|c| c.context.as_ref())
        .ok_or_else(|| kc_error("no current context".into()))?;
    let Some(user) = kubeconfig
        .auth_infos
        .iter()
        .find(|a| a.name == context.user.as_deref().unwrap_or_default())
        .and_then(|a| a.auth_info.as_ref())
    else {
        return Ok(None);
    };
    let pem = match (&user.client_certificate_data, &user.client_certificate) {
        (Some(data), _) => b64decode(data)
            .ok_or_else(|| kc_error("client-certificate-data is not base64".into()))?,
        (None, Some(file)) => {
            let file = Path::new(file);
            let file = if file.is_relative() {
                path.parent().unwrap_or(Path::new("")).join(file)
            } else {
                file.to_owned()
            };
            std::fs::read(&file).map_err(|e| file_error(&file, e))?
        }
        (None, None) => return Ok(None),
    };
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| kc_error(format!("client certificate: {e}")))?;
    Ok(Some(certs))
}

/// Whether the kubeconfig exists, reads, and has client certificates none of which
/// expired (`isClientConfigStillValid`). A file that cannot be read or has no
/// certificate is not valid (the bootstrap replaces it), as upstream.
pub fn client_config_valid(path: &Path) -> bool {
    if !path.exists() {
        return false;
    }
    match kubeconfig_client_certs(path) {
        Ok(Some(certs)) if !certs.is_empty() => {
            let now = jiff::Timestamp::now();
            let expired = certs
                .iter()
                .find(|c| validity(c).is_none_or(|(_, not_after)| not_after < now));
            if expired.is_some() {
                tracing::warn!(kubeconfig = %path.display(), "part of the kubeconfig's client certificate is expired");
            }
            expired.is_none()
        }
        Ok(_) => {
            tracing::warn!(kubeconfig = %path.display(), "the kubeconfig has no client certificate");
            false
        }
        Err(e) => {
            tracing::warn!("{e}");
            false
        }
    }
}

/// Writes `kubeconfig` with the bootstrap kubeconfig's cluster (server and CA) and the
/// client certificate and key `pem` (`writeKubeconfigFromBootstrapping`).
pub fn write_kubeconfig(bootstrap: &Path, kubeconfig: &Path, pem: &Path) -> Result<()> {
    use kube::config::{AuthInfo, Context, NamedAuthInfo, NamedCluster, NamedContext};
    let kc_error = |m: String| Error::Kubeconfig {
        path: bootstrap.to_owned(),
        message: m,
    };
    let source = Kubeconfig::read_from(bootstrap).map_err(|e| kc_error(e.to_string()))?;
    let cluster_name = source
        .current_context
        .as_deref()
        .and_then(|c| source.contexts.iter().find(|n| n.name == c))
        .and_then(|c| c.context.as_ref())
        .map(|c| c.cluster.clone())
        .ok_or_else(|| kc_error("no current context".into()))?;
    let mut cluster = source
        .clusters
        .iter()
        .find(|c| c.name == cluster_name)
        .and_then(|c| c.cluster.clone())
        .ok_or_else(|| kc_error(format!("no cluster {cluster_name:?}")))?;
    // A relative CA file is relative to the bootstrap kubeconfig.
    if let Some(ca) = &cluster.certificate_authority
        && Path::new(ca).is_relative()
    {
        cluster.certificate_authority = Some(
            bootstrap
                .parent()
                .unwrap_or(Path::new(""))
                .join(ca)
                .display()
                .to_string(),
        );
    }
    let pem = pem.display().to_string();
    let out = Kubeconfig {
        clusters: vec![NamedCluster {
            name: "default-cluster".into(),
            cluster: Some(cluster),
            other: Default::default(),
        }],
        auth_infos: vec![NamedAuthInfo {
            name: "default-auth".into(),
            auth_info: Some(AuthInfo {
                client_certificate: Some(pem.clone()),
                client_key: Some(pem),
                ..AuthInfo::default()
            }),
            other: Default::default(),
        }],
        contexts: vec![NamedContext {
            name: "default-context".into(),
            context: Some(Context {
                cluster: "default-cluster".into(),
                user: Some("default-auth".into()),
                namespace: Some("default".into()),
                ..Context::default()
            }),
            other: Default::default(),
        }],
        current_context: Some("default-context".into()),
        api_version: Some("v1".into()),
        kind: Some("Config".into()),
        ..Kubeconfig::default()
    };
    // JSON is YAML; kube and kubectl read it.
    let text = serde_json::to_string_pretty(&out)
        .map_err(|e| kc_error(format!("serializing the kubeconfig: {e}")))?;
    if let Some(dir) = kubeconfig.parent() {
        std::fs::create_dir_all(dir).map_err(|e| file_error(dir, e))?;
    }
    crate::private_file::write(kubeconfig, text.as_bytes()).map_err(|e| file_error(kubeconfig, e))
}
