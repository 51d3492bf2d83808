//! `scaled_dot_product_attention`'s forward and backward on NumPy views.
//!
//! The Python layer (`attend._sdpa._Call`) has already validated the call and
//! brought every array to the library's rank-4 layout (`[B, H, L, E]`) as views, so
//! strided inputs such as the `[B, T, H, D] → [B, H, T, D]` transpose arrive here
//! without a copy and the kernels read them through their strides.
//!
//! bfloat16 tensors cross as their 16-bit patterns (`t.view(torch.int16).numpy()`:
//! NumPy has no bfloat16) and are read here, in place, as [`bf16`]; results go back
//! the same way and Python views them as `torch.bfloat16`.

use attend::attention::{
    attention_backward_with, attention_train, attention_with, AttentionOptions, BackwardConfig,
    Causal, Config, Dropout,
};
use attend::element::{bf16, to_f32};
use ndarray::{Array4, ArrayView4, Dimension, Ix3, Ix4};
use numpy::{IntoPyArray, PyReadonlyArray3, PyReadonlyArray4, PyReadonlyArrayDyn};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::to_py;
use crate::pool;

/// A float32 array handed back to Python.
type Out<'py, D> = Bound<'py, numpy::PyArray<f32, D>>;

/// A bfloat16 array handed back to Python as its bit patterns.
type OutBf16<'py, D> = Bound<'py, numpy::PyArray<i16, D>>;

/// One call, read from the attributes of the Python `_Call` object.
///
/// `mask` is boolean (true = attend) and `bias` additive, each broadcastable to
/// `[B, H, L, S]`; `causal` is top-left aligned (PyTorch's `is_causal`); `seed`
/// picks the dropout pattern, so the backward must see the forward's. `N` is the
/// NumPy element type of `q`, `k`, `v`: `f32`, or `i16` holding bfloat16 bits.
#[derive(FromPyObject)]
pub struct Call<'py, N: numpy::Element = f32> {
    #[pyo3(attribute)]
    q: PyReadonlyArray4<'py, N>,
    #[pyo3(attribute)]
    k: PyReadonlyArray4<'py, N>,
    #[pyo3(attribute)]
    v: PyReadonlyArray4<'py, N>,
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

impl<N: numpy::Element> Call<'_, N> {
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

/// The bfloat16 bit patterns of a NumPy `int16` view, read in place as [`bf16`].
fn as_bf16<'a>(bits: ArrayView4<'a, i16>) -> ArrayView4<'a, bf16> {
    let raw = bits.raw_view().cast::<bf16>();
    // SAFETY: `bf16` is `#[repr(transparent)]` over `u16`, so it has `i16`'s size
    // and alignment and every bit pattern is a valid `bf16`; the raw view keeps the
    // shape and strides of a valid view whose memory stays borrowed for `'a`.
    unsafe { raw.deref_into_view() }
}

/// `a` as bfloat16 bit patterns, for Python to view as `torch.bfloat16`.
fn bf16_bits<D: Dimension>(a: &ndarray::Array<bf16, D>) -> ndarray::Array<i16, D> {
    a.mapv(|x| x.to_bits() as i16)
}

/// The bf16 form refuses dropout: the library's dropout runs in f32 only.
fn no_dropout(call: &Call<'_, i16>) -> PyResult<()> {
    if call.dropout_p != 0.0 {
        return Err(PyValueError::new_err(
            "dropout_p > 0 is not supported for torch.bfloat16 tensors: pass float32 tensors for dropout",
        ));
    }
    Ok(())
}

/// Attention forward on bfloat16 `q`, `k`, `v` (bf16 products, f32 accumulation):
/// `(out, lse)`, `out [B, H, L, Ev]` as bfloat16 bits and `lse [B, H, L]` in f32.
#[pyfunction]
pub fn sdpa_forward_bf16<'py>(
    py: Python<'py>,
    call: Call<'py, i16>,
    threads: usize,
) -> PyResult<(OutBf16<'py, Ix4>, Out<'py, Ix3>)> {
    no_dropout(&call)?;
    let [q, k, v] = [&call.q, &call.k, &call.v].map(|a| as_bf16(a.as_array()));
    let opts = call.options();
    let (out, lse) = pool::run(py, threads, || {
        attention_with(q, k, v, &opts, &Config::default())
    })?;
    Ok((bf16_bits(&out).into_pyarray(py), lse.into_pyarray(py)))
}

/// Attention backward on bfloat16 tensors: the f32 backward of the bf16 values
/// (widened exactly; the library has no bf16 backward yet), gradients rounded to
/// bf16 and returned as bit patterns.
#[pyfunction]
pub fn sdpa_backward_bf16<'py>(
    py: Python<'py>,
    call: Call<'py, i16>,
    out: PyReadonlyArray4<'py, i16>,
    lse: PyReadonlyArray3<'py, f32>,
    dout: PyReadonlyArray4<'py, i16>,
    threads: usize,
) -> PyResult<(OutBf16<'py, Ix4>, OutBf16<'py, Ix4>, OutBf16<'py, Ix4>)> {
    no_dropout(&call)?;
    let widen = |a: &PyReadonlyArray4<'py, i16>| -> Array4<f32> { to_f32(as_bf16(a.as_array())) };
    let [q, k, v, out, dout] = [&call.q, &call.k, &call.v, &out, &dout].map(widen);
    let lse = lse.as_array();
    let opts = call.options();
    let grads = pool::run(py, threads, || {
        let g = attention_backward_with(
            q.view(),
            k.view(),
            v.view(),
            out.view(),
            lse,
            dout.view(),
            &opts,
            &BackwardConfig::default(),
        )?;
        Ok([g.dq, g.dk, g.dv].map(|a| a.mapv(bf16::from_f32)))
    })?;
    let [dq, dk, dv] = grads.map(|g| bf16_bits(&g).into_pyarray(py));
    Ok((dq, dk, dv))
}
