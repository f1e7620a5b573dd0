//! Stopping long work from outside, between two of its steps.
//!
//! A caller that can be interrupted (the Python binding, whose user presses Ctrl-C) installs a
//! poll on the thread that runs the work ([`install`]); the long loops of the workspace — MAP
//! training, GFSVI's and VaLLA's optimisers, ELLA's pass, the Laplace passes over the data, the
//! Krylov iterations — call [`check`] between steps and chunks on that thread, and return
//! [`InputError::Interrupted`] when the poll says stop. Nothing else changes: without a poll
//! installed `check` is one thread-local read, and the poll itself runs at most once per its
//! period, so a tight loop pays a clock read per step. The crates know no engine: what a poll
//! asks (Python's signal handlers, a cancelled job) is the installer's.
//!
//! ```
//! use fspace_input::{interrupt, InputError};
//! use std::time::Duration;
//! assert!(interrupt::check("a loop").is_ok()); // no poll installed
//! let guard = interrupt::install(Duration::ZERO, || true);
//! assert_eq!(interrupt::check("a loop"), Err(InputError::Interrupted { during: "a loop" }));
//! drop(guard);
//! assert!(interrupt::check("a loop").is_ok());
//! ```

use std::cell::RefCell;
use std::marker::PhantomData;
use std::time::{Duration, Instant};

use crate::InputError;

struct Poll {
    poll: Box<dyn FnMut() -> bool>,
    every: Duration,
    last: Instant,
}

thread_local! {
    static POLL: RefCell<Option<Poll>> = const { RefCell::new(None) };
}

/// Keeps a poll installed on its thread; dropping it restores the poll it replaced.
#[must_use = "the poll is removed when the guard drops"]
pub struct Guard {
    previous: Option<Poll>,
    /// The poll belongs to the thread that installed it.
    _thread: PhantomData<*const ()>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let previous = self.previous.take();
        POLL.with(|p| {
            if let Ok(mut slot) = p.try_borrow_mut() {
                *slot = previous;
            }
        });
    }
}

/// Installs `poll` as this thread's interrupt check until the returned guard drops: [`check`]
/// calls it at most once per `every` (the first time after `every` has passed) and reports an
/// interruption when it returns `true`.
pub fn install(every: Duration, poll: impl FnMut() -> bool + 'static) -> Guard {
    let new = Poll { poll: Box::new(poll), every, last: Instant::now() };
    let previous = POLL.with(|p| p.borrow_mut().replace(new));
    Guard { previous, _thread: PhantomData }
}

/// `Err(InputError::Interrupted { during })` when this thread's poll (if any, and if its period
/// has passed) says stop; `Ok(())` otherwise. Called by long loops between steps.
pub fn check(during: &'static str) -> Result<(), InputError> {
    POLL.with(|p| {
        // A poll that itself reaches a check (re-entrancy) is not polled again.
        let Ok(mut slot) = p.try_borrow_mut() else { return Ok(()) };
        let Some(poll) = slot.as_mut() else { return Ok(()) };
        let now = Instant::now();
        if now.duration_since(poll.last) < poll.every {
            return Ok(());
        }
        poll.last = now;
        if (poll.poll)() {
            Err(InputError::Interrupted { during })
        } else {
            Ok(())
        }
    })
}

/// `work()` — one long call that has no steps to check between (a dense factorisation) —
/// with this thread's poll still heard: where a poll is installed, `work` runs on a thread of
/// its own while this thread checks every few milliseconds, and an interruption returns
/// [`InputError::Interrupted`] at once, leaving `work` to finish unseen on its thread (its CPU
/// time is spent, its result dropped). Without a poll `work` runs here, as a plain call.
pub fn wait_for<T: Send + 'static>(
    during: &'static str,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, InputError> {
    let polled = POLL.with(|p| p.try_borrow().map(|slot| slot.is_some()).unwrap_or(false));
    if !polled {
        return Ok(work());
    }
    let (send, receive) = std::sync::mpsc::channel();
    let worker = std::thread::Builder::new().name("fspace-wait-for".into()).spawn(move || {
        // The receiver is gone only after an interruption: the result is not wanted then.
        let _ = send.send(work());
    });
    if worker.is_err() {
        // No thread to be had (the call went with the refused thread).
        return Err(InputError::Invalid {
            what: "a thread for a long call",
            reason: format!("the system refused one during {during}"),
        });
    }
    loop {
        match receive.recv_timeout(Duration::from_millis(5)) {
            Ok(value) => return Ok(value),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => check(during)?,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(InputError::Invalid { what: "a long call", reason: format!("{during} panicked") })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    #[test]
    fn the_poll_runs_once_per_period_and_nests() {
        let calls = Rc::new(Cell::new(0));
        let c = calls.clone();
        let outer = install(Duration::from_secs(3600), move || {
            c.set(c.get() + 1);
            true
        });
        // Within the period: not polled.
        assert!(check("x").is_ok());
        assert_eq!(calls.get(), 0);
        {
            let _inner = install(Duration::ZERO, || true);
            assert!(check("y").is_err());
        }
        // The outer poll is back (still within its period).
        assert!(check("x").is_ok());
        drop(outer);
        assert!(check("x").is_ok());
        // Another thread never sees this thread's poll.
        let _g = install(Duration::ZERO, || true);
        assert!(std::thread::spawn(|| check("z").is_ok()).join().unwrap());
    }

    #[test]
    fn a_long_call_is_left_at_the_first_check_that_says_stop() {
        // Without a poll: a plain call.
        assert_eq!(wait_for("sum", || 2 + 2), Ok(4));
        // A poll that never stops: the call's value.
        let keep = install(Duration::ZERO, || false);
        assert_eq!(wait_for("sum", || 3 + 4), Ok(7));
        drop(keep);
        // A poll that stops after 30 ms: a call of 10 s is left within a fraction of a second.
        let start = Instant::now();
        let _stop = install(Duration::ZERO, move || start.elapsed() > Duration::from_millis(30));
        let left = wait_for("a sleep", || std::thread::sleep(Duration::from_secs(10)));
        assert_eq!(left, Err(InputError::Interrupted { during: "a sleep" }));
        assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
    }
}
