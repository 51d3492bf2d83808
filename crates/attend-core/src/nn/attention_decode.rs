//! Incremental (cached) causal decoding through [`MultiHeadAttention`].

use ndarray::{Array3, ArrayView3};

use super::{merge_heads, MultiHeadAttention};
use crate::decode::DecodeConfig;
use crate::kv_cache::{CacheShape, LayerCache};
use crate::{Error, Result};

impl MultiHeadAttention {
    /// An empty key/value cache for this module: `batch` sequences, every position
    /// kept, or only the last `window` with a sliding window.
    pub fn new_cache(&self, batch: usize, window: Option<usize>) -> Result<LayerCache> {
        let shape =
            CacheShape::new(batch, self.kv_heads, self.head_dim()).with_value_dim(self.value_dim());
        match window {
            None => Ok(LayerCache::new(shape)),
            Some(w) => LayerCache::windowed(shape, w),
        }
    }

    /// One step of causal decoding: projects the new tokens `x [B, T, d_in]`,
    /// appends their keys and values to `cache`, and attends each new query to
    /// every cached position up to its own (bottom-right alignment, within the
    /// cache's window if any). Returns `[B, T, d]`.
    ///
    /// Running the tokens of a sequence through this one step at a time gives the
    /// same result, up to rounding, as [`forward`](Self::forward) on the whole
    /// sequence with `causal: Some(Causal::BottomRight)` (and the window
    /// `(w − 1, 0)` for a windowed cache). On error the cache is unchanged.
    pub fn forward_cached(
        &self,
        x: ArrayView3<'_, f32>,
        cache: &mut LayerCache,
        config: &DecodeConfig,
    ) -> Result<Array3<f32>> {
        let (q, k, v) = self.project(x)?;
        if k.dim().0 != cache.batch() {
            return Err(Error::shape(format!(
                "forward_cached: input x {:?} has batch {} but the cache holds {} sequences",
                x.shape(),
                k.dim().0,
                cache.batch()
            )));
        }
        cache.append(k.view(), v.view())?;
        let (ctx, _) = cache.attend(q.view(), None, config)?;
        let context = merge_heads(ctx.view());
        match &self.out_proj {
            Some(o) => o.forward(context.view()),
            None => Ok(context),
        }
    }
}
