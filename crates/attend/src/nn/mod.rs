//! Modules: [`Linear`], [`Embedding`] and the canonical [`MultiHeadAttention`].
//!
//! Every notebook variant of attention is the same [`MultiHeadAttention`] with
//! different weights; [`initialisers`] draws those weights in PyTorch's order.

mod attention;
mod attention_decode;
mod embedding;
pub mod initialisers;
mod linear;

pub use attention::{merge_heads, split_heads, ModuleTrace, MultiHeadAttention};
pub use embedding::Embedding;
pub use linear::Linear;
