//! The node API server (`:10250`): its TLS (the serving certificate made or read),
//! its guard (authentication and authorization, through the API server's reviews
//! when the node has one) and its router.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use anyhow::Context as _;

use super::Server;
use crate::cm::cgroup::CgroupManager;
use crate::config::AuthzMode;
use crate::config::NodeConfig;
use crate::router::RuntimeRouter;
use crate::server::ServerState;
use crate::server::auth::{Authenticator, KubeTokenReviewer, TokenReviewer};
use crate::server::authz::{Authorizer, Guard, KubeAccessReviewer, SubjectAccessReviewer};
use crate::server::node_api::{NodeApiState, router};
use crate::server::tls::{CertSlot, server_config, serving_pair};
use crate::stats::{PodCgroups, StatsConfig, StatsProvider};

/// The addresses the serving certificate names: the node's IPs (`--node-ip`), and
/// the bind address when it is a specific one.
fn serving_ips(config: &NodeConfig) -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = config
        .cluster
        .as_ref()
        .map(|c| c.node_ips.clone())
        .unwrap_or_default();
    if !config.address.is_unspecified() && !ips.contains(&config.address) {
        ips.push(config.address);
    }
    ips
}

/// Where the statistics are read: the cgroup hierarchy at `/sys/fs/cgroup` and the pod
/// cgroups the container manager makes (none with `cgroupsPerQOS: false`).
pub(super) fn stats_provider(
    config: &NodeConfig,
    container_manager: Option<&crate::cm::ContainerManager>,
) -> StatsProvider {
    let mount = std::path::PathBuf::from("/sys/fs/cgroup");
    let version = match container_manager {
        Some(cm) => Some(cm.cgroups().version()),
        None => {
            let driver = config
                .cgroups
                .as_ref()
                .map_or(crate::cm::cgroup::Driver::Cgroupfs, |c| c.driver);
            match CgroupManager::detect(&mount, driver) {
                Ok(h) => Some(h.version()),
                Err(e) => {
                    tracing::warn!("statistics without cgroups: {e}");
                    None
                }
            }
        }
    };
    StatsProvider::new(StatsConfig {
        node_name: config.node_name.clone(),
        root_dir: config.root_dir.clone(),
        pod_logs_dir: config.pod_logs_dir.clone(),
        volume_stats_agg_period: config.volume_stats_agg_period,
        proc: "/proc".into(),
        cgroup_mount: mount,
        cgroup_version: version,
        pod_cgroups: container_manager.map(PodCgroups::of),
    })
}

/// The node API's server, or `None` when it is off (`port: 0`, or nothing could
/// authenticate: see `config/node_api.rs`). A serving certificate that cannot be
/// read or made is the node's end, as the kubelet's.
pub(super) fn server(
    config: &NodeConfig,
    router_of_runtimes: &RuntimeRouter,
    client: Option<&kube::Client>,
    certificates: Option<(&crate::cluster::certificates::Rotations, &kube::Client)>,
    stats: Arc<StatsProvider>,
    base: ServerState,
) -> anyhow::Result<Option<Server>> {
    let settings = &config.node_api;
    if config.port == 0 {
        return Ok(None);
    }
    if !settings.can_authenticate() {
        tracing::warn!(
            port = config.port,
            "the node API is off: no client CA (authentication.x509.clientCAFile), no token webhook and no anonymous access, so no request could be authenticated"
        );
        return Ok(None);
    }
    // With serverTLSBootstrap the certificate comes only from kubelet-serving CSRs,
    // sent through the watch client (waiting for one is a watch): until one is issued
    // the slot is empty and handshakes fail, as the kubelet's.
    let serving_csrs = certificates.filter(|_| {
        config
            .cluster
            .as_ref()
            .is_some_and(|c| c.certificates.server_tls_bootstrap)
    });
    let slot = if serving_csrs.is_some() {
        CertSlot::empty()
    } else {
        let pair = serving_pair(&settings.tls, &config.node_name, &serving_ips(config))
            .context("the node API's serving certificate")?;
        CertSlot::new(pair).context("the node API's serving certificate")?
    };
    if let Some((rotations, watch)) = serving_csrs {
        rotations.push(serving_rotation(config, watch, &slot)?);
    }
    let tls = server_config(&settings.tls, slot).context("the node API's TLS settings")?;

    let tokens: Option<Arc<dyn TokenReviewer>> = client
        .filter(|_| settings.authn.webhook.is_some())
        .map(|c| Arc::new(KubeTokenReviewer::new(c.clone())) as Arc<dyn TokenReviewer>);
    let authenticator =
        Authenticator::new(settings.authn.clone(), tokens).context("node API authentication")?;
    let reviews: Option<Arc<dyn SubjectAccessReviewer>> = client
        .filter(|_| matches!(settings.authz, AuthzMode::Webhook { .. }))
        .map(|c| Arc::new(KubeAccessReviewer::new(c.clone())) as Arc<dyn SubjectAccessReviewer>);
    let authorizer = Authorizer::new(settings.authz, reviews).context("node API authorization")?;
    let guard = Arc::new(Guard::new(
        config.node_name.clone(),
        authenticator,
        authorizer,
        settings.fine_grained,
    ));
    let state = NodeApiState {
        base,
        router: router_of_runtimes.clone(),
        stats,
        configz: Arc::new(crate::server::configz::configz(config)),
        node_name: config.node_name.clone(),
        debugging_handlers: settings.debugging_handlers,
        streaming_idle_timeout: settings.streaming_idle_timeout,
        system_logs: settings
            .system_log_handler
            .then(|| crate::server::node_logs::NodeLogs {
                root: crate::server::node_logs::SYSTEM_LOG_DIR.into(),
            }),
    };
    Ok(Some(Server {
        name: "node API",
        addr: SocketAddr::new(config.address, config.port),
        router: router(state, guard),
        serving: "serving the node API over TLS (/containerLogs, /pods, /healthz, /metrics, /metrics/probes, /stats/summary, /metrics/resource, /metrics/cadvisor, /logs/, /exec, /attach, /portForward)",
        tls: Some(Arc::new(tls)),
    }))
}

/// `serverTLSBootstrap`: the serving certificate from `kubelet-serving` CSRs, kept in
/// `<cert-dir>/kubelet-server-current.pem` and rotated like the client certificate;
/// each issued pair replaces the slot's, so new handshakes present it. One issued
/// earlier and still valid is served at once; until the first is issued the slot is
/// empty and the node API completes no handshake (the kubelet has no certificate then
/// either; `tlsCertFile` and the self-signed pair are not used).
fn serving_rotation(
    config: &NodeConfig,
    client: &kube::Client,
    slot: &Arc<CertSlot>,
) -> anyhow::Result<crate::cluster::certificates::Rotation> {
    use crate::cluster::certificates::{Kind, Pair, Rotation, Store, Template};
    use crate::server::tls::ServingPair;
    let serving = |p: &Pair| ServingPair {
        chain: p.chain.clone(),
        key: p.key.clone_key(),
    };
    let store = Store::new(&config.node_api.tls.cert_dir, Kind::Serving);
    if let Ok(current) = store.current()
        && current.not_after > jiff::Timestamp::now()
    {
        slot.replace(serving(&current))
            .context("the issued serving certificate")?;
    }
    let slot = slot.clone();
    Ok(Rotation {
        template: Template::serving(&config.node_name, &config.node_name, &serving_ips(config)),
        store,
        client: client.clone(),
        initial: None,
        on_issued: Box::new(move |pair, _| {
            let swapped = slot.replace(serving(pair)).map_err(|e| e.to_string());
            Box::pin(std::future::ready(swapped))
        }),
    })
}
