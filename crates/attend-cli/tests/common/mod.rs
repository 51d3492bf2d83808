//! What several test files need.

use std::path::PathBuf;

/// all-MiniLM-L6-v2, fetched by scripts/fetch-model into $ATTEND_MODEL_DIR or
/// ~/.cache/attend/all-minilm-l6-v2; the tests that need it fail when it is missing.
pub fn model_dir() -> PathBuf {
    let dir = std::env::var_os("ATTEND_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/attend/all-minilm-l6-v2")
        });
    assert!(
        dir.join("model.safetensors").is_file(),
        "all-MiniLM-L6-v2 is not at {}: run scripts/fetch-model (or set ATTEND_MODEL_DIR)",
        dir.display()
    );
    dir
}
