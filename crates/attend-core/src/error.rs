//! The one error type of the crate.
//!
//! Every message is a single line that names the argument at fault and, for shape
//! problems, the shapes involved, so the command-line tool can print it as is. The
//! variants say what kind of thing went wrong, so that a caller (the Python
//! binding, say) can match on them instead of parsing the text.

use std::path::PathBuf;

use crate::isa::{Isa, IsaError};

/// What went wrong, with a one-line message naming the culprit.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// One argument whose shape is not what the operation needs.
    #[error("{arg} of shape {got:?} must be {want}")]
    Shape {
        /// The argument.
        arg: String,
        /// Its shape.
        got: Vec<usize>,
        /// What its shape must be, in words (`"[B, Hq, L] = [1, 2, 3]"`).
        want: String,
    },
    /// Arguments whose shapes do not fit together; the message names each and its
    /// shape.
    #[error("{0}")]
    ShapeMismatch(String),
    /// A value outside what the operation accepts (NaN, out-of-range id, bad option).
    #[error("{0}")]
    Value(String),
    /// A file that could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file concerned.
        path: PathBuf,
        /// What happened to it.
        #[source]
        source: std::io::Error,
    },
    /// A file whose contents are not what its format requires.
    #[error("{0}")]
    Format(String),
    /// An instruction set was asked for that this CPU does not have.
    #[error("isa {0} is not available on this CPU")]
    IsaUnavailable(Isa),
    /// A kernel was asked for a problem it does not handle.
    #[error("kernel: the {kernel} kernel {reason}")]
    Unsupported {
        /// The kernel (`"fused"`, `"decode"`, `"fused backward"`).
        kernel: &'static str,
        /// What it supports instead.
        reason: &'static str,
    },
}

/// `Result` with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<IsaError> for Error {
    fn from(err: IsaError) -> Self {
        match err {
            IsaError::Unavailable(isa) => Error::IsaUnavailable(isa),
            IsaError::Name(message) => Error::Value(message),
        }
    }
}

impl Error {
    /// Shapes that do not fit together; `msg` names the arguments and their shapes.
    pub fn shape(msg: impl Into<String>) -> Self {
        Error::ShapeMismatch(msg.into())
    }

    /// A bad value; `msg` names the argument and the value.
    pub fn value(msg: impl Into<String>) -> Self {
        Error::Value(msg.into())
    }

    /// A malformed file or document.
    pub fn format(msg: impl Into<String>) -> Self {
        Error::Format(msg.into())
    }

    /// This error with `what` put before its message (`"{what}: {message}"`), its
    /// variant kept: for a caller that knows what was being read (a file, a
    /// tensor) when a function that does not know it failed. An `Io` error
    /// already names its file, and `IsaUnavailable` and `Unsupported` name no
    /// argument, so those are returned as they are.
    pub fn context(self, what: impl std::fmt::Display) -> Self {
        match self {
            Error::Shape { arg, got, want } => Error::Shape {
                arg: format!("{what}: {arg}"),
                got,
                want,
            },
            Error::ShapeMismatch(m) => Error::ShapeMismatch(format!("{what}: {m}")),
            Error::Value(m) => Error::Value(format!("{what}: {m}")),
            Error::Format(m) => Error::Format(format!("{what}: {m}")),
            other @ (Error::Io { .. } | Error::IsaUnavailable(_) | Error::Unsupported { .. }) => {
                other
            }
        }
    }

    /// An I/O failure on `path`: an [`std::io::Error`] is kept as the source, as
    /// is; anything else (a message such as `"not found"`) becomes one.
    pub fn io(
        path: impl AsRef<std::path::Path>,
        err: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        let source = match err.into().downcast::<std::io::Error>() {
            Ok(io) => *io,
            Err(other) => std::io::Error::other(other),
        };
        Error::Io {
            path: path.as_ref().to_path_buf(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_keep_their_kind_and_message() {
        let missing = std::io::Error::from(std::io::ErrorKind::NotFound);
        let err = Error::io("model/config.json", missing);
        let Error::Io { source, .. } = &err else {
            panic!("not an Io error: {err:?}");
        };
        assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        assert!(err.to_string().starts_with("model/config.json: "), "{err}");
        let err = Error::io("tokenizer.json", "tokenizer file not found");
        assert_eq!(err.to_string(), "tokenizer.json: tokenizer file not found");
    }

    #[test]
    fn context_keeps_the_variant() {
        let err = Error::value("eps is NaN").context("model.safetensors");
        assert!(matches!(err, Error::Value(_)), "{err:?}");
        assert_eq!(err.to_string(), "model.safetensors: eps is NaN");
        let err = Error::Shape {
            arg: "w".into(),
            got: vec![2],
            want: "[3]".into(),
        }
        .context("f");
        assert!(matches!(err, Error::Shape { .. }), "{err:?}");
        assert_eq!(err.to_string(), "f: w of shape [2] must be [3]");
        let err = Error::io("a.bin", "not found").context("b");
        assert_eq!(err.to_string(), "a.bin: not found");
    }
}
