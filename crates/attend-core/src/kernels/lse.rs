//! Each query's log-sum-exp as the forward kernels hand it on: the f32 value that
//! PyTorch returns, and what rounding it to f32 left out, for the backward.
//!
//! The backward recomputes each weight as `exp(s − lse)`, so an error in `lse`
//! scales a whole row of weights, and with them every gradient of the row: half an
//! f32 ulp of an `lse` of 67 is 3.8·10⁻⁶, thirty times f32's own rounding of a
//! weight. A row's log-sum-exp is `m + ln l` (`m` its largest score, `l` its sum of
//! `exp(s − m)`); the kernels know both, so they hand on the f32 value and its
//! residual, whose sum holds `m` exactly and `ln l` to f32's rounding of `ln l`
//! itself, however large `m` is (a padding mask's `f32::MIN` included, where the
//! value alone holds nothing of `ln l`).

use ndarray::Array3;

/// Log-sum-exps `[B, Hq, L]` in two f32 parts: the row's log-sum-exp is
/// `value + residual`.
#[derive(Clone, Debug, PartialEq)]
pub struct LogSumExp {
    /// Each row's natural log-sum-exp rounded to f32 (−∞ for a row that sees no
    /// key), as PyTorch and [`attention_with_lse`](crate::attention::attention_with_lse)
    /// return it.
    pub value: Array3<f32>,
    /// What the rounding of `value` left out (0 where `value` is not finite).
    pub residual: Array3<f32>,
}

impl LogSumExp {
    /// A `[B, Hq, L]` log-sum-exp whose residuals are all 0 (`value` carries it
    /// whole, or nothing better is known).
    pub fn exact(value: Array3<f32>) -> Self {
        let residual = Array3::zeros(value.raw_dim());
        LogSumExp { value, residual }
    }
}

/// The two f32 parts of a log-sum-exp `top + log_sum`, `top` the row's largest
/// score and `log_sum` the log of its sum of `exp(s − top)`, kept apart until
/// here: `value` is their sum rounded to f32, `residual` the rest, `(top − value)`
/// (exact in f64, the two being f32 numbers close together) plus `log_sum`. A
/// value that is not finite (no key seen, a NaN, an overflow) has residual 0.
#[inline(always)]
pub(crate) fn split(top: f64, log_sum: f64) -> (f32, f32) {
    let value = (top + log_sum) as f32;
    let residual = ((top - f64::from(value)) + log_sum) as f32;
    (value, if value.is_finite() { residual } else { 0.0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parts add up to the log-sum-exp within f32's rounding of the residual,
    /// where the value alone is half an ulp of it away.
    #[test]
    fn the_parts_carry_what_f32_drops() {
        let (top, log_sum) = (67.123_456_789_f64, 1.987_654_321_f64);
        let (value, residual) = split(top, log_sum);
        let exact = top + log_sum;
        assert_eq!(value, exact as f32);
        let err = (f64::from(value) + f64::from(residual) - exact).abs();
        assert!(
            err <= f64::from(residual.abs()) * f64::from(f32::EPSILON),
            "{err}"
        );
        assert!((f64::from(value) - exact).abs() > 1e3 * err);
    }

    /// At a padding mask's `f32::MIN` the value is `top` itself and the residual
    /// holds the whole log of the sum.
    #[test]
    fn a_huge_top_leaves_the_log_of_the_sum_in_the_residual() {
        let top = f64::from(f32::MIN);
        let (value, residual) = split(top, 3f64.ln());
        assert_eq!((value, residual), (f32::MIN, 3f32.ln()));
    }

    #[test]
    fn values_that_are_not_finite_have_no_residual() {
        assert_eq!(split(f64::NEG_INFINITY, 0.0), (f32::NEG_INFINITY, 0.0));
        let (value, residual) = split(f64::NAN, 0.0);
        assert!(value.is_nan());
        assert_eq!(residual, 0.0);
        assert_eq!(split(1e39, 0.0), (f32::INFINITY, 0.0));
    }
}
