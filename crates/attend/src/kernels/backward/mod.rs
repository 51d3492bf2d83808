//! Attention backward: `dQ`, `dK`, `dV` from `dO`, plus the training forward
//! (attention with dropout on the weights).
//!
//! Two kernels compute the same thing: `reference` (f64, materialises every
//! probability, any softmax axis) and [`fused`] (FlashAttention-2 style: recomputes
//! the probabilities block by block from the saved log-sum-exp, never holds an
//! `L × S` matrix, parallel over key blocks so that even one head keeps every core
//! busy, and bit-for-bit deterministic whatever the thread count).
//!
//! ```
//! use attend::attention::{attention_with_lse, AttentionOptions, Causal};
//! use attend::kernels::backward::attention_backward;
//! use ndarray::Array4;
//!
//! let q = Array4::<f32>::from_shape_fn((1, 2, 3, 4), |(_, h, i, e)| (h + i * e) as f32 * 0.1);
//! let k = q.clone();
//! let v = q.clone();
//! let opts = AttentionOptions { causal: Some(Causal::TopLeft), ..Default::default() };
//! let (out, lse) = attention_with_lse(q.view(), k.view(), v.view(), &opts)?;
//! let dout = Array4::<f32>::ones(out.raw_dim());
//! let g = attention_backward(q.view(), k.view(), v.view(), out.view(), lse.view(), dout.view(), &opts)?;
//! assert_eq!(g.dk.shape(), k.shape());
//! # Ok::<(), attend::Error>(())
//! ```

pub mod fused;
pub(crate) mod reference;

use ndarray::{Array3, Array4, ArrayView3, ArrayView4, ShapeBuilder};

use crate::attention::{AttentionOptions, Problem};
use crate::{Error, Result};

/// The gradients of an attention call with respect to its three inputs.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionGrads {
    /// `∂loss/∂q`, shaped like `q`.
    pub dq: Array4<f32>,
    /// `∂loss/∂k`, shaped like `k` (grouped heads summed).
    pub dk: Array4<f32>,
    /// `∂loss/∂v`, shaped like `v` (grouped heads summed).
    pub dv: Array4<f32>,
}

/// Dropout on the attention weights, as in training: each weight is zeroed with
/// probability `p` and the kept ones are scaled by `1/(1 − p)`.
///
/// The keep/drop decision of weight `(b, h, i, j)` is a hash of `seed` and the
/// index (a counter-based generator, like FlashAttention's Philox), so the backward
/// pass recomputes the same mask without storing it and the result does not depend
/// on the thread count. The masks are not PyTorch's bits, only its semantics. Use a
/// new seed for every training step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dropout {
    p: f32,
    seed: u64,
    /// Drop when the 24-bit uniform draw is below this.
    threshold: u32,
    scale: f32,
}

impl Dropout {
    /// Dropout with probability `p ∈ [0, 1)` and a seed.
    pub fn new(p: f32, seed: u64) -> Result<Self> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::value(format!(
                "dropout probability must be in [0, 1), got {p}"
            )));
        }
        Ok(Dropout {
            p,
            seed,
            threshold: (p as f64 * (1u64 << 24) as f64).round() as u32,
            scale: 1.0 / (1.0 - p),
        })
    }

    /// The drop probability.
    pub fn p(&self) -> f32 {
        self.p
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// `0` if weight `(b, h, i, j)` is dropped, else `1/(1 − p)`.
    #[inline]
    pub fn factor(&self, b: usize, h: usize, i: usize, j: usize) -> f32 {
        self.factor_in_row(self.row(b, h, i), j)
    }

    /// The hash of a row `(b, h, i)` of weights, for [`factor_in_row`](Self::factor_in_row):
    /// a kernel that walks a row hashes its prefix once.
    #[inline]
    pub fn row(&self, b: usize, h: usize, i: usize) -> u64 {
        let mut x = self.seed ^ 0x9E37_79B9_7F4A_7C15;
        for part in [b, h, i] {
            x = splitmix(x ^ part as u64);
        }
        x
    }

    /// [`factor`](Self::factor) of weight `j` of the row hashed by [`row`](Self::row).
    #[inline]
    pub fn factor_in_row(&self, row: u64, j: usize) -> f32 {
        if self.threshold == 0 {
            return 1.0;
        }
        if ((splitmix(row ^ j as u64) >> 40) as u32) < self.threshold {
            0.0
        } else {
            self.scale
        }
    }
}

/// One round of SplitMix64's output function.
#[inline]
fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Which kernel computes a backward pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackwardKernel {
    /// The fused kernel when it supports the problem (softmax over keys), else the
    /// reference.
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
    /// Worker threads; `None` uses the current rayon pool. The result has the same
    /// bits whatever this is.
    pub threads: Option<usize>,
    /// Dropout applied in the forward pass, if any.
    pub dropout: Option<Dropout>,
    /// Instruction set for the fused kernel; `None` picks the best this CPU has.
    pub isa: Option<crate::kernels::Isa>,
}

/// Gradients of `sum(attention(q, k, v) ∘ dout)` with respect to `q`, `k` and `v`.
///
/// `out` and `lse` are what [`attention_with_lse`](crate::attention::attention_with_lse)
/// returned for the same inputs and options. Fully masked rows give zero gradients.
pub fn attention_backward(
    q: ArrayView4<'_, f32>,
    k: ArrayView4<'_, f32>,
    v: ArrayView4<'_, f32>,
    out: ArrayView4<'_, f32>,
    lse: ArrayView3<'_, f32>,
    dout: ArrayView4<'_, f32>,
    opts: &AttentionOptions<'_>,
) -> Result<AttentionGrads> {
    attention_backward_with(q, k, v, out, lse, dout, opts, &BackwardConfig::default())
}

/// [`attention_backward`] with an explicit kernel, thread count and dropout.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward_with(
    q: ArrayView4<'_, f32>,
    k: ArrayView4<'_, f32>,
    v: ArrayView4<'_, f32>,
    out: ArrayView4<'_, f32>,
    lse: ArrayView3<'_, f32>,
    dout: ArrayView4<'_, f32>,
    opts: &AttentionOptions<'_>,
    config: &BackwardConfig,
) -> Result<AttentionGrads> {
    let p = Problem::new(q, k, v, opts)?;
    let d = p.dims();
    let out_shape = [d.batch, d.heads, d.q_len, d.value_dim];
    if dout.shape() != out_shape {
        return Err(Error::shape(format!(
            "dout of shape {:?} must have the output's shape {out_shape:?}",
            dout.shape()
        )));
    }
    if out.shape() != out_shape {
        return Err(Error::shape(format!(
            "out of shape {:?} must be the forward output's shape {out_shape:?}",
            out.shape()
        )));
    }
    if lse.shape() != [d.batch, d.heads, d.q_len] {
        return Err(Error::shape(format!(
            "lse of shape {:?} must be [B, Hq, L] = {:?}",
            lse.shape(),
            [d.batch, d.heads, d.q_len]
        )));
    }
    let isa = crate::kernels::Isa::resolve(config.isa)?;
    let supported = fused::supports(&p);
    let use_fused = match config.kernel {
        BackwardKernel::Reference => false,
        BackwardKernel::Auto => supported,
        BackwardKernel::Fused if supported => true,
        BackwardKernel::Fused => {
            return Err(Error::value(
                "kernel: the fused backward supports only softmax over keys",
            ))
        }
    };
    let run = || {
        if use_fused {
            fused::run(&p, out, lse, dout, config.dropout.as_ref(), isa)
        } else {
            let g = reference::backward(
                &p,
                p.q.mapv(f64::from).view(),
                p.k.mapv(f64::from).view(),
                p.v.mapv(f64::from).view(),
                dout.mapv(f64::from).view(),
                config.dropout.as_ref(),
            );
            AttentionGrads {
                dq: g.dq.mapv(|x| x as f32),
                dk: g.dk.mapv(|x| x as f32),
                dv: g.dv.mapv(|x| x as f32),
            }
        }
    };
    crate::kernels::with_threads(config.threads, run)
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
                let isa = crate::kernels::Isa::resolve(None)?;
                let run = || crate::kernels::fused::run_with_dropout(&p, isa, Some(dr));
                return crate::kernels::with_threads(None, run);
            }
            let f = reference::forward(
                &p,
                p.q.mapv(f64::from).view(),
                p.k.mapv(f64::from).view(),
                p.v.mapv(f64::from).view(),
                Some(dr),
            );
            Ok((f.out.mapv(|x| x as f32), f.lse.mapv(|x| x as f32)))
        }
        _ => crate::attention::attention_with_lse(q, k, v, opts),
    }
}

/// A shape-only f32 view (every element is the same zero), for building a
/// [`Problem`] that carries the masks of an f64 computation.
pub(crate) fn shape_only(shape: [usize; 4]) -> ArrayView4<'static, f32> {
    static ZERO: [f32; 1] = [0.0];
    ArrayView4::from_shape(shape.strides([0; 4]), &ZERO[..])
        .expect("zero strides index one element")
}
