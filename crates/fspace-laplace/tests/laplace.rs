//! Every structure against an independent dense computation on small networks: the dense GGN
//! `Σᵢ J(xᵢ)ᵀ Hᵢ J(xᵢ)` from the explicit Jacobian and the likelihood's Hessian blocks, dense
//! log-determinants, dense `J Σ Jᵀ`, and sample moments.

use fspace_core::{CoreError, Likelihood, Link, Posterior};
use fspace_core::{Data, LikelihoodSpec, Persist};
use fspace_input::InputError;
use fspace_laplace::{
    fit, fit_batches, fit_sharded, CurvatureApprox, CurvatureSource, FullConfig, KronBias, LaplaceConfig,
    LaplaceError, LaplacePosterior, LaplaceSums, LowRankConfig, MarglikConfig, Predictive, PriorPrecision,
    SampledConfig, SampledPreconditioner, Structure, Weights,
};
use fspace_nn::{Activation, Cnn, CnnConfig, ConvBlock, HelmholtzNet, Mlp, MlpConfig, Network};
use fspace_testutil::{rel_frob, rng, ThreadReduce};
use nalgebra::{DMatrix, DVector};
use rand::Rng;

/// The `Network` shape and weight methods a test wrapper network forwards unchanged to its
/// inner `net`.
macro_rules! delegate_shape_to_net {
    () => {
        fn input_dim(&self) -> usize {
            self.net.input_dim()
        }
        fn output_dim(&self) -> usize {
            self.net.output_dim()
        }
        fn n_params(&self) -> usize {
            self.net.n_params()
        }
        fn params(&self) -> DVector<f64> {
            self.net.params()
        }
        fn set_params(&mut self, params: &DVector<f64>) -> fspace_nn::Result<()> {
            self.net.set_params(params)
        }
    };
}

/// Every required `Network` method forwarded unchanged to the inner `net`.
macro_rules! delegate_required_to_net {
    () => {
        delegate_shape_to_net!();
        fn forward(&self, x: &DMatrix<f64>) -> fspace_nn::Result<DMatrix<f64>> {
            self.net.forward(x)
        }
        fn vjp(&self, x: &DMatrix<f64>, v: &DMatrix<f64>) -> fspace_nn::Result<DVector<f64>> {
            self.net.vjp(x, v)
        }
        fn jvp(&self, x: &DMatrix<f64>, u: &DVector<f64>) -> fspace_nn::Result<DMatrix<f64>> {
            self.net.jvp(x, u)
        }
    };
}

fn mlp(d: usize, hidden: Vec<usize>, q: usize, seed: u64) -> Mlp {
    Mlp::new(MlpConfig { input_dim: d, hidden, output_dim: q, activation: Activation::Tanh, seed }).unwrap()
}

/// Regression data for a `d → 1` net and classification data for a `d → q` net.
fn regression(n: usize, d: usize, seed: u64) -> (DMatrix<f64>, DVector<f64>) {
    let mut r = rng(seed);
    let x: DMatrix<f64> = DMatrix::from_fn(n, d, |_, _| r.gen_range(-2.0..2.0));
    let y = DVector::from_fn(n, |i, _| x.row(i).sum().sin() + 0.1 * r.gen_range(-1.0f64..1.0));
    (x, y)
}

fn classification(n: usize, d: usize, q: usize, seed: u64) -> (DMatrix<f64>, DVector<f64>) {
    let mut r = rng(seed);
    let x = DMatrix::from_fn(n, d, |_, _| r.gen_range(-2.0..2.0));
    let y = DVector::from_fn(n, |_, _| r.gen_range(0..q) as f64);
    (x, y)
}

/// The dense GGN from the explicit Jacobian and the likelihood's Hessian blocks.
fn dense_ggn<N: Network>(net: &N, lik: &dyn Likelihood, x: &DMatrix<f64>, y: &DVector<f64>) -> DMatrix<f64> {
    let f = net.forward(x).unwrap();
    let h = lik.nll_hessian(&f, y).unwrap();
    let j = net.jacobian(x).unwrap();
    let q = net.output_dim();
    let p = net.n_params();
    let mut g = DMatrix::zeros(p, p);
    for i in 0..x.nrows() {
        let ji = j.rows(i * q, q);
        g += ji.transpose() * &h[i] * ji;
    }
    g
}

/// The dense empirical Fisher `Σᵢ ∇_w ℓᵢ ∇_w ℓᵢᵀ` with `∇_w ℓᵢ = J(xᵢ)ᵀ gᵢ`, `gᵢ` the
/// likelihood's gradient in `f` at the observed label; also returns `Σᵢ ∇_w ℓᵢ`.
fn dense_empirical_fisher<N: Network>(
    net: &N,
    lik: &dyn Likelihood,
    x: &DMatrix<f64>,
    y: &DVector<f64>,
) -> (DMatrix<f64>, DVector<f64>) {
    let f = net.forward(x).unwrap();
    let g = lik.nll_grad(&f, y).unwrap();
    let j = net.jacobian(x).unwrap();
    let (q, p) = (net.output_dim(), net.n_params());
    let (mut ef, mut total) = (DMatrix::zeros(p, p), DVector::zeros(p));
    for i in 0..x.nrows() {
        let grad_i = j.rows(i * q, q).transpose() * g.row(i).transpose();
        ef += &grad_i * grad_i.transpose();
        total += grad_i;
    }
    (ef, total)
}

fn restrict(m: &DMatrix<f64>, idx: &[usize]) -> DMatrix<f64> {
    DMatrix::from_fn(idx.len(), idx.len(), |a, b| m[(idx[a], idx[b])])
}

/// `fit` on a training set given as inputs and point-major targets.
fn fit_v<N: Network>(
    net: N,
    lik: LikelihoodSpec,
    x: &DMatrix<f64>,
    y: &DVector<f64>,
    config: &LaplaceConfig,
) -> Result<LaplacePosterior<N>, LaplaceError> {
    let t = lik.target_dim();
    let ym = DMatrix::from_row_slice(y.len() / t, t, &y.as_slice()[..(y.len() / t) * t]);
    Ok(fit(net, lik, &Data::new(x, &ym)?, config)?.posterior)
}

fn config(structure: Structure) -> LaplaceConfig {
    LaplaceConfig { structure, chunk_points: 3, ..Default::default() }
}

fn fit_with<N: Network>(
    net: N,
    lik: LikelihoodSpec,
    x: &DMatrix<f64>,
    y: &DVector<f64>,
    s: Structure,
) -> LaplacePosterior<N> {
    fit_v(net, lik, x, y, &config(s)).unwrap()
}

/// Every curvature structure, the low-rank one at `rank`.
fn every_structure(rank: usize) -> [Structure; 7] {
    [
        Structure::full(),
        Structure::Diag,
        Structure::block_diag(),
        Structure::Kfac,
        Structure::Ekfac,
        Structure::last_layer(),
        Structure::low_rank(rank),
    ]
}

fn layer_blocks(net: &Mlp) -> Vec<Vec<usize>> {
    net.layer_infos().iter().map(|i| i.weight.clone().chain(i.bias.clone()).collect()).collect()
}

/// The GGN's per-layer diagonal blocks, laid out block-diagonally in layer order.
fn layer_diagonal_blocks(net: &Mlp, ggn: &DMatrix<f64>) -> DMatrix<f64> {
    let mut out = DMatrix::zeros(net.n_params(), net.n_params());
    let mut o = 0;
    for b in layer_blocks(net) {
        out.view_mut((o, o), (b.len(), b.len())).copy_from(&restrict(ggn, &b));
        o += b.len();
    }
    out
}

#[test]
fn diag_block_diag_full_and_last_layer_equal_the_dense_ggn() {
    // Two outputs, categorical: Hᵢ is a full 2 × 2 block, so the whitening by Lᵢ matters.
    let net = mlp(2, vec![4, 3], 3, 1);
    let (x, y) = classification(7, 2, 3, 2);
    let lik = LikelihoodSpec::Categorical { classes: 3 };
    let ggn = dense_ggn(&net, lik.build().unwrap().as_ref(), &x, &y);
    let scale = ggn.norm();

    let diag = fit_with(net.clone(), lik, &x, &y, Structure::Diag);
    let d = restrict(&ggn, diag.indices()).diagonal();
    let err = (diag.curvature().to_dense().diagonal() - &d).norm() / d.norm();
    println!("diag rel err {err:.2e}");
    assert!(err < 1e-12);

    let bd = fit_with(net.clone(), lik, &x, &y, Structure::block_diag());
    let err = rel_frob(&bd.curvature().to_dense(), &layer_diagonal_blocks(&net, &ggn));
    println!("block-diag rel err {err:.2e}");
    assert!(err < 1e-10);

    // Blocks larger than n·d' = 21 (the 8×8 layer's 72) take the thin-SVD route.
    let wide = mlp(2, vec![8, 8], 3, 9);
    let ggn_w = dense_ggn(&wide, lik.build().unwrap().as_ref(), &x, &y);
    let bdw = fit_with(wide.clone(), lik, &x, &y, Structure::block_diag());
    let err = rel_frob(&bdw.curvature().to_dense(), &layer_diagonal_blocks(&wide, &ggn_w));
    println!("block-diag (SVD route for the 72-parameter block) rel err {err:.2e}");
    assert!(err < 1e-10);

    // n·d' = 21 < p: the thin-SVD route.
    let full = fit_with(net.clone(), lik, &x, &y, Structure::full());
    let err = (full.curvature().to_dense() - restrict(&ggn, full.indices())).norm() / scale;
    println!("full (SVD route) rel err {err:.2e}");
    assert!(err < 1e-10);

    // n·d' > p: the dense-Gram route.
    let small = mlp(2, vec![2], 3, 3);
    let (xb, yb) = classification(20, 2, 3, 4);
    let ggn_b = dense_ggn(&small, lik.build().unwrap().as_ref(), &xb, &yb);
    let full_b = fit_with(small, lik, &xb, &yb, Structure::full());
    let err = rel_frob(&full_b.curvature().to_dense(), &ggn_b);
    println!("full (Gram route) rel err {err:.2e}");
    assert!(err < 1e-10);

    let ll = fit_with(net.clone(), lik, &x, &y, Structure::last_layer());
    let err = rel_frob(&ll.curvature().to_dense(), &restrict(&ggn, ll.indices()));
    println!("last-layer rel err {err:.2e}");
    assert!(err < 1e-10);
    assert_eq!(ll.indices().len(), 3 * 4);
}

/// `m` (in a posterior's index order, layer by layer) with its cross-layer blocks zeroed.
fn block_diagonal_part(m: &DMatrix<f64>, net: &Mlp) -> DMatrix<f64> {
    let mut out = DMatrix::zeros(m.nrows(), m.ncols());
    let mut o = 0;
    for sz in net.layer_infos().iter().map(|i| i.n_params()) {
        out.view_mut((o, o), (sz, sz)).copy_from(&m.view((o, o), (sz, sz)));
        o += sz;
    }
    out
}

#[test]
fn the_empirical_fisher_is_the_sum_of_squared_gradients_in_every_structure() {
    let net = mlp(2, vec![4, 3], 3, 1);
    let (x, y) = classification(7, 2, 3, 2);
    let lik = LikelihoodSpec::Categorical { classes: 3 };
    let built = lik.build().unwrap();
    let (ef, total) = dense_empirical_fisher(&net, built.as_ref(), &x, &y);
    // The reference's gradients are the loss's: their sum is the central-difference gradient
    // of the total NLL in the weights.
    let nll = |w: &[f64]| {
        let mut n = net.clone();
        n.set_params(&DVector::from_column_slice(w)).unwrap();
        built.nll(&n.forward(&x).unwrap(), &y).unwrap()
    };
    let fd = DVector::from_vec(fspace_testutil::fd_gradient(nll, net.params().as_slice(), 1e-6));
    let err = (&fd - &total).norm() / total.norm();
    println!("Σ ∇ℓᵢ vs finite differences rel err {err:.2e}");
    assert!(err < 1e-7);

    let ef_config =
        |structure| LaplaceConfig { curvature: CurvatureSource::EmpiricalFisher, ..config(structure) };
    let fit_ef = |net: &Mlp, x: &DMatrix<f64>, y: &DVector<f64>, s: Structure| {
        fit_v(net.clone(), lik, x, y, &ef_config(s)).unwrap()
    };
    let full = fit_ef(&net, &x, &y, Structure::full());
    let err = rel_frob(&full.curvature().to_dense(), &restrict(&ef, full.indices()));
    println!("EF full rel err {err:.2e}");
    assert!(err < 1e-10);
    let diag = fit_ef(&net, &x, &y, Structure::Diag);
    let d = restrict(&ef, diag.indices()).diagonal();
    let err = (diag.curvature().to_dense().diagonal() - &d).norm() / d.norm();
    println!("EF diag rel err {err:.2e}");
    assert!(err < 1e-12);
    let bd = fit_ef(&net, &x, &y, Structure::block_diag());
    let err = rel_frob(&bd.curvature().to_dense(), &layer_diagonal_blocks(&net, &ef));
    println!("EF block-diag rel err {err:.2e}");
    assert!(err < 1e-10);
    let ll = fit_ef(&net, &x, &y, Structure::last_layer());
    let err = rel_frob(&ll.curvature().to_dense(), &restrict(&ef, ll.indices()));
    println!("EF last-layer rel err {err:.2e}");
    assert!(err < 1e-10);
    // One point: KFAC and EKFAC are the EF's layer blocks exactly (G = ggᵀ of the
    // backpropagated gradient, A = ããᵀ).
    let (x1, y1) = classification(1, 2, 3, 6);
    let (ef1, _) = dense_empirical_fisher(&net, built.as_ref(), &x1, &y1);
    for s in [Structure::Kfac, Structure::Ekfac] {
        let post = fit_ef(&net, &x1, &y1, s);
        let expected = block_diagonal_part(&restrict(&ef1, post.indices()), &net);
        let err = rel_frob(&post.curvature().to_dense(), &expected);
        println!("EF {} one-point rel err {err:.2e}", post.curvature().name());
        assert!(err < 1e-10);
    }
    // The GGN is another matrix (the Fisher at the model's own labels, not the observed ones).
    let ggn = fit_with(net.clone(), lik, &x, &y, Structure::full());
    assert!(rel_frob(&ggn.curvature().to_dense(), &full.curvature().to_dense()) > 1e-2);
    // A saved configuration from before the option existed reads as the GGN.
    let mut old = serde_json::to_value(LaplaceConfig::default()).unwrap();
    old.as_object_mut().unwrap().remove("curvature");
    let back: LaplaceConfig = serde_json::from_value(old).unwrap();
    assert_eq!(back.curvature, CurvatureSource::Ggn);
}

#[test]
fn kfac_is_exact_for_one_point_and_ekfac_matches_the_ggn_in_its_eigenbasis() {
    let net = mlp(3, vec![5, 4], 2, 5);
    let lik = LikelihoodSpec::Categorical { classes: 2 };
    // One point: every layer block of the GGN is exactly G ⊗ A.
    let (x1, y1) = classification(1, 3, 2, 6);
    let ggn1 = dense_ggn(&net, lik.build().unwrap().as_ref(), &x1, &y1);
    for s in [Structure::Kfac, Structure::Ekfac] {
        let post = fit_with(net.clone(), lik, &x1, &y1, s);
        let mut expected = restrict(&ggn1, post.indices());
        // Zero the cross-layer blocks: KFAC is block-diagonal over layers.
        let mut o = 0;
        let sizes: Vec<usize> = net.layer_infos().iter().map(|i| i.n_params()).collect();
        let mut mask = DMatrix::zeros(expected.nrows(), expected.ncols());
        for &sz in &sizes {
            mask.view_mut((o, o), (sz, sz)).fill(1.0);
            o += sz;
        }
        expected.component_mul_assign(&mask);
        let err = rel_frob(&post.curvature().to_dense(), &expected);
        println!("{} one-point rel err {err:.2e}", post.curvature().name());
        assert!(err < 1e-10);
    }
    // Many points: EKFAC's eigenvalues are diag(Qᵀ GGN_l Q) in KFAC's eigenbasis Q = Q_G ⊗ Q_A.
    let (x, y) = classification(9, 3, 2, 7);
    let ggn = dense_ggn(&net, lik.build().unwrap().as_ref(), &x, &y);
    let post = fit_with(net.clone(), lik, &x, &y, Structure::Ekfac);
    let fspace_laplace::Curvature::Kron(k) = post.curvature() else { panic!("kron") };
    let mut o = 0;
    for (layer, info) in k.layers.iter().zip(net.layer_infos()) {
        let idx = &post.indices()[o..o + info.n_params()];
        o += info.n_params();
        let q = layer.g_vectors.kronecker(&layer.a_vectors);
        let proj = q.transpose() * restrict(&ggn, idx) * &q;
        let fitted = layer.fitted.as_ref().unwrap();
        let (r, c) = layer.shape();
        let expected = DVector::from_fn(r * c, |i, _| proj[(i, i)]);
        let got = DVector::from_fn(r * c, |i, _| fitted[(i / c, i % c)]);
        let err = (&got - &expected).norm() / expected.norm();
        println!("EKFAC {} eigenvalue fit rel err {err:.2e}", info.name);
        assert!(err < 1e-10);
    }
    // And KFAC on many points is only an approximation: it differs from the exact blocks.
    let kfac = fit_with(net.clone(), lik, &x, &y, Structure::Kfac);
    let err = rel_frob(&kfac.curvature().to_dense(), &restrict(&ggn, kfac.indices()));
    println!("KFAC many-point rel difference to the GGN {err:.2e}");
    assert!(err > 1e-3);
}

fn tiny_cnn(seed: u64) -> Cnn {
    Cnn::new(CnnConfig {
        input_shape: (1, 6, 6),
        convs: vec![ConvBlock { channels: 2, kernel: 3, same_padding: true, pool: true }],
        hidden: vec![4],
        output_dim: 3,
        activation: Activation::Tanh,
        seed,
    })
    .unwrap()
}

#[test]
fn cnn_statistics_give_the_exact_jacobian_blocks_diagonal_and_ekfac() {
    let net = tiny_cnn(1);
    let (x, y) = classification(4, 36, 3, 8);
    let lik = LikelihoodSpec::Categorical { classes: 3 };
    // Σ_t δ_t ã_tᵀ for unit cotangents = the Jacobian rows of the layer (KFC's ingredients).
    let jac = net.jacobian(&x).unwrap();
    let eye = vec![DMatrix::identity(3, 3); 4];
    let stats = net.kfac_statistics(&x, &eye).unwrap();
    let mut worst = 0.0f64;
    for (info, st) in net.layer_infos().iter().zip(&stats) {
        for i in 0..4 {
            for o in 0..3 {
                let g = st.example_gradient(i, o, true);
                for r in 0..info.fan_out {
                    for j in 0..=info.fan_in {
                        worst = worst.max((g[(r, j)] - jac[(i * 3 + o, info.flat_index(r, j))]).abs());
                    }
                }
            }
        }
    }
    println!("CNN per-example gradients vs Jacobian: max abs err {worst:.2e}");
    assert!(worst < 1e-12);

    let ggn = dense_ggn(&net, lik.build().unwrap().as_ref(), &x, &y);
    let diag = fit_with(net.clone(), lik, &x, &y, Structure::Diag);
    let err = (diag.curvature().to_dense().diagonal() - ggn.diagonal()).norm() / ggn.diagonal().norm();
    println!("CNN diag rel err {err:.2e}");
    assert!(err < 1e-12);

    let post = fit_with(net.clone(), lik, &x, &y, Structure::Ekfac);
    let fspace_laplace::Curvature::Kron(k) = post.curvature() else { panic!("kron") };
    let mut o = 0;
    for (layer, info) in k.layers.iter().zip(net.layer_infos()) {
        let idx = &post.indices()[o..o + info.n_params()];
        o += info.n_params();
        let q = layer.g_vectors.kronecker(&layer.a_vectors);
        let proj = q.transpose() * restrict(&ggn, idx) * &q;
        let (r, c) = layer.shape();
        let fitted = layer.fitted.as_ref().unwrap();
        let err = (0..r * c).map(|i| (fitted[(i / c, i % c)] - proj[(i, i)]).abs()).fold(0.0, f64::max)
            / proj.diagonal().abs().max();
        println!("CNN EKFAC {} rel err {err:.2e}", info.name);
        assert!(err < 1e-10);
    }
}

#[test]
fn cnn_kfc_is_exact_for_one_image_with_one_output_position() {
    // A 3×3 conv without padding on a 3×3 image has one output position: KFC = exact block.
    let net = Cnn::new(CnnConfig {
        input_shape: (2, 3, 3),
        convs: vec![ConvBlock { channels: 3, kernel: 3, same_padding: false, pool: false }],
        hidden: vec![],
        output_dim: 2,
        activation: Activation::Tanh,
        seed: 3,
    })
    .unwrap();
    let (x, y) = classification(1, 18, 2, 9);
    let lik = LikelihoodSpec::Categorical { classes: 2 };
    let ggn = dense_ggn(&net, lik.build().unwrap().as_ref(), &x, &y);
    let post = fit_with(net.clone(), lik, &x, &y, Structure::Kfac);
    let dense = post.curvature().to_dense();
    let mut o = 0;
    for info in net.layer_infos() {
        let idx = &post.indices()[o..o + info.n_params()];
        let err = rel_frob(&dense.view((o, o), (idx.len(), idx.len())).into_owned(), &restrict(&ggn, idx));
        println!("KFC one-position {} rel err {err:.2e}", info.name);
        assert!(err < 1e-10);
        o += info.n_params();
    }
}

/// Low-rank top-`k` against a dense `eigh` of the GGN, with the GGN products from cached
/// layer statistics (`cache`) or streamed JVP/VJP.
fn check_low_rank<N: Network + Clone>(
    net: &N,
    lik: &LikelihoodSpec,
    x: &DMatrix<f64>,
    y: &DVector<f64>,
    ks: &[usize],
    cache: bool,
) {
    let ggn = dense_ggn(net, lik.build().unwrap().as_ref(), x, y);
    let eig = fspace_linalg::sym_eigh(&ggn).unwrap();
    for &k in ks {
        let cfg = LowRankConfig {
            rank: k,
            statistics_cache_bytes: if cache { usize::MAX } else { 0 },
            ..Default::default()
        };
        let post = fit_with(net.clone(), *lik, x, y, Structure::LowRank(cfg));
        assert_eq!(post.report().cached_statistics, cache);
        let fspace_laplace::Curvature::Eigen(e) = post.curvature() else { panic!("eigen") };
        let vals_err = (0..k).map(|j| (e.values[j] - eig.0[j]).abs() / eig.0[0]).fold(0.0, f64::max);
        let orth = (e.vectors.transpose() * &e.vectors - DMatrix::identity(k, k)).abs().max();
        // Eigenvectors up to sign: |⟨u_j, v_j⟩| = 1 (the spectrum is simple here).
        let vec_err =
            (0..k).map(|j| 1.0 - e.vectors.column(j).dot(&eig.1.column(j)).abs()).fold(0.0, f64::max);
        println!(
            "cache {cache} rank {k}: eigenvalue err {vals_err:.2e}, max|UᵀU − I| {orth:.2e}, vector err {vec_err:.2e}, {} Lanczos steps",
            post.report().lanczos_iterations
        );
        assert!(vals_err < 1e-8 && orth < 1e-10 && vec_err < 1e-8);
    }
}

/// An MLP that counts the GGN products asked of it (in points: one product visits every point).
#[derive(Clone)]
struct CountingProducts {
    net: Mlp,
    points: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Network for CountingProducts {
    delegate_required_to_net!();
    fn ggn_vector_product(
        &self,
        x: &DMatrix<f64>,
        hessians: &[DMatrix<f64>],
        v: &DVector<f64>,
    ) -> fspace_nn::Result<DVector<f64>> {
        self.points.fetch_add(x.nrows(), std::sync::atomic::Ordering::SeqCst);
        self.net.ggn_vector_product(x, hessians, v)
    }
}

#[test]
fn a_growing_low_rank_krylov_space_keeps_its_products() {
    // A tight tolerance on 20 pairs makes the space grow past its first 40 vectors; every
    // growth extends the decomposition, so the products made are the iterations (+1 for the
    // projected start), not the sum of the sizes tried.
    let net = mlp(30, vec![20], 1, 40);
    let (x, y) = regression(300, 30, 41);
    let lik = LikelihoodSpec::gaussian(0.3);
    let points = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counting = CountingProducts { net: net.clone(), points: points.clone() };
    let cfg = LowRankConfig { rank: 20, tol: 1e-13, statistics_cache_bytes: 0, ..Default::default() };
    let post = fit_with(counting, lik, &x, &y, Structure::LowRank(cfg));
    let iterations = post.report().lanczos_iterations;
    let products = points.load(std::sync::atomic::Ordering::SeqCst) as f64 / x.nrows() as f64;
    println!(
        "{iterations} Lanczos steps, {products} GGN products, worst residual {:.2e}",
        post.report().max_ritz_residual
    );
    assert!(iterations > 40, "the space did not grow ({iterations} steps)");
    assert_eq!(products, (iterations + 1) as f64);
    let ggn = dense_ggn(&net, lik.build().unwrap().as_ref(), &x, &y);
    let eig = fspace_linalg::sym_eigh(&ggn).unwrap();
    let fspace_laplace::Curvature::Eigen(e) = post.curvature() else { panic!("eigen") };
    let vals_err = (0..20).map(|j| (e.values[j] - eig.0[j]).abs() / eig.0[0]).fold(0.0, f64::max);
    assert!(vals_err < 1e-10, "eigenvalue error {vals_err:.2e}");
}

#[test]
fn a_bounded_krylov_basis_restarts_and_finds_the_same_low_rank_curvature() {
    // 20 pairs to 1e-12 in a basis of 24 vectors: thick-restart Lanczos restarts many times and
    // must still find the dense GGN's top eigenpairs; every product is counted in the report.
    let net = mlp(30, vec![20], 1, 40);
    let (x, y) = regression(300, 30, 41);
    let lik = LikelihoodSpec::gaussian(0.3);
    let ggn = dense_ggn(&net, lik.build().unwrap().as_ref(), &x, &y);
    let (values, vectors) = fspace_linalg::sym_eigh(&ggn).unwrap();
    for max_basis in [24, 60] {
        let points = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counting = CountingProducts { net: net.clone(), points: points.clone() };
        let cfg = LowRankConfig {
            rank: 20,
            tol: 1e-12,
            statistics_cache_bytes: 0,
            max_basis: Some(max_basis),
            ..Default::default()
        };
        let post = fit_with(counting, lik, &x, &y, Structure::LowRank(cfg));
        let report = post.report();
        let products = points.load(std::sync::atomic::Ordering::SeqCst) / x.nrows();
        println!(
            "max_basis {max_basis}: {} steps, {products} GGN products, worst residual {:.2e}",
            report.lanczos_iterations, report.max_ritz_residual
        );
        assert_eq!(products, report.lanczos_iterations + 1);
        assert!(report.max_ritz_residual <= 1e-12);
        if max_basis == 24 {
            assert!(products > 2 * max_basis, "a 24-vector basis must restart ({products} products)");
        }
        let fspace_laplace::Curvature::Eigen(e) = post.curvature() else { panic!("eigen") };
        assert_eq!(e.vectors.shape(), (net.n_params(), 20));
        for j in 0..20 {
            let err = (e.values[j] - values[j]).abs() / values[0];
            assert!(err < 1e-11, "max_basis {max_basis}: eigenvalue {j} error {err:.2e}");
            let cos = e.vectors.column(j).dot(&vectors.column(j)).abs();
            assert!((1.0 - cos).abs() < 1e-8, "max_basis {max_basis}: eigenvector {j}: |cos| = {cos}");
        }
    }
    // A basis too small for the rank is a typed error naming it.
    let cfg =
        LowRankConfig { rank: 20, max_basis: Some(21), statistics_cache_bytes: 0, ..Default::default() };
    let err = fit_v(net, lik, &x, &y, &config(Structure::LowRank(cfg))).unwrap_err().to_string();
    assert!(err.contains("max_basis"), "{err}");
}

#[test]
fn low_rank_top_k_equals_dense_eigh() {
    let net = mlp(2, vec![8, 8], 1, 11);
    let (x, y) = regression(30, 2, 12);
    let lik = LikelihoodSpec::gaussian(0.3);
    for cache in [true, false] {
        check_low_rank(&net, &lik, &x, &y, &[1, 5, 12], cache);
    }
    // Several cotangent columns per example (categorical) and a CNN (several positions).
    let (xc, yc) = classification(20, 2, 3, 30);
    let cat = LikelihoodSpec::Categorical { classes: 3 };
    check_low_rank(&mlp(2, vec![6], 3, 31), &cat, &xc, &yc, &[4, 9], true);
    let (xi, yi) = classification(4, 36, 3, 32);
    check_low_rank(&tiny_cnn(33), &cat, &xi, &yi, &[3, 6], true);
    // With the diagonal remainder the diagonal is exact.
    let ggn = dense_ggn(&net, lik.build().unwrap().as_ref(), &x, &y);
    let s = Structure::LowRank(LowRankConfig { rank: 5, diag_remainder: true, ..Default::default() });
    let post = fit_with(net.clone(), lik, &x, &y, s);
    let err = (post.curvature().to_dense().diagonal() - ggn.diagonal()).norm() / ggn.diagonal().norm();
    println!("low-rank + diagonal remainder: diagonal rel err {err:.2e}");
    assert!(err < 1e-10);
}

/// `T·ll − ½ Σ λ w² + ½ Σ log λ − ½ log|T C + Λ|` with a dense Cholesky.
fn dense_marglik<N: Network>(post: &LaplacePosterior<N>, lam: &[f64], t: f64) -> f64 {
    let c = post.curvature().to_dense();
    let lam_v = DVector::from_column_slice(lam);
    let p = &c * t + DMatrix::from_diagonal(&lam_v);
    let logdet = 2.0 * p.cholesky().unwrap().l().diagonal().map(f64::ln).sum();
    let w = post.network().params();
    let scatter: f64 = post.indices().iter().zip(lam).map(|(&i, l)| l * w[i] * w[i]).sum();
    t * post.log_likelihood() - 0.5 * scatter + 0.5 * lam_v.map(f64::ln).sum() - 0.5 * logdet
}

fn per_coordinate(post: &LaplacePosterior<Mlp>, per_layer: &[f64]) -> Vec<f64> {
    let infos = post.network().layer_infos();
    post.indices()
        .iter()
        .map(|&i| {
            let g = infos.iter().position(|l| l.weight.contains(&i) || l.bias.contains(&i)).unwrap();
            per_layer[g]
        })
        .collect()
}

#[test]
fn marginal_likelihood_and_its_optimum_equal_a_dense_evaluation() {
    let net = mlp(1, vec![6, 6], 1, 13);
    let (x, y) = regression(25, 1, 14);
    let lik = LikelihoodSpec::gaussian(0.2);
    for s in every_structure(10) {
        let mut post = fit_with(net.clone(), lik, &x, &y, s);
        let name = post.curvature().name();
        for (lam, t) in [(0.5, 1.0), (3.0, 0.3), (40.0, 5.0)] {
            let got = post.log_marginal_likelihood_at(&PriorPrecision::Scalar(lam), t).unwrap();
            let want = dense_marglik(&post, &vec![lam; post.indices().len()], t);
            assert!((got - want).abs() < 1e-9 * want.abs().max(1.0), "{name} λ={lam} T={t}: {got} vs {want}");
        }
        // Per-layer λ (the Woodbury path for the eigen structures).
        let pl = vec![0.7, 2.0, 5.0];
        let got = post.log_marginal_likelihood_at(&PriorPrecision::PerLayer(pl.clone()), 1.5).unwrap();
        let want = dense_marglik(&post, &per_coordinate(&post, &pl), 1.5);
        assert!((got - want).abs() < 1e-9 * want.abs().max(1.0), "{name} per-layer: {got} vs {want}");
        // The optimum: no better value nearby in the dense evaluation.
        let best = post.optimize_prior_precision(&MarglikConfig::default()).unwrap();
        let lam = post.prior_precision()[0];
        let at = |l: f64| dense_marglik(&post, &vec![l; post.indices().len()], 1.0);
        assert!((best - at(lam)).abs() < 1e-9 * best.abs().max(1.0));
        for f in [0.99, 1.01, 0.5, 2.0] {
            assert!(at(lam * f) <= at(lam) + 1e-9, "{name}: λ* = {lam} is not a maximum (×{f})");
        }
        println!("{name}: λ* = {lam:.4}, log Z = {best:.4}");
        // Per-layer optimisation never does worse than the scalar optimum.
        let per =
            post.optimize_prior_precision(&MarglikConfig { per_layer: true, ..Default::default() }).unwrap();
        assert!(per >= best - 1e-9, "{name}: per-layer {per} < scalar {best}");
    }
}

/// `Curvature::eigenvalues` (what the Python layer's differentiable evidence is built from)
/// against the dense eigenvalues of `C`, for every structure; the sampled one has none.
#[test]
fn the_listed_eigenvalues_are_those_of_the_dense_curvature() {
    let net = mlp(2, vec![5, 4], 3, 21);
    let (x, y) = classification(30, 2, 3, 22);
    let lik = LikelihoodSpec::categorical(3);
    for s in every_structure(6) {
        let post = fit_with(net.clone(), lik, &x, &y, s);
        let name = post.curvature().name();
        let mut got = post.curvature().eigenvalues().unwrap_or_else(|| panic!("{name} lists none"));
        let dense = post.curvature().to_dense();
        let mut want: Vec<f64> = dense.symmetric_eigenvalues().iter().map(|v| v.max(0.0)).collect();
        assert!(got.len() <= want.len(), "{name}: {} eigenvalues for dim {}", got.len(), want.len());
        // The unlisted ones are 0 (low rank, thin SVD).
        got.resize(want.len(), 0.0);
        got.sort_by(f64::total_cmp);
        want.sort_by(f64::total_cmp);
        let scale = want.last().copied().unwrap_or(1.0).max(1e-300);
        if name == "low_rank" {
            // The top 6 only: compare them with the dense top 6.
            for (g, w) in got.iter().rev().zip(want.iter().rev()).take(6) {
                assert!((g - w).abs() < 1e-8 * scale, "{name}: {g} vs {w}");
            }
        } else {
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() < 1e-9 * scale, "{name}: {g} vs {w}");
            }
        }
        // log |T·C + λI| from the list equals the structure's own.
        let (t, lam) = (0.7, 2.5);
        let listed = post.curvature().eigenvalues().unwrap();
        let from_list: f64 = listed.iter().map(|e| (t * e + lam).ln()).sum::<f64>()
            + (post.curvature().dim() - listed.len()) as f64 * lam.ln();
        let own = post
            .curvature()
            .log_det_precision(t, &DVector::from_element(post.curvature().dim(), lam))
            .unwrap();
        assert!((from_list - own).abs() < 1e-9 * own.abs().max(1.0), "{name}: {from_list} vs {own}");
    }
    let sampled = Structure::Sampled(SampledConfig { samples: 4, em_steps: 0, ..Default::default() });
    let post = fit_with(net, lik, &x, &y, sampled);
    assert!(post.curvature().eigenvalues().is_none());
}

/// `J Σ Jᵀ` densely vs the posterior's GLM covariances (per point and joint) for a prior given
/// per layer (`lam_layers`) or as one value.
fn check_glm<N: Network + Clone>(
    post: &mut LaplacePosterior<N>,
    xt: &DMatrix<f64>,
    lam_layers: &[f64],
    scalar: bool,
) -> f64 {
    let q = post.network().output_dim();
    let infos = post.network().layer_infos();
    let prior = if scalar {
        PriorPrecision::Scalar(lam_layers[0])
    } else {
        PriorPrecision::PerLayer(lam_layers.to_vec())
    };
    post.set_prior_precision(prior).unwrap();
    post.set_temperature(0.7).unwrap();
    let lam = DVector::from_iterator(
        post.indices().len(),
        post.indices().iter().map(|&i| {
            let g = infos.iter().position(|l| l.weight.contains(&i) || l.bias.contains(&i)).unwrap();
            if scalar {
                lam_layers[0]
            } else {
                lam_layers[g]
            }
        }),
    );
    let sigma = (post.curvature().to_dense() * 0.7 + DMatrix::from_diagonal(&lam)).try_inverse().unwrap();
    let js = post.network().jacobian(xt).unwrap().select_columns(post.indices());
    let cov = &js * &sigma * js.transpose();
    let covs = post.glm_covariances(xt).unwrap();
    let mut worst = 0.0f64;
    for i in 0..xt.nrows() {
        let block = cov.view((i * q, i * q), (q, q)).into_owned();
        worst = worst.max((&covs[i] - &block).abs().max() / block.abs().max());
    }
    let (_, joint) = post.predict_joint(xt).unwrap();
    // Σ applied to a block of the curvature's coordinates is the dense inverse's product.
    let v = js.transpose();
    let applied = post.covariance_solve(&v).unwrap();
    let dim = post.indices().len();
    match post.covariance_diagonal() {
        Some(d) => assert!(rel_frob(&DMatrix::from_diagonal(&d), &sigma) < 1e-12, "diag: Σ is its diagonal"),
        None => assert_ne!(post.curvature().name(), "diag"),
    }
    assert!(matches!(
        post.covariance_solve(&DMatrix::zeros(dim + 1, 2)),
        Err(LaplaceError::Input(InputError::DimensionMismatch { .. }))
    ));
    assert!(matches!(
        post.covariance_solve(&DMatrix::from_element(dim, 1, f64::NAN)),
        Err(LaplaceError::Input(InputError::NonFinite { .. }))
    ));
    let dense =
        (post.curvature().to_dense() * 0.7 + DMatrix::from_diagonal(&lam)).try_inverse().unwrap() * &v;
    worst.max(rel_frob(&joint, &cov)).max(rel_frob(&applied, &dense))
}

#[test]
fn glm_predictive_equals_dense_j_sigma_jt_for_every_structure() {
    let net = mlp(2, vec![5, 4], 3, 15);
    let (x, y) = classification(12, 2, 3, 16);
    let (xt, _) = classification(6, 2, 3, 17);
    let lik = LikelihoodSpec::Categorical { classes: 3 };
    for s in every_structure(8) {
        let mut post = fit_with(net.clone(), lik, &x, &y, s);
        // Per-layer λ takes the Jacobian/Woodbury route for the eigen structures, a scalar λ
        // the layer-statistics route.
        for scalar in [false, true] {
            let err = check_glm(&mut post, &xt, &[0.5, 1.5, 3.0], scalar);
            println!("{} (scalar λ: {scalar}): GLM covariance rel err {err:.2e}", post.curvature().name());
            assert!(err < 1e-9);
        }
    }
    // The CNN: convolution layers take the per-example-gradient branch.
    let cnn = tiny_cnn(5);
    let (xc, yc) = classification(5, 36, 3, 18);
    let (xct, _) = classification(3, 36, 3, 19);
    for s in [Structure::full(), Structure::Diag, Structure::Kfac, Structure::Ekfac, Structure::low_rank(6)] {
        let mut post = fit_with(cnn.clone(), lik, &xc, &yc, s);
        let err = check_glm(&mut post, &xct, &[0.5, 1.5, 3.0], true);
        println!("CNN {}: GLM covariance rel err {err:.2e}", post.curvature().name());
        assert!(err < 1e-9);
    }
}

/// The diagonal structure over the last layer (laplace-torch's `DiagLLLaplace`): the diagonal
/// of the dense last-layer GGN, its GLM predictive the dense `J Σ Jᵀ`, and it saves and loads.
#[test]
fn last_layer_diagonal_is_the_diagonal_of_the_last_layer_ggn() {
    let net = mlp(2, vec![5, 4], 3, 31);
    let (x, y) = classification(20, 2, 3, 32);
    let (xt, _) = classification(5, 2, 3, 33);
    let lik = LikelihoodSpec::Categorical { classes: 3 };
    let config = LaplaceConfig { weights: Weights::LastLayer, ..config(Structure::Diag) };
    let mut post = fit_v(net.clone(), lik, &x, &y, &config).unwrap();
    let ggn = dense_ggn(&net, lik.build().unwrap().as_ref(), &x, &y);
    let want = restrict(&ggn, post.indices()).diagonal();
    let got = post.curvature().to_dense().diagonal();
    assert_eq!(post.indices(), net.layer_infos().last().unwrap().kron_order().as_slice());
    assert!((&got - &want).norm() / want.norm() < 1e-10);
    let err = check_glm(&mut post, &xt, &[0.5, 1.5, 3.0], true);
    assert!(err < 1e-9, "GLM covariance rel err {err:.2e}");
    let back = LaplacePosterior::<Mlp>::from_json(&post.to_json().unwrap()).unwrap();
    assert_eq!(back.glm_covariances(&xt).unwrap(), post.glm_covariances(&xt).unwrap());
}

#[test]
fn samples_have_the_posterior_covariance_and_mc_matches_glm_for_a_linear_model() {
    // A network without hidden layers is linear in its weights: the nonlinear MC predictive and
    // the GLM predictive are the same Gaussian.
    let net = mlp(2, vec![], 2, 19);
    let (x, y) = classification(15, 2, 2, 20);
    let (xt, _) = classification(4, 2, 2, 21);
    let lik = LikelihoodSpec::Categorical { classes: 2 };
    for s in [
        Structure::full(),
        Structure::Diag,
        Structure::Kfac,
        Structure::Ekfac,
        Structure::last_layer(),
        Structure::low_rank(3),
    ] {
        let mut post = fit_with(net.clone(), lik, &x, &y, s);
        post.set_prior_precision(PriorPrecision::Scalar(0.8)).unwrap();
        let glm = post.predict_glm(&xt).unwrap();
        let mut r = rng(22);
        let mc = post.predict_nonlinear(&xt, 40_000, &mut r).unwrap();
        let mean_err = (&mc.mean - &glm.mean).abs().max() / glm.var.max().sqrt();
        let var_err = (&mc.var - &glm.var).abs().max() / glm.var.max();
        println!(
            "{}: MC vs GLM mean err {mean_err:.3} sd, var rel err {var_err:.3}",
            post.curvature().name()
        );
        assert!(mean_err < 0.03 && var_err < 0.04);
    }
    // Weight samples reproduce Σ (non-isotropic prior: the perturb-and-solve sampler).
    let net = mlp(1, vec![3], 1, 23);
    let (x, y) = regression(10, 1, 24);
    for s in [
        Structure::full(),
        Structure::block_diag(),
        Structure::Kfac,
        Structure::Ekfac,
        Structure::low_rank(4),
    ] {
        let mut post = fit_with(net.clone(), LikelihoodSpec::gaussian(0.3), &x, &y, s);
        post.set_prior_precision(PriorPrecision::PerLayer(vec![2.0, 0.5])).unwrap();
        let c = post.curvature().to_dense();
        let infos = post.network().layer_infos();
        let lam = DVector::from_fn(post.indices().len(), |a, _| {
            let i = post.indices()[a];
            if infos[0].weight.contains(&i) || infos[0].bias.contains(&i) {
                2.0
            } else {
                0.5
            }
        });
        let sigma = (c + DMatrix::from_diagonal(&lam)).try_inverse().unwrap();
        let mut r = rng(25);
        let draws = post.sample_weights(40_000, &mut r).unwrap();
        let w = post.network().params();
        let dim = post.indices().len();
        let mut emp = DMatrix::zeros(dim, dim);
        for d in &draws {
            let z = DVector::from_fn(dim, |a, _| d[post.indices()[a]] - w[post.indices()[a]]);
            emp.ger(1.0 / draws.len() as f64, &z, &z, 1.0);
        }
        let err = rel_frob(&emp, &sigma);
        println!("{}: sample covariance rel err {err:.3}", post.curvature().name());
        assert!(err < 0.03);
    }
}

#[test]
fn save_load_round_trip_predicts_identically() {
    let dir = std::env::temp_dir().join(format!("fspace-laplace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (x, y) = classification(10, 2, 3, 26);
    for s in every_structure(4) {
        let mut post =
            fit_with(mlp(2, vec![4], 3, 27), LikelihoodSpec::Categorical { classes: 3 }, &x, &y, s);
        post.set_predictive(Predictive::Nonlinear { samples: 5, seed: 1 }).unwrap();
        let path = dir.join(format!("{}.json", post.curvature().name()));
        post.save(&path).unwrap();
        let back: LaplacePosterior<Mlp> = LaplacePosterior::load(&path).unwrap();
        assert_eq!(back.predict(&x).unwrap(), post.predict(&x).unwrap());
        assert_eq!(back.predict_glm(&x).unwrap(), post.predict_glm(&x).unwrap());
    }
    // A CNN (its layer table is rebuilt on load).
    let net = tiny_cnn(2);
    let (xc, yc) = classification(3, 36, 3, 28);
    let post = fit_with(net, LikelihoodSpec::Categorical { classes: 3 }, &xc, &yc, Structure::Kfac);
    let path = dir.join("cnn.json");
    post.save(&path).unwrap();
    let back: LaplacePosterior<Cnn> = LaplacePosterior::load(&path).unwrap();
    assert_eq!(back.predict_glm(&xc).unwrap(), post.predict_glm(&xc).unwrap());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn temperature_scales_the_curvature_and_grid_searches_pick_the_best_value() {
    let net = mlp(1, vec![6], 1, 29);
    let (x, y) = regression(20, 1, 30);
    let (xv, yv) = regression(10, 1, 31);
    let mut post = fit_with(net, LikelihoodSpec::gaussian(0.2), &x, &y, Structure::full());
    // Var(T) with λ = T·λ₀ is Var(1)/T (the precision is T·(C + λ₀)).
    post.set_prior_precision(PriorPrecision::Scalar(0.5)).unwrap();
    let v1 = post.predict_glm(&xv).unwrap().var;
    post.set_temperature(4.0).unwrap();
    post.set_prior_precision(PriorPrecision::Scalar(2.0)).unwrap();
    let v4 = post.predict_glm(&xv).unwrap().var;
    assert!((&v1 / 4.0 - &v4).abs().max() < 1e-12 * v1.max());
    post.set_temperature(1.0).unwrap();
    let grid = [0.01, 0.1, 1.0, 10.0, 100.0];
    let table = post.gridsearch_prior_precision(&grid, &xv, &yv).unwrap();
    let best = table.iter().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
    assert_eq!(post.prior_precision()[0], best.0);
    let t_table = post.select_temperature(&[0.1, 1.0, 10.0], &xv, &yv).unwrap();
    let t_best = t_table.iter().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
    assert_eq!(post.temperature(), t_best.0);
    println!("λ grid {table:?}; T grid {t_table:?}");
}

/// The grid searches of KFAC, EKFAC and the diagonal structure share one set of layer statistics
/// among their candidates; each candidate's validation NLL must still be the bits of its own
/// `predictive_nll`. 300 validation points span two of the GLM predictive's 256-point chunks.
#[test]
fn grid_searches_sharing_the_statistics_give_each_candidates_own_bits() {
    fn check<N: Network + Clone>(
        post: &LaplacePosterior<N>,
        xv: &DMatrix<f64>,
        yv: &DVector<f64>,
        what: &str,
    ) {
        let grid = [0.3, 1.0, 30.0];
        let own = |set: &dyn Fn(&mut LaplacePosterior<N>, f64)| -> Vec<u64> {
            grid.iter()
                .map(|&v| {
                    let mut p = post.clone();
                    set(&mut p, v);
                    p.predictive_nll(xv, yv).unwrap().to_bits()
                })
                .collect()
        };
        let bits = |t: Vec<(f64, f64)>| t.iter().map(|(_, n)| n.to_bits()).collect::<Vec<_>>();
        let mut searched = post.clone();
        let lambdas = bits(searched.gridsearch_prior_precision(&grid, xv, yv).unwrap());
        assert_eq!(
            lambdas,
            own(&|p, v| p.set_prior_precision(PriorPrecision::Scalar(v)).unwrap()),
            "{what}: λ"
        );
        let mut searched = post.clone();
        let temperatures = bits(searched.select_temperature(&grid, xv, yv).unwrap());
        assert_eq!(temperatures, own(&|p, v| p.set_temperature(v).unwrap()), "{what}: T");
    }
    let (xc, yc) = classification(60, 36, 3, 40);
    let (xcv, ycv) = classification(300, 36, 3, 41);
    for s in [Structure::Kfac, Structure::Ekfac, Structure::Diag] {
        let post = fit_with(tiny_cnn(42), LikelihoodSpec::Categorical { classes: 3 }, &xc, &yc, s.clone());
        check(&post, &xcv, &ycv, &format!("CNN {s:?}"));
    }
    let (xr, yr) = regression(40, 2, 43);
    let (xrv, yrv) = regression(300, 2, 44);
    for s in [Structure::Kfac, Structure::Diag] {
        let post = fit_with(mlp(2, vec![5], 1, 45), LikelihoodSpec::gaussian(0.3), &xr, &yr, s.clone());
        check(&post, &xrv, &yrv, &format!("MLP {s:?}"));
    }
}

#[test]
fn bad_input_gives_typed_errors() {
    let net = mlp(2, vec![4], 1, 32);
    let (x, y) = regression(8, 2, 33);
    let g = LikelihoodSpec::gaussian(0.1);
    let too_big = Structure::Full(FullConfig { max_params: 10 });
    assert!(matches!(fit_v(net.clone(), g, &x, &y, &config(too_big)), Err(LaplaceError::TooLarge { .. })));
    // KFAC and last-layer on a network without layer structure (the Helmholtz net's outputs
    // are input-derivatives of two MLPs): Unsupported, named.
    let helm = HelmholtzNet::new(vec![4], Activation::Tanh, 0).unwrap();
    let xh = DMatrix::from_fn(5, 2, |i, j| (i + j) as f64 * 0.1);
    let yh = DVector::from_element(10, 0.1);
    let iso = LikelihoodSpec::IsotropicGaussian { sigma: 0.1, outputs: 2, learn: false };
    for s in [Structure::Kfac, Structure::Ekfac, Structure::last_layer()] {
        let e = fit_v(helm.clone(), iso, &xh, &yh, &config(s)).unwrap_err();
        assert!(matches!(e, LaplaceError::Unsupported { .. }), "{e}");
        println!("{e}");
    }
    // …while the Jacobian-based structures work on it.
    let post = fit_v(helm.clone(), iso, &xh, &yh, &config(Structure::full())).unwrap();
    assert_eq!(post.predict_glm(&xh).unwrap().var.ncols(), 2);
    // A scalar Gaussian does not fit a two-output network.
    assert!(matches!(
        fit_v(helm, g, &xh, &yh, &config(Structure::Diag)),
        Err(LaplaceError::Input(InputError::DimensionMismatch { .. })
            | LaplaceError::Core(CoreError::Input(InputError::DimensionMismatch { .. })))
    ));
    let bad = |c: LaplaceConfig| fit_v(net.clone(), g, &x, &y, &c);
    assert!(matches!(
        bad(LaplaceConfig { temperature: 0.0, ..config(Structure::Diag) }),
        Err(LaplaceError::Input(InputError::Invalid { what: "temperature", .. }))
    ));
    assert!(matches!(
        bad(LaplaceConfig { prior_precision: PriorPrecision::Scalar(-1.0), ..config(Structure::Diag) }),
        Err(LaplaceError::Input(InputError::Invalid { .. }))
    ));
    assert!(matches!(
        bad(LaplaceConfig {
            prior_precision: PriorPrecision::PerLayer(vec![1.0]),
            ..config(Structure::Diag)
        }),
        Err(LaplaceError::Input(InputError::DimensionMismatch { .. })
            | LaplaceError::Core(CoreError::Input(InputError::DimensionMismatch { .. })))
    ));
    assert!(matches!(
        bad(config(Structure::low_rank(0))),
        Err(LaplaceError::Input(InputError::Invalid { .. }))
    ));
    let mut xn = x.clone();
    xn[(0, 0)] = f64::NAN;
    assert!(matches!(
        fit_v(net.clone(), g, &xn, &y, &config(Structure::Diag)),
        Err(LaplaceError::Input(InputError::NonFinite { .. })
            | LaplaceError::Core(CoreError::Input(InputError::NonFinite { .. })))
    ));
    let mut yn = y.clone();
    yn[1] = f64::INFINITY;
    assert!(matches!(
        fit_v(net.clone(), g, &x, &yn, &config(Structure::Diag)),
        Err(LaplaceError::Input(InputError::NonFinite { .. })
            | LaplaceError::Core(CoreError::Input(InputError::NonFinite { .. })))
    ));
    assert!(matches!(
        fit_v(net.clone(), g, &x, &y.rows(0, 5).into_owned(), &config(Structure::Diag)),
        Err(LaplaceError::Input(InputError::DimensionMismatch { .. })
            | LaplaceError::Core(CoreError::Input(InputError::DimensionMismatch { .. })))
    ));
    assert!(matches!(
        fit_v(net.clone(), g, &DMatrix::zeros(0, 2), &DVector::zeros(0), &config(Structure::Diag)),
        Err(LaplaceError::Input(InputError::Empty { .. })
            | LaplaceError::Core(CoreError::Input(InputError::Empty { .. })))
    ));
    assert!(matches!(
        fit_v(net.clone(), LikelihoodSpec::gaussian(0.0), &x, &y, &config(Structure::Diag)),
        Err(LaplaceError::Core(_))
    ));
    let mut post = fit_v(net.clone(), g, &x, &y, &config(Structure::Diag)).unwrap();
    assert!(post.set_temperature(f64::NAN).is_err());
    assert!(post.set_prior_precision(PriorPrecision::Scalar(0.0)).is_err());
    assert!(post.predict_glm(&DMatrix::zeros(3, 5)).is_err());
    // KFAC / last-layer on a network without layer structure: Unsupported, named.
    let cnn = tiny_cnn(0);
    let (xc, yc) = classification(2, 36, 3, 34);
    let e = fit_v(
        cnn,
        LikelihoodSpec::Categorical { classes: 3 },
        &xc,
        &yc,
        &config(Structure::Full(FullConfig { max_params: 100 })),
    );
    assert!(matches!(e, Err(LaplaceError::TooLarge { structure: "full", .. })));
    let e = format!("{}", e.unwrap_err());
    assert!(e.contains("parameters") && e.contains("100"), "{e}");
    // Probabilities for a regression model are refused.
    assert!(post.class_probabilities(&x, &fspace_core::Link::Probit).is_err());
}

#[test]
fn conventions_match_laplace_torch() {
    // The GGN is summed over the data: duplicating every point doubles the curvature.
    let net = mlp(1, vec![5], 1, 40);
    let (x, y) = regression(12, 1, 41);
    let g = LikelihoodSpec::gaussian(0.2);
    let once = fit_with(net.clone(), g, &x, &y, Structure::full());
    let x2 = DMatrix::from_fn(24, 1, |i, _| x[(i % 12, 0)]);
    let y2 = DVector::from_fn(24, |i, _| y[i % 12]);
    let twice = fit_with(net.clone(), g, &x2, &y2, Structure::full());
    let err = rel_frob(&twice.curvature().to_dense(), &(once.curvature().to_dense() * 2.0));
    assert!(err < 1e-12, "summed GGN: {err}");
    // λ is a precision: with C = 0 (no data influence) the weight variance is 1/λ.
    let mut post = fit_with(net, g, &x, &y, Structure::Diag);
    post.set_prior_precision(PriorPrecision::Scalar(4.0)).unwrap();
    post.set_temperature(1e-12).unwrap();
    let draws = post.sample_weights(20_000, &mut rng(42)).unwrap();
    let w = post.network().params();
    let var = draws.iter().map(|d| (d[0] - w[0]).powi(2)).sum::<f64>() / draws.len() as f64;
    assert!((var - 0.25).abs() < 0.01, "prior variance {var} vs 1/λ = 0.25");
    // predict is f without noise; predict_y adds σ².
    post.set_temperature(1.0).unwrap();
    let f = post.predict(&x).unwrap();
    let yv = post.predict_y(&x).unwrap();
    assert!((&yv.var - f.var.add_scalar(0.04)).abs().max() < 1e-14);
}

#[test]
fn bernoulli_classification_and_link_approximations() {
    let net = mlp(2, vec![6], 1, 43);
    let (x, y) = classification(20, 2, 2, 44);
    let post = fit_with(net, LikelihoodSpec::Bernoulli, &x, &y, Structure::Kfac);
    let ggn = dense_ggn(post.network(), LikelihoodSpec::Bernoulli.build().unwrap().as_ref(), &x, &y);
    // KFAC of a one-output layer with one point would be exact; here check Bernoulli's
    // whitening through the diagonal, which is exact: fit Diag and compare with the dense GGN.
    let diag = fit_with(post.network().clone(), LikelihoodSpec::Bernoulli, &x, &y, Structure::Diag);
    let err = (diag.curvature().to_dense().diagonal() - ggn.diagonal()).norm() / ggn.diagonal().norm();
    assert!(err < 1e-12, "Bernoulli diagonal {err}");
    for link in [Link::Probit, Link::LaplaceBridge, Link::MonteCarlo { samples: 2000, seed: 46 }] {
        let p = post.class_probabilities(&x, &link).unwrap();
        assert_eq!(p.ncols(), 2);
        for i in 0..x.nrows() {
            assert!(
                (p.row(i).sum() - 1.0).abs() < 1e-12 && p.row(i).iter().all(|&v| (0.0..=1.0).contains(&v))
            );
        }
    }
    // Probit and MC agree to MC error on the GLM predictive.
    let pp = post.class_probabilities(&x, &Link::Probit).unwrap();
    let pm = post.class_probabilities(&x, &Link::MonteCarlo { samples: 20_000, seed: 47 }).unwrap();
    let diff = (&pp - &pm).abs().max();
    println!("Bernoulli probit vs MC max diff {diff:.4}");
    assert!(diff < 0.03);
    // The validation NLL of a grid search is the mean −log p(y).
    let nll = post.predictive_nll(&x, &y).unwrap();
    let manual = -(0..x.nrows()).map(|i| pp[(i, y[i] as usize)].ln()).sum::<f64>() / x.nrows() as f64;
    assert!((nll - manual).abs() < 1e-12);
}

mod invariants {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(12))]
        /// For every structure, any seed, λ and T: C is symmetric PSD, `P⁻¹ (P v) = v` and
        /// `log|P|` equals a dense Cholesky's.
        #[test]
        fn precision_solve_and_log_det_are_consistent(seed in 0u64..1000, lam in 0.05f64..20.0, t in 0.1f64..10.0) {
            let net = mlp(2, vec![4, 3], 2, seed);
            let (x, y) = classification(6, 2, 2, seed + 1);
            for s in every_structure(5) {
                let post = fit_with(net.clone(), LikelihoodSpec::Categorical { classes: 2 }, &x, &y, s);
                let c = post.curvature().to_dense();
                let dim = c.nrows();
                prop_assert!((&c - c.transpose()).abs().max() <= 1e-12 * c.abs().max().max(1e-300));
                let min_eig = c.clone().symmetric_eigen().eigenvalues.min();
                prop_assert!(min_eig >= -1e-10 * c.abs().max().max(1.0));
                let lamv = DVector::from_element(dim, lam);
                let p = &c * t + DMatrix::from_diagonal(&lamv);
                let v = DMatrix::from_fn(dim, 2, |i, j| ((i * 7 + j * 3) % 5) as f64 - 2.0);
                let back = post.curvature().solve(t, &lamv, &(&p * &v)).unwrap();
                prop_assert!((&back - &v).abs().max() < 1e-8 * (1.0 + v.abs().max()));
                let dense = 2.0 * p.cholesky().unwrap().l().diagonal().map(f64::ln).sum();
                let ld = post.curvature().log_det_precision(t, &lamv).unwrap();
                prop_assert!((ld - dense).abs() < 1e-8 * dense.abs().max(1.0));
            }
        }
    }
}

#[test]
fn kfc_factors_equal_their_definition_on_a_cnn_with_many_positions() {
    // G = Σᵢ Σ_t Σ_{o,o'} Hᵢ[o,o'] δ_{i,o,t} δ_{i,o',t}ᵀ / (n·T) and A = Σᵢ Σ_t ã ãᵀ from the
    // unit-cotangent statistics and the likelihood's Hessians (not through Hᵢ's factors).
    let net = tiny_cnn(7);
    let (x, y) = classification(3, 36, 3, 48);
    let lik = LikelihoodSpec::Categorical { classes: 3 };
    let post = fit_with(net.clone(), lik, &x, &y, Structure::Kfac);
    let h = lik.build().unwrap().nll_hessian(&net.forward(&x).unwrap(), &y).unwrap();
    let stats = net.kfac_statistics(&x, &vec![DMatrix::identity(3, 3); 3]).unwrap();
    let dense = post.curvature().to_dense();
    let mut o = 0;
    for (info, st) in net.layer_infos().iter().zip(&stats) {
        let t = info.positions();
        let mut g = DMatrix::zeros(info.fan_out, info.fan_out);
        let mut a = DMatrix::zeros(info.fan_in + 1, info.fan_in + 1);
        for i in 0..3 {
            for p in 0..t {
                let at = st.inputs.row(i * t + p).transpose().insert_row(info.fan_in, 1.0);
                a += &at * at.transpose();
                for c in 0..3 {
                    for c2 in 0..3 {
                        let dc = st.output_grads.row((i * 3 + c) * t + p).transpose();
                        let dc2 = st.output_grads.row((i * 3 + c2) * t + p).transpose();
                        g += dc * dc2.transpose() * h[i][(c, c2)];
                    }
                }
            }
        }
        g /= (3 * t) as f64;
        let expected = g.kronecker(&a);
        let n = info.n_params();
        let err = rel_frob(&dense.view((o, o), (n, n)).into_owned(), &expected);
        println!("KFC {} ({t} positions): factors vs definition rel err {err:.2e}", info.name);
        assert!(err < 1e-10);
        o += n;
    }
}

#[test]
fn last_layer_glm_covariances_equal_the_dense_jacobian_route() {
    // The last-layer fast path (one GEMM per output on the features) against J Σ Jᵀ formed from
    // the explicit last-layer Jacobian and the curvature's solve (`predict_joint`).
    let net = mlp(3, vec![6, 5], 4, 31);
    let (x, y) = classification(25, 3, 4, 32);
    let (xt, _) = classification(7, 3, 4, 33);
    let mut post = fit_with(net, LikelihoodSpec::Categorical { classes: 4 }, &x, &y, Structure::last_layer());
    post.set_prior_precision(PriorPrecision::Scalar(0.7)).unwrap();
    let covs = post.glm_covariances(&xt).unwrap();
    let (_, joint) = Posterior::predict_joint(&post, &xt).unwrap();
    let q = 4;
    for (i, c) in covs.iter().enumerate() {
        let dense = joint.view((i * q, i * q), (q, q)).into_owned();
        assert!(rel_frob(c, &dense) < 1e-10, "point {i}: {c} vs {dense}");
    }
}

#[test]
fn heteroscedastic_laplace_equals_the_dense_fisher_laplace_on_a_trained_toy() {
    // A 1 → 8 → 2 tanh net (mean, log-variance) trained by MAP on data whose noise grows with
    // |x|; every structure's curvature is checked against the dense Σᵢ Jᵢᵀ Fᵢ Jᵢ with the
    // Fisher blocks Fᵢ = diag(e^−ηᵢ, ½), and the full structure's predictive against the dense
    // J (GGN + λI)⁻¹ Jᵀ.
    let mut r = rng(40);
    let x: DMatrix<f64> = DMatrix::from_fn(40, 1, |_, _| r.gen_range(-2.0..2.0));
    let y = DVector::from_fn(40, |i, _| {
        x[(i, 0)].sin() + (0.05 + 0.3 * x[(i, 0)].abs()) * r.gen_range(-1.0..1.0)
    });
    let mut net = mlp(1, vec![8], 2, 41);
    let lik = LikelihoodSpec::HeteroscedasticGaussian;
    let mut built = lik.build().unwrap();
    let cfg = fspace_nn::TrainConfig {
        schedule: fspace_core::Schedule::epochs(300),
        batch_size: 40,
        learning_rate: 1e-2,
        ..Default::default()
    };
    let before = built.nll(&net.forward(&x).unwrap(), &y).unwrap();
    fspace_nn::train_map(&mut net, built.as_mut(), &x, &y, None, None, &cfg, |_| {}).unwrap();
    let after = built.nll(&net.forward(&x).unwrap(), &y).unwrap();
    assert!(after < before - 10.0, "MAP training lowered the NLL only from {before} to {after}");

    let ggn = dense_ggn(&net, built.as_ref(), &x, &y);
    // The Fisher blocks, written out independently of the likelihood's code.
    let f = net.forward(&x).unwrap();
    let j = net.jacobian(&x).unwrap();
    let mut by_hand = DMatrix::zeros(net.n_params(), net.n_params());
    for i in 0..x.nrows() {
        let ji = j.rows(2 * i, 2);
        let fisher = DMatrix::from_diagonal(&DVector::from_vec(vec![(-f[(i, 1)]).exp(), 0.5]));
        by_hand += ji.transpose() * fisher * ji;
    }
    assert!(rel_frob(&ggn, &by_hand) < 1e-13);

    let full = fit_with(net.clone(), lik, &x, &y, Structure::full());
    assert!(rel_frob(&restrict(&ggn, full.indices()), &full.curvature().to_dense()) < 1e-10);
    let diag = fit_with(net.clone(), lik, &x, &y, Structure::Diag);
    let d = restrict(&ggn, diag.indices()).diagonal();
    assert!((diag.curvature().to_dense().diagonal() - &d).norm() / d.norm() < 1e-12);

    let lam = 0.5;
    let mut post = full;
    post.set_prior_precision(PriorPrecision::Scalar(lam)).unwrap();
    let xt = DMatrix::from_column_slice(5, 1, &[-3.0, -1.0, 0.0, 1.0, 3.0]);
    let sigma = (&by_hand + DMatrix::identity(net.n_params(), net.n_params()) * lam).try_inverse().unwrap();
    let jt = net.jacobian(&xt).unwrap();
    let cov = &jt * sigma * jt.transpose();
    let pred = post.predict(&xt).unwrap();
    let ft = net.forward(&xt).unwrap();
    for i in 0..5 {
        for o in 0..2 {
            let v = cov[(2 * i + o, 2 * i + o)];
            assert!((pred.var[(i, o)] - v).abs() <= 1e-9 * v.max(1e-12), "var {} vs {v}", pred.var[(i, o)]);
        }
    }
    // y's predictive: one column, the mean output's variance plus E[e^η].
    let py = post.predict_y(&xt).unwrap();
    assert_eq!(py.mean.ncols(), 1);
    for i in 0..5 {
        let expected = cov[(2 * i, 2 * i)] + (ft[(i, 1)] + 0.5 * cov[(2 * i + 1, 2 * i + 1)]).exp();
        assert!((py.mean[(i, 0)] - ft[(i, 0)]).abs() < 1e-12);
        assert!((py.var[(i, 0)] - expected).abs() < 1e-9 * expected);
    }
    // The learned noise follows the data: wider at |x| = 2 than at 0.
    let edge = net.forward(&DMatrix::from_column_slice(2, 1, &[-1.9, 0.0])).unwrap();
    assert!(edge[(0, 1)] > edge[(1, 1)], "log-variance at -1.9: {} vs at 0: {}", edge[(0, 1)], edge[(1, 1)]);
    assert!(post.predictive_nll(&x, &y).unwrap().is_finite());
}

#[test]
fn last_layer_kfac_equals_the_dense_last_layer_laplace_for_a_one_output_gaussian_head() {
    // One output and a Gaussian likelihood: G = 1/σ² is a scalar, so the last layer's KFAC
    // G ⊗ A = (1/σ²) Σ φ̃φ̃ᵀ is its exact GGN — the dense last-layer Laplace.
    let net = mlp(2, vec![6, 5], 1, 50);
    let (x, y) = regression(30, 2, 51);
    let (xt, _) = regression(7, 2, 52);
    let lik = LikelihoodSpec::gaussian(0.3);
    let last = LaplaceConfig { weights: Weights::LastLayer, ..config(Structure::Kfac) };
    let mut kfac = fit_v(net.clone(), lik, &x, &y, &last).unwrap();
    let mut dense = fit_with(net.clone(), lik, &x, &y, Structure::last_layer());
    assert_eq!(kfac.indices(), dense.indices());
    assert_eq!(kfac.indices().len(), 6);
    assert!(rel_frob(&kfac.curvature().to_dense(), &dense.curvature().to_dense()) < 1e-12);
    for post in [&mut kfac, &mut dense] {
        post.set_prior_precision(PriorPrecision::Scalar(0.7)).unwrap();
        post.set_temperature(0.8).unwrap();
    }
    let (a, b) = (kfac.predict(&xt).unwrap(), dense.predict(&xt).unwrap());
    assert!(rel_frob(&a.var, &b.var) < 1e-10, "{:?} vs {:?}", a.var, b.var);
    assert_eq!(a.mean, b.mean);
    assert!(
        (kfac.log_marginal_likelihood().unwrap() - dense.log_marginal_likelihood().unwrap()).abs() < 1e-9
    );
    // Against the dense Jacobian route over the last layer's columns.
    let sigma = (kfac.curvature().to_dense() * 0.8 + DMatrix::identity(6, 6) * 0.7).try_inverse().unwrap();
    let js = net.jacobian(&xt).unwrap().select_columns(kfac.indices());
    let cov = &js * sigma * js.transpose();
    for i in 0..7 {
        assert!((a.var[(i, 0)] - cov[(i, i)]).abs() <= 1e-10 * cov[(i, i)]);
    }
    // EKFAC over the last layer matches too, diag is its diagonal, and the other structures say
    // they are not implemented.
    let ek = fit_v(net.clone(), lik, &x, &y, &LaplaceConfig { structure: Structure::Ekfac, ..last.clone() })
        .unwrap();
    assert!(rel_frob(&ek.curvature().to_dense(), &dense.curvature().to_dense()) < 1e-10);
    let diag = LaplaceConfig { structure: Structure::Diag, ..last.clone() };
    let d = fit_v(net.clone(), lik, &x, &y, &diag).unwrap();
    let want = DMatrix::from_diagonal(&dense.curvature().to_dense().diagonal());
    assert!(rel_frob(&d.curvature().to_dense(), &want) < 1e-12);
    let low_rank = LaplaceConfig { structure: Structure::low_rank(2), ..last.clone() };
    assert!(matches!(fit_v(net.clone(), lik, &x, &y, &low_rank), Err(LaplaceError::Unsupported { .. })));
    // With several outputs last-layer KFAC is an approximation of the last-layer GGN, and the
    // predictive still equals J_L Σ_KFAC J_Lᵀ.
    let multi = mlp(2, vec![6, 5], 3, 53);
    let (xc, yc) = classification(20, 2, 3, 54);
    let cat = LikelihoodSpec::categorical(3);
    let mut post = fit_v(multi.clone(), cat, &xc, &yc, &last).unwrap();
    post.set_prior_precision(PriorPrecision::Scalar(1.3)).unwrap();
    let sigma = (post.curvature().to_dense() + DMatrix::identity(18, 18) * 1.3).try_inverse().unwrap();
    let js = multi.jacobian(&xt).unwrap().select_columns(post.indices());
    let cov = &js * sigma * js.transpose();
    let covs = post.glm_covariances(&xt).unwrap();
    for i in 0..7 {
        let block = cov.view((3 * i, 3 * i), (3, 3)).into_owned();
        assert!((&covs[i] - &block).abs().max() <= 1e-10 * block.abs().max());
    }
    // Saved and loaded, the layer map survives.
    let path = std::env::temp_dir().join(format!("fspace-ll-kfac-{}.json", std::process::id()));
    post.save(&path).unwrap();
    let back: LaplacePosterior<Mlp> = LaplacePosterior::load(&path).unwrap();
    assert_eq!(back.predict(&xt).unwrap(), post.predict(&xt).unwrap());
    std::fs::remove_file(&path).ok();
}

#[test]
fn subnetwork_laplace_equals_the_dense_ggn_over_the_chosen_weights() {
    let net = mlp(2, vec![5, 4], 3, 60);
    let (x, y) = classification(15, 2, 3, 61);
    let (xt, _) = classification(6, 2, 3, 62);
    let lik = LikelihoodSpec::categorical(3);
    let p = net.n_params();
    let idx: Vec<usize> = (0..p).filter(|i| i % 3 == 1).collect();
    let cfg = LaplaceConfig { weights: Weights::Subnetwork(idx.clone()), ..config(Structure::full()) };
    let mut post = fit_v(net.clone(), lik, &x, &y, &cfg).unwrap();
    assert_eq!(post.indices(), &idx[..]);
    let ggn = dense_ggn(&net, lik.build().unwrap().as_ref(), &x, &y);
    assert!(rel_frob(&post.curvature().to_dense(), &restrict(&ggn, &idx)) < 1e-10);
    post.set_prior_precision(PriorPrecision::Scalar(0.9)).unwrap();
    let sigma = (restrict(&ggn, &idx) + DMatrix::identity(idx.len(), idx.len()) * 0.9).try_inverse().unwrap();
    let js = net.jacobian(&xt).unwrap().select_columns(&idx);
    let cov = &js * sigma * js.transpose();
    let (_, joint) = post.predict_joint(&xt).unwrap();
    assert!(rel_frob(&joint, &cov) < 1e-9);
    // Bad index sets are typed errors; other structures say they are not implemented.
    for bad in [vec![], vec![3, 3], vec![5, 2], vec![p]] {
        let cfg = LaplaceConfig { weights: Weights::Subnetwork(bad.clone()), ..config(Structure::full()) };
        let e = fit_v(net.clone(), lik, &x, &y, &cfg).unwrap_err();
        assert!(
            matches!(
                e,
                LaplaceError::Input(InputError::Empty { .. })
                    | LaplaceError::Input(InputError::Invalid { .. })
            ),
            "{bad:?}: {e}"
        );
    }
    let kfac = LaplaceConfig { weights: Weights::Subnetwork(idx), ..config(Structure::Kfac) };
    assert!(matches!(fit_v(net, lik, &x, &y, &kfac), Err(LaplaceError::Unsupported { .. })));
}

#[test]
fn kfac_with_separate_bias_blocks_drops_only_the_weight_bias_coupling() {
    // Coordinates of each layer are `[W | b]` row-major (kron_order): column `fan_in` of each
    // row is the bias. Separate blocks = the folded factors with the W–b cross terms of the
    // input factor removed: exact for one point up to those terms, and the bias block n·G is
    // the exact bias GGN for any number of points.
    let net = mlp(3, vec![5, 4], 1, 70);
    let lik = LikelihoodSpec::gaussian(0.4);
    let separate = |s: Structure| LaplaceConfig { kron_bias: KronBias::Separate, ..config(s) };
    let (x1, y1) = regression(1, 3, 71);
    let ggn1 = dense_ggn(&net, lik.build().unwrap().as_ref(), &x1, &y1);
    let post = fit_v(net.clone(), lik, &x1, &y1, &separate(Structure::Kfac)).unwrap();
    let mut expected = restrict(&ggn1, post.indices());
    let mut o = 0;
    let mut mask = DMatrix::zeros(expected.nrows(), expected.ncols());
    for info in net.layer_infos() {
        let c = info.fan_in + 1;
        for a in 0..info.n_params() {
            for b in 0..info.n_params() {
                let (bias_a, bias_b) = (a % c == info.fan_in, b % c == info.fan_in);
                if bias_a == bias_b {
                    mask[(o + a, o + b)] = 1.0;
                }
            }
        }
        o += info.n_params();
    }
    expected.component_mul_assign(&mask);
    assert!(rel_frob(&post.curvature().to_dense(), &expected) < 1e-10);

    // Many points: each bias block is exact.
    let (x, y) = regression(25, 3, 72);
    let ggn = dense_ggn(&net, lik.build().unwrap().as_ref(), &x, &y);
    for s in [Structure::Kfac, Structure::Ekfac] {
        let post = fit_v(net.clone(), lik, &x, &y, &separate(s)).unwrap();
        let dense = post.curvature().to_dense();
        let mut o = 0;
        for info in net.layer_infos() {
            let c = info.fan_in + 1;
            let local: Vec<usize> = (0..info.fan_out).map(|r| o + r * c + info.fan_in).collect();
            let flat: Vec<usize> = local.iter().map(|&i| post.indices()[i]).collect();
            let err = rel_frob(&restrict(&dense, &local), &restrict(&ggn, &flat));
            assert!(err < 1e-10, "{} bias block of {}: {err:e}", post.curvature().name(), info.name);
            o += info.n_params();
        }
    }
    // The folded default differs (it couples W and b), and predictions still match J Σ Jᵀ.
    let folded = fit_v(net.clone(), lik, &x, &y, &config(Structure::Kfac)).unwrap();
    let mut sep = fit_v(net.clone(), lik, &x, &y, &separate(Structure::Kfac)).unwrap();
    assert!(rel_frob(&folded.curvature().to_dense(), &sep.curvature().to_dense()) > 1e-3);
    let (xt, _) = regression(5, 3, 73);
    let err = check_glm(&mut sep, &xt, &[0.5, 1.5, 3.0], true);
    assert!(err < 1e-9, "{err:e}");
}

/// The sampled posterior at `(λ, T)` from `samples` draws and `em_steps` EM updates.
fn fit_sampled(
    net: &Mlp,
    lik: LikelihoodSpec,
    x: &DMatrix<f64>,
    y: &DVector<f64>,
    t: f64,
    cfg: SampledConfig,
) -> LaplacePosterior<Mlp> {
    let config = LaplaceConfig {
        structure: Structure::Sampled(cfg),
        temperature: t,
        prior_precision: PriorPrecision::Scalar(1.0),
        ..config(Structure::Diag)
    };
    fit_v(net.clone(), lik, x, y, &config).unwrap()
}

#[test]
fn sampled_laplace_has_the_posterior_covariance_and_em_finds_the_evidence_optimum() {
    let net = mlp(2, vec![5], 3, 40);
    let (x, y) = classification(30, 2, 3, 41);
    let (xt, _) = classification(8, 2, 3, 42);
    let (xr, yr) = regression(25, 2, 43);
    let reg_net = mlp(2, vec![6], 1, 44);
    let cases = [
        (&net, LikelihoodSpec::Categorical { classes: 3 }, &x, &y, 1.0, SampledPreconditioner::Kfac),
        (&net, LikelihoodSpec::Categorical { classes: 3 }, &x, &y, 1.0, SampledPreconditioner::Diag),
        (&net, LikelihoodSpec::Categorical { classes: 3 }, &x, &y, 1.0, SampledPreconditioner::LowRank(8)),
        (&reg_net, LikelihoodSpec::gaussian(0.3), &xr, &yr, 0.5, SampledPreconditioner::Identity),
    ];
    for (net, lik, x, y, t, preconditioner) in cases {
        // The exact reference: the full GGN's evidence optimum over one λ, at T.
        let mut full = fit_with(net.clone(), lik, x, y, Structure::full());
        full.set_temperature(t).unwrap();
        full.optimize_prior_precision(&MarglikConfig::default()).unwrap();
        let lam = full.prior_precision()[0];
        let cfg =
            SampledConfig { samples: 8_000, em_steps: 25, tol: 1e-8, preconditioner, ..Default::default() };
        let post = fit_sampled(net, lik, x, y, t, cfg);
        let lam_s = post.prior_precision()[0];
        let lam_err = (lam_s - lam).abs() / lam;
        // The draws' second moment against the dense (T·GGN + λI)⁻¹ at EM's λ.
        let ggn = dense_ggn(net, lik.build().unwrap().as_ref(), x, y);
        let p = ggn.nrows();
        let sigma = (ggn * t + DMatrix::identity(p, p) * lam_s).try_inverse().unwrap();
        let cov_err = rel_frob(&post.curvature().to_dense(), &sigma);
        // GLM variances against the full posterior at the same λ.
        full.set_prior_precision(PriorPrecision::Scalar(lam_s)).unwrap();
        let (exact, sampled) = (full.glm_covariances(&xt).unwrap(), post.glm_covariances(&xt).unwrap());
        let var_err = exact
            .iter()
            .zip(&sampled)
            .map(|(e, s)| (e.diagonal() - s.diagonal()).abs().max() / e.diagonal().max())
            .fold(0.0, f64::max);
        let report = post.report();
        println!(
            "{preconditioner:?}, T = {t}: λ EM {lam_s:.4} vs evidence optimum {lam:.4} (rel {lam_err:.1e}); \
             Σ rel err {cov_err:.3}; GLM variance rel err {var_err:.3}; {} EM steps, products {:?}",
            report.em_prior_precisions.len(),
            report.cg_products
        );
        assert!(lam_err < 0.03, "λ {lam_s} vs {lam}");
        // Monte-Carlo error of 8 000 draws: ≈ 0.06 here (0.037 at 20 000).
        assert!(cov_err < 0.1 && var_err < 0.08, "Σ {cov_err}, variances {var_err}");
        assert_eq!(report.em_prior_precisions.len(), 25);
        assert_eq!(report.cg_products.len(), 26);
    }
}

#[test]
fn sampled_laplace_is_reproducible_round_trips_and_refuses_other_priors() {
    let net = mlp(2, vec![4], 3, 50);
    let (x, y) = classification(20, 2, 3, 51);
    let lik = LikelihoodSpec::Categorical { classes: 3 };
    let cfg = SampledConfig { samples: 16, em_steps: 3, ..Default::default() };
    let post = fit_sampled(&net, lik, &x, &y, 1.0, cfg.clone());
    let again = fit_sampled(&net, lik, &x, &y, 1.0, cfg.clone());
    assert_eq!(post.curvature(), again.curvature());
    assert_eq!(post.prior_precision(), again.prior_precision());
    let other_seed = fit_sampled(&net, lik, &x, &y, 1.0, SampledConfig { seed: 1, ..cfg.clone() });
    assert_ne!(post.curvature(), other_seed.curvature());

    let dir = std::env::temp_dir().join(format!("fspace-sampled-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sampled.json");
    post.save(&path).unwrap();
    let back: LaplacePosterior<Mlp> = LaplacePosterior::load(&path).unwrap();
    assert_eq!(back.predict_glm(&x).unwrap(), post.predict_glm(&x).unwrap());
    std::fs::remove_dir_all(&dir).ok();

    // The draws belong to one (λ, T): the evidence, another λ or T are typed errors.
    let unsupported = |r: Result<(), LaplaceError>| matches!(r, Err(LaplaceError::Unsupported { .. }));
    assert!(unsupported(post.log_marginal_likelihood().map(|_| ())));
    let mut moved = post.clone();
    moved.set_prior_precision(PriorPrecision::Scalar(post.prior_precision()[0] * 2.0)).unwrap();
    assert!(unsupported(moved.glm_covariances(&x).map(|_| ())));
    let mut hot = post.clone();
    hot.set_temperature(2.0).unwrap();
    assert!(unsupported(hot.sample_weights(3, &mut rng(0)).map(|_| ())));
    let per_layer = LaplaceConfig {
        structure: Structure::Sampled(cfg.clone()),
        prior_precision: PriorPrecision::PerLayer(vec![1.0, 1.0]),
        ..config(Structure::Diag)
    };
    assert!(unsupported(fit_v(net.clone(), lik, &x, &y, &per_layer).map(|_| ())));
    let last = LaplaceConfig {
        structure: Structure::Sampled(cfg.clone()),
        weights: Weights::LastLayer,
        ..config(Structure::Diag)
    };
    assert!(unsupported(fit_v(net.clone(), lik, &x, &y, &last).map(|_| ())));
    let zero = LaplaceConfig {
        structure: Structure::Sampled(SampledConfig { samples: 0, ..cfg.clone() }),
        ..config(Structure::Diag)
    };
    assert!(matches!(
        fit_v(net.clone(), lik, &x, &y, &zero),
        Err(LaplaceError::Input(InputError::Invalid { .. }))
    ));
    let starved = LaplaceConfig {
        structure: Structure::Sampled(SampledConfig {
            max_iterations: 1,
            tol: 1e-12,
            preconditioner: SampledPreconditioner::Identity,
            ..cfg
        }),
        ..config(Structure::Diag)
    };
    assert!(matches!(
        fit_v(net, lik, &x, &y, &starved),
        Err(LaplaceError::Linalg(fspace_linalg::LinalgError::NoConvergence { .. }))
    ));
}

/// An EM record (`SampledConfig::em_checkpoint`) lets a sampled fit continue from its last
/// recorded λ: the steps before agree exactly, the steps after to the solves' tolerance, and a
/// record of another fit or a damaged one is a typed error naming the file.
#[test]
fn sampled_laplace_continues_from_its_em_record_and_refuses_another_fit_s() {
    let net = mlp(2, vec![4], 3, 60);
    let (x, y) = classification(20, 2, 3, 61);
    let lik = LikelihoodSpec::Categorical { classes: 3 };
    let cfg = SampledConfig { samples: 16, em_steps: 5, tol: 1e-10, ..Default::default() };
    let whole = fit_sampled(&net, lik, &x, &y, 1.0, cfg.clone());
    let lam = whole.report().em_prior_precisions.clone();
    assert_eq!(lam.len(), 5);

    let dir = std::env::temp_dir().join(format!("fspace-sampled-em-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("em.json");
    let recorded = SampledConfig { em_checkpoint: Some(file.clone()), ..cfg.clone() };
    // An "interrupted" fit: two steps recorded, exactly the uninterrupted fit's first two.
    let first = fit_sampled(&net, lik, &x, &y, 1.0, SampledConfig { em_steps: 2, ..recorded.clone() });
    assert_eq!(first.report().em_prior_precisions, lam[..2]);
    let record: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(record["prior_precisions"].as_array().unwrap().len(), 2);

    // Continued: the recorded steps kept, the rest from a cold solve, equal to the tolerance.
    let resumed = fit_sampled(&net, lik, &x, &y, 1.0, recorded.clone());
    let report = resumed.report();
    assert_eq!(report.em_prior_precisions[..2], lam[..2]);
    for (a, b) in report.em_prior_precisions.iter().zip(&lam) {
        assert!((a - b).abs() <= 1e-6 * b, "λ {a} vs uninterrupted {b}");
    }
    assert_eq!(report.cg_products.len(), whole.report().cg_products.len());
    assert_eq!(report.cg_products[..2], first.report().cg_products[..2]);
    // Its cost counts the two recorded steps' seconds, which a fresh fit does not have.
    let step_seconds: f64 = record["seconds"].as_array().unwrap().iter().map(|s| s.as_f64().unwrap()).sum();
    assert!(step_seconds > 0.0 && report.em_recorded_seconds == step_seconds);
    assert_eq!((whole.report().em_recorded_seconds, first.report().em_recorded_seconds), (0.0, 0.0));
    // An empty record counts +0 s, not the −0.0 an empty f64 sum gives.
    assert!(first.report().em_recorded_seconds.is_sign_positive());
    let (cr, cw) = (resumed.glm_covariances(&x).unwrap(), whole.glm_covariances(&x).unwrap());
    for (r, w) in cr.iter().zip(&cw) {
        assert!((r - w).abs().max() <= 1e-6 * w.abs().max(), "draws' covariance moved");
    }
    // Every step recorded: only the final solve runs, at the same λ.
    let done = fit_sampled(&net, lik, &x, &y, 1.0, recorded.clone());
    assert_eq!(done.report().em_prior_precisions, report.em_prior_precisions);
    assert_eq!(done.prior_precision(), resumed.prior_precision());

    // Another fit's record: refused, naming the field that differs.
    let other = LaplaceConfig {
        structure: Structure::Sampled(SampledConfig { seed: 7, ..recorded.clone() }),
        temperature: 1.0,
        prior_precision: PriorPrecision::Scalar(1.0),
        ..config(Structure::Diag)
    };
    let err = fit_v(net.clone(), lik, &x, &y, &other).unwrap_err();
    assert!(matches!(err, LaplaceError::EmCheckpoint { .. }), "{err}");
    assert!(
        err.to_string().contains("seed: 0 there, 7 here") && err.to_string().contains("em.json"),
        "{err}"
    );
    let moved_net = mlp(2, vec![4], 3, 62);
    let err = fit_v(
        moved_net,
        lik,
        &x,
        &y,
        &LaplaceConfig { structure: Structure::Sampled(recorded.clone()), ..other.clone() },
    )
    .unwrap_err();
    assert!(err.to_string().contains("fingerprint"), "{err}");
    // A record whose step took negative seconds is not a record of a run.
    let mut negative = record.clone();
    negative["seconds"][0] = serde_json::json!(-4.0);
    std::fs::write(&file, negative.to_string()).unwrap();
    let sampled = |cfg: SampledConfig| LaplaceConfig {
        structure: Structure::Sampled(cfg),
        prior_precision: PriorPrecision::Scalar(1.0),
        ..config(Structure::Diag)
    };
    let err = fit_v(net.clone(), lik, &x, &y, &sampled(SampledConfig { em_steps: 2, ..recorded.clone() }))
        .unwrap_err();
    assert!(err.to_string().contains("-4 seconds"), "{err}");
    std::fs::write(&file, "{ not json").unwrap();
    let err =
        fit_v(net.clone(), lik, &x, &y, &LaplaceConfig { structure: Structure::Sampled(recorded), ..other })
            .unwrap_err();
    assert!(err.to_string().contains("is not a sampled-fit EM record"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `fit_observed` reports each pass over the data chunk by chunk (points folded so far, out of
/// `n`) and fits exactly what `fit` fits.
#[test]
fn fit_observed_reports_every_pass_over_the_data_and_fits_the_same_posterior() {
    let (x, y) = regression(10, 2, 41);
    let ym = DMatrix::from_column_slice(10, 1, y.as_slice());
    let data = Data::new(&x, &ym).unwrap();
    let lik = LikelihoodSpec::gaussian(0.3);
    let probe = DMatrix::from_fn(4, 2, |i, j| 0.3 * i as f64 - 0.2 * j as f64);
    // (structure, number of passes: exact, or at least this many for low rank's Lanczos).
    let cases = [
        (Structure::Diag, 1, true),
        (Structure::full(), 1, true),
        (Structure::Kfac, 1, true),
        (Structure::Ekfac, 2, true),
        (Structure::low_rank(3), 2, false),
    ];
    for (structure, passes, exact) in cases {
        let name = structure.name();
        let cfg = config(structure);
        let mut seen: Vec<(usize, usize)> = Vec::new();
        let mut observer = |p: &fspace_core::Progress| {
            assert!(p.loss.is_none() && p.validation.is_none(), "{name}");
            seen.push((p.step, p.total));
        };
        let observed = fspace_laplace::fit_observed(mlp(2, vec![4], 1, 3), lik, &data, &cfg, &mut observer)
            .unwrap()
            .posterior;
        assert!(seen.iter().all(|&(_, total)| total == 10), "{name}: {seen:?}");
        // Chunks of 3 points: every pass reports 3, 6, 9, 10.
        let pass: Vec<usize> = vec![3, 6, 9, 10];
        assert_eq!(seen.len() % pass.len(), 0, "{name}: {seen:?}");
        for chunk in seen.chunks(pass.len()) {
            assert_eq!(chunk.iter().map(|s| s.0).collect::<Vec<_>>(), pass, "{name}");
        }
        let n_passes = seen.len() / pass.len();
        assert!(if exact { n_passes == passes } else { n_passes >= passes }, "{name}: {n_passes} passes");
        let plain = fit(mlp(2, vec![4], 1, 3), lik, &data, &cfg).unwrap().posterior;
        let (a, b) = (observed.predict(&probe).unwrap(), plain.predict(&probe).unwrap());
        assert_eq!(a.var, b.var, "{name}");
    }
}

/// An MLP seen through its products only: no layer statistics, and a Jacobian that must never
/// be formed; every reverse pass is on one point with at most `max_columns` cotangents.
#[derive(Clone)]
struct ProductsOnly {
    net: Mlp,
    max_columns: usize,
}

impl Network for ProductsOnly {
    delegate_required_to_net!();
    fn vjp_columns(&self, x: &DMatrix<f64>, l: &DMatrix<f64>) -> fspace_nn::Result<DMatrix<f64>> {
        assert!(
            x.nrows() == 1 && l.ncols() <= self.max_columns,
            "{} points, {} columns",
            x.nrows(),
            l.ncols()
        );
        self.net.vjp_columns(x, l)
    }
    fn jacobian(&self, _: &DMatrix<f64>) -> fspace_nn::Result<DMatrix<f64>> {
        panic!("the diagonal formed a Jacobian");
    }
}

#[test]
fn the_diagonal_without_layer_statistics_is_jacobian_free_and_equals_the_dense_ggn() {
    // Three classes (Hᵢ a full block, k = 3 whitened rows per point), chunks of 3 points.
    let net = mlp(2, vec![4, 3], 3, 1);
    let (x, y) = classification(7, 2, 3, 2);
    let lik = LikelihoodSpec::Categorical { classes: 3 };
    let want = dense_ggn(&net, lik.build().unwrap().as_ref(), &x, &y).diagonal();
    let wrapped = ProductsOnly { net: net.clone(), max_columns: 3 };
    assert!(wrapped.layer_infos().is_empty());
    let diag = fit_with(wrapped, lik, &x, &y, Structure::Diag);
    let got = diag.curvature().to_dense().diagonal();
    let err = (&got - &want).norm() / want.norm();
    println!("Jacobian-free diag rel err {err:.2e}");
    assert!(err < 1e-12);
    // The layer-statistics route (the MLP itself) agrees with it.
    let native = fit_with(net, lik, &x, &y, Structure::Diag).curvature().to_dense().diagonal();
    assert!((&got - &native).norm() / native.norm() < 1e-12);
}

/// An MLP that sums its own Kronecker factors ([`Network::kfac_factor_sums`], as a torch model
/// does on its side), chunk by chunk with plain products, and records the points of each call;
/// `wrong_shapes` makes it return a layer's sums at the wrong size.
#[derive(Clone)]
struct SelfSumming {
    net: Mlp,
    calls: std::sync::Arc<std::sync::Mutex<Vec<(usize, usize)>>>,
    wrong_shapes: bool,
}

impl Network for SelfSumming {
    delegate_required_to_net!();
    fn layer_infos(&self) -> Vec<fspace_nn::LayerInfo> {
        self.net.layer_infos()
    }
    fn kfac_statistics(
        &self,
        x: &DMatrix<f64>,
        factors: &[DMatrix<f64>],
    ) -> fspace_nn::Result<Vec<fspace_nn::LayerStatistics>> {
        self.net.kfac_statistics(x, factors)
    }
    fn kfac_factor_sums(
        &self,
        x: &DMatrix<f64>,
        factors: &[DMatrix<f64>],
        chunk: usize,
    ) -> fspace_nn::Result<Option<Vec<fspace_nn::KfacFactorSums>>> {
        self.calls.lock().unwrap().push((x.nrows(), chunk));
        let infos = self.net.layer_infos();
        let mut sums: Vec<fspace_nn::KfacFactorSums> =
            infos.iter().map(fspace_nn::KfacFactorSums::zeros).collect();
        for s in (0..x.nrows()).step_by(chunk) {
            let l = chunk.min(x.nrows() - s);
            let stats = self.net.kfac_statistics(&x.rows(s, l).into_owned(), &factors[s..s + l])?;
            for (total, st) in sums.iter_mut().zip(&stats) {
                total.add(&fspace_nn::KfacFactorSums {
                    input_gram: st.inputs.transpose() * &st.inputs,
                    input_sum: st.inputs.row_sum().transpose(),
                    input_rows: st.inputs.nrows(),
                    grad_gram: st.output_grads.transpose() * &st.output_grads,
                });
            }
        }
        if self.wrong_shapes {
            sums[1].grad_gram = DMatrix::zeros(1, 1);
        }
        Ok(Some(sums))
    }
}

#[test]
fn factor_sums_from_the_network_give_the_statistics_posterior_in_groups_of_chunks() {
    // 35 points in chunks of 3: 12 chunks, so the network is asked for its sums 6 times, two
    // chunks (6 points) a call, and the progress hook hears after each call.
    let (x, y) = classification(35, 2, 3, 90);
    let net = mlp(2, vec![6, 5], 3, 91);
    let lik = LikelihoodSpec::categorical(3);
    let ym = DMatrix::from_column_slice(35, 1, y.as_slice());
    let data = Data::new(&x, &ym).unwrap();
    let probe = DMatrix::from_fn(4, 2, |i, j| 0.4 * i as f64 - 0.3 * j as f64);
    for (structure, bias) in [
        (Structure::Kfac, KronBias::Folded),
        (Structure::Kfac, KronBias::Separate),
        (Structure::Ekfac, KronBias::Folded),
    ] {
        let cfg = LaplaceConfig { kron_bias: bias, ..config(structure.clone()) };
        let calls = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let summing = SelfSumming { net: net.clone(), calls: calls.clone(), wrong_shapes: false };
        let mut seen = Vec::new();
        let mut observer = |p: &fspace_core::Progress| seen.push(p.step);
        let own = fspace_laplace::fit_observed(summing, lik, &data, &cfg, &mut observer).unwrap().posterior;
        let plain = fit(net.clone(), lik, &data, &cfg).unwrap().posterior;
        let what = format!("{} {bias:?}", structure.name());
        assert_eq!(*calls.lock().unwrap(), vec![(6, 3), (6, 3), (6, 3), (6, 3), (6, 3), (5, 3)], "{what}");
        // The factor pass reports per call; EKFAC's second pass per chunk.
        assert_eq!(seen[..6], [6, 12, 18, 24, 30, 35], "{what}");
        let err = rel_frob(&own.curvature().to_dense(), &plain.curvature().to_dense());
        assert!(err < 1e-12, "{what}: {err:e}");
        let (a, b) = (own.predict(&probe).unwrap(), plain.predict(&probe).unwrap());
        assert!(rel_frob(&a.var, &b.var) < 1e-12 && rel_frob(&a.mean, &b.mean) < 1e-14, "{what}");
    }
    let bad = SelfSumming { net, calls: Default::default(), wrong_shapes: true };
    let err = fit(bad, lik, &data, &config(Structure::Kfac)).err().expect("wrong shapes refused");
    let text = err.to_string();
    assert!(text.contains("wrong shapes for layer") && text.contains("fan_out 5"), "{text}");
}

/// Rows `[s, e)` of a point-major target vector with `t` targets per point, as an `n × t` matrix.
fn target_rows(y: &DVector<f64>, t: usize, s: usize, e: usize) -> DMatrix<f64> {
    DMatrix::from_fn(e - s, t, |i, j| y[(s + i) * t + j])
}

/// The streamed fit ([`LaplaceSums`] over uneven batches, and two halves merged) against the
/// in-memory fit, for every streamable structure and subset: the same curvature, evidence and
/// GLM covariances to rounding.
#[test]
fn a_streamed_fit_equals_the_in_memory_fit_for_every_streamable_structure() {
    let net = mlp(2, vec![5, 4], 3, 41);
    let (x, yc) = classification(37, 2, 3, 42);
    let (xt, _) = classification(6, 2, 3, 43);
    let yr = DVector::from_fn(37 * 3, |i, _| (i as f64 * 0.37).sin());
    let sub = vec![1, 4, 9, 17, 30, 31, 50];
    let cases: Vec<(Structure, Weights, KronBias)> = vec![
        (Structure::Diag, Weights::All, KronBias::Folded),
        (Structure::Diag, Weights::LastLayer, KronBias::Folded),
        (Structure::Diag, Weights::Subnetwork(sub.clone()), KronBias::Folded),
        (Structure::Kfac, Weights::All, KronBias::Folded),
        (Structure::Kfac, Weights::All, KronBias::Separate),
        (Structure::Kfac, Weights::LastLayer, KronBias::Separate),
        (Structure::full(), Weights::All, KronBias::Folded),
        (Structure::full(), Weights::LastLayer, KronBias::Folded),
        (Structure::full(), Weights::Subnetwork(sub.clone()), KronBias::Folded),
        (Structure::last_layer(), Weights::All, KronBias::Folded),
    ];
    let likelihoods = [
        (LikelihoodSpec::categorical(3), yc.clone(), 1usize),
        (LikelihoodSpec::IsotropicGaussian { sigma: 0.3, outputs: 3, learn: false }, yr.clone(), 3usize),
    ];
    for (structure, weights, kron_bias) in cases {
        for (lik, y, t) in &likelihoods {
            let config = LaplaceConfig {
                structure: structure.clone(),
                weights: weights.clone(),
                kron_bias,
                chunk_points: 4,
                ..Default::default()
            };
            let whole = fit_v(net.clone(), *lik, &x, y, &config).unwrap();
            let what = format!("{} {:?} {:?} {:?}", structure.name(), weights, kron_bias, lik);
            // Uneven batches, one of them empty.
            let bounds = [0, 5, 5, 16, 30, 37];
            let batches = bounds
                .windows(2)
                .map(|w| (x.rows(w[0], w[1] - w[0]).into_owned(), target_rows(y, *t, w[0], w[1])));
            let streamed = fit_batches(net.clone(), *lik, batches, &config).unwrap().posterior;
            // Two halves summed apart, then merged.
            let mut a = LaplaceSums::new(&net, *lik, &config).unwrap();
            let mut b = LaplaceSums::new(&net, *lik, &config).unwrap();
            a.add(&net, &x.rows(0, 20).into_owned(), &target_rows(y, *t, 0, 20)).unwrap();
            b.add(&net, &x.rows(20, 17).into_owned(), &target_rows(y, *t, 20, 37)).unwrap();
            // The same halves as flat vectors summed element-wise (an all-reduce over two
            // processes), read back into fresh sums: the merge, bit for bit.
            let (fa, fb) = (a.to_flat(), b.to_flat());
            let reduced: Vec<f64> = fa.iter().zip(&fb).map(|(u, v)| u + v).collect();
            let mut c = LaplaceSums::new(&net, *lik, &config).unwrap();
            c.set_flat(&reduced).unwrap();
            assert!(c.set_flat(&reduced[1..]).is_err(), "{what}: a shorter vector");
            let mut bad = reduced.clone();
            *bad.last_mut().unwrap() = 2.5;
            assert!(c.set_flat(&bad).is_err(), "{what}: a fractional count");
            a.merge(&b).unwrap();
            assert_eq!(a.n_data(), 37);
            assert_eq!((c.n_data(), c.to_flat()), (37, a.to_flat()), "{what}");
            let merged = a.finish(net.clone()).unwrap().posterior;
            for post in [&streamed, &merged] {
                assert_eq!(post.indices(), whole.indices(), "{what}");
                let err = rel_frob(&post.curvature().to_dense(), &whole.curvature().to_dense());
                assert!(err < 1e-10, "{what}: curvature rel err {err:.2e}");
                let (e1, e2) =
                    (post.log_marginal_likelihood().unwrap(), whole.log_marginal_likelihood().unwrap());
                assert!((e1 - e2).abs() < 1e-10 * e2.abs().max(1.0), "{what}: evidence {e1} vs {e2}");
                for (c1, c2) in
                    post.glm_covariances(&xt).unwrap().iter().zip(whole.glm_covariances(&xt).unwrap())
                {
                    assert!(rel_frob(c1, &c2) < 1e-9, "{what}: GLM covariance");
                }
            }
        }
    }
}

/// An MLP that counts its passes over the data: `forward`, `last_layer_features`, and
/// `forward_with_last_layer_features` (both from one pass, as a torch model's callbacks do).
#[derive(Clone)]
struct CountingPasses {
    net: Mlp,
    passes: std::sync::Arc<[std::sync::atomic::AtomicUsize; 3]>,
}

impl CountingPasses {
    fn count(&self, which: usize) {
        self.passes[which].fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    fn take(&self) -> [usize; 3] {
        [0, 1, 2].map(|i| self.passes[i].swap(0, std::sync::atomic::Ordering::SeqCst))
    }
}

impl Network for CountingPasses {
    delegate_shape_to_net!();
    fn forward(&self, x: &DMatrix<f64>) -> fspace_nn::Result<DMatrix<f64>> {
        self.count(0);
        self.net.forward(x)
    }
    fn vjp(&self, x: &DMatrix<f64>, v: &DMatrix<f64>) -> fspace_nn::Result<DVector<f64>> {
        self.net.vjp(x, v)
    }
    fn jvp(&self, x: &DMatrix<f64>, u: &DVector<f64>) -> fspace_nn::Result<DMatrix<f64>> {
        self.net.jvp(x, u)
    }
    fn layer_infos(&self) -> Vec<fspace_nn::LayerInfo> {
        self.net.layer_infos()
    }
    fn last_layer_features(&self, x: &DMatrix<f64>) -> fspace_nn::Result<DMatrix<f64>> {
        self.count(1);
        self.net.last_layer_features(x)
    }
    fn forward_with_last_layer_features(
        &self,
        x: &DMatrix<f64>,
    ) -> fspace_nn::Result<(DMatrix<f64>, DMatrix<f64>)> {
        self.count(2);
        self.net.forward_with_last_layer_features(x)
    }
}

/// A last-layer fit (last-layer weights under diag, KFAC or full, or the `last_layer`
/// structure) makes one pass per chunk that returns the outputs and the last layer's inputs
/// together — in memory and streamed — and gives the posterior of the two-pass fit, bit for bit;
/// its GLM predictive takes the mean and the covariances from one pass too.
#[test]
fn a_last_layer_fit_makes_one_pass_over_the_data() {
    let net = mlp(2, vec![5, 4], 3, 61);
    let (x, y) = classification(37, 2, 3, 62);
    let lik = LikelihoodSpec::categorical(3);
    let counting = CountingPasses { net: net.clone(), passes: Default::default() };
    let cases = [
        (Structure::Diag, Weights::LastLayer),
        (Structure::Kfac, Weights::LastLayer),
        (Structure::full(), Weights::LastLayer),
        (Structure::last_layer(), Weights::All),
    ];
    for (structure, weights) in cases {
        let what = format!("{} {:?}", structure.name(), weights);
        let config = LaplaceConfig { structure, weights, chunk_points: 4, ..Default::default() };
        let plain = fit_v(net.clone(), lik, &x, &y, &config).unwrap();
        counting.take();
        let one_pass = fit_v(counting.clone(), lik, &x, &y, &config).unwrap();
        // 37 points in chunks of 4: ten passes, each returning both.
        assert_eq!(counting.take(), [0, 0, 10], "{what}: [forward, features, both] calls");
        assert_eq!(one_pass.curvature().to_dense(), plain.curvature().to_dense(), "{what}");
        assert_eq!(one_pass.log_marginal_likelihood().unwrap(), plain.log_marginal_likelihood().unwrap());
        let mut sums = LaplaceSums::new(&counting, lik, &config).unwrap();
        sums.add(&counting, &x.rows(0, 20).into_owned(), &target_rows(&y, 1, 0, 20)).unwrap();
        sums.add(&counting, &x.rows(20, 17).into_owned(), &target_rows(&y, 1, 20, 37)).unwrap();
        assert_eq!(counting.take(), [0, 0, 5 + 5], "{what}: streamed [forward, features, both] calls");
        let streamed = sums.finish(counting.clone()).unwrap().posterior;
        let err = rel_frob(&streamed.curvature().to_dense(), &plain.curvature().to_dense());
        assert!(err < 1e-12, "{what}: streamed curvature rel err {err:.2e}");
        // The GLM covariances come from the last layer's inputs alone (the wrapper has no layer
        // statistics to give), equal to the plain network's.
        let xt = x.rows(0, 5).into_owned();
        let (a, b) = (one_pass.glm_covariances(&xt).unwrap(), plain.glm_covariances(&xt).unwrap());
        assert_eq!(counting.take(), [0, 1, 0], "{what}: predictive [forward, features, both] calls");
        // The mean and the covariances together: one pass.
        let (mean, c) = one_pass.glm_mean_and_covariances(&xt).unwrap();
        assert_eq!(counting.take(), [0, 0, 1], "{what}: GLM predictive [forward, features, both] calls");
        assert_eq!(mean, net.forward(&xt).unwrap(), "{what}: GLM mean");
        for ((a, b), c) in a.iter().zip(&b).zip(&c) {
            assert!(rel_frob(a, b) < 1e-12 && rel_frob(c, b) < 1e-12, "{what}: GLM covariance");
        }
    }
    // The default (a network without the override) still makes both calls, and agrees.
    let both = net.forward_with_last_layer_features(&x).unwrap();
    assert_eq!((both.0, both.1), (net.forward(&x).unwrap(), net.last_layer_features(&x).unwrap()));
}

#[test]
fn streamed_sums_refuse_what_they_cannot_do() {
    let net = mlp(2, vec![5], 3, 44);
    let lik = LikelihoodSpec::categorical(3);
    for structure in [Structure::Ekfac, Structure::low_rank(3), Structure::block_diag()] {
        let config = LaplaceConfig { structure, ..Default::default() };
        let err = LaplaceSums::new(&net, lik, &config).unwrap_err().to_string();
        assert!(err.contains("more than once"), "{err}");
    }
    let config = LaplaceConfig { structure: Structure::Diag, ..Default::default() };
    let mut sums = LaplaceSums::new(&net, lik, &config).unwrap();
    // Nothing added: no posterior.
    assert!(sums.finish(net.clone()).unwrap_err().to_string().contains("no batch"));
    let (x, y) = classification(8, 2, 3, 45);
    let ym = DMatrix::from_column_slice(8, 1, y.as_slice());
    // Rows that disagree, a non-finite input, a label out of range, another network.
    assert!(sums.add(&net, &x, &ym.rows(0, 7).into_owned()).is_err());
    let mut bad = x.clone();
    bad[(0, 0)] = f64::NAN;
    assert!(sums.add(&net, &bad, &ym).is_err());
    assert!(sums.add(&net, &x, &ym.map(|v| v + 5.0)).is_err());
    assert!(sums.add(&mlp(2, vec![6], 3, 44), &x, &ym).is_err());
    assert_eq!(sums.n_data(), 0);
    sums.add(&net, &x, &ym).unwrap();
    // Sums of other settings do not merge.
    let other =
        LaplaceSums::new(&net, lik, &LaplaceConfig { structure: Structure::Kfac, ..Default::default() })
            .unwrap();
    assert!(sums.merge(&other).is_err());
}

/// A prior precision per parameter (laplace-torch's diagonal prior): the evidence and the GLM
/// predictive equal their dense evaluations, it survives save/load, and KFAC refuses it.
#[test]
fn a_per_parameter_prior_equals_the_dense_computation() {
    let net = mlp(2, vec![5, 4], 3, 61);
    let (x, y) = classification(25, 2, 3, 62);
    let (xt, _) = classification(5, 2, 3, 63);
    let lik = LikelihoodSpec::categorical(3);
    let cases = [
        (Structure::Diag, Weights::All),
        (Structure::full(), Weights::All),
        (Structure::Diag, Weights::LastLayer),
        (Structure::full(), Weights::LastLayer),
        (Structure::full(), Weights::Subnetwork(vec![0, 3, 7, 20, 40, 53])),
    ];
    for (structure, weights) in cases {
        let config = LaplaceConfig { structure, weights: weights.clone(), ..config(Structure::Diag) };
        let mut post = fit_v(net.clone(), lik, &x, &y, &config).unwrap();
        let what = format!("{} {weights:?}", post.curvature().name());
        let dim = post.indices().len();
        // λ in ascending flat order; the coordinates may be ordered otherwise (last layer).
        let values: Vec<f64> = (0..dim).map(|i| 0.3 + 0.2 * (i % 7) as f64).collect();
        let mut sorted: Vec<(usize, usize)> =
            post.indices().iter().copied().enumerate().map(|(c, f)| (f, c)).collect();
        sorted.sort();
        let mut per_coordinate = vec![0.0; dim];
        for (rank, &(_, c)) in sorted.iter().enumerate() {
            per_coordinate[c] = values[rank];
        }
        post.set_prior_precision(PriorPrecision::PerParameter(values.clone())).unwrap();
        let want = dense_marglik(&post, &per_coordinate, 1.0);
        let got = post.log_marginal_likelihood().unwrap();
        assert!((got - want).abs() < 1e-9 * want.abs().max(1.0), "{what}: {got} vs {want}");
        let lam = DMatrix::from_diagonal(&DVector::from_vec(per_coordinate.clone()));
        let sigma = (post.curvature().to_dense() + lam).try_inverse().unwrap();
        let js = net.jacobian(&xt).unwrap().select_columns(post.indices());
        let cov = &js * sigma * js.transpose();
        for (i, c) in post.glm_covariances(&xt).unwrap().iter().enumerate() {
            let block = cov.view((i * 3, i * 3), (3, 3)).into_owned();
            assert!(rel_frob(c, &block) < 1e-9, "{what}: GLM covariance");
        }
        let back = LaplacePosterior::<Mlp>::from_json(&post.to_json().unwrap()).unwrap();
        assert_eq!(back.glm_covariances(&xt).unwrap(), post.glm_covariances(&xt).unwrap());
        // A scalar prior afterwards replaces it.
        post.set_prior_precision(PriorPrecision::Scalar(2.0)).unwrap();
        let want = dense_marglik(&post, &vec![2.0; dim], 1.0);
        assert!((post.log_marginal_likelihood().unwrap() - want).abs() < 1e-9 * want.abs().max(1.0));
        assert!(post.set_prior_precision(PriorPrecision::PerParameter(vec![1.0; dim + 1])).is_err());
    }
    let mut kfac = fit_v(net.clone(), lik, &x, &y, &config(Structure::Kfac)).unwrap();
    let dim = kfac.indices().len();
    kfac.set_prior_precision(PriorPrecision::PerParameter((0..dim).map(|i| 1.0 + i as f64).collect()))
        .unwrap();
    assert!(kfac.log_marginal_likelihood().is_err());
    assert!(kfac.glm_covariances(&xt).is_err());
}

/// A prior precision per parameter tensor (laplace-torch's layer-wise prior) on KFAC / EKFAC
/// with the bias in its own block: `T·C + diag(λ)` keeps the Kronecker eigenbasis, so the
/// evidence, its eigenvalue pairing (`eigenvalue_owners`), the GLM covariances, solves and
/// samples equal their dense evaluations; a finer λ, or a weight/bias split on the folded
/// bias, is refused.
#[test]
fn a_prior_per_parameter_tensor_on_kfac_with_separate_bias_equals_the_dense_computation() {
    let net = mlp(2, vec![5, 4], 3, 64);
    let (x, y) = classification(30, 2, 3, 65);
    let (xt, _) = classification(5, 2, 3, 66);
    let lik = LikelihoodSpec::categorical(3);
    let infos = net.layer_infos();
    // λ per tensor in named_parameters order (weight, bias of each layer), expanded to every
    // parameter in ascending flat order.
    let tensor_lambda = |i: usize| {
        let l = infos.iter().position(|l| l.weight.contains(&i) || l.bias.contains(&i)).unwrap();
        let bias = infos[l].bias.contains(&i);
        0.4 + 0.9 * (2 * l + usize::from(bias)) as f64
    };
    for structure in [Structure::Kfac, Structure::Ekfac] {
        let cfg = LaplaceConfig { kron_bias: KronBias::Separate, ..config(structure) };
        let mut post = fit_v(net.clone(), lik, &x, &y, &cfg).unwrap();
        let what = post.curvature().name();
        let mut flat: Vec<usize> = post.indices().to_vec();
        flat.sort_unstable();
        let values: Vec<f64> = flat.iter().map(|&i| tensor_lambda(i)).collect();
        let per_coordinate: Vec<f64> = post.indices().iter().map(|&i| tensor_lambda(i)).collect();
        let prior = PriorPrecision::PerParameter(values.clone());
        post.set_prior_precision(prior.clone()).unwrap();
        post.set_temperature(0.8).unwrap();
        let want = dense_marglik(&post, &per_coordinate, 0.8);
        let got = post.log_marginal_likelihood().unwrap();
        assert!((got - want).abs() < 1e-9 * want.abs(), "{what}: evidence {got} vs {want}");
        // The eigenvalues paired with their owners' λ give the same log-determinant.
        let eig = post.curvature().eigenvalues().unwrap();
        let owners = post.eigenvalue_owners(&prior).unwrap().unwrap();
        let lam_v = DVector::from_column_slice(&per_coordinate);
        let dense = post.curvature().to_dense() * 0.8 + DMatrix::from_diagonal(&lam_v);
        let logdet = 2.0 * dense.clone().cholesky().unwrap().l().diagonal().map(f64::ln).sum();
        let paired: f64 = eig.iter().zip(&owners).map(|(e, &o)| (0.8 * e + values[o]).ln()).sum();
        assert!((paired - logdet).abs() < 1e-9 * logdet.abs(), "{what}: paired {paired} vs {logdet}");
        // The GLM covariances against J (T·C + diag λ)⁻¹ Jᵀ.
        let sigma = dense.try_inverse().unwrap();
        let js = net.jacobian(&xt).unwrap().select_columns(post.indices());
        let cov = &js * &sigma * js.transpose();
        for (i, c) in post.glm_covariances(&xt).unwrap().iter().enumerate() {
            let block = cov.view((i * 3, i * 3), (3, 3)).into_owned();
            assert!(rel_frob(c, &block) < 1e-9, "{what}: GLM covariance at point {i}");
        }
        let v = DMatrix::from_fn(per_coordinate.len(), 2, |i, j| ((i * 7 + j * 3) % 5) as f64 - 2.0);
        let solved = post.curvature().solve(0.8, &lam_v, &v).unwrap();
        assert!(rel_frob(&solved, &(&sigma * &v)) < 1e-9, "{what}: solve");
        // One λ per parameter is finer than the Kronecker basis holds.
        let finer = PriorPrecision::PerParameter((0..values.len()).map(|i| 1.0 + i as f64).collect());
        assert!(post.eigenvalue_owners(&finer).is_err(), "{what}");
    }
    // Folded, a layer's weight and bias share eigenvectors: a split λ is refused.
    let mut folded = fit_v(net.clone(), lik, &x, &y, &config(Structure::Kfac)).unwrap();
    let mut flat: Vec<usize> = folded.indices().to_vec();
    flat.sort_unstable();
    let split = PriorPrecision::PerParameter(flat.iter().map(|&i| tensor_lambda(i)).collect());
    assert!(folded.eigenvalue_owners(&split).is_err());
    folded.set_prior_precision(split).unwrap();
    assert!(folded.log_marginal_likelihood().is_err());
    assert!(folded.glm_covariances(&xt).is_err());
}

/// A saved KFAC / EKFAC posterior whose factor eigenvalues were edited below zero is refused
/// when loaded (a negative eigenvalue flips a predictive variance's sign), and so is one whose
/// network weights are near f64::MAX or whose eigenvectors hold an entry above 1.
#[test]
fn loaded_posteriors_with_impossible_numbers_are_refused_or_fail_loudly() {
    let net = mlp(2, vec![5], 3, 41);
    let (x, y) = classification(20, 2, 3, 42);
    let (xt, _) = classification(4, 2, 3, 43);
    let lik = LikelihoodSpec::Categorical { classes: 3 };
    for structure in [Structure::Kfac, Structure::Ekfac] {
        let post = fit_v(net.clone(), lik, &x, &y, &config(structure.clone())).unwrap();
        let mut v: serde_json::Value = serde_json::from_str(&post.to_json().unwrap()).unwrap();
        let layer = &mut v["payload"]["curvature"]["Kron"]["layers"][0];
        let field = if layer["fitted"].is_null() { "g_values" } else { "a_values" };
        layer[field][0][0] = serde_json::json!(-5.0); // nalgebra stores [data, rows, cols]
        let err = LaplacePosterior::<Mlp>::from_json(&v.to_string()).unwrap_err();
        assert!(err.to_string().contains(field), "{structure:?}: {err}");
    }
    // Weights near f64::MAX (a tampered file that passes the finite checks): refused when read
    // (fspace_nn::MAX_LOADED_WEIGHT), not served as a predictive whose joint form overflows and
    // whose marginal one saturates to zero variance.
    let post = fit_v(net.clone(), lik, &x, &y, &config(Structure::Kfac)).unwrap();
    let text = post.to_json().unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let at = find_array_of_numbers(&v["payload"]["net"], "/payload/net".into()).expect("a weight array");
    for w in v.pointer_mut(&at).unwrap().as_array_mut().unwrap() {
        *w = serde_json::json!(1e308);
    }
    let err = LaplacePosterior::<Mlp>::from_json(&v.to_string()).unwrap_err();
    assert!(err.to_string().contains("beyond ±1e150"), "{err}");
    assert!(predict_is_finite_or_refused(&post, &xt));
    // An eigenvector entry of ±1e308 (or any above 1): the columns are not orthonormal, and the
    // file is refused, naming the field, instead of serving infinite variances.
    for (structure, pointer) in [
        (Structure::Kfac, "/payload/curvature/Kron/layers/0/g_vectors/0/0"),
        (Structure::Kfac, "/payload/curvature/Kron/layers/1/a_vectors/0/3"),
        (Structure::full(), "/payload/curvature/Eigen/vectors/0/2"),
    ] {
        let post = fit_v(net.clone(), lik, &x, &y, &config(structure.clone())).unwrap();
        let mut v: serde_json::Value = serde_json::from_str(&post.to_json().unwrap()).unwrap();
        for bad in [-1e308, 1.5] {
            *v.pointer_mut(pointer).unwrap_or_else(|| panic!("{pointer}")) = serde_json::json!(bad);
            let err = LaplacePosterior::<Mlp>::from_json(&v.to_string()).unwrap_err().to_string();
            let field = pointer.rsplit('/').nth(2).unwrap();
            assert!(err.contains(field) && err.contains("orthonormal"), "{structure:?} {bad}: {err}");
        }
    }
}

fn predict_is_finite_or_refused(post: &LaplacePosterior<Mlp>, x: &DMatrix<f64>) -> bool {
    post.predict(x).map_or(true, |p| p.var.iter().all(|v| v.is_finite()))
}

/// The JSON pointer of the first array of at least two numbers inside `v` (depth first).
fn find_array_of_numbers(v: &serde_json::Value, at: String) -> Option<String> {
    match v {
        serde_json::Value::Array(items) if items.len() >= 2 && items.iter().all(|i| i.is_number()) => {
            Some(at)
        }
        serde_json::Value::Array(items) => {
            items.iter().enumerate().find_map(|(k, i)| find_array_of_numbers(i, format!("{at}/{k}")))
        }
        serde_json::Value::Object(map) => {
            map.iter().find_map(|(k, i)| find_array_of_numbers(i, format!("{at}/{k}")))
        }
        _ => None,
    }
}

/// `fit_sharded` on `world` threads, each with its contiguous (uneven) shard of `(x, y)`, or
/// with `data_of(rank)`'s own rows and network where given.
fn sharded_fits<N: Network + Clone + Send + Sync>(
    world: usize,
    lik: LikelihoodSpec,
    config: &LaplaceConfig,
    shard_of: &(dyn Fn(usize) -> (N, DMatrix<f64>, DMatrix<f64>) + Sync),
) -> Vec<Result<LaplacePosterior<N>, LaplaceError>> {
    let reducer = ThreadReduce::new(world);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let reducer = &reducer;
                scope.spawn(move || {
                    let (net, xs, ys) = shard_of(rank);
                    let mut reduce =
                        |part: DVector<f64>, failed: bool| reducer.sum::<LaplaceError>(rank, part, failed);
                    let shard = fspace_core::ProcessShard { rank, world, reduce: &mut reduce };
                    let data = Data::new(&xs, &ys)?;
                    Ok(fit_sharded(net, lik, &data, config, shard, &mut fspace_core::Silent)?.posterior)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// `fit_sharded` over 2 and 3 "processes" (threads, uneven shards of 101 points) for the
/// structures that pass over the data more than once — KFAC and EKFAC (all weights, the last
/// layer), low rank (growing Krylov space, thick restart, diagonal remainder): every process
/// ends with the single-process posterior (curvature, evidence, GLM covariances to 1e-10) and
/// the same Lanczos iteration count.
#[test]
fn a_sharded_fit_equals_the_single_process_fit_for_the_multi_pass_structures() {
    let net = mlp(2, vec![5, 4], 3, 51);
    let n = 101;
    let (x, yc) = classification(n, 2, 3, 52);
    let (xt, _) = classification(6, 2, 3, 53);
    let yr = DVector::from_fn(n * 3, |i, _| (i as f64 * 0.37).sin());
    let low_rank = |diag_remainder, max_basis| {
        Structure::LowRank(LowRankConfig { rank: 6, diag_remainder, max_basis, ..Default::default() })
    };
    let cases: Vec<(Structure, Weights, KronBias)> = vec![
        (Structure::Kfac, Weights::All, KronBias::Folded),
        (Structure::Ekfac, Weights::All, KronBias::Separate),
        (Structure::Ekfac, Weights::LastLayer, KronBias::Folded),
        (low_rank(false, None), Weights::All, KronBias::Folded),
        (low_rank(true, None), Weights::All, KronBias::Folded),
        (low_rank(false, Some(14)), Weights::All, KronBias::Folded),
    ];
    let likelihoods = [
        (LikelihoodSpec::categorical(3), yc.clone(), 1usize),
        (LikelihoodSpec::IsotropicGaussian { sigma: 0.3, outputs: 3, learn: false }, yr.clone(), 3usize),
    ];
    for (structure, weights, kron_bias) in cases {
        for (lik, y, t) in &likelihoods {
            let config = LaplaceConfig {
                structure: structure.clone(),
                weights: weights.clone(),
                kron_bias,
                chunk_points: 7,
                ..Default::default()
            };
            let label = format!("{} {:?} {:?} {:?}", structure.name(), weights, kron_bias, lik);
            compare_contiguous_shards(&net, *lik, (&x, y, *t), &xt, &config, &label, &|whole, post, what| {
                assert_eq!(post.report().lanczos_iterations, whole.report.lanczos_iterations, "{what}");
                assert_eq!(post.indices(), whole.posterior.indices(), "{what}");
                let err = rel_frob(&post.curvature().to_dense(), &whole.posterior.curvature().to_dense());
                assert!(err < 1e-10, "{what}: curvature rel err {err:.2e}");
                let (e1, e2) = (
                    post.log_marginal_likelihood().unwrap(),
                    whole.posterior.log_marginal_likelihood().unwrap(),
                );
                assert!((e1 - e2).abs() < 1e-10 * e2.abs().max(1.0), "{what}: evidence {e1} vs {e2}");
            });
        }
    }
}

/// The single-process fit of `n` rows `(x, y)` (`t` targets per point) and [`sharded_fits`]
/// over 2 and 3 "processes" holding uneven contiguous shards of them: every process's posterior
/// has the single-process GLM covariances at `xt` (to 1e-9), then meets `check(whole, post,
/// what)`.
#[allow(clippy::type_complexity)]
fn compare_contiguous_shards(
    net: &Mlp,
    lik: LikelihoodSpec,
    (x, y, t): (&DMatrix<f64>, &DVector<f64>, usize),
    xt: &DMatrix<f64>,
    config: &LaplaceConfig,
    label: &str,
    check: &dyn Fn(
        &fspace_core::Fitted<LaplacePosterior<Mlp>, fspace_laplace::FitReport>,
        &LaplacePosterior<Mlp>,
        &str,
    ),
) {
    let n = x.nrows();
    let whole = fit(net.clone(), lik, &Data::new(x, &target_rows(y, t, 0, n)).unwrap(), config).unwrap();
    let covariances = whole.posterior.glm_covariances(xt).unwrap();
    for world in [2usize, 3] {
        let what = format!("{label} on {world}");
        let bounds: Vec<usize> = (0..=world).map(|k| (n * k * 2 / world).div_ceil(2).min(n)).collect();
        let shard_of = |rank: usize| {
            let (s, e) = (bounds[rank], bounds[rank + 1]);
            (net.clone(), x.rows(s, e - s).into_owned(), target_rows(y, t, s, e))
        };
        for post in sharded_fits(world, lik, config, &shard_of) {
            let post = post.unwrap();
            for (c1, c2) in post.glm_covariances(xt).unwrap().iter().zip(&covariances) {
                let err = rel_frob(c1, c2);
                assert!(err < 1e-9, "{what}: GLM covariance rel err {err:.2e}");
            }
            check(&whole, &post, &what);
        }
    }
}

/// The sampled structure over 2 and 3 "processes" (threads, uneven shards of 101 points), with
/// each preconditioner: the noise `ε` of a point is the one a single process over all points
/// draws for it, `Rᵀε`, every CG product and EM's `γ` are summed over the processes, so every
/// process ends with the single-process draws and EM prior precisions to 1e-10 (measured
/// ≤ 1.8e-11 with solves to 1e-12). The CG product counts may differ by a few (CG past `p`
/// iterations on 54 parameters follows the products' rounding, which the sums' order changes:
/// measured 31 against 38 at most); they stay within 25 %. Noise keyed by the local rows fails
/// the test.
#[test]
fn a_sharded_sampled_fit_draws_the_single_process_samples() {
    let net = mlp(2, vec![5, 4], 3, 56);
    let n = 101;
    let (x, yc) = classification(n, 2, 3, 57);
    let (xt, _) = classification(6, 2, 3, 58);
    let yr = DVector::from_fn(n * 3, |i, _| (i as f64 * 0.41).cos());
    let likelihoods = [
        (LikelihoodSpec::categorical(3), yc, 1usize),
        (LikelihoodSpec::IsotropicGaussian { sigma: 0.3, outputs: 3, learn: false }, yr, 3usize),
    ];
    for preconditioner in [
        SampledPreconditioner::LowRank(5),
        SampledPreconditioner::Diag,
        SampledPreconditioner::Kfac,
        SampledPreconditioner::Identity,
    ] {
        for (lik, y, t) in &likelihoods {
            let sampled =
                SampledConfig { samples: 5, em_steps: 2, tol: 1e-12, preconditioner, ..Default::default() };
            let config = LaplaceConfig {
                structure: Structure::Sampled(sampled),
                chunk_points: 7,
                ..Default::default()
            };
            let label = format!("{preconditioner:?} {lik:?}");
            compare_contiguous_shards(&net, *lik, (&x, y, *t), &xt, &config, &label, &|whole, post, what| {
                let (c1, c2) = (&post.report().cg_products, &whole.report.cg_products);
                assert_eq!(c1.len(), c2.len(), "{what}");
                for (a, b) in c1.iter().zip(c2) {
                    assert!(a.abs_diff(*b) * 4 <= *b, "{what}: CG products {c1:?} vs {c2:?}");
                }
                let (l1, l2) = (&post.report().em_prior_precisions, &whole.report.em_prior_precisions);
                assert_eq!(l1.len(), 2, "{what}");
                for (a, b) in l1.iter().zip(l2) {
                    assert!((a - b).abs() < 1e-10 * b, "{what}: EM λ {a} vs {b}");
                }
                let err = rel_frob(&post.curvature().to_dense(), &whole.posterior.curvature().to_dense());
                assert!(err < 1e-10, "{what}: draws' second moment rel err {err:.2e}");
            });
        }
    }
}

/// An MLP whose GGN products fail on demand (a process that is interrupted, or whose
/// callback network raises, in the middle of the Lanczos iteration).
#[derive(Clone)]
struct FailingProducts {
    net: Mlp,
    fail: bool,
}

impl Network for FailingProducts {
    delegate_required_to_net!();
    fn ggn_vector_product(
        &self,
        x: &DMatrix<f64>,
        hessians: &[DMatrix<f64>],
        v: &DVector<f64>,
    ) -> fspace_nn::Result<DVector<f64>> {
        if self.fail {
            return Err(fspace_nn::NnError::Callback("the product failed here".into()));
        }
        self.net.ggn_vector_product(x, hessians, v)
    }
    fn jvp_columns(&self, x: &DMatrix<f64>, u: &DMatrix<f64>) -> fspace_nn::Result<DMatrix<f64>> {
        if self.fail {
            return Err(fspace_nn::NnError::Callback("the product failed here".into()));
        }
        self.net.jvp_columns(x, u)
    }
}

/// A process that fails — before its first reduce (its own bad targets), inside a Lanczos
/// product, or on a structure `fit_sharded` does not take — returns its own error, and every
/// other process the reduce's: none waits forever.
#[test]
fn a_sharded_fit_fails_on_every_process_when_one_fails() {
    let net = mlp(2, vec![5], 3, 54);
    let n = 40;
    let (x, y) = classification(n, 2, 3, 55);
    let lik = LikelihoodSpec::categorical(3);
    let ym = target_rows(&y, 1, 0, n);
    let low_rank = LaplaceConfig { structure: Structure::low_rank(4), ..Default::default() };
    // Process 1's labels are out of range.
    let bad_labels = |rank: usize| {
        let ys = if rank == 1 { ym.rows(20, 20).map(|_| 7.0) } else { ym.rows(0, 20).into_owned() };
        (net.clone(), x.rows(20 * rank, 20).into_owned(), ys)
    };
    let results = sharded_fits(2, lik, &low_rank, &bad_labels);
    assert!(results[0].as_ref().err().unwrap().to_string().contains("another process failed"));
    assert!(!results[1].as_ref().err().unwrap().to_string().contains("another process"));
    // Process 0's products fail inside the Lanczos iteration.
    let failing_products = |rank: usize| {
        let net = FailingProducts { net: net.clone(), fail: rank == 0 };
        (net, x.rows(20 * rank, 20).into_owned(), ym.rows(20 * rank, 20).into_owned())
    };
    let results = sharded_fits(2, lik, &low_rank, &failing_products);
    assert!(results[0].as_ref().err().unwrap().to_string().contains("the product failed here"));
    assert!(results[1].as_ref().err().unwrap().to_string().contains("another process failed"));
    // Refused on every process: a one-pass structure (pointing to the partial sums), and a
    // sampled fit that would record its EM steps (one file, each process's own fingerprint).
    let diag = LaplaceConfig { structure: Structure::Diag, ..Default::default() };
    let recorded = LaplaceConfig {
        structure: Structure::Sampled(SampledConfig {
            samples: 2,
            em_checkpoint: Some(std::env::temp_dir().join("never-written.json")),
            ..Default::default()
        }),
        ..Default::default()
    };
    let halves =
        |rank: usize| (net.clone(), x.rows(20 * rank, 20).into_owned(), ym.rows(20 * rank, 20).into_owned());
    for (refused, fragment) in [(&diag, "LaplaceSums"), (&recorded, "em_checkpoint")] {
        for result in sharded_fits(2, lik, refused, &halves) {
            let err = result.err().unwrap().to_string();
            assert!(err.contains(fragment), "{err}");
        }
    }
    // The sampled structure's products (streamed, no statistics cached) failing on process 1.
    let sampled = LaplaceConfig {
        structure: Structure::Sampled(SampledConfig {
            samples: 2,
            preconditioner: SampledPreconditioner::Identity,
            statistics_cache_bytes: 0,
            ..Default::default()
        }),
        ..Default::default()
    };
    let failing_products = |rank: usize| {
        let net = FailingProducts { net: net.clone(), fail: rank == 1 };
        (net, x.rows(20 * rank, 20).into_owned(), ym.rows(20 * rank, 20).into_owned())
    };
    let results = sharded_fits(2, lik, &sampled, &failing_products);
    assert!(results[0].as_ref().err().unwrap().to_string().contains("another process failed"));
    assert!(results[1].as_ref().err().unwrap().to_string().contains("the product failed here"));
}

/// Every query at a given λ and T (`state_at` + the `*_in` queries) equals the query after
/// setting them, bit for bit, and leaves the posterior as it was; its JSON at a state is the
/// JSON after setting it. Per-layer and per-parameter priors, every structure, regression and
/// classification.
#[test]
fn queries_at_a_given_prior_and_temperature_equal_setting_them_and_change_nothing() {
    use rand::SeedableRng;
    let (x, y) = regression(30, 2, 41);
    let (xc, yc) = classification(30, 2, 3, 42);
    let xt = DMatrix::from_fn(4, 2, |i, j| 0.3 * i as f64 - 0.5 * j as f64);
    for structure in every_structure(4) {
        for (net, lik, xs, ys) in [
            (mlp(2, vec![5], 1, 3), LikelihoodSpec::gaussian(0.2), &x, &y),
            (mlp(2, vec![4], 3, 4), LikelihoodSpec::categorical(3), &xc, &yc),
        ] {
            let post = fit_with(net, lik, xs, ys, structure.clone());
            let before = post.to_json().unwrap();
            let dim = post.indices().len();
            let per_parameter =
                PriorPrecision::PerParameter((0..dim).map(|i| 0.5 + 0.1 * i as f64).collect());
            let layers = post.prior_precision().len();
            let per_layer = PriorPrecision::PerLayer((0..layers).map(|l| 0.7 + l as f64).collect());
            for prior in [PriorPrecision::Scalar(2.5), per_layer, per_parameter] {
                let Ok(state) = post.state_at(&prior, 0.6) else {
                    // The structures that take no per-parameter prior refuse it either way.
                    let mut set = post.clone();
                    assert!(set.set_prior_precision(prior.clone()).is_err(), "{structure:?}");
                    continue;
                };
                let mut set = post.clone();
                set.set_prior_precision(prior.clone()).unwrap();
                set.set_temperature(0.6).unwrap();
                assert_eq!(set.state(), state);
                let what = format!("{structure:?} {prior:?}");
                same(post.glm_mean_and_covariances_in(&state, &xt), set.glm_mean_and_covariances(&xt), &what);
                let v = DMatrix::from_fn(dim, 2, |i, j| (i + 2 * j) as f64 * 0.01);
                same(post.covariance_solve_in(&state, &v), set.covariance_solve(&v), &what);
                assert_eq!(post.covariance_diagonal_in(&state), set.covariance_diagonal());
                let draw = |p: &LaplacePosterior<Mlp>, s: Option<&fspace_laplace::QueryState>| {
                    let mut r = rand::rngs::StdRng::seed_from_u64(9);
                    match s {
                        Some(s) => p.sample_weights_in(s, 3, &mut r),
                        None => p.sample_weights(3, &mut r),
                    }
                };
                same(draw(&post, Some(&state)), draw(&set, None), &what);
                if matches!(structure, Structure::Full(_) | Structure::Diag) {
                    same(
                        post.glm_joint_in(&state, &xt),
                        set.predict_joint(&xt).map_err(LaplaceError::from),
                        &what,
                    );
                }
                assert_eq!(post.to_json_in(&state).unwrap(), set.to_json().unwrap());
                assert_eq!(post.to_json().unwrap(), before, "a query changed the posterior");
            }
            assert_eq!(post.to_json_in(&post.state()).unwrap(), before);
            assert!(post.state_at(&PriorPrecision::Scalar(1.0), 0.0).is_err());
            assert!(post.state_at(&PriorPrecision::Scalar(-1.0), 1.0).is_err());
        }
    }
}

/// Both `Ok` and equal, or both `Err` with the same message.
fn same<T: PartialEq + std::fmt::Debug, E: std::fmt::Display>(a: Result<T, E>, b: Result<T, E>, what: &str) {
    match (a, b) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "{what}"),
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{what}"),
        (a, b) => panic!(
            "{what}: {:?} against {:?}",
            a.map(|_| ()).map_err(|e| e.to_string()),
            b.map(|_| ()).map_err(|e| e.to_string())
        ),
    }
}

/// `SUPPORT` is the one table of which structure exists over which weights: `fit` builds
/// exactly the listed pairs, `LaplaceSums` streams exactly those marked `streams`, and
/// `fit_sharded` takes exactly those marked `shards`; every other pair is refused with the
/// same `Unsupported` error by each.
#[test]
fn the_support_table_is_what_fit_streaming_and_sharding_do() {
    use fspace_laplace::{support, Subset, SUPPORT};
    let (x, y) = regression(12, 2, 61);
    let ym = DMatrix::from_column_slice(12, 1, y.as_slice());
    let sampled = Structure::Sampled(SampledConfig { samples: 4, em_steps: 0, ..Default::default() });
    let mut structures = every_structure(3).to_vec();
    structures.push(sampled);
    let mut seen = 0;
    for structure in &structures {
        for weights in [Weights::All, Weights::LastLayer, Weights::Subnetwork(vec![0, 3, 7])] {
            let row = support(structure, &weights);
            let what = format!("{} over {:?}", structure.name(), weights.subset());
            let config = LaplaceConfig {
                structure: structure.clone(),
                weights: weights.clone(),
                ..config(Structure::Diag)
            };
            let net = mlp(2, vec![4], 1, 5);
            let lik = LikelihoodSpec::gaussian(0.3);
            let built = fit(net.clone(), lik, &Data::new(&x, &ym).unwrap(), &config);
            let streamed = LaplaceSums::new(&net, lik, &config);
            let sharded =
                sharded_fits(1, lik, &config, &|_| (net.clone(), x.clone(), ym.clone())).pop().unwrap();
            match row {
                Ok(r) => {
                    seen += 1;
                    assert!(SUPPORT.contains(&r));
                    assert!(built.is_ok(), "{what}: {:?}", built.err());
                    assert_eq!(streamed.is_ok(), r.streams, "{what}: {:?}", streamed.err());
                    assert_eq!(sharded.is_ok(), r.shards, "{what}: {:?}", sharded.err());
                }
                Err(e) => {
                    let e = e.to_string();
                    assert!(e.contains("it is not implemented over"), "{what}: {e}");
                    for refused in [built.err().map(|e| e.to_string()), streamed.err().map(|e| e.to_string())]
                    {
                        assert_eq!(refused.as_deref(), Some(e.as_str()), "{what}");
                    }
                    assert!(sharded.is_err(), "{what}");
                    assert!(!SUPPORT
                        .iter()
                        .any(|r| r.structure == structure.name() && r.subset == weights.subset()));
                }
            }
        }
    }
    assert_eq!(seen, SUPPORT.len(), "a row of SUPPORT no structure reaches");
    assert!(SUPPORT.iter().any(|r| r.subset == Subset::Subnetwork));
}
