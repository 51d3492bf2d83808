//! sentence-transformers' encoder over the library's BERT: text in, vectors out.

use std::path::PathBuf;

use numpy::{IntoPyArray, PyArray2};
use pyo3::prelude::*;

use crate::errors::to_py;
use crate::pool;

/// A sentence-transformers checkpoint directory loaded by the library.
#[pyclass(module = "attend._attend", frozen)]
pub struct SentenceEncoder {
    inner: attend::models::SentenceEncoder,
}

#[pymethods]
impl SentenceEncoder {
    /// Loads `config.json`, `model.safetensors`, `tokenizer.json` and the
    /// sentence-transformers module configs from `model_dir`.
    #[new]
    fn new(py: Python<'_>, model_dir: PathBuf) -> PyResult<Self> {
        let inner = pool::run(py, 1, || attend::models::SentenceEncoder::load(&model_dir))?;
        Ok(SentenceEncoder { inner })
    }

    /// Embeds `texts` as one padded batch: `(vectors [n, d], warnings)`. Vectors
    /// are normalised when the checkpoint's modules say so.
    fn embed<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<String>,
        threads: usize,
    ) -> PyResult<(Bound<'py, PyArray2<f32>>, Vec<String>)> {
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let out = pool::run(py, threads, || self.inner.embed(&refs))?;
        Ok((out.vectors.into_pyarray(py), out.warnings))
    }

    /// The embedding width.
    #[getter]
    fn dimension(&self) -> usize {
        self.inner.dimension()
    }

    /// The longest input in tokens; longer texts are truncated.
    #[getter]
    fn max_seq_length(&self) -> usize {
        self.inner.tokenizer.max_len()
    }

    /// Whether the checkpoint normalises its embeddings itself.
    #[getter]
    fn normalizes(&self) -> bool {
        self.inner.normalizes()
    }

    /// The number of tokens of each text, special tokens included, after truncation.
    fn token_counts(&self, texts: Vec<String>) -> PyResult<Vec<usize>> {
        texts
            .iter()
            .map(|t| self.inner.tokenizer.encode(t).map(|tok| tok.ids.len()))
            .collect::<attend::Result<_>>()
            .map_err(to_py)
    }
}
