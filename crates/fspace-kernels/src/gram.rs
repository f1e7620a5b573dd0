//! Gram matrices, their diagonals and hyperparameter gradients, and the matrix-free
//! [`GramOperator`].
//!
//! Points are the rows of an `n × d` matrix. For a kernel with `d'` outputs, the Gram matrix
//! `K(X, Y)` is `(n·d') × (m·d')`, ordered point-major: row `i·d' + a` is output `a` of point `i`.

use fspace_input::InputError;
use fspace_linalg::LinearOperator;
use nalgebra::{DMatrix, DMatrixView, DVector};
use rayon::prelude::*;

use crate::error::{KernelError, Result};
use crate::kernel::MatrixKernel;

/// Points per row block of a tile (rows are parallelised over blocks).
const ROW_BLOCK: usize = 64;
/// Rows per tile of a mirrored Gram matrix (each fills the columns up to its last row).
const MIRROR_ROWS: usize = 16;
/// Gram matrices with fewer entries are filled on the calling thread: waking a second thread
/// costs more than it saves (one FSP-Laplace training step factorises a fresh 100 × 100 Gram).
const PARALLEL_MIN_ENTRIES: usize = 1 << 15;
/// Points per column block of a tile (bounds the tile buffer to `ROW_BLOCK·COL_BLOCK·d'²`).
const COL_BLOCK: usize = 512;

/// A validated, row-major copy of a point set (non-empty, finite).
#[derive(Debug, Clone, PartialEq)]
pub struct PointSet {
    data: Vec<f64>,
    n: usize,
    d: usize,
}

impl PointSet {
    /// Copies the rows of `x` after checking it is non-empty and finite.
    pub fn new(what: &'static str, x: &DMatrix<f64>) -> Result<Self> {
        if x.nrows() == 0 || x.ncols() == 0 {
            return Err(KernelError::Input(InputError::Empty { what }));
        }
        if x.iter().any(|v| !v.is_finite()) {
            return Err(KernelError::Input(InputError::NonFinite { what }));
        }
        let (n, d) = x.shape();
        let mut data = Vec::with_capacity(n * d);
        for i in 0..n {
            data.extend(x.row(i).iter());
        }
        Ok(Self { data, n, d })
    }
    /// Number of points.
    pub fn len(&self) -> usize {
        self.n
    }
    /// Always false (empty sets are rejected at construction).
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
    /// Input dimension.
    pub fn dim(&self) -> usize {
        self.d
    }
    /// Point `i`.
    pub fn row(&self, i: usize) -> &[f64] {
        &self.data[i * self.d..(i + 1) * self.d]
    }
    /// Points `start..end` as one row-major slice.
    pub fn rows(&self, start: usize, end: usize) -> &[f64] {
        &self.data[start * self.d..end * self.d]
    }
}

fn validated<K: MatrixKernel + ?Sized>(k: &K, what: &'static str, x: &DMatrix<f64>) -> Result<PointSet> {
    let p = PointSet::new(what, x)?;
    k.check_input_dim(p.dim())?;
    Ok(p)
}

fn check_same_dim(x: &PointSet, y: &PointSet) -> Result<()> {
    if x.dim() == y.dim() {
        Ok(())
    } else {
        Err(KernelError::Input(InputError::DimensionMismatch {
            what: "columns of Y vs. columns of X",
            expected: x.dim(),
            found: y.dim(),
        }))
    }
}

/// Row-major Gram tile rows for the points `x` against the first `cols` points of `y` (the
/// rest of each output row is left as it is), computed block-wise.
fn fill_rows<K: MatrixKernel + ?Sized>(k: &K, x: &[f64], y: &PointSet, cols: usize, out: &mut [f64]) {
    let (d, q, m) = (y.dim(), k.output_dim(), y.len());
    let nx = x.len() / d;
    let width = m * q;
    let mut tile = vec![0.0; nx * q * COL_BLOCK.min(cols) * q];
    for c0 in (0..cols).step_by(COL_BLOCK) {
        let c1 = (c0 + COL_BLOCK).min(cols);
        let tw = (c1 - c0) * q;
        let tile = &mut tile[..nx * q * tw];
        k.eval_block_tile(x, y.rows(c0, c1), d, tile);
        for r in 0..nx * q {
            out[r * width + c0 * q..r * width + c1 * q].copy_from_slice(&tile[r * tw..(r + 1) * tw]);
        }
    }
}

/// The dense Gram matrix `K(X, Y)` (`n·d' × m·d'`), computed in parallel.
///
/// Built without an intermediate copy: the row-major buffer of `K(Y, X)` *is* the column-major
/// buffer of `K(X, Y)`, because every kernel satisfies `k(x, y) = k(y, x)ᵀ`.
pub fn gram<K: MatrixKernel + ?Sized>(k: &K, x: &DMatrix<f64>, y: &DMatrix<f64>) -> Result<DMatrix<f64>> {
    let xs = validated(k, "points X", x)?;
    let ys = validated(k, "points Y", y)?;
    check_same_dim(&xs, &ys)?;
    let q = k.output_dim();
    let height = xs.len() * q;
    let mut data = vec![0.0; ys.len() * q * height];
    // `K(X, X)` of a kernel that is symmetric bit for bit: each row block fills the columns up
    // to its last row, then the upper triangle is mirrored (half the kernel evaluations).
    let mirror = std::ptr::eq(x, y) && q == 1 && k.gram_mirrors();
    let block = |(b, chunk): (usize, &mut [f64])| {
        let r0 = b * ROW_BLOCK;
        let r1 = (r0 + ROW_BLOCK).min(ys.len());
        if mirror {
            for s0 in (r0..r1).step_by(MIRROR_ROWS) {
                let s1 = (s0 + MIRROR_ROWS).min(r1);
                fill_rows(k, ys.rows(s0, s1), &xs, s1, &mut chunk[(s0 - r0) * height..(s1 - r0) * height]);
            }
        } else {
            fill_rows(k, ys.rows(r0, r1), &xs, xs.len(), chunk);
        }
    };
    if data.len() < PARALLEL_MIN_ENTRIES {
        data.chunks_mut(ROW_BLOCK * q * height).enumerate().for_each(block);
    } else {
        data.par_chunks_mut(ROW_BLOCK * q * height).enumerate().for_each(block);
    }
    if mirror {
        let n = height;
        for i in 0..n {
            let first = (i / MIRROR_ROWS + 1) * MIRROR_ROWS; // columns from here on were not filled
            for j in first.min(n)..n {
                data[i * n + j] = data[j * n + i];
            }
        }
    }
    Ok(DMatrix::from_vec(height, ys.len() * q, data))
}

/// The diagonal of `K(X, X)` (`n·d'` entries).
pub fn gram_diag<K: MatrixKernel + ?Sized>(k: &K, x: &DMatrix<f64>) -> Result<DVector<f64>> {
    let xs = validated(k, "points X", x)?;
    let q = k.output_dim();
    let mut block = vec![0.0; q * q];
    let mut out = DVector::zeros(xs.len() * q);
    for i in 0..xs.len() {
        k.eval_block(xs.row(i), xs.row(i), &mut block);
        for a in 0..q {
            out[i * q + a] = block[a * q + a];
        }
    }
    Ok(out)
}

/// `∂K(X, Y)/∂θⱼ` for every log-hyperparameter `θⱼ` (one matrix per hyperparameter, in the
/// order of [`KernelBase::params`](crate::KernelBase::params)).
pub fn gram_grad<K: MatrixKernel + ?Sized>(
    k: &K,
    x: &DMatrix<f64>,
    y: &DMatrix<f64>,
) -> Result<Vec<DMatrix<f64>>> {
    let xs = validated(k, "points X", x)?;
    let ys = validated(k, "points Y", y)?;
    check_same_dim(&xs, &ys)?;
    let (q, np, n, m) = (k.output_dim(), k.n_params(), xs.len(), ys.len());
    // Row-major rows of every gradient matrix, computed per point of X in parallel.
    let rows: Vec<Vec<f64>> = (0..n)
        .into_par_iter()
        .map(|i| {
            let mut g = vec![0.0; np * q * q];
            let mut out = vec![0.0; np * q * m * q];
            for j in 0..m {
                k.eval_block_grad(xs.row(i), ys.row(j), &mut g);
                for p in 0..np {
                    for a in 0..q {
                        for b in 0..q {
                            out[(p * q + a) * m * q + j * q + b] = g[p * q * q + a * q + b];
                        }
                    }
                }
            }
            out
        })
        .collect();
    Ok((0..np)
        .map(|p| {
            DMatrix::from_fn(n * q, m * q, |r, c| {
                let (i, a) = (r / q, r % q);
                rows[i][(p * q + a) * m * q + c]
            })
        })
        .collect())
}

/// The matrix-free Gram operator `v ↦ (K(X, X) + σ²I) v`.
///
/// Products are computed tile by tile (`64 × 512` points), in parallel over row blocks, so
/// memory stays `O(n·d + threads·tile)`: the `n × n` matrix is never held. Each product costs
/// `O(n²·d)` kernel evaluations. [`with_tile_cache`](Self::with_tile_cache) trades memory for
/// those evaluations when the tiles fit a budget.
#[derive(Debug, Clone)]
pub struct GramOperator<K> {
    kernel: K,
    points: PointSet,
    shift: f64,
    tiles: Option<TileCache>,
}

/// Every tile of `K(X, X)`, row block by row block, each as the product loop evaluates it.
#[derive(Clone)]
struct TileCache(Vec<Vec<f64>>);

impl std::fmt::Debug for TileCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let entries: usize = self.0.iter().map(Vec::len).sum();
        write!(f, "TileCache({} tiles, {entries} entries)", self.0.len())
    }
}

impl<K: MatrixKernel> GramOperator<K> {
    /// The operator `K(X, X)` for points as rows of `x`.
    pub fn new(kernel: K, x: &DMatrix<f64>) -> Result<Self> {
        let points = validated(&kernel, "points X", x)?;
        Ok(Self { kernel, points, shift: 0.0, tiles: None })
    }

    /// Keeps every tile of `K(X, X)` (`8·(n·d')²` bytes) when that is at most `max_bytes`, so
    /// that each product reuses them instead of evaluating the kernel again (Lanczos and CG
    /// apply the operator hundreds of times). The products run the same accumulation on the
    /// same tiles, so their results are bit for bit those of the matrix-free operator; only
    /// memory grows, from `O(n·d)` to `O(n²d'²)`. Over the budget the operator stays matrix-free.
    pub fn with_tile_cache(mut self, max_bytes: usize) -> Self {
        let (n, q) = (self.points.len(), self.kernel.output_dim());
        let bytes = (n * q).saturating_mul(n * q).saturating_mul(std::mem::size_of::<f64>());
        if bytes > max_bytes {
            return self;
        }
        let tiles = (0..n.div_ceil(ROW_BLOCK))
            .into_par_iter()
            .flat_map_iter(|b| {
                let this = &self;
                let rows = (((b + 1) * ROW_BLOCK).min(n) - b * ROW_BLOCK) * q;
                (0..n).step_by(COL_BLOCK).map(move |c0| {
                    let mut tile = vec![0.0; rows * ((c0 + COL_BLOCK).min(n) - c0) * q];
                    this.eval_tile(b, c0, &mut tile);
                    tile
                })
            })
            .collect();
        self.tiles = Some(TileCache(tiles));
        self
    }

    /// Whether [`with_tile_cache`](Self::with_tile_cache) kept the tiles.
    pub fn is_tile_cached(&self) -> bool {
        self.tiles.is_some()
    }

    /// Adds `σ² I` (observation noise or jitter); `shift` must be finite and ≥ 0.
    pub fn with_shift(mut self, shift: f64) -> Result<Self> {
        if !(shift.is_finite() && shift >= 0.0) {
            return Err(KernelError::InvalidHyperparameter {
                name: "diagonal shift".into(),
                value: shift,
                reason: "must be finite and ≥ 0",
            });
        }
        self.shift = shift;
        Ok(self)
    }

    /// The kernel.
    pub fn kernel(&self) -> &K {
        &self.kernel
    }

    /// The points.
    pub fn points(&self) -> &PointSet {
        &self.points
    }

    /// The diagonal shift σ².
    pub fn shift(&self) -> f64 {
        self.shift
    }

    /// The diagonal of `K + σ²I`.
    pub fn diagonal(&self) -> DVector<f64> {
        let q = self.kernel.output_dim();
        let mut block = vec![0.0; q * q];
        DVector::from_iterator(
            self.points.len() * q,
            (0..self.points.len()).flat_map(|i| {
                self.kernel.eval_block(self.points.row(i), self.points.row(i), &mut block);
                (0..q).map(|a| block[a * q + a] + self.shift).collect::<Vec<_>>()
            }),
        )
    }

    /// Column `j` of `K + σ²I` (`O(n)` kernel evaluations).
    pub fn column(&self, j: usize) -> DVector<f64> {
        let q = self.kernel.output_dim();
        let (pj, b) = (j / q, j % q);
        let mut block = vec![0.0; q * q];
        let mut col = DVector::zeros(self.points.len() * q);
        for i in 0..self.points.len() {
            self.kernel.eval_block(self.points.row(i), self.points.row(pj), &mut block);
            for a in 0..q {
                col[i * q + a] = block[a * q + b];
            }
        }
        col[j] += self.shift;
        col
    }

    /// Tile `(b, c0)` of `K(X, X)`: the points of row block `b` against the column block that
    /// starts at point `c0`, row-major into `out` (the products' and the cache's one route).
    fn eval_tile(&self, b: usize, c0: usize, out: &mut [f64]) {
        let n = self.points.len();
        let (r0, r1, c1) = (b * ROW_BLOCK, ((b + 1) * ROW_BLOCK).min(n), (c0 + COL_BLOCK).min(n));
        self.kernel.eval_block_tile(
            self.points.rows(r0, r1),
            self.points.rows(c0, c1),
            self.points.dim(),
            out,
        );
    }

    fn row_block_product(&self, b: usize, v: &DMatrix<f64>) -> DMatrix<f64> {
        let (q, n) = (self.kernel.output_dim(), self.points.len());
        let r0 = b * ROW_BLOCK;
        let r1 = (r0 + ROW_BLOCK).min(n);
        let rows = (r1 - r0) * q;
        let mut out = DMatrix::zeros(rows, v.ncols());
        let per_row_block = n.div_ceil(COL_BLOCK);
        let mut scratch = match self.tiles {
            Some(_) => Vec::new(),
            None => vec![0.0; rows * COL_BLOCK.min(n) * q],
        };
        for (cb, c0) in (0..n).step_by(COL_BLOCK).enumerate() {
            let c1 = (c0 + COL_BLOCK).min(n);
            let cols = (c1 - c0) * q;
            let tile: &[f64] = match &self.tiles {
                Some(cache) => &cache.0[b * per_row_block + cb],
                None => {
                    let tile = &mut scratch[..rows * cols];
                    self.eval_tile(b, c0, tile);
                    tile
                }
            };
            // The row-major (rows × cols) tile is the column-major (cols × rows) matrix Tᵀ.
            let t_transposed = DMatrixView::from_slice(tile, cols, rows);
            out.gemm_tr(1.0, &t_transposed, &v.rows(c0 * q, cols), 1.0);
        }
        if self.shift != 0.0 {
            out += v.rows(r0 * q, rows) * self.shift;
        }
        out
    }
}

impl<K: MatrixKernel> LinearOperator for GramOperator<K> {
    fn dim(&self) -> usize {
        self.points.len() * self.kernel.output_dim()
    }

    fn matvec(&self, v: &DVector<f64>) -> DVector<f64> {
        let v = DMatrix::from_column_slice(v.len(), 1, v.as_slice());
        DVector::from_column_slice(self.matmat(&v).as_slice())
    }

    fn matmat(&self, v: &DMatrix<f64>) -> DMatrix<f64> {
        let q = self.kernel.output_dim();
        let n_blocks = self.points.len().div_ceil(ROW_BLOCK);
        let blocks: Vec<DMatrix<f64>> =
            (0..n_blocks).into_par_iter().map(|b| self.row_block_product(b, v)).collect();
        let mut out = DMatrix::zeros(self.dim(), v.ncols());
        for (b, block) in blocks.into_iter().enumerate() {
            out.rows_mut(b * ROW_BLOCK * q, block.nrows()).copy_from(&block);
        }
        out
    }
}

/// Entries of `K + σ²I` for the pivoted-Cholesky preconditioner (`O(n)` kernel evaluations per
/// column; the matrix is never formed).
impl<K: MatrixKernel> fspace_linalg::SymmetricEntries for GramOperator<K> {
    fn entries_dim(&self) -> usize {
        self.dim()
    }
    fn diagonal_entries(&self) -> DVector<f64> {
        self.diagonal()
    }
    fn column_entries(&self, j: usize) -> DVector<f64> {
        self.column(j)
    }
}
