//! `scaled_dot_product_attention`'s forward and backward on NumPy views, in
//! float32, bfloat16 and float64.
//!
//! The arrays come as the caller gave them, of any rank ≥ 2 and any strides; a
//! [`Layout`] applies PyTorch's shape rules and hands the kernels rank-4 views of
//! the same memory (`[B, T, H, D] → [B, H, T, D]` transposes and broadcast axes
//! included), and [`sdpa_shapes`] answers the same rules for shapes alone, which is
//! what PyTorch's fake tensors need.
//!
//! bfloat16 tensors cross as their 16-bit patterns (`t.view(torch.int16).numpy()`:
//! NumPy has no bfloat16) and are read here, in place, as [`bf16`]; results go back
//! the same way and Python views them as `torch.bfloat16`. float64 runs the f64
//! reference (every score materialised, one thread: correct, and slow).

use attend::attention::{
    attention_backward_with, attention_train, attention_with, AttentionOptions, BackwardConfig,
    Causal, Config, Dropout,
};
use attend::element::{bf16, to_f32};
use attend::grad::Scalar;
use attend::{Error, Result};
use ndarray::{Array, ArrayD, ArrayView4, ArrayViewD, CowArray, Dimension, Ix4};
use numpy::{IntoPyArray, PyArrayDyn, PyReadonlyArrayDyn};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use pyo3::IntoPyObjectExt;

use crate::errors::to_py;
use crate::pool;
use crate::shapes::{Input, Layout, Source};

/// An array handed back to Python.
type Out<'py, T> = Bound<'py, PyArrayDyn<T>>;

/// `(query, key, value)` as NumPy arrays of one element type: `f32`, `f64`, or `i16`
/// holding bfloat16 bits.
type Qkv<'py, N> = (
    PyReadonlyArrayDyn<'py, N>,
    PyReadonlyArrayDyn<'py, N>,
    PyReadonlyArrayDyn<'py, N>,
);

/// `attn_mask`: boolean (true = attend) or additive, broadcastable to `[..., L, S]`.
#[derive(FromPyObject)]
pub enum Mask<'py> {
    /// `true` = attend.
    Bool(PyReadonlyArrayDyn<'py, bool>),
    /// Added to the scaled scores.
    Bias(PyReadonlyArrayDyn<'py, f32>),
}

/// A mask's array, borrowed.
enum MaskView<'a> {
    Bool(ArrayViewD<'a, bool>),
    Bias(ArrayViewD<'a, f32>),
}

impl Mask<'_> {
    fn view(&self) -> MaskView<'_> {
        match self {
            Mask::Bool(m) => MaskView::Bool(m.as_array()),
            Mask::Bias(m) => MaskView::Bias(m.as_array()),
        }
    }
}

impl MaskView<'_> {
    fn shape(&self) -> &[usize] {
        match self {
            MaskView::Bool(m) => m.shape(),
            MaskView::Bias(m) => m.shape(),
        }
    }
}

/// Everything about a call but its tensors, as `scaled_dot_product_attention` takes
/// it (Python keeps one for each set of options it meets). The constructor refuses a
/// dropout probability outside `[0, 1)`; the shape rules refuse the rest.
#[pyclass(frozen, module = "attend._attend")]
pub struct Options {
    causal: bool,
    scale: Option<f64>,
    dropout: Option<Dropout>,
    enable_gqa: bool,
}

#[pymethods]
impl Options {
    /// `is_causal` (top-left aligned, as PyTorch), `scale` (`None` for `1/√E`),
    /// `dropout_p` with the `seed` that picks its pattern (the backward must be given
    /// the forward's), `enable_gqa` (key/value heads that divide the query's).
    #[new]
    #[pyo3(signature = (*, is_causal, scale, dropout_p, enable_gqa, seed))]
    fn new(
        is_causal: bool,
        scale: Option<f64>,
        dropout_p: f64,
        enable_gqa: bool,
        seed: u64,
    ) -> PyResult<Self> {
        let dropout = match dropout_p {
            0.0 => None,
            p => Some(Dropout::new(p as f32, seed).map_err(to_py)?),
        };
        Ok(Options {
            causal: is_causal,
            scale,
            dropout,
            enable_gqa,
        })
    }
}

impl Options {
    /// The layout of a call with these shapes, or the error the call would raise.
    fn layout(
        &self,
        q: &[usize],
        k: &[usize],
        v: &[usize],
        mask: Option<&[usize]>,
    ) -> Result<Layout> {
        if self.causal && mask.is_some() {
            return Err(Error::value(
                "attn_mask and is_causal=True cannot both be given (PyTorch's rule): fold causality into the mask",
            ));
        }
        let layout = Layout::new(q, k, v, mask, self.enable_gqa)?;
        // The kernels take an f32 scale: refused here, for every dtype, if it is not one.
        layout.dims.scale(self.scale.map(|s| s as f32))?;
        Ok(layout)
    }
}

/// A call's arrays in the kernels' rank-4 layout, viewing the caller's memory
/// wherever the strides allow.
struct Call<'a, T> {
    layout: Layout,
    q: CowArray<'a, T, Ix4>,
    k: CowArray<'a, T, Ix4>,
    v: CowArray<'a, T, Ix4>,
    mask: Option<CowArray<'a, bool, Ix4>>,
    bias: Option<CowArray<'a, f32, Ix4>>,
    causal: bool,
}

impl<'a, T: Clone> Call<'a, T> {
    fn new(
        [q, k, v]: [&'a ArrayViewD<'_, T>; 3],
        mask: Option<&'a MaskView<'_>>,
        options: &Options,
    ) -> Result<Self> {
        let layout = options.layout(q.shape(), k.shape(), v.shape(), mask.map(MaskView::shape))?;
        let (mut bool_mask, mut bias) = (None, None);
        // An empty output computes nothing, so its mask is never read.
        match mask.filter(|_| !layout.is_empty()) {
            Some(MaskView::Bool(m)) => bool_mask = Some(layout.mask(m)?),
            Some(MaskView::Bias(m)) => bias = Some(layout.mask(m)?),
            None => {}
        }
        Ok(Call {
            q: layout.input(q, Input::Query)?,
            k: layout.input(k, Input::Key)?,
            v: layout.input(v, Input::Value)?,
            mask: bool_mask,
            bias,
            causal: options.causal,
            layout,
        })
    }

    /// The library's options for this call, with `scale` (already checked).
    fn options(&self, scale: Option<f32>) -> AttentionOptions<'_> {
        AttentionOptions {
            scale,
            causal: self.causal.then_some(Causal::TopLeft),
            mask: self.mask.as_ref().map(|m| m.view().into_dyn()),
            bias: self.bias.as_ref().map(|b| b.view().into_dyn()),
            ..Default::default()
        }
    }

    /// The forward's `out` and `lse` as the caller sees them, `[..., L, Ev]` and
    /// `[..., L]` (an empty output computes nothing).
    fn forward<U: Clone + num_traits::Zero, V: Clone + num_traits::Zero>(
        &self,
        compute: impl FnOnce(&Self) -> Result<(ndarray::Array4<U>, ndarray::Array3<V>)>,
    ) -> Result<(ArrayD<U>, ArrayD<V>)> {
        let (out_shape, lse_shape) = (self.layout.out_shape(), self.layout.lse_shape());
        if self.layout.is_empty() {
            return Ok((ArrayD::zeros(out_shape), ArrayD::zeros(lse_shape)));
        }
        let (out, lse) = compute(self)?;
        Ok((reshape(out, out_shape)?, reshape(lse, lse_shape)?))
    }

    /// `(dq, dk, dv)` shaped like the caller's `q`, `k`, `v`, from the kernels'
    /// rank-4 gradients (an empty output gives zeros without computing anything).
    fn gradients<F: Clone + num_traits::Zero + std::ops::Add<Output = F>>(
        &self,
        [q, k, v]: [&[usize]; 3],
        compute: impl FnOnce() -> Result<[ndarray::Array4<F>; 3]>,
    ) -> Result<[ArrayD<F>; 3]> {
        if self.layout.is_empty() {
            return Ok([q, k, v].map(ArrayD::zeros));
        }
        let [dq, dk, dv] = compute()?;
        let l = &self.layout;
        Ok([
            l.reduce(dq.view(), Input::Query, q)?,
            l.reduce(dk.view(), Input::Key, k)?,
            l.reduce(dv.view(), Input::Value, v)?,
        ])
    }
}

/// A kernel's standard-layout result in the caller's shape (same elements).
fn reshape<T, D: Dimension>(a: Array<T, D>, shape: Vec<usize>) -> Result<ArrayD<T>> {
    a.into_shape_with_order(shape)
        .map_err(|e| Error::shape(format!("attention result: {e}")))
}

/// A [`Source`] for Python: `(argument, axis)`, or the constant 1.
fn source(py: Python<'_>, s: Source) -> PyResult<Bound<'_, PyAny>> {
    match s {
        Source::Axis(arg, axis) => (arg, axis).into_bound_py_any(py),
        Source::One => 1.into_bound_py_any(py),
    }
}

/// The sizes of a call's output and log-sum-exp, from its arguments' shapes alone,
/// for PyTorch's fake tensors (`torch.compile`, `torch.export`, the meta device),
/// which ask this instead of running the kernels, and get their errors.
///
/// Given the shapes' (hinted) sizes, it answers `(out, lse, equal, divides)`: where
/// each size of the output `[..., L, Ev]` and of the log-sum-exp `[..., L]` comes
/// from, as `(argument, axis)` (0 query, 1 key, 2 value, 3 mask) or 1, so that sizes
/// a compiler keeps symbolic stay symbolic; and the pairs of sizes that the call
/// needs equal, and `(multiple, divisor)` pairs, for the compiler to assume.
#[pyfunction]
#[pyo3(signature = (query, key, value, mask, options))]
pub fn sdpa_shapes<'py>(
    py: Python<'py>,
    query: Vec<usize>,
    key: Vec<usize>,
    value: Vec<usize>,
    mask: Option<Vec<usize>>,
    options: PyRef<'py, Options>,
) -> PyResult<Bound<'py, PyTuple>> {
    let layout = options
        .layout(&query, &key, &value, mask.as_deref())
        .map_err(to_py)?;
    let list = |sources: Vec<Source>| -> PyResult<Bound<'py, PyList>> {
        let items = sources
            .into_iter()
            .map(|s| source(py, s))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, items)
    };
    let pairs = |pairs: &[(Source, Source)]| -> PyResult<Bound<'py, PyList>> {
        let items = pairs
            .iter()
            .map(|&(a, b)| PyTuple::new(py, [source(py, a)?, source(py, b)?]))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, items)
    };
    PyTuple::new(
        py,
        [
            list(layout.out_sources())?.into_any(),
            list(layout.lse_sources())?.into_any(),
            pairs(&layout.equal)?.into_any(),
            pairs(&layout.divides)?.into_any(),
        ],
    )
}

/// Attention forward on float32 arrays: `(out [..., L, Ev], lse [..., L])`.
#[pyfunction]
pub fn sdpa_forward<'py>(
    py: Python<'py>,
    inputs: Qkv<'py, f32>,
    mask: Option<Mask<'py>>,
    options: PyRef<'py, Options>,
    threads: usize,
) -> PyResult<(Out<'py, f32>, Out<'py, f32>)> {
    let [q, k, v] = [&inputs.0, &inputs.1, &inputs.2].map(|a| a.as_array());
    let mask = mask.as_ref().map(Mask::view);
    let call = Call::new([&q, &k, &v], mask.as_ref(), &options).map_err(to_py)?;
    let scale = options.scale.map(|s| s as f32);
    let dropout = options.dropout;
    let (out, lse) = pool::run(py, threads, || {
        call.forward(|c| {
            let opts = c.options(scale);
            attention_train(c.q.view(), c.k.view(), c.v.view(), &opts, dropout.as_ref())
        })
    })?;
    Ok((out.into_pyarray(py), lse.into_pyarray(py)))
}

/// Attention backward on float32 arrays: `(dq, dk, dv)` shaped like `q`, `k`, `v`
/// (summed over the axes they were broadcast along), from the forward's `out` and
/// `lse` and the output gradient `dout`.
#[pyfunction]
pub fn sdpa_backward<'py>(
    py: Python<'py>,
    inputs: Qkv<'py, f32>,
    mask: Option<Mask<'py>>,
    saved: (PyReadonlyArrayDyn<'py, f32>, PyReadonlyArrayDyn<'py, f32>),
    dout: PyReadonlyArrayDyn<'py, f32>,
    options: PyRef<'py, Options>,
    threads: usize,
) -> PyResult<(Out<'py, f32>, Out<'py, f32>, Out<'py, f32>)> {
    let [q, k, v] = [&inputs.0, &inputs.1, &inputs.2].map(|a| a.as_array());
    let mask = mask.as_ref().map(Mask::view);
    let call = Call::new([&q, &k, &v], mask.as_ref(), &options).map_err(to_py)?;
    let (out, lse, dout) = (saved.0.as_array(), saved.1.as_array(), dout.as_array());
    let config = BackwardConfig {
        dropout: options.dropout,
        ..Default::default()
    };
    let scale = options.scale.map(|s| s as f32);
    let grads = pool::run(py, threads, || {
        call.gradients([q.shape(), k.shape(), v.shape()], || {
            let l = &call.layout;
            let (out, lse, dout) = (l.output(&out)?, l.lse(&lse)?, l.output(&dout)?);
            let (q, k, v) = (call.q.view(), call.k.view(), call.v.view());
            let opts = call.options(scale);
            let g = attention_backward_with(
                q,
                k,
                v,
                out.view(),
                lse.view(),
                dout.view(),
                &opts,
                &config,
            )?;
            Ok([g.dq, g.dk, g.dv])
        })
    })?;
    let [dq, dk, dv] = grads.map(|g| g.into_pyarray(py));
    Ok((dq, dk, dv))
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
fn bf16_bits<D: Dimension>(a: &Array<bf16, D>) -> Array<i16, D> {
    a.mapv(|x| x.to_bits() as i16)
}

/// The bf16 forms refuse dropout: the library's dropout runs in f32 only.
fn no_dropout(options: &Options) -> PyResult<()> {
    if options.dropout.is_some() {
        return Err(to_py(Error::value(
            "dropout_p > 0 is not supported for torch.bfloat16 tensors: pass float32 tensors for dropout",
        )));
    }
    Ok(())
}

/// Attention forward on bfloat16 arrays (bf16 products, f32 accumulation):
/// `(out, lse)`, `out [..., L, Ev]` as bfloat16 bits and `lse [..., L]` in f32.
#[pyfunction]
pub fn sdpa_forward_bf16<'py>(
    py: Python<'py>,
    inputs: Qkv<'py, i16>,
    mask: Option<Mask<'py>>,
    options: PyRef<'py, Options>,
    threads: usize,
) -> PyResult<(Out<'py, i16>, Out<'py, f32>)> {
    no_dropout(&options)?;
    let [q, k, v] = [&inputs.0, &inputs.1, &inputs.2].map(|a| a.as_array());
    let mask = mask.as_ref().map(Mask::view);
    let call = Call::new([&q, &k, &v], mask.as_ref(), &options).map_err(to_py)?;
    let scale = options.scale.map(|s| s as f32);
    let (out, lse) = pool::run(py, threads, || {
        call.forward(|c| {
            let [q, k, v] = [&c.q, &c.k, &c.v].map(|a| as_bf16(a.view()));
            let (out, lse) = attention_with(q, k, v, &c.options(scale), &Config::default())?;
            Ok((bf16_bits(&out), lse))
        })
    })?;
    Ok((out.into_pyarray(py), lse.into_pyarray(py)))
}

/// Attention backward on bfloat16 arrays: the f32 backward of the bf16 values
/// (widened exactly; the library has no bf16 backward yet), the gradients summed
/// over broadcast axes in f32, then rounded to bf16 and returned as bit patterns.
#[pyfunction]
pub fn sdpa_backward_bf16<'py>(
    py: Python<'py>,
    inputs: Qkv<'py, i16>,
    mask: Option<Mask<'py>>,
    saved: (PyReadonlyArrayDyn<'py, i16>, PyReadonlyArrayDyn<'py, f32>),
    dout: PyReadonlyArrayDyn<'py, i16>,
    options: PyRef<'py, Options>,
    threads: usize,
) -> PyResult<(Out<'py, i16>, Out<'py, i16>, Out<'py, i16>)> {
    no_dropout(&options)?;
    let [q, k, v] = [&inputs.0, &inputs.1, &inputs.2].map(|a| a.as_array());
    let mask = mask.as_ref().map(Mask::view);
    let call = Call::new([&q, &k, &v], mask.as_ref(), &options).map_err(to_py)?;
    let (out, lse, dout) = (saved.0.as_array(), saved.1.as_array(), dout.as_array());
    let scale = options.scale.map(|s| s as f32);
    let grads = pool::run(py, threads, || {
        call.gradients([q.shape(), k.shape(), v.shape()], || {
            let l = &call.layout;
            let (out, lse, dout) = (l.output(&out)?, l.lse(&lse)?, l.output(&dout)?);
            let widen = |a: &CowArray<'_, i16, Ix4>| to_f32(as_bf16(a.view()));
            let [q, k, v, out, dout] = [&call.q, &call.k, &call.v, &out, &dout].map(widen);
            let g = attention_backward_with(
                q.view(),
                k.view(),
                v.view(),
                out.view(),
                lse.view(),
                dout.view(),
                &call.options(scale),
                &BackwardConfig::default(),
            )?;
            Ok([g.dq, g.dk, g.dv])
        })
    })?;
    let [dq, dk, dv] = grads.map(|g| bf16_bits(&g.mapv(bf16::from_f32)).into_pyarray(py));
    Ok((dq, dk, dv))
}

/// The f64 scale of a call: PyTorch's, `1/√E` computed in f64 by default. The
/// library's scale is an f32, so the f64 reference is given the query times this
/// scale and a scale of 1.
fn f64_scale(call: &Call<'_, f64>, options: &Options) -> PyResult<f64> {
    call.layout.dims.scale(options.scale).map_err(to_py)
}

/// Attention forward on float64 arrays by the f64 reference:
/// `(out [..., L, Ev], lse [..., L])`, both f64.
#[pyfunction]
pub fn sdpa_forward_f64<'py>(
    py: Python<'py>,
    inputs: Qkv<'py, f64>,
    mask: Option<Mask<'py>>,
    options: PyRef<'py, Options>,
    threads: usize,
) -> PyResult<(Out<'py, f64>, Out<'py, f64>)> {
    let [q, k, v] = [&inputs.0, &inputs.1, &inputs.2].map(|a| a.as_array());
    let mask = mask.as_ref().map(Mask::view);
    let call = Call::new([&q, &k, &v], mask.as_ref(), &options).map_err(to_py)?;
    let (dropout, scale) = (options.dropout, f64_scale(&call, &options)?);
    let (out, lse) = pool::run(py, threads, || {
        call.forward(|c| {
            let q = c.q.mapv(|x| x * scale);
            let opts = c.options(Some(1.0));
            f64::attention_forward(q.view(), c.k.view(), c.v.view(), &opts, dropout.as_ref())
        })
    })?;
    Ok((out.into_pyarray(py), lse.into_pyarray(py)))
}

/// Attention backward on float64 arrays by the f64 reference (which recomputes
/// the probabilities, so `lse` is not read): `(dq, dk, dv)` shaped like `q`, `k`, `v`.
#[pyfunction]
pub fn sdpa_backward_f64<'py>(
    py: Python<'py>,
    inputs: Qkv<'py, f64>,
    mask: Option<Mask<'py>>,
    saved: (PyReadonlyArrayDyn<'py, f64>, PyReadonlyArrayDyn<'py, f64>),
    dout: PyReadonlyArrayDyn<'py, f64>,
    options: PyRef<'py, Options>,
    threads: usize,
) -> PyResult<(Out<'py, f64>, Out<'py, f64>, Out<'py, f64>)> {
    let [q, k, v] = [&inputs.0, &inputs.1, &inputs.2].map(|a| a.as_array());
    let mask = mask.as_ref().map(Mask::view);
    let call = Call::new([&q, &k, &v], mask.as_ref(), &options).map_err(to_py)?;
    let (out, lse, dout) = (saved.0.as_array(), saved.1.as_array(), dout.as_array());
    let (dropout, scale) = (options.dropout, f64_scale(&call, &options)?);
    let grads = pool::run(py, threads, || {
        call.gradients([q.shape(), k.shape(), v.shape()], || {
            let l = &call.layout;
            let (out, lse, dout) = (l.output(&out)?, l.lse(&lse)?, l.output(&dout)?);
            let q = call.q.mapv(|x| x * scale);
            let opts = call.options(Some(1.0));
            let (dq, dk, dv) = f64::attention_backward(
                q.view(),
                call.k.view(),
                call.v.view(),
                out.view(),
                lse.view(),
                dout.view(),
                &opts,
                dropout.as_ref(),
            )?;
            // d(q·s)/dq = s; dk already holds the scale through q·s.
            Ok([dq * scale, dk, dv])
        })
    })?;
    let [dq, dk, dv] = grads.map(|g| g.into_pyarray(py));
    Ok((dq, dk, dv))
}
