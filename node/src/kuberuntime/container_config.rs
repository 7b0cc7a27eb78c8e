//! A container's configuration for the runtime: its environment, mounts (the
//! termination message file among them), resources, labels and annotations.

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{Container, Pod};
use wasmlet_runtime::{ContainerConfig, ContainerMetadata, ContainerResources};

use crate::cluster::events::WARNING;
use crate::pod::{spec_grace_seconds, uid};
use crate::pod_state::{SandboxRecord, labels};
use crate::podspec;
use crate::quantity;
use crate::sync::{PodSyncer, container_hash};

impl PodSyncer {
    /// A container's cgroup resources from its spec: CPU shares from the request,
    /// CFS quota from the limit (as `cpuCFSQuota` and `cpuCFSQuotaPeriod` say), the
    /// memory limit, and its oom_score_adj. Given at create, and again in place when a
    /// running container's resources change.
    pub(crate) fn container_resources(
        &self,
        pod: &Pod,
        c: &Container,
    ) -> Result<ContainerResources, String> {
        let (cpu_shares, quota) =
            podspec::cpu_resources(c).map_err(|e| format!("resources: {e}"))?;
        // `cpuCFSQuota: false` sets no quota; `cpuCFSQuotaPeriod` is the period.
        let (cpu_quota, cpu_period) = match (quota, self.cgroups.as_ref().map(|cm| cm.config())) {
            (Some(_), Some(cfg)) if !cfg.cpu_cfs_quota => (None, None),
            (Some(_), Some(cfg)) => {
                let limit = podspec::milli_cpu_limit(c).unwrap_or(0);
                let period = cfg.cpu_cfs_quota_period_us;
                (
                    Some(podspec::milli_cpu_to_quota(limit, period)),
                    Some(period),
                )
            }
            (q, _) => (q.map(|(q, _)| q), q.map(|(_, p)| p)),
        };
        let memory_limit_bytes = c
            .resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get("memory"))
            .map(quantity::bytes)
            .transpose()
            .map_err(|e| format!("resources.limits.memory: {e}"))?;
        Ok(ContainerResources {
            cpu_shares: Some(cpu_shares),
            cpu_quota,
            cpu_period,
            memory_limit_bytes,
            oom_score_adj: self.oom_score_adj(pod, c),
            cpuset_cpus: self
                .cpus
                .as_ref()
                .map(|m| m.cpuset(crate::pod::uid(pod), &c.name).to_string()),
        })
    }

    /// The container's environment: ConfigMaps and Secrets it names are read first,
    /// and the services' variables come from the watched Services.
    pub(crate) async fn container_env(
        &self,
        pod: &Pod,
        c: &Container,
        sandbox: &SandboxRecord,
    ) -> Result<crate::env::Env, String> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let (config_maps, secrets) = crate::env::references(c);
        let mut objects = crate::env::Objects::default();
        for name in config_maps {
            let cm = self.objects.config_map(ns, &name).await?;
            objects.config_maps.insert(name, cm);
        }
        for name in secrets {
            let secret = self.objects.secret(ns, &name).await?;
            objects.secrets.insert(name, secret);
        }
        let links = pod
            .spec
            .as_ref()
            .and_then(|s| s.enable_service_links)
            .unwrap_or(true);
        let services = crate::env::service_env(&self.objects.services().await?, ns, links);
        let pod_ips: Vec<String> = sandbox.ip.iter().cloned().collect();
        let ctx = crate::env::Context {
            host_ips: &self.host_ips,
            pod_ips: &pod_ips,
            allocatable: &self.allocatable,
            objects: &objects,
            services: &services,
        };
        let (env, invalid) = crate::env::make_env(pod, c, &ctx)?;
        if !invalid.is_empty() {
            self.events.pod(
                pod,
                Some(&c.name),
                WARNING,
                "InvalidEnvironmentVariableNames",
                format!(
                    "Keys [{}] from the EnvFrom configMap or secret were skipped since they are invalid environment variable names.",
                    invalid.join(", ")
                ),
            );
        }
        Ok(env)
    }

    /// The mount of a container attempt's termination message file: the file itself
    /// at `terminationMessagePath` for containers, its directory at the path's
    /// directory for Wasm guests (WASI preopens directories).
    pub(crate) fn termination_mount(
        &self,
        pod: &Pod,
        c: &Container,
        attempt: u32,
        directories_only: bool,
    ) -> Result<Option<wasmlet_runtime::Mount>, String> {
        let Some(file) = self.termination_file(pod, c, attempt) else {
            return Ok(None);
        };
        let path = c
            .termination_message_path
            .clone()
            .unwrap_or_else(|| "/dev/termination-log".into());
        let dir = file
            .parent()
            .expect("the file is in a directory")
            .to_owned();
        let create = || -> std::io::Result<()> {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::create_dir_all(&dir)?;
            std::fs::write(&file, b"")?;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666))?;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))
        };
        create().map_err(|e| {
            format!(
                "creating the termination message file {}: {e}",
                file.display()
            )
        })?;
        Ok(Some(if directories_only {
            wasmlet_runtime::Mount {
                container_path: std::path::Path::new(&path)
                    .parent()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| "/".into()),
                host_path: dir,
                readonly: false,
            }
        } else {
            wasmlet_runtime::Mount {
                container_path: path,
                host_path: file,
                readonly: false,
            }
        }))
    }

    pub(crate) fn container_config(
        &self,
        pod: &Pod,
        c: &Container,
        attempt: u32,
        env: crate::env::Env,
        volumes: &[(String, crate::volumes::HostVolume)],
        directories_only: bool,
    ) -> Result<ContainerConfig, String> {
        let (command, args) = crate::env::expand_command(c, &env);
        // subPathExpr: a variable that is missing or empty is an error (the kubelet's
        // ExpandContainerVolumeMounts), never a mount of the whole volume.
        let expand_sub_path = |s: &str| -> Result<String, String> {
            let missing = std::cell::RefCell::new(std::collections::BTreeSet::new());
            let expanded = crate::env::expand(s, &|name| {
                let value = env.get(name).unwrap_or_default();
                if value.is_empty() {
                    missing.borrow_mut().insert(name.to_owned());
                }
                Some(value.to_owned())
            });
            let missing = missing.into_inner();
            if missing.is_empty() {
                Ok(expanded)
            } else {
                Err(format!(
                    "missing value for {}",
                    missing.into_iter().collect::<Vec<_>>().join(", ")
                ))
            }
        };
        let mut mounts =
            crate::volumes::container_mounts(c, volumes, &expand_sub_path, directories_only)?;
        mounts.extend(self.termination_mount(pod, c, attempt, directories_only)?);
        let env = env.into_vec();
        let spec = pod.spec.clone().unwrap_or_default();
        let resources = self.container_resources(pod, c)?;
        let mut labels = BTreeMap::new();
        labels.insert(
            labels::POD_NAME.into(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        labels.insert(
            labels::POD_NAMESPACE.into(),
            pod.metadata.namespace.clone().unwrap_or_default(),
        );
        labels.insert(labels::POD_UID.into(), uid(pod).to_owned());
        labels.insert(labels::CONTAINER_NAME.into(), c.name.clone());
        let mut annotations = BTreeMap::new();
        annotations.insert(labels::CONTAINER_HASH.into(), container_hash(c));
        annotations.insert(labels::CONTAINER_RESTART_COUNT.into(), attempt.to_string());
        annotations.insert(
            labels::CONTAINER_TERMINATION_MESSAGE_PATH.into(),
            c.termination_message_path.clone().unwrap_or_default(),
        );
        annotations.insert(
            labels::CONTAINER_TERMINATION_MESSAGE_POLICY.into(),
            c.termination_message_policy.clone().unwrap_or_default(),
        );
        let grace = spec_grace_seconds(pod);
        annotations.insert(
            labels::POD_TERMINATION_GRACE_PERIOD.into(),
            grace.to_string(),
        );
        Ok(ContainerConfig {
            metadata: ContainerMetadata {
                name: c.name.clone(),
                attempt,
            },
            image: c.image.clone().unwrap_or_default(),
            command,
            args,
            working_dir: c.working_dir.clone().filter(|w| !w.is_empty()),
            env,
            mounts,
            log_path: PathBuf::from(&c.name).join(format!("{attempt}.log")),
            labels,
            annotations,
            resources,
            devices: crate::volumes::container_devices(c, volumes, directories_only)?,
            cdi_devices: Vec::new(),
            security: podspec::container_security(&spec, c),
            stdin: c.stdin.unwrap_or(false),
            stdin_once: c.stdin_once.unwrap_or(false),
            tty: c.tty.unwrap_or(false),
            ports: c
                .ports
                .iter()
                .flatten()
                .filter(|p| p.protocol.as_deref().is_none_or(|proto| proto == "TCP"))
                .filter_map(|p| u16::try_from(p.container_port).ok())
                .collect(),
        })
    }
}
