//! Versioned JSON persistence for fitted posteriors.
//!
//! A saved file is one JSON object
//! `{"format": "fspace", "type": "<Persist::KIND>", "version": <Persist::VERSION>, "payload": …}`.
//! Loading checks the envelope before the payload, so a file of another posterior type or of
//! another format version is a [`PersistError`] that names both, never a panic or a
//! half-filled value. Numbers are written with `serde_json`'s `float_roundtrip`, so a
//! save → load round trip reproduces every `f64` bit for bit.
//!
//! # The load invariant
//!
//! A file may come from anywhere (a colleague, a model zoo, a pickle), so nothing in it is
//! trusted. Loading runs three gates, in order, and a value that passes them all cannot reach a
//! panic in any method of the type:
//!
//! 1. **Size.** [`Persist::load`] refuses a file longer than [`LoadLimits::max_bytes`] before
//!    reading it ([`PersistError::TooLarge`]); [`Persist::load_with_limits`] raises the bound.
//!    JSON declares no sizes, so every array held after parsing was spelled out in the text.
//! 2. **Self-checking parts.** The building blocks check themselves while they are deserialised:
//!    networks (parameter count against the configuration, finite weights), kernels
//!    (hyperparameters), Cholesky factors (square, triangular, positive diagonal), likelihood
//!    specs (σ > 0, ≥ 2 classes).
//! 3. **The type's own invariants.** [`Persist::validate_loaded`], which every persisted type
//!    must implement (there is no default), checks what ties the parts together: every
//!    matrix's shape against the dimensions it is used with, the likelihood against the
//!    network's outputs, finite values and positive scales where the maths needs them. It is
//!    written with [`LoadCheck`], so every refusal is a [`PersistError::Invalid`] that names the
//!    type and the field.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A fingerprint of a sequence of `f64`s: 64-bit FNV-1a over each value's bits in
/// little-endian byte order, as 16 lower-case hex digits. It names what a resumable record was
/// computed from (a network's weights, a data set), so a resumed run can tell whether a stored
/// record belongs to the inputs it has now. Equal bit patterns give equal fingerprints on every
/// platform; `0.0` and `-0.0` differ, as do NaNs of different payloads.
///
/// ```
/// assert_eq!(fspace_core::fingerprint([]), "cbf29ce484222325");
/// assert_ne!(fspace_core::fingerprint([1.0, 2.0]), fspace_core::fingerprint([2.0, 1.0]));
/// ```
pub fn fingerprint(values: impl IntoIterator<Item = f64>) -> String {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0100_0000_01b3;
    let mut h = OFFSET_BASIS;
    for v in values {
        for byte in v.to_bits().to_le_bytes() {
            h = (h ^ u64::from(byte)).wrapping_mul(PRIME);
        }
    }
    format!("{h:016x}")
}

/// What can go wrong saving or loading a posterior.
#[derive(Debug, Error)]
pub enum PersistError {
    /// The file could not be read or written.
    #[error("cannot access {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating-system error.
        #[source]
        source: std::io::Error,
    },
    /// The text is not JSON of the expected shape.
    #[error("malformed saved {what}: {source}")]
    Json {
        /// The envelope or the payload of which type.
        what: String,
        /// serde_json's error (line and column).
        #[source]
        source: serde_json::Error,
    },
    /// The file is not an fspace save file.
    #[error("not an fspace save file (format {found:?})")]
    NotFspace {
        /// The `format` field found.
        found: String,
    },
    /// The file holds another type.
    #[error("the file holds a {found}, not a {expected}")]
    WrongType {
        /// The type asked for.
        expected: &'static str,
        /// The type in the file.
        found: String,
    },
    /// The file was written by another version of the type's format.
    #[error("{kind} file format version {found} is not supported (this build reads version {expected})")]
    WrongVersion {
        /// The type.
        kind: &'static str,
        /// The version this build reads.
        expected: u32,
        /// The version in the file.
        found: u32,
    },
    /// The payload parsed but describes an invalid value (e.g. a likelihood that does not fit
    /// the saved network).
    #[error("saved {kind} is invalid: {field}: {reason}")]
    Invalid {
        /// The type.
        kind: &'static str,
        /// The field (a path such as `curvature.eigenvalues`).
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// The file is longer than the caller allows ([`LoadLimits`]); nothing was read.
    #[error(
        "{path} is {bytes} bytes, more than the {limit}-byte limit (raise LoadLimits::max_bytes to read it)"
    )]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its length.
        bytes: u64,
        /// The limit in force.
        limit: u64,
    },
    /// A value that cannot be written. (Non-finite numbers have no JSON form: serde_json
    /// writes them as `null`, and loading such a file is a [`PersistError::Json`].)
    #[error("cannot save {kind}: {reason}")]
    Unserialisable {
        /// The type.
        kind: &'static str,
        /// Why.
        reason: String,
    },
}

const FORMAT: &str = "fspace";

/// Bounds on what [`Persist::load_with_limits`] reads from an untrusted file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadLimits {
    /// The longest file read, in bytes (default 2 GiB: a saved last-layer Laplace of the
    /// 784-200-200-10 MNIST MLP is ≈ 0.1 GB). Parsing needs a few times this in memory.
    pub max_bytes: u64,
}

impl Default for LoadLimits {
    fn default() -> Self {
        Self { max_bytes: 2 << 30 }
    }
}

/// What an array frame of [`check_matrix_sizes`] has seen.
#[derive(Clone, Copy)]
enum Seen {
    /// An array of this many entries.
    Array(usize),
    /// An unsigned integer.
    Unsigned(u64),
    /// Anything else.
    Other,
}

/// One pass over a payload's text (already known to be JSON) that refuses every nalgebra
/// matrix, serialised as `[data, rows, cols]`, whose `rows × cols` overflows or differs from
/// the number of values it holds. Numbers are skipped, not parsed, so the pass costs a fraction
/// of the typed parse; it allocates one frame per nesting level.
fn check_matrix_sizes(text: &str) -> Result<(), String> {
    struct Frame {
        array: bool,
        count: usize,
        first: [Seen; 3],
    }
    let bytes = text.as_bytes();
    let mut stack: Vec<Frame> = Vec::new();
    let mut i = 0;
    // A value has started in the innermost frame: count it (arrays only).
    fn element(stack: &mut [Frame], seen: Seen) {
        if let Some(f) = stack.last_mut() {
            if f.array {
                if let Some(slot) = f.first.get_mut(f.count) {
                    *slot = seen;
                }
                f.count += 1;
            }
        }
    }
    while i < bytes.len() {
        match bytes[i] {
            b'[' | b'{' => {
                stack.push(Frame { array: bytes[i] == b'[', count: 0, first: [Seen::Other; 3] });
                i += 1;
            }
            b']' | b'}' => {
                let Some(f) = stack.pop() else { return Err("unbalanced brackets".into()) };
                let seen = if f.array {
                    if let (3, [Seen::Array(len), Seen::Unsigned(r), Seen::Unsigned(c)]) = (f.count, f.first)
                    {
                        if r.checked_mul(c) != Some(len as u64) {
                            return Err(format!("a matrix declares {r} × {c} entries and holds {len}"));
                        }
                    }
                    Seen::Array(f.count)
                } else {
                    Seen::Other
                };
                element(&mut stack, seen);
                i += 1;
            }
            b'"' => {
                // A string (an object key or a value); keys sit in object frames, not counted.
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                element(&mut stack, Seen::Other);
            }
            b',' | b':' | b' ' | b'\n' | b'\r' | b'\t' => i += 1,
            _ => {
                let start = i;
                while i < bytes.len()
                    && !matches!(bytes[i], b',' | b']' | b'}' | b' ' | b'\n' | b'\r' | b'\t')
                {
                    i += 1;
                }
                let token = &text[start..i];
                let seen = if token.bytes().all(|b| b.is_ascii_digit()) {
                    token.parse::<u64>().map(Seen::Unsigned).unwrap_or(Seen::Other)
                } else {
                    Seen::Other
                };
                element(&mut stack, seen);
            }
        }
    }
    Ok(())
}

/// The checks a [`Persist::validate_loaded`] is written with. Each returns
/// [`PersistError::Invalid`] naming the type and the field.
///
/// ```
/// use fspace_core::LoadCheck;
/// let check = LoadCheck::new("my::Posterior");
/// assert!(check.len("weights", 3, 3).is_ok());
/// let e = check.shape("factor", (2, 3), (3, 2)).unwrap_err();
/// assert_eq!(e.to_string(), "saved my::Posterior is invalid: factor: is 2 × 3, must be 3 × 2");
/// ```
#[derive(Debug, Clone, Copy)]
pub struct LoadCheck {
    kind: &'static str,
}

impl LoadCheck {
    /// Checks for the type `kind` (its [`Persist::KIND`]).
    pub fn new(kind: &'static str) -> Self {
        Self { kind }
    }

    /// The error for `field`.
    pub fn invalid(&self, field: impl Into<String>, reason: impl Into<String>) -> PersistError {
        PersistError::Invalid { kind: self.kind, field: field.into(), reason: reason.into() }
    }

    /// `Err(invalid(field, reason()))` unless `ok`.
    pub fn ensure(&self, ok: bool, field: &str, reason: impl FnOnce() -> String) -> Result<(), PersistError> {
        if ok {
            Ok(())
        } else {
            Err(self.invalid(field, reason()))
        }
    }

    /// `field` has `expected` entries.
    pub fn len(&self, field: &str, found: usize, expected: usize) -> Result<(), PersistError> {
        self.ensure(found == expected, field, || format!("has {found} entries, must have {expected}"))
    }

    /// `field` is a `rows × cols` matrix.
    pub fn shape(
        &self,
        field: &str,
        found: (usize, usize),
        expected: (usize, usize),
    ) -> Result<(), PersistError> {
        self.ensure(found == expected, field, || {
            format!("is {} × {}, must be {} × {}", found.0, found.1, expected.0, expected.1)
        })
    }

    /// Every value of `field` is finite.
    pub fn finite<'a>(
        &self,
        field: &str,
        values: impl IntoIterator<Item = &'a f64>,
    ) -> Result<(), PersistError> {
        self.ensure(values.into_iter().all(|v| v.is_finite()), field, || "has non-finite entries".into())
    }

    /// `field` holds orthonormal columns, as far as entries go: each is finite and of magnitude at
    /// most 1 (a unit column has no larger entry; rounding is allowed `1e-6`). A tampered entry
    /// of ±1e308 would otherwise load and serve infinite variances.
    pub fn unit_entries<'a>(
        &self,
        field: &str,
        values: impl IntoIterator<Item = &'a f64>,
    ) -> Result<(), PersistError> {
        let mut worst = 0.0f64;
        let ok = values.into_iter().all(|v| {
            worst = worst.max(v.abs());
            v.is_finite() && v.abs() <= 1.0 + 1e-6
        });
        self.ensure(ok, field, || {
            format!("holds an entry of magnitude {worst:e}: the columns of an orthonormal basis have none above 1")
        })
    }

    /// Every value of `field` is finite and ≥ 0.
    pub fn non_negative<'a>(
        &self,
        field: &str,
        values: impl IntoIterator<Item = &'a f64>,
    ) -> Result<(), PersistError> {
        self.ensure(values.into_iter().all(|v| v.is_finite() && *v >= 0.0), field, || {
            "must be finite and ≥ 0".into()
        })
    }

    /// `value` is finite and > 0.
    pub fn positive(&self, field: &str, value: f64) -> Result<(), PersistError> {
        self.ensure(value.is_finite() && value > 0.0, field, || format!("is {value}, must be finite and > 0"))
    }

    /// `spec` is valid and describes a network with `outputs` outputs.
    pub fn likelihood(
        &self,
        field: &str,
        spec: &crate::LikelihoodSpec,
        outputs: usize,
    ) -> Result<(), PersistError> {
        spec.validate().map_err(|e| self.invalid(field, e.to_string()))?;
        self.ensure(spec.output_dim() == outputs, field, || {
            format!(
                "the {} likelihood needs {} outputs, the network has {outputs}",
                spec.name(),
                spec.output_dim()
            )
        })
    }
}

/// The envelope's JSON text around `payload`, as [`Persist::to_json`] writes it: for a type that
/// saves a view of itself (its fields with some replaced) under its own `kind` and `version`,
/// so that [`Persist::from_json`] reads it back.
pub fn envelope_json<T: Serialize + ?Sized>(
    kind: &'static str,
    version: u32,
    payload: &T,
) -> Result<String, PersistError> {
    let env = EnvelopeOut { format: FORMAT, kind, version, payload };
    serde_json::to_string(&env).map_err(|e| PersistError::Unserialisable { kind, reason: e.to_string() })
}

#[derive(Serialize)]
struct EnvelopeOut<'a, T: ?Sized> {
    format: &'static str,
    #[serde(rename = "type")]
    kind: &'static str,
    version: u32,
    payload: &'a T,
}

#[derive(Deserialize)]
struct EnvelopeIn {
    format: String,
    #[serde(rename = "type")]
    kind: String,
    version: u32,
    payload: Box<serde_json::value::RawValue>,
}

/// A value saved and loaded as versioned JSON. Implement it with the type's name and format
/// version; the methods have defaults. Every fitted posterior of the workspace implements it.
pub trait Persist: Serialize + DeserializeOwned {
    /// The type name written to the file (e.g. `"fspace_laplace::LaplacePosterior"`).
    const KIND: &'static str;
    /// The payload format version; bump it when the serialised fields change.
    const VERSION: u32;

    /// Checks a freshly parsed value: every invariant a constructor of the type would
    /// establish and serde cannot (shapes against each other, the likelihood against the
    /// network, finite and positive values). Required, so that no persisted type forgets it;
    /// write it with [`LoadCheck`]. [`from_json`](Self::from_json) returns its error.
    fn validate_loaded(&self) -> Result<(), PersistError>;

    /// The JSON text of the envelope and payload.
    fn to_json(&self) -> Result<String, PersistError> {
        envelope_json(Self::KIND, Self::VERSION, self)
    }

    /// Parses [`to_json`](Self::to_json)'s text, checking format, type and version first.
    fn from_json(text: &str) -> Result<Self, PersistError> {
        let env: EnvelopeIn = serde_json::from_str(text)
            .map_err(|source| PersistError::Json { what: "envelope".into(), source })?;
        if env.format != FORMAT {
            return Err(PersistError::NotFspace { found: env.format });
        }
        if env.kind != Self::KIND {
            return Err(PersistError::WrongType { expected: Self::KIND, found: env.kind });
        }
        if env.version != Self::VERSION {
            return Err(PersistError::WrongVersion {
                kind: Self::KIND,
                expected: Self::VERSION,
                found: env.version,
            });
        }
        // Matrices first: nalgebra multiplies a matrix's declared dimensions without checking
        // for overflow, so `[[], 2^32, 2^32]` would pass as a 2^32 × 2^32 matrix with no data.
        check_matrix_sizes(env.payload.get()).map_err(|reason| PersistError::Invalid {
            kind: Self::KIND,
            field: "a matrix".into(),
            reason,
        })?;
        let value: Self = serde_json::from_str(env.payload.get())
            .map_err(|source| PersistError::Json { what: Self::KIND.to_string(), source })?;
        value.validate_loaded()?;
        Ok(value)
    }

    /// Writes the JSON to `path`.
    fn save(&self, path: impl AsRef<Path>) -> Result<(), PersistError> {
        let path = path.as_ref();
        std::fs::write(path, self.to_json()?).map_err(|source| PersistError::Io { path: path.into(), source })
    }

    /// Reads a file written by [`save`](Self::save), within the default [`LoadLimits`].
    fn load(path: impl AsRef<Path>) -> Result<Self, PersistError> {
        Self::load_with_limits(path, &LoadLimits::default())
    }

    /// [`load`](Self::load) with the caller's limits: a longer file is refused before it is read.
    fn load_with_limits(path: impl AsRef<Path>, limits: &LoadLimits) -> Result<Self, PersistError> {
        use std::io::Read;
        let path = path.as_ref();
        let io = |source| PersistError::Io { path: path.into(), source };
        let file = std::fs::File::open(path).map_err(io)?;
        let bytes = file.metadata().map_err(io)?.len();
        if bytes > limits.max_bytes {
            return Err(PersistError::TooLarge { path: path.into(), bytes, limit: limits.max_bytes });
        }
        // `take` also bounds a file that grows while it is read.
        let mut text = String::new();
        file.take(limits.max_bytes.saturating_add(1)).read_to_string(&mut text).map_err(io)?;
        if text.len() as u64 > limits.max_bytes {
            return Err(PersistError::TooLarge {
                path: path.into(),
                bytes: text.len() as u64,
                limit: limits.max_bytes,
            });
        }
        Self::from_json(&text)
    }
}
