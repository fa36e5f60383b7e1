//! The bounded store behind [`ValueCache`](super::ValueCache): entries by key, plus a recency
//! index (a monotonically increasing tick per use, oldest first) to evict the least recently used
//! entry when the entry count or the byte total goes over its limit, and a sweep of entries that
//! went stale for the `max_age` they were fetched with. O(log n) per use; no unsafe, no extra
//! crate.
//!
//! Each entry's key and value bytes are kept together in the cache's own [`Slab`], so that a
//! storm's new entries share pages instead of taking one each; the tables here hold only
//! fixed-size records.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;
use std::time::Duration;

use tokio::time::Instant;

use super::slab::{Slab, Span};
use super::{CacheKey, CacheLimits};
use crate::secret::SecretBytes;

/// How often, at most, an insert first drops the entries that went stale.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// One cached value and what decides its freshness and its place in the eviction order.
struct Entry {
    /// Where the key's bytes and then the value's are; freeing them zeroizes them.
    span: Span,
    /// Length of the key's part of `span`.
    key_len: usize,
    /// The file mode the backend gave the value, if any.
    file_mode: Option<u32>,
    /// When the value was stored.
    stored_at: Instant,
    /// Fraction of the caller's `max_age` this entry lives: `1 - jitter_i`.
    lifetime: f64,
    /// The `max_age` of the caller that fetched it: past that (times `lifetime`) it is swept.
    fetched_for: Option<Duration>,
    /// Last use, the key of this entry in `Lru::order`.
    tick: u64,
}

impl Entry {
    /// True when, at `now`, the entry is too old for `max_age` (`None`: never).
    fn is_stale(&self, max_age: Option<Duration>, now: Instant) -> bool {
        max_age.is_some_and(|max_age| {
            // Compared in f64 so that no `max_age` (even `Duration::MAX`) can overflow or panic.
            let age = now.saturating_duration_since(self.stored_at).as_secs_f64();
            age >= max_age.as_secs_f64() * self.lifetime
        })
    }
}

/// Entries bounded by count and bytes, evicting the least recently used first. `S` hashes keys
/// (a test uses one that makes every key collide).
#[derive(Default)]
pub(super) struct Lru<S = RandomState> {
    /// By the hash of the key's bytes. The key itself is in the slab and compared on every
    /// look-up; of two keys whose hashes collide, the later stored replaces the earlier.
    entries: HashMap<u64, Entry>,
    /// Tick of last use -> key hash; the first entry is the least recently used.
    order: BTreeMap<u64, u64>,
    /// The entries' bytes.
    slab: Slab,
    hasher: S,
    tick: u64,
    /// When stale entries were last swept; `None` before the first insert.
    swept_at: Option<Instant>,
}

impl<S: BuildHasher> Lru<S> {
    /// A copy of the value when it is fresh enough for `max_age` (`None`: any age), marking the
    /// entry as just used; `None` when absent or stale.
    pub(super) fn get_fresh(
        &mut self,
        key: &CacheKey,
        max_age: Option<Duration>,
        now: Instant,
    ) -> Option<SecretBytes> {
        let hash = self.hasher.hash_one(&key.0[..]);
        let tick = self.next_tick();
        let entry = self.entries.get_mut(&hash)?;
        let (stored_key, value) = self.slab.get(entry.span).split_at_checked(entry.key_len)?;
        if stored_key != &key.0[..] || entry.is_stale(max_age, now) {
            return None;
        }
        if let Some(shared) = self.order.remove(&entry.tick) {
            self.order.insert(tick, shared);
        }
        entry.tick = tick;
        Some(SecretBytes::new(value.to_vec()).with_file_mode(entry.file_mode))
    }

    /// Stores a copy of `value` under `key` (replacing and zeroizing any previous value), then
    /// evicts least recently used entries until both limits hold. A value that alone exceeds
    /// `max_bytes`, or any value when `max_entries` is 0, is not stored. At most every
    /// [`SWEEP_EVERY`], entries stale for the `max_age` they were fetched with are dropped first.
    pub(super) fn insert(
        &mut self,
        key: &CacheKey,
        value: &SecretBytes,
        (stored_at, fetched_for): (Instant, Option<Duration>),
        lifetime: f64,
        limits: &CacheLimits,
    ) {
        self.sweep_if_due(stored_at);
        let hash = self.hasher.hash_one(&key.0[..]);
        self.remove_hash(hash);
        let size = value.len() as u64 + key.size();
        if limits.max_entries == 0 || size > limits.max_bytes {
            return;
        }
        let tick = self.next_tick();
        self.order.insert(tick, hash);
        let entry = Entry {
            span: self.slab.put(&[&key.0, value.expose()]),
            key_len: key.0.len(),
            file_mode: value.file_mode(),
            stored_at,
            lifetime,
            fetched_for,
            tick,
        };
        self.entries.insert(hash, entry);
        while self.entries.len() > limits.max_entries || self.bytes() > limits.max_bytes {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            self.remove_hash(oldest);
        }
    }

    /// Drops the entry for `key`, if any; true when there was one.
    pub(super) fn remove(&mut self, key: &CacheKey) -> bool {
        let hash = self.hasher.hash_one(&key.0[..]);
        let Some(entry) = self.entries.get(&hash) else {
            return false;
        };
        let stored = self.slab.get(entry.span);
        if stored.get(..entry.key_len) != Some(&key.0[..]) {
            return false;
        }
        self.remove_hash(hash)
    }

    /// Number of entries.
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Bytes charged to all entries (each value plus its key).
    pub(super) fn bytes(&self) -> u64 {
        self.slab.live() as u64
    }

    /// The slab, for tests that look at how entries are packed.
    #[cfg(test)]
    pub(super) fn slab(&self) -> &Slab {
        &self.slab
    }

    /// Drops (and zeroizes) the entry under `hash`, whatever its key; true when there was one.
    /// Moves the remaining entries to a fresh slab when this left it mostly empty.
    fn remove_hash(&mut self, hash: u64) -> bool {
        let Some(entry) = self.entries.remove(&hash) else {
            return false;
        };
        self.order.remove(&entry.tick);
        self.slab.free(entry.span);
        if self.slab.is_sparse() {
            self.compact();
        }
        true
    }

    /// Moves every entry to a fresh slab, least recently used first; the old one is zeroized as
    /// it is dropped. Costs a copy of the live bytes, once they are outnumbered by dead ones.
    fn compact(&mut self) {
        let mut packed = Slab::default();
        for hash in self.order.values() {
            if let Some(entry) = self.entries.get_mut(hash) {
                entry.span = packed.put(&[self.slab.get(entry.span)]);
            }
        }
        self.slab = packed;
    }

    /// Drops the entries that went stale for the `max_age` they were fetched with, when the
    /// last such sweep is [`SWEEP_EVERY`] old: a pod's values then leave memory soon after it
    /// stops asking for them, not only when the cache reaches its limits.
    fn sweep_if_due(&mut self, now: Instant) {
        let due = self
            .swept_at
            .is_none_or(|at| now.saturating_duration_since(at) >= SWEEP_EVERY);
        if !due {
            return;
        }
        self.swept_at = Some(now);
        let stale: Vec<u64> = self
            .entries
            .iter()
            .filter(|(_, entry)| entry.is_stale(entry.fetched_for, now))
            .map(|(hash, _)| *hash)
            .collect();
        for hash in stale {
            self.remove_hash(hash);
        }
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }
}
