//! The node API server (`:10250`): its TLS (the serving certificate made or read),
//! its guard (authentication and authorization, through the API server's reviews
//! when the node has one) and its router.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use anyhow::Context as _;

use super::Server;
use crate::config::AuthzMode;
use crate::config::NodeConfig;
use crate::router::RuntimeRouter;
use crate::server::ServerState;
use crate::server::auth::{Authenticator, KubeTokenReviewer, TokenReviewer};
use crate::server::authz::{Authorizer, Guard, KubeAccessReviewer, SubjectAccessReviewer};
use crate::server::node_api::{NodeApiState, router};
use crate::server::tls::{CertSlot, server_config, serving_pair};

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

/// The node API's server, or `None` when it is off (`port: 0`, or nothing could
/// authenticate: see `config/node_api.rs`). A serving certificate that cannot be
/// read or made is the node's end, as the kubelet's.
pub(super) fn server(
    config: &NodeConfig,
    router_of_runtimes: &RuntimeRouter,
    client: Option<&kube::Client>,
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
    let pair = serving_pair(&settings.tls, &config.node_name, &serving_ips(config))
        .context("the node API's serving certificate")?;
    let slot = CertSlot::new(pair).context("the node API's serving certificate")?;
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
    };
    Ok(Some(Server {
        name: "node API",
        addr: SocketAddr::new(config.address, config.port),
        router: router(state, guard),
        serving: "serving the node API over TLS (/containerLogs, /pods, /healthz, /metrics/probes)",
        tls: Some(Arc::new(tls)),
    }))
}
