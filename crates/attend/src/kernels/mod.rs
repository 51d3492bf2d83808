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
