//! Modules: [`Linear`], [`Embedding`], [`LayerNorm`] and the canonical
//! [`MultiHeadAttention`].
//!
//! Every notebook variant of attention is the same [`MultiHeadAttention`] with
//! different weights; [`initialisers`] draws those weights in PyTorch's order and
//! [`state_dict`] reads and writes them under PyTorch's names.

mod activation;
mod attention;
mod attention_decode;
mod embedding;
pub mod initialisers;
mod layer_norm;
mod linear;
mod matmul;
pub mod state_dict;

pub use activation::Activation;
pub use attention::{heads_view, merge_heads, split_heads, ModuleTrace, MultiHeadAttention};
pub use embedding::Embedding;
pub use layer_norm::LayerNorm;
pub use linear::Linear;
