//! Worker threads: rayon pools built once per thread count and reused
//! (docs/design.md, "Scratch and threads").
//!
//! A call that names a thread count runs on a pool of that many workers. Building
//! a pool starts threads, which costs more than a decoding step, so pools are kept
//! for the life of the process, one per thread count asked for.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use rayon::ThreadPool;

use crate::{Error, Result};

/// The pool of `n` workers, built on first use.
pub fn pool(n: usize) -> Result<Arc<ThreadPool>> {
    static POOLS: Mutex<Option<HashMap<usize, Arc<ThreadPool>>>> = Mutex::new(None);
    crate::limits::threads("threads", n)?;
    let mut pools = POOLS.lock().unwrap_or_else(PoisonError::into_inner);
    let pools = pools.get_or_insert_with(HashMap::new);
    if let Some(pool) = pools.get(&n) {
        return Ok(Arc::clone(pool));
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(move |i| format!("attend-{n}-{i}"))
        .build()
        .map_err(|e| Error::value(format!("threads: cannot start {n} threads: {e}")))?;
    let pool = Arc::new(pool);
    pools.insert(n, Arc::clone(&pool));
    Ok(pool)
}

/// Runs `f` on the pool of `threads` workers, or on the current pool (the global
/// one unless called inside `ThreadPool::install`) when `threads` is `None`.
pub fn install<R: Send>(threads: Option<usize>, f: impl FnOnce() -> R + Send) -> Result<R> {
    match threads {
        None => Ok(f()),
        Some(n) => Ok(pool(n)?.install(f)),
    }
}
