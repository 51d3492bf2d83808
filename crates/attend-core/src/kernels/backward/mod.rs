//! Attention backward kernels: `dQ`, `dK`, `dV` from `dO` (chosen and called by
//! [`crate::attention::attention_backward_with`]).
//!
//! Two kernels compute the same thing: `reference` (f64, materialises every
//! probability, any softmax axis) and [`fused`] (FlashAttention-2 style: recomputes
//! the probabilities block by block from the saved log-sum-exp, never holds an
//! `L × S` matrix, parallel over key blocks so that even one head keeps every core
//! busy, and bit-for-bit deterministic whatever the thread count).

mod coarse;
pub mod fused;
pub(crate) mod reference;

use ndarray::{Array4, ArrayD};

/// The gradients of an attention call with respect to its three inputs, in the
/// inputs' element type `T` (bf16 gradients are the f32 ones rounded once).
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionGrads<T = f32> {
    /// `∂loss/∂q`, shaped like `q`.
    pub dq: Array4<T>,
    /// `∂loss/∂k`, shaped like `k` (grouped heads summed).
    pub dk: Array4<T>,
    /// `∂loss/∂v`, shaped like `v` (grouped heads summed).
    pub dv: Array4<T>,
    /// `∂loss/∂bias`, shaped like the additive mask as the caller gave it (summed
    /// over the axes it was broadcast along): the scores' gradient `dS`, 0 where a
    /// key is hidden. Only when asked for (`BackwardConfig::bias_grad`) and there
    /// is an additive mask.
    pub dbias: Option<ArrayD<f32>>,
}
