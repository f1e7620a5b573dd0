//! Row-major GEMM on flat slices, the kernel under every batched network pass.
//!
//! Networks keep their batches as row-major buffers (a point per row, NHWC for feature maps)
//! and their weights in the flat parameter vector (`W` row-major `out × in`). This module views
//! such slices as nalgebra matrices with explicit strides — a transposed operand is the same
//! slice with its strides swapped, never a copy — and calls nalgebra's `gemm`, which hands
//! strided `f64` products above 5×5 to `matrixmultiply`'s packed, vectorised kernel (safe code;
//! the workspace forbids `unsafe`). Products large enough to pay for it are split over rayon by
//! blocks of output rows, or of output columns when they are wider than tall and deep (the
//! convolutions' weight gradients): every output entry is still the same sequence of
//! floating-point operations, so results do not depend on the thread count.
//!
//! Why this kernel (the network-speed table, measured on the 2-core development machine, GFLOP/s, shapes
//! `m×k×n` of the MNIST networks' products; the table is in `docs/ARCHITECTURE.md`, "Network
//! speed"):
//! matrixmultiply through nalgebra reached 100–110 GFLOP/s on one core for the MLP's shapes
//! and 50–90 on the convolution shapes, faer 0.22 about the same on one core, gemm 0.18 about
//! 60; splitting rows over the two cores ourselves gives the parallel speed-up without a second
//! thread pool next to rayon's.

use nalgebra::{Dyn, MatrixView, MatrixViewMut};
use rayon::prelude::*;

/// A read-only row-major operand: `rows × cols` stored densely, optionally used transposed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Operand<'a> {
    data: &'a [f64],
    rows: usize,
    cols: usize,
    transposed: bool,
}

impl<'a> Operand<'a> {
    /// The row-major `rows × cols` matrix in `data`.
    pub(crate) fn new(data: &'a [f64], rows: usize, cols: usize) -> Self {
        assert_eq!(data.len(), rows * cols, "operand buffer does not match its shape");
        Self { data, rows, cols, transposed: false }
    }
    /// Its transpose (no copy).
    pub(crate) fn t(self) -> Self {
        Self { transposed: !self.transposed, ..self }
    }
    /// Logical shape (after the transpose).
    fn shape(&self) -> (usize, usize) {
        if self.transposed {
            (self.cols, self.rows)
        } else {
            (self.rows, self.cols)
        }
    }
    /// Logical rows `start..start + len` as a strided nalgebra view.
    fn view_rows(&self, start: usize, len: usize) -> MatrixView<'a, f64, Dyn, Dyn, Dyn, Dyn> {
        self.view((start, len), (0, self.shape().1))
    }
    /// Logical columns `start..start + len` (all rows) as a strided nalgebra view.
    fn view_cols(&self, start: usize, len: usize) -> MatrixView<'a, f64, Dyn, Dyn, Dyn, Dyn> {
        self.view((0, self.shape().0), (start, len))
    }
    /// The logical block of `rows = (first, count)` and `cols = (first, count)`.
    fn view(&self, rows: (usize, usize), cols: (usize, usize)) -> MatrixView<'a, f64, Dyn, Dyn, Dyn, Dyn> {
        // Stored (r, c) lives at r·cols + c; logical (i, j) is stored (i, j) or (j, i).
        let (rs, cs) = if self.transposed { (1, self.cols) } else { (self.cols, 1) };
        let offset = rows.0 * rs + cols.0 * cs;
        let span = if rows.1 == 0 || cols.1 == 0 { 0 } else { (rows.1 - 1) * rs + (cols.1 - 1) * cs + 1 };
        MatrixView::from_slice_with_strides_generic(
            &self.data[offset..offset + span],
            Dyn(rows.1),
            Dyn(cols.1),
            Dyn(rs),
            Dyn(cs),
        )
    }
}

/// nalgebra sends products with a dimension at most this to a loop of `gemv`s instead of
/// `matrixmultiply`.
const NALGEBRA_SMALL_DIM: usize = 5;

/// Rows of `C` that [`small_gemm`] accumulates together.
const SMALL_ROWS: usize = 8;

/// Strided loop for thin products (`min(m, n, k) ≤ 5`). Each entry of `C` is the sum over `l`
/// in ascending order of `A[i, l]·B[l, j]` (terms with `A[i, l] = 0` skipped), scaled by `α`;
/// `SMALL_ROWS` rows are accumulated side by side so that a product with one output column
/// (`n = 1`) runs that many independent sums at once instead of one dependent chain, and the
/// loop is compiled by `pulp` for the widest vector unit the CPU has. The arithmetic of every
/// entry is that of a row-by-row loop (tested bit for bit).
fn small_gemm(c: &mut [f64], a: Operand<'_>, b: Operand<'_>, alpha: f64, beta: f64) {
    pulp::Arch::new().dispatch(SmallGemm { c, a, b, alpha, beta });
}

struct SmallGemm<'a, 'b> {
    c: &'b mut [f64],
    a: Operand<'a>,
    b: Operand<'a>,
    alpha: f64,
    beta: f64,
}

impl pulp::WithSimd for SmallGemm<'_, '_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let Self { c, a, b, alpha, beta } = self;
        let (m, k) = a.shape();
        let n = b.shape().1;
        let (ars, acs) = if a.transposed { (1, a.cols) } else { (a.cols, 1) };
        let (brs, bcs) = if b.transposed { (1, b.cols) } else { (b.cols, 1) };
        let store = |out: &mut [f64], acc: &[f64]| {
            if beta == 0.0 {
                out.iter_mut().zip(acc).for_each(|(o, s)| *o = alpha * s);
            } else {
                out.iter_mut().zip(acc).for_each(|(o, s)| *o = beta * *o + alpha * s);
            }
        };
        let mut i0 = 0;
        if n == 1 {
            // A zero `A[i, l]` adds +0 instead of being skipped: the same bits, because a sum
            // that starts at +0 is never −0, and x + 0 = x for every other x (NaN, ±∞ included).
            while i0 + SMALL_ROWS <= m {
                let mut acc = [0.0; SMALL_ROWS];
                for l in 0..k {
                    let bl = b.data[l * brs];
                    for (r, s) in acc.iter_mut().enumerate() {
                        let ail = a.data[(i0 + r) * ars + l * acs];
                        *s += if ail != 0.0 { ail * bl } else { 0.0 };
                    }
                }
                store(&mut c[i0..i0 + SMALL_ROWS], &acc);
                i0 += SMALL_ROWS;
            }
        }
        let mut acc = vec![0.0; SMALL_ROWS * n];
        while i0 < m {
            let rows = SMALL_ROWS.min(m - i0);
            let acc = &mut acc[..rows * n];
            acc.iter_mut().for_each(|v| *v = 0.0);
            for l in 0..k {
                let row = l * brs;
                for (r, acc_r) in acc.chunks_exact_mut(n).enumerate() {
                    let ail = a.data[(i0 + r) * ars + l * acs];
                    if ail != 0.0 {
                        acc_r.iter_mut().enumerate().for_each(|(j, v)| *v += ail * b.data[row + j * bcs]);
                    }
                }
            }
            store(&mut c[i0 * n..(i0 + rows) * n], acc);
            i0 += rows;
        }
    }
}

/// Below this many multiply-adds a product runs on the calling thread.
const PARALLEL_MIN_MACS: usize = 1 << 18;

/// A product wider than tall is split by columns when its depth `k` is at least this many times
/// its height `m`: the packing of `B` it saves (`k·n` per extra block) then outweighs copying
/// the blocks into `C` (`m·n`); below it, row blocks were faster (measured in
/// the record of 2026-11-26 on the KL's inverses and im2col, `git show 838ffc8:docs/performance-history.md`).
const COLUMN_SPLIT_DEPTH: usize = 16;

/// `C ← β C + α A B` for a row-major `C` (`m × n`, `c.len() == m·n`). With `β = 0`, `C` is
/// not read. Panics on inconsistent shapes (internal callers only).
pub(crate) fn gemm(c: &mut [f64], a: Operand<'_>, b: Operand<'_>, alpha: f64, beta: f64) {
    let (m, k) = a.shape();
    let (kb, n) = b.shape();
    assert_eq!(k, kb, "gemm: inner dimensions differ");
    assert_eq!(c.len(), m * n, "gemm: output buffer does not match m × n");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        c.iter_mut().for_each(|v| *v = if beta == 0.0 { 0.0 } else { beta * *v });
        return;
    }
    if m.min(n).min(k) <= NALGEBRA_SMALL_DIM {
        // nalgebra's own loop for thin products assumes unit row strides; ours does not.
        small_gemm(c, a, b, alpha, beta);
        return;
    }
    let threads = rayon::current_num_threads();
    let macs = m * n * k;
    if threads > 1 && macs >= PARALLEL_MIN_MACS && n > m && n >= 2 * 8 && k >= COLUMN_SPLIT_DEPTH * m {
        column_blocks(c, a, b, alpha, beta, threads);
        return;
    }
    let mut block = if threads > 1 && macs >= PARALLEL_MIN_MACS && m >= 2 * 8 {
        m.div_ceil(threads).div_ceil(8) * 8 // whole register tiles per block
    } else {
        m
    };
    // nalgebra's loop for thin products assumes unit row strides (above), and a last block of
    // at most `NALGEBRA_SMALL_DIM` rows would be sent to it: it wrote past the end of `C`
    // (20 × 128 outputs on two threads). Such a remainder joins whole tiles of a wider block.
    while block < m && m % block != 0 && m % block <= NALGEBRA_SMALL_DIM {
        block += 8;
    }
    let run = |(i, rows): (usize, &mut [f64])| {
        let len = rows.len() / n;
        let mut out = MatrixViewMut::from_slice_with_strides_generic(rows, Dyn(len), Dyn(n), Dyn(n), Dyn(1));
        let b_view = b.view_rows(0, k);
        // nalgebra skips reading `out` when β = 0.
        out.gemm(alpha, &a.view_rows(i * block, len), &b_view, beta);
    };
    if block < m {
        c.par_chunks_mut(block * n).enumerate().for_each(run);
    } else {
        run((0, c));
    }
}

/// [`gemm`] split over rayon by blocks of output columns, for products wider than tall (the
/// weight gradients `Δᵀ X` of the convolutions: `m` = output channels, `k` = patches, `n` = patch
/// width). matrixmultiply packs the whole of `B` for every block of rows, but only its own
/// columns for a block of columns. Each block is computed into a buffer and copied into `C`;
/// blocks are whole register tiles (8 columns) and none is narrower than nalgebra's small-product
/// limit, so every entry is the same matrixmultiply arithmetic as in one call.
fn column_blocks(c: &mut [f64], a: Operand<'_>, b: Operand<'_>, alpha: f64, beta: f64, threads: usize) {
    let m = a.shape().0;
    let n = b.shape().1;
    let width = n.div_ceil(threads).div_ceil(8) * 8;
    let mut starts: Vec<usize> = (0..n).step_by(width).collect();
    if starts.len() > 1 && n - starts[starts.len() - 1] <= NALGEBRA_SMALL_DIM {
        starts.pop(); // the last block joins the one before it
    }
    let ends: Vec<usize> = starts.iter().skip(1).copied().chain([n]).collect();
    let c_ref = &*c;
    let blocks: Vec<Vec<f64>> = starts
        .par_iter()
        .zip(&ends)
        .map(|(&j0, &j1)| {
            let w = j1 - j0;
            let mut buf: Vec<f64> = if beta == 0.0 {
                vec![0.0; m * w]
            } else {
                c_ref.chunks_exact(n).flat_map(|row| row[j0..j1].iter().copied()).collect()
            };
            let mut out =
                MatrixViewMut::from_slice_with_strides_generic(&mut buf[..], Dyn(m), Dyn(w), Dyn(w), Dyn(1));
            out.gemm(alpha, &a.view_rows(0, m), &b.view_cols(j0, w), beta);
            buf
        })
        .collect();
    for ((&j0, &j1), buf) in starts.iter().zip(&ends).zip(&blocks) {
        for (row, src) in c.chunks_exact_mut(n).zip(buf.chunks_exact(j1 - j0)) {
            row[j0..j1].copy_from_slice(src);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nalgebra::DMatrix;

    fn dense(op: Operand<'_>) -> DMatrix<f64> {
        let m = DMatrix::from_row_slice(op.rows, op.cols, op.data);
        if op.transposed {
            m.transpose()
        } else {
            m
        }
    }

    #[test]
    fn all_transpose_combinations_match_dense_products() {
        for &(m, k, n) in &[
            (3, 4, 5),
            (40, 30, 20),
            (300, 37, 50),
            (1, 9, 1),
            (17, 1, 6),
            (300, 3, 40),
            (40, 200, 2),
            (6, 6, 6),
        ] {
            let a_data: Vec<f64> = (0..m * k).map(|i| ((i * 7 % 13) as f64 - 6.0) / 3.0).collect();
            let b_data: Vec<f64> = (0..k * n).map(|i| ((i * 5 % 11) as f64 - 5.0) / 4.0).collect();
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                let a = if ta { Operand::new(&a_data, k, m).t() } else { Operand::new(&a_data, m, k) };
                let b = if tb { Operand::new(&b_data, n, k).t() } else { Operand::new(&b_data, k, n) };
                let expected_prod = dense(a) * dense(b);
                let mut c: Vec<f64> = (0..m * n).map(|i| i as f64).collect();
                let c0 = DMatrix::from_row_slice(m, n, &c);
                gemm(&mut c, a, b, 0.5, 2.0);
                let got = DMatrix::from_row_slice(m, n, &c);
                let expected = c0 * 2.0 + expected_prod * 0.5;
                assert!(
                    (got - &expected).abs().max() < 1e-11 * (1.0 + expected.abs().max()),
                    "{m}×{k}×{n} {ta} {tb}"
                );
            }
        }
    }

    /// Row blocks over rayon never leave a remainder thin enough for nalgebra's own loop, which
    /// assumes unit row strides and wrote past the end of `C`: every `m` from 16 to 70 on 2, 3
    /// and 4 threads, each product checked against the dense one and the values after `C` (in
    /// the same allocation) unchanged.
    #[test]
    fn row_blocks_on_any_thread_count_stay_inside_the_output() {
        let (k, n) = (128, 128);
        let b_data: Vec<f64> = (0..k * n).map(|i| ((i * 5 % 11) as f64 - 5.0) / 4.0).collect();
        for threads in [2, 3, 4] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            for m in 16..=70 {
                let a_data: Vec<f64> = (0..m * k).map(|i| ((i * 7 % 13) as f64 - 6.0) / 3.0).collect();
                let (a, b) = (Operand::new(&a_data, m, k), Operand::new(&b_data, k, n));
                let guard = 4 * n;
                let mut buf = vec![1.0; m * n + guard];
                pool.install(|| gemm(&mut buf[..m * n], a, b, 1.0, 1.0));
                assert!(buf[m * n..].iter().all(|&v| v == 1.0), "m = {m}, {threads} threads: wrote past C");
                let expected = DMatrix::from_element(m, n, 1.0) + dense(a) * dense(b);
                let got = DMatrix::from_row_slice(m, n, &buf[..m * n]);
                assert!(
                    (got - &expected).abs().max() < 1e-10 * expected.abs().max(),
                    "m = {m}, {threads} threads"
                );
            }
        }
    }

    /// The row-by-row loop `small_gemm` replaced: its bits are the reference.
    fn row_by_row(c: &mut [f64], a: Operand<'_>, b: Operand<'_>, alpha: f64, beta: f64) {
        let (m, k) = a.shape();
        let n = b.shape().1;
        let (ars, acs) = if a.transposed { (1, a.cols) } else { (a.cols, 1) };
        let (brs, bcs) = if b.transposed { (1, b.cols) } else { (b.cols, 1) };
        for i in 0..m {
            let mut acc = vec![0.0; n];
            for l in 0..k {
                let ail = a.data[i * ars + l * acs];
                if ail != 0.0 {
                    acc.iter_mut().enumerate().for_each(|(j, v)| *v += ail * b.data[l * brs + j * bcs]);
                }
            }
            for (o, s) in c[i * n..(i + 1) * n].iter_mut().zip(&acc) {
                *o = if beta == 0.0 { alpha * s } else { beta * *o + alpha * s };
            }
        }
    }

    #[test]
    fn thin_products_give_the_bits_of_a_row_by_row_loop() {
        for &(m, k, n) in
            &[(100, 50, 1), (50, 100, 1), (1, 100, 50), (100, 1, 50), (13, 3, 7), (9, 5, 2), (21, 4, 1)]
        {
            // Zeros in A (skipped terms), one of them facing an infinite B entry.
            let a_data: Vec<f64> = (0..m * k)
                .map(|i| if i % 5 == 0 { 0.0 } else { ((i * 7 % 13) as f64 - 6.0).sin() / 3.0 })
                .collect();
            let mut b_data: Vec<f64> = (0..k * n).map(|i| ((i * 5 % 11) as f64 - 5.0).cos() / 4.0).collect();
            b_data[0] = f64::INFINITY;
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                let a = if ta { Operand::new(&a_data, k, m).t() } else { Operand::new(&a_data, m, k) };
                let b = if tb { Operand::new(&b_data, n, k).t() } else { Operand::new(&b_data, k, n) };
                for beta in [0.0, 0.7] {
                    let mut got: Vec<f64> = (0..m * n).map(|i| (i as f64).sqrt()).collect();
                    let mut want = got.clone();
                    small_gemm(&mut got, a, b, 1.3, beta);
                    row_by_row(&mut want, a, b, 1.3, beta);
                    assert!(
                        got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()),
                        "{m}×{k}×{n} {ta} {tb} β = {beta}"
                    );
                }
            }
        }
    }

    #[test]
    fn column_split_gives_the_same_bits_as_one_call() {
        // Wider than tall, as the convolutions' weight gradients `Δᵀ X` (A transposed); n = 17
        // and 21 leave a narrow last block that must join the one before it.
        for &(m, k, n) in &[(6, 5000, 25), (16, 3000, 150), (8, 4000, 17), (7, 3000, 21), (120, 100, 400)] {
            let a_data: Vec<f64> = (0..m * k).map(|i| ((i * 7 % 13) as f64).sin()).collect();
            let b_data: Vec<f64> = (0..k * n).map(|i| ((i * 5 % 11) as f64).cos()).collect();
            let a = Operand::new(&a_data, k, m).t();
            for (tb, beta) in [(false, 0.0), (true, 1.0), (false, 0.7)] {
                let b = if tb { Operand::new(&b_data, n, k).t() } else { Operand::new(&b_data, k, n) };
                let c0: Vec<f64> = (0..m * n).map(|i| (i as f64 * 0.3).cos()).collect();
                let mut split = c0.clone();
                gemm(&mut split, a, b, 1.0, beta);
                // One matrixmultiply call over the whole product.
                let mut whole = c0;
                let mut out = MatrixViewMut::from_slice_with_strides_generic(
                    &mut whole[..],
                    Dyn(m),
                    Dyn(n),
                    Dyn(n),
                    Dyn(1),
                );
                out.gemm(1.0, &a.view_rows(0, m), &b.view_rows(0, k), beta);
                assert!(
                    split.iter().zip(&whole).all(|(s, w)| s.to_bits() == w.to_bits()),
                    "{m}×{k}×{n}, transposed B {tb}, β = {beta}"
                );
            }
        }
    }

    #[test]
    fn parallel_split_gives_the_same_bits_as_one_block() {
        let (m, k, n) = (517, 300, 70);
        let a_data: Vec<f64> = (0..m * k).map(|i| ((i * 7 % 13) as f64).sin()).collect();
        let b_data: Vec<f64> = (0..k * n).map(|i| ((i * 5 % 11) as f64).cos()).collect();
        let mut par = vec![0.0; m * n];
        gemm(&mut par, Operand::new(&a_data, m, k), Operand::new(&b_data, k, n), 1.0, 0.0);
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let mut seq = vec![0.0; m * n];
        pool.install(|| gemm(&mut seq, Operand::new(&a_data, m, k), Operand::new(&b_data, k, n), 1.0, 0.0));
        assert_eq!(par, seq);
    }
}
