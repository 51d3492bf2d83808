//! docs/design.md's mask rule at f32's ends, the same on every kernel (reference,
//! fused, decode; f32 and bf16) and instruction set: only −∞ hides a key. A finite
//! additive term, however large, and a score near f32's limits take PyTorch's math:
//! a row of `f32::MIN` (transformers' padding mask) weighs its keys alike and gives
//! the mean of `v`; terms between `f32::MIN` and `−f32::MAX / log₂e` stay apart; a
//! term of `+3·10³⁸` is a finite score; a scaled product `scale · q·k` is ±∞ only
//! where it is beyond f32's range, and then +∞ makes its row NaN (∞ − ∞, as in
//! PyTorch) and −∞ weighs 0. The expected values are exact: each row's weights are
//! 1 on one key and 0 elsewhere, or equal.

mod kernel_support;

use attend::attention::{
    attention_backward_with, attention_with, AttentionOptions, BackwardConfig, BackwardKernel,
    Config, Exec, Kernel, Saved, DECODE_MAX_QUERIES,
};
use attend::element::bf16;
use attend::kernels::Isa;
use kernel_support::{Rng, BF16_ULP};
use ndarray::{s, Array2, Array3, Array4};

/// Every kernel that can run a problem with `q_len` queries, on every ISA here.
fn configs(q_len: usize) -> Vec<Config> {
    let mut out = vec![Config {
        kernel: Kernel::Reference,
        ..Default::default()
    }];
    for isa in Isa::available() {
        for kernel in [Kernel::Fused, Kernel::Decode] {
            if kernel == Kernel::Decode && q_len > DECODE_MAX_QUERIES {
                continue;
            }
            out.push(Config {
                kernel,
                exec: Exec {
                    isa: Some(isa),
                    threads: Some(2),
                },
            });
        }
    }
    out
}

/// Random q `[1, 2, L, 16]`, k `[1, 2, S, 16]`, v `[1, 2, S, 8]`, rounded to bf16
/// so that the f32 and the bf16 kernels get the same numbers.
fn inputs(seed: u64, l: usize, s: usize) -> [Array4<f32>; 3] {
    let mut rng = Rng::new(seed);
    let round = |a: Array4<f32>| a.mapv(|x| bf16::from_f32(x).to_f32());
    [
        round(rng.array((1, 2, l, 16))),
        round(rng.array((1, 2, s, 16))),
        round(rng.array((1, 2, s, 8))),
    ]
}

/// The sizes: a few queries against a long cache (the decode kernel's), and
/// blocks of queries and keys over several tiles.
const SIZES: [(usize, usize); 2] = [(3, 300), (70, 150)];

/// What a row must be.
enum Want {
    /// This row, within the rounding of its kind.
    Row(Vec<f64>),
    /// NaN, output and log-sum-exp.
    Nan,
}

/// Runs every configuration on f32 and on bf16 tensors and checks each row
/// `(h, i)` against `want(h, i)`: a [`Want::Row`] within the rounding of its kind
/// (f32: 4 ε of the row's largest value, for the sum of equal weights' products;
/// bf16: two bf16 ulps more, for the weights and the output rounded once each).
fn check(
    [q, k, v]: &[Array4<f32>; 3],
    opts: &AttentionOptions<'_>,
    want: impl Fn(usize, usize) -> Want,
) {
    for config in configs(q.dim().2) {
        let f32_run: (Array4<f32>, Array3<f32>) =
            attention_with(q.view(), k.view(), v.view(), opts, &config).unwrap();
        let [qb, kb, vb] = [q, k, v].map(|a| a.mapv(bf16::from_f32));
        let (out, lse) = attention_with(qb.view(), kb.view(), vb.view(), opts, &config).unwrap();
        let bf16_run = (out.mapv(bf16::to_f32), lse);
        for (kind, (out, lse), ulp) in [("f32", f32_run, 0.0), ("bf16", bf16_run, BF16_ULP)] {
            for ((_, h, i), &l) in lse.indexed_iter() {
                let row = out.slice(s![0, h, i, ..]);
                let what = format!("{kind} {config:?} row ({h}, {i}): {row} lse {l}");
                match want(h, i) {
                    Want::Nan => assert!(row.iter().all(|x| x.is_nan()) && l.is_nan(), "{what}"),
                    Want::Row(want) => {
                        let size = want.iter().fold(0.0f64, |m, x| m.max(x.abs()));
                        let tol = (4.0 * f32::EPSILON as f64 + 2.0 * ulp) * size;
                        // A NaN on our side is an infinite error (`max` would drop it).
                        let diff = |(&g, &w): (&f32, &f64)| match (g as f64 - w).abs() {
                            d if d.is_nan() => f64::INFINITY,
                            d => d,
                        };
                        let err = row.iter().zip(&want).map(diff).fold(0.0f64, f64::max);
                        assert!(
                            err <= tol && l.is_finite(),
                            "{what}: error {err:e} > {tol:e}"
                        );
                    }
                }
            }
        }
    }
}

/// The mean of `v[0, h, j, ..]` over the keys `j` that `keep` keeps, in f64.
fn mean_of(v: &Array4<f32>, h: usize, keep: impl Fn(usize) -> bool) -> Want {
    let keys: Vec<usize> = (0..v.dim().2).filter(|&j| keep(j)).collect();
    Want::Row(
        (0..v.dim().3)
            .map(|c| keys.iter().map(|&j| v[[0, h, j, c]] as f64).sum::<f64>() / keys.len() as f64)
            .collect(),
    )
}

#[test]
fn rows_of_f32_min_give_the_mean_of_v_as_pytorch_does() {
    for (l, s_len) in SIZES {
        let x = inputs(1 + l as u64, l, s_len);
        // transformers' `(1 − m) · finfo.min` over whole rows: every score is
        // `f32::MIN` once rounded, so the weights are equal.
        let bias = Array2::from_elem((l, s_len), f32::MIN);
        let opts = AttentionOptions {
            bias: Some(bias.view().into_dyn()),
            ..Default::default()
        };
        check(&x, &opts, |h, _| mean_of(&x[2], h, |_| true));
    }
}

#[test]
fn keys_of_f32_min_beside_others_weigh_nothing_by_the_error_rule() {
    for (l, s_len) in SIZES {
        let [q, k, v] = inputs(2 + l as u64, l, s_len);
        // transformers' padding of some keys, and a term just inside the range
        // that a factor of log₂e would have overflowed.
        let bias = Array2::from_shape_fn((l, s_len), |(i, j)| match (i + j) % 5 {
            0 => f32::MIN,
            1 => -2.5e38,
            _ => 0.5,
        });
        let opts = AttentionOptions {
            bias: Some(bias.view().into_dyn()),
            ..Default::default()
        };
        for config in configs(l) {
            let got = attention_with(q.view(), k.view(), v.view(), &opts, &config).unwrap();
            let what = format!("{config:?}");
            kernel_support::check(q.view(), k.view(), v.view(), &opts, &got, &what);
        }
    }
}

#[test]
fn terms_beyond_f32_max_over_log2e_stay_apart() {
    for (l, s_len) in SIZES {
        let x = inputs(3 + l as u64, l, s_len);
        // Every key far below the others but one, key `i mod S`, at −2.5·10³⁸:
        // the rest are −3·10³⁸ and f32::MIN, 5·10³⁷ and more below it, weight 0.
        let bias = Array2::from_shape_fn((l, s_len), |(i, j)| {
            if j == i % s_len {
                -2.5e38
            } else if j % 2 == 0 {
                -3e38
            } else {
                f32::MIN
            }
        });
        let opts = AttentionOptions {
            bias: Some(bias.view().into_dyn()),
            ..Default::default()
        };
        check(&x, &opts, |h, i| mean_of(&x[2], h, |j| j == i % s_len));
    }
}

#[test]
fn a_term_of_plus_3e38_is_a_finite_score() {
    for (l, s_len) in SIZES {
        let x = inputs(4 + l as u64, l, s_len);
        // Keys `j ≡ i (mod 4)` at +3·10³⁸, the others at 0: equal weights on the
        // former, and 0 on the latter (3·10³⁸ below them).
        let bias =
            Array2::from_shape_fn((l, s_len), |(i, j)| if j % 4 == i % 4 { 3e38 } else { 0.0 });
        let opts = AttentionOptions {
            bias: Some(bias.view().into_dyn()),
            ..Default::default()
        };
        check(&x, &opts, |h, i| mean_of(&x[2], h, |j| j % 4 == i % 4));
    }
}

#[test]
fn scores_near_f32_max_follow_pytorchs_math() {
    for (l, s_len) in SIZES {
        let [mut q, mut k, v] = inputs(5 + l as u64, l, s_len);
        // q·k = 2⁶³ · k[j, 0] (the other columns 0), scale 1 (so that the bf16
        // kernel, which scales after the sum, meets the same scores). Row i sees the
        // keys j ≡ i (mod 3) from L on, and key i, its own:
        // - rows i ≡ 0: the shared keys at 2⁶³ score 2¹²⁶, key i at 1.5·2⁶⁴ scores
        //   1.5·2¹²⁷ ≈ 2.6·10³⁸ (finite, beyond f32::MAX / log₂e): weight 1;
        // - rows i ≡ 1: the shared keys likewise, key i at 2⁶⁶ scores 2¹²⁹, beyond
        //   f32's range: +∞, and the row is NaN as in PyTorch (∞ − ∞);
        // - rows i ≡ 2: the shared keys at −2⁶⁶ (scores −∞: weight 0), key i at 1.
        q.fill(0.0);
        k.fill(0.0);
        q.slice_mut(s![.., .., .., 0]).fill(2f32.powi(63));
        for j in 0..s_len {
            let own = j < l;
            let key = match (j % 3, own) {
                (0, true) => 1.5 * 2f32.powi(64),
                (1, true) => 2f32.powi(66),
                (2, true) => 1.0,
                (2, false) => -(2f32.powi(66)),
                _ => 2f32.powi(63),
            };
            k.slice_mut(s![.., .., j, 0]).fill(key);
        }
        let mask = Array2::from_shape_fn((l, s_len), |(i, j)| j % 3 == i % 3 && (j == i || j >= l));
        let opts = AttentionOptions {
            mask: Some(mask.view().into_dyn()),
            scale: Some(1.0),
            ..Default::default()
        };
        let x = [q, k, v];
        check(&x, &opts, |h, i| match i % 3 {
            1 => Want::Nan,
            _ => mean_of(&x[2], h, |j| j == i),
        });
    }
}

/// The gradients of rows of `f32::MIN` (equal weights `1/S`) against the f64
/// reference's: each entry is a sum of at most `S + E` rounded products of the
/// equal weights and the inputs, so the f32 error is at most `(S + E) · ε` of
/// its terms' size (the worst-case bound of a sum), here taken as the largest
/// gradient's.
#[test]
fn the_gradients_of_rows_of_f32_min_are_those_of_equal_weights() {
    for (l, s_len) in SIZES {
        let [q, k, v] = inputs(6 + l as u64, l, s_len);
        let dout = Rng::new(60 + l as u64).array((1, 2, l, 8));
        let bias = Array2::from_shape_fn((l, s_len), |(i, j)| {
            if i % 2 == 0 || j % 3 == 0 {
                f32::MIN
            } else {
                0.25
            }
        });
        let opts = AttentionOptions {
            bias: Some(bias.view().into_dyn()),
            ..Default::default()
        };
        let config = Config {
            kernel: Kernel::Reference,
            ..Default::default()
        };
        let (out, lse) = attention_with(q.view(), k.view(), v.view(), &opts, &config).unwrap();
        let saved = Saved::new(out.view(), lse.view());
        let grads = |kernel, isa| {
            let config = BackwardConfig {
                kernel,
                exec: Exec {
                    isa: Some(isa),
                    threads: Some(2),
                },
                ..Default::default()
            };
            let (q, k, v) = (q.view(), k.view(), v.view());
            attention_backward_with(q, k, v, saved, dout.view(), &opts, &config).unwrap()
        };
        let want = grads(BackwardKernel::Reference, Isa::Portable);
        for isa in Isa::available() {
            let got = grads(BackwardKernel::Fused, isa);
            for (what, g, w) in [
                ("dq", &got.dq, &want.dq),
                ("dk", &got.dk, &want.dk),
                ("dv", &got.dv, &want.dv),
            ] {
                let size = w.iter().fold(0.0f32, |m, x| m.max(x.abs())) as f64;
                let tol = (s_len + 16) as f64 * f32::EPSILON as f64 * size;
                // A NaN is an infinite error (`max` would drop it).
                let diff = |(&a, &b): (&f32, &f32)| match (a as f64 - b as f64).abs() {
                    d if d.is_nan() => f64::INFINITY,
                    d => d,
                };
                let err = g.iter().zip(w).map(diff).fold(0.0f64, f64::max);
                assert!(
                    err <= tol,
                    "{} L{l} S{s_len} {what}: error {err:e} > {tol:e}",
                    isa.name()
                );
            }
        }
    }
}
