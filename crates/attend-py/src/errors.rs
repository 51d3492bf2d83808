//! The library's errors as Python exceptions, with the same one-line messages the
//! command line prints.
//!
//! Bad values and shapes raise `attend.AttendValueError`, which is both a
//! `ValueError` (what attend raised before) and a `RuntimeError` (what PyTorch
//! raises for the same calls), so that code written for either catches it. The
//! classes live in `attend/_errors.py`, since a PyO3 exception has one base only.

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

static VALUE_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static TYPE_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// `attend::Error` → `AttendValueError` (shapes, values, malformed files, an
/// instruction set or kernel that cannot run the call) or `OSError` (a file that
/// could not be read or written).
pub fn to_py(err: attend::Error) -> PyErr {
    match err {
        attend::Error::Io { .. } => PyOSError::new_err(err.to_string()),
        attend::Error::Shape { .. }
        | attend::Error::ShapeMismatch(_)
        | attend::Error::Value(_)
        | attend::Error::Format(_)
        | attend::Error::IsaUnavailable(_)
        | attend::Error::Unsupported { .. } => value_error(err.to_string()),
    }
}

/// An `attend.AttendValueError` with `message`.
pub fn value_error(message: String) -> PyErr {
    attend_error(&VALUE_ERROR, "AttendValueError", message)
}

/// An `attend.AttendTypeError` (both `TypeError` and `RuntimeError`) with `message`.
pub fn type_error(message: String) -> PyErr {
    attend_error(&TYPE_ERROR, "AttendTypeError", message)
}

fn attend_error(class: &PyOnceLock<Py<PyType>>, name: &str, message: String) -> PyErr {
    Python::attach(|py| match class.import(py, "attend._errors", name) {
        Ok(class) => PyErr::from_type(class.clone(), message),
        Err(import) => import,
    })
}
