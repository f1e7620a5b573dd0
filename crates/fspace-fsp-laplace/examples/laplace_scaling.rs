//! Time and peak memory of Alg. 2 (`laplace`) against the number of context points `n_C` and
//! the number of network parameters `p`, one child process per case so that each peak
//! resident set (VmHWM, Linux) is its own. The table puts the peak above the post-setup
//! resident memory next to `p·r·8` bytes (the factors the algorithm keeps) and to the `p²·8`,
//! `p·n_C·8` and `n_C²·8` bytes of the matrices it never forms.
//!
//! Set-up: inputs in ℝ², 500 data points, Gaussian likelihood, RBF prior (ℓ = 0.3 on
//! [−3, 3]², numerically high rank so that Lanczos runs to `max_rank`), Halton context points,
//! 2×H tanh MLPs.
//!
//! `cargo run --release -p fspace-fsp-laplace --example laplace_scaling -- [--contexts 100,1000,4000]
//! [--widths 50,100,200,400] [--rank 500]`

use std::process::Command;
use std::time::Instant;

use fspace_fsp_laplace::{laplace, FspLaplaceConfig};

#[path = "../benches/support/problem.rs"]
mod problem;

use fspace_testutil::proc_status_kib as status_kib;

fn child(n_c: usize, width: usize, rank: usize) {
    let p = problem::problem(n_c, width);
    let cfg = FspLaplaceConfig { max_rank: rank, ..Default::default() };
    let base = status_kib("VmRSS:");
    let t = Instant::now();
    let post = laplace(&p.net, &p.likelihood, &p.prior, &p.x, &p.y, &p.context, &cfg).unwrap();
    let secs = t.elapsed().as_secs_f64();
    let r = post.report();
    println!(
        "{secs} {} {} {} {}",
        p.net.n_params(),
        r.lanczos_rank,
        r.rank,
        status_kib("VmHWM:").saturating_sub(base)
    );
}

fn list(args: &[String], flag: &str, default: &[usize]) -> Vec<usize> {
    match args.iter().position(|a| a == flag) {
        Some(i) => args[i + 1].split(',').map(|v| v.parse().expect("a list of sizes")).collect(),
        None => default.to_vec(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        child(args[1].parse().unwrap(), args[2].parse().unwrap(), args[3].parse().unwrap());
        return;
    }
    let contexts = list(&args, "--contexts", &[100, 1000, 4000]);
    let widths = list(&args, "--widths", &[50, 100, 200, 400]);
    let rank = list(&args, "--rank", &[500])[0];
    let exe = std::env::current_exe().unwrap();
    println!("| n_C | net | p | Lanczos r | final rank | seconds | peak extra MiB | p·r·8 MiB | p·n_C·8 MiB | n_C²·8 MiB | p²·8 MiB |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let cases: Vec<(usize, usize)> = contexts
        .iter()
        .map(|&c| (c, 50))
        .chain(widths.iter().filter(|&&w| w != 50).map(|&w| (1000, w)))
        .collect();
    for (n_c, w) in cases {
        let out = Command::new(&exe)
            .args(["--child", &n_c.to_string(), &w.to_string(), &rank.to_string()])
            .output()
            .unwrap();
        let s = String::from_utf8_lossy(&out.stdout);
        let v: Vec<f64> = s.split_whitespace().map(|t| t.parse().unwrap()).collect();
        let (secs, p, lr, fr, kib) = (v[0], v[1], v[2], v[3], v[4]);
        let mib = |b: f64| b / 1048576.0;
        println!(
            "| {n_c} | 2×{w} | {p} | {lr} | {fr} | {secs:.2} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            kib / 1024.0,
            mib(p * lr * 8.0),
            mib(p * n_c as f64 * 8.0),
            mib((n_c * n_c) as f64 * 8.0),
            mib(p * p * 8.0)
        );
    }
}
