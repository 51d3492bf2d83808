//! Attention kernels. [`mod@reference`] is the oracle every other kernel is judged by;
//! [`fused`] is the fast forward and [`backward`] the gradients, both written once
//! over the 16-lane vectors of each instruction set (`Isa`); [`decode`] is the
//! split-KV kernel for short queries against long key caches. `tile` is the
//! register tile of the backward's products and of the dense layers' (`nn`).
//!
//! Kernels take a validated [`Problem`](crate::problem::Problem) and a detected
//! instruction set; choosing the kernel, the instruction set and the threads is the
//! job of [`crate::attention`], above them (docs/design.md, "Layers").

pub mod backward;
pub mod decode;
pub mod fused;
pub mod lse;
pub(crate) mod merge;
pub mod reference;
pub(crate) mod round;
pub(crate) mod scratch;
mod stream;
pub(crate) mod tile;

pub use crate::isa::{Isa, IsaError, MAX_ISA_VAR};
pub use stream::stream_sum;

/// The larger of `a` and `b`, NaN if either is: a row's running maximum must carry
/// a NaN score to the softmax (which then gives NaN, as the f64 reference and
/// PyTorch's math backend do), where `f32::max` would drop it and make a row of
/// NaN scores look fully masked.
pub(crate) fn nan_max<F: num_traits::Float>(a: F, b: F) -> F {
    if a.is_nan() || b.is_nan() {
        F::nan()
    } else if b > a {
        b
    } else {
        a
    }
}
