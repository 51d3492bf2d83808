//! The traced forward: the padded batch through the reference attention, every
//! layer's intermediates kept, for `attend explain` and the attention pictures.

use ndarray::{Array2, Array3, Array4};

use super::forward::projection_heads;
use super::probe::{Probe, Work};
use super::{BertModel, TokenBatch};
use attend_core::attention::AttentionOptions;
use attend_core::kernels::reference;
use attend_core::nn::{merge_heads, ModuleTrace, MultiHeadAttention};
use attend_core::problem::Problem;
use attend_core::Result;

/// Every intermediate of a [`BertModel::trace`] run.
#[derive(Clone, Debug)]
pub struct BertTrace {
    /// Input of each layer, `[B, T, d]` (entry 0 is the embedding output).
    pub inputs: Vec<Array3<f32>>,
    /// Each layer's self-attention: `q`, `k`, `v` (`[B, H, T, head_dim]`), raw scores,
    /// scaled-and-masked scores and softmax weights (`[B, H, T, T]`), context and
    /// output projection.
    pub attention: Vec<ModuleTrace>,
    /// Last hidden state, `[B, T, d]`, padding positions included (as transformers
    /// computes them).
    pub hidden: Array3<f32>,
    /// MPNet's relative-position bias `[1, H, T, T]`, added to every layer's scaled
    /// scores; `None` for the other families.
    pub position_bias: Option<Array4<f32>>,
}

impl BertModel {
    /// [`forward`](Self::forward) on the padded batch through the reference attention,
    /// keeping every intermediate: the per-layer, per-head Q, K, V, scores and
    /// attention weights that `attend explain` and the HTML viewer show.
    pub fn trace(&self, batch: &TokenBatch) -> Result<BertTrace> {
        self.check(batch)?;
        let (b, t) = batch.ids.dim();
        let d = self.config.hidden_size;
        let rows: Vec<(usize, usize)> = (0..b)
            .flat_map(|bi| (0..t).map(move |ti| (bi, ti)))
            .collect();
        let padding = batch.padding_mask();
        let bias = self.position_bias(t);
        let mut probe = Tracer {
            batch: b,
            tokens: t,
            heads: self.config.num_attention_heads,
            opts: AttentionOptions {
                key_padding: Some(padding.view()),
                bias: bias.as_ref().map(|a| a.view().into_dyn()),
                ..Default::default()
            },
            layers: Vec::with_capacity(self.layers.len()),
        };
        let to_batch = |rows: Array2<f32>| rows.into_shape_with_order((b, t, d)).expect("B·T rows");
        let mut h = self.embed_rows(batch, &rows)?;
        let mut inputs = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let out = self.layer(layer, h.view(), &mut probe)?;
            inputs.push(to_batch(std::mem::replace(&mut h, out)));
        }
        Ok(BertTrace {
            inputs,
            attention: probe.layers,
            hidden: to_batch(h),
            position_bias: bias,
        })
    }
}

/// The traced forward's probe: attention on the padded batch through the
/// reference kernel, each layer's Q, K, V, scores, weights, context and output
/// projection kept.
struct Tracer<'a> {
    batch: usize,
    /// The padded length `T`.
    tokens: usize,
    heads: usize,
    /// The padding keys masked, MPNet's bias added.
    opts: AttentionOptions<'a>,
    /// Each layer's record so far.
    layers: Vec<ModuleTrace>,
}

impl Probe for Tracer<'_> {
    fn done(&mut self, _: Work) {}

    fn attention(&mut self, layer: &MultiHeadAttention, qkv: &Array2<f32>) -> Result<Array2<f32>> {
        let (b, t, heads) = (self.batch, self.tokens, self.heads);
        let all = qkv.as_slice().expect("Linear returns row-major arrays");
        let [q, k, v] = [0, 1, 2].map(|which| {
            projection_heads(all, b, t, which, heads)
                .as_standard_layout()
                .into_owned()
        });
        let attention = reference::run(&Problem::new(q.view(), k.view(), v.view(), &self.opts)?);
        let context = merge_heads(attention.output.view());
        let rows =
            Array2::from_shape_vec((b * t, qkv.ncols() / 3), context.iter().copied().collect())
                .expect("B·T rows of d");
        // The layer adds the output projection to its residual as it computes it,
        // so the projection alone, which the record keeps, is computed here again.
        let output = match &layer.out_proj {
            Some(o) => Some(o.forward(context.view())?),
            None => None,
        };
        self.layers.push(ModuleTrace {
            q,
            k,
            v,
            attention,
            context,
            output,
        });
        Ok(rows)
    }
}
