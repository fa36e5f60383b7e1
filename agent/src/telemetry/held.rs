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
//! (a mount storm) writes in steps of a few KiB, and nothing here ever allocates. A worker that
//! hangs keeps its last lines until another worker parks or anything else logs.
//!
//! A line can be put off further, before it is formatted: [`after_answer`] runs the code that
//! logs it when the worker runs out of work (or has put off [`DEFER_AT_MOST`] of them). Formatting
//! a publish's span and line took about a tenth of the agent's own work on a warm publish
//! (docs/benchmarks.md). A line logged at once by the same worker may come before lines it put off
//! earlier; the CSI edge puts off all of its lines, so a volume's own lines keep their order.
//!
//! Not for formatting lines (tracing-subscriber does) nor for deciding what is logged.

use std::cell::{Cell, RefCell};
use std::io::{self, Write};
use std::panic::AssertUnwindSafe;
use std::sync::{Mutex, MutexGuard, PoisonError};

use tracing_subscriber::fmt::MakeWriter;

/// Most bytes held (about 20 publish lines): a fixed buffer, so that holding lines allocates
/// nothing and a mount storm leaves no memory behind.
const HOLD_AT_MOST: usize = 4096;

/// Most lines a worker puts off before it logs them at once: a worker that stays busy (a mount
/// storm) formats them in batches, and the list stays small.
const DEFER_AT_MOST: usize = 32;

/// Code that logs a line, put off by [`after_answer`].
type Deferred = Box<dyn FnOnce()>;

thread_local! {
    /// Whether this thread holds its lines: set by its first [`write_held`].
    static HOLDS: Cell<bool> = const { Cell::new(false) };
    /// What this worker put off with [`after_answer`], oldest first.
    static DEFERRED: RefCell<Vec<Deferred>> = const { RefCell::new(Vec::new()) };
}

/// The process's held stderr lines.
static STDERR: Held<Stderr> = Held::new(Stderr);

/// For tokio's `on_thread_park`: logs what this thread put off and writes the lines held so
/// far, and from now on holds the lines this thread logs.
pub fn write_held() {
    HOLDS.set(true);
    run_deferred();
    STDERR.flush_held();
}

/// For tokio's `on_thread_stop`: logs what this thread put off and writes the lines held so far.
pub fn flush() {
    run_deferred();
    STDERR.flush_held();
}

/// Runs `log` (code that logs) once this runtime worker has run out of work, after the answer
/// its line describes; at once on any other thread.
pub fn after_answer(log: impl FnOnce() + 'static) {
    if !HOLDS.get() {
        log();
        return;
    }
    let full = DEFERRED.with_borrow_mut(|deferred| {
        deferred.push(Box::new(log));
        deferred.len() >= DEFER_AT_MOST
    });
    if full {
        run_deferred();
    }
}

/// Runs what this thread put off, oldest first.
fn run_deferred() {
    // Taken out of the cell first: what runs only logs, but must find the cell free.
    let mut batch = DEFERRED.take();
    if batch.is_empty() {
        return;
    }
    for log in batch.drain(..) {
        // A panic while formatting a line must not take the runtime's worker with it; the line
        // is lost, as it would be if it had panicked where it was logged.
        let _ = std::panic::catch_unwind(AssertUnwindSafe(log));
    }
    // The emptied list keeps its room for the next batch.
    DEFERRED.with_borrow_mut(|deferred| {
        if deferred.is_empty() {
            *deferred = batch;
        }
    });
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

/// Lines held for a [`Sink`].
#[derive(Debug)]
pub struct Held<S> {
    lines: Mutex<Lines>,
    sink: S,
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
            sink,
        }
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

    /// What [`after_answer`]'s code did, in order.
    type Ran = std::rc::Rc<RefCell<Vec<usize>>>;

    fn put_off(ran: &Ran, n: usize) {
        let ran = ran.clone();
        after_answer(move || ran.borrow_mut().push(n));
    }

    #[test]
    fn a_thread_that_never_parked_logs_what_it_would_put_off_at_once() {
        std::thread::spawn(|| {
            let ran = Ran::default();
            put_off(&ran, 1);
            assert_eq!(*ran.borrow(), [1]);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_worker_logs_what_it_put_off_when_it_parks_or_stops_in_order() {
        let held = Held::new(Recorded::default());
        on_a_worker(&held, || {
            let ran = Ran::default();
            put_off(&ran, 1);
            put_off(&ran, 2);
            assert!(
                ran.borrow().is_empty(),
                "run before the worker ran out of work"
            );
            write_held();
            assert_eq!(*ran.borrow(), [1, 2]);
            put_off(&ran, 3);
            flush();
            assert_eq!(*ran.borrow(), [1, 2, 3]);
        });
    }

    #[test]
    fn a_busy_worker_logs_what_it_put_off_in_batches_and_a_panic_loses_one_line() {
        let held = Held::new(Recorded::default());
        on_a_worker(&held, || {
            let ran = Ran::default();
            for n in 0..DEFER_AT_MOST - 1 {
                put_off(&ran, n);
            }
            after_answer(|| panic!("a bug while formatting"));
            // The batch is full: all of it ran, but for the line that panicked.
            assert_eq!(*ran.borrow(), (0..DEFER_AT_MOST - 1).collect::<Vec<_>>());
            put_off(&ran, 99);
            assert_eq!(ran.borrow().len(), DEFER_AT_MOST - 1);
            run_deferred();
            assert_eq!(ran.borrow().last(), Some(&99));
        });
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
