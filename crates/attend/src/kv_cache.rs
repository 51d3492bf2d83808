//! The key/value cache of incremental decoding.
//!
//! Each layer keeps its keys `[B, Hkv, ·, E]` and values `[B, Hkv, ·, Ev]` in one
//! buffer per tensor whose capacity doubles when full, so appending `n` steps
//! copies `O(n)` floats in total, not `O(n²)`. With a sliding window of `w` keys
//! the buffer is a ring that keeps only the most recent keys (`w − 1` plus the
//! latest step), so memory stays bounded however long the generation runs.
//!
//! ```
//! use attend::kv_cache::LayerCache;
//! use ndarray::Array4;
//!
//! let mut cache = LayerCache::new(1, 2, 4, 4);
//! for _ in 0..3 {
//!     let k = Array4::<f32>::ones((1, 2, 1, 4));
//!     cache.append(k.view(), k.view())?;
//! }
//! let q = Array4::<f32>::ones((1, 2, 1, 4));
//! let (out, _lse) = cache.attend(q.view(), None, &Default::default())?;
//! assert_eq!(out.shape(), &[1, 2, 1, 4]);
//! # Ok::<(), attend::Error>(())
//! ```

use ndarray::{s, Array3, Array4, ArrayView4};

use crate::attention::{attention_with, AttentionOptions, Causal, Config, Kernel};
use crate::decode::{attention_partial_with, merge_partials, DecodeConfig, Partial};
use crate::{Error, Result};

/// The caches of every layer of a model.
#[derive(Clone, Debug)]
pub struct KvCache {
    layers: Vec<LayerCache>,
}

impl KvCache {
    /// `layers` empty caches of `batch` sequences with `kv_heads` heads of key
    /// width `head_dim` and value width `value_dim`.
    pub fn new(
        layers: usize,
        batch: usize,
        kv_heads: usize,
        head_dim: usize,
        value_dim: usize,
    ) -> Self {
        KvCache {
            layers: (0..layers)
                .map(|_| LayerCache::new(batch, kv_heads, head_dim, value_dim))
                .collect(),
        }
    }

    /// Like [`new`](Self::new), every layer a sliding window of `window` keys.
    pub fn with_window(
        layers: usize,
        batch: usize,
        kv_heads: usize,
        head_dim: usize,
        value_dim: usize,
        window: usize,
    ) -> Result<Self> {
        Ok(KvCache {
            layers: (0..layers)
                .map(|_| LayerCache::with_window(batch, kv_heads, head_dim, value_dim, window))
                .collect::<Result<_>>()?,
        })
    }

    /// Number of layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Layer `i`'s cache.
    pub fn layer(&self, i: usize) -> Result<&LayerCache> {
        let n = self.layers.len();
        self.layers.get(i).ok_or_else(|| {
            Error::value(format!("layer {i} out of range: the cache has {n} layers"))
        })
    }

    /// Layer `i`'s cache, to append to.
    pub fn layer_mut(&mut self, i: usize) -> Result<&mut LayerCache> {
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

/// One layer's keys and values.
#[derive(Clone, Debug)]
pub struct LayerCache {
    batch: usize,
    kv_heads: usize,
    head_dim: usize,
    value_dim: usize,
    window: Option<usize>,
    /// Rows per `(b, h)` in the buffers.
    cap: usize,
    /// Positions appended so far; position `p` lives in row `p % cap`.
    len: usize,
    /// `[B, Hkv, cap, E]`.
    k: Vec<f32>,
    /// `[B, Hkv, cap, Ev]`.
    v: Vec<f32>,
}

impl LayerCache {
    /// An empty cache that keeps every position.
    pub fn new(batch: usize, kv_heads: usize, head_dim: usize, value_dim: usize) -> Self {
        LayerCache {
            batch,
            kv_heads,
            head_dim,
            value_dim,
            window: None,
            cap: 0,
            len: 0,
            k: Vec::new(),
            v: Vec::new(),
        }
    }

    /// An empty cache for sliding-window attention: each query sees itself and the
    /// `window − 1` keys before it (the window `(window − 1, 0)` of
    /// [`AttentionOptions::window`]), and older keys are dropped.
    pub fn with_window(
        batch: usize,
        kv_heads: usize,
        head_dim: usize,
        value_dim: usize,
        window: usize,
    ) -> Result<Self> {
        if window == 0 {
            return Err(Error::value("window must be at least 1 key, got 0"));
        }
        let mut c = Self::new(batch, kv_heads, head_dim, value_dim);
        c.window = Some(window);
        Ok(c)
    }

    /// Sequences in the batch.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Key/value heads.
    pub fn kv_heads(&self) -> usize {
        self.kv_heads
    }

    /// Key width per head.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Value width per head.
    pub fn value_dim(&self) -> usize {
        self.value_dim
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
    /// new positions.
    pub fn append(&mut self, k: ArrayView4<'_, f32>, v: ArrayView4<'_, f32>) -> Result<()> {
        let (b, h, t, e) = k.dim();
        let (vb, vh, vt, ev) = v.dim();
        let want = format!(
            "[B, Hkv, T, E] = [{}, {}, T, {}]",
            self.batch, self.kv_heads, self.head_dim
        );
        if (b, h, e) != (self.batch, self.kv_heads, self.head_dim) {
            return Err(Error::shape(format!(
                "append: k {:?} does not fit the cache's {want}",
                k.shape()
            )));
        }
        if (vb, vh, ev) != (self.batch, self.kv_heads, self.value_dim) {
            return Err(Error::shape(format!(
                "append: v {:?} does not fit the cache's [B, Hkv, T, Ev] = [{}, {}, T, {}]",
                v.shape(),
                self.batch,
                self.kv_heads,
                self.value_dim
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
                        *x = y;
                    }
                    let vd = &mut self.v[at * ev..(at + 1) * ev];
                    for (x, &y) in vd.iter_mut().zip(v.slice(s![bi, hi, p, ..])) {
                        *x = y;
                    }
                }
            }
        }
        self.len += t;
        Ok(())
    }

    /// Reallocates to `new_cap` rows, keeping the retained positions.
    fn grow(&mut self, new_cap: usize) {
        let (bh, e, ev) = (self.batch * self.kv_heads, self.head_dim, self.value_dim);
        let mut k = vec![0.0f32; bh * new_cap * e];
        let mut v = vec![0.0f32; bh * new_cap * ev];
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
    pub fn segments(&self) -> Vec<(usize, ArrayView4<'_, f32>, ArrayView4<'_, f32>)> {
        let kept = self.retained();
        if kept == 0 {
            return Vec::new();
        }
        let full_k = ArrayView4::from_shape(
            (self.batch, self.kv_heads, self.cap, self.head_dim),
            &self.k,
        )
        .expect("buffer matches its shape");
        let full_v = ArrayView4::from_shape(
            (self.batch, self.kv_heads, self.cap, self.value_dim),
            &self.v,
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
    pub fn keys_values(&self) -> Result<(ArrayView4<'_, f32>, ArrayView4<'_, f32>)> {
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
    fn one_piece(&self) -> Option<(ArrayView4<'_, f32>, ArrayView4<'_, f32>)> {
        let mut segs = self.segments();
        match segs.len() {
            0 => {
                let view = |width| {
                    ArrayView4::from_shape((self.batch, self.kv_heads, 0, width), &[])
                        .expect("empty")
                };
                Some((view(self.head_dim), view(self.value_dim)))
            }
            1 => segs.pop().map(|(_, k, v)| (k, v)),
            _ => None,
        }
    }

    /// Causal attention of the queries `q [B, H, L, E]` of the last `L` appended
    /// positions over the cache, aligned bottom-right (query `i` sees keys up to its
    /// own position), within the window if there is one. `scale` defaults to `1/√E`.
    ///
    /// Returns the output `[B, H, L, Ev]` and the log-sum-exp `[B, H, L]`; equal to
    /// recomputing causal attention over the whole sequence, up to rounding.
    ///
    /// Steps of up to [`DECODE_MAX_QUERIES`](crate::attention::DECODE_MAX_QUERIES) queries run the split-KV decode kernel;
    /// longer ones (a prompt's prefill) the fused forward kernel, unless a sliding
    /// window's ring has wrapped, whose two pieces are attended by the decode kernel
    /// and merged.
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
        if let Some((k, v)) = self.one_piece() {
            // Every retained key in one piece (or none, and validation speaks about
            // q): the general entry point picks the kernel by the number of queries.
            let config = Config {
                kernel: Kernel::Auto,
                isa: config.isa,
                threads: config.threads,
            };
            return attention_with(q, k, v, &opts, &config);
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
