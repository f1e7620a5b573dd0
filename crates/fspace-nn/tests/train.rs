//! MAP training, the regulariser hook, early stopping and feature maps.

use fspace_core::{Gaussian, Schedule};
use fspace_input::InputError;
use fspace_nn::*;
use fspace_testutil::rng;
use nalgebra::{DMatrix, DVector};

fn sine_net(seed: u64) -> Mlp {
    Mlp::new(MlpConfig {
        input_dim: 1,
        hidden: vec![50, 50],
        output_dim: 1,
        activation: Activation::Tanh,
        seed,
    })
    .unwrap()
}

fn rmse(net: &Mlp, x: &DMatrix<f64>, y: &DVector<f64>) -> f64 {
    let f = net.forward(x).unwrap();
    ((f.column(0) - y).norm_squared() / y.len() as f64).sqrt()
}

#[test]
fn a_2x50_tanh_mlp_fits_the_sine_toy_to_the_noise_level() {
    // FSP-Laplace App. B.1: x ~ U([−1,−0.5] ∪ [0.5,1]), y = sin(2πx) + ε, σ = 0.1.
    let train = fspace_data::sine(200, 0.1, &mut rng(1)).unwrap();
    let test = fspace_data::sine(1000, 0.1, &mut rng(2)).unwrap();
    let mut net = sine_net(0);
    let mut lik = Gaussian::new(0.1).unwrap();
    let cfg = TrainConfig {
        schedule: Schedule::epochs(600),
        batch_size: 100,
        learning_rate: 5e-3,
        ..Default::default()
    };
    let report = train_map(&mut net, &mut lik, &train.x, &train.y_vec(), None, None, &cfg, |_| {}).unwrap();
    let test_rmse = rmse(&net, &test.x, &test.y_vec());
    eprintln!("sine toy: test RMSE {test_rmse:.4} after {} epochs (noise 0.1)", report.epochs);
    assert!(test_rmse <= 1.5 * 0.1, "test RMSE {test_rmse}");
    // Deterministic under the seed.
    let mut again = sine_net(0);
    train_map(
        &mut again,
        &mut lik,
        &train.x,
        &train.y_vec(),
        None,
        None,
        &TrainConfig { schedule: Schedule::epochs(3), ..cfg.clone() },
        |_| {},
    )
    .unwrap();
    let mut again2 = sine_net(0);
    train_map(
        &mut again2,
        &mut lik,
        &train.x,
        &train.y_vec(),
        None,
        None,
        &TrainConfig { schedule: Schedule::epochs(3), ..cfg },
        |_| {},
    )
    .unwrap();
    assert_eq!(again.params(), again2.params());
}

#[test]
fn the_regularizer_hook_steers_the_network_with_its_own_gradient() {
    // Data near x = 0 only; R(w) = 50 (f(2) − 3)² pins the function far from the data.
    let x = DMatrix::from_fn(40, 1, |i, _| -0.2 + 0.01 * i as f64);
    let y = DVector::from_element(40, 0.0);
    let anchor = DMatrix::from_element(1, 1, 2.0);
    let mut reg = |net: &Mlp, _rng: &mut rand::rngs::StdRng| -> Result<(f64, DVector<f64>)> {
        let r = net.forward(&anchor)?[(0, 0)] - 3.0;
        Ok((50.0 * r * r, net.vjp(&anchor, &DMatrix::from_element(1, 1, 100.0 * r))?))
    };
    let mut net = sine_net(3);
    let cfg = TrainConfig {
        schedule: Schedule::epochs(400),
        batch_size: 40,
        learning_rate: 1e-2,
        ..Default::default()
    };
    train_map(&mut net, &mut Gaussian::new(0.1).unwrap(), &x, &y, None, Some(&mut reg), &cfg, |_| {})
        .unwrap();
    assert!((net.forward(&anchor).unwrap()[(0, 0)] - 3.0).abs() < 0.05);
    assert!(rmse(&net, &x, &y) < 0.05);
}

/// The regulariser runs beside the data pass on a rayon thread; on a one-thread pool the two
/// run one after the other. Both must give the same weights, bit for bit, with the regulariser
/// drawing from the step's RNG (as FSP-Laplace's context points do) and failing on cue.
#[test]
fn the_regularizer_beside_the_data_pass_gives_the_bits_of_one_thread() {
    let data = fspace_data::sine(300, 0.1, &mut rng(11)).unwrap();
    let cfg = TrainConfig {
        schedule: Schedule::epochs(3),
        batch_size: 100,
        learning_rate: 1e-2,
        ..Default::default()
    };
    let run = |threads: usize, fail_at: Option<usize>| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            let mut calls = 0;
            let mut reg = |net: &Mlp, rng: &mut rand::rngs::StdRng| -> Result<(f64, DVector<f64>)> {
                calls += 1;
                if Some(calls) == fail_at {
                    return Err(NnError::Regularizer("asked to fail".into()));
                }
                let c = DMatrix::from_fn(60, 1, |_, _| rand::Rng::gen_range(rng, -2.0..2.0));
                let f = net.forward(&c)?;
                Ok((0.5 * f.norm_squared(), net.vjp(&c, &f)?))
            };
            let mut net = sine_net(12);
            let mut lik = Gaussian::new(0.1).unwrap();
            train_map(
                &mut net,
                &mut lik,
                &data.x,
                &data.y.column(0).into_owned(),
                None,
                Some(&mut reg),
                &cfg,
                |_| {},
            )
            .map(|_| net.params())
        })
    };
    let (one, two) = (run(1, None).unwrap(), run(2, None).unwrap());
    assert!(one.iter().zip(&two).all(|(a, b)| a.to_bits() == b.to_bits()));
    assert!(matches!(run(2, Some(5)), Err(NnError::Regularizer(m)) if m == "asked to fail"));
}

#[test]
fn early_stopping_restores_the_best_validation_weights() {
    let train = fspace_data::sine(30, 0.3, &mut rng(4)).unwrap();
    let val = fspace_data::sine(200, 0.3, &mut rng(5)).unwrap();
    let mut lik = Gaussian::new(0.3).unwrap();
    let mut net = Mlp::new(MlpConfig {
        input_dim: 1,
        hidden: vec![200, 200],
        output_dim: 1,
        activation: Activation::Tanh,
        seed: 1,
    })
    .unwrap();
    let cfg = TrainConfig {
        schedule: Schedule::epochs(3000).patience(20),
        batch_size: 30,
        learning_rate: 1e-2,
        ..Default::default()
    };
    let mut seen = 0;
    let report = train_map(
        &mut net,
        &mut lik,
        &train.x,
        &train.y_vec(),
        Some((&val.x, &val.y_vec())),
        None,
        &cfg,
        |_| seen += 1,
    )
    .unwrap();
    assert!(report.stopped_early && report.epochs < 3000 && seen == report.epochs);
    let best = report.history.iter().filter_map(|p| p.validation_loss).fold(f64::INFINITY, f64::min);
    let now = lik.nll_of(&net, &val);
    assert!((now - best).abs() < 1e-12, "restored weights give the best validation loss: {now} vs {best}");
}

#[test]
fn sparse_validation_checks_every_kth_epoch_and_counts_patience_in_evaluations() {
    let train = fspace_data::sine(30, 0.3, &mut rng(4)).unwrap();
    let val = fspace_data::sine(200, 0.3, &mut rng(5)).unwrap();
    let run = |validate_every: usize, adds: bool, reg_value: f64| {
        let mut lik = Gaussian::new(0.3).unwrap();
        let mut net = sine_net(1);
        let cfg = TrainConfig {
            schedule: Schedule::epochs(3000).every_epochs(validate_every).patience(4),
            batch_size: 30,
            learning_rate: 1e-2,
            validation_adds_regularizer: adds,
            ..Default::default()
        };
        let mut reg = |_: &Mlp, _: &mut rand::rngs::StdRng| Ok((reg_value, DVector::zeros(2701)));
        let rep = train_map(
            &mut net,
            &mut lik,
            &train.x,
            &train.y_vec(),
            Some((&val.x, &val.y_vec())),
            Some(&mut reg),
            &cfg,
            |_| {},
        )
        .unwrap();
        (rep, lik.nll_of(&net, &val))
    };
    let (rep, restored) = run(10, false, 0.0);
    // Validated at epochs 10, 20, 30, …; stopped at the 4th check in a row without improvement.
    for p in &rep.history {
        assert_eq!(p.validation_loss.is_some(), p.epoch % 10 == 0, "epoch {}", p.epoch);
    }
    assert!(rep.stopped_early);
    let checks: Vec<f64> = rep.history.iter().filter_map(|p| p.validation_loss).collect();
    let best = checks.iter().cloned().fold(f64::INFINITY, f64::min);
    let after_best = checks.len() - 1 - checks.iter().position(|&v| v == best).unwrap();
    assert_eq!(after_best, 4, "{checks:?}");
    assert_eq!(rep.best_step, 10 * (checks.len() - 4), "30 points in one batch: a step per epoch");
    assert!((restored - best).abs() < 1e-12);
    // The regulariser's value joins the validation loss (per validation point) only when asked.
    let (with, _) = run(10, true, 50.0);
    let (without, _) = run(10, false, 50.0);
    let first = |r: &TrainReport| r.history.iter().find_map(|p| p.validation_loss).unwrap();
    assert!((first(&with) - first(&without) - 50.0 / 200.0).abs() < 1e-12);
    assert!(matches!(
        train_map(
            &mut sine_net(0),
            &mut Gaussian::new(0.3).unwrap(),
            &train.x,
            &train.y_vec(),
            None,
            None,
            &TrainConfig { schedule: Schedule::epochs(5).every_epochs(0), ..Default::default() },
            |_| {}
        ),
        Err(NnError::Input(InputError::Invalid { what: "schedule evaluation interval", .. }))
    ));
    // A non-positive learning rate or a negative weight decay is refused before any step.
    for (learning_rate, weight_decay, what) in
        [(-1e-3, 0.0, "learning_rate"), (f64::NAN, 0.0, "learning_rate"), (1e-3, -1.0, "weight_decay")]
    {
        let config =
            TrainConfig { schedule: Schedule::epochs(1), learning_rate, weight_decay, ..Default::default() };
        let result = train_map(
            &mut sine_net(0),
            &mut Gaussian::new(0.3).unwrap(),
            &train.x,
            &train.y_vec(),
            None,
            None,
            &config,
            |_| {},
        );
        assert!(
            matches!(result, Err(NnError::Input(InputError::Invalid { what: w, .. })) if w == what),
            "{what}"
        );
    }
    // A regulariser whose gradient has the wrong length is a typed error, not a panic.
    let mut bad = |_: &Mlp, _: &mut rand::rngs::StdRng| Ok((0.0, DVector::zeros(3)));
    assert!(matches!(
        train_map(
            &mut sine_net(0),
            &mut Gaussian::new(0.3).unwrap(),
            &train.x,
            &train.y_vec(),
            None,
            Some(&mut bad),
            &TrainConfig { schedule: Schedule::epochs(1), ..Default::default() },
            |_| {}
        ),
        Err(NnError::Input(InputError::DimensionMismatch {
            what: "regulariser gradient",
            expected: 2701,
            found: 3
        }))
    ));
}

trait NllOf {
    fn nll_of(&self, net: &Mlp, d: &fspace_data::Dataset) -> f64;
}

impl NllOf for Gaussian {
    fn nll_of(&self, net: &Mlp, d: &fspace_data::Dataset) -> f64 {
        use fspace_core::Likelihood;
        self.nll(&net.forward(&d.x).unwrap(), &d.y_vec()).unwrap() / d.len() as f64
    }
}

#[test]
fn periodic_feature_maps_append_sin_and_cos() {
    let x = DMatrix::from_row_slice(2, 1, &[0.25, 1.0]);
    let phi = FeatureMap::Periodic { column: 0, period: 1.0 }.apply(&x).unwrap();
    assert_eq!(phi.ncols(), 3);
    assert!(
        (phi[(0, 1)] - 1.0).abs() < 1e-15 && phi[(0, 2)].abs() < 1e-15 && (phi[(1, 2)] - 1.0).abs() < 1e-15
    );
    assert!(FeatureMap::Periodic { column: 1, period: 1.0 }.apply(&x).is_err());
    assert!(FeatureMap::Periodic { column: 0, period: 0.0 }.apply(&x).is_err());
    assert_eq!(FeatureMap::Identity.output_dim(3), 3);
}

#[test]
fn featurized_network_is_the_inner_network_at_the_features() {
    let map = FeatureMap::Periodic { column: 0, period: 0.7 };
    let inner = Mlp::new(MlpConfig {
        input_dim: 3,
        hidden: vec![8, 8],
        output_dim: 2,
        activation: Activation::Tanh,
        seed: 3,
    })
    .unwrap();
    let net = Featurized::new(map.clone(), 1, inner.clone()).unwrap();
    let mut r = rng(5);
    let x = fspace_testutil::randn(7, 1, &mut r);
    let phi = map.apply(&x).unwrap();
    assert_eq!((Network::input_dim(&net), Network::output_dim(&net)), (1, 2));
    fspace_testutil::assert_mat_close(
        &Network::forward(&net, &x).unwrap(),
        &inner.forward(&phi).unwrap(),
        0.0,
        0.0,
    );
    // J·u against central finite differences of the forward pass in the parameters.
    let w = Network::params(&net);
    let u = fspace_testutil::randn_vec(w.len(), &mut r);
    let f_at = |t: f64| {
        let mut n2 = net.clone();
        Network::set_params(&mut n2, &(&w + &u * t)).unwrap();
        Network::forward(&n2, &x).unwrap()
    };
    let fd = (f_at(1e-6) - f_at(-1e-6)) / 2e-6;
    fspace_testutil::assert_mat_close(&Network::jvp(&net, &x, &u).unwrap(), &fd, 1e-6, 1e-8);
    // Adjoint identity ⟨J u, V⟩ = ⟨u, Jᵀ V⟩ and the Jacobian's consistency with both.
    let v = fspace_testutil::randn(7, 2, &mut r);
    let lhs = Network::jvp(&net, &x, &u).unwrap().dot(&v);
    let rhs = u.dot(&Network::vjp(&net, &x, &v).unwrap());
    assert!((lhs - rhs).abs() < 1e-10 * lhs.abs().max(1.0));
    let jac = Network::jacobian(&net, &x).unwrap();
    let ju = &jac * &u;
    let jvp = Network::jvp(&net, &x, &u).unwrap();
    assert!((0..7).all(|i| (0..2).all(|o| (ju[i * 2 + o] - jvp[(i, o)]).abs() < 1e-10)));
    // The forwarded multi-column and fused products equal the inner network's at the features.
    let u2 = fspace_testutil::randn(w.len(), 3, &mut r);
    let l2 = fspace_testutil::randn(14, 3, &mut r);
    fspace_testutil::assert_mat_close(
        &Network::jvp_columns(&net, &x, &u2).unwrap(),
        &Network::jvp_columns(&inner, &phi, &u2).unwrap(),
        0.0,
        0.0,
    );
    fspace_testutil::assert_mat_close(
        &Network::vjp_columns(&net, &x, &l2).unwrap(),
        &Network::vjp_columns(&inner, &phi, &l2).unwrap(),
        0.0,
        0.0,
    );
    let (f, g) = Network::forward_vjp(&net, &x, &mut |f: &DMatrix<f64>| Ok(f * 2.0)).unwrap();
    let f_ref = Network::forward(&net, &x).unwrap();
    fspace_testutil::assert_mat_close(&f, &f_ref, 0.0, 0.0);
    let g_ref = Network::vjp(&net, &x, &(&f_ref * 2.0)).unwrap();
    assert!((g - &g_ref).amax() < 1e-12 * g_ref.amax().max(1.0));
    // Bad setups: the map's output must match the network's input; inputs must have 1 column.
    assert!(Featurized::new(FeatureMap::Identity, 1, inner.clone()).is_err());
    assert!(Featurized::new(FeatureMap::Periodic { column: 0, period: -1.0 }, 1, inner).is_err());
    assert!(Network::forward(&net, &DMatrix::zeros(3, 2)).is_err());
}

#[test]
fn training_rejects_bad_setups() {
    let mut net = sine_net(0);
    let mut lik = Gaussian::new(0.1).unwrap();
    let x = DMatrix::zeros(5, 1);
    assert!(train_map(
        &mut net,
        &mut lik,
        &x,
        &DVector::zeros(4),
        None,
        None,
        &TrainConfig::default(),
        |_| {}
    )
    .is_err());
    let cfg = TrainConfig { schedule: Schedule::epochs(10).patience(3), ..Default::default() };
    assert!(train_map(&mut net, &mut lik, &x, &DVector::zeros(5), None, None, &cfg, |_| {}).is_err());
    let bad = DVector::from_element(5, f64::NAN);
    assert!(train_map(&mut net, &mut lik, &x, &bad, None, None, &TrainConfig::default(), |_| {}).is_err());
}

#[test]
fn the_gaussian_noise_scale_is_learned_jointly() {
    // Start from σ = 1 on data with σ = 0.1: the learned σ lands near the truth, and with
    // `learn_likelihood = false` it is left alone.
    let train = fspace_data::sine(200, 0.1, &mut rng(3)).unwrap();
    let mut net = sine_net(1);
    let mut lik = Gaussian::new(1.0).unwrap();
    let cfg = TrainConfig {
        schedule: Schedule::epochs(1500),
        batch_size: 100,
        learning_rate: 5e-3,
        learn_likelihood: true,
        ..Default::default()
    };
    train_map(&mut net, &mut lik, &train.x, &train.y_vec(), None, None, &cfg, |_| {}).unwrap();
    eprintln!("learned σ = {:.4} (true 0.1)", lik.sigma());
    assert!((0.07..0.13).contains(&lik.sigma()), "learned σ {}", lik.sigma());
    let mut fixed = Gaussian::new(1.0).unwrap();
    let cfg = TrainConfig { schedule: Schedule::epochs(2), learn_likelihood: false, ..cfg };
    train_map(&mut sine_net(1), &mut fixed, &train.x, &train.y_vec(), None, None, &cfg, |_| {}).unwrap();
    assert_eq!(fixed.sigma(), 1.0);
}

/// `jvp_columns` / `vjp_columns` (a shared forward trace for the MLP and the CNN; for the
/// Helmholtz net one Jacobian per chunk of 16 points for `J·U` and the trait's per-column
/// default for `Jᵀ·L`) equal one `jvp` / `vjp` per column, on batches that span several CNN
/// and Helmholtz chunks; bad shapes and NaN are typed errors.
#[test]
fn multi_column_products_equal_one_product_per_column() {
    let mlp = Mlp::new(MlpConfig {
        input_dim: 3,
        hidden: vec![7, 5],
        output_dim: 2,
        activation: Activation::Tanh,
        seed: 1,
    })
    .unwrap();
    let cnn = Cnn::new(CnnConfig {
        input_shape: (1, 6, 6),
        convs: vec![ConvBlock { channels: 3, kernel: 3, same_padding: true, pool: true }],
        hidden: vec![5],
        output_dim: 3,
        activation: Activation::Tanh,
        seed: 2,
    })
    .unwrap();
    let helmholtz = HelmholtzNet::new(vec![6, 5], Activation::Tanh, 3).unwrap();
    let nets: [(&dyn Network, usize); 3] = [(&mlp, 40), (&cnn, 300), (&helmholtz, 37)];
    for (net, n) in nets {
        let (d, q, p, r) = (net.input_dim(), net.output_dim(), net.n_params(), 5);
        let x = DMatrix::from_fn(n, d, |i, j| ((i * 7 + j * 3) % 11) as f64 / 11.0 - 0.5);
        let u = DMatrix::from_fn(p, r, |i, j| (((i + 3 * j) % 13) as f64 - 6.0) * 0.05);
        let l = DMatrix::from_fn(n * q, r, |i, j| (((2 * i + j) % 9) as f64 - 4.0) * 0.1);
        let ju = net.jvp_columns(&x, &u).unwrap();
        let jtl = net.vjp_columns(&x, &l).unwrap();
        assert_eq!((ju.shape(), jtl.shape()), ((n * q, r), (p, r)));
        for j in 0..r {
            let f = net.jvp(&x, &u.column(j).into_owned()).unwrap();
            for i in 0..n {
                for o in 0..q {
                    assert!((ju[(i * q + o, j)] - f[(i, o)]).abs() <= 1e-12 * (1.0 + f[(i, o)].abs()));
                }
            }
            let v = DMatrix::from_fn(n, q, |i, o| l[(i * q + o, j)]);
            let g = net.vjp(&x, &v).unwrap();
            let scale = g.amax().max(1.0);
            assert!((jtl.column(j) - &g).amax() <= 1e-12 * scale);
        }
        assert!(matches!(
            net.jvp_columns(&x, &u.rows(0, p - 1).into_owned()),
            Err(NnError::Input(InputError::DimensionMismatch { .. }))
        ));
        assert!(matches!(
            net.vjp_columns(&x, &l.rows(0, n).into_owned()),
            Err(NnError::Input(InputError::DimensionMismatch { .. }))
        ));
        let mut bad = u.clone();
        bad[(1, 1)] = f64::NAN;
        assert!(matches!(net.jvp_columns(&x, &bad), Err(NnError::Input(InputError::NonFinite { .. }))));
    }
}

/// `train_map_sharded` on two threads where process 1's regulariser fails at its third call
/// (a callback network's error, say), and once where process 0's validation regulariser fails:
/// the failing process returns its own error and the other the reduce's — neither waits in a
/// later step's reduce. And without failures, the sharded run trains the single-process weights.
#[test]
fn a_regulariser_failing_on_one_process_fails_every_process() {
    let x = DMatrix::from_fn(40, 1, |i, _| i as f64 / 20.0 - 1.0);
    let y = x.column(0).map(|v| (3.0 * v).sin());
    let cfg = |validation_adds_regularizer| TrainConfig {
        schedule: Schedule::steps(8).every_steps(2),
        batch_size: 10,
        learning_rate: 1e-2,
        validation_adds_regularizer,
        ..Default::default()
    };
    let run = |fail_rank: Option<usize>, fail_at: usize, adds: bool| {
        let reducer = fspace_testutil::ThreadReduce::new(2);
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..2)
                .map(|rank| {
                    let (reducer, x, y, cfg) = (&reducer, &x, &y, cfg(adds));
                    scope.spawn(move || {
                        let mut net = sine_net(3);
                        let mut lik = Gaussian::new(0.1).unwrap();
                        let mut calls = 0usize;
                        let mut reg =
                            |net: &Mlp, _: &mut rand::rngs::StdRng| -> Result<(f64, DVector<f64>)> {
                                calls += 1;
                                if Some(rank) == fail_rank && calls == fail_at {
                                    return Err(NnError::Callback("the regulariser failed here".into()));
                                }
                                let w = net.params();
                                Ok((0.5 * 1e-3 * w.norm_squared(), w * 1e-3))
                            };
                        let hook: &mut Regularizer<'_, Mlp> = &mut reg;
                        let mut reduce = |part: DVector<f64>, failed: bool| {
                            reducer
                                .reduce(rank, part, failed)
                                .ok_or_else(|| NnError::Callback("another process failed".into()))
                        };
                        let shard = fspace_core::ProcessShard { rank, world: 2, reduce: &mut reduce };
                        let rows: Vec<usize> = (rank * 20..rank * 20 + 20).collect();
                        let (xs, ys) = (x.select_rows(&rows), y.select_rows(&rows));
                        let val = (rank == 0).then_some((&xs, &ys));
                        train_map_sharded(&mut net, &mut lik, &xs, &ys, val, Some(hook), &cfg, |_| {}, shard)
                            .map(|_| net.params())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
        })
    };
    // In a step (the third call: the third step's regulariser).
    let results = run(Some(1), 3, false);
    assert!(results[0].as_ref().unwrap_err().to_string().contains("another process failed"));
    assert!(results[1].as_ref().unwrap_err().to_string().contains("the regulariser failed here"));
    // In a validation (the third call is the first validation's term: steps 1, 2, then it).
    let results = run(Some(0), 3, true);
    assert!(results[0].as_ref().unwrap_err().to_string().contains("the regulariser failed here"));
    assert!(results[1].as_ref().unwrap_err().to_string().contains("another process failed"));
    // No failure: both processes train the same weights.
    let results = run(None, 0, true);
    let (a, b) = (results[0].as_ref().unwrap(), results[1].as_ref().unwrap());
    assert_eq!(a, b);
}
