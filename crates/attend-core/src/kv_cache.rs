//! The key/value cache of incremental decoding.
//!
//! Each layer keeps its keys `[B, Hkv, ·, E]` and values `[B, Hkv, ·, Ev]` in one
//! buffer per tensor whose capacity doubles when full, so appending `n` steps
//! copies `O(n)` floats in total, not `O(n²)`. With a sliding window of `w` keys
//! the buffer is a ring that keeps only the most recent keys (`w − 1` plus the
//! latest step), so memory stays bounded however long the generation runs.
//!
//! The cache stores f32 (the default) or bf16: a `LayerCache<bf16>` holds half
//! the bytes, and decoding, which reads every cached byte once per step, reads half
//! as many. Appended f32 steps are rounded to bf16 (to nearest, ties to even, as
//! PyTorch's `tensor.to(torch.bfloat16)`); the queries stay f32, and the kernel
//! widens the bf16 rows exactly as it loads them.
//!
//! ```
//! use attend_core::kv_cache::{CacheShape, LayerCache};
//! use ndarray::Array4;
//!
//! let shape = CacheShape::new(1, 2, 4); // B, Hkv, E (values as wide as the keys)
//! let mut cache: LayerCache = LayerCache::new(shape); // f32, the default
//! for _ in 0..3 {
//!     let k = Array4::<f32>::ones((1, 2, 1, 4));
//!     cache.append(k.view(), k.view())?;
//! }
//! let q = Array4::<f32>::ones((1, 2, 1, 4));
//! let (out, _lse) = cache.attend(q.view(), None, &Default::default())?;
//! assert_eq!(out.shape(), &[1, 2, 1, 4]);
//! # Ok::<(), attend_core::Error>(())
//! ```
//!
//! A bf16 cache:
//!
//! ```
//! use attend_core::element::bf16;
//! use attend_core::kv_cache::{CacheShape, LayerCache};
//! use ndarray::Array4;
//!
//! let mut cache = LayerCache::<bf16>::new(CacheShape::new(1, 2, 4));
//! let k = Array4::<f32>::from_elem((1, 2, 1, 4), 1.0 + 1.0 / 256.0);
//! cache.append(k.view(), k.view())?; // rounded to bf16: 1 + 2^-8 is a tie, to 1
//! let q = Array4::<f32>::ones((1, 2, 1, 4));
//! let (out, _lse) = cache.attend(q.view(), None, &Default::default())?;
//! assert_eq!(out[[0, 1, 0, 3]], 1.0);
//! # Ok::<(), attend_core::Error>(())
//! ```

use std::any::Any;

use ndarray::{s, Array3, Array4, ArrayView4, CowArray, Ix4};

use crate::attention::{
    attention_with, auto_decodes, AttentionOptions, Causal, Config, Kernel, DECODE_MAX_QUERIES,
};
use crate::decode::{
    attention_partial_with, decode_attention, merge_partials, DecodeConfig, Partial,
};
use crate::element::{Dtype, Element};
use crate::{Error, Result};

/// What a cache holds at each position: `batch` sequences of `kv_heads` heads, each
/// a key of width `head_dim` and a value of width `value_dim`.
///
/// [`CacheShape::new`] makes the values as wide as the keys, the usual case, and
/// [`with_value_dim`](Self::with_value_dim) says otherwise; the fields are public,
/// so a literal names every width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheShape {
    /// Sequences in the batch, `B`.
    pub batch: usize,
    /// Key/value heads, `Hkv`.
    pub kv_heads: usize,
    /// Key width per head, `E`.
    pub head_dim: usize,
    /// Value width per head, `Ev`.
    pub value_dim: usize,
}

impl CacheShape {
    /// `batch` sequences of `kv_heads` heads whose keys and values are both
    /// `head_dim` wide.
    pub fn new(batch: usize, kv_heads: usize, head_dim: usize) -> Self {
        CacheShape {
            batch,
            kv_heads,
            head_dim,
            value_dim: head_dim,
        }
    }

    /// The same shape with values `value_dim` wide.
    pub fn with_value_dim(self, value_dim: usize) -> Self {
        CacheShape { value_dim, ..self }
    }
}

/// The caches of every layer of a model, holding `T` (`f32`, the default, or bf16).
#[derive(Clone, Debug)]
pub struct KvCache<T: Element = f32> {
    layers: Vec<LayerCache<T>>,
}

impl<T: Element> KvCache<T> {
    /// `layers` empty caches of `shape` that keep every position.
    ///
    /// The element type comes from the context, or is named where nothing else fixes
    /// it: `KvCache::<bf16>::new(..)`, `KvCache::<f32>::new(..)`. (The default, f32,
    /// applies where the type is written, as in `let c: KvCache = KvCache::new(..)`,
    /// not to the inference of a call.)
    pub fn new(layers: usize, shape: CacheShape) -> Self {
        KvCache {
            layers: (0..layers).map(|_| LayerCache::new(shape)).collect(),
        }
    }

    /// `layers` empty caches of `shape`, each a sliding window of `window` keys
    /// (see [`LayerCache::windowed`]).
    pub fn windowed(layers: usize, shape: CacheShape, window: usize) -> Result<Self> {
        Ok(KvCache {
            layers: (0..layers)
                .map(|_| LayerCache::windowed(shape, window))
                .collect::<Result<_>>()?,
        })
    }

    /// Number of layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Layer `i`'s cache.
    pub fn layer(&self, i: usize) -> Result<&LayerCache<T>> {
        let n = self.layers.len();
        self.layers.get(i).ok_or_else(|| {
            Error::value(format!("layer {i} out of range: the cache has {n} layers"))
        })
    }

    /// Layer `i`'s cache, to append to.
    pub fn layer_mut(&mut self, i: usize) -> Result<&mut LayerCache<T>> {
        let n = self.layers.len();
        self.layers.get_mut(i).ok_or_else(|| {
            Error::value(format!("layer {i} out of range: the cache has {n} layers"))
        })
    }

    /// Forgets every position of every layer, keeping the memory.
    pub fn clear(&mut self) {
        self.layers.iter_mut().for_each(LayerCache::clear);
    }
}

/// One layer's keys and values, stored as `T` (`f32`, the default, or bf16).
#[derive(Clone, Debug)]
pub struct LayerCache<T: Element = f32> {
    shape: CacheShape,
    window: Option<usize>,
    /// Rows per `(b, h)` in the buffers.
    cap: usize,
    /// Positions appended so far; position `p` lives in row `p % cap`.
    len: usize,
    /// `[B, Hkv, cap, E]`.
    k: Vec<T>,
    /// `[B, Hkv, cap, Ev]`.
    v: Vec<T>,
}

impl<T: Element> LayerCache<T> {
    /// An empty cache of `shape` that keeps every position.
    ///
    /// The element type comes from the context, or is named where nothing else fixes
    /// it: `LayerCache::<bf16>::new(shape)`, `LayerCache::<f32>::new(shape)`. (The
    /// default, f32, applies where the type is written, as in `let c: LayerCache =
    /// LayerCache::new(shape)`, not to the inference of a call.)
    pub fn new(shape: CacheShape) -> Self {
        LayerCache {
            shape,
            window: None,
            cap: 0,
            len: 0,
            k: Vec::new(),
            v: Vec::new(),
        }
    }

    /// An empty cache of `shape` for sliding-window attention: each query sees
    /// itself and the `window − 1` keys before it (the window `(window − 1, 0)` of
    /// [`AttentionOptions::window`]), and older keys are dropped. An error if
    /// `window` is 0.
    pub fn windowed(shape: CacheShape, window: usize) -> Result<Self> {
        if window == 0 {
            return Err(Error::value("window must be at least 1 key, got 0"));
        }
        let mut c = Self::new(shape);
        c.window = Some(window);
        Ok(c)
    }

    /// What the cache holds at each position.
    pub fn shape(&self) -> CacheShape {
        self.shape
    }

    /// Sequences in the batch.
    pub fn batch(&self) -> usize {
        self.shape.batch
    }

    /// Key/value heads.
    pub fn kv_heads(&self) -> usize {
        self.shape.kv_heads
    }

    /// Key width per head.
    pub fn head_dim(&self) -> usize {
        self.shape.head_dim
    }

    /// Value width per head.
    pub fn value_dim(&self) -> usize {
        self.shape.value_dim
    }

    /// Positions appended so far (including any a window has dropped).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing has been appended.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The sliding window, if any.
    pub fn window(&self) -> Option<usize> {
        self.window
    }

    /// Positions still held: all of them, or the most recent ones with a window.
    pub fn retained(&self) -> usize {
        self.len.min(self.cap)
    }

    /// Rows allocated per sequence and head.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Forgets every position, keeping the memory.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Appends the keys `k [B, Hkv, T, E]` and values `v [B, Hkv, T, Ev]` of `T`
    /// new positions, f32 or bf16, rounded to the cache's element type (to nearest,
    /// ties to even; exact when the types are the same).
    pub fn append<S: Element>(&mut self, k: ArrayView4<'_, S>, v: ArrayView4<'_, S>) -> Result<()> {
        let (b, h, t, e) = k.dim();
        let (vb, vh, vt, ev) = v.dim();
        let CacheShape {
            batch,
            kv_heads,
            head_dim,
            value_dim,
        } = self.shape;
        let want = format!("[B, Hkv, T, E] = [{batch}, {kv_heads}, T, {head_dim}]");
        if (b, h, e) != (batch, kv_heads, head_dim) {
            return Err(Error::shape(format!(
                "append: k {:?} does not fit the cache's {want}",
                k.shape()
            )));
        }
        if (vb, vh, ev) != (batch, kv_heads, value_dim) {
            return Err(Error::shape(format!(
                "append: v {:?} does not fit the cache's [B, Hkv, T, Ev] = [{batch}, {kv_heads}, T, {value_dim}]",
                v.shape(),
            )));
        }
        if vt != t {
            return Err(Error::shape(format!(
                "append: k {:?} and v {:?} hold different numbers of positions",
                k.shape(),
                v.shape()
            )));
        }
        let needed = match self.window {
            None => self.len + t,
            // The new queries each see `w − 1` earlier keys.
            Some(w) => (w - 1 + t).min(self.len + t),
        };
        if needed > self.cap {
            let new_cap = match self.window {
                None => needed.max(2 * self.cap).max(16),
                Some(w) => needed.max(w),
            };
            self.grow(new_cap);
        }
        for p in 0..t {
            let row = (self.len + p) % self.cap;
            for bi in 0..b {
                for hi in 0..h {
                    let at = (bi * h + hi) * self.cap + row;
                    let kd = &mut self.k[at * e..(at + 1) * e];
                    for (x, &y) in kd.iter_mut().zip(k.slice(s![bi, hi, p, ..])) {
                        *x = T::from_f32(y.to_f32());
                    }
                    let vd = &mut self.v[at * ev..(at + 1) * ev];
                    for (x, &y) in vd.iter_mut().zip(v.slice(s![bi, hi, p, ..])) {
                        *x = T::from_f32(y.to_f32());
                    }
                }
            }
        }
        self.len += t;
        Ok(())
    }

    /// Reallocates to `new_cap` rows, keeping the retained positions.
    fn grow(&mut self, new_cap: usize) {
        let (bh, e, ev) = (
            self.shape.batch * self.shape.kv_heads,
            self.shape.head_dim,
            self.shape.value_dim,
        );
        let mut k = vec![T::default(); bh * new_cap * e];
        let mut v = vec![T::default(); bh * new_cap * ev];
        let kept = self.retained();
        for pos in self.len - kept..self.len {
            let (from, to) = (pos % self.cap.max(1), pos % new_cap);
            for x in 0..bh {
                let (src, dst) = (x * self.cap + from, x * new_cap + to);
                k[dst * e..(dst + 1) * e].copy_from_slice(&self.k[src * e..(src + 1) * e]);
                v[dst * ev..(dst + 1) * ev].copy_from_slice(&self.v[src * ev..(src + 1) * ev]);
            }
        }
        self.k = k;
        self.v = v;
        self.cap = new_cap;
    }

    /// The retained keys and values as at most two views `[B, Hkv, n, ·]` in
    /// position order (a ring buffer wraps around once), with the index of each
    /// view's first key among the retained ones.
    pub fn segments(&self) -> Vec<(usize, ArrayView4<'_, T>, ArrayView4<'_, T>)> {
        self.segments_of(&self.k, &self.v)
    }

    /// [`segments`](Self::segments) of buffers `k` and `v` laid out as the cache's
    /// own (the cache's buffers, or the same buffers seen as another type).
    fn segments_of<'a, U>(
        &self,
        k: &'a [U],
        v: &'a [U],
    ) -> Vec<(usize, ArrayView4<'a, U>, ArrayView4<'a, U>)> {
        let kept = self.retained();
        if kept == 0 {
            return Vec::new();
        }
        let full_k = ArrayView4::from_shape(
            (
                self.shape.batch,
                self.shape.kv_heads,
                self.cap,
                self.shape.head_dim,
            ),
            k,
        )
        .expect("buffer matches its shape");
        let full_v = ArrayView4::from_shape(
            (
                self.shape.batch,
                self.shape.kv_heads,
                self.cap,
                self.shape.value_dim,
            ),
            v,
        )
        .expect("buffer matches its shape");
        let first = (self.len - kept) % self.cap;
        let mut out = Vec::with_capacity(2);
        let end = (first + kept).min(self.cap);
        out.push((
            0,
            full_k.slice_move(s![.., .., first..end, ..]),
            full_v.slice_move(s![.., .., first..end, ..]),
        ));
        if end - first < kept {
            let rest = kept - (end - first);
            out.push((
                end - first,
                full_k.slice_move(s![.., .., ..rest, ..]),
                full_v.slice_move(s![.., .., ..rest, ..]),
            ));
        }
        out
    }

    /// The keys and values of every position, `[B, Hkv, len, ·]`, without a copy.
    /// An error for a windowed cache (use [`segments`](Self::segments)).
    pub fn keys_values(&self) -> Result<(ArrayView4<'_, T>, ArrayView4<'_, T>)> {
        if self.window.is_some() {
            return Err(Error::value(
                "keys_values: a sliding-window cache is a ring buffer; use segments()",
            ));
        }
        Ok(self
            .one_piece()
            .expect("a cache without a window is never a wrapped ring"))
    }

    /// The retained keys and values as single views (`[B, Hkv, 0, ·]` when there
    /// are none), or `None` when a window's ring has wrapped into two pieces.
    fn one_piece(&self) -> Option<(ArrayView4<'_, T>, ArrayView4<'_, T>)> {
        self.one_piece_of(&self.k, &self.v)
    }

    /// [`one_piece`](Self::one_piece) of buffers laid out as the cache's own.
    fn one_piece_of<'a, U>(
        &self,
        k: &'a [U],
        v: &'a [U],
    ) -> Option<(ArrayView4<'a, U>, ArrayView4<'a, U>)> {
        let mut segs = self.segments_of(k, v);
        match segs.len() {
            0 => {
                let view = |width| {
                    ArrayView4::from_shape((self.shape.batch, self.shape.kv_heads, 0, width), &[])
                        .expect("empty")
                };
                Some((view(self.shape.head_dim), view(self.shape.value_dim)))
            }
            1 => segs.pop().map(|(_, k, v)| (k, v)),
            _ => None,
        }
    }

    /// [`one_piece`](Self::one_piece) in f32, for the fused kernel: the cache's own
    /// buffers when it holds f32, else a widened copy (exact; a prefill's arithmetic
    /// dwarfs it, `L > 16` operations per element copied).
    #[allow(clippy::type_complexity)]
    fn one_piece_f32(&self) -> Option<(CowArray<'_, f32, Ix4>, CowArray<'_, f32, Ix4>)> {
        let (k, v): (&dyn Any, &dyn Any) = (&self.k, &self.v);
        if let (Some(k), Some(v)) = (k.downcast_ref::<Vec<f32>>(), v.downcast_ref::<Vec<f32>>()) {
            let (k, v) = self.one_piece_of(k, v)?;
            return Some((k.into(), v.into()));
        }
        let (k, v) = self.one_piece()?;
        Some((k.mapv(T::to_f32).into(), v.mapv(T::to_f32).into()))
    }

    /// Causal attention of the queries `q [B, H, L, E]` of the last `L` appended
    /// positions over the cache, aligned bottom-right (query `i` sees keys up to its
    /// own position), within the window if there is one. `scale` defaults to `1/√E`.
    ///
    /// Returns the output `[B, H, L, Ev]` and the log-sum-exp `[B, H, L]`; equal to
    /// recomputing causal attention over the whole sequence, up to rounding.
    ///
    /// Steps of up to [`DECODE_MAX_QUERIES`] queries over a bf16 cache run the
    /// split-KV decode kernel, which reads the cache as it is; over an f32 cache
    /// only those [`auto_decodes`] gives it (a few queries against many keys),
    /// since the fused forward kernel reads an f32 cache in place too and its time
    /// does not grow with the queries (`examples/kernel_choice_bench`: against
    /// 4,096 keys, 8 and 16 queries 1.7-4.4× faster than in the decode kernel, 4
    /// queries within 20 % either way). Longer steps (a
    /// prompt's prefill) run the fused kernel, unless a sliding window's ring has
    /// wrapped, whose two pieces are attended by the decode kernel and merged.
    ///
    /// The queries are f32 whatever the cache holds, and so are the products: a bf16
    /// cache gives the attention of `q` over its keys and values widened to f32
    /// (the decode kernel widens each row as it loads it; a prefill widens the cache
    /// once and runs the f32 fused kernel), so that decoding and prefill agree.
    pub fn attend(
        &self,
        q: ArrayView4<'_, f32>,
        scale: Option<f32>,
        config: &DecodeConfig,
    ) -> Result<(Array4<f32>, Array3<f32>)> {
        let l = q.dim().2;
        if l > self.len {
            return Err(Error::shape(format!(
                "attend: q {:?} has {l} queries but the cache holds only {} positions; append their keys first",
                q.shape(),
                self.len
            )));
        }
        if let Some(w) = self.window {
            let kept = self.retained();
            if kept < self.len && kept < w - 1 + l {
                return Err(Error::shape(format!(
                    "attend: q {:?} has {l} queries, but the window of {w} keeps only the last {kept} positions; attend right after appending them",
                    q.shape()
                )));
            }
        }
        let opts = AttentionOptions {
            scale,
            causal: Some(Causal::BottomRight),
            window: self.window.map(|w| (w - 1, 0)),
            ..Default::default()
        };
        // Every retained key in one piece (or none, and validation speaks about q).
        let decodes = l <= DECODE_MAX_QUERIES
            && (T::DTYPE != Dtype::F32 || auto_decodes(Dtype::F32, l, self.retained()));
        if decodes {
            if let Some((k, v)) = self.one_piece() {
                return decode_attention(q, k, v, &opts, config);
            }
        } else if let Some((k, v)) = self.one_piece_f32() {
            // The general entry point: the fused kernel (or the reference when the
            // fused one does not support the problem).
            let config = Config {
                kernel: Kernel::Auto,
                exec: *config,
            };
            return attention_with(q, k.view(), v.view(), &opts, &config);
        }
        let total = self.retained();
        let parts: Vec<Partial> = self
            .segments()
            .into_iter()
            .map(|(start, k, v)| attention_partial_with(q, k, v, &opts, start, total, config))
            .collect::<Result<_>>()?;
        let m = merge_partials(&parts)?;
        Ok((m.output, m.lse))
    }
}
