//! Named tensors read from safetensors, `.npz` and `.npy` files, and written back.

use std::collections::BTreeMap;
use std::io::{Cursor, Read, Write};
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensorError, SafeTensors, TensorView};

use crate::error::{io_error, InteropError, Result};

/// The element type a tensor had in its file (values are always held as `f64`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceDtype {
    /// 64-bit float: read exactly.
    F64,
    /// 32-bit float: upcast exactly (every f32 is an f64), so the network computes in f64 on
    /// the f32-rounded weights.
    F32,
}

/// One tensor: its shape (row-major, C order) and values.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Shape, outermost first (PyTorch `Linear.weight`: `out × in`).
    pub shape: Vec<usize>,
    /// Values in row-major order, `shape.iter().product()` of them.
    pub data: Vec<f64>,
    /// The element type in the file it came from.
    pub dtype: SourceDtype,
}

impl Tensor {
    /// A tensor from its shape and row-major values; errors if the count does not match.
    pub fn new(name: &str, shape: Vec<usize>, data: Vec<f64>, dtype: SourceDtype) -> Result<Self> {
        check_count(name, &shape, data.len())?;
        Ok(Self { shape, data, dtype })
    }
}

/// Bounds on what the readers take from an untrusted file. Headers are checked against them
/// (and against the bytes actually present) before anything is allocated, so a file that
/// declares a tensor of 10¹² entries, or a zip member that inflates without end, is an
/// [`InteropError::TooLarge`] or [`InteropError::Truncated`], never an abort.
///
/// | limit | default | bounds |
/// |---|---|---|
/// | `max_file_bytes` | 4 GiB | the file read by [`Tensors::read`] |
/// | `max_elements` | 2²⁹ (4 GiB as f64) | the elements of one tensor |
/// | `max_member_bytes` | 4 GiB | one `.npz` member, inflated |
///
/// The defaults hold every network fspace runs with room to spare (a ResNet-152's weights are
/// 60 M elements); raise them for larger files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorLimits {
    /// The longest file read, in bytes.
    pub max_file_bytes: u64,
    /// The most elements one tensor may have.
    pub max_elements: u64,
    /// The largest inflated `.npz` member, in bytes.
    pub max_member_bytes: u64,
}

impl Default for TensorLimits {
    fn default() -> Self {
        Self { max_file_bytes: 4 << 30, max_elements: 1 << 29, max_member_bytes: 4 << 30 }
    }
}

impl TensorLimits {
    fn too_large(file: &str, what: String, size: u64, limit: u64) -> InteropError {
        InteropError::TooLarge { file: file.to_string(), what, size, limit }
    }

    fn check_elements(&self, file: &str, name: &str, shape: &[u64]) -> Result<u64> {
        let count = shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
        match count {
            Some(n) if n <= self.max_elements => Ok(n),
            _ => Err(Self::too_large(
                file,
                format!("tensor `{name}` of shape {shape:?}"),
                count.unwrap_or(u64::MAX),
                self.max_elements,
            )),
        }
    }
}

/// A set of named tensors and the file they came from (named in every error).
#[derive(Debug, Clone, PartialEq)]
pub struct Tensors {
    source: String,
    map: BTreeMap<String, Tensor>,
    texts: BTreeMap<String, String>,
}

fn file_label(path: &Path) -> String {
    path.display().to_string()
}

/// The file's bytes, refusing one longer than `limit` before reading it.
fn read_bytes(path: &Path, limit: u64) -> Result<Vec<u8>> {
    let label = file_label(path);
    let file = std::fs::File::open(path).map_err(|e| io_error(&label, &e))?;
    let len = file.metadata().map_err(|e| io_error(&label, &e))?.len();
    if len > limit {
        return Err(TensorLimits::too_large(&label, "the file".into(), len, limit));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes).map_err(|e| io_error(&label, &e))?;
    if bytes.len() as u64 > limit {
        return Err(TensorLimits::too_large(&label, "the file".into(), bytes.len() as u64, limit));
    }
    Ok(bytes)
}

fn write_bytes(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(|e| io_error(&file_label(path), &e))
}

impl Tensors {
    /// An empty set; `source` names it in errors.
    pub fn new(source: impl Into<String>) -> Self {
        Self { source: source.into(), map: BTreeMap::new(), texts: BTreeMap::new() }
    }

    /// Reads a `.safetensors`, `.npz` or `.npy` file (by extension; a `.npy` file becomes one
    /// tensor named after the file stem), within the default [`TensorLimits`].
    pub fn read(path: impl AsRef<Path>) -> Result<Self> {
        Self::read_with_limits(path, &TensorLimits::default())
    }

    /// [`read`](Self::read) within the caller's limits.
    pub fn read_with_limits(path: impl AsRef<Path>, limits: &TensorLimits) -> Result<Self> {
        let path = path.as_ref();
        let label = file_label(path);
        let ext = path.extension().and_then(|e| e.to_str());
        if !matches!(ext, Some("safetensors" | "npz" | "npy")) {
            return Err(InteropError::UnknownFormat { file: label });
        }
        let bytes = read_bytes(path, limits.max_file_bytes)?;
        match ext {
            Some("safetensors") => Self::from_safetensors_bytes_with_limits(&bytes, label, limits),
            Some("npz") => Self::from_npz_bytes_with_limits(&bytes, label, limits),
            _ => {
                let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("array").to_string();
                let mut out = Self::new(label);
                let parsed = parse_npy(&bytes, &out.source, &name, limits)?;
                out.add_parsed(name, parsed);
                Ok(out)
            }
        }
    }

    /// Parses safetensors bytes (`source` names them in errors), within the default
    /// [`TensorLimits`].
    pub fn from_safetensors_bytes(bytes: &[u8], source: impl Into<String>) -> Result<Self> {
        Self::from_safetensors_bytes_with_limits(bytes, source, &TensorLimits::default())
    }

    /// [`from_safetensors_bytes`](Self::from_safetensors_bytes) within the caller's limits. The
    /// safetensors parser checks that the header fits the buffer and that every tensor's byte
    /// range matches its shape, so no declared size exceeds the bytes present.
    pub fn from_safetensors_bytes_with_limits(
        bytes: &[u8],
        source: impl Into<String>,
        limits: &TensorLimits,
    ) -> Result<Self> {
        let source = source.into();
        let st = SafeTensors::deserialize(bytes).map_err(|e| safetensors_error(&source, e))?;
        let mut out = Self::new(source);
        for (name, view) in st.tensors() {
            let shape: Vec<u64> = view.shape().iter().map(|&d| d as u64).collect();
            limits.check_elements(&out.source, &name, &shape)?;
            let (data, dtype) = match view.dtype() {
                Dtype::F64 => (
                    view.data()
                        .chunks_exact(8)
                        .map(|c| f64::from_le_bytes(c.try_into().expect("8-byte chunk")))
                        .collect(),
                    SourceDtype::F64,
                ),
                Dtype::F32 => (
                    view.data()
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes(c.try_into().expect("4-byte chunk")) as f64)
                        .collect(),
                    SourceDtype::F32,
                ),
                other => {
                    return Err(InteropError::UnsupportedDtype {
                        file: out.source,
                        name,
                        dtype: format!("{other:?}"),
                    })
                }
            };
            out.map.insert(name, Tensor { shape: view.shape().to_vec(), data, dtype });
        }
        Ok(out)
    }

    /// Parses `.npz` bytes (a zip of `.npy` files, stored or deflated as `numpy.savez` /
    /// `savez_compressed` write them), within the default [`TensorLimits`].
    pub fn from_npz_bytes(bytes: &[u8], source: impl Into<String>) -> Result<Self> {
        Self::from_npz_bytes_with_limits(bytes, source, &TensorLimits::default())
    }

    /// [`from_npz_bytes`](Self::from_npz_bytes) within the caller's limits: a member whose
    /// declared or actual inflated size passes `max_member_bytes` is refused, and each member's
    /// header is checked against its bytes before its data is read.
    pub fn from_npz_bytes_with_limits(
        bytes: &[u8],
        source: impl Into<String>,
        limits: &TensorLimits,
    ) -> Result<Self> {
        let source = source.into();
        let mut archive = zip::ZipArchive::new(Cursor::new(bytes)).map_err(|e| {
            // A zip's directory is at its end: a file that starts like a zip but has no
            // directory was cut short.
            if bytes.starts_with(b"PK\x03\x04") {
                InteropError::Truncated {
                    file: source.clone(),
                    reason: format!("zip directory missing ({e})"),
                }
            } else {
                InteropError::Corrupt { file: source.clone(), format: "npz", reason: e.to_string() }
            }
        })?;
        let mut out = Self::new(source);
        for i in 0..archive.len() {
            let mut entry = archive.by_index(i).map_err(|e| InteropError::Corrupt {
                file: out.source.clone(),
                format: "npz",
                reason: e.to_string(),
            })?;
            let name = entry.name().strip_suffix(".npy").unwrap_or(entry.name()).to_string();
            let limit = limits.max_member_bytes;
            let too_large =
                |size| TensorLimits::too_large(&out.source, format!("inflated member `{name}`"), size, limit);
            if entry.size() > limit {
                return Err(too_large(entry.size()));
            }
            // The declared size may lie: read at most one byte past the limit.
            let mut buf = Vec::with_capacity((entry.size() as usize).min(bytes.len().saturating_mul(4)));
            (&mut entry)
                .take(limit + 1)
                .read_to_end(&mut buf)
                .map_err(|e| read_failure(&out.source, &name, &e))?;
            if buf.len() as u64 > limit {
                return Err(too_large(buf.len() as u64));
            }
            let parsed = parse_npy(&buf, &out.source, &name, limits)?;
            out.add_parsed(name, parsed);
        }
        Ok(out)
    }

    fn add_parsed(&mut self, name: String, parsed: Parsed) {
        match parsed {
            Parsed::Tensor(t) => {
                self.map.insert(name, t);
            }
            Parsed::Text(t) => {
                self.texts.insert(name, t);
            }
        }
    }

    /// A text array of an `.npz` file (a unicode string such as the `method` that
    /// [`write_posterior_npz`](crate::write_posterior_npz) writes). Text is kept apart from the
    /// tensors: it is never a weight.
    pub fn text(&self, name: &str) -> Option<&str> {
        self.texts.get(name).map(String::as_str)
    }

    /// The file (or label) the tensors came from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Adds (or replaces) a tensor.
    pub fn insert(&mut self, name: impl Into<String>, tensor: Tensor) {
        self.map.insert(name.into(), tensor);
    }

    /// The tensor `name`.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.map.get(name)
    }

    /// Removes and returns the tensor `name`.
    pub fn remove(&mut self, name: &str) -> Option<Tensor> {
        self.map.remove(name)
    }

    /// Keeps only the tensors for which `keep(name, tensor)` holds (e.g. to drop buffers such
    /// as batch-norm statistics that a network file carries but fspace does not use).
    pub fn retain(&mut self, mut keep: impl FnMut(&str, &Tensor) -> bool) {
        self.map.retain(|k, v| keep(k, v));
    }

    /// The tensors' names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.map.keys().map(String::as_str)
    }

    /// `(name, tensor)` pairs, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.map.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The safetensors bytes of these tensors, as f64 or (rounded) f32.
    pub fn to_safetensors_bytes(&self, dtype: SourceDtype) -> Result<Vec<u8>> {
        let raw: Vec<(String, Vec<usize>, Vec<u8>)> = self
            .map
            .iter()
            .map(|(name, t)| {
                let bytes = match dtype {
                    SourceDtype::F64 => t.data.iter().flat_map(|v| v.to_le_bytes()).collect(),
                    SourceDtype::F32 => t.data.iter().flat_map(|&v| (v as f32).to_le_bytes()).collect(),
                };
                (name.clone(), t.shape.clone(), bytes)
            })
            .collect();
        let st_dtype = match dtype {
            SourceDtype::F64 => Dtype::F64,
            SourceDtype::F32 => Dtype::F32,
        };
        let views = raw
            .iter()
            .map(|(name, shape, bytes)| {
                TensorView::new(st_dtype, shape.clone(), bytes)
                    .map(|v| (name.clone(), v))
                    .map_err(|e| InteropError::InvalidArray { name: name.clone(), reason: e.to_string() })
            })
            .collect::<Result<Vec<_>>>()?;
        safetensors::serialize(views, None).map_err(|e| InteropError::InvalidArray {
            name: "safetensors header".into(),
            reason: e.to_string(),
        })
    }

    /// Writes the tensors as a safetensors file.
    pub fn write_safetensors(&self, path: impl AsRef<Path>, dtype: SourceDtype) -> Result<()> {
        write_bytes(path.as_ref(), &self.to_safetensors_bytes(dtype)?)
    }

    /// The `.npz` bytes of these tensors (f64 arrays, stored uncompressed as `numpy.savez`
    /// writes them).
    pub fn to_npz_bytes(&self) -> Result<Vec<u8>> {
        let mut npz = NpzBuffer::new();
        for (name, t) in &self.map {
            npz.add_f64(name, &t.shape, &t.data)?;
        }
        for (name, text) in &self.texts {
            npz.add_text(name, text)?;
        }
        npz.finish()
    }

    /// Writes the tensors as an `.npz` file.
    pub fn write_npz(&self, path: impl AsRef<Path>) -> Result<()> {
        write_bytes(path.as_ref(), &self.to_npz_bytes()?)
    }
}

/// `shape` holds exactly `len` values, else [`InteropError::InvalidArray`].
fn check_count(name: &str, shape: &[usize], len: usize) -> Result<()> {
    let count: usize = shape.iter().product();
    if count != len {
        return Err(InteropError::InvalidArray {
            name: name.to_string(),
            reason: format!("shape {shape:?} holds {count} values, {len} given"),
        });
    }
    Ok(())
}

fn safetensors_error(file: &str, e: SafeTensorError) -> InteropError {
    match e {
        SafeTensorError::HeaderTooSmall
        | SafeTensorError::InvalidHeaderLength
        | SafeTensorError::MetadataIncompleteBuffer => {
            InteropError::Truncated { file: file.to_string(), reason: e.to_string() }
        }
        other => {
            InteropError::Corrupt { file: file.to_string(), format: "safetensors", reason: other.to_string() }
        }
    }
}

fn read_failure(file: &str, name: &str, e: &std::io::Error) -> InteropError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        InteropError::Truncated { file: file.to_string(), reason: format!("array `{name}` ends early") }
    } else {
        InteropError::Corrupt {
            file: file.to_string(),
            format: "npz",
            reason: format!("array `{name}`: {e}"),
        }
    }
}

/// What one `.npy` member holds.
enum Parsed {
    Tensor(Tensor),
    Text(String),
}

/// Checks a `.npy` array's header without allocating and returns the number of data bytes
/// after it: the header length is checked against the bytes present and the shape's element
/// count against `limits` and against the data bytes, before `npyz` (which preallocates the
/// declared count) sees the bytes.
fn check_npy_header(bytes: &[u8], file: &str, name: &str, limits: &TensorLimits) -> Result<u64> {
    let truncated = |reason: String| InteropError::Truncated { file: file.to_string(), reason };
    let corrupt = |reason: String| InteropError::Corrupt {
        file: file.to_string(),
        format: "npy",
        reason: format!("`{name}`: {reason}"),
    };
    if bytes.len() < 10 {
        return Err(truncated(format!("header of `{name}` ends early")));
    }
    if &bytes[..6] != b"\x93NUMPY" {
        return Err(corrupt("not an .npy array (bad magic string)".into()));
    }
    let (len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => {
            (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12)
        }
        2 | 3 => return Err(truncated(format!("header of `{name}` ends early"))),
        v => return Err(corrupt(format!("unknown .npy format version {v}"))),
    };
    if len > bytes.len() - start {
        return Err(truncated(format!(
            "header of `{name}` declares {len} bytes, {} remain",
            bytes.len() - start
        )));
    }
    let header = String::from_utf8_lossy(&bytes[start..start + len]);
    let Some(at) = header.find("'shape'").or_else(|| header.find("\"shape\"")) else {
        return Err(corrupt("header has no 'shape'".into()));
    };
    let rest = &header[at..];
    let (Some(open), Some(close)) = (rest.find('('), rest.find(')')) else {
        return Err(corrupt("header's shape is not a tuple".into()));
    };
    if close < open {
        return Err(corrupt("header's shape is not a tuple".into()));
    }
    let shape = rest[open + 1..close]
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.trim_end_matches('L').parse::<u64>())
        .collect::<std::result::Result<Vec<u64>, _>>()
        .map_err(|e| corrupt(format!("header's shape: {e}")))?;
    let count = limits.check_elements(file, name, &shape)?;
    // Every dtype read here takes ≥ 1 byte per element (f4, f8, a string of ≥ 1 code point).
    let data = (bytes.len() - start - len) as u64;
    if count > data {
        return Err(truncated(format!("`{name}` declares {count} elements, {data} bytes remain")));
    }
    Ok(data)
}

/// One `.npy` array: f8 or f4 (either byte order), C or Fortran order; or one unicode string.
fn parse_npy(bytes: &[u8], file: &str, name: &str, limits: &TensorLimits) -> Result<Parsed> {
    let data_bytes = check_npy_header(bytes, file, name, limits)?;
    let npy = npyz::NpyFile::new(bytes).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            InteropError::Truncated {
                file: file.to_string(),
                reason: format!("header of `{name}` ends early"),
            }
        } else {
            InteropError::Corrupt { file: file.to_string(), format: "npy", reason: format!("`{name}`: {e}") }
        }
    })?;
    let shape: Vec<usize> = npy.shape().iter().map(|&s| s as usize).collect();
    // `into_vec` preallocates the declared count: it must fit the bytes after the header.
    let check_data_bytes = |npy: &npyz::NpyFile<&[u8]>, item: u64| -> Result<()> {
        let need = npy.len().saturating_mul(item);
        if need > data_bytes {
            return Err(InteropError::Truncated {
                file: file.to_string(),
                reason: format!("array `{name}` needs {need} data bytes, {data_bytes} remain"),
            });
        }
        Ok(())
    };
    let fortran = npy.order() == npyz::Order::Fortran;
    let unsupported = |dtype: String| InteropError::UnsupportedDtype {
        file: file.to_string(),
        name: name.to_string(),
        dtype,
    };
    let (data, dtype) = match npy.dtype() {
        npyz::DType::Plain(ts) if ts.type_char() == npyz::TypeChar::Float && ts.size_field() == 8 => {
            check_data_bytes(&npy, 8)?;
            (npy.into_vec::<f64>().map_err(|e| read_failure(file, name, &e))?, SourceDtype::F64)
        }
        npyz::DType::Plain(ts) if ts.type_char() == npyz::TypeChar::Float && ts.size_field() == 4 => {
            check_data_bytes(&npy, 4)?;
            let v = npy.into_vec::<f32>().map_err(|e| read_failure(file, name, &e))?;
            (v.into_iter().map(f64::from).collect(), SourceDtype::F32)
        }
        npyz::DType::Plain(ts) if ts.type_char() == npyz::TypeChar::UnicodeStr && npy.len() == 1 => {
            let mut v = npy.into_vec::<String>().map_err(|e| read_failure(file, name, &e))?;
            return Ok(Parsed::Text(v.pop().unwrap_or_default()));
        }
        npyz::DType::Plain(ts) => return Err(unsupported(ts.to_string())),
        other => return Err(unsupported(other.descr())),
    };
    let data = if fortran { fortran_to_c(&data, &shape) } else { data };
    Tensor::new(name, shape, data, dtype).map(Parsed::Tensor)
}

/// Reorders column-major (Fortran) values of `shape` into row-major order.
fn fortran_to_c(data: &[f64], shape: &[usize]) -> Vec<f64> {
    let n = data.len();
    let mut out = vec![0.0; n];
    let mut index = vec![0usize; shape.len()];
    for (c_pos, slot) in out.iter_mut().enumerate() {
        // `index` is the multi-index of row-major position `c_pos`.
        let mut f_pos = 0;
        let mut stride = 1;
        for (k, &i) in index.iter().enumerate() {
            f_pos += i * stride;
            stride *= shape[k];
        }
        *slot = data[f_pos];
        if c_pos + 1 < n {
            for k in (0..shape.len()).rev() {
                index[k] += 1;
                if index[k] < shape[k] {
                    break;
                }
                index[k] = 0;
            }
        }
    }
    out
}

/// An `.npz` archive built in memory: f64 arrays, 0-d scalars and unicode strings, each an
/// uncompressed `.npy` member as `numpy.savez` writes them.
pub(crate) struct NpzBuffer {
    zip: zip::ZipWriter<Cursor<Vec<u8>>>,
    names: Vec<String>,
}

impl NpzBuffer {
    pub(crate) fn new() -> Self {
        Self { zip: zip::ZipWriter::new(Cursor::new(Vec::new())), names: Vec::new() }
    }

    fn member(&mut self, name: &str, npy: &[u8]) -> Result<()> {
        if name.is_empty() || self.names.iter().any(|n| n == name) {
            return Err(InteropError::InvalidArray {
                name: name.to_string(),
                reason: "array names must be non-empty and distinct".into(),
            });
        }
        let options =
            zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
        let fail = |e: String| InteropError::InvalidArray { name: name.to_string(), reason: e };
        self.zip.start_file(format!("{name}.npy"), options).map_err(|e| fail(e.to_string()))?;
        self.zip.write_all(npy).map_err(|e| fail(e.to_string()))?;
        self.names.push(name.to_string());
        Ok(())
    }

    pub(crate) fn add_f64(&mut self, name: &str, shape: &[usize], data: &[f64]) -> Result<()> {
        check_count(name, shape, data.len())?;
        let mut npy = Vec::new();
        let shape: Vec<u64> = shape.iter().map(|&s| s as u64).collect();
        {
            use npyz::WriterBuilder;
            let mut w = npyz::WriteOptions::<f64>::new()
                .default_dtype()
                .shape(&shape)
                .writer(&mut npy)
                .begin_nd()
                .map_err(|e| InteropError::InvalidArray { name: name.to_string(), reason: e.to_string() })?;
            w.extend(data.iter().copied())
                .and_then(|()| w.finish())
                .map_err(|e| InteropError::InvalidArray { name: name.to_string(), reason: e.to_string() })?;
        }
        self.member(name, &npy)
    }

    pub(crate) fn add_text(&mut self, name: &str, text: &str) -> Result<()> {
        let chars = text.chars().count().max(1) as u64;
        let dtype =
            npyz::DType::Plain(format!("<U{chars}").parse().map_err(|e| InteropError::InvalidArray {
                name: name.to_string(),
                reason: format!("{e}"),
            })?);
        let mut npy = Vec::new();
        {
            use npyz::WriterBuilder;
            let mut w = npyz::WriteOptions::<str>::new()
                .dtype(dtype)
                .shape(&[])
                .writer(&mut npy)
                .begin_nd()
                .map_err(|e| InteropError::InvalidArray { name: name.to_string(), reason: e.to_string() })?;
            w.push(text)
                .and_then(|()| w.finish())
                .map_err(|e| InteropError::InvalidArray { name: name.to_string(), reason: e.to_string() })?;
        }
        self.member(name, &npy)
    }

    pub(crate) fn finish(self) -> Result<Vec<u8>> {
        self.zip
            .finish()
            .map(Cursor::into_inner)
            .map_err(|e| InteropError::InvalidArray { name: "npz archive".into(), reason: e.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fortran_order_is_transposed_to_c_order() {
        // 2 × 3 matrix [[0, 1, 2], [3, 4, 5]] stored column-major.
        let f = [0.0, 3.0, 1.0, 4.0, 2.0, 5.0];
        assert_eq!(fortran_to_c(&f, &[2, 3]), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        // 2 × 2 × 2: element (i, j, k) = 4i + 2j + k, column-major position i + 2j + 4k.
        let mut f3 = vec![0.0; 8];
        for i in 0..2 {
            for j in 0..2 {
                for k in 0..2 {
                    f3[i + 2 * j + 4 * k] = (4 * i + 2 * j + k) as f64;
                }
            }
        }
        assert_eq!(fortran_to_c(&f3, &[2, 2, 2]), (0..8).map(f64::from).collect::<Vec<_>>());
    }
}
