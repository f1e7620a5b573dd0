//! `nn-epoch-timer` — issue 15's speed table: one epoch of MAP training (`train_map`, Adam
//! 1e-3, batch 100, f64, categorical likelihood) over the 54 000 MNIST training images of the
//! seed-0 90/10 split, for the three networks of the issue (MLP 784-200-200-10 tanh, LeNet-5
//! tanh, FSP-Laplace's MNIST CNN tanh), and the per-batch cost of `f`, `J·u` and `Jᵀ·V` on 100
//! images (median of repeated calls), beside PyTorch 2 on the same two cores: run live by
//! `scripts/compare/torch_epoch.py` (one epoch, same image count) when a python with torch
//! imports (`$FSPACE_PYTHON`, else `python3`), otherwise the recorded [`TORCH_REFERENCE`],
//! labelled as recorded with its date. `--quick` trains on 5 400 images and scales the time by
//! 10.

use std::time::Instant;

use anyhow::Result;
use fspace_core::Categorical;
use fspace_nn::{train_map, Activation, Cnn, CnnConfig, Mlp, MlpConfig, Network, TrainConfig};
use nalgebra::{DMatrix, DVector};
use serde_json::{json, Map, Value};

use super::images::{train_val_test, ImageSet};
use super::Options;
use crate::report::{fmt, markdown_table, Run};

/// PyTorch 2.15 (wheel from PyPI, run on the CPU, f64, `torch.set_num_threads(2)`) on the same 2-core
/// machine, seconds per epoch of 54 000 images, measured with `scripts/compare/torch_epoch.py`
/// (median of 3 epochs) on 2026-11-23. Used only when PyTorch cannot run live.
pub const TORCH_REFERENCE: [(&str, f64); 3] =
    [("MLP 784-200-200-10", 1.44), ("LeNet-5", 7.09), ("FSP MNIST CNN", 22.32)];

/// Median milliseconds of `reps` calls of `f` (after one warm-up call).
pub(super) fn median_ms(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut v = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        f()?;
        v.push(t.elapsed().as_secs_f64() * 1e3);
    }
    v.sort_by(|a, b| a.total_cmp(b));
    Ok(v[v.len() / 2])
}

/// One network's epoch and per-batch operator times.
pub(super) struct Timing {
    /// Seconds per epoch (scaled).
    pub(super) epoch_s: f64,
    forward_ms: f64,
    jvp_ms: f64,
    vjp_ms: f64,
    final_loss: f64,
}

/// Times `f`, `J·u`, `Jᵀ·V` on 100 images and one epoch of MAP training on `x` (× `scale`).
pub(super) fn time_network<N: Network>(
    net: &mut N,
    x: &DMatrix<f64>,
    y: &DVector<f64>,
    scale: f64,
) -> Result<Timing> {
    let batch = x.rows(0, 100).into_owned();
    let u = DVector::from_fn(net.n_params(), |i, _| ((i % 13) as f64 - 6.0) * 1e-2);
    let v = DMatrix::from_fn(100, 10, |i, j| ((i + 3 * j) % 7) as f64 * 0.1 - 0.3);
    let reps = 15;
    let forward_ms = median_ms(reps, || {
        net.forward(&batch)?;
        Ok(())
    })?;
    let jvp_ms = median_ms(reps, || {
        net.jvp(&batch, &u)?;
        Ok(())
    })?;
    let vjp_ms = median_ms(reps, || {
        net.vjp(&batch, &v)?;
        Ok(())
    })?;
    let mut lik = Categorical::new(10)?;
    let cfg = TrainConfig { epochs: 1, batch_size: 100, learning_rate: 1e-3, seed: 0, ..Default::default() };
    let t = Instant::now();
    let rep = train_map(net, &mut lik, x, y, None, None, &cfg, |_| {})?;
    let epoch_s = t.elapsed().as_secs_f64() * scale;
    Ok(Timing { epoch_s, forward_ms, jvp_ms, vjp_ms, final_loss: rep.history[0].train_loss })
}

/// Runs the timer.
pub fn run(opts: &Options) -> Result<()> {
    let mut run = Run::new(&opts.out, "nn-epoch-timer")?;
    let (train, _, _, _) = train_val_test(ImageSet::Mnist, 0)?;
    let (train, scale) = if opts.quick { (train.subset(5_400, 0), 10.0) } else { (train, 1.0) };
    run.log(format!(
        "{} MNIST training images, batch 100, Adam 1e-3, f64, {} rayon threads{}",
        train.x.nrows(),
        rayon::current_num_threads(),
        if opts.quick { " (--quick: epoch time ×10)" } else { "" }
    ));
    let live = super::perf::torch_epochs_live(&mut run, opts.quick.then_some(5_400), "mlp,lenet,fsp");
    let keys = ["mlp_epoch_s", "lenet_epoch_s", "fsp_cnn_epoch_s"];
    let torch_label = if live.is_some() {
        "PyTorch 2 CPU, run live in this run".to_string()
    } else {
        "PyTorch 2 CPU, recorded 2026-11-23 (no python with torch here)".to_string()
    };
    let mut rows = Vec::new();
    let mut metrics = Map::new();
    // `FSPACE_TIMER_ONLY=<prefix>` times only the networks whose name starts with it (profiling).
    let only = std::env::var("FSPACE_TIMER_ONLY").unwrap_or_default();
    for (k, (name, recorded)) in
        TORCH_REFERENCE.into_iter().enumerate().filter(|(_, (n, _))| n.starts_with(only.as_str()))
    {
        let torch_s = live.as_ref().and_then(|v| v[keys[k]].as_f64()).unwrap_or(recorded);
        let timing = match name {
            "MLP 784-200-200-10" => time_network(
                &mut Mlp::new(MlpConfig {
                    input_dim: 784,
                    hidden: vec![200, 200],
                    output_dim: 10,
                    activation: Activation::Tanh,
                    seed: 0,
                })?,
                &train.x,
                &train.y,
                scale,
            )?,
            "LeNet-5" => time_network(
                &mut Cnn::new(CnnConfig::lenet5(10, Activation::Tanh, 0))?,
                &train.x,
                &train.y,
                scale,
            )?,
            _ => time_network(
                &mut Cnn::new(CnnConfig::fsp_mnist(10, Activation::Tanh, 0))?,
                &train.x,
                &train.y,
                scale,
            )?,
        };
        run.log(format!(
            "{name}: epoch {:.2} s (PyTorch {:.2} s); per batch of 100: f {:.2} ms, J·u {:.2} ms, Jᵀ·V {:.2} ms; mean loss {:.4}",
            timing.epoch_s, torch_s, timing.forward_ms, timing.jvp_ms, timing.vjp_ms, timing.final_loss
        ));
        rows.push(vec![
            name.to_string(),
            format!("{:.2}", timing.epoch_s),
            format!("{torch_s:.2}"),
            format!("{:.2}×", timing.epoch_s / torch_s),
            format!("{:.2}", timing.forward_ms),
            format!("{:.2} ({:.1}×)", timing.jvp_ms, timing.jvp_ms / timing.forward_ms),
            format!("{:.2} ({:.1}×)", timing.vjp_ms, timing.vjp_ms / timing.forward_ms),
            fmt(timing.final_loss),
        ]);
        metrics.insert(
            name.to_string(),
            json!({
                "epoch_s": timing.epoch_s, "torch_epoch_s": torch_s, "forward_ms": timing.forward_ms,
                "jvp_ms": timing.jvp_ms, "vjp_ms": timing.vjp_ms, "mean_train_loss": timing.final_loss,
            }),
        );
    }
    let table = markdown_table(
        &[
            "network",
            "epoch s (fspace)",
            "epoch s (PyTorch)",
            "fspace / PyTorch",
            "f per batch ms",
            "J·u ms (× f)",
            "Jᵀ·V ms (× f)",
            "mean train loss",
        ],
        &rows,
    );
    run.write_table(&format!(
        "# Network speed (issue 15)\n\nOne epoch of `train_map` over {} MNIST images{} (batch 100, Adam, f64) on {} threads; \
         {torch_label} (`scripts/compare/torch_epoch.py`, the same number of images). Per-batch operator times \
         are medians over 15 calls on 100 images.\n\n{table}\n\nWall time {:.0} s.\n",
        train.x.nrows(),
        if opts.quick { " (×10: --quick)" } else { "" },
        rayon::current_num_threads(),
        run.elapsed_seconds()
    ))?;
    run.write_metrics(&Value::Object(metrics))?;
    Ok(())
}
