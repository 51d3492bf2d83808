//! `nn.Embedding`: a lookup table of token vectors.

use ndarray::{Array2, Array3, ArrayView2};

use crate::{Error, Result};

/// A table of `num` vectors of width `dim`, indexed by token id.
#[derive(Clone, Debug, PartialEq)]
pub struct Embedding {
    /// `[num, dim]`.
    pub weight: Array2<f32>,
    /// The id whose row is zero and receives no gradient, as in PyTorch.
    pub padding_idx: Option<usize>,
}

impl Embedding {
    /// Number of rows (the vocabulary size).
    pub fn num_embeddings(&self) -> usize {
        self.weight.nrows()
    }

    /// Width of each vector.
    pub fn dim(&self) -> usize {
        self.weight.ncols()
    }

    /// Looks up `ids [B, T]`, giving `[B, T, dim]`.
    pub fn forward(&self, ids: ArrayView2<'_, usize>) -> Result<Array3<f32>> {
        let (b, t) = ids.dim();
        let mut out = Array3::zeros((b, t, self.dim()));
        for ((bi, ti), &id) in ids.indexed_iter() {
            if id >= self.num_embeddings() {
                return Err(Error::value(format!(
                    "token id {id} at [{bi}, {ti}] is out of range for an embedding of {} rows",
                    self.num_embeddings()
                )));
            }
            out.slice_mut(ndarray::s![bi, ti, ..])
                .assign(&self.weight.row(id));
        }
        Ok(out)
    }
}
