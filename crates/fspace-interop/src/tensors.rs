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

fn read_bytes(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| io_error(&file_label(path), &e))
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
    /// tensor named after the file stem).
    pub fn read(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let label = file_label(path);
        match path.extension().and_then(|e| e.to_str()) {
            Some("safetensors") => Self::from_safetensors_bytes(&read_bytes(path)?, label),
            Some("npz") => Self::from_npz_bytes(&read_bytes(path)?, label),
            Some("npy") => {
                let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("array").to_string();
                let mut out = Self::new(label);
                let parsed = parse_npy(&read_bytes(path)?, &out.source, &name)?;
                out.add_parsed(name, parsed);
                Ok(out)
            }
            _ => Err(InteropError::UnknownFormat { file: label }),
        }
    }

    /// Parses safetensors bytes (`source` names them in errors).
    pub fn from_safetensors_bytes(bytes: &[u8], source: impl Into<String>) -> Result<Self> {
        let source = source.into();
        let st = SafeTensors::deserialize(bytes).map_err(|e| safetensors_error(&source, e))?;
        let mut out = Self::new(source);
        for (name, view) in st.tensors() {
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
    /// `savez_compressed` write them).
    pub fn from_npz_bytes(bytes: &[u8], source: impl Into<String>) -> Result<Self> {
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
            let mut buf = Vec::with_capacity(entry.size() as usize);
            entry.read_to_end(&mut buf).map_err(|e| read_failure(&out.source, &name, &e))?;
            let parsed = parse_npy(&buf, &out.source, &name)?;
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

/// One `.npy` array: f8 or f4 (either byte order), C or Fortran order; or one unicode string.
fn parse_npy(bytes: &[u8], file: &str, name: &str) -> Result<Parsed> {
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
    let fortran = npy.order() == npyz::Order::Fortran;
    let unsupported = |dtype: String| InteropError::UnsupportedDtype {
        file: file.to_string(),
        name: name.to_string(),
        dtype,
    };
    let (data, dtype) = match npy.dtype() {
        npyz::DType::Plain(ts) if ts.type_char() == npyz::TypeChar::Float && ts.size_field() == 8 => {
            (npy.into_vec::<f64>().map_err(|e| read_failure(file, name, &e))?, SourceDtype::F64)
        }
        npyz::DType::Plain(ts) if ts.type_char() == npyz::TypeChar::Float && ts.size_field() == 4 => {
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
