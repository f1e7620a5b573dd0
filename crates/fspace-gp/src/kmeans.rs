//! k-means clustering (Lloyd's algorithm with k-means++ seeding), used to initialise inducing
//! points (SVGP here, VaLLA later). A dozen lines of well-known code; the clustering crates
//! (linfa-clustering) would bring ndarray and the linfa stack for it.

use nalgebra::DMatrix;
use rand::distributions::{Distribution, WeightedIndex};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::{invalid, Result};

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
    let sq =
        |i: usize, c: &DMatrix<f64>, j: usize| (0..d).map(|t| (x[(i, t)] - c[(j, t)]).powi(2)).sum::<f64>();
    let mut centroids = DMatrix::<f64>::zeros(k, d);
    centroids.set_row(0, &x.row(rng.gen_range(0..n)));
    let mut dist: Vec<f64> = (0..n).map(|i| sq(i, &centroids, 0)).collect();
    for j in 1..k {
        let next = match WeightedIndex::new(&dist) {
            Ok(w) => w.sample(&mut rng),
            Err(_) => rng.gen_range(0..n), // all remaining points coincide with centroids
        };
        centroids.set_row(j, &x.row(next));
        for (i, di) in dist.iter_mut().enumerate() {
            *di = di.min(sq(i, &centroids, j));
        }
    }
    let mut assign = vec![usize::MAX; n];
    for _ in 0..max_iter {
        let mut changed = false;
        for i in 0..n {
            let best =
                (0..k).min_by(|&a, &b| sq(i, &centroids, a).total_cmp(&sq(i, &centroids, b))).expect("k ≥ 1");
            changed |= assign[i] != best;
            assign[i] = best;
        }
        if !changed {
            break;
        }
        let mut sums = DMatrix::<f64>::zeros(k, d);
        let mut counts = vec![0usize; k];
        for i in 0..n {
            counts[assign[i]] += 1;
            for t in 0..d {
                sums[(assign[i], t)] += x[(i, t)];
            }
        }
        for j in 0..k {
            if counts[j] > 0 {
                for t in 0..d {
                    centroids[(j, t)] = sums[(j, t)] / counts[j] as f64;
                }
            }
        }
    }
    Ok(centroids)
}
