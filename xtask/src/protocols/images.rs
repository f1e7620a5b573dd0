//! The MNIST / Fashion-MNIST pipeline shared by the image experiments: loading the bundled
//! IDX files, one scalar standardisation fitted on the training pixels, a seeded 90/10
//! train/validation split, seeded subsets, and the classification metrics every table reports.

use anyhow::Result;
use fspace_data::{fashion_mnist, mnist, Dataset, Split};
use nalgebra::{DMatrix, DVector};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

/// Which image set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageSet {
    /// MNIST digits.
    Mnist,
    /// Fashion-MNIST.
    FashionMnist,
}

/// Images as rows (784 standardised pixels) and labels.
pub struct Images {
    /// `n × 784`.
    pub x: DMatrix<f64>,
    /// Labels `0..10` as `f64`.
    pub y: DVector<f64>,
}

impl Images {
    /// The rows `idx`.
    pub fn select(&self, idx: &[usize]) -> Images {
        Images {
            x: self.x.select_rows(idx),
            y: DVector::from_iterator(idx.len(), idx.iter().map(|&i| self.y[i])),
        }
    }
    /// A seeded random subset of `n` rows (all rows if `n ≥ len`).
    pub fn subset(&self, n: usize, seed: u64) -> Images {
        let mut idx: Vec<usize> = (0..self.x.nrows()).collect();
        idx.shuffle(&mut StdRng::seed_from_u64(seed));
        idx.truncate(n.min(idx.len()));
        self.select(&idx)
    }
}

/// The sparse Dirichlet GP baseline through `fspace_gp::sparse_dirichlet::fit`: an RBF kernel of
/// `(variance, lengthscale)`, `n_inducing` training images (a subset seeded by `seed`) as
/// inducing inputs, Milios et al.'s `α_ε = 0.01`, ten classes.
pub fn sparse_dirichlet_gp(
    train: &Images,
    (variance, lengthscale): (f64, f64),
    n_inducing: usize,
    seed: u64,
) -> Result<fspace_gp::SparseDirichletGp<fspace_kernels::Rbf>> {
    let z = train.subset(n_inducing, seed).x;
    let labels = DMatrix::from_column_slice(train.y.len(), 1, train.y.as_slice());
    let prior = fspace_kernels::GpPrior::with_kernel(
        fspace_kernels::Rbf::new(variance, lengthscale)?,
        fspace_kernels::PriorMean::Zero,
    );
    let config = fspace_gp::SparseDirichletConfig {
        inducing: fspace_gp::InducingPoints::Given(z),
        alpha_eps: 0.01,
        ..Default::default()
    };
    let data = fspace_core::Data::new(&train.x, &labels)?;
    Ok(fspace_gp::sparse_dirichlet::fit(
        fspace_core::LikelihoodSpec::categorical(10),
        &prior,
        &data,
        &config,
    )?
    .posterior)
}

fn load(set: ImageSet, split: Split) -> Result<Dataset> {
    Ok(match set {
        ImageSet::Mnist => mnist(split)?,
        ImageSet::FashionMnist => fashion_mnist(split)?,
    })
}

/// `(train, validation, test)` of `set` with pixels standardised by the training pixels' mean
/// and standard deviation (one scalar each), the 60 000 training images split 90/10 by `seed`.
pub fn train_val_test(set: ImageSet, seed: u64) -> Result<(Images, Images, Images, (f64, f64))> {
    let train = load(set, Split::Train)?;
    let test = load(set, Split::Test)?;
    let n = train.x.len() as f64;
    let mean = train.x.iter().sum::<f64>() / n;
    let sd = (train.x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt();
    let norm = |d: &Dataset| Images { x: d.x.map(|v| (v - mean) / sd), y: d.y_vec() };
    let all = norm(&train);
    let mut idx: Vec<usize> = (0..all.x.nrows()).collect();
    idx.shuffle(&mut StdRng::seed_from_u64(seed));
    let n_val = idx.len() / 10;
    let (val_idx, train_idx) = idx.split_at(n_val);
    Ok((all.select(train_idx), all.select(val_idx), norm(&test), (mean, sd)))
}

/// The test images of `set` standardised with another set's `(mean, sd)` (an OOD set).
pub fn test_with(set: ImageSet, stats: (f64, f64)) -> Result<Images> {
    let d = load(set, Split::Test)?;
    Ok(Images { x: d.x.map(|v| (v - stats.0) / stats.1), y: d.y_vec() })
}

/// Accuracy, NLL, ECE (15 bins), Brier and mean predictive entropy of class probabilities.
pub struct ClassMetrics {
    /// Accuracy.
    pub accuracy: f64,
    /// Mean negative log-likelihood.
    pub nll: f64,
    /// Expected calibration error.
    pub ece: f64,
    /// Brier score.
    pub brier: f64,
    /// Mean predictive entropy.
    pub entropy: f64,
}

/// [`ClassMetrics`] of `probs` (`n × C`) against labels `y`.
pub fn class_metrics(probs: &DMatrix<f64>, y: &DVector<f64>) -> Result<ClassMetrics> {
    let ys = y.as_slice();
    let ent = fspace_metrics::predictive_entropy(probs)?;
    Ok(ClassMetrics {
        accuracy: fspace_metrics::accuracy(probs, ys)?,
        nll: fspace_metrics::categorical_nll(probs, ys)?,
        ece: fspace_metrics::ece(probs, ys, 15)?,
        brier: fspace_metrics::brier(probs, ys)?,
        entropy: ent.iter().sum::<f64>() / ent.len() as f64,
    })
}

/// Row-wise softmax of a network's logits on `x` (the MAP predictive).
pub fn map_probs<N: fspace_nn::Network>(net: &N, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
    Ok(softmax_rows(&net.forward(x)?))
}

/// Class probabilities from `samples` joint function samples of `post` on `x` (seeded): the
/// mean of the samples' softmax, and each sample's softmax (`n × C` each).
pub fn sampled_class_probs(
    post: &dyn fspace_core::Posterior,
    x: &DMatrix<f64>,
    samples: usize,
    seed: u64,
) -> Result<(DMatrix<f64>, Vec<DMatrix<f64>>)> {
    let draws = post.sample_functions(x, samples, &mut StdRng::seed_from_u64(seed))?;
    Ok(softmax_mean(&draws, x.nrows(), post.output_dim()))
}

/// Class probabilities from `samples` draws of independent per-point, per-class Gaussian
/// logits (a predictive's marginals, for models whose joint samples are too costly): the mean
/// softmax and each draw's softmax, as [`sampled_class_probs`].
pub fn marginal_sampled_class_probs(
    pred: &fspace_core::FunctionPredictive,
    samples: usize,
    seed: u64,
) -> (DMatrix<f64>, Vec<DMatrix<f64>>) {
    use rand_distr::{Distribution, StandardNormal};
    let mut rng = StdRng::seed_from_u64(seed);
    let (n, c) = pred.mean.shape();
    let draws: Vec<DMatrix<f64>> = (0..samples)
        .map(|_| {
            DMatrix::from_fn(n, c, |i, k| {
                let z: f64 = StandardNormal.sample(&mut rng);
                pred.mean[(i, k)] + pred.var[(i, k)].sqrt() * z
            })
        })
        .collect();
    softmax_mean(&draws, n, c)
}

/// Each draw's row-wise softmax (`n × C` logits each) and their mean.
fn softmax_mean(draws: &[DMatrix<f64>], n: usize, c: usize) -> (DMatrix<f64>, Vec<DMatrix<f64>>) {
    let per_sample: Vec<DMatrix<f64>> = draws.iter().map(softmax_rows).collect();
    let mut mean = DMatrix::zeros(n, c);
    for p in &per_sample {
        mean += p;
    }
    (mean / per_sample.len().max(1) as f64, per_sample)
}

/// Row-wise softmax of logits.
fn softmax_rows(f: &DMatrix<f64>) -> DMatrix<f64> {
    let mut p = DMatrix::zeros(f.nrows(), f.ncols());
    for i in 0..f.nrows() {
        let row: Vec<f64> = f.row(i).iter().cloned().collect();
        for (j, v) in fspace_core::softmax(&row).into_iter().enumerate() {
            p[(i, j)] = v;
        }
    }
    p
}

/// The 28×28 images (rows of `x`) rotated by `degrees` anticlockwise about the image centre,
/// by bilinear interpolation; pixels that come from outside the frame get `background` (the
/// standardised value of a black pixel). Ovadia et al.'s (2019) rotated-MNIST shift.
pub fn rotate(x: &DMatrix<f64>, degrees: f64, background: f64) -> DMatrix<f64> {
    const SIDE: usize = 28;
    let (s, c) = degrees.to_radians().sin_cos();
    let centre = (SIDE as f64 - 1.0) / 2.0;
    let mut out = DMatrix::from_element(x.nrows(), x.ncols(), background);
    for r in 0..SIDE {
        for col in 0..SIDE {
            // The source of output pixel (r, col): rotate back by −θ.
            let (dy, dx) = (r as f64 - centre, col as f64 - centre);
            let (sy, sx) = (c * dy + s * dx + centre, -s * dy + c * dx + centre);
            let (y0, x0) = (sy.floor(), sx.floor());
            let (fy, fx) = (sy - y0, sx - x0);
            let at = |img: usize, yy: f64, xx: f64| {
                if yy < 0.0 || xx < 0.0 || yy > (SIDE - 1) as f64 || xx > (SIDE - 1) as f64 {
                    background
                } else {
                    x[(img, yy as usize * SIDE + xx as usize)]
                }
            };
            for img in 0..x.nrows() {
                out[(img, r * SIDE + col)] = (1.0 - fy) * (1.0 - fx) * at(img, y0, x0)
                    + (1.0 - fy) * fx * at(img, y0, x0 + 1.0)
                    + fy * (1.0 - fx) * at(img, y0 + 1.0, x0)
                    + fy * fx * at(img, y0 + 1.0, x0 + 1.0);
            }
        }
    }
    out
}

/// Mean predictive entropy of `probs`.
pub fn mean_entropy(probs: &DMatrix<f64>) -> Result<f64> {
    let ent = fspace_metrics::predictive_entropy(probs)?;
    Ok(ent.iter().sum::<f64>() / ent.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_by_quarter_turns_permutes_pixels_and_zero_is_identity() {
        let x = DMatrix::from_fn(2, 784, |i, j| ((i * 784 + j) as f64 * 0.37).sin());
        let close = |a: &DMatrix<f64>, b: &DMatrix<f64>| (a - b).amax() < 1e-9;
        assert!(close(&rotate(&x, 0.0, -1.0), &x));
        let r90 = rotate(&x, 90.0, -1.0);
        // Anticlockwise: the top-right pixel (row 0, column 27) moves to the top-left.
        assert!((r90[(0, 0)] - x[(0, 27)]).abs() < 1e-9);
        let r360 = rotate(&rotate(&rotate(&r90, 90.0, -1.0), 90.0, -1.0), 90.0, -1.0);
        assert!(close(&r360, &x));
        // A 45° turn leaves the corners outside the frame: they become the background.
        assert_eq!(rotate(&x, 45.0, -7.0)[(1, 0)], -7.0);
    }
}
