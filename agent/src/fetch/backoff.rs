//! Exponential backoff with jitter per (store, auth identity), so that a backend which is down
//! or throttling is not hammered by every republish of every volume that uses it.
//!
//! Only transient provider errors (unavailable, throttled, timed out) count as failures; a
//! success resets. While a (store, identity) is backing off, no backend call is made for it
//! ([`Gate`], entered right before each call); values still in the cache are served meanwhile.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::FetchError;
use crate::providers::ProviderError;

/// Delay after the first failure; doubled for each further consecutive failure.
pub const BASE_DELAY: Duration = Duration::from_secs(1);
/// Longest delay, however many failures in a row.
pub const MAX_DELAY: Duration = Duration::from_secs(300);
/// Largest fraction by which a delay is randomly shortened, so that volumes do not retry in step.
pub const JITTER: f64 = 0.2;

/// True for the errors that say "try again later" rather than "this will never work".
pub fn is_transient(error: &ProviderError) -> bool {
    matches!(
        error,
        ProviderError::Unavailable(_) | ProviderError::Throttled(_) | ProviderError::Timeout(_)
    )
}

/// The delay after `failures` consecutive failures (at least 1), shortened by `jitter` (a
/// fraction in [0, 1), scaled to [0, [`JITTER`])).
pub fn delay(failures: u32, jitter: f64) -> Duration {
    delay_between(failures, BASE_DELAY, MAX_DELAY, jitter)
}

/// [`delay`] from `base` (first failure), doubling, up to `max`.
pub fn delay_between(failures: u32, base: Duration, max: Duration, jitter: f64) -> Duration {
    let exponent = failures.saturating_sub(1).min(20);
    let full = base.saturating_mul(1 << exponent).min(max);
    full.mul_f64(1.0 - jitter.clamp(0.0, 1.0) * JITTER)
}

/// Backoff state of one (store, identity).
#[derive(Debug, Clone, Copy)]
struct Entry {
    failures: u32,
    next: Instant,
}

struct State {
    entries: HashMap<(String, String), Entry>,
}

/// Consecutive transient failures and the next allowed attempt, per (store, identity).
pub struct Backoff {
    state: Mutex<State>,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            state: Mutex::new(State {
                entries: HashMap::new(),
            }),
        }
    }
}

/// A (store, identity) that must not be called yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackingOff {
    /// Consecutive transient failures so far.
    pub failures: u32,
    /// When the next attempt is allowed.
    pub next: Instant,
}

impl Backoff {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `Some` while `(store, identity)` is backing off at `now`.
    pub fn check(&self, store: &str, identity: &str, now: Instant) -> Option<BackingOff> {
        let state = self.lock();
        let entry = state
            .entries
            .get(&(store.to_string(), identity.to_string()))?;
        (now < entry.next).then_some(BackingOff {
            failures: entry.failures,
            next: entry.next,
        })
    }

    /// Records a transient failure at `now`; returns the delay until the next allowed attempt.
    /// A failure reported while already backing off does not lengthen the delay.
    pub fn failed(&self, store: &str, identity: &str, now: Instant) -> Duration {
        let mut state = self.lock();
        let jitter = fastrand::f64();
        let entry = state
            .entries
            .entry((store.to_string(), identity.to_string()))
            .or_insert(Entry {
                failures: 0,
                next: now,
            });
        // Callers that shared one failed fetch (single-flight) report it once each: while the
        // delay it started runs, further reports are the same attempt, not new failures.
        if now < entry.next {
            return entry.next - now;
        }
        entry.failures = entry.failures.saturating_add(1);
        let wait = delay(entry.failures, jitter);
        entry.next = now + wait;
        wait
    }

    /// Records a success: the next failure starts from the base delay again.
    pub fn succeeded(&self, store: &str, identity: &str) {
        let mut state = self.lock();
        if !state.entries.is_empty() {
            state
                .entries
                .remove(&(store.to_string(), identity.to_string()));
        }
    }
}

/// The backoff of one fetch's (store, identity), consulted right before each backend call, so
/// values still in the cache are served while the backend is being left alone.
pub struct Gate<'a> {
    backoff: &'a Backoff,
    store: &'a str,
    identity: &'a str,
    /// Whether a backend call was let through: only then does a success say the backend is
    /// healthy again.
    called: AtomicBool,
}

impl<'a> Gate<'a> {
    /// A gate over `backoff` for calls to `store` as `identity`.
    pub fn new(backoff: &'a Backoff, store: &'a str, identity: &'a str) -> Self {
        Self {
            backoff,
            store,
            identity,
            called: AtomicBool::new(false),
        }
    }

    /// Lets a backend call through, or refuses it with `Unavailable` while backing off.
    pub fn enter(&self) -> Result<(), ProviderError> {
        let now = Instant::now();
        match self.backoff.check(self.store, self.identity, now) {
            Some(off) => Err(ProviderError::Unavailable(format!(
                "backing off after {} failed attempt(s) as service account {}; next attempt \
                 in {:.1}s",
                off.failures,
                self.identity,
                off.next.saturating_duration_since(now).as_secs_f64()
            ))),
            None => {
                self.called.store(true, Ordering::Relaxed);
                Ok(())
            }
        }
    }

    /// Records how the fetch ended; returns the wait until the next allowed backend attempt
    /// when the (store, identity) is backing off.
    pub fn record<T>(&self, fetched: &Result<T, FetchError>) -> Option<Duration> {
        match fetched {
            Ok(_) if self.called.load(Ordering::Relaxed) => {
                self.backoff.succeeded(self.store, self.identity);
                None
            }
            Ok(_) => None,
            Err(e) => e.provider_error().filter(|e| is_transient(e)).map(|_| {
                self.backoff
                    .failed(self.store, self.identity, Instant::now())
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_five_minutes_and_jitter_only_shortens() {
        assert_eq!(delay(1, 0.0), Duration::from_secs(1));
        assert_eq!(delay(2, 0.0), Duration::from_secs(2));
        assert_eq!(delay(4, 0.0), Duration::from_secs(8));
        assert_eq!(delay(9, 0.0), Duration::from_secs(256));
        assert_eq!(delay(10, 0.0), MAX_DELAY);
        assert_eq!(delay(u32::MAX, 0.0), MAX_DELAY);
        assert_eq!(delay(1, 0.5), Duration::from_millis(900));
        assert!(delay(1, 0.999_999) > Duration::from_millis(800));
        assert!(delay(3, 0.999_999) > Duration::from_millis(3200));
    }

    #[test]
    fn only_unavailable_throttled_and_timeout_are_transient() {
        assert!(is_transient(&ProviderError::Unavailable("x".into())));
        assert!(is_transient(&ProviderError::Throttled("x".into())));
        assert!(is_transient(&ProviderError::Timeout("x".into())));
        assert!(!is_transient(&ProviderError::NotFound));
        assert!(!is_transient(&ProviderError::PermissionDenied("x".into())));
        assert!(!is_transient(&ProviderError::Config("x".into())));
    }

    #[test]
    fn backs_off_per_store_and_identity_and_a_success_resets() {
        let b = Backoff::default();
        let t0 = Instant::now();
        assert_eq!(b.check("s", "ns/sa", t0), None);
        let first = b.failed("s", "ns/sa", t0);
        assert!(first > Duration::from_millis(800) && first <= BASE_DELAY);
        let blocked = b.check("s", "ns/sa", t0).unwrap();
        assert_eq!(
            blocked,
            BackingOff {
                failures: 1,
                next: t0 + first
            }
        );
        // Other identities and stores are not affected.
        assert_eq!(b.check("s", "ns/other", t0), None);
        // A second report of the same failed attempt (single-flight waiters) is not a new one.
        let half = t0 + first / 2;
        assert_eq!(b.failed("s", "ns/sa", half), t0 + first - half);
        assert_eq!(b.check("s", "ns/sa", half).unwrap().failures, 1);
        assert_eq!(b.check("other", "ns/sa", t0), None);
        // Allowed again once the delay has passed; the next failure waits about twice as long.
        let t1 = t0 + first;
        assert_eq!(b.check("s", "ns/sa", t1), None);
        let second = b.failed("s", "ns/sa", t1);
        assert!(second > Duration::from_millis(1600) && second <= 2 * BASE_DELAY);
        assert_eq!(b.check("s", "ns/sa", t1).unwrap().failures, 2);
        let mut t = t1 + second;
        let mut wait = Duration::ZERO;
        for _ in 0..20 {
            wait = b.failed("s", "ns/sa", t);
            assert!(wait <= MAX_DELAY);
            t += wait;
        }
        assert!(
            wait > MAX_DELAY.mul_f64(1.0 - JITTER),
            "capped at five minutes"
        );
        assert!(b.check("s", "ns/sa", t - Duration::from_secs(1)).is_some());
        b.succeeded("s", "ns/sa");
        assert_eq!(b.check("s", "ns/sa", t0), None);
        assert_eq!(
            b.failed("s", "ns/sa", t0),
            b.check("s", "ns/sa", t0).unwrap().next - t0
        );
        assert!(b.check("s", "ns/sa", t0).unwrap().next - t0 <= BASE_DELAY);
    }
}
