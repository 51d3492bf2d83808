//! Shared helpers of the kernel tests (fused, decode): random inputs, the naive f32 yardstick
//! and docs/design.md's error rule.
#![allow(dead_code)]

use attend::attention::{AttentionOptions, Problem};
use attend::element::bf16;
use attend::kernels::reference;
use ndarray::{Array, Array2, Array3, Array4, ArrayView4, Dimension, ShapeBuilder};

/// A small xorshift generator, so the tests do not depend on other modules.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    /// Roughly normal (sum of uniforms).
    pub fn normal(&mut self) -> f32 {
        (0..4).map(|_| self.uniform()).sum::<f32>() * 0.866
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    pub fn array<D: Dimension>(&mut self, shape: impl ShapeBuilder<Dim = D>) -> Array<f32, D> {
        let mut a = Array::zeros(shape);
        a.mapv_inplace(|_| self.normal());
        a
    }
}

/// The yardstick: attention in plain f32, materialising the scores, with the
/// textbook max-subtracted softmax and `f32::exp`.
pub fn naive_f32(p: &Problem<'_>) -> (Array4<f32>, Array3<f32>) {
    let d = p.dims();
    let group = d.heads / d.kv_heads;
    let mut out = Array4::zeros((d.batch, d.heads, d.q_len, d.value_dim));
    let mut lse = Array3::zeros((d.batch, d.heads, d.q_len));
    for b in 0..d.batch {
        for h in 0..d.heads {
            let kvh = h / group;
            let mut s = Array2::<f32>::from_elem((d.q_len, d.kv_len), f32::NEG_INFINITY);
            for i in 0..d.q_len {
                let (lo, hi) = p.key_range(i);
                for j in lo..hi {
                    if p.keeps(b, h, i, j) {
                        let mut dot = 0.0f32;
                        for e in 0..d.head_dim {
                            dot += p.q[[b, h, i, e]] * p.k[[b, kvh, j, e]];
                        }
                        s[[i, j]] = dot * p.scale + p.bias_at(b, h, i, j);
                    }
                }
                let max = s.row(i).iter().copied().fold(f32::NEG_INFINITY, f32::max);
                if max == f32::NEG_INFINITY {
                    lse[[b, h, i]] = f32::NEG_INFINITY;
                    continue;
                }
                let w: Vec<f32> = s.row(i).iter().map(|&x| (x - max).exp()).collect();
                let sum: f32 = w.iter().sum();
                lse[[b, h, i]] = max + sum.ln();
                for c in 0..d.value_dim {
                    let mut acc = 0.0f32;
                    for (j, wj) in w.iter().enumerate() {
                        if *wj != 0.0 {
                            acc += wj * p.v[[b, kvh, j, c]];
                        }
                    }
                    out[[b, h, i, c]] = acc / sum;
                }
            }
        }
    }
    (out, lse)
}

fn max_err<D: Dimension>(a: &Array<f32, D>, b: &Array<f32, D>) -> f64 {
    a.iter()
        .zip(b.iter())
        .map(|(&x, &y)| {
            if x == y || (x.is_nan() && y.is_nan()) {
                0.0 // also equal infinities
            } else if x.is_nan() || y.is_nan() {
                f64::INFINITY // a NaN on one side only (`f64::max` would drop it)
            } else {
                (x as f64 - y as f64).abs()
            }
        })
        .fold(0.0, f64::max)
}

/// Checks `got` against the f64 reference with docs/design.md's rule: the max error is at
/// most twice the naive f32 implementation's, plus the f32 rounding floor (of the
/// output and of the scaled scores it depends on; see the body). Also
/// checks that fully masked rows are exactly 0 with a log-sum-exp of −∞.
pub fn check(
    q: ArrayView4<'_, f32>,
    k: ArrayView4<'_, f32>,
    v: ArrayView4<'_, f32>,
    opts: &AttentionOptions<'_>,
    got: &(Array4<f32>, Array3<f32>),
    what: &str,
) {
    let p = Problem::new(q, k, v, opts).expect("valid problem");
    let naive = naive_f32(&p);
    check_against(&p, &naive, 0.0, got, what);
}

/// [`check`] for a bf16 result: `q`, `k`, `v` hold the bf16 inputs widened to f32,
/// `got` the bf16 output widened. The yardstick is [`naive_bf16`], and the floor
/// adds one bf16 ulp of the output's largest entry (`2⁻⁸·max|o|`): the output and
/// the weights are each rounded to bf16 once (half an ulp each), which no bf16
/// implementation avoids.
pub fn check_bf16(
    q: ArrayView4<'_, f32>,
    k: ArrayView4<'_, f32>,
    v: ArrayView4<'_, f32>,
    opts: &AttentionOptions<'_>,
    got: &(Array4<f32>, Array3<f32>),
    what: &str,
) {
    for (name, a) in [("q", q.view()), ("k", k.view()), ("v", v.view())] {
        assert!(
            a.iter()
                .all(|&x| bf16::from_f32(x).to_f32() == x || x.is_nan()),
            "{what}: {name} must hold bf16 numbers"
        );
    }
    let p = Problem::new(q, k, v, opts).expect("valid problem");
    let naive = naive_bf16(&p);
    check_against(&p, &naive, BF16_ULP, got, what);
}

/// One ulp of bf16 relative to a power of two: 8 significant bits.
pub const BF16_ULP: f64 = 1.0 / 256.0;

/// The bf16 yardstick: [`naive_f32`] on bf16 inputs (whose products are exact in
/// f32), with the normalised weights rounded to bf16 before they multiply `v` and
/// the output rounded to bf16, as PyTorch's math attention on bf16 tensors does.
pub fn naive_bf16(p: &Problem<'_>) -> (Array4<f32>, Array3<f32>) {
    let round = |x: f32| bf16::from_f32(x).to_f32();
    let d = p.dims();
    let group = d.heads / d.kv_heads;
    let (_, lse) = naive_f32(p);
    let mut out = Array4::zeros((d.batch, d.heads, d.q_len, d.value_dim));
    for ((b, h, i), &l) in lse.indexed_iter() {
        if l == f32::NEG_INFINITY {
            continue;
        }
        let (lo, hi) = p.key_range(i);
        let mut w = vec![0.0f32; d.kv_len];
        let mut max = f32::NEG_INFINITY;
        let mut s = vec![f32::NEG_INFINITY; d.kv_len];
        for (j, sj) in s.iter_mut().enumerate().take(hi).skip(lo) {
            if p.keeps(b, h, i, j) {
                let mut dot = 0.0f32;
                for e in 0..d.head_dim {
                    dot += p.q[[b, h, i, e]] * p.k[[b, h / group, j, e]];
                }
                *sj = dot * p.scale + p.bias_at(b, h, i, j);
                max = max.max(*sj);
            }
        }
        let mut sum = 0.0f32;
        for (wj, sj) in w[lo..hi].iter_mut().zip(&s[lo..hi]) {
            *wj = (sj - max).exp();
            sum += *wj;
        }
        for c in 0..d.value_dim {
            let mut acc = 0.0f32;
            for (j, wj) in w.iter().enumerate().take(hi).skip(lo) {
                if *wj != 0.0 {
                    acc += round(wj / sum) * p.v[[b, h / group, j, c]];
                }
            }
            out[[b, h, i, c]] = round(acc);
        }
    }
    (out, lse)
}

/// The rule itself: `got` against the f64 reference, within twice `naive`'s error
/// plus the f32 floor plus `ulp_floor` times the output's largest entry.
fn check_against(
    p: &Problem<'_>,
    naive: &(Array4<f32>, Array3<f32>),
    ulp_floor: f64,
    got: &(Array4<f32>, Array3<f32>),
    what: &str,
) {
    let want = reference::run(p);
    assert_eq!(got.0.shape(), want.output.shape(), "{what}: output shape");
    assert_eq!(got.1.shape(), want.lse.value.shape(), "{what}: lse shape");
    for (l, (g, n)) in want.lse.value.iter().zip(got.1.iter().zip(naive.1.iter())) {
        assert_eq!(
            *l == f32::NEG_INFINITY,
            *g == f32::NEG_INFINITY,
            "{what}: fully masked rows differ (ref lse {l}, got {g}, naive {n})"
        );
    }
    let d = p.dims();
    for ((b, h, i), l) in want.lse.value.indexed_iter() {
        if *l == f32::NEG_INFINITY {
            for c in 0..d.value_dim {
                assert_eq!(got.0[[b, h, i, c]], 0.0, "{what}: masked row must be 0");
            }
        }
    }
    // The f32 rounding floor: output magnitude, plus how far the output moves when
    // each scaled score is rounded to f32 (|∂out/∂s| · ulp(s), to first order) and
    // when each product of its dot product carries one rounding (u · Σ|q·k|: where
    // the products cancel, the score is small but its error is not).
    // Every f32 implementation pays this, so on small problems the naive
    // implementation's error alone is too noisy a yardstick.
    let vmax = want
        .output
        .iter()
        .fold(0.0f64, |m, &x| m.max(x.abs() as f64));
    let eps = f32::EPSILON as f64;
    let group = d.heads / d.kv_heads;
    // Σ_e |q·k| · |scale| of every score, for the products' roundings above.
    let abs_dots = Array4::from_shape_fn(want.weights.raw_dim(), |(b, h, i, j)| {
        (0..d.head_dim)
            .map(|e| (p.q[[b, h, i, e]] as f64 * p.k[[b, h / group, j, e]] as f64).abs())
            .sum::<f64>()
            * (p.scale as f64).abs()
    });
    let mut score_floor = 0.0f64;
    for ((b, h, i, c), &o) in want.output.indexed_iter() {
        let mut sens = 0.0f64;
        for j in 0..d.kv_len {
            let w = want.weights[[b, h, i, j]] as f64;
            // Both terms of `scale · q·k + bias` are rounded, however much they cancel.
            let s = (want.scores[[b, h, i, j]] * p.scale).abs() as f64
                + p.bias_at(b, h, i, j).abs() as f64;
            if w > 0.0 {
                let dv = p.v[[b, h / group, j, c]] as f64 - o as f64;
                sens += w * dv.abs() * (s * eps + abs_dots[[b, h, i, j]] * eps / 2.0);
            }
        }
        score_floor = score_floor.max(sens);
    }
    let floor = (4.0 * eps + ulp_floor) * vmax.max(f32::MIN_POSITIVE as f64) + 2.0 * score_floor;
    let (err, nerr) = (
        max_err(&got.0, &want.output),
        max_err(&naive.0, &want.output),
    );
    assert!(
        err <= 2.0 * nerr + floor,
        "{what}: output error {err:e} > 2 × naive {nerr:e} + floor {floor:e}"
    );
    // The log-sum-exp is as precise as the largest score it is computed from,
    // before the additive mask (which may cancel most of it) is added.
    let scaled_dots = want.scores.iter().map(|&x| x * p.scale);
    let lmax = want
        .scaled
        .iter()
        .copied()
        .chain(want.lse.value.iter().copied())
        .chain(scaled_dots)
        .filter(|x| x.is_finite())
        .fold(0.0f64, |m, x| m.max(x.abs() as f64));
    let lfloor = 4.0 * f32::EPSILON as f64 * lmax.max(1.0);
    let (err, nerr) = (
        max_err(&got.1, &want.lse.value),
        max_err(&naive.1, &want.lse.value),
    );
    assert!(
        err <= 2.0 * nerr + lfloor,
        "{what}: lse error {err:e} > 2 × naive {nerr:e} + floor {lfloor:e}"
    );
}
