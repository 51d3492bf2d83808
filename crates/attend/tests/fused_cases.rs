//! Targeted cases for the fused kernel: determinism across thread counts, NaN
//! isolation, huge scores, fully masked rows, dispatch.

mod kernel_support;

use attend::attention::{
    attention, attention_with, attention_with_lse, AttentionOptions, Causal, Config, Exec, Kernel,
    Problem, SoftmaxAxis,
};
use attend::kernels::{reference, Isa};
use kernel_support::{check, Rng};
use ndarray::{Array2, Array4, ArrayD, IxDyn};

fn fused(isa: Isa, threads: usize) -> Config {
    Config {
        kernel: Kernel::Fused,
        exec: Exec {
            isa: Some(isa),
            threads: Some(threads),
        },
    }
}

/// Runs the fused kernel with 2 threads on every instruction set and judges each
/// result.
fn check_every_isa([q, k, v]: [&Array4<f32>; 3], opts: &AttentionOptions<'_>, what: &str) {
    for isa in Isa::available() {
        let got = attention_with(q.view(), k.view(), v.view(), opts, &fused(isa, 2)).unwrap();
        let what = format!("{what} on {isa:?}");
        check(q.view(), k.view(), v.view(), opts, &got, &what);
    }
}

#[allow(clippy::too_many_arguments)]
fn qkv(
    seed: u64,
    b: usize,
    h: usize,
    hkv: usize,
    l: usize,
    s: usize,
    e: usize,
    ev: usize,
) -> [Array4<f32>; 3] {
    let mut rng = Rng::new(seed);
    [
        rng.array((b, h, l, e)),
        rng.array((b, hkv, s, e)),
        rng.array((b, hkv, s, ev)),
    ]
}

#[test]
fn same_bits_for_one_two_and_three_threads() {
    let [q, k, v] = qkv(1, 1, 4, 2, 150, 200, 64, 48);
    let mut rng = Rng::new(9);
    let mask = ArrayD::from_shape_fn(IxDyn(&[150, 200]), |_| rng.below(10) != 0);
    for opts in [
        AttentionOptions::default(),
        AttentionOptions {
            causal: Some(Causal::BottomRight),
            window: Some((70, 0)),
            mask: Some(mask.view()),
            ..Default::default()
        },
    ] {
        for isa in Isa::available() {
            let one = attention_with(q.view(), k.view(), v.view(), &opts, &fused(isa, 1)).unwrap();
            for threads in [2, 3] {
                let many =
                    attention_with(q.view(), k.view(), v.view(), &opts, &fused(isa, threads))
                        .unwrap();
                let same =
                    |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(
                    same(one.0.as_slice().unwrap(), many.0.as_slice().unwrap()),
                    "{isa:?} {threads}"
                );
                assert!(
                    same(one.1.as_slice().unwrap(), many.1.as_slice().unwrap()),
                    "{isa:?} {threads}"
                );
            }
            check(
                q.view(),
                k.view(),
                v.view(),
                &opts,
                &one,
                &format!("{isa:?}"),
            );
        }
    }
}

#[test]
fn nan_in_one_head_stays_in_that_head() {
    let [mut q, k, v] = qkv(2, 2, 4, 4, 70, 90, 32, 32);
    let clean: Vec<_> = Isa::available()
        .into_iter()
        .map(|isa| {
            attention_with(
                q.view(),
                k.view(),
                v.view(),
                &Default::default(),
                &fused(isa, 1),
            )
            .unwrap()
        })
        .collect();
    q[[1, 2, 5, 3]] = f32::NAN;
    for (isa, clean) in Isa::available().into_iter().zip(clean) {
        let (out, lse) = attention_with(
            q.view(),
            k.view(),
            v.view(),
            &Default::default(),
            &fused(isa, 2),
        )
        .unwrap();
        for b in 0..2 {
            for h in 0..4 {
                let poisoned = (b, h) == (1, 2);
                for i in 0..70 {
                    let nan_row = out
                        .slice(ndarray::s![b, h, i, ..])
                        .iter()
                        .any(|x| x.is_nan());
                    if poisoned && i == 5 {
                        assert!(nan_row, "{isa:?}: the NaN row itself should be NaN");
                    } else if !poisoned {
                        assert!(!nan_row, "{isa:?}: NaN leaked into head ({b}, {h})");
                        assert_eq!(lse[[b, h, i]], clean.1[[b, h, i]]);
                        assert_eq!(out[[b, h, i, 0]], clean.0[[b, h, i, 0]]);
                    }
                }
            }
        }
    }
}

#[test]
fn scores_around_1e4_do_not_overflow() {
    let [mut q, mut k, v] = qkv(3, 1, 2, 2, 40, 130, 16, 8);
    // |q·k| up to about 1e4 after scaling.
    q.mapv_inplace(|x| x * 60.0);
    k.mapv_inplace(|x| x * 60.0);
    let opts = AttentionOptions {
        causal: Some(Causal::TopLeft),
        ..Default::default()
    };
    let p = Problem::new(q.view(), k.view(), v.view(), &opts).unwrap();
    let want = reference::run(&p);
    assert!(
        want.scaled.iter().any(|&s| s.abs() > 5e3),
        "the test needs huge scores"
    );
    for isa in Isa::available() {
        let got = attention_with(q.view(), k.view(), v.view(), &opts, &fused(isa, 2)).unwrap();
        assert!(got.0.iter().all(|x| x.is_finite()), "{isa:?}: overflow");
        assert!(
            got.1.iter().all(|x| x.is_finite()),
            "{isa:?}: overflow in lse"
        );
        check(
            q.view(),
            k.view(),
            v.view(),
            &opts,
            &got,
            &format!("{isa:?}"),
        );
    }
}

#[test]
fn fully_masked_rows_are_exactly_zero() {
    let [q, k, v] = qkv(4, 1, 2, 1, 100, 100, 24, 24);
    let mut pad = Array2::from_elem((1, 100), false);
    pad.slice_mut(ndarray::s![0, 10..]).fill(true); // only keys 0..10 are real
                                                    // Queries 0..=59 see nothing: the window starts at i - 50.
    let mut mask = ArrayD::from_elem(IxDyn(&[100, 100]), true);
    mask.slice_mut(ndarray::s![60.., ..]).fill(false);
    let opts = AttentionOptions {
        key_padding: Some(pad.view()),
        mask: Some(mask.view()),
        window: Some((50, 50)),
        ..Default::default()
    };
    for isa in Isa::available() {
        let (out, lse) =
            attention_with(q.view(), k.view(), v.view(), &opts, &fused(isa, 2)).unwrap();
        for h in 0..2 {
            for i in 0..100 {
                let visible = i <= 59;
                assert_eq!(lse[[0, h, i]].is_finite(), visible, "{isa:?} row {i}");
                if !visible {
                    assert!(out
                        .slice(ndarray::s![0, h, i, ..])
                        .iter()
                        .all(|&x| x.to_bits() == 0));
                }
            }
        }
        check(
            q.view(),
            k.view(),
            v.view(),
            &opts,
            &(out, lse),
            &format!("{isa:?}"),
        );
    }
}

#[test]
fn masks_broadcast_over_batch_heads_or_queries_match_the_reference() {
    // L > 64: two query blocks of 64 lanes, the last one padded.
    let (b, h, l, s) = (2, 4, 70, 90);
    let [q, k, v] = qkv(6, b, h, 2, l, s, 32, 24);
    let mut rng = Rng::new(10);
    let keep_2d = ArrayD::from_shape_fn(IxDyn(&[l, s]), |_| rng.below(6) != 0);
    let keep_per_batch = ArrayD::from_shape_fn(IxDyn(&[b, 1, 1, s]), |_| rng.below(5) != 0);
    let bias_per_head = ArrayD::from_shape_fn(IxDyn(&[1, h, l, s]), |_| rng.normal());
    let padding = Array2::from_shape_fn((b, s), |_| rng.below(7) == 0);
    // Padding as a batch of sentences has it: a tail of keys in one sequence only,
    // so that some tiles are cut by it and others read no mask at all.
    let tail = Array2::from_shape_fn((b, s), |(bb, j)| bb == 0 && j >= 60);
    let cases = [
        AttentionOptions {
            key_padding: Some(tail.view()),
            ..Default::default()
        },
        AttentionOptions {
            mask: Some(keep_2d.view()),
            key_padding: Some(padding.view()),
            ..Default::default()
        },
        AttentionOptions {
            bias: Some(bias_per_head.view()),
            causal: Some(Causal::TopLeft),
            window: Some((30, 0)),
            ..Default::default()
        },
        AttentionOptions {
            mask: Some(keep_per_batch.view()),
            bias: Some(bias_per_head.view()),
            causal: Some(Causal::BottomRight),
            ..Default::default()
        },
    ];
    for (n, opts) in cases.iter().enumerate() {
        check_every_isa([&q, &k, &v], opts, &format!("case {n}"));
    }
}

#[test]
fn long_rows_many_tiles_gqa_and_wide_heads() {
    let [q, k, v] = qkv(5, 1, 2, 1, 100, 200, 256, 96);
    for opts in [
        AttentionOptions::default(),
        AttentionOptions {
            causal: Some(Causal::BottomRight),
            window: Some((100, 0)),
            ..Default::default()
        },
        AttentionOptions {
            causal: Some(Causal::TopLeft),
            scale: Some(0.3),
            ..Default::default()
        },
    ] {
        let got = attention_with(q.view(), k.view(), v.view(), &opts, &Config::default()).unwrap();
        check(q.view(), k.view(), v.view(), &opts, &got, "best isa");
    }
}

/// A short prompt against a long cache under bottom-right causality masks few of
/// its scores, so its units are 64 queries wide though the problem is banded
/// (docs/fused-forward.md): the band's edge then cuts the units' last tile.
#[test]
fn wide_units_across_a_band() {
    let [q, k, v] = qkv(7, 1, 2, 2, 90, 1000, 64, 40);
    let opts = AttentionOptions {
        causal: Some(Causal::BottomRight),
        ..Default::default()
    };
    check_every_isa([&q, &k, &v], &opts, "bottom-right, 90 × 1000");
}

#[test]
fn default_dispatch_is_fused_and_queries_axis_falls_back() {
    let [q, k, v] = qkv(6, 1, 2, 2, 20, 30, 8, 8);
    let opts = AttentionOptions::default();
    let auto = attention_with_lse(q.view(), k.view(), v.view(), &opts).unwrap();
    let fast = attention_with(
        q.view(),
        k.view(),
        v.view(),
        &opts,
        &fused(Isa::detect(), 1),
    )
    .unwrap();
    assert_eq!(auto, fast);
    let opts = AttentionOptions {
        softmax_axis: SoftmaxAxis::Queries,
        ..Default::default()
    };
    let p = Problem::new(q.view(), k.view(), v.view(), &opts).unwrap();
    let want = reference::run(&p).output;
    assert_eq!(
        attention(q.view(), k.view(), v.view(), &opts).unwrap(),
        want
    );
    let err = attention_with(
        q.view(),
        k.view(),
        v.view(),
        &opts,
        &Config {
            kernel: Kernel::Fused,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("fused"), "{err}");
}

/// Prints how the fused kernel's error compares with the naive f32 yardstick's over
/// many random problems (`cargo test --release -- --ignored --nocapture survey`).
#[test]
#[ignore]
fn error_ratio_survey() {
    use attend::attention::Problem;
    for e in [16, 64, 128, 256] {
        let mut ratios = vec![];
        for seed in 0..40 {
            let [q, k, v] = qkv(100 + seed, 1, 2, 2, 8, 40, e, 64);
            let opts = AttentionOptions {
                scale: Some(
                    std::env::var("SURVEY_SCALE")
                        .map(|s| s.parse().unwrap())
                        .unwrap_or(0.7),
                ),
                ..Default::default()
            };
            let p = Problem::new(q.view(), k.view(), v.view(), &opts).unwrap();
            let want = reference::run(&p).output;
            let naive = kernel_support::naive_f32(&p).0;
            let got = attention_with(q.view(), k.view(), v.view(), &opts, &Config::default())
                .unwrap()
                .0;
            let err = |a: &Array4<f32>| {
                a.iter()
                    .zip(want.iter())
                    .map(|(x, y)| (x - y).abs())
                    .fold(0.0f32, f32::max)
            };
            ratios.push(err(&got) / err(&naive));
        }
        ratios.sort_by(f32::total_cmp);
        println!(
            "E={e}: ratio median {:.2} p90 {:.2} max {:.2}",
            ratios[20], ratios[36], ratios[39]
        );
    }
}
