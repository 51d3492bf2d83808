//! How to run an attention call: which kernel, instruction set and threads. Below
//! `element` and `attention`, which both name it (docs/design.md, "Layers"); the
//! public API reaches it as `attention::{Config, Kernel}`.

use crate::isa::{Isa, IsaToken};
use crate::Result;

/// Which kernel computes an attention call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Kernel {
    /// The decode kernel where it is the faster one (a few queries against many
    /// keys: [`auto_decodes`](crate::attention::auto_decodes)), else the fused
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

/// The most queries the decode kernel ([`Kernel::Decode`]) is made for: a KV
/// cache's steps up to this long run it.
pub const DECODE_MAX_QUERIES: usize = 16;

/// Where a call runs: its instruction set and its threads. Every call's
/// configuration holds one ([`Config::exec`],
/// [`BackwardConfig::exec`](crate::attention::BackwardConfig::exec)); decoding takes
/// one as it is ([`DecodeConfig`](crate::decode::DecodeConfig)).
///
/// Results have the same bits whatever `threads` is.
///
/// ```
/// use attend_core::attention::{Config, Exec, Kernel};
/// use attend_core::kernels::Isa;
///
/// let one_core = Config {
///     kernel: Kernel::Fused,
///     exec: Exec { isa: Some(Isa::Portable), threads: Some(1) },
/// };
/// assert_eq!(one_core.exec.threads, Some(1));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Exec {
    /// Instruction set; `None` picks the best this CPU has ([`Isa::detect`]).
    pub isa: Option<Isa>,
    /// Worker threads; `None` runs on the current rayon pool (the global one unless
    /// called inside `ThreadPool::install`).
    pub threads: Option<usize>,
}

impl Exec {
    /// The token of the instruction set asked for, or of the best one; an error if
    /// this CPU lacks the one asked for.
    pub(crate) fn token(&self) -> Result<IsaToken> {
        Ok(Isa::resolve(self.isa)?.token()?)
    }

    /// Runs `f` on the threads asked for ([`crate::threads::install`]).
    pub(crate) fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> Result<R> {
        crate::threads::install(self.threads, f)
    }
}

/// How to run an attention call: which kernel, and where.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// Which kernel to use.
    pub kernel: Kernel,
    /// Instruction set and threads.
    pub exec: Exec,
}
