//! Uncertainty for a network trained in PyTorch: the VaLLA paper's MNIST MLP (784-200-200-10,
//! tanh) trained by `scripts/interop/train_in_pytorch.py`, loaded from its safetensors file,
//! then a KFAC Laplace approximation (λ by the Laplace marginal likelihood) and VaLLA fitted
//! around it. Reports accuracy, NLL, ECE and OOD ROC-AUC against Fashion-MNIST (predictive
//! entropy as the score), and writes every method's test-set class probabilities to
//! `DIR/mnist_predictions.npz` and the Laplace posterior over the logits of 100 test images
//! (mean, variance, joint samples) to `DIR/lla_kfac_posterior.npz`, for Python
//! (`scripts/interop/read_predictions.py`).
//!
//! ```text
//! python scripts/interop/train_in_pytorch.py            # writes target/interop/
//! cargo run --release --example from_pytorch -- [DIR] [--valla-iterations N] [--test N]
//! ```

use std::path::PathBuf;
use std::time::Instant;

use fspace::core::{Data, LikelihoodSpec, Link, Posterior};
use fspace::data::{fashion_mnist, mnist, Dataset, Split};
use fspace::interop::{infer_mlp, write_posterior_npz, LayerNames, NpzWriter, PosteriorExport, Tensors};
use fspace::laplace::{fit as laplace_fit, LaplaceConfig, MarglikConfig, PriorPrecision, Structure};
use fspace::metrics::{accuracy, categorical_nll, ece, predictive_entropy, roc_auc};
use fspace::nn::{Activation, Mlp};
use fspace::valla::{fit as valla_fit, VallaConfig};
use nalgebra::{DMatrix, DVector};
use rand::rngs::StdRng;
use rand::SeedableRng;

type Error = Box<dyn std::error::Error>;

struct Args {
    dir: PathBuf,
    valla_iterations: usize,
    n_test: usize,
}

fn args() -> Result<Args, Error> {
    let mut out = Args { dir: PathBuf::from("target/interop"), valla_iterations: 2_000, n_test: 10_000 };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--valla-iterations" => {
                out.valla_iterations = it.next().ok_or("--valla-iterations N")?.parse()?
            }
            "--test" => out.n_test = it.next().ok_or("--test N")?.parse()?,
            s if !s.starts_with("--") => out.dir = PathBuf::from(s),
            s => return Err(format!("unknown flag {s}").into()),
        }
    }
    Ok(out)
}

fn scalar(t: &Tensors, name: &str) -> Result<f64, Error> {
    Ok(t.get(name).ok_or_else(|| format!("{name} missing from {}", t.source()))?.data[0])
}

fn softmax_rows(f: &DMatrix<f64>) -> DMatrix<f64> {
    let mut p = f.clone();
    for mut row in p.row_iter_mut() {
        let m = row.max();
        row.apply(|v| *v = (*v - m).exp());
        let s = row.sum();
        row /= s;
    }
    p
}

/// `[accuracy %, NLL, ECE, OOD-AUC]` of test and OOD class probabilities.
fn metrics(p_test: &DMatrix<f64>, y: &[f64], p_ood: &DMatrix<f64>) -> Result<[f64; 4], Error> {
    let auc = roc_auc(&predictive_entropy(p_test)?, &predictive_entropy(p_ood)?)?;
    Ok([100.0 * accuracy(p_test, y)?, categorical_nll(p_test, y)?, ece(p_test, y, 15)?, auc])
}

fn main() -> Result<(), Error> {
    let args = args()?;
    let weights = Tensors::read(args.dir.join("mnist_mlp.safetensors"))?;
    let meta = Tensors::read(args.dir.join("mnist_mlp_meta.npz"))?;
    let net: Mlp = infer_mlp(&weights, Activation::Tanh, &LayerNames::Natural)?;
    println!("loaded {} ({} parameters, {:?})", weights.source(), net.n_params(), net.config().hidden);

    // The same standardisation and validation rows as the PyTorch run.
    let (mean, sd) = (scalar(&meta, "pixel_mean")?, scalar(&meta, "pixel_sd")?);
    let norm = |d: Dataset| (d.x.map(|v| (v - mean) / sd), d.y_vec());
    let (x_all, y_all) = norm(mnist(Split::Train)?);
    let mut is_val = vec![false; x_all.nrows()];
    for &i in &meta.get("val_index").ok_or("val_index missing")?.data {
        is_val[i as usize] = true;
    }
    let rows = |val: bool| (0..x_all.nrows()).filter(|&i| is_val[i] == val).collect::<Vec<_>>();
    let (train_rows, val_rows) = (rows(false), rows(true));
    let labels = |idx: &[usize]| DMatrix::from_fn(idx.len(), 1, |i, _| y_all[idx[i]]);
    let (x, y) = (x_all.select_rows(&train_rows), labels(&train_rows));
    let (xv, yv) = (x_all.select_rows(&val_rows), labels(&val_rows));
    let (x_test, y_test) = norm(mnist(Split::Test)?);
    let (x_ood, _) = norm(fashion_mnist(Split::Test)?);
    let n_test = args.n_test.min(x_test.nrows());
    let (x_test, y_test) =
        (x_test.rows(0, n_test).into_owned(), DVector::from(y_test.as_slice()[..n_test].to_vec()));
    let x_ood = x_ood.rows(0, n_test).into_owned();

    // fspace's forward pass against the logits PyTorch computed (f32 weights, f32 arithmetic).
    let torch_logits = meta.get("test_logits").ok_or("test_logits missing")?;
    let torch_logits =
        DMatrix::from_row_slice(torch_logits.shape[0], torch_logits.shape[1], &torch_logits.data);
    let logits = net.forward(&x_test)?;
    let gap = (logits - torch_logits.rows(0, n_test)).abs().max();
    println!("max |logit(fspace) − logit(PyTorch)| on {n_test} test images: {gap:.2e}");

    let likelihood = LikelihoodSpec::Categorical { classes: 10 };
    let data = Data::new(&x, &y)?.with_validation(&xv, &yv)?;
    let ys = y_test.as_slice();
    let mut rows_out: Vec<(&str, [f64; 4], f64)> = Vec::new();
    let mut npz = NpzWriter::new();
    npz.vector("y_test", &y_test)?;

    let p_map = softmax_rows(&net.forward(&x_test)?);
    rows_out.push(("MAP (PyTorch)", metrics(&p_map, ys, &softmax_rows(&net.forward(&x_ood)?))?, 0.0));
    npz.matrix("probs.map", &p_map)?;

    // KFAC Laplace, λ by the marginal likelihood (from PyTorch's weight decay 1e-3 · N).
    let start = Instant::now();
    let lambda0 = 1e-3 * x.nrows() as f64;
    let cfg = LaplaceConfig {
        structure: Structure::Kfac,
        prior_precision: PriorPrecision::Scalar(lambda0),
        ..LaplaceConfig::default()
    };
    let mut lla = laplace_fit(net.clone(), likelihood, &Data::new(&x, &y)?, &cfg)?.posterior;
    let log_marglik = lla.optimize_prior_precision(&MarglikConfig::default())?;
    let lambda = lla.prior_precision()[0];
    let secs = start.elapsed().as_secs_f64();
    let mut rng = StdRng::seed_from_u64(0);
    let p = lla.class_probabilities(&x_test, &Link::Probit)?;
    let p_ood = lla.class_probabilities(&x_ood, &Link::Probit)?;
    rows_out.push(("LLA KFAC", metrics(&p, ys, &p_ood)?, secs));
    npz.matrix("probs.lla_kfac", &p)?.scalar("summary.lla_kfac.prior_precision", lambda)?;
    npz.scalar("summary.lla_kfac.log_marginal_likelihood", log_marglik)?;
    println!("LLA KFAC: λ = {lambda:.3} by marginal likelihood (log p(D|λ) = {log_marglik:.1}; {secs:.1} s)");
    // The posterior over logits itself on 100 test images: mean, variance, 10 joint samples.
    let x_small = x_test.rows(0, 100.min(n_test)).into_owned();
    let summary =
        [("prior_precision", lambda), ("log_marginal_likelihood", log_marglik), ("fit_seconds", secs)];
    let export = PosteriorExport { method: "LLA KFAC", x: &x_small, samples: 10, summary: &summary };
    write_posterior_npz(args.dir.join("lla_kfac_posterior.npz"), &lla, &export, &mut rng)?;

    // VaLLA with 100 inducing points, σ₀² at the MAP's prior variance 1/λ₀.
    let start = Instant::now();
    let cfg = VallaConfig {
        num_inducing: 100,
        schedule: fspace_core::Schedule {
            length: fspace_core::Span::Steps(args.valla_iterations),
            ..VallaConfig::default().schedule
        },
        prior_variance: 1.0 / lambda0,
        ..VallaConfig::default()
    };
    let valla = valla_fit(net, likelihood, &data, &cfg)?.posterior;
    let secs = start.elapsed().as_secs_f64();
    let p = valla.class_probabilities(&x_test, &Link::Probit)?;
    let p_ood = valla.class_probabilities(&x_ood, &Link::Probit)?;
    rows_out.push(("VaLLA 100", metrics(&p, ys, &p_ood)?, secs));
    let rep = valla.report();
    npz.matrix("probs.valla_100", &p)?.scalar("summary.valla_100.iterations", rep.iterations as f64)?;
    println!("VaLLA 100: {} iterations (best {}), {secs:.1} s", rep.iterations, rep.best_iteration);

    println!("\n| method | ACC % | NLL | ECE | OOD-AUC (FMNIST) | fit s |\n|---|---|---|---|---|---|");
    for (name, m, s) in &rows_out {
        println!("| {name} | {:.2} | {:.4} | {:.4} | {:.4} | {s:.1} |", m[0], m[1], m[2], m[3]);
    }
    let out = args.dir.join("mnist_predictions.npz");
    npz.write(&out)?;
    println!("\nwrote {}", out.display());
    Ok(())
}
