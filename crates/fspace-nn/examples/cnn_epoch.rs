//! Epochs of MAP training (Adam 1e-3, batch 100, categorical; one `train_map` call each) of
//! LeNet-5 or the FSP MNIST CNN on `n` synthetic 28 × 28 images, the `perf` experiment's epoch
//! workload; prints the seconds of each.
//! A target for `perf record`.
//!
//! `cargo run --release -p fspace-nn --example cnn_epoch -- [lenet|fsp] [n] [epochs]`
//!
//! xtask raises glibc's trim and mmap thresholds (`mallopt`); to time this binary under the
//! same allocator, run it with
//! `GLIBC_TUNABLES=glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=2147483647`.

use fspace_core::Categorical;
use fspace_nn::{train_map, Activation, Cnn, CnnConfig, TrainConfig};
use nalgebra::{DMatrix, DVector};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let which = std::env::args().nth(1).unwrap_or_else(|| "lenet".into());
    let n: usize = std::env::args().nth(2).map_or(Ok(5400), |s| s.parse())?;
    let epochs: usize = std::env::args().nth(3).map_or(Ok(1), |s| s.parse())?;
    let config = match which.as_str() {
        "lenet" => CnnConfig::lenet5(10, Activation::Tanh, 0),
        "fsp" => CnnConfig::fsp_mnist(10, Activation::Tanh, 0),
        other => return Err(format!("unknown network {other} (lenet or fsp)").into()),
    };
    let mut net = Cnn::new(config)?;
    let x = DMatrix::from_fn(n, 784, |i, j| (((i * 31 + j * 7) % 255) as f64 / 255.0 - 0.5).max(0.0));
    let y = DVector::from_fn(n, |i, _| (i % 10) as f64);
    let mut lik = Categorical::new(10)?;
    let cfg = TrainConfig {
        schedule: fspace_core::Schedule::epochs(1),
        batch_size: 100,
        learning_rate: 1e-3,
        seed: 0,
        ..Default::default()
    };
    for _ in 0..epochs {
        let t = std::time::Instant::now();
        let report = train_map(&mut net, &mut lik, &x, &y, None, None, &cfg, |_| {})?;
        let s = t.elapsed().as_secs_f64();
        println!(
            "{which}: {n} images in {s:.3} s ({:.2} s per 54 000), loss {:.6}",
            s * 54_000.0 / n as f64,
            report.history[0].train_loss
        );
    }
    Ok(())
}
