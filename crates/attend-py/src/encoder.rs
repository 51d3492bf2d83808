//! sentence-transformers' encoder over the library's BERT: text in, vectors out.

use std::path::PathBuf;

use numpy::{IntoPyArray, PyArray2};
use pyo3::prelude::*;

use attend::attention::Precision;
use attend::models::Sequence;

use crate::errors::{to_py, value_error};
use crate::pool;

/// A sentence-transformers checkpoint directory loaded by the library.
#[pyclass(module = "attend._attend", frozen)]
pub struct SentenceEncoder {
    inner: attend::models::SentenceEncoder,
}

#[pymethods]
impl SentenceEncoder {
    /// Loads `config.json`, `model.safetensors`, `tokenizer.json` and the
    /// sentence-transformers module configs from `model_dir`, on `threads`
    /// threads, with the encoder's dense products in `precision` (`f32`, `bf16`
    /// or `int8`, as `attend embed --precision`). Like the `attend` command, it asks
    /// the process's allocator to keep freed memory for reuse
    /// (`attend::memory::keep_freed_memory`).
    #[new]
    #[pyo3(signature = (model_dir, precision = "f32", threads = 1))]
    fn new(py: Python<'_>, model_dir: PathBuf, precision: &str, threads: usize) -> PyResult<Self> {
        let precision = Precision::from_name(precision).map_err(to_py)?;
        attend::memory::keep_freed_memory();
        let inner = pool::run(py, threads, || {
            attend::models::SentenceEncoder::load_with(&model_dir, precision)
        })?;
        Ok(SentenceEncoder { inner })
    }

    /// The precision of the encoder's dense products: `"f32"`, `"bf16"` or
    /// `"int8"`.
    #[getter]
    fn precision(&self) -> &'static str {
        self.inner.model.precision.name()
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

    /// The number of token ids the model knows (ids run from 0 to one less).
    #[getter]
    fn vocab_size(&self) -> usize {
        self.inner.model.config.vocab_size
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

    /// Embeds sequences given as token ids of the model's vocabulary, taken as they
    /// are (special tokens included, token type 0), as one padded batch. A sequence
    /// that is empty or longer than `max_seq_length` is an error, as is an id
    /// outside the vocabulary.
    fn embed_ids<'py>(
        &self,
        py: Python<'py>,
        sequences: Vec<Vec<u32>>,
        threads: usize,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let max = self.inner.tokenizer.max_len();
        for (i, ids) in sequences.iter().enumerate() {
            if ids.is_empty() || ids.len() > max {
                return Err(value_error(format!(
                    "token sequence {i} has {} ids; it must have 1 to {max} (the model's max_seq_length)",
                    ids.len()
                )));
            }
        }
        let type_ids: Vec<Vec<u32>> = sequences.iter().map(|ids| vec![0; ids.len()]).collect();
        let seqs: Vec<Sequence<'_>> = sequences
            .iter()
            .zip(&type_ids)
            .map(|(ids, type_ids)| Sequence { ids, type_ids })
            .collect();
        let vectors = pool::run(py, threads, || self.inner.engine().embed(&seqs))?;
        Ok(vectors.into_pyarray(py))
    }
}
