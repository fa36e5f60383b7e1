//! Drops cached values once no reader would take them any more.
//!
//! The least-recently-used bound alone keeps a stale value until 10,000 newer ones push it out:
//! the secrets of a pod gone hours ago stayed in memory, and so did what a storm of new service
//! accounts cached (docs/benchmarks.md at c9d4b4e). One task per cache sleeps until the next
//! entry expires and drops every expired one, at most once per [`GAP`], then has the freed
//! memory returned.
//! Event-driven: with nothing that expires it waits on its bell and runs nothing.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::{State, lock};
use crate::telemetry::Metrics;

/// Shortest time between two sweeps: entries fetched together expire over a spread of instants
/// (the jitter), and one sweep per instant would scan the table for each.
pub(super) const GAP: Duration = Duration::from_secs(10);

/// When the next sweep is due, and the bell of the task that runs it.
#[derive(Default)]
pub(super) struct Sweeps {
    /// The planned sweep; `None` while nothing cached expires.
    at: Option<Instant>,
    /// When the last sweep ran.
    last: Option<Instant>,
    /// Rung when `at` moves earlier; `None` until the first entry that expires, or with no
    /// runtime to run the task on.
    bell: Option<watch::Sender<()>>,
}

impl Sweeps {
    /// Plans a sweep for an entry just stored that expires at `expires`, starting the task on
    /// the first one. Called under the cache's lock, where `state` lives.
    pub(super) fn expiring(
        &mut self,
        expires: Instant,
        state: &Arc<Mutex<State>>,
        metrics: &Arc<Metrics>,
    ) {
        if self.bell.is_none() {
            self.start(state, metrics);
        }
        // Without a runtime (a caller outside tokio) entries leave by the LRU bound only.
        let Some(bell) = &self.bell else {
            return;
        };
        let at = self.last.map_or(expires, |last| expires.max(last + GAP));
        if self.at.is_some_and(|planned| planned <= at) {
            return;
        }
        self.at = Some(at);
        bell.send_replace(());
    }

    fn start(&mut self, state: &Arc<Mutex<State>>, metrics: &Arc<Metrics>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (bell, rung) = watch::channel(());
        self.bell = Some(bell);
        runtime.spawn(run(Arc::downgrade(state), rung, Arc::clone(metrics)));
    }
}

/// The sweeping task: ends with the cache, whose state holds the bell's sender.
async fn run(state: Weak<Mutex<State>>, mut rung: watch::Receiver<()>, metrics: Arc<Metrics>) {
    loop {
        // Holds the state only to read it: the cache must be free to go while this waits.
        let planned = match state.upgrade() {
            Some(state) => lock(&state).sweeps.at,
            None => return,
        };
        // Ends the task when the bell's sender (the cache) is gone.
        let due = match planned {
            Some(at) => tokio::select! {
                () = tokio::time::sleep_until(at) => true,
                changed = rung.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    false
                }
            },
            None => {
                if rung.changed().await.is_err() {
                    return;
                }
                false
            }
        };
        if !due {
            // Planned earlier since: look again.
            continue;
        }
        let Some(state) = state.upgrade() else {
            return;
        };
        let dropped = lock(&state).sweep(Instant::now());
        drop(state);
        if dropped > 0 {
            metrics.cache_expired.inc_by(dropped as u64);
            // The values were zeroized as they went. As after a burst, the free pages go back
            // to the system rather than wait in glibc's free lists; a storm's ~0.1 MiB left is
            // mostly not these values, though (docs/benchmarks.md at c9d4b4e, 27 Nov, 18:06).
            crate::memory::trim_in_background("expired cache entries");
        }
    }
}

impl State {
    /// Drops the entries expired at `now` and plans the next sweep; returns how many went.
    fn sweep(&mut self, now: Instant) -> usize {
        let (dropped, next) = self.lru.sweep(now);
        let sweeps = &mut self.sweeps;
        sweeps.last = Some(now);
        sweeps.at = next.map(|next| next.max(now + GAP));
        dropped
    }
}
