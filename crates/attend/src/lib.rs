//! `attend`: self-attention that is faithful to PyTorch and fast on CPU.
//!
//! The README follows; its examples run as doctests.
#![doc = include_str!("../../../README.md")]
#![warn(missing_docs)]

pub mod error;
pub mod init;
pub mod print;
pub mod rng;

pub use error::{Error, Result};
pub mod attention;
pub mod decode;
pub mod experiment;
pub mod kernels;
pub mod kv_cache;
pub mod nn;
pub mod text;
