//! Where `--model` points when it is not given.

use std::path::PathBuf;

use attend::Error;

/// `--model DIR`, else `$ATTEND_MODEL_DIR`, else `~/.cache/attend/all-minilm-l6-v2`
/// (where `scripts/fetch-model` puts all-MiniLM-L6-v2). Without a home directory
/// there is no default: a path relative to the working directory would load
/// whatever happens to be there.
pub fn resolve(arg: Option<PathBuf>) -> Result<PathBuf, Error> {
    let given = |v: Option<std::ffi::OsString>| v.filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = arg.or_else(|| given(std::env::var_os("ATTEND_MODEL_DIR"))) {
        return Ok(dir);
    }
    match given(std::env::var_os("HOME")) {
        Some(home) if home.is_absolute() => Ok(home.join(".cache/attend/all-minilm-l6-v2")),
        _ => Err(Error::value(
            "no model directory: pass --model DIR or set ATTEND_MODEL_DIR (HOME is unset or not absolute, so there is no ~/.cache/attend/all-minilm-l6-v2 to default to)",
        )),
    }
}

/// Output formats of the model commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Plain text for people.
    Text,
    /// One JSON object.
    Json,
}

/// `[[a, b], [c, d]]` with each `f32` in its shortest round-trip form (serde_json
/// would widen them to `f64` and print 17 digits).
pub fn json_matrix<'a>(rows: impl IntoIterator<Item = ndarray::ArrayView1<'a, f32>>) -> String {
    let rows: Vec<String> = rows
        .into_iter()
        .map(|r| {
            let xs: Vec<String> = r
                .iter()
                .map(|x| {
                    if x.is_finite() {
                        x.to_string()
                    } else {
                        "null".into()
                    }
                })
                .collect();
            format!("[{}]", xs.join(","))
        })
        .collect();
    format!("[{}]", rows.join(","))
}
