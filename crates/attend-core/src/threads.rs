//! Worker threads: rayon pools built once per thread count and reused, in each
//! process (docs/design.md, "Scratch and threads").
//!
//! A call that names a thread count runs on a pool of that many workers. Building
//! a pool starts threads, which costs more than a decoding step, so pools are kept
//! for the life of the process, one per thread count asked for.
//!
//! A forked child inherits the kept pools but none of their threads (fork copies
//! only the thread that called it): a job handed to such a pool would wait forever.
//! So the pools belong to the process that built them, and a child that asks for a
//! pool builds its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use rayon::ThreadPool;

use crate::{Error, Result};

/// The pools one process built, by thread count.
struct Pools {
    /// The process they belong to (their threads run there).
    pid: u32,
    by_count: HashMap<usize, Arc<ThreadPool>>,
}

/// The pool of `n` workers of this process, built on first use.
pub fn pool(n: usize) -> Result<Arc<ThreadPool>> {
    static POOLS: Mutex<Option<Pools>> = Mutex::new(None);
    crate::limits::threads("threads", n)?;
    let mut pools = POOLS.lock().unwrap_or_else(PoisonError::into_inner);
    let pid = std::process::id();
    if pools.as_ref().is_some_and(|p| p.pid != pid) {
        // A forked child's copy of its parent's pools. Dropping a pool wakes its
        // threads to end them, through locks that fork may have copied while a
        // parent's thread held them; these threads are not here, so the copies are
        // left as they are (a small leak, once per fork).
        std::mem::forget(pools.take());
    }
    let pools = pools.get_or_insert_with(|| Pools {
        pid,
        by_count: HashMap::new(),
    });
    if let Some(pool) = pools.by_count.get(&n) {
        return Ok(Arc::clone(pool));
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(move |i| format!("attend-{n}-{i}"))
        .build()
        .map_err(|e| Error::value(format!("threads: cannot start {n} threads: {e}")))?;
    let pool = Arc::new(pool);
    pools.by_count.insert(n, Arc::clone(&pool));
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
