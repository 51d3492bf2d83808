//! `attend`: self-attention that is faithful to PyTorch and fast on CPU.
//!
//! The README follows; its examples run as doctests.
#![doc = include_str!("../../../README.md")]
#![warn(missing_docs)]

pub mod attention;
pub mod corpus;
pub mod decode;
pub mod element;
pub mod error;
pub mod experiment;
pub mod grad;
pub mod init;
pub mod io;
pub(crate) mod isa;
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
