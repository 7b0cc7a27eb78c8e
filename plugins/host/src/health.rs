//! A plugin's health: the state machine that disables a failing plugin with
//! exponential back-off and enables it again after a good call.

use std::time::Duration;

use tokio::time::Instant;

/// When repeated failures disable a plugin, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffPolicy {
    /// Consecutive failures that disable the plugin [default: 5].
    pub failure_threshold: u32,
    /// The first disable's length [default: 10 s].
    pub initial: Duration,
    /// The longest disable; each failed trial after a disable doubles it up to this
    /// [default: 5 min].
    pub max: Duration,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        BackoffPolicy {
            failure_threshold: 5,
            initial: Duration::from_secs(10),
            max: Duration::from_secs(300),
        }
    }
}

/// Where a plugin stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Health {
    /// Calls go through; `failures` consecutive failures so far.
    Enabled { failures: u32 },
    /// Calls are refused until `until`.
    Disabled {
        until: Instant,
        backoff: Duration,
        failures: u32,
    },
    /// The disable ran out: calls go through again; the next failure disables the
    /// plugin for twice as long, the next success enables it.
    Trial { backoff: Duration, failures: u32 },
}

/// A change the node hears about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transition {
    None,
    Disabled { backoff: Duration, failures: u32 },
    Enabled,
}

impl Default for Health {
    fn default() -> Self {
        Health::Enabled { failures: 0 }
    }
}

impl Health {
    /// Whether a call may start now; `Err((until, failures))` while disabled.
    pub(crate) fn admit(&mut self, now: Instant) -> Result<(), (Instant, u32)> {
        match *self {
            Health::Disabled {
                until,
                backoff,
                failures,
            } => {
                if now < until {
                    return Err((until, failures));
                }
                *self = Health::Trial { backoff, failures };
                Ok(())
            }
            Health::Enabled { .. } | Health::Trial { .. } => Ok(()),
        }
    }

    pub(crate) fn success(&mut self) -> Transition {
        let was = *self;
        *self = Health::Enabled { failures: 0 };
        match was {
            Health::Trial { .. } | Health::Disabled { .. } => Transition::Enabled,
            Health::Enabled { .. } => Transition::None,
        }
    }

    pub(crate) fn failure(&mut self, now: Instant, policy: &BackoffPolicy) -> Transition {
        let (backoff, failures) = match *self {
            Health::Enabled { failures } if failures + 1 >= policy.failure_threshold => {
                (policy.initial, failures + 1)
            }
            Health::Enabled { failures } => {
                *self = Health::Enabled {
                    failures: failures + 1,
                };
                return Transition::None;
            }
            Health::Trial { backoff, failures } => {
                ((backoff * 2).min(policy.max), failures.saturating_add(1))
            }
            // A call that started before the plugin was disabled.
            Health::Disabled {
                until,
                backoff,
                failures,
            } => {
                *self = Health::Disabled {
                    until,
                    backoff,
                    failures: failures.saturating_add(1),
                };
                return Transition::None;
            }
        };
        *self = Health::Disabled {
            until: now + backoff,
            backoff,
            failures,
        };
        Transition::Disabled { backoff, failures }
    }

    pub(crate) fn consecutive_failures(&self) -> u32 {
        match *self {
            Health::Enabled { failures }
            | Health::Disabled { failures, .. }
            | Health::Trial { failures, .. } => failures,
        }
    }

    /// `Some(until)` while calls are refused.
    pub(crate) fn disabled_until(&self, now: Instant) -> Option<Instant> {
        match *self {
            Health::Disabled { until, .. } if now < until => Some(until),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy)]
    enum Step {
        Ok,
        Fail,
        Wait(u64),
    }

    /// Runs `steps` (calls that admit then succeed or fail, or waits in seconds) and
    /// returns the transitions and the final state's disable length.
    fn run(steps: &[Step]) -> (Vec<Transition>, Health, Instant) {
        let policy = BackoffPolicy::default();
        let start = Instant::now();
        let mut now = start;
        let mut health = Health::default();
        let mut transitions = Vec::new();
        for step in steps {
            match step {
                Step::Wait(s) => now += Duration::from_secs(*s),
                Step::Ok | Step::Fail => {
                    if health.admit(now).is_err() {
                        transitions.push(Transition::None);
                        continue;
                    }
                    let t = match step {
                        Step::Ok => health.success(),
                        _ => health.failure(now, &policy),
                    };
                    if t != Transition::None {
                        transitions.push(t);
                    }
                }
            }
        }
        (transitions, health, start)
    }

    use Step::*;

    #[test]
    fn five_failures_disable_for_ten_seconds() {
        let (t, health, start) = run(&[Fail, Fail, Fail, Fail, Fail]);
        assert_eq!(
            t,
            [Transition::Disabled {
                backoff: Duration::from_secs(10),
                failures: 5
            }]
        );
        assert_eq!(
            health.disabled_until(start),
            Some(start + Duration::from_secs(10))
        );
    }

    #[test]
    fn a_success_resets_the_count() {
        let (t, health, _) = run(&[Fail, Fail, Fail, Fail, Ok, Fail, Fail, Fail, Fail]);
        assert!(t.is_empty());
        assert_eq!(health.consecutive_failures(), 4);
    }

    #[test]
    fn calls_are_refused_while_disabled() {
        let (t, _, _) = run(&[Fail, Fail, Fail, Fail, Fail, Wait(9), Ok]);
        assert_eq!(t.len(), 2);
        assert_eq!(t[1], Transition::None, "the call was refused");
    }

    #[test]
    fn a_failed_trial_doubles_the_back_off_up_to_five_minutes() {
        let mut steps = vec![Fail; 5];
        let mut expected = vec![10];
        let mut wait = 10;
        for _ in 0..7 {
            steps.push(Wait(wait));
            steps.push(Fail);
            wait = (wait * 2).min(300);
            expected.push(wait);
        }
        let (t, _, _) = run(&steps);
        let backoffs: Vec<u64> = t
            .iter()
            .map(|t| match t {
                Transition::Disabled { backoff, .. } => backoff.as_secs(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(backoffs, expected);
        assert_eq!(*backoffs.last().unwrap(), 300);
    }

    #[test]
    fn a_good_trial_enables_and_restarts_the_back_off() {
        let (t, health, _) = run(&[
            Fail,
            Fail,
            Fail,
            Fail,
            Fail,
            Wait(10),
            Ok,
            Fail,
            Fail,
            Fail,
            Fail,
            Fail,
        ]);
        assert_eq!(
            t,
            [
                Transition::Disabled {
                    backoff: Duration::from_secs(10),
                    failures: 5
                },
                Transition::Enabled,
                Transition::Disabled {
                    backoff: Duration::from_secs(10),
                    failures: 5
                },
            ]
        );
        assert!(matches!(health, Health::Disabled { .. }));
    }
}
