//! Time and peak memory of Lanczos-LDLᵀ pseudo-inverse factors on the matrix-free RBF Gram
//! operator (d = 8) against n, next to a dense symmetric eigendecomposition where it fits.
//!
//! Each case runs in a fresh child process so that its peak resident memory (VmHWM, Linux) is
//! its own; the table reports the peak *above* the resident memory after setup, next to the
//! `n·r·8` bytes of the Lanczos basis, to show memory growing as O(n·r) rather than O(n²).
//!
//! `cargo run --release --example lanczos_scaling -- [--sizes 1000,2000] [--ranks 100,500]
//! [--dense-max 4000]`

use std::process::Command;
use std::time::Instant;

use fspace::kernels::{gram, GramOperator, Rbf};
use fspace::linalg::{pinv_factor, sym_eigh, LanczosConfig};
use nalgebra::DMatrix;
use rand::{rngs::StdRng, Rng, SeedableRng};

use fspace_testutil::proc_status_kib as status_kib;

fn points(n: usize) -> DMatrix<f64> {
    let mut rng = StdRng::seed_from_u64(0);
    DMatrix::from_fn(n, 8, |_, _| rng.gen_range(-1.0..1.0))
}

fn child(args: &[String]) {
    let (mode, n): (&str, usize) = (&args[0], args[1].parse().unwrap());
    let x = points(n);
    let kernel = Rbf::ard(1.0, vec![0.7; 8]).unwrap();
    match mode {
        "lanczos" => {
            let r: usize = args[2].parse().unwrap();
            let op = GramOperator::new(kernel, &x).unwrap();
            let base = status_kib("VmRSS:");
            let t = Instant::now();
            let cfg = LanczosConfig { max_rank: r, pivot_tol: 0.0, ..Default::default() };
            let (f, info) = pinv_factor(&op, &cfg).unwrap();
            let secs = t.elapsed().as_secs_f64();
            println!(
                "{secs} {} {} {}",
                f.ncols(),
                status_kib("VmHWM:").saturating_sub(base),
                info.lanczos.iterations
            );
        }
        "dense" => {
            let base = status_kib("VmRSS:");
            let t = Instant::now();
            let k = gram(&kernel, &x, &x).unwrap();
            let (values, _) = sym_eigh(&k).unwrap();
            let secs = t.elapsed().as_secs_f64();
            println!("{secs} {} {} 0", values.len(), status_kib("VmHWM:").saturating_sub(base));
        }
        _ => panic!("unknown mode"),
    }
}

fn list(args: &[String], flag: &str, default: &[usize]) -> Vec<usize> {
    args.iter()
        .position(|a| a == flag)
        .map(|i| args[i + 1].split(',').map(|v| v.parse().unwrap()).collect())
        .unwrap_or_else(|| default.to_vec())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        return child(&args[1..]);
    }
    let sizes = list(&args, "--sizes", &[1000, 2000, 4000, 8000, 16000]);
    let ranks = list(&args, "--ranks", &[100, 500]);
    let dense_max = list(&args, "--dense-max", &[4000])[0];
    let exe = std::env::current_exe().unwrap();
    println!("| method | n | r | seconds | peak extra MiB | n·r·8 MiB | n²·8 MiB |");
    println!("|---|---|---|---|---|---|---|");
    for &n in &sizes {
        let mut cases: Vec<Vec<String>> =
            ranks.iter().map(|r| vec!["lanczos".into(), n.to_string(), r.to_string()]).collect();
        if n <= dense_max {
            cases.push(vec!["dense".into(), n.to_string()]);
        }
        for case in cases {
            let out = Command::new(&exe).arg("--child").args(&case).output().unwrap();
            let line = String::from_utf8_lossy(&out.stdout);
            let v: Vec<f64> = line.split_whitespace().map(|s| s.parse().unwrap()).collect();
            if v.len() < 3 {
                println!("| {} | {n} | - | failed: {} |", case[0], String::from_utf8_lossy(&out.stderr));
                continue;
            }
            let r = v[1] as usize;
            let mib = |b: f64| b / (1024.0 * 1024.0);
            let label = if case[0] == "dense" {
                "dense eigh".to_string()
            } else {
                format!("lanczos-ldlt (max {})", case[2])
            };
            println!(
                "| {label} | {n} | {r} | {:.2} | {:.1} | {:.1} | {:.1} |",
                v[0],
                v[2] / 1024.0,
                mib((n * r * 8) as f64),
                mib((n * n * 8) as f64)
            );
        }
    }
}
