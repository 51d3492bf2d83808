//! The log-sum-exp residuals of a caller that saved only the f32 log-sum-exp.
//!
//! The fused backward recomputes each weight as `exp(s − lse − residual)`, the
//! residual being what rounding the log-sum-exp to f32 left out, which the forward
//! kernels return beside it (`kernels::lse`). A caller that kept only the f32 `lse`
//! gets residuals of 0, which cost a row's weights up to half an ulp of `lse`
//! each (a relative error of 2⁻²⁴·|lse|), but for the rows whose `|lse|` reaches
//! [`COARSE_LSE`]: there the residual is recomputed here, once per call, from the
//! scores the row sees. The log-sum-exp is `m + ln l` (`m` the row's largest score,
//! `l` its sum of `exp(s − m)`), and where the scores are as large as a padding
//! mask's `f32::MIN` the f32 `lse` holds nothing of `ln l` (a row of equal scores
//! would get weights of 1 instead of `1/S`).

use ndarray::s;
use rayon::prelude::*;

use crate::element::Element;
use crate::problem::Problem;

/// The `|lse|` from which a row's residual is recomputed: from `2^16` on an f32's
/// spacing is `2^−7` or more, so `ln l` (and with it every weight of the row) would
/// be off by up to 0.4 %, and by a factor of `e^(±½)` from `2^23`. Only scores of
/// that size (huge additive masks, or products that large) reach it.
const COARSE_LSE: f32 = 65_536.0;

/// Each row's residual, in `[B, H, L]` order, for the forward's f32 log-sum-exps
/// `lse`: 0, but recomputed for the rows whose finite `|lse|` reaches
/// [`COARSE_LSE`].
pub(super) fn residuals<T: Element>(p: &Problem<'_, T>, lse: &[f32]) -> Vec<f32> {
    let d = p.dims();
    let mut residual = vec![0.0f32; lse.len()];
    let coarse = |x: f32| x.is_finite() && x.abs() >= COARSE_LSE;
    if !lse.iter().any(|&x| coarse(x)) {
        return residual;
    }
    let rows = d.q_len.max(1);
    residual
        .par_chunks_mut(rows)
        .zip(lse.par_chunks(rows))
        .enumerate()
        .for_each(|(bh, (residual, lse))| {
            let (b, h) = (bh / d.heads, bh % d.heads);
            for (i, (r, &value)) in residual.iter_mut().zip(lse).enumerate() {
                if coarse(value) {
                    // `m + ln l − lse`, `m − lse` exact in f64 (two f32 numbers).
                    let (m, log_sum) = row_stats(p, (b, h), i);
                    *r = ((m - f64::from(value)) + log_sum) as f32;
                }
            }
        });
    residual
}

/// The largest score `m` query `i` of head `(b, h)` sees and `ln l`, `l` the sum
/// of `exp(s − m)` over them (in f64), each score computed as the backward
/// computes it, the scaled query's f32 dot product with the key plus the mask's
/// term, but for the order of the dot product's sum (at these sizes its last bits
/// are lost in the sum with the term).
fn row_stats<T: Element>(p: &Problem<'_, T>, (b, h): (usize, usize), i: usize) -> (f64, f64) {
    let d = p.dims();
    let kvh = h / (d.heads / d.kv_heads);
    let (lo, hi) = p.key_range(i);
    let mut terms = vec![0.0f32; hi.saturating_sub(lo)];
    p.mask_rows((b, h), i..i + 1, lo..hi)
        .write_terms(0, &mut terms);
    let q = p.q.slice(s![b, h, i, ..]).mapv(|x| x.to_f32() * p.scale);
    let scores: Vec<f32> = (lo..hi)
        .zip(&terms)
        .filter(|(_, &t)| t != f32::NEG_INFINITY)
        .map(|(j, &t)| {
            let k = p.k.slice(s![b, kvh, j, ..]);
            let dot = q
                .iter()
                .zip(&k)
                .fold(0.0f32, |acc, (&x, &y)| acc + x * y.to_f32());
            dot + t
        })
        .collect();
    let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let l: f64 = scores.iter().map(|&s| ((s - m) as f64).exp()).sum();
    (f64::from(m), l.ln())
}
