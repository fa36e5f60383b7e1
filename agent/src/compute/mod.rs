//! Where tenant-driven computation runs: templates, rewrites, decoding and property lookups are
//! written by whoever may create an ExternalSecret, so they run on a small pool of dedicated
//! threads, never on the async workers that serve kubelet, health checks and other tenants, and
//! each job has a wall-clock deadline.
//!
//! One tenant (namespace) never holds every thread: its jobs take at most all threads but one,
//! so a namespace full of hostile templates slows only itself.
//!
//! The deadline is cooperative: a job's code asks [`deadline_passed`] between steps (the
//! template budget on every charge, rewrite and decoding between entries), and the caller stops
//! waiting at the deadline whatever the job does. Every step is itself bounded (sizes, compiled
//! regex sizes, the template cost budget), so a job notices its deadline soon after it passes.

use std::cell::Cell;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Stack of the pool's threads: the CEL parser recurses deeply (see `resolve::template`); only
/// the pages used are committed.
pub const STACK_BYTES: usize = 32 << 20;

/// Jobs waiting for a thread at most; beyond that a publish is refused at once.
const QUEUE: usize = 1024;

/// Default wall-clock limit of one publish's computation.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

type Job = Box<dyn FnOnce() + Send>;

thread_local! {
    /// The deadline of the job running on this thread, if any.
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
    /// True on the pool's threads (which have a large stack).
    static ON_POOL: Cell<bool> = const { Cell::new(false) };
}

/// True when the job running on this thread has passed its deadline (never outside a job).
pub fn deadline_passed() -> bool {
    DEADLINE.with(|d| d.get().is_some_and(|at| Instant::now() >= at))
}

/// True on a pool thread, whose stack is [`STACK_BYTES`].
pub fn on_pool_thread() -> bool {
    ON_POOL.with(Cell::get)
}

/// Why a job produced no result.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ComputeError {
    /// The job did not finish within its limit (including time spent queued).
    #[error(
        "the computation (templates, rewrite, decoding) took longer than {0:?}, the limit per publish"
    )]
    TimedOut(Duration),
    /// Too many jobs are queued.
    #[error("the agent is busy computing other publishes; retry later")]
    Busy,
    /// The job panicked (a bug).
    #[error("the computation failed unexpectedly (a bug in Latchkey)")]
    Panicked,
}

/// A fixed set of big-stack threads fed from one bounded queue.
pub struct Pool {
    jobs: SyncSender<Job>,
    timeout: Duration,
    /// How many threads one tenant may use at once.
    per_tenant: usize,
    /// Each tenant's share, while it has jobs in flight.
    tenants: Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
}

impl Pool {
    /// Starts `threads` workers (at least one); each job may run for `timeout`.
    pub fn new(threads: usize, timeout: Duration) -> std::io::Result<Self> {
        let (jobs, queue) = std::sync::mpsc::sync_channel::<Job>(QUEUE);
        let queue = Arc::new(Mutex::new(queue));
        for i in 0..threads.max(1) {
            let queue = Arc::clone(&queue);
            std::thread::Builder::new()
                .name(format!("latchkey-compute-{i}"))
                .stack_size(STACK_BYTES)
                .spawn(move || work(&queue))?;
        }
        Ok(Self {
            jobs,
            timeout,
            per_tenant: threads.saturating_sub(1).max(1),
            tenants: Mutex::default(),
        })
    }

    /// A pool sized for this machine: one thread per core, at least two (so one busy tenant
    /// never holds up every other publish).
    pub fn for_this_machine(timeout: Duration) -> std::io::Result<Self> {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Self::new(cores.max(2), timeout)
    }

    /// The wall-clock limit of one job.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Runs `f` for `tenant` on a pool thread and waits (asynchronously) for its result, at
    /// most the pool's timeout from now (waiting for the tenant's share included).
    pub async fn run<T, F>(&self, tenant: &str, f: F) -> Result<T, ComputeError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let limit = self.timeout;
        let start = Instant::now();
        let deadline = start.checked_add(limit).unwrap_or(start);
        let share = self.share(tenant);
        let permit =
            tokio::time::timeout_at(deadline.into(), Arc::clone(&share).acquire_owned()).await;
        let result = match permit {
            Ok(Ok(_permit)) => self.run_until(deadline, limit, f).await,
            // Timed out waiting for a share (the semaphore is never closed).
            _ => Err(ComputeError::TimedOut(limit)),
        };
        self.release(tenant, share);
        result
    }

    /// [`Self::run`] for work that can fail: a failure returned once the time limit has passed
    /// is reported as the timeout it is (the work's own bounds are what fire when the deadline
    /// passes).
    pub async fn run_fallible<T, E, F>(
        &self,
        tenant: &str,
        work: F,
    ) -> Result<Result<T, E>, ComputeError>
    where
        T: Send + 'static,
        E: Send + 'static,
        F: FnOnce() -> Result<T, E> + Send + 'static,
    {
        let started = Instant::now();
        match self.run(tenant, work).await? {
            Err(_) if started.elapsed() >= self.timeout => {
                Err(ComputeError::TimedOut(self.timeout))
            }
            done => Ok(done),
        }
    }

    /// The semaphore of `tenant`'s share of the threads.
    fn share(&self, tenant: &str) -> Arc<tokio::sync::Semaphore> {
        let mut tenants = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(
            tenants
                .entry(tenant.to_string())
                .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(self.per_tenant))),
        )
    }

    /// Forgets a tenant's share once nobody uses it (the map only holds active tenants).
    fn release(&self, tenant: &str, share: Arc<tokio::sync::Semaphore>) {
        let mut tenants = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
        drop(share);
        if tenants
            .get(tenant)
            .is_some_and(|s| Arc::strong_count(s) == 1)
        {
            tenants.remove(tenant);
        }
    }

    async fn run_until<T, F>(
        &self,
        deadline: Instant,
        limit: Duration,
        f: F,
    ) -> Result<T, ComputeError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            if Instant::now() >= deadline {
                // Waited in the queue past its deadline: the caller has given up already.
                return;
            }
            DEADLINE.with(|d| d.set(Some(deadline)));
            let result = std::panic::catch_unwind(AssertUnwindSafe(f));
            DEADLINE.with(|d| d.set(None));
            let _ = tx.send(result.map_err(|_| ComputeError::Panicked));
        });
        self.jobs.try_send(job).map_err(|e| match e {
            TrySendError::Full(_) | TrySendError::Disconnected(_) => ComputeError::Busy,
        })?;
        match tokio::time::timeout_at(deadline.into(), rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) | Err(_) => Err(ComputeError::TimedOut(limit)),
        }
    }
}

fn work(queue: &Mutex<Receiver<Job>>) {
    ON_POOL.with(|p| p.set(true));
    loop {
        // Holding the lock while waiting is the point: one idle worker waits, the others queue
        // on the mutex. A poisoned lock only means another worker panicked outside a job.
        let job = queue.lock().unwrap_or_else(|p| p.into_inner()).recv();
        match job {
            Ok(job) => job(),
            // The pool was dropped.
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn runs_jobs_with_a_deadline_on_big_stack_threads() {
        let pool = Pool::new(2, Duration::from_millis(200)).unwrap();
        let (on_pool, passed) = pool
            .run("a", || (on_pool_thread(), deadline_passed()))
            .await
            .unwrap();
        assert!(on_pool && !passed);
        assert!(!on_pool_thread() && !deadline_passed());
    }

    #[tokio::test]
    async fn a_job_past_its_deadline_times_out_and_sees_it() {
        let pool = Pool::new(2, Duration::from_millis(50)).unwrap();
        let (seen_tx, seen_rx) = std::sync::mpsc::channel();
        let started = Instant::now();
        let err = pool
            .run("a", move || {
                while !deadline_passed() {
                    std::thread::sleep(Duration::from_millis(1));
                }
                let _ = seen_tx.send(());
                // Finishing late: the caller has stopped waiting by now.
                std::thread::sleep(Duration::from_millis(100));
            })
            .await
            .unwrap_err();
        assert_eq!(err, ComputeError::TimedOut(Duration::from_millis(50)));
        assert!(started.elapsed() < Duration::from_secs(1));
        seen_rx.recv_timeout(Duration::from_secs(1)).unwrap();
        // The other thread still serves.
        pool.run("b", || ()).await.unwrap();
    }

    #[tokio::test]
    async fn a_panicking_job_is_reported() {
        let pool = Pool::new(1, Duration::from_secs(5)).unwrap();
        let err = pool.run("a", || panic!("boom")).await.unwrap_err();
        assert_eq!(err, ComputeError::Panicked);
        assert_eq!(pool.run("a", || 7).await, Ok(7));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_tenant_never_holds_every_thread() {
        let pool = Arc::new(Pool::new(2, Duration::from_secs(3)).unwrap());
        // Four jobs of a hostile tenant, each busy until its deadline.
        let hostile: Vec<_> = (0..4)
            .map(|_| {
                let pool = Arc::clone(&pool);
                tokio::spawn(async move {
                    pool.run("evil", || {
                        while !deadline_passed() {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                    })
                    .await
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let started = Instant::now();
        assert_eq!(pool.run("shop", || 1).await, Ok(1));
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "{:?}",
            started.elapsed()
        );
        for h in hostile {
            // The running one may just make it at its deadline; the queued ones time out.
            let r = h.await.unwrap();
            assert!(
                matches!(r, Ok(()) | Err(ComputeError::TimedOut(_))),
                "{r:?}"
            );
        }
        assert!(
            pool.tenants.lock().unwrap().is_empty(),
            "shares are forgotten"
        );
    }
}
