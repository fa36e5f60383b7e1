//! Log lines held until the runtime worker that logged them runs out of work, then written in
//! one `write(2)`. A publish logs its line just before it answers; written at once, that line
//! was a write to stderr (a pipe the container runtime reads) that woke the reader, about 7 µs
//! between kubelet's request and the answer (docs/benchmarks.md). Held, it is written right
//! after the answer, by the same thread, when tokio calls [`write_held`] before the worker parks.
//!
//! Only threads that have parked once (runtime workers: tokio calls `on_thread_park` on no other
//! thread) hold their lines. Every other thread writes what is held and then its own line, so
//! lines keep their order across threads. A line that does not fit in what is left of the
//! fixed buffer ([`HOLD_AT_MOST`]) first has what is held written, so a worker that stays busy
//! (a mount storm) writes in steps of a few KiB, and holding a line never allocates. A worker that
//! hangs keeps its last lines until another worker parks or anything else logs.
//!
//! A line can be put off further, before it is formatted: [`after_answer`] keeps the code that
//! logs it for [`LOG_AFTER`], then the lines put off meanwhile are formatted and written together
//! (or at once when [`DEFER_AT_MOST`] of them wait). Formatting a publish's span and line took
//! about a tenth of the agent's own work on a warm publish, and doing it as soon as the worker
//! ran out of work, right after the answer, still held kubelet back: woken on the CPU that
//! answered, its gRPC client waited for the line to be formatted and written and for the log
//! reader it woke (~20 µs of a warm publish, docs/benchmarks.md). The list is the process's, not
//! a thread's: any line logged later, on any thread, first has what waits logged, so put-off
//! lines keep their place among the others (their timestamps are when they were formatted, at
//! most [`LOG_AFTER`] after the event).
//!
//! Not for formatting lines (tracing-subscriber does) nor for deciding what is logged.

use std::cell::Cell;
use std::fmt;
use std::io::{self, Write};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tracing_subscriber::fmt::MakeWriter;

/// Most bytes held (about 20 publish lines): a fixed buffer, so that holding lines allocates
/// nothing and a mount storm leaves no memory behind.
const HOLD_AT_MOST: usize = 4096;

/// Most lines put off before they are logged at once: workers that stay busy (a mount storm)
/// format them in batches, and the list stays small.
const DEFER_AT_MOST: usize = 32;

/// How long [`after_answer`] puts a line off: the lines of a few dozen calls are then formatted
/// and written in one go, away from any one answer, in one `write(2)` for the log reader to wake
/// up to. Short enough that a person reading the log sees no delay.
pub const LOG_AFTER: Duration = Duration::from_millis(5);

/// Whether a task will log what is put off once [`LOG_AFTER`] has passed.
static LOG_SCHEDULED: AtomicBool = AtomicBool::new(false);

/// Code that logs a line, put off by [`after_answer`].
type Deferred = Box<dyn FnOnce() + Send>;

thread_local! {
    /// Whether this thread holds its lines: set by its first [`write_held`].
    static HOLDS: Cell<bool> = const { Cell::new(false) };
}

/// The process's held stderr lines.
static STDERR: Held<Stderr> = Held::new(Stderr);

/// For tokio's `on_thread_park`: writes the lines held so far, and from now on holds the lines
/// this thread logs. What was put off waits for its task ([`after_answer`]).
pub fn write_held() {
    HOLDS.set(true);
    STDERR.flush_held();
}

/// For tokio's `on_thread_stop`: logs what was put off and writes the lines held so far.
pub fn flush() {
    STDERR.run_deferred();
    STDERR.flush_held();
}

/// Runs `log` (code that logs) within [`LOG_AFTER`], after the answer its line describes, or
/// before any later line; at once on a thread that is not a runtime worker.
pub fn after_answer(log: impl FnOnce() + Send + 'static) {
    if !HOLDS.get() {
        // Each line it logs first has what waits logged (`Held::log`).
        log();
        return;
    }
    if STDERR.put_off(Box::new(log)) {
        STDERR.run_deferred();
    } else if !LOG_SCHEDULED.load(Ordering::Acquire) && !LOG_SCHEDULED.swap(true, Ordering::AcqRel)
    {
        log_later();
    }
}

/// Starts the task that logs what waits once [`LOG_AFTER`] has passed.
fn log_later() {
    // Only runtime workers put lines off, so there is a runtime; should it be shutting down, the
    // task is dropped and the workers' stop hook ([`flush`]) logs what waits.
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async {
            tokio::time::sleep(LOG_AFTER).await;
            // Cleared first: a line put off while these are formatted gets a task of its own.
            LOG_SCHEDULED.store(false, Ordering::Release);
            flush();
        });
    } else {
        LOG_SCHEDULED.store(false, Ordering::Release);
        flush();
    }
}

/// A `tracing_subscriber` writer to stderr that holds the lines of runtime workers (see the
/// module's documentation).
#[derive(Debug, Clone, Copy, Default)]
pub struct HeldStderr;

impl<'a> MakeWriter<'a> for HeldStderr {
    type Writer = &'static Held<Stderr>;

    fn make_writer(&'a self) -> Self::Writer {
        &STDERR
    }
}

/// Where held lines go in the end.
pub trait Sink: Sync {
    /// Writes all of `bytes`.
    fn write_all(&self, bytes: &[u8]) -> io::Result<()>;
}

/// The process's stderr, unbuffered.
#[derive(Debug)]
pub struct Stderr;

impl Sink for Stderr {
    fn write_all(&self, bytes: &[u8]) -> io::Result<()> {
        io::stderr().lock().write_all(bytes)
    }
}

/// Lines held for a [`Sink`], and code put off that logs more.
pub struct Held<S> {
    lines: Mutex<Lines>,
    /// Put off by [`after_answer`], oldest first.
    deferred: Mutex<Vec<Deferred>>,
    /// Whether `deferred` may hold something: read without its lock before every line.
    pending: AtomicBool,
    sink: S,
}

impl<S: fmt::Debug> fmt::Debug for Held<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Held")
            .field("lines", &self.lines)
            .field("pending", &self.pending)
            .field("sink", &self.sink)
            .finish_non_exhaustive()
    }
}

/// Whole lines, in a buffer of fixed size.
#[derive(Debug)]
struct Lines {
    bytes: [u8; HOLD_AT_MOST],
    len: usize,
}

impl Lines {
    fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `line` if it fits.
    fn hold(&mut self, line: &[u8]) -> bool {
        let Some(room) = self.bytes.get_mut(self.len..self.len + line.len()) else {
            return false;
        };
        room.copy_from_slice(line);
        self.len += line.len();
        true
    }
}

impl<S: Sink> Held<S> {
    const fn new(sink: S) -> Self {
        Self {
            lines: Mutex::new(Lines {
                bytes: [0; HOLD_AT_MOST],
                len: 0,
            }),
            deferred: Mutex::new(Vec::new()),
            pending: AtomicBool::new(false),
            sink,
        }
    }

    /// Keeps `log` until [`Self::run_deferred`] runs or anything logs; true when the list is
    /// full and should be run now.
    fn put_off(&self, log: Deferred) -> bool {
        let mut deferred = self.deferred();
        deferred.push(log);
        self.pending.store(true, Ordering::Release);
        deferred.len() >= DEFER_AT_MOST
    }

    /// Runs what was put off, oldest first.
    fn run_deferred(&self) {
        // Read before it is written: every line passes here, on every thread.
        if !self.pending.load(Ordering::Acquire) || !self.pending.swap(false, Ordering::AcqRel) {
            return;
        }
        // Taken out first: what runs logs, and each of its lines comes back here.
        let mut batch = std::mem::take(&mut *self.deferred());
        for log in batch.drain(..) {
            // A panic while formatting a line must not take a runtime worker with it; the line
            // is lost, as it would be if it had panicked where it was logged.
            let _ = std::panic::catch_unwind(AssertUnwindSafe(log));
        }
        // The emptied list keeps its room for the next batch.
        let mut deferred = self.deferred();
        if deferred.capacity() == 0 {
            *deferred = batch;
        }
    }

    fn deferred(&self) -> MutexGuard<'_, Vec<Deferred>> {
        // A push or a take: a poisoned lock leaves a whole list behind.
        self.deferred.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes what is held.
    fn flush_held(&self) {
        let mut lines = self.lines();
        if !lines.is_empty() {
            // Nowhere to report that stderr failed: these lines are lost, as a line written at
            // once would be.
            let _ = self.write_out(&mut lines);
        }
    }

    /// Holds `line` when this thread holds lines (after writing what is held if it does not fit
    /// beside it), else writes what is held and then `line`.
    fn log(&self, line: &[u8]) -> io::Result<()> {
        // What was put off before this line comes first.
        self.run_deferred();
        let holds = HOLDS.get();
        let mut lines = self.lines();
        if holds && lines.hold(line) {
            return Ok(());
        }
        let held = if lines.is_empty() {
            Ok(())
        } else {
            self.write_out(&mut lines)
        };
        if holds && lines.hold(line) {
            return held;
        }
        held.and(self.sink.write_all(line))
    }

    fn write_out(&self, lines: &mut Lines) -> io::Result<()> {
        let written = self.sink.write_all(&lines.bytes[..lines.len]);
        lines.len = 0;
        written
    }

    fn lines(&self) -> MutexGuard<'_, Lines> {
        // Every operation under this lock leaves whole lines behind (a line is appended in one
        // call), so a poisoned lock is still safe to use.
        self.lines.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<S: Sink> Write for &Held<S> {
    fn write(&mut self, line: &[u8]) -> io::Result<usize> {
        self.log(line)?;
        Ok(line.len())
    }

    fn write_all(&mut self, line: &[u8]) -> io::Result<()> {
        self.log(line)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[derive(Debug, Default)]
    struct Recorded(Mutex<Vec<Vec<u8>>>);

    impl Sink for Recorded {
        fn write_all(&self, bytes: &[u8]) -> io::Result<()> {
            self.0.lock().unwrap().push(bytes.to_vec());
            Ok(())
        }
    }

    /// What the park hook does, for a test's own `Held`.
    fn park(held: &Held<Recorded>) {
        HOLDS.set(true);
        held.flush_held();
    }

    /// Runs `f` on a fresh thread that has parked once, as a runtime worker has.
    fn on_a_worker(held: &Held<Recorded>, f: impl FnOnce() + Send) {
        std::thread::scope(|s| {
            s.spawn(|| {
                park(held);
                f();
            });
        });
    }

    fn writes(held: &Held<Recorded>) -> Vec<String> {
        let writes = held.sink.0.lock().unwrap();
        writes
            .iter()
            .map(|w| String::from_utf8(w.clone()).unwrap())
            .collect()
    }

    #[test]
    fn a_thread_that_never_parked_writes_each_line_at_once() {
        let held = Held::new(Recorded::default());
        std::thread::scope(|s| {
            s.spawn(|| {
                (&held).write_all(b"one\n").unwrap();
                (&held).write_all(b"two\n").unwrap();
            });
        });
        assert_eq!(writes(&held), ["one\n", "two\n"]);
    }

    #[test]
    fn a_worker_holds_its_lines_until_it_parks_and_writes_them_in_one_go() {
        let held = Held::new(Recorded::default());
        on_a_worker(&held, || {
            (&held).write_all(b"mounted a\n").unwrap();
            (&held).write_all(b"mounted b\n").unwrap();
            assert!(writes(&held).is_empty(), "written before the park");
            park(&held);
            assert_eq!(writes(&held), ["mounted a\nmounted b\n"]);
            park(&held);
            assert_eq!(writes(&held).len(), 1, "nothing held, nothing written");
        });
    }

    #[test]
    fn a_line_from_another_thread_writes_the_held_lines_first_so_order_is_kept() {
        let held = Held::new(Recorded::default());
        std::thread::scope(|s| {
            s.spawn(|| {
                park(&held);
                (&held).write_all(b"worker\n").unwrap();
            })
            .join()
            .unwrap();
            s.spawn(|| (&held).write_all(b"blocking thread\n").unwrap());
        });
        assert_eq!(writes(&held), ["worker\n", "blocking thread\n"]);
    }

    #[test]
    fn a_busy_worker_writes_what_is_held_when_the_next_line_does_not_fit() {
        let held = Held::new(Recorded::default());
        on_a_worker(&held, || {
            let line = [b'x'; 1000];
            let fit = HOLD_AT_MOST / line.len();
            for _ in 0..fit {
                (&held).write_all(&line).unwrap();
            }
            assert!(writes(&held).is_empty());
            (&held).write_all(&line).unwrap();
            let written = writes(&held);
            assert_eq!(written.len(), 1);
            assert_eq!(written[0].len(), fit * line.len());
            assert_eq!(held.lines().len, line.len(), "the last line is held");

            // A line longer than the buffer is written at once, after what is held.
            let long = vec![b'y'; HOLD_AT_MOST + 1];
            (&held).write_all(&long).unwrap();
            let written = writes(&held);
            assert_eq!(written.len(), 3);
            assert_eq!(written[1].as_bytes(), line);
            assert_eq!(written[2].as_bytes(), long);
            assert!(held.lines().is_empty());
        });
    }

    /// What put-off code did, in order.
    type Ran = Arc<Mutex<Vec<usize>>>;

    /// What [`after_answer`] does on a worker, for a test's own `Held`, but for the task.
    fn put_off(held: &Held<Recorded>, ran: &Ran, n: usize) {
        let ran = Arc::clone(ran);
        if held.put_off(Box::new(move || ran.lock().unwrap().push(n))) {
            held.run_deferred();
        }
    }

    fn seen(ran: &Ran) -> Vec<usize> {
        ran.lock().unwrap().clone()
    }

    #[test]
    fn a_thread_that_never_parked_logs_what_it_would_put_off_at_once() {
        std::thread::spawn(|| {
            let ran = Ran::default();
            let r = Arc::clone(&ran);
            after_answer(move || r.lock().unwrap().push(1));
            assert_eq!(seen(&ran), [1]);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn what_was_put_off_is_logged_when_its_task_runs_or_before_any_later_line() {
        let held = Held::new(Recorded::default());
        let ran = Ran::default();
        put_off(&held, &ran, 1);
        put_off(&held, &ran, 2);
        assert!(seen(&ran).is_empty(), "run at once");
        park(&held);
        assert!(
            seen(&ran).is_empty(),
            "run when the worker parked, right after the answer"
        );
        held.run_deferred();
        assert_eq!(seen(&ran), [1, 2]);
        // A line logged later, on any thread, comes after what waits.
        let written = Arc::new(Mutex::new(0));
        let (r, w) = (Arc::clone(&ran), Arc::clone(&written));
        let held = Arc::new(held);
        let logger = Arc::clone(&held);
        assert!(!held.put_off(Box::new(move || {
            r.lock().unwrap().push(3);
            *w.lock().unwrap() = logger.sink.0.lock().unwrap().len();
        })));
        let other = Arc::clone(&held);
        std::thread::spawn(move || (&*other).write_all(b"later\n").unwrap())
            .join()
            .unwrap();
        assert_eq!(seen(&ran), [1, 2, 3]);
        assert_eq!(*written.lock().unwrap(), 0, "the later line came first");
        assert_eq!(writes(&held), ["later\n"]);
    }

    #[test]
    fn a_runtime_worker_logs_what_it_put_off_soon_after() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .on_thread_park(write_held)
            .on_thread_stop(flush)
            .build()
            .unwrap();
        let ran = Ran::default();
        runtime.block_on(async {
            for n in 0..3 {
                // Every worker has parked once (and so holds) before the task runs.
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                let ran = Arc::clone(&ran);
                tokio::spawn(async move {
                    after_answer(move || ran.lock().unwrap().push(n));
                })
                .await
                .unwrap();
            }
            tokio::time::sleep(LOG_AFTER * 10).await;
        });
        assert_eq!(seen(&ran), [0, 1, 2]);
        assert!(
            !LOG_SCHEDULED.load(Ordering::Acquire),
            "a task is left behind"
        );
    }

    #[test]
    fn a_full_list_is_logged_at_once_and_a_panic_loses_one_line() {
        let held = Held::new(Recorded::default());
        let ran = Ran::default();
        for n in 0..DEFER_AT_MOST - 1 {
            put_off(&held, &ran, n);
        }
        assert!(held.put_off(Box::new(|| panic!("a bug while formatting"))));
        held.run_deferred();
        // The list was full: all of it ran, but for the line that panicked.
        assert_eq!(seen(&ran), (0..DEFER_AT_MOST - 1).collect::<Vec<_>>());
        put_off(&held, &ran, 99);
        assert_eq!(seen(&ran).len(), DEFER_AT_MOST - 1);
        held.run_deferred();
        assert_eq!(seen(&ran).last(), Some(&99));
    }

    #[test]
    fn the_subscriber_writes_each_event_as_one_held_line() {
        let held: &'static Held<Recorded> = Box::leak(Box::new(Held::new(Recorded::default())));
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || held)
            .finish();
        on_a_worker(held, || {
            tracing::subscriber::with_default(subscriber, || {
                tracing::info!(target_path = "/t", "volume mounted");
                tracing::warn!("second");
            });
            assert!(writes(held).is_empty());
            park(held);
        });
        let written = writes(held);
        assert_eq!(written.len(), 1);
        let lines: Vec<&str> = written[0].lines().collect();
        assert_eq!(lines.len(), 2, "{written:?}");
        assert!(lines[0].contains("volume mounted") && lines[0].contains("target_path=\"/t\""));
        assert!(lines[1].contains("second"));
    }
}
