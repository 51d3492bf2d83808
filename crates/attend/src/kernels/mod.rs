//! Attention kernels. [`reference`] is the oracle every other kernel is judged by.

pub mod backward;
pub mod reference;
