//! A batch of token ids, right-padded to a common length.

use ndarray::{s, Array2};

use attend_core::{Error, Result};

/// Token ids of a batch of sequences, right-padded to a common length `T`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenBatch {
    /// `[B, T]` token ids; positions at or past a sequence's length are padding.
    pub ids: Array2<u32>,
    /// `[B, T]` token-type (segment) ids.
    pub type_ids: Array2<u32>,
    /// Number of real tokens of each sequence, each ≤ `T`.
    pub lengths: Vec<usize>,
}

impl TokenBatch {
    /// Pads `sequences` of `(ids, type_ids)` on the right with `pad_id` (type 0).
    pub fn from_sequences(sequences: &[(Vec<u32>, Vec<u32>)], pad_id: u32) -> Result<Self> {
        let t = sequences
            .iter()
            .map(|(ids, _)| ids.len())
            .max()
            .unwrap_or(0);
        let mut ids = Array2::from_elem((sequences.len(), t), pad_id);
        let mut type_ids = Array2::zeros((sequences.len(), t));
        let mut lengths = Vec::with_capacity(sequences.len());
        for (b, (i, ty)) in sequences.iter().enumerate() {
            if i.len() != ty.len() {
                return Err(Error::shape(format!(
                    "sequence {b} has {} ids but {} type ids",
                    i.len(),
                    ty.len()
                )));
            }
            ids.slice_mut(s![b, ..i.len()]).assign(&ndarray::aview1(i));
            type_ids
                .slice_mut(s![b, ..i.len()])
                .assign(&ndarray::aview1(ty));
            lengths.push(i.len());
        }
        Ok(TokenBatch {
            ids,
            type_ids,
            lengths,
        })
    }

    /// `[B, T]`, `true` at padding positions (the attention API's `key_padding`).
    pub fn padding_mask(&self) -> Array2<bool> {
        let (b, t) = self.ids.dim();
        Array2::from_shape_fn((b, t), |(bi, ti)| ti >= self.lengths[bi])
    }
}
