//! k-means against the plain Lloyd loop it replaced: the same centroids bit for bit.

use fspace_gp::kmeans;
use fspace_testutil::{randn, rng, same_bits};
use nalgebra::DMatrix;
use rand::distributions::{Distribution, WeightedIndex};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The straightforward version: indexed distances recomputed at every comparison,
/// `Iterator::min_by` (the first of equal minima), serial everything.
fn plain_kmeans(x: &DMatrix<f64>, k: usize, max_iter: usize, seed: u64) -> DMatrix<f64> {
    let (n, d) = x.shape();
    let mut rng = StdRng::seed_from_u64(seed);
    let sq =
        |i: usize, c: &DMatrix<f64>, j: usize| (0..d).map(|t| (x[(i, t)] - c[(j, t)]).powi(2)).sum::<f64>();
    let mut centroids = DMatrix::<f64>::zeros(k, d);
    centroids.set_row(0, &x.row(rng.gen_range(0..n)));
    let mut dist: Vec<f64> = (0..n).map(|i| sq(i, &centroids, 0)).collect();
    for j in 1..k {
        let next = match WeightedIndex::new(&dist) {
            Ok(w) => w.sample(&mut rng),
            Err(_) => rng.gen_range(0..n),
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
            let best = (0..k).min_by(|&a, &b| sq(i, &centroids, a).total_cmp(&sq(i, &centroids, b))).unwrap();
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
    centroids
}

#[test]
fn kmeans_gives_the_plain_loops_bits() {
    // k below, at and across the 8 centroids scored side by side; d from 1 to image size.
    for (case, &(n, d, k, iters)) in [
        (50, 1, 1, 10),
        (200, 3, 7, 50),
        (300, 2, 8, 50),
        (400, 5, 9, 50),
        (500, 16, 23, 30),
        (300, 784, 20, 20),
    ]
    .iter()
    .enumerate()
    {
        let x = randn(n, d, &mut rng(case as u64));
        for seed in 0..3 {
            let fast = kmeans(&x, k, iters, seed).unwrap();
            assert!(same_bits(&fast, &plain_kmeans(&x, k, iters, seed)), "n {n}, d {d}, k {k}, seed {seed}");
        }
    }
    // Ties: points on an integer grid (exactly equal distances to two centroids; the first one
    // wins), and more centroids than distinct points (the seeding's all-zero weights).
    let grid = DMatrix::from_fn(90, 2, |i, t| ((i * (t + 2)) % 5) as f64);
    for k in [2, 3, 9, 10, 12, 17] {
        for seed in 0..4 {
            assert!(
                same_bits(&kmeans(&grid, k, 40, seed).unwrap(), &plain_kmeans(&grid, k, 40, seed)),
                "ties, k {k}, seed {seed}"
            );
        }
    }
}
