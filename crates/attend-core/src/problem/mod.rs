//! What an attention call asks for, independent of how it is computed: the
//! options ([`AttentionOptions`]), the validated call ([`Problem`]: shapes checked,
//! masks broadcast, scale resolved), the per-tile view of its masks
//! (`MaskTiles`, for the fused kernels) and dropout on its weights ([`Dropout`]).
//!
//! Every kernel takes a [`Problem`], so validation and mask semantics live in
//! exactly one place. This module is a leaf: it imports neither
//! [`crate::attention`] (the dispatch above the kernels) nor [`crate::kernels`]
//! (see docs/design.md, "Layers").

mod dropout;
mod mask_term;
mod mask_tiles;

pub use dropout::Dropout;
pub(crate) use mask_term::along;
pub(crate) use mask_tiles::{band_row, MaskTiles};

use ndarray::{Array4, ArrayD, ArrayView2, ArrayView4, ArrayViewD, Axis, IxDyn};
use num_traits::AsPrimitive;

use crate::{Error, Result};

/// How a causal mask lines up queries with keys when `L ≠ S`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Causal {
    /// Query `i` sees keys `j ≤ i` (PyTorch's `is_causal=True`).
    TopLeft,
    /// Query `i` sees keys `j ≤ i + S − L`: the last query sees every key
    /// (FlashAttention, KV-cache decoding).
    BottomRight,
}

/// The axis the softmax normalises over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SoftmaxAxis {
    /// Each query's weights over the keys sum to one (standard attention).
    #[default]
    Keys,
    /// Each key's weights over the queries sum to one (notebook 004's `softmax(dim=0)`).
    Queries,
}

/// Everything about an attention call except the tensors themselves.
///
/// All masks combine: a score is kept only if every mask keeps it.
#[derive(Clone, Debug, Default)]
pub struct AttentionOptions<'a> {
    /// Multiplies `q·k`; defaults to `1/√E`.
    pub scale: Option<f32>,
    /// Causal masking and its alignment.
    pub causal: Option<Causal>,
    /// Sliding window `(left, right)`: query `i` sees keys `j` with
    /// `i' − left ≤ j ≤ i' + right`, where `i'` is `i` aligned as `causal` says
    /// (bottom-right when `causal` is `None`, as in FlashAttention).
    pub window: Option<(usize, usize)>,
    /// Boolean mask broadcastable to `[B, Hq, L, S]`; `true` means attend.
    pub mask: Option<ArrayViewD<'a, bool>>,
    /// Additive mask broadcastable to `[B, Hq, L, S]`, added to the scaled scores.
    pub bias: Option<ArrayViewD<'a, f32>>,
    /// The additive mask in f64, for f64 tensors: the f64 reference adds it in
    /// place of `bias`, which must hold it rounded to f32 (its shape, and the −∞
    /// that hide keys, are `bias`'s for every rule; the f32 kernels read `bias`).
    pub bias_f64: Option<ArrayViewD<'a, f64>>,
    /// `[B, S]`, `true` marks a padding key that no query may attend to.
    /// (This is `nn.MultiheadAttention`'s `key_padding_mask` convention, the
    /// opposite of [`AttentionOptions::mask`].)
    pub key_padding: Option<ArrayView2<'a, bool>>,
    /// Normalise over keys (default) or over queries.
    pub softmax_axis: SoftmaxAxis,
    /// The precision of the products for f32 tensors (bf16 tensors are always
    /// computed in [`Precision::Bf16`]).
    pub precision: Precision,
}

/// How the products of an attention call are computed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    /// f32 products, f32 sums.
    #[default]
    F32,
    /// `q`, `k` and `v` rounded to bf16 (to nearest, ties to even), products of bf16
    /// numbers, f32 sums and softmax statistics, the weights rounded to bf16 once
    /// before they multiply `v` (PyTorch's autocast to bf16). For f32 tensors the
    /// output is the bf16 result widened back to f32.
    Bf16,
    /// A precision of dense layers only (`nn::Linear::for_inference_with`):
    /// weights quantized to int8 (symmetric, one scale per output), each input
    /// row to unsigned bytes with its own scale and zero point, products summed
    /// exactly in i32. Attention rejects it: its products stay f32 or bf16.
    Int8,
}

impl Precision {
    /// Every precision, in the order [`Precision::name`]'s errors list them.
    pub const ALL: [Precision; 3] = [Precision::F32, Precision::Bf16, Precision::Int8];

    /// Lower-case name: `f32`, `bf16` or `int8` (as `attend embed --precision`
    /// spells it).
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
            Precision::Int8 => "int8",
        }
    }

    /// The precision named `name` (as [`Precision::name`] spells it); an error
    /// listing the names otherwise.
    pub fn from_name(name: &str) -> Result<Precision> {
        Precision::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .ok_or_else(|| {
                Error::value(format!(
                    "unknown precision {name:?}; expected f32, bf16 or int8"
                ))
            })
    }
}

/// A checked attention call, ready for any kernel.
///
/// The element types are those of the tensors: `Q` the queries', `KV` the keys'
/// and values' (by default `Q`'s). The kernels take f32 or bf16 and the oracle that
/// judges them f64 ([`crate::kernels::reference`]), one type for all three;
/// decoding takes f32 queries against a bf16 cache (`Problem<'_, f32, bf16>`), so
/// that the queries keep their f32 bits. The masks are the caller's, in their own
/// types, whatever `Q` and `KV` are.
#[derive(Clone, Debug)]
pub struct Problem<'a, Q = f32, KV = Q> {
    /// Queries `[B, Hq, L, E]`.
    pub q: ArrayView4<'a, Q>,
    /// Keys `[B, Hkv, S, E]`.
    pub k: ArrayView4<'a, KV>,
    /// Values `[B, Hkv, S, Ev]`.
    pub v: ArrayView4<'a, KV>,
    /// Boolean mask broadcast to `[B, Hq, L, S]` (true = attend).
    pub mask: Option<ArrayView4<'a, bool>>,
    /// Additive mask broadcast to `[B, Hq, L, S]`.
    pub bias: Option<ArrayView4<'a, f32>>,
    /// The additive mask in f64 ([`AttentionOptions::bias_f64`]), broadcast alike.
    pub bias_f64: Option<ArrayView4<'a, f64>>,
    /// `[B, S]`, true = padding key.
    pub key_padding: Option<ArrayView2<'a, bool>>,
    /// The resolved scale.
    pub scale: f32,
    /// Causal alignment, if any.
    pub causal: Option<Causal>,
    /// Sliding window `(left, right)`, if any.
    pub window: Option<(usize, usize)>,
    /// Axis of the softmax.
    pub softmax_axis: SoftmaxAxis,
    /// Precision of the products.
    pub precision: Precision,
}

/// The dimensions of a problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    /// Batch size.
    pub batch: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Query length `L`.
    pub q_len: usize,
    /// Key length `S`.
    pub kv_len: usize,
    /// Query/key width `E`.
    pub head_dim: usize,
    /// Value width `Ev`.
    pub value_dim: usize,
}

impl Dims {
    /// The dimensions of a call on `q [B, Hq, L, E]`, `k [B, Hkv, S, E]` and
    /// `v [B, Hkv, S, Ev]`, checked as [`Problem::new`] checks them: with `Hq` a
    /// multiple of `Hkv` and the output and scores countable. It reads shapes only,
    /// so a caller that has no data yet (PyTorch's fake tensors, say) learns the
    /// same answer, or the same error, as the call itself would give.
    pub fn check(q: [usize; 4], k: [usize; 4], v: [usize; 4]) -> Result<Dims> {
        let [b, hq, l, e] = q;
        let [kb, hkv, s, ke] = k;
        let [vb, vh, vs, ev] = v;
        if kb != b || vb != b {
            return Err(Error::shape(format!(
                "batch sizes differ: q {q:?}, k {k:?}, v {v:?}"
            )));
        }
        if ke != e {
            return Err(Error::shape(format!(
                "q and k widths differ: q {q:?}, k {k:?}"
            )));
        }
        if vh != hkv || vs != s {
            return Err(Error::shape(format!(
                "k and v disagree on heads or length: k {k:?}, v {v:?}"
            )));
        }
        if hkv == 0 || !hq.is_multiple_of(hkv) {
            return Err(Error::shape(format!(
                "query heads ({hq}) must be a multiple of key/value heads ({hkv}): q {q:?}, k {k:?}"
            )));
        }
        // Every size a kernel computes from these dimensions is at most one of these
        // products (or the inputs' own), so kernels may multiply them unchecked.
        crate::limits::elements("attention output [B, Hq, L, Ev]", &[b, hq, l, ev])?;
        crate::limits::elements("attention scores [B, Hq, L, S]", &[b, hq, l, s])?;
        Ok(Dims {
            batch: b,
            heads: hq,
            kv_heads: hkv,
            q_len: l,
            kv_len: s,
            head_dim: e,
            value_dim: ev,
        })
    }

    /// The scores' shape, `[B, Hq, L, S]`, which every mask broadcasts to.
    pub fn scores(&self) -> [usize; 4] {
        [self.batch, self.heads, self.q_len, self.kv_len]
    }

    /// Checks that a mask (`name`) of `shape` broadcasts to [`Dims::scores`] as
    /// NumPy and PyTorch broadcast: at most four axes, aligned on the right, each
    /// 1 or the scores' own.
    pub fn check_mask(&self, name: &str, shape: &[usize]) -> Result<()> {
        let full = self.scores();
        let fits = shape.len() <= 4
            && shape
                .iter()
                .rev()
                .zip(full.iter().rev())
                .all(|(&m, &f)| m == 1 || m == f);
        if fits {
            return Ok(());
        }
        Err(mask_error(name, shape, full))
    }

    /// The scale `scale` asks for, `1/√E` when it is `None`; an error if it is
    /// not finite. In the tensors' float type: f32 for the kernels, f64 for the
    /// reference that runs in f64.
    pub fn scale<F>(&self, scale: Option<F>) -> Result<F>
    where
        F: num_traits::Float + std::fmt::Display + 'static,
        usize: AsPrimitive<F>,
    {
        match scale {
            Some(x) if !x.is_finite() => {
                Err(Error::value(format!("scale must be finite, got {x}")))
            }
            Some(x) => Ok(x),
            // With E = 0 every score is an empty sum, 0, whatever the scale; 1/√0
            // would make it 0 · ∞ = NaN in the kernels that scale after the sum.
            None if self.head_dim == 0 => Ok(F::one()),
            None => Ok(F::one() / self.head_dim.as_().sqrt()),
        }
    }
}

impl<'a, Q, KV> Problem<'a, Q, KV> {
    /// Checks shapes and options and broadcasts the masks.
    pub fn new<'q: 'a, 'k: 'a, 'v: 'a, 'o: 'a>(
        q: ArrayView4<'q, Q>,
        k: ArrayView4<'k, KV>,
        v: ArrayView4<'v, KV>,
        opts: &'a AttentionOptions<'o>,
    ) -> Result<Self> {
        // ndarray views are invariant in their lifetime; shorten them explicitly.
        let (q, k, v) = (q.reborrow(), k.reborrow(), v.reborrow());
        let d = Dims::check(q.dim().into(), k.dim().into(), v.dim().into())?;
        let mask = opts
            .mask
            .as_ref()
            .map(|m| broadcast("mask", m, &d))
            .transpose()?;
        let bias = opts
            .bias
            .as_ref()
            .map(|m| broadcast("bias", m, &d))
            .transpose()?;
        let bias_f64 = match (&opts.bias_f64, &opts.bias) {
            (None, _) => None,
            (Some(exact), Some(rounded)) if exact.shape() == rounded.shape() => {
                Some(broadcast("bias_f64", exact, &d)?)
            }
            (Some(exact), _) => {
                return Err(Error::value(format!(
                    "bias_f64 of shape {:?} needs bias, its rounding to f32, of the same shape",
                    exact.shape()
                )))
            }
        };
        if let Some(kp) = &opts.key_padding {
            if kp.dim() != (d.batch, d.kv_len) {
                return Err(Error::shape(format!(
                    "key_padding must be [B, S] = [{}, {}], got {:?}",
                    d.batch,
                    d.kv_len,
                    kp.shape()
                )));
            }
        }
        if opts.precision == Precision::Int8 {
            return Err(Error::Unsupported {
                kernel: "attention",
                reason: "computes in f32 or bf16; int8 is a precision of the dense layers",
            });
        }
        let scale = d.scale(opts.scale)?;
        Ok(Problem {
            q,
            k,
            v,
            mask,
            bias,
            bias_f64,
            key_padding: opts.key_padding.as_ref().map(|p| p.view()),
            scale,
            causal: opts.causal,
            window: opts.window,
            softmax_axis: opts.softmax_axis,
            precision: opts.precision,
        })
    }

    /// The same problem (shapes, masks, scale) on other tensors of the same shapes,
    /// for instance `self`'s rounded to another type.
    ///
    /// # Panics
    /// If a shape differs from `self`'s.
    pub fn with_tensors<'b, Q2, KV2>(
        &'b self,
        q: ArrayView4<'b, Q2>,
        k: ArrayView4<'b, KV2>,
        v: ArrayView4<'b, KV2>,
    ) -> Problem<'b, Q2, KV2> {
        assert!(
            q.shape() == self.q.shape()
                && k.shape() == self.k.shape()
                && v.shape() == self.v.shape(),
            "with_tensors needs the problem's shapes"
        );
        Problem {
            q,
            k,
            v,
            mask: self.mask.as_ref().map(|m| m.view()),
            bias: self.bias.as_ref().map(|m| m.view()),
            bias_f64: self.bias_f64.as_ref().map(|m| m.view()),
            key_padding: self.key_padding.as_ref().map(|m| m.view()),
            scale: self.scale,
            causal: self.causal,
            window: self.window,
            softmax_axis: self.softmax_axis,
            precision: self.precision,
        }
    }

    /// The problem's dimensions.
    pub fn dims(&self) -> Dims {
        let (batch, heads, q_len, head_dim) = self.q.dim();
        let (_, kv_heads, kv_len, _) = self.k.dim();
        Dims {
            batch,
            heads,
            kv_heads,
            q_len,
            kv_len,
            head_dim,
            value_dim: self.v.dim().3,
        }
    }

    /// Whether causality or a window cuts each query's keys to a band of its own.
    pub fn is_banded(&self) -> bool {
        self.causal.is_some() || self.window.is_some()
    }

    /// The range of keys `[lo, hi)` that causality and the window leave visible to
    /// query `i`; the other masks are applied per score on top of it.
    pub fn key_range(&self, i: usize) -> (usize, usize) {
        let kv_len = self.dims().kv_len;
        self.key_range_in(i, 0, kv_len)
    }

    /// [`key_range`](Self::key_range) for a shard: this problem's keys are keys
    /// `start..start + S` of a sequence of `total` keys, and causality and the window
    /// are aligned on that whole sequence. The range is in the shard's own indices.
    pub fn key_range_in(&self, i: usize, start: usize, total: usize) -> (usize, usize) {
        let Dims { q_len, kv_len, .. } = self.dims();
        let (lo, hi) = self.global_key_range(i, q_len, total);
        let lo = lo.clamp(start, start + kv_len) - start;
        let hi = hi.clamp(start, start + kv_len) - start;
        (lo, hi.max(lo))
    }

    fn global_key_range(&self, i: usize, q_len: usize, kv_len: usize) -> (usize, usize) {
        let Some((lo, hi)) = self.band_offsets(q_len, kv_len) else {
            return (0, kv_len);
        };
        let at = |offset: i128| (i as i128 + offset).clamp(0, kv_len as i128) as usize;
        let hi = at(hi);
        let lo = lo.map_or(0, at);
        (lo, hi.max(lo))
    }

    /// The causal/window band as offsets from each query: query `i` sees the keys
    /// `j` with `i + lo ≤ j < i + hi` (`lo` unbounded without a window), cut to
    /// `0..kv_len`; `None` where nothing bands the keys. The offsets do not depend
    /// on `i`, so whether query `i` sees key `j` depends only on `j − i` (for `j`
    /// inside `0..kv_len`): the fused kernel masks a tile's band with one row of
    /// terms read at a shifting offset (`band_row`). In i128: a window
    /// side may be any usize (usize::MAX means "unbounded"), and i64 arithmetic
    /// would wrap it into a negative width.
    pub(crate) fn band_offsets(&self, q_len: usize, kv_len: usize) -> Option<(Option<i128>, i128)> {
        if !self.is_banded() {
            return None;
        }
        // Where query 0's diagonal is, as a signed key index.
        let diag = match self.causal {
            Some(Causal::TopLeft) => 0,
            _ => kv_len as i128 - q_len as i128,
        };
        // Causal masking forbids every key right of the diagonal, whatever the window.
        let right = match (self.causal, self.window) {
            (Some(_), _) => 0,
            (None, Some((_, r))) => r as i128,
            (None, None) => unreachable!("handled above"),
        };
        Some((
            self.window.map(|(left, _)| diag - left as i128),
            diag + right + 1,
        ))
    }

    /// Whether the boolean mask and key padding keep score `(b, h, i, j)`.
    #[inline]
    pub fn keeps(&self, b: usize, h: usize, i: usize, j: usize) -> bool {
        self.mask.as_ref().is_none_or(|m| m[[b, h, i, j]])
            && self.key_padding.as_ref().is_none_or(|p| !p[[b, j]])
    }

    /// The additive mask's value at `(b, h, i, j)` (0 without one).
    #[inline]
    pub fn bias_at(&self, b: usize, h: usize, i: usize, j: usize) -> f32 {
        self.bias.as_ref().map_or(0.0, |m| m[[b, h, i, j]])
    }

    /// The additive mask's value at `(b, h, i, j)` in f64: [`Problem::bias_f64`]'s
    /// where there is one, else [`Problem::bias_at`]'s (what the f64 reference adds).
    #[inline]
    pub fn exact_bias_at(&self, b: usize, h: usize, i: usize, j: usize) -> f64 {
        match &self.bias_f64 {
            Some(m) => m[[b, h, i, j]],
            None => f64::from(self.bias_at(b, h, i, j)),
        }
    }

    /// Whether query `i` of `(b, h)` sees key `j`: inside its causal/window band,
    /// kept by the boolean mask and key padding, and with an additive term other
    /// than −∞. A key a query does not see adds nothing to its row, neither score
    /// nor value, whatever it holds (docs/design.md, "NaN").
    #[inline]
    pub fn sees(&self, b: usize, h: usize, i: usize, j: usize) -> bool {
        let (lo, hi) = self.key_range(i);
        (lo..hi).contains(&j)
            && self.keeps(b, h, i, j)
            && self.bias_at(b, h, i, j) != f32::NEG_INFINITY
    }
}

/// Per-tile views of the masks, for the tiled kernels.
///
/// They restate [`Problem::key_range`], [`Problem::keeps`] and [`Problem::bias_at`]
/// for a block of queries and keys at once, so a tiled kernel decides which tiles to
/// skip and what to add to each score without re-deriving any mask rule.
impl<Q, KV> Problem<'_, Q, KV> {
    /// Whether a boolean mask, additive mask or key padding is present, so that
    /// scores must be masked one by one even inside the causal/window band.
    pub fn has_elementwise_masks(&self) -> bool {
        self.mask.is_some() || self.bias.is_some() || self.key_padding.is_some()
    }

    /// The union `[lo, hi)` of [`Problem::key_range`] over queries `i0..i1`
    /// (`i0 < i1`). `key_range` is monotone in `i` (both ends move right with the
    /// diagonal), so the union is the first query's `lo` to the last query's `hi`.
    pub fn block_key_range(&self, i0: usize, i1: usize) -> (usize, usize) {
        debug_assert!(i0 < i1);
        let (lo, _) = self.key_range(i0);
        let (_, hi) = self.key_range(i1 - 1);
        (lo, hi.max(lo))
    }

    /// Whether every query in `i0..i1` sees every key in `j0..j1` as far as causality
    /// and the window go (`i0 < i1`, `j0 < j1`); the boolean masks come on top.
    pub fn tile_in_band(&self, i0: usize, i1: usize, j0: usize, j1: usize) -> bool {
        debug_assert!(i0 < i1 && j0 < j1);
        // By monotonicity, the last query has the largest `lo` and the first the
        // smallest `hi`.
        self.key_range(i1 - 1).0 <= j0 && self.key_range(i0).1 >= j1
    }
}

fn mask_error(name: &str, shape: &[usize], full: [usize; 4]) -> Error {
    Error::shape(format!(
        "{name} of shape {shape:?} does not broadcast to [B, Hq, L, S] = {full:?}"
    ))
}

/// A gradient of the broadcast scores `[B, Hq, L, S]` summed back to `shape`, an
/// additive mask's shape as the caller gave it: over the leading axes it lacks
/// and the axes where it has 1 (the reverse of broadcasting it). Sums in the
/// gradient's own type, in index order.
pub fn sum_to_mask_shape<T: Clone + num_traits::Zero>(
    full: Array4<T>,
    shape: &[usize],
) -> ArrayD<T> {
    let mut g = full.into_dyn();
    let lead = g.ndim() - shape.len();
    for _ in 0..lead {
        g = g.sum_axis(Axis(0));
    }
    for (axis, &n) in shape.iter().enumerate() {
        if n == 1 && g.shape()[axis] != 1 {
            g = g.sum_axis(Axis(axis)).insert_axis(Axis(axis));
        }
    }
    g
}

fn broadcast<'a, T>(name: &str, m: &'a ArrayViewD<'_, T>, d: &Dims) -> Result<ArrayView4<'a, T>> {
    d.check_mask(name, m.shape())?;
    // check_mask accepts exactly the shapes that ndarray broadcasts to four axes.
    m.broadcast(IxDyn(&d.scores()))
        .and_then(|view| view.into_dimensionality().ok())
        .ok_or_else(|| mask_error(name, m.shape(), d.scores()))
}
