//! Matching named tensors to the weight layers of an [`Mlp`] or a [`Cnn`], and back.

use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::ops::Range;

use fspace_nn::{Activation, Cnn, CnnConfig, LayerInfo, LayerKind, Mlp, MlpConfig};
use nalgebra::DVector;

use crate::error::{InteropError, Result};
use crate::tensors::{SourceDtype, Tensor, Tensors};

/// How the file's tensors are assigned to the network's weight layers. Each layer takes the
/// tensors `<prefix>.weight` and `<prefix>.bias`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum LayerNames {
    /// Layers in natural order of their prefixes (digit runs compared as numbers: `fc2` before
    /// `fc10`, `0` before `2` before `4` as in an `nn.Sequential`); convolutions (4-d weights)
    /// and dense layers (2-d weights) are ordered separately, convolutions first.
    #[default]
    Natural,
    /// The prefixes in the network's layer order (convolutions first, then dense layers).
    Explicit(Vec<String>),
}

/// Compares two names with digit runs as numbers (`layer2` < `layer10`).
fn natural_cmp(a: &str, b: &str) -> Ordering {
    fn chunks(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let mut start = 0;
        let bytes = s.as_bytes();
        for i in 1..=bytes.len() {
            if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[start].is_ascii_digit() {
                out.push((bytes[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        out
    }
    let (ca, cb) = (chunks(a), chunks(b));
    for ((da, sa), (db, sb)) in ca.iter().zip(&cb) {
        let ord = if *da && *db {
            let (ta, tb) = (sa.trim_start_matches('0'), sb.trim_start_matches('0'));
            ta.len().cmp(&tb.len()).then_with(|| ta.cmp(tb))
        } else {
            sa.cmp(sb)
        };
        if ord != Ordering::Equal {
            return ord;
        }
    }
    ca.len().cmp(&cb.len()).then_with(|| a.cmp(b))
}

/// The layer prefixes of `tensors` whose weight has `rank` dimensions, in natural order.
/// Every name must end in `.weight` or `.bias`.
fn prefixes_of_rank(tensors: &Tensors, rank: usize) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for (name, tensor) in tensors.iter() {
        let prefix = match (name.strip_suffix(".weight"), name.strip_suffix(".bias")) {
            (Some(p), _) => {
                if tensor.shape.len() != rank {
                    continue;
                }
                p
            }
            (None, Some(_)) => continue,
            (None, None) => {
                return Err(InteropError::UnknownName { file: tensors.source().into(), name: name.into() })
            }
        };
        out.push(prefix.to_string());
    }
    out.sort_by(|a, b| natural_cmp(a, b));
    Ok(out)
}

/// What one weight layer needs: the weight's shape and where weight and bias go.
struct Slot {
    weight_shape: Vec<usize>,
    weight: Range<usize>,
    bias: Range<usize>,
    conv: bool,
}

fn available(tensors: &Tensors) -> String {
    tensors.names().collect::<Vec<_>>().join(", ")
}

/// Tensor `name` of shape `shape` from `tensors`, checked, and marked as `used` (`all` lists
/// the file's tensors for the error).
fn take<'a>(
    tensors: &'a Tensors,
    used: &mut BTreeSet<String>,
    name: &str,
    shape: &[usize],
    all: &str,
) -> Result<&'a Tensor> {
    let file = tensors.source().to_string();
    let Some(t) = tensors.get(name) else {
        return Err(InteropError::MissingTensor { file, name: name.into(), available: all.to_string() });
    };
    if t.shape != shape {
        return Err(InteropError::ShapeMismatch {
            file,
            name: name.into(),
            expected: shape.to_vec(),
            found: t.shape.clone(),
        });
    }
    if t.data.iter().any(|v| !v.is_finite()) {
        return Err(InteropError::NonFinite { file, name: name.into() });
    }
    used.insert(name.to_string());
    Ok(t)
}

/// Assigns tensors to `slots` and returns the flat parameter vector; every tensor must be used.
fn fill(tensors: &Tensors, slots: &[Slot], names: &LayerNames, n_params: usize) -> Result<DVector<f64>> {
    let file = tensors.source().to_string();
    let prefixes = match names {
        LayerNames::Explicit(list) => {
            if list.len() != slots.len() {
                return Err(InteropError::LayerCount {
                    file,
                    kind: "named",
                    expected: slots.len(),
                    found: list.len(),
                });
            }
            list.clone()
        }
        LayerNames::Natural => {
            let (convs, denses) = (prefixes_of_rank(tensors, 4)?, prefixes_of_rank(tensors, 2)?);
            let want_convs = slots.iter().filter(|s| s.conv).count();
            let want_dense = slots.len() - want_convs;
            for (kind, found, expected) in
                [("convolutional", convs.len(), want_convs), ("dense", denses.len(), want_dense)]
            {
                if found != expected {
                    return Err(InteropError::LayerCount { file, kind, expected, found });
                }
            }
            convs.into_iter().chain(denses).collect()
        }
    };
    let all = available(tensors);
    let mut used = BTreeSet::new();
    let mut params = vec![0.0; n_params];
    for (slot, prefix) in slots.iter().zip(&prefixes) {
        let w = take(tensors, &mut used, &format!("{prefix}.weight"), &slot.weight_shape, &all)?;
        let b = take(tensors, &mut used, &format!("{prefix}.bias"), &slot.weight_shape[..1], &all)?;
        params[slot.weight.clone()].copy_from_slice(&w.data);
        params[slot.bias.clone()].copy_from_slice(&b.data);
    }
    let unused: Vec<&str> = tensors.names().filter(|n| !used.contains(*n)).collect();
    if !unused.is_empty() {
        return Err(InteropError::UnusedTensors { file, names: unused.join(", ") });
    }
    Ok(DVector::from_vec(params))
}

fn dense_slot(info: &LayerInfo) -> Slot {
    Slot {
        weight_shape: vec![info.fan_out, info.fan_in],
        weight: info.weight.clone(),
        bias: info.bias.clone(),
        conv: false,
    }
}

/// An [`Mlp`] of architecture `config` with the weights in `tensors` (PyTorch `Linear` layout:
/// weight `out × in`, bias `out`). `config.seed` is irrelevant: every parameter is loaded.
pub fn load_mlp(tensors: &Tensors, config: &MlpConfig, names: &LayerNames) -> Result<Mlp> {
    let mut net = Mlp::new(config.clone())?;
    let slots: Vec<Slot> = net.layer_infos().iter().map(dense_slot).collect();
    let params = fill(tensors, &slots, names, net.n_params())?;
    net.set_params(&params)?;
    Ok(net)
}

/// The [`MlpConfig`] that `tensors` describe: the widths read from the 2-d weights taken in
/// the order of `names`, with the given hidden `activation` (weights do not record it).
pub fn infer_mlp_config(tensors: &Tensors, activation: Activation, names: &LayerNames) -> Result<MlpConfig> {
    let file = tensors.source().to_string();
    let prefixes = match names {
        LayerNames::Explicit(list) => list.clone(),
        LayerNames::Natural => prefixes_of_rank(tensors, 2)?,
    };
    if prefixes.is_empty() {
        return Err(InteropError::Ambiguous { file, reason: "no 2-d `*.weight` tensor".into() });
    }
    let mut widths = Vec::new();
    for prefix in &prefixes {
        let name = format!("{prefix}.weight");
        let Some(w) = tensors.get(&name) else {
            return Err(InteropError::MissingTensor { file, name, available: available(tensors) });
        };
        if w.shape.len() != 2 {
            return Err(InteropError::Ambiguous {
                file,
                reason: format!("`{name}` has shape {:?}; a dense layer's weight is 2-d", w.shape),
            });
        }
        let (out, inp) = (w.shape[0], w.shape[1]);
        match widths.last() {
            None => widths.push(inp),
            Some(&prev) if prev != inp => {
                return Err(InteropError::Ambiguous {
                    file,
                    reason: format!("`{name}` takes {inp} inputs but the layer before gives {prev}"),
                })
            }
            Some(_) => {}
        }
        widths.push(out);
    }
    let n = widths.len();
    Ok(MlpConfig {
        input_dim: widths[0],
        hidden: widths[1..n - 1].to_vec(),
        output_dim: widths[n - 1],
        activation,
        seed: 0,
    })
}

/// An [`Mlp`] whose widths are read from `tensors` ([`infer_mlp_config`]) and whose weights
/// are loaded from them ([`load_mlp`]).
pub fn infer_mlp(tensors: &Tensors, activation: Activation, names: &LayerNames) -> Result<Mlp> {
    load_mlp(tensors, &infer_mlp_config(tensors, activation, names)?, names)
}

/// A [`Cnn`] of architecture `config` with the weights in `tensors` (PyTorch layouts:
/// `Conv2d.weight` `out × in × k × k`, `Linear.weight` `out × in`, biases; inputs flattened
/// channel-major, as `torch.flatten` does after the last convolution). Padding and pooling are
/// not recorded in weights, so the architecture is always given.
pub fn load_cnn(tensors: &Tensors, config: &CnnConfig, names: &LayerNames) -> Result<Cnn> {
    let mut net = Cnn::new(config.clone())?;
    let infos = net.layer_infos();
    let slots = cnn_slots(config, &infos);
    let params = fill(tensors, &slots, names, net.n_params())?;
    net.set_params(&params)?;
    Ok(net)
}

fn cnn_slots(config: &CnnConfig, infos: &[LayerInfo]) -> Vec<Slot> {
    let mut convs = config.convs.iter();
    infos
        .iter()
        .map(|info| match info.kind {
            LayerKind::Conv { .. } => {
                let k = convs.next().expect("one ConvBlock per conv layer").kernel;
                Slot {
                    weight_shape: vec![info.fan_out, info.fan_in / (k * k), k, k],
                    weight: info.weight.clone(),
                    bias: info.bias.clone(),
                    conv: true,
                }
            }
            LayerKind::Dense => dense_slot(info),
        })
        .collect()
}

fn export(params: &DVector<f64>, infos: &[LayerInfo], slots: &[Slot], source: &str) -> Tensors {
    let mut out = Tensors::new(source);
    for (info, slot) in infos.iter().zip(slots) {
        let weight = params.as_slice()[slot.weight.clone()].to_vec();
        let bias = params.as_slice()[slot.bias.clone()].to_vec();
        let dtype = SourceDtype::F64;
        out.insert(
            format!("{}.weight", info.name),
            Tensor { shape: slot.weight_shape.clone(), data: weight, dtype },
        );
        out.insert(format!("{}.bias", info.name), Tensor { shape: vec![bias.len()], data: bias, dtype });
    }
    out
}

/// The MLP's weights as PyTorch-layout tensors named `layer{l}.weight` / `layer{l}.bias`
/// (reloaded by [`load_mlp`] with [`LayerNames::Natural`]).
pub fn mlp_tensors(net: &Mlp) -> Tensors {
    let infos = net.layer_infos();
    let slots: Vec<Slot> = infos.iter().map(dense_slot).collect();
    export(&net.params(), &infos, &slots, "fspace Mlp")
}

/// The CNN's weights as PyTorch-layout tensors named `conv{i}.*` and `dense{j}.*`.
pub fn cnn_tensors(net: &Cnn) -> Tensors {
    let infos = net.layer_infos();
    let slots = cnn_slots(net.config(), &infos);
    export(&net.params(), &infos, &slots, "fspace Cnn")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natural_order_compares_digit_runs_as_numbers() {
        let mut names = vec!["fc10", "fc2", "fc1", "net.4", "net.0", "net.2", "a", "fc02"];
        names.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(names, ["a", "fc1", "fc02", "fc2", "fc10", "net.0", "net.2", "net.4"]);
    }
}
