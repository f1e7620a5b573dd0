//! Untrusted tensor files: headers that declare more than the file holds, tensors past the
//! element limit, zip members that inflate past their bound and files past the byte limit are
//! refused with typed errors before anything of the declared size is allocated.

use std::io::Write;

use fspace_interop::{InteropError, TensorLimits, Tensors};

/// An `.npy` (format 1.0) with the given header dictionary and data bytes.
fn npy(dict: &str, data: &[u8]) -> Vec<u8> {
    let mut header = dict.to_string();
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((header.len() as u16).to_le_bytes());
    out.extend(header.as_bytes());
    out.extend(data);
    out
}

fn f64_npy(shape: &str, values: &[f64]) -> Vec<u8> {
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    npy(&format!("{{'descr': '<f8', 'fortran_order': False, 'shape': {shape}, }}"), &data)
}

fn zip_of(members: &[(&str, Vec<u8>)], method: zip::CompressionMethod) -> Vec<u8> {
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default().compression_method(method);
    for (name, bytes) in members {
        w.start_file(*name, options).unwrap();
        w.write_all(bytes).unwrap();
    }
    w.finish().unwrap().into_inner()
}

fn stored(members: &[(&str, Vec<u8>)]) -> Vec<u8> {
    zip_of(members, zip::CompressionMethod::Stored)
}

#[test]
fn well_formed_arrays_still_load() {
    let t = Tensors::from_npz_bytes(
        &stored(&[("w.npy", f64_npy("(2, 3)", &[1., 2., 3., 4., 5., 6.]))]),
        "ok.npz",
    )
    .unwrap();
    assert_eq!(t.get("w").unwrap().shape, vec![2, 3]);
    let scalar = Tensors::from_npz_bytes(&stored(&[("s.npy", f64_npy("()", &[7.0]))]), "s.npz").unwrap();
    assert_eq!(scalar.get("s").unwrap().data, vec![7.0]);
}

#[test]
fn a_declared_shape_of_a_trillion_entries_is_refused_before_allocation() {
    // 10¹² elements declared, 8 bytes present: past the element limit.
    let huge = stored(&[("w.npy", f64_npy("(1000000, 1000000)", &[1.0]))]);
    match Tensors::from_npz_bytes(&huge, "huge.npz") {
        Err(InteropError::TooLarge { size, limit, what, .. }) => {
            assert_eq!((size, limit), (1_000_000_000_000, TensorLimits::default().max_elements));
            assert!(what.contains("`w`"), "{what}");
        }
        other => panic!("{other:?}"),
    }
    // A product that overflows u64 is refused the same way.
    let overflow = stored(&[("w.npy", f64_npy("(4294967296, 4294967296, 4)", &[1.0]))]);
    assert!(matches!(Tensors::from_npz_bytes(&overflow, "o.npz"), Err(InteropError::TooLarge { .. })));
    // Within the element limit but more than the file holds: truncated, still before allocation.
    let short = stored(&[("w.npy", f64_npy("(1000, 1000)", &[1.0]))]);
    assert!(matches!(Tensors::from_npz_bytes(&short, "s.npz"), Err(InteropError::Truncated { .. })));
    // A caller's tighter limit applies.
    let small = TensorLimits { max_elements: 5, ..TensorLimits::default() };
    let six = stored(&[("w.npy", f64_npy("(2, 3)", &[0.0; 6]))]);
    assert!(matches!(
        Tensors::from_npz_bytes_with_limits(&six, "six.npz", &small),
        Err(InteropError::TooLarge { size: 6, limit: 5, .. })
    ));
}

#[test]
fn a_header_longer_than_the_array_is_truncated() {
    let mut bytes = f64_npy("(2,)", &[1.0, 2.0]);
    bytes[8..10].copy_from_slice(&u16::MAX.to_le_bytes());
    let e = Tensors::from_npz_bytes(&stored(&[("w.npy", bytes)]), "h.npz").unwrap_err();
    assert!(matches!(e, InteropError::Truncated { .. }), "{e}");
    // Format 2.0 with a 4-byte length of 4 GiB.
    let mut v2 = b"\x93NUMPY\x02\x00".to_vec();
    v2.extend(u32::MAX.to_le_bytes());
    v2.extend(b"{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }\n");
    let e = Tensors::from_npz_bytes(&stored(&[("w.npy", v2)]), "h2.npz").unwrap_err();
    assert!(matches!(e, InteropError::Truncated { .. }), "{e}");
}

#[test]
fn a_member_that_inflates_past_the_bound_is_refused() {
    // 1 MiB of zeros deflates to about a kilobyte.
    let zeros = f64_npy("(131072,)", &vec![0.0; 131_072]);
    let bomb = zip_of(&[("w.npy", zeros)], zip::CompressionMethod::Deflated);
    assert!(bomb.len() < 8192, "{} bytes", bomb.len());
    let limits = TensorLimits { max_member_bytes: 64 * 1024, ..TensorLimits::default() };
    match Tensors::from_npz_bytes_with_limits(&bomb, "bomb.npz", &limits) {
        Err(InteropError::TooLarge { limit, .. }) => assert_eq!(limit, 64 * 1024),
        other => panic!("{other:?}"),
    }
    assert!(Tensors::from_npz_bytes(&bomb, "bomb.npz").is_ok(), "the default limit reads it");
}

#[test]
fn a_member_whose_declared_size_lies_is_bounded_by_what_it_inflates_to() {
    let bytes = stored(&[("w.npy", f64_npy("(2,)", &[1.0, 2.0]))]);
    // Patch the uncompressed size in the central directory (signature PK\x01\x02, size at +24)
    // and the local header (PK\x03\x04, size at +22) to 4 GiB − 1.
    let find = |sig: &[u8]| bytes.windows(4).position(|w| w == sig).unwrap();
    let mut patched = bytes.clone();
    let central = find(b"PK\x01\x02");
    patched[central + 24..central + 28].copy_from_slice(&u32::MAX.to_le_bytes());
    let local = find(b"PK\x03\x04");
    patched[local + 22..local + 26].copy_from_slice(&u32::MAX.to_le_bytes());
    let limits = TensorLimits { max_member_bytes: 1 << 20, ..TensorLimits::default() };
    let e = Tensors::from_npz_bytes_with_limits(&patched, "lie.npz", &limits).unwrap_err();
    assert!(matches!(e, InteropError::TooLarge { .. } | InteropError::Corrupt { .. }), "{e}");
}

#[test]
fn a_file_past_the_byte_limit_is_not_read() {
    let dir = std::env::temp_dir().join(format!("fspace-interop-limits-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("w.npy");
    let bytes = f64_npy("(4,)", &[1.0, 2.0, 3.0, 4.0]);
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(Tensors::read(&path).unwrap().get("w").unwrap().data, vec![1.0, 2.0, 3.0, 4.0]);
    let limits = TensorLimits { max_file_bytes: bytes.len() as u64 - 1, ..TensorLimits::default() };
    match Tensors::read_with_limits(&path, &limits) {
        Err(InteropError::TooLarge { size, .. }) => assert_eq!(size, bytes.len() as u64),
        other => panic!("{other:?}"),
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn safetensors_past_the_element_limit_and_headers_past_the_file_are_refused() {
    let mut t = Tensors::new("t");
    t.insert(
        "w",
        fspace_interop::Tensor {
            shape: vec![3, 4],
            data: vec![0.5; 12],
            dtype: fspace_interop::SourceDtype::F64,
        },
    );
    let bytes = t.to_safetensors_bytes(fspace_interop::SourceDtype::F64).unwrap();
    let limits = TensorLimits { max_elements: 11, ..TensorLimits::default() };
    assert!(matches!(
        Tensors::from_safetensors_bytes_with_limits(&bytes, "w.safetensors", &limits),
        Err(InteropError::TooLarge { size: 12, .. })
    ));
    let mut long = bytes.clone();
    long[..8].copy_from_slice(&(bytes.len() as u64).to_le_bytes());
    assert!(matches!(
        Tensors::from_safetensors_bytes(&long, "w.safetensors"),
        Err(InteropError::Truncated { .. })
    ));
    // A header that declares a 10¹²-element tensor over 96 bytes of data.
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(bytes[8..8 + n].to_vec()).unwrap().replace("[3,4]", "[1000000,1000000]");
    let mut forged = (header.len() as u64).to_le_bytes().to_vec();
    forged.extend(header.as_bytes());
    forged.extend(&bytes[8 + n..]);
    let e = Tensors::from_safetensors_bytes(&forged, "w.safetensors").unwrap_err();
    assert!(matches!(e, InteropError::Corrupt { .. } | InteropError::TooLarge { .. }), "{e}");
}
