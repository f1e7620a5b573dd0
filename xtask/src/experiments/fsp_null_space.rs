//! `fsp-null-space` — FSP-Laplace Table C.2: `‖P₀ΛP₀ᵀ‖_F / ‖Λ‖_F`, the part of the Laplace
//! precision that Alg. 2 drops by working in `range(M)`, for RBF and Matérn-1/2 priors on the
//! sine toy and two moons.
//!
//! `Λ = J_Cᵀ Σ(C,C)† J_C + Σᵢ J(xᵢ)ᵀ Hᵢ J(xᵢ) = WᵀW` with `W = [F ᵀJ_C; H^{1/2} J_X]`
//! (`F Fᵀ = Σ(C,C)†`, dense pseudo-inverse with relative cut-off 1e-10, Lanczos' default). The
//! Frobenius norms use `‖WᵀW‖_F = ‖WWᵀ‖_F` and `P₀ΛP₀ = (WP₀)ᵀ(WP₀)`, so only `W` (rows ×
//! p) is formed, never the `p × p` matrix — exact, and small for these nets. `P₀ = I − UUᵀ` with
//! `U` the basis Alg. 2 used.

use anyhow::Result;
use fspace_context::BoundingBox;
use fspace_core::Data;
use fspace_core::Fitted;
use fspace_core::Schedule;
use fspace_core::{Categorical, Gaussian, Likelihood, LikelihoodSpec};
use fspace_fsp_laplace::{fit, FspConfig, FspLaplace};
use fspace_kernels::GpPrior;
use fspace_kernels::{Kernel, Matern12, Rbf};
use fspace_linalg::{psd_pinv_sqrt, sym_eigh};
use fspace_nn::Mlp;
use nalgebra::{DMatrix, DVector};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use crate::harness::registry::Options;
use crate::harness::report::{markdown_table, Run};
use crate::protocols::moons::{fitted_priors, moons, BOX};
use crate::protocols::sine::{fit_sine_prior, sine_config};
use crate::protocols::tanh_mlp;

/// `‖P₀ΛP₀‖_F / ‖Λ‖_F` at the posterior's network and basis.
fn null_space_ratio(
    post: &FspLaplace<Mlp>,
    likelihood: &dyn Likelihood,
    prior: &GpPrior,
    x: &DMatrix<f64>,
    y: &DVector<f64>,
    context: &DMatrix<f64>,
) -> Result<f64> {
    let net = post.network();
    let q = net.output_dim();
    let f = psd_pinv_sqrt(&prior.gram(context)?, 1e-10)?;
    let top = f.transpose() * net.jacobian(context)?;
    let jx = net.jacobian(x)?;
    let hess = likelihood.nll_hessian(&net.forward(x)?, y)?;
    let mut bottom = DMatrix::zeros(jx.nrows(), jx.ncols());
    for (i, h) in hess.iter().enumerate() {
        let (vals, vecs) = sym_eigh(h)?;
        let root = &vecs * DMatrix::from_diagonal(&vals.map(|v| v.max(0.0).sqrt())) * vecs.transpose();
        bottom.rows_mut(i * q, q).copy_from(&(root * jx.rows(i * q, q)));
    }
    let mut w = DMatrix::zeros(top.nrows() + bottom.nrows(), jx.ncols());
    w.rows_mut(0, top.nrows()).copy_from(&top);
    w.rows_mut(top.nrows(), bottom.nrows()).copy_from(&bottom);
    let u = post.range_basis();
    let wp0 = &w - (&w * u) * u.transpose();
    Ok((&wp0 * wp0.transpose()).norm() / (&w * w.transpose()).norm())
}

/// One kernel's ratios, ours beside the paper's.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KernelRatios {
    /// ‖P₀ΛP₀ᵀ‖_F / ‖Λ‖_F on the sine regression.
    pub regression: f64,
    /// The same on two moons.
    pub classification: f64,
    /// Table C.2's regression value.
    pub paper_regression: f64,
    /// Table C.2's classification value.
    pub paper_classification: f64,
}

/// `metrics.json`: per kernel (`rbf`, `matern12`).
pub type Metrics = std::collections::BTreeMap<String, KernelRatios>;

/// `fsp-null-space`: runs the experiment and writes its folder.
pub fn run(opts: &Options) -> Result<()> {
    let mut run = Run::new(&opts.out, "fsp-null-space")?;
    let (reg_epochs, cls_epochs) = if opts.quick { (800, 300) } else { (4000, 1000) };
    let paper = [("rbf", 1.026e-7, 3.548e-4), ("matern12", 4.305e-6, 1.299e-2)];
    let bar = run.progress(4, "runs");
    let mut metrics = Metrics::new();
    let mut ours = std::collections::HashMap::new();

    let data = fspace_data::sine(100, 0.1, &mut StdRng::seed_from_u64(opts.seed))?;
    let y = data.y_vec();
    for (name, k) in [("rbf", Rbf::new(1.0, 0.3)?.boxed()), ("matern12", Matern12::new(1.0, 0.3)?.boxed())] {
        bar.set_message(format!("regression {name}"));
        let (kernel, noise) = fit_sine_prior(&k, &data, opts.seed)?;
        let prior = GpPrior::centered(kernel);
        let lik = Gaussian::new(noise.sqrt())?;
        let config = sine_config(100, reg_epochs, 100, fspace_fsp_laplace::ContextDesign::Grid, opts.seed)?;
        let Fitted { posterior: post, report: _ } = fit(
            tanh_mlp(1, &[50, 50], 1, opts.seed)?,
            LikelihoodSpec::gaussian(noise.sqrt()),
            &prior,
            &Data::new(&data.x, &crate::protocols::targets(&y, 1))?,
            &config,
        )?;
        let context = crate::protocols::linspace(-2.0, 2.0, 100);
        let ratio = null_space_ratio(&post, &lik, &prior, &data.x, &y, &context)?;
        run.log(format!(
            "regression {name}: ‖P₀ΛP₀‖/‖Λ‖ = {ratio:.3e} (range rank {})",
            post.report().range_rank
        ));
        ours.insert(("regression", name), ratio);
        bar.inc(1);
    }

    let (x, labels, _, _) = moons(opts.seed)?;
    for (name, prior, _) in fitted_priors(&x, &labels, opts.seed)? {
        bar.set_message(format!("two moons {name}"));
        let config = FspConfig {
            schedule: Schedule::epochs(cls_epochs),
            batch_size: x.nrows(),
            learning_rate: 1e-3,
            seed: opts.seed,
            context_box: Some(BoundingBox::cube(2, -BOX, BOX)?),
            ..Default::default()
        };
        let lik = Categorical::new(2)?;
        let Fitted { posterior: post, report: _ } = fit(
            tanh_mlp(2, &[100, 100], 2, opts.seed)?,
            LikelihoodSpec::categorical(2),
            &prior,
            &Data::new(&x, &crate::protocols::targets(&labels, 1))?,
            &config,
        )?;
        let context = fspace_fsp_laplace::context_points(
            fspace_fsp_laplace::ContextDesign::Grid,
            &BoundingBox::cube(2, -BOX, BOX)?,
            100,
            0,
        )?;
        let ratio = null_space_ratio(&post, &lik, &prior, &x, &labels, &context)?;
        run.log(format!(
            "two moons {name}: ‖P₀ΛP₀‖/‖Λ‖ = {ratio:.3e} (range rank {})",
            post.report().range_rank
        ));
        ours.insert(("classification", name), ratio);
        bar.inc(1);
    }
    bar.finish_and_clear();
    let mut rows = Vec::new();
    for (name, paper_reg, paper_cls) in paper {
        let (r, c) = (ours[&("regression", name)], ours[&("classification", name)]);
        metrics.insert(
            name.into(),
            KernelRatios {
                regression: r,
                classification: c,
                paper_regression: paper_reg,
                paper_classification: paper_cls,
            },
        );
        rows.push(vec![
            name.into(),
            format!("{r:.3e}"),
            format!("{paper_reg:.3e}"),
            format!("{c:.3e}"),
            format!("{paper_cls:.3e}"),
        ]);
    }
    run.write_metrics(&metrics)?;
    run.write_table(&format!(
        "# fsp-null-space\n\n‖P₀ΛP₀ᵀ‖_F / ‖Λ‖_F (paper: Table C.2), seed {}; sine toy ({reg_epochs} epochs) and two moons ({cls_epochs} epochs), 100 grid context points.\n\n{}\n",
        opts.seed,
        markdown_table(&["kernel", "regression (ours)", "regression (paper)", "classification (ours)", "classification (paper)"], &rows)
    ))?;
    Ok(())
}
