//! docs/design.md's NaN rule on the forward, the same on every kernel, instruction
//! set, element type and size: a NaN in a query or a key reaches exactly the output
//! rows whose scores it touches (the f64 reference decides, as PyTorch's math
//! backend does: a NaN score makes its row's softmax NaN), a NaN in a value the
//! columns of the rows that see its key; fully masked rows stay 0 with log-sum-exp
//! −∞; rows the NaN cannot reach are untouched, and a key a row does not see never
//! reaches it, whatever it holds.

mod kernel_support;
mod nan_support;

use attend::attention::{
    attention_train, attention_with, AttentionOptions, Causal, Config, Dropout, Exec, Kernel,
    Problem,
};
use attend::element::bf16;
use attend::kernels::Isa;
use kernel_support::{check_bf16, Rng};
use nan_support::{assert_pattern, key_lengths, poison, MaskArrays, Masks, Poison, LENGTHS};
use ndarray::{s, Array2, Array3, Array4};

/// Every kernel that can run a problem with `q_len` queries, on every ISA here.
fn configs(q_len: usize) -> Vec<Config> {
    let mut out = vec![Config {
        kernel: Kernel::Reference,
        ..Default::default()
    }];
    for isa in Isa::available() {
        for kernel in [Kernel::Fused, Kernel::Decode, Kernel::Auto] {
            if kernel == Kernel::Decode && q_len > attend::attention::DECODE_MAX_QUERIES {
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

/// Random q `[1, H, L, 16]`, k `[1, H, S, 16]` and v `[1, H, S, 8]`.
fn inputs(seed: u64, heads: usize, l: usize, s: usize) -> (Array4<f32>, Array4<f32>, Array4<f32>) {
    let mut rng = Rng::new(seed);
    let q = rng.array((1, heads, l, 16));
    let k = rng.array((1, heads, s, 16));
    (q, k, rng.array((1, heads, s, 8)))
}

/// Runs every kernel and checks each row against `expect(b, h, i)`: `Some(true)`
/// NaN, `Some(false)` finite, `None` fully masked (0 and −∞).
fn check(
    q: &Array4<f32>,
    k: &Array4<f32>,
    v: &Array4<f32>,
    opts: &AttentionOptions<'_>,
    expect: impl Fn(usize, usize, usize) -> Option<bool>,
) {
    for config in configs(q.dim().2) {
        let (out, lse): (Array4<f32>, Array3<f32>) =
            attention_with(q.view(), k.view(), v.view(), opts, &config).unwrap();
        for ((b, h, i), &l) in lse.indexed_iter() {
            let row = out.slice(s![b, h, i, ..]);
            let what = format!("{config:?} row ({b}, {h}, {i}): {row} lse {l}");
            match expect(b, h, i) {
                Some(true) => assert!(row.iter().all(|x| x.is_nan()) && l.is_nan(), "{what}"),
                Some(false) => {
                    assert!(row.iter().all(|x| x.is_finite()) && l.is_finite(), "{what}")
                }
                None => assert!(
                    row.iter().all(|&x| x == 0.0) && l == f32::NEG_INFINITY,
                    "{what}"
                ),
            }
        }
    }
}

#[test]
fn a_nan_query_row_is_nan_on_every_kernel_and_other_rows_are_not() {
    for (l, s_len) in [(3, 700), (40, 40), (130, 90)] {
        let (mut q, k, v) = inputs(l as u64, 2, l, s_len);
        q[[0, 1, 1, 5]] = f32::NAN;
        // Row 2 of head 0 sees no key at all.
        let mask = Array2::from_shape_fn((l, s_len), |(i, _)| i != 2);
        let opts = AttentionOptions {
            mask: Some(mask.view().into_dyn()),
            ..Default::default()
        };
        check(&q, &k, &v, &opts, |_, h, i| match (h, i) {
            (_, 2) => None,
            (1, 1) => Some(true),
            _ => Some(false),
        });
    }
}

#[test]
fn a_nan_key_reaches_every_row_that_sees_it() {
    for (l, s_len) in [(4, 300), (70, 70)] {
        let (q, mut k, v) = inputs(7 + l as u64, 2, l, s_len);
        k[[0, 0, 3, 0]] = f32::NAN;
        // Every query of head 0 sees key 3; head 1 has its own keys and never
        // meets it.
        check(&q, &k, &v, &AttentionOptions::default(), |_, h, _| {
            Some(h == 0)
        });
    }
}

#[test]
fn a_nan_key_hidden_by_a_mask_reaches_no_row() {
    for (l, s_len) in [(4, 4), (70, 70), (12, 300)] {
        let (q, mut k, v) = inputs(11 + l as u64, 1, l, s_len);
        k[[0, 0, 3, 0]] = f32::NAN;
        let opts = AttentionOptions {
            causal: Some(Causal::TopLeft),
            ..Default::default()
        };
        // Causal: query i sees keys j ≤ i, so rows 0..3 never meet key 3 (in the
        // fused kernel they share its tile, where the mask hides it).
        check(&q, &k, &v, &opts, |_, _, i| Some(i >= 3));
        // The same with a boolean mask that hides key 3 from the even rows.
        let mask = Array2::from_shape_fn((l, s_len), |(i, j)| j != 3 || i % 2 == 1);
        let opts = AttentionOptions {
            mask: Some(mask.view().into_dyn()),
            ..Default::default()
        };
        check(&q, &k, &v, &opts, |_, _, i| Some(i % 2 == 1));
    }
}

#[test]
fn dropout_does_not_hide_a_nan_value() {
    // Dropout scales a weight, it does not mask a key: a dropped key's zero weight
    // times a NaN value is NaN, as in the math (and the f64 reference), so the NaN
    // reaches its column of every row that sees the key, dropped there or not. A
    // key the causal mask hides still reaches no row.
    for (l, s_len) in [(4, 4), (40, 40), (129, 129)] {
        let (q, k, mut v) = inputs(23 + l as u64, 2, l, s_len);
        v[[0, 0, 3, 5]] = f32::NAN;
        let dropout = Dropout::new(0.5, 99).expect("a valid rate");
        for causal in [None, Some(Causal::TopLeft)] {
            let opts = AttentionOptions {
                causal,
                ..Default::default()
            };
            let (out, lse) = attention_train(q.view(), k.view(), v.view(), &opts, Some(&dropout))
                .expect("a valid problem");
            let dropped = (0..l)
                .filter(|&i| dropout.factor(0, 0, i, 3) == 0.0)
                .count();
            assert!(dropped > 0 || l < 8, "L={l}: no row drops key 3");
            for ((h, i, c), x) in out.slice(s![0, .., .., ..]).indexed_iter() {
                let sees = causal.is_none() || i >= 3usize;
                let want_nan = h == 0usize && c == 5usize && sees;
                assert_eq!(
                    x.is_nan(),
                    want_nan,
                    "L={l} {causal:?} head {h} row {i} column {c}: {x}"
                );
            }
            assert!(
                lse.value.iter().all(|x| x.is_finite()),
                "L={l}: the weights have no NaN"
            );
        }
    }
}

#[test]
fn a_seen_key_with_a_score_of_minus_infinity_still_multiplies_its_value() {
    // q·k = −∞ gives key 3 a weight of 0, but the rows see it: 0 times its NaN
    // value is NaN in that column, as in the math, on every kernel (decoding
    // included: L = 1 and 4). Another row, which the causal mask hides key 3 from,
    // stays finite. The log-sum-exp is finite (the other keys carry the row).
    for (l, s_len) in [(1, 40), (4, 300), (40, 40)] {
        let (mut q, mut k, mut v) = inputs(31 + l as u64, 1, l, s_len);
        q.slice_mut(s![.., .., .., 0])
            .mapv_inplace(|x| x.abs() + 0.1);
        k[[0, 0, 3, 0]] = f32::NEG_INFINITY;
        v[[0, 0, 3, 2]] = f32::NAN;
        for causal in [None, Some(Causal::BottomRight)] {
            let opts = AttentionOptions {
                causal,
                ..Default::default()
            };
            // Bottom-right: query i sees keys j ≤ i + S − L.
            let sees = |i: usize| causal.is_none() || 3 + l <= i + s_len;
            for config in configs(l) {
                let (out, lse): (Array4<f32>, Array3<f32>) =
                    attention_with(q.view(), k.view(), v.view(), &opts, &config).unwrap();
                for ((i, c), x) in out.slice(s![0, 0, .., ..]).indexed_iter() {
                    let want_nan = c == 2usize && sees(i);
                    assert_eq!(
                        x.is_nan(),
                        want_nan,
                        "{config:?} {causal:?} L={l} row {i} column {c}: {x}"
                    );
                }
                assert!(lse.iter().all(|x| x.is_finite()), "{config:?} L={l}: {lse}");
            }
        }
    }
}

#[test]
fn a_nan_query_in_a_fully_masked_row_gives_zero() {
    for (l, s_len) in [(4, 300), (40, 40)] {
        let (mut q, k, v) = inputs(13 + l as u64, 1, l, s_len);
        q[[0, 0, 2, 0]] = f32::NAN;
        let mask = Array2::from_shape_fn((l, s_len), |(i, _)| i != 2);
        let opts = AttentionOptions {
            mask: Some(mask.view().into_dyn()),
            ..Default::default()
        };
        check(&q, &k, &v, &opts, |_, _, i| (i != 2).then_some(false));
    }
}

/// Random q `[1, 2, L, 20]`, k `[1, 2, S, 20]` and v `[1, 2, S, 24]`: widths with a
/// tail past whole vectors of 16.
fn grid_inputs(seed: u64, l: usize, s: usize) -> (Array4<f32>, Array4<f32>, Array4<f32>) {
    let mut rng = Rng::new(seed);
    let q = rng.array((1, 2, l, 20));
    let k = rng.array((1, 2, s, 20));
    (q, k, rng.array((1, 2, s, 24)))
}

/// Every case of the grid: `(L, S, masks, poison)`, the additive mask's NaNs only
/// with an additive mask.
fn grid() -> Vec<(usize, usize, Masks, Poison)> {
    let mut cases = Vec::new();
    for l in LENGTHS {
        for s in key_lengths(l, 300) {
            for masks in Masks::ALL {
                for which in [Poison::Query, Poison::Key, Poison::Values, Poison::Bias] {
                    if which != Poison::Bias || masks == Masks::AdditiveCausal {
                        cases.push((l, s, masks, which));
                    }
                }
            }
        }
    }
    cases
}

/// One grid case's inputs with their NaNs, and its masks.
fn grid_case(
    n: usize,
    (l, s, masks, which): (usize, usize, Masks, Poison),
) -> ([Array4<f32>; 3], MaskArrays) {
    let (mut q, mut k, mut v) = grid_inputs(n as u64, l, s);
    let mut arrays = MaskArrays::new(masks, l, s);
    poison(which, (&mut q, &mut k, &mut v), arrays.bias.as_mut(), None);
    ([q, k, v], arrays)
}

#[test]
fn the_rule_holds_on_f32_at_every_size_on_every_kernel() {
    for (n, case) in grid().into_iter().enumerate() {
        let ([q, k, v], arrays) = grid_case(n, case);
        let opts = arrays.options();
        let p = Problem::new(q.view(), k.view(), v.view(), &opts).unwrap();
        let (want_out, want_lse) = nan_support::forward(&p);
        for config in configs(case.0) {
            let what = format!("{case:?} {config:?}");
            let got = attention_with(q.view(), k.view(), v.view(), &opts, &config).unwrap();
            assert_pattern(&got.0, &want_out, &format!("{what} output"));
            assert_pattern(&got.1, &want_lse, &format!("{what} lse"));
            // The finite entries within docs/design.md's error rule (its maxima skip
            // the NaN entries, whose places are checked above).
            kernel_support::check(q.view(), k.view(), v.view(), &opts, &got, &what);
        }
    }
}

#[test]
fn the_rule_holds_on_bf16_at_every_size_on_every_kernel() {
    for (n, case) in grid().into_iter().enumerate() {
        let ([q, k, v], arrays) = grid_case(n, case);
        let opts = arrays.options();
        let [q, k, v] = [q, k, v].map(|a| a.mapv(bf16::from_f32));
        let [q32, k32, v32] = [&q, &k, &v].map(|a| a.mapv(bf16::to_f32));
        let p = Problem::new(q32.view(), k32.view(), v32.view(), &opts).unwrap();
        let (want_out, want_lse) = nan_support::forward(&p);
        for config in configs(case.0) {
            let what = format!("bf16 {case:?} {config:?}");
            let (out, lse) = attention_with(q.view(), k.view(), v.view(), &opts, &config).unwrap();
            let got = (out.mapv(bf16::to_f32), lse);
            assert_pattern(&got.0, &want_out, &format!("{what} output"));
            assert_pattern(&got.1, &want_lse, &format!("{what} lse"));
            check_bf16(q32.view(), k32.view(), v32.view(), &opts, &got, &what);
        }
    }
}
