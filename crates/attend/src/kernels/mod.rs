//! Attention kernels. [`reference`] is the oracle every other kernel is judged by;
//! [`fused`] is the fast forward, built on the per-ISA vectors in `simd`.

pub mod backward;
pub mod fused;
pub mod reference;
pub(crate) mod simd;

pub use simd::Isa;
