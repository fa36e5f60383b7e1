//! The bounded store behind [`ValueCache`](super::ValueCache): entries by key, plus a recency
//! index (a monotonically increasing tick per use, oldest first) to evict the least recently used
//! entry when the entry count or the byte total goes over its limit. O(log n) per use; no unsafe,
//! no extra crate. Entries no reader would take any more are dropped by [`Lru::sweep`].

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tokio::time::Instant;

use super::CacheKey;
use crate::secret::SecretBytes;

/// One cached value and what decides its freshness and its place in the eviction order.
struct Entry {
    /// The fetched value; dropping it zeroizes it.
    value: SecretBytes,
    /// When the value was stored.
    stored_at: Instant,
    /// Fraction of the caller's `max_age` this entry lives: `1 - jitter_i`.
    lifetime: f64,
    /// When the entry turns stale for every reader that has used it, the longest `max_age`
    /// among them deciding; `None`: never (a reader took it with no `max_age`).
    expires: Option<Instant>,
    /// Last use, the key of this entry in `Lru::order`.
    tick: u64,
    /// Bytes charged to this entry (value + key).
    size: u64,
}

/// Entries bounded by count and bytes, evicting the least recently used first.
#[derive(Default)]
pub(super) struct Lru {
    entries: HashMap<CacheKey, Entry>,
    /// Tick of last use -> key; the first entry is the least recently used.
    order: BTreeMap<u64, CacheKey>,
    tick: u64,
    bytes: u64,
}

impl Lru {
    /// A copy of the value when it is fresh enough for `max_age` (`None`: any age), marking the
    /// entry as just used; `None` when absent or stale.
    pub(super) fn get_fresh(
        &mut self,
        key: &CacheKey,
        max_age: Option<Duration>,
        now: Instant,
    ) -> Option<SecretBytes> {
        let tick = self.next_tick();
        let entry = self.entries.get_mut(key)?;
        if let Some(max_age) = max_age {
            // Compared in f64 so that no `max_age` (even `Duration::MAX`) can overflow or panic.
            let age = now.saturating_duration_since(entry.stored_at).as_secs_f64();
            if age >= max_age.as_secs_f64() * entry.lifetime {
                return None;
            }
        }
        if let Some(shared) = self.order.remove(&entry.tick) {
            self.order.insert(tick, shared);
        }
        entry.tick = tick;
        // A reader with a longer `max_age` keeps the entry for itself until then.
        entry.expires = match (entry.expires, max_age) {
            (Some(expires), Some(max_age)) => {
                expiry(entry.stored_at, max_age, entry.lifetime).map(|e| e.max(expires))
            }
            _ => None,
        };
        Some(entry.value.clone())
    }

    /// Stores `value`, fetched for a reader taking values up to `max_age` old (`None`: any age),
    /// under `key` (replacing and dropping any previous value), then evicts least recently used
    /// entries until both limits hold. A value that alone exceeds `max_bytes`, or any value when
    /// `max_entries` is 0, is not stored. Returns when the stored entry expires, if it does.
    #[allow(clippy::too_many_arguments)] // Each is one fact about the entry or a limit.
    pub(super) fn insert(
        &mut self,
        key: CacheKey,
        value: SecretBytes,
        stored_at: Instant,
        max_age: Option<Duration>,
        lifetime: f64,
        max_entries: usize,
        max_bytes: u64,
    ) -> Option<Instant> {
        self.remove(&key);
        let size = value.len() as u64 + key.size();
        if max_entries == 0 || size > max_bytes {
            return None;
        }
        let expires = max_age.and_then(|max_age| expiry(stored_at, max_age, lifetime));
        let tick = self.next_tick();
        self.order.insert(tick, key.clone());
        self.bytes += size;
        self.entries.insert(
            key,
            Entry {
                value,
                stored_at,
                lifetime,
                expires,
                tick,
                size,
            },
        );
        while self.entries.len() > max_entries || self.bytes > max_bytes {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            if let Some(evicted) = self.entries.remove(&oldest) {
                self.bytes -= evicted.size;
            }
        }
        expires
    }

    /// Drops (and so zeroizes) every entry expired at `now`, then gives back most of the table
    /// if it emptied. Returns how many went and when the next of the others expires.
    pub(super) fn sweep(&mut self, now: Instant) -> (usize, Option<Instant>) {
        let Self {
            entries,
            order,
            bytes,
            ..
        } = self;
        let mut dropped = 0;
        let mut next: Option<Instant> = None;
        entries.retain(|_, entry| match entry.expires {
            Some(expires) if expires <= now => {
                order.remove(&entry.tick);
                *bytes -= entry.size;
                dropped += 1;
                false
            }
            Some(expires) => {
                next = Some(next.map_or(expires, |n| n.min(expires)));
                true
            }
            None => true,
        });
        if dropped > 0 {
            crate::memory::shrink_emptied(entries);
        }
        (dropped, next)
    }

    /// Drops the entry for `key`, if any; true when there was one.
    pub(super) fn remove(&mut self, key: &CacheKey) -> bool {
        match self.entries.remove(key) {
            Some(entry) => {
                self.order.remove(&entry.tick);
                self.bytes -= entry.size;
                true
            }
            None => false,
        }
    }

    /// Number of entries.
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Bytes charged to all entries.
    pub(super) fn bytes(&self) -> u64 {
        self.bytes
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }
}

/// When a value stored at `stored_at` turns stale for a reader with `max_age`, if it ever does
/// (`None` past what an `Instant` holds). The same f64 arithmetic as [`Lru::get_fresh`]'s.
fn expiry(stored_at: Instant, max_age: Duration, lifetime: f64) -> Option<Instant> {
    let lives = Duration::try_from_secs_f64(max_age.as_secs_f64() * lifetime).ok()?;
    stored_at.checked_add(lives)
}
