//! Versioned JSON persistence for fitted posteriors.
//!
//! A saved file is one JSON object
//! `{"format": "fspace", "type": "<Persist::KIND>", "version": <Persist::VERSION>, "payload": …}`.
//! Loading checks the envelope before the payload, so a file of another posterior type or of
//! another format version is a [`PersistError`] that names both, never a panic or a
//! half-filled value. Numbers are written with `serde_json`'s `float_roundtrip`, so a
//! save → load round trip reproduces every `f64` bit for bit.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use thiserror::Error;

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
    #[error("saved {kind} is invalid: {reason}")]
    Invalid {
        /// The type.
        kind: &'static str,
        /// What is wrong.
        reason: String,
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

#[derive(Serialize)]
struct EnvelopeOut<'a, T> {
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

    /// Checks a freshly parsed value (shapes that serde cannot check); the default accepts
    /// everything. Return [`PersistError::Invalid`] to refuse.
    fn validate_loaded(&self) -> Result<(), PersistError> {
        Ok(())
    }

    /// The JSON text of the envelope and payload.
    fn to_json(&self) -> Result<String, PersistError> {
        let env = EnvelopeOut { format: FORMAT, kind: Self::KIND, version: Self::VERSION, payload: self };
        serde_json::to_string(&env)
            .map_err(|e| PersistError::Unserialisable { kind: Self::KIND, reason: e.to_string() })
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

    /// Reads a file written by [`save`](Self::save).
    fn load(path: impl AsRef<Path>) -> Result<Self, PersistError> {
        let path = path.as_ref();
        let text =
            std::fs::read_to_string(path).map_err(|source| PersistError::Io { path: path.into(), source })?;
        Self::from_json(&text)
    }
}
