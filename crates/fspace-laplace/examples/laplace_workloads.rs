//! Time and peak memory of each curvature structure on the benchmark workloads, one child
//! process per case so that each peak resident set (VmHWM, Linux) is its own.
//!
//! * W1 (sine toy, 2×50, p = 2 701): full GGN fit + λ by marginal likelihood + GLM predictive
//!   at 1 000 points.
//! * W2 (10 000 points, 2×200, p = 40 801): KFAC fit and predictive; low-rank `k` fit with
//!   `max|UᵀU − I|`; diagonal fit; KFAC and low-rank against `n` and `k` (memory sweep).
//!
//! `cargo run --release -p fspace-laplace --example laplace_workloads`

use fspace_core::Data;
use std::process::Command;
use std::time::Instant;

use fspace_laplace::{fit, Curvature, LaplaceConfig, LowRankConfig, MarglikConfig, Structure};
use nalgebra::DMatrix;

#[path = "../benches/support/workloads.rs"]
#[allow(dead_code)] // w1/w2 are the bench's shorthands
mod workloads;

use fspace_testutil::proc_status_kib as status_kib;

fn child(case: &str, n: usize, width: usize, k: usize) {
    let w = workloads::workload(n, width);
    let p = w.net.n_params();
    let base = status_kib("VmRSS:");
    let structure = match case {
        "full" => Structure::full(),
        "kfac" => Structure::Kfac,
        "ekfac" => Structure::Ekfac,
        "diag" => Structure::Diag,
        "lowrank" => Structure::low_rank(k),
        // The same without the layer-statistics cache: one JVP + VJP per GGN product.
        "lowrank_streamed" => {
            Structure::LowRank(LowRankConfig { rank: k, statistics_cache_bytes: 0, ..Default::default() })
        }
        other => panic!("unknown case {other}"),
    };
    let cfg = LaplaceConfig { structure, ..Default::default() };
    let t = Instant::now();
    let mut post = fit(w.net, w.likelihood, &Data::new(&w.x, &w.y).unwrap(), &cfg).unwrap().posterior;
    let fit_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    post.optimize_prior_precision(&MarglikConfig::default()).unwrap();
    let marglik_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let pred = post.predict_glm(&w.x_test).unwrap();
    let predict_s = t.elapsed().as_secs_f64();
    assert!(pred.var.iter().all(|v| v.is_finite()));
    let orth = match post.curvature() {
        Curvature::Eigen(e) if case.starts_with("lowrank") => (e.vectors.transpose() * &e.vectors
            - DMatrix::identity(e.vectors.ncols(), e.vectors.ncols()))
        .abs()
        .max(),
        _ => 0.0,
    };
    println!(
        "{fit_s} {marglik_s} {predict_s} {p} {} {orth} {} {}",
        status_kib("VmHWM:").saturating_sub(base),
        post.report().lanczos_iterations,
        post.prior_precision()[0]
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        child(&args[1], args[2].parse().unwrap(), args[3].parse().unwrap(), args[4].parse().unwrap());
        return;
    }
    let only: Option<&str> = args.first().map(String::as_str);
    let cases: Vec<(&str, &str, usize, usize, usize)> = vec![
        ("W1", "full", 100, 50, 0),
        ("W1", "kfac", 100, 50, 0),
        ("W1", "lowrank", 100, 50, 100),
        ("W2", "kfac", 10_000, 200, 0),
        ("W2", "ekfac", 10_000, 200, 0),
        ("W2", "diag", 10_000, 200, 0),
        ("W2", "lowrank", 10_000, 200, 100),
        ("W2", "lowrank_streamed", 10_000, 200, 100),
        ("sweep", "kfac", 10_000, 50, 0),
        ("sweep", "kfac", 10_000, 100, 0),
        ("sweep", "kfac", 10_000, 400, 0),
        ("sweep", "kfac", 2_500, 200, 0),
        ("sweep", "lowrank", 10_000, 200, 25),
        ("sweep", "lowrank", 10_000, 200, 50),
        ("sweep", "lowrank", 2_500, 100, 100),
        ("sweep", "lowrank", 2_500, 400, 100),
    ];
    let exe = std::env::current_exe().unwrap();
    println!("| workload | structure | n | net | p | k | fit s | λ by marglik s | predict 1000 s | Lanczos steps | max abs(UᵀU − I) | peak extra MiB | p·k·8 MiB | Σ factors MiB |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (name, case, n, width, k) in cases {
        if only.is_some_and(|o| o != name) {
            continue;
        }
        let out = Command::new(&exe)
            .args(["--child", case, &n.to_string(), &width.to_string(), &k.to_string()])
            .output()
            .unwrap();
        let s = String::from_utf8_lossy(&out.stdout);
        let v: Vec<f64> = s.split_whitespace().map(|t| t.parse().unwrap_or(f64::NAN)).collect();
        if v.len() < 8 {
            println!(
                "| {name} | {case} | {n} | 2×{width} | failed: {} |",
                String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("")
            );
            continue;
        }
        let (fit_s, ml_s, pr_s, p, kib, orth, iters) = (v[0], v[1], v[2], v[3], v[4], v[5], v[6]);
        let factors = ((width + 1) * (width + 1) * 2 + 2 * 2 + width * width + 4) as f64 * 8.0 / 1048576.0;
        println!(
            "| {name} | {case} | {n} | 2×{width} | {p} | {k} | {fit_s:.3} | {ml_s:.4} | {pr_s:.3} | {iters} | {orth:.1e} | {:.1} | {:.1} | {factors:.2} |",
            kib / 1024.0,
            p * k as f64 * 8.0 / 1048576.0,
        );
    }
}
