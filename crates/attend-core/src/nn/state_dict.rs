//! Loading and saving modules under PyTorch's state-dict names, in safetensors files.
//!
//! [`MultiHeadAttention`] is read from either naming PyTorch uses:
//!
//! | layout | names (after `prefix`) |
//! |---|---|
//! | [`ProjectionNames::Packed`] (`nn.MultiheadAttention`) | `in_proj_weight [3E, E]` (rows `q; k; v`), `in_proj_bias [3E]`, `out_proj.weight`, `out_proj.bias` |
//! | `nn.MultiheadAttention` with `kdim`/`vdim` ≠ `E` (read only) | `q_proj_weight`, `k_proj_weight`, `v_proj_weight`, `in_proj_bias`, `out_proj.*` |
//! | [`ProjectionNames::Separate`] (three `nn.Linear`s) | `q_proj.weight`, `q_proj.bias`, `k_proj.*`, `v_proj.*`, `out_proj.*` |
//!
//! Biases and `out_proj` are optional. Head counts are not part of a state dict and
//! are passed in.
//!
//! ```
//! use attend_core::nn::{state_dict, Linear, MultiHeadAttention};
//! use attend_core::nn::state_dict::ProjectionNames;
//! use attend_core::io::safetensors::{self, SafeTensors};
//! use ndarray::Array2;
//!
//! let lin = |n| Linear::new(Array2::from_elem((4, 4), n), None).unwrap();
//! let m = MultiHeadAttention::new(lin(1.0), lin(2.0), lin(3.0), Some(lin(4.0)), 2, 2)?;
//! let tensors = state_dict::attention_tensors(&m, "attn.", ProjectionNames::Packed)?;
//! let views: Vec<_> = tensors.iter().map(|(n, t)| (n.as_str(), t.view())).collect();
//! let file = SafeTensors::from_bytes(safetensors::serialize(&views, None)?, "mem")?;
//! assert_eq!(state_dict::load_attention(&file, "attn.", 2, 2)?, m);
//! # Ok::<(), attend_core::Error>(())
//! ```

use std::path::Path;

use ndarray::{concatenate, s, ArrayD, Axis};

use super::{Linear, MultiHeadAttention};
use crate::io::safetensors::{self, SafeTensors};
use crate::{Error, Result};

/// Which of PyTorch's names to write the q/k/v projections under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProjectionNames {
    /// `in_proj_weight`/`in_proj_bias`, as `nn.MultiheadAttention` saves them.
    Packed,
    /// `q_proj.weight`, `k_proj.weight`, `v_proj.weight` (and `.bias`).
    Separate,
}

/// Reads `{prefix}weight` and, if present, `{prefix}bias` as a [`Linear`].
///
/// `prefix` includes its trailing dot: `"encoder.layer.0.intermediate.dense."`.
pub fn load_linear(file: &SafeTensors, prefix: &str) -> Result<Linear> {
    let weight = file.tensor2(&format!("{prefix}weight"))?;
    let bias_name = format!("{prefix}bias");
    let bias = if file.contains(&bias_name) {
        Some(file.tensor1(&bias_name)?)
    } else {
        None
    };
    Linear::new(weight, bias)
        .map_err(|e| Error::shape(format!("{}: {prefix}*: {e}", file.origin())))
}

/// Reads a [`MultiHeadAttention`] stored under `prefix` in any of the layouts in the
/// [module docs](self), with `heads` query heads and `kv_heads` key/value heads.
pub fn load_attention(
    file: &SafeTensors,
    prefix: &str,
    heads: usize,
    kv_heads: usize,
) -> Result<MultiHeadAttention> {
    let name = |s: &str| format!("{prefix}{s}");
    let (q, k, v) = if file.contains(&name("in_proj_weight")) {
        let w = file.tensor2(&name("in_proj_weight"))?;
        if w.nrows() % 3 != 0 {
            return Err(Error::shape(format!(
                "{}: {} has shape {:?}; its rows must split into q, k, v",
                file.origin(),
                name("in_proj_weight"),
                w.shape()
            )));
        }
        let e = w.nrows() / 3;
        let b = packed_bias(file, &name("in_proj_bias"), e)?;
        let part = |i: usize| {
            Linear::new(
                w.slice(s![i * e..(i + 1) * e, ..]).to_owned(),
                b.as_ref()
                    .map(|b| b.slice(s![i * e..(i + 1) * e]).to_owned()),
            )
        };
        (part(0)?, part(1)?, part(2)?)
    } else if file.contains(&name("q_proj_weight")) {
        let ws = ["q", "k", "v"].map(|p| file.tensor2(&name(&format!("{p}_proj_weight"))));
        let [wq, wk, wv] = ws;
        let (wq, wk, wv) = (wq?, wk?, wv?);
        let total = wq.nrows() + wk.nrows() + wv.nrows();
        let b = packed_bias(file, &name("in_proj_bias"), total / 3)?;
        let (eq, ek) = (wq.nrows(), wk.nrows());
        let cut = |lo: usize, hi: usize| b.as_ref().map(|b| b.slice(s![lo..hi]).to_owned());
        (
            Linear::new(wq, cut(0, eq))?,
            Linear::new(wk, cut(eq, eq + ek))?,
            Linear::new(wv, cut(eq + ek, total))?,
        )
    } else if file.contains(&name("q_proj.weight")) {
        (
            load_linear(file, &name("q_proj."))?,
            load_linear(file, &name("k_proj."))?,
            load_linear(file, &name("v_proj."))?,
        )
    } else {
        return Err(Error::format(format!(
            "{}: no attention weights under prefix {prefix:?} (looked for {0}in_proj_weight, {0}q_proj_weight and {0}q_proj.weight)",
            file.origin(),
        )));
    };
    let out = if file.contains(&name("out_proj.weight")) {
        Some(load_linear(file, &name("out_proj."))?)
    } else {
        None
    };
    MultiHeadAttention::new(q, k, v, out, heads, kv_heads).map_err(|e| {
        Error::shape(format!(
            "{}: attention under {prefix:?}: {e}",
            file.origin()
        ))
    })
}

fn packed_bias(file: &SafeTensors, name: &str, e: usize) -> Result<Option<ndarray::Array1<f32>>> {
    if !file.contains(name) {
        return Ok(None);
    }
    let b = file.tensor1(name)?;
    if b.len() != 3 * e {
        return Err(Error::shape(format!(
            "{}: {name} has length {}, expected {}",
            file.origin(),
            b.len(),
            3 * e
        )));
    }
    Ok(Some(b))
}

/// The state dict of `module` under `prefix`, as `(name, tensor)` pairs.
///
/// [`ProjectionNames::Packed`] needs q, k and v of one shape, all with or all without
/// a bias (as `nn.MultiheadAttention` has them).
pub fn attention_tensors(
    module: &MultiHeadAttention,
    prefix: &str,
    names: ProjectionNames,
) -> Result<Vec<(String, ArrayD<f32>)>> {
    let name = |s: &str| format!("{prefix}{s}");
    let projections = [&module.q_proj, &module.k_proj, &module.v_proj];
    let mut out = Vec::new();
    match names {
        ProjectionNames::Packed => {
            let shape = module.q_proj.weight.shape();
            if projections.iter().any(|p| p.weight.shape() != shape) {
                return Err(Error::shape(format!(
                    "in_proj_weight needs q, k, v projections of one shape, got {:?}, {:?}, {:?}",
                    module.q_proj.weight.shape(),
                    module.k_proj.weight.shape(),
                    module.v_proj.weight.shape()
                )));
            }
            let with_bias = projections.iter().filter(|p| p.bias.is_some()).count();
            if with_bias != 0 && with_bias != 3 {
                return Err(Error::value(
                    "in_proj_bias needs a bias on all of q, k, v or on none of them",
                ));
            }
            let ws: Vec<_> = projections.iter().map(|p| p.weight.view()).collect();
            let w = concatenate(Axis(0), &ws).expect("same shapes");
            out.push((name("in_proj_weight"), w.into_dyn()));
            if with_bias == 3 {
                let bs: Vec<_> = projections
                    .iter()
                    .map(|p| p.bias.as_ref().expect("counted").view())
                    .collect();
                let b = concatenate(Axis(0), &bs).expect("one axis");
                out.push((name("in_proj_bias"), b.into_dyn()));
            }
        }
        ProjectionNames::Separate => {
            for (p, proj) in ["q_proj.", "k_proj.", "v_proj."].iter().zip(projections) {
                push_linear(&mut out, &name(p), proj);
            }
        }
    }
    if let Some(o) = &module.out_proj {
        push_linear(&mut out, &name("out_proj."), o);
    }
    Ok(out)
}

fn push_linear(out: &mut Vec<(String, ArrayD<f32>)>, prefix: &str, l: &Linear) {
    out.push((format!("{prefix}weight"), l.weight.clone().into_dyn()));
    if let Some(b) = &l.bias {
        out.push((format!("{prefix}bias"), b.clone().into_dyn()));
    }
}

/// Writes `module` to a safetensors file (metadata `format: pt`) under `prefix`.
pub fn save_attention(
    path: impl AsRef<Path>,
    module: &MultiHeadAttention,
    prefix: &str,
    names: ProjectionNames,
) -> Result<()> {
    let tensors = attention_tensors(module, prefix, names)?;
    let views: Vec<_> = tensors
        .iter()
        .map(|(n, t)| (n.as_str(), t.view()))
        .collect();
    let meta = [("format".to_string(), "pt".to_string())]
        .into_iter()
        .collect();
    safetensors::write(path, &views, Some(&meta))
}

/// Reads a [`MultiHeadAttention`] from the safetensors file at `path`
/// (see [`load_attention`]).
pub fn read_attention(
    path: impl AsRef<Path>,
    prefix: &str,
    heads: usize,
    kv_heads: usize,
) -> Result<MultiHeadAttention> {
    load_attention(&SafeTensors::open(path)?, prefix, heads, kv_heads)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array1, Array2};

    fn linear(out: usize, inp: usize, seed: usize, bias: bool) -> Linear {
        let w = Array2::from_shape_fn((out, inp), |(i, j)| {
            ((i * 7 + j * 3 + seed) % 11) as f32 - 5.0
        });
        let b = bias.then(|| Array1::from_shape_fn(out, |i| (i + seed) as f32 / 4.0));
        Linear::new(w, b).unwrap()
    }

    fn round_trip(m: &MultiHeadAttention, names: ProjectionNames) -> MultiHeadAttention {
        let dir = std::env::temp_dir().join(format!(
            "attend-state-dict-{}-{names:?}-{}.safetensors",
            std::process::id(),
            m.heads
        ));
        save_attention(&dir, m, "layer.attn.", names).unwrap();
        let back = read_attention(&dir, "layer.attn.", m.heads, m.kv_heads).unwrap();
        std::fs::remove_file(&dir).ok();
        back
    }

    #[test]
    fn packed_round_trip() {
        let m = MultiHeadAttention::new(
            linear(8, 8, 1, true),
            linear(8, 8, 2, true),
            linear(8, 8, 3, true),
            Some(linear(8, 8, 4, true)),
            2,
            2,
        )
        .unwrap();
        let names: Vec<String> = attention_tensors(&m, "", ProjectionNames::Packed)
            .unwrap()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(
            names,
            [
                "in_proj_weight",
                "in_proj_bias",
                "out_proj.weight",
                "out_proj.bias"
            ]
        );
        assert_eq!(round_trip(&m, ProjectionNames::Packed), m);
    }

    #[test]
    fn separate_round_trip_with_grouped_heads_and_no_out_proj() {
        let m = MultiHeadAttention::new(
            linear(8, 6, 1, true),
            linear(4, 6, 2, false),
            linear(6, 6, 3, true),
            None,
            4,
            2,
        )
        .unwrap();
        assert_eq!(round_trip(&m, ProjectionNames::Separate), m);
        // Packing needs equal shapes.
        let err = attention_tensors(&m, "", ProjectionNames::Packed).unwrap_err();
        assert!(err.to_string().contains("in_proj_weight"), "{err}");
    }

    #[test]
    fn multihead_attention_with_kdim_names() {
        let (wq, wk, wv) = (
            linear(4, 4, 1, false),
            linear(4, 3, 2, false),
            linear(4, 5, 3, false),
        );
        let bias = Array1::from_shape_fn(12, |i| i as f32);
        let tensors = [
            ("q_proj_weight", wq.weight.clone().into_dyn()),
            ("k_proj_weight", wk.weight.clone().into_dyn()),
            ("v_proj_weight", wv.weight.clone().into_dyn()),
            ("in_proj_bias", bias.clone().into_dyn()),
        ];
        let views: Vec<_> = tensors.iter().map(|(n, t)| (*n, t.view())).collect();
        let file =
            SafeTensors::from_bytes(safetensors::serialize(&views, None).unwrap(), "kdim").unwrap();
        // k and v take other widths than q, which the canonical module refuses.
        let err = load_attention(&file, "", 2, 2).unwrap_err().to_string();
        assert!(err.starts_with("kdim: attention under \"\""), "{err}");
    }

    #[test]
    fn missing_weights_are_reported() {
        let a = Array1::<f32>::zeros(3).into_dyn();
        let file = SafeTensors::from_bytes(
            safetensors::serialize(&[("x", a.view())], None).unwrap(),
            "f",
        )
        .unwrap();
        let err = load_attention(&file, "enc.", 1, 1).unwrap_err().to_string();
        assert!(
            err.contains("no attention weights under prefix \"enc.\""),
            "{err}"
        );
    }
}
