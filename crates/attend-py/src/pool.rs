//! Where the library's work runs: off the GIL, on a thread pool built once per
//! thread count, with panics caught.
//!
//! Building a rayon pool costs far more than a small attention call, and Python
//! passes a thread count with every call (it follows `torch.get_num_threads()`), so
//! pools are kept and reused.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use rayon::ThreadPool;

use crate::errors::to_py;

/// More threads than this is a mistake, not a request (each is a real OS thread).
const MAX_THREADS: usize = 1024;

static POOLS: Mutex<Vec<(usize, Arc<ThreadPool>)>> = Mutex::new(Vec::new());

fn pool(threads: usize) -> PyResult<Arc<ThreadPool>> {
    if threads == 0 || threads > MAX_THREADS {
        return Err(PyValueError::new_err(format!(
            "threads must be between 1 and {MAX_THREADS}, got {threads}"
        )));
    }
    let mut pools = POOLS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((_, p)) = pools.iter().find(|(n, _)| *n == threads) {
        return Ok(Arc::clone(p));
    }
    let p = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("attend-{i}"))
        .build()
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start {threads} threads: {e}")))?;
    let p = Arc::new(p);
    pools.push((threads, Arc::clone(&p)));
    Ok(p)
}

/// Runs `work` without the GIL on a pool of `threads` workers. A library error
/// becomes `ValueError`/`OSError`; a panic (a bug, never bad input) becomes a
/// `RuntimeError` instead of unwinding into Python.
pub fn run<R: Send>(
    py: Python<'_>,
    threads: usize,
    work: impl FnOnce() -> attend::Result<R> + Send,
) -> PyResult<R> {
    let pool = pool(threads)?;
    let outcome = py.detach(|| catch_unwind(AssertUnwindSafe(|| pool.install(work))));
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

/// The instruction set the kernels run on this CPU (`"avx512"`, `"avx2"`,
/// `"portable"`), so benchmarks can say which path ran.
#[pyfunction]
pub fn isa() -> String {
    format!("{:?}", attend::kernels::Isa::detect()).to_lowercase()
}
