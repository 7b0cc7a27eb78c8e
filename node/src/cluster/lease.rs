//! The node Lease: the heartbeat the node lifecycle controller watches.
//!
//! As the kubelet's lease controller: the Lease `kube-node-lease/<node>` is held by the
//! node for `nodeLeaseDurationSeconds` (40 s) and renewed every quarter of that
//! (10 s). A failed renewal is retried a few times with a short back-off; a lease that
//! cannot be read or created is retried with a back-off doubling to 7 s.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, PostParams};
use tokio_util::sync::CancellationToken;

use super::{NodeHandle, is_not_found};

/// The namespace node leases live in.
pub const NAMESPACE: &str = "kube-node-lease";
const MAX_UPDATE_RETRIES: u32 = 5;
const MAX_BACKOFF: Duration = Duration::from_secs(7);

/// Renews the node's lease until cancelled.
pub struct LeaseController {
    api: Api<Lease>,
    node_name: String,
    duration_seconds: i32,
    node: NodeHandle,
    latest: Option<Lease>,
}

fn now() -> MicroTime {
    MicroTime(jiff::Timestamp::now())
}

impl LeaseController {
    pub fn new(
        client: kube::Client,
        node_name: &str,
        duration_seconds: i32,
        node: NodeHandle,
    ) -> Self {
        LeaseController {
            api: Api::namespaced(client, NAMESPACE),
            node_name: node_name.to_owned(),
            duration_seconds,
            node,
            latest: None,
        }
    }

    /// The renew interval: a quarter of the lease's duration.
    pub fn renew_interval(&self) -> Duration {
        Duration::from_secs(u64::try_from(self.duration_seconds).unwrap_or(40)) / 4
    }

    fn spec(&self) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.node_name.clone()),
            lease_duration_seconds: Some(self.duration_seconds),
            renew_time: Some(now()),
            ..Default::default()
        }
    }

    /// Reads the lease, creating it when it does not exist.
    async fn ensure(&mut self) -> kube::Result<Lease> {
        match self.api.get(&self.node_name).await {
            Ok(lease) => Ok(lease),
            Err(e) if is_not_found(&e) => {
                let mut lease = Lease::default();
                lease.metadata.name = Some(self.node_name.clone());
                lease.metadata.namespace = Some(NAMESPACE.into());
                lease.metadata.owner_references = self.node.owner_reference().map(|o| vec![o]);
                lease.spec = Some(self.spec());
                let created = self.api.create(&PostParams::default(), &lease).await?;
                tracing::info!(lease = %self.node_name, "created the node lease");
                Ok(created)
            }
            Err(e) => Err(e),
        }
    }

    /// One renewal: the lease with a fresh renewTime (and the owner reference, once
    /// the node's UID is known), written with the resourceVersion last read.
    async fn renew(&mut self, base: Lease) -> kube::Result<Lease> {
        let mut lease = base;
        let mut spec = lease.spec.take().unwrap_or_default();
        spec.holder_identity = Some(self.node_name.clone());
        spec.lease_duration_seconds = Some(self.duration_seconds);
        spec.renew_time = Some(now());
        lease.spec = Some(spec);
        if lease
            .metadata
            .owner_references
            .as_ref()
            .is_none_or(|o| o.is_empty())
        {
            lease.metadata.owner_references = self.node.owner_reference().map(|o| vec![o]);
        }
        self.api
            .replace(&self.node_name, &PostParams::default(), &lease)
            .await
    }

    /// Runs one heartbeat: renews the lease, retrying an update a few times; on
    /// failure the next heartbeat reads the lease again. `Err` after every retry failed.
    pub async fn heartbeat(&mut self) -> Result<(), String> {
        let base = match self.latest.clone() {
            Some(l) => l,
            None => {
                let l = self
                    .ensure()
                    .await
                    .map_err(|e| format!("reading or creating the node lease: {e}"))?;
                self.latest = Some(l.clone());
                l
            }
        };
        let mut last_error = String::new();
        let mut base = base;
        for attempt in 0..MAX_UPDATE_RETRIES {
            match self.renew(base.clone()).await {
                Ok(l) => {
                    self.latest = Some(l);
                    return Ok(());
                }
                Err(e) => {
                    last_error = e.to_string();
                    tracing::debug!(attempt, "renewing the node lease: {e}");
                    // A conflict means our copy is stale: read it again.
                    if super::is_conflict(&e) || is_not_found(&e) {
                        match self.ensure().await {
                            Ok(l) => base = l,
                            Err(e) => last_error = e.to_string(),
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        self.latest = None;
        Err(format!(
            "failed {MAX_UPDATE_RETRIES} attempts to renew the node lease: {last_error}"
        ))
    }

    /// Heartbeats every [`Self::renew_interval`] until cancelled.
    pub async fn run(mut self, cancel: CancellationToken) {
        let interval = self.renew_interval();
        let mut backoff = Duration::from_millis(200);
        let mut failing = false;
        loop {
            let wait = match self.heartbeat().await {
                Ok(()) => {
                    if failing {
                        tracing::info!(lease = %self.node_name, "renewing the node lease again");
                    }
                    failing = false;
                    backoff = Duration::from_millis(200);
                    interval
                }
                Err(e) => {
                    if !failing {
                        tracing::error!(lease = %self.node_name, "{e}");
                    }
                    failing = true;
                    let wait = backoff.min(interval);
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    wait
                }
            };
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
}
