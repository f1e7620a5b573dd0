//! The benchmark workloads, shared by the criterion bench and the scaling example:
//! W1 = the sine toy (100 points, 2×50 tanh, p = 2 701); W2 = 10 000 sine points, 2×200 tanh
//! (p = 40 801). Networks at their seeded initialisation (the cost of every structure depends on
//! the shapes, not on the weights' values); data from `fspace_data::sine` (FSP-Laplace App. B.1).

use fspace_core::LikelihoodSpec;
use fspace_nn::{Activation, Mlp, MlpConfig};
use nalgebra::DMatrix;
use rand::SeedableRng;

/// A workload: network, inputs, targets, likelihood, 1 000 test inputs.
pub struct Workload {
    pub net: Mlp,
    pub x: DMatrix<f64>,
    pub y: DMatrix<f64>,
    pub likelihood: LikelihoodSpec,
    pub x_test: DMatrix<f64>,
}

/// `n` sine points and a 2×`width` tanh MLP.
pub fn workload(n: usize, width: usize) -> Workload {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let data = fspace_data::sine(n, 0.1, &mut rng).expect("sine data");
    let net = Mlp::new(MlpConfig {
        input_dim: 1,
        hidden: vec![width, width],
        output_dim: 1,
        activation: Activation::Tanh,
        seed: 0,
    })
    .expect("network");
    let x_test = DMatrix::from_fn(1000, 1, |i, _| -2.0 + 4.0 * i as f64 / 999.0);
    Workload { net, y: data.y, x: data.x, likelihood: LikelihoodSpec::gaussian(0.1), x_test }
}

/// W1: the sine toy.
pub fn w1() -> Workload {
    workload(100, 50)
}

/// W2: 10 000 points, 2×200.
pub fn w2() -> Workload {
    workload(10_000, 200)
}
