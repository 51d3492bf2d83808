//! Reading and writing modules under PyTorch's state-dict names: each reader takes
//! the [`Scope`] its module's tensors sit in, each writer the [`ScopeMut`] to put
//! them in, so the module's path in a checkpoint (`encoder.layer.0.attention.`) is
//! the caller's and the names below it are these functions'.
//!
//! [`MultiHeadAttention`] is read from either naming PyTorch uses:
//!
//! | layout | names (in the scope) |
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
//! use attend_core::io::safetensors::{self, SafeTensors, StateDict};
//! use ndarray::Array2;
//!
//! let lin = |n| Linear::new(Array2::from_elem((4, 4), n), None).unwrap();
//! let m = MultiHeadAttention::new(lin(1.0), lin(2.0), lin(3.0), Some(lin(4.0)), 2, 2)?;
//! let mut dict = StateDict::default();
//! state_dict::push_attention(&mut dict.scope("attn."), &m, ProjectionNames::Packed)?;
//! let file = SafeTensors::from_bytes(safetensors::serialize(&dict.views(), None)?, "mem")?;
//! assert_eq!(state_dict::load_attention(&file.scope("attn."), 2, 2)?, m);
//! # Ok::<(), attend_core::Error>(())
//! ```

use ndarray::{concatenate, s, Array1, Axis};

use super::{LayerNorm, Linear, MultiHeadAttention};
use crate::io::safetensors::{Scope, ScopeMut};
use crate::{Error, Result};

/// Which of PyTorch's names to write the q/k/v projections under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProjectionNames {
    /// `in_proj_weight`/`in_proj_bias`, as `nn.MultiheadAttention` saves them.
    Packed,
    /// `q_proj.weight`, `k_proj.weight`, `v_proj.weight` (and `.bias`).
    Separate,
}

/// Reads `weight` and, if present, `bias` in `scope` as a [`Linear`].
pub fn load_linear(scope: &Scope<'_>) -> Result<Linear> {
    let weight = scope.tensor2("weight")?;
    let bias = if scope.contains("bias") {
        Some(scope.tensor1("bias")?)
    } else {
        None
    };
    Linear::new(weight, bias)
        .map_err(|e| Error::shape(format!("{}: {}*: {e}", scope.origin(), scope.prefix())))
}

/// Reads the [`LayerNorm`] in `scope`: `weight` and `bias`, or `gamma` and `beta`
/// as old checkpoints call them, each checked to have `width` entries as it is
/// read (the width is the model's, known before its weights are, and a wrong
/// tensor is then named by its shape against it).
pub fn load_layer_norm(scope: &Scope<'_>, width: usize, eps: f32) -> Result<LayerNorm> {
    let vector = |name: &str, old: &str| -> Result<Array1<f32>> {
        let name = if scope.contains(name) { name } else { old };
        Ok(scope
            .tensor_shaped(name, &[width])?
            .into_dimensionality()
            .expect("shape checked"))
    };
    let weight = vector("weight", "gamma")?;
    let bias = vector("bias", "beta")?;
    // LayerNorm's own checks know the tensors but not the file.
    LayerNorm::new(weight, bias, eps).map_err(|e| e.context(scope.origin()))
}

/// Reads a [`MultiHeadAttention`] in `scope` in any of the layouts in the
/// [module docs](self), with `heads` query heads and `kv_heads` key/value heads.
pub fn load_attention(
    scope: &Scope<'_>,
    heads: usize,
    kv_heads: usize,
) -> Result<MultiHeadAttention> {
    let (q, k, v) = if scope.contains("in_proj_weight") {
        let w = scope.tensor2("in_proj_weight")?;
        if w.nrows() % 3 != 0 {
            return Err(Error::shape(format!(
                "{}: {} has shape {:?}; its rows must split into q, k, v",
                scope.origin(),
                scope.name("in_proj_weight"),
                w.shape()
            )));
        }
        let e = w.nrows() / 3;
        let b = packed_bias(scope, e)?;
        let part = |i: usize| {
            Linear::new(
                w.slice(s![i * e..(i + 1) * e, ..]).to_owned(),
                b.as_ref()
                    .map(|b| b.slice(s![i * e..(i + 1) * e]).to_owned()),
            )
        };
        (part(0)?, part(1)?, part(2)?)
    } else if scope.contains("q_proj_weight") {
        let ws = ["q", "k", "v"].map(|p| scope.tensor2(&format!("{p}_proj_weight")));
        let [wq, wk, wv] = ws;
        let (wq, wk, wv) = (wq?, wk?, wv?);
        let total = wq.nrows() + wk.nrows() + wv.nrows();
        let b = packed_bias(scope, total / 3)?;
        let (eq, ek) = (wq.nrows(), wk.nrows());
        let cut = |lo: usize, hi: usize| b.as_ref().map(|b| b.slice(s![lo..hi]).to_owned());
        (
            Linear::new(wq, cut(0, eq))?,
            Linear::new(wk, cut(eq, eq + ek))?,
            Linear::new(wv, cut(eq + ek, total))?,
        )
    } else if scope.contains("q_proj.weight") {
        (
            load_linear(&scope.at("q_proj."))?,
            load_linear(&scope.at("k_proj."))?,
            load_linear(&scope.at("v_proj."))?,
        )
    } else {
        return Err(Error::format(format!(
            "{}: no attention weights under prefix {:?} (looked for {}, {} and {})",
            scope.origin(),
            scope.prefix(),
            scope.name("in_proj_weight"),
            scope.name("q_proj_weight"),
            scope.name("q_proj.weight"),
        )));
    };
    let out = if scope.contains("out_proj.weight") {
        Some(load_linear(&scope.at("out_proj."))?)
    } else {
        None
    };
    MultiHeadAttention::new(q, k, v, out, heads, kv_heads).map_err(|e| {
        Error::shape(format!(
            "{}: attention under {:?}: {e}",
            scope.origin(),
            scope.prefix()
        ))
    })
}

/// The packed `in_proj_bias` of q, k and v, each `e` long, if there is one.
fn packed_bias(scope: &Scope<'_>, e: usize) -> Result<Option<Array1<f32>>> {
    if !scope.contains("in_proj_bias") {
        return Ok(None);
    }
    let b = scope.tensor1("in_proj_bias")?;
    if b.len() != 3 * e {
        return Err(Error::shape(format!(
            "{}: {} has length {}, expected {}",
            scope.origin(),
            scope.name("in_proj_bias"),
            b.len(),
            3 * e
        )));
    }
    Ok(Some(b))
}

/// Puts the state dict of `module` in `out`.
///
/// [`ProjectionNames::Packed`] needs q, k and v of one shape, all with or all without
/// a bias (as `nn.MultiheadAttention` has them); otherwise nothing is put.
pub fn push_attention(
    out: &mut ScopeMut<'_>,
    module: &MultiHeadAttention,
    names: ProjectionNames,
) -> Result<()> {
    let projections = [&module.q_proj, &module.k_proj, &module.v_proj];
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
            out.push("in_proj_weight", w.into_dyn());
            if with_bias == 3 {
                let bs: Vec<_> = projections
                    .iter()
                    .map(|p| p.bias.as_ref().expect("counted").view())
                    .collect();
                let b = concatenate(Axis(0), &bs).expect("one axis");
                out.push("in_proj_bias", b.into_dyn());
            }
        }
        ProjectionNames::Separate => {
            for (p, proj) in ["q_proj.", "k_proj.", "v_proj."].iter().zip(projections) {
                push_linear(&mut out.at(p), proj);
            }
        }
    }
    if let Some(o) = &module.out_proj {
        push_linear(&mut out.at("out_proj."), o);
    }
    Ok(())
}

/// Puts `linear`'s `weight` and, if it has one, `bias` in `out`.
pub fn push_linear(out: &mut ScopeMut<'_>, linear: &Linear) {
    out.push("weight", linear.weight.clone().into_dyn());
    if let Some(b) = &linear.bias {
        out.push("bias", b.clone().into_dyn());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::safetensors::{self, SafeTensors, StateDict};
    use ndarray::Array2;

    fn linear(out: usize, inp: usize, seed: usize, bias: bool) -> Linear {
        let w = Array2::from_shape_fn((out, inp), |(i, j)| {
            ((i * 7 + j * 3 + seed) % 11) as f32 - 5.0
        });
        let b = bias.then(|| Array1::from_shape_fn(out, |i| (i + seed) as f32 / 4.0));
        Linear::new(w, b).unwrap()
    }

    fn round_trip(m: &MultiHeadAttention, names: ProjectionNames) -> MultiHeadAttention {
        let mut dict = StateDict::default();
        push_attention(&mut dict.scope("layer.attn."), m, names).unwrap();
        let bytes = safetensors::serialize(&dict.views(), None).unwrap();
        let file = SafeTensors::from_bytes(bytes, "round trip").unwrap();
        load_attention(&file.scope("layer.").at("attn."), m.heads, m.kv_heads).unwrap()
    }

    /// The names `m` is written under at the root.
    fn names_of(m: &MultiHeadAttention, names: ProjectionNames) -> Result<Vec<String>> {
        let mut dict = StateDict::default();
        push_attention(&mut dict.scope(""), m, names)?;
        Ok(dict.views().iter().map(|(n, _)| n.to_string()).collect())
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
        assert_eq!(
            names_of(&m, ProjectionNames::Packed).unwrap(),
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
        let err = names_of(&m, ProjectionNames::Packed).unwrap_err();
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
        let err = load_attention(&file.scope(""), 2, 2)
            .unwrap_err()
            .to_string();
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
        let err = load_attention(&file.scope("enc."), 1, 1)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "f: no attention weights under prefix \"enc.\" (looked for enc.in_proj_weight, enc.q_proj_weight and enc.q_proj.weight)"
        );
    }

    #[test]
    fn layer_norms_are_read_under_either_name_and_checked_against_the_width() {
        let v = |x: f32| Array1::from_elem(3, x).into_dyn();
        let tensors = [
            ("new.weight", v(2.0)),
            ("new.bias", v(1.0)),
            ("old.gamma", v(3.0)),
            ("old.beta", v(0.5)),
        ];
        let views: Vec<_> = tensors.iter().map(|(n, t)| (*n, t.view())).collect();
        let file =
            SafeTensors::from_bytes(safetensors::serialize(&views, None).unwrap(), "ln").unwrap();
        let want =
            |w: f32, b: f32| LayerNorm::new(Array1::from_elem(3, w), Array1::from_elem(3, b), 0.5);
        assert_eq!(
            load_layer_norm(&file.scope("new."), 3, 0.5).unwrap(),
            want(2.0, 1.0).unwrap()
        );
        assert_eq!(
            load_layer_norm(&file.scope("old."), 3, 0.5).unwrap(),
            want(3.0, 0.5).unwrap()
        );
        let err = load_layer_norm(&file.scope("old."), 4, 0.5)
            .unwrap_err()
            .to_string();
        assert_eq!(err, "ln: tensor \"old.gamma\" has shape [3], expected [4]");
        let err = load_layer_norm(&file.scope("new."), 3, -1.0)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("ln: LayerNorm eps"), "{err}");
    }
}
