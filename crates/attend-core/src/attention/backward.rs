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
use crate::kernels::backward::{fused, reference, AttentionGrads};
use crate::problem::{sum_to_mask_shape, AttentionOptions, Dropout, Problem};
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
/// [`attention_with_lse`](crate::attention::attention_with_lse) returns them.
///
/// One argument rather than two so that a backward call does not take six tensors
/// of one type in a row, where swapping two compiles. `T` is the float type: f32
/// for [`attention_backward`], f64 for the gradient checks
/// ([`crate::grad::Scalar`]).
#[derive(Clone, Copy, Debug)]
pub struct Saved<'a, T = f32> {
    /// The forward output, `[B, Hq, L, Ev]`.
    pub out: ArrayView4<'a, T>,
    /// The forward log-sum-exp, `[B, Hq, L]` (−∞ for fully masked rows).
    pub lse: ArrayView3<'a, T>,
}

impl<'a, T> Saved<'a, T> {
    /// The forward's output `out` and log-sum-exp `lse`.
    pub fn new(out: ArrayView4<'a, T>, lse: ArrayView3<'a, T>) -> Self {
        Saved { out, lse }
    }
}

/// Views of what [`attention_with_lse`](crate::attention::attention_with_lse)
/// returned, `(out, lse)`.
impl<'a, T> From<&'a (Array4<T>, Array3<T>)> for Saved<'a, T> {
    fn from((out, lse): &'a (Array4<T>, Array3<T>)) -> Self {
        Saved::new(out.view(), lse.view())
    }
}

/// Gradients of `sum(attention(q, k, v) ∘ dout)` with respect to `q`, `k` and `v`.
///
/// `saved` holds what [`attention_with_lse`](crate::attention::attention_with_lse)
/// returned for the same inputs and options. Fully masked rows give zero gradients.
pub fn attention_backward(
    q: ArrayView4<'_, f32>,
    k: ArrayView4<'_, f32>,
    v: ArrayView4<'_, f32>,
    saved: Saved<'_>,
    dout: ArrayView4<'_, f32>,
    opts: &AttentionOptions<'_>,
) -> Result<AttentionGrads> {
    attention_backward_with(q, k, v, saved, dout, opts, &BackwardConfig::default())
}

/// [`attention_backward`] with an explicit kernel, thread count and dropout.
pub fn attention_backward_with(
    q: ArrayView4<'_, f32>,
    k: ArrayView4<'_, f32>,
    v: ArrayView4<'_, f32>,
    saved: Saved<'_>,
    dout: ArrayView4<'_, f32>,
    opts: &AttentionOptions<'_>,
    config: &BackwardConfig,
) -> Result<AttentionGrads> {
    let Saved { out, lse } = saved;
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
    if lse.shape() != lse_shape {
        let want = format!("[B, Hq, L] = {lse_shape:?}");
        return Err(shape_error("lse", lse.shape(), want));
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
        let run = || fused::run(&p, out, lse, dout, dropout, bias_shape.is_some(), isa);
        let (mut g, ds) = config.exec.install(run)?;
        let sum = |(ds, shape): (Array4<f32>, &[usize])| {
            sum_to_mask_shape(ds.mapv(f64::from), shape).mapv(|x| x as f32)
        };
        g.dbias = ds.zip(bias_shape).map(sum);
        return Ok(g);
    }
    let (q, k, v) = (q.mapv(f64::from), k.mapv(f64::from), v.mapv(f64::from));
    let exact = Problem::new(q.view(), k.view(), v.view(), opts)?;
    let dout = dout.mapv(f64::from);
    let run = || reference::backward(&exact, dout.view(), config.dropout.as_ref());
    let g = config.exec.install(run)?;
    Ok(AttentionGrads {
        dq: g.dq.mapv(|x| x as f32),
        dk: g.dk.mapv(|x| x as f32),
        dv: g.dv.mapv(|x| x as f32),
        dbias: bias_shape.map(|shape| sum_to_mask_shape(g.ds, shape).mapv(|x| x as f32)),
    })
}

/// Attention as training computes it: [`attention_with_lse`](crate::attention::attention_with_lse)
/// with dropout on the weights. Without dropout it is exactly that function; with
/// it, the fused forward applies each tile's dropout factors before the values are
/// summed (the log-sum-exp is that of the weights before dropout).
pub fn attention_train(
    q: ArrayView4<'_, f32>,
    k: ArrayView4<'_, f32>,
    v: ArrayView4<'_, f32>,
    opts: &AttentionOptions<'_>,
    dropout: Option<&Dropout>,
) -> Result<(Array4<f32>, Array3<f32>)> {
    match dropout {
        Some(dr) if dr.p() > 0.0 => {
            let p = Problem::new(q, k, v, opts)?;
            if crate::kernels::fused::supports(&p) {
                let exec = Exec::default();
                let isa = exec.token()?;
                let run = || crate::kernels::fused::run(&p, isa, Some(dr));
                return exec.install(run);
            }
            let (q, k, v) = (q.mapv(f64::from), k.mapv(f64::from), v.mapv(f64::from));
            let exact = Problem::new(q.view(), k.view(), v.view(), opts)?;
            let f = reference::forward(&exact, Some(dr));
            Ok((f.out.mapv(|x| x as f32), f.lse.mapv(|x| x as f32)))
        }
        _ => crate::attention::attention_with_lse(q, k, v, opts),
    }
}
