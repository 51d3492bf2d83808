//! Attention kernels. [`reference`] is the oracle every other kernel is judged by;
//! [`decode`] is the split-KV kernel for short queries against long key caches.

pub mod decode;
pub mod reference;
