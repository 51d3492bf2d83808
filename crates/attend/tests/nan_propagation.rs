//! A NaN in a query or a key reaches exactly the output rows whose scores it
//! touches, the same way on every kernel (the f64 reference decides, as PyTorch's
//! math backend does: a NaN score makes its row's softmax NaN); fully masked rows
//! stay 0 with log-sum-exp −∞; rows the NaN cannot reach are untouched.

mod kernel_support;

use attend::attention::{attention_with, AttentionOptions, Causal, Config, Exec, Kernel};
use attend::kernels::Isa;
use kernel_support::Rng;
use ndarray::{s, Array2, Array3, Array4};

/// Every kernel that can run a problem with `q_len` queries, on every ISA here.
fn configs(q_len: usize) -> Vec<Config> {
    let isas = [Isa::Portable, Isa::Avx2, Isa::Avx512];
    let mut out = vec![Config {
        kernel: Kernel::Reference,
        ..Default::default()
    }];
    for isa in isas.into_iter().filter(|i| i.is_available()) {
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
