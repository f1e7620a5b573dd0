//! Ctrl-C in every long call. A fit runs with the GIL released, where Python cannot act on a
//! signal; [`interruptible`] installs a poll of Python's signal handlers on the calling thread
//! (fspace-input's [`interrupt`](fspace_input::interrupt)), which the workspace's loops call
//! between steps and chunks — at most every [`POLL_EVERY`]. When a handler raises (a Ctrl-C:
//! `KeyboardInterrupt`), the loop stops with `InputError::Interrupted` and the call re-raises the
//! handler's exception; the object the call belonged to keeps the state it had before it.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;

/// How often a loop polls Python's signal handlers: far inside the second a user waits, far
/// above the cost of taking the GIL.
pub(crate) const POLL_EVERY: Duration = Duration::from_millis(50);

/// The installed poll (removed when this drops) and the exception a signal handler raised.
pub(crate) struct Interruptible {
    raised: Rc<RefCell<Option<PyErr>>>,
    stop: Arc<AtomicBool>,
    _guard: fspace_input::interrupt::Guard,
}

impl Interruptible {
    /// The exception a signal handler raised during the call, if any (taken).
    pub(crate) fn take(&self) -> Option<PyErr> {
        self.raised.borrow_mut().take()
    }

    /// A flag that stops the call at its next check when set (a progress callback that raised).
    pub(crate) fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }
}

/// Installs the poll on this thread for the life of the returned value.
pub(crate) fn interruptible() -> Interruptible {
    let raised: Rc<RefCell<Option<PyErr>>> = Rc::new(RefCell::new(None));
    let slot = raised.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let guard = fspace_input::interrupt::install(POLL_EVERY, move || {
        if flag.load(Ordering::Relaxed) {
            return true;
        }
        Python::attach(|py| match py.check_signals() {
            Ok(()) => false,
            Err(e) => {
                slot.borrow_mut().get_or_insert(e);
                true
            }
        })
    });
    Interruptible { raised, stop, _guard: guard }
}

/// Runs `work` with the GIL released and Ctrl-C polled, as a fit runs: a query (a predictive,
/// weight or function draws) stops at its next check and re-raises the signal handler's
/// exception; otherwise `work`'s error goes through `raise`.
pub(crate) fn detach_interruptible<T, E, F>(
    py: Python<'_>,
    work: F,
    raise: impl FnOnce(E) -> PyErr,
) -> PyResult<T>
where
    F: pyo3::marker::Ungil + FnOnce() -> Result<T, E>,
    Result<T, E>: pyo3::marker::Ungil,
{
    let interrupt = interruptible();
    let out = py.detach(work);
    if let Some(e) = interrupt.take() {
        return Err(e);
    }
    out.map_err(raise)
}
