//! The node API's TLS: its serving certificate, the kubelet's TLS settings, and the
//! client certificates it asks for.
//!
//! The serving certificate is, as the kubelet chooses it:
//! - `tlsCertFile` and `tlsPrivateKeyFile` when both are set;
//! - otherwise `<cert-dir>/kubelet.crt` and `kubelet.key`, made at the first start as a
//!   self-signed pair (a CA `<host>-ca@<unix time>` that signs `<host>@<unix time>`,
//!   valid for a year; the `.crt` holds the certificate then its CA) and reused while
//!   they parse and have not expired. wasmlet also puts the node's IPs in its SANs
//!   (the kubelet puts only the host name), so a client that pins the CA can reach
//!   the node by address.
//!
//! The certificate is held in a [`CertSlot`] that a rotation (a serving certificate
//! issued through a CSR) swaps while the server runs; new handshakes use the new one.
//!
//! With `clientCAFile`, clients are asked for a certificate, as the Kubernetes servers
//! ask (Go's `RequestClientCert`): not required, and not verified by the handshake
//! beyond the client's proof that it holds the key. The chain is verified against the
//! CA afterwards ([`ClientCa::verify`]) and the result goes to authentication, so a
//! certificate from another CA is a 401 (or a token on the same request still
//! counts), not a failed handshake.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::config::TlsSettings;
use rustls::DistinguishedName;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::UnixTime;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;

/// How long a self-signed serving certificate is valid (the kubelet's one year).
pub const SELF_SIGNED_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

/// What went wrong setting up TLS, naming the file or value.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("{0}")]
    Settings(String),
    #[error("making the self-signed serving certificate: {0}")]
    Generate(String),
}

fn file_error(path: &Path, message: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        path: path.to_owned(),
        message: message.to_string(),
    }
}

/// A certificate chain and its key, in DER.
pub struct ServingPair {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

impl std::fmt::Debug for ServingPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("ServingPair")
            .field("certificates", &self.chain.len())
            .finish_non_exhaustive()
    }
}

/// Reads a PEM certificate chain and a PEM private key.
pub fn read_pair(cert_file: &Path, key_file: &Path) -> Result<ServingPair, TlsError> {
    let chain = CertificateDer::pem_file_iter(cert_file)
        .map_err(|e| file_error(cert_file, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(cert_file, e))?;
    if chain.is_empty() {
        return Err(file_error(cert_file, "no certificate in the file"));
    }
    let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| file_error(key_file, e))?;
    Ok(ServingPair { chain, key })
}

/// When the first certificate of a chain stops being valid; `None` if it does not
/// parse.
pub fn not_after(cert: &CertificateDer<'_>) -> Option<jiff::Timestamp> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    jiff::Timestamp::from_second(parsed.validity().not_after.timestamp()).ok()
}

/// The serving pair the node starts with (see the module doc): the configured files,
/// else the self-signed pair in the cert dir, made if missing or expired.
pub fn serving_pair(
    settings: &TlsSettings,
    host: &str,
    ips: &[IpAddr],
) -> Result<ServingPair, TlsError> {
    match (&settings.cert_file, &settings.key_file) {
        (Some(cert), Some(key)) => return read_pair(cert, key),
        (None, None) => {}
        _ => {
            return Err(TlsError::Settings(
                "tlsCertFile and tlsPrivateKeyFile must be set together".to_owned(),
            ));
        }
    }
    let cert_file = settings.cert_dir.join("kubelet.crt");
    let key_file = settings.cert_dir.join("kubelet.key");
    if cert_file.exists() && key_file.exists() {
        match read_pair(&cert_file, &key_file) {
            Ok(pair) if not_after(&pair.chain[0]).is_some_and(|t| t > jiff::Timestamp::now()) => {
                return Ok(pair);
            }
            Ok(_) => tracing::info!(
                cert = %cert_file.display(),
                "the self-signed serving certificate has expired; making a new one"
            ),
            Err(e) => tracing::warn!(
                "the self-signed serving certificate is unusable, making a new one: {e}"
            ),
        }
    }
    let (cert_pem, key_pem) = self_signed(host, ips, SELF_SIGNED_VALIDITY)?;
    std::fs::create_dir_all(&settings.cert_dir).map_err(|e| file_error(&settings.cert_dir, e))?;
    crate::private_file::write(&key_file, key_pem.as_bytes())
        .map_err(|e| file_error(&key_file, e))?;
    std::fs::write(&cert_file, cert_pem.as_bytes()).map_err(|e| file_error(&cert_file, e))?;
    tracing::info!(cert = %cert_file.display(), "made a self-signed serving certificate");
    read_pair(&cert_file, &key_file)
}

fn offset(t: std::time::SystemTime) -> time::OffsetDateTime {
    time::OffsetDateTime::from(t)
}

/// A CA `<host>-ca@<now>` and the serving certificate `<host>@<now>` it signs, for
/// `host` and `ips`; returns the certificate-then-CA PEM and the key PEM.
pub fn self_signed(
    host: &str,
    ips: &[IpAddr],
    validity: Duration,
) -> Result<(String, String), TlsError> {
    let now = std::time::SystemTime::now();
    // A minute back, for clients whose clocks are a little behind.
    self_signed_between(host, ips, now - Duration::from_secs(60), now + validity)
}

/// [`self_signed`], valid from `not_before` to `not_after`.
fn self_signed_between(
    host: &str,
    ips: &[IpAddr],
    not_before: std::time::SystemTime,
    not_after: std::time::SystemTime,
) -> Result<(String, String), TlsError> {
    use rcgen::{
        BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
        IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
    };
    let generate = |e: rcgen::Error| TlsError::Generate(e.to_string());
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let (not_before, not_after) = (offset(not_before), offset(not_after));

    let ca_key = KeyPair::generate().map_err(generate)?;
    let mut ca = CertificateParams::default();
    ca.distinguished_name = DistinguishedName::new();
    ca.distinguished_name
        .push(DnType::CommonName, format!("{host}-ca@{stamp}"));
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    ca.not_before = not_before;
    ca.not_after = not_after;
    let ca_cert = ca.self_signed(&ca_key).map_err(generate)?;
    let issuer = Issuer::new(ca, ca_key);

    let key = KeyPair::generate().map_err(generate)?;
    let mut leaf = CertificateParams::default();
    leaf.distinguished_name = DistinguishedName::new();
    leaf.distinguished_name
        .push(DnType::CommonName, format!("{host}@{stamp}"));
    leaf.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.not_before = not_before;
    leaf.not_after = not_after;
    let mut sans = Vec::new();
    match host.parse::<IpAddr>() {
        Ok(ip) => sans.push(SanType::IpAddress(ip)),
        Err(_) => sans.push(SanType::DnsName(
            host.to_owned().try_into().map_err(generate)?,
        )),
    }
    for ip in ips {
        if !sans.contains(&SanType::IpAddress(*ip)) {
            sans.push(SanType::IpAddress(*ip));
        }
    }
    leaf.subject_alt_names = sans;
    let cert = leaf.signed_by(&key, &issuer).map_err(generate)?;
    Ok((
        format!("{}{}", cert.pem(), ca_cert.pem()),
        key.serialize_pem(),
    ))
}

/// The serving certificate, swappable while the server runs. An empty slot (with
/// `serverTLSBootstrap`, until the first `kubelet-serving` CSR is issued) fails every
/// handshake, as the kubelet has no certificate to present until then.
#[derive(Debug)]
pub struct CertSlot {
    current: RwLock<Option<Arc<CertifiedKey>>>,
}

impl CertSlot {
    pub fn new(pair: ServingPair) -> Result<Arc<CertSlot>, TlsError> {
        Ok(Arc::new(CertSlot {
            current: RwLock::new(Some(certified(pair)?)),
        }))
    }

    /// A slot with no certificate yet: handshakes fail until [`Self::replace`].
    pub fn empty() -> Arc<CertSlot> {
        Arc::new(CertSlot {
            current: RwLock::new(None),
        })
    }

    /// Serves `pair` from the next handshake on.
    pub fn replace(&self, pair: ServingPair) -> Result<(), TlsError> {
        let key = certified(pair)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Some(key);
        Ok(())
    }

    /// The certificate chain served now (empty while there is none).
    pub fn chain(&self) -> Vec<CertificateDer<'static>> {
        self.served().map(|k| k.cert.clone()).unwrap_or_default()
    }

    fn served(&self) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

fn certified(pair: ServingPair) -> Result<Arc<CertifiedKey>, TlsError> {
    let provider = provider();
    let key = provider
        .key_provider
        .load_private_key(pair.key)
        .map_err(|e| TlsError::Settings(format!("the serving key: {e}")))?;
    Ok(Arc::new(CertifiedKey::new(pair.chain, key)))
}

impl ResolvesServerCert for CertSlot {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let served = self.served();
        if served.is_none() {
            tracing::debug!(
                "TLS handshake refused: no serving certificate available for the node yet"
            );
        }
        served
    }
}

/// ring, the one provider the node links.
fn provider() -> CryptoProvider {
    rustls::crypto::ring::default_provider()
}

/// The provider with only the configured cipher suites (Go names; TLS 1.3 suites are
/// always on, as in Go, where `tlsCipherSuites` applies to TLS 1.2 and below).
fn provider_with(cipher_suites: &[String]) -> Result<CryptoProvider, TlsError> {
    let mut provider = provider();
    if cipher_suites.is_empty() {
        return Ok(provider);
    }
    let mut unknown = Vec::new();
    let mut chosen: Vec<rustls::SupportedCipherSuite> = provider
        .cipher_suites
        .iter()
        .copied()
        .filter(|s| s.tls13().is_some())
        .collect();
    for name in cipher_suites {
        match provider
            .cipher_suites
            .iter()
            .find(|s| s.tls13().is_none() && go_name(s) == Some(name.as_str()))
        {
            Some(s) => chosen.push(*s),
            None => unknown.push(name.as_str()),
        }
    }
    if !unknown.is_empty() {
        return Err(TlsError::Settings(format!(
            "tlsCipherSuites: unsupported cipher suite(s) {}; supported: {}",
            unknown.join(", "),
            provider
                .cipher_suites
                .iter()
                .filter_map(go_name)
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    provider.cipher_suites = chosen;
    Ok(provider)
}

/// The Go (IANA) name of a TLS 1.2 suite, as `tlsCipherSuites` spells it.
fn go_name(suite: &rustls::SupportedCipherSuite) -> Option<&'static str> {
    use rustls::CipherSuite::*;
    Some(match suite.suite() {
        TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 => "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384 => "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256 => {
            "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"
        }
        TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384 => "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256 => {
            "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256"
        }
        _ => return None,
    })
}

/// The rustls protocol versions from `tlsMinVersion`.
fn versions(
    min_version: Option<&str>,
) -> Result<&'static [&'static rustls::SupportedProtocolVersion], TlsError> {
    static BOTH: &[&rustls::SupportedProtocolVersion] =
        &[&rustls::version::TLS13, &rustls::version::TLS12];
    static TLS13: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];
    match min_version {
        None | Some("") | Some("VersionTLS12") => Ok(BOTH),
        Some("VersionTLS13") => Ok(TLS13),
        Some(v @ ("VersionTLS10" | "VersionTLS11")) => Err(TlsError::Settings(format!(
            "tlsMinVersion: {v} is not supported by this node (TLS 1.2 is the oldest)"
        ))),
        Some(v) => Err(TlsError::Settings(format!(
            "tlsMinVersion: unknown version {v:?}; use VersionTLS12 or VersionTLS13"
        ))),
    }
}

/// The client CA (`clientCAFile`): verifies a chain presented in the handshake.
#[derive(Debug)]
pub struct ClientCa {
    verifier: Arc<dyn ClientCertVerifier>,
}

impl ClientCa {
    /// Whether `chain` (end entity first) chains to the CA and is valid now, for
    /// client authentication.
    pub fn verify(&self, chain: &[CertificateDer<'_>]) -> Result<(), String> {
        let (end_entity, intermediates) = chain.split_first().ok_or("no certificate")?;
        self.verifier
            .verify_client_cert(end_entity, intermediates, UnixTime::now())
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

/// Asks for a client certificate and checks that the client holds its key; leaves
/// the chain's verification to [`ClientCa::verify`] after the handshake.
#[derive(Debug)]
struct RequestClientCert {
    ca: Arc<dyn ClientCertVerifier>,
}

impl ClientCertVerifier for RequestClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.ca.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.ca.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.ca.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.ca.supported_verify_schemes()
    }
}

/// The node API's TLS: the rustls configuration and the client CA, if any.
pub struct ServerTls {
    pub config: Arc<rustls::ServerConfig>,
    pub client_ca: Option<Arc<ClientCa>>,
}

/// The server's rustls configuration: the slot's certificate, the configured suites
/// and versions, client certificates requested when `clientCAFile` is set (see the
/// module doc), and HTTP/1.1 offered by ALPN.
pub fn server_config(settings: &TlsSettings, slot: Arc<CertSlot>) -> Result<ServerTls, TlsError> {
    let provider = Arc::new(provider_with(&settings.cipher_suites)?);
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions(settings.min_version.as_deref())?)
        .map_err(|e| TlsError::Settings(format!("TLS settings: {e}")))?;
    let mut client_ca = None;
    let builder = match &settings.client_ca_file {
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| file_error(path, e))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| file_error(path, e))?;
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(file_error(path, "no CA certificate in the file"));
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|e| file_error(path, e))?;
            client_ca = Some(Arc::new(ClientCa {
                verifier: verifier.clone(),
            }));
            builder.with_client_cert_verifier(Arc::new(RequestClientCert { ca: verifier }))
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(slot);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(ServerTls {
        config: Arc::new(config),
        client_ca,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(dir: &Path) -> TlsSettings {
        TlsSettings {
            cert_dir: dir.to_owned(),
            ..TlsSettings::default()
        }
    }

    #[test]
    fn a_self_signed_pair_is_made_once_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let ip: IpAddr = "10.1.2.3".parse().unwrap();
        let first = serving_pair(&settings(dir.path()), "edge-1", &[ip]).unwrap();
        assert_eq!(first.chain.len(), 2, "the certificate, then its CA");
        let (_, leaf) = x509_parser::parse_x509_certificate(first.chain[0].as_ref()).unwrap();
        let cn = leaf.subject().iter_common_name().next().unwrap();
        assert!(cn.as_str().unwrap().starts_with("edge-1@"), "{cn:?}");
        let (_, ca) = x509_parser::parse_x509_certificate(first.chain[1].as_ref()).unwrap();
        assert_eq!(leaf.issuer(), ca.subject());
        let sans = leaf.subject_alternative_name().unwrap().unwrap();
        let names: Vec<String> = sans
            .value
            .general_names
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert!(names.iter().any(|n| n.contains("edge-1")), "{names:?}");
        assert!(
            names.contains(&"IPAddress(0a:01:02:03)".to_owned()),
            "{names:?}"
        );
        let days = (not_after(&first.chain[0]).unwrap() - jiff::Timestamp::now())
            .total(jiff::Unit::Hour)
            .unwrap()
            / 24.0;
        assert!((364.0..=366.0).contains(&days), "{days} days");
        let mode = std::fs::metadata(dir.path().join("kubelet.key"))
            .unwrap()
            .permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );

        let again = serving_pair(&settings(dir.path()), "edge-1", &[ip]).unwrap();
        assert_eq!(again.chain, first.chain, "the pair on disk is reused");
    }

    #[test]
    fn an_expired_self_signed_pair_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
        let (cert, key) = self_signed_between(
            "edge-1",
            &[],
            hour_ago - Duration::from_secs(3600),
            hour_ago,
        )
        .unwrap();
        std::fs::write(dir.path().join("kubelet.crt"), &cert).unwrap();
        std::fs::write(dir.path().join("kubelet.key"), &key).unwrap();
        let old = read_pair(
            &dir.path().join("kubelet.crt"),
            &dir.path().join("kubelet.key"),
        )
        .unwrap();
        let pair = serving_pair(&settings(dir.path()), "edge-1", &[]).unwrap();
        assert_ne!(pair.chain, old.chain);
    }

    #[test]
    fn configured_files_win_and_half_a_pair_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = self_signed("other", &[], SELF_SIGNED_VALIDITY).unwrap();
        let (c, k) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&c, &cert).unwrap();
        std::fs::write(&k, &key).unwrap();
        let mut s = settings(&dir.path().join("certs"));
        s.cert_file = Some(c.clone());
        s.key_file = Some(k);
        let pair = serving_pair(&s, "edge-1", &[]).unwrap();
        assert_eq!(
            pair.chain,
            read_pair(&c, &s.key_file.clone().unwrap()).unwrap().chain
        );
        assert!(
            !dir.path().join("certs").exists(),
            "no self-signed pair made"
        );
        s.key_file = None;
        let err = serving_pair(&s, "edge-1", &[]).unwrap_err();
        assert!(err.to_string().contains("must be set together"), "{err}");
        let missing = read_pair(&dir.path().join("nope.crt"), &c).unwrap_err();
        assert!(missing.to_string().contains("nope.crt"), "{missing}");
    }

    #[test]
    fn cipher_suites_and_versions_are_the_kubelets_names() {
        let p = provider_with(&["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".to_owned()]).unwrap();
        let tls12: Vec<_> = p
            .cipher_suites
            .iter()
            .filter(|s| s.tls13().is_none())
            .filter_map(go_name)
            .collect();
        assert_eq!(tls12, ["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"]);
        assert!(p.cipher_suites.iter().any(|s| s.tls13().is_some()));
        let err = provider_with(&["TLS_RSA_WITH_RC4_128_SHA".to_owned()]).unwrap_err();
        assert!(
            err.to_string().contains("TLS_RSA_WITH_RC4_128_SHA"),
            "{err}"
        );
        assert_eq!(versions(Some("VersionTLS13")).unwrap().len(), 1);
        assert_eq!(versions(None).unwrap().len(), 2);
        assert!(versions(Some("VersionTLS10")).is_err());
        assert!(versions(Some("TLS1.2")).is_err());
    }

    #[test]
    fn a_client_ca_file_without_a_certificate_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.crt");
        std::fs::write(&ca, "not a certificate").unwrap();
        let mut s = settings(dir.path());
        s.client_ca_file = Some(ca);
        let slot = CertSlot::new(serving_pair(&s, "n", &[]).unwrap()).unwrap();
        let err = server_config(&s, slot).err().expect("an error");
        assert!(err.to_string().contains("ca.crt"), "{err}");
    }

    #[test]
    fn an_empty_slot_serves_nothing_until_a_pair_is_put_in() {
        let dir = tempfile::tempdir().unwrap();
        let s = settings(dir.path());
        let slot = CertSlot::empty();
        assert!(slot.served().is_none());
        assert!(slot.chain().is_empty());
        slot.replace(serving_pair(&s, "n", &[]).unwrap()).unwrap();
        assert_eq!(slot.chain().len(), 2, "the leaf and its self-signed CA");
    }
}
