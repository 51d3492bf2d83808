//! `attend`: self-attention that is faithful to PyTorch and fast on CPU.
//!
//! This crate is the one API over the layers, each its own crate (docs/design.md,
//! "The crates and their layers"): the instruction sets (`attend-simd`), the
//! numerical core (`attend-core`), the real encoders (`attend-models`) and the
//! explanations (`attend-explain`); every module is re-exported here under its name.
//!
//! The README follows; its examples run as doctests.
#![doc = include_str!("../../../README.md")]
#![warn(missing_docs)]

/// The examples of docs/cli.md, run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/cli.md")]
pub struct CommandLineDocs;

/// The examples of docs/measurements.md, run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/measurements.md")]
pub struct MeasurementsDocs;

pub use attend_core::{
    attention, decode, element, error, grad, init, io, kernels, kv_cache, limits, memory, nn,
    optim, problem, rng, threads, Error, Result,
};
pub use attend_explain::{experiment, print, text, train, viz, walkthrough};
pub use attend_models::{corpus, models};

pub mod timing;
