//! The library's errors as Python exceptions, with the same one-line messages the
//! command line prints.

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::PyErr;

/// `attend::Error` → `ValueError` (shapes, values, malformed files) or `OSError`
/// (a file that could not be read or written).
pub fn to_py(err: attend::Error) -> PyErr {
    match err {
        attend::Error::Io { .. } => PyOSError::new_err(err.to_string()),
        attend::Error::Shape(_) | attend::Error::Value(_) | attend::Error::Format(_) => {
            PyValueError::new_err(err.to_string())
        }
    }
}
