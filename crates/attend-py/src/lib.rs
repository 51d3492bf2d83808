//! `attend._attend`: the compiled half of the `attend` Python package.
//!
//! A thin skin over the `attend` crate: every function here converts arrays,
//! releases the GIL, runs the library on a cached thread pool and turns its errors
//! into Python exceptions. The Python half (`python/attend/`) gives these functions
//! PyTorch's and sentence-transformers' signatures; nothing is implemented twice.

mod dlpack;
mod encoder;
mod errors;
mod explain;
mod pool;
mod sdpa;
mod shapes;
mod shortcut;

use pyo3::prelude::*;

#[pymodule]
fn _attend(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // An instruction-set cap the kernels would ignore fails the import.
    attend::kernels::Isa::env_cap().map_err(|err| errors::to_py(err.into()))?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("SMALL_WORK", pool::SMALL_WORK)?;
    m.add_class::<sdpa::Options>()?;
    m.add_function(wrap_pyfunction!(sdpa::sdpa_shapes, m)?)?;
    m.add_function(wrap_pyfunction!(sdpa::sdpa_forward, m)?)?;
    m.add_function(wrap_pyfunction!(sdpa::sdpa_forward_tensors, m)?)?;
    m.add_function(wrap_pyfunction!(sdpa::sdpa_backward_tensors, m)?)?;
    m.add_class::<shortcut::ForwardShortcut>()?;
    m.add_function(wrap_pyfunction!(pool::isa, m)?)?;
    m.add_function(wrap_pyfunction!(explain::explain_experiment, m)?)?;
    m.add_function(wrap_pyfunction!(explain::explain_model, m)?)?;
    m.add_class::<encoder::SentenceEncoder>()?;
    m.add_class::<explain::Walkthrough>()?;
    Ok(())
}
