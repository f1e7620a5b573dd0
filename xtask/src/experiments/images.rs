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

/// Mean predictive entropy of `probs`.
pub fn mean_entropy(probs: &DMatrix<f64>) -> Result<f64> {
    let ent = fspace_metrics::predictive_entropy(probs)?;
    Ok(ent.iter().sum::<f64>() / ent.len() as f64)
}
