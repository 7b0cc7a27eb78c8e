//! Volume stats: `NodeGetVolumeStats` of each published volume, for
//! `/stats/summary` and the `kubelet_volume_stats_*` metrics.

use super::*;

/// A published volume's usage as its driver reports it (`NodeGetVolumeStats`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeUsage {
    /// The pod's name for the volume.
    pub volume: String,
    /// `(namespace, claim)` of a claimed volume.
    pub claim: Option<(String, String)>,
    pub available_bytes: Option<u64>,
    pub capacity_bytes: Option<u64>,
    pub used_bytes: Option<u64>,
    pub inodes_free: Option<u64>,
    pub inodes: Option<u64>,
    pub inodes_used: Option<u64>,
}

/// How long a volume stats call may take: stats are read when asked for, and a
/// driver that hangs must not hang `/stats/summary`.
const STATS_TIMEOUT: Duration = Duration::from_secs(5);

impl CsiVolumes {
    /// The usage of the CSI volumes published for the pod `uid`, from drivers with
    /// `GET_VOLUME_STATS`; a volume whose driver cannot say is left out.
    pub async fn pod_stats(&self, uid: &str) -> Vec<VolumeUsage> {
        let mine: Vec<(PathBuf, Published)> = self
            .published
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, p)| p.pod_uid == uid)
            .map(|(t, p)| (t.clone(), p.clone()))
            .collect();
        let mut out = Vec::new();
        for (target, p) in mine {
            if let Some(u) = self.volume_stats(&target, &p).await {
                out.push(u);
            }
        }
        out.sort_by(|a, b| a.volume.cmp(&b.volume));
        out
    }

    /// The usage of every claimed volume, once per claim: the
    /// `kubelet_volume_stats_*` metrics.
    pub async fn claim_stats(&self) -> Vec<VolumeUsage> {
        let all: Vec<(PathBuf, Published)> = self
            .published
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, p)| p.claim.is_some())
            .map(|(t, p)| (t.clone(), p.clone()))
            .collect();
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for (target, p) in all {
            if !seen.insert(p.claim.clone()) {
                continue;
            }
            if let Some(u) = self.volume_stats(&target, &p).await {
                out.push(u);
            }
        }
        out.sort_by(|a, b| a.claim.cmp(&b.claim));
        out
    }

    async fn volume_stats(&self, target: &Path, p: &Published) -> Option<VolumeUsage> {
        if self.stats_period.is_zero() {
            return None;
        }
        if let Some((at, u)) = self.stats.lock().unwrap().get(target)
            && at.elapsed() < self.stats_period
        {
            return Some(u.clone());
        }
        let caps = self.capabilities(&p.driver).await.ok()?;
        if !caps.contains(&(csi::node_service_capability::rpc::Type::GetVolumeStats as i32)) {
            return None;
        }
        let mut client = self.client(&p.driver).ok()?;
        let mut request = tonic::Request::new(csi::NodeGetVolumeStatsRequest {
            volume_id: p.handle.clone(),
            volume_path: target.display().to_string(),
            staging_target_path: String::new(),
        });
        let limit = STATS_TIMEOUT.min(self.timeout);
        request.set_timeout(limit);
        let response =
            match tokio::time::timeout(limit, client.node_get_volume_stats(request)).await {
                Ok(Ok(r)) => r.into_inner(),
                Ok(Err(s)) => {
                    tracing::debug!(volume = %p.volume, "NodeGetVolumeStats: {}", s.message());
                    return None;
                }
                Err(_) => {
                    tracing::debug!(volume = %p.volume, "NodeGetVolumeStats timed out");
                    return None;
                }
            };
        let mut u = VolumeUsage {
            volume: p.volume.clone(),
            claim: p.claim.clone(),
            ..Default::default()
        };
        let n = |v: i64| u64::try_from(v).ok();
        for usage in &response.usage {
            use csi::volume_usage::Unit;
            match Unit::try_from(usage.unit) {
                Ok(Unit::Bytes) => {
                    (u.available_bytes, u.capacity_bytes, u.used_bytes) =
                        (n(usage.available), n(usage.total), n(usage.used));
                }
                Ok(Unit::Inodes) => {
                    (u.inodes_free, u.inodes, u.inodes_used) =
                        (n(usage.available), n(usage.total), n(usage.used));
                }
                _ => {
                    tracing::debug!(volume = %p.volume, unit = usage.unit, "a volume usage in an unknown unit")
                }
            }
        }
        if response.usage.is_empty() {
            return None;
        }
        self.stats
            .lock()
            .unwrap()
            .insert(target.to_owned(), (Instant::now(), u.clone()));
        Some(u)
    }
}
