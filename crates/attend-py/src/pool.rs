//! Where the library's work runs: off the GIL, on a thread pool built once per
//! thread count, with panics caught.
//!
//! Building a rayon pool costs far more than a small attention call, and Python
//! passes a thread count with every call (it follows `torch.get_num_threads()`), so
//! the library's pools ([`attend::threads::pool`]), kept and reused, run the work.
//! Those pools belong to one process (a forked child builds its own), so all of the
//! work runs on them and none on rayon's global pool, whose threads a forked child
//! would lack and which cannot be rebuilt.
//!
//! A call that asks for one thread, or whose work is too small to gain from a
//! second, runs on the calling thread itself, as the one worker of a pool of its
//! own: handing work to a pool's sleeping worker and being woken back costs more
//! than a tiny attention call (scripts/bench/op-overhead). That pool has no thread
//! but its caller, so a forked child's copy of it works as the parent's did.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::sync_channel;
use std::sync::Arc;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use rayon::ThreadPool;

use crate::errors::to_py;

/// Below this many multiply-adds a call runs on the calling thread alone: one
/// thread finishes it before a pool's workers would have taken it and handed it
/// back (scripts/bench/op-overhead times both sides of it).
pub const SMALL_WORK: usize = 1 << 21;

thread_local! {
    /// This thread as the one worker of a pool of its own (`None` where it cannot
    /// be one: a thread already working for another rayon pool).
    static CALLER: Option<Arc<ThreadPool>> = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .use_current_thread()
        .build()
        .ok()
        .map(Arc::new);
}

/// Runs `work` without the GIL on a pool of `threads` workers. A library error
/// becomes `ValueError`/`OSError`; a panic (a bug, never bad input) becomes a
/// `RuntimeError` instead of unwinding into Python.
pub fn run<R: Send>(
    py: Python<'_>,
    threads: usize,
    work: impl FnOnce() -> attend::Result<R> + Send,
) -> PyResult<R> {
    run_sized(py, threads, usize::MAX, work)
}

/// [`run`] for work of about `madds` multiply-adds: on the calling thread when
/// that is under [`SMALL_WORK`] or `threads` is 1.
pub fn run_sized<R: Send>(
    py: Python<'_>,
    threads: usize,
    madds: usize,
    work: impl FnOnce() -> attend::Result<R> + Send,
) -> PyResult<R> {
    attend::limits::threads("threads", threads).map_err(to_py)?;
    let caller = if threads == 1 || madds < SMALL_WORK {
        CALLER.try_with(Clone::clone).ok().flatten()
    } else {
        None
    };
    let outcome = match caller {
        Some(own) => py.detach(|| catch_unwind(AssertUnwindSafe(|| own.install(work)))),
        None => {
            let pool = attend::threads::pool(threads).map_err(to_py)?;
            // From a thread outside every pool, `install` hands over and sleeps.
            if rayon::current_thread_index().is_none() {
                py.detach(|| catch_unwind(AssertUnwindSafe(|| pool.install(work))))
            } else {
                py.detach(|| hand_over(&pool, work))
            }
        }
    };
    match outcome {
        Ok(result) => result.map_err(to_py),
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("unknown panic");
            Err(PyRuntimeError::new_err(format!(
                "attend: internal error (a bug, please report it): {what}"
            )))
        }
    }
}

/// Runs `work` on one of `pool`'s workers while this thread sleeps until it is
/// done, for a thread that is a worker of another pool (one that has run a small
/// call: its [`CALLER`] pool). `ThreadPool::install` from such a thread waits by
/// spinning through its own pool's queue first, which on two CPUs takes one from
/// the workers while they run.
fn hand_over<R: Send>(
    pool: &ThreadPool,
    work: impl FnOnce() -> R + Send,
) -> std::thread::Result<R> {
    let (done, result) = sync_channel(1);
    let job: Box<dyn FnOnce() + Send + '_> = Box::new(move || {
        let _ = done.send(catch_unwind(AssertUnwindSafe(work)));
    });
    // SAFETY: `spawn` takes a job that borrows nothing, and `job` borrows what
    // `work` borrows from the caller's frame. This function returns only once the
    // job has sent its result, after `work` has run and been dropped: what the job
    // still holds then (the sender) is its own. The kept pools never drop a job
    // unrun (they live as long as the process); were one dropped, `work` would be
    // dropped unrun with it and `recv` would fail.
    let job: Box<dyn FnOnce() + Send + 'static> = unsafe { std::mem::transmute(job) };
    pool.spawn(job);
    result
        .recv()
        .unwrap_or_else(|_| Err(Box::new("the thread pool dropped the call unrun")))
}

/// The instruction set the kernels run on this CPU (`"amx"`, `"avx512bf16"`, `"avx512"`,
/// `"avx2vnni"`, `"avx2"`, `"portable"`; at most the one `ATTEND_MAX_ISA` names),
/// so benchmarks can say which path ran.
#[pyfunction]
pub fn isa() -> String {
    attend::kernels::Isa::detect().name().to_owned()
}
