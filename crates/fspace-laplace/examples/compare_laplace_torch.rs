//! fspace's Laplace beside laplace-torch's on one shared network and λ: reads the JSON that
//! `scripts/compare/kfac_laplace_torch.py` writes (a trained 1-50-50-1 tanh MLP in PyTorch's
//! `Linear.weight` out × in layout, the data, σ, λ, and laplace-torch's GLM predictive std for
//! `kron`, `full` and `diag`) and prints the largest relative difference of the predictive std
//! for each structure — KFAC both with the bias folded into the input factor (our default) and
//! in separate blocks.
//!
//! `cargo run --release -p fspace-laplace --example compare_laplace_torch -- /tmp/kfac_compare.json`

use fspace_core::{Data, LikelihoodSpec, Posterior};
use fspace_laplace::{fit, KronBias, LaplaceConfig, PriorPrecision, Structure};
use fspace_nn::{Activation, Mlp, MlpConfig};
use nalgebra::{DMatrix, DVector};
use serde_json::Value;

fn numbers(v: &Value) -> Vec<f64> {
    v.as_array().expect("array").iter().map(|x| x.as_f64().expect("number")).collect()
}

fn main() {
    let path = std::env::args().nth(1).unwrap_or_else(|| "/tmp/kfac_compare.json".into());
    let j: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read the JSON")).expect("JSON");
    let (sigma, lambda) = (j["sigma"].as_f64().unwrap(), j["prior_precision"].as_f64().unwrap());
    let x = numbers(&j["x"]);
    let y = numbers(&j["y"]);
    let xt = numbers(&j["x_test"]);
    let layers = j["layers"].as_array().unwrap();
    let hidden: Vec<usize> = layers[..layers.len() - 1].iter().map(|l| numbers(&l["bias"]).len()).collect();
    let mut net =
        Mlp::new(MlpConfig { input_dim: 1, hidden, output_dim: 1, activation: Activation::Tanh, seed: 0 })
            .unwrap();
    // PyTorch's Linear.weight is out × in, row-major, as fspace's layer layout.
    let mut w = DVector::zeros(net.n_params());
    for (info, l) in net.layer_infos().iter().zip(layers) {
        let rows = l["weight"].as_array().unwrap();
        let bias = numbers(&l["bias"]);
        for r in 0..info.fan_out {
            let row = numbers(&rows[r]);
            for c in 0..info.fan_in {
                w[info.flat_index(r, c)] = row[c];
            }
            w[info.flat_index(r, info.fan_in)] = bias[r];
        }
    }
    net.set_params(&w).unwrap();
    let xm = DMatrix::from_column_slice(x.len(), 1, &x);
    let ym = DMatrix::from_column_slice(y.len(), 1, &y);
    let xtm = DMatrix::from_column_slice(xt.len(), 1, &xt);
    let data = Data::new(&xm, &ym).unwrap();
    let torch_mean = numbers(&j["laplace_torch"]["kron"]["f_mean"]);
    let mean = net.forward(&xtm).unwrap();
    let mean_err = (0..xt.len()).map(|i| (mean[(i, 0)] - torch_mean[i]).abs()).fold(0.0, f64::max);
    println!("network mean: max |fspace − torch| = {mean_err:.2e}");
    let cases = [
        ("kron", "KFAC, bias folded (fspace default)", Structure::Kfac, KronBias::Folded),
        ("kron", "KFAC, bias separate", Structure::Kfac, KronBias::Separate),
        ("full", "full GGN", Structure::full(), KronBias::Folded),
        ("diag", "diagonal GGN", Structure::Diag, KronBias::Folded),
    ];
    println!("| structure | laplace-torch backend | max relative difference of the predictive std |");
    println!("|---|---|---|");
    for (key, label, structure, kron_bias) in cases {
        let config = LaplaceConfig {
            structure,
            kron_bias,
            prior_precision: PriorPrecision::Scalar(lambda),
            ..Default::default()
        };
        let post = fit(net.clone(), LikelihoodSpec::gaussian(sigma), &data, &config).unwrap().posterior;
        let std = post.predict(&xtm).unwrap().std();
        let torch = numbers(&j["laplace_torch"][key]["f_std"]);
        let worst = (0..xt.len()).map(|i| (std[(i, 0)] - torch[i]).abs() / torch[i]).fold(0.0, f64::max);
        println!(
            "| {label} | {} | {worst:.3e} |",
            j["laplace_torch"][key]["backend"].as_str().unwrap_or("?")
        );
    }
}
