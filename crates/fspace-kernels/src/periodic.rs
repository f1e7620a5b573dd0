//! The periodic (exp-sine-squared) kernel of MacKay (1998), in the form used by Rasmussen &
//! Williams §5.4.3: `k(x, y) = σ² exp(−2 Σᵢ sin²(π (xᵢ − yᵢ)/p) / ℓᵢ²)`, period `p > 0`.

use crate::error::{check_param_len, from_log, positive, validate_lengthscales, Result};
use crate::kernel::{indexed_names, Kernel, KernelBase};
use crate::spec::KernelSpec;

/// Periodic kernel; hyperparameters (log space): `variance`, `lengthscale` (1 or `d`), `period`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Periodic {
    variance: f64,
    lengthscales: Vec<f64>,
    period: f64,
}

impl Periodic {
    /// Isotropic periodic kernel.
    pub fn new(variance: f64, lengthscale: f64, period: f64) -> Result<Self> {
        Self::ard(variance, vec![lengthscale], period)
    }

    /// Periodic kernel with one lengthscale per input dimension (shared period).
    pub fn ard(variance: f64, lengthscales: Vec<f64>, period: f64) -> Result<Self> {
        positive("variance", variance)?;
        positive("period", period)?;
        validate_lengthscales(&lengthscales)?;
        Ok(Self { variance, lengthscales, period })
    }

    /// The period `p`.
    pub fn period(&self) -> f64 {
        self.period
    }

    fn ls(&self, i: usize) -> f64 {
        if self.lengthscales.len() == 1 {
            self.lengthscales[0]
        } else {
            self.lengthscales[i]
        }
    }

    fn exponent(&self, x: &[f64], y: &[f64]) -> f64 {
        let w = std::f64::consts::PI / self.period;
        (0..x.len()).map(|i| (w * (x[i] - y[i])).sin().powi(2) / self.ls(i).powi(2)).sum()
    }
}

impl KernelBase for Periodic {
    fn input_dim(&self) -> Option<usize> {
        (self.lengthscales.len() > 1).then_some(self.lengthscales.len())
    }
    fn n_params(&self) -> usize {
        2 + self.lengthscales.len()
    }
    fn params(&self) -> Vec<f64> {
        let mut p = vec![self.variance.ln()];
        p.extend(self.lengthscales.iter().map(|l| l.ln()));
        p.push(self.period.ln());
        p
    }
    fn param_names(&self) -> Vec<String> {
        let mut n = vec!["variance".to_string()];
        n.extend(indexed_names("lengthscale", self.lengthscales.len()));
        n.push("period".into());
        n
    }
    fn set_params(&mut self, p: &[f64]) -> Result<()> {
        check_param_len(self.n_params(), p.len())?;
        let names = self.param_names();
        let nl = self.lengthscales.len();
        let variance = from_log(&names[0], p[0])?;
        let ls = (0..nl).map(|i| from_log(&names[1 + i], p[1 + i])).collect::<Result<Vec<_>>>()?;
        let period = from_log("period", p[1 + nl])?;
        (self.variance, self.lengthscales, self.period) = (variance, ls, period);
        Ok(())
    }
}

impl Kernel for Periodic {
    fn eval(&self, x: &[f64], y: &[f64]) -> f64 {
        self.variance * (-2.0 * self.exponent(x, y)).exp()
    }

    fn eval_grad(&self, x: &[f64], y: &[f64], out: &mut [f64]) {
        let k = self.eval(x, y);
        let w = std::f64::consts::PI / self.period;
        out[0] = k;
        let nl = self.lengthscales.len();
        out[1..1 + nl].iter_mut().for_each(|g| *g = 0.0);
        let mut dperiod = 0.0;
        for i in 0..x.len() {
            let phase = w * (x[i] - y[i]);
            let l2 = self.ls(i).powi(2);
            let slot = if nl == 1 { 0 } else { i };
            // ∂k/∂log ℓᵢ = 4k sin²/ℓᵢ²
            out[1 + slot] += 4.0 * k * phase.sin().powi(2) / l2;
            // ∂k/∂log p = 2k Σ sin(2·phase)·phase/ℓᵢ²
            dperiod += 2.0 * k * (2.0 * phase).sin() * phase / l2;
        }
        out[1 + nl] = dperiod;
    }

    fn eval_grad_x(&self, x: &[f64], y: &[f64], out: &mut [f64]) -> Result<()> {
        // ∂k/∂xᵢ = −2k · sin(2·phaseᵢ) · (π/p)/ℓᵢ²
        let k = self.eval(x, y);
        let w = std::f64::consts::PI / self.period;
        for (i, o) in out[..x.len()].iter_mut().enumerate() {
            *o = -2.0 * k * (2.0 * w * (x[i] - y[i])).sin() * w / self.ls(i).powi(2);
        }
        Ok(())
    }

    fn is_stationary(&self) -> bool {
        true
    }

    fn clone_box(&self) -> Box<dyn Kernel> {
        Box::new(self.clone())
    }

    fn spec(&self) -> Option<KernelSpec> {
        Some(KernelSpec::Periodic {
            variance: self.variance,
            lengthscales: self.lengthscales.clone(),
            period: self.period,
        })
    }
}
