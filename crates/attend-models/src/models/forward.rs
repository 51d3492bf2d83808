//! The fast forward: the rows of every sequence packed together through the
//! dense layers, each sequence's attention through the fused kernel on its own
//! rows, and groups of whole sequences side by side on the thread pool.

use ndarray::{s, Array2, Array3, Array4, ArrayView4, Axis, ShapeBuilder};
use rayon::prelude::*;

use super::probe::{Probe, Stopwatch, Timings, Watch, Work};
use super::{BertModel, TokenBatch};
use attend_core::attention::{attention, AttentionOptions};
use attend_core::nn::MultiHeadAttention;
use attend_core::Result;

impl BertModel {
    /// The last hidden state `[B, T, d]`; padding positions are zero.
    ///
    /// Only real tokens are computed: the rows of all sequences are packed
    /// together through the dense layers, and attention runs on each sequence's
    /// rows of the stacked projections where they lie (no padded copy, no padding
    /// keys or queries). A sequence's result therefore does not depend on what
    /// else is in the batch, and padding costs nothing until the output is laid
    /// out as `[B, T, d]`.
    pub fn forward(&self, batch: &TokenBatch) -> Result<Array3<f32>> {
        Ok(self.forward_watched(batch, || ())?.0)
    }

    /// [`forward`](Self::forward), adding the time spent in each kind of work to
    /// `timings` (for benchmarks: where does the time go?).
    pub fn forward_timed(&self, batch: &TokenBatch, timings: &mut Timings) -> Result<Array3<f32>> {
        let (out, watches) = self.forward_watched(batch, Stopwatch::new)?;
        // The threads' mean, so that the kinds still add up to the forward's time.
        let ways = watches.len() as u32;
        for watch in &watches {
            timings.matmul += watch.spent.matmul / ways;
            timings.attention += watch.spent.attention / ways;
            timings.other += watch.spent.other / ways;
        }
        Ok(out)
    }

    /// [`forward`](Self::forward) with a stopwatch from `watch` on each group of
    /// sequences, returned with the output.
    fn forward_watched<W: Watch + Send>(
        &self,
        batch: &TokenBatch,
        watch: impl Fn() -> W + Send + Sync,
    ) -> Result<(Array3<f32>, Vec<W>)> {
        if rayon::current_thread_index().is_none() {
            // Run on a worker of the thread pool: each parallel step is then a join
            // the worker completes itself if the other thread is late, where a call
            // from outside the pool would hand each step over and wait for it.
            return rayon::scope(|_| self.forward_watched(batch, watch));
        }
        self.check(batch)?;
        // MPNet's bias for the batch's T, made once and shared by every group.
        let bias = self.position_bias(batch.ids.ncols());
        let groups = sequence_groups(&batch.lengths, rayon::current_num_threads());
        if groups.len() < 2 {
            let (out, spent) = self.forward_rows(batch, bias.as_ref(), watch())?;
            return Ok((out, vec![spent]));
        }
        // Groups of whole sequences side by side, one per thread: each product
        // then runs on one core, where the whole batch's would make the threads
        // meet at every product. A sequence's result does not depend on its
        // group, so the output is the same.
        let parts: Vec<(Array3<f32>, W)> = groups
            .par_iter()
            .with_max_len(1)
            .map(|range| {
                let group = TokenBatch {
                    ids: batch.ids.slice(s![range.clone(), ..]).to_owned(),
                    type_ids: batch.type_ids.slice(s![range.clone(), ..]).to_owned(),
                    lengths: batch.lengths[range.clone()].to_vec(),
                };
                self.forward_rows(&group, bias.as_ref(), watch())
            })
            .collect::<Result<_>>()?;
        let views: Vec<_> = parts.iter().map(|(out, _)| out.view()).collect();
        let out = ndarray::concatenate(Axis(0), &views).expect("groups share T and d");
        Ok((out, parts.into_iter().map(|(_, spent)| spent).collect()))
    }

    /// The forward of a checked batch with its position bias, every product split
    /// over the thread pool, timed by `watch`.
    fn forward_rows<W: Watch>(
        &self,
        batch: &TokenBatch,
        bias: Option<&Array4<f32>>,
        watch: W,
    ) -> Result<(Array3<f32>, W)> {
        let mut probe = Packed {
            model: self,
            lengths: &batch.lengths,
            bias,
            watch,
        };
        let (b, t) = batch.ids.dim();
        let d = self.config.hidden_size;
        let rows: Vec<(usize, usize)> = (0..b)
            .flat_map(|bi| (0..batch.lengths[bi]).map(move |ti| (bi, ti)))
            .collect();
        if rows.is_empty() {
            return Ok((Array3::zeros((b, t, d)), probe.watch));
        }
        let mut h = self.embed_rows(batch, &rows)?;
        probe.done(Work::Other);
        for layer in &self.layers {
            h = self.layer(layer, h.view(), &mut probe)?;
        }
        // Each sequence's rows, then zeros for its padding.
        let src = h.as_slice().expect("Linear returns row-major arrays");
        let mut out = Vec::with_capacity(b * t * d);
        let mut r = 0;
        for &len in &batch.lengths {
            out.extend_from_slice(&src[r * d..(r + len) * d]);
            out.resize(out.len() + (t - len) * d, 0.0);
            r += len;
        }
        probe.done(Work::Other);
        let out = Array3::from_shape_vec((b, t, d), out).expect("B·T rows of d");
        Ok((out, probe.watch))
    }

    /// One layer's attention over the packed rows of the stacked projections
    /// `qkv [n, 3d]` (sequences of `lengths`, one after another), as packed rows
    /// `[n, d]` of the heads side by side. Each sequence is its own call on views
    /// of its rows, the sequences in parallel.
    fn attend_sequences(
        &self,
        qkv: &Array2<f32>,
        lengths: &[usize],
        bias: Option<&Array4<f32>>,
    ) -> Result<Array2<f32>> {
        let (n, width) = qkv.dim();
        let d = width / 3;
        let heads = self.config.num_attention_heads;
        let dh = self.config.head_dim();
        let all = qkv.as_slice().expect("Linear returns row-major arrays");
        let starts: Vec<usize> = lengths
            .iter()
            .scan(0, |r, &len| {
                let start = *r;
                *r += len;
                Some(start)
            })
            .collect();
        let contexts: Vec<Array4<f32>> = starts
            .par_iter()
            .zip(lengths)
            .filter(|(_, &len)| len > 0)
            .map(|(&start, &len)| {
                let rows = &all[start * width..(start + len) * width];
                let bias = bias.map(|a| a.slice(s![.., .., ..len, ..len]).into_dyn());
                let opts = AttentionOptions {
                    bias,
                    ..Default::default()
                };
                attention(
                    projection_heads(rows, 1, len, 0, heads),
                    projection_heads(rows, 1, len, 1, heads),
                    projection_heads(rows, 1, len, 2, heads),
                    &opts,
                )
            })
            .collect::<Result<_>>()?;
        // [1, H, len, dh] per sequence → packed rows [n, H·dh].
        let mut merged = Vec::with_capacity(n * d);
        for ctx in &contexts {
            let ctx = ctx.as_standard_layout();
            let src = ctx.as_slice().expect("standard layout");
            let len = ctx.dim().2;
            for ti in 0..len {
                for hi in 0..heads {
                    let from = (hi * len + ti) * dh;
                    merged.extend_from_slice(&src[from..from + dh]);
                }
            }
        }
        Ok(Array2::from_shape_vec((n, d), merged).expect("n rows of d"))
    }
}

/// The fast forward's probe: each sequence's attention through the fused kernel
/// on its own rows (packed, no padding), timed by `watch`.
struct Packed<'a, W> {
    model: &'a BertModel,
    /// The rows of each sequence, one sequence after another.
    lengths: &'a [usize],
    /// MPNet's position bias for the batch.
    bias: Option<&'a Array4<f32>>,
    watch: W,
}

impl<W: Watch> Probe for Packed<'_, W> {
    #[inline(always)]
    fn done(&mut self, work: Work) {
        self.watch.lap(work);
    }

    fn attention(&mut self, _: &MultiHeadAttention, qkv: &Array2<f32>) -> Result<Array2<f32>> {
        self.model.attend_sequences(qkv, self.lengths, self.bias)
    }
}

/// Fewest tokens for which a group of sequences gets a thread of its own: from
/// about 64 rows a product runs near its single-thread peak (examples/dense_bench).
const GROUP_TOKENS: usize = 64;

/// Splits the sequences of `lengths` into at most `threads` contiguous groups of
/// about equal tokens, each of at least [`GROUP_TOKENS`] tokens (one group when
/// the batch is too small to share).
pub(super) fn sequence_groups(lengths: &[usize], threads: usize) -> Vec<std::ops::Range<usize>> {
    let tokens: usize = lengths.iter().sum();
    let ways = threads.min(tokens / GROUP_TOKENS).min(lengths.len()).max(1);
    let mut groups = Vec::with_capacity(ways);
    let (mut start, mut seen) = (0, 0);
    for (i, &len) in lengths.iter().enumerate() {
        seen += len;
        // Cut once this group has its share of the tokens.
        if seen * ways >= tokens * (groups.len() + 1) && groups.len() + 1 < ways {
            groups.push(start..i + 1);
            start = i + 1;
        }
    }
    groups.push(start..lengths.len());
    groups
}

/// Projection `which` (0 queries, 1 keys, 2 values) of `batch` sequences of
/// `len` rows each of stacked projections (`3d` wide) as `[batch, H, len, d/H]`:
/// a view, no copy.
pub(super) fn projection_heads(
    rows: &[f32],
    batch: usize,
    len: usize,
    which: usize,
    heads: usize,
) -> ArrayView4<'_, f32> {
    let width = rows.len() / (batch * len);
    let d = width / 3;
    let dh = d / heads;
    ArrayView4::from_shape(
        (batch, heads, len, dh).strides((len * width, dh, width, 1)),
        &rows[which * d..],
    )
    .expect("the heads of one projection lie inside the stacked rows")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_groups_share_the_tokens_and_keep_small_batches_whole() {
        assert_eq!(sequence_groups(&[40, 40, 40, 40], 2), vec![0..2, 2..4]);
        assert_eq!(sequence_groups(&[100, 10, 10, 10], 2), vec![0..1, 1..4]);
        // Too few tokens for two groups of GROUP_TOKENS, or one sequence.
        assert_eq!(sequence_groups(&[30, 30, 30], 2), vec![0..3]);
        assert_eq!(sequence_groups(&[500], 2), vec![0..1]);
        assert_eq!(sequence_groups(&[0, 0], 2), vec![0..2]);
        assert_eq!(sequence_groups(&[64, 64, 64], 4), vec![0..1, 1..2, 2..3]);
    }
}
