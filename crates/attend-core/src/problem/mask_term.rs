//! The additive term of a score from the per-score masks, defined once for every
//! kernel: the fused forward's [`MaskTiles`](super::MaskTiles), the decode kernel
//! and the fused backward all write or add it through [`MaskRows`].
//!
//! A score's term is the additive mask's value as it is, or 0 without an additive
//! mask, and −∞ where the boolean mask or key padding drops the key, even where the
//! additive mask's value is NaN: a dropped key is never a weight. Only −∞ hides a
//! key: a finite value, however large (`f32::MIN` included), is added to the score
//! in the score's own units, as PyTorch's math does, never scaled into other units
//! where it could overflow (docs/design.md, "Masks"). Causality and
//! the window are not part of it; each kernel cuts its band its own way (whole
//! tiles skipped, ranges of keys).

use std::ops::Range;

use ndarray::{s, ArrayView1, ArrayView2, Axis};

use super::Problem;

/// The per-score masks of a block of queries × keys of one `(batch, head)`, sliced
/// once so that each query's row of terms reads them as rows (a 4-D index per
/// score costs more than the score).
#[derive(Clone, Copy, Debug)]
pub(crate) struct MaskRows<'a> {
    /// The boolean mask, `true` = attend.
    keep: Option<ArrayView2<'a, bool>>,
    /// The additive mask.
    bias: Option<ArrayView2<'a, f32>>,
    /// Key padding, `true` = dropped.
    pad: Option<ArrayView1<'a, bool>>,
}

impl<Q, KV> Problem<'_, Q, KV> {
    /// The masks of queries `rows` and keys `keys` of batch `b` and query head `h`,
    /// key padding included.
    pub(crate) fn mask_rows(
        &self,
        (b, h): (usize, usize),
        rows: Range<usize>,
        keys: Range<usize>,
    ) -> MaskRows<'_> {
        let block = s![b, h, rows, keys.clone()];
        MaskRows {
            keep: self.mask.as_ref().map(|m| m.slice(block)),
            bias: self.bias.as_ref().map(|m| m.slice(block)),
            pad: self.key_padding.as_ref().map(|m| m.slice(s![b, keys])),
        }
    }
}

impl<'a> MaskRows<'a> {
    /// The same masks without key padding, for terms shared by every batch row
    /// (key padding is per batch row).
    pub(crate) fn without_padding(self) -> Self {
        MaskRows { pad: None, ..self }
    }

    /// Writes the terms of row `r`'s scores into `out` (one per key of the block):
    /// the additive mask's value (0 without one), −∞ where a mask drops the key.
    pub(crate) fn write_terms(&self, r: usize, out: &mut [f32]) {
        match self.row(r).1 {
            Some(bias) => along(out, bias, |t, x| *t = x),
            None => out.fill(0.0),
        }
        self.cut(r, out);
    }

    /// Adds the terms of row `r`'s scores to the scores in `out`: each kept score
    /// plus the additive mask's value (left as it is without one), −∞ for a
    /// dropped key or an additive −∞ whatever the score (a NaN score included:
    /// NaN + −∞ is NaN).
    pub(crate) fn add_terms(&self, r: usize, out: &mut [f32]) {
        if let Some(bias) = self.row(r).1 {
            along(out, bias, |t, x| {
                *t = if x == f32::NEG_INFINITY { x } else { *t + x }
            });
        }
        self.cut(r, out);
    }

    /// Row `r` of the boolean and additive masks.
    fn row(&self, r: usize) -> (Option<ArrayView1<'a, bool>>, Option<ArrayView1<'a, f32>>) {
        (
            self.keep.map(|m| m.index_axis_move(Axis(0), r)),
            self.bias.map(|m| m.index_axis_move(Axis(0), r)),
        )
    }

    /// Sets to −∞ the entries of `out` whose key row `r`'s boolean mask or key
    /// padding drops.
    fn cut(&self, r: usize, out: &mut [f32]) {
        let cut = |t: &mut f32, dropped: bool| {
            if dropped {
                *t = f32::NEG_INFINITY;
            }
        };
        if let Some(keep) = self.row(r).0 {
            along(out, keep, |t, kept| cut(t, !kept));
        }
        if let Some(pad) = self.pad {
            along(out, pad, cut);
        }
    }
}

/// Calls `f(out[j], row[j])` along a row of mask values (`out` may be longer): through
/// a slice when the row is contiguous, which compiles to a tight loop, unlike
/// ndarray's general iterator.
#[inline]
pub(crate) fn along<T: Copy>(out: &mut [f32], row: ArrayView1<'_, T>, f: impl Fn(&mut f32, T)) {
    match row.as_slice() {
        Some(r) => out.iter_mut().zip(r).for_each(|(o, &x)| f(o, x)),
        None => out.iter_mut().zip(row).for_each(|(o, &x)| f(o, x)),
    }
}

#[cfg(test)]
mod tests {
    use ndarray::{Array2, Array4};

    use super::*;
    use crate::problem::AttentionOptions;

    /// Every score's written and added term against [`Problem::keeps`] and
    /// [`Problem::bias_at`], with masks broadcast over heads (strided rows) and
    /// NaN in the additive mask where it is dropped and where it is kept.
    #[test]
    fn terms_follow_keeps_and_bias_at_score_by_score() {
        let (b, h, l, s) = (2, 3, 5, 9);
        let q = Array4::<f32>::zeros((b, h, l, 4));
        let kv = Array4::<f32>::zeros((b, 1, s, 4));
        let mask = Array4::from_shape_fn((b, 1, l, s), |(bi, _, i, j)| (bi + i * 3 + j) % 4 != 0);
        let bias = Array4::from_shape_fn((1, h, l, s), |(_, hi, i, j)| {
            if (hi + i + j) % 5 == 0 {
                f32::NAN
            } else {
                (hi * 7 + i * 3 + j) as f32 / 4.0 - 3.0
            }
        });
        let pad = Array2::from_shape_fn((b, s), |(bi, j)| (j + bi) % 7 == 3);
        let opts = AttentionOptions {
            mask: Some(mask.view().into_dyn()),
            bias: Some(bias.view().into_dyn()),
            key_padding: Some(pad.view()),
            ..Default::default()
        };
        let p = Problem::new(q.view(), kv.view(), kv.view(), &opts).expect("valid");
        let (rows, keys) = (1..4, 2..8);
        for (bi, hi) in [(0, 0), (1, 2)] {
            let block = p.mask_rows((bi, hi), rows.clone(), keys.clone());
            for (r, i) in rows.clone().enumerate() {
                let mut written = vec![f32::NAN; keys.len()];
                block.write_terms(r, &mut written);
                let mut added: Vec<f32> = keys.clone().map(|j| j as f32).collect();
                block.add_terms(r, &mut added);
                for (jj, j) in keys.clone().enumerate() {
                    let (want_w, want_a) = if p.keeps(bi, hi, i, j) {
                        let t = p.bias_at(bi, hi, i, j);
                        (t, j as f32 + t)
                    } else {
                        (f32::NEG_INFINITY, f32::NEG_INFINITY)
                    };
                    let at = format!("({bi}, {hi}, {i}, {j})");
                    assert_eq!(written[jj].to_bits(), want_w.to_bits(), "written {at}");
                    assert_eq!(added[jj].to_bits(), want_a.to_bits(), "added {at}");
                }
                let mut shared = vec![f32::NAN; keys.len()];
                block.without_padding().write_terms(r, &mut shared);
                for (jj, j) in keys.clone().enumerate() {
                    let dropped = !mask[[bi, 0, i, j]];
                    let want = if dropped {
                        f32::NEG_INFINITY
                    } else {
                        bias[[0, hi, i, j]]
                    };
                    assert_eq!(shared[jj].to_bits(), want.to_bits(), "shared ({i}, {j})");
                }
            }
        }
    }
}
