//! The one merge of a softmax split over disjoint sets of keys: the decode kernel's
//! chunks and `decode::merge_partials`'s shards both end here.

use ndarray::ArrayView1;

/// One part of a query's softmax over some of its keys. Its log-sum-exp is
/// `top + log_sum`, kept in two terms: where the scores are as large as `f32::MIN`
/// (a padding mask's), their sum is lost in `top`'s rounding, in f32 and f64 alike.
#[derive(Clone, Copy)]
pub(crate) struct SoftmaxPart<'a> {
    /// The part's largest score (or its log-sum-exp, with `log_sum` 0); −∞ when it
    /// saw no key.
    pub top: f64,
    /// The log of the part's sum of `exp(score − top)`.
    pub log_sum: f64,
    /// What `output` is multiplied by to be the part's normalised output (1 when it
    /// is normalised already; `1 / sum` for a sum of unnormalised weights).
    pub scale: f64,
    /// The part's output row.
    pub output: ArrayView1<'a, f32>,
}

/// Merges `parts` in their order into the softmax over all their keys: writes
/// `Σ exp(lse_i − lse) · scale_i · output_i` into `out` and returns
/// `lse = log Σ exp(lse_i)` in two terms as the parts have it, `(top, log_sum)`,
/// summing in f64 in `acc` (`out.len()` long), with each `lse_i − lse` taken as
/// `(top_i − max top) + log_sum_i − log Σ …` so that the tops' difference is exact.
/// Parts that saw no key weigh nothing; when none saw one, `out` is left as it is
/// and the lse is `(−∞, 0)`. A NaN lse makes the result NaN.
pub(crate) fn merge_softmax_parts<'a, 'o>(
    parts: impl Iterator<Item = SoftmaxPart<'a>> + Clone,
    acc: &mut [f64],
    out: impl IntoIterator<Item = &'o mut f32>,
) -> (f64, f64) {
    let m = parts
        .clone()
        .map(|p| p.top)
        .fold(f64::NEG_INFINITY, super::nan_max);
    if m == f64::NEG_INFINITY {
        return (m, 0.0);
    }
    acc.fill(0.0);
    let mut sum = 0.0f64;
    for p in parts.filter(|p| p.top != f64::NEG_INFINITY) {
        let w = ((p.top - m) + p.log_sum).exp();
        sum += w;
        let w = w * p.scale;
        for (a, &x) in acc.iter_mut().zip(p.output) {
            *a += w * x as f64;
        }
    }
    for (y, a) in out.into_iter().zip(acc.iter()) {
        *y = (a / sum) as f32;
    }
    (m, sum.ln())
}

#[cfg(test)]
mod tests {
    use ndarray::arr1;

    use super::*;

    /// Two halves of a softmax over four scores merge into the softmax over all
    /// four, computed directly in f64.
    #[test]
    fn halves_merge_into_the_whole() {
        let scores = [0.3f64, -1.2, 2.0, 0.7];
        let values = [1.0f32, -2.0, 0.5, 4.0];
        let whole_lse = scores.iter().map(|s| s.exp()).sum::<f64>().ln();
        let whole: f64 = scores
            .iter()
            .zip(values)
            .map(|(s, v)| (s - whole_lse).exp() * v as f64)
            .sum();
        let half = |r: std::ops::Range<usize>| {
            let lse = scores[r.clone()].iter().map(|s| s.exp()).sum::<f64>().ln();
            let out: f64 = r.map(|j| (scores[j] - lse).exp() * values[j] as f64).sum();
            (lse, arr1(&[out as f32]))
        };
        let ((l0, o0), (l1, o1)) = (half(0..2), half(2..4));
        // The second half unnormalised, carrying its sum as a scale instead.
        let sum1 = l1.exp();
        let o1_raw = o1.mapv(|x| (x as f64 * sum1) as f32);
        let parts = [
            SoftmaxPart {
                top: l0,
                log_sum: 0.0,
                scale: 1.0,
                output: o0.view(),
            },
            SoftmaxPart {
                top: 2.0,
                log_sum: l1 - 2.0,
                scale: 1.0 / sum1,
                output: o1_raw.view(),
            },
        ];
        let mut out = [0.0f32];
        let (top, log_sum) = merge_softmax_parts(parts.iter().copied(), &mut [0.0], out.iter_mut());
        let lse = top + log_sum;
        assert!((lse - whole_lse).abs() < 1e-12, "{lse} vs {whole_lse}");
        assert!(
            (out[0] as f64 - whole).abs() < 1e-6,
            "{} vs {whole}",
            out[0]
        );
    }

    #[test]
    fn parts_without_keys_weigh_nothing() {
        let o = arr1(&[5.0f32]);
        let none = SoftmaxPart {
            top: f64::NEG_INFINITY,
            log_sum: 0.0,
            scale: 1.0,
            output: o.view(),
        };
        let mut out = [7.0f32];
        let lse = merge_softmax_parts([none, none].into_iter(), &mut [0.0], out.iter_mut());
        assert_eq!((lse, out[0]), ((f64::NEG_INFINITY, 0.0), 7.0));
        let some = SoftmaxPart {
            top: 0.5,
            log_sum: 0.0,
            scale: 1.0,
            output: o.view(),
        };
        let lse = merge_softmax_parts([none, some].into_iter(), &mut [0.0], out.iter_mut());
        assert_eq!((lse, out[0]), ((0.5, 0.0), 5.0));
    }

    /// Parts whose scores all round to `f32::MIN` (a padding mask's rows): the
    /// tops are equal and the parts weigh as their sums say, 3 keys against 1,
    /// where log-sum-exps rounded into one number would weigh them alike.
    #[test]
    fn parts_of_equal_huge_scores_weigh_by_their_sums() {
        let (a, b) = (arr1(&[3.0f32]), arr1(&[7.0f32]));
        let top = f32::MIN as f64;
        let parts = [
            SoftmaxPart {
                top,
                log_sum: 3f64.ln(),
                scale: 1.0,
                output: a.view(),
            },
            SoftmaxPart {
                top,
                log_sum: 0.0,
                scale: 1.0,
                output: b.view(),
            },
        ];
        let mut out = [0.0f32];
        merge_softmax_parts(parts.into_iter(), &mut [0.0], out.iter_mut());
        assert_eq!(out[0], 4.0);
    }
}
