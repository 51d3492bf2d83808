//! `scaled_dot_product_attention`'s forward and backward on NumPy views.
//!
//! The Python layer (`attend._sdpa._Call`) has already validated the call and
//! brought every array to the library's rank-4 layout (`[B, H, L, E]`) as views, so
//! strided inputs such as the `[B, T, H, D] → [B, H, T, D]` transpose arrive here
//! without a copy and the kernels read them through their strides.

use attend::attention::{
    attention_backward_with, attention_train, AttentionOptions, BackwardConfig, Causal, Dropout,
};
use ndarray::{Ix3, Ix4};
use numpy::{IntoPyArray, PyReadonlyArray3, PyReadonlyArray4, PyReadonlyArrayDyn};
use pyo3::prelude::*;

use crate::errors::to_py;
use crate::pool;

/// A float32 array handed back to Python.
type Out<'py, D> = Bound<'py, numpy::PyArray<f32, D>>;

/// One call, read from the attributes of the Python `_Call` object.
///
/// `mask` is boolean (true = attend) and `bias` additive, each broadcastable to
/// `[B, H, L, S]`; `causal` is top-left aligned (PyTorch's `is_causal`); `seed`
/// picks the dropout pattern, so the backward must see the forward's.
#[derive(FromPyObject)]
pub struct Call<'py> {
    #[pyo3(attribute)]
    q: PyReadonlyArray4<'py, f32>,
    #[pyo3(attribute)]
    k: PyReadonlyArray4<'py, f32>,
    #[pyo3(attribute)]
    v: PyReadonlyArray4<'py, f32>,
    #[pyo3(attribute)]
    mask: Option<PyReadonlyArrayDyn<'py, bool>>,
    #[pyo3(attribute)]
    bias: Option<PyReadonlyArrayDyn<'py, f32>>,
    #[pyo3(attribute)]
    causal: bool,
    #[pyo3(attribute)]
    scale: Option<f64>,
    #[pyo3(attribute)]
    dropout_p: f64,
    #[pyo3(attribute)]
    seed: u64,
}

impl Call<'_> {
    fn options(&self) -> AttentionOptions<'_> {
        AttentionOptions {
            scale: self.scale.map(|s| s as f32),
            causal: self.causal.then_some(Causal::TopLeft),
            mask: self.mask.as_ref().map(|m| m.as_array()),
            bias: self.bias.as_ref().map(|b| b.as_array()),
            ..Default::default()
        }
    }

    fn dropout(&self) -> PyResult<Option<Dropout>> {
        if self.dropout_p == 0.0 {
            return Ok(None);
        }
        Dropout::new(self.dropout_p as f32, self.seed)
            .map(Some)
            .map_err(to_py)
    }
}

/// Attention forward: `(out [B, H, L, Ev], lse [B, H, L])`.
#[pyfunction]
pub fn sdpa_forward<'py>(
    py: Python<'py>,
    call: Call<'py>,
    threads: usize,
) -> PyResult<(Out<'py, Ix4>, Out<'py, Ix3>)> {
    let dropout = call.dropout()?;
    let (q, k, v) = (call.q.as_array(), call.k.as_array(), call.v.as_array());
    let opts = call.options();
    let (out, lse) = pool::run(py, threads, || {
        attention_train(q, k, v, &opts, dropout.as_ref())
    })?;
    Ok((out.into_pyarray(py), lse.into_pyarray(py)))
}

/// Attention backward: `(dq, dk, dv)` shaped like the call's `q`, `k`, `v`, from the
/// forward's `out` and `lse` and the output gradient `dout`.
#[pyfunction]
pub fn sdpa_backward<'py>(
    py: Python<'py>,
    call: Call<'py>,
    out: PyReadonlyArray4<'py, f32>,
    lse: PyReadonlyArray3<'py, f32>,
    dout: PyReadonlyArray4<'py, f32>,
    threads: usize,
) -> PyResult<(Out<'py, Ix4>, Out<'py, Ix4>, Out<'py, Ix4>)> {
    let config = BackwardConfig {
        dropout: call.dropout()?,
        ..Default::default()
    };
    let (q, k, v) = (call.q.as_array(), call.k.as_array(), call.v.as_array());
    let (out, lse, dout) = (out.as_array(), lse.as_array(), dout.as_array());
    let opts = call.options();
    let grads = pool::run(py, threads, || {
        attention_backward_with(q, k, v, out, lse, dout, &opts, &config)
    })?;
    Ok((
        grads.dq.into_pyarray(py),
        grads.dk.into_pyarray(py),
        grads.dv.into_pyarray(py),
    ))
}
