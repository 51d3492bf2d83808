//! The canonical multi-head attention module.

use ndarray::{Array3, Array4, ArrayView3, ArrayView4};

use super::Linear;
use crate::attention::{attention, AttentionOptions, Problem};
use crate::kernels::reference::{self, AttentionTrace};
use crate::{Error, Result};

/// Multi-head (and grouped-query) self-attention with canonical weights.
///
/// `q_proj` maps `d_in` to `heads · head_dim`, `k_proj` to `kv_heads · head_dim` and
/// `v_proj` to `kv_heads · value_dim`; the optional `out_proj` maps the concatenated
/// heads onward. Every notebook variant is this module with other weights.
#[derive(Clone, Debug, PartialEq)]
pub struct MultiHeadAttention {
    /// Query projection.
    pub q_proj: Linear,
    /// Key projection.
    pub k_proj: Linear,
    /// Value projection.
    pub v_proj: Linear,
    /// Optional output projection applied to the merged heads.
    pub out_proj: Option<Linear>,
    /// Number of query heads.
    pub heads: usize,
    /// Number of key/value heads (`heads` for plain multi-head attention).
    pub kv_heads: usize,
}

/// Every intermediate of one forward pass of [`MultiHeadAttention`].
#[derive(Clone, Debug)]
pub struct ModuleTrace {
    /// Queries `[B, H, T, head_dim]`.
    pub q: Array4<f32>,
    /// Keys `[B, Hkv, T, head_dim]`.
    pub k: Array4<f32>,
    /// Values `[B, Hkv, T, value_dim]`.
    pub v: Array4<f32>,
    /// Scores, weights and per-head output of the attention itself.
    pub attention: AttentionTrace,
    /// Heads concatenated, `[B, T, H · value_dim]`.
    pub context: Array3<f32>,
    /// After the output projection, if there is one.
    pub output: Option<Array3<f32>>,
}

impl MultiHeadAttention {
    /// Builds the module, checking that the projections fit together.
    pub fn new(
        q_proj: Linear,
        k_proj: Linear,
        v_proj: Linear,
        out_proj: Option<Linear>,
        heads: usize,
        kv_heads: usize,
    ) -> Result<Self> {
        let d_in = q_proj.in_features();
        if k_proj.in_features() != d_in || v_proj.in_features() != d_in {
            return Err(Error::shape(format!(
                "projections take different input widths: w_q {:?}, w_k {:?}, w_v {:?}",
                q_proj.weight.shape(),
                k_proj.weight.shape(),
                v_proj.weight.shape()
            )));
        }
        if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(Error::value(format!(
                "heads ({heads}) must be a positive multiple of kv_heads ({kv_heads})"
            )));
        }
        for (name, proj, h) in [
            ("w_q", &q_proj, heads),
            ("w_k", &k_proj, kv_heads),
            ("w_v", &v_proj, kv_heads),
        ] {
            if !proj.out_features().is_multiple_of(h) {
                return Err(Error::shape(format!(
                    "{name} {:?}: its width {} is not divisible by {h} heads",
                    proj.weight.shape(),
                    proj.out_features()
                )));
            }
        }
        if q_proj.out_features() / heads != k_proj.out_features() / kv_heads {
            return Err(Error::shape(format!(
                "query and key head widths differ: w_q {:?} over {heads} heads, w_k {:?} over {kv_heads}",
                q_proj.weight.shape(),
                k_proj.weight.shape()
            )));
        }
        if let Some(o) = &out_proj {
            let merged = v_proj.out_features() / kv_heads * heads;
            if o.in_features() != merged {
                return Err(Error::shape(format!(
                    "out_proj {:?} must take the merged heads' width {merged}",
                    o.weight.shape()
                )));
            }
        }
        Ok(MultiHeadAttention {
            q_proj,
            k_proj,
            v_proj,
            out_proj,
            heads,
            kv_heads,
        })
    }

    /// Input width.
    pub fn d_in(&self) -> usize {
        self.q_proj.in_features()
    }

    /// Query/key width per head.
    pub fn head_dim(&self) -> usize {
        self.q_proj.out_features() / self.heads
    }

    /// Value width per head.
    pub fn value_dim(&self) -> usize {
        self.v_proj.out_features() / self.kv_heads
    }

    /// Self-attention over `x [B, T, d_in]`, giving `[B, T, d]`.
    pub fn forward(
        &self,
        x: ArrayView3<'_, f32>,
        opts: &AttentionOptions<'_>,
    ) -> Result<Array3<f32>> {
        self.check_input(x)?;
        let q = self.q_proj.forward(x)?;
        let k = self.k_proj.forward(x)?;
        let v = self.v_proj.forward(x)?;
        let ctx = attention(
            heads_view(&q, self.heads),
            heads_view(&k, self.kv_heads),
            heads_view(&v, self.kv_heads),
            opts,
        )?;
        self.finish(merge_heads(ctx.view()))
    }

    /// [`forward`](Self::forward) through the reference kernel, keeping every
    /// intermediate.
    pub fn trace(
        &self,
        x: ArrayView3<'_, f32>,
        opts: &AttentionOptions<'_>,
    ) -> Result<ModuleTrace> {
        let (q, k, v) = self.project(x)?;
        let attention = reference::run(&Problem::new(q.view(), k.view(), v.view(), opts)?);
        let context = merge_heads(attention.output.view());
        let output = match &self.out_proj {
            Some(o) => Some(o.forward(context.view())?),
            None => None,
        };
        Ok(ModuleTrace {
            q,
            k,
            v,
            attention,
            context,
            output,
        })
    }

    /// Checks that `x [B, T, d_in]` has the width the projections take.
    pub(crate) fn check_input(&self, x: ArrayView3<'_, f32>) -> Result<()> {
        if x.dim().2 != self.d_in() {
            return Err(Error::shape(format!(
                "input x {:?} has width {} but the projections expect {} (w_q {:?})",
                x.shape(),
                x.dim().2,
                self.d_in(),
                self.q_proj.weight.shape()
            )));
        }
        Ok(())
    }

    /// Projects `x` and splits heads: `q [B, H, T, dh]`, `k`, `v [B, Hkv, T, ·]`.
    pub fn project(
        &self,
        x: ArrayView3<'_, f32>,
    ) -> Result<(Array4<f32>, Array4<f32>, Array4<f32>)> {
        self.check_input(x)?;
        Ok((
            split_heads(self.q_proj.forward(x)?.view(), self.heads),
            split_heads(self.k_proj.forward(x)?.view(), self.kv_heads),
            split_heads(self.v_proj.forward(x)?.view(), self.kv_heads),
        ))
    }

    fn finish(&self, context: Array3<f32>) -> Result<Array3<f32>> {
        match &self.out_proj {
            Some(o) => o.forward(context.view()),
            None => Ok(context),
        }
    }
}

/// A standard-layout `[B, T, H · D]` (a projection's output) viewed as
/// `[B, H, T, D]` without a copy: the attention kernels take any strides.
///
/// # Panics
/// If `y` is not in standard layout or its width is not a multiple of `heads`.
pub fn heads_view(y: &Array3<f32>, heads: usize) -> ArrayView4<'_, f32> {
    let (b, t, width) = y.dim();
    assert!(
        heads > 0 && width.is_multiple_of(heads),
        "heads_view: width {width} is not a multiple of {heads} heads"
    );
    y.view()
        .into_shape_with_order((b, t, heads, width / heads))
        .expect("heads_view needs a standard-layout array")
        .permuted_axes([0, 2, 1, 3])
}

/// `[B, T, H · D]` → `[B, H, T, D]`, any element type and any input layout.
pub fn split_heads<A: Clone>(y: ArrayView3<'_, A>, heads: usize) -> Array4<A> {
    let (b, t, width) = y.dim();
    y.to_shape((b, t, heads, width / heads))
        .expect("[B, T, H·D] holds B·T·H·D elements")
        .permuted_axes([0, 2, 1, 3])
        .as_standard_layout()
        .into_owned()
}

/// `[B, H, T, D]` → `[B, T, H · D]` (heads concatenated), any element type.
pub fn merge_heads<A: Clone>(o: ArrayView4<'_, A>) -> Array3<A> {
    let (b, h, t, d) = o.dim();
    o.permuted_axes([0, 2, 1, 3])
        .as_standard_layout()
        .into_owned()
        .into_shape_with_order((b, t, h * d))
        .expect("a standard-layout array reshapes")
}
