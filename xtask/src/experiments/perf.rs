//! `perf` — the project against the machine and against PyTorch, in one run (≤ 3 minutes on 2
//! cores). Writes `results/perf/metrics.json` with flat numeric fields:
//!
//! | field | what |
//! |---|---|
//! | `gfsvi_step_ms` | one GFSVI objective + gradient, M = 500 measurement points, 2×30 tanh (p = 1 021), batch 100 (median of 7) |
//! | `gfsvi_bound_ms` | a GEMM of the step's GEMM-shaped multiply-adds `gfsvi_step_madds` = 1.5 M²p + 2M³ (`J S Jᵀ`'s lower triangle M²p/2, its pullback `Jᵀ C` M²p, the KL's two SPD inverses M³ each by LAPACK's count; 6.3e8): 500 × 2 532 times 2 532 × 500 by the workspace's fastest GEMM (faer's, `fspace_linalg::fast::matmul`, all rayon threads — the one the GFSVI and TFSVI steps use), timed here |
//! | `gfsvi_gram_bound_ms` | the same GEMM of `J S Jᵀ` alone (M²p, 500 × 1 021 times 1 021 × 500), the yardstick of earlier rounds |
//! | `gfsvi_bound_nalgebra_ms` | `gfsvi_bound_ms`'s GEMM by nalgebra's own product (`matrixmultiply`, one thread): what the step would cost without faer |
//! | `gfsvi_step_over_bound` | their ratio (the target: ≤ 2.5) |
//! | `tfsvi_step_ms`, `tfsvi_bound_ms` | the same for TFSVI (the prior's pushforward `J σ² Jᵀ` and its pullback add 1.5 M²p, the KL's gradient in the prior covariance `Σ_p⁻¹ Σ_q Σ_p⁻¹` 2M³) |
//! | `valla_iteration_ms`, `valla_bound_ms` | one VaLLA iteration (objective + gradient including `Z`) on the MNIST MLP 784-200-200-10, batch 100, M = 200, and the GEMM of its multiply-adds counted from the NTK and objective code (`valla_madds` in this file) |
//! | `sweeps` | every M measured: GFSVI 100 … 1 000, TFSVI 100 … 500, VaLLA 50 … 200 (`m`, `step_ms`, `madds`, `bound_ms`, `ratio`) |
//! | `lenet_epoch_s`, `fsp_cnn_epoch_s` | one epoch of MAP training (Adam 1e-3, batch 100, f64) on 5 400 MNIST images, × 10; the median of 3 rounds (below) |
//! | `fsp_toy_prior_s` | FSP-Laplace on the sine toy for one RBF prior: 8 000 full-batch steps + Alg. 2 |
//! | `w1_full_lla_s` | W1 (sine toy, 2×50 tanh, p = 2 701): full-GGN Laplace fit + λ by marginal likelihood + GLM predictive at 1 000 points |
//! | `torch_lenet_epoch_s`, `torch_fsp_cnn_epoch_s` | the same epochs in PyTorch (CPU, f64, 2 threads), run live by `scripts/compare/torch_epoch.py` — present only when a python with torch is importable (`$FSPACE_PYTHON`, else `python3`). Each of the 3 rounds times one fspace epoch and then one PyTorch epoch, each after an untimed warm-up epoch, so both sides see the same state of the machine |
//! | `lenet_over_torch`, `fsp_cnn_over_torch` | the median over rounds of fspace's epoch over PyTorch's (present with them) |
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
use fspace_valla::internals::iteration as valla_iteration;
use fspace_valla::VariationalState;
use nalgebra::{DMatrix, DVector};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use crate::harness::registry::Options;
use crate::harness::report::{markdown_table, Run};
use crate::protocols::images::{train_val_test, ImageSet, Images};
use crate::protocols::sine::sine_config;
use crate::protocols::timing::{median, median_ms, one_epoch, torch_epoch_script, torch_python};
use crate::protocols::{tanh_mlp, targets};

/// One method's iteration at one size against a GEMM of the iteration's GEMM-shaped work.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BoundPoint {
    /// The number of measurement / inducing points `M`.
    pub m: usize,
    /// Median milliseconds of one objective + gradient.
    pub step_ms: f64,
    /// The iteration's GEMM-shaped multiply-adds, counted from the code (see the counting
    /// functions in `perf.rs`).
    pub madds: f64,
    /// Median milliseconds of one GEMM (`M × k` times `k × M`, `k = madds / M²`) of the same
    /// multiply-adds by faer's parallel GEMM.
    pub bound_ms: f64,
    /// `step_ms / bound_ms` (the target: ≤ 2.5).
    pub ratio: f64,
}

/// A parallel GEMM of the workspace.
type Product = fn(&DMatrix<f64>, &DMatrix<f64>) -> DMatrix<f64>;

/// Median milliseconds of `product` on `madds` multiply-adds shaped `m × k` times `k × m`.
fn gemm_ms(product: Product, m: usize, madds: f64, reps: usize) -> Result<f64> {
    let k = ((madds / (m * m) as f64).round() as usize).max(1);
    let a = DMatrix::from_fn(m, k, |i, j| ((i * 7 + j * 3) % 11) as f64 * 0.1);
    let b = a.transpose();
    median_ms(reps, || {
        std::hint::black_box(product(&a, &b));
        Ok(())
    })
}

/// [`gemm_ms`] by faer's GEMM, the fastest of the workspace (the GFSVI / TFSVI steps use it).
fn gemm_bound_ms(m: usize, madds: f64, reps: usize) -> Result<f64> {
    gemm_ms(fspace_linalg::fast::matmul, m, madds, reps)
}

/// GFSVI's GEMM-shaped multiply-adds per step: `J S Jᵀ` (`M²p/2`: `fast::gram` computes the lower
/// triangle only), its pullback `Jᵀ C` (`M²p`), the KL's two SPD inverses (`M³` each by
/// LAPACK's count: Cholesky `M³/3` plus the inverse `2M³/3`).
fn gfsvi_madds(m: usize, p: usize) -> f64 {
    let (m, p) = (m as f64, p as f64);
    1.5 * m * m * p + 2.0 * m * m * m
}

/// TFSVI's: GFSVI's plus the prior's pushforward `J σ_p² Jᵀ` and its pullback (`1.5 M²p`), and
/// the KL's gradient in the prior covariance, whose `Σ_p⁻¹ Σ_q Σ_p⁻¹` is two `M³` products
/// (`fspace_gfsvi::gaussian_kl` with `with_prior_grad`).
fn tfsvi_madds(m: usize, p: usize) -> f64 {
    let mf = m as f64;
    gfsvi_madds(m, p) + 1.5 * (m * m * p) as f64 + 2.0 * mf * mf * mf
}

/// VaLLA's GEMM-shaped multiply-adds per iteration for an MLP with layer sizes `sizes`
/// (`d, h₁, …, d'`), a batch of `n` points (all `d'` outputs: `n·d'` rows) and `m` inducing
/// points (one output each), counted from `fspace_nn::ntk` and `fspace_valla::objective`:
/// * each side of the NTK: the hidden layers' forward GEMMs and the δ recursion
///   `δ_{j+1} W_{j+1}`;
/// * the layer products `a_j(X) a_j(Z)ᵀ`, `δ_j(X) δ_j(Z)ᵀ` of `κ(X, Z)` and `κ(Z, Z)`, and the
///   same shapes again in their cotangents;
/// * the pull-back through `Z`'s δ recursion and forward pass;
/// * the objective's `M × M` algebra, `25/3 M³` (`K_Z L`, `Lᵀ K_Z L`, the Cholesky of `B`,
///   `B⁻¹` by two triangular solves, `B⁻²`, `Lᵀ K_Z L` again, `K_Z L B̄`, `L B̄ Lᵀ`), and its
///   `n·d' × M` algebra, `5·n d' M²` (`κ(X, Z) L`, two triangular solves, `Y Yᵀ`,
///   `κ(X, Z)ᵀ W̄`, `W̄ Lᵀ`).
fn valla_madds(sizes: &[usize], n: usize, m: usize) -> f64 {
    let q = *sizes.last().expect("layer sizes");
    let layers: Vec<(f64, f64)> = sizes.windows(2).map(|w| (w[0] as f64, w[1] as f64)).collect();
    let hidden = &layers[..layers.len() - 1];
    let forward: f64 = hidden.iter().map(|(i, o)| i * o).sum();
    let delta: f64 = (0..hidden.len()).map(|j| layers[j + 1].1 * layers[j].1).sum();
    let (sum_in, sum_out): (f64, f64) = (layers.iter().map(|l| l.0).sum(), layers.iter().map(|l| l.1).sum());
    let (n, m, rows_x) = (n as f64, m as f64, (n * q) as f64);
    let sides = n * forward + rows_x * delta + m * (forward + delta);
    let products = 2.0 * (n * m * sum_in + rows_x * m * sum_out) + 2.0 * m * m * (sum_in + sum_out);
    let backprop = m * (delta + forward);
    let algebra = 25.0 / 3.0 * m * m * m + 5.0 * rows_x * m * m;
    sides + products + backprop + algebra
}

/// GFSVI (`tfsvi = false`) or TFSVI steps at each `M` on a 2×30 tanh network, batch 100.
fn fsvi_sweep(ms: &[usize], tfsvi: bool) -> Result<Vec<BoundPoint>> {
    let mut net = tanh_mlp(1, &[30, 30], 1, 0)?;
    let p = net.params().len();
    let x = DMatrix::from_fn(100, 1, |i, _| -1.0 + 2.0 * ((i as f64 * 0.618_034).fract()));
    let y = x.map(|v| (std::f64::consts::TAU * v).sin());
    let params = VariationalParams {
        mean: net.params(),
        log_std: DVector::from_element(p, -3.0),
        log_noise_std: -2.0,
    };
    let prior = if tfsvi {
        KlPrior::WeightPushforward { sigma_p: 1.0 }
    } else {
        KlPrior::Gp(GpPrior::centered(Rbf::new(1.0, 0.3)?))
    };
    ms.iter()
        .map(|&m| {
            let xm = DMatrix::from_fn(m, 1, |i, _| -1.0 + 2.0 * ((i as f64 * 0.754_877_666).fract()));
            let reps = if m >= 1000 { 3 } else { 7 };
            let step_ms = median_ms(reps, || {
                objective(&mut net, &params, &prior, &x, &y, 100, &xm, 1e-10)?;
                Ok(())
            })?;
            let madds = if tfsvi { tfsvi_madds(m, p) } else { gfsvi_madds(m, p) };
            let bound_ms = gemm_bound_ms(m, madds, reps)?;
            Ok(BoundPoint { m, step_ms, madds, bound_ms, ratio: step_ms / bound_ms })
        })
        .collect()
}

/// VaLLA iterations (objective + exact gradient including `Z`, as `fit` runs them) on the MNIST
/// MLP 784-200-200-10, batch 100, at each `M` (the `valla_iteration` bench's case).
fn valla_sweep(ms: &[usize]) -> Result<Vec<BoundPoint>> {
    let sizes = [784, 200, 200, 10];
    let net = tanh_mlp(784, &[200, 200], 10, 0)?;
    let inputs =
        |n: usize, phase: f64| DMatrix::from_fn(n, 784, |i, j| ((i * 784 + j) as f64 * 0.618 + phase).sin());
    let x = inputs(100, 0.0);
    let y: Vec<f64> = (0..100).map(|i| (i % 10) as f64).collect();
    let g = net.forward(&x)?;
    let kxx = net.ntk_diagonal(&x)?;
    ms.iter()
        .map(|&m| {
            let mut l = DMatrix::identity(m, m);
            for r in 1..m {
                l[(r, r - 1)] = 0.1;
            }
            let state = VariationalState {
                outputs: (0..m).map(|i| i % 10).collect(),
                z: inputs(m, 0.3),
                log_prior_var: 0.0,
                log_noise_var: -2.0,
                l,
            };
            let lik = LikelihoodSpec::categorical(10);
            let step_ms = median_ms(5, || {
                valla_iteration(&net, &state, lik, &x, &g, &kxx, &y, 10_000)?;
                Ok(())
            })?;
            let madds = valla_madds(&sizes, 100, m);
            let bound_ms = gemm_bound_ms(m, madds, 5)?;
            Ok(BoundPoint { m, step_ms, madds, bound_ms, ratio: step_ms / bound_ms })
        })
        .collect()
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

/// Timed rounds per network. A round is one fspace epoch and then one PyTorch epoch (each side
/// after one untimed warm-up epoch), so both sides see the same state of the machine (why:
/// the record of 2026-11-26 on the KL's inverses and im2col, `git show 838ffc8:docs/performance-history.md`).
const ROUNDS: usize = 3;

/// One network's epochs beside PyTorch's, 5 400 images × 10.
struct EpochComparison {
    /// Median over rounds of fspace's epoch.
    ours_s: f64,
    /// Median over rounds of PyTorch's epoch, with the median of the rounds' ratios.
    torch: Option<(f64, f64)>,
}

/// [`ROUNDS`] alternated rounds of fspace's and (with `python`) PyTorch's epoch of `network`
/// (`lenet` or `fsp` in `scripts/compare/torch_epoch.py`).
fn compare_epochs(
    run: &mut Run,
    python: Option<&str>,
    config: CnnConfig,
    network: &str,
    train: &Images,
) -> Result<EpochComparison> {
    let key = if network == "lenet" { "lenet_epoch_s" } else { "fsp_cnn_epoch_s" };
    let mut net = Cnn::new(config)?;
    // 5 400 images, timed ×10 as a 54 000-image epoch.
    let mut epoch_s = || one_epoch(&mut net, &train.x, &train.y).map(|(s, _)| s * 10.0);
    epoch_s()?; // warm-up
    let (mut ours, mut torch) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        ours.push(epoch_s()?);
        if let Some(py) = python {
            let args = ["--warmup", "1", "--epochs", "1", "--no-per-batch"];
            if let Some(t) =
                torch_epoch_script(run, py, Some(5_400), network, &args).and_then(|v| v[key].as_f64())
            {
                torch.push(t);
            }
        }
    }
    run.log(format!(
        "{network} epochs (5 400 images × 10), fspace / PyTorch by round: {}",
        ours.iter()
            .enumerate()
            .map(|(r, o)| torch.get(r).map_or(format!("{o:.2} s"), |t| format!("{o:.2} / {t:.2} s")))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let torch = if torch.len() == ours.len() {
        let ratios = ours.iter().zip(&torch).map(|(o, t)| o / t).collect();
        Some((median(torch), median(ratios)))
    } else {
        None
    };
    Ok(EpochComparison { ours_s: median(ours), torch })
}

/// The M-sweeps against their GEMM bounds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Sweeps {
    /// GFSVI, 2×30 tanh, M = 100 … 1 000.
    pub gfsvi: Vec<BoundPoint>,
    /// TFSVI, the same network.
    pub tfsvi: Vec<BoundPoint>,
    /// VaLLA on the MNIST MLP, M = 50 … 200.
    pub valla: Vec<BoundPoint>,
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
    /// The step's GEMM-shaped multiply-adds (1.5 M²p + 2M³).
    pub gfsvi_step_madds: f64,
    /// Milliseconds of the GEMM of J S Jᵀ alone.
    pub gfsvi_gram_bound_ms: f64,
    /// `gfsvi_bound_ms`'s GEMM by nalgebra's `matrixmultiply` (the earlier rounds' bound).
    pub gfsvi_bound_nalgebra_ms: f64,
    /// Median milliseconds of one TFSVI step (M = 500, 2×30).
    pub tfsvi_step_ms: f64,
    /// Milliseconds of one GEMM of its GEMM-shaped multiply-adds.
    pub tfsvi_bound_ms: f64,
    /// Median milliseconds of one VaLLA iteration (M = 200, MNIST MLP, batch 100).
    pub valla_iteration_ms: f64,
    /// Milliseconds of one GEMM of its GEMM-shaped multiply-adds.
    pub valla_bound_ms: f64,
    /// Every size measured, per method.
    pub sweeps: Sweeps,
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
    /// `lenet_epoch_s / torch_lenet_epoch_s` (the target: ≤ 0.8).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub lenet_over_torch: Option<f64>,
    /// `fsp_cnn_epoch_s / torch_fsp_cnn_epoch_s` (target ≤ 0.8).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub fsp_cnn_over_torch: Option<f64>,
}

/// Runs the measurements.
pub fn run(opts: &Options) -> Result<()> {
    let mut run = Run::new(&opts.out, "perf")?;
    let sweeps = Sweeps {
        gfsvi: fsvi_sweep(&[100, 200, 500, 1000], false)?,
        tfsvi: fsvi_sweep(&[100, 200, 500], true)?,
        valla: valla_sweep(&[50, 100, 200])?,
    };
    let at =
        |points: &[BoundPoint], m: usize| points.iter().find(|b| b.m == m).cloned().expect("measured size");
    let (gfsvi, tfsvi, valla) = (at(&sweeps.gfsvi, 500), at(&sweeps.tfsvi, 500), at(&sweeps.valla, 200));
    let gram_bound =
        gemm_bound_ms(500, (500 * 500 * tanh_mlp(1, &[30, 30], 1, 0)?.params().len()) as f64, 7)?;
    for (name, points) in [("GFSVI", &sweeps.gfsvi), ("TFSVI", &sweeps.tfsvi), ("VaLLA", &sweeps.valla)] {
        for b in points {
            run.log(format!(
                "{name} M = {}: {:.2} ms; GEMM of its {:.3e} multiply-adds {:.2} ms ({:.1}× the bound)",
                b.m, b.step_ms, b.madds, b.bound_ms, b.ratio
            ));
        }
    }
    run.log(format!("GFSVI M = 500: GEMM of J S Jᵀ alone {gram_bound:.2} ms"));
    let nalgebra_bound = gemm_ms(|a, b| a * b, 500, gfsvi.madds, 7)?;
    run.log(format!(
        "GFSVI M = 500: its GEMM by nalgebra's matrixmultiply (one thread) {nalgebra_bound:.2} ms (faer's: {:.2} ms)",
        gfsvi.bound_ms
    ));

    let (train, _, _, _) = train_val_test(ImageSet::Mnist, 0)?;
    let train = train.subset(5_400, 0);
    let python = torch_python(&mut run);
    let lenet = compare_epochs(
        &mut run,
        python.as_deref(),
        CnnConfig::lenet5(10, Activation::Tanh, 0),
        "lenet",
        &train,
    )?;
    let fsp_cnn = compare_epochs(
        &mut run,
        python.as_deref(),
        CnnConfig::fsp_mnist(10, Activation::Tanh, 0),
        "fsp",
        &train,
    )?;
    let (lenet_s, fsp_cnn_s) = (lenet.ours_s, fsp_cnn.ours_s);
    run.log(format!(
        "epochs (5 400 images × 10, median of {ROUNDS} rounds): LeNet-5 {lenet_s:.2} s, FSP CNN {fsp_cnn_s:.2} s"
    ));

    let toy = fsp_toy_prior()?;
    run.log(format!("FSP-Laplace sine toy, one RBF prior (8 000 steps + Alg. 2): {toy:.2} s"));
    let w1 = w1_full_lla()?;
    run.log(format!("W1 full-GGN Laplace (fit + marginal likelihood + 1 000 predictions): {w1:.2} s"));

    for (name, c) in [("LeNet-5", &lenet), ("FSP CNN", &fsp_cnn)] {
        if let Some((t, ratio)) = c.torch {
            run.log(format!("PyTorch (live, alternated): {name} {t:.2} s; fspace / PyTorch {ratio:.2}"));
        }
    }
    let torch_cell = |c: &EpochComparison| {
        c.torch.map_or("– (no python with torch)".to_string(), |(t, r)| {
            format!("PyTorch {t:.2} s (ours {r:.2}×, median of {ROUNDS} alternated rounds)")
        })
    };
    let bound_row = |name: &str, b: &BoundPoint| {
        vec![
            format!("{name}, M = {}", b.m),
            format!("{:.2} ms", b.step_ms),
            format!("GEMM bound of its {:.2e} multiply-adds {:.2} ms ({:.1}×)", b.madds, b.bound_ms, b.ratio),
        ]
    };
    let mut rows: Vec<Vec<String>> = Vec::new();
    for (name, points) in [
        ("GFSVI step, 2×30", &sweeps.gfsvi),
        ("TFSVI step, 2×30", &sweeps.tfsvi),
        ("VaLLA iteration, MNIST MLP", &sweeps.valla),
    ] {
        rows.extend(points.iter().map(|b| bound_row(name, b)));
    }
    rows.extend([
        vec!["LeNet-5 epoch (5 400 × 10)".into(), format!("{lenet_s:.2} s"), torch_cell(&lenet)],
        vec!["FSP CNN epoch (5 400 × 10)".into(), format!("{fsp_cnn_s:.2} s"), torch_cell(&fsp_cnn)],
        vec!["FSP toy prior (8 000 steps + Alg. 2)".into(), format!("{toy:.2} s"), "–".into()],
        vec!["W1 full LLA".into(), format!("{w1:.2} s"), "–".into()],
    ]);
    run.write_table(&format!(
        "# perf\n\nMeasured in one run on this machine ({} rayon threads). \"–\": no reference for that row.\n\n{}\n",
        rayon::current_num_threads(),
        markdown_table(&["measurement", "fspace", "reference"], &rows)
    ))?;
    run.write_metrics(&Metrics {
        gfsvi_step_ms: gfsvi.step_ms,
        gfsvi_bound_ms: gfsvi.bound_ms,
        gfsvi_step_over_bound: gfsvi.ratio,
        gfsvi_step_madds: gfsvi.madds,
        gfsvi_gram_bound_ms: gram_bound,
        gfsvi_bound_nalgebra_ms: nalgebra_bound,
        tfsvi_step_ms: tfsvi.step_ms,
        tfsvi_bound_ms: tfsvi.bound_ms,
        valla_iteration_ms: valla.step_ms,
        valla_bound_ms: valla.bound_ms,
        lenet_epoch_s: lenet_s,
        fsp_cnn_epoch_s: fsp_cnn_s,
        fsp_toy_prior_s: toy,
        w1_full_lla_s: w1,
        torch_lenet_epoch_s: lenet.torch.map(|t| t.0),
        torch_fsp_cnn_epoch_s: fsp_cnn.torch.map(|t| t.0),
        lenet_over_torch: lenet.torch.map(|t| t.1),
        fsp_cnn_over_torch: fsp_cnn.torch.map(|t| t.1),
        sweeps,
    })?;
    Ok(())
}
