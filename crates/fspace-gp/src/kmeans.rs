//! k-means clustering (Lloyd's algorithm with k-means++ seeding), used to initialise inducing
//! points (SVGP here, VaLLA later). A few dozen lines of well-known code; the clustering crates
//! (linfa-clustering) would bring ndarray and the linfa stack for it.
//!
//! Speed without changing a bit: points are read as contiguous rows, the distances from one
//! point to 8 centroids accumulate side by side (each one still summed over the
//! coordinates in order, so each distance is the plain loop's), and points are assigned in
//! parallel. The centroid sums keep the points' order.

use nalgebra::DMatrix;
use rand::distributions::{Distribution, WeightedIndex};
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
    let (n, d) = x.shape();
    if k == 0 || k > n {
        return Err(invalid("k", format!("need 1 ≤ k ≤ n = {n}, got {k}")));
    }
    if x.iter().any(|v| !v.is_finite()) {
        return Err(invalid("k-means data", "contains NaN or ±∞"));
    }
    let mut rng = StdRng::seed_from_u64(seed);
    // Row i of x is points[i·d .. (i+1)·d].
    let xt = x.transpose();
    let points = xt.as_slice();
    let point = |i: usize| &points[i * d..(i + 1) * d];
    let mut cent = vec![0.0; k * d];
    cent[..d].copy_from_slice(point(rng.gen_range(0..n)));
    let mut dist: Vec<f64> = (0..n).into_par_iter().map(|i| sq(point(i), &cent[..d])).collect();
    for j in 1..k {
        let next = match WeightedIndex::new(&dist) {
            Ok(w) => w.sample(&mut rng),
            Err(_) => rng.gen_range(0..n), // all remaining points coincide with centroids
        };
        cent[j * d..(j + 1) * d].copy_from_slice(point(next));
        let c = &cent[j * d..(j + 1) * d];
        dist.par_iter_mut().enumerate().for_each(|(i, di)| *di = di.min(sq(point(i), c)));
    }
    let mut assign = vec![usize::MAX; n];
    let mut cent_t = vec![0.0; k * d];
    for _ in 0..max_iter {
        for j in 0..k {
            for t in 0..d {
                cent_t[t * k + j] = cent[j * d + t];
            }
        }
        let mut changed = false;
        let best: Vec<usize> = (0..n)
            .into_par_iter()
            .with_min_len(POINTS_PER_TASK)
            .map(|i| nearest(point(i), &cent, &cent_t, k))
            .collect();
        for (a, b) in assign.iter_mut().zip(best) {
            changed |= *a != b;
            *a = b;
        }
        if !changed {
            break;
        }
        let mut sums = vec![0.0; k * d];
        let mut counts = vec![0usize; k];
        for (i, &a) in assign.iter().enumerate() {
            counts[a] += 1;
            for (s, v) in sums[a * d..(a + 1) * d].iter_mut().zip(point(i)) {
                *s += v;
            }
        }
        for j in 0..k {
            if counts[j] > 0 {
                for t in 0..d {
                    cent[j * d + t] = sums[j * d + t] / counts[j] as f64;
                }
            }
        }
    }
    Ok(DMatrix::from_row_slice(k, d, &cent))
}
