//! Bundled datasets (counts + checksums), generators (moments, supports), loaders (errors),
//! splits and preprocessing (invariants).

use fspace_input::InputError;
use std::io::Write;
use std::path::PathBuf;

use fspace_data::*;
use fspace_testutil::{rand_uniform, rng};
use nalgebra::DMatrix;
use proptest::prelude::*;

#[test]
fn bundled_files_match_their_checksums_and_the_readme_records_them() {
    let readme = std::fs::read_to_string(dataset_dir().join("README.md")).unwrap();
    for (file, expected) in BUNDLED_SHA256 {
        assert_eq!(sha256_hex(&dataset_dir().join(file)).unwrap(), *expected, "{file}");
        assert!(readme.contains(expected), "datasets/README.md does not record {file}'s SHA-256");
    }
}

#[test]
fn a_modified_bundled_file_is_refused_and_names_the_file() {
    // One digit changed in the yacht file, in a copy of the datasets directory.
    let dir = std::env::temp_dir().join(format!("fspace-data-tamper-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let name = "yacht_hydrodynamics.data";
    let original = std::fs::read_to_string(dataset_dir().join(name)).unwrap();
    std::fs::write(dir.join(name), &original).unwrap();
    assert_eq!(verified_bundled_file(&dir, name).unwrap(), dir.join(name));
    let at = original.find(|c: char| c.is_ascii_digit() && c != '9').unwrap();
    let mut tampered = original.into_bytes();
    tampered[at] += 1;
    std::fs::write(dir.join(name), &tampered).unwrap();
    match verified_bundled_file(&dir, name) {
        Err(DataError::ChecksumMismatch { path, expected, found }) => {
            assert_eq!(path, dir.join(name));
            assert_eq!(expected, BUNDLED_SHA256.iter().find(|(f, _)| *f == name).unwrap().1);
            assert_ne!(found, expected);
        }
        other => panic!("{other:?}"),
    }
    // A truncated copy likewise; a name that is not bundled is an input error.
    std::fs::write(dir.join(name), &tampered[..100]).unwrap();
    assert!(matches!(verified_bundled_file(&dir, name), Err(DataError::ChecksumMismatch { .. })));
    assert!(matches!(verified_bundled_file(&dir, "mine.csv"), Err(DataError::Input(_))));
    std::fs::remove_dir_all(&dir).unwrap();
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
