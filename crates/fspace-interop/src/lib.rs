//! # fspace-interop
//!
//! Bring your own network. The post-hoc methods (Laplace in every structure, VaLLA, ELLA) add
//! uncertainty to a network someone already trained, usually in PyTorch or JAX. This crate
//! reads such weights into fspace networks and writes predictions back for Python.
//!
//! * [`Tensors`]: named tensors from **safetensors** (`safetensors.torch.save_file(model.state_dict(), …)`),
//!   **`.npz`** (`numpy.savez` / `savez_compressed`) or `.npy` files. 64-bit floats are read
//!   exactly; 32-bit floats are upcast (exactly — the network then computes in f64 on the
//!   f32-rounded weights). Any other dtype, a truncated or malformed file gets a typed
//!   [`InteropError`]. Files are untrusted: a file, tensor or zip member larger than
//!   [`TensorLimits`] allows, or a header that declares more data than the file holds, is
//!   refused before anything of that size is allocated.
//! * [`load_mlp`], [`infer_mlp`], [`load_cnn`]: the tensors assigned to the network's weight
//!   layers. The layouts are PyTorch's: `Linear.weight` is `out × in` and a layer computes
//!   `a Wᵀ + b`; `Conv2d.weight` is `out × in × k × k` (cross-correlation, as `Conv2d`), and
//!   images are flattened channel-major, as `torch.flatten(x, 1)`. Each layer takes
//!   `<prefix>.weight` and `<prefix>.bias`; prefixes are matched in natural order
//!   ([`LayerNames::Natural`]: `0 < 2 < 4` in an `nn.Sequential`, `fc2 < fc10`) or as listed
//!   ([`LayerNames::Explicit`]). Every network parameter must come from the file and every
//!   tensor of the file must be used, so a mismatched architecture is an error, never a
//!   partial load. Activations are not stored in weights and are always given; fspace's
//!   `Activation::Gelu` is the tanh form (`nn.GELU(approximate="tanh")`).
//! * [`mlp_tensors`], [`cnn_tensors`] and [`Tensors::write_safetensors`] / [`Tensors::write_npz`]:
//!   the other direction, for a network trained in fspace.
//! * [`NpzWriter`] and [`write_posterior_npz`]: predictions, predictive variances, joint
//!   function samples (`S × n × d'`) and named summary numbers as an `.npz` archive
//!   (`numpy.load`).
//!
//! ```
//! use fspace_interop::{infer_mlp, LayerNames, Tensor, Tensors, SourceDtype};
//! use fspace_nn::Activation;
//! use nalgebra::DMatrix;
//!
//! // A 2 → 3 → 1 network as PyTorch's `nn.Sequential(Linear(2, 3), Tanh(), Linear(3, 1))`
//! // would name it.
//! let mut t = Tensors::new("example");
//! let f64_tensor = |shape: Vec<usize>, data: Vec<f64>| Tensor { shape, data, dtype: SourceDtype::F64 };
//! t.insert("0.weight", f64_tensor(vec![3, 2], vec![0.1, 0.2, 0.3, 0.4, 0.5, 0.6]));
//! t.insert("0.bias", f64_tensor(vec![3], vec![0.0, 0.1, 0.2]));
//! t.insert("2.weight", f64_tensor(vec![1, 3], vec![1.0, -1.0, 0.5]));
//! t.insert("2.bias", f64_tensor(vec![1], vec![0.3]));
//! let net = infer_mlp(&t, Activation::Tanh, &LayerNames::Natural)?;
//! let f = net.forward(&DMatrix::from_row_slice(1, 2, &[1.0, 2.0]))?;
//! let h = [0.5f64.tanh(), 1.2f64.tanh(), 1.9f64.tanh()];
//! assert!((f[0] - (h[0] - h[1] + 0.5 * h[2] + 0.3)).abs() < 1e-15);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod error;
mod export;
mod networks;
mod tensors;

pub use error::{InteropError, Result};
pub use export::{write_posterior_npz, NpzWriter, PosteriorExport};
pub use networks::{cnn_tensors, infer_mlp, infer_mlp_config, load_cnn, load_mlp, mlp_tensors, LayerNames};
pub use tensors::{SourceDtype, Tensor, TensorLimits, Tensors};
