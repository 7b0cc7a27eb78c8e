//! Kubelet credential provider plugins (`credentialprovider.kubelet.k8s.io/v1`): the
//! `CredentialProviderConfig` of `--image-credential-provider-config`, each provider a
//! program in `--image-credential-provider-bin-dir` that is run, for an image its
//! `matchImages` covers, with a `CredentialProviderRequest` on stdin and answers a
//! `CredentialProviderResponse` on stdout. Answers are cached per provider by the
//! key the plugin chose (`Image`, `Registry` or `Global`) for `cacheDuration` (else the
//! provider's `defaultCacheDuration`; zero caches nothing). A plugin that fails (exit
//! status, timeout, an answer that does not parse or has the wrong kind) is logged and
//! gives no credentials, as the kubelet's; nothing of what it printed is logged, since
//! it may be a secret.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;
use tokio::io::AsyncWriteExt;
use wasmlet_runtime::AuthConfig;

use super::credentials::{Credential, key_matches, registry_of, repository_of};

/// How long a plugin may run (the kubelet's one minute).
pub const EXEC_TIMEOUT: Duration = Duration::from_secs(60);
const API_VERSIONS: &[&str] = &[
    "credentialprovider.kubelet.k8s.io/v1",
    "credentialprovider.kubelet.k8s.io/v1beta1",
    "credentialprovider.kubelet.k8s.io/v1alpha1",
];

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ConfigFile {
    api_version: Option<String>,
    kind: Option<String>,
    #[serde(default)]
    providers: Vec<ProviderSection>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ProviderSection {
    name: String,
    #[serde(default)]
    match_images: Vec<String>,
    default_cache_duration: Option<String>,
    api_version: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: Vec<EnvVar>,
    #[serde(default)]
    token_attributes: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EnvVar {
    name: String,
    value: String,
}

/// One provider, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Provider {
    pub name: String,
    pub binary: PathBuf,
    pub match_images: Vec<String>,
    pub default_cache_duration: Duration,
    pub api_version: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// Reads and validates `config` against the plugins in `bin_dir`: every problem, at
/// once.
pub fn load(config: &Path, bin_dir: &Path) -> Result<Vec<Provider>, Vec<String>> {
    let mut errors = Vec::new();
    if !bin_dir.is_dir() {
        errors.push(format!(
            "--image-credential-provider-bin-dir {}: plugin binary directory does not exist",
            bin_dir.display()
        ));
    }
    let text = match std::fs::read_to_string(config) {
        Ok(t) => t,
        Err(e) => {
            errors.push(format!(
                "--image-credential-provider-config {}: {e}",
                config.display()
            ));
            return Err(errors);
        }
    };
    let file: ConfigFile = match serde_saphyr::from_str(&text) {
        Ok(f) => f,
        Err(e) => {
            errors.push(format!(
                "--image-credential-provider-config {}: {e}",
                config.display()
            ));
            return Err(errors);
        }
    };
    if file.kind.as_deref() != Some("CredentialProviderConfig") {
        errors.push(format!(
            "{}: kind must be CredentialProviderConfig, not {:?}",
            config.display(),
            file.kind.unwrap_or_default()
        ));
    }
    if !file.api_version.as_deref().is_some_and(|v| {
        [
            "kubelet.config.k8s.io/v1",
            "kubelet.config.k8s.io/v1beta1",
            "kubelet.config.k8s.io/v1alpha1",
        ]
        .contains(&v)
    }) {
        errors.push(format!(
            "{}: apiVersion must be kubelet.config.k8s.io/v1, not {:?}",
            config.display(),
            file.api_version.unwrap_or_default()
        ));
    }
    if file.providers.is_empty() {
        errors.push(format!(
            "{}: at least 1 provider is required",
            config.display()
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut providers = Vec::new();
    for p in file.providers {
        let at = format!("{}: provider {:?}", config.display(), p.name);
        if p.name.is_empty()
            || p.name.contains('/')
            || p.name.contains(' ')
            || p.name == "."
            || p.name == ".."
        {
            errors.push(format!("{at}: name must be a file name in the bin dir"));
        }
        if !seen.insert(p.name.clone()) {
            errors.push(format!("{at}: duplicate name"));
        }
        if p.match_images.is_empty() {
            errors.push(format!("{at}: at least 1 item in matchImages is required"));
        }
        for m in &p.match_images {
            if m.is_empty() || m.contains("://") && !m.starts_with("https://") {
                errors.push(format!(
                    "{at}: matchImages {m:?} is not a host[:port][/path]"
                ));
            }
        }
        let default_cache_duration = match p.default_cache_duration.as_deref() {
            None => {
                errors.push(format!("{at}: defaultCacheDuration is required"));
                Duration::ZERO
            }
            Some(d) => crate::duration::parse(d).unwrap_or_else(|e| {
                errors.push(format!("{at}: defaultCacheDuration: {e}"));
                Duration::ZERO
            }),
        };
        let api_version = p.api_version.unwrap_or_default();
        if !API_VERSIONS.contains(&api_version.as_str()) {
            errors.push(format!(
                "{at}: apiVersion must be one of {API_VERSIONS:?}, not {api_version:?}"
            ));
        }
        if p.token_attributes.is_some() {
            errors.push(format!(
                "{at}: tokenAttributes (service account tokens) is not supported"
            ));
        }
        let binary = bin_dir.join(&p.name);
        if !binary.is_file() {
            errors.push(format!(
                "{at}: plugin binary executable {} does not exist",
                binary.display()
            ));
        }
        providers.push(Provider {
            name: p.name,
            binary,
            match_images: p.match_images,
            default_cache_duration,
            api_version,
            args: p.args,
            env: p.env.into_iter().map(|e| (e.name, e.value)).collect(),
        });
    }
    if errors.is_empty() {
        Ok(providers)
    } else {
        Err(errors)
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Response {
    api_version: Option<String>,
    kind: Option<String>,
    cache_key_type: Option<String>,
    cache_duration: Option<String>,
    #[serde(default)]
    auth: BTreeMap<String, AuthEntry>,
}

#[derive(Debug, Deserialize)]
struct AuthEntry {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
}

/// A cached answer.
struct Cached {
    credentials: Vec<Credential>,
    until: Instant,
}

/// The node's credential providers and their caches.
pub struct CredentialProviders {
    providers: Vec<Provider>,
    /// By provider name, then cache key (`image`, `registry`, `"global"`).
    cache: Mutex<HashMap<String, HashMap<String, Cached>>>,
}

/// Why a plugin gave nothing (for the log; never what it printed).
#[derive(Debug, thiserror::Error)]
enum PluginError {
    #[error("could not be run: {0}")]
    Exec(std::io::Error),
    #[error("did not answer within {EXEC_TIMEOUT:?}")]
    Timeout,
    #[error("exited with {0}")]
    Status(std::process::ExitStatus),
    #[error("answered with something that is not a CredentialProviderResponse ({0})")]
    Parse(String),
    #[error("answered apiVersion {got:?} where {want:?} was asked")]
    ApiVersion { got: String, want: String },
    #[error("answered cacheKeyType {0:?}: Image, Registry or Global")]
    CacheKey(String),
}

impl CredentialProviders {
    pub fn new(providers: Vec<Provider>) -> Self {
        CredentialProviders {
            providers,
            cache: Mutex::default(),
        }
    }

    /// The credentials the providers give for `image` (a reference as in the pod),
    /// matched against it, best first.
    pub async fn credentials(&self, image: &str) -> Vec<AuthConfig> {
        let repository = repository_of(image);
        let mut found: Vec<Credential> = Vec::new();
        for p in &self.providers {
            if !p.match_images.iter().any(|m| key_matches(m, &repository)) {
                continue;
            }
            let credentials = match self.cached(p, &repository) {
                Some(c) => c,
                None => match self.exec(p, &repository).await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(provider = %p.name, image = %repository, "credential provider: {e}; no credentials from it");
                        continue;
                    }
                },
            };
            found.extend(credentials);
        }
        super::credentials::matching(&found, image)
    }

    fn cached(&self, p: &Provider, repository: &str) -> Option<Vec<Credential>> {
        let mut cache = self.cache.lock().unwrap();
        let entries = cache.get_mut(&p.name)?;
        let now = Instant::now();
        entries.retain(|_, c| c.until > now);
        let registry = registry_of(repository);
        [repository, registry.as_str(), "global"]
            .iter()
            .find_map(|k| entries.get(*k))
            .map(|c| c.credentials.clone())
    }

    async fn exec(&self, p: &Provider, repository: &str) -> Result<Vec<Credential>, PluginError> {
        let request = serde_json::json!({
            "apiVersion": p.api_version,
            "kind": "CredentialProviderRequest",
            "image": repository,
        });
        let mut cmd = tokio::process::Command::new(&p.binary);
        cmd.args(&p.args)
            .envs(p.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(PluginError::Exec)?;
        let mut stdin = child.stdin.take().expect("stdin is piped");
        let body = serde_json::to_vec(&request).expect("serializes");
        let run = async move {
            stdin.write_all(&body).await?;
            drop(stdin);
            child.wait_with_output().await
        };
        let out = tokio::time::timeout(EXEC_TIMEOUT, run)
            .await
            .map_err(|_| PluginError::Timeout)?
            .map_err(PluginError::Exec)?;
        if !out.status.success() {
            return Err(PluginError::Status(out.status));
        }
        // Only the error's kind and position: serde's text may quote a password.
        let response: Response = serde_json::from_slice(&out.stdout).map_err(|e| {
            PluginError::Parse(format!(
                "{:?} error at line {}, column {}",
                e.classify(),
                e.line(),
                e.column()
            ))
        })?;
        if response.kind.as_deref() != Some("CredentialProviderResponse") {
            return Err(PluginError::Parse(format!(
                "kind {:?}",
                response.kind.unwrap_or_default()
            )));
        }
        let got = response.api_version.unwrap_or_default();
        if got != p.api_version {
            return Err(PluginError::ApiVersion {
                got,
                want: p.api_version.clone(),
            });
        }
        let key = match response.cache_key_type.as_deref() {
            Some("Image") => repository.to_owned(),
            Some("Registry") => registry_of(repository),
            Some("Global") => "global".to_owned(),
            other => return Err(PluginError::CacheKey(other.unwrap_or_default().into())),
        };
        let credentials: Vec<Credential> = response
            .auth
            .into_iter()
            .map(|(key, e)| Credential {
                key,
                auth: AuthConfig {
                    username: e.username,
                    password: e.password,
                    ..Default::default()
                },
            })
            .collect();
        let duration = match response.cache_duration.as_deref() {
            Some(d) => crate::duration::parse(d).unwrap_or(p.default_cache_duration),
            None => p.default_cache_duration,
        };
        if !duration.is_zero() {
            self.cache
                .lock()
                .unwrap()
                .entry(p.name.clone())
                .or_default()
                .insert(
                    key,
                    Cached {
                        credentials: credentials.clone(),
                        until: Instant::now() + duration,
                    },
                );
        }
        Ok(credentials)
    }
}

/// The node's own credentials, looked up after a pod's pull secrets: its docker
/// configuration (re-read every [`DOCKER_CONFIG_LIFETIME`], as the kubelet caches it)
/// and the credential provider plugins.
pub struct NodeKeyring {
    root_dir: PathBuf,
    home: Option<PathBuf>,
    docker: Mutex<Option<(Instant, Vec<Credential>)>>,
    providers: Option<CredentialProviders>,
}

/// How long the node's docker configuration is used before it is read again.
pub const DOCKER_CONFIG_LIFETIME: Duration = Duration::from_secs(300);

impl NodeKeyring {
    pub fn new(root_dir: PathBuf, providers: Option<CredentialProviders>) -> Self {
        NodeKeyring {
            root_dir,
            home: std::env::var_os("HOME").map(PathBuf::from),
            docker: Mutex::default(),
            providers,
        }
    }

    /// The node's credentials for `image`, best first: its docker configuration's,
    /// then the providers'.
    pub async fn lookup(&self, image: &str) -> Vec<AuthConfig> {
        let docker = {
            let mut cached = self.docker.lock().unwrap();
            let fresh = cached
                .as_ref()
                .is_some_and(|(at, _)| at.elapsed() < DOCKER_CONFIG_LIFETIME);
            if !fresh {
                let read =
                    super::credentials::node_docker_config(&self.root_dir, self.home.as_deref());
                if let Some((file, entries)) = &read {
                    tracing::debug!(file = %file.display(), entries = entries.len(), "read the node's docker configuration");
                }
                *cached = Some((
                    Instant::now(),
                    read.map(|(_, entries)| entries).unwrap_or_default(),
                ));
            }
            cached.as_ref().map(|(_, c)| c.clone()).unwrap_or_default()
        };
        let mut found = super::credentials::matching(&docker, image);
        if let Some(p) = &self.providers {
            found.extend(p.credentials(image).await);
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_is_checked_as_the_kubelet_checks_it_every_error_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        std::fs::write(bin.join("ecr"), "").unwrap();
        let config = dir.path().join("c.yaml");
        std::fs::write(
            &config,
            "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n\
             - name: ecr\n  matchImages: [\"*.dkr.ecr.*.amazonaws.com\"]\n  defaultCacheDuration: 12h\n  apiVersion: credentialprovider.kubelet.k8s.io/v1\n  args: [get-credentials]\n  env: [{name: AWS_PROFILE, value: temp}]\n",
        )
        .unwrap();
        let providers = load(&config, &bin).unwrap();
        assert_eq!(providers.len(), 1);
        assert_eq!(
            providers[0].default_cache_duration,
            Duration::from_secs(12 * 3600)
        );
        assert_eq!(
            providers[0].env,
            [("AWS_PROFILE".to_owned(), "temp".to_owned())]
        );

        std::fs::write(
            &config,
            "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n\
             - name: missing\n  matchImages: []\n  apiVersion: credentialprovider.kubelet.k8s.io/v9\n",
        )
        .unwrap();
        let errors = load(&config, &bin).unwrap_err();
        for want in [
            "at least 1 item in matchImages",
            "defaultCacheDuration is required",
            "apiVersion must be one of",
            "plugin binary executable",
        ] {
            assert!(
                errors.iter().any(|e| e.contains(want)),
                "{want}: {errors:#?}"
            );
        }
    }
}
