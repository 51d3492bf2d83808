//! Length-sorted batching: texts of similar length share a batch, so a batch pads
//! little; the vectors are put back in the texts' own order.

use std::sync::{Mutex, PoisonError};

use ndarray::{Array2, ArrayView2};
use rayon::prelude::*;

use attend_core::{Error, Result};

/// The indices of `lengths` in batches of at most `batch_size`, longest texts first.
///
/// The sort is stable, so equal lengths keep their input order and the batches are
/// the same on every run.
pub fn length_sorted_batches(lengths: &[usize], batch_size: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(lengths[i]));
    order
        .chunks(batch_size.max(1))
        .map(<[usize]>::to_vec)
        .collect()
}

/// Embeds `texts` (strings, or their tokens) batch by batch in length order and
/// returns their vectors `[texts.len(), width]` in the texts' own order.
///
/// `lengths[i]` is text `i`'s length in tokens; `embed` turns one batch of texts
/// into one row each; `done` hears how many texts each finished batch held.
///
/// Batches run side by side on the current thread pool, each on the thread that
/// takes it: one thread per batch keeps every product of a forward pass on one
/// core, where one batch split over all threads would meet at every product. A
/// batch's vectors do not depend on the thread that computed it, so neither does
/// the output; `done` is called as batches finish, in any order.
pub fn embed_in_length_order<T: Sync>(
    texts: &[T],
    lengths: &[usize],
    batch_size: usize,
    width: usize,
    embed: impl Fn(&[&T]) -> Result<Array2<f32>> + Sync,
    done: impl FnMut(usize) + Send,
) -> Result<Array2<f32>> {
    if lengths.len() != texts.len() {
        return Err(Error::shape(format!(
            "lengths has {} entries for {} texts",
            lengths.len(),
            texts.len()
        )));
    }
    let done = Mutex::new(done);
    let batches = length_sorted_batches(lengths, batch_size);
    let vectors: Vec<Array2<f32>> = batches
        .par_iter()
        .with_max_len(1)
        .map(|batch| {
            let chosen: Vec<&T> = batch.iter().map(|&i| &texts[i]).collect();
            let vectors = embed(&chosen)?;
            check_rows(vectors.view(), batch.len(), width)?;
            (done.lock().unwrap_or_else(PoisonError::into_inner))(batch.len());
            Ok(vectors)
        })
        .collect::<Result<_>>()?;
    let mut out = Array2::zeros((texts.len(), width));
    for (batch, vectors) in batches.iter().zip(&vectors) {
        for (row, &i) in vectors.rows().into_iter().zip(batch) {
            out.row_mut(i).assign(&row);
        }
    }
    Ok(out)
}

fn check_rows(vectors: ArrayView2<'_, f32>, texts: usize, width: usize) -> Result<()> {
    if vectors.dim() != (texts, width) {
        return Err(Error::shape(format!(
            "a batch of {texts} texts gave vectors of shape {:?}, expected [{texts}, {width}]",
            vectors.shape()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_longest_first_and_stable() {
        let b = length_sorted_batches(&[3, 9, 3, 1, 9], 2);
        assert_eq!(b, vec![vec![1, 4], vec![0, 2], vec![3]]);
        assert!(length_sorted_batches(&[], 4).is_empty());
    }

    #[test]
    fn vectors_come_back_in_input_order() {
        let texts = ["ccc", "a", "bbbbb", "dd", "e"];
        let lengths: Vec<usize> = texts.iter().map(|t| t.len()).collect();
        let mut batch_sizes = Vec::new();
        // Each text's vector is its own length and the size of the batch it was in.
        let out = embed_in_length_order(
            &texts,
            &lengths,
            2,
            2,
            |batch| {
                Ok(Array2::from_shape_fn((batch.len(), 2), |(i, j)| {
                    [batch[i].len(), batch.len()][j] as f32
                }))
            },
            |n| batch_sizes.push(n),
        )
        .unwrap();
        let lens: Vec<f32> = out.column(0).to_vec();
        assert_eq!(lens, [3.0, 1.0, 5.0, 2.0, 1.0]);
        // Batches may finish in any order.
        batch_sizes.sort_unstable();
        assert_eq!(batch_sizes, [1, 2, 2]);
        // The longest two shared a batch; the last, lone batch holds a shortest text.
        assert_eq!(out[[2, 1]], 2.0);
        assert_eq!(out[[4, 1]], 1.0);
    }

    #[test]
    fn a_wrong_shape_from_embed_is_an_error() {
        let err = embed_in_length_order(
            &["a", "b"],
            &[1, 1],
            8,
            4,
            |_| Ok(Array2::zeros((1, 4))),
            |_| {},
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "a batch of 2 texts gave vectors of shape [1, 4], expected [2, 4]"
        );
    }
}
