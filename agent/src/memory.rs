//! Gives the memory of a burst of CSI calls back to the system once the burst is over.
//!
//! Every call in flight holds its futures and buffers (~17 KiB for a publish); after a mount
//! storm glibc's malloc keeps what the runtime's threads freed in their arenas, so RSS stayed
//! 8-12 MiB above idle for good (`git show c9d4b4e:docs/benchmarks.md`, "Memory").
//! `malloc_trim` hands those free pages back: once per burst, once the agent has been quiet long
//! enough for the burst's blocking threads to have exited. Event-driven: an idle agent runs
//! nothing here.
//!
//! Live data made during a burst is what `malloc_trim` cannot return, and a page holding one
//! small live allocation among the burst's garbage stays resident. Two things keep that small:
//! one malloc arena for the whole process ([`one_arena`]), and the per-target maps giving their
//! table back once a burst's volumes are gone ([`shrink_emptied`]).
//!
//! The value cache has its own bounds and trims after dropping expired entries
//! (`cache/sweep.rs`). Nothing here works for allocators other than glibc's (elsewhere the calls
//! do nothing).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// Calls in flight at once from which a burst is worth trimming after.
const BURST: usize = 32;
/// How long an idle thread of tokio's blocking pool lives (the runtime is built with it). A
/// burst starts up to 16 of them; what they freed reaches the arenas only when they exit.
pub const BLOCKING_KEEP_ALIVE: Duration = Duration::from_secs(10);
/// How long no call may be in flight before the trim: until the burst's blocking threads have
/// exited.
const QUIET: Duration = Duration::from_secs(BLOCKING_KEEP_ALIVE.as_secs() + 2);

/// Counts calls in flight and trims after a burst.
#[derive(Debug, Default)]
pub struct Bursts {
    in_flight: AtomicUsize,
    /// Most calls in flight at once since the last trim.
    peak: AtomicUsize,
    /// A trim is waiting for the quiet period.
    scheduled: AtomicBool,
}

impl Bursts {
    /// Counts one call until the returned guard is dropped.
    pub fn enter(self: &Arc<Self>) -> InFlight {
        let now = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak.fetch_max(now, Ordering::Relaxed);
        InFlight(Arc::clone(self))
    }

    fn left(self: &Arc<Self>) {
        let now = self.in_flight.fetch_sub(1, Ordering::Relaxed) - 1;
        if now > 0 || self.peak.load(Ordering::Relaxed) < BURST {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        let bursts = Arc::clone(self);
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(QUIET).await;
                if bursts.in_flight.load(Ordering::Relaxed) == 0 {
                    break;
                }
            }
            bursts.peak.store(0, Ordering::Relaxed);
            bursts.scheduled.store(false, Ordering::Release);
            trim_in_background("a burst");
        });
    }
}

/// One call in flight (see [`Bursts::enter`]).
#[derive(Debug)]
pub struct InFlight(Arc<Bursts>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.left();
    }
}

/// Returns the free memory of every malloc arena to the system, on a thread of its own; `what`
/// freed it (for the debug log).
pub fn trim_in_background(what: &'static str) {
    // Walks the arenas under their lock: up to milliseconds, so off the runtime's threads; and
    // not on its blocking pool either, whose thread would then idle on for BLOCKING_KEEP_ALIVE
    // with its stack, after a burst's have gone.
    let spawned = std::thread::Builder::new()
        .name("latchkey-trim".into())
        .spawn(move || trim(what));
    if let Err(err) = spawned {
        tracing::debug!(%err, what, "no thread to return freed memory");
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim(what: &'static str) {
    // SAFETY: malloc_trim takes no pointers and only releases pages malloc holds free; glibc
    // makes it safe to call from any thread at any time (it locks each arena).
    let released = unsafe { libc::malloc_trim(0) };
    tracing::debug!(released = released == 1, what, "freed memory returned");
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim(_: &'static str) {}

/// Makes every thread allocate from one malloc arena. Call it first thing in `main`.
///
/// glibc gives each thread that meets a locked arena one of its own, up to 8 per core. Publishes
/// run on the runtime's two workers, so a storm's request memory and the few allocations that
/// outlive it (cache values, a grown table) were spread over two more arenas, each with its own
/// free lists and its own partly used pages; after the trim those arenas kept 2-3 MiB resident
/// for ~0.9 MiB in use. With one arena a later burst reuses the same free chunks: 0.5-1 MiB
/// less `RssAnon` once settled, and a storm leaves 0.2-0.5 MiB instead of 0.4-1.0. The cost is a
/// shared lock on allocations that miss the per-thread cache: a storm of 500 publishes took
/// 53-79 ms instead of 41-49 ms; a warm publish, one at a time, does not contend
/// (git show c9d4b4e:docs/benchmarks.md, "After a storm").
pub fn one_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt takes no pointers; M_ARENA_MAX only bounds how many arenas glibc creates
    // later, which is valid at any time (arenas that already exist stay in use).
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Below this many entries a map keeps its table: not worth reallocating.
const KEEP_ENTRIES: usize = 64;

/// An emptied map keeps a table this small: publishes one at a time take such a map from 0 to
/// 1 entry and back on every call, and freeing it would make them allocate it again each time.
const KEEP_WHEN_EMPTY: usize = 4;

/// Gives back most of `map`'s table once it is three-quarters empty, and all of a grown one
/// once empty.
///
/// A hash table never shrinks by itself, so a map keyed by target path keeps the room of the
/// most volumes it ever held (~84 KiB at 1,000), made in the middle of a burst where it pins the
/// burst's pages. Call after a removal; halving at a quarter keeps it amortised O(1). The last
/// table of those steps (room for 64, ~4 KiB) was still made while the burst's volumes went,
/// so an emptied map frees it outright; the next insert makes a small one.
pub fn shrink_emptied<K: Eq + Hash, V, S: BuildHasher>(map: &mut HashMap<K, V, S>) {
    if map.is_empty() {
        if map.capacity() > KEEP_WHEN_EMPTY {
            map.shrink_to(0);
        }
    } else if map.capacity() > KEEP_ENTRIES && map.len() < map.capacity() / 4 {
        map.shrink_to(KEEP_ENTRIES.max(map.len() * 2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_is_trimmed_once_after_a_quiet_period() {
        let bursts = Arc::new(Bursts::default());
        let calls: Vec<_> = (0..BURST).map(|_| bursts.enter()).collect();
        assert_eq!(bursts.peak.load(Ordering::Relaxed), BURST);
        drop(calls);
        assert!(bursts.scheduled.load(Ordering::Relaxed));
        // A call during the quiet period postpones the trim.
        let late = bursts.enter();
        tokio::time::sleep(QUIET + Duration::from_millis(10)).await;
        assert!(bursts.scheduled.load(Ordering::Relaxed));
        drop(late);
        tokio::time::sleep(QUIET * 2).await;
        assert!(!bursts.scheduled.load(Ordering::Relaxed));
        assert_eq!(bursts.peak.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn an_emptied_map_gives_its_table_back() {
        let mut map: HashMap<u32, u32> = (0..1000).map(|i| (i, i)).collect();
        for i in 0..1000 {
            map.remove(&i);
            shrink_emptied(&mut map);
            // Never below what it holds, and at most ~4x it once past the floor.
            assert!(map.capacity() >= map.len());
            assert!(
                map.capacity() <= (4 * map.len() + 8).max(2 * KEEP_ENTRIES),
                "{} entries, room for {}",
                map.len(),
                map.capacity()
            );
        }
        assert_eq!(map.capacity(), 0, "an emptied map keeps no table");
    }

    #[test]
    fn a_map_used_one_entry_at_a_time_keeps_its_small_table() {
        let mut map: HashMap<u32, u32> = HashMap::new();
        map.insert(1, 1);
        let small = map.capacity();
        assert!(small <= KEEP_WHEN_EMPTY, "{small}");
        map.remove(&1);
        shrink_emptied(&mut map);
        assert_eq!(map.capacity(), small);
    }

    #[tokio::test(start_paused = true)]
    async fn calls_one_at_a_time_schedule_nothing() {
        let bursts = Arc::new(Bursts::default());
        for _ in 0..1000 {
            drop(bursts.enter());
        }
        assert!(!bursts.scheduled.load(Ordering::Relaxed));
    }
}
