//! Bundled datasets (counts + checksums), generators (moments, supports), loaders (errors),
//! splits and preprocessing (invariants).

use fspace_input::InputError;
use std::io::Write;
use std::path::PathBuf;

use fspace_data::*;
use fspace_testutil::{rand_uniform, rng};
use nalgebra::DMatrix;
use proptest::prelude::*;
use sha2::{Digest, Sha256};

fn sha256(path: &std::path::Path) -> String {
    let bytes = std::fs::read(path).unwrap();
    Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// (file, sha256) — the same values as datasets/README.md.
const CHECKSUMS: &[(&str, &str)] = &[
    ("boston_housing.csv", "fd6aae7c42ed5998b4157a6149aa35d47c60fc0664c5bcfea5f3df4f423376cc"),
    ("concrete.csv", "c2690f237285ede14fa54fe05dbe6a83ce510f65de6a8c5f8cafd6cefd9f38e2"),
    ("mauna_loa_co2.csv", "8e8d277356c7f1e9204e127f52123a77d0bc9db222a994f4adcf4bf3788ef415"),
    ("gulfdata_train.csv", "dcd75987abb9fb1c35dd3d76c724f330523b1af236fa0a2b113ab0e8b8912751"),
    ("gulfdata_test.csv", "f4e50eec95fabc687795f3b2021c310fccd1f473e5dadefc653763af6663ab24"),
    ("yacht_hydrodynamics.data", "1638f9806fefc050259068b3a5d695431b2ed16020b7c57478af02f83081baf0"),
    ("winequality_red.csv", "f5eb6b494f4f6431698dce8fb15c356d091c2a5dc13f823742dcc9709a327b4a"),
    ("digits.csv.gz", "46abec6b12486ad9e51943373abcf22bbea1b5a51a1619b361570d8893f1464a"),
    ("mnist/t10k-images-idx3-ubyte.gz", "1a1a05eab793c14bb050b398624a11b0ffd1a2953baed553b1b9bd079e2a20be"),
    ("mnist/t10k-labels-idx1-ubyte.gz", "b91679a0acfe4ba0e50a2437a903084cba1f5f92592b016a25a7dfd00455798b"),
    ("mnist/train-images-idx3-ubyte.gz", "0b367032e93c5d0cea0925647cfdb18614af8ee15f83e6f2fc2ad904a6835971"),
    ("mnist/train-labels-idx1-ubyte.gz", "1787548bbe0bff1ec2ecdc0ef292b02df999e2d1a6002d27500982c652b17203"),
    (
        "fashion_mnist/t10k-images-idx3-ubyte.gz",
        "cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa",
    ),
    (
        "fashion_mnist/t10k-labels-idx1-ubyte.gz",
        "8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05",
    ),
    (
        "fashion_mnist/train-images-idx3-ubyte.gz",
        "b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7",
    ),
    (
        "fashion_mnist/train-labels-idx1-ubyte.gz",
        "0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056",
    ),
];

#[test]
fn bundled_files_match_their_checksums() {
    for (file, expected) in CHECKSUMS {
        assert_eq!(sha256(&dataset_dir().join(file)), *expected, "{file}");
    }
}

#[test]
fn bundled_tables_load_with_documented_shapes() {
    let cases: Vec<(&str, Dataset, usize, usize)> = vec![
        ("mauna loa", mauna_loa().unwrap(), 820, 1),
        ("gulf train", gulf_drifters().unwrap().0, 20, 2),
        ("gulf test", gulf_drifters().unwrap().1, 544, 2),
        ("yacht", yacht().unwrap(), 308, 6),
        ("boston", boston().unwrap(), 506, 13),
        ("concrete", concrete().unwrap(), 1030, 8),
        ("wine", wine_quality_red().unwrap(), 1599, 11),
        ("digits", digits().unwrap(), 1797, 64),
    ];
    for (name, d, n, p) in cases {
        let t = if name.starts_with("gulf") { 2 } else { 1 };
        assert_eq!((d.x.nrows(), d.x.ncols(), d.y.ncols()), (n, p, t), "{name}");
        assert!(d.x.iter().chain(d.y.iter()).all(|v| v.is_finite()), "{name}");
    }
    let co2 = mauna_loa().unwrap();
    assert!((co2.x[(0, 0)] - 1958.2027).abs() < 1e-12 && (co2.y[(0, 0)] - 315.71).abs() < 1e-12);
    assert!((co2.x[(819, 0)] - 2026.4583).abs() < 1e-12 && (co2.y[(819, 0)] - 431.44).abs() < 1e-12);
    let (gtr, gte) = gulf_drifters().unwrap();
    assert_eq!((gtr.x[(0, 0)], gtr.x[(0, 1)], gtr.y[(0, 1)]), (-90.0, 26.5, -0.045338905));
    let (lo, hi) = (gte.x.column(0).min(), gte.x.column(0).max());
    assert!((lo + 90.788).abs() < 1e-3 && (hi + 83.8).abs() < 0.3, "test grid spans the Gulf box: {lo} {hi}");
    let y = yacht().unwrap();
    assert_eq!((y.x[(0, 5)], y.y[(307, 0)]), (0.125, 46.66));
    assert!(co2.x.as_slice().windows(2).all(|w| w[1] > w[0]), "chronological");
    let digits = digits().unwrap();
    assert!(digits.x.max() == 16.0 && digits.y.max() == 9.0);
}

#[test]
fn image_datasets_load_completely() {
    for (name, train, test) in [
        ("mnist", mnist(Split::Train).unwrap(), mnist(Split::Test).unwrap()),
        ("fashion", fashion_mnist(Split::Train).unwrap(), fashion_mnist(Split::Test).unwrap()),
    ] {
        assert_eq!(train.x.shape(), (60_000, 784), "{name}");
        assert_eq!(test.x.shape(), (10_000, 784), "{name}");
        assert!(train.x.max() <= 1.0 && train.x.min() >= 0.0);
        let mut counts = [0usize; 10];
        train.y.iter().for_each(|&l| counts[l as usize] += 1);
        assert!(counts.iter().all(|&c| c > 5000), "{name}: {counts:?}");
    }
}

#[test]
fn generators_follow_the_papers() {
    let mut r = rng(1);
    let s = sine(20_000, 0.1, &mut r).unwrap();
    assert!(s.x.iter().all(|&x| (0.5..=1.0).contains(&x.abs())), "support [−1,−0.5] ∪ [0.5,1]");
    let resid: Vec<f64> =
        (0..s.len()).map(|i| s.y[(i, 0)] - (std::f64::consts::TAU * s.x[(i, 0)]).sin()).collect();
    let sd = (resid.iter().map(|e| e * e).sum::<f64>() / resid.len() as f64).sqrt();
    assert!((sd - 0.1).abs() < 0.003 && resid.iter().sum::<f64>().abs() / (resid.len() as f64) < 0.003);
    let neg = s.x.iter().filter(|&&x| x < 0.0).count() as f64 / s.len() as f64;
    assert!((neg - 0.5).abs() < 0.02);

    let c = cubic(20_000, &mut r).unwrap();
    assert!(c.x.iter().all(|&x| (-4.0..4.0).contains(&x)));
    let var = (0..c.len()).map(|i| (c.y[(i, 0)] - c.x[(i, 0)].powi(3)).powi(2)).sum::<f64>() / c.len() as f64;
    assert!((var - 9.0).abs() < 0.3, "ε ~ N(0, 9): {var}");
    assert!((c.x.mean()).abs() < 0.1 && (c.x.variance() - 16.0 / 3.0).abs() < 0.15);

    let (m, scaler) = two_moons(1000, 0.1, &mut r).unwrap();
    for j in 0..2 {
        let col = m.x.column(j);
        assert!(col.mean().abs() < 1e-12 && (col.variance() - 1.0).abs() < 1e-12, "standardised");
    }
    assert_eq!(m.y.iter().filter(|&&l| l == 1.0).count(), 500);
    // Noise-free moons lie exactly on sklearn's arcs once un-standardised.
    let (clean, sc) = two_moons(101, 0.0, &mut r).unwrap();
    let raw = sc.inverse(&clean.x).unwrap();
    for i in 0..101 {
        let (a, b) = (raw[(i, 0)], raw[(i, 1)]);
        let r2 = if clean.y[(i, 0)] == 0.0 { a * a + b * b } else { (1.0 - a).powi(2) + (0.5 - b).powi(2) };
        assert!((r2 - 1.0).abs() < 1e-12);
    }
    let _ = scaler;
}

#[test]
fn ocean_field_splits_into_curl_free_and_divergence_free_parts() {
    let (lo, hi) = GULF_BOX;
    let pts = rand_uniform(50, 2, 0.0, 1.0, &mut rng(2));
    let pts = DMatrix::from_fn(50, 2, |i, j| lo[j] + pts[(i, j)] * (hi[j] - lo[j]));
    let h = 1e-5;
    let shifted =
        |dj: usize, s: f64| DMatrix::from_fn(50, 2, |i, j| pts[(i, j)] + if j == dj { s * h } else { 0.0 });
    let parts = |p: &DMatrix<f64>| {
        let (_, cf, df) = ocean_current_field(p).unwrap();
        (cf, df)
    };
    let ((cf_x1p, df_x1p), (cf_x1m, df_x1m)) = (parts(&shifted(0, 1.0)), parts(&shifted(0, -1.0)));
    let ((cf_x2p, df_x2p), (cf_x2m, df_x2m)) = (parts(&shifted(1, 1.0)), parts(&shifted(1, -1.0)));
    let (total, cf, _) = ocean_current_field(&pts).unwrap();
    let mut max_div_free_div = 0.0f64;
    let mut max_curl_free_curl = 0.0f64;
    let mut max_field = 0.0f64;
    for i in 0..50 {
        let div = (df_x1p[(i, 0)] - df_x1m[(i, 0)] + df_x2p[(i, 1)] - df_x2m[(i, 1)]) / (2.0 * h);
        let curl = (cf_x1p[(i, 1)] - cf_x1m[(i, 1)] - (cf_x2p[(i, 0)] - cf_x2m[(i, 0)])) / (2.0 * h);
        max_div_free_div = max_div_free_div.max(div.abs());
        max_curl_free_curl = max_curl_free_curl.max(curl.abs());
        max_field = max_field.max(total.row(i).norm());
    }
    assert!(max_div_free_div < 1e-7 && max_curl_free_curl < 1e-7, "{max_div_free_div} {max_curl_free_curl}");
    assert!(max_field > 0.1 && cf.norm() > 1e-3, "both parts are present");
    let (train, test) = ocean_current(20, 0.02, &mut rng(3)).unwrap();
    assert_eq!((train.x.shape(), train.y.shape(), test.x.shape()), ((20, 2), (20, 2), (34 * 16, 2)));
    assert!((0..20)
        .all(|i| (lo[0]..=hi[0]).contains(&train.x[(i, 0)]) && (lo[1]..=hi[1]).contains(&train.x[(i, 1)])));
    assert_eq!(
        (test.x[(0, 0)], test.x[(0, 1)], test.x[(543, 0)], test.x[(543, 1)]),
        (lo[0], lo[1], hi[0], hi[1])
    );
}

fn temp_file(name: &str, contents: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fspace-data-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::File::create(&path).unwrap().write_all(contents).unwrap();
    path
}

#[test]
fn loaders_report_where_a_file_is_wrong() {
    assert!(matches!(read_csv("/nonexistent/fspace.csv", None), Err(DataError::Io { .. })));
    let p = temp_file("cols.csv", b"a,b,c\n1,2,3\n4,5\n");
    assert!(matches!(read_csv(&p, None), Err(DataError::ColumnCount { row: 2, expected: 3, found: 2, .. })));
    let p = temp_file("nan.csv", b"a,b\n1,2\n3,NaN\n");
    assert!(matches!(read_csv(&p, None), Err(DataError::NonFinite { row: 2, column: 1, .. })));
    let p = temp_file("text.csv", b"a,b\n1,x\n");
    assert!(matches!(read_csv(&p, None), Err(DataError::Parse { row: 1, column: 1, .. })));
    let p = temp_file("empty.csv", b"a,b\n");
    assert!(matches!(read_csv(&p, None), Err(DataError::Corrupt { .. })));
    let table = read_csv(temp_file("ok.csv", b"\"a\",b\n1,2\n3,4\n"), None).unwrap();
    assert_eq!(table.header, vec!["a", "b"]);
    assert!(matches!(table.split_targets(&["z"]), Err(DataError::MissingColumn { .. })));
    // A truncated gzip stream.
    let full = std::fs::read(dataset_dir().join("digits.csv.gz")).unwrap();
    let p = temp_file("trunc.csv.gz", &full[..full.len() / 2]);
    assert!(read_csv(&p, None).is_err());
    // IDX: wrong magic, and a payload shorter than its header says.
    let p = temp_file("bad.idx", &[0, 0, 0x0d, 1, 0, 0, 0, 2, 1, 2]);
    assert!(matches!(read_idx(&p), Err(DataError::Corrupt { .. })));
    let p = temp_file("short.idx", &[0, 0, 0x08, 1, 0, 0, 0, 3, 1, 2]);
    assert!(matches!(read_idx(&p), Err(DataError::Corrupt { .. })));
    let ok = read_idx(temp_file("ok.idx", &[0, 0, 0x08, 2, 0, 0, 0, 1, 0, 0, 0, 2, 7, 9])).unwrap();
    assert_eq!((ok.dims, ok.data), (vec![1, 2], vec![7, 9]));
}

#[test]
fn splits_and_encodings() {
    let (train, test) = chronological_split(741, 0.7).unwrap();
    assert_eq!((train.len(), test.len(), *train.last().unwrap() + 1), (518, 223, test[0]));
    assert!(chronological_split(3, 0.1).is_err() && chronological_split(10, 1.0).is_err());
    assert!(kfold(5, 6, 0.1, &mut rng(0)).is_err() && kfold(5, 1, 0.1, &mut rng(0)).is_err());
    assert!(kfold(10, 2, 1.5, &mut rng(0)).is_err());
    let x = DMatrix::from_row_slice(3, 2, &[1.0, 5.0, 2.0, 7.0, 1.0, 9.0]);
    let (enc, layout) = one_hot(&x, &[0]).unwrap();
    assert_eq!(layout, vec![(0, Some(1.0)), (0, Some(2.0)), (1, None)]);
    assert_eq!(enc, DMatrix::from_row_slice(3, 3, &[1.0, 0.0, 5.0, 0.0, 1.0, 7.0, 1.0, 0.0, 9.0]));
    assert!(one_hot(&x, &[2]).is_err());
    assert!(Standardizer::fit(&DMatrix::zeros(0, 2)).is_err());
    let s = Standardizer::fit(&DMatrix::from_element(3, 1, 4.0)).unwrap();
    assert_eq!((s.mean[0], s.std[0]), (4.0, 1.0), "constant columns are centred only");
}

#[test]
fn distinct_rows_drop_exact_duplicate_records_only() {
    let x = DMatrix::from_row_slice(5, 2, &[1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 0.0, 3.0, -0.0, 3.0]);
    let y = DMatrix::from_column_slice(5, 1, &[7.0, 7.0, 8.0, 1.0, 1.0]);
    // Row 1 repeats row 0; row 2 has row 0's inputs but another target (kept); -0.0 == 0.0.
    assert_eq!(distinct_rows(&x, &y).unwrap(), vec![0, 2, 3]);
    assert!(matches!(
        distinct_rows(&x, &DMatrix::zeros(4, 1)),
        Err(DataError::Input(InputError::Invalid { .. }))
    ));
    // Red wine ships 240 exact duplicate records (1 599 rows, 1 359 distinct), the reason the
    // UCI experiments fit GP hyperparameters on distinct records.
    let wine = wine_quality_red().unwrap();
    assert_eq!(distinct_rows(&wine.x, &wine.y).unwrap().len(), 1359);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn standardise_then_inverse_is_the_identity(n in 1usize..40, d in 1usize..5, seed in 0u64..1000) {
        let x = rand_uniform(n, d, -100.0, 100.0, &mut rng(seed));
        let s = Standardizer::fit(&x).unwrap();
        let back = s.inverse(&s.transform(&x).unwrap()).unwrap();
        prop_assert!((back - &x).abs().max() <= 1e-10);
    }

    #[test]
    fn kfold_covers_every_row_exactly_once(n in 2usize..200, k in 2usize..10, frac in 0.0f64..0.5, seed in 0u64..1000) {
        prop_assume!(k <= n);
        let folds = kfold(n, k, frac, &mut rng(seed)).unwrap();
        let mut seen = vec![0usize; n];
        for f in &folds {
            f.test.iter().for_each(|&i| seen[i] += 1);
            let mut all: Vec<usize> = f.train.iter().chain(&f.validation).chain(&f.test).cloned().collect();
            all.sort();
            prop_assert_eq!(all, (0..n).collect::<Vec<_>>(), "each fold partitions the rows");
            prop_assert!(!f.train.is_empty());
        }
        prop_assert!(seen.iter().all(|&c| c == 1));
    }

    #[test]
    fn distinct_rows_keep_one_first_copy_of_every_record(
        cells in proptest::collection::vec(0u8..3, 2..60), d in 1usize..3,
    ) {
        // Cells from {0, 1, 2} make repeated records likely.
        let n = cells.len() / (d + 1);
        prop_assume!(n >= 1);
        let x = DMatrix::from_fn(n, d, |i, j| cells[i * (d + 1) + j] as f64);
        let y = DMatrix::from_fn(n, 1, |i, _| cells[i * (d + 1) + d] as f64);
        let record = |i: usize| x.row(i).iter().chain(y.row(i).iter()).cloned().collect::<Vec<f64>>();
        let kept = distinct_rows(&x, &y).unwrap();
        prop_assert!(kept.windows(2).all(|w| w[0] < w[1]), "first copies, in order");
        for (a, &i) in kept.iter().enumerate() {
            prop_assert!(kept[..a].iter().all(|&j| record(j) != record(i)), "no record kept twice");
        }
        for i in 0..n {
            let first = kept.iter().find(|&&j| record(j) == record(i));
            prop_assert!(first.is_some_and(|&j| j <= i), "row {} is represented by its first copy", i);
        }
    }
}
