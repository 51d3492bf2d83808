//! Saving and loading a [`Reverser`] as safetensors.
//!
//! The format is eight bytes of little-endian header length, a JSON header naming
//! every tensor's dtype, shape and byte range, then the raw little-endian data; it is
//! small enough to write here with `serde_json` rather than add a dependency (the
//! BERT loader's `io::safetensors` reads these files too). Tensors, all `F32`:
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

use ndarray::{Array1, Array2, ArrayD, IxDyn};
use serde_json::{json, Map, Value};

use super::Reverser;
use crate::nn::{Embedding, Linear, MultiHeadAttention};
use crate::{Error, Result};

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
    let path = path.as_ref();
    let mut header = Map::new();
    header.insert(
        "__metadata__".into(),
        json!({"format": FORMAT, "heads": model.attention.heads.to_string()}),
    );
    let mut data = Vec::new();
    for (name, t) in tensors(model) {
        let start = data.len();
        for x in t.iter() {
            data.extend_from_slice(&x.to_le_bytes());
        }
        header.insert(
            name,
            json!({"dtype": "F32", "shape": t.shape(), "data_offsets": [start, data.len()]}),
        );
    }
    let mut text = Value::Object(header).to_string().into_bytes();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&text);
    bytes.extend_from_slice(&data);
    std::fs::write(path, bytes).map_err(|e| Error::io(path, e))
}

/// Reads a model written by [`save`]: the attention module, the embeddings and the
/// head, checked to fit together.
pub fn load(path: impl AsRef<Path>) -> Result<Reverser> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let bad = |msg: &str| Error::format(format!("{}: {msg}", path.display()));
    if bytes.len() < 8 {
        return Err(bad("too short for a safetensors file"));
    }
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header: Value = bytes
        .get(8..8 + n)
        .and_then(|h| serde_json::from_slice(h).ok())
        .ok_or_else(|| bad("unreadable safetensors header"))?;
    let header = header
        .as_object()
        .ok_or_else(|| bad("header is not an object"))?;
    let meta = header.get("__metadata__");
    if meta.and_then(|m| m["format"].as_str()) != Some(FORMAT) {
        return Err(bad(&format!(
            "not an {FORMAT} file (metadata format differs)"
        )));
    }
    let heads: usize = meta
        .and_then(|m| m["heads"].as_str())
        .and_then(|h| h.parse().ok())
        .ok_or_else(|| bad("metadata lacks heads"))?;
    let body = &bytes[8 + n..];
    let mut found: BTreeMap<String, ArrayD<f32>> = BTreeMap::new();
    for (name, info) in header.iter().filter(|(k, _)| *k != "__metadata__") {
        if info["dtype"] != "F32" {
            return Err(bad(&format!(
                "tensor {name} is {}, expected F32",
                info["dtype"]
            )));
        }
        let shape: Vec<usize> = info["shape"]
            .as_array()
            .ok_or_else(|| bad("shape"))?
            .iter()
            .filter_map(|d| d.as_u64().map(|d| d as usize))
            .collect();
        let off = &info["data_offsets"];
        let (s, e) = (
            off[0].as_u64().unwrap_or(u64::MAX) as usize,
            off[1].as_u64().unwrap_or(0) as usize,
        );
        let raw = body
            .get(s..e)
            .filter(|r| r.len() == 4 * shape.iter().product::<usize>())
            .ok_or_else(|| bad(&format!("tensor {name}: data offsets do not fit its shape")))?;
        let v: Vec<f32> = raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        found.insert(
            name.clone(),
            ArrayD::from_shape_vec(IxDyn(&shape), v).expect("checked size"),
        );
    }
    let mut take2 = |name: &str| -> Result<Array2<f32>> {
        found
            .remove(name)
            .ok_or_else(|| bad(&format!("missing tensor {name}")))?
            .into_dimensionality()
            .map_err(|_| bad(&format!("{name} must be 2-D")))
    };
    let tokens = take2("tokens.weight")?;
    let positions = take2("positions.weight")?;
    let mut ws = Vec::new();
    for name in ["q_proj", "k_proj", "v_proj", "out_proj"] {
        ws.push(take2(&format!("attention.{name}.weight"))?);
    }
    let head_w = take2("head.weight")?;
    let mut take1 = |name: &str| -> Result<Array1<f32>> {
        found
            .remove(name)
            .ok_or_else(|| bad(&format!("missing tensor {name}")))?
            .into_dimensionality()
            .map_err(|_| bad(&format!("{name} must be 1-D")))
    };
    let mut bs = Vec::new();
    for name in ["q_proj", "k_proj", "v_proj", "out_proj"] {
        bs.push(take1(&format!("attention.{name}.bias"))?);
    }
    let head_b = take1("head.bias")?;
    let mut lin = ws.into_iter().zip(bs).map(|(w, b)| Linear::new(w, Some(b)));
    let (q, k, v, o) = (
        lin.next().expect("4")?,
        lin.next().expect("4")?,
        lin.next().expect("4")?,
        lin.next().expect("4")?,
    );
    let attention = MultiHeadAttention::new(q, k, v, Some(o), heads, heads)?;
    let head = Linear::new(head_w, Some(head_b))?;
    for (what, w) in [("tokens.weight", &tokens), ("positions.weight", &positions)] {
        if w.ncols() != attention.d_in() || head.in_features() != attention.d_in() {
            return Err(bad(&format!(
                "{what} {:?} does not fit the attention width {}",
                w.shape(),
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
