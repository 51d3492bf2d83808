//! The rows whose saved log-sum-exp is too coarse for the fused backward.
//!
//! The fused backward recomputes each weight as `exp(s − lse)`. The log-sum-exp
//! is `m + ln l` (`m` the row's largest score, `l` its sum of `exp(s − m)`), and
//! an f32 `lse` carries `ln l` only to within half its spacing: where the scores
//! are as large as a padding mask's `f32::MIN`, nothing of it (a row of equal
//! scores would get weights of 1 instead of `1/S`). For the rows whose `|lse|`
//! reaches [`COARSE_LSE`], the statistics are recomputed here, once per call, from
//! the scores the row sees, and the backward uses `exp(s − m) / l` instead.

use ndarray::s;
use rayon::prelude::*;

use crate::problem::Problem;

/// The `|lse|` from which a row's statistics are recomputed: from `2^16` on an
/// f32's spacing is `2^−7` or more, so `ln l` (and with it every weight of the
/// row) would be off by up to 0.4 %, and by a factor of `e^(±½)` from `2^23`.
/// Only scores of that size (huge additive masks, or products that large) reach
/// it.
const COARSE_LSE: f32 = 65_536.0;

/// Each row's shift and factor for its weights, `exp(s − shift) · factor`, in
/// `[B, H, L]` order: `(lse, 1)` for most rows, `(m, 1/l)` recomputed for the
/// rows whose finite `|lse|` reaches [`COARSE_LSE`]. `lse` is the forward's.
pub(super) fn row_shifts(p: &Problem<'_>, lse: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let d = p.dims();
    let mut shift = lse.to_vec();
    let mut factor = vec![1.0f32; lse.len()];
    let coarse = |x: f32| x.is_finite() && x.abs() >= COARSE_LSE;
    if !lse.iter().any(|&x| coarse(x)) {
        return (shift, factor);
    }
    let rows = d.q_len.max(1);
    shift
        .par_chunks_mut(rows)
        .zip(factor.par_chunks_mut(rows))
        .enumerate()
        .for_each(|(bh, (shift, factor))| {
            let (b, h) = (bh / d.heads, bh % d.heads);
            for (i, (m, f)) in shift.iter_mut().zip(factor.iter_mut()).enumerate() {
                if coarse(*m) {
                    (*m, *f) = row_stats(p, (b, h), i);
                }
            }
        });
    (shift, factor)
}

/// The largest score `m` query `i` of head `(b, h)` sees and `1/l`, `l` the sum
/// of `exp(s − m)` over them (in f64), each score computed as the backward
/// computes it: the f32 dot product times the scale, plus the mask's term.
fn row_stats(p: &Problem<'_>, (b, h): (usize, usize), i: usize) -> (f32, f32) {
    let d = p.dims();
    let kvh = h / (d.heads / d.kv_heads);
    let (lo, hi) = p.key_range(i);
    let mut terms = vec![0.0f32; hi.saturating_sub(lo)];
    p.mask_rows((b, h), i..i + 1, lo..hi)
        .write_terms(0, &mut terms);
    let q = p.q.slice(s![b, h, i, ..]);
    let scores: Vec<f32> = (lo..hi)
        .zip(&terms)
        .filter(|(_, &t)| t != f32::NEG_INFINITY)
        .map(|(j, &t)| {
            let k = p.k.slice(s![b, kvh, j, ..]);
            let dot = q.iter().zip(&k).fold(0.0f32, |acc, (&x, &y)| acc + x * y);
            dot * p.scale + t
        })
        .collect();
    let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let l: f64 = scores.iter().map(|&s| ((s - m) as f64).exp()).sum();
    (m, (1.0 / l) as f32)
}
