//! A test PKI: a self-signed CA that issues client and serving certificates and
//! signs certificate signing requests, plus parsers for assertions.
//!
//! Start at [`Ca`]. Keys are ECDSA P-256 (ring). Validity is a [`Duration`] from
//! now, so a test can issue certificates that expire within seconds; times are
//! whole seconds (X.509 has no finer resolution).
//!
//! ```no_run
//! # fn example() -> anyhow::Result<()> {
//! use std::time::Duration;
//! use wasmlet_testkit::pki::{self, Ca};
//!
//! let ca = Ca::new("test-ca");
//! let (cert, _key) = ca.issue_client("system:node:n1", &["system:nodes"], Duration::from_secs(60))?;
//! let info = pki::parse_cert(&cert)?;
//! assert_eq!(info.common_name, "system:node:n1");
//! ca.verify(&cert)?;
//! # Ok(())
//! # }
//! ```

use std::hash::{BuildHasher, RandomState};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, anyhow, bail};
use jiff::Timestamp;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SanType, SerialNumber, SignatureAlgorithm,
};
use x509_parser::prelude::{FromDer, GeneralName, ParsedExtension, X509Certificate};

/// How long a [`Ca`] is valid.
const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// The CSR usages Kubernetes knows (`certificates.k8s.io/v1` `KeyUsage`), sorted.
pub const KNOWN_USAGES: [&str; 23] = [
    "any",
    "cert sign",
    "client auth",
    "code signing",
    "content commitment",
    "crl sign",
    "data encipherment",
    "decipher only",
    "digital signature",
    "email protection",
    "encipher only",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "key agreement",
    "key encipherment",
    "microsoft sgc",
    "netscape sgc",
    "ocsp signing",
    "s/mime",
    "server auth",
    "signing",
    "timestamping",
];

/// A self-signed certificate authority.
pub struct Ca {
    cert_pem: String,
    cert_der: Vec<u8>,
    issuer: Issuer<'static, KeyPair>,
    not_after: Timestamp,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca")
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

/// The fields of a certificate (or a request) that tests assert on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertInfo {
    /// The subject's common name (`""` when absent).
    pub common_name: String,
    /// The subject's organizations, in order.
    pub organizations: Vec<String>,
    /// DNS names, then IP addresses, as text.
    pub sans: Vec<String>,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
    pub emails: Vec<String>,
    pub uris: Vec<String>,
    /// The issuer's common name (for a request: `""`).
    pub issuer: String,
    pub not_before: Timestamp,
    pub not_after: Timestamp,
    /// Key usage and extended key usage in the names CSRs use (`digital signature`,
    /// `client auth`, ...), key usages first.
    pub usages: Vec<String>,
    pub is_ca: bool,
    /// The DER SubjectPublicKeyInfo.
    pub public_key: Vec<u8>,
    /// The serial number in hex (for a request: `""`).
    pub serial: String,
}

/// A parsed, signature-checked PKCS#10 request.
pub(crate) struct ParsedCsr {
    pub info: CertInfo,
    subject: DistinguishedName,
    sans: Vec<SanType>,
    key: CsrKey,
}

/// The requester's public key, as rcgen writes it into the certificate.
struct CsrKey {
    raw: Vec<u8>,
    alg: &'static SignatureAlgorithm,
}

impl PublicKeyData for CsrKey {
    fn der_bytes(&self) -> &[u8] {
        &self.raw
    }

    fn algorithm(&self) -> &'static SignatureAlgorithm {
        self.alg
    }
}

impl Ca {
    /// A new CA with subject `CN=<name>`, valid for ten years.
    ///
    /// # Panics
    /// If ring cannot make a key or sign (it does not fail on supported platforms).
    pub fn new(name: &str) -> Ca {
        Ca::try_new(name).expect("ring makes and signs a P-256 CA certificate")
    }

    fn try_new(name: &str) -> anyhow::Result<Ca> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
        ];
        let now = unix_now();
        let not_after = now + CA_VALIDITY.as_secs();
        set_validity(&mut params, now.saturating_sub(3600), not_after);
        params.serial_number = Some(random_serial());
        let cert = params.self_signed(&key)?;
        Ok(Ca {
            cert_pem: cert.pem(),
            cert_der: cert.der().to_vec(),
            issuer: Issuer::new(params, key),
            not_after: timestamp(not_after),
        })
    }

    /// The CA certificate, PEM.
    pub fn pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA certificate, DER.
    pub fn der(&self) -> &[u8] {
        &self.cert_der
    }

    /// A client certificate (`client auth`, `digital signature`, `key encipherment`)
    /// for `CN=<cn>, O=<orgs...>`, valid from now for `validity`: (cert PEM, PKCS#8 key PEM).
    pub fn issue_client(
        &self,
        cn: &str,
        orgs: &[&str],
        validity: Duration,
    ) -> anyhow::Result<(String, String)> {
        check_orgs(orgs)?;
        let mut params = leaf_params(cn, orgs);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(params, validity)
    }

    /// A serving certificate (`server auth`) for `sans` (IP addresses or DNS names;
    /// the first is also the CN), valid from now for `validity`.
    pub fn issue_server(
        &self,
        sans: &[&str],
        validity: Duration,
    ) -> anyhow::Result<(String, String)> {
        let mut params = leaf_params(sans.first().copied().unwrap_or(""), &[]);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.subject_alt_names = sans.iter().map(|s| san(s)).collect::<Result<_, _>>()?;
        self.issue(params, validity)
    }

    fn issue(
        &self,
        mut params: CertificateParams,
        validity: Duration,
    ) -> anyhow::Result<(String, String)> {
        let key = KeyPair::generate()?;
        let now = unix_now();
        set_validity(&mut params, now, now + validity.as_secs());
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// Signs a PKCS#10 request (PEM or DER) as a Kubernetes signer does: subject and
    /// SANs from the request, key usages from `usages` (CSR usage names), valid
    /// from now for `validity`. Fails on a bad request signature or unknown usage.
    pub fn sign_csr(
        &self,
        csr: &[u8],
        usages: &[&str],
        validity: Duration,
    ) -> anyhow::Result<String> {
        let parsed = parse_request(csr)?;
        let now = unix_now();
        self.sign_parsed(&parsed, usages, now, now + validity.as_secs())
    }

    /// Signs a parsed request valid from `not_before` to `not_after` (Unix seconds),
    /// clamped to the CA's own expiry.
    pub(crate) fn sign_parsed(
        &self,
        csr: &ParsedCsr,
        usages: &[&str],
        not_before: u64,
        not_after: u64,
    ) -> anyhow::Result<String> {
        let mut params = CertificateParams::default();
        params.distinguished_name = csr.subject.clone();
        params.subject_alt_names = csr.sans.clone();
        params.is_ca = IsCa::ExplicitNoCa;
        params.use_authority_key_identifier_extension = true;
        params.serial_number = Some(random_serial());
        let (key_usages, extended) = key_usages(usages)?;
        params.key_usages = key_usages;
        params.extended_key_usages = extended;
        let ca_end = u64::try_from(self.not_after.as_second()).unwrap_or(0);
        set_validity(&mut params, not_before, not_after.min(ca_end));
        let cert = params.signed_by(&csr.key, &self.issuer)?;
        Ok(cert.pem())
    }

    /// Checks that `cert_pem` was issued by this CA (issuer name and signature);
    /// returns its fields. Validity is not checked.
    pub fn verify(&self, cert_pem: &str) -> anyhow::Result<CertInfo> {
        let der = pem_block(cert_pem.as_bytes(), "CERTIFICATE")?;
        let (_, cert) = X509Certificate::from_der(&der).context("parsing the certificate")?;
        let (_, ca) = X509Certificate::from_der(&self.cert_der).context("parsing the CA")?;
        if cert.issuer() != ca.subject() {
            bail!(
                "issued by {}, not by this CA ({})",
                cert.issuer(),
                ca.subject()
            );
        }
        cert.verify_signature(Some(ca.public_key()))
            .map_err(|e| anyhow!("the signature does not verify with the CA's key: {e}"))?;
        Ok(cert_info(&cert))
    }
}

/// A new ECDSA P-256 key and a PKCS#10 request for `CN=<cn>, O=<orgs>` with `sans`
/// (IPs or DNS names), as a kubelet makes one: (request PEM, key PEM).
pub fn generate_csr(cn: &str, orgs: &[&str], sans: &[&str]) -> anyhow::Result<(String, String)> {
    check_orgs(orgs)?;
    let key = KeyPair::generate()?;
    let mut params = leaf_params(cn, orgs);
    params.use_authority_key_identifier_extension = false;
    params.serial_number = None;
    params.is_ca = IsCa::NoCa;
    params.key_usages.clear();
    params.subject_alt_names = sans.iter().map(|s| san(s)).collect::<Result<_, _>>()?;
    let csr = params.serialize_request(&key)?;
    Ok((csr.pem()?, key.serialize_pem()))
}

/// The fields of the first certificate in `pem`.
pub fn parse_cert(pem: &str) -> anyhow::Result<CertInfo> {
    let der = pem_block(pem.as_bytes(), "CERTIFICATE")?;
    let (_, cert) = X509Certificate::from_der(&der).context("parsing the certificate")?;
    Ok(cert_info(&cert))
}

/// The fields of a PKCS#10 request (PEM or DER); its signature is checked.
pub fn parse_csr(csr: &[u8]) -> anyhow::Result<CertInfo> {
    Ok(parse_request(csr)?.info)
}

/// The DER of the SubjectPublicKeyInfo of a PKCS#8 private key PEM (to compare
/// with [`CertInfo::public_key`]).
pub fn public_key_of(key_pem: &str) -> anyhow::Result<Vec<u8>> {
    let key = KeyPair::from_pem(key_pem).context("parsing the private key")?;
    Ok(key.subject_public_key_info())
}

/// The DER of every PEM block of `label` in `data`.
pub(crate) fn pem_blocks(data: &[u8], label: &str) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for pem in x509_parser::pem::Pem::iter_from_buffer(data) {
        let pem = pem.map_err(|e| anyhow!("invalid PEM: {e}"))?;
        if pem.label == label {
            out.push(pem.contents);
        }
    }
    Ok(out)
}

/// The DER of the first PEM block of `label` in `data`.
pub(crate) fn pem_block(data: &[u8], label: &str) -> anyhow::Result<Vec<u8>> {
    pem_blocks(data, label)?
        .into_iter()
        .next()
        .ok_or_else(|| anyhow!("no {label} PEM block"))
}

/// Parses and checks a PKCS#10 request given as PEM (`CERTIFICATE REQUEST`) or DER.
pub(crate) fn parse_request(csr: &[u8]) -> anyhow::Result<ParsedCsr> {
    let der = if csr.starts_with(b"-----") {
        pem_block(csr, "CERTIFICATE REQUEST")?
    } else {
        csr.to_vec()
    };
    let (_, req) = x509_parser::certification_request::X509CertificationRequest::from_der(&der)
        .map_err(|e| anyhow!("x509: malformed certificate request: {e}"))?;
    req.verify_signature()
        .map_err(|e| anyhow!("x509: certificate request signature is invalid: {e}"))?;
    let info = &req.certification_request_info;
    let mut subject = DistinguishedName::new();
    for attr in info.subject.iter_attributes() {
        let Some(components) = attr.attr_type().iter() else {
            continue;
        };
        let components: Vec<u64> = components.collect();
        if let Ok(value) = attr.as_str() {
            push_name(&mut subject, DnType::from_oid(&components), value)?;
        }
    }
    let mut sans = Vec::new();
    let mut fields = names(&info.subject);
    for ext in req.requested_extensions().into_iter().flatten() {
        if let ParsedExtension::SubjectAlternativeName(alt) = ext {
            for name in &alt.general_names {
                add_general_name(&mut fields, name);
                match name {
                    GeneralName::DNSName(d) => sans.push(SanType::DnsName((*d).try_into()?)),
                    GeneralName::RFC822Name(e) => sans.push(SanType::Rfc822Name((*e).try_into()?)),
                    GeneralName::URI(u) => sans.push(SanType::URI((*u).try_into()?)),
                    GeneralName::IPAddress(bytes) => {
                        if let Some(ip) = ip_of(bytes) {
                            sans.push(SanType::IpAddress(ip));
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    let spki = &info.subject_pki;
    let alg = key_algorithm(
        &spki.algorithm.algorithm.to_id_string(),
        spki.algorithm
            .parameters
            .as_ref()
            .and_then(|p| p.as_oid().ok())
            .map(|o| o.to_id_string()),
    )?;
    fields.public_key = spki.raw.to_vec();
    Ok(ParsedCsr {
        info: fields,
        subject,
        sans,
        key: CsrKey {
            raw: spki.subject_public_key.data.to_vec(),
            alg,
        },
    })
}

/// The rcgen algorithm that writes a SubjectPublicKeyInfo of this key type.
fn key_algorithm(oid: &str, curve: Option<String>) -> anyhow::Result<&'static SignatureAlgorithm> {
    Ok(match (oid, curve.as_deref()) {
        ("1.2.840.10045.2.1", Some("1.2.840.10045.3.1.7")) => &rcgen::PKCS_ECDSA_P256_SHA256,
        ("1.2.840.10045.2.1", Some("1.3.132.0.34")) => &rcgen::PKCS_ECDSA_P384_SHA384,
        ("1.2.840.113549.1.1.1", _) => &rcgen::PKCS_RSA_SHA256,
        ("1.3.101.112", _) => &rcgen::PKCS_ED25519,
        (oid, curve) => bail!("unsupported public key algorithm {oid} {curve:?}"),
    })
}

fn leaf_params(cn: &str, orgs: &[&str]) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    if !cn.is_empty() {
        params.distinguished_name.push(DnType::CommonName, cn);
    }
    for org in orgs {
        // At most two (see `push_name`); `leaf_params` callers check first.
        let _ = push_name(
            &mut params.distinguished_name,
            DnType::OrganizationName,
            org,
        );
    }
    params.is_ca = IsCa::ExplicitNoCa;
    params.use_authority_key_identifier_extension = true;
    params.serial_number = Some(random_serial());
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params
}

/// Adds `ty=value` to `dn`. rcgen keeps one value per attribute type, so a second
/// value of a type goes in under the same OID spelled as a custom type; a third
/// cannot be written.
fn push_name(dn: &mut DistinguishedName, ty: DnType, value: &str) -> anyhow::Result<()> {
    if dn.get(&ty).is_none() {
        dn.push(ty, value);
        return Ok(());
    }
    let oid: Vec<u64> = match &ty {
        DnType::CommonName => vec![2, 5, 4, 3],
        DnType::OrganizationName => vec![2, 5, 4, 10],
        DnType::OrganizationalUnitName => vec![2, 5, 4, 11],
        DnType::CountryName => vec![2, 5, 4, 6],
        DnType::LocalityName => vec![2, 5, 4, 7],
        DnType::StateOrProvinceName => vec![2, 5, 4, 8],
        _ => bail!("a name with more than one {ty:?} cannot be written"),
    };
    let alias = DnType::CustomDnType(oid);
    if dn.get(&alias).is_some() {
        bail!("a name with more than two {ty:?} values cannot be written");
    }
    dn.push(alias, value);
    Ok(())
}

fn check_orgs(orgs: &[&str]) -> anyhow::Result<()> {
    if orgs.len() > 2 {
        bail!("at most two organizations per certificate, got {orgs:?}");
    }
    Ok(())
}

fn san(name: &str) -> anyhow::Result<SanType> {
    Ok(match name.parse::<IpAddr>() {
        Ok(ip) => SanType::IpAddress(ip),
        Err(_) => SanType::DnsName(name.try_into()?),
    })
}

/// rcgen key usages for CSR usage names, as the Kubernetes signers map them.
fn key_usages(
    usages: &[&str],
) -> anyhow::Result<(Vec<KeyUsagePurpose>, Vec<ExtendedKeyUsagePurpose>)> {
    let mut key = Vec::new();
    let mut extended = Vec::new();
    let mut unrecognized = Vec::new();
    for usage in usages {
        let k = match *usage {
            "signing" | "digital signature" => Some(KeyUsagePurpose::DigitalSignature),
            "content commitment" => Some(KeyUsagePurpose::ContentCommitment),
            "key encipherment" => Some(KeyUsagePurpose::KeyEncipherment),
            "key agreement" => Some(KeyUsagePurpose::KeyAgreement),
            "data encipherment" => Some(KeyUsagePurpose::DataEncipherment),
            "cert sign" => Some(KeyUsagePurpose::KeyCertSign),
            "crl sign" => Some(KeyUsagePurpose::CrlSign),
            "encipher only" => Some(KeyUsagePurpose::EncipherOnly),
            "decipher only" => Some(KeyUsagePurpose::DecipherOnly),
            _ => None,
        };
        let e = match *usage {
            "any" => Some(ExtendedKeyUsagePurpose::Any),
            "server auth" => Some(ExtendedKeyUsagePurpose::ServerAuth),
            "client auth" => Some(ExtendedKeyUsagePurpose::ClientAuth),
            "code signing" => Some(ExtendedKeyUsagePurpose::CodeSigning),
            "email protection" | "s/mime" => Some(ExtendedKeyUsagePurpose::EmailProtection),
            "ipsec end system" => Some(ExtendedKeyUsagePurpose::Other(vec![
                1, 3, 6, 1, 5, 5, 7, 3, 5,
            ])),
            "ipsec tunnel" => Some(ExtendedKeyUsagePurpose::Other(vec![
                1, 3, 6, 1, 5, 5, 7, 3, 6,
            ])),
            "ipsec user" => Some(ExtendedKeyUsagePurpose::Other(vec![
                1, 3, 6, 1, 5, 5, 7, 3, 7,
            ])),
            "timestamping" => Some(ExtendedKeyUsagePurpose::TimeStamping),
            "ocsp signing" => Some(ExtendedKeyUsagePurpose::OcspSigning),
            "microsoft sgc" => Some(ExtendedKeyUsagePurpose::Other(vec![
                1, 3, 6, 1, 4, 1, 311, 10, 3, 3,
            ])),
            "netscape sgc" => Some(ExtendedKeyUsagePurpose::Other(vec![
                2, 16, 840, 1, 113730, 4, 1,
            ])),
            _ => None,
        };
        match (k, e) {
            (Some(k), _) if !key.contains(&k) => key.push(k),
            (Some(_), _) => {}
            (None, Some(e)) if !extended.contains(&e) => extended.push(e),
            (None, Some(_)) => {}
            (None, None) => unrecognized.push(format!("{usage:?}")),
        }
    }
    if !unrecognized.is_empty() {
        bail!("unrecognized usage values: [{}]", unrecognized.join(" "));
    }
    Ok((key, extended))
}

fn names(subject: &x509_parser::x509::X509Name<'_>) -> CertInfo {
    let text = |attr: &x509_parser::x509::AttributeTypeAndValue<'_>| {
        attr.as_str().map(str::to_string).unwrap_or_default()
    };
    CertInfo {
        common_name: subject
            .iter_common_name()
            .next()
            .map(text)
            .unwrap_or_default(),
        organizations: subject.iter_organization().map(text).collect(),
        sans: Vec::new(),
        dns_names: Vec::new(),
        ip_addresses: Vec::new(),
        emails: Vec::new(),
        uris: Vec::new(),
        issuer: String::new(),
        not_before: Timestamp::UNIX_EPOCH,
        not_after: Timestamp::UNIX_EPOCH,
        usages: Vec::new(),
        is_ca: false,
        public_key: Vec::new(),
        serial: String::new(),
    }
}

fn add_general_name(info: &mut CertInfo, name: &GeneralName<'_>) {
    match name {
        GeneralName::DNSName(d) => info.dns_names.push(d.to_string()),
        GeneralName::IPAddress(bytes) => info.ip_addresses.extend(ip_of(bytes)),
        GeneralName::RFC822Name(e) => info.emails.push(e.to_string()),
        GeneralName::URI(u) => info.uris.push(u.to_string()),
        _ => {}
    }
    info.sans = info
        .dns_names
        .iter()
        .cloned()
        .chain(info.ip_addresses.iter().map(IpAddr::to_string))
        .collect();
}

fn ip_of(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).ok().map(IpAddr::from),
        16 => <[u8; 16]>::try_from(bytes).ok().map(IpAddr::from),
        _ => None,
    }
}

fn cert_info(cert: &X509Certificate<'_>) -> CertInfo {
    let mut info = names(cert.subject());
    info.issuer = names(cert.issuer()).common_name;
    if let Ok(Some(alt)) = cert.subject_alternative_name() {
        for name in &alt.value.general_names {
            add_general_name(&mut info, name);
        }
    }
    info.not_before = timestamp_i64(cert.validity().not_before.timestamp());
    info.not_after = timestamp_i64(cert.validity().not_after.timestamp());
    if let Ok(Some(ku)) = cert.key_usage() {
        let ku = ku.value;
        let flags = [
            (ku.digital_signature(), "digital signature"),
            (ku.non_repudiation(), "content commitment"),
            (ku.key_encipherment(), "key encipherment"),
            (ku.data_encipherment(), "data encipherment"),
            (ku.key_agreement(), "key agreement"),
            (ku.key_cert_sign(), "cert sign"),
            (ku.crl_sign(), "crl sign"),
            (ku.encipher_only(), "encipher only"),
            (ku.decipher_only(), "decipher only"),
        ];
        info.usages.extend(
            flags
                .iter()
                .filter(|(on, _)| *on)
                .map(|(_, n)| n.to_string()),
        );
    }
    if let Ok(Some(eku)) = cert.extended_key_usage() {
        let eku = eku.value;
        let flags = [
            (eku.any, "any"),
            (eku.server_auth, "server auth"),
            (eku.client_auth, "client auth"),
            (eku.code_signing, "code signing"),
            (eku.email_protection, "email protection"),
            (eku.time_stamping, "timestamping"),
            (eku.ocsp_signing, "ocsp signing"),
        ];
        info.usages.extend(
            flags
                .iter()
                .filter(|(on, _)| *on)
                .map(|(_, n)| n.to_string()),
        );
    }
    info.is_ca = cert.is_ca();
    info.public_key = cert.public_key().raw.to_vec();
    info.serial = cert.raw_serial_as_string();
    info
}

/// Seconds since the Unix epoch, now.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Sets the validity from Unix seconds (rcgen's time type is reached through
/// `date_time_ymd`, so the `time` crate needs no naming here).
fn set_validity(params: &mut CertificateParams, not_before: u64, not_after: u64) {
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    params.not_before = epoch + Duration::from_secs(not_before);
    params.not_after = epoch + Duration::from_secs(not_after);
}

fn timestamp(unix: u64) -> Timestamp {
    timestamp_i64(i64::try_from(unix).unwrap_or(i64::MAX))
}

fn timestamp_i64(unix: i64) -> Timestamp {
    Timestamp::from_second(unix).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// A random positive 16-byte serial.
fn random_serial() -> SerialNumber {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let state = RandomState::new();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&state.hash_one((n, 0u8)).to_be_bytes());
    bytes[8..].copy_from_slice(&state.hash_one((n, 1u8)).to_be_bytes());
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    SerialNumber::from_slice(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn issued_certificates_parse_back() -> anyhow::Result<()> {
        let ca = Ca::new("wasmlet-test-ca");
        let ca_info = parse_cert(ca.pem())?;
        assert_eq!(
            (ca_info.common_name.as_str(), ca_info.issuer.as_str()),
            ("wasmlet-test-ca", "wasmlet-test-ca")
        );
        assert!(ca_info.is_ca);

        let (cert, key) = ca.issue_client("system:node:n1", &["system:nodes", "extra"], MINUTE)?;
        let info = ca.verify(&cert)?;
        assert_eq!(info.common_name, "system:node:n1");
        assert_eq!(info.organizations, ["system:nodes", "extra"]);
        assert_eq!(info.issuer, "wasmlet-test-ca");
        assert!(
            info.usages.contains(&"client auth".to_string()),
            "{:?}",
            info.usages
        );
        assert!(!info.is_ca);
        assert_eq!(info.public_key, public_key_of(&key)?);
        let lifetime = info.not_after.as_second() - info.not_before.as_second();
        assert_eq!(lifetime, 60);
        let skew = (info.not_before.as_second() - Timestamp::now().as_second()).abs();
        assert!(skew <= 2, "not_before is now: {}", info.not_before);

        let (serving, _) = ca.issue_server(&["127.0.0.1", "localhost"], MINUTE)?;
        let info = ca.verify(&serving)?;
        assert_eq!(info.dns_names, ["localhost"]);
        assert_eq!(info.ip_addresses, ["127.0.0.1".parse::<IpAddr>()?]);
        assert_eq!(info.sans, ["localhost", "127.0.0.1"]);
        assert!(info.usages.contains(&"server auth".to_string()));

        let other = Ca::new("other");
        assert!(other.verify(&cert).is_err(), "another CA did not issue it");
        Ok(())
    }

    #[test]
    fn signs_requests_with_their_subject_key_and_usages() -> anyhow::Result<()> {
        let ca = Ca::new("ca");
        let (csr, key) = generate_csr("system:node:n1", &["system:nodes"], &["n1", "10.0.0.1"])?;
        let request = parse_csr(csr.as_bytes())?;
        assert_eq!(request.common_name, "system:node:n1");
        assert_eq!(request.sans, ["n1", "10.0.0.1"]);
        let cert = ca.sign_csr(
            csr.as_bytes(),
            &["digital signature", "server auth"],
            Duration::from_secs(5),
        )?;
        let info = ca.verify(&cert)?;
        assert_eq!(info.common_name, "system:node:n1");
        assert_eq!(info.organizations, ["system:nodes"]);
        assert_eq!(info.sans, ["n1", "10.0.0.1"]);
        assert_eq!(info.usages, ["digital signature", "server auth"]);
        assert_eq!(info.public_key, public_key_of(&key)?);
        assert_eq!(info.public_key, request.public_key);
        assert_eq!(info.not_after.as_second() - info.not_before.as_second(), 5);

        let der = pem_block(csr.as_bytes(), "CERTIFICATE REQUEST")?;
        assert!(
            ca.sign_csr(&der, &["client auth"], MINUTE).is_ok(),
            "DER works too"
        );
        let err = ca
            .sign_csr(csr.as_bytes(), &["flying"], MINUTE)
            .expect_err("unknown usage");
        assert!(err.to_string().contains("unrecognized usage"), "{err}");
        let mut tampered = der.clone();
        let last = tampered.len() - 1;
        tampered[last] ^= 0x55;
        assert!(
            parse_csr(&tampered).is_err(),
            "a broken signature is refused"
        );
        Ok(())
    }
}
