//! Gradients of the modules, with explicit caches and no tape.
//!
//! Every module gets two methods in addition to its `forward`:
//!
//! - `forward_train(x, …) -> (y, cache)`: the forward pass, keeping what the
//!   backward pass needs;
//! - `backward(&cache, dy) -> (dx, grads)`: the input's gradient and the parameters'
//!   gradients, in a struct whose fields have the module's parameter names
//!   ([`LinearGrads`] has `weight` and `bias`, [`MultiHeadAttentionGrads`] has
//!   `q_proj`, `k_proj`, `v_proj`, `out_proj`).
//!
//! Chaining modules by hand is then a matter of running the backward passes in the
//! reverse order of the forward passes:
//!
//! ```
//! use attend_core::attention::AttentionOptions;
//! use attend_core::nn::{Linear, MultiHeadAttention};
//! use attend_core::optim::{AdamW, Optimizer};
//! use ndarray::{Array1, Array2, Array3};
//!
//! let lin = |o: usize, i: usize| Linear::new(Array2::from_elem((o, i), 0.1), Some(Array1::zeros(o))).unwrap();
//! let mut mha = MultiHeadAttention::new(lin(4, 4), lin(4, 4), lin(4, 4), None, 2, 2)?;
//! let mut head = lin(1, 4);
//! let x = Array3::<f32>::from_shape_fn((1, 3, 4), |(_, t, c)| (t + c) as f32 * 0.5);
//! let opts = AttentionOptions::default();
//!
//! let (h, mha_cache) = mha.forward_train(x.view(), &opts)?;
//! let (y, head_cache) = head.forward_train(h.view())?;
//! let dy = y.mapv(|_| 1.0); // d(sum y)/dy
//! let (dh, head_grads) = head.backward(&head_cache, dy.view())?;
//! let (_dx, mha_grads) = mha.backward(&mha_cache, dh.view())?;
//!
//! let mut opt = AdamW::new(1e-3)?;
//! opt.step(&mut mha, &mha_grads)?;
//! opt.step(&mut head, &head_grads)?;
//! # Ok::<(), attend_core::Error>(())
//! ```
//!
//! The arithmetic is written once, generic over the float type, so the finite
//! difference checks run the very same code in f64.

mod attention;
mod embedding;
mod linear;

pub use attention::{MultiHeadAttentionCache, MultiHeadAttentionGrads};
pub use embedding::{EmbeddingCache, EmbeddingGrads};
pub use linear::{LinearCache, LinearGrads};

use ndarray::{Array3, Array4, ArrayD, ArrayView4, NdFloat};

use crate::attention::{
    attention_backward_with, attention_train, AttentionOptions, BackwardConfig, Dropout, Problem,
    Saved,
};
use crate::kernels::backward::reference;
use crate::problem::sum_to_mask_shape;
use crate::Result;

/// The gradients of an attention call in `T`: `(dq, dk, dv)` and the additive
/// mask's, when asked for ([`Scalar::attention_backward`]).
pub type Grads<T> = (Array4<T>, Array4<T>, Array4<T>, Option<ArrayD<T>>);

/// The results of an attention forward in `T`: the output, the log-sum-exp and
/// what rounding the log-sum-exp to `T` left out ([`Scalar::attention_forward`]).
pub type Forward<T> = (Array4<T>, Array3<T>, Array3<T>);

/// A float type the module gradients are computed in: f32 for training (fast
/// kernels), f64 for the gradient checks (reference kernel).
pub trait Scalar: NdFloat + num_traits::FromPrimitive {
    /// Attention forward with optional dropout: output, log-sum-exp, and what
    /// rounding the log-sum-exp to `Self` left out (`Saved::lse_residual`).
    fn attention_forward(
        q: ArrayView4<'_, Self>,
        k: ArrayView4<'_, Self>,
        v: ArrayView4<'_, Self>,
        opts: &AttentionOptions<'_>,
        dropout: Option<&Dropout>,
    ) -> Result<Forward<Self>>;

    /// Attention backward: `(dq, dk, dv)` and, with `bias_grad` and an additive
    /// mask, the mask's gradient shaped like it (summed over its broadcast axes).
    #[allow(clippy::too_many_arguments)]
    fn attention_backward(
        q: ArrayView4<'_, Self>,
        k: ArrayView4<'_, Self>,
        v: ArrayView4<'_, Self>,
        saved: Saved<'_, Self>,
        dout: ArrayView4<'_, Self>,
        opts: &AttentionOptions<'_>,
        dropout: Option<&Dropout>,
        bias_grad: bool,
    ) -> Result<Grads<Self>>;
}

impl Scalar for f32 {
    fn attention_forward(
        q: ArrayView4<'_, f32>,
        k: ArrayView4<'_, f32>,
        v: ArrayView4<'_, f32>,
        opts: &AttentionOptions<'_>,
        dropout: Option<&Dropout>,
    ) -> Result<Forward<f32>> {
        let (out, lse) = attention_train(q, k, v, opts, dropout)?;
        Ok((out, lse.value, lse.residual))
    }

    fn attention_backward(
        q: ArrayView4<'_, f32>,
        k: ArrayView4<'_, f32>,
        v: ArrayView4<'_, f32>,
        saved: Saved<'_>,
        dout: ArrayView4<'_, f32>,
        opts: &AttentionOptions<'_>,
        dropout: Option<&Dropout>,
        bias_grad: bool,
    ) -> Result<Grads<f32>> {
        let config = BackwardConfig {
            dropout: dropout.copied(),
            bias_grad,
            ..Default::default()
        };
        let g = attention_backward_with(q, k, v, saved, dout, opts, &config)?;
        Ok((g.dq, g.dk, g.dv, g.dbias))
    }
}

impl Scalar for f64 {
    fn attention_forward(
        q: ArrayView4<'_, f64>,
        k: ArrayView4<'_, f64>,
        v: ArrayView4<'_, f64>,
        opts: &AttentionOptions<'_>,
        dropout: Option<&Dropout>,
    ) -> Result<Forward<f64>> {
        // The reference backward recomputes its weights: the residual is not read.
        let p = Problem::new(q, k, v, opts)?;
        let f = reference::forward(&p, dropout);
        let residual = Array3::zeros(f.lse.raw_dim());
        Ok((f.out, f.lse, residual))
    }

    fn attention_backward(
        q: ArrayView4<'_, f64>,
        k: ArrayView4<'_, f64>,
        v: ArrayView4<'_, f64>,
        _saved: Saved<'_, f64>,
        dout: ArrayView4<'_, f64>,
        opts: &AttentionOptions<'_>,
        dropout: Option<&Dropout>,
        bias_grad: bool,
    ) -> Result<Grads<f64>> {
        let p = Problem::new(q, k, v, opts)?;
        let g = reference::backward(&p, dout, dropout);
        let shape = opts.bias.as_ref().filter(|_| bias_grad).map(|b| b.shape());
        let dbias = shape.map(|shape| sum_to_mask_shape(g.ds, shape));
        Ok((g.dq, g.dk, g.dv, dbias))
    }
}

#[cfg(test)]
mod tests;
