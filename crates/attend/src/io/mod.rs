//! Reading and writing arrays in files: safetensors and `.npy`.

pub mod npy;
pub mod safetensors;

use std::path::Path;

use crate::{Error, Result};

/// Writes `bytes` to a temporary file next to `path` and renames it over `path`, so
/// a failed or interrupted write never leaves a half-written file behind.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| Error::value(format!("{}: not a file name", path.display())))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let written = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path));
    written.map_err(|e| {
        // The temporary file may exist (the rename failed); it is ours to remove.
        let _ = std::fs::remove_file(&tmp);
        Error::io(path, e)
    })
}
