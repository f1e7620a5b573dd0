//! Blocked (BLAS-3) Cholesky factorisation and triangular solves.
//!
//! nalgebra's Cholesky and triangular solves work column by column; beyond `n ≈ 1000` they are
//! memory-bound (measured: 12.3 s for a 4000 × 4000 Cholesky, 76 s for `K⁻¹`). Here the
//! factorisation is right-looking with `NB × NB` diagonal blocks: factor the diagonal block,
//! solve the panel below it, and update the trailing matrix with one matrix product
//! (`A₂₂ −= L₂₁L₂₁ᵀ`), split over column chunks in parallel. Triangular solves with many
//! right-hand sides are blocked the same way and parallel over right-hand-side columns.

use nalgebra::{DMatrix, DMatrixViewMut};
use rayon::prelude::*;

/// Diagonal block size.
const NB: usize = 96;
/// Right-hand-side columns per parallel task in the triangular solves.
const RHS_CHUNK: usize = 64;

/// The lower Cholesky factor `L` (`LLᵀ = A`) of a symmetric matrix given by its lower triangle;
/// `None` if `A` is not (numerically) positive definite.
pub fn cholesky_lower(a: &DMatrix<f64>) -> Option<DMatrix<f64>> {
    let n = a.nrows();
    let mut l = a.clone();
    let mut k = 0;
    while k < n {
        let b = NB.min(n - k);
        // The diagonal block, copied column by column (a strided view's `clone_owned` goes
        // through an element iterator).
        let mut block = DMatrix::zeros(b, b);
        for (c, col) in block.as_mut_slice().chunks_exact_mut(b).enumerate() {
            col.copy_from_slice(&l.as_slice()[(k + c) * n + k..(k + c) * n + k + b]);
        }
        let l11 = diagonal_block_cholesky(block)?;
        for (c, col) in l11.as_slice().chunks_exact(b).enumerate() {
            l.as_mut_slice()[(k + c) * n + k..(k + c) * n + k + b].copy_from_slice(col);
        }
        let kb = k + b;
        if kb < n {
            let m = n - kb;
            // Panel: L₂₁ = A₂₁ L₁₁⁻ᵀ, i.e. L₁₁ L₂₁ᵀ = A₂₁ᵀ.
            let mut l21t = l.view((kb, k), (m, b)).transpose();
            if !substitute(Triangle::Lower, (l11.as_slice(), b), b, (l21t.as_mut_slice(), b), m) {
                return None;
            }
            let l21 = l21t.transpose();
            l.view_mut((kb, k), (m, b)).copy_from(&l21);
            // Trailing update of the lower part, parallel over column chunks of A₂₂.
            let chunk_cols = NB.max(m.div_ceil(rayon::current_num_threads() * 4));
            l.as_mut_slice()[kb * n..].par_chunks_mut(n * chunk_cols).enumerate().for_each(|(c, cols)| {
                let g0 = kb + c * chunk_cols; // first global column of this chunk
                let w = cols.len() / n;
                let mut view = DMatrixViewMut::from_slice(cols, n, w);
                let mut lower = view.rows_mut(g0, n - g0);
                let r0 = g0 - kb;
                lower.gemm(-1.0, &l21.rows(r0, n - g0), &l21.rows(r0, w).transpose(), 1.0);
            });
        }
        k = kb;
    }
    l.fill_upper_triangle(0.0, 1);
    Some(l)
}

/// Left-looking, column-by-column Cholesky of a small block in place (column-major, `n × n`,
/// lower triangle read and written): column `j` receives `a_{·j} −= l_{jk} l_{·k}` for
/// `k = 0, …, j−1` in that order, one rounded product and one rounded sum per term, then
/// `l_{jj} = √a_{jj}` and the division of the rest of the column. These are the operations of
/// nalgebra's `Cholesky::new` in the same order (so the same bits, tested), on contiguous
/// columns, compiled by `pulp` for the widest vector unit the CPU has. `false` if a pivot is not
/// positive (or NaN).
struct LeftLooking<'a> {
    a: &'a mut [f64],
    n: usize,
}

impl pulp::WithSimd for LeftLooking<'_> {
    type Output = bool;
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) -> bool {
        let (a, n) = (self.a, self.n);
        for j in 0..n {
            let (done, rest) = a.split_at_mut(j * n);
            let col_j = &mut rest[j..n];
            for k in 0..j {
                let col_k = &done[k * n + j..(k + 1) * n];
                let factor = -col_k[0];
                col_j.iter_mut().zip(col_k).for_each(|(y, x)| *y += factor * x);
            }
            let pivot = col_j[0];
            // NaN fails this test too.
            if pivot.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
                return false;
            }
            let root = pivot.sqrt();
            col_j[0] = root;
            col_j[1..].iter_mut().for_each(|v| *v /= root);
        }
        true
    }
}

/// The lower Cholesky factor of a diagonal block (upper triangle zeroed); `None` unless every
/// pivot is positive and finite.
fn diagonal_block_cholesky(mut block: DMatrix<f64>) -> Option<DMatrix<f64>> {
    let n = block.nrows();
    if !pulp::Arch::new().dispatch(LeftLooking { a: block.as_mut_slice(), n }) {
        return None;
    }
    block.fill_upper_triangle(0.0, 1);
    block.diagonal().iter().all(|d| d.is_finite()).then_some(block)
}

/// Which triangle a [`Substitution`] solves with.
#[derive(Clone, Copy)]
enum Triangle {
    Lower,
    Upper,
}

/// `T X = B` in place for a triangular `T` (`n × n`, `T[i, k] = t[k·ldt + i]`) and `cols`
/// right-hand sides (`X[i, j] = x[j·ldx + i]`), column by column with the operations of
/// nalgebra's `solve_{lower,upper}_triangular_mut` in the same order: for each pivot `i`
/// (ascending for `Lower`, descending for `Upper`) `x_i ← x_i / t_ii`, then
/// `x_r += (−x_i)·t_ri` over the rest of the column, one rounded product and one rounded sum
/// per term (so the same bits, tested). nalgebra runs those updates through a strided loop that
/// the compiler does not vectorise; here they are contiguous slices compiled by `pulp`.
/// `false` if a pivot is zero (nalgebra's condition).
struct Substitution<'a> {
    triangle: Triangle,
    t: &'a [f64],
    ldt: usize,
    n: usize,
    x: &'a mut [f64],
    ldx: usize,
    cols: usize,
}

impl pulp::WithSimd for Substitution<'_> {
    type Output = bool;
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) -> bool {
        let Self { triangle, t, ldt, n, x, ldx, cols } = self;
        for j in 0..cols {
            let col = &mut x[j * ldx..j * ldx + n];
            for step in 0..n {
                let i = match triangle {
                    Triangle::Lower => step,
                    Triangle::Upper => n - 1 - step,
                };
                let diag = t[i * ldt + i];
                if diag == 0.0 {
                    return false;
                }
                let coeff = col[i] / diag;
                col[i] = coeff;
                let factor = -coeff;
                let (rest, t_rest) = match triangle {
                    Triangle::Lower => (&mut col[i + 1..], &t[i * ldt + i + 1..i * ldt + n]),
                    Triangle::Upper => (&mut col[..i], &t[i * ldt..i * ldt + i]),
                };
                rest.iter_mut().zip(t_rest).for_each(|(y, v)| *y += factor * v);
            }
        }
        true
    }
}

/// Runs a [`Substitution`] on the widest vector unit the CPU has.
fn substitute(
    triangle: Triangle,
    (t, ldt): (&[f64], usize),
    n: usize,
    (x, ldx): (&mut [f64], usize),
    cols: usize,
) -> bool {
    pulp::Arch::new().dispatch(Substitution { triangle, t, ldt, n, x, ldx, cols })
}

fn par_columns(b: &DMatrix<f64>, f: impl Fn(&mut DMatrix<f64>) + Sync) -> DMatrix<f64> {
    let n = b.nrows();
    if n == 0 || b.ncols() == 0 {
        return b.clone();
    }
    let chunks: Vec<DMatrix<f64>> = b
        .as_slice()
        .par_chunks(n * RHS_CHUNK)
        .map(|cols| {
            let mut x = DMatrix::from_column_slice(n, cols.len() / n, cols);
            f(&mut x);
            x
        })
        .collect();
    let mut out = DMatrix::zeros(n, b.ncols());
    let mut c0 = 0;
    for x in chunks {
        out.columns_mut(c0, x.ncols()).copy_from(&x);
        c0 += x.ncols();
    }
    out
}

/// `L⁻¹ B` for lower-triangular `L` with a positive diagonal (forward substitution by blocks).
pub fn solve_lower(l: &DMatrix<f64>, b: &DMatrix<f64>) -> DMatrix<f64> {
    let n = l.nrows();
    par_columns(b, |x| {
        let mut i0 = 0;
        while i0 < n {
            let bi = NB.min(n - i0);
            if i0 > 0 {
                let (top, mut cur) = x.rows_range_pair_mut(0..i0, i0..i0 + bi);
                cur.gemm(-1.0, &l.view((i0, 0), (bi, i0)), &top, 1.0);
            }
            let cols = x.ncols();
            let t = (&l.as_slice()[i0 * n + i0..], n);
            substitute(Triangle::Lower, t, bi, (&mut x.as_mut_slice()[i0..], n), cols);
            i0 += bi;
        }
    })
}

/// `U⁻¹ B` for upper-triangular `U` with a positive diagonal (back substitution by blocks);
/// with `U = Lᵀ` this is `L⁻ᵀ B`.
pub fn solve_upper(u: &DMatrix<f64>, b: &DMatrix<f64>) -> DMatrix<f64> {
    let n = u.nrows();
    let starts: Vec<usize> = (0..n).step_by(NB).collect();
    par_columns(b, |x| {
        for &i0 in starts.iter().rev() {
            let i1 = (i0 + NB).min(n);
            if i1 < n {
                let (mut cur, bottom) = x.rows_range_pair_mut(i0..i1, i1..n);
                cur.gemm(-1.0, &u.view((i0, i1), (i1 - i0, n - i1)), &bottom, 1.0);
            }
            let cols = x.ncols();
            let t = (&u.as_slice()[i0 * n + i0..], n);
            substitute(Triangle::Upper, t, i1 - i0, (&mut x.as_mut_slice()[i0..], n), cols);
        }
    })
}

/// Column blocks per rayon thread in the parallel products (dynamic load balance).
const BLOCKS_PER_THREAD: usize = 4;

fn block_width(n: usize) -> usize {
    n.div_ceil(rayon::current_num_threads() * BLOCKS_PER_THREAD).max(32)
}

/// `AᵀA` for a tall `A` (`p × n`): each column block of the lower triangle is one GEMM against
/// a shared `Aᵀ`; blocks run in parallel and the result is mirrored.
pub fn par_gram(a: &DMatrix<f64>) -> DMatrix<f64> {
    let n = a.ncols();
    let at = a.transpose();
    let w = block_width(n);
    let blocks: Vec<(usize, DMatrix<f64>)> = (0..n)
        .step_by(w)
        .collect::<Vec<_>>()
        .into_par_iter()
        .map(|c0| {
            let cw = w.min(n - c0);
            (c0, at.rows(c0, n - c0) * a.columns(c0, cw))
        })
        .collect();
    let mut g = DMatrix::zeros(n, n);
    for (c0, b) in blocks {
        g.view_mut((c0, c0), (n - c0, b.ncols())).copy_from(&b);
    }
    g.fill_upper_triangle_with_lower_triangle();
    g
}

/// `A B` with the columns of `B` split over rayon threads.
pub fn par_matmul(a: &DMatrix<f64>, b: &DMatrix<f64>) -> DMatrix<f64> {
    let n = b.ncols();
    let w = block_width(n);
    let blocks: Vec<(usize, DMatrix<f64>)> = (0..n)
        .step_by(w)
        .collect::<Vec<_>>()
        .into_par_iter()
        .map(|c0| (c0, a * b.columns(c0, w.min(n - c0))))
        .collect();
    let mut out = DMatrix::zeros(a.nrows(), n);
    for (c0, blk) in blocks {
        out.columns_mut(c0, blk.ncols()).copy_from(&blk);
    }
    out
}

/// `L⁻¹` of a lower-triangular `L` with a positive diagonal, by recursive halving
/// (`[[A, 0], [B, D]]⁻¹ = [[A⁻¹, 0], [−D⁻¹BA⁻¹, D⁻¹]]`): `n³/3` flops, nearly all in GEMMs.
pub fn lower_triangular_inverse(l: &DMatrix<f64>) -> DMatrix<f64> {
    let n = l.nrows();
    if n <= NB {
        let mut inv = DMatrix::identity(n, n);
        substitute(Triangle::Lower, (l.as_slice(), n), n, (inv.as_mut_slice(), n), n);
        return inv;
    }
    let h = n / 2;
    let top = || lower_triangular_inverse(&l.view((0, 0), (h, h)).clone_owned());
    let bottom = || lower_triangular_inverse(&l.view((h, h), (n - h, n - h)).clone_owned());
    // The halves are independent; side by side once they are worth a thread's wake-up.
    let (a_inv, d_inv) = if n > 2 * NB { rayon::join(top, bottom) } else { (top(), bottom()) };
    let lower = -(&d_inv * (l.view((h, 0), (n - h, h)) * &a_inv));
    let mut inv = DMatrix::zeros(n, n);
    inv.view_mut((0, 0), (h, h)).copy_from(&a_inv);
    inv.view_mut((h, h), (n - h, n - h)).copy_from(&d_inv);
    inv.view_mut((h, 0), (n - h, h)).copy_from(&lower);
    inv
}

/// `(A⁻¹, log|A|)` of a symmetric positive definite `A` through its blocked Cholesky factor,
/// the triangular inverse and `A⁻¹ = L⁻ᵀL⁻¹` (lower-triangle blocks only); `None` if `A` is
/// not numerically positive definite.
pub fn spd_inverse_and_logdet(a: &DMatrix<f64>) -> Option<(DMatrix<f64>, f64)> {
    let l = cholesky_lower(a)?;
    let logdet = 2.0 * l.diagonal().iter().map(|v| v.ln()).sum::<f64>();
    Some((par_gram(&lower_triangular_inverse(&l)), logdet))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fspace_testutil::same_bits;

    /// An SPD test matrix with entries of mixed sign and magnitude.
    fn spd(n: usize) -> DMatrix<f64> {
        let g = DMatrix::from_fn(n, n, |i, j| {
            ((i * 31 + j * 17) % 23) as f64 / 7.0 - 1.5 + (i as f64 * 0.37).sin()
        });
        &g * g.transpose() + DMatrix::identity(n, n) * 0.1
    }

    #[test]
    fn the_diagonal_block_kernel_gives_nalgebras_bits() {
        for n in [1, 2, 5, 17, 96] {
            let a = spd(n);
            let ours = diagonal_block_cholesky(a.clone()).unwrap();
            let theirs = nalgebra::Cholesky::new(a).unwrap().l();
            assert!(same_bits(&ours, &theirs), "n = {n}");
        }
    }

    #[test]
    fn substitution_gives_nalgebras_bits() {
        for n in [1, 2, 7, 96, 131] {
            // A triangle inside a larger matrix (leading dimension n + 3, offset (2, 2)), so that
            // the strides are exercised as in the blocked solves.
            let big = spd(n + 3);
            let lower = big.view((2, 2), (n, n)).lower_triangle();
            let upper = lower.transpose();
            let b = DMatrix::from_fn(n, 5, |i, j| ((i * 7 + j * 3) % 11) as f64 - 4.5);
            for (triangle, t) in [(Triangle::Lower, &lower), (Triangle::Upper, &upper)] {
                let mut theirs = b.clone();
                match triangle {
                    Triangle::Lower => assert!(t.solve_lower_triangular_mut(&mut theirs)),
                    Triangle::Upper => assert!(t.solve_upper_triangular_mut(&mut theirs)),
                }
                let mut stored = big.clone();
                stored.view_mut((2, 2), (n, n)).copy_from(t);
                let ld = n + 3;
                // The right-hand sides in rows 1..n+1 of a taller matrix.
                let mut x = DMatrix::zeros(n + 1, 5);
                x.rows_mut(1, n).copy_from(&b);
                let offset = 2 * ld + 2;
                assert!(substitute(
                    triangle,
                    (&stored.as_slice()[offset..], ld),
                    n,
                    (&mut x.as_mut_slice()[1..], n + 1),
                    5
                ));
                assert!(same_bits(&x.rows(1, n).clone_owned(), &theirs), "n = {n}");
            }
        }
    }

    #[test]
    fn substitution_refuses_a_zero_pivot() {
        let mut l = spd(4).lower_triangle();
        l[(2, 2)] = 0.0;
        let mut x = DMatrix::from_element(4, 2, 1.0);
        assert!(!l.clone().solve_lower_triangular_mut(&mut x.clone()));
        assert!(!substitute(Triangle::Lower, (l.as_slice(), 4), 4, (x.as_mut_slice(), 4), 2));
    }

    #[test]
    fn the_blocked_routines_give_the_column_by_column_bits() {
        // Sizes across one and several diagonal blocks.
        for n in [50, 200, 300] {
            let a = spd(n);
            let l = cholesky_lower(&a).unwrap();
            let b = DMatrix::from_fn(n, 70, |i, j| ((i * 5 + j * 13) % 17) as f64 - 8.0);
            // Each block solve against nalgebra's on the same block: the blocked solve's result
            // is rebuilt from nalgebra's per-block solves with the same GEMM updates.
            let mut reference = b.clone();
            let mut i0 = 0;
            while i0 < n {
                let bi = NB.min(n - i0);
                let (top, mut cur) = reference.rows_range_pair_mut(0..i0, i0..i0 + bi);
                if i0 > 0 {
                    cur.gemm(-1.0, &l.view((i0, 0), (bi, i0)), &top, 1.0);
                }
                l.view((i0, i0), (bi, bi)).solve_lower_triangular_mut(&mut cur);
                i0 += bi;
            }
            // `solve_lower` splits the columns into chunks of `RHS_CHUNK`; each column's
            // arithmetic does not depend on the others.
            assert!(same_bits(&solve_lower(&l, &b), &reference), "n = {n}");
            let u = l.transpose();
            let mut reference = b.clone();
            for i0 in (0..n).step_by(NB).rev() {
                let i1 = (i0 + NB).min(n);
                let (mut cur, bottom) = reference.rows_range_pair_mut(i0..i1, i1..n);
                if i1 < n {
                    cur.gemm(-1.0, &u.view((i0, i1), (i1 - i0, n - i1)), &bottom, 1.0);
                }
                u.view((i0, i0), (i1 - i0, i1 - i0)).solve_upper_triangular_mut(&mut cur);
            }
            assert!(same_bits(&solve_upper(&u, &b), &reference), "n = {n}");
            let inv = lower_triangular_inverse(&l);
            if n <= NB {
                let mut theirs = DMatrix::identity(n, n);
                l.solve_lower_triangular_mut(&mut theirs);
                assert!(same_bits(&inv, &theirs));
            }
        }
    }

    #[test]
    fn the_diagonal_block_kernel_refuses_what_nalgebra_refuses() {
        let mut a = spd(6);
        a[(3, 3)] = -1.0;
        assert!(nalgebra::Cholesky::new(a.clone()).is_none());
        assert!(diagonal_block_cholesky(a.clone()).is_none());
        a[(3, 3)] = f64::NAN;
        assert!(diagonal_block_cholesky(a).is_none());
    }
}
