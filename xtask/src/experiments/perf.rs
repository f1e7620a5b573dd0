//! `perf` — the project against the machine and against PyTorch, in one run (≤ 3 minutes on 2
//! cores). Writes `results/perf/metrics.json` with flat numeric fields:
//!
//! | field | what |
//! |---|---|
//! | `gfsvi_step_ms` | one GFSVI objective + gradient, M = 500 measurement points, 2×30 tanh (p = 1 021), batch 100 (median of 10) |
//! | `gfsvi_bound_ms` | a GEMM of the step's GEMM-shaped multiply-adds `gfsvi_step_madds` = 2M²p + 2M³ (`J S Jᵀ` and its pullback `J·C`, M²p each; the KL's two SPD inverses, M³ each by LAPACK's count; 7.6e8): 500 × 3 042 times 3 042 × 500 by the workspace's parallel GEMM (`fspace_linalg::blocked::par_matmul`, all rayon threads), timed here (median of 10) |
//! | `gfsvi_gram_bound_ms` | the same GEMM of `J S Jᵀ` alone (M²p, 500 × 1 021 times 1 021 × 500), the yardstick of earlier rounds |
//! | `gfsvi_step_over_bound` | their ratio (the target: ≤ 2.5) |
//! | `lenet_epoch_s`, `fsp_cnn_epoch_s` | one epoch of MAP training (Adam 1e-3, batch 100, f64) on 5 400 MNIST images, × 10 |
//! | `fsp_toy_prior_s` | FSP-Laplace on the sine toy for one RBF prior: 8 000 full-batch steps + Alg. 2 |
//! | `w1_full_lla_s` | W1 (sine toy, 2×50 tanh, p = 2 701): full-GGN Laplace fit + λ by marginal likelihood + GLM predictive at 1 000 points |
//! | `torch_lenet_epoch_s`, `torch_fsp_cnn_epoch_s` | the same epochs in PyTorch (CPU, f64, 2 threads), run live by `scripts/compare/torch_epoch.py` — present only when a python with torch is importable (`$FSPACE_PYTHON`, else `python3`) |
//!
//! Every number is measured in this run on this machine; nothing is a recorded reference.

use std::time::Instant;

use anyhow::Result;
use fspace_core::{Data, Fitted, LikelihoodSpec};
use fspace_fsp_laplace::{fit as fsp_fit, ContextDesign};
use fspace_gfsvi::{objective, KlPrior, VariationalParams};
use fspace_kernels::{GpPrior, Rbf};
use fspace_laplace::{fit as laplace_fit, LaplaceConfig, MarglikConfig, Structure};
use fspace_nn::{Activation, Cnn, CnnConfig};
use nalgebra::{DMatrix, DVector};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use crate::harness::registry::Options;
use crate::harness::report::{markdown_table, Run};
use crate::protocols::images::{train_val_test, ImageSet};
use crate::protocols::sine::sine_config;
use crate::protocols::timing::{median_ms, time_network, torch_epochs_live};
use crate::protocols::{tanh_mlp, targets};

/// GFSVI's step against GEMMs of its flop count.
struct StepTiming {
    /// Median ms of one objective + gradient.
    step: f64,
    /// Median ms of a GEMM of the step's GEMM-shaped multiply-adds ([`Self::madds`]).
    bound: f64,
    /// The step's GEMM-shaped multiply-adds: `J S Jᵀ` (M²p), its pullback `J·C` (M²p) and the two
    /// SPD inverses of the KL (M³ each: Cholesky M³/3 plus the inverse 2M³/3, LAPACK's count).
    madds: f64,
    /// Median ms of a GEMM of `J S Jᵀ` alone (M²p), the yardstick of earlier rounds.
    gram_bound: f64,
}

/// [`StepTiming`] of GFSVI at M = 500 on a 2×30 tanh network.
fn gfsvi_step() -> Result<StepTiming> {
    let mut net = tanh_mlp(1, &[30, 30], 1, 0)?;
    let p = net.params().len();
    let x = DMatrix::from_fn(100, 1, |i, _| -1.0 + 2.0 * ((i as f64 * 0.618_034).fract()));
    let y = x.map(|v| (std::f64::consts::TAU * v).sin());
    let xm = DMatrix::from_fn(500, 1, |i, _| -1.0 + 2.0 * ((i as f64 * 0.754_877_666).fract()));
    let params = VariationalParams {
        mean: net.params(),
        log_std: DVector::from_element(p, -3.0),
        log_noise_std: -2.0,
    };
    let prior = KlPrior::Gp(GpPrior::centered(Rbf::new(1.0, 0.3)?));
    let step = median_ms(10, || {
        objective(&mut net, &params, &prior, &x, &y, 100, &xm, 1e-10)?;
        Ok(())
    })?;
    let m = 500usize;
    let gemm_ms = |k: usize| {
        let a = DMatrix::from_fn(m, k, |i, j| ((i * 7 + j * 3) % 11) as f64 * 0.1);
        let b = a.transpose();
        median_ms(10, || {
            std::hint::black_box(fspace_linalg::blocked::par_matmul(&a, &b));
            Ok(())
        })
    };
    // A GEMM of M² · k multiply-adds with k = 2p + 2M has the step's count.
    let madds = (m * m * (2 * p + 2 * m)) as f64;
    Ok(StepTiming { step, bound: gemm_ms(2 * p + 2 * m)?, madds, gram_bound: gemm_ms(p)? })
}

/// Seconds of FSP-Laplace on the sine toy with one RBF prior (8 000 steps + Alg. 2).
fn fsp_toy_prior() -> Result<f64> {
    let mut rng = StdRng::seed_from_u64(0);
    let data = fspace_data::sine(100, 0.1, &mut rng)?;
    let config = sine_config(100, 8000, 100, ContextDesign::Grid, 0)?;
    let prior = GpPrior::centered(Rbf::new(1.0, 0.3)?);
    let t = Instant::now();
    let Fitted { .. } = fsp_fit(
        tanh_mlp(1, &[50, 50], 1, 0)?,
        LikelihoodSpec::gaussian(0.1),
        &prior,
        &Data::new(&data.x, &targets(&data.y_vec(), 1))?,
        &config,
    )?;
    Ok(t.elapsed().as_secs_f64())
}

/// Seconds of W1's full-GGN Laplace: fit, λ by marginal likelihood, GLM predictive at 1 000
/// points (the `laplace_workloads` example's W1 / full case).
fn w1_full_lla() -> Result<f64> {
    let mut rng = StdRng::seed_from_u64(0);
    let data = fspace_data::sine(100, 0.1, &mut rng)?;
    let x_test = DMatrix::from_fn(1000, 1, |i, _| -2.0 + 4.0 * i as f64 / 999.0);
    let t = Instant::now();
    let cfg = LaplaceConfig { structure: Structure::full(), ..Default::default() };
    let net = tanh_mlp(1, &[50, 50], 1, 0)?;
    let mut post =
        laplace_fit(net, LikelihoodSpec::gaussian(0.1), &Data::new(&data.x, &data.y)?, &cfg)?.posterior;
    post.optimize_prior_precision(&MarglikConfig::default())?;
    std::hint::black_box(post.predict_glm(&x_test)?);
    Ok(t.elapsed().as_secs_f64())
}

/// PyTorch's LeNet-5 and FSP CNN epochs on 5 400 images × 10, if a python with torch runs.
fn torch_epochs(run: &mut Run) -> Option<(f64, f64)> {
    let v = torch_epochs_live(run, Some(5_400), "lenet,fsp")?;
    Some((v["lenet_epoch_s"].as_f64()?, v["fsp_cnn_epoch_s"].as_f64()?))
}

/// `metrics.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Metrics {
    /// Median milliseconds of one GFSVI step (M = 500, 2×30).
    pub gfsvi_step_ms: f64,
    /// Milliseconds of one GEMM of the step's GEMM-shaped multiply-adds.
    pub gfsvi_bound_ms: f64,
    /// Their ratio.
    pub gfsvi_step_over_bound: f64,
    /// The step's GEMM-shaped multiply-adds (2M²p + 2M³).
    pub gfsvi_step_madds: f64,
    /// Milliseconds of the GEMM of J S Jᵀ alone.
    pub gfsvi_gram_bound_ms: f64,
    /// Seconds of one LeNet-5 epoch (5 400 × 10 images).
    pub lenet_epoch_s: f64,
    /// Seconds of one FSP CNN epoch.
    pub fsp_cnn_epoch_s: f64,
    /// Seconds of the FSP-Laplace sine toy under one RBF prior.
    pub fsp_toy_prior_s: f64,
    /// Seconds of the W1 full-GGN Laplace.
    pub w1_full_lla_s: f64,
    /// PyTorch's LeNet-5 epoch, when a python with torch ran.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub torch_lenet_epoch_s: Option<f64>,
    /// PyTorch's FSP CNN epoch, when a python with torch ran.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub torch_fsp_cnn_epoch_s: Option<f64>,
}

/// Runs the measurements.
pub fn run(opts: &Options) -> Result<()> {
    let mut run = Run::new(&opts.out, "perf")?;
    let StepTiming { step, bound, madds, gram_bound } = gfsvi_step()?;
    run.log(format!(
        "GFSVI step (M = 500, 2×30): {step:.2} ms; GEMM of its {madds:.3e} multiply-adds: {bound:.2} ms \
         ({:.1}× the bound); GEMM of J S Jᵀ alone: {gram_bound:.2} ms",
        step / bound
    ));

    let (train, _, _, _) = train_val_test(ImageSet::Mnist, 0)?;
    let train = train.subset(5_400, 0);
    let lenet =
        time_network(&mut Cnn::new(CnnConfig::lenet5(10, Activation::Tanh, 0))?, &train.x, &train.y, 10.0)?;
    let fsp_cnn = time_network(
        &mut Cnn::new(CnnConfig::fsp_mnist(10, Activation::Tanh, 0))?,
        &train.x,
        &train.y,
        10.0,
    )?;
    run.log(format!(
        "epochs (5 400 images × 10): LeNet-5 {:.2} s, FSP CNN {:.2} s",
        lenet.epoch_s, fsp_cnn.epoch_s
    ));

    let toy = fsp_toy_prior()?;
    run.log(format!("FSP-Laplace sine toy, one RBF prior (8 000 steps + Alg. 2): {toy:.2} s"));
    let w1 = w1_full_lla()?;
    run.log(format!("W1 full-GGN Laplace (fit + marginal likelihood + 1 000 predictions): {w1:.2} s"));

    let torch = torch_epochs(&mut run);
    if let Some((t_lenet, t_fsp)) = torch {
        run.log(format!("PyTorch (live): LeNet-5 {t_lenet:.2} s, FSP CNN {t_fsp:.2} s"));
    }
    let torch_cell = |v: Option<f64>, ours: f64| {
        v.map_or("– (no python with torch)".to_string(), |t| format!("{t:.2} s (ours {:.2}×)", ours / t))
    };
    let rows = vec![
        vec![
            "GFSVI step, M = 500, 2×30".into(),
            format!("{step:.2} ms"),
            format!(
                "GEMM bound of its {madds:.2e} multiply-adds {bound:.2} ms ({:.1}×); J S Jᵀ alone {gram_bound:.2} ms",
                step / bound
            ),
        ],
        vec![
            "LeNet-5 epoch (5 400 × 10)".into(),
            format!("{:.2} s", lenet.epoch_s),
            torch_cell(torch.map(|t| t.0), lenet.epoch_s),
        ],
        vec![
            "FSP CNN epoch (5 400 × 10)".into(),
            format!("{:.2} s", fsp_cnn.epoch_s),
            torch_cell(torch.map(|t| t.1), fsp_cnn.epoch_s),
        ],
        vec!["FSP toy prior (8 000 steps + Alg. 2)".into(), format!("{toy:.2} s"), "–".into()],
        vec!["W1 full LLA".into(), format!("{w1:.2} s"), "–".into()],
    ];
    run.write_table(&format!(
        "# perf\n\nMeasured in one run on this machine ({} rayon threads). \"–\": no reference for that row.\n\n{}\n",
        rayon::current_num_threads(),
        markdown_table(&["measurement", "fspace", "reference"], &rows)
    ))?;
    run.write_metrics(&Metrics {
        gfsvi_step_ms: step,
        gfsvi_bound_ms: bound,
        gfsvi_step_over_bound: step / bound,
        gfsvi_step_madds: madds,
        gfsvi_gram_bound_ms: gram_bound,
        lenet_epoch_s: lenet.epoch_s,
        fsp_cnn_epoch_s: fsp_cnn.epoch_s,
        fsp_toy_prior_s: toy,
        w1_full_lla_s: w1,
        torch_lenet_epoch_s: torch.map(|t| t.0),
        torch_fsp_cnn_epoch_s: torch.map(|t| t.1),
    })?;
    Ok(())
}
