//! The one error type of the crate.
//!
//! Every message is a single line that names the argument at fault and, for shape
//! problems, both shapes involved, so the command-line tool can print it as is.

/// What went wrong, with a one-line message naming the culprit.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Arrays whose shapes do not fit together.
    #[error("{0}")]
    Shape(String),
    /// A value outside what the operation accepts (NaN, out-of-range id, bad option).
    #[error("{0}")]
    Value(String),
    /// A file that could not be read or written.
    #[error("{path}: {message}")]
    Io {
        /// The file concerned.
        path: String,
        /// What happened to it.
        message: String,
    },
    /// A file whose contents are not what its format requires.
    #[error("{0}")]
    Format(String),
}

/// `Result` with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A shape mismatch; `msg` names the argument and both shapes.
    pub fn shape(msg: impl Into<String>) -> Self {
        Error::Shape(msg.into())
    }

    /// A bad value; `msg` names the argument and the value.
    pub fn value(msg: impl Into<String>) -> Self {
        Error::Value(msg.into())
    }

    /// A malformed file or document.
    pub fn format(msg: impl Into<String>) -> Self {
        Error::Format(msg.into())
    }

    /// An I/O failure on `path`.
    pub fn io(path: impl AsRef<std::path::Path>, err: impl std::fmt::Display) -> Self {
        Error::Io {
            path: path.as_ref().display().to_string(),
            message: err.to_string(),
        }
    }
}
