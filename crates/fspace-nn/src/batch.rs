//! Row-major batch helpers shared by the MLP's and the CNN's batched passes: the vectorised
//! `tanh`, activations with their slopes, bias rows, column sums, short copies, the
//! column-major → row-major copy and the cotangent check.

use fspace_input::InputError;
use nalgebra::DMatrix;
use rayon::prelude::*;

use crate::activation::Activation;
use crate::error::{NnError, Result};

/// Element-wise work below this many entries stays on the calling thread.
const PARALLEL_MIN_ELEMENTS: usize = 1 << 14;

/// `ln 2` split for Cody–Waite range reduction (`LN2_HI` has 32 trailing zero bits, so
/// `k·LN2_HI` is exact for the `|k| ≤ 64` used here).
const LN2_HI: f64 = 0.693_147_180_369_123_8; // 0x1.62e42fee00000p-1
const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;
/// `1.5·2⁵²`: adding and subtracting it rounds to the nearest integer, and the sum's low bits
/// hold that integer (two's complement).
const ROUND_MAGIC: f64 = 6_755_399_441_055_744.0;

/// `tanh x` without a libm call, in straight-line arithmetic the compiler vectorises (the
/// batched passes evaluate millions per CNN step; glibc's scalar `tanh` dominated them):
/// `tanh|x| = e/(e + 2)` with `e = expm1(2|x|)`, and `expm1(y) = 2ᵏ q(r) + (2ᵏ − 1)` for
/// `y = k ln 2 + r`, `|r| ≤ ln2/2`, with `q(r) = eʳ − 1` its Taylor polynomial to `r¹³`
/// (truncation below 1e-17 relative). Without cancellation for small `|x|` (`k = 0` gives
/// `e = q(r)`), the result is within a few ulp of `f64::tanh` (tested over 10⁶ points).
#[inline(always)]
pub(crate) fn fast_tanh(x: f64) -> f64 {
    let y = 2.0 * x.abs();
    let y = if y > 44.0 { 44.0 } else { y }; // tanh(22) = 1 in f64; keeps NaN
    let shifted = y * std::f64::consts::LOG2_E + ROUND_MAGIC;
    let k = shifted - ROUND_MAGIC;
    let r = (y - k * LN2_HI) - k * LN2_LO;
    // q(r) = r + r²/2! + … + r¹³/13!, Horner.
    let mut q = 1.0 / 6_227_020_800.0;
    for c in [
        1.0 / 479_001_600.0,
        1.0 / 39_916_800.0,
        1.0 / 3_628_800.0,
        1.0 / 362_880.0,
        1.0 / 40_320.0,
        1.0 / 5_040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
    ] {
        q = q * r + c;
    }
    q *= r;
    let two_k = f64::from_bits(shifted.to_bits().wrapping_add(1023) << 52);
    let e = two_k * q + (two_k - 1.0);
    (e / (e + 2.0)).copysign(x)
}

/// `tanh` of a block in place, with `1 − tanh²` into `slopes` if given (same length), compiled
/// for the widest vector unit the CPU has: `pulp`'s safe run-time dispatch builds
/// [`pulp::WithSimd::with_simd`] once for AVX2 and once for the SSE2 baseline. Only the vector
/// width differs between the two: the compiler neither fuses multiply-adds nor reorders
/// operations, so both give the same bits (tested).
struct TanhBlock<'a> {
    z: &'a mut [f64],
    slopes: Option<&'a mut [f64]>,
}

impl pulp::WithSimd for TanhBlock<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        // Blocks of `LANES` independent evaluations give the out-of-order core several
        // vectors' polynomial chains to overlap.
        const LANES: usize = 16;
        let tanh_all = |z: &mut [f64]| z.iter_mut().for_each(|v| *v = fast_tanh(*v));
        let with_slopes = |z: &mut [f64], s: &mut [f64]| {
            for (zv, sv) in z.iter_mut().zip(s.iter_mut()) {
                let t = fast_tanh(*zv);
                (*zv, *sv) = (t, 1.0 - t * t);
            }
        };
        match self.slopes {
            Some(s) => {
                let mut zc = self.z.chunks_exact_mut(LANES);
                let mut sc = s.chunks_exact_mut(LANES);
                for (zb, sb) in (&mut zc).zip(&mut sc) {
                    let zb: &mut [f64; LANES] = zb.try_into().expect("chunk of LANES");
                    let sb: &mut [f64; LANES] = sb.try_into().expect("chunk of LANES");
                    with_slopes(zb, sb);
                }
                with_slopes(zc.into_remainder(), sc.into_remainder());
            }
            None => {
                let mut zc = self.z.chunks_exact_mut(LANES);
                for zb in &mut zc {
                    let zb: &mut [f64; LANES] = zb.try_into().expect("chunk of LANES");
                    tanh_all(zb);
                }
                tanh_all(zc.into_remainder());
            }
        }
    }
}

/// `z ← σ(z)` and, if asked, `slopes ← σ'(z)` (parallel in chunks for large batches).
pub(crate) fn activate(act: Activation, z: &mut [f64], slopes: Option<&mut Vec<f64>>) {
    const CHUNK: usize = 4096;
    let body = |zc: &mut [f64], sc: Option<&mut [f64]>| match (act, sc) {
        (Activation::Tanh, slopes) => pulp::Arch::new().dispatch(TanhBlock { z: zc, slopes }),
        (_, Some(sc)) => {
            zc.iter_mut().zip(sc.iter_mut()).for_each(|(zv, sv)| (*zv, *sv) = act.value_slope(*zv))
        }
        (_, None) => zc.iter_mut().for_each(|v| *v = act.value(*v)),
    };
    match slopes {
        Some(s) => {
            s.resize(z.len(), 0.0);
            if z.len() >= PARALLEL_MIN_ELEMENTS {
                z.par_chunks_mut(CHUNK).zip(s.par_chunks_mut(CHUNK)).for_each(|(zc, sc)| body(zc, Some(sc)));
            } else {
                body(z, Some(s));
            }
        }
        None if z.len() >= PARALLEL_MIN_ELEMENTS => z.par_chunks_mut(CHUNK).for_each(|zc| body(zc, None)),
        None => body(z, None),
    }
}

/// `a ← a ⊙ s` (parallel in chunks for large batches).
pub(crate) fn scale_by(a: &mut [f64], s: &[f64]) {
    const CHUNK: usize = 4096;
    let body = |(ac, sc): (&mut [f64], &[f64])| ac.iter_mut().zip(sc).for_each(|(x, y)| *x *= y);
    if a.len() >= PARALLEL_MIN_ELEMENTS {
        a.par_chunks_mut(CHUNK).zip(s.par_chunks(CHUNK)).for_each(body);
    } else {
        body((a, s));
    }
}

/// Column sums of a row-major `n × m` buffer added into `out` (length `m`).
pub(crate) fn add_column_sums(rows: &[f64], m: usize, out: &mut [f64]) {
    for row in rows.chunks_exact(m) {
        out.iter_mut().zip(row).for_each(|(o, r)| *o += r);
    }
}

/// `rows` copies of `flat[b..b + width]` (a bias broadcast over a batch), from the scratch pool.
pub(crate) fn bias_rows(flat: &[f64], b: usize, width: usize, rows: usize) -> Vec<f64> {
    const ROWS_PER_TASK: usize = 1024;
    let mut z = crate::scratch::overwritten(rows * width);
    let bias = &flat[b..b + width];
    let fill = |block: &mut [f64]| block.chunks_exact_mut(width).for_each(|row| copy_short(row, bias));
    if z.len() >= PARALLEL_MIN_ELEMENTS && width > 0 {
        z.par_chunks_mut(width * ROWS_PER_TASK).for_each(fill);
    } else {
        fill(&mut z);
    }
    z
}

/// `dst ← src` for the short runs of im2col and the bias rows of narrow layers (often 3 to 6
/// values): blocks of 4 as fixed-size copies and the rest one by one, instead of a `memcpy`
/// call per run; longer runs go to `copy_from_slice`.
pub(crate) fn copy_short(dst: &mut [f64], src: &[f64]) {
    debug_assert_eq!(dst.len(), src.len());
    if dst.len() > 16 {
        dst.copy_from_slice(src);
        return;
    }
    let mut d = dst.chunks_exact_mut(4);
    let mut s = src.chunks_exact(4);
    for (d4, s4) in (&mut d).zip(&mut s) {
        let d4: &mut [f64; 4] = d4.try_into().expect("a block of 4");
        *d4 = s4.try_into().expect("a block of 4");
    }
    for (v, w) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *v = *w;
    }
}

/// A row-major copy of a column-major matrix.
pub(crate) fn row_major(m: &DMatrix<f64>) -> Vec<f64> {
    m.transpose().as_slice().to_vec()
}

/// A finite `n × d'` cotangent.
pub(crate) fn check_cotangent(v: &DMatrix<f64>, n: usize, q: usize) -> Result<()> {
    if v.shape() != (n, q) {
        return Err(NnError::Input(InputError::DimensionMismatch {
            what: "cotangent rows × columns",
            expected: n * q,
            found: v.len(),
        }));
    }
    if v.iter().any(|c| !c.is_finite()) {
        return Err(NnError::Input(InputError::NonFinite { what: "cotangent" }));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{activate, fast_tanh};
    use crate::activation::Activation;

    #[test]
    fn the_vector_unit_tanh_gives_the_scalar_bits() {
        // Lengths around the block of 16 and the parallel threshold; special values included.
        for n in [1, 15, 16, 17, 100, 1 << 14, (1 << 14) + 37] {
            let z: Vec<f64> = (0..n)
                .map(|i| match i % 11 {
                    0 => -0.0,
                    1 => f64::INFINITY,
                    2 => 1e-300,
                    3 => 30.0,
                    _ => ((i as f64) * 0.37).sin() * 4.0,
                })
                .collect();
            let mut values = z.clone();
            let mut slopes = Vec::new();
            activate(Activation::Tanh, &mut values, Some(&mut slopes));
            let mut plain = z.clone();
            activate(Activation::Tanh, &mut plain, None);
            for (i, &x) in z.iter().enumerate() {
                let t = fast_tanh(x);
                assert_eq!(values[i].to_bits(), t.to_bits(), "tanh({x}) at {i} of {n}");
                assert_eq!(plain[i].to_bits(), t.to_bits(), "tanh({x}) at {i} of {n}, no slopes");
                assert_eq!(slopes[i].to_bits(), (1.0 - t * t).to_bits(), "slope at {x}");
            }
        }
        let mut nan = vec![f64::NAN; 20];
        activate(Activation::Tanh, &mut nan, None);
        assert!(nan.iter().all(|v| v.is_nan()));
    }

    #[test]
    fn fast_tanh_is_within_a_few_ulp_of_libm() {
        let mut worst = 0.0f64;
        for i in 0..1_000_000 {
            // Dense near 0 (relative accuracy) and out to the saturation.
            let u = i as f64 / 1_000_000.0;
            for x in [u * 25.0 - 12.5, (u - 0.5) * 1e-3, (u - 0.5) * 1e-9] {
                let (got, want) = (fast_tanh(x), x.tanh());
                let ulps = (got - want).abs() / (want.abs() * f64::EPSILON).max(f64::MIN_POSITIVE);
                worst = worst.max(ulps);
            }
        }
        assert!(worst <= 4.0, "worst error {worst} ulp");
        for (x, t) in
            [(0.0, 0.0), (30.0, 1.0), (-30.0, -1.0), (f64::INFINITY, 1.0), (f64::NEG_INFINITY, -1.0)]
        {
            assert_eq!(fast_tanh(x), t);
        }
        assert!(fast_tanh(f64::NAN).is_nan());
        assert!(fast_tanh(-0.0).is_sign_negative());
    }
}
