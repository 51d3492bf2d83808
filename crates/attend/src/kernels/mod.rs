//! Attention kernels. [`mod@reference`] is the oracle every other kernel is judged by;
//! [`fused`] is the fast forward, built on the per-ISA vectors in `simd`;
//! [`decode`] is the split-KV kernel for short queries against long key caches.

pub mod backward;
pub mod decode;
pub mod fused;
pub mod reference;
pub(crate) mod simd;

pub use simd::Isa;

use crate::{Error, Result};

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

/// Runs `f` on a pool of `threads` workers, or on the current pool.
pub(crate) fn with_threads<R: Send>(
    threads: Option<usize>,
    f: impl FnOnce() -> R + Send,
) -> Result<R> {
    match threads {
        None => Ok(f()),
        Some(n) => {
            crate::limits::threads("threads", n)?;
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .map_err(|e| Error::value(format!("threads: cannot start {n} threads: {e}")))?;
            Ok(pool.install(f))
        }
    }
}
