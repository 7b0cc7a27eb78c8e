//! The node's certificates from the cluster's CertificateSigningRequests: the client
//! certificate's TLS bootstrap and rotation, and the serving certificate of
//! `serverTLSBootstrap`, as the kubelet does them (`pkg/kubelet/certificate` and
//! client-go's `util/certificate`).
//!
//! - [`bootstrap_client`] (`--bootstrap-kubeconfig`): when `--kubeconfig` is missing,
//!   unreadable or its client certificate expired, a key (ECDSA P-256) and a CSR
//!   `node-csr-<digest>` for `system:node:<name>` in `system:nodes` (signer
//!   `kubernetes.io/kube-apiserver-client-kubelet`) are made with the bootstrap
//!   credentials; once approved and issued (waiting at most an hour), the pair goes to
//!   `<cert-dir>/kubelet-client-<time>.pem` behind the link `kubelet-client-current.pem`,
//!   and `--kubeconfig` is written naming that file with the bootstrap kubeconfig's
//!   server and CA.
//! - [`Rotation`] (`rotateCertificates`, and the serving certificate): sleeps until the
//!   rotation deadline ([`rotation_deadline`]: 70–90 % of the certificate's life,
//!   jittered), requests a new certificate with a CSR `csr-*` through the node's
//!   current credentials, writes it as above and hands it over ([`Rotation::run`]).
//! - [`RotatingClient`]: the node's API clients are made over a slot holding a kube
//!   client built from the current certificate; a rotation builds new ones and swaps
//!   them in. Requests (and watches) started afterwards connect with the new
//!   certificate; a watch already open keeps the connection it has.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_util::sync::CancellationToken;

mod clients;
mod files;

pub use clients::*;
pub use files::*;

/// The signer of kubelet client certificates.
pub const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The signer of kubelet serving certificates.
pub const SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";
/// How long the bootstrap waits for its certificate (`requestNodeCertificate`).
pub const BOOTSTRAP_WAIT: Duration = Duration::from_secs(3600);
/// How long a rotation waits for its certificate (`certificateWaitTimeout`).
pub const ROTATION_WAIT: Duration = Duration::from_secs(15 * 60);
/// The deadline of creating a CSR.
const CREATE_TIMEOUT: Duration = Duration::from_secs(30);
/// Where the bootstrap keeps its key until the certificate is issued.
const BOOTSTRAP_KEY: &str = "kubelet-client.key.tmp";

/// What went wrong getting a certificate, naming the file or the CSR.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig { path: PathBuf, message: String },
    #[error("making the certificate signing request: {0}")]
    Generate(String),
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("certificate signing request {name} is denied, reason: {reason}, message: {message}")]
    Denied {
        name: String,
        reason: String,
        message: String,
    },
    #[error("certificate signing request {name} failed, reason: {reason}, message: {message}")]
    Failed {
        name: String,
        reason: String,
        message: String,
    },
    #[error(
        "timed out after {}s waiting for certificate signing request {name} to be approved and issued",
        after.as_secs()
    )]
    TimedOut { name: String, after: Duration },
    #[error("certificate signing request {name}: {message}")]
    Csr { name: String, message: String },
    #[error("the issued certificate: {0}")]
    Certificate(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn file_error(path: &Path, message: impl std::fmt::Display) -> Error {
    Error::File {
        path: path.to_owned(),
        message: message.to_string(),
    }
}

/// Which certificate: the node's client certificate or its serving certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Client,
    Serving,
}

impl Kind {
    /// The file name prefix in the cert dir (`kubelet-client`, `kubelet-server`).
    pub fn prefix(self) -> &'static str {
        match self {
            Kind::Client => "kubelet-client",
            Kind::Serving => "kubelet-server",
        }
    }

    pub fn signer(self) -> &'static str {
        match self {
            Kind::Client => CLIENT_SIGNER,
            Kind::Serving => SERVING_SIGNER,
        }
    }

    /// The usages asked for an ECDSA key: no key encipherment, which only RSA keys
    /// take part in (client-go's `DefaultKubeletClientGetUsages` and the serving
    /// manager's `getUsages`).
    pub fn usages(self) -> Vec<String> {
        let usages: &[&str] = match self {
            Kind::Client => &["digital signature", "client auth"],
            Kind::Serving => &["digital signature", "server auth"],
        };
        usages.iter().map(|u| u.to_string()).collect()
    }
}

/// What a requested certificate names: `system:node:<node>` in `system:nodes`, and
/// for a serving certificate the node's host name and addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    pub kind: Kind,
    pub node_name: String,
    pub dns_names: Vec<String>,
    pub ips: Vec<IpAddr>,
}

impl Template {
    pub fn client(node_name: &str) -> Template {
        Template {
            kind: Kind::Client,
            node_name: node_name.to_owned(),
            dns_names: Vec::new(),
            ips: Vec::new(),
        }
    }

    /// A serving certificate for the host name `hostname` (an IP address goes to the
    /// IP SANs) and `ips`.
    pub fn serving(node_name: &str, hostname: &str, ips: &[IpAddr]) -> Template {
        let mut t = Template {
            kind: Kind::Serving,
            node_name: node_name.to_owned(),
            dns_names: Vec::new(),
            ips: Vec::new(),
        };
        match hostname.parse::<IpAddr>() {
            Ok(ip) => t.ips.push(ip),
            Err(_) => t.dns_names.push(hostname.to_owned()),
        }
        for ip in ips {
            if !t.ips.contains(ip) {
                t.ips.push(*ip);
            }
        }
        t
    }

    pub fn common_name(&self) -> String {
        format!("system:node:{}", self.node_name)
    }
}

/// A new key and the CSR for it, in PEM.
pub struct Request {
    pub csr_pem: String,
    pub key_pem: String,
    /// The key's SubjectPublicKeyInfo, DER.
    pub public_key: Vec<u8>,
}

/// A new ECDSA P-256 key (client-go's choice) and a CSR for `template`.
pub fn new_request(template: &Template) -> Result<Request> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| Error::Generate(e.to_string()))?;
    request_for(template, &key)
}

fn request_for(template: &Template, key: &rcgen::KeyPair) -> Result<Request> {
    use rcgen::{CertificateParams, DistinguishedName, DnType, PublicKeyData as _, SanType};
    let generate = |e: rcgen::Error| Error::Generate(e.to_string());
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::OrganizationName, "system:nodes");
    params
        .distinguished_name
        .push(DnType::CommonName, template.common_name());
    let mut sans = Vec::new();
    for name in &template.dns_names {
        sans.push(SanType::DnsName(name.clone().try_into().map_err(generate)?));
    }
    sans.extend(template.ips.iter().map(|ip| SanType::IpAddress(*ip)));
    params.subject_alt_names = sans;
    let csr = params.serialize_request(key).map_err(generate)?;
    Ok(Request {
        csr_pem: csr.pem().map_err(generate)?,
        key_pem: key.serialize_pem(),
        public_key: key.subject_public_key_info(),
    })
}

/// The bootstrap CSR's name, `node-csr-<digest>` (`digestedName`): SHA-512/256 over
/// the public key, the subject and the usages, each base64url and `|`-terminated, so
/// a node that restarts while waiting finds its own request again.
pub fn bootstrap_csr_name(public_key: &[u8], template: &Template, usages: &[String]) -> String {
    use sha2::Digest as _;
    let mut hash = sha2::Sha512_256::new();
    let mut write = |data: &[u8]| {
        hash.update(b64url(data).as_bytes());
        hash.update(b"|");
    };
    write(public_key);
    write(template.common_name().as_bytes());
    write(b"system:nodes");
    for u in usages {
        write(u.as_bytes());
    }
    format!("node-csr-{}", b64url(&hash.finalize()))
}

/// Base64 with the URL alphabet, no padding (Go's `RawURLEncoding`).
fn b64url(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

/// Decodes standard base64 (kubeconfig `*-data` fields), ignoring whitespace.
fn b64decode(text: &str) -> Option<Vec<u8>> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return None,
        } as u32)
    };
    let digits: Vec<u8> = text
        .bytes()
        .filter(|c| !c.is_ascii_whitespace() && *c != b'=')
        .collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        if chunk.len() == 1 {
            return None;
        }
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            n |= value(*c)? << (18 - 6 * i);
        }
        for i in 0..chunk.len() - 1 {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    Some(out)
}

/// When to rotate a certificate valid from `not_before` to `not_after`: at
/// `70 % + 20 % × draw` of its life (`draw` in `[0, 1)`; client-go's
/// `jitteryDuration`, `wait.Jitter(total, 0.2) - 0.3 × total`).
pub fn rotation_deadline(
    not_before: jiff::Timestamp,
    not_after: jiff::Timestamp,
    draw: f64,
) -> jiff::Timestamp {
    let start = not_before.as_nanosecond();
    let total = (not_after.as_nanosecond() - start).max(0) as f64;
    let at = start + (total * (0.7 + 0.2 * draw.clamp(0.0, 1.0))).round() as i128;
    jiff::Timestamp::from_nanosecond(at).unwrap_or(not_after)
}

/// A uniform draw in `[0, 1)` from the standard library's random hasher keys.
fn draw() -> f64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let bits = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// How a CSR is named: the bootstrap's digest, or `generateName: csr-`.
pub enum CsrName {
    Fixed(String),
    Generate,
}

/// Creates the CSR for `request` and waits, at most `wait`, until it is approved and
/// issued (`csr.RequestCertificate` and `WaitForCertificate`); returns the PEM
/// certificate. A Denied or Failed condition is the error. An existing CSR of the
/// same name for the same key is waited for instead.
pub async fn request_certificate(
    client: &kube::Client,
    name: CsrName,
    template: &Template,
    usages: Vec<String>,
    request: &Request,
    wait: Duration,
) -> Result<String> {
    let api: kube::Api<CertificateSigningRequest> = kube::Api::all(client.clone());
    let mut csr = CertificateSigningRequest {
        spec: CertificateSigningRequestSpec {
            request: ByteString(request.csr_pem.clone().into_bytes()),
            signer_name: template.kind.signer().to_owned(),
            usages: Some(usages),
            ..Default::default()
        },
        ..Default::default()
    };
    match &name {
        CsrName::Fixed(n) => csr.metadata.name = Some(n.clone()),
        CsrName::Generate => csr.metadata.generate_name = Some("csr-".into()),
    }
    // The client may have no read deadline (it also watches): the create has one.
    let params = kube::api::PostParams::default();
    let create = tokio::time::timeout(CREATE_TIMEOUT, api.create(&params, &csr));
    let Ok(created) = create.await else {
        return Err(Error::Csr {
            name: match &name {
                CsrName::Fixed(n) => n.clone(),
                CsrName::Generate => "csr-*".into(),
            },
            message: format!("creating it took more than {}s", CREATE_TIMEOUT.as_secs()),
        });
    };
    let created = match created {
        Ok(c) => c,
        Err(e) if super::is_conflict(&e) && matches!(name, CsrName::Fixed(_)) => {
            let CsrName::Fixed(n) = &name else {
                unreachable!()
            };
            let existing = api.get(n).await.map_err(|source| Error::Api {
                what: format!("reading certificate signing request {n}"),
                source,
            })?;
            ensure_same_key(n, &existing, &request.public_key)?;
            existing
        }
        Err(source) => {
            return Err(Error::Api {
                what: "creating a certificate signing request".into(),
                source,
            });
        }
    };
    let csr_name = created.metadata.name.clone().unwrap_or_default();
    let uid = created.metadata.uid.clone();
    tracing::info!(csr = %csr_name, signer = template.kind.signer(), "waiting for the certificate signing request to be approved and issued");
    if let Some(done) = outcome(&csr_name, &created) {
        return done;
    }
    // A watch of the one CSR, watched again after an error (a dropped connection)
    // until the deadline, as `WaitForCertificate`'s informer does.
    let cond = |c: Option<&CertificateSigningRequest>| {
        c.is_none_or(|c| c.metadata.uid != uid || outcome("", c).is_some())
    };
    let deadline = tokio::time::Instant::now() + wait;
    let csr = loop {
        let waited = tokio::time::timeout_at(
            deadline,
            kube::runtime::wait::await_condition(api.clone(), &csr_name, cond),
        )
        .await;
        match waited {
            Err(_) => {
                return Err(Error::TimedOut {
                    name: csr_name,
                    after: wait,
                });
            }
            Ok(Err(e)) => {
                tracing::debug!(csr = %csr_name, "watching the certificate signing request: {e}; watching again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Ok(Ok(None)) => {
                return Err(Error::Csr {
                    name: csr_name,
                    message: "deleted while waiting for it".into(),
                });
            }
            Ok(Ok(Some(csr))) => break csr,
        }
    };
    if csr.metadata.uid != uid {
        return Err(Error::Csr {
            name: csr_name,
            message: "it was replaced by another object of the same name".into(),
        });
    }
    outcome(&csr_name, &csr).unwrap_or_else(|| {
        Err(Error::Csr {
            name: csr_name.clone(),
            message: "no outcome".into(),
        })
    })
}

/// The existing CSR must ask for the same key (`ensureCompatible`).
fn ensure_same_key(name: &str, csr: &CertificateSigningRequest, public_key: &[u8]) -> Result<()> {
    let bad = |m: &str| Error::Csr {
        name: name.to_owned(),
        message: m.to_owned(),
    };
    let (_, pem) = x509_parser::pem::parse_x509_pem(&csr.spec.request.0)
        .map_err(|_| bad("exists with a request that does not parse"))?;
    use x509_parser::prelude::FromDer as _;
    let (_, parsed) =
        x509_parser::certification_request::X509CertificationRequest::from_der(&pem.contents)
            .map_err(|_| bad("exists with a request that does not parse"))?;
    if parsed.certification_request_info.subject_pki.raw != public_key {
        return Err(bad("exists for another key"));
    }
    Ok(())
}

/// The CSR's outcome, when it has one: the certificate once approved and issued, or
/// the Denied / Failed condition.
fn outcome(name: &str, csr: &CertificateSigningRequest) -> Option<Result<String>> {
    let status = csr.status.as_ref()?;
    let conditions = status.conditions.as_deref().unwrap_or_default();
    let mut approved = false;
    for c in conditions {
        let reason = c.reason.clone().unwrap_or_default();
        let message = c.message.clone().unwrap_or_default();
        let name = name.to_owned();
        match c.type_.as_str() {
            "Denied" => {
                return Some(Err(Error::Denied {
                    name,
                    reason,
                    message,
                }));
            }
            "Failed" => {
                return Some(Err(Error::Failed {
                    name,
                    reason,
                    message,
                }));
            }
            "Approved" => approved = true,
            _ => {}
        }
    }
    let cert = status.certificate.as_ref().filter(|c| !c.0.is_empty())?;
    if !approved {
        return None;
    }
    Some(String::from_utf8(cert.0.clone()).map_err(|_| Error::Certificate("not PEM".into())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> jiff::Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn the_rotation_deadline_is_70_to_90_percent_of_the_life() {
        let (nb, na) = (ts("2026-01-01T00:00:00Z"), ts("2026-01-01T01:40:00Z"));
        assert_eq!(rotation_deadline(nb, na, 0.0), ts("2026-01-01T01:10:00Z"));
        assert_eq!(rotation_deadline(nb, na, 0.5), ts("2026-01-01T01:20:00Z"));
        let (mut low, mut high) = (f64::MAX, f64::MIN);
        for _ in 0..10_000 {
            let d = rotation_deadline(nb, na, draw());
            let share = (d - nb).total(jiff::Unit::Second).unwrap() / 6000.0;
            assert!((0.7..0.9).contains(&share), "{share}");
            low = low.min(share);
            high = high.max(share);
        }
        assert!(low < 0.71 && high > 0.89, "the draws spread: {low}..{high}");
    }

    #[test]
    fn base64_round_trips() {
        for data in [&b""[..], b"f", b"fo", b"foo", b"foob", b"\xff\xfe\x00"] {
            let url = b64url(data);
            assert!(!url.contains('='));
            assert_eq!(b64decode(&url).unwrap(), data);
        }
        assert_eq!(b64url(b"\xfb\xff"), "-_8");
        assert_eq!(b64decode("Zm9vYg==").unwrap(), b"foob");
    }

    #[test]
    fn a_serving_csr_names_the_node_its_host_and_its_addresses() {
        let ip: IpAddr = "10.0.0.21".parse().unwrap();
        let t = Template::serving("edge-1", "edge-1", &[ip]);
        let r = new_request(&t).unwrap();
        let info = wasmlet_testkit::pki::parse_csr(r.csr_pem.as_bytes()).unwrap();
        assert_eq!(info.common_name, "system:node:edge-1");
        assert_eq!(info.organizations, ["system:nodes"]);
        assert_eq!(info.dns_names, ["edge-1"]);
        assert_eq!(info.ip_addresses, [ip]);
        assert_eq!(
            wasmlet_testkit::pki::public_key_of(&r.key_pem).unwrap(),
            r.public_key
        );
        assert_eq!(Kind::Serving.usages(), ["digital signature", "server auth"]);
        assert_eq!(Kind::Serving.signer(), "kubernetes.io/kubelet-serving");
    }

    #[test]
    fn a_client_csr_has_no_sans_and_a_stable_bootstrap_name() {
        let t = Template::client("edge-1");
        let r = new_request(&t).unwrap();
        let info = wasmlet_testkit::pki::parse_csr(r.csr_pem.as_bytes()).unwrap();
        assert_eq!(info.common_name, "system:node:edge-1");
        assert_eq!(info.organizations, ["system:nodes"]);
        assert!(info.sans.is_empty(), "{:?}", info.sans);
        assert_eq!(Kind::Client.usages(), ["digital signature", "client auth"]);
        let usages = Kind::Client.usages();
        let name = bootstrap_csr_name(&r.public_key, &t, &usages);
        assert!(name.starts_with("node-csr-"), "{name}");
        assert_eq!(
            name.len(),
            "node-csr-".len() + 43,
            "a 32-byte digest: {name}"
        );
        assert_eq!(name, bootstrap_csr_name(&r.public_key, &t, &usages));
        let other = new_request(&t).unwrap();
        assert_ne!(name, bootstrap_csr_name(&other.public_key, &t, &usages));
    }

    fn issued(ca: &wasmlet_testkit::pki::Ca, validity: Duration) -> (String, String) {
        ca.issue_client("system:node:edge-1", &["system:nodes"], validity)
            .unwrap()
    }

    #[test]
    fn the_store_writes_a_private_pair_and_moves_the_link() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path(), Kind::Client);
        assert!(store.current().is_err());
        let ca = wasmlet_testkit::pki::Ca::new("test-ca");
        let (cert, key) = issued(&ca, Duration::from_secs(3600));
        let pair = store.update(&cert, &key).unwrap();
        assert!(pair.not_after > jiff::Timestamp::now());
        let link = dir.path().join("kubelet-client-current.pem");
        let target = std::fs::read_link(&link).unwrap();
        let target_name = target.to_str().unwrap();
        assert!(
            target_name.starts_with("kubelet-client-2") && target_name.ends_with(".pem"),
            "{target_name}"
        );
        let mode = std::fs::metadata(dir.path().join(&target))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let current = store.current().unwrap();
        assert_eq!(current.chain.len(), 1);
    }

    #[test]
    fn the_written_kubeconfig_names_the_pair_and_the_bootstrap_cluster() {
        let dir = tempfile::tempdir().unwrap();
        let bootstrap = dir.path().join("bootstrap.conf");
        std::fs::write(
            &bootstrap,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://10.0.0.1:6443\n    certificate-authority: ca.crt\nusers:\n- name: u\n  user:\n    token: abcdef.0123456789abcdef\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
        )
        .unwrap();
        let kubeconfig = dir.path().join("kubelet.conf");
        assert!(!client_config_valid(&kubeconfig), "missing");
        let ca = wasmlet_testkit::pki::Ca::new("test-ca");
        let store = Store::new(&dir.path().join("pki"), Kind::Client);
        let (cert, key) = issued(&ca, Duration::from_secs(3600));
        store.update(&cert, &key).unwrap();
        write_kubeconfig(&bootstrap, &kubeconfig, &store.current_path()).unwrap();
        let written = Kubeconfig::read_from(&kubeconfig).unwrap();
        let cluster = written.clusters[0].cluster.clone().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://10.0.0.1:6443"));
        assert_eq!(
            cluster.certificate_authority.as_deref(),
            Some(dir.path().join("ca.crt").to_str().unwrap())
        );
        let user = written.auth_infos[0].auth_info.clone().unwrap();
        let pem = store.current_path().display().to_string();
        assert_eq!(user.client_certificate.as_deref(), Some(pem.as_str()));
        assert_eq!(user.client_key.as_deref(), Some(pem.as_str()));
        assert!(user.token.is_none());
        assert_eq!(written.current_context.as_deref(), Some("default-context"));
        assert!(client_config_valid(&kubeconfig));

        // An expired certificate makes it invalid again: the bootstrap runs.
        let expired = dir.path().join("expired.pem");
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["edge-1".into()]).unwrap();
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(2);
        params.not_after = now - time::Duration::hours(1);
        let old = params.self_signed(&key).unwrap();
        std::fs::write(&expired, format!("{}{}", old.pem(), key.serialize_pem())).unwrap();
        write_kubeconfig(&bootstrap, &kubeconfig, &expired).unwrap();
        assert!(!client_config_valid(&kubeconfig));
    }

    #[test]
    fn a_csrs_outcome_is_its_certificate_or_its_refusal() {
        let csr = |conditions: &[(&str, &str)], cert: Option<&str>| {
            serde_json::from_value::<CertificateSigningRequest>(serde_json::json!({
                "metadata": {"name": "csr-1"},
                "spec": {"request": "", "signerName": CLIENT_SIGNER},
                "status": {
                    "conditions": conditions.iter().map(|(t, r)| serde_json::json!({
                        "type": t, "status": "True", "reason": r, "message": "m"
                    })).collect::<Vec<_>>(),
                    "certificate": cert.map(|c| b64url(c.as_bytes()).replace('-', "+").replace('_', "/")),
                }
            }))
            .unwrap()
        };
        assert!(outcome("csr-1", &csr(&[], None)).is_none(), "pending");
        assert!(
            outcome("csr-1", &csr(&[("Approved", "AutoApproved")], None)).is_none(),
            "approved, not issued"
        );
        let issued = outcome("csr-1", &csr(&[("Approved", "A")], Some("PEM"))).unwrap();
        assert_eq!(issued.unwrap(), "PEM");
        let denied = outcome("csr-1", &csr(&[("Denied", "KubectlDeny")], None)).unwrap();
        let text = denied.unwrap_err().to_string();
        assert!(
            text.contains("denied") && text.contains("KubectlDeny"),
            "{text}"
        );
        let failed = outcome(
            "csr-1",
            &csr(
                &[("Approved", "A"), ("Failed", "SignerValidationFailure")],
                None,
            ),
        )
        .unwrap();
        assert!(matches!(failed, Err(Error::Failed { .. })));
    }
}
