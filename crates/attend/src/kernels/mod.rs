//! Attention kernels. [`reference`] is the oracle every other kernel is judged by;
//! [`fused`] is the fast forward, built on the per-ISA vectors in `simd`;
//! [`decode`] is the split-KV kernel for short queries against long key caches.

pub mod backward;
pub mod decode;
pub mod fused;
pub mod reference;
pub(crate) mod simd;

pub use simd::Isa;
