//! Image garbage collection, the kubelet's `realImageGCManager`, for every runtime:
//! the CRI runtime's images (through `RemoveImage`) and the Wasm image store (whose
//! removal takes the compile cache's artifacts with it).
//!
//! Each runtime's images are tracked by id: when first detected, when last used (a
//! container of any state refers to it), their size. Every `imageGCPeriod` (5 m) a
//! pass looks at the filesystem each runtime keeps its images on: at
//! `imageGCHighThresholdPercent` (85) or more used, it frees
//! `capacity × (100 − imageGCLowThresholdPercent) / 100 − available`, least recently
//! used first, never an image a container refers to, a pinned one (the sandbox
//! image) or one detected less than `imageMinimumGCAge` (2 m) ago. With
//! `imageMaximumGCAge` set, unused images older than it go whatever the disk. The
//! eviction manager asks for every unused image to go ([`ImageGc::delete_unused`])
//! before it evicts a pod for disk pressure.

pub mod credentials;
pub mod providers;
pub mod puller;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use wasmlet_runtime::Runtime;

use crate::router::RuntimeRouter;

/// The kubelet's image GC settings.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageGcPolicy {
    /// `imageGCHighThresholdPercent` (85; 100 turns threshold GC off).
    pub high_threshold_percent: u8,
    /// `imageGCLowThresholdPercent` (80).
    pub low_threshold_percent: u8,
    /// `imageMinimumGCAge` (2 m).
    pub min_age: Duration,
    /// `imageMaximumGCAge` (zero: off).
    pub max_age: Duration,
    /// How often a pass runs (the kubelet's fixed `ImageGCPeriod`, 5 m;
    /// `wasmlet.imageGCPeriod` shortens it for tests).
    pub period: Duration,
}

impl Default for ImageGcPolicy {
    fn default() -> Self {
        ImageGcPolicy {
            high_threshold_percent: 85,
            low_threshold_percent: 80,
            min_age: Duration::from_secs(120),
            max_age: Duration::ZERO,
            period: Duration::from_secs(300),
        }
    }
}

impl ImageGcPolicy {
    /// The kubelet's validation.
    pub fn check(&self) -> Result<(), String> {
        if self.high_threshold_percent > 100 {
            return Err(format!(
                "imageGCHighThresholdPercent: {} is not between 0 and 100",
                self.high_threshold_percent
            ));
        }
        if self.low_threshold_percent >= self.high_threshold_percent {
            return Err(format!(
                "imageGCLowThresholdPercent ({}) must be less than imageGCHighThresholdPercent ({})",
                self.low_threshold_percent, self.high_threshold_percent
            ));
        }
        if !self.max_age.is_zero() && self.max_age <= self.min_age {
            return Err(format!(
                "imageMaximumGCAge ({:?}) must be greater than imageMinimumGCAge ({:?})",
                self.max_age, self.min_age
            ));
        }
        Ok(())
    }

    /// What a pass must free of a filesystem of `capacity` with `available` bytes
    /// left: nothing below the high threshold, else down to the low one.
    pub fn amount_to_free(&self, capacity: u64, available: u64) -> u64 {
        if capacity == 0 || self.high_threshold_percent >= 100 {
            return 0;
        }
        let used_percent = 100 - (available.min(capacity) * 100 / capacity);
        if used_percent < u64::from(self.high_threshold_percent) {
            return 0;
        }
        (capacity * (100 - u64::from(self.low_threshold_percent)) / 100).saturating_sub(available)
    }
}

/// What the manager knows of one image.
#[derive(Clone, Debug)]
struct Record {
    first_detected: Instant,
    /// `None`: never seen in use (such images go first, as the kubelet's zero time).
    last_used: Option<Instant>,
    size: u64,
    in_use: bool,
    pinned: bool,
}

/// The image garbage collector of every runtime of the node.
pub struct ImageGc {
    policy: ImageGcPolicy,
    router: RuntimeRouter,
    /// By runtime name, then image id.
    records: Mutex<HashMap<String, HashMap<String, Record>>>,
}

impl ImageGc {
    pub fn new(policy: ImageGcPolicy, router: RuntimeRouter) -> Self {
        ImageGc {
            policy,
            router,
            records: Mutex::new(HashMap::new()),
        }
    }

    /// Passes every period until cancelled (the first right away, to detect what
    /// the node has).
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(self.policy.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            if let Err(e) = self.garbage_collect().await {
                tracing::warn!("image garbage collection: {e}");
            }
        }
    }

    /// Brings the records of `runtime`'s images up to date at `now`.
    async fn detect(&self, runtime: &dyn Runtime, now: Instant) -> Result<(), String> {
        let images = runtime
            .list_images()
            .await
            .map_err(|e| format!("listing {}'s images: {e}", runtime.name()))?;
        let containers = runtime
            .list_containers()
            .await
            .map_err(|e| format!("listing {}'s containers: {e}", runtime.name()))?;
        let used: HashSet<&str> = containers
            .iter()
            .flat_map(|c| [c.image.as_str(), c.image_ref.as_str()])
            .collect();
        let in_use: Vec<&str> = images
            .iter()
            .filter(|i| {
                std::iter::once(&i.id)
                    .chain(&i.repo_tags)
                    .chain(&i.repo_digests)
                    .any(|name| used.contains(name.as_str()))
            })
            .map(|i| i.repo_tags.first().unwrap_or(&i.id).as_str())
            .collect();
        tracing::debug!(
            runtime = runtime.name(),
            images = images.len(),
            ?in_use,
            "image garbage collection: detected"
        );
        let mut all = self.records.lock().unwrap();
        let records = all.entry(runtime.name().to_owned()).or_default();
        let present: HashSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
        records.retain(|id, _| present.contains(id.as_str()));
        for image in &images {
            let in_use = std::iter::once(&image.id)
                .chain(&image.repo_tags)
                .chain(&image.repo_digests)
                .any(|name| used.contains(name.as_str()));
            let r = records.entry(image.id.clone()).or_insert(Record {
                first_detected: now,
                last_used: None,
                size: image.size,
                in_use,
                pinned: image.pinned,
            });
            r.size = image.size;
            r.in_use = in_use;
            r.pinned = image.pinned;
            if in_use {
                r.last_used = Some(now);
            }
        }
        Ok(())
    }

    /// Removes `runtime`'s images that may go, least recently used first, until
    /// `amount` bytes are freed (`None`: every one): the bytes freed. An image may
    /// go once it is unused, unpinned, detected at least `min_age` before
    /// `now`, and (with `older_than`) unused for longer than that.
    async fn free(
        &self,
        runtime: &dyn Runtime,
        amount: Option<u64>,
        now: Instant,
        older_than: Option<Duration>,
    ) -> u64 {
        let mut candidates: Vec<(String, Record)> = {
            let all = self.records.lock().unwrap();
            all.get(runtime.name())
                .into_iter()
                .flatten()
                .filter(|(_, r)| {
                    !r.in_use
                        && !r.pinned
                        && now.saturating_duration_since(r.first_detected) >= self.policy.min_age
                        && older_than.is_none_or(|age| {
                            let since = r.last_used.unwrap_or(r.first_detected);
                            now.saturating_duration_since(since) > age
                        })
                })
                .map(|(id, r)| (id.clone(), r.clone()))
                .collect()
        };
        candidates.sort_by_key(|(_, r)| (r.last_used, r.first_detected));
        let mut freed = 0;
        for (id, record) in candidates {
            if amount.is_some_and(|a| freed >= a) {
                break;
            }
            match runtime.remove_image(&id).await {
                Ok(()) => {
                    tracing::info!(runtime = runtime.name(), image = %id, size = record.size, "image garbage collection: removed an image");
                    freed += record.size;
                    if let Some(r) = self.records.lock().unwrap().get_mut(runtime.name()) {
                        r.remove(&id);
                    }
                }
                Err(e) => {
                    tracing::warn!(runtime = runtime.name(), image = %id, "image garbage collection: removing an image: {e}")
                }
            }
        }
        freed
    }

    /// One pass over every runtime (the kubelet's `GarbageCollect`).
    pub async fn garbage_collect(&self) -> Result<(), String> {
        let now = Instant::now();
        let mut problems = Vec::new();
        for runtime in self.router.runtimes() {
            if let Err(e) = self.detect(&*runtime, now).await {
                problems.push(e);
                continue;
            }
            if !self.policy.max_age.is_zero() {
                self.free(&*runtime, None, now, Some(self.policy.max_age))
                    .await;
            }
            let Some((capacity, available)) = image_fs(&*runtime).await else {
                continue;
            };
            let amount = self.policy.amount_to_free(capacity, available);
            if amount == 0 {
                continue;
            }
            tracing::info!(
                runtime = runtime.name(),
                amount,
                "image garbage collection: disk usage is over the high threshold"
            );
            let freed = self.free(&*runtime, Some(amount), now, None).await;
            if freed < amount {
                problems.push(format!(
                    "{}: Failed to garbage collect required amount of images. Attempted to free {amount} bytes, but only found {freed} bytes eligible to free.",
                    runtime.name()
                ));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }

    /// Every image that may go, of every runtime (the kubelet's
    /// `DeleteUnusedImages`): bytes freed.
    pub async fn delete_unused(&self) -> u64 {
        self.delete_unused_on(None).await
    }

    /// [`Self::delete_unused`] for the runtimes whose images are on the filesystem
    /// `on` is on (every runtime with `None`), for the eviction manager's reclaim of
    /// that filesystem: images elsewhere would free nothing there.
    pub async fn delete_unused_on(&self, on: Option<&std::path::Path>) -> u64 {
        use std::os::unix::fs::MetadataExt as _;
        let device = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.dev()).ok();
        let target = on.map(device);
        let now = Instant::now();
        let mut freed = 0;
        for runtime in self.router.runtimes() {
            if let Some(target) = target {
                let mountpoint = runtime
                    .image_fs_info()
                    .await
                    .ok()
                    .and_then(|u| u.into_iter().next())
                    .map(|u| u.mountpoint);
                if mountpoint.as_deref().and_then(device) != target || target.is_none() {
                    continue;
                }
            }
            if let Err(e) = self.detect(&*runtime, now).await {
                tracing::warn!("image garbage collection: {e}");
                continue;
            }
            freed += self.free(&*runtime, None, now, None).await;
        }
        freed
    }
}

/// The capacity and available bytes of the filesystem `runtime` keeps its images on.
async fn image_fs(runtime: &dyn Runtime) -> Option<(u64, u64)> {
    let usage = runtime.image_fs_info().await.ok()?;
    let mountpoint = usage.into_iter().next()?.mountpoint;
    let fs = crate::machine::fs_stats(&mountpoint).ok()?;
    Some((fs.capacity_bytes, fs.available_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_amount_to_free_is_the_kubelets() {
        let p = ImageGcPolicy::default();
        // 100 GB disk: 84 % used frees nothing, 90 % frees down to 80 %.
        assert_eq!(p.amount_to_free(100_000, 16_000), 0);
        assert_eq!(p.amount_to_free(100_000, 15_000), 5_000);
        assert_eq!(p.amount_to_free(100_000, 10_000), 10_000);
        let off = ImageGcPolicy {
            high_threshold_percent: 100,
            ..p.clone()
        };
        assert_eq!(off.amount_to_free(100_000, 0), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn unused_images_go_least_recently_used_first_and_used_ones_stay() {
        use wasmlet_runtime::{ContainerConfig, ContainerMetadata, PodSandboxConfig};
        use wasmlet_testkit::fake_runtime::FakeRuntime;
        let fake = Arc::new(FakeRuntime::new());
        let runtime = fake.clone().into_dyn();
        let router = RuntimeRouter::new(
            Default::default(),
            [(String::new(), runtime.clone())].into(),
            "",
        );
        let gc = ImageGc::new(
            ImageGcPolicy {
                min_age: Duration::from_secs(5),
                ..Default::default()
            },
            router,
        );
        let sandbox = runtime
            .run_pod_sandbox(&PodSandboxConfig::default())
            .await
            .unwrap();
        let run = |image: &'static str| {
            let runtime = runtime.clone();
            let sandbox = sandbox.clone();
            async move {
                let config = ContainerConfig {
                    metadata: ContainerMetadata {
                        name: image.replace(':', "-"),
                        attempt: 0,
                    },
                    image: image.into(),
                    ..Default::default()
                };
                runtime
                    .create_container(&sandbox, &config, &PodSandboxConfig::default())
                    .await
                    .unwrap()
            }
        };
        let present = |r: &str| fake.images().contains(&r.to_owned());
        for r in ["old:1", "mid:1", "new:1", "busy:1"] {
            fake.add_image(r);
        }
        // "old" used until 10 s, "new" until 20 s, "busy" all along, "mid" never.
        let old = run("old:1").await;
        let new = run("new:1").await;
        let _busy = run("busy:1").await;
        let t0 = Instant::now();
        gc.detect(&*runtime, t0).await.unwrap();
        tokio::time::advance(Duration::from_secs(10)).await;
        gc.detect(&*runtime, Instant::now()).await.unwrap();
        runtime.remove_container(&old).await.unwrap();
        tokio::time::advance(Duration::from_secs(10)).await;
        gc.detect(&*runtime, Instant::now()).await.unwrap();
        runtime.remove_container(&new).await.unwrap();
        gc.detect(&*runtime, Instant::now()).await.unwrap();

        // Two images' worth: "mid" (never used: first) and "old"
        // (10 s) go; "new" and the busy one stay.
        let freed = gc.free(&*runtime, Some(2048), Instant::now(), None).await;
        assert_eq!(freed, 2048);
        let left: Vec<String> = fake.images();
        assert!(
            left.contains(&"new:1".to_owned()) && left.contains(&"busy:1".to_owned()),
            "{left:?}"
        );
        assert!(!present("old:1") && !present("mid:1"), "{left:?}");
        // Everything unused goes, never the busy one; an image detected just now
        // waits out the minimum age.
        fake.add_image("fresh:1");
        assert_eq!(gc.delete_unused().await, 1024, "only new:1");
        assert!(present("busy:1") && !present("new:1"));
        assert!(present("fresh:1"), "younger than imageMinimumGCAge");
    }

    #[test]
    fn the_thresholds_are_checked() {
        assert!(ImageGcPolicy::default().check().is_ok());
        let bad = ImageGcPolicy {
            low_threshold_percent: 90,
            ..Default::default()
        };
        assert_eq!(
            bad.check().unwrap_err(),
            "imageGCLowThresholdPercent (90) must be less than imageGCHighThresholdPercent (85)"
        );
    }
}
