//! The split-KV decode kernel against the f64 reference, under docs/design.md's error
//! rule, on every instruction set this CPU has.

mod kernel_support;

use attend::attention::{AttentionOptions, Causal};
use attend::decode::{decode_attention, DecodeConfig, Isa};
use kernel_support::{check, Rng};
use ndarray::{Array2, Array4};

struct Case {
    b: usize,
    h: usize,
    hkv: usize,
    l: usize,
    s: usize,
    e: usize,
    ev: usize,
}

const CASES: &[Case] = &[
    Case {
        b: 1,
        h: 4,
        hkv: 4,
        l: 1,
        s: 1,
        e: 16,
        ev: 16,
    },
    Case {
        b: 1,
        h: 4,
        hkv: 4,
        l: 1,
        s: 37,
        e: 64,
        ev: 64,
    },
    Case {
        b: 2,
        h: 8,
        hkv: 2,
        l: 1,
        s: 300,
        e: 128,
        ev: 128,
    },
    Case {
        b: 1,
        h: 6,
        hkv: 3,
        l: 3,
        s: 1100,
        e: 40,
        ev: 24,
    },
    Case {
        b: 1,
        h: 2,
        hkv: 1,
        l: 16,
        s: 777,
        e: 7,
        ev: 130,
    },
    Case {
        b: 2,
        h: 3,
        hkv: 1,
        l: 5,
        s: 2100,
        e: 128,
        ev: 5,
    },
    Case {
        b: 1,
        h: 1,
        hkv: 1,
        l: 2,
        s: 1,
        e: 1,
        ev: 1,
    },
];

fn inputs(c: &Case, seed: u64) -> (Array4<f32>, Array4<f32>, Array4<f32>) {
    let mut rng = Rng::new(seed);
    let mut q = rng.array((c.b, c.h, c.l, c.e));
    q.mapv_inplace(|x| x * 1.5);
    (
        q,
        rng.array((c.b, c.hkv, c.s, c.e)),
        rng.array((c.b, c.hkv, c.s, c.ev)),
    )
}

fn each_isa(mut f: impl FnMut(DecodeConfig, &str)) {
    for isa in Isa::available() {
        f(
            DecodeConfig {
                isa: Some(isa),
                threads: Some(2),
            },
            isa.name(),
        );
    }
}

#[test]
fn plain_causal_and_windowed_match_the_reference() {
    type Window = Option<(usize, usize)>;
    let windows: [(Option<Causal>, Window); 5] = [
        (None, None),
        (Some(Causal::BottomRight), None),
        (Some(Causal::TopLeft), None),
        (Some(Causal::BottomRight), Some((100, 0))),
        (None, Some((3, 2))),
    ];
    for (n, c) in CASES.iter().enumerate() {
        let (q, k, v) = inputs(c, n as u64);
        for (causal, window) in windows {
            let opts = AttentionOptions {
                causal,
                window,
                ..Default::default()
            };
            each_isa(|cfg, isa| {
                let got = decode_attention(q.view(), k.view(), v.view(), &opts, &cfg).unwrap();
                let what = format!("case {n} {isa} causal {causal:?} window {window:?}");
                check(q.view(), k.view(), v.view(), &opts, &got, &what);
            });
        }
    }
}

#[test]
fn masks_bias_padding_and_scale_match_the_reference() {
    for (n, c) in CASES.iter().enumerate() {
        let (q, k, v) = inputs(c, 100 + n as u64);
        let mut rng = Rng::new(7 + n as u64);
        // Mask over [B, Hq, L, S] that drops about a third of the keys, and for the
        // first query every key (a fully masked row).
        let mut mask = ndarray::Array4::from_shape_fn((c.b, c.h, c.l, c.s), |_| rng.below(3) != 0);
        mask.slice_mut(ndarray::s![0, 0, 0, ..]).fill(false);
        let mask = mask.into_dyn();
        let bias = rng.array((c.l, c.s)).into_dyn();
        let padding = Array2::from_shape_fn((c.b, c.s), |(_, j)| j % 5 == 4);
        let opts = AttentionOptions {
            scale: Some(0.3),
            causal: Some(Causal::BottomRight),
            mask: Some(mask.view()),
            bias: Some(bias.view()),
            key_padding: Some(padding.view()),
            ..Default::default()
        };
        each_isa(|cfg, isa| {
            let got = decode_attention(q.view(), k.view(), v.view(), &opts, &cfg).unwrap();
            check(
                q.view(),
                k.view(),
                v.view(),
                &opts,
                &got,
                &format!("case {n} {isa} masks"),
            );
        });
    }
}

#[test]
fn strided_views_need_no_copy_and_give_the_same_bits() {
    let c = &CASES[3];
    let (q, k, v) = inputs(c, 5);
    // [B, S, H, D] buffers seen as [B, H, S, D].
    let kt = k
        .view()
        .permuted_axes([0, 2, 1, 3])
        .as_standard_layout()
        .into_owned();
    let vt = v
        .view()
        .permuted_axes([0, 2, 1, 3])
        .as_standard_layout()
        .into_owned();
    let (kp, vp) = (
        kt.view().permuted_axes([0, 2, 1, 3]),
        vt.view().permuted_axes([0, 2, 1, 3]),
    );
    // And a key width stride that is not 1 (copied inside the kernel).
    let kf = k.view().reversed_axes().as_standard_layout().into_owned();
    let kr = kf.view().reversed_axes();
    let opts = AttentionOptions::default();
    each_isa(|cfg, isa| {
        let want = decode_attention(q.view(), k.view(), v.view(), &opts, &cfg).unwrap();
        let got = decode_attention(q.view(), kp, vp, &opts, &cfg).unwrap();
        assert_eq!(want, got, "{isa}: [B, S, H, D] strides");
        let got = decode_attention(q.view(), kr, v.view(), &opts, &cfg).unwrap();
        assert_eq!(want, got, "{isa}: column-major k");
    });
}

#[test]
fn same_bits_whatever_the_thread_count() {
    let c = &CASES[5];
    let (q, k, v) = inputs(c, 9);
    let opts = AttentionOptions {
        causal: Some(Causal::BottomRight),
        ..Default::default()
    };
    for isa in Isa::available() {
        let run = |threads| {
            let cfg = DecodeConfig {
                isa: Some(isa),
                threads: Some(threads),
            };
            decode_attention(q.view(), k.view(), v.view(), &opts, &cfg).unwrap()
        };
        let one = run(1);
        for threads in [2, 3, 5] {
            assert_eq!(one, run(threads), "{isa:?} with {threads} threads");
        }
    }
}

#[test]
fn no_keys_and_fully_masked_rows_give_zeros_and_minus_infinity() {
    let q = Array4::<f32>::ones((1, 2, 3, 8));
    let k = Array4::<f32>::ones((1, 2, 0, 8));
    let v = Array4::<f32>::ones((1, 2, 0, 4));
    let (out, lse) = decode_attention(
        q.view(),
        k.view(),
        v.view(),
        &Default::default(),
        &Default::default(),
    )
    .unwrap();
    assert!(out.iter().all(|&x| x == 0.0));
    assert!(lse.iter().all(|&x| x == f32::NEG_INFINITY));
    // Top-left causal with more queries than keys: nothing is hidden here, but a
    // window that ends before the first key leaves nothing visible.
    let k = Array4::<f32>::ones((1, 2, 4, 8));
    let v = Array4::<f32>::ones((1, 2, 4, 4));
    let opts = AttentionOptions {
        causal: Some(Causal::BottomRight),
        ..Default::default()
    };
    let (out, lse) =
        decode_attention(q.view(), k.view(), v.view(), &opts, &Default::default()).unwrap();
    assert!(out.iter().all(|x| x.is_finite()));
    assert!(lse.iter().all(|x| x.is_finite()));
}

#[test]
fn bad_config_and_softmax_over_queries_are_errors() {
    let q = Array4::<f32>::ones((1, 2, 1, 8));
    let k = Array4::<f32>::ones((1, 2, 4, 8));
    let cfg = DecodeConfig {
        threads: Some(0),
        ..Default::default()
    };
    let err =
        decode_attention(q.view(), k.view(), k.view(), &Default::default(), &cfg).unwrap_err();
    assert_eq!(err.to_string(), "threads must be between 1 and 1024, got 0");
    let opts = AttentionOptions {
        softmax_axis: attend::attention::SoftmaxAxis::Queries,
        ..Default::default()
    };
    let err =
        decode_attention(q.view(), k.view(), k.view(), &opts, &Default::default()).unwrap_err();
    assert!(err.to_string().starts_with("softmax_axis:"), "{err}");
    let k3 = Array4::<f32>::ones((1, 3, 4, 8));
    let err = decode_attention(
        q.view(),
        k3.view(),
        k3.view(),
        &Default::default(),
        &Default::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("multiple"), "{err}");
}

#[test]
fn nan_inputs_give_nan_outputs_not_silence() {
    let c = &CASES[2];
    let (q, mut k, v) = inputs(c, 11);
    k[[0, 0, 123, 5]] = f32::NAN;
    each_isa(|cfg, isa| {
        let (out, lse) =
            decode_attention(q.view(), k.view(), v.view(), &Default::default(), &cfg).unwrap();
        // Query heads 0..4 share K/V head 0.
        for h in 0..4 {
            assert!(out[[0, h, 0, 0]].is_nan(), "{isa}: head {h} output");
            assert!(lse[[0, h, 0]].is_nan(), "{isa}: head {h} lse");
        }
        assert!(
            out.slice(ndarray::s![0, 4.., .., ..])
                .iter()
                .all(|x| x.is_finite()),
            "{isa}"
        );
    });
}
