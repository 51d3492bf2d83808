//! The reference attention: materialises every score, accumulates in f64, and is
//! meant to be read next to the notebooks. It is the judge of the fast kernels and
//! the source of the intermediates that `explain` shows.

use ndarray::{Array2, Array3, Array4};

use crate::kernels::lse::{split, LogSumExp};
use crate::problem::{Problem, SoftmaxAxis};

/// Every intermediate of one attention call.
#[derive(Clone, Debug)]
pub struct AttentionTrace {
    /// Raw `q·k`, `[B, Hq, L, S]`.
    pub scores: Array4<f32>,
    /// Scaled scores plus the additive mask; masked entries are −∞.
    pub scaled: Array4<f32>,
    /// Softmax of `scaled` over the chosen axis; fully masked rows (or columns) are 0.
    pub weights: Array4<f32>,
    /// `weights · v`, `[B, Hq, L, Ev]`.
    pub output: Array4<f32>,
    /// Log-sum-exp of each query's row of `scaled`, `[B, Hq, L]` (−∞ when fully masked),
    /// whatever the softmax axis, in its two f32 parts.
    pub lse: LogSumExp,
}

/// Runs the reference attention on a validated problem.
pub fn run(p: &Problem<'_>) -> AttentionTrace {
    let d = p.dims();
    let group = d.heads / d.kv_heads;
    let mut trace = AttentionTrace {
        scores: Array4::zeros((d.batch, d.heads, d.q_len, d.kv_len)),
        scaled: Array4::zeros((d.batch, d.heads, d.q_len, d.kv_len)),
        weights: Array4::zeros((d.batch, d.heads, d.q_len, d.kv_len)),
        output: Array4::zeros((d.batch, d.heads, d.q_len, d.value_dim)),
        lse: LogSumExp::exact(Array3::zeros((d.batch, d.heads, d.q_len))),
    };
    for b in 0..d.batch {
        for h in 0..d.heads {
            let kvh = h / group;
            let mut scaled = Array2::<f64>::from_elem((d.q_len, d.kv_len), f64::NEG_INFINITY);
            // Which keys each query sees: the others add nothing to its row, not
            // even a NaN in their score or value (docs/design.md, "NaN").
            let sees = Array2::from_shape_fn((d.q_len, d.kv_len), |(i, j)| p.sees(b, h, i, j));
            for i in 0..d.q_len {
                for j in 0..d.kv_len {
                    let dot: f64 = (0..d.head_dim)
                        .map(|e| p.q[[b, h, i, e]] as f64 * p.k[[b, kvh, j, e]] as f64)
                        .sum();
                    trace.scores[[b, h, i, j]] = dot as f32;
                    if sees[[i, j]] {
                        let product = in_f32_range(dot * p.scale as f64);
                        scaled[[i, j]] = in_f32_range(product + p.bias_at(b, h, i, j) as f64);
                    }
                }
                let (top, log_sum) = log_sum_exp_parts(scaled.row(i).iter().copied());
                let at = [b, h, i];
                (trace.lse.value[at], trace.lse.residual[at]) = split(top, log_sum);
            }
            let weights = match p.softmax_axis {
                SoftmaxAxis::Keys => softmax_rows(scaled.clone()),
                SoftmaxAxis::Queries => softmax_rows(scaled.t().to_owned()).reversed_axes(),
            };
            for i in 0..d.q_len {
                for j in 0..d.kv_len {
                    trace.scaled[[b, h, i, j]] = scaled[[i, j]] as f32;
                    trace.weights[[b, h, i, j]] = weights[[i, j]] as f32;
                }
                for c in 0..d.value_dim {
                    let acc: f64 = (0..d.kv_len)
                        .filter(|&j| sees[[i, j]])
                        .map(|j| weights[[i, j]] * p.v[[b, kvh, j, c]] as f64)
                        .sum();
                    trace.output[[b, h, i, c]] = acc as f32;
                }
            }
        }
    }
    trace
}

/// `x`, or ±∞ where it is beyond f32's range: a score of f32 tensors overflows
/// where PyTorch's math would overflow it, at the scaled product `scale · q·k` and
/// at its sum with the additive mask (docs/design.md, "Masks"); the rest of the
/// arithmetic stays in f64.
fn in_f32_range(x: f64) -> f64 {
    if (x as f32).is_infinite() {
        x.signum() * f64::INFINITY
    } else {
        x
    }
}

/// `log Σ exp(x)`, −∞ for an empty or all −∞ sequence.
pub(crate) fn log_sum_exp(xs: impl Iterator<Item = f64> + Clone) -> f64 {
    let (max, log_sum) = log_sum_exp_parts(xs);
    max + log_sum
}

/// `log Σ exp(x)` in two terms, `(max, log Σ exp(x − max))`, which f64 cannot
/// always add up (`max` of a padding mask's size swallows the second); `(−∞, 0)`
/// for an empty or all −∞ sequence.
pub(crate) fn log_sum_exp_parts(xs: impl Iterator<Item = f64> + Clone) -> (f64, f64) {
    let max = xs.clone().fold(f64::NEG_INFINITY, crate::kernels::nan_max);
    if max == f64::NEG_INFINITY {
        return (max, 0.0);
    }
    (max, xs.map(|x| (x - max).exp()).sum::<f64>().ln())
}

/// Row-wise softmax; a row that is entirely −∞ (fully masked) becomes zeros.
pub(crate) fn softmax_rows(mut x: Array2<f64>) -> Array2<f64> {
    for mut row in x.rows_mut() {
        let max = row
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, crate::kernels::nan_max);
        if max == f64::NEG_INFINITY {
            row.fill(0.0);
            continue;
        }
        row.mapv_inplace(|s| (s - max).exp());
        let sum = row.sum();
        row.mapv_inplace(|e| e / sum);
    }
    x
}
