//! Sampler invariants: support, stratification, published sequences, discrepancy, errors.

use fspace_context::*;
use fspace_input::InputError;
use fspace_testutil::{rand_uniform, rng};
use nalgebra::DMatrix;
use proptest::prelude::*;

fn all_samplers(bbox: &BoundingBox) -> Vec<(&'static str, Box<dyn Sampler>)> {
    vec![
        ("uniform", Box::new(UniformSampler::new(bbox.clone()))),
        ("halton", Box::new(HaltonSampler::new(bbox.clone()).skip(3))),
        ("halton_scrambled", Box::new(HaltonSampler::new(bbox.clone()).scrambled(9))),
        ("sobol", Box::new(SobolSampler::new(bbox.clone()).unwrap())),
        ("sobol_scrambled", Box::new(SobolSampler::new(bbox.clone()).unwrap().scrambled(9).skip(1))),
        ("lhs", Box::new(LatinHypercube::new(bbox.clone()))),
        ("lhs_centred", Box::new(LatinHypercube::centred(bbox.clone()))),
    ]
}

fn random_box(d: usize, seed: u64) -> BoundingBox {
    let lo = rand_uniform(1, d, -5.0, 0.0, &mut rng(seed));
    let width = rand_uniform(1, d, 0.1, 4.0, &mut rng(seed + 1));
    BoundingBox::new(lo.iter().cloned().collect(), (lo + width).iter().cloned().collect()).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    #[test]
    fn every_sampler_stays_inside_its_box(d in 1usize..6, n in 1usize..200, seed in 0u64..10_000) {
        let bbox = random_box(d, seed);
        let mut r = rng(seed);
        for (name, s) in all_samplers(&bbox) {
            let pts = s.sample(n, &mut r).unwrap();
            prop_assert_eq!(pts.shape(), (n, d));
            for i in 0..n {
                let p: Vec<f64> = pts.row(i).iter().cloned().collect();
                prop_assert!(bbox.contains(&p), "{} point {:?} outside {:?}", name, p, bbox);
            }
        }
        let grid = GridSampler::per_side(bbox.clone(), 3).unwrap();
        let pts = grid.sample(3usize.pow(d as u32), &mut r).unwrap();
        prop_assert!((0..pts.nrows()).all(|i| bbox.contains(&pts.row(i).iter().cloned().collect::<Vec<_>>())));
    }

    #[test]
    fn latin_hypercube_has_one_point_per_stratum(d in 1usize..6, n in 1usize..300, seed in 0u64..10_000) {
        let bbox = random_box(d, seed);
        let pts = LatinHypercube::new(bbox.clone()).sample(n, &mut rng(seed)).unwrap();
        for j in 0..d {
            let (lo, hi) = (bbox.lower()[j], bbox.upper()[j]);
            let mut hits = vec![0usize; n];
            for i in 0..n {
                let s = (((pts[(i, j)] - lo) / (hi - lo)) * n as f64).floor() as usize;
                hits[s.min(n - 1)] += 1;
            }
            prop_assert!(hits.iter().all(|&h| h == 1), "dim {}: {:?}", j, hits);
        }
    }

    #[test]
    fn box_from_data_widens_by_half_the_range(n in 1usize..50, d in 1usize..4, seed in 0u64..1000) {
        let x = rand_uniform(n, d, -3.0, 3.0, &mut rng(seed));
        let b = BoundingBox::from_data(&x, 0.5).unwrap();
        for j in 0..d {
            let (lo, hi) = (x.column(j).min(), x.column(j).max());
            prop_assert!((b.lower()[j] - (lo - 0.5 * (hi - lo))).abs() < 1e-12);
            prop_assert!((b.upper()[j] - (hi + 0.5 * (hi - lo))).abs() < 1e-12);
        }
    }
}

#[test]
fn first_sobol_points_equal_the_published_sequence() {
    // Joe & Kuo (2008) new-joe-kuo-6.21201 direction numbers, unscrambled, Gray-code order;
    // the same values as scipy.stats.qmc.Sobol(d=5, scramble=False).random(8).
    let expected = [
        [0.0, 0.0, 0.0, 0.0, 0.0],
        [0.5, 0.5, 0.5, 0.5, 0.5],
        [0.75, 0.25, 0.25, 0.25, 0.75],
        [0.25, 0.75, 0.75, 0.75, 0.25],
        [0.375, 0.375, 0.625, 0.875, 0.375],
        [0.875, 0.875, 0.125, 0.375, 0.875],
        [0.625, 0.125, 0.875, 0.625, 0.625],
        [0.125, 0.625, 0.375, 0.125, 0.125],
    ];
    let s = SobolSampler::new(BoundingBox::cube(5, 0.0, 1.0).unwrap()).unwrap();
    let u = s.unit_points(8).unwrap();
    for (i, row) in expected.iter().enumerate() {
        for (j, v) in row.iter().enumerate() {
            assert_eq!(u[(i, j)], *v, "point {i}, dim {j}");
        }
    }
    // Skipping continues the same sequence.
    let skipped = s.clone().skip(5).unit_points(3).unwrap();
    assert_eq!(skipped, u.rows(5, 3).into_owned());
}

#[test]
fn halton_matches_the_halton_crate_and_the_radical_inverse_definition() {
    assert_eq!(&first_primes(6), &[2, 3, 5, 7, 11, 13]);
    let u = HaltonSampler::new(BoundingBox::cube(54, 0.0, 1.0).unwrap()).unit_points(300).unwrap();
    for (j, &b) in first_primes(54).iter().enumerate() {
        let reference: Vec<f64> = halton::Sequence::new(b as u8).take(300).collect();
        for i in 0..300 {
            assert!((u[(i, j)] - reference[i]).abs() < 1e-15, "base {b}, index {i}");
        }
    }
    assert_eq!(radical_inverse(2, 6), 0.375); // 110₂ → 0.011₂
    assert!((radical_inverse(3, 5) - 7.0 / 9.0).abs() < 1e-15); // 12₃ → 0.21₃
                                                                // Beyond the halton crate's u8 bases: 784 dimensions (MNIST-sized context points).
    let big =
        HaltonSampler::new(BoundingBox::cube(784, 0.0, 1.0).unwrap()).scrambled(1).unit_points(4).unwrap();
    assert_eq!(big.shape(), (4, 784));
    assert!(big.iter().all(|v| (0.0..1.0).contains(v)));
}

fn mean_uniform_discrepancy(n: usize, d: usize, seeds: u64) -> f64 {
    let sampler = UniformSampler::new(BoundingBox::cube(d, 0.0, 1.0).unwrap());
    (0..seeds)
        .map(|s| centered_l2_discrepancy(&sampler.sample(n, &mut rng(100 + s)).unwrap()).unwrap())
        .sum::<f64>()
        / seeds as f64
}

#[test]
fn low_discrepancy_sequences_beat_uniform_points() {
    for d in [2usize, 8] {
        for n in [256usize, 1024] {
            let unit = BoundingBox::cube(d, 0.0, 1.0).unwrap();
            let uniform = mean_uniform_discrepancy(n, d, 3);
            let cases = [
                ("halton", HaltonSampler::new(unit.clone()).unit_points(n).unwrap()),
                ("halton_scrambled", HaltonSampler::new(unit.clone()).scrambled(3).unit_points(n).unwrap()),
                ("sobol", SobolSampler::new(unit.clone()).unwrap().unit_points(n).unwrap()),
                (
                    "sobol_scrambled",
                    SobolSampler::new(unit.clone()).unwrap().scrambled(3).unit_points(n).unwrap(),
                ),
            ];
            for (name, pts) in cases {
                let cd = centered_l2_discrepancy(&pts).unwrap();
                assert!(cd < uniform, "{name} d={d} n={n}: CD² {cd:.3e} ≥ uniform {uniform:.3e}");
            }
        }
    }
}

#[test]
fn discrepancy_matches_a_closed_form() {
    // One point at the centre of [0,1]: CD² = (13/12) − 2 + 1 = 1/12 in d = 1.
    let cd = centered_l2_discrepancy(&DMatrix::from_element(1, 1, 0.5)).unwrap();
    assert!((cd - 1.0 / 12.0).abs() < 1e-15);
}

#[test]
fn samplers_are_deterministic_under_a_seed() {
    let bbox = BoundingBox::cube(3, -1.0, 2.0).unwrap();
    for (name, s) in all_samplers(&bbox) {
        let a = s.sample(50, &mut rng(11)).unwrap();
        let b = s.sample(50, &mut rng(11)).unwrap();
        assert_eq!(a, b, "{name}");
    }
    let a = HaltonSampler::new(bbox.clone()).scrambled(4).unit_points(10).unwrap();
    let b = HaltonSampler::new(bbox.clone()).scrambled(5).unit_points(10).unwrap();
    assert_ne!(a, b, "different scrambling seeds must differ");
}

#[test]
fn grids_include_the_corners_and_support_per_dimension_counts() {
    let bbox = BoundingBox::new(vec![-2.0, 0.0], vec![2.0, 1.0]).unwrap();
    let g = GridSampler::new(bbox.clone()).sample(100, &mut rng(0)).unwrap();
    assert_eq!(g.row(0).iter().cloned().collect::<Vec<_>>(), vec![-2.0, 0.0]);
    assert_eq!(g.row(99).iter().cloned().collect::<Vec<_>>(), vec![2.0, 1.0]);
    assert!((g[(1, 1)] - 1.0 / 9.0).abs() < 1e-15);
    let g96 = GridSampler::with_counts(bbox.clone(), vec![12, 8]).unwrap();
    assert_eq!(g96.size(), Some(96));
    assert_eq!(g96.sample(96, &mut rng(0)).unwrap().nrows(), 96);
    assert!(g96.sample(100, &mut rng(0)).is_err());
    assert!(GridSampler::new(bbox.clone()).sample(99, &mut rng(0)).is_err());
    let line = GridSampler::new(BoundingBox::cube(1, -2.0, 2.0).unwrap()).sample(5, &mut rng(0)).unwrap();
    assert_eq!(line.as_slice(), &[-2.0, -1.0, 0.0, 1.0, 2.0]);
}

#[test]
fn dataset_and_mixture_samplers_draw_rows() {
    let data = DMatrix::from_fn(20, 2, |i, j| (i * 10 + j) as f64);
    let s = DatasetSampler::new(data.clone()).unwrap();
    let pts = s.sample(20, &mut rng(1)).unwrap();
    let mut firsts: Vec<f64> = pts.column(0).iter().cloned().collect();
    firsts.sort_by(|a, b| a.partial_cmp(b).unwrap());
    assert_eq!(
        firsts,
        (0..20).map(|i| (i * 10) as f64).collect::<Vec<_>>(),
        "without replacement: a permutation"
    );
    assert!(s.sample(21, &mut rng(1)).is_err());
    assert_eq!(
        DatasetSampler::with_replacement(data.clone()).unwrap().sample(50, &mut rng(1)).unwrap().nrows(),
        50
    );

    let mut m = MixtureSampler::new(BoundingBox::cube(2, 500.0, 600.0).unwrap(), 4);
    assert!(m.sample(10, &mut rng(2)).is_err(), "no batch set yet");
    m.set_batch(data.clone()).unwrap();
    let pts = m.sample(10, &mut rng(2)).unwrap();
    assert!((0..6).all(|i| pts[(i, 0)] >= 500.0), "first n − b rows are uniform in the box");
    assert!(
        (6..10).all(|i| pts[(i, 0)] < 200.0 && pts[(i, 0)] % 10.0 == 0.0),
        "last b rows come from the batch"
    );
    assert!(m.set_batch(DMatrix::zeros(3, 5)).is_err());
}

#[test]
fn bad_input_is_a_typed_error() {
    assert!(matches!(BoundingBox::new(vec![1.0], vec![0.0]), Err(ContextError::InvertedBox { dim: 0, .. })));
    assert!(matches!(
        BoundingBox::new(vec![0.0, f64::NAN], vec![1.0, 1.0]),
        Err(ContextError::Input(InputError::NonFinite { .. }))
    ));
    assert!(matches!(BoundingBox::new(vec![], vec![]), Err(ContextError::Input(InputError::Empty { .. }))));
    assert!(matches!(
        BoundingBox::new(vec![0.0], vec![1.0, 2.0]),
        Err(ContextError::Input(InputError::DimensionMismatch { .. }))
    ));
    assert!(matches!(
        BoundingBox::from_data(&DMatrix::zeros(0, 3), 0.5),
        Err(ContextError::Input(InputError::Empty { .. }))
    ));
    assert!(BoundingBox::from_data(&DMatrix::from_element(2, 2, f64::INFINITY), 0.5).is_err());
    assert!(BoundingBox::from_data(&DMatrix::from_element(2, 2, 1.0), -1.0).is_err());
    // A constant feature gives a degenerate (zero-width) side, which is allowed.
    let flat = BoundingBox::from_data(&DMatrix::from_element(3, 1, 2.0), 0.5).unwrap();
    assert_eq!(UniformSampler::new(flat).sample(4, &mut rng(0)).unwrap().as_slice(), &[2.0; 4]);
    let bbox = BoundingBox::cube(2, 0.0, 1.0).unwrap();
    for (name, s) in all_samplers(&bbox) {
        assert!(matches!(s.sample(0, &mut rng(0)), Err(ContextError::ZeroSamples)), "{name}");
    }
    assert!(SobolSampler::new(BoundingBox::cube(SOBOL_MAX_DIM + 1, 0.0, 1.0).unwrap()).is_err());
    assert!(DatasetSampler::new(DMatrix::zeros(0, 2)).is_err());
    assert!(GridSampler::with_counts(bbox.clone(), vec![3]).is_err());
    assert!(GridSampler::with_counts(bbox, vec![3, 0]).is_err());
    assert!(centered_l2_discrepancy(&DMatrix::from_element(2, 2, 1.5)).is_err());
}

#[test]
fn a_deserialised_box_is_checked_as_a_constructed_one() {
    let good: BoundingBox = serde_json::from_str(r#"{"lower": [-1.0, 0.0], "upper": [1.0, 0.0]}"#).unwrap();
    assert_eq!(good, BoundingBox::new(vec![-1.0, 0.0], vec![1.0, 0.0]).unwrap());
    assert_eq!(serde_json::from_str::<BoundingBox>(&serde_json::to_string(&good).unwrap()).unwrap(), good);
    for (text, says) in [
        (r#"{"lower": [1.0], "upper": [-1.0]}"#, "dimension 0"),
        (r#"{"lower": [0.0], "upper": [1e999]}"#, ""),
        (r#"{"lower": [], "upper": []}"#, "empty"),
        (r#"{"lower": [0.0, 0.0], "upper": [1.0]}"#, "upper bounds"),
    ] {
        let err = serde_json::from_str::<BoundingBox>(text).expect_err(text).to_string();
        assert!(err.contains(says), "{text}: {err}");
    }
}
