//! Per-key exponential back-off, the kubelet's `flowcontrol.Backoff` without jitter.
//!
//! A container that exits is restarted at once the first time; after that each
//! restart waits twice as long as the one before, up to a maximum. The back-off is
//! forgotten once an exit comes more than twice the maximum after the last restart
//! (10 minutes with the default 5-minute cap).

use std::collections::HashMap;
use std::time::Duration;

use jiff::Timestamp;

/// Back-off state for many keys.
#[derive(Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    entries: HashMap<String, Entry>,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    backoff: Duration,
    last_update: Timestamp,
}

fn since(later: Timestamp, earlier: Timestamp) -> Duration {
    let d = later.duration_since(earlier);
    d.try_into().unwrap_or(Duration::ZERO)
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max,
            entries: HashMap::new(),
        }
    }

    fn expired(&self, event_time: Timestamp, entry: &Entry) -> bool {
        since(event_time, entry.last_update) > self.max * 2
    }

    /// If `key` is still backing off from an event at `event_time`, how long is left.
    pub fn remaining(&self, key: &str, event_time: Timestamp, now: Timestamp) -> Option<Duration> {
        let entry = self.entries.get(key)?;
        if self.expired(event_time, entry) {
            return None;
        }
        let elapsed = since(now, event_time);
        entry.backoff.checked_sub(elapsed).filter(|d| !d.is_zero())
    }

    /// How long `key` still backs off counting from its last update (the kubelet's
    /// `IsInBackOffSinceUpdate`, used for image pulls).
    pub fn remaining_since_update(&self, key: &str, now: Timestamp) -> Option<Duration> {
        let entry = self.entries.get(key)?;
        entry
            .backoff
            .checked_sub(since(now, entry.last_update))
            .filter(|d| !d.is_zero())
    }

    /// Records a restart at `now` after an event at `event_time`: the next back-off
    /// doubles, or starts again from the initial delay if the last one has expired.
    pub fn next(&mut self, key: &str, event_time: Timestamp, now: Timestamp) {
        let backoff = match self.entries.get(key) {
            Some(e) if !self.expired(event_time, e) => (e.backoff * 2).min(self.max),
            _ => self.initial,
        };
        self.entries.insert(
            key.to_owned(),
            Entry {
                backoff,
                last_update: now,
            },
        );
    }

    /// The current back-off of `key`, if any.
    pub fn get(&self, key: &str) -> Option<Duration> {
        self.entries.get(key).map(|e| e.backoff)
    }

    /// Forgets keys not updated for twice the maximum.
    pub fn gc(&mut self, now: Timestamp) {
        let limit = self.max * 2;
        self.entries
            .retain(|_, e| since(now, e.last_update) <= limit);
    }

    /// Forgets every key starting with `prefix` (a pod that is gone).
    pub fn forget_prefix(&mut self, prefix: &str) {
        self.entries.retain(|k, _| !k.starts_with(prefix));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    #[test]
    fn doubles_from_ten_seconds_to_five_minutes() {
        let mut b = Backoff::new(Duration::from_secs(10), Duration::from_secs(300));
        // First exit: no back-off yet, restart at once.
        assert_eq!(b.remaining("c", t(0), t(0)), None);
        b.next("c", t(0), t(0));
        let mut now = 0;
        let mut seen = Vec::new();
        for _ in 0..8 {
            // The container runs for a second and exits again.
            let exit = now + 1;
            let wait = b.remaining("c", t(exit), t(exit)).unwrap();
            seen.push(wait.as_secs());
            now = exit + wait.as_secs() as i64;
            assert_eq!(
                b.remaining("c", t(exit), t(now)),
                None,
                "waited long enough"
            );
            b.next("c", t(exit), t(now));
        }
        assert_eq!(seen, [10, 20, 40, 80, 160, 300, 300, 300]);
    }

    #[test]
    fn resets_after_running_twice_the_maximum() {
        let mut b = Backoff::new(Duration::from_secs(10), Duration::from_secs(300));
        b.next("c", t(0), t(0));
        b.next("c", t(1), t(11));
        assert_eq!(b.get("c"), Some(Duration::from_secs(20)));
        // Exits 601 s after the last restart: stable again, back to 10 s.
        assert_eq!(b.remaining("c", t(612), t(612)), None);
        b.next("c", t(612), t(612));
        assert_eq!(b.get("c"), Some(Duration::from_secs(10)));
    }

    #[test]
    fn gc_and_forget() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(2));
        b.next("pod-a/c", t(0), t(0));
        b.next("pod-b/c", t(0), t(10));
        b.gc(t(5));
        assert!(b.get("pod-a/c").is_none());
        b.forget_prefix("pod-b/");
        assert!(b.get("pod-b/c").is_none());
    }
}
