//! `NativeNetwork` forwards every `Network` method to the wrapped MLP or CNN (bit-identical
//! results), saves its kind, and refuses a file of the other kind.

use fspace_nn::*;
use fspace_testutil::{randn, rng, same_bits};
use nalgebra::DMatrix;

fn mlp() -> Mlp {
    Mlp::new(MlpConfig {
        input_dim: 3,
        hidden: vec![6, 4],
        output_dim: 2,
        activation: Activation::Tanh,
        seed: 1,
    })
    .unwrap()
}

fn cnn() -> Cnn {
    Cnn::new(CnnConfig {
        input_shape: (2, 6, 5),
        convs: vec![ConvBlock { channels: 3, kernel: 3, same_padding: true, pool: true }],
        hidden: vec![4],
        output_dim: 2,
        activation: Activation::Relu,
        seed: 2,
    })
    .unwrap()
}

/// Every product of `wrapped` equals `net`'s, bit for bit.
fn forwards_exactly<N: Network + Clone + Into<NativeNetwork>>(net: N, d: usize) {
    let wrapped: NativeNetwork = net.clone().into();
    let mut r = rng(3);
    let x = randn(7, d, &mut r);
    let p = net.n_params();
    let u = randn(p, 3, &mut r);
    let l = randn(7 * 2, 3, &mut r);
    assert_eq!((wrapped.input_dim(), wrapped.output_dim(), wrapped.n_params()), (d, 2, p));
    assert!(same_bits(&wrapped.forward(&x).unwrap(), &net.forward(&x).unwrap()));
    assert!(same_bits(&wrapped.jvp_columns(&x, &u).unwrap(), &net.jvp_columns(&x, &u).unwrap()));
    assert!(same_bits(&wrapped.vjp_columns(&x, &l).unwrap(), &net.vjp_columns(&x, &l).unwrap()));
    assert!(same_bits(&wrapped.jacobian(&x).unwrap(), &net.jacobian(&x).unwrap()));
    assert!(same_bits(&wrapped.last_layer_features(&x).unwrap(), &net.last_layer_features(&x).unwrap()));
    let factors: Vec<DMatrix<f64>> = (0..7).map(|_| randn(2, 2, &mut r)).collect();
    let (a, b) = (wrapped.kfac_statistics(&x, &factors).unwrap(), net.kfac_statistics(&x, &factors).unwrap());
    assert_eq!(a.len(), b.len());
    for (sa, sb) in a.iter().zip(&b) {
        assert!(same_bits(&sa.inputs, &sb.inputs) && same_bits(&sa.output_grads, &sb.output_grads));
    }
    // Several networks of one kind take the wrapped type's fused rule: same numbers.
    let mut other = net.clone();
    other.set_params(&(net.params() * 0.5)).unwrap();
    let plain = [net.clone(), other.clone()];
    let native = [wrapped.clone(), other.into()];
    let mut cot =
        |fs: &[DMatrix<f64>]| -> Result<Vec<DMatrix<f64>>> { Ok(fs.iter().map(|f| f * 2.0).collect()) };
    let (fa, ga) = NativeNetwork::forward_vjp_many(&native, &x, &mut cot).unwrap();
    let (fb, gb) = N::forward_vjp_many(&plain, &x, &mut cot).unwrap();
    for s in 0..2 {
        assert!(same_bits(&fa[s], &fb[s]));
        assert_eq!(ga[s], gb[s]);
    }
}

#[test]
fn the_wrapper_forwards_every_product_exactly() {
    forwards_exactly(mlp(), 3);
    forwards_exactly(cnn(), 2 * 6 * 5);
}

#[test]
fn a_mixed_batch_of_networks_takes_the_per_network_rule() {
    // An MLP and a CNN of equal input width and outputs: the default pass, each network's own
    // forward and vjp.
    let m = Mlp::new(MlpConfig {
        input_dim: 60,
        hidden: vec![3],
        output_dim: 2,
        activation: Activation::Tanh,
        seed: 4,
    })
    .unwrap();
    let c = cnn();
    let x = randn(4, 60, &mut rng(5));
    let nets = [NativeNetwork::from(m.clone()), NativeNetwork::from(c.clone())];
    let mut cot = |fs: &[DMatrix<f64>]| -> Result<Vec<DMatrix<f64>>> { Ok(fs.to_vec()) };
    let (fs, gs) = NativeNetwork::forward_vjp_many(&nets, &x, &mut cot).unwrap();
    let fm = m.forward(&x).unwrap();
    assert!(same_bits(&fs[0], &fm));
    assert_eq!(gs[0], m.vjp(&x, &fm).unwrap());
    let fc = c.forward(&x).unwrap();
    assert!(same_bits(&fs[1], &fc));
    assert!((&gs[1] - c.vjp(&x, &fc).unwrap()).amax() < 1e-12);
}

#[test]
fn a_saved_network_names_its_kind_and_loads_only_as_it() {
    for net in [NativeNetwork::from(mlp()), NativeNetwork::from(cnn())] {
        let text = serde_json::to_string(&net).unwrap();
        let kind = if net.kind() == "mlp" { "Mlp" } else { "Cnn" };
        assert!(text.starts_with(&format!("{{\"{kind}\":")), "{}", &text[..20]);
        let back: NativeNetwork = serde_json::from_str(&text).unwrap();
        assert_eq!(back.kind(), net.kind());
        assert_eq!(back.params(), net.params());
    }
    // An MLP's payload under the CNN's tag is refused, not misread.
    let text = serde_json::to_string(&NativeNetwork::from(mlp())).unwrap().replacen("\"Mlp\"", "\"Cnn\"", 1);
    assert!(serde_json::from_str::<NativeNetwork>(&text).is_err());
}
