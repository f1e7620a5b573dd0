//! Cleaning the vector registers after faer's kernels.
//!
//! faer 0.22's x86 matrix-multiply kernels (the generated assembly of `private-gemm-x86`)
//! return with the upper halves of the YMM/ZMM registers dirty. Until the thread executes
//! `vzeroupper`, every legacy-SSE instruction it runs pays Intel's AVX→SSE transition penalty —
//! glibc's `tanh`, `exp` and `expm1`, which dfdx's activations call for every unit, among them
//! (`docs/PERFORMANCE.md`, "After faer's kernels", has the measurement).
//!
//! So every function of [`crate::fast`] and [`crate::dense`] that calls faer holds a
//! [`CleanOnDrop`] guard: on every return path it executes `vzeroupper` on the calling thread
//! and, when faer ran on rayon's pool, queues the same on every pool thread.
//!
//! The library crates forbid `unsafe`; this crate denies it (its `Cargo.toml`) and this module
//! alone allows it, for the one `asm!` statement below.
#![allow(unsafe_code)]

/// Zeroes bits 128 and up of the vector registers on the calling thread (`vzeroupper`), where
/// the CPU has AVX; nothing elsewhere.
pub(crate) fn clear_upper_vector_state() {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: `vzeroupper` exists wherever AVX does (checked above). It changes only the
        // vector registers' upper bits; `clobber_abi("C")` declares every call-clobbered
        // register — all vector registers among them — as overwritten, so the compiler keeps no
        // live value in one across this statement. It reads and writes no memory, uses no stack
        // and leaves the flags alone.
        unsafe { std::arch::asm!("vzeroupper", clobber_abi("C"), options(nomem, nostack, preserves_flags)) }
    }
}

/// Runs [`clear_upper_vector_state`] when dropped: on the calling thread, and on every thread
/// of the current rayon pool when `parallel` (queued with `spawn_broadcast`, so nothing waits).
pub(crate) struct CleanOnDrop {
    parallel: bool,
}

impl CleanOnDrop {
    /// A guard for a faer call on the calling thread only.
    pub(crate) fn serial() -> Self {
        Self { parallel: false }
    }
    /// A guard for a faer call that may have run on rayon's pool.
    pub(crate) fn parallel() -> Self {
        Self { parallel: true }
    }
    /// The guard for a faer call under `par`.
    pub(crate) fn for_par(par: faer::Par) -> Self {
        Self { parallel: !matches!(par, faer::Par::Seq) }
    }
}

impl Drop for CleanOnDrop {
    fn drop(&mut self) {
        clear_upper_vector_state();
        if self.parallel && rayon::current_num_threads() > 1 {
            rayon::spawn_broadcast(|_| clear_upper_vector_state());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clearing_keeps_scalar_and_vector_values_the_compiler_holds() {
        // Values live across the asm statement must survive it (the clobber list is right).
        let v: Vec<f64> = (0..64).map(|i| (i as f64).sin()).collect();
        let before: f64 = v.iter().map(|x| x * x).sum();
        let a = std::hint::black_box(1.25f64);
        clear_upper_vector_state();
        let after: f64 = v.iter().map(|x| x * x).sum();
        assert_eq!(before.to_bits(), after.to_bits());
        assert_eq!(a * 2.0, 2.5);
        drop(CleanOnDrop::parallel());
        drop(CleanOnDrop::serial());
    }
}
