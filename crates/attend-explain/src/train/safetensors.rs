//! Saving and loading a [`Reverser`] as safetensors.
//!
//! Reading goes through a [`Scope`] of the file and writing through a [`StateDict`],
//! the attention module under `attention.` with [`state_dict`]'s own names for
//! it. Tensors, all `F32`:
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

use super::Reverser;
use attend_core::io::safetensors::{self, SafeTensors, Scope, StateDict};
use attend_core::nn::state_dict::{self, ProjectionNames};
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

/// The tensors of `m` under [`TENSOR_NAMES`], in that order.
fn tensors(m: &Reverser) -> Result<StateDict> {
    let mut dict = StateDict::default();
    let mut root = dict.scope("");
    root.push("tokens.weight", m.tokens.weight.clone().into_dyn());
    root.push("positions.weight", m.positions.weight.clone().into_dyn());
    let names = ProjectionNames::Separate;
    state_dict::push_attention(&mut root.at("attention."), &m.attention, names)?;
    state_dict::push_linear(&mut root.at("head."), &m.head);
    Ok(dict)
}

/// Writes `model` to `path` as safetensors.
pub fn save(model: &Reverser, path: impl AsRef<Path>) -> Result<()> {
    let metadata = BTreeMap::from([
        ("format".to_owned(), FORMAT.to_owned()),
        ("heads".to_owned(), model.attention.heads.to_string()),
    ]);
    safetensors::write(path, &tensors(model)?.views(), Some(&metadata))
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
    // Every linear map here has a bias: a missing one is a broken file, not a
    // model without biases, so this is stricter than `state_dict::load_linear`.
    let linear = |scope: Scope<'_>| -> Result<Linear> {
        Linear::new(scope.tensor2("weight")?, Some(scope.tensor1("bias")?))
    };
    let root = file.scope("");
    let attention = root.at("attention.");
    let attention = MultiHeadAttention::new(
        linear(attention.at("q_proj."))?,
        linear(attention.at("k_proj."))?,
        linear(attention.at("v_proj."))?,
        Some(linear(attention.at("out_proj."))?),
        heads,
        heads,
    )?;
    let head = linear(root.at("head."))?;
    let tokens = root.tensor2("tokens.weight")?;
    let positions = root.tensor2("positions.weight")?;
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
