//! The attention functions, forward and backward: validation, then the choice of
//! kernel, instruction set and threads, side by side above the kernels
//! (docs/design.md, "Layers").
//!
//! Inputs follow PyTorch's `scaled_dot_product_attention`: `q [B, Hq, L, E]`,
//! `k [B, Hkv, S, E]`, `v [B, Hkv, S, Ev]`, with `Hq` a multiple of `Hkv`
//! (grouped-query attention). Views may have any strides, so a `[B, T, H, D]` buffer
//! is passed as `view.permuted_axes([0, 2, 1, 3])` without a copy.
//!
//! ```
//! use attend_core::attention::{attention, AttentionOptions, Causal};
//! use ndarray::Array4;
//!
//! let q = Array4::<f32>::ones((1, 2, 3, 4));
//! let k = Array4::<f32>::ones((1, 2, 5, 4));
//! let v = Array4::<f32>::ones((1, 2, 5, 6));
//! let opts = AttentionOptions { causal: Some(Causal::BottomRight), ..Default::default() };
//! let out = attention(q.view(), k.view(), v.view(), &opts)?;
//! assert_eq!(out.shape(), &[1, 2, 3, 6]);
//! # Ok::<(), attend_core::Error>(())
//! ```

mod backward;
mod bf16;

pub use crate::config::{Config, Exec, Kernel, DECODE_MAX_QUERIES};
pub use crate::element::Element;
pub use crate::kernels::backward::AttentionGrads;
pub use crate::kernels::lse::LogSumExp;
pub use crate::problem::{
    AttentionOptions, Causal, Dims, Dropout, Precision, Problem, SoftmaxAxis,
};
pub use backward::{
    attention_backward, attention_backward_with, attention_train, BackwardConfig, BackwardKernel,
    Saved,
};

use ndarray::{Array3, Array4, ArrayView3, ArrayView4};

use crate::element::sealed::{Computed, FusedBackward, Sealed};
use crate::element::Dtype;
use crate::isa::IsaToken;
use crate::kernels::backward::fused as backward_kernel;
use crate::kernels::{decode, fused, reference};
use crate::{Error, Result};

/// Scaled dot-product attention: `softmax(scale · q kᵀ + masks) v`.
///
/// Rows whose keys are all masked give zeros. Returns `[B, Hq, L, Ev]` in the
/// inputs' element type.
pub fn attention<T: Element>(
    q: ArrayView4<'_, T>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    opts: &AttentionOptions<'_>,
) -> Result<Array4<T>> {
    attention_with_lse(q, k, v, opts).map(|(out, _)| out)
}

/// [`attention`] that also returns the natural log-sum-exp of each query's
/// scaled, masked scores, `[B, Hq, L]` (−∞ for fully masked rows).
pub fn attention_with_lse<T: Element>(
    q: ArrayView4<'_, T>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    opts: &AttentionOptions<'_>,
) -> Result<(Array4<T>, Array3<f32>)> {
    attention_with(q, k, v, opts, &Config::default())
}

/// [`attention_with_lse`] with an explicit [`Config`].
pub fn attention_with<T: Element>(
    q: ArrayView4<'_, T>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    opts: &AttentionOptions<'_>,
    config: &Config,
) -> Result<(Array4<T>, Array3<f32>)> {
    attention_with_lse_parts(q, k, v, opts, config).map(|(out, lse)| (out, lse.value))
}

/// [`attention_with`] that also returns what rounding the log-sum-exp to f32 left
/// out ([`LogSumExp::residual`]): what a backward needs to recompute the weights as
/// exactly as the forward had them ([`Saved::with_lse_residual`]).
pub fn attention_with_lse_parts<T: Element>(
    q: ArrayView4<'_, T>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    opts: &AttentionOptions<'_>,
    config: &Config,
) -> Result<(Array4<T>, LogSumExp)> {
    let problem = Problem::new(q, k, v, opts)?;
    let (out, [value, residual]) = T::compute(&problem, config)?;
    Ok((out, LogSumExp { value, residual }))
}

/// Whether [`Kernel::Auto`] runs the decode kernel on `q_len` queries of element
/// type `dtype` against `kv_len` keys, rather than the fused kernel.
///
/// The decode kernel's work grows with the queries, each reading every key; the
/// fused kernel's with the keys times a unit of 32 or 64 queries, however few of
/// them there are. So decoding pays only for very few queries against many keys:
/// up to three in f32 and one in bf16 (whose decode kernel widens every key row it
/// reads), each with at least 32 keys. `examples/kernel_choice_bench` times both
/// (f32 and bf16, heads of 32 and 64, 1 to 16 queries against 16 to 4,096 keys);
/// on an AMD EPYC Zen 5, 2 threads, past these bounds the fused kernel was level
/// or faster (12 queries against 16 keys, 12 heads of 32: 8.0 µs against the
/// decode kernel's 24.4 µs), within them the decode kernel (one query against
/// 4,096 keys: 119 µs against 283 µs). The one miss: bf16 with one to three
/// queries against 16 keys, where decoding was 3-5 µs faster.
///
/// ```
/// use attend_core::attention::auto_decodes;
/// use attend_core::element::Dtype;
///
/// assert!(auto_decodes(Dtype::F32, 1, 4096)); // a decoding step
/// assert!(!auto_decodes(Dtype::F32, 12, 12)); // a short text's self-attention
/// assert!(!auto_decodes(Dtype::Bf16, 2, 4096));
/// ```
pub fn auto_decodes(dtype: Dtype, q_len: usize, kv_len: usize) -> bool {
    let most = match dtype {
        Dtype::F32 => 3,
        Dtype::Bf16 => 1,
    };
    q_len <= most && q_len * 32 <= kv_len
}

/// The kernel `config` asks for, checked against what the kernels support.
fn choose_kernel<T: Element>(problem: &Problem<'_, T>, kernel: Kernel) -> Result<Kernel> {
    let dims = problem.dims();
    let decodes = auto_decodes(T::DTYPE, dims.q_len, dims.kv_len);
    Ok(match kernel {
        Kernel::Reference => Kernel::Reference,
        Kernel::Auto if decodes && decode::supports(problem) => Kernel::Decode,
        Kernel::Auto if fused::supports(problem) => Kernel::Fused,
        Kernel::Auto => Kernel::Reference,
        Kernel::Fused if fused::supports(problem) => Kernel::Fused,
        Kernel::Fused => {
            return Err(Error::Unsupported {
                kernel: "fused",
                reason: "supports only softmax over keys and value width > 0",
            })
        }
        Kernel::Decode if decode::supports(problem) => Kernel::Decode,
        Kernel::Decode => {
            return Err(Error::Unsupported {
                kernel: "decode",
                reason: "supports only softmax over keys",
            })
        }
    })
}

impl Sealed for f32 {
    fn compute(problem: &Problem<'_>, config: &Config) -> Result<Computed<f32>> {
        if problem.precision == Precision::Bf16 {
            return bf16::compute_rounded(problem, config);
        }
        let isa = config.exec.token()?;
        let which = choose_kernel(problem, config.kernel)?;
        let run = || match which {
            Kernel::Fused => fused::run(problem, isa, None),
            Kernel::Decode => {
                let kv_len = problem.dims().kv_len;
                decode::run(problem, decode::KeySpan::whole(kv_len), isa)
            }
            Kernel::Reference | Kernel::Auto => {
                let trace = reference::run(problem);
                (trace.output, trace.lse)
            }
        };
        let (out, lse) = config.exec.install(run)?;
        Ok((out, [lse.value, lse.residual]))
    }

    fn fused_backward(
        p: &Problem<'_, Self>,
        out: ArrayView4<'_, Self>,
        lse: (ArrayView3<'_, f32>, Option<ArrayView3<'_, f32>>),
        dout: ArrayView4<'_, Self>,
        dropout: Option<&Dropout>,
        want_ds: bool,
        isa: IsaToken,
    ) -> FusedBackward<Self> {
        backward_kernel::run(p, out, lse, dout, dropout, want_ds, isa)
    }
}
