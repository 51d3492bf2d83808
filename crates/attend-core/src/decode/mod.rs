//! Decoding: short queries against long key/value caches, and attention over key
//! shards whose partial results merge exactly.
//!
//! * [`decode_attention`] runs the split-KV kernel ([`crate::kernels::decode`]):
//!   fast for 1 to 16 queries, any number of keys, grouped-query aware.
//! * [`attention_partial`] / [`attention_partial_at`] compute the output and
//!   log-sum-exp of the queries over one shard of the keys; [`merge_partials`]
//!   combines shards into the attention over all of them, exact up to rounding
//!   (ring attention, flash-decoding across workers).
//!
//! The queries are f32; the keys and values f32 or bf16 (a bf16 KV cache: the rows
//! are widened exactly as the kernel loads them, and everything after is f32). The
//! outputs and log-sum-exps are f32 either way, so partials of bf16 shards merge
//! without a rounding in between. bf16 queries are widened first (exact):
//! `q.mapv(bf16::to_f32)`.
//!
//! ```
//! use attend_core::attention::{attention, AttentionOptions};
//! use attend_core::decode::{attention_partial, merge_partials};
//! use ndarray::{s, Array4};
//!
//! let q = Array4::<f32>::from_shape_fn((1, 2, 1, 4), |(_, h, _, e)| (h + e) as f32 * 0.1);
//! let k = Array4::<f32>::from_shape_fn((1, 2, 10, 4), |(_, h, j, e)| ((h * j + e) % 5) as f32 * 0.2);
//! let v = k.clone();
//! let opts = AttentionOptions::default();
//! let parts = [
//!     attention_partial(q.view(), k.slice(s![.., .., ..4, ..]), v.slice(s![.., .., ..4, ..]), &opts)?,
//!     attention_partial(q.view(), k.slice(s![.., .., 4.., ..]), v.slice(s![.., .., 4.., ..]), &opts)?,
//! ];
//! let merged = merge_partials(&parts)?;
//! let full = attention(q.view(), k.view(), v.view(), &opts)?;
//! assert!(merged.output.iter().zip(&full).all(|(a, b)| (a - b).abs() < 1e-6));
//! # Ok::<(), attend_core::Error>(())
//! ```

use ndarray::{Array3, Array4, ArrayView4};

use crate::attention::{AttentionOptions, Problem, SoftmaxAxis};
use crate::element::Element;
use crate::kernels::decode::{self as kernel, KeySpan};
use crate::kernels::merge::{merge_softmax_parts, SoftmaxPart};
use crate::{Error, Result};

pub use crate::kernels::Isa;

/// How to run the decode kernel: only where it runs (the one run configuration,
/// [`Exec`](crate::attention::Exec)).
pub type DecodeConfig = crate::config::Exec;

/// The attention of some queries over one shard of the keys: the output as if the
/// shard were all the keys, and the log-sum-exp of the scores, which tells how much
/// weight the shard carries when merged with others.
#[derive(Clone, Debug, PartialEq)]
pub struct Partial {
    /// `[B, Hq, L, Ev]`, normalised over the shard's keys (0 where none is visible).
    pub output: Array4<f32>,
    /// `[B, Hq, L]`, natural log-sum-exp of the shard's scaled, masked scores
    /// (−∞ where no key is visible).
    pub lse: Array3<f32>,
}

/// Attention through the split-KV decode kernel: like
/// [`attention_with_lse`](crate::attention::attention_with_lse), fastest for 1 to
/// 16 queries. Softmax over queries is not supported (it does not split over keys).
/// `k` and `v` may be f32 or bf16; the output is f32.
pub fn decode_attention<T: Element>(
    q: ArrayView4<'_, f32>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    opts: &AttentionOptions<'_>,
    config: &DecodeConfig,
) -> Result<(Array4<f32>, Array3<f32>)> {
    let kv_len = k.dim().2;
    let part = run_shard(q, k, v, opts, KeySpan::whole(kv_len), config)?;
    Ok((part.output, part.lse))
}

/// The attention of `q` over the keys `k`, `v` alone, with its log-sum-exp, ready
/// to be merged with other shards by [`merge_partials`].
///
/// Masks (`mask`, `bias`, `key_padding`) are the shard's: they broadcast to
/// `[B, Hq, L, S_shard]`. Causal masks and windows treat the shard as the whole
/// sequence; use [`attention_partial_at`] to align them on a longer one.
pub fn attention_partial<T: Element>(
    q: ArrayView4<'_, f32>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    opts: &AttentionOptions<'_>,
) -> Result<Partial> {
    let kv_len = k.dim().2;
    run_shard(
        q,
        k,
        v,
        opts,
        KeySpan::whole(kv_len),
        &DecodeConfig::default(),
    )
}

/// [`attention_partial`] for a shard holding keys `start..start + S_shard` of a
/// sequence of `total` keys: causal masks and windows are aligned on the whole
/// sequence (bottom-right alignment puts the last query at key `total − 1`).
pub fn attention_partial_at<T: Element>(
    q: ArrayView4<'_, f32>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    opts: &AttentionOptions<'_>,
    start: usize,
    total: usize,
) -> Result<Partial> {
    attention_partial_with(q, k, v, opts, start, total, &DecodeConfig::default())
}

/// [`attention_partial_at`] with an explicit [`DecodeConfig`].
pub fn attention_partial_with<T: Element>(
    q: ArrayView4<'_, f32>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    opts: &AttentionOptions<'_>,
    start: usize,
    total: usize,
    config: &DecodeConfig,
) -> Result<Partial> {
    let len = k.dim().2;
    if start.checked_add(len).is_none_or(|end| end > total) {
        return Err(Error::value(format!(
            "shard of {len} keys at start {start} does not fit in a sequence of total {total} keys (k {:?})",
            k.shape()
        )));
    }
    run_shard(q, k, v, opts, KeySpan { start, total }, config)
}

fn run_shard<T: Element>(
    q: ArrayView4<'_, f32>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    opts: &AttentionOptions<'_>,
    span: KeySpan,
    config: &DecodeConfig,
) -> Result<Partial> {
    // f32 queries against keys and values of `T`: the queries keep their f32 bits.
    let problem = Problem::new(q, k, v, opts)?;
    if problem.softmax_axis != SoftmaxAxis::Keys {
        return Err(Error::value(
            "softmax_axis: decoding and partial attention need softmax over keys (Queries does not split over key shards)",
        ));
    }
    let isa = config.token()?;
    let run = || kernel::run(&problem, span, isa);
    let (output, lse) = config.install(run)?;
    Ok(Partial {
        output,
        lse: lse.value,
    })
}

/// Merges the partial results of disjoint key shards into the attention over all
/// of them: `lse = log Σ exp(lse_i)`, `output = Σ exp(lse_i − lse) · output_i`.
///
/// Exact up to rounding; the same parts in the same order give the same bits.
/// Shards with no visible key (lse −∞) weigh nothing; if no shard has one, the
/// output is 0 and the lse −∞.
pub fn merge_partials(parts: &[Partial]) -> Result<Partial> {
    let first = parts
        .first()
        .ok_or_else(|| Error::value("merge_partials: the list of partial results is empty"))?;
    let shape = first.output.shape();
    for (n, p) in parts.iter().enumerate() {
        if p.output.shape() != shape {
            return Err(Error::shape(format!(
                "merge_partials: part {n} has output shape {:?} but part 0 has {:?}",
                p.output.shape(),
                shape
            )));
        }
        if p.lse.shape() != &shape[..3] {
            return Err(Error::shape(format!(
                "merge_partials: part {n} has lse shape {:?} but its output {:?} needs {:?}",
                p.lse.shape(),
                p.output.shape(),
                &shape[..3]
            )));
        }
    }
    let (b, h, l, ev) = first.output.dim();
    let mut output = Array4::zeros((b, h, l, ev));
    let mut lse = Array3::from_elem((b, h, l), f32::NEG_INFINITY);
    let mut acc = vec![0.0f64; ev];
    for ((bi, hi, i), out_lse) in lse.indexed_iter_mut() {
        let row = parts.iter().map(|p| SoftmaxPart {
            top: p.lse[[bi, hi, i]] as f64,
            log_sum: 0.0,
            scale: 1.0,
            output: p.output.slice(ndarray::s![bi, hi, i, ..]),
        });
        let out = output.slice_mut(ndarray::s![bi, hi, i, ..]);
        let (top, log_sum) = merge_softmax_parts(row, &mut acc, out);
        *out_lse = (top + log_sum) as f32;
    }
    Ok(Partial { output, lse })
}
