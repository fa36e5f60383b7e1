//! Gives the memory of a burst of CSI calls back to the system once the burst is over.
//!
//! Every call in flight holds its futures and buffers (~17 KiB for a publish); after a mount
//! storm glibc's malloc keeps what the runtime's threads freed in their arenas, so RSS stayed
//! 8-12 MiB above idle for good (docs/benchmarks.md, "Memory"). `malloc_trim` hands those free
//! pages back: once per burst, once the agent has been quiet long enough for the burst's blocking
//! threads to have exited. Event-driven: an idle agent runs nothing here.
//!
//! Not for live data (the value cache has its own bounds), and not for allocators other than
//! glibc's (elsewhere this does nothing).

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
            // Walks every arena under its lock: milliseconds, so off the runtime's threads.
            let _ = tokio::task::spawn_blocking(trim).await;
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

/// Returns the free memory of every malloc arena to the system.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() {
    // SAFETY: malloc_trim takes no pointers and only releases pages malloc holds free; glibc
    // makes it safe to call from any thread at any time (it locks each arena).
    let released = unsafe { libc::malloc_trim(0) };
    tracing::debug!(released = released == 1, "memory of a burst returned");
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}

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

    #[tokio::test(start_paused = true)]
    async fn calls_one_at_a_time_schedule_nothing() {
        let bursts = Arc::new(Bursts::default());
        for _ in 0..1000 {
            drop(bursts.enter());
        }
        assert!(!bursts.scheduled.load(Ordering::Relaxed));
    }
}
