//! `nn-epoch-timer` — the network-speed table: one epoch of MAP training (`train_map`, Adam
//! 1e-3, batch 100, f64, categorical likelihood) over the 54 000 MNIST training images of the
//! seed-0 90/10 split, for the three networks (MLP 784-200-200-10 tanh, LeNet-5
//! tanh, FSP-Laplace's MNIST CNN tanh), and the per-batch cost of `f`, `J·u` and `Jᵀ·V` on 100
//! images (median of repeated calls), beside PyTorch 2 on the same two cores: run live by
//! `scripts/compare/torch_epoch.py` (one epoch, same image count) when a python with torch
//! imports (`$FSPACE_PYTHON`, else `python3`), otherwise the recorded [`TORCH_REFERENCE`],
//! labelled as recorded with its date. `--quick` trains on 5 400 images and scales the time by
//! 10.

use anyhow::Result;
use fspace_nn::{Activation, Cnn, CnnConfig, Mlp, MlpConfig};
use serde::{Deserialize, Serialize};

use crate::harness::registry::Options;
use crate::harness::report::{fmt, markdown_table, Run};
use crate::protocols::images::{train_val_test, ImageSet};
use crate::protocols::timing::{time_network, TORCH_REFERENCE};
/// One network's timings.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NetworkTiming {
    /// Seconds of one epoch of `train_map`.
    pub epoch_s: f64,
    /// PyTorch's (live or recorded).
    pub torch_epoch_s: f64,
    /// Median milliseconds of f on a batch of 100.
    pub forward_ms: f64,
    /// Of J·u.
    pub jvp_ms: f64,
    /// Of Jᵀ·V.
    pub vjp_ms: f64,
    /// Mean training loss of the epoch.
    pub mean_train_loss: f64,
}

/// `metrics.json`: per network.
pub type Metrics = std::collections::BTreeMap<String, NetworkTiming>;

/// `nn-epoch-timer`: runs the experiment and writes its folder.
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
    let live =
        crate::protocols::timing::torch_epochs_live(&mut run, opts.quick.then_some(5_400), "mlp,lenet,fsp");
    let keys = ["mlp_epoch_s", "lenet_epoch_s", "fsp_cnn_epoch_s"];
    let torch_label = if live.is_some() {
        "PyTorch 2 CPU, run live in this run".to_string()
    } else {
        "PyTorch 2 CPU, recorded 2026-11-23 (no python with torch here)".to_string()
    };
    let mut rows = Vec::new();
    let mut metrics = Metrics::new();
    // `FSPACE_TIMER_ONLY=<prefix>` times only the networks whose name starts with it (profiling).
    let only = std::env::var("FSPACE_TIMER_ONLY").unwrap_or_default();
    for (k, (name, recorded)) in
        TORCH_REFERENCE.into_iter().enumerate().filter(|(_, (n, _))| n.starts_with(only.as_str()))
    {
        let torch_s = live.as_ref().and_then(|v| v[keys[k]].as_f64()).unwrap_or(recorded);
        let timing = match name {
            "MLP 784-200-200-10" => time_network(
                &mut Mlp::new(MlpConfig::mnist(10, Activation::Tanh, 0))?,
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
            NetworkTiming {
                epoch_s: timing.epoch_s,
                torch_epoch_s: torch_s,
                forward_ms: timing.forward_ms,
                jvp_ms: timing.jvp_ms,
                vjp_ms: timing.vjp_ms,
                mean_train_loss: timing.final_loss,
            },
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
        "# Network speed\n\nOne epoch of `train_map` over {} MNIST images{} (batch 100, Adam, f64) on {} threads; \
         {torch_label} (`scripts/compare/torch_epoch.py`, the same number of images). Per-batch operator times \
         are medians over 15 calls on 100 images.\n\n{table}\n\nWall time {:.0} s.\n",
        train.x.nrows(),
        if opts.quick { " (×10: --quick)" } else { "" },
        rayon::current_num_threads(),
        run.elapsed_seconds()
    ))?;
    run.write_metrics(&metrics)?;
    Ok(())
}
