//! TLS for both sides of the API server, always with ring: serving with a
//! certificate from the server's CA while *requesting* client certificates
//! (checked per request, as the apiserver's x509 authenticator does, so an expired
//! or foreign certificate is a 401 rather than a failed handshake), and the client
//! side towards kubelets (the apiserver-kubelet-client certificate; the kubelet's
//! serving certificate is verified only against a configured kubelet CA).

use std::sync::Arc;

use anyhow::Context as _;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    ClientConfig, DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig,
    SignatureScheme,
};

use crate::pki::Ca;

/// The one crypto provider: ring.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A TLS listener's configuration and the verifier requests are authenticated with.
pub(crate) struct Serving {
    pub config: Arc<ServerConfig>,
    pub verifier: Arc<dyn ClientCertVerifier>,
}

fn certs(pem: &str) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .context("parsing certificate PEM")?;
    anyhow::ensure!(!certs.is_empty(), "no certificate in the PEM");
    Ok(certs)
}

fn key(pem: &str) -> anyhow::Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).context("parsing private key PEM")
}

fn roots(pem: &str) -> anyhow::Result<Arc<RootCertStore>> {
    let mut roots = RootCertStore::empty();
    for cert in certs(pem)? {
        roots.add(cert).context("adding a CA certificate")?;
    }
    Ok(Arc::new(roots))
}

/// Serving with `cert_pem`/`key_pem`, requesting client certificates from `ca`.
pub(crate) fn serving(ca: &Ca, cert_pem: &str, key_pem: &str) -> anyhow::Result<Serving> {
    let provider = provider();
    let verifier = WebPkiClientVerifier::builder_with_provider(roots(ca.pem())?, provider.clone())
        .allow_unauthenticated()
        .build()
        .context("building the client certificate verifier")?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(Arc::new(RequestClientCert(verifier.clone())))
        .with_single_cert(certs(cert_pem)?, key(key_pem)?)
        .context("the serving certificate")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Serving {
        config: Arc::new(config),
        verifier,
    })
}

/// A client configuration presenting `cert_pem`/`key_pem`; the server's certificate
/// is verified against `server_ca` when given, else not at all.
pub(crate) fn client(
    cert_pem: &str,
    key_pem: &str,
    server_ca: Option<&str>,
) -> anyhow::Result<Arc<ClientConfig>> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match server_ca {
        Some(pem) => {
            let verifier = WebPkiServerVerifier::builder_with_provider(roots(pem)?, provider)
                .build()
                .context("building the kubelet certificate verifier")?;
            builder.with_webpki_verifier(verifier)
        }
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(InsecureServer(provider))),
    };
    let mut config = builder
        .with_client_auth_cert(certs(cert_pem)?, key(key_pem)?)
        .context("the client certificate")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A client configuration without a client certificate that verifies nothing.
pub(crate) fn insecure_client() -> anyhow::Result<Arc<ClientConfig>> {
    let provider = provider();
    let mut config = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(InsecureServer(provider)))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The server name to verify a kubelet at `host` by.
pub(crate) fn server_name(host: &str) -> anyhow::Result<ServerName<'static>> {
    ServerName::try_from(host.to_string()).with_context(|| format!("invalid server name {host:?}"))
}

/// Asks for a client certificate (naming the CA) and checks the handshake
/// signature, but accepts any chain: requests are authenticated one by one.
#[derive(Debug)]
struct RequestClientCert(Arc<dyn ClientCertVerifier>);

impl ClientCertVerifier for RequestClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.0.root_hint_subjects()
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
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `--kubelet-certificate-authority` unset: any serving certificate will do (the
/// handshake signature is still checked).
#[derive(Debug)]
struct InsecureServer(Arc<CryptoProvider>);

impl ServerCertVerifier for InsecureServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
