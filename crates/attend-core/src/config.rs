//! How to run an attention call: which kernel, instruction set and threads. Below
//! `element` and `attention`, which both name it (docs/design.md, "Layers"); the
//! public API reaches it as `attention::{Config, Kernel}`.

use crate::isa::Isa;

/// Which kernel computes an attention call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Kernel {
    /// The decode kernel for at most [`DECODE_MAX_QUERIES`] queries, else the fused
    /// kernel when it supports the problem, else the reference.
    #[default]
    Auto,
    /// The f64 reference (materialises the scores; slow, exact-ish).
    Reference,
    /// The fused kernel; an error if it does not support the problem.
    Fused,
    /// The split-KV decode kernel ([`crate::kernels::decode`]), made for 1 to
    /// [`DECODE_MAX_QUERIES`] queries against many keys; an error if it does not
    /// support the problem.
    Decode,
}

/// [`Kernel::Auto`] runs the decode kernel for at most this many queries.
pub const DECODE_MAX_QUERIES: usize = 16;

/// How to run an attention call: kernel, instruction set and threads.
///
/// The result has the same bits whatever `threads` is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// Which kernel to use.
    pub kernel: Kernel,
    /// Instruction set for the fused kernel; `None` picks the best this CPU has.
    pub isa: Option<Isa>,
    /// Worker threads; `None` runs on the current rayon pool (the global one unless
    /// called inside `ThreadPool::install`).
    pub threads: Option<usize>,
}
