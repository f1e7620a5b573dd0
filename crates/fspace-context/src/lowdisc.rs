//! Low-discrepancy sequences: Halton (own implementation) and Sobol (the `sobol` crate with
//! Joe–Kuo D6 direction numbers), both with an optional burn-in skip and seeded scrambling.
//!
//! Why our own Halton: the `halton` crate takes its base as a `u8`, so it stops at the 54th
//! prime (251) — FSP-Laplace uses Halton points in 784 dimensions (MNIST) — and it has no
//! scrambling. Unscrambled Halton points are tested against the `halton` crate where it applies.
//!
//! Scrambling: Halton uses one random permutation of the digits `{0, …, b−1}` per dimension
//! (Braaten & Weller 1979; applied to every digit position, including the trailing zeros, to
//! 53 bits of precision). Sobol uses a random digital shift (XOR of a uniform 64-bit word per
//! dimension), which keeps the (t, m, s)-net structure and makes each point uniform.

use fspace_input::InputError;
use nalgebra::DMatrix;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, RngCore, SeedableRng};
use sobol::params::JoeKuoD6;
use sobol::Sobol;

use crate::bbox::BoundingBox;
use crate::error::{ContextError, Result};
use crate::sampler::{nonzero, Sampler};

/// The first `d` primes.
pub fn first_primes(d: usize) -> Vec<u64> {
    let mut primes = Vec::with_capacity(d);
    let mut candidate = 2u64;
    while primes.len() < d {
        if primes.iter().take_while(|&&p| p * p <= candidate).all(|&p| !candidate.is_multiple_of(p)) {
            primes.push(candidate);
        }
        candidate += 1;
    }
    primes
}

/// The radical inverse `φ_b(i)`: the base-`b` digits of `i` mirrored about the radix point.
pub fn radical_inverse(base: u64, mut index: u64) -> f64 {
    let inv = 1.0 / base as f64;
    let (mut factor, mut result) = (inv, 0.0);
    while index > 0 {
        result += factor * (index % base) as f64;
        index /= base;
        factor *= inv;
    }
    result
}

/// Radical inverse with every digit (to 53-bit precision) mapped through `perm`.
fn scrambled_radical_inverse(base: u64, mut index: u64, perm: &[u32]) -> f64 {
    let inv = 1.0 / base as f64;
    let (mut factor, mut result) = (inv, 0.0);
    // Digits until the contribution drops below 2⁻⁵³.
    while factor > f64::EPSILON * 0.5 {
        result += factor * perm[(index % base) as usize] as f64;
        index /= base;
        factor *= inv;
    }
    result.min(1.0 - f64::EPSILON * 0.5)
}

/// Halton points in a box: dimension `j` is the radical inverse in the `j`-th prime base of the
/// indices `skip + 1, skip + 2, …` (index 0, the origin, is never used).
#[derive(Debug, Clone, PartialEq)]
pub struct HaltonSampler {
    bbox: BoundingBox,
    skip: u64,
    bases: Vec<u64>,
    permutations: Option<Vec<Vec<u32>>>,
}

impl HaltonSampler {
    /// Unscrambled Halton points in `bbox`.
    pub fn new(bbox: BoundingBox) -> Self {
        let bases = first_primes(bbox.dim());
        Self { bbox, skip: 0, bases, permutations: None }
    }
    /// Skips the first `skip` points (burn-in).
    pub fn skip(mut self, skip: u64) -> Self {
        self.skip = skip;
        self
    }
    /// Scrambles with random digit permutations drawn from `seed`.
    pub fn scrambled(mut self, seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        self.permutations = Some(
            self.bases
                .iter()
                .map(|&b| {
                    let mut p: Vec<u32> = (0..b as u32).collect();
                    p.shuffle(&mut rng);
                    p
                })
                .collect(),
        );
        self
    }
    /// Points in the unit cube.
    pub fn unit_points(&self, n: usize) -> Result<DMatrix<f64>> {
        nonzero(n)?;
        Ok(DMatrix::from_fn(n, self.bases.len(), |i, j| {
            let index = self.skip + i as u64 + 1;
            match &self.permutations {
                Some(p) => scrambled_radical_inverse(self.bases[j], index, &p[j]),
                None => radical_inverse(self.bases[j], index),
            }
        }))
    }
}

impl Sampler for HaltonSampler {
    fn dim(&self) -> usize {
        self.bbox.dim()
    }
    fn sample(&self, n: usize, _rng: &mut dyn RngCore) -> Result<DMatrix<f64>> {
        Ok(self.bbox.from_unit(&self.unit_points(n)?))
    }
}

/// Largest dimension supported by the Joe–Kuo D6 direction numbers shipped with `sobol`.
pub const SOBOL_MAX_DIM: usize = 21_201;

/// Sobol points in a box (Joe & Kuo 2008 direction numbers, Gray-code order as in SciPy and
/// the Joe–Kuo reference implementation; the first point is the origin unless skipped).
#[derive(Debug, Clone, PartialEq)]
pub struct SobolSampler {
    bbox: BoundingBox,
    skip: usize,
    shift: Option<Vec<u64>>,
}

impl SobolSampler {
    /// Unscrambled Sobol points in `bbox`; errors above [`SOBOL_MAX_DIM`] dimensions.
    pub fn new(bbox: BoundingBox) -> Result<Self> {
        if bbox.dim() > SOBOL_MAX_DIM {
            return Err(ContextError::Input(InputError::DimensionMismatch {
                what: "Sobol dimension (Joe–Kuo D6 supports at most 21201)",
                expected: SOBOL_MAX_DIM,
                found: bbox.dim(),
            }));
        }
        Ok(Self { bbox, skip: 0, shift: None })
    }
    /// Skips the first `skip` points (burn-in).
    pub fn skip(mut self, skip: usize) -> Self {
        self.skip = skip;
        self
    }
    /// Scrambles with a random digital shift drawn from `seed`.
    pub fn scrambled(mut self, seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        self.shift = Some((0..self.bbox.dim()).map(|_| rng.gen::<u64>()).collect());
        self
    }
    /// Points in the unit cube.
    pub fn unit_points(&self, n: usize) -> Result<DMatrix<f64>> {
        nonzero(n)?;
        let d = self.bbox.dim();
        let seq: Sobol<u64> = if d <= 1000 {
            Sobol::new(d, &JoeKuoD6::standard())
        } else {
            Sobol::new(d, &JoeKuoD6::extended())
        };
        let mut out = DMatrix::zeros(n, d);
        for (i, point) in seq.skip(self.skip).take(n).enumerate() {
            for (j, &v) in point.iter().enumerate() {
                let v = match &self.shift {
                    Some(s) => v ^ s[j],
                    None => v,
                };
                // Top 53 bits → [0, 1).
                out[(i, j)] = (v >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
            }
        }
        Ok(out)
    }
}

impl Sampler for SobolSampler {
    fn dim(&self) -> usize {
        self.bbox.dim()
    }
    fn sample(&self, n: usize, _rng: &mut dyn RngCore) -> Result<DMatrix<f64>> {
        Ok(self.bbox.from_unit(&self.unit_points(n)?))
    }
}

/// Hickernell's centred L2-discrepancy (squared) of points in the unit cube (rows of `u`):
/// `CD² = (13/12)^d − (2/n) Σᵢ Πₖ (1 + ½|uᵢₖ − ½| − ½|uᵢₖ − ½|²)
///        + (1/n²) Σᵢⱼ Πₖ (1 + ½|uᵢₖ − ½| + ½|uⱼₖ − ½| − ½|uᵢₖ − uⱼₖ|)`. Lower is more uniform.
pub fn centered_l2_discrepancy(u: &DMatrix<f64>) -> Result<f64> {
    let (n, d) = u.shape();
    if n == 0 || d == 0 {
        return Err(ContextError::Input(InputError::Empty { what: "points for the discrepancy" }));
    }
    if u.iter().any(|v| !(0.0..=1.0).contains(v)) {
        return Err(ContextError::Input(InputError::Invalid {
            what: "points",
            reason: "centred discrepancy needs points in the unit cube".into(),
        }));
    }
    let c = |v: f64| (v - 0.5).abs();
    let term1 = (13.0f64 / 12.0).powi(d as i32);
    let term2: f64 = (0..n)
        .map(|i| (0..d).map(|k| 1.0 + 0.5 * c(u[(i, k)]) - 0.5 * c(u[(i, k)]).powi(2)).product::<f64>())
        .sum::<f64>()
        * 2.0
        / n as f64;
    let mut term3 = 0.0;
    for i in 0..n {
        for j in 0..n {
            term3 += (0..d)
                .map(|k| 1.0 + 0.5 * c(u[(i, k)]) + 0.5 * c(u[(j, k)]) - 0.5 * (u[(i, k)] - u[(j, k)]).abs())
                .product::<f64>();
        }
    }
    Ok(term1 - term2 + term3 / (n * n) as f64)
}
