//! The reference attention backward: materialises every score and probability in
//! f64 and applies the textbook formulas. It is the judge of the fused backward and
//! the attention step of the f64 gradient checks.
//!
//! With `P = softmax(S)`, `S = scale · q kᵀ + bias` (masked entries −∞), optional
//! dropout `P̃ = P ∘ Z / (1 − p)` and `O = P̃ v`:
//!
//! ```text
//! dV = P̃ᵀ dO          dP̃ = dO vᵀ          dP = dP̃ ∘ Z / (1 − p)
//! dS = P ∘ (dP − D)    D_i = Σ_j P_ij dP_ij (softmax over keys; over queries the
//!                       sum runs down the column instead)
//! dQ = scale · dS k    dK = scale · dSᵀ q
//! ```
//!
//! Grouped-query heads sum their `dK`, `dV` into the shared key/value head.

use ndarray::{Array2, Array3, Array4, ArrayView4};

use crate::kernels::reference::{log_sum_exp, softmax_rows};
use crate::problem::{Dropout, Problem, SoftmaxAxis};

/// Forward results in f64.
pub(crate) struct Forward {
    /// `[B, Hq, L, Ev]`.
    pub out: Array4<f64>,
    /// `[B, Hq, L]`, −∞ for fully masked rows.
    pub lse: Array3<f64>,
}

/// Gradients in f64.
pub(crate) struct Backward {
    pub dq: Array4<f64>,
    pub dk: Array4<f64>,
    pub dv: Array4<f64>,
    /// The scores' gradient `dS` `[B, Hq, L, S]`, the additive mask's before the
    /// sum over its broadcast axes (0 at the pairs that do not see each other).
    pub ds: Array4<f64>,
}

/// The probabilities of head `(b, h)`, `[L, S]`, the row log-sum-exps, and which
/// keys each query sees ([`Problem::sees`]): every sum below runs over those pairs
/// only, so a key a query does not see adds nothing to its row or its gradients,
/// not even a NaN (docs/design.md, "NaN").
fn probabilities(
    p: &Problem<'_, f64>,
    b: usize,
    h: usize,
) -> (Array2<f64>, Vec<f64>, Array2<bool>) {
    let (q, k) = (&p.q, &p.k);
    let d = p.dims();
    let kvh = h / (d.heads / d.kv_heads);
    let scale = p.scale as f64;
    let mut s = Array2::<f64>::from_elem((d.q_len, d.kv_len), f64::NEG_INFINITY);
    let mut lse = vec![f64::NEG_INFINITY; d.q_len];
    let sees = Array2::from_shape_fn((d.q_len, d.kv_len), |(i, j)| p.sees(b, h, i, j));
    for i in 0..d.q_len {
        for j in 0..d.kv_len {
            if sees[[i, j]] {
                let dot: f64 = (0..d.head_dim)
                    .map(|e| q[[b, h, i, e]] * k[[b, kvh, j, e]])
                    .sum();
                s[[i, j]] = dot * scale + p.exact_bias_at(b, h, i, j);
            }
        }
        lse[i] = log_sum_exp(s.row(i).iter().copied());
    }
    let probs = match p.softmax_axis {
        SoftmaxAxis::Keys => softmax_rows(s),
        SoftmaxAxis::Queries => softmax_rows(s.reversed_axes()).reversed_axes(),
    };
    (probs, lse, sees)
}

/// The dropout factor `Z_ij / (1 − p)` of score `(b, h, i, j)` (1 without dropout).
#[inline]
fn dropped(dropout: Option<&Dropout>, b: usize, h: usize, i: usize, j: usize) -> f64 {
    dropout.map_or(1.0, |dr| dr.factor(b, h, i, j) as f64)
}

/// The forward pass: output and log-sum-exp.
pub(crate) fn forward(p: &Problem<'_, f64>, dropout: Option<&Dropout>) -> Forward {
    let v = &p.v;
    let d = p.dims();
    let group = d.heads / d.kv_heads;
    let mut out = Array4::zeros((d.batch, d.heads, d.q_len, d.value_dim));
    let mut lse = Array3::zeros((d.batch, d.heads, d.q_len));
    for b in 0..d.batch {
        for h in 0..d.heads {
            let kvh = h / group;
            let (probs, l, sees) = probabilities(p, b, h);
            for i in 0..d.q_len {
                lse[[b, h, i]] = l[i];
                for j in 0..d.kv_len {
                    let w = probs[[i, j]] * dropped(dropout, b, h, i, j);
                    if sees[[i, j]] {
                        for c in 0..d.value_dim {
                            out[[b, h, i, c]] += w * v[[b, kvh, j, c]];
                        }
                    }
                }
            }
        }
    }
    Forward { out, lse }
}

/// The backward pass, recomputing the probabilities from `q` and `k`.
pub(crate) fn backward(
    p: &Problem<'_, f64>,
    dout: ArrayView4<'_, f64>,
    dropout: Option<&Dropout>,
) -> Backward {
    let (q, k, v) = (&p.q, &p.k, &p.v);
    let d = p.dims();
    let group = d.heads / d.kv_heads;
    let scale = p.scale as f64;
    let mut dq = Array4::zeros(q.raw_dim());
    let mut dk = Array4::zeros(k.raw_dim());
    let mut dv = Array4::zeros(v.raw_dim());
    let mut ds_all = Array4::zeros((d.batch, d.heads, d.q_len, d.kv_len));
    for b in 0..d.batch {
        for h in 0..d.heads {
            let kvh = h / group;
            let (probs, _, sees) = probabilities(p, b, h);
            // dP_ij = Z_ij/(1-p) · dO_i · v_j, and dV_j += P̃_ij dO_i.
            let mut dp = Array2::<f64>::zeros((d.q_len, d.kv_len));
            for i in 0..d.q_len {
                for j in 0..d.kv_len {
                    if !sees[[i, j]] {
                        continue;
                    }
                    let z = dropped(dropout, b, h, i, j);
                    let dot: f64 = (0..d.value_dim)
                        .map(|c| dout[[b, h, i, c]] * v[[b, kvh, j, c]])
                        .sum();
                    dp[[i, j]] = dot * z;
                    let w = probs[[i, j]] * z;
                    for c in 0..d.value_dim {
                        dv[[b, kvh, j, c]] += w * dout[[b, h, i, c]];
                    }
                }
            }
            // dS = P ∘ (dP − D), D summed along the softmax axis over the pairs
            // that see each other (a NaN row's P is NaN at the others too).
            let mut ds = &probs * &dp;
            ds.zip_mut_with(&sees, |x, &seen| *x = if seen { *x } else { 0.0 });
            match p.softmax_axis {
                SoftmaxAxis::Keys => {
                    for (mut row, prow) in ds.rows_mut().into_iter().zip(probs.rows()) {
                        let dsum = row.sum();
                        row.zip_mut_with(&prow, |x, &pr| *x -= pr * dsum);
                    }
                }
                SoftmaxAxis::Queries => {
                    for (mut col, pcol) in ds.columns_mut().into_iter().zip(probs.columns()) {
                        let dsum = col.sum();
                        col.zip_mut_with(&pcol, |x, &pr| *x -= pr * dsum);
                    }
                }
            }
            ds_all.slice_mut(ndarray::s![b, h, .., ..]).assign(&ds);
            for i in 0..d.q_len {
                for j in 0..d.kv_len {
                    if !sees[[i, j]] {
                        continue;
                    }
                    let g = ds[[i, j]] * scale;
                    for e in 0..d.head_dim {
                        dq[[b, h, i, e]] += g * k[[b, kvh, j, e]];
                        dk[[b, kvh, j, e]] += g * q[[b, h, i, e]];
                    }
                }
            }
        }
    }
    Backward {
        dq,
        dk,
        dv,
        ds: ds_all,
    }
}
