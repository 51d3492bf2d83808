//! Saving and loading a [`Reverser`] as safetensors.
//!
//! Reading and writing go through [`attend_core::io::safetensors`]. Tensors, all `F32`:
//!
//! | name | shape |
//! |---|---|
//! | `tokens.weight` | `[10, d]` |
//! | `positions.weight` | `[T, d]` |
//! | `attention.{q,k,v,out}_proj.weight` | `[d, d]` (`[out, in]`) |
//! | `attention.{q,k,v,out}_proj.bias` | `[d]` |
//! | `head.weight`, `head.bias` | `[10, d]`, `[10]` |
//!
//! and `__metadata__` holds `format = "attend-reverser/1"` and `heads`.

use std::collections::BTreeMap;
use std::path::Path;

use ndarray::ArrayD;

use super::Reverser;
use attend_core::io::safetensors::{self, SafeTensors};
use attend_core::nn::{Embedding, Linear, MultiHeadAttention};
use attend_core::{Error, Result};

/// The tensor names of a saved [`Reverser`], in file order.
pub const TENSOR_NAMES: [&str; 12] = [
    "tokens.weight",
    "positions.weight",
    "attention.q_proj.weight",
    "attention.q_proj.bias",
    "attention.k_proj.weight",
    "attention.k_proj.bias",
    "attention.v_proj.weight",
    "attention.v_proj.bias",
    "attention.out_proj.weight",
    "attention.out_proj.bias",
    "head.weight",
    "head.bias",
];

const FORMAT: &str = "attend-reverser/1";

fn tensors(m: &Reverser) -> Vec<(String, ArrayD<f32>)> {
    let mut out = vec![
        (
            "tokens.weight".to_owned(),
            m.tokens.weight.clone().into_dyn(),
        ),
        (
            "positions.weight".to_owned(),
            m.positions.weight.clone().into_dyn(),
        ),
    ];
    let a = &m.attention;
    let projs = [
        ("q_proj", Some(&a.q_proj)),
        ("k_proj", Some(&a.k_proj)),
        ("v_proj", Some(&a.v_proj)),
        ("out_proj", a.out_proj.as_ref()),
    ];
    for (name, l) in projs {
        if let Some(l) = l {
            out.push((
                format!("attention.{name}.weight"),
                l.weight.clone().into_dyn(),
            ));
            if let Some(b) = &l.bias {
                out.push((format!("attention.{name}.bias"), b.clone().into_dyn()));
            }
        }
    }
    out.push(("head.weight".to_owned(), m.head.weight.clone().into_dyn()));
    if let Some(b) = &m.head.bias {
        out.push(("head.bias".to_owned(), b.clone().into_dyn()));
    }
    out
}

/// Writes `model` to `path` as safetensors.
pub fn save(model: &Reverser, path: impl AsRef<Path>) -> Result<()> {
    let tensors = tensors(model);
    let views: Vec<(&str, _)> = tensors
        .iter()
        .map(|(n, t)| (n.as_str(), t.view()))
        .collect();
    let metadata = BTreeMap::from([
        ("format".to_owned(), FORMAT.to_owned()),
        ("heads".to_owned(), model.attention.heads.to_string()),
    ]);
    safetensors::write(path, &views, Some(&metadata))
}

/// Reads a model written by [`save`]: the attention module, the embeddings and the
/// head, checked to fit together.
pub fn load(path: impl AsRef<Path>) -> Result<Reverser> {
    let path = path.as_ref();
    let file = SafeTensors::open(path)?;
    let bad = |msg: &str| Error::format(format!("{}: {msg}", path.display()));
    if file.metadata().get("format").map(String::as_str) != Some(FORMAT) {
        return Err(bad(&format!(
            "not an {FORMAT} file (metadata format differs)"
        )));
    }
    let heads: usize = file
        .metadata()
        .get("heads")
        .and_then(|h| h.parse().ok())
        .ok_or_else(|| bad("metadata lacks heads"))?;
    let linear = |name: &str| -> Result<Linear> {
        Linear::new(
            file.tensor2(&format!("{name}.weight"))?,
            Some(file.tensor1(&format!("{name}.bias"))?),
        )
    };
    let attention = MultiHeadAttention::new(
        linear("attention.q_proj")?,
        linear("attention.k_proj")?,
        linear("attention.v_proj")?,
        Some(linear("attention.out_proj")?),
        heads,
        heads,
    )?;
    let head = linear("head")?;
    let tokens = file.tensor2("tokens.weight")?;
    let positions = file.tensor2("positions.weight")?;
    for (what, width) in [
        ("tokens.weight", tokens.ncols()),
        ("positions.weight", positions.ncols()),
        ("head.weight", head.in_features()),
    ] {
        if width != attention.d_in() {
            return Err(bad(&format!(
                "{what} has width {width}, which does not fit the attention width {}",
                attention.d_in()
            )));
        }
    }
    Ok(Reverser {
        tokens: Embedding {
            weight: tokens,
            padding_idx: None,
        },
        positions: Embedding {
            weight: positions,
            padding_idx: None,
        },
        attention,
        head,
    })
}
