//! The registry: every experiment, with the flags it accepts and its measured full-setting wall
//! time. Each experiment file imports only [`crate::harness`], [`crate::protocols`] and the
//! library crates.

use crate::harness::registry::{Experiment, Flag};

pub mod fsp_ablation;
pub mod fsp_bayesopt;
pub mod fsp_images;
pub mod fsp_mauna_loa;
pub mod fsp_moons;
pub mod fsp_null_space;
pub mod fsp_ocean;
pub mod fsp_toy;
pub mod fsp_uci;
pub mod gfsvi_figures;
pub mod gfsvi_toy;
pub mod gfsvi_uci;
pub mod gfsvi_w2;
pub mod gl_cubic;
pub mod gl_mnist;
pub mod nn_speed;
pub mod perf;
pub mod valla_images;
pub mod valla_regression;
pub mod valla_toy;

/// Every experiment, in the order the default suite runs them. `full_minutes` is the wall time
/// of the last timed full run on 2 cores (the commit and date are in `docs/results/README.md` or
/// the run's `RUN.md`), `None` where no full run was timed.
pub const EXPERIMENTS: &[Experiment] = &[
    Experiment {
        name: "fsp-toy-regression",
        paper: "FSP-Laplace Fig. 1, C.1–C.4 (sine regression, 7 priors vs. exact GP)",
        in_default_suite: true,
        flags: &[],
        full_minutes: Some(1.0),
        budget_of: None,
        run: fsp_toy::run,
        redraw: None,
    },
    Experiment {
        name: "fsp-mauna-loa",
        paper: "FSP-Laplace Table 1 (Mauna Loa) and Fig. C.9: FSP-Laplace, FVI, Laplace, GP forecasts of NOAA CO₂ 1974–2024",
        in_default_suite: false,
        flags: &[Flag::Seeds, Flag::Resume],
        full_minutes: Some(11.5),
        budget_of: None,
        run: fsp_mauna_loa::run,
        redraw: None,
    },
    Experiment {
        name: "fsp-ocean",
        paper: "FSP-Laplace Table 1 (ocean current) and Fig. 2: Helmholtz FSP-Laplace, FVI, Laplace, GP on the Gulf drifters",
        in_default_suite: false,
        flags: &[Flag::Seeds, Flag::Resume],
        full_minutes: Some(27.8),
        budget_of: None,
        run: fsp_ocean::run,
        redraw: None,
    },
    Experiment {
        name: "fsp-uci",
        paper: "FSP-Laplace Table C.1: ELL and OOD accuracy on the shipped UCI sets (FSP-Laplace, FVI, Laplace, MAP, GP, sparse GP)",
        in_default_suite: false,
        flags: &[Flag::Seeds, Flag::Resume],
        full_minutes: Some(21.4),
        budget_of: None,
        run: fsp_uci::run,
        redraw: None,
    },
    Experiment {
        name: "fsp-bayesopt",
        paper: "FSP-Laplace Fig. 3: BO on Branin, Ackley-4, Hartmann-6, polynomial-8, BNN-draw-10 and the Brusselator PDE with FSP-Laplace, Laplace, FVI and GP surrogates",
        in_default_suite: false,
        flags: &[Flag::Seeds, Flag::Resume],
        // 5 seeds of 859 s (seed 0 at e291b1e; 2 804 s before Alg. 2 kept its kernel tiles,
        // the record of 2026-11-27 on one full `fsp-bayesopt` seed, `git show 838ffc8:docs/performance-history.md`).
        full_minutes: Some(71.6),
        budget_of: None,
        run: fsp_bayesopt::run,
        redraw: None,
    },
    Experiment {
        name: "fsp-bayesopt-covariance",
        paper: "FSP-Laplace Fig. 3's covariance budget: BO on Hartmann-6 with FSP-Laplace, 500, 2 000 and the paper's 10 000 Latin-hypercube covariance points",
        in_default_suite: false,
        flags: &[Flag::Seeds, Flag::Resume, Flag::CovariancePoints],
        // The 10 000-point row is not yet timed whole (docs/PERFORMANCE.md, "The long
        // experiments", has its measured quick budget and projection).
        full_minutes: None,
        budget_of: None,
        run: fsp_bayesopt::run_covariance_sweep,
        redraw: None,
    },
    Experiment {
        name: "fsp-two-moons",
        paper: "FSP-Laplace Fig. C.5, C.6 (two moons, RBF and Matérn-1/2)",
        in_default_suite: true,
        flags: &[],
        full_minutes: Some(1.1),
        budget_of: None,
        run: fsp_moons::run,
        redraw: None,
    },
    Experiment {
        name: "fsp-context-ablation",
        paper: "FSP-Laplace Fig. C.7, C.8 (M ∈ {3, 5, 10, 100} training context points)",
        in_default_suite: true,
        flags: &[],
        full_minutes: Some(1.1),
        budget_of: None,
        run: fsp_ablation::run,
        redraw: None,
    },
    Experiment {
        name: "fsp-null-space",
        paper: "FSP-Laplace Table C.2 (‖P₀ΛP₀ᵀ‖_F / ‖Λ‖_F)",
        in_default_suite: true,
        flags: &[],
        full_minutes: Some(0.45),
        budget_of: None,
        run: fsp_null_space::run,
        redraw: None,
    },
    Experiment {
        name: "gl-cubic-toy",
        paper: "Generalized Laplace Fig. 2 (cubic toy: Diag, KFAC, EKFAC, B-Diag, full GGN)",
        in_default_suite: true,
        flags: &[],
        full_minutes: Some(0.01),
        budget_of: None,
        run: gl_cubic::run,
        redraw: None,
    },
    Experiment {
        name: "gl-mnist-temperature",
        paper: "Generalized Laplace Fig. 3, 5 (LeNet-5 on MNIST, T from 0.1 to 10, Diag/KFAC/EKFAC)",
        in_default_suite: false,
        flags: &[],
        full_minutes: Some(20.4),
        budget_of: None,
        run: gl_mnist::run,
        redraw: None,
    },
    Experiment {
        name: "fsp-mnist",
        paper: "FSP-Laplace Table 2, Fig. C.10 (MNIST CNN: FSP-Laplace RND, Laplace KFAC, MAP; LL, ACC, ECE, OOD vs FMNIST)",
        in_default_suite: false,
        flags: &[Flag::Seeds, Flag::Resume],
        // 5 seeds × 1 352 s (seed 0 at `bcab956`; `git show 838ffc8:docs/performance-history.md`).
        full_minutes: Some(100.1),
        budget_of: None,
        run: fsp_images::run_mnist,
        redraw: Some(fsp_images::redraw_mnist),
    },
    Experiment {
        name: "fsp-fmnist",
        paper: "FSP-Laplace Table 2, Fig. C.10 (Fashion-MNIST CNN: the same columns; OOD vs MNIST)",
        in_default_suite: false,
        flags: &[Flag::Seeds, Flag::Resume],
        full_minutes: Some(175.0),
        budget_of: None,
        run: fsp_images::run_fmnist,
        redraw: Some(fsp_images::redraw_fmnist),
    },
    Experiment {
        name: "fsp-mnist-halton",
        paper: "FSP-Laplace Table 2's covariance budget: MNIST FSP-Laplace (RND) with 250 … 4 000 Halton points (paper: 25 000), one trained network",
        in_default_suite: false,
        flags: &[],
        full_minutes: Some(27.8),
        budget_of: None,
        run: fsp_images::run_halton_sweep,
        redraw: None,
    },
    Experiment {
        name: "fsp-rotated",
        paper: "FSP-Laplace Fig. C.11: predictive entropy of rotated MNIST / Fashion-MNIST test images (FSP-Laplace, MAP, Laplace KFAC, sparse GP)",
        in_default_suite: false,
        flags: &[],
        full_minutes: None,
        budget_of: None,
        run: fsp_images::run_rotated,
        redraw: None,
    },
    Experiment {
        name: "nn-epoch-timer",
        paper: "network speed: one MNIST epoch and per-batch f / J·u / Jᵀ·V of MLP, LeNet-5, FSP CNN beside PyTorch 2 CPU",
        in_default_suite: false,
        flags: &[],
        full_minutes: Some(0.5),
        budget_of: None,
        run: nn_speed::run,
        redraw: None,
    },
    Experiment {
        name: "perf",
        paper: "speed targets: GFSVI step against its GEMM bound, LeNet-5 / FSP CNN epochs (beside PyTorch run live when importable), FSP toy prior, W1 full LLA (≤ 3 min)",
        in_default_suite: false,
        flags: &[],
        full_minutes: Some(1.2),
        budget_of: None,
        run: perf::run,
        redraw: None,
    },
    Experiment {
        name: "valla-toy",
        paper: "VaLLA Figs. 1, 6, 7 (1-D gap toy: VaLLA M ∈ {5, 10, 20}, ELLA, exact LLA; early stopping)",
        in_default_suite: false,
        flags: &[],
        full_minutes: Some(1.5),
        budget_of: None,
        run: valla_toy::run,
        redraw: None,
    },
    Experiment {
        name: "valla-mnist",
        paper: "VaLLA Fig. 3 (MNIST: MAP, LLA Diag/KFAC, last-layer LLA (+KFAC), ELLA, Sampled LLA, VaLLA 100/200; OOD vs FMNIST; fit times)",
        in_default_suite: false,
        flags: &[Flag::Seeds, Flag::Resume, Flag::Methods],
        // The other rows took 3 264 s for seed 0 at 62f219e (docs/results/valla-mnist); the
        // Sampled LLA row adds more than 2 h per seed at the full size (DEVIATIONS V5); untimed
        // in full.
        full_minutes: None,
        budget_of: None,
        run: valla_images::run_mnist,
        redraw: Some(valla_images::redraw_mnist),
    },
    Experiment {
        name: "valla-mnist-quick",
        paper: "VaLLA Fig. 3 with the --quick budget (3 000 training images, 5 MAP epochs, 200 VaLLA steps), every row including Sampled LLA",
        in_default_suite: false,
        flags: &[Flag::Resume, Flag::Methods],
        // 262 s at efcacaf (then written by `valla-mnist --quick`); 834 s at 62f219e on a
        // machine whose GEMMs ran ≈ 3× slower (the same 198 products: docs/results/README.md).
        full_minutes: Some(4.4),
        budget_of: Some("valla-mnist"),
        run: valla_images::run_mnist_quick,
        redraw: None,
    },
    Experiment {
        name: "valla-fmnist",
        paper: "VaLLA Fig. 4 (FMNIST: the same methods; OOD vs MNIST; rotated FMNIST ECE/NLL; fit times)",
        in_default_suite: false,
        flags: &[Flag::Seeds, Flag::Resume, Flag::Methods],
        // 5 seeds of 475 s (seed 0; the record of 2026-11-26 on k-means and Alg. 2's kernel tiles, `git show 838ffc8:docs/performance-history.md`).
        full_minutes: Some(39.6),
        budget_of: None,
        run: valla_images::run_fmnist,
        redraw: Some(valla_images::redraw_fmnist),
    },
    Experiment {
        name: "valla-regression",
        paper: "VaLLA Fig. 2 left (NLL, CRPS, CQM; 3×200 tanh) on the shipped Boston/concrete/wine sets (Airline/Year/Taxi unavailable)",
        in_default_suite: false,
        flags: &[Flag::Seeds, Flag::Resume],
        // 5 seeds of 203 s (seed 0; the record of 2026-11-26 on k-means and Alg. 2's kernel tiles, `git show 838ffc8:docs/performance-history.md`).
        full_minutes: Some(16.9),
        budget_of: None,
        run: valla_regression::run,
        redraw: Some(valla_regression::redraw),
    },
    Experiment {
        name: "valla-toy-quick",
        paper: "VaLLA Figs. 1, 6, 7 with the --quick budget (3 000 MAP, 2 000 VaLLA steps)",
        in_default_suite: true,
        flags: &[],
        full_minutes: Some(0.2),
        budget_of: Some("valla-toy"),
        run: valla_toy::run_quick,
        redraw: None,
    },
    Experiment {
        name: "gfsvi-toy",
        paper: "GFSVI Figs. 1, 2, 4–8 (sine toy: four priors vs exact GP; GFSVI/FVI/TFSVI/MFVI/Laplace; M sweep; σ_n = 1)",
        in_default_suite: false,
        flags: &[],
        full_minutes: Some(13.2),
        budget_of: None,
        run: gfsvi_toy::run,
        redraw: None,
    },
    Experiment {
        name: "gfsvi-toy-quick",
        paper: "GFSVI Figs. 1, 2, 4–8 with the --quick budget (1 500 steps, M = 100)",
        in_default_suite: true,
        flags: &[],
        full_minutes: Some(2.2),
        budget_of: Some("gfsvi-toy"),
        run: gfsvi_toy::run_quick,
        redraw: None,
    },
    Experiment {
        name: "gfsvi-activations",
        paper: "GFSVI Fig. 3 (ReLU 2×30 / 2×100 and tanh 2×30 networks under RBF and Matérn-1/2 priors vs the exact GP)",
        in_default_suite: false,
        flags: &[Flag::Resume],
        full_minutes: Some(43.6),
        budget_of: None,
        run: gfsvi_figures::run_activations,
        redraw: Some(gfsvi_figures::redraw_activations),
    },
    Experiment {
        name: "gfsvi-lengthscale",
        paper: "GFSVI Fig. 6 (RBF priors with lengthscale 0.1, 0.3, 1: GFSVI against the exact GP, sample roughness)",
        in_default_suite: false,
        flags: &[],
        full_minutes: Some(13.8),
        budget_of: None,
        run: gfsvi_figures::run_lengthscale,
        redraw: None,
    },
    Experiment {
        name: "gfsvi-gamma",
        paper: "GFSVI Figs. 10, 12 (fits with γ from 1e-10 to 1; D_KL^γ of a fit over γ and M, RBF and Matérn-1/2)",
        in_default_suite: false,
        flags: &[],
        full_minutes: Some(16.6),
        budget_of: None,
        run: gfsvi_figures::run_gamma,
        redraw: None,
    },
    Experiment {
        name: "gfsvi-uci",
        paper: "GFSVI Tables 1, 5 (ELL, MSE; 5-fold CV; GFSVI/FVI/TFSVI/MFVI/Laplace/SVGP/GP) on the shipped Boston/concrete/wine/yacht",
        in_default_suite: false,
        flags: &[Flag::Seeds, Flag::Resume, Flag::Gamma, Flag::Sets, Flag::Folds],
        full_minutes: Some(360.0),
        budget_of: None,
        run: gfsvi_uci::run_uci,
        redraw: None,
    },
    Experiment {
        name: "gfsvi-ood",
        paper: "GFSVI Table 3 (OOD accuracy of one threshold on Var[f]; digits stand in for the song subset; the same fits as gfsvi-uci, all three tables)",
        in_default_suite: false,
        flags: &[Flag::Seeds, Flag::Resume, Flag::Gamma, Flag::Sets, Flag::Folds],
        full_minutes: Some(360.0),
        budget_of: None,
        run: gfsvi_uci::run_ood,
        redraw: None,
    },
    Experiment {
        name: "gfsvi-w2",
        paper: "GFSVI Table 2 (per-point W2 to the exact GP: GFSVI, FVI, SVGP; 2×100 tanh, γ = 1e-15)",
        in_default_suite: false,
        flags: &[Flag::Seeds, Flag::Resume, Flag::Sets, Flag::Folds],
        full_minutes: Some(480.0),
        budget_of: None,
        run: gfsvi_w2::run,
        redraw: None,
    },
];

#[cfg(test)]
mod tests {
    use super::EXPERIMENTS;

    /// Every experiment that can redraw its figures redraws, from the committed run's
    /// `metrics.json` alone, exactly the figures that run committed beside it.
    #[test]
    fn every_committed_run_redraws_its_figures_from_its_metrics() {
        let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/results");
        let mut checked = 0;
        for e in EXPERIMENTS {
            let Some(redraw) = e.redraw else { continue };
            let committed = docs.join(e.name);
            let dir =
                std::env::temp_dir().join(format!("fspace-committed-{}-{}", std::process::id(), e.name));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::copy(committed.join("metrics.json"), dir.join("metrics.json")).unwrap();
            let written = redraw(&dir).unwrap_or_else(|err| panic!("{}: {err:#}", e.name));
            let mut names: Vec<_> = written
                .iter()
                .map(|p| {
                    assert!(p.starts_with(&dir) && p.exists(), "{}: {}", e.name, p.display());
                    p.file_name().unwrap().to_owned()
                })
                .collect();
            let mut pngs: Vec<_> = std::fs::read_dir(&committed)
                .unwrap()
                .map(|f| f.unwrap().file_name())
                .filter(|f| f.to_string_lossy().ends_with(".png"))
                .collect();
            names.sort();
            pngs.sort();
            assert_eq!(names, pngs, "{}", e.name);
            std::fs::remove_dir_all(&dir).unwrap();
            checked += 1;
        }
        assert_eq!(checked, 6);
    }
}
