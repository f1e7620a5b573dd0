//! Mutation tests of every loader: a saved file of each persisted type, and a network file of
//! each binary format, is edited systematically (`fspace_testutil::mutate`: every array one
//! shorter / longer, every pair of dimensions swapped, every number set to NaN / −1 / 0 / 1 /
//! 1e308 / 10¹², every boolean flipped, every field removed, every enum tag changed to each other
//! variant), and under proptest several such edits together and random byte flips of the binary
//! formats. Each mutant must give an error, or a loaded value whose `predict` (and joint
//! samples) are finite — never a panic.

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};

use fspace::core::{Data, LikelihoodSpec, Persist, Posterior, Schedule};
use fspace::fsp_laplace::{FspConfig, FspLaplace};
use fspace::gfsvi::{
    FviConfig, GfsviConfig, KlPrior, LinearizedPosterior, MfviConfig, OptimConfig, WeightSamplePosterior,
};
use fspace::gp::{
    ExactGp, InducingPoints, LaplaceGpClassifier, SparseDirichletConfig, SparseDirichletGp, Svgp, SvgpConfig,
};
use fspace::interop::{load_cnn, load_mlp, LayerNames, SourceDtype, Tensors};
use fspace::kernels::{GpPrior, PriorMean, Rbf};
use fspace::laplace::{LaplaceConfig, LaplacePosterior, SampledConfig, Structure};
use fspace::nn::{
    Activation, Cnn, CnnConfig, ConvBlock, FeatureMap, Featurized, HelmholtzNet, Mlp, MlpConfig, Network,
};
use fspace::valla::{EllaConfig, EllaPosterior, FeatureRoute, VallaConfig, VallaPosterior};
use fspace_testutil::mutate::{apply, json_mutants, Mutant};
use fspace_testutil::rng;
use nalgebra::DMatrix;
use proptest::prelude::*;
use rand::Rng;
use serde_json::Value;

thread_local! {
    static PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
    static CAPTURING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Keeps the panic messages of mutants (instead of printing them) so that a failure lists every
/// mutant; other panics go to the default hook.
fn quiet_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !CAPTURING.with(|c| c.get()) {
                return default(info);
            }
            let msg = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_default();
            let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
            PANIC.with(|p| *p.borrow_mut() = Some(format!("{msg}{at}")));
        }));
    });
}

/// What one mutant did.
#[derive(Debug)]
enum Verdict {
    /// The loader refused it.
    Refused,
    /// It loaded and every prediction was finite or a typed error.
    Served,
}

type Exercise = Box<dyn Fn(&str) -> Result<Verdict, String>>;
type Parse = Box<dyn Fn(&str) -> Result<(), String>>;

/// A saved file and how to load and use it.
struct Case {
    name: String,
    doc: Value,
    parse: Parse,
    exercise: Exercise,
}

fn finite(what: &str, m: &DMatrix<f64>) -> Result<(), String> {
    if m.iter().all(|v| v.is_finite()) {
        Ok(())
    } else {
        Err(format!("{what} has non-finite entries"))
    }
}

fn case<P: Persist + Posterior + 'static>(name: &str, post: &P, x: &DMatrix<f64>) -> Case {
    let text = post.to_json().unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    // The unmutated file serves.
    let x = x.clone();
    let exercise: Exercise = Box::new(move |t: &str| {
        let Ok(p) = P::from_json(t) else { return Ok(Verdict::Refused) };
        if let Ok(pred) = p.predict(&x) {
            finite("predictive mean", &pred.mean)?;
            finite("predictive variance", &pred.var)?;
        }
        if let Ok(draws) = p.sample_functions(&x, 2, &mut rng(7)) {
            for d in &draws {
                finite("function sample", d)?;
            }
        }
        Ok(Verdict::Served)
    });
    let parse = Box::new(|t: &str| P::from_json(t).map(|_| ()).map_err(|e| e.to_string()));
    let c = Case { name: name.to_string(), doc, parse, exercise };
    assert!(matches!((c.exercise)(&text), Ok(Verdict::Served)), "{name}: the saved file itself must load");
    c
}

/// Runs `text` through `exercise`, turning a panic into an error message.
fn run(exercise: &dyn Fn(&str) -> Result<Verdict, String>, text: &str) -> Result<Verdict, String> {
    PANIC.with(|p| p.borrow_mut().take());
    CAPTURING.with(|c| c.set(true));
    let outcome = catch_unwind(AssertUnwindSafe(|| exercise(text)));
    CAPTURING.with(|c| c.set(false));
    match outcome {
        Ok(v) => v,
        Err(_) => Err(format!("panic: {}", PANIC.with(|p| p.borrow_mut().take()).unwrap_or_default())),
    }
}

fn regression_set() -> (DMatrix<f64>, DMatrix<f64>) {
    let mut r = rng(1);
    let x: DMatrix<f64> = DMatrix::from_fn(16, 1, |_, _| r.gen_range(-2.0..2.0));
    let y = x.map(|v| v.sin());
    (x, y)
}

fn class_set() -> (DMatrix<f64>, DMatrix<f64>) {
    let mut r = rng(2);
    let x = DMatrix::from_fn(18, 2, |_, _| r.gen_range(-2.0..2.0));
    let y = DMatrix::from_fn(18, 1, |i, _| (i % 3) as f64);
    (x, y)
}

fn mlp(d: usize, hidden: usize, q: usize) -> Mlp {
    Mlp::new(MlpConfig {
        input_dim: d,
        hidden: vec![hidden],
        output_dim: q,
        activation: Activation::Tanh,
        seed: 3,
    })
    .unwrap()
}

fn tiny_cnn_config() -> CnnConfig {
    CnnConfig {
        input_shape: (1, 4, 4),
        convs: vec![ConvBlock { channels: 2, kernel: 3, same_padding: true, pool: true }],
        hidden: vec![3],
        output_dim: 2,
        activation: Activation::Tanh,
        seed: 4,
    }
}

/// One saved file of every persisted type (every Laplace structure, both ELLA feature routes,
/// GFSVI and TFSVI, FVI and MFVI, every GP), each on a tiny problem.
fn cases() -> Vec<Case> {
    let (x, y) = regression_set();
    let (xc, yc) = class_set();
    let xt = DMatrix::from_column_slice(4, 1, &[-3.0, -0.5, 0.7, 2.5]);
    let xct = xc.rows(0, 4).into_owned();
    // The training sets double as validation sets (early stopping, ELLA's λ): only the saved
    // files matter here.
    let data = Data::new(&x, &y).unwrap().with_validation(&x, &y).unwrap();
    let cdata = Data::new(&xc, &yc).unwrap().with_validation(&xc, &yc).unwrap();
    // Laplace refuses a validation set (it would not use it).
    let (plain, cplain) = (Data::new(&x, &y).unwrap(), Data::new(&xc, &yc).unwrap());
    let gauss = LikelihoodSpec::gaussian(0.2);
    let mut out = Vec::new();

    let structures = [
        ("full", Structure::full()),
        ("diag", Structure::Diag),
        ("block-diag", Structure::block_diag()),
        ("kfac", Structure::Kfac),
        ("ekfac", Structure::Ekfac),
        ("last-layer", Structure::last_layer()),
        ("low-rank", Structure::low_rank(3)),
        ("sampled", Structure::Sampled(SampledConfig { samples: 4, em_steps: 1, ..Default::default() })),
    ];
    for (name, s) in structures {
        let cfg = LaplaceConfig { structure: s, ..Default::default() };
        let post = fspace::laplace::fit(mlp(1, 4, 1), gauss, &plain, &cfg).unwrap().posterior;
        out.push(case(&format!("Laplace {name}"), &post, &xt));
    }
    let cfg = LaplaceConfig { structure: Structure::Kfac, ..Default::default() };
    let post =
        fspace::laplace::fit(mlp(2, 3, 3), LikelihoodSpec::categorical(3), &cplain, &cfg).unwrap().posterior;
    out.push(case("Laplace categorical kfac", &post, &xct));
    let cnn = Cnn::new(tiny_cnn_config()).unwrap();
    let mut r = rng(5);
    let ximg = DMatrix::from_fn(6, 16, |_, _| r.gen_range(-1.0..1.0));
    let yimg = DMatrix::from_fn(6, 1, |i, _| (i % 2) as f64);
    let idata = Data::new(&ximg, &yimg).unwrap();
    let post = fspace::laplace::fit(cnn, LikelihoodSpec::categorical(2), &idata, &cfg).unwrap().posterior;
    out.push(case::<LaplacePosterior<Cnn>>("Laplace CNN kfac", &post, &ximg.rows(0, 3).into_owned()));

    let prior = GpPrior::centered(Rbf::new(1.0, 0.7).unwrap());
    let fcfg = FspConfig {
        schedule: Schedule::epochs(3),
        batch_size: 8,
        n_context: 6,
        n_laplace_context: 8,
        ..Default::default()
    };
    let fsp = fspace::fsp_laplace::fit(mlp(1, 4, 1), gauss, &prior, &data, &fcfg).unwrap().posterior;
    out.push(case::<FspLaplace<Mlp>>("FSP-Laplace", &fsp, &xt));

    let vcfg = VallaConfig {
        num_inducing: 4,
        schedule: Schedule::steps(10).every_steps(5),
        batch_size: 8,
        ..Default::default()
    };
    let valla = fspace::valla::fit(mlp(1, 4, 1), gauss, &data, &vcfg).unwrap().posterior;
    out.push(case::<VallaPosterior<Mlp>>("VaLLA", &valla, &xt));
    let valla_c =
        fspace::valla::fit(mlp(2, 3, 3), LikelihoodSpec::categorical(3), &cdata, &vcfg).unwrap().posterior;
    out.push(case::<VallaPosterior<Mlp>>("VaLLA categorical", &valla_c, &xct));
    for route in [FeatureRoute::Jvp, FeatureRoute::Kernel] {
        let ecfg = EllaConfig { num_points: 6, num_eigen: 3, route, ..Default::default() };
        let ella = fspace::valla::ella::fit(mlp(1, 4, 1), gauss, &data, &ecfg).unwrap().posterior;
        out.push(case::<EllaPosterior<Mlp>>(&format!("ELLA {route:?}"), &ella, &xt));
    }

    let optim = OptimConfig { schedule: Schedule::steps(3), batch_size: 8, ..Default::default() };
    let gcfg = GfsviConfig { measurement_points: 4, optim: optim.clone(), ..Default::default() };
    let gfsvi = fspace::gfsvi::fit(mlp(1, 4, 1), gauss, &KlPrior::Gp(prior.clone()), &data, &gcfg).unwrap();
    out.push(case::<LinearizedPosterior<Mlp>>("GFSVI", &gfsvi.posterior, &xt));
    let tfsvi =
        fspace::gfsvi::fit(mlp(1, 4, 1), gauss, &KlPrior::WeightPushforward { sigma_p: 0.5 }, &data, &gcfg)
            .unwrap();
    out.push(case::<LinearizedPosterior<Mlp>>("TFSVI", &tfsvi.posterior, &xt));
    let vcfg = FviConfig {
        n_uniform: 4,
        n_batch: 4,
        optim: optim.clone(),
        predictive_samples: 3,
        ..Default::default()
    };
    let fvi = fspace::gfsvi::fvi::fit(mlp(1, 4, 1), gauss, &prior, &data, &vcfg).unwrap();
    out.push(case::<WeightSamplePosterior<Mlp>>("FVI", &fvi.posterior, &xt));
    let mcfg = MfviConfig { optim, predictive_samples: 3, ..Default::default() };
    let mfvi = fspace::gfsvi::mfvi::fit(mlp(1, 4, 1), gauss, &data, &mcfg).unwrap();
    out.push(case::<WeightSamplePosterior<Mlp>>("MFVI", &mfvi.posterior, &xt));

    let rbf = |variance, lengthscale| Rbf::new(variance, lengthscale).unwrap();
    let exact_prior = GpPrior::with_kernel(rbf(1.0, 0.5), PriorMean::Constant(0.1));
    let exact = fspace::gp::exact::fit(LikelihoodSpec::gaussian(0.1), &exact_prior, &plain).unwrap();
    out.push(case::<ExactGp<Rbf>>("exact GP", &exact.posterior, &xt));
    let scfg = SvgpConfig {
        schedule: Schedule::steps(3),
        inducing: InducingPoints::Given(x.rows(0, 5).into_owned()),
        ..Default::default()
    };
    let svgp_prior = GpPrior::with_kernel(rbf(1.0, 0.5), PriorMean::Zero);
    let svgp =
        fspace::gp::svgp::fit(LikelihoodSpec::gaussian_learned(0.05f64.sqrt()), &svgp_prior, &plain, &scfg)
            .unwrap();
    out.push(case::<Svgp<Rbf>>("SVGP", &svgp.posterior, &xt));
    let labels = x.map(|v| if v > 0.0 { 1.0 } else { 0.0 });
    let bdata = Data::new(&x, &labels).unwrap();
    let clf_prior = GpPrior::with_kernel(rbf(2.0, 1.0), PriorMean::Zero);
    let clf =
        fspace::gp::classification::fit(LikelihoodSpec::Bernoulli, &clf_prior, &bdata, &Default::default())
            .unwrap();
    out.push(case::<LaplaceGpClassifier<Rbf>>("GP classifier", &clf.posterior, &xt));
    let dcfg = SparseDirichletConfig {
        inducing: InducingPoints::Given(xc.rows(0, 5).into_owned()),
        ..Default::default()
    };
    let sparse_prior = GpPrior::with_kernel(rbf(1.0, 1.0), PriorMean::Zero);
    let sparse =
        fspace::gp::sparse_dirichlet::fit(LikelihoodSpec::categorical(3), &sparse_prior, &cplain, &dcfg)
            .unwrap()
            .posterior;
    out.push(case::<SparseDirichletGp<Rbf>>("sparse Dirichlet GP", &sparse, &xct));
    out
}

/// A network as JSON: it loads only whole (the types check themselves when deserialised).
fn network_case<N: Network + serde::Serialize + serde::de::DeserializeOwned + 'static>(
    name: &str,
    net: &N,
    x: &DMatrix<f64>,
) -> Case {
    let doc = serde_json::to_value(net).unwrap();
    let x = x.clone();
    let exercise: Exercise = Box::new(move |t: &str| {
        let Ok(n) = serde_json::from_str::<N>(t) else { return Ok(Verdict::Refused) };
        // Finite weights can still overflow (1e308): a network promises no panic, and that a
        // loaded one computes; posteriors turn non-finite outputs into typed errors.
        let _ = n.forward(&x);
        Ok(Verdict::Served)
    });
    let parse = Box::new(|t: &str| serde_json::from_str::<N>(t).map(|_| ()).map_err(|e| e.to_string()));
    Case { name: name.to_string(), doc, parse, exercise }
}

fn network_cases() -> Vec<Case> {
    let x1 = DMatrix::from_column_slice(3, 1, &[-1.0, 0.0, 2.0]);
    let x2 = DMatrix::from_row_slice(2, 2, &[0.1, 0.2, -0.3, 0.4]);
    let mut r = rng(6);
    let ximg = DMatrix::from_fn(2, 16, |_, _| r.gen_range(-1.0..1.0));
    let feat = Featurized::new(FeatureMap::Periodic { column: 0, period: 1.5 }, 1, mlp(3, 3, 1)).unwrap();
    vec![
        network_case("Mlp", &mlp(1, 3, 2), &x1),
        network_case("Cnn", &Cnn::new(tiny_cnn_config()).unwrap(), &ximg),
        network_case("HelmholtzNet", &HelmholtzNet::new(vec![3], Activation::Tanh, 1).unwrap(), &x2),
        network_case("Featurized<Mlp>", &feat, &x1),
    ]
}

fn check_all(cases: &[Case]) {
    quiet_panics();
    let mut failures = Vec::new();
    let (mut total, mut refused) = (0, 0);
    for c in cases {
        let mutants = json_mutants(&c.doc, &c.parse);
        for m in &mutants {
            let mut d = c.doc.clone();
            apply(&mut d, m);
            total += 1;
            match run(&c.exercise, &serde_json::to_string(&d).unwrap()) {
                Ok(Verdict::Refused) => refused += 1,
                Ok(Verdict::Served) => {}
                Err(e) => failures.push(format!("{}: {}: {e}", c.name, m.description)),
            }
        }
    }
    println!("{total} mutants, {refused} refused, {} failures", failures.len());
    assert!(failures.is_empty(), "{} of {total} mutants failed:\n{}", failures.len(), summary(&failures));
}

/// One line per kind of failure (array indices folded to `#`), with its count and first message.
fn summary(failures: &[String]) -> String {
    let mut kinds: std::collections::BTreeMap<String, (usize, &String)> = Default::default();
    for f in failures {
        let key: String = f.split(": ").take(2).collect::<Vec<_>>().join(": ");
        let key: String = key.chars().map(|c| if c.is_ascii_digit() { '#' } else { c }).collect();
        kinds.entry(key).or_insert((0, f)).0 += 1;
    }
    kinds.iter().map(|(_, (n, f))| format!("{n:>5} × {f}")).collect::<Vec<_>>().join("\n")
}

#[test]
fn every_single_edit_of_every_saved_posterior_is_refused_or_serves_finite_predictions() {
    check_all(&cases());
}

#[test]
fn every_single_edit_of_every_network_json_is_refused_or_computes() {
    check_all(&network_cases());
}

/// Several edits at once: proptest picks them from each file's single-edit list.
#[test]
fn combined_edits_are_refused_or_serve_finite_predictions() {
    quiet_panics();
    let cases = cases();
    let lists: Vec<Vec<Mutant>> = cases.iter().map(|c| json_mutants(&c.doc, &c.parse)).collect();
    let config = ProptestConfig { cases: 192, failure_persistence: None, ..ProptestConfig::default() };
    proptest!(config, |(which in 0..cases.len(), picks in prop::collection::vec(any::<prop::sample::Index>(), 2..5))| {
        let c = &cases[which];
        let mut d = c.doc.clone();
        let mut names = Vec::new();
        for pick in &picks {
            let m = pick.get(&lists[which]);
            apply(&mut d, m);
            names.push(m.description.clone());
        }
        let outcome = run(&c.exercise, &serde_json::to_string(&d).unwrap());
        prop_assert!(outcome.is_ok(), "{}: {names:?}: {:?}", c.name, outcome);
    });
}

// ---------------------------------------------------------------------------------------------
// Binary network files.

fn mlp_config() -> MlpConfig {
    MlpConfig { input_dim: 2, hidden: vec![3], output_dim: 2, activation: Activation::Tanh, seed: 8 }
}

fn finite_weights(w: &nalgebra::DVector<f64>) -> Result<(), String> {
    if w.iter().all(|v| v.is_finite()) {
        Ok(())
    } else {
        Err("a network loaded with non-finite weights".into())
    }
}

/// Loads an MLP (or the tiny CNN) from `bytes` and runs it; panics are the failures.
fn exercise_bytes(bytes: &[u8], npz: bool, cnn: bool) -> Result<Verdict, String> {
    let tensors = if npz {
        Tensors::from_npz_bytes(bytes, "mutant.npz")
    } else {
        Tensors::from_safetensors_bytes(bytes, "mutant.safetensors")
    };
    let Ok(tensors) = tensors else { return Ok(Verdict::Refused) };
    let names = LayerNames::default();
    if cnn {
        let Ok(net) = load_cnn(&tensors, &tiny_cnn_config(), &names) else { return Ok(Verdict::Refused) };
        finite_weights(&net.params())?;
        let _ = net.forward(&DMatrix::from_element(2, 16, 0.3));
    } else {
        let Ok(net) = load_mlp(&tensors, &mlp_config(), &names) else { return Ok(Verdict::Refused) };
        finite_weights(&net.params())?;
        let _ = net.forward(&DMatrix::from_element(2, 2, 0.3));
    }
    Ok(Verdict::Served)
}

/// The four network files: MLP and CNN, safetensors (f32) and npz (f64).
fn network_files() -> Vec<(String, Vec<u8>, bool, bool)> {
    let mlp_t = fspace::interop::mlp_tensors(&Mlp::new(mlp_config()).unwrap());
    let cnn_t = fspace::interop::cnn_tensors(&Cnn::new(tiny_cnn_config()).unwrap());
    vec![
        ("MLP safetensors".into(), mlp_t.to_safetensors_bytes(SourceDtype::F32).unwrap(), false, false),
        ("MLP npz".into(), mlp_t.to_npz_bytes().unwrap(), true, false),
        ("CNN safetensors".into(), cnn_t.to_safetensors_bytes(SourceDtype::F64).unwrap(), false, true),
        ("CNN npz".into(), cnn_t.to_npz_bytes().unwrap(), true, true),
    ]
}

/// Every truncation, and every edit of the safetensors JSON header (re-framed with its true
/// length, so that the edit itself is what the loader sees).
#[test]
fn every_truncation_and_header_edit_of_the_network_files_is_refused_or_loads_whole() {
    quiet_panics();
    let mut failures = Vec::new();
    let mut total = 0;
    for (name, bytes, npz, cnn) in network_files() {
        assert!(matches!(exercise_bytes(&bytes, npz, cnn), Ok(Verdict::Served)), "{name} must load");
        let ex = |b: &[u8]| run(&|_: &str| exercise_bytes(b, npz, cnn), "");
        for cut in 0..bytes.len() {
            total += 1;
            if let Err(e) = ex(&bytes[..cut]) {
                failures.push(format!("{name} cut at {cut}: {e}"));
            }
        }
        if !npz {
            let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
            let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
            let frame = |h: &Value| {
                let text = serde_json::to_vec(h).unwrap();
                let mut out = (text.len() as u64).to_le_bytes().to_vec();
                out.extend(text);
                out.extend(&bytes[8 + n..]);
                out
            };
            let parse = |t: &str| -> Result<(), String> {
                let h: Value = serde_json::from_str(t).map_err(|e| e.to_string())?;
                Tensors::from_safetensors_bytes(&frame(&h), "x").map(|_| ()).map_err(|e| e.to_string())
            };
            for m in json_mutants(&header, &parse) {
                let mut h = header.clone();
                apply(&mut h, &m);
                total += 1;
                if let Err(e) = ex(&frame(&h)) {
                    failures.push(format!("{name} header {}: {e}", m.description));
                }
            }
            // A header length past the end of the file, and an absurd one.
            for len in [n as u64 + 1, bytes.len() as u64, u64::MAX / 2] {
                let mut b = bytes.clone();
                b[..8].copy_from_slice(&len.to_le_bytes());
                total += 1;
                if let Err(e) = ex(&b) {
                    failures.push(format!("{name} header length {len}: {e}"));
                }
            }
        }
    }
    println!("{total} mutants, {} failures", failures.len());
    assert!(failures.is_empty(), "{:#?}", failures.iter().take(40).collect::<Vec<_>>());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]
    /// Random byte flips anywhere in the network files.
    #[test]
    fn byte_flips_in_network_files_are_refused_or_load_whole(
        which in 0usize..4,
        flips in prop::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..6),
    ) {
        quiet_panics();
        let (name, mut bytes, npz, cnn) = network_files().swap_remove(which);
        for (at, mask) in &flips {
            let i = at.index(bytes.len());
            bytes[i] ^= mask;
        }
        let outcome = run(&|_: &str| exercise_bytes(&bytes, npz, cnn), "");
        prop_assert!(outcome.is_ok(), "{name}: {:?}", outcome);
    }
}
