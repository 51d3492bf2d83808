//! The library's errors as Python exceptions, with the same one-line messages the
//! command line prints.

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::PyErr;

/// `attend::Error` → `ValueError` (shapes, values, malformed files, an instruction
/// set or kernel that cannot run the call) or `OSError`
/// (a file that could not be read or written).
pub fn to_py(err: attend::Error) -> PyErr {
    match err {
        attend::Error::Io { .. } => PyOSError::new_err(err.to_string()),
        attend::Error::Shape { .. }
        | attend::Error::ShapeMismatch(_)
        | attend::Error::Value(_)
        | attend::Error::Format(_)
        | attend::Error::IsaUnavailable(_)
        | attend::Error::Unsupported { .. } => PyValueError::new_err(err.to_string()),
    }
}
