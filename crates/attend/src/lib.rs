//! `attend`: self-attention that is faithful to PyTorch and fast on CPU.
//!
//! The README follows; its examples run as doctests.
#![doc = include_str!("../../../README.md")]
#![warn(missing_docs)]

pub mod attention;
mod config;
pub mod corpus;
pub mod decode;
pub mod element;
pub mod error;
pub mod experiment;
pub mod grad;
pub mod init;
pub mod io;
// The instruction sets live in their own crate, the lowest layer.
pub(crate) use attend_simd as isa;
pub mod kernels;
pub mod kv_cache;
pub mod limits;
pub mod memory;
pub mod models;
pub mod nn;
pub mod optim;
pub mod print;
pub mod problem;
pub mod rng;
pub mod text;
pub mod threads;
pub mod train;
pub mod viz;
pub mod walkthrough;

pub use error::{Error, Result};
