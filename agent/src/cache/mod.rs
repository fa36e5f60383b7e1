//! The identity-scoped value cache with single-flight, between resolution and the providers.
//!
//! What it is for: remembering the *fetched* value of one remote key (`Provider::get`), keyed by
//! store identity, auth identity, remote key and version, so that pods sharing a service account
//! share one backend read, and so that concurrent publishes needing the same key share one
//! in-flight backend call (single-flight) instead of each calling the backend.
//!
//! - Two identities never share an entry: the auth identity is part of [`CacheKey`].
//! - Freshness is the caller's `refreshInterval` (`max_age`), shortened per entry by a random
//!   jitter drawn when the value is stored, so values fetched together do not expire together.
//! - Values live in memory only, are bounded by entry count and total bytes (least recently used
//!   evicted first) and are zeroized when evicted, replaced or invalidated ([`SecretBytes`]).
//! - A value leaves once stale for the longest `max_age` of the readers that used it
//!   ([`sweep`]): a gone pod's secrets do not wait for the LRU bound. A reader with a longer
//!   `max_age` that comes only after that fetches again.
//! - Errors are shared with every caller waiting on the same fetch, and never cached.
//! - If the caller running a fetch is cancelled, the callers waiting on it retry; one of them
//!   becomes the new fetcher.
//!
//! What it is not: not a cache of per-property projections, templates or files (resolution runs
//! on every publish); not a cache of `dataFrom.find` results; not persistent; not a negative
//! cache; not a retry or backoff policy and not a background refresher (callers decide when to ask
//! again and may [`ValueCache::invalidate`] after a failed refresh or a backend change).

mod lru;
mod sweep;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::providers::{ProviderError, RemoteKey};
use crate::secret::SecretBytes;
use crate::telemetry::Metrics;
use lru::Lru;
use sweep::Sweeps;

/// What one cached value is for: which store, as whom, which remote key and version.
///
/// The four parts are packed into one shared allocation, each after its length (an absent
/// version has a length no string can have), so that two different keys never pack alike. One
/// allocation, made once per look-up and shared by the flight and the entry: a warm publish of
/// 3 keys made 9 strings here before, and every cached entry held 4 allocations for its key,
/// which a mount storm scattered over as many pages of its burst (docs/benchmarks.md at
/// c9d4b4e).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct CacheKey(Arc<[u8]>);

/// The length prefix of an absent version.
const NO_VERSION: u64 = u64::MAX;
/// Most bytes of a key packed on the stack before it is copied into its shared allocation.
const PACK_ON_STACK: usize = 512;

impl CacheKey {
    /// The key of `key` in `store` (an opaque store identity built by the caller: kind,
    /// namespace, name plus a hash of the spec), fetched as `identity` (e.g. `shop/web` for a
    /// pod's service account).
    pub fn new(store: &str, identity: &str, key: &RemoteKey) -> Self {
        let version = key.version.as_deref();
        let parts = [
            (store.len() as u64, store),
            (identity.len() as u64, identity),
            (key.key.len() as u64, key.key.as_str()),
            (
                version.map_or(NO_VERSION, |v| v.len() as u64),
                version.unwrap_or_default(),
            ),
        ];
        let len = parts
            .iter()
            .map(|(_, bytes)| 8 + bytes.len())
            .sum::<usize>();
        // Packed slice by slice (a byte-by-byte iterator took ~2,300 instructions per key, more
        // than the cache look-up itself), on the stack when it fits, so that the shared
        // allocation is the only one.
        let mut on_stack = [0u8; PACK_ON_STACK];
        let mut on_heap = Vec::new();
        let buffer = match on_stack.get_mut(..len) {
            Some(buffer) => buffer,
            None => {
                on_heap.resize(len, 0);
                &mut on_heap[..]
            }
        };
        let mut at = 0;
        for (length, bytes) in parts {
            for piece in [&length.to_le_bytes()[..], bytes.as_bytes()] {
                buffer[at..at + piece.len()].copy_from_slice(piece);
                at += piece.len();
            }
        }
        Self(Arc::from(&*buffer))
    }

    /// Bytes this key is charged in the cache's byte budget.
    fn size(&self) -> u64 {
        self.0.len() as u64
    }

    /// The packed parts, in order, each `None` when absent (only the version can be).
    fn parts(&self) -> impl Iterator<Item = Option<&str>> {
        let mut rest = &self.0[..];
        std::iter::from_fn(move || {
            let (length, tail) = rest.split_first_chunk::<8>()?;
            let length = u64::from_le_bytes(*length);
            if length == NO_VERSION {
                rest = tail;
                return Some(None);
            }
            let (bytes, tail) = tail.split_at_checked(usize::try_from(length).ok()?)?;
            rest = tail;
            Some(std::str::from_utf8(bytes).ok())
        })
    }
}

impl fmt::Debug for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = self.parts();
        let mut next = || parts.next().flatten();
        f.debug_struct("CacheKey")
            .field("store", &next())
            .field("identity", &next())
            .field("key", &next())
            .field("version", &next())
            .finish()
    }
}

/// Bounds of a [`ValueCache`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CacheLimits {
    /// Most entries held; 0 disables storing (single-flight still applies).
    pub max_entries: usize,
    /// Most bytes held, counting each value and its key.
    pub max_bytes: u64,
    /// Largest fraction (0.0..=0.5, clamped) by which an entry's lifetime is randomly shortened.
    pub jitter: f64,
}

impl Default for CacheLimits {
    fn default() -> Self {
        Self {
            max_entries: 10_000,
            max_bytes: 64 * 1024 * 1024,
            jitter: 0.1,
        }
    }
}

/// The outcome of one backend fetch, as shared with every caller waiting on it.
type Outcome = Result<SecretBytes, ProviderError>;

/// A fetch in flight: waiters subscribe to its outcome.
struct Flight {
    /// Tells this flight apart from a later one for the same key.
    id: u64,
    /// `None` until the fetcher publishes the outcome; closed without it if the fetcher is gone.
    outcome: watch::Receiver<Option<Outcome>>,
}

/// Everything behind the cache's lock.
struct State {
    lru: Lru,
    flights: HashMap<CacheKey, Flight>,
    next_flight: u64,
    sweeps: Sweeps,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // No code panics while holding the lock with the state half-updated; recover from poison.
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// In-memory, identity-scoped cache of fetched secret values with single-flight fetching.
pub struct ValueCache {
    limits: CacheLimits,
    metrics: Arc<Metrics>,
    /// Shared with the sweeping task, which holds it only while it sweeps.
    state: Arc<Mutex<State>>,
}

/// What one look-up under the lock decided.
enum Step<'a> {
    /// A fresh value.
    Hit(SecretBytes),
    /// Another caller is fetching: wait for its outcome.
    Join(watch::Receiver<Option<Outcome>>),
    /// This caller fetches.
    Fetch(FlightGuard<'a>),
}

impl ValueCache {
    /// An empty cache with these limits, counting hits, misses and joins in `metrics`.
    pub fn new(limits: CacheLimits, metrics: Arc<Metrics>) -> Self {
        let jitter = if limits.jitter.is_finite() {
            limits.jitter.clamp(0.0, 0.5)
        } else {
            0.0
        };
        Self {
            limits: CacheLimits { jitter, ..limits },
            metrics,
            state: Arc::new(Mutex::new(State {
                lru: Lru::default(),
                flights: HashMap::new(),
                next_flight: 0,
                sweeps: Sweeps::default(),
            })),
        }
    }

    /// The value for `key`: cached when fresh for `max_age` (`None`: any cached value), else the
    /// outcome of `fetch`, run by exactly one of the concurrent callers for the same key.
    pub async fn get_or_fetch<F, Fut>(
        &self,
        key: CacheKey,
        max_age: Option<Duration>,
        fetch: F,
    ) -> Result<SecretBytes, ProviderError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<SecretBytes, ProviderError>>,
    {
        loop {
            match self.step(&key, max_age) {
                Step::Hit(value) => return Ok(value),
                Step::Join(mut outcome) => {
                    let shared = outcome
                        .wait_for(Option::is_some)
                        .await
                        .ok()
                        .and_then(|seen| (*seen).clone());
                    if let Some(outcome) = shared {
                        return outcome;
                    }
                    // The fetcher was cancelled before it had an outcome: look again; this
                    // caller may find a new flight, or become the fetcher itself.
                }
                Step::Fetch(flight) => {
                    let outcome = fetch().await;
                    flight.finish(&outcome);
                    return outcome;
                }
            }
        }
    }

    /// Drops the entry for `key`; a fetch for it already in flight still answers its waiters but
    /// its value is not stored, and the next caller fetches anew.
    pub fn invalidate(&self, key: &CacheKey) {
        let mut state = self.lock();
        state.lru.remove(key);
        state.flights.remove(key);
    }

    /// Number of cached values.
    pub fn len(&self) -> usize {
        self.lock().lru.len()
    }

    /// True when no value is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes charged to cached values (each value's length plus its key's).
    pub fn bytes(&self) -> u64 {
        self.lock().lru.bytes()
    }

    /// Decides, under the lock, whether this caller hits, joins or fetches.
    fn step(&self, key: &CacheKey, max_age: Option<Duration>) -> Step<'_> {
        let mut state = self.lock();
        if let Some(value) = state.lru.get_fresh(key, max_age, Instant::now()) {
            self.metrics.cache_hits.inc();
            return Step::Hit(value);
        }
        if let Some(flight) = state.flights.get(key) {
            self.metrics.cache_joins.inc();
            return Step::Join(flight.outcome.clone());
        }
        let id = state.next_flight;
        state.next_flight += 1;
        let (tx, rx) = watch::channel(None);
        let key = key.clone();
        state
            .flights
            .insert(key.clone(), Flight { id, outcome: rx });
        self.metrics.cache_misses.inc();
        Step::Fetch(FlightGuard {
            cache: self,
            key,
            max_age,
            id,
            outcome: tx,
            finished: false,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

impl fmt::Debug for ValueCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("ValueCache")
            .field("entries", &state.lru.len())
            .field("bytes", &state.lru.bytes())
            .field("in_flight", &state.flights.len())
            .field("limits", &self.limits)
            .finish()
    }
}

/// The fetcher's side of a flight. Finishing stores and publishes the outcome; dropping it
/// unfinished (the fetcher's future was cancelled, or the fetch panicked) withdraws the flight
/// and closes the channel, which wakes the waiters so that they retry.
struct FlightGuard<'a> {
    cache: &'a ValueCache,
    key: CacheKey,
    /// The fetching reader's: how long the value it stores stays.
    max_age: Option<Duration>,
    id: u64,
    outcome: watch::Sender<Option<Outcome>>,
    finished: bool,
}

impl FlightGuard<'_> {
    /// Stores a fetched value (unless the flight was invalidated meanwhile), ends the flight and
    /// hands the outcome to every waiter.
    fn finish(mut self, outcome: &Outcome) {
        {
            let cache = self.cache;
            let mut state = cache.lock();
            if state
                .flights
                .get(&self.key)
                .is_some_and(|f| f.id == self.id)
            {
                state.flights.remove(&self.key);
                if let Ok(value) = outcome {
                    let lifetime = 1.0 - cache.limits.jitter * fastrand::f64();
                    let expires = state.lru.insert(
                        self.key.clone(),
                        value.clone(),
                        Instant::now(),
                        self.max_age,
                        lifetime,
                        cache.limits.max_entries,
                        cache.limits.max_bytes,
                    );
                    if let Some(expires) = expires {
                        state.sweeps.expiring(expires, &cache.state, &cache.metrics);
                    }
                }
            }
        }
        self.finished = true;
        // The flight is out of the map, so no receiver can be added any more: when none is
        // left, nobody needs a copy of the outcome.
        if !self.outcome.is_closed() {
            self.outcome.send_replace(Some(outcome.clone()));
        }
    }
}

impl Drop for FlightGuard<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let mut state = self.cache.lock();
        if state
            .flights
            .get(&self.key)
            .is_some_and(|f| f.id == self.id)
        {
            state.flights.remove(&self.key);
        }
        // `self.outcome` (the sender) is dropped after this, closing the channel.
    }
}
