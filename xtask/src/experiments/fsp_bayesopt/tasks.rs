//! The Bayesian-optimisation tasks of FSP-Laplace Fig. 3 (Li et al. 2024's setup): analytic
//! test functions, and the three tasks the authors' code defines beside them
//! (`data_utils/bayes_opt_utils` of `lenardrommel/laplax`, branch `fsp_laplace`): a random
//! polynomial, a random tanh network and the variance of a Brusselator reaction–diffusion
//! simulation. Every task is minimised here (the reward is `−f`); the authors maximise the
//! polynomial and the network and minimise the PDE's variance, so `f` is their objective's
//! negative for the first two.
//!
//! The polynomial's and the network's parameters are draws of the authors' distributions from
//! this crate's seeded generator: their draws are torch pickles in their repository, which a
//! machine without internet cannot fetch, so the tasks are the same random functions in
//! distribution, not the same functions.

use nalgebra::{DMatrix, DVector};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

/// A test function, minimised on a box.
#[derive(Debug, Clone, Copy)]
pub enum Task {
    /// Branin–Hoo on [−5, 10] × [0, 15]; minimum 0.397887.
    Branin,
    /// Ackley in `d` dimensions on [−32.768, 32.768]^d; minimum 0 at the origin.
    Ackley(usize),
    /// Hartmann-6 on [0, 1]^6; minimum −3.32237.
    Hartmann6,
    /// Minus the authors' `PolyDraw` on [0, 1]^d (`d` a multiple of 4; their config: 8):
    /// `Σ_j Π_{i<4} (x − c)_{i·d/4 + j}`, `c ~ N(0, I)` drawn once (seed 0).
    Polynomial(usize),
    /// Minus the authors' `BnnDraw` on [0, 1]^d (their config: `d` = 10, one output): a
    /// `d`-256-256-1 tanh network with every weight and bias `~ N(0, 1)`, drawn once (seed 0).
    Network(usize),
    /// The authors' `PDEVar`: the variance of the edge-weighted final state of a Brusselator on
    /// a 64 × 64 unit grid ([`brusselator_variance`]) over `(a, b, d₀, d₁)` in
    /// [0.1, 5]² × [0.01, 5]².
    Pde,
}

const HARTMANN_A: [[f64; 6]; 4] = [
    [10.0, 3.0, 17.0, 3.5, 1.7, 8.0],
    [0.05, 10.0, 17.0, 0.1, 8.0, 14.0],
    [3.0, 3.5, 1.7, 10.0, 17.0, 8.0],
    [17.0, 8.0, 0.05, 10.0, 0.1, 14.0],
];
const HARTMANN_P: [[f64; 6]; 4] = [
    [0.1312, 0.1696, 0.5569, 0.0124, 0.8283, 0.5886],
    [0.2329, 0.4135, 0.8307, 0.3736, 0.1004, 0.9991],
    [0.2348, 0.1451, 0.3522, 0.2883, 0.3047, 0.6650],
    [0.4047, 0.8828, 0.8732, 0.5743, 0.1091, 0.0381],
];
const HARTMANN_ALPHA: [f64; 4] = [1.0, 1.2, 3.0, 3.2];

impl Task {
    /// Name with dimension.
    pub fn name(&self) -> String {
        match self {
            Task::Branin => "Branin (2-d)".into(),
            Task::Ackley(d) => format!("Ackley ({d}-d)"),
            Task::Hartmann6 => "Hartmann (6-d)".into(),
            Task::Polynomial(d) => format!("Polynomial ({d}-d)"),
            Task::Network(d) => format!("BNN draw ({d}-d)"),
            Task::Pde => "PDE (4-d)".into(),
        }
    }
    /// Input dimension.
    pub fn dim(&self) -> usize {
        match self {
            Task::Branin => 2,
            Task::Ackley(d) | Task::Polynomial(d) | Task::Network(d) => *d,
            Task::Hartmann6 => 6,
            Task::Pde => 4,
        }
    }
    /// The search box `(lower, upper)`.
    pub fn bounds(&self) -> (Vec<f64>, Vec<f64>) {
        match self {
            Task::Branin => (vec![-5.0, 0.0], vec![10.0, 15.0]),
            Task::Ackley(d) => (vec![-32.768; *d], vec![32.768; *d]),
            Task::Hartmann6 => (vec![0.0; 6], vec![1.0; 6]),
            Task::Polynomial(d) | Task::Network(d) => (vec![0.0; *d], vec![1.0; *d]),
            Task::Pde => (vec![0.1, 0.1, 0.01, 0.01], vec![5.0; 4]),
        }
    }
    /// The global minimum value, where it is known (the network's and the PDE's are not).
    pub fn minimum(&self) -> Option<f64> {
        match self {
            Task::Branin => Some(0.397_887_357_729_738),
            Task::Ackley(_) => Some(0.0),
            Task::Hartmann6 => Some(-3.322_368_011_415_51),
            Task::Polynomial(d) => Some(-polynomial_max(*d)),
            Task::Network(_) | Task::Pde => None,
        }
    }
    /// `f(x)` at a point of the box.
    pub fn eval(&self, x: &[f64]) -> f64 {
        use std::f64::consts::PI;
        match self {
            Task::Branin => {
                let (a, b, c) = (1.0, 5.1 / (4.0 * PI * PI), 5.0 / PI);
                let (r, s, t) = (6.0, 10.0, 1.0 / (8.0 * PI));
                a * (x[1] - b * x[0] * x[0] + c * x[0] - r).powi(2) + s * (1.0 - t) * x[0].cos() + s
            }
            Task::Ackley(d) => {
                let n = *d as f64;
                let sq = x.iter().map(|v| v * v).sum::<f64>() / n;
                let cs = x.iter().map(|v| (2.0 * PI * v).cos()).sum::<f64>() / n;
                -20.0 * (-0.2 * sq.sqrt()).exp() - cs.exp() + 20.0 + std::f64::consts::E
            }
            Task::Hartmann6 => -(0..4)
                .map(|i| {
                    let e: f64 = (0..6).map(|j| HARTMANN_A[i][j] * (x[j] - HARTMANN_P[i][j]).powi(2)).sum();
                    HARTMANN_ALPHA[i] * (-e).exp()
                })
                .sum::<f64>(),
            Task::Polynomial(_) => -polynomial(x),
            Task::Network(_) => -network(x),
            Task::Pde => brusselator_variance(&[x[0], x[1], x[2], x[3]]),
        }
    }
    /// `f` at a point of the unit cube, mapped onto the box.
    pub(super) fn eval_unit(&self, u: &[f64]) -> f64 {
        let (lo, hi) = self.bounds();
        let x: Vec<f64> = u.iter().zip(lo.iter().zip(&hi)).map(|(v, (l, h))| l + v * (h - l)).collect();
        self.eval(&x)
    }
}

/// Hidden width of the random network task.
const NETWORK_WIDTH: usize = 256;

/// `n` standard normal draws from seed `seed`.
fn normals(n: usize, seed: u64) -> Vec<f64> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| Distribution::<f64>::sample(&StandardNormal, &mut rng)).collect()
}

/// The polynomial's centres `c` (`d` values), drawn from seed 0 at every call (cheaper than the
/// evaluation around it).
fn poly_centres(d: usize) -> Vec<f64> {
    normals(d, 0)
}

/// The network's parameters, layer by layer `W₀ (256 × d), b₀, W₁ (256 × 256), b₁, W₂ (1 × 256), b₂`
/// (torch's `named_parameters` order, weights row-major), drawn from seed 0 at every call
/// (under a millisecond; a BO run evaluates the task a few dozen times).
fn network_params(d: usize) -> Vec<f64> {
    let h = NETWORK_WIDTH;
    normals(h * d + h + h * h + h + h + 1, 0)
}

/// The random network at `x`: the workspace's tanh MLP (its flat layout is torch's) with the
/// drawn parameters.
fn network(x: &[f64]) -> f64 {
    let d = x.len();
    let mut net = crate::protocols::tanh_mlp(d, &[NETWORK_WIDTH, NETWORK_WIDTH], 1, 0).expect("a valid MLP");
    net.set_params(&DVector::from_vec(network_params(d))).expect("the MLP's parameter count");
    net.forward(&DMatrix::from_row_slice(1, d, x)).expect("one point of the task's dimension")[(0, 0)]
}

/// The polynomial at `x`.
fn polynomial(x: &[f64]) -> f64 {
    let (d, c) = (x.len(), poly_centres(x.len()));
    let g = d / 4;
    (0..g).map(|j| (0..4).map(|i| x[i * g + j] - c[i * g + j]).product::<f64>()).sum()
}

/// The polynomial's maximum on [0, 1]^d: each of the `d/4` products is multilinear in its four
/// disjoint variables, so its maximum is at one of the 16 corners.
fn polynomial_max(d: usize) -> f64 {
    let (c, g) = (poly_centres(d), d / 4);
    (0..g)
        .map(|j| {
            (0..16u32)
                .map(|corner| (0..4).map(|i| f64::from((corner >> i) & 1) - c[i * g + j]).product::<f64>())
                .fold(f64::NEG_INFINITY, f64::max)
        })
        .sum()
}

/// Side of the Brusselator grid.
const PDE_GRID: usize = 64;

/// The authors' `PDEVar` objective at `(a, b, d₀, d₁)`: on a 64 × 64 grid of unit cells with
/// zero-flux (Neumann) boundaries, `u_t = d₀ Δu + a − (b + 1) u + u² v`, `v_t = d₁ Δv + b u − u² v`
/// from `u = a`, `v = b/a + 0.1 ε` (`ε` standard normal per cell), explicit Euler with
/// `dt = 10⁻³` to `t = 20` (py-pde's `solve(t_range=20, dt=1e-3)` with its default explicit
/// solver); non-finite final values become `10⁵ ε`; the result is the sample variance (`n − 1`)
/// of both fields weighted 1 on the two outermost rows and columns and 0.1 inside. The authors
/// draw `ε` afresh at every evaluation; here it is seeded by the input's bits, so an input always
/// gives the same value.
pub fn brusselator_variance(p: &[f64; 4]) -> f64 {
    brusselator_variance_steps(p, 20_000)
}

fn brusselator_variance_steps(p: &[f64; 4], steps: usize) -> f64 {
    let (mut u, mut v, mut rng) = brusselator_state(p, steps);
    // Non-finite final values (a blown-up reaction) become 10⁵ ε, then the edge weighting.
    for x in u.iter_mut().chain(v.iter_mut()) {
        if !x.is_finite() {
            *x = 1e5 * Distribution::<f64>::sample(&StandardNormal, &mut rng);
        }
    }
    let n = PDE_GRID;
    let edge = |r: usize| r < 2 || r >= n - 2;
    let weight = |k: usize| if edge(k / n) || edge(k % n) { 1.0 } else { 0.1 };
    let values: Vec<f64> = [&u, &v].iter().flat_map(|f| (0..n * n).map(move |k| f[k] * weight(k))).collect();
    let m = values.len() as f64;
    let mean = values.iter().sum::<f64>() / m;
    values.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (m - 1.0)
}

/// The fields `(u, v)` after `steps` Euler steps, and the generator (for the non-finite
/// replacement).
fn brusselator_state(p: &[f64; 4], steps: usize) -> (Vec<f64>, Vec<f64>, StdRng) {
    let [a, b, d0, d1] = *p;
    let n = PDE_GRID;
    let seed = p.iter().fold(0u64, |h, v| h.rotate_left(17) ^ v.to_bits());
    let mut rng = StdRng::seed_from_u64(seed);
    let mut u = vec![a; n * n];
    let mut v: Vec<f64> =
        (0..n * n).map(|_| b / a + 0.1 * Distribution::<f64>::sample(&StandardNormal, &mut rng)).collect();
    let (mut lu, mut lv) = (vec![0.0; n * n], vec![0.0; n * n]);
    let dt = 1e-3;
    // 5-point Laplacian with mirrored ghost cells (zero normal derivative).
    let laplacian = |f: &[f64], out: &mut [f64]| {
        for i in 0..n {
            let (iu, id) = (i.saturating_sub(1), (i + 1).min(n - 1));
            let (row, up, down) =
                (&f[i * n..(i + 1) * n], &f[iu * n..(iu + 1) * n], &f[id * n..(id + 1) * n]);
            for (j, o) in out[i * n..(i + 1) * n].iter_mut().enumerate() {
                let (l, r) = (row[j.saturating_sub(1)], row[(j + 1).min(n - 1)]);
                *o = up[j] + down[j] + l + r - 4.0 * row[j];
            }
        }
    };
    for _ in 0..steps {
        laplacian(&u, &mut lu);
        laplacian(&v, &mut lv);
        for k in 0..n * n {
            let (uk, vk) = (u[k], v[k]);
            let uuv = uk * uk * vk;
            u[k] = uk + dt * (d0 * lu[k] + a - (b + 1.0) * uk + uuv);
            v[k] = vk + dt * (d1 * lv[k] + b * uk - uuv);
        }
    }
    (u, v, rng)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn test_functions_reach_their_published_minima() {
        use std::f64::consts::PI;
        let min = |t: Task| t.minimum().unwrap();
        for x in [[-PI, 12.275], [PI, 2.275], [9.42478, 2.475]] {
            assert!((Task::Branin.eval(&x) - min(Task::Branin)).abs() < 1e-5);
        }
        assert!(Task::Ackley(4).eval(&[0.0; 4]).abs() < 1e-12);
        let xs = [0.20169, 0.150011, 0.476874, 0.275332, 0.311652, 0.6573];
        assert!((Task::Hartmann6.eval(&xs) - min(Task::Hartmann6)).abs() < 1e-4);
        // Elsewhere the functions are above their minima (the polynomial's is its best corner).
        let mut rng = StdRng::seed_from_u64(1);
        for task in [Task::Branin, Task::Ackley(4), Task::Hartmann6, Task::Polynomial(8)] {
            for _ in 0..200 {
                let u: Vec<f64> = (0..task.dim()).map(|_| rng.gen::<f64>()).collect();
                assert!(task.eval_unit(&u) >= min(task) - 1e-9);
            }
        }
        let corner_values: Vec<f64> = (0..256u32)
            .map(|bits| {
                Task::Polynomial(8).eval(&(0..8).map(|i| f64::from((bits >> i) & 1)).collect::<Vec<_>>())
            })
            .collect();
        let best = corner_values.iter().cloned().fold(f64::INFINITY, f64::min);
        assert!((best - min(Task::Polynomial(8))).abs() < 1e-12, "the minimum is a corner");
    }

    #[test]
    fn the_polynomial_is_the_sum_of_four_factor_products() {
        let c = poly_centres(8);
        let x = [0.1, 0.9, 0.3, 0.7, 0.5, 0.2, 0.8, 0.4];
        // PolyDraw reshapes (x − c) to 4 × 2 and multiplies down the columns.
        let want = (x[0] - c[0]) * (x[2] - c[2]) * (x[4] - c[4]) * (x[6] - c[6])
            + (x[1] - c[1]) * (x[3] - c[3]) * (x[5] - c[5]) * (x[7] - c[7]);
        assert!((Task::Polynomial(8).eval(&x) + want).abs() < 1e-14);
    }

    #[test]
    fn the_network_draw_is_a_tanh_mlp_with_standard_normal_parameters() {
        let p = network_params(10);
        assert_eq!(p.len(), 256 * 10 + 256 + 256 * 256 + 256 + 256 + 1);
        let (m, v) =
            (p.iter().sum::<f64>() / p.len() as f64, p.iter().map(|x| x * x).sum::<f64>() / p.len() as f64);
        assert!(m.abs() < 0.01 && (v - 1.0).abs() < 0.02, "N(0, 1) parameters: mean {m}, variance {v}");
        // At x = 0 the first layer is its bias.
        let (h, b0) = (256, &p[256 * 10..256 * 10 + 256]);
        let a0: Vec<f64> = b0.iter().map(|b| b.tanh()).collect();
        let w1 = &p[256 * 11..256 * 11 + h * h];
        let b1 = &p[256 * 11 + h * h..256 * 12 + h * h];
        let a1: Vec<f64> =
            (0..h).map(|o| (b1[o] + (0..h).map(|i| w1[o * h + i] * a0[i]).sum::<f64>()).tanh()).collect();
        let (w2, b2) = (&p[256 * 12 + h * h..256 * 13 + h * h], p[256 * 13 + h * h]);
        let f = b2 + w2.iter().zip(&a1).map(|(w, a)| w * a).sum::<f64>();
        assert!((Task::Network(10).eval(&[0.0; 10]) + f).abs() < 1e-12);
    }

    /// The Brusselator's homogeneous state `(u, v) = (a, b/a)` is stable for `b < 1 + a²`: the
    /// initial noise decays (Jacobian eigenvalues −2, −2 at `a = 2, b = 1`); beyond it (`a = 1,
    /// b = 3`, a Hopf bifurcation) the state moves away from it.
    #[test]
    fn the_brusselator_settles_in_its_stable_region_and_not_beyond() {
        let deviation = |p: [f64; 4]| {
            let (u, v, _) = brusselator_state(&p, 4_000);
            let (a, ba) = (p[0], p[1] / p[0]);
            u.iter().map(|x| (x - a).abs()).chain(v.iter().map(|x| (x - ba).abs())).fold(0.0, f64::max)
        };
        let (stable, hopf) = (deviation([2.0, 1.0, 1.0, 1.0]), deviation([1.0, 3.0, 1.0, 1.0]));
        assert!(stable < 1e-3, "stable region: max deviation {stable}");
        assert!(hopf > 10.0 * stable && hopf.is_finite(), "Hopf region: max deviation {hopf}");
        // Same input, same noise: the objective is a function of its input.
        let p = [2.0, 1.0, 1.0, 1.0];
        assert_eq!(brusselator_variance_steps(&p, 100), brusselator_variance_steps(&p, 100));
    }
}
