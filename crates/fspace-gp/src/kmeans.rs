//! k-means clustering (Lloyd's algorithm with k-means++ seeding), used to initialise inducing
//! points (SVGP here, VaLLA later). A few dozen lines of well-known code; the clustering crates
//! (linfa-clustering) would bring ndarray and the linfa stack for it.
//!
//! Speed without changing a bit: points are read as contiguous rows, the distances from one
//! point to 8 centroids accumulate side by side (each one still summed over the
//! coordinates in order, so each distance is the plain loop's), and points are assigned in
//! parallel. The centroid sums keep the points' order.

use nalgebra::DMatrix;
use rand::distributions::Distribution;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;

use crate::error::{invalid, Result};

/// Centroids whose distances to one point accumulate side by side.
const LANES: usize = 8;

/// Points per parallel task.
const POINTS_PER_TASK: usize = 64;

/// `Σ_t (p_t − c_t)²`, summed in coordinate order.
fn sq(p: &[f64], c: &[f64]) -> f64 {
    p.iter().zip(c).map(|(a, b)| (a - b).powi(2)).sum::<f64>()
}

/// Index of the nearest centroid to `p` (the first one on ties, by `f64::total_cmp`).
/// `cent` holds the centroids row by row, `cent_t` the same values coordinate by coordinate
/// (`cent_t[t·k + j]`).
fn nearest(p: &[f64], cent: &[f64], cent_t: &[f64], k: usize) -> usize {
    let d = p.len();
    let mut best = (0, f64::INFINITY);
    let mut consider = |j: usize, dist: f64| {
        if j == 0 || dist.total_cmp(&best.1).is_lt() {
            best = (j, dist);
        }
    };
    let full = k - k % LANES;
    for j0 in (0..full).step_by(LANES) {
        let mut acc = [0.0f64; LANES];
        for (t, &v) in p.iter().enumerate() {
            let c = &cent_t[t * k + j0..t * k + j0 + LANES];
            for l in 0..LANES {
                acc[l] += (v - c[l]).powi(2);
            }
        }
        for (l, &a) in acc.iter().enumerate() {
            consider(j0 + l, a);
        }
    }
    for j in full..k {
        consider(j, sq(p, &cent[j * d..(j + 1) * d]));
    }
    best.0
}

/// `k` centroids (`k × d`) of the rows of `x` after at most `max_iter` Lloyd iterations from a
/// seeded k-means++ start. Errors: `k = 0`, `k > n`, non-finite data.
pub fn kmeans(x: &DMatrix<f64>, k: usize, max_iter: usize, seed: u64) -> Result<DMatrix<f64>> {
    // One process holding every row: the sharded clustering with a sum that returns its part
    // (the same draws and the same sums, bit for bit; `tests/kmeans.rs`).
    let layout = [(0, x.nrows())];
    let mut sum = |part: Vec<f64>| Ok(part);
    kmeans_sharded(x, k, max_iter, seed, KmeansShard { rank: 0, layout: &layout, sum: &mut sum })
}

/// One process's part of a sharded clustering ([`kmeans_sharded`]): its rows are the rows
/// `layout[rank].0 .. layout[rank].0 + layout[rank].1` of every process's rows together (in
/// process order), and `sum(part)` returns the sum of every process's `part` (an all-reduce;
/// the engine is the caller's).
pub struct KmeansShard<'a> {
    /// This process's position in `layout`.
    pub rank: usize,
    /// `(first global row, rows)` of every process, in process order, contiguous.
    pub layout: &'a [(usize, usize)],
    /// The all-reduce (sum) of a vector over the processes.
    pub sum: &'a mut dyn FnMut(Vec<f64>) -> Result<Vec<f64>>,
}

/// [`kmeans`] over rows sharded across processes: every process calls it with its own rows
/// and the same `k`, `max_iter`, `seed` and layout, and gets the centroids one process over
/// all the rows (in process order) gets — the same draws from the same seeded generator, the
/// k-means++ weights summed per process (one all-reduce of one number per process and of the
/// chosen point per centroid), each Lloyd step's centroid sums and counts all-reduced
/// (`k·(d + 1) + 1` numbers). [`kmeans`] is this clustering on one process; with several the
/// sums differ in the order of their additions only.
pub fn kmeans_sharded(
    x: &DMatrix<f64>,
    k: usize,
    max_iter: usize,
    seed: u64,
    shard: KmeansShard<'_>,
) -> Result<DMatrix<f64>> {
    let KmeansShard { rank, layout, sum } = shard;
    let d = x.ncols();
    let world = layout.len();
    if rank >= world {
        return Err(invalid("k-means shard", format!("rank {rank} outside a layout of {world} processes")));
    }
    let mut n = 0;
    for (r, &(first, rows)) in layout.iter().enumerate() {
        if first != n {
            return Err(invalid("k-means shard", format!("process {r}'s rows start at {first}, not {n}")));
        }
        n += rows;
    }
    let (offset, local) = layout[rank];
    if x.nrows() != local {
        return Err(invalid("k-means shard", format!("{} rows where the layout has {local}", x.nrows())));
    }
    if k == 0 || k > n {
        return Err(invalid("k", format!("need 1 ≤ k ≤ n = {n}, got {k}")));
    }
    if x.iter().any(|v| !v.is_finite()) {
        return Err(invalid("k-means data", "contains NaN or ±∞"));
    }
    let mut summed = |part: Vec<f64>| -> Result<Vec<f64>> {
        let len = part.len();
        let out = sum(part)?;
        if out.len() != len {
            return Err(invalid("k-means all-reduce", format!("{} values returned for {len}", out.len())));
        }
        Ok(out)
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let xt = x.transpose();
    let points = xt.as_slice();
    let point = |i: usize| &points[i * d..(i + 1) * d];
    let mine = |g: usize| (offset..offset + local).contains(&g).then(|| g - offset);
    // The chosen row to every process: its holder sends it, the others zeros.
    let share = |row: Option<usize>, summed: &mut dyn FnMut(Vec<f64>) -> Result<Vec<f64>>| {
        summed(row.map_or_else(|| vec![0.0; d], |i| point(i).to_vec()))
    };
    let mut cent = vec![0.0; k * d];
    let first = mine(rng.gen_range(0..n));
    cent[..d].copy_from_slice(&share(first, &mut summed)?);
    let mut dist: Vec<f64> = (0..local).into_par_iter().map(|i| sq(point(i), &cent[..d])).collect();
    for j in 1..k {
        // k-means++'s weights: each process's sum (in row order), then `WeightedIndex`'s draw —
        // a uniform on [0, total), the first row whose running sum exceeds it.
        let mut totals = vec![0.0; world];
        totals[rank] = dist.iter().sum();
        let totals = summed(totals)?;
        let total: f64 = totals.iter().sum();
        let row = if total > 0.0 {
            let u = rand::distributions::Uniform::new(0.0, total).sample(&mut rng);
            let mut before = 0.0;
            let mut owner = world - 1; // rounding left `u` past every sum: the last row
            for (r, &t) in totals.iter().enumerate() {
                if before + t > u {
                    owner = r;
                    break;
                }
                before += t;
            }
            (owner == rank).then(|| {
                let mut running = before;
                dist.iter()
                    .position(|&w| {
                        running += w;
                        running > u
                    })
                    .unwrap_or(local.saturating_sub(1))
            })
        } else {
            mine(rng.gen_range(0..n)) // all remaining points coincide with centroids
        };
        let chosen = share(row, &mut summed)?;
        cent[j * d..(j + 1) * d].copy_from_slice(&chosen);
        let c = &cent[j * d..(j + 1) * d];
        dist.par_iter_mut().enumerate().for_each(|(i, di)| *di = di.min(sq(point(i), c)));
    }
    let mut assign = vec![usize::MAX; local];
    let mut cent_t = vec![0.0; k * d];
    for _ in 0..max_iter {
        for j in 0..k {
            for t in 0..d {
                cent_t[t * k + j] = cent[j * d + t];
            }
        }
        let mut changed = false;
        let best: Vec<usize> = (0..local)
            .into_par_iter()
            .with_min_len(POINTS_PER_TASK)
            .map(|i| nearest(point(i), &cent, &cent_t, k))
            .collect();
        for (a, b) in assign.iter_mut().zip(best) {
            changed |= *a != b;
            *a = b;
        }
        // [changed, Σ points per centroid (k·d), counts (k)] in one all-reduce.
        let mut part = vec![0.0; 1 + k * d + k];
        part[0] = changed as u8 as f64;
        for (i, &a) in assign.iter().enumerate() {
            part[1 + k * d + a] += 1.0;
            for (s, v) in part[1 + a * d..1 + (a + 1) * d].iter_mut().zip(point(i)) {
                *s += v;
            }
        }
        let total = summed(part)?;
        if total[0] == 0.0 {
            break;
        }
        for j in 0..k {
            let count = total[1 + k * d + j];
            if count > 0.0 {
                for t in 0..d {
                    cent[j * d + t] = total[1 + j * d + t] / count;
                }
            }
        }
    }
    Ok(DMatrix::from_row_slice(k, d, &cent))
}
