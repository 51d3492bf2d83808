//! Property test: the multi-head module equals the attention formula written out
//! directly in f64, on random shapes, heads and widths.

use attend::attention::{AttentionOptions, Causal};
use attend::nn::{Linear, MultiHeadAttention};
use ndarray::{Array1, Array2, Array3};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Case {
    x: Array3<f32>,
    heads: usize,
    dkh: usize,
    dvh: usize,
    w: [Array2<f32>; 3],
    b: Option<[Array1<f32>; 3]>,
    causal: bool,
}

fn matrix(rows: usize, cols: usize) -> impl Strategy<Value = Array2<f32>> {
    prop::collection::vec(-1.0f32..1.0, rows * cols)
        .prop_map(move |v| Array2::from_shape_vec((rows, cols), v).unwrap())
}

fn vector(n: usize) -> impl Strategy<Value = Array1<f32>> {
    prop::collection::vec(-1.0f32..1.0, n).prop_map(Array1::from)
}

fn case() -> impl Strategy<Value = Case> {
    (
        1..3usize,
        1..7usize,
        1..9usize,
        1..4usize,
        1..6usize,
        1..6usize,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_flat_map(|(b, t, d_in, heads, dkh, dvh, bias, causal)| {
            let x = prop::collection::vec(-2.0f32..2.0, b * t * d_in)
                .prop_map(move |v| Array3::from_shape_vec((b, t, d_in), v).unwrap());
            let w = (
                matrix(heads * dkh, d_in),
                matrix(heads * dkh, d_in),
                matrix(heads * dvh, d_in),
            );
            let biases = (
                vector(heads * dkh),
                vector(heads * dkh),
                vector(heads * dvh),
            );
            (x, w, biases).prop_map(move |(x, (wq, wk, wv), (bq, bk, bv))| Case {
                x,
                heads,
                dkh,
                dvh,
                w: [wq, wk, wv],
                b: bias.then_some([bq, bk, bv]),
                causal,
            })
        })
}

/// softmax((x W_qᵀ + b_q)(x W_kᵀ + b_k)ᵀ / √d_k) (x W_vᵀ + b_v), head by head, in f64.
fn direct(c: &Case) -> Array3<f64> {
    let (bs, t, d_in) = c.x.dim();
    let proj = |which: usize, b: usize, i: usize, row: usize| -> f64 {
        let bias = c.b.as_ref().map_or(0.0, |bb| bb[which][row] as f64);
        (0..d_in)
            .map(|e| c.x[[b, i, e]] as f64 * c.w[which][[row, e]] as f64)
            .sum::<f64>()
            + bias
    };
    let mut out = Array3::zeros((bs, t, c.heads * c.dvh));
    for b in 0..bs {
        for h in 0..c.heads {
            for i in 0..t {
                let keys = if c.causal { i + 1 } else { t };
                let scores: Vec<f64> = (0..keys)
                    .map(|j| {
                        (0..c.dkh)
                            .map(|e| proj(0, b, i, h * c.dkh + e) * proj(1, b, j, h * c.dkh + e))
                            .sum::<f64>()
                            / (c.dkh as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = exps.iter().sum();
                for c2 in 0..c.dvh {
                    out[[b, i, h * c.dvh + c2]] = (0..keys)
                        .map(|j| exps[j] / sum * proj(2, b, j, h * c.dvh + c2))
                        .sum();
                }
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn module_matches_the_direct_formula(c in case()) {
        let linear = |i: usize| Linear::new(c.w[i].clone(), c.b.as_ref().map(|b| b[i].clone())).unwrap();
        let m = MultiHeadAttention::new(linear(0), linear(1), linear(2), None, c.heads, c.heads).unwrap();
        let opts = AttentionOptions { causal: c.causal.then_some(Causal::TopLeft), ..Default::default() };
        let got = m.forward(c.x.view(), &opts).unwrap();
        let want = direct(&c);
        prop_assert_eq!(got.shape(), want.shape());
        // The module projects in f32: each of q, k, v carries a relative error of at
        // most about d_in · 2⁻²⁴ ≈ 5e-7 (|x|, |w| ≤ 2, d_in ≤ 8, so |q| ≤ 16 + 1); a
        // score error of ≤ 2·17²·5e-7 ≈ 3e-4 moves a softmax weight by at most that
        // relative amount, and the output, a convex combination of v rows (|v| ≤ 17),
        // by ≤ 17 · 3e-4 ≈ 5e-3 in the very worst case. Typical errors are far
        // smaller; this bound is what the reasoning guarantees.
        for (g, w) in got.iter().zip(want.iter()) {
            prop_assert!((*g as f64 - w).abs() <= 5e-3 * (1.0 + w.abs() / 17.0), "{} vs {}", g, w);
        }
    }
}
