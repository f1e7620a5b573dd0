//! A memory budget, checked before the allocations whose size comes from the caller.
//!
//! A dense curvature of `p²` entries, a KFAC factor of `fan²`, `S × p` weight samples, a Gram
//! matrix at `M` measurement points: asked for something that cannot fit, an allocator aborts
//! the whole process (a Python interpreter with it) instead of returning an error. So the
//! places that allocate by a caller's size first [`ensure`] that the bytes fit the budget and
//! otherwise return [`InputError::TooLarge`], naming the structure, the size and a cheaper
//! choice. The budget is the machine's available memory (Linux's `MemAvailable`, read at each
//! check), or the limit [`set_limit`] or the environment variable `FSPACE_MEMORY_LIMIT` (bytes)
//! sets; where neither is known, no limit.
//!
//! ```
//! use fspace_input::{budget, InputError};
//! budget::set_limit(Some(1 << 30));
//! assert!(budget::ensure("a 1 000² matrix", budget::matrix_bytes(1_000, 1_000), "fewer points").is_ok());
//! let err = budget::ensure("a 20 000² matrix", budget::matrix_bytes(20_000, 20_000), "fewer points").unwrap_err();
//! assert!(matches!(err, InputError::TooLarge { .. }));
//! budget::set_limit(None);
//! ```

use std::sync::atomic::{AtomicU64, Ordering};

use crate::InputError;

/// The limit set by [`set_limit`] (0: none set).
static LIMIT: AtomicU64 = AtomicU64::new(0);

/// Sets the budget in bytes for every thread (`None`: back to `FSPACE_MEMORY_LIMIT` or the
/// available memory).
pub fn set_limit(bytes: Option<u64>) {
    LIMIT.store(bytes.unwrap_or(0).max(u64::from(bytes.is_some())), Ordering::Relaxed);
}

/// The budget in bytes now: [`set_limit`]'s, else `FSPACE_MEMORY_LIMIT`'s, else the available
/// memory; `None` where none is known.
pub fn limit() -> Option<u64> {
    match LIMIT.load(Ordering::Relaxed) {
        0 => std::env::var("FSPACE_MEMORY_LIMIT")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|&v| v > 0)
            .or_else(available),
        set => Some(set),
    }
}

/// Linux's `MemAvailable` in bytes (`None` elsewhere).
fn available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// The bytes of an `rows × cols` matrix of `f64` (saturating: a product past `u128` is huge
/// anyway).
pub fn matrix_bytes(rows: usize, cols: usize) -> u128 {
    (rows as u128).saturating_mul(cols as u128).saturating_mul(8)
}

/// `Ok` when `bytes` fit the budget, else [`InputError::TooLarge`] naming `what` and `cheaper`
/// (what to ask for instead).
pub fn ensure(what: &'static str, bytes: u128, cheaper: &'static str) -> Result<(), InputError> {
    match limit() {
        Some(limit) if bytes > u128::from(limit) => Err(InputError::TooLarge { what, bytes, limit, cheaper }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_refuses_what_does_not_fit_and_names_it() {
        set_limit(Some(8_000));
        assert!(ensure("x", matrix_bytes(10, 100), "y").is_ok());
        let err =
            ensure("a KFAC output factor", matrix_bytes(100, 100), "hessian_structure=\"diag\"").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("a KFAC output factor") && text.contains("diag"), "{text}");
        assert_eq!(matrix_bytes(usize::MAX, usize::MAX), u128::MAX);
        set_limit(None);
        // The machine's own budget is known on Linux and refuses an exabyte.
        if cfg!(target_os = "linux") {
            assert!(limit().is_some());
            assert!(ensure("x", 1 << 60, "y").is_err());
        }
    }
}
