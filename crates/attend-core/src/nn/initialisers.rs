//! Initialisers: each notebook's way of creating attention weights, drawing random
//! numbers in PyTorch's order and writing them into the canonical module.
//!
//! A variant is two independent choices: how one weight block is created
//! ([`WeightInit`]) and how the blocks are laid out and ordered ([`QkvLayout`]). Every
//! layout is a list of creation calls plus a map from the created rows to the
//! canonical `[q; k; v]` rows, so no variant needs code of its own.

use ndarray::{Array1, Array2, Axis};

use super::{Linear, MultiHeadAttention};
use crate::init;
use crate::rng::TorchGenerator;
use crate::{Error, Result};

/// How one block of projection weights is created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightInit {
    /// `nn.Linear(d_in, width)`: Kaiming-uniform weight `[out, in]`, then the bias.
    Linear,
    /// `nn.Parameter(torch.rand(d_in, width))`, used as `x @ W` (notebook 002).
    UniformInOut,
    /// `nn.Parameter(torch.rand(width, d_in))`, used as `W x` (notebook 004).
    UniformOutIn,
    /// Exactly what `nn.MultiheadAttention(E, H, bias=True)` creates.
    TorchMha,
}

/// How the query, key and value projections are packed and in what order they are
/// created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum QkvLayout {
    /// Three projections created in the order q, k, v.
    #[default]
    Separate,
    /// One projection whose output rows are `[q; k; v]` (PyTorch's `in_proj`).
    Fused,
    /// One projection whose output is, per head, `[q_h | k_h | v_h]` (notebook 001).
    FusedInterleaved,
    /// An independent (q, k, v) triple of projections per head, created head by head.
    PerHead,
}

/// What to create: widths are totals over all heads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionSpec {
    /// Input width.
    pub d_in: usize,
    /// Total query/key width.
    pub d_k: usize,
    /// Total value width.
    pub d_v: usize,
    /// Number of heads.
    pub heads: usize,
    /// Whether the q/k/v projections have biases.
    pub bias: bool,
    /// Whether an output `Linear(d_v, d_v, bias=True)` follows, created last.
    pub out_proj: bool,
    /// How each block is drawn.
    pub init: WeightInit,
    /// How the blocks are packed.
    pub layout: QkvLayout,
}

/// Draws the module's weights from `gen` in PyTorch's order.
pub fn initialise(spec: &AttentionSpec, gen: &mut TorchGenerator) -> Result<MultiHeadAttention> {
    check(spec)?;
    if spec.init == WeightInit::TorchMha {
        return torch_mha(spec, gen);
    }
    let (dkh, dvh) = (spec.d_k / spec.heads, spec.d_v / spec.heads);
    let calls: Vec<usize> = match spec.layout {
        QkvLayout::Separate => vec![spec.d_k, spec.d_k, spec.d_v],
        QkvLayout::Fused | QkvLayout::FusedInterleaved => vec![2 * spec.d_k + spec.d_v],
        QkvLayout::PerHead => (0..spec.heads).flat_map(|_| [dkh, dkh, dvh]).collect(),
    };
    let mut weights = Vec::new();
    let mut biases = Vec::new();
    for out in calls {
        let (w, b) = create_block(spec, gen, out);
        weights.push(w);
        biases.extend(b);
    }
    let created = ndarray::concatenate(
        Axis(0),
        &weights.iter().map(|w| w.view()).collect::<Vec<_>>(),
    )
    .expect("blocks share d_in");
    let created_bias = spec.bias.then(|| {
        ndarray::concatenate(
            Axis(0),
            &biases.iter().map(|b| b.view()).collect::<Vec<_>>(),
        )
        .expect("bias blocks are 1-D")
    });
    let [q_rows, k_rows, v_rows] = canonical_rows(spec);
    let project = |rows: &[usize]| {
        Linear::new(
            created.select(Axis(0), rows),
            created_bias.as_ref().map(|b| b.select(Axis(0), rows)),
        )
    };
    let (q, k, v) = (project(&q_rows)?, project(&k_rows)?, project(&v_rows)?);
    let out = if spec.out_proj {
        let (w, b) = init::linear(gen, spec.d_v, spec.d_v, true);
        Some(Linear::new(w, b)?)
    } else {
        None
    };
    MultiHeadAttention::new(q, k, v, out, spec.heads, spec.heads)
}

/// A module from given weights in `[d_in, width]` orientation (`q = x @ W_q`), as
/// notebook 003 writes them.
pub fn from_given(
    w_q: Array2<f32>,
    w_k: Array2<f32>,
    w_v: Array2<f32>,
    heads: usize,
) -> Result<MultiHeadAttention> {
    let linear =
        |w: Array2<f32>| Linear::new(w.reversed_axes().as_standard_layout().to_owned(), None);
    MultiHeadAttention::new(linear(w_q)?, linear(w_k)?, linear(w_v)?, None, heads, heads)
}

fn check(spec: &AttentionSpec) -> Result<()> {
    if spec.heads == 0 {
        return Err(Error::value("--heads must be at least 1"));
    }
    for (flag, width) in [
        ("q/k width (--d-out or --d-k)", spec.d_k),
        ("v width (--d-out or --d-v)", spec.d_v),
    ] {
        if width == 0 {
            return Err(Error::value(format!("{flag} must be at least 1")));
        }
        if !width.is_multiple_of(spec.heads) {
            return Err(Error::value(format!(
                "{flag} {width} is not divisible by --heads {}",
                spec.heads
            )));
        }
    }
    if spec.bias
        && matches!(
            spec.init,
            WeightInit::UniformInOut | WeightInit::UniformOutIn
        )
    {
        return Err(Error::value(
            "--bias needs --init linear: torch.rand parameters have no bias",
        ));
    }
    if spec.init == WeightInit::TorchMha && (spec.d_k != spec.d_in || spec.d_v != spec.d_in) {
        return Err(Error::value(format!(
            "--init torch-mha needs d_k = d_v = d_in (embed_dim), got d_k {}, d_v {}, d_in {}",
            spec.d_k, spec.d_v, spec.d_in
        )));
    }
    Ok(())
}

/// One creation call producing `out` rows of `[out, d_in]` weights (and bias).
fn create_block(
    spec: &AttentionSpec,
    gen: &mut TorchGenerator,
    out: usize,
) -> (Array2<f32>, Option<Array1<f32>>) {
    let d_in = spec.d_in;
    match spec.init {
        WeightInit::Linear => init::linear(gen, d_in, out, spec.bias),
        WeightInit::UniformOutIn => (as_matrix(gen.rand(&[out, d_in])), None),
        WeightInit::UniformInOut => (
            as_matrix(gen.rand(&[d_in, out]))
                .reversed_axes()
                .as_standard_layout()
                .to_owned(),
            None,
        ),
        WeightInit::TorchMha => unreachable!("handled by torch_mha"),
    }
}

fn as_matrix(a: ndarray::ArrayD<f32>) -> Array2<f32> {
    a.into_dimensionality().expect("rand of a 2-D shape is 2-D")
}

/// For each of q, k, v, the created rows that form its canonical rows, in order.
fn canonical_rows(spec: &AttentionSpec) -> [Vec<usize>; 3] {
    let (dk, dv, h) = (spec.d_k, spec.d_v, spec.heads);
    match spec.layout {
        QkvLayout::Separate | QkvLayout::Fused => [
            (0..dk).collect(),
            (dk..2 * dk).collect(),
            (2 * dk..2 * dk + dv).collect(),
        ],
        // Per head, the created rows are [q_h | k_h | v_h], whether one call made
        // them all or one call per head did.
        QkvLayout::FusedInterleaved | QkvLayout::PerHead => {
            let (dkh, dvh) = (dk / h, dv / h);
            let block = 2 * dkh + dvh;
            let rows = |offset: usize, width: usize| {
                (0..h)
                    .flat_map(|hh| (0..width).map(move |i| hh * block + offset + i))
                    .collect()
            };
            [rows(0, dkh), rows(dkh, dkh), rows(2 * dkh, dvh)]
        }
    }
}

/// `nn.MultiheadAttention(E, H, bias=True)`: its `out_proj` (a `Linear(E, E)`) is
/// created first, then `xavier_uniform_` fills `in_proj_weight [3E, E]`, then both
/// biases are set to zero.
fn torch_mha(spec: &AttentionSpec, gen: &mut TorchGenerator) -> Result<MultiHeadAttention> {
    let e = spec.d_in;
    let (w_o, _) = init::linear(gen, e, e, true);
    let in_proj = init::xavier_uniform(gen, 3 * e, e, 1.0);
    let block = |i: usize| {
        Linear::new(
            in_proj
                .slice(ndarray::s![i * e..(i + 1) * e, ..])
                .to_owned(),
            Some(Array1::zeros(e)),
        )
    };
    let out = Linear::new(w_o, Some(Array1::zeros(e)))?;
    MultiHeadAttention::new(
        block(0)?,
        block(1)?,
        block(2)?,
        Some(out),
        spec.heads,
        spec.heads,
    )
}
