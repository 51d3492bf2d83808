//! Where the library's work runs: off the GIL, on a thread pool built once per
//! thread count, with panics caught.
//!
//! Building a rayon pool costs far more than a small attention call, and Python
//! passes a thread count with every call (it follows `torch.get_num_threads()`), so
//! the library's pools ([`attend::threads::pool`]), kept and reused, run the work.
//! Those pools belong to one process (a forked child builds its own), so all of the
//! work runs on them and none on rayon's global pool, whose threads a forked child
//! would lack and which cannot be rebuilt.

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::errors::to_py;

/// Runs `work` without the GIL on a pool of `threads` workers. A library error
/// becomes `ValueError`/`OSError`; a panic (a bug, never bad input) becomes a
/// `RuntimeError` instead of unwinding into Python.
pub fn run<R: Send>(
    py: Python<'_>,
    threads: usize,
    work: impl FnOnce() -> attend::Result<R> + Send,
) -> PyResult<R> {
    let pool = attend::threads::pool(threads).map_err(to_py)?;
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

/// The instruction set the kernels run on this CPU (`"avx512bf16"`, `"avx512"`,
/// `"avx2vnni"`, `"avx2"`, `"portable"`; at most the one `ATTEND_MAX_ISA` names),
/// so benchmarks can say which path ran.
#[pyfunction]
pub fn isa() -> String {
    attend::kernels::Isa::detect().name().to_owned()
}
