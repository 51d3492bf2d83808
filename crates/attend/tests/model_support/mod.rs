//! Shared helpers of the real-model tests: where a checkpoint is, and loading it
//! once. The tests fail (they do not skip) when the model is missing.
#![allow(dead_code)]

use std::path::PathBuf;

use attend::models::SentenceEncoder;

/// A real checkpoint the tests read: the variable that may point at it, its
/// directory under `~/.cache/attend`, and the command that fetches it.
pub struct RealModel {
    pub env: &'static str,
    pub cache_name: &'static str,
    pub fetch: &'static str,
}

pub const MINILM: RealModel = RealModel {
    env: "ATTEND_MODEL_DIR",
    cache_name: "all-minilm-l6-v2",
    fetch: "scripts/fetch-model",
};

pub const MPNET: RealModel = RealModel {
    env: "ATTEND_MPNET_DIR",
    cache_name: "all-mpnet-base-v2",
    fetch: "scripts/fetch-model mpnet",
};

impl RealModel {
    /// `$env`, else `~/.cache/attend/<cache_name>`.
    pub fn dir(&self) -> PathBuf {
        std::env::var_os(self.env)
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(std::env::var_os("HOME").expect("HOME is set"))
                    .join(".cache/attend")
                    .join(self.cache_name)
            })
    }

    /// The encoder, loaded from [`dir`](Self::dir); panics naming the fetch command
    /// when the model is not there.
    pub fn load(&self) -> SentenceEncoder {
        let dir = self.dir();
        assert!(
            dir.join("model.safetensors").is_file(),
            "{} is not at {}: run {} (or set {})",
            self.cache_name,
            dir.display(),
            self.fetch,
            self.env
        );
        SentenceEncoder::load(&dir).expect("the model loads")
    }
}

/// The largest absolute difference between `a` and `b`, element by element; a NaN
/// on either side is an infinite difference (`f32::max` would drop it).
pub fn max_abs_diff(a: impl IntoIterator<Item = f32>, b: impl IntoIterator<Item = f32>) -> f32 {
    a.into_iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(
            0.0,
            |m, d| if d.is_nan() { f32::INFINITY } else { m.max(d) },
        )
}
