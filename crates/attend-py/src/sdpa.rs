//! `scaled_dot_product_attention`'s forward and backward on NumPy views.
//!
//! The Python layer has already brought every array to the library's rank-4
//! layout (`[B, H, L, E]`) as views, so strided inputs such as the
//! `[B, T, H, D] → [B, H, T, D]` transpose arrive here without a copy and the
//! kernels read them through their strides.

use attend::attention::{AttentionOptions, Causal};
use attend::kernels::backward::{
    attention_backward_with, attention_train, BackwardConfig, Dropout,
};
use ndarray::{Ix3, Ix4};
use numpy::{IntoPyArray, PyReadonlyArray3, PyReadonlyArray4, PyReadonlyArrayDyn};
use pyo3::prelude::*;

use crate::errors::to_py;
use crate::pool;

/// A float32 array handed back to Python.
type Out<'py, D> = Bound<'py, numpy::PyArray<f32, D>>;

/// The masks and scalars of one call, as Python passes them.
struct Options<'py> {
    mask: Option<PyReadonlyArrayDyn<'py, bool>>,
    bias: Option<PyReadonlyArrayDyn<'py, f32>>,
    causal: bool,
    scale: Option<f64>,
}

impl Options<'_> {
    fn attention(&self) -> AttentionOptions<'_> {
        AttentionOptions {
            scale: self.scale.map(|s| s as f32),
            causal: self.causal.then_some(Causal::TopLeft),
            mask: self.mask.as_ref().map(|m| m.as_array()),
            bias: self.bias.as_ref().map(|b| b.as_array()),
            ..Default::default()
        }
    }
}

fn dropout(p: f64, seed: u64) -> PyResult<Option<Dropout>> {
    if p == 0.0 {
        return Ok(None);
    }
    Dropout::new(p as f32, seed).map(Some).map_err(to_py)
}

/// Attention forward: `(out [B, H, L, Ev], lse [B, H, L])`.
///
/// `mask` is boolean (true = attend) and `bias` additive, each broadcastable to
/// `[B, H, L, S]`; `causal` is top-left aligned (PyTorch's `is_causal`).
#[pyfunction]
#[pyo3(signature = (q, k, v, *, mask=None, bias=None, causal=false, scale=None, dropout_p=0.0, seed=0, threads=1))]
#[allow(clippy::too_many_arguments)]
pub fn sdpa_forward<'py>(
    py: Python<'py>,
    q: PyReadonlyArray4<'py, f32>,
    k: PyReadonlyArray4<'py, f32>,
    v: PyReadonlyArray4<'py, f32>,
    mask: Option<PyReadonlyArrayDyn<'py, bool>>,
    bias: Option<PyReadonlyArrayDyn<'py, f32>>,
    causal: bool,
    scale: Option<f64>,
    dropout_p: f64,
    seed: u64,
    threads: usize,
) -> PyResult<(Out<'py, Ix4>, Out<'py, Ix3>)> {
    let options = Options {
        mask,
        bias,
        causal,
        scale,
    };
    let dropout = dropout(dropout_p, seed)?;
    let (q, k, v) = (q.as_array(), k.as_array(), v.as_array());
    let opts = options.attention();
    let (out, lse) = pool::run(py, threads, || {
        attention_train(q, k, v, &opts, dropout.as_ref())
    })?;
    Ok((out.into_pyarray(py), lse.into_pyarray(py)))
}

/// Attention backward: `(dq, dk, dv)` shaped like `q`, `k`, `v`, from the forward's
/// `out` and `lse` and the output gradient `dout`. The options and dropout seed must
/// be the forward's.
#[pyfunction]
#[pyo3(signature = (q, k, v, out, lse, dout, *, mask=None, bias=None, causal=false, scale=None, dropout_p=0.0, seed=0, threads=1))]
#[allow(clippy::too_many_arguments)]
pub fn sdpa_backward<'py>(
    py: Python<'py>,
    q: PyReadonlyArray4<'py, f32>,
    k: PyReadonlyArray4<'py, f32>,
    v: PyReadonlyArray4<'py, f32>,
    out: PyReadonlyArray4<'py, f32>,
    lse: PyReadonlyArray3<'py, f32>,
    dout: PyReadonlyArray4<'py, f32>,
    mask: Option<PyReadonlyArrayDyn<'py, bool>>,
    bias: Option<PyReadonlyArrayDyn<'py, f32>>,
    causal: bool,
    scale: Option<f64>,
    dropout_p: f64,
    seed: u64,
    threads: usize,
) -> PyResult<(Out<'py, Ix4>, Out<'py, Ix4>, Out<'py, Ix4>)> {
    let options = Options {
        mask,
        bias,
        causal,
        scale,
    };
    let config = BackwardConfig {
        dropout: dropout(dropout_p, seed)?,
        ..Default::default()
    };
    let (q, k, v) = (q.as_array(), k.as_array(), v.as_array());
    let (out, lse, dout) = (out.as_array(), lse.as_array(), dout.as_array());
    let opts = options.attention();
    let grads = pool::run(py, threads, || {
        attention_backward_with(q, k, v, out, lse, dout, &opts, &config)
    })?;
    Ok((
        grads.dq.into_pyarray(py),
        grads.dk.into_pyarray(py),
        grads.dv.into_pyarray(py),
    ))
}
