//! The node API's section of the configuration: its TLS (`tlsCertFile`, ...,
//! `--cert-dir`), `authentication` and `authorization`, with the `KubeletConfiguration`
//! v1beta1 defaults (anonymous off, the token webhook on with a 2 m cache, mode
//! Webhook with 5 m / 30 s caches).
//!
//! A node without an API server cannot ask one: when it runs standalone and the
//! file does not set them, the token webhook is off and the mode is AlwaysAllow (any
//! client certificate from `clientCAFile` may do everything, as with the kubelet's
//! `--authorization-mode=AlwaysAllow`); set explicitly, either is an error. With no
//! way to authenticate at all (no client CA, no webhook, anonymous off) the node
//! API is not served, and the log says why.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::sections::duration_of;
use super::{KubeletConfiguration, NodeFlags};

/// `authentication.webhook.cacheTTL`'s default.
pub const DEFAULT_TOKEN_CACHE_TTL: Duration = Duration::from_secs(2 * 60);

/// The kubelet's `streamingConnectionIdleTimeout` default.
pub const DEFAULT_STREAMING_IDLE_TIMEOUT: Duration = Duration::from_secs(4 * 60 * 60);

/// `KubeletAuthentication`, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthnConfig {
    /// `authentication.anonymous.enabled`.
    pub anonymous: bool,
    /// `authentication.x509.clientCAFile` is set: client certificates name users.
    pub x509: bool,
    /// `authentication.webhook.enabled`, with its `cacheTTL`.
    pub webhook: Option<Duration>,
}

impl Default for AuthnConfig {
    /// The `KubeletConfiguration` defaults: anonymous off, the webhook on with a 2 m
    /// cache, no client CA.
    fn default() -> AuthnConfig {
        AuthnConfig {
            anonymous: false,
            x509: false,
            webhook: Some(DEFAULT_TOKEN_CACHE_TTL),
        }
    }
}

/// `authorization.webhook.cacheAuthorizedTTL`'s default.
pub const DEFAULT_CACHE_AUTHORIZED_TTL: Duration = Duration::from_secs(5 * 60);
/// `authorization.webhook.cacheUnauthorizedTTL`'s default.
pub const DEFAULT_CACHE_UNAUTHORIZED_TTL: Duration = Duration::from_secs(30);

/// `KubeletAuthorization`, resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthzMode {
    AlwaysAllow,
    Webhook {
        /// `cacheAuthorizedTTL`.
        authorized_ttl: Duration,
        /// `cacheUnauthorizedTTL`.
        unauthorized_ttl: Duration,
    },
}

impl Default for AuthzMode {
    /// The `KubeletConfiguration` default: Webhook, 5 m and 30 s.
    fn default() -> AuthzMode {
        AuthzMode::Webhook {
            authorized_ttl: DEFAULT_CACHE_AUTHORIZED_TTL,
            unauthorized_ttl: DEFAULT_CACHE_UNAUTHORIZED_TTL,
        }
    }
}

/// The kubelet's TLS settings, resolved from its flags and configuration file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// `tlsCertFile` / `--tls-cert-file`.
    pub cert_file: Option<PathBuf>,
    /// `tlsPrivateKeyFile` / `--tls-private-key-file`.
    pub key_file: Option<PathBuf>,
    /// `--cert-dir`: where the self-signed pair (and, later, issued ones) are kept.
    pub cert_dir: PathBuf,
    /// `tlsCipherSuites`, by their Go (IANA) names; empty is the library's default.
    pub cipher_suites: Vec<String>,
    /// `tlsMinVersion`: `VersionTLS12` or `VersionTLS13`; `None` is TLS 1.2.
    pub min_version: Option<String>,
    /// `authentication.x509.clientCAFile`.
    pub client_ca_file: Option<PathBuf>,
}

/// `authentication` in the file.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct AuthenticationSection {
    x509: Option<X509Section>,
    webhook: Option<AuthnWebhookSection>,
    anonymous: Option<Enabled>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct X509Section {
    #[serde(rename = "clientCAFile")]
    client_ca_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct AuthnWebhookSection {
    enabled: Option<bool>,
    #[serde(rename = "cacheTTL")]
    cache_ttl: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct Enabled {
    enabled: Option<bool>,
}

/// `authorization` in the file.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct AuthorizationSection {
    mode: Option<String>,
    webhook: Option<AuthzWebhookSection>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct AuthzWebhookSection {
    #[serde(rename = "cacheAuthorizedTTL")]
    cache_authorized_ttl: Option<String>,
    #[serde(rename = "cacheUnauthorizedTTL")]
    cache_unauthorized_ttl: Option<String>,
}

/// The node API, resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeApiSettings {
    pub tls: TlsSettings,
    pub authn: AuthnConfig,
    pub authz: AuthzMode,
    /// `KubeletFineGrainedAuthz` (alpha, off, in 1.32).
    pub fine_grained: bool,
    /// `enableSystemLogHandler` (default true): `/logs/` serves the node's `/var/log`.
    pub system_log_handler: bool,
    /// `enableDebuggingHandlers` (default true): logs, `/runningpods/`, `/configz`
    /// and streaming are served; off, they answer 405 (`/configz` 404), as the
    /// kubelet's.
    pub debugging_handlers: bool,
    /// `streamingConnectionIdleTimeout` (default 4 h): a stream the node serves
    /// itself that carries nothing for this long is ended.
    pub streaming_idle_timeout: Duration,
}

impl NodeApiSettings {
    /// Whether any request could ever be authenticated; without, the API is not served.
    pub fn can_authenticate(&self) -> bool {
        self.authn.anonymous || self.authn.x509 || self.authn.webhook.is_some()
    }
}

impl NodeFlags {
    /// The node API's TLS, authentication and authorization; `standalone` without a
    /// kubeconfig (see the module doc).
    pub(super) fn node_api(
        &self,
        file: &mut KubeletConfiguration,
        root_dir: &std::path::Path,
        standalone: bool,
        errors: &mut Vec<String>,
    ) -> NodeApiSettings {
        let authn_file = file.authentication.take().unwrap_or_default();
        let authz_file = file.authorization.take().unwrap_or_default();
        let client_ca_file = self
            .client_ca_file
            .clone()
            .or(authn_file.x509.and_then(|x| x.client_ca_file));
        let webhook = authn_file.webhook.unwrap_or_default();
        let webhook_enabled = self.authentication_token_webhook.or(webhook.enabled);
        let cache_ttl = duration_of(
            errors,
            "authentication.webhook.cacheTTL",
            webhook.cache_ttl.as_ref(),
            DEFAULT_TOKEN_CACHE_TTL,
        );
        let webhook = match (webhook_enabled, standalone) {
            (Some(true), true) => {
                errors.push(
                    "authentication.webhook.enabled needs an API server (--kubeconfig) to send TokenReviews to"
                        .to_owned(),
                );
                None
            }
            (Some(true), false) | (None, false) => Some(cache_ttl),
            (Some(false), _) | (None, true) => None,
        };
        let anonymous = self
            .anonymous_auth
            .or(authn_file.anonymous.and_then(|a| a.enabled))
            .unwrap_or(false);

        let mode = self.authorization_mode.clone().or(authz_file.mode);
        let hooks = authz_file.webhook.unwrap_or_default();
        let authorized_ttl = duration_of(
            errors,
            "authorization.webhook.cacheAuthorizedTTL",
            hooks.cache_authorized_ttl.as_ref(),
            DEFAULT_CACHE_AUTHORIZED_TTL,
        );
        let unauthorized_ttl = duration_of(
            errors,
            "authorization.webhook.cacheUnauthorizedTTL",
            hooks.cache_unauthorized_ttl.as_ref(),
            DEFAULT_CACHE_UNAUTHORIZED_TTL,
        );
        let authz = match (mode.as_deref(), standalone) {
            (Some("AlwaysAllow"), _) | (None, true) => AuthzMode::AlwaysAllow,
            (Some("Webhook"), true) => {
                errors.push(
                    "authorization.mode Webhook needs an API server (--kubeconfig) to send SubjectAccessReviews to"
                        .to_owned(),
                );
                AuthzMode::AlwaysAllow
            }
            (Some("Webhook"), false) | (None, false) => AuthzMode::Webhook {
                authorized_ttl,
                unauthorized_ttl,
            },
            (Some(other), _) => {
                errors.push(format!(
                    "authorization.mode: {other:?} is not AlwaysAllow or Webhook"
                ));
                AuthzMode::AlwaysAllow
            }
        };

        let streaming_idle_timeout = duration_of(
            errors,
            "streamingConnectionIdleTimeout",
            self.streaming_connection_idle_timeout
                .as_ref()
                .or(file.streaming_connection_idle_timeout.as_ref()),
            DEFAULT_STREAMING_IDLE_TIMEOUT,
        );
        NodeApiSettings {
            tls: TlsSettings {
                cert_file: self.tls_cert_file.clone().or(file.tls_cert_file.take()),
                key_file: self
                    .tls_private_key_file
                    .clone()
                    .or(file.tls_private_key_file.take()),
                cert_dir: self
                    .cert_dir
                    .clone()
                    .unwrap_or_else(|| root_dir.join("pki")),
                cipher_suites: file.tls_cipher_suites.take().unwrap_or_default(),
                min_version: file.tls_min_version.take(),
                client_ca_file: client_ca_file.clone(),
            },
            authn: AuthnConfig {
                anonymous,
                x509: client_ca_file.is_some(),
                webhook,
            },
            authz,
            fine_grained: false,
            system_log_handler: file.enable_system_log_handler.take().unwrap_or(true),
            debugging_handlers: file.enable_debugging_handlers.take().unwrap_or(true),
            streaming_idle_timeout,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(yaml: &str, flags: NodeFlags) -> Result<NodeApiSettings, Vec<String>> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(
            &path,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{yaml}"
            ),
        )
        .unwrap();
        NodeFlags {
            config: Some(path),
            hostname_override: Some("edge-1".into()),
            root_dir: Some("/var/lib/wasmlet".into()),
            ..flags
        }
        .resolve()
        .map(|c| c.node_api)
        .map_err(|e| e.0)
    }

    fn in_cluster() -> NodeFlags {
        NodeFlags {
            kubeconfig: Some("/k".into()),
            ..NodeFlags::default()
        }
    }

    #[test]
    fn the_system_log_handler_is_on_unless_the_file_turns_it_off() {
        assert!(resolve("", in_cluster()).unwrap().system_log_handler);
        let off = resolve("enableSystemLogHandler: false\n", in_cluster()).unwrap();
        assert!(!off.system_log_handler);
    }

    #[test]
    fn a_joined_nodes_defaults_are_the_kubelet_configurations() {
        let api = resolve("", in_cluster()).unwrap();
        assert_eq!(
            api.authn,
            AuthnConfig {
                anonymous: false,
                x509: false,
                webhook: Some(Duration::from_secs(120)),
            }
        );
        assert_eq!(
            api.authz,
            AuthzMode::Webhook {
                authorized_ttl: Duration::from_secs(300),
                unauthorized_ttl: Duration::from_secs(30),
            }
        );
        assert_eq!(api.tls.cert_dir, PathBuf::from("/var/lib/wasmlet/pki"));
        assert_eq!(api.streaming_idle_timeout, Duration::from_secs(4 * 3600));
        assert!(api.can_authenticate());
    }

    #[test]
    fn the_streaming_idle_timeout_is_the_flags_else_the_files() {
        let yaml = "streamingConnectionIdleTimeout: 30m\n";
        let api = resolve(yaml, in_cluster()).unwrap();
        assert_eq!(api.streaming_idle_timeout, Duration::from_secs(30 * 60));
        let flags = NodeFlags {
            streaming_connection_idle_timeout: Some("90s".into()),
            ..in_cluster()
        };
        assert_eq!(
            resolve(yaml, flags).unwrap().streaming_idle_timeout,
            Duration::from_secs(90)
        );
        let errors = resolve("streamingConnectionIdleTimeout: soon\n", in_cluster()).unwrap_err();
        assert!(
            errors[0].starts_with("streamingConnectionIdleTimeout: "),
            "{errors:?}"
        );
    }

    #[test]
    fn a_standalone_node_asks_no_api_server() {
        let api = resolve("", NodeFlags::default()).unwrap();
        assert_eq!(api.authn.webhook, None);
        assert_eq!(api.authz, AuthzMode::AlwaysAllow);
        assert!(!api.can_authenticate(), "no CA, no webhook, no anonymous");

        let errors = resolve(
            "authentication:\n  webhook:\n    enabled: true\nauthorization:\n  mode: Webhook\n",
            NodeFlags::default(),
        )
        .unwrap_err();
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].contains("TokenReviews"), "{errors:?}");
        assert!(errors[1].contains("SubjectAccessReviews"), "{errors:?}");
    }

    #[test]
    fn the_files_settings_and_the_flags_over_them() {
        let yaml = "tlsCertFile: /etc/tls.crt\ntlsPrivateKeyFile: /etc/tls.key\n\
                    tlsMinVersion: VersionTLS13\n\
                    tlsCipherSuites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]\n\
                    authentication:\n  x509:\n    clientCAFile: /etc/ca.crt\n  \
                    webhook:\n    cacheTTL: 10s\n  anonymous:\n    enabled: true\n\
                    authorization:\n  mode: Webhook\n  webhook:\n    cacheAuthorizedTTL: 1m\n    cacheUnauthorizedTTL: 5s\n";
        let api = resolve(yaml, in_cluster()).unwrap();
        assert_eq!(api.tls.cert_file, Some("/etc/tls.crt".into()));
        assert_eq!(api.tls.key_file, Some("/etc/tls.key".into()));
        assert_eq!(api.tls.min_version.as_deref(), Some("VersionTLS13"));
        assert_eq!(
            api.tls.cipher_suites,
            ["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"]
        );
        assert_eq!(api.tls.client_ca_file, Some("/etc/ca.crt".into()));
        assert_eq!(
            api.authn,
            AuthnConfig {
                anonymous: true,
                x509: true,
                webhook: Some(Duration::from_secs(10)),
            }
        );
        assert_eq!(
            api.authz,
            AuthzMode::Webhook {
                authorized_ttl: Duration::from_secs(60),
                unauthorized_ttl: Duration::from_secs(5),
            }
        );

        let flags = NodeFlags {
            anonymous_auth: Some(false),
            authorization_mode: Some("AlwaysAllow".into()),
            client_ca_file: Some("/other/ca.crt".into()),
            cert_dir: Some("/certs".into()),
            ..in_cluster()
        };
        let api = resolve(yaml, flags).unwrap();
        assert!(!api.authn.anonymous);
        assert_eq!(api.authz, AuthzMode::AlwaysAllow);
        assert_eq!(api.tls.client_ca_file, Some("/other/ca.crt".into()));
        assert_eq!(api.tls.cert_dir, PathBuf::from("/certs"));
    }

    #[test]
    fn bad_values_are_each_reported() {
        let errors = resolve(
            "authentication:\n  webhook:\n    cacheTTL: soon\nauthorization:\n  mode: RBAC\n  webhook:\n    cacheAuthorizedTTL: 5x\n",
            in_cluster(),
        )
        .unwrap_err();
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(
            errors[0].starts_with("authentication.webhook.cacheTTL"),
            "{errors:?}"
        );
        assert!(
            errors[1].starts_with("authorization.webhook.cacheAuthorizedTTL"),
            "{errors:?}"
        );
        assert!(errors[2].contains("\"RBAC\""), "{errors:?}");
    }
}
