//! The backward dispatch: validation of the saved forward results, then the choice
//! of the fused or the reference kernel; and the training forward (attention with
//! dropout on the weights).
//!
//! ```
//! use attend_core::attention::{
//!     attention_backward, attention_with_lse, AttentionOptions, Causal, Saved,
//! };
//! use ndarray::Array4;
//!
//! let q = Array4::<f32>::from_shape_fn((1, 2, 3, 4), |(_, h, i, e)| (h + i * e) as f32 * 0.1);
//! let k = q.clone();
//! let v = q.clone();
//! let opts = AttentionOptions { causal: Some(Causal::TopLeft), ..Default::default() };
//! let forward = attention_with_lse(q.view(), k.view(), v.view(), &opts)?;
//! let dout = Array4::<f32>::ones(forward.0.raw_dim());
//! let saved = Saved::from(&forward);
//! let g = attention_backward(q.view(), k.view(), v.view(), saved, dout.view(), &opts)?;
//! assert_eq!(g.dk.shape(), k.shape());
//! # Ok::<(), attend_core::Error>(())
//! ```

use ndarray::{Array3, Array4, ArrayView3, ArrayView4};

use crate::config::Exec;
use crate::element::Element;
use crate::kernels::backward::{fused, reference, AttentionGrads};
use crate::kernels::lse::LogSumExp;
use crate::problem::{sum_to_mask_shape, AttentionOptions, Dropout, Precision, Problem};
use crate::{Error, Result};

/// Which kernel computes a backward pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackwardKernel {
    /// The fused kernel when it supports the problem (softmax over keys, `E > 0`),
    /// else the reference.
    #[default]
    Auto,
    /// The f64 reference.
    Reference,
    /// The fused kernel; an error if it does not support the problem.
    Fused,
}

/// How to run a backward pass.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BackwardConfig {
    /// Which kernel.
    pub kernel: BackwardKernel,
    /// Dropout applied in the forward pass, if any.
    pub dropout: Option<Dropout>,
    /// Instruction set and threads (the result has the same bits whatever the
    /// threads).
    pub exec: Exec,
    /// Whether to return the additive mask's gradient ([`AttentionGrads::dbias`]),
    /// for a learned mask: a `[B, Hq, L, S]` buffer the kernels fill only then.
    pub bias_grad: bool,
}

/// What a forward pass saves for its backward: the output `out [B, Hq, L, Ev]` and
/// the natural log-sum-exp `lse [B, Hq, L]` of each query's scores, as
/// [`attention_with_lse`](crate::attention::attention_with_lse) returns them, and
/// where the forward gave it ([`attention_with_lse_parts`](crate::attention::attention_with_lse_parts),
/// [`attention_train`]), what rounding `lse` to f32 left out.
///
/// One argument rather than two so that a backward call does not take six tensors
/// of one type in a row, where swapping two compiles. `T` is the float type of the
/// log-sum-exp: f32 for [`attention_backward`], f64 for the gradient checks
/// ([`crate::grad::Scalar`]); `O` the output's element type, `T` but for bf16
/// tensors, whose log-sum-exp is f32.
#[derive(Clone, Copy, Debug)]
pub struct Saved<'a, T = f32, O = T> {
    /// The forward output, `[B, Hq, L, Ev]`.
    pub out: ArrayView4<'a, O>,
    /// The forward log-sum-exp, `[B, Hq, L]` (−∞ for fully masked rows).
    pub lse: ArrayView3<'a, T>,
    /// What rounding `lse` left out ([`LogSumExp::residual`]), `[B, Hq, L]`. The
    /// backward recomputes each weight as `exp(s − lse − residual)`: without it,
    /// `lse`'s rounding (up to half its ulp) scales whole rows of weights, and the
    /// backward recomputes the log of the sum of the rows whose `|lse| ≥ 2¹⁶`,
    /// where `lse` no longer holds it.
    pub lse_residual: Option<ArrayView3<'a, T>>,
}

impl<'a, T, O> Saved<'a, T, O> {
    /// The forward's output `out` and log-sum-exp `lse`.
    pub fn new(out: ArrayView4<'a, O>, lse: ArrayView3<'a, T>) -> Self {
        Saved {
            out,
            lse,
            lse_residual: None,
        }
    }

    /// The same with the log-sum-exp's `residual` ([`LogSumExp::residual`]).
    pub fn with_lse_residual(self, residual: ArrayView3<'a, T>) -> Self {
        Saved {
            lse_residual: Some(residual),
            ..self
        }
    }
}

/// Views of what [`attention_with_lse`](crate::attention::attention_with_lse)
/// returned, `(out, lse)`.
impl<'a, T> From<&'a (Array4<T>, Array3<T>)> for Saved<'a, T> {
    fn from((out, lse): &'a (Array4<T>, Array3<T>)) -> Self {
        Saved::new(out.view(), lse.view())
    }
}

/// Views of what [`attention_with_lse_parts`](crate::attention::attention_with_lse_parts)
/// or [`attention_train`] returned, `(out, lse)`, the residual included.
impl<'a, O> From<&'a (Array4<O>, LogSumExp)> for Saved<'a, f32, O> {
    fn from((out, lse): &'a (Array4<O>, LogSumExp)) -> Self {
        Saved::new(out.view(), lse.value.view()).with_lse_residual(lse.residual.view())
    }
}

/// Gradients of `sum(attention(q, k, v) ∘ dout)` with respect to `q`, `k` and `v`.
///
/// `saved` holds what [`attention_with_lse`](crate::attention::attention_with_lse)
/// returned for the same inputs and options. Fully masked rows give zero gradients.
/// On bf16 tensors the gradients are the f32 backward's on the bf16 numbers
/// (widened exactly as the kernel reads them), each rounded to bf16 once.
pub fn attention_backward<T: Element>(
    q: ArrayView4<'_, T>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    saved: Saved<'_, f32, T>,
    dout: ArrayView4<'_, T>,
    opts: &AttentionOptions<'_>,
) -> Result<AttentionGrads<T>> {
    attention_backward_with(q, k, v, saved, dout, opts, &BackwardConfig::default())
}

/// [`attention_backward`] with an explicit kernel, thread count and dropout.
pub fn attention_backward_with<T: Element>(
    q: ArrayView4<'_, T>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    saved: Saved<'_, f32, T>,
    dout: ArrayView4<'_, T>,
    opts: &AttentionOptions<'_>,
    config: &BackwardConfig,
) -> Result<AttentionGrads<T>> {
    let Saved {
        out,
        lse,
        lse_residual,
    } = saved;
    let p = Problem::new(q, k, v, opts)?;
    let d = p.dims();
    let out_shape = [d.batch, d.heads, d.q_len, d.value_dim];
    let shape_error = |arg: &str, got: &[usize], want: String| Error::Shape {
        arg: arg.into(),
        got: got.to_vec(),
        want,
    };
    if dout.shape() != out_shape {
        let want = format!("the output's shape {out_shape:?}");
        return Err(shape_error("dout", dout.shape(), want));
    }
    if out.shape() != out_shape {
        let want = format!("the forward output's shape {out_shape:?}");
        return Err(shape_error("out", out.shape(), want));
    }
    let lse_shape = [d.batch, d.heads, d.q_len];
    for (arg, a) in [("lse", Some(&lse)), ("lse_residual", lse_residual.as_ref())] {
        if let Some(a) = a.filter(|a| a.shape() != lse_shape) {
            let want = format!("[B, Hq, L] = {lse_shape:?}");
            return Err(shape_error(arg, a.shape(), want));
        }
    }
    let isa = config.exec.token()?;
    let supported = fused::supports(&p);
    let use_fused = match config.kernel {
        BackwardKernel::Reference => false,
        BackwardKernel::Auto => supported,
        BackwardKernel::Fused if supported => true,
        BackwardKernel::Fused => {
            return Err(Error::Unsupported {
                kernel: "fused backward",
                reason: "supports only softmax over keys and head width > 0",
            })
        }
    };
    // The mask's gradient, when asked for, summed back to the mask's own shape.
    let bias_shape = opts
        .bias
        .as_ref()
        .filter(|_| config.bias_grad)
        .map(|b| b.shape());
    if use_fused {
        let dropout = config.dropout.as_ref();
        let lse = (lse, lse_residual);
        let run = || T::fused_backward(&p, out, lse, dout, dropout, bias_shape.is_some(), isa);
        let ([dq, dk, dv], ds) = config.exec.install(run)?;
        let sum = |(ds, shape): (Array4<f32>, &[usize])| {
            sum_to_mask_shape(ds.mapv(f64::from), shape).mapv(|x| x as f32)
        };
        let dbias = ds.zip(bias_shape).map(sum);
        return Ok(AttentionGrads { dq, dk, dv, dbias });
    }
    let exactly = |a: ArrayView4<'_, T>| a.mapv(|x| f64::from(x.to_f32()));
    let (q, k, v) = (exactly(q), exactly(k), exactly(v));
    let exact = Problem::new(q.view(), k.view(), v.view(), opts)?;
    let dout = exactly(dout);
    let run = || reference::backward(&exact, dout.view(), config.dropout.as_ref());
    let g = config.exec.install(run)?;
    // Through f32, as the fused kernel's gradients are rounded.
    let round = |a: Array4<f64>| a.mapv(|x| T::from_f32(x as f32));
    Ok(AttentionGrads {
        dq: round(g.dq),
        dk: round(g.dk),
        dv: round(g.dv),
        dbias: bias_shape.map(|shape| sum_to_mask_shape(g.ds, shape).mapv(|x| x as f32)),
    })
}

/// Attention as training computes it: [`attention_with_lse_parts`](crate::attention::attention_with_lse_parts)
/// with dropout on the weights, the log-sum-exp in its two parts for the backward
/// ([`Saved`]'s `From`). With dropout the fused forward applies each tile's dropout
/// factors before the values are summed (the log-sum-exp is that of the weights
/// before dropout).
///
/// Wherever it supports the problem the fused kernel computes it, short queries
/// included: its scores are the ones the fused backward recomputes, to the bit, so
/// that the weights it gets back from the log-sum-exp are the forward's (another
/// kernel's scores differ in their last bits, which a row's largest weight, near
/// 1, would carry whole, where a softmax normalising its own scores cancels them).
pub fn attention_train(
    q: ArrayView4<'_, f32>,
    k: ArrayView4<'_, f32>,
    v: ArrayView4<'_, f32>,
    opts: &AttentionOptions<'_>,
    dropout: Option<&Dropout>,
) -> Result<(Array4<f32>, LogSumExp)> {
    let dropout = dropout.filter(|dr| dr.p() > 0.0);
    let p = Problem::new(q, k, v, opts)?;
    let f32_products = p.precision == Precision::F32 || dropout.is_some();
    if crate::kernels::fused::supports(&p) && f32_products {
        let exec = Exec::default();
        let isa = exec.token()?;
        let run = || crate::kernels::fused::run(&p, isa, dropout);
        return exec.install(run);
    }
    let Some(dr) = dropout else {
        return crate::attention::attention_with_lse_parts(q, k, v, opts, &Default::default());
    };
    // Softmax over queries, or no value width: the backward's weights do not come
    // from this log-sum-exp (the reference recomputes them; with no values every
    // gradient is 0), so its f32 rounding is all it needs.
    let (q, k, v) = (q.mapv(f64::from), k.mapv(f64::from), v.mapv(f64::from));
    let exact = Problem::new(q.view(), k.view(), v.view(), opts)?;
    let f = reference::forward(&exact, Some(dr));
    let lse = LogSumExp::exact(f.lse.mapv(|x| x as f32));
    Ok((f.out.mapv(|x| x as f32), lse))
}
