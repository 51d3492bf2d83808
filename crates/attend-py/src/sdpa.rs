//! `scaled_dot_product_attention`'s forward and backward in float32, bfloat16 and
//! float64: on torch tensors, as the CPU kernels of `torch.ops.attend.*`, and on
//! float32 NumPy arrays, for NumPy callers.
//!
//! The inputs come as the caller gave them, of any rank ≥ 2 and any strides; a
//! [`Layout`] applies PyTorch's shape rules and hands the kernels rank-4 views of
//! the same memory (`[B, T, H, D] → [B, H, T, D]` transposes and broadcast axes
//! included), and [`sdpa_shapes`] answers the same rules for shapes alone, which is
//! what PyTorch's fake tensors need.
//!
//! Tensors cross through DLPack ([`crate::dlpack`]), bfloat16 read in place as
//! [`bf16`]; float16 is widened to float32 by PyTorch first (the kernels have no
//! float16 loads) and the results rounded back once. float64 runs the f64 reference
//! (every score materialised, one thread: correct, and slow).

use attend::attention::{
    attention_backward_with, attention_train, attention_with_lse_parts, AttentionOptions,
    BackwardConfig, Causal, Config, Dropout, Saved,
};
use attend::element::{bf16, to_f32};
use attend::grad::Scalar;
use attend::{Error, Result};
use ndarray::{Array, ArrayD, ArrayViewD, CowArray, Dimension, Ix4};
use numpy::{IntoPyArray, PyArrayDyn, PyReadonlyArrayDyn};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use pyo3::{intern, IntoPyObjectExt};

use crate::dlpack::{into_tensor, Element, Tensor, F16};
use crate::errors::{to_py, type_error};
use crate::pool;
use crate::shapes::{Input, Layout, Source};

/// An array handed back to NumPy.
type Out<'py, T> = Bound<'py, PyArrayDyn<T>>;

/// `(query, key, value)` as float32 NumPy arrays.
type Qkv<'py> = (
    PyReadonlyArrayDyn<'py, f32>,
    PyReadonlyArrayDyn<'py, f32>,
    PyReadonlyArrayDyn<'py, f32>,
);

/// `(query, key, value)`, borrowed.
type Views<'a, 'b, T> = [&'a ArrayViewD<'b, T>; 3];

/// `attn_mask` as a NumPy array: boolean (true = attend) or additive, broadcastable
/// to `[..., L, S]`.
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
    /// A float64 additive mask of float64 tensors, which the f64 reference adds in
    /// float64.
    Bias64(ArrayViewD<'a, f64>),
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
            MaskView::Bias64(m) => m.shape(),
        }
    }
}

/// Everything about a call but its tensors, as `scaled_dot_product_attention` takes
/// it (a Python object for the shape rules and NumPy calls; the operators' kernels
/// make theirs from the schema's arguments). The constructor refuses a dropout
/// probability outside `[0, 1]`; the shape rules refuse the rest.
#[pyclass(frozen, module = "attend._attend")]
pub struct Options {
    causal: bool,
    scale: Option<f64>,
    dropout: Option<Dropout>,
    /// `dropout_p = 1`: every weight dropped, so the output and the gradients are
    /// zeros, as PyTorch's are (the library's dropout takes `p < 1` only).
    drops_all: bool,
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
        Options::of(is_causal, scale, dropout_p, enable_gqa, seed)
    }
}

impl Options {
    /// The options of a call, or the error for its dropout probability.
    fn of(
        is_causal: bool,
        scale: Option<f64>,
        dropout_p: f64,
        enable_gqa: bool,
        seed: u64,
    ) -> PyResult<Self> {
        if !(0.0..=1.0).contains(&dropout_p) {
            return Err(to_py(Error::value(format!(
                "dropout_p: dropout probability has to be between 0 and 1, but got {dropout_p}"
            ))));
        }
        // A probability just below 1 that rounds to 1 in f32 drops all as well.
        let drops_all = dropout_p as f32 == 1.0;
        let dropout = match dropout_p {
            0.0 => None,
            _ if drops_all => None,
            p => Some(Dropout::new(p as f32, seed).map_err(to_py)?),
        };
        Ok(Options {
            causal: is_causal,
            scale,
            dropout,
            drops_all,
            enable_gqa,
        })
    }

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
                "Explicit attn_mask should not be set when is_causal=True (PyTorch's rule): fold causality into attn_mask",
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
    /// The additive mask in f32: the caller's, or a float64 one rounded
    /// ([`to_f32_mask`]), which `bias_f64` then holds exactly.
    bias: Option<CowArray<'a, f32, Ix4>>,
    bias_f64: Option<CowArray<'a, f64, Ix4>>,
    causal: bool,
    drops_all: bool,
}

/// A float64 additive mask rounded to f32 as the library's masks are: finite values
/// beyond f32's range saturate (a float64 `finfo.min` still masks a score rather
/// than becoming −∞, which would zero a fully masked row that PyTorch averages), the
/// infinities and NaN stay.
fn to_f32_mask<'b>(m: &CowArray<'_, f64, Ix4>) -> CowArray<'b, f32, Ix4> {
    let (lo, hi) = (f64::from(f32::MIN), f64::from(f32::MAX));
    let round = |&x: &f64| {
        if x.is_finite() {
            x.clamp(lo, hi) as f32
        } else {
            x as f32
        }
    };
    CowArray::from(m.map(round))
}

impl<'a, T: Clone> Call<'a, T> {
    fn new(
        [q, k, v]: [&'a ArrayViewD<'_, T>; 3],
        mask: Option<&'a MaskView<'_>>,
        options: &Options,
    ) -> Result<Self> {
        let layout = options.layout(q.shape(), k.shape(), v.shape(), mask.map(MaskView::shape))?;
        let (mut bool_mask, mut bias, mut bias_f64) = (None, None, None);
        // An empty output computes nothing, so its mask is never read.
        match mask.filter(|_| !layout.is_empty()) {
            Some(MaskView::Bool(m)) => bool_mask = Some(layout.mask(m)?),
            Some(MaskView::Bias(m)) => bias = Some(layout.mask(m)?),
            Some(MaskView::Bias64(m)) => {
                let exact = layout.mask(m)?;
                bias = Some(to_f32_mask(&exact));
                bias_f64 = Some(exact);
            }
            None => {}
        }
        Ok(Call {
            q: layout.input(q, Input::Query)?,
            k: layout.input(k, Input::Key)?,
            v: layout.input(v, Input::Value)?,
            mask: bool_mask,
            bias,
            bias_f64,
            causal: options.causal,
            drops_all: options.drops_all,
            layout,
        })
    }

    /// The forward's multiply-adds, `q·kᵀ` and the weights times `v` (the
    /// causal mask's half counted whole): what decides whether the call is worth
    /// a second thread ([`pool::run_sized`]).
    fn forward_madds(&self) -> usize {
        let (b, h, l, e) = self.q.dim();
        let (s, ev) = (self.k.dim().2, self.v.dim().3);
        [b, h, l, s, e + ev]
            .into_iter()
            .fold(1, usize::saturating_mul)
    }

    /// The backward's: five products to the forward's two.
    fn backward_madds(&self) -> usize {
        self.forward_madds().saturating_mul(5) / 2
    }

    /// The library's options for this call, with `scale` (already checked).
    fn options(&self, scale: Option<f32>) -> AttentionOptions<'_> {
        AttentionOptions {
            scale,
            causal: self.causal.then_some(Causal::TopLeft),
            mask: self.mask.as_ref().map(|m| m.view().into_dyn()),
            bias: self.bias.as_ref().map(|b| b.view().into_dyn()),
            bias_f64: self.bias_f64.as_ref().map(|b| b.view().into_dyn()),
            ..Default::default()
        }
    }

    /// The forward's `out`, `lse` and the log-sum-exp's residual as the caller
    /// sees them, `[..., L, Ev]`, `[..., L]` and `[..., L]` (an empty output
    /// computes nothing; with every weight dropped the output is zeros and `lse`
    /// that of the weights before dropout).
    fn forward<U: Clone + Default, V: Clone + Default>(
        &self,
        compute: impl FnOnce(&Self) -> Result<Forward<U, V>>,
    ) -> Result<ForwardD<U, V>> {
        let (out_shape, lse_shape) = (self.layout.out_shape(), self.layout.lse_shape());
        if self.layout.is_empty() {
            let lse = ArrayD::default(lse_shape);
            return Ok((ArrayD::default(out_shape), lse.clone(), lse));
        }
        let (mut out, lse, residual) = compute(self)?;
        if self.drops_all {
            out.fill(U::default());
        }
        let (lse, residual) = (
            reshape(lse, lse_shape.clone())?,
            reshape(residual, lse_shape)?,
        );
        Ok((reshape(out, out_shape)?, lse, residual))
    }

    /// `(dq, dk, dv)` shaped like the caller's `q`, `k`, `v`, and the additive
    /// mask's gradient shaped like it (`mask`, when asked for), from the kernels'
    /// rank-4 gradients (an empty output, or one with every weight dropped, gives
    /// zeros without computing anything).
    fn gradients<F: Clone + num_traits::Zero + std::ops::Add<Output = F>>(
        &self,
        [q, k, v]: [&[usize]; 3],
        mask: Option<&[usize]>,
        compute: impl FnOnce() -> Result<Grads<F>>,
    ) -> Result<Backward<F>> {
        if self.layout.is_empty() || self.drops_all {
            return Ok(([q, k, v].map(ArrayD::zeros), mask.map(ArrayD::zeros)));
        }
        let ([dq, dk, dv], dmask) = compute()?;
        let l = &self.layout;
        let dmask = match dmask.zip(mask) {
            Some((g, shape)) => Some(l.reduce_mask(g, shape)?),
            None => None,
        };
        Ok((
            [
                l.reduce(dq.view(), Input::Query, q)?,
                l.reduce(dk.view(), Input::Key, k)?,
                l.reduce(dv.view(), Input::Value, v)?,
            ],
            dmask,
        ))
    }
}

/// A forward's rank-4 output, its log-sum-exp and the log-sum-exp's residual
/// (`attend::attention::LogSumExp`).
type Forward<U, V> = (ndarray::Array4<U>, ndarray::Array3<V>, ndarray::Array3<V>);

/// The same in the caller's shapes.
type ForwardD<U, V> = (ArrayD<U>, ArrayD<V>, ArrayD<V>);

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

/// float32 attention forward: `(out [..., L, Ev], lse [..., L], lse_residual
/// [..., L])`.
fn forward_f32(
    py: Python<'_>,
    qkv: Views<'_, '_, f32>,
    mask: Option<&MaskView<'_>>,
    options: &Options,
    threads: usize,
) -> PyResult<ForwardD<f32, f32>> {
    let call = Call::new(qkv, mask, options).map_err(to_py)?;
    let scale = options.scale.map(|s| s as f32);
    let dropout = options.dropout;
    pool::run_sized(py, threads, call.forward_madds(), || {
        call.forward(|c| {
            let opts = c.options(scale);
            let (out, lse) =
                attention_train(c.q.view(), c.k.view(), c.v.view(), &opts, dropout.as_ref())?;
            Ok((out, lse.value, lse.residual))
        })
    })
}

/// The kernels' gradients of a call: `(dq, dk, dv)` rank 4, and the additive
/// mask's shaped like the call's rank-4 mask, when asked for.
type Grads<F> = ([ndarray::Array4<F>; 3], Option<ArrayD<F>>);

/// The gradients a backward hands back: `(dq, dk, dv)` and the mask's (in `M`).
type Backward<F, M = F> = ([ArrayD<F>; 3], Option<ArrayD<M>>);

/// What the backward reads besides the inputs: the forward's `out`, `lse` and the
/// log-sum-exp's residual, and the output gradient `dout`.
type SavedAndDout<'a, 'b, T, L> = (
    &'a ArrayViewD<'b, T>,
    [&'a ArrayViewD<'b, L>; 2],
    &'a ArrayViewD<'b, T>,
);

/// float32 attention backward: `(dq, dk, dv)` shaped like `q`, `k`, `v` (summed
/// over the axes they were broadcast along), and the additive mask's gradient
/// where `mask_grad` asks for it.
fn backward_f32(
    py: Python<'_>,
    qkv: Views<'_, '_, f32>,
    mask: Option<&MaskView<'_>>,
    (out, [lse, residual], dout): SavedAndDout<'_, '_, f32, f32>,
    (options, mask_grad): (&Options, bool),
    threads: usize,
) -> PyResult<Backward<f32>> {
    let call = Call::new(qkv, mask, options).map_err(to_py)?;
    let config = BackwardConfig {
        dropout: options.dropout,
        bias_grad: mask_grad,
        ..Default::default()
    };
    let scale = options.scale.map(|s| s as f32);
    pool::run_sized(py, threads, call.backward_madds(), || {
        call.gradients(qkv.map(|a| a.shape()), bias_shape(mask, mask_grad), || {
            let l = &call.layout;
            let (out, lse, dout) = (l.output(out)?, l.lse(lse)?, l.output(dout)?);
            let residual = l.lse(residual)?;
            let g = attention_backward_with(
                call.q.view(),
                call.k.view(),
                call.v.view(),
                Saved::new(out.view(), lse.view()).with_lse_residual(residual.view()),
                dout.view(),
                &call.options(scale),
                &config,
            )?;
            Ok(([g.dq, g.dk, g.dv], g.dbias))
        })
    })
}

/// The additive mask's shape, where its gradient is asked for.
fn bias_shape<'a>(mask: Option<&'a MaskView<'_>>, mask_grad: bool) -> Option<&'a [usize]> {
    match mask {
        Some(MaskView::Bias(m)) if mask_grad => Some(m.shape()),
        Some(MaskView::Bias64(m)) if mask_grad => Some(m.shape()),
        _ => None,
    }
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

/// bfloat16 attention forward (bf16 products, f32 accumulation): `out` in bf16,
/// `lse` and its residual in f32.
fn forward_bf16(
    py: Python<'_>,
    qkv: Views<'_, '_, bf16>,
    mask: Option<&MaskView<'_>>,
    options: &Options,
    threads: usize,
) -> PyResult<ForwardD<bf16, f32>> {
    no_dropout(options)?;
    let call = Call::new(qkv, mask, options).map_err(to_py)?;
    let scale = options.scale.map(|s| s as f32);
    pool::run_sized(py, threads, call.forward_madds(), || {
        call.forward(|c| {
            let (q, k, v) = (c.q.view(), c.k.view(), c.v.view());
            let opts = c.options(scale);
            let (out, lse) = attention_with_lse_parts(q, k, v, &opts, &Config::default())?;
            Ok((out, lse.value, lse.residual))
        })
    })
}

/// bfloat16 attention backward: the f32 backward of the bf16 values (widened
/// exactly; the library has no bf16 backward yet), the gradients summed over
/// broadcast axes in f32, then rounded to bf16.
fn backward_bf16(
    py: Python<'_>,
    qkv: Views<'_, '_, bf16>,
    mask: Option<&MaskView<'_>>,
    (out, [lse, residual], dout): SavedAndDout<'_, '_, bf16, f32>,
    (options, mask_grad): (&Options, bool),
    threads: usize,
) -> PyResult<Backward<bf16, f32>> {
    no_dropout(options)?;
    let call = Call::new(qkv, mask, options).map_err(to_py)?;
    let scale = options.scale.map(|s| s as f32);
    let config = BackwardConfig {
        bias_grad: mask_grad,
        ..Default::default()
    };
    pool::run_sized(py, threads, call.backward_madds(), || {
        let (grads, dmask) =
            call.gradients(qkv.map(|a| a.shape()), bias_shape(mask, mask_grad), || {
                let l = &call.layout;
                let (out, lse, dout) = (l.output(out)?, l.lse(lse)?, l.output(dout)?);
                let residual = l.lse(residual)?;
                let widen = |a: &CowArray<'_, bf16, Ix4>| to_f32(a.view());
                let [q, k, v, out, dout] = [&call.q, &call.k, &call.v, &out, &dout].map(widen);
                let g = attention_backward_with(
                    q.view(),
                    k.view(),
                    v.view(),
                    Saved::new(out.view(), lse.view()).with_lse_residual(residual.view()),
                    dout.view(),
                    &call.options(scale),
                    &config,
                )?;
                Ok(([g.dq, g.dk, g.dv], g.dbias))
            })?;
        Ok((grads.map(|g| g.mapv(bf16::from_f32)), dmask))
    })
}

/// The f64 scale of a call: PyTorch's, `1/√E` computed in f64 by default. The
/// library's scale is an f32, so the f64 reference is given the query times this
/// scale and a scale of 1.
fn f64_scale(call: &Call<'_, f64>, options: &Options) -> PyResult<f64> {
    call.layout.dims.scale(options.scale).map_err(to_py)
}

/// float64 attention forward by the f64 reference: `out`, `lse` and its residual
/// (0: the f64 backward does not read them) in f64.
fn forward_f64(
    py: Python<'_>,
    qkv: Views<'_, '_, f64>,
    mask: Option<&MaskView<'_>>,
    options: &Options,
    threads: usize,
) -> PyResult<ForwardD<f64, f64>> {
    let call = Call::new(qkv, mask, options).map_err(to_py)?;
    let (dropout, scale) = (options.dropout, f64_scale(&call, options)?);
    pool::run_sized(py, threads, call.forward_madds(), || {
        call.forward(|c| {
            let q = c.q.mapv(|x| x * scale);
            let opts = c.options(Some(1.0));
            f64::attention_forward(q.view(), c.k.view(), c.v.view(), &opts, dropout.as_ref())
        })
    })
}

/// float64 attention backward by the f64 reference (which recomputes the
/// probabilities, so `lse` is not read).
fn backward_f64(
    py: Python<'_>,
    qkv: Views<'_, '_, f64>,
    mask: Option<&MaskView<'_>>,
    (out, [lse, _], dout): SavedAndDout<'_, '_, f64, f64>,
    (options, mask_grad): (&Options, bool),
    threads: usize,
) -> PyResult<Backward<f64>> {
    let call = Call::new(qkv, mask, options).map_err(to_py)?;
    let (dropout, scale) = (options.dropout, f64_scale(&call, options)?);
    pool::run_sized(py, threads, call.backward_madds(), || {
        call.gradients(qkv.map(|a| a.shape()), bias_shape(mask, mask_grad), || {
            let l = &call.layout;
            let (out, lse, dout) = (l.output(out)?, l.lse(lse)?, l.output(dout)?);
            let q = call.q.mapv(|x| x * scale);
            let opts = call.options(Some(1.0));
            let (dq, dk, dv, dmask) = f64::attention_backward(
                q.view(),
                call.k.view(),
                call.v.view(),
                Saved::new(out.view(), lse.view()),
                dout.view(),
                &opts,
                dropout.as_ref(),
                mask_grad,
            )?;
            // d(q·s)/dq = s; dk already holds the scale through q·s.
            Ok(([dq * scale, dk, dv], dmask))
        })
    })
}

/// Attention forward on float32 NumPy arrays (any rank, any strides):
/// `(out [..., L, Ev], lse [..., L])`, the log-sum-exp rounded to f32 as PyTorch
/// returns it.
#[pyfunction]
pub fn sdpa_forward<'py>(
    py: Python<'py>,
    inputs: Qkv<'py>,
    mask: Option<Mask<'py>>,
    options: PyRef<'py, Options>,
    threads: usize,
) -> PyResult<(Out<'py, f32>, Out<'py, f32>)> {
    let [q, k, v] = [&inputs.0, &inputs.1, &inputs.2].map(|a| a.as_array());
    let mask = mask.as_ref().map(Mask::view);
    let (out, lse, _) = forward_f32(py, [&q, &k, &v], mask.as_ref(), &options, threads)?;
    Ok((out.into_pyarray(py), lse.into_pyarray(py)))
}

/// The options of an operator call, as its schema passes them; `seed` is an
/// integer scalar tensor, or `None` without dropout.
fn op_options(
    dropout_p: f64,
    is_causal: bool,
    scale: Option<f64>,
    enable_gqa: bool,
    seed: Option<&Bound<'_, PyAny>>,
) -> PyResult<Options> {
    let seed = seed.map(|s| s.extract::<u64>()).transpose()?.unwrap_or(0);
    Options::of(is_causal, scale, dropout_p, enable_gqa, seed)
}

/// `query`, `key` and `value` read as `T`, or the `TypeError` naming the one that is not.
fn views<'a, T: Element>([q, k, v]: &[Tensor<'a>; 3]) -> PyResult<[ArrayViewD<'a, T>; 3]> {
    Ok([q.view()?, k.view()?, v.view()?])
}

/// A tensor mask as the kernels take it: boolean or float32, or float64 for float64
/// queries (`attend.ops` converts the other dtypes first).
fn tensor_mask<'a>(
    mask: Option<&Tensor<'a>>,
    query: &Tensor<'_>,
) -> PyResult<Option<MaskView<'a>>> {
    let Some(m) = mask else {
        return Ok(None);
    };
    match m.dtype() {
        d if d == bool::DTYPE => Ok(Some(MaskView::Bool(m.view()?))),
        d if d == f32::DTYPE => Ok(Some(MaskView::Bias(m.view()?))),
        d if d == f64::DTYPE && query.dtype() == f64::DTYPE => {
            Ok(Some(MaskView::Bias64(m.view()?)))
        }
        d => Err(type_error(format!(
            "attn_mask must be torch.bool or torch.float32 here (or torch.float64 for \
             torch.float64 queries), got {}",
            d.name()
        ))),
    }
}

/// The error for a query of a dtype the kernels do not read.
fn unsupported(query: &Tensor<'_>) -> PyErr {
    type_error(format!(
        "query must be torch.float32, torch.bfloat16, torch.float16 or torch.float64, got {}",
        query.dtype().name()
    ))
}

/// float16 tensors as float32 ones, widened by PyTorch (`Tensor.float()`, one copy:
/// the kernels have no float16 loads), each checked to be float16 like the query.
fn widened<'py, const N: usize>(
    tensors: [(&Bound<'py, PyAny>, &Tensor<'_>); N],
) -> PyResult<[Bound<'py, PyAny>; N]> {
    for (_, t) in &tensors {
        t.expect(F16)?;
    }
    let mut wide = Vec::with_capacity(N);
    for (t, _) in tensors {
        wide.push(t.call_method0(intern!(t.py(), "float"))?);
    }
    Ok(wide
        .try_into()
        .unwrap_or_else(|_| unreachable!("one widened tensor per tensor")))
}

/// A float32 result rounded to float16 once, by PyTorch (`Tensor.half()`).
fn narrowed(t: Bound<'_, PyAny>) -> PyResult<Bound<'_, PyAny>> {
    t.call_method0(intern!(t.py(), "half"))
}

/// The CPU kernel of `torch.ops.attend.scaled_dot_product_attention`, on torch
/// tensors of any rank and strides, read in place: `(out [..., L, Ev], lse [..., L],
/// lse_residual [..., L])` as new tensors, `out` in the query's dtype and `lse`
/// and what rounding it left out (`attend::attention::LogSumExp`) in float32
/// (float64 for float64 inputs).
#[pyfunction]
#[pyo3(signature = (query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, seed, threads))]
#[allow(clippy::too_many_arguments)] // the operator's schema, then the thread count
pub fn sdpa_forward_tensors<'py>(
    py: Python<'py>,
    query: &Bound<'py, PyAny>,
    key: &Bound<'py, PyAny>,
    value: &Bound<'py, PyAny>,
    attn_mask: Option<&Bound<'py, PyAny>>,
    dropout_p: f64,
    is_causal: bool,
    scale: Option<f64>,
    enable_gqa: bool,
    seed: Option<&Bound<'py, PyAny>>,
    threads: usize,
) -> PyResult<ForwardTensors<'py>> {
    let options = op_options(dropout_p, is_causal, scale, enable_gqa, seed)?;
    let qkv = [
        Tensor::new(query, "query")?,
        Tensor::new(key, "key")?,
        Tensor::new(value, "value")?,
    ];
    let mask = attn_mask.map(|m| Tensor::new(m, "attn_mask")).transpose()?;
    let mask = tensor_mask(mask.as_ref(), &qkv[0])?;
    let mask = mask.as_ref();
    let dtype = qkv[0].dtype();
    if dtype == f32::DTYPE {
        let [q, k, v] = views::<f32>(&qkv)?;
        forward_tensors(py, forward_f32(py, [&q, &k, &v], mask, &options, threads)?)
    } else if dtype == bf16::DTYPE {
        let [q, k, v] = views::<bf16>(&qkv)?;
        forward_tensors(py, forward_bf16(py, [&q, &k, &v], mask, &options, threads)?)
    } else if dtype == f64::DTYPE {
        let [q, k, v] = views::<f64>(&qkv)?;
        forward_tensors(py, forward_f64(py, [&q, &k, &v], mask, &options, threads)?)
    } else if dtype == F16 {
        let [q, k, v] = widened([(query, &qkv[0]), (key, &qkv[1]), (value, &qkv[2])])?;
        let (out, lse, residual) = sdpa_forward_tensors(
            py, &q, &k, &v, attn_mask, dropout_p, is_causal, scale, enable_gqa, seed, threads,
        )?;
        Ok((narrowed(out)?, lse, residual))
    } else {
        Err(unsupported(&qkv[0]))
    }
}

/// A forward's tensors: `(out, lse, lse_residual)`.
pub type ForwardTensors<'py> = (Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>);

/// A forward's results as new tensors.
fn forward_tensors<U: Element, V: Element>(
    py: Python<'_>,
    (out, lse, residual): ForwardD<U, V>,
) -> PyResult<ForwardTensors<'_>> {
    Ok((
        into_tensor(py, out)?,
        into_tensor(py, lse)?,
        into_tensor(py, residual)?,
    ))
}

/// A backward's tensors: `(dq, dk, dv)` and the mask's gradient (`None` unless
/// asked for).
type GradTensors<'py> = (
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Option<Bound<'py, PyAny>>,
);

/// The gradients as new tensors.
fn gradients<T: Element, M: Element>(
    py: Python<'_>,
    ([dq, dk, dv], dmask): Backward<T, M>,
) -> PyResult<GradTensors<'_>> {
    Ok((
        into_tensor(py, dq)?,
        into_tensor(py, dk)?,
        into_tensor(py, dv)?,
        dmask.map(|g| into_tensor(py, g)).transpose()?,
    ))
}

/// The CPU kernel of `torch.ops.attend.scaled_dot_product_attention_backward`:
/// `(dq, dk, dv)` as new tensors shaped like `query`, `key` and `value` (summed over
/// the axes they were broadcast along), from the forward's `out`, `lse` and
/// `lse_residual` and the output gradient `grad_out`; with `mask_grad`, the additive mask's gradient
/// shaped like it (float32, float64 for float64 queries), else `None`.
#[pyfunction]
#[pyo3(signature = (
    grad_out, query, key, value, out, lse, lse_residual, attn_mask, dropout_p, is_causal, scale, enable_gqa,
    seed, threads, mask_grad=false
))]
#[allow(clippy::too_many_arguments)] // the operator's schema, then the thread count
pub fn sdpa_backward_tensors<'py>(
    py: Python<'py>,
    grad_out: &Bound<'py, PyAny>,
    query: &Bound<'py, PyAny>,
    key: &Bound<'py, PyAny>,
    value: &Bound<'py, PyAny>,
    out: &Bound<'py, PyAny>,
    lse: &Bound<'py, PyAny>,
    lse_residual: &Bound<'py, PyAny>,
    attn_mask: Option<&Bound<'py, PyAny>>,
    dropout_p: f64,
    is_causal: bool,
    scale: Option<f64>,
    enable_gqa: bool,
    seed: Option<&Bound<'py, PyAny>>,
    threads: usize,
    mask_grad: bool,
) -> PyResult<GradTensors<'py>> {
    let options = op_options(dropout_p, is_causal, scale, enable_gqa, seed)?;
    let qkv = [
        Tensor::new(query, "query")?,
        Tensor::new(key, "key")?,
        Tensor::new(value, "value")?,
    ];
    let saved = [
        Tensor::new(out, "out")?,
        Tensor::new(lse, "lse")?,
        Tensor::new(lse_residual, "lse_residual")?,
        Tensor::new(grad_out, "grad_out")?,
    ];
    let mask = attn_mask.map(|m| Tensor::new(m, "attn_mask")).transpose()?;
    let mask = tensor_mask(mask.as_ref(), &qkv[0])?;
    let mask = mask.as_ref();
    let [o, l, r, d] = &saved;
    let dtype = qkv[0].dtype();
    if dtype == f32::DTYPE {
        let [q, k, v] = views::<f32>(&qkv)?;
        let (o, l, r, d) = (o.view()?, l.view()?, r.view()?, d.view()?);
        gradients(
            py,
            backward_f32(
                py,
                [&q, &k, &v],
                mask,
                (&o, [&l, &r], &d),
                (&options, mask_grad),
                threads,
            )?,
        )
    } else if dtype == bf16::DTYPE {
        let [q, k, v] = views::<bf16>(&qkv)?;
        let (o, l, r, d) = (o.view()?, l.view()?, r.view()?, d.view()?);
        gradients(
            py,
            backward_bf16(
                py,
                [&q, &k, &v],
                mask,
                (&o, [&l, &r], &d),
                (&options, mask_grad),
                threads,
            )?,
        )
    } else if dtype == f64::DTYPE {
        let [q, k, v] = views::<f64>(&qkv)?;
        let (o, l, r, d) = (o.view()?, l.view()?, r.view()?, d.view()?);
        gradients(
            py,
            backward_f64(
                py,
                [&q, &k, &v],
                mask,
                (&o, [&l, &r], &d),
                (&options, mask_grad),
                threads,
            )?,
        )
    } else if dtype == F16 {
        let [g, q, k, v, o] = widened([
            (grad_out, d),
            (query, &qkv[0]),
            (key, &qkv[1]),
            (value, &qkv[2]),
            (out, o),
        ])?;
        let (dq, dk, dv, dmask) = sdpa_backward_tensors(
            py,
            &g,
            &q,
            &k,
            &v,
            &o,
            lse,
            lse_residual,
            attn_mask,
            dropout_p,
            is_causal,
            scale,
            enable_gqa,
            seed,
            threads,
            mask_grad,
        )?;
        Ok((narrowed(dq)?, narrowed(dk)?, narrowed(dv)?, dmask))
    } else {
        Err(unsupported(&qkv[0]))
    }
}
