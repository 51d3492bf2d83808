//! Gradients of [`MultiHeadAttention`]: projections (whatever layout initialised
//! them, they are canonical `[out, in]` blocks by now), heads, attention and the
//! optional output projection.

use ndarray::{Array2, Array3, Array4, ArrayView1, ArrayView2, ArrayView3};

use super::linear::{self, LinearGrads};
use super::Scalar;
use crate::attention::AttentionOptions;
use crate::attention::{Dropout, Saved};
use crate::nn::{merge_heads, split_heads, Linear, MultiHeadAttention};
use crate::{Error, Result};

/// What [`MultiHeadAttention::backward`] needs from the forward pass. It borrows
/// the masks of the [`AttentionOptions`] it was run with.
#[derive(Clone, Debug)]
pub struct MultiHeadAttentionCache<'o, T = f32> {
    /// The input as rows `[B·T, d_in]`.
    pub(crate) x: Array2<T>,
    /// `(B, T)`.
    pub(crate) bt: (usize, usize),
    /// Queries, keys and values after splitting heads.
    pub(crate) q: Array4<T>,
    pub(crate) k: Array4<T>,
    pub(crate) v: Array4<T>,
    /// Attention output per head `[B, H, T, dv]` and its log-sum-exp.
    pub(crate) out: Array4<T>,
    pub(crate) lse: ndarray::Array3<T>,
    /// What rounding `lse` left out (`Scalar::attention_forward`).
    pub(crate) lse_residual: ndarray::Array3<T>,
    /// Merged heads `[B·T, H·dv]` (the output projection's input).
    pub(crate) context: Array2<T>,
    pub(crate) opts: AttentionOptions<'o>,
    pub(crate) dropout: Option<Dropout>,
}

/// Gradients of a [`MultiHeadAttention`], named like its parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct MultiHeadAttentionGrads<T = f32> {
    /// Gradients of the query projection.
    pub q_proj: LinearGrads<T>,
    /// Gradients of the key projection.
    pub k_proj: LinearGrads<T>,
    /// Gradients of the value projection.
    pub v_proj: LinearGrads<T>,
    /// Gradients of the output projection, if the module has one.
    pub out_proj: Option<LinearGrads<T>>,
}

/// Borrowed weights of the module in any float type.
#[derive(Clone, Debug)]
pub(crate) struct Weights<'a, T> {
    pub q: (ArrayView2<'a, T>, Option<ArrayView1<'a, T>>),
    pub k: (ArrayView2<'a, T>, Option<ArrayView1<'a, T>>),
    pub v: (ArrayView2<'a, T>, Option<ArrayView1<'a, T>>),
    pub o: Option<(ArrayView2<'a, T>, Option<ArrayView1<'a, T>>)>,
    pub heads: usize,
    pub kv_heads: usize,
}

fn view(l: &Linear) -> (ArrayView2<'_, f32>, Option<ArrayView1<'_, f32>>) {
    (l.weight.view(), l.bias.as_ref().map(|b| b.view()))
}

impl MultiHeadAttention {
    pub(crate) fn weights(&self) -> Weights<'_, f32> {
        Weights {
            q: view(&self.q_proj),
            k: view(&self.k_proj),
            v: view(&self.v_proj),
            o: self.out_proj.as_ref().map(view),
            heads: self.heads,
            kv_heads: self.kv_heads,
        }
    }

    /// [`forward`](MultiHeadAttention::forward), also returning what
    /// [`backward`](MultiHeadAttention::backward) needs.
    pub fn forward_train<'o>(
        &self,
        x: ArrayView3<'_, f32>,
        opts: &AttentionOptions<'o>,
    ) -> Result<(Array3<f32>, MultiHeadAttentionCache<'o>)> {
        self.forward_train_dropout(x, opts, None)
    }

    /// [`forward_train`](MultiHeadAttention::forward_train) with dropout on the
    /// attention weights (use a new seed every step).
    pub fn forward_train_dropout<'o>(
        &self,
        x: ArrayView3<'_, f32>,
        opts: &AttentionOptions<'o>,
        dropout: Option<Dropout>,
    ) -> Result<(Array3<f32>, MultiHeadAttentionCache<'o>)> {
        self.check_input(x)?;
        forward(&self.weights(), x, opts, dropout)
    }

    /// Gradients given `dy = ∂loss/∂y` (`[B, T, d]`): returns `∂loss/∂x` and the
    /// parameters' gradients.
    pub fn backward(
        &self,
        cache: &MultiHeadAttentionCache<'_>,
        dy: ArrayView3<'_, f32>,
    ) -> Result<(Array3<f32>, MultiHeadAttentionGrads)> {
        backward(&self.weights(), cache, dy)
    }
}

/// The module's forward pass in any float type.
pub(crate) fn forward<'o, T: Scalar>(
    w: &Weights<'_, T>,
    x: ArrayView3<'_, T>,
    opts: &AttentionOptions<'o>,
    dropout: Option<Dropout>,
) -> Result<(Array3<T>, MultiHeadAttentionCache<'o, T>)> {
    let (b, t, d_in) = x.dim();
    let x2 = x
        .as_standard_layout()
        .into_owned()
        .into_shape_with_order((b * t, d_in))
        .expect("standard layout reshapes");
    let project = |(wt, bias): (ArrayView2<'_, T>, Option<ArrayView1<'_, T>>), heads: usize| {
        let y = linear::forward(wt, bias, x2.view());
        let width = y.ncols();
        let y = y.into_shape_with_order((b, t, width)).expect("rows");
        split_heads(y.view(), heads)
    };
    let q = project(w.q, w.heads);
    let k = project(w.k, w.kv_heads);
    let v = project(w.v, w.kv_heads);
    let (out, lse, lse_residual) =
        T::attention_forward(q.view(), k.view(), v.view(), opts, dropout.as_ref())?;
    let merged = merge_heads(out.view());
    let width = merged.dim().2;
    let context = merged
        .into_shape_with_order((b * t, width))
        .expect("standard layout");
    let y2 = match &w.o {
        Some((wo, bo)) => linear::forward(wo.view(), bo.as_ref().map(|b| b.view()), context.view()),
        None => context.clone(),
    };
    let d_out = y2.ncols();
    let y = y2.into_shape_with_order((b, t, d_out)).expect("rows");
    let cache = MultiHeadAttentionCache {
        x: x2,
        bt: (b, t),
        q,
        k,
        v,
        out,
        lse,
        lse_residual,
        context,
        opts: opts.clone(),
        dropout,
    };
    Ok((y, cache))
}

/// The module's backward pass in any float type.
pub(crate) fn backward<T: Scalar>(
    w: &Weights<'_, T>,
    cache: &MultiHeadAttentionCache<'_, T>,
    dy: ArrayView3<'_, T>,
) -> Result<(Array3<T>, MultiHeadAttentionGrads<T>)> {
    let (b, t) = cache.bt;
    let d_out =
        w.o.as_ref()
            .map_or(cache.context.ncols(), |(wo, _)| wo.nrows());
    if dy.dim() != (b, t, d_out) {
        return Err(Error::shape(format!(
            "dy of shape {:?} must be the forward output's shape {:?}",
            dy.shape(),
            [b, t, d_out]
        )));
    }
    let dy2 = dy
        .as_standard_layout()
        .into_owned()
        .into_shape_with_order((b * t, d_out))
        .expect("checked shape");
    let (dctx, out_proj) = match &w.o {
        Some((wo, bo)) => {
            let (dctx, g) =
                linear::backward(wo.view(), bo.is_some(), cache.context.view(), dy2.view());
            (dctx, Some(g))
        }
        None => (dy2, None),
    };
    let width = dctx.ncols();
    let dctx = dctx.into_shape_with_order((b, t, width)).expect("rows");
    let dout = split_heads(dctx.view(), w.heads);
    let (dq, dk, dv, _) = T::attention_backward(
        cache.q.view(),
        cache.k.view(),
        cache.v.view(),
        Saved::new(cache.out.view(), cache.lse.view()).with_lse_residual(cache.lse_residual.view()),
        dout.view(),
        &cache.opts,
        cache.dropout.as_ref(),
        false,
    )?;
    let rows = |a: Array4<T>| {
        let m = merge_heads(a.view());
        let width = m.dim().2;
        m.into_shape_with_order((b * t, width))
            .expect("standard layout")
    };
    let (dx_q, q_proj) = linear::backward(
        w.q.0.view(),
        w.q.1.is_some(),
        cache.x.view(),
        rows(dq).view(),
    );
    let (dx_k, k_proj) = linear::backward(
        w.k.0.view(),
        w.k.1.is_some(),
        cache.x.view(),
        rows(dk).view(),
    );
    let (dx_v, v_proj) = linear::backward(
        w.v.0.view(),
        w.v.1.is_some(),
        cache.x.view(),
        rows(dv).view(),
    );
    let dx = dx_q + dx_k + dx_v;
    let d_in = dx.ncols();
    Ok((
        dx.into_shape_with_order((b, t, d_in)).expect("rows"),
        MultiHeadAttentionGrads {
            q_proj,
            k_proj,
            v_proj,
            out_proj,
        },
    ))
}
