//! Positions: which row of the position table each token reads, DistilBERT's
//! sinusoidal table, and MPNet's relative-position bias.

use ndarray::{Array2, Array4, ArrayView2};

/// Position ids of one sequence of `ids`, as transformers numbers them.
///
/// Without a padding index (BERT, DistilBERT) token `i` reads row `i`. With one
/// (RoBERTa, XLM-R, MPNet: `create_position_ids_from_input_ids`) a token that is
/// not padding reads `padding_idx + (number of non-padding tokens up to and
/// including it)`, and a padding token reads `padding_idx`.
pub(crate) fn position_ids(
    ids: impl Iterator<Item = u32>,
    padding_idx: Option<usize>,
) -> Vec<usize> {
    match padding_idx {
        None => ids.enumerate().map(|(i, _)| i).collect(),
        Some(pad) => {
            let mut seen = 0;
            ids.map(|id| {
                if id as usize == pad {
                    pad
                } else {
                    seen += 1;
                    pad + seen
                }
            })
            .collect()
        }
    }
}

/// DistilBERT's fixed sinusoidal position table `[rows, dim]`:
/// `sin(p / 10000^(2⌊j/2⌋/dim))` in even columns and `cos` of the same in odd ones
/// (transformers' `create_sinusoidal_embeddings`, computed in f64 and rounded).
pub(crate) fn sinusoidal_table(rows: usize, dim: usize) -> Array2<f32> {
    Array2::from_shape_fn((rows, dim), |(p, j)| {
        let angle = p as f64 / 10000f64.powf((2 * (j / 2)) as f64 / dim as f64);
        (if j % 2 == 0 { angle.sin() } else { angle.cos() }) as f32
    })
}

/// Buckets MPNet's relative-position function uses (transformers calls it with
/// its default of 32 whatever the config says).
pub(crate) const MPNET_BUCKETS: usize = 32;
/// Distances past this share the last bucket of their direction.
const MPNET_MAX_DISTANCE: f32 = 128.0;

/// The bucket of a key `relative = key − query` positions away (transformers'
/// `MPNetEncoder.relative_position_bucket` with 32 buckets and distance 128):
/// half the buckets for keys before the query, half for keys after it; in each
/// half, exact distances up to 7, then logarithmically wider buckets up to 128.
/// The logarithm is taken in f32, as PyTorch does, so that the boundaries fall
/// where they fall in transformers.
pub(crate) fn mpnet_bucket(relative: i64) -> usize {
    let half = MPNET_BUCKETS / 2;
    let n = -relative;
    let base = if n < 0 { half } else { 0 };
    let n = n.unsigned_abs() as usize;
    let max_exact = half / 2;
    if n < max_exact {
        return base + n;
    }
    let ratio = (n as f32 / max_exact as f32).ln()
        / (f64::from(MPNET_MAX_DISTANCE) / max_exact as f64).ln() as f32;
    let large = max_exact + (ratio * (half - max_exact) as f32) as usize;
    base + large.min(half - 1)
}

/// MPNet's position bias `[1, H, T, T]` for sequences padded to `t` tokens, from
/// the table `[buckets, H]`: entry `[0, h, i, j]` is `table[bucket(j − i), h]`.
/// It is the same for every sequence of a batch, so the attention call broadcasts
/// it over the batch instead of copying it `B` times.
pub(crate) fn mpnet_bias(table: ArrayView2<'_, f32>, t: usize) -> Array4<f32> {
    let heads = table.ncols();
    // One bucket per distance −(t−1) … t−1, looked up once.
    let buckets: Vec<usize> = (0..(2 * t).saturating_sub(1))
        .map(|k| mpnet_bucket(k as i64 - (t as i64 - 1)))
        .collect();
    Array4::from_shape_fn((1, heads, t, t), |(_, h, i, j)| {
        table[[buckets[j + t - 1 - i], h]]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roberta_positions_skip_padding() {
        assert_eq!(position_ids([5, 6, 7].into_iter(), None), [0, 1, 2]);
        assert_eq!(
            position_ids([0, 5, 6, 1, 1].into_iter(), Some(1)),
            [2, 3, 4, 1, 1]
        );
        assert_eq!(position_ids([5, 1, 6].into_iter(), Some(1)), [2, 1, 3]);
    }

    #[test]
    fn mpnet_buckets_follow_the_formula() {
        // Exact buckets for distances 0–7, keys after the query in the upper half.
        for d in 0..8 {
            assert_eq!(mpnet_bucket(-d), d as usize);
            assert_eq!(mpnet_bucket(d), if d == 0 { 0 } else { 16 + d as usize });
        }
        // 8 + ⌊ln(n/8)/ln(16) · 8⌋: n = 8 → 8, n = 16 → 10, n = 127 → 15, then capped.
        assert_eq!(mpnet_bucket(-8), 8);
        assert_eq!(mpnet_bucket(-16), 10);
        assert_eq!(mpnet_bucket(-127), 15);
        // Where the f32 logarithm decides (transformers' table for ±600 agrees with
        // this function everywhere; these are its values at 64 = 8 · 16^(3/4)).
        assert_eq!(mpnet_bucket(-63), 13);
        assert_eq!(mpnet_bucket(-64), 14);
        assert_eq!(mpnet_bucket(64), 30);
        assert_eq!(mpnet_bucket(-10_000), 15);
        assert_eq!(mpnet_bucket(10_000), 31);
        // Monotone in distance within each direction.
        for d in 1..600 {
            assert!(mpnet_bucket(-d) >= mpnet_bucket(-(d - 1)));
            assert!(mpnet_bucket(d) >= mpnet_bucket(d - 1) || d == 1);
        }
    }

    #[test]
    fn mpnet_bias_reads_the_table_by_bucket() {
        let table = Array2::from_shape_fn((32, 2), |(b, h)| (b * 10 + h) as f32);
        let bias = mpnet_bias(table.view(), 5);
        assert_eq!(bias.dim(), (1, 2, 5, 5));
        for i in 0..5 {
            for j in 0..5 {
                let b = mpnet_bucket(j as i64 - i as i64);
                assert_eq!(bias[[0, 1, i, j]], (b * 10 + 1) as f32);
            }
        }
    }

    #[test]
    fn sinusoids_start_at_zero_and_one() {
        let t = sinusoidal_table(4, 6);
        assert_eq!(t.row(0).to_vec(), [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]);
        assert!((t[[1, 0]] - 1f32.sin()).abs() < 1e-7);
        assert!((t[[3, 3]] - (3.0f64 / 10000f64.powf(2.0 / 6.0)).cos() as f32).abs() < 1e-7);
    }
}
