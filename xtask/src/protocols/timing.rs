//! Timing: the median of repeated calls, one network's epoch and operator times, and PyTorch's
//! epoch run live through `scripts/compare/torch_epoch.py`.

use std::process::Command;
use std::time::Instant;

use anyhow::Result;
use fspace_core::Categorical;
use fspace_core::Schedule;
use fspace_nn::{train_map, Network, TrainConfig};
use nalgebra::{DMatrix, DVector};
use serde_json::Value;

use crate::harness::report::Run;

/// PyTorch 2.15 (wheel from PyPI, run on the CPU, f64, `torch.set_num_threads(2)`) on the same 2-core
/// machine, seconds per epoch of 54 000 images, measured with `scripts/compare/torch_epoch.py`
/// (median of 3 epochs) on 2026-11-23. Used only when PyTorch cannot run live.
pub const TORCH_REFERENCE: [(&str, f64); 3] =
    [("MLP 784-200-200-10", 1.44), ("LeNet-5", 7.09), ("FSP MNIST CNN", 22.32)];

/// Median milliseconds of `reps` calls of `f` (after one warm-up call).
pub fn median_ms(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut v = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        f()?;
        v.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(median(v))
}

/// The middle value (upper middle for an even count) of a non-empty list.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// One network's epoch and per-batch operator times.
pub struct Timing {
    /// Seconds per epoch (scaled).
    pub epoch_s: f64,
    /// Milliseconds of one forward pass on 100 images.
    pub forward_ms: f64,
    /// Milliseconds of one J·u on 100 images.
    pub jvp_ms: f64,
    /// Milliseconds of one Jᵀ·V on 100 images.
    pub vjp_ms: f64,
    /// Mean training loss of the timed epoch.
    pub final_loss: f64,
}

/// Times `f`, `J·u`, `Jᵀ·V` on 100 images and one epoch of MAP training on `x` (× `scale`).
pub fn time_network<N: Network>(
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
    let (seconds, final_loss) = one_epoch(net, x, y)?;
    Ok(Timing { epoch_s: seconds * scale, forward_ms, jvp_ms, vjp_ms, final_loss })
}

/// Seconds and training loss of one MAP epoch (Adam 1e-3, batch 100, categorical, seed 0; one
/// `train_map` call) of `net` on `(x, y)`.
pub fn one_epoch<N: Network>(net: &mut N, x: &DMatrix<f64>, y: &DVector<f64>) -> Result<(f64, f64)> {
    let mut lik = Categorical::new(10)?;
    let cfg = TrainConfig {
        schedule: Schedule::epochs(1),
        batch_size: 100,
        learning_rate: 1e-3,
        seed: 0,
        ..Default::default()
    };
    let t = Instant::now();
    let rep = train_map(net, &mut lik, x, y, None, None, &cfg, |_| {})?;
    Ok((t.elapsed().as_secs_f64(), rep.history[0].train_loss))
}

/// The python (`$FSPACE_PYTHON`, else `python3`) if it imports torch; `None` (with the reason
/// in the log) otherwise.
pub fn torch_python(run: &mut Run) -> Option<String> {
    let python = std::env::var("FSPACE_PYTHON").unwrap_or_else(|_| "python3".into());
    let importable = Command::new(&python)
        .args(["-c", "import torch"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !importable {
        run.log(format!("PyTorch: `{python} -c 'import torch'` failed; no live PyTorch numbers"));
        return None;
    }
    Some(python)
}

/// Seconds per 54 000-image epoch that PyTorch reports for the networks `only`
/// (`mlp,lenet,fsp`), trained on `images` images (`None`: all) and scaled to 54 000, run live by
/// `scripts/compare/torch_epoch.py` with `$FSPACE_PYTHON` (else `python3`); `None` (with the
/// reason in the log) when no python with torch imports or the script does not report.
pub fn torch_epochs_live(run: &mut Run, images: Option<usize>, only: &str) -> Option<Value> {
    let python = torch_python(run)?;
    torch_epoch_script(run, &python, images, only, &["--epochs", "1"])
}

/// One run of `scripts/compare/torch_epoch.py` for the networks `only` with `extra` arguments;
/// its JSON line, or `None` (logged) if it does not report.
pub fn torch_epoch_script(
    run: &mut Run,
    python: &str,
    images: Option<usize>,
    only: &str,
    extra: &[&str],
) -> Option<Value> {
    let dir = fspace_data::dataset_dir().join("mnist");
    let mut cmd = Command::new(python);
    cmd.arg("scripts/compare/torch_epoch.py").arg(&dir).args(["--json", "--only", only]).args(extra);
    if let Some(n) = images {
        cmd.args(["--images", &n.to_string()]);
    }
    let parsed = cmd.output().ok().filter(|o| o.status.success()).and_then(|o| {
        let text = String::from_utf8_lossy(&o.stdout).to_string();
        let line = text.lines().rev().find(|l| l.trim_start().starts_with('{'))?.to_string();
        serde_json::from_str::<Value>(&line).ok()
    });
    if parsed.is_none() {
        run.log("PyTorch: scripts/compare/torch_epoch.py did not report; no live PyTorch numbers");
    }
    parsed
}
