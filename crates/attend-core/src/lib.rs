//! `attend`'s numerical core, above the instruction sets (`attend-simd`) and below
//! the models and explanations: attention and its kernels (forward, backward,
//! decoding), the KV cache, modules, gradients and optimisers, safetensors and
//! `.npy`, PyTorch's generator and initialisers (docs/design.md, "The crates and
//! their layers"). Reach it through the `attend` crate, which re-exports every
//! module under the same name.
#![warn(missing_docs)]

pub mod attention;
mod config;
pub mod decode;
pub mod element;
pub mod error;
pub mod grad;
pub mod init;
pub mod io;
// The instruction sets live in their own crate, the lowest layer.
pub(crate) use attend_simd as isa;
pub mod kernels;
pub mod kv_cache;
pub mod limits;
pub mod memory;
pub mod nn;
pub mod optim;
pub mod problem;
pub mod rng;
pub mod threads;

pub use error::{Error, Result};
