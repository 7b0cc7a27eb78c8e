//! How many image pulls run at once and how often one may start: the kubelet's
//! `serializeImagePulls` (one at a time, the default), `maxParallelImagePulls` (at most
//! that many when pulls are not serialized; unlimited when unset), and
//! `registryPullQPS`/`registryBurst`, one token bucket for the whole node (5 per
//! second, bursts of 10; 0 is unlimited). A pull that finds the bucket empty fails at
//! once with the kubelet's "pull QPS exceeded" and goes into the image back-off.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// The pull settings of `KubeletConfiguration`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PullSettings {
    pub serialize: bool,
    /// With `serialize` false: at most this many at once; `None` is unlimited.
    pub max_parallel: Option<usize>,
    /// Pulls per second; 0 is unlimited.
    pub qps: f64,
    pub burst: u32,
}

impl Default for PullSettings {
    fn default() -> Self {
        PullSettings {
            serialize: true,
            max_parallel: None,
            qps: 5.0,
            burst: 10,
        }
    }
}

impl PullSettings {
    /// The kubelet's validation of these fields.
    pub fn check(&self, errors: &mut Vec<String>) {
        if self.qps < 0.0 {
            errors.push(format!(
                "registryPullQPS (--registry-qps) {} must not be a negative number",
                self.qps
            ));
        }
        if let Some(n) = self.max_parallel {
            if n < 1 {
                errors.push(format!(
                    "maxParallelImagePulls {n} must be a positive number"
                ));
            } else if self.serialize && n > 1 {
                errors.push(
                    "maxParallelImagePulls cannot be larger than 1 unless SerializeImagePulls \
                     (--serialize-image-pulls) is set to false"
                        .into(),
                );
            }
        }
    }
}

/// A token bucket that refills at `qps` up to `burst` and never waits.
#[derive(Debug)]
struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    fn try_accept(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The node's pull limits, shared by every pod worker.
#[derive(Debug, Clone)]
pub struct PullLimits {
    slots: Option<Arc<Semaphore>>,
    bucket: Option<Arc<Mutex<TokenBucket>>>,
}

/// The refusal of a pull the token bucket had no token for.
pub const QPS_EXCEEDED: &str = "pull QPS exceeded";

impl PullLimits {
    pub fn new(s: PullSettings) -> Self {
        let slots = if s.serialize { Some(1) } else { s.max_parallel };
        PullLimits {
            slots: slots.map(|n| Arc::new(Semaphore::new(n))),
            bucket: (s.qps > 0.0).then(|| {
                Arc::new(Mutex::new(TokenBucket {
                    qps: s.qps,
                    burst: f64::from(s.burst.max(1)),
                    tokens: f64::from(s.burst.max(1)),
                    at: Instant::now(),
                }))
            }),
        }
    }

    /// Waits for a pull slot (the time spent is the "including waiting" of the
    /// kubelet's `Pulled` event), then takes a token, or refuses with
    /// [`QPS_EXCEEDED`].
    pub async fn admit(&self) -> Result<Option<OwnedSemaphorePermit>, &'static str> {
        let permit = match &self.slots {
            Some(s) => Some(
                s.clone()
                    .acquire_owned()
                    .await
                    .expect("the semaphore is never closed"),
            ),
            None => None,
        };
        if let Some(bucket) = &self.bucket
            && !bucket.lock().unwrap().try_accept(Instant::now())
        {
            return Err(QPS_EXCEEDED);
        }
        Ok(permit)
    }
}

/// A duration as the kubelet's event prints it (`Truncate(time.Millisecond)`).
pub fn event_duration(d: Duration) -> String {
    crate::duration::format(Duration::from_millis(d.as_millis() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_bucket_allows_a_burst_then_refills_at_the_rate() {
        let limits = PullLimits::new(PullSettings {
            serialize: false,
            max_parallel: None,
            qps: 2.0,
            burst: 3,
        });
        for _ in 0..3 {
            assert!(limits.admit().await.is_ok());
        }
        assert_eq!(limits.admit().await.err(), Some(QPS_EXCEEDED));
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(limits.admit().await.is_ok(), "one token after 1/qps");
        assert_eq!(limits.admit().await.err(), Some(QPS_EXCEEDED));
        let unlimited = PullLimits::new(PullSettings {
            qps: 0.0,
            serialize: false,
            ..Default::default()
        });
        for _ in 0..100 {
            assert!(unlimited.admit().await.is_ok());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn serialized_pulls_wait_for_each_other() {
        let limits = PullLimits::new(PullSettings::default());
        let first = limits.admit().await.unwrap();
        let second = tokio::spawn({
            let limits = limits.clone();
            async move { limits.admit().await.map(|_| ()) }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!second.is_finished(), "a second pull waits for the first");
        drop(first);
        second.await.unwrap().unwrap();
    }

    #[test]
    fn the_settings_are_checked_as_the_kubelet_checks_them() {
        let mut errors = Vec::new();
        PullSettings {
            max_parallel: Some(3),
            ..Default::default()
        }
        .check(&mut errors);
        PullSettings {
            serialize: false,
            max_parallel: Some(0),
            qps: -1.0,
            burst: 10,
        }
        .check(&mut errors);
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(errors[0].contains("cannot be larger than 1"));
    }

    #[test]
    fn event_durations_are_truncated_to_milliseconds() {
        assert_eq!(event_duration(Duration::from_micros(1_234_567)), "1.234s");
        assert_eq!(event_duration(Duration::from_micros(45_900)), "45ms");
    }
}
