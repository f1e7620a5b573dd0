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

/// `kmeans_sharded` on `world` threads, each with its contiguous shard of `x` (`bounds`).
fn sharded(x: &DMatrix<f64>, bounds: &[usize], k: usize, seed: u64) -> Vec<fspace_gp::Result<DMatrix<f64>>> {
    let world = bounds.len() - 1;
    let layout: Vec<(usize, usize)> = (0..world).map(|r| (bounds[r], bounds[r + 1] - bounds[r])).collect();
    let reducer = fspace_testutil::ThreadReduce::new(world);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let (reducer, layout) = (&reducer, &layout);
                let rows = x.rows(bounds[rank], bounds[rank + 1] - bounds[rank]).into_owned();
                scope.spawn(move || {
                    let mut sum = |part: Vec<f64>| {
                        Ok(reducer
                            .reduce(rank, nalgebra::DVector::from_vec(part), false)
                            .unwrap()
                            .data
                            .into())
                    };
                    let shard = fspace_gp::KmeansShard { rank, layout, sum: &mut sum };
                    fspace_gp::kmeans_sharded(&rows, k, 30, seed, shard)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Over 2 and 3 processes (uneven shards, one of them empty) every process gets the
/// one-process centroids to rounding (the sums' order); a layout that does not fit the rows is
/// refused.
#[test]
fn sharded_kmeans_is_the_single_process_clustering() {
    let x = randn(301, 3, &mut rng(71));
    for (k, seed) in [(1, 1), (7, 2), (20, 3)] {
        // `kmeans` is this clustering on one process (and the plain loop's bits, above).
        let single = kmeans(&x, k, 30, seed).unwrap();
        for bounds in [vec![0, 150, 301], vec![0, 101, 101, 301], vec![0, 7, 200, 301]] {
            for got in sharded(&x, &bounds, k, seed) {
                let err = (got.unwrap() - &single).amax() / single.amax();
                assert!(err < 1e-12, "k = {k}, shards {bounds:?}: centroids differ by {err:e}");
            }
        }
    }
    let mut sum = |part: Vec<f64>| Ok(part);
    let layout = [(0, 10)];
    let shard = fspace_gp::KmeansShard { rank: 0, layout: &layout, sum: &mut sum };
    let err = fspace_gp::kmeans_sharded(&x, 3, 10, 0, shard).unwrap_err().to_string();
    assert!(err.contains("301 rows where the layout has 10"), "{err}");
}
