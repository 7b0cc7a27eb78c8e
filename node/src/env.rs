//! A container's environment and the expansion of `$(VAR)` references, by the
//! kubelet's rules (`makeEnvironmentVariables` and the forked `expansion` package).
//!
//! - `envFrom` first, in order (ConfigMaps and Secrets, with `prefix`; keys that are not
//!   valid variable names are skipped and reported), then `env` in order; a later
//!   definition of a name replaces an earlier one.
//! - `value` is expanded against the variables defined before it; `valueFrom` values
//!   are not expanded.
//! - `command` and `args` are expanded against the final environment.
//! - `$(VAR)` of an undefined variable stays as written; `$$` is a literal `$`.
//! - A missing, non-optional reference is an error: the container is not started
//!   (`CreateContainerConfigError`) rather than started with a wrong value.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{
    ConfigMap, Container, PersistentVolume, PersistentVolumeClaim, Pod, Secret, Service,
};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::quantity;

/// Expands `$(NAME)` in `input` with `lookup`, as Kubernetes does.
pub fn expand(input: &str, lookup: &dyn Fn(&str) -> Option<String>) -> String {
    let bytes = input.as_bytes();
    let mut out = String::with_capacity(input.len());
    let mut checkpoint = 0;
    let mut cursor = 0;
    while cursor < bytes.len() {
        if bytes[cursor] == b'$' && cursor + 1 < bytes.len() {
            out.push_str(&input[checkpoint..cursor]);
            let rest = &input[cursor + 1..];
            let advance = match rest.as_bytes()[0] {
                b'$' => {
                    out.push('$');
                    1
                }
                b'(' => match rest.find(')') {
                    Some(close) => {
                        let name = &rest[1..close];
                        match lookup(name) {
                            Some(v) => out.push_str(&v),
                            None => {
                                out.push_str("$(");
                                out.push_str(name);
                                out.push(')');
                            }
                        }
                        close + 1
                    }
                    None => {
                        out.push_str("$(");
                        1
                    }
                },
                _ => {
                    // `$` before anything else is literal, with the next character.
                    let ch = rest.chars().next().unwrap_or_default();
                    out.push('$');
                    out.push(ch);
                    ch.len_utf8()
                }
            };
            cursor += advance + 1;
            checkpoint = cursor;
        } else {
            cursor += 1;
        }
    }
    out.push_str(&input[checkpoint.min(input.len())..]);
    out
}

/// An ordered environment: later definitions replace earlier ones in place.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Env {
    vars: Vec<(String, String)>,
    index: HashMap<String, usize>,
}

impl Env {
    pub fn set(&mut self, name: String, value: String) {
        match self.index.get(&name) {
            Some(&i) => self.vars[i].1 = value,
            None => {
                self.index.insert(name.clone(), self.vars.len());
                self.vars.push((name, value));
            }
        }
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.index.get(name).map(|&i| self.vars[i].1.as_str())
    }

    pub fn into_vec(self) -> Vec<(String, String)> {
        self.vars
    }

    pub fn vars(&self) -> &[(String, String)] {
        &self.vars
    }
}

/// Whether `name` is a valid environment variable name (`IsEnvVarName`): letters,
/// digits, `_`, `-`, `.`, not starting with a digit.
pub fn is_env_var_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// The ConfigMaps and Secrets a container's environment names, fetched before the
/// environment is made. `None` for an object that does not exist.
#[derive(Clone, Debug, Default)]
pub struct Objects {
    pub config_maps: BTreeMap<String, Option<ConfigMap>>,
    pub secrets: BTreeMap<String, Option<Secret>>,
}

/// The names of the ConfigMaps and Secrets a container's environment refers to.
pub fn references(c: &Container) -> (Vec<String>, Vec<String>) {
    let mut cms = Vec::new();
    let mut secrets = Vec::new();
    for from in c.env_from.iter().flatten() {
        if let Some(r) = &from.config_map_ref {
            cms.push(r.name.clone());
        }
        if let Some(r) = &from.secret_ref {
            secrets.push(r.name.clone());
        }
    }
    for var in c.env.iter().flatten() {
        let Some(from) = &var.value_from else {
            continue;
        };
        if let Some(r) = &from.config_map_key_ref {
            cms.push(r.name.clone());
        }
        if let Some(r) = &from.secret_key_ref {
            secrets.push(r.name.clone());
        }
    }
    cms.sort();
    cms.dedup();
    secrets.sort();
    secrets.dedup();
    (cms, secrets)
}

/// Reads the ConfigMaps and Secrets environments name (the API server's, for a node
/// in a cluster). `Ok(None)` when the object does not exist.
#[async_trait::async_trait]
pub trait ObjectSource: Send + Sync {
    async fn config_map(&self, namespace: &str, name: &str) -> Result<Option<ConfigMap>, String>;
    async fn secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>, String>;
    /// Every Service in the cluster, for [`service_env`]; an error until they were
    /// read once.
    async fn services(&self) -> Result<std::sync::Arc<[Service]>, String>;
    /// A token of the pod's service account bound to the pod (TokenRequest), for a
    /// projected `serviceAccountToken` volume source: the token and when it expires.
    async fn service_account_token(
        &self,
        pod: &Pod,
        audiences: Vec<String>,
        expiration_seconds: i64,
    ) -> Result<(String, jiff::Timestamp), String>;

    /// What a CSI volume is set up from: the claim, its bound volume, the driver's
    /// `CSIDriver` object and, for drivers that attach, the `VolumeAttachment`. A
    /// node without an API server has none of them.
    async fn persistent_volume_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<PersistentVolumeClaim>, String> {
        Err(format!(
            "PersistentVolumeClaim {namespace}/{name} cannot be read: this node has no API server"
        ))
    }

    async fn persistent_volume(&self, name: &str) -> Result<Option<PersistentVolume>, String> {
        Err(format!(
            "PersistentVolume {name} cannot be read: this node has no API server"
        ))
    }

    /// Merge-patches a claim's status (the node finishing a filesystem resize).
    async fn patch_claim_status(
        &self,
        namespace: &str,
        name: &str,
        _patch: serde_json::Value,
    ) -> Result<(), String> {
        Err(format!(
            "PersistentVolumeClaim {namespace}/{name} cannot be updated: this node has no API server"
        ))
    }

    async fn csi_driver(&self, name: &str) -> Result<Option<CSIDriver>, String> {
        Err(format!(
            "CSIDriver {name} cannot be read: this node has no API server"
        ))
    }

    async fn volume_attachment(&self, name: &str) -> Result<Option<VolumeAttachment>, String> {
        Err(format!(
            "VolumeAttachment {name} cannot be read: this node has no API server"
        ))
    }
}

/// A standalone node has no ConfigMaps or Secrets to read.
pub struct NoApiServer;

#[async_trait::async_trait]
impl ObjectSource for NoApiServer {
    async fn config_map(&self, namespace: &str, name: &str) -> Result<Option<ConfigMap>, String> {
        Err(format!(
            "ConfigMap {namespace}/{name} cannot be read: this node has no API server"
        ))
    }

    async fn secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>, String> {
        Err(format!(
            "Secret {namespace}/{name} cannot be read: this node has no API server"
        ))
    }

    /// No services: a standalone kubelet sets no service variables either.
    async fn services(&self) -> Result<std::sync::Arc<[Service]>, String> {
        Ok(std::sync::Arc::from([]))
    }

    async fn service_account_token(
        &self,
        pod: &Pod,
        _audiences: Vec<String>,
        _expiration_seconds: i64,
    ) -> Result<(String, jiff::Timestamp), String> {
        Err(format!(
            "a token for service account {:?} cannot be requested: this node has no API server",
            pod.spec
                .as_ref()
                .and_then(|s| s.service_account_name.as_deref())
                .unwrap_or("default")
        ))
    }
}

/// The services whose variables a pod in `namespace` gets, as the kubelet chooses
/// them: the master service `kubernetes` of the `default` namespace always (unless the
/// pod's own namespace has one of that name and links are enabled), and with
/// `enableServiceLinks` every service of the pod's namespace; only services with a
/// cluster IP (not headless).
pub fn service_env(
    services: &[Service],
    namespace: &str,
    enable_service_links: bool,
) -> Vec<(String, String)> {
    let mut chosen: BTreeMap<&str, &Service> = BTreeMap::new();
    for svc in services {
        let ip = svc
            .spec
            .as_ref()
            .and_then(|s| s.cluster_ip.as_deref())
            .unwrap_or("");
        if ip.is_empty() || ip == "None" {
            continue;
        }
        let name = svc.metadata.name.as_deref().unwrap_or("");
        let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
        if ns == "default" && name == "kubernetes" {
            chosen.entry(name).or_insert(svc);
        } else if ns == namespace && enable_service_links {
            chosen.insert(name, svc);
        }
    }
    let mut out = Vec::new();
    for (name, svc) in chosen {
        let spec = svc.spec.as_ref().expect("services with an IP have a spec");
        let ip = spec.cluster_ip.clone().unwrap_or_default();
        let ports = spec.ports.as_deref().unwrap_or_default();
        let prefix = name.replace('-', "_").to_uppercase();
        out.push((format!("{prefix}_SERVICE_HOST"), ip.clone()));
        if let Some(first) = ports.first() {
            out.push((format!("{prefix}_SERVICE_PORT"), first.port.to_string()));
        }
        for p in ports {
            if let Some(port_name) = p.name.as_deref().filter(|n| !n.is_empty()) {
                out.push((
                    format!(
                        "{prefix}_SERVICE_PORT_{}",
                        port_name.replace('-', "_").to_uppercase()
                    ),
                    p.port.to_string(),
                ));
            }
        }
        // Docker link variables.
        let host_port = |port: i32| {
            if ip.contains(':') {
                format!("[{ip}]:{port}")
            } else {
                format!("{ip}:{port}")
            }
        };
        for (i, p) in ports.iter().enumerate() {
            let protocol = p
                .protocol
                .as_deref()
                .filter(|p| !p.is_empty())
                .unwrap_or("TCP");
            let url = format!("{}://{}", protocol.to_lowercase(), host_port(p.port));
            if i == 0 {
                out.push((format!("{prefix}_PORT"), url.clone()));
            }
            let port_prefix = format!("{prefix}_PORT_{}_{}", p.port, protocol.to_uppercase());
            out.push((port_prefix.clone(), url));
            out.push((format!("{port_prefix}_PROTO"), protocol.to_lowercase()));
            out.push((format!("{port_prefix}_PORT"), p.port.to_string()));
            out.push((format!("{port_prefix}_ADDR"), ip.clone()));
        }
    }
    out
}

/// What the environment is made from besides the pod.
pub struct Context<'a> {
    pub host_ips: &'a [String],
    pub pod_ips: &'a [String],
    /// The node's allocatable resources: the value of a `resourceFieldRef` to a limit
    /// the container does not set.
    pub allocatable: &'a BTreeMap<String, Quantity>,
    pub objects: &'a Objects,
    /// The service variables ([`service_env`]): available to `$(VAR)` after the
    /// container's own, and added where the container defines no variable of the name.
    pub services: &'a [(String, String)],
}

/// The environment of `c` and the `envFrom` keys skipped for not being variable names.
pub fn make_env(pod: &Pod, c: &Container, ctx: &Context<'_>) -> Result<(Env, Vec<String>), String> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut env = Env::default();
    let mut invalid = Vec::new();
    for from in c.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let mut data: Vec<(String, String)> = Vec::new();
        if let Some(r) = &from.config_map_ref {
            match ctx.objects.config_maps.get(&r.name).cloned().flatten() {
                Some(cm) => data.extend(cm.data.unwrap_or_default()),
                None if r.optional == Some(true) => continue,
                None => return Err(format!("configmap {:?} not found", r.name)),
            }
        }
        if let Some(r) = &from.secret_ref {
            match ctx.objects.secrets.get(&r.name).cloned().flatten() {
                Some(s) => data.extend(
                    s.data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned())),
                ),
                None if r.optional == Some(true) => continue,
                None => return Err(format!("secret {:?} not found", r.name)),
            }
        }
        for (k, v) in data {
            let name = format!("{prefix}{k}");
            if is_env_var_name(&name) {
                env.set(name, v);
            } else {
                invalid.push(name);
            }
        }
    }
    for var in c.env.iter().flatten() {
        let value = match (&var.value, &var.value_from) {
            (Some(v), _) if !v.is_empty() => {
                let defined = env.clone();
                expand(v, &|name| {
                    defined.get(name).map(str::to_owned).or_else(|| {
                        ctx.services
                            .iter()
                            .find(|(k, _)| k == name)
                            .map(|(_, v)| v.clone())
                    })
                })
            }
            (_, Some(from)) => {
                if let Some(f) = &from.field_ref {
                    field_value(pod, &f.field_path, ctx)
                        .map_err(|e| format!("env {:?}: {e}", var.name))?
                } else if let Some(r) = &from.resource_field_ref {
                    let container = r
                        .container_name
                        .as_deref()
                        .filter(|n| !n.is_empty())
                        .unwrap_or(&c.name);
                    resource_value(pod, container, &r.resource, r.divisor.as_ref(), ctx)
                        .map_err(|e| format!("env {:?}: {e}", var.name))?
                } else if let Some(r) = &from.config_map_key_ref {
                    let optional = r.optional == Some(true);
                    match ctx.objects.config_maps.get(&r.name).cloned().flatten() {
                        None if optional => continue,
                        None => return Err(format!("configmap {:?} not found", r.name)),
                        Some(cm) => match cm.data.unwrap_or_default().get(&r.key) {
                            Some(v) => v.clone(),
                            None if optional => continue,
                            None => {
                                return Err(format!(
                                    "couldn't find key {} in ConfigMap {ns}/{}",
                                    r.key, r.name
                                ));
                            }
                        },
                    }
                } else if let Some(r) = &from.secret_key_ref {
                    let optional = r.optional == Some(true);
                    match ctx.objects.secrets.get(&r.name).cloned().flatten() {
                        None if optional => continue,
                        None => return Err(format!("secret {:?} not found", r.name)),
                        Some(s) => match s.data.unwrap_or_default().get(&r.key) {
                            Some(v) => String::from_utf8_lossy(&v.0).into_owned(),
                            None if optional => continue,
                            None => {
                                return Err(format!(
                                    "couldn't find key {} in Secret {ns}/{}",
                                    r.key, r.name
                                ));
                            }
                        },
                    }
                } else {
                    String::new()
                }
            }
            _ => String::new(),
        };
        env.set(var.name.clone(), value);
    }
    for (name, value) in ctx.services {
        if env.get(name).is_none() {
            env.set(name.clone(), value.clone());
        }
    }
    Ok((env, invalid))
}

/// `command` and `args` with `$(VAR)` expanded against the container's environment.
pub fn expand_command(c: &Container, env: &Env) -> (Vec<String>, Vec<String>) {
    let lookup = |name: &str| env.get(name).map(str::to_owned);
    let ex = |list: &Option<Vec<String>>| -> Vec<String> {
        list.iter().flatten().map(|s| expand(s, &lookup)).collect()
    };
    (ex(&c.command), ex(&c.args))
}

fn annotation_list(map: &BTreeMap<String, String>) -> String {
    map.iter()
        .map(|(k, v)| format!("{k}={}", serde_json::to_string(v).unwrap_or_default()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The value of a downward-API `fieldRef`.
pub fn field_value(pod: &Pod, path: &str, ctx: &Context<'_>) -> Result<String, String> {
    let spec = pod.spec.clone().unwrap_or_default();
    let meta = &pod.metadata;
    let subscript = |prefix: &str| -> Option<String> {
        let rest = path.strip_prefix(prefix)?.strip_prefix("['")?;
        Some(rest.strip_suffix("']")?.to_owned())
    };
    Ok(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "metadata.labels" => annotation_list(&meta.labels.clone().unwrap_or_default()),
        "metadata.annotations" => annotation_list(&meta.annotations.clone().unwrap_or_default()),
        "spec.nodeName" => spec.node_name.unwrap_or_default(),
        "spec.serviceAccountName" => spec.service_account_name.unwrap_or_default(),
        "status.hostIP" => ctx.host_ips.first().cloned().unwrap_or_default(),
        "status.hostIPs" => ctx.host_ips.join(","),
        "status.podIP" => ctx.pod_ips.first().cloned().unwrap_or_default(),
        "status.podIPs" => ctx.pod_ips.join(","),
        _ => {
            if let Some(k) = subscript("metadata.labels") {
                meta.labels
                    .as_ref()
                    .and_then(|l| l.get(&k).cloned())
                    .unwrap_or_default()
            } else if let Some(k) = subscript("metadata.annotations") {
                meta.annotations
                    .as_ref()
                    .and_then(|a| a.get(&k).cloned())
                    .unwrap_or_default()
            } else {
                return Err(format!("unsupported fieldPath: {path}"));
            }
        }
    })
}

/// The value of a `resourceFieldRef`: the container's limit (the node's allocatable
/// when it sets none) or request, divided by `divisor` and rounded up.
pub fn resource_value(
    pod: &Pod,
    container: &str,
    resource: &str,
    divisor: Option<&Quantity>,
    ctx: &Context<'_>,
) -> Result<String, String> {
    let spec = pod.spec.clone().unwrap_or_default();
    let c = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == container)
        .ok_or_else(|| format!("no container {container:?} in the pod"))?;
    let resources = c.resources.clone().unwrap_or_default();
    let (kind, name) = resource
        .split_once('.')
        .ok_or_else(|| format!("unsupported container resource: {resource}"))?;
    let value = match kind {
        "limits" => resources
            .limits
            .as_ref()
            .and_then(|l| l.get(name))
            .or_else(|| ctx.allocatable.get(name))
            .cloned(),
        "requests" => resources
            .requests
            .as_ref()
            .and_then(|r| r.get(name))
            .cloned(),
        _ => return Err(format!("unsupported container resource: {resource}")),
    };
    if !matches!(name, "cpu" | "memory" | "ephemeral-storage") && !name.starts_with("hugepages-") {
        return Err(format!("unsupported container resource: {resource}"));
    }
    let value = match value {
        Some(q) => quantity::parse(&q).map_err(|e| format!("{resource}: {e}"))?,
        None => 0.0,
    };
    let divisor = match divisor {
        Some(d) => quantity::parse(d).map_err(|e| format!("divisor: {e}"))?,
        None => 1.0,
    };
    if divisor <= 0.0 {
        return Err(format!("divisor of {resource} must be positive"));
    }
    // In milli-units for cpu, as the kubelet's MilliValue arithmetic; whole units else.
    let n = if name == "cpu" {
        ((value * 1000.0).round() / (divisor * 1000.0).round()).ceil()
    } else {
        (value.round() / divisor.round().max(1.0)).ceil()
    };
    Ok(format!("{}", n as i64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::{
        ConfigMapEnvSource, ConfigMapKeySelector, EnvFromSource, EnvVar, EnvVarSource,
        ObjectFieldSelector, ResourceFieldSelector, ResourceRequirements, SecretKeySelector,
    };

    fn map(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn expansion_follows_the_kubernetes_rules() {
        let vars = map(&[("A", "a"), ("B", "b"), ("EMPTY", "")]);
        let cases = [
            ("$(A)", "a"),
            ("x$(A)y$(B)z", "xaybz"),
            ("$(MISSING)", "$(MISSING)"),
            ("$$(A)", "$(A)"),
            ("$$$(A)", "$a"),
            ("$$", "$"),
            ("$", "$"),
            ("a$", "a$"),
            ("$(A", "$(A"),
            ("$A", "$A"),
            ("$(EMPTY)x", "x"),
            ("$()", "$()"),
            ("($(A))", "(a)"),
            ("$(A)$(B)", "ab"),
            ("ünï$(A)cødé", "ünïacødé"),
            ("$ü", "$ü"),
        ];
        for (input, want) in cases {
            assert_eq!(expand(input, &vars), want, "{input:?}");
        }
    }

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "p", "namespace": "ns", "uid": "u-1",
                "labels": {"app": "web", "tier": "edge"},
                "annotations": {"note": "hi \"there\""},
            },
            "spec": {
                "nodeName": "n1",
                "serviceAccountName": "sa",
                "containers": [{
                    "name": "c",
                    "resources": {
                        "limits": {"memory": "64Mi"},
                        "requests": {"cpu": "250m", "memory": "32Mi"},
                    },
                }],
            },
        }))
        .unwrap()
    }

    fn objects() -> Objects {
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "cfg"},
            "data": {"color": "blue", "size": "L", "bad key": "x"},
        }))
        .unwrap();
        let mut secret = Secret::default();
        secret.metadata.name = Some("creds".into());
        secret.data = Some(BTreeMap::from([(
            "password".to_owned(),
            ByteString(b"s3cret".to_vec()),
        )]));
        Objects {
            config_maps: BTreeMap::from([("cfg".to_owned(), Some(cm)), ("gone".to_owned(), None)]),
            secrets: BTreeMap::from([("creds".to_owned(), Some(secret))]),
        }
    }

    fn field(path: &str) -> Option<EnvVarSource> {
        Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                api_version: None,
            }),
            ..Default::default()
        })
    }

    fn var(name: &str, value: Option<&str>, from: Option<EnvVarSource>) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: value.map(str::to_owned),
            value_from: from,
        }
    }

    fn run(c: Container) -> Result<(Env, Vec<String>), String> {
        let objects = objects();
        let allocatable = BTreeMap::from([
            ("cpu".to_owned(), Quantity("2".into())),
            ("memory".to_owned(), Quantity("1Gi".into())),
        ]);
        let host_ips = ["10.0.0.1".to_owned(), "fd00::1".to_owned()];
        let pod_ips = ["10.88.0.5".to_owned()];
        let ctx = Context {
            host_ips: &host_ips,
            pod_ips: &pod_ips,
            allocatable: &allocatable,
            objects: &objects,
            services: &[],
        };
        let mut p = pod();
        p.spec.as_mut().unwrap().containers[0].env = c.env.clone();
        make_env(&p, &c, &ctx)
    }

    fn container(env: Vec<EnvVar>, env_from: Vec<EnvFromSource>) -> Container {
        let mut c = pod().spec.unwrap().containers[0].clone();
        c.env = Some(env);
        c.env_from = Some(env_from);
        c
    }

    #[test]
    fn field_refs_give_the_downward_api_values() {
        let (env, _) = run(container(
            vec![
                var("NAME", None, field("metadata.name")),
                var("NS", None, field("metadata.namespace")),
                var("UID", None, field("metadata.uid")),
                var("APP", None, field("metadata.labels['app']")),
                var("NOTE", None, field("metadata.annotations['note']")),
                var("NODE", None, field("spec.nodeName")),
                var("SA", None, field("spec.serviceAccountName")),
                var("HOST", None, field("status.hostIP")),
                var("HOSTS", None, field("status.hostIPs")),
                var("IP", None, field("status.podIP")),
                var("IPS", None, field("status.podIPs")),
                var("LABELS", None, field("metadata.labels")),
            ],
            vec![],
        ))
        .unwrap();
        let got: Vec<(&str, &str)> = env
            .vars()
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("NAME", "p"),
                ("NS", "ns"),
                ("UID", "u-1"),
                ("APP", "web"),
                ("NOTE", "hi \"there\""),
                ("NODE", "n1"),
                ("SA", "sa"),
                ("HOST", "10.0.0.1"),
                ("HOSTS", "10.0.0.1,fd00::1"),
                ("IP", "10.88.0.5"),
                ("IPS", "10.88.0.5"),
                ("LABELS", "app=\"web\"\ntier=\"edge\""),
            ]
        );
        let err = run(container(vec![var("X", None, field("spec.bogus"))], vec![])).unwrap_err();
        assert_eq!(err, "env \"X\": unsupported fieldPath: spec.bogus");
    }

    #[test]
    fn resource_refs_divide_and_round_up_and_default_limits_to_allocatable() {
        let res = |resource: &str, divisor: Option<&str>| {
            var(
                "V",
                None,
                Some(EnvVarSource {
                    resource_field_ref: Some(ResourceFieldSelector {
                        container_name: None,
                        resource: resource.into(),
                        divisor: divisor.map(|d| Quantity(d.into())),
                    }),
                    ..Default::default()
                }),
            )
        };
        let value = |resource: &str, divisor: Option<&str>| {
            run(container(vec![res(resource, divisor)], vec![]))
                .map(|(e, _)| e.get("V").unwrap().to_owned())
        };
        assert_eq!(value("limits.memory", None).unwrap(), "67108864");
        assert_eq!(value("limits.memory", Some("1Mi")).unwrap(), "64");
        assert_eq!(
            value("requests.memory", Some("1Gi")).unwrap(),
            "1",
            "rounded up"
        );
        assert_eq!(
            value("requests.cpu", None).unwrap(),
            "1",
            "250m rounds up to 1"
        );
        assert_eq!(value("requests.cpu", Some("1m")).unwrap(), "250");
        assert_eq!(
            value("limits.cpu", None).unwrap(),
            "2",
            "the node's allocatable"
        );
        assert!(value("limits.gpu", None).is_err());
        let _ = ResourceRequirements::default();
    }

    #[test]
    fn config_maps_and_secrets_with_optional_and_env_from_with_prefix() {
        let key = |name: &str, cm: &str, key: &str, optional: Option<bool>| {
            var(
                name,
                None,
                Some(EnvVarSource {
                    config_map_key_ref: Some(ConfigMapKeySelector {
                        name: cm.into(),
                        key: key.into(),
                        optional,
                    }),
                    ..Default::default()
                }),
            )
        };
        let secret = var(
            "PW",
            None,
            Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: "creds".into(),
                    key: "password".into(),
                    optional: None,
                }),
                ..Default::default()
            }),
        );
        let from = EnvFromSource {
            config_map_ref: Some(ConfigMapEnvSource {
                name: "cfg".into(),
                optional: None,
            }),
            prefix: Some("CFG_".into()),
            secret_ref: None,
        };
        let (env, invalid) = run(container(
            vec![
                key("COLOR", "cfg", "color", None),
                key("MAYBE", "cfg", "nope", Some(true)),
                key("ABSENT", "gone", "x", Some(true)),
                secret,
                var("CFG_SIZE", Some("override-$(COLOR)"), None),
            ],
            vec![from],
        ))
        .unwrap();
        assert_eq!(env.get("COLOR"), Some("blue"));
        assert_eq!(env.get("PW"), Some("s3cret"));
        assert_eq!(env.get("CFG_color"), Some("blue"));
        assert_eq!(
            env.get("CFG_SIZE"),
            Some("override-blue"),
            "env wins over envFrom"
        );
        assert_eq!(env.get("MAYBE"), None);
        assert_eq!(env.get("ABSENT"), None);
        assert_eq!(invalid, ["CFG_bad key"]);

        let missing_key = run(container(vec![key("X", "cfg", "nope", None)], vec![])).unwrap_err();
        assert_eq!(missing_key, "couldn't find key nope in ConfigMap ns/cfg");
        let missing_cm = run(container(vec![key("X", "gone", "x", None)], vec![])).unwrap_err();
        assert_eq!(missing_cm, "configmap \"gone\" not found");
    }

    #[test]
    fn values_expand_against_earlier_variables_only_and_commands_against_all() {
        let mut c = container(
            vec![
                var("LATER_REF", Some("$(B)"), None),
                var("A", Some("a"), None),
                var("B", Some("$(A)-b"), None),
                var("ESC", Some("$$(A)"), None),
                var("FROM", None, field("metadata.name")),
            ],
            vec![],
        );
        c.command = Some(vec!["/bin/$(FROM)".into(), "$(NOPE)".into()]);
        c.args = Some(vec!["--b=$(B)".into(), "$$(B)".into()]);
        let (env, _) = run(c.clone()).unwrap();
        assert_eq!(env.get("LATER_REF"), Some("$(B)"), "B was not defined yet");
        assert_eq!(env.get("B"), Some("a-b"));
        assert_eq!(env.get("ESC"), Some("$(A)"));
        let (command, args) = expand_command(&c, &env);
        assert_eq!(command, ["/bin/p", "$(NOPE)"]);
        assert_eq!(args, ["--b=a-b", "$(B)"]);
    }

    #[test]
    fn env_var_names() {
        for ok in ["A", "a_b", "A-B", "a.b", "_x"] {
            assert!(is_env_var_name(ok), "{ok}");
        }
        for bad in ["", "1A", "a b", "a=b", "ä"] {
            assert!(!is_env_var_name(bad), "{bad}");
        }
    }

    fn service(ns: &str, name: &str, ip: &str, ports: serde_json::Value) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"clusterIP": ip, "ports": ports},
        }))
        .unwrap()
    }

    fn services() -> Vec<Service> {
        vec![
            service(
                "default",
                "kubernetes",
                "10.96.0.1",
                serde_json::json!([{"name": "https", "port": 443}]),
            ),
            service(
                "ns",
                "redis-primary",
                "10.0.0.11",
                serde_json::json!([{"port": 6379}, {"name": "metrics-port", "port": 9121, "protocol": "UDP"}]),
            ),
            service("ns", "headless", "None", serde_json::json!([{"port": 80}])),
            service(
                "other",
                "elsewhere",
                "10.0.0.12",
                serde_json::json!([{"port": 80}]),
            ),
        ]
    }

    #[test]
    fn service_variables_follow_the_kubelet_and_docker_link_names() {
        let env: BTreeMap<String, String> =
            service_env(&services(), "ns", true).into_iter().collect();
        let want: BTreeMap<String, String> = [
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("KUBERNETES_SERVICE_PORT_HTTPS", "443"),
            ("KUBERNETES_PORT", "tcp://10.96.0.1:443"),
            ("KUBERNETES_PORT_443_TCP", "tcp://10.96.0.1:443"),
            ("KUBERNETES_PORT_443_TCP_PROTO", "tcp"),
            ("KUBERNETES_PORT_443_TCP_PORT", "443"),
            ("KUBERNETES_PORT_443_TCP_ADDR", "10.96.0.1"),
            ("REDIS_PRIMARY_SERVICE_HOST", "10.0.0.11"),
            ("REDIS_PRIMARY_SERVICE_PORT", "6379"),
            ("REDIS_PRIMARY_SERVICE_PORT_METRICS_PORT", "9121"),
            ("REDIS_PRIMARY_PORT", "tcp://10.0.0.11:6379"),
            ("REDIS_PRIMARY_PORT_6379_TCP", "tcp://10.0.0.11:6379"),
            ("REDIS_PRIMARY_PORT_6379_TCP_PROTO", "tcp"),
            ("REDIS_PRIMARY_PORT_6379_TCP_PORT", "6379"),
            ("REDIS_PRIMARY_PORT_6379_TCP_ADDR", "10.0.0.11"),
            ("REDIS_PRIMARY_PORT_9121_UDP", "udp://10.0.0.11:9121"),
            ("REDIS_PRIMARY_PORT_9121_UDP_PROTO", "udp"),
            ("REDIS_PRIMARY_PORT_9121_UDP_PORT", "9121"),
            ("REDIS_PRIMARY_PORT_9121_UDP_ADDR", "10.0.0.11"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(env, want);
    }

    #[test]
    fn without_service_links_only_the_master_service_is_seen() {
        let names: Vec<String> = service_env(&services(), "ns", false)
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert!(
            names.iter().all(|n| n.starts_with("KUBERNETES_")),
            "{names:?}"
        );
        assert!(names.contains(&"KUBERNETES_SERVICE_HOST".to_owned()));
        // A `kubernetes` service of the pod's own namespace wins when links are on.
        let mut own = services();
        own.push(service(
            "ns",
            "kubernetes",
            "10.0.0.99",
            serde_json::json!([{"port": 8443}]),
        ));
        let env: BTreeMap<String, String> = service_env(&own, "ns", true).into_iter().collect();
        assert_eq!(env["KUBERNETES_SERVICE_HOST"], "10.0.0.99");
        // IPv6 cluster IPs are bracketed in URLs.
        let v6 = [service(
            "ns",
            "v6",
            "fd00::10",
            serde_json::json!([{"port": 80}]),
        )];
        let env: BTreeMap<String, String> = service_env(&v6, "ns", true).into_iter().collect();
        assert_eq!(env["V6_PORT"], "tcp://[fd00::10]:80");
    }

    #[test]
    fn service_variables_expand_in_values_and_never_replace_the_containers_own() {
        let objects = objects();
        let allocatable = BTreeMap::new();
        let svc = service_env(&services(), "ns", true);
        let ctx = Context {
            host_ips: &[],
            pod_ips: &[],
            allocatable: &allocatable,
            objects: &objects,
            services: &svc,
        };
        let mut c = container(
            vec![
                var(
                    "URL",
                    Some("redis://$(REDIS_PRIMARY_SERVICE_HOST):6379"),
                    None,
                ),
                var("KUBERNETES_SERVICE_HOST", Some("mine"), None),
            ],
            vec![],
        );
        c.command = Some(vec!["$(KUBERNETES_PORT)".into()]);
        let mut p = pod();
        p.spec.as_mut().unwrap().containers[0] = c.clone();
        let (env, _) = make_env(&p, &c, &ctx).unwrap();
        assert_eq!(env.get("URL"), Some("redis://10.0.0.11:6379"));
        assert_eq!(env.get("KUBERNETES_SERVICE_HOST"), Some("mine"));
        assert_eq!(env.get("REDIS_PRIMARY_SERVICE_PORT"), Some("6379"));
        let (command, _) = expand_command(&c, &env);
        assert_eq!(command, ["tcp://10.96.0.1:443"]);
    }
}
