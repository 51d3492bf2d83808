//! Where `--model` points when it is not given.

use std::path::PathBuf;

/// `--model DIR`, else `$ATTEND_MODEL_DIR`, else `~/.cache/attend/all-minilm-l6-v2`
/// (where `scripts/fetch-model` puts all-MiniLM-L6-v2).
pub fn resolve(arg: Option<PathBuf>) -> PathBuf {
    arg.or_else(|| std::env::var_os("ATTEND_MODEL_DIR").map(PathBuf::from))
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_default();
            home.join(".cache/attend/all-minilm-l6-v2")
        })
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
