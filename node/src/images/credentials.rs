//! Pull credentials from a pod's `imagePullSecrets`, as the kubelet's keyring reads
//! them: `kubernetes.io/dockerconfigjson` (`.dockerconfigjson`, `{"auths": {...}}`)
//! and `kubernetes.io/dockercfg` (`.dockercfg`, the entries themselves), each entry
//! keyed by a registry (`host[:port][/path]`, with or without a scheme; `*` matches one
//! label of a host) and matched against the image's registry and repository.

use std::collections::BTreeMap;

use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use wasmlet_runtime::AuthConfig;

pub const DOCKER_CONFIG_JSON: &str = "kubernetes.io/dockerconfigjson";
pub const DOCKER_CONFIG_JSON_KEY: &str = ".dockerconfigjson";
pub const DOCKER_CFG: &str = "kubernetes.io/dockercfg";
pub const DOCKER_CFG_KEY: &str = ".dockercfg";

/// Docker Hub's names; an image without a registry host is on it.
const DOCKER_HUB: &[&str] = &["docker.io", "index.docker.io", "registry-1.docker.io"];

#[derive(serde::Deserialize)]
struct DockerConfigJson {
    #[serde(default)]
    auths: BTreeMap<String, Entry>,
}

#[derive(serde::Deserialize, Default)]
struct Entry {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    auth: String,
}

/// One registry's credentials from a secret.
#[derive(Clone, Debug)]
pub struct Credential {
    /// The key it was stored under (`registry.example.com`, `*.example.com:5000/team`).
    pub key: String,
    pub auth: AuthConfig,
}

/// The entries of one pull secret; an error says what is wrong with it (never what
/// it holds).
pub fn from_secret(secret: &Secret) -> Result<Vec<Credential>, String> {
    let name = secret.metadata.name.as_deref().unwrap_or_default();
    let data = |key: &str| secret.data.as_ref().and_then(|d| d.get(key)).map(|b| &b.0);
    let entries: BTreeMap<String, Entry> = match secret.type_.as_deref() {
        Some(DOCKER_CONFIG_JSON) => {
            let raw = data(DOCKER_CONFIG_JSON_KEY)
                .ok_or_else(|| format!("pull secret {name} has no {DOCKER_CONFIG_JSON_KEY}"))?;
            serde_json::from_slice::<DockerConfigJson>(raw)
                .map_err(|e| {
                    format!(
                        "pull secret {name}: {DOCKER_CONFIG_JSON_KEY} is not a docker config ({})",
                        shape_of(&e)
                    )
                })?
                .auths
        }
        Some(DOCKER_CFG) => {
            let raw = data(DOCKER_CFG_KEY)
                .ok_or_else(|| format!("pull secret {name} has no {DOCKER_CFG_KEY}"))?;
            serde_json::from_slice(raw).map_err(|e| {
                format!(
                    "pull secret {name}: {DOCKER_CFG_KEY} is not a docker config ({})",
                    shape_of(&e)
                )
            })?
        }
        other => {
            return Err(format!(
                "pull secret {name} is of type {:?}, not {DOCKER_CONFIG_JSON} or {DOCKER_CFG}",
                other.unwrap_or("")
            ));
        }
    };
    let mut out = Vec::new();
    for (key, e) in entries {
        let (username, password) = if e.username.is_empty() && !e.auth.is_empty() {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(e.auth.trim())
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| {
                    format!("pull secret {name}: the auth of {key} is not base64 of user:password")
                })?;
            let (u, p) = decoded.split_once(':').ok_or_else(|| {
                format!("pull secret {name}: the auth of {key} is not base64 of user:password")
            })?;
            (u.to_owned(), p.to_owned())
        } else {
            (e.username, e.password)
        };
        out.push(Credential {
            auth: AuthConfig {
                username,
                password,
                // Left empty, as the kubelet leaves it: containerd checks a
                // non-empty one against the host as a URL, which `host:port` is not.
                ..Default::default()
            },
            key,
        });
    }
    Ok(out)
}

/// Where a secret's JSON is wrong, without serde's text (it may quote the value).
fn shape_of(e: &serde_json::Error) -> String {
    format!(
        "{:?} error at line {}, column {}",
        e.classify(),
        e.line(),
        e.column()
    )
}

/// A key or an image without its scheme and split into host and path.
fn host_and_path(s: &str) -> (String, String) {
    let s = s
        .strip_prefix("https://")
        .or_else(|| s.strip_prefix("http://"))
        .unwrap_or(s);
    let (host, path) = s.split_once('/').unwrap_or((s, ""));
    // `/v1/` and `/v2/` name the API, not a repository (the docker client's rule).
    let path = path.trim_end_matches('/');
    let path = ["v1", "v2"]
        .iter()
        .find_map(|v| {
            path.strip_prefix(v)
                .filter(|rest| rest.is_empty() || rest.starts_with('/'))
        })
        .map(|rest| rest.trim_start_matches('/'))
        .unwrap_or(path);
    (host.to_ascii_lowercase(), path.to_owned())
}

/// The registry host and repository path of an image reference.
fn image_location(image: &str) -> (String, String) {
    let name = image.split('@').next().unwrap_or(image);
    let (first, rest) = name.split_once('/').unwrap_or(("", name));
    let is_host = first.contains('.') || first.contains(':') || first == "localhost";
    let (host, repo) = if is_host {
        (first.to_ascii_lowercase(), rest)
    } else {
        ("docker.io".to_owned(), name)
    };
    // The tag goes; a port stays with the host.
    let repo = match repo.rsplit_once(':') {
        Some((r, tag)) if !tag.contains('/') => r,
        _ => repo,
    };
    (host, repo.to_owned())
}

/// Whether `pattern`'s host (labels may be `*`) matches `host`, ports included.
fn host_matches(pattern: &str, host: &str) -> bool {
    let split = |h: &str| -> (String, Option<String>) {
        match h.rsplit_once(':') {
            Some((name, port)) => (name.to_owned(), Some(port.to_owned())),
            None => (h.to_owned(), None),
        }
    };
    let ((p_name, p_port), (h_name, h_port)) = (split(pattern), split(host));
    if p_port != h_port {
        return false;
    }
    let (pl, hl): (Vec<&str>, Vec<&str>) =
        (p_name.split('.').collect(), h_name.split('.').collect());
    pl.len() == hl.len() && pl.iter().zip(&hl).all(|(p, h)| glob(p, h))
}

/// Go's `filepath.Match` for one host label: `*` any run of characters, `?` one, the
/// rest literal (a label has no `/`, so `*` is never stopped by one).
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(c) if *c == '?' || *c == t[ti] => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// Whether a key or `matchImages` pattern (`host[:port][/path]`, host labels may be
/// globs) covers `image`, as the kubelet's `URLsMatchStr`.
pub fn key_matches(key: &str, image: &str) -> bool {
    let (host, repo) = image_location(image);
    let (k_host, k_path) = host_and_path(key);
    let host_ok = host_matches(&k_host, &host)
        || (DOCKER_HUB.contains(&host.as_str()) && DOCKER_HUB.contains(&k_host.as_str()));
    host_ok && (k_path.is_empty() || repo == k_path || repo.starts_with(&format!("{k_path}/")))
}

/// An image's normalized repository, without tag or digest, as the kubelet sends it to
/// credential providers: `nginx:1.27` is `docker.io/library/nginx`.
pub fn repository_of(image: &str) -> String {
    let (host, repo) = image_location(image);
    if DOCKER_HUB.contains(&host.as_str()) && !repo.contains('/') {
        format!("docker.io/library/{repo}")
    } else {
        format!("{host}/{repo}")
    }
}

/// The registry (`host[:port]`) of a normalized repository.
pub fn registry_of(repository: &str) -> String {
    repository.split('/').next().unwrap_or_default().to_owned()
}

/// [`lookup`], for other modules' credentials.
pub fn matching(credentials: &[Credential], image: &str) -> Vec<AuthConfig> {
    lookup(credentials, image)
}

/// The node's own docker configuration, as the kubelet reads it: the first of
/// `config.json` in the root directory, the working directory, `$HOME/.docker` and
/// `/.docker` that exists and parses, else the first legacy `.dockercfg` in the root
/// directory, the working directory, `$HOME` and `/`. The file it came from, with its
/// entries; `None` when there is none.
pub fn node_docker_config(
    root_dir: &std::path::Path,
    home: Option<&std::path::Path>,
) -> Option<(std::path::PathBuf, Vec<Credential>)> {
    use std::path::PathBuf;
    let cwd = std::env::current_dir().ok();
    let dirs = |sub: &str| -> Vec<PathBuf> {
        let mut d = vec![root_dir.to_owned()];
        d.extend(cwd.clone());
        if let Some(h) = home {
            d.push(if sub.is_empty() {
                h.to_owned()
            } else {
                h.join(sub)
            });
        }
        d.push(PathBuf::from("/").join(sub));
        d
    };
    let json = dirs(".docker")
        .into_iter()
        .map(|d| (d.join("config.json"), true));
    let legacy = dirs("").into_iter().map(|d| (d.join(".dockercfg"), false));
    for (path, is_json) in json.chain(legacy) {
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        let entries: Option<BTreeMap<String, Entry>> = if is_json {
            serde_json::from_slice::<DockerConfigJson>(&bytes)
                .ok()
                .map(|c| c.auths)
        } else {
            serde_json::from_slice(&bytes).ok()
        };
        let Some(entries) = entries else {
            tracing::warn!(file = %path.display(), "the node's docker configuration does not parse; skipped");
            continue;
        };
        let credentials = entries
            .into_iter()
            .filter_map(|(key, e)| {
                Some(Credential {
                    auth: decode_entry(e)?,
                    key,
                })
            })
            .collect();
        return Some((path, credentials));
    }
    None
}

/// An entry's user and password: from `auth` (base64 of `user:password`) when it has
/// one, else its fields; `None` when `auth` does not decode.
fn decode_entry(e: Entry) -> Option<AuthConfig> {
    let (username, password) = if !e.auth.is_empty() {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(e.auth.trim())
            .ok()
            .and_then(|b| String::from_utf8(b).ok())?;
        let (u, p) = decoded.split_once(':')?;
        (u.to_owned(), p.to_owned())
    } else {
        (e.username, e.password)
    };
    Some(AuthConfig {
        username,
        password,
        ..Default::default()
    })
}

/// The credentials for `image`, best match first (the longest key), as the
/// kubelet's keyring orders them.
pub fn lookup(credentials: &[Credential], image: &str) -> Vec<AuthConfig> {
    let mut found: Vec<&Credential> = credentials
        .iter()
        .filter(|c| key_matches(&c.key, image))
        .collect();
    found.sort_by_key(|c| std::cmp::Reverse(c.key.len()));
    found.into_iter().map(|c| c.auth.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn secret(type_: &str, key: &str, body: serde_json::Value) -> Secret {
        Secret {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("regcred".into()),
                ..Default::default()
            },
            type_: Some(type_.into()),
            data: Some(
                [(
                    key.to_owned(),
                    ByteString(serde_json::to_vec(&body).unwrap()),
                )]
                .into(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn both_secret_types_and_the_auth_field_are_read() {
        let json = secret(
            DOCKER_CONFIG_JSON,
            DOCKER_CONFIG_JSON_KEY,
            serde_json::json!({"auths": {
                "registry.example.com:5000": {"auth": base64::engine::general_purpose::STANDARD.encode("me:p:w")},
                "https://index.docker.io/v1/": {"username": "hub", "password": "x"},
            }}),
        );
        let creds = from_secret(&json).unwrap();
        let found = lookup(&creds, "registry.example.com:5000/team/app:v1");
        assert_eq!(found.len(), 1);
        assert_eq!(
            (found[0].username.as_str(), found[0].password.as_str()),
            ("me", "p:w")
        );
        let hub = lookup(&creds, "nginx:1.27");
        assert_eq!(hub.len(), 1);
        assert_eq!(hub[0].username, "hub");
        assert!(
            lookup(&creds, "registry.example.com/team/app").is_empty(),
            "the port must match"
        );

        let cfg = secret(
            DOCKER_CFG,
            DOCKER_CFG_KEY,
            serde_json::json!({"*.example.org": {"username": "w", "password": "y"}}),
        );
        let creds = from_secret(&cfg).unwrap();
        assert_eq!(lookup(&creds, "eu.example.org/app@sha256:abc").len(), 1);
        assert!(
            lookup(&creds, "a.eu.example.org/app").is_empty(),
            "* is one label"
        );
    }

    #[test]
    fn a_longer_key_wins_and_paths_narrow_the_match() {
        let s = secret(
            DOCKER_CONFIG_JSON,
            DOCKER_CONFIG_JSON_KEY,
            serde_json::json!({"auths": {
                "reg.local": {"username": "any", "password": "1"},
                "reg.local/team": {"username": "team", "password": "2"},
            }}),
        );
        let creds = from_secret(&s).unwrap();
        let users = |image: &str| {
            lookup(&creds, image)
                .into_iter()
                .map(|a| a.username)
                .collect::<Vec<_>>()
        };
        assert_eq!(users("reg.local/team/app:1"), ["team", "any"]);
        assert_eq!(users("reg.local/teamwork/app"), ["any"]);
        let api_path = secret(
            DOCKER_CONFIG_JSON,
            DOCKER_CONFIG_JSON_KEY,
            serde_json::json!({"auths": {"https://reg.local:5000/v2/": {"username": "v2", "password": "3"}}}),
        );
        let creds = from_secret(&api_path).unwrap();
        assert_eq!(
            lookup(&creds, "reg.local:5000/any/app").len(),
            1,
            "/v2/ is no repository"
        );
    }

    #[test]
    fn host_labels_match_as_go_globs_and_images_normalize() {
        assert!(key_matches("app*.k8s.io", "app1.k8s.io/x"));
        assert!(!key_matches("app*.k8s.io", "web.k8s.io/x"));
        assert!(key_matches("*.*.registry.io", "a.b.registry.io/x"));
        assert!(!key_matches("*.io", "a.k8s.io/x"));
        assert!(key_matches(
            "registry.io:8080/path",
            "registry.io:8080/path/app:v1"
        ));
        assert!(!key_matches(
            "registry.io/path",
            "registry.io:8080/path/app"
        ));
        assert_eq!(repository_of("nginx:1.27"), "docker.io/library/nginx");
        assert_eq!(
            repository_of("reg.local:5000/team/app@sha256:ab"),
            "reg.local:5000/team/app"
        );
        assert_eq!(registry_of("reg.local:5000/team/app"), "reg.local:5000");
    }

    #[test]
    fn the_nodes_docker_config_is_the_first_that_parses() {
        let root = tempfile::tempdir().unwrap();
        let home = tempfile::tempdir().unwrap();
        assert!(node_docker_config(root.path(), Some(home.path())).is_none());
        std::fs::create_dir(home.path().join(".docker")).unwrap();
        let cfg = serde_json::json!({"auths": {"reg.local": {"auth": base64::engine::general_purpose::STANDARD.encode("u:p")}}});
        std::fs::write(
            home.path().join(".docker/config.json"),
            serde_json::to_vec(&cfg).unwrap(),
        )
        .unwrap();
        // One in the root dir that does not parse is skipped.
        std::fs::write(root.path().join("config.json"), "{").unwrap();
        let (file, creds) = node_docker_config(root.path(), Some(home.path())).unwrap();
        assert_eq!(file, home.path().join(".docker/config.json"));
        let found = lookup(&creds, "reg.local/app:1");
        assert_eq!(
            (found[0].username.as_str(), found[0].password.as_str()),
            ("u", "p")
        );
    }

    #[test]
    fn a_bad_secret_says_what_is_wrong_without_its_contents() {
        let mut s = secret(
            DOCKER_CONFIG_JSON,
            DOCKER_CONFIG_JSON_KEY,
            serde_json::json!({}),
        );
        s.data = Some(
            [(
                DOCKER_CONFIG_JSON_KEY.to_owned(),
                ByteString(b"{\"auths\": \"s3cret\"".to_vec()),
            )]
            .into(),
        );
        let err = from_secret(&s).unwrap_err();
        assert!(err.contains("regcred") && !err.contains("s3cret"), "{err}");
        let opaque = secret("Opaque", "x", serde_json::json!({}));
        assert!(from_secret(&opaque).unwrap_err().contains("Opaque"));
    }
}
