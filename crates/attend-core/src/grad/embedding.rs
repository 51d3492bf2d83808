//! Gradients of [`Embedding`].

use ndarray::{Array2, Array3, ArrayView2, ArrayView3};

use super::Scalar;
use crate::nn::Embedding;
use crate::{Error, Result};

/// What [`Embedding::backward`] needs: the ids that were looked up.
#[derive(Clone, Debug)]
pub struct EmbeddingCache {
    /// `[B, T]`.
    pub(crate) ids: Array2<usize>,
}

/// Gradient of an [`Embedding`], named like its parameter.
#[derive(Clone, Debug, PartialEq)]
pub struct EmbeddingGrads<T = f32> {
    /// `∂loss/∂weight`, `[num, dim]`; the padding row is zero, as in PyTorch.
    pub weight: Array2<T>,
}

impl Embedding {
    /// [`forward`](Embedding::forward), also returning what
    /// [`backward`](Embedding::backward) needs.
    pub fn forward_train(
        &self,
        ids: ArrayView2<'_, usize>,
    ) -> Result<(Array3<f32>, EmbeddingCache)> {
        let y = self.forward(ids)?;
        Ok((
            y,
            EmbeddingCache {
                ids: ids.to_owned(),
            },
        ))
    }

    /// The table's gradient given `dy = ∂loss/∂y` (`[B, T, dim]`). Token ids are
    /// discrete, so there is no input gradient.
    pub fn backward(
        &self,
        cache: &EmbeddingCache,
        dy: ArrayView3<'_, f32>,
    ) -> Result<EmbeddingGrads> {
        let (b, t) = cache.ids.dim();
        if dy.dim() != (b, t, self.dim()) {
            return Err(Error::shape(format!(
                "dy of shape {:?} must be the forward output's shape {:?}",
                dy.shape(),
                [b, t, self.dim()]
            )));
        }
        Ok(backward(
            self.num_embeddings(),
            self.padding_idx,
            cache.ids.view(),
            dy,
        ))
    }
}

/// Scatter-adds `dy` into the rows of the looked-up ids, skipping `padding_idx`.
pub(crate) fn backward<T: Scalar>(
    num: usize,
    padding_idx: Option<usize>,
    ids: ArrayView2<'_, usize>,
    dy: ArrayView3<'_, T>,
) -> EmbeddingGrads<T> {
    let mut weight = Array2::zeros((num, dy.dim().2));
    for ((bi, ti), &id) in ids.indexed_iter() {
        if Some(id) == padding_idx {
            continue;
        }
        let mut row = weight.row_mut(id);
        row += &dy.slice(ndarray::s![bi, ti, ..]);
    }
    EmbeddingGrads { weight }
}
