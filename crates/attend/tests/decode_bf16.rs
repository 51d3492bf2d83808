//! Decoding with bf16 keys and values against the f64 reference on the same rounded
//! inputs (widened exactly), under docs/design.md's error rule:
//!
//! * bf16 attention through the decode kernel (q, k, v and the output bf16) is held
//!   to the bf16 rule: twice the error of a naive implementation with bf16 products
//!   and f32 sums, plus the rounding floor, which for a bf16 output adds one bf16 ulp
//!   of the largest output entry;
//! * f32 queries against bf16 keys and values (`decode_attention`, key shards, the
//!   bf16 `KvCache`) compute in f32 on the widened numbers, so they are held to the
//!   f32 rule on those numbers.
//!
//! Every instruction set this CPU has runs; the tests print which (the AVX512-BF16
//! path is exercised only where the CPU has it).

mod kernel_support;

use attend::attention::{attention_with, AttentionOptions, Causal, Config, Exec, Kernel};
use attend::decode::{
    attention_partial_at, decode_attention, merge_partials, DecodeConfig, Isa, Partial,
};
use attend::element::{bf16, round_to_bf16};
use attend::kv_cache::{CacheShape, LayerCache};
use kernel_support::{check, check_bf16, Rng};
use ndarray::{s, Array2, Array3, Array4};

/// `(B, Hq, Hkv, L, S, E, Ev)`: single and several queries, grouped-query heads,
/// widths with and without a tail of less than 16, chunks split many ways.
const CASES: &[(usize, usize, usize, usize, usize, usize, usize)] = &[
    (1, 4, 4, 1, 1, 16, 16),
    (1, 4, 4, 1, 37, 64, 64),
    (2, 8, 2, 1, 300, 128, 128),
    (1, 6, 3, 3, 1100, 40, 24),
    (1, 2, 1, 16, 777, 7, 130),
    (2, 3, 1, 5, 2100, 128, 5),
    (1, 1, 1, 2, 1, 1, 1),
];

/// Random q, k, v already rounded to bf16, as bf16 and widened to f32.
struct Inputs {
    q: Array4<bf16>,
    k: Array4<bf16>,
    v: Array4<bf16>,
    q32: Array4<f32>,
    k32: Array4<f32>,
    v32: Array4<f32>,
}

fn inputs(case: (usize, usize, usize, usize, usize, usize, usize), seed: u64) -> Inputs {
    let (b, h, hkv, l, s, e, ev) = case;
    let mut rng = Rng::new(seed);
    let mut q = rng.array((b, h, l, e));
    q.mapv_inplace(|x| x * 1.5);
    let (k, v) = (rng.array((b, hkv, s, e)), rng.array((b, hkv, s, ev)));
    let half = |a: &Array4<f32>| a.mapv(bf16::from_f32);
    let (q, k, v) = (half(&q), half(&k), half(&v));
    let wide = |a: &Array4<bf16>| a.mapv(bf16::to_f32);
    Inputs {
        q32: wide(&q),
        k32: wide(&k),
        v32: wide(&v),
        q,
        k,
        v,
    }
}

/// Every instruction set this CPU has, with two threads; prints which ran.
fn each_isa(mut f: impl FnMut(Isa)) {
    let isas = Isa::available();
    eprintln!(
        "instruction sets exercised: {}",
        isas.iter().map(|i| i.name()).collect::<Vec<_>>().join(", ")
    );
    for isa in isas {
        f(isa);
    }
}

/// The bf16 decode kernel's result (output widened) with the given settings.
fn decode_bf16(
    x: &Inputs,
    opts: &AttentionOptions<'_>,
    isa: Isa,
    threads: usize,
) -> (Array4<f32>, Array3<f32>) {
    let config = Config {
        kernel: Kernel::Decode,
        exec: Exec {
            isa: Some(isa),
            threads: Some(threads),
        },
    };
    let (out, lse) = attention_with(x.q.view(), x.k.view(), x.v.view(), opts, &config).unwrap();
    (out.mapv(bf16::to_f32), lse)
}

type Window = Option<(usize, usize)>;

const ALIGNMENTS: [(Option<Causal>, Window); 5] = [
    (None, None),
    (Some(Causal::BottomRight), None),
    (Some(Causal::TopLeft), None),
    (Some(Causal::BottomRight), Some((100, 0))),
    (None, Some((3, 2))),
];

#[test]
fn bf16_attention_through_the_decode_kernel_matches_the_reference() {
    each_isa(|isa| {
        for (n, &case) in CASES.iter().enumerate() {
            let x = inputs(case, n as u64);
            for (causal, window) in ALIGNMENTS {
                let opts = AttentionOptions {
                    causal,
                    window,
                    ..Default::default()
                };
                let got = decode_bf16(&x, &opts, isa, 2);
                let what = format!("case {case:?} {isa} causal {causal:?} window {window:?}");
                check_bf16(x.q32.view(), x.k32.view(), x.v32.view(), &opts, &got, &what);
            }
        }
    });
}

#[test]
fn bf16_masks_bias_padding_and_scale_match_the_reference() {
    each_isa(|isa| {
        for (n, &case) in CASES.iter().enumerate() {
            let (b, h, _, l, s, _, _) = case;
            let x = inputs(case, 100 + n as u64);
            let mut rng = Rng::new(7 + n as u64);
            // About a third of the keys dropped, and for the first query of the
            // first head every key (a fully masked row).
            let mut mask = Array4::from_shape_fn((b, h, l, s), |_| rng.below(3) != 0);
            mask.slice_mut(s![0, 0, 0, ..]).fill(false);
            let mask = mask.into_dyn();
            let bias = rng.array((l, s)).into_dyn();
            let padding = Array2::from_shape_fn((b, s), |(_, j)| j % 5 == 4);
            let opts = AttentionOptions {
                scale: Some(0.3),
                causal: Some(Causal::BottomRight),
                mask: Some(mask.view()),
                bias: Some(bias.view()),
                key_padding: Some(padding.view()),
                ..Default::default()
            };
            let got = decode_bf16(&x, &opts, isa, 2);
            let what = format!("case {case:?} {isa} masks");
            check_bf16(x.q32.view(), x.k32.view(), x.v32.view(), &opts, &got, &what);
        }
    });
}

#[test]
fn f32_queries_against_bf16_keys_compute_in_f32_on_the_widened_numbers() {
    each_isa(|isa| {
        for (n, &case) in CASES.iter().enumerate() {
            let x = inputs(case, 200 + n as u64);
            // A query that bf16 cannot hold: its f32 bits must reach the kernel.
            let mut rng = Rng::new(300 + n as u64);
            let q = rng.array(x.q.dim());
            assert_ne!(q, round_to_bf16(q.view()));
            let config = DecodeConfig {
                isa: Some(isa),
                threads: Some(2),
            };
            for (causal, window) in ALIGNMENTS {
                let opts = AttentionOptions {
                    causal,
                    window,
                    ..Default::default()
                };
                let got =
                    decode_attention(q.view(), x.k.view(), x.v.view(), &opts, &config).unwrap();
                let what =
                    format!("case {case:?} {isa} f32 q, causal {causal:?} window {window:?}");
                check(q.view(), x.k32.view(), x.v32.view(), &opts, &got, &what);
            }
        }
    });
}

#[test]
fn one_and_two_threads_give_the_same_bits() {
    // 5000 keys of 64 split into many chunks, so that two threads share the work.
    for case in [(1, 8, 2, 1, 5000, 64, 64), (2, 4, 4, 3, 3000, 40, 24)] {
        let x = inputs(case, 11);
        let opts = AttentionOptions {
            causal: Some(Causal::BottomRight),
            window: Some((2500, 0)),
            ..Default::default()
        };
        each_isa(|isa| {
            assert_eq!(
                decode_bf16(&x, &opts, isa, 1),
                decode_bf16(&x, &opts, isa, 2),
                "{case:?} {isa}: bf16 attention"
            );
            let run = |threads| {
                let config = DecodeConfig {
                    isa: Some(isa),
                    threads: Some(threads),
                };
                decode_attention(x.q32.view(), x.k.view(), x.v.view(), &opts, &config).unwrap()
            };
            assert_eq!(run(1), run(2), "{case:?} {isa}: f32 q, bf16 k and v");
        });
    }
}

#[test]
fn strided_bf16_views_give_the_same_bits() {
    let x = inputs(CASES[3], 5);
    // [B, S, H, D] buffers seen as [B, H, S, D] (read in place), and a k whose last
    // axis is not contiguous (copied inside the kernel).
    let bshd = |a: &Array4<bf16>| {
        a.view()
            .permuted_axes([0, 2, 1, 3])
            .as_standard_layout()
            .into_owned()
    };
    let (kt, vt) = (bshd(&x.k), bshd(&x.v));
    let (kp, vp) = (
        kt.view().permuted_axes([0, 2, 1, 3]),
        vt.view().permuted_axes([0, 2, 1, 3]),
    );
    let kf = x.k.view().reversed_axes().as_standard_layout().into_owned();
    let kr = kf.view().reversed_axes();
    let opts = AttentionOptions::default();
    each_isa(|isa| {
        let config = DecodeConfig {
            isa: Some(isa),
            threads: Some(2),
        };
        let run = |k, v| decode_attention(x.q32.view(), k, v, &opts, &config).unwrap();
        let want = run(x.k.view(), x.v.view());
        assert_eq!(want, run(kp, vp), "{isa}: [B, S, H, D] strides");
        assert_eq!(want, run(kr, x.v.view()), "{isa}: column-major k");
    });
}

#[test]
fn bf16_key_shards_merge_into_attention_over_all_keys() {
    let mut rng = Rng::new(42);
    for (n_shards, case) in (2..=5).zip([
        (1, 4, 4, 1, 50, 16, 16),
        (2, 8, 2, 1, 1000, 64, 64),
        (1, 6, 3, 4, 333, 24, 27),
        (1, 2, 1, 16, 700, 128, 8),
    ]) {
        let x = inputs(case, 50 + n_shards as u64);
        let len = case.4;
        let mut cuts: Vec<usize> = (1..n_shards).map(|_| rng.below(len + 1)).collect();
        cuts.extend([0, len]);
        cuts.sort_unstable();
        for causal in [None, Some(Causal::BottomRight), Some(Causal::TopLeft)] {
            let opts = AttentionOptions {
                causal,
                window: causal.map(|_| (len / 3, 0)),
                ..Default::default()
            };
            let parts: Vec<Partial> = cuts
                .windows(2)
                .map(|w| {
                    let (k, v) = (
                        x.k.slice(s![.., .., w[0]..w[1], ..]),
                        x.v.slice(s![.., .., w[0]..w[1], ..]),
                    );
                    attention_partial_at(x.q32.view(), k, v, &opts, w[0], len).unwrap()
                })
                .collect();
            let merged = merge_partials(&parts).unwrap();
            let what = format!("{n_shards} bf16 shards at {cuts:?}, causal {causal:?}");
            let got = (merged.output, merged.lse);
            check(x.q32.view(), x.k32.view(), x.v32.view(), &opts, &got, &what);
        }
    }
}

/// Appends `k`, `v` step by step (sizes from `steps`, cycled) to `cache`, attends
/// each step's queries, and returns every position's output and log-sum-exp.
fn decode_all(
    cache: &mut LayerCache<bf16>,
    q: &Array4<f32>,
    k: &Array4<f32>,
    v: &Array4<f32>,
    steps: &[usize],
    config: &DecodeConfig,
) -> (Array4<f32>, Array3<f32>) {
    let (b, h, t, _) = q.dim();
    let mut out = Array4::zeros((b, h, t, v.dim().3));
    let mut lse = Array3::zeros((b, h, t));
    let (mut at, mut n) = (0, 0);
    while at < t {
        let r = at..at + steps[n % steps.len()].min(t - at);
        let (ks, vs) = (
            k.slice(s![.., .., r.clone(), ..]),
            v.slice(s![.., .., r.clone(), ..]),
        );
        cache.append(ks, vs).unwrap();
        let (o, l) = cache
            .attend(q.slice(s![.., .., r.clone(), ..]), None, config)
            .unwrap();
        out.slice_mut(s![.., .., r.clone(), ..]).assign(&o);
        lse.slice_mut(s![.., .., r.clone()]).assign(&l);
        at = r.end;
        n += 1;
    }
    (out, lse)
}

#[test]
fn a_bf16_cache_equals_attention_over_the_rounded_keys() {
    let mut rng = Rng::new(1);
    let (b, h, hkv, t, e, ev) = (2, 4, 2, 300, 32, 24);
    let q = rng.array((b, h, t, e));
    let k = rng.array((b, hkv, t, e));
    let v = rng.array((b, hkv, t, ev));
    let (k16, v16) = (round_to_bf16(k.view()), round_to_bf16(v.view()));
    assert_ne!(
        k, k16,
        "the keys must lose bits in bf16 for this test to mean anything"
    );
    let opts = AttentionOptions {
        causal: Some(Causal::BottomRight),
        ..Default::default()
    };
    each_isa(|isa| {
        let config = DecodeConfig {
            isa: Some(isa),
            threads: Some(2),
        };
        // 300 steps of one token; then a 40-token prefill (the fused kernel on the
        // widened cache) between short steps.
        for steps in [vec![1], vec![40, 7, 1, 16, 3, 1, 17, 12]] {
            let mut cache = LayerCache::<bf16>::new(CacheShape::new(b, hkv, e).with_value_dim(ev));
            let got = decode_all(&mut cache, &q, &k, &v, &steps, &config);
            let what = format!("bf16 cache, steps {steps:?}, {isa}");
            check(q.view(), k16.view(), v16.view(), &opts, &got, &what);
            // The cache holds the appended numbers rounded to nearest even.
            let (kc, vc) = cache.keys_values().unwrap();
            assert_eq!(kc, k.mapv(bf16::from_f32), "{what}: stored keys");
            assert_eq!(vc, v.mapv(bf16::from_f32), "{what}: stored values");
        }
    });
}

#[test]
fn a_bf16_ring_window_equals_windowed_attention_over_the_rounded_keys() {
    let mut rng = Rng::new(3);
    let (b, h, hkv, t, e, ev) = (1, 4, 1, 150, 16, 20);
    let q = rng.array((b, h, t, e));
    let k = rng.array((b, hkv, t, e));
    let v = rng.array((b, hkv, t, ev));
    let (k16, v16) = (round_to_bf16(k.view()), round_to_bf16(v.view()));
    for (window, steps) in [
        (1, vec![1]),
        (20, vec![1]),
        (20, vec![3, 1, 6, 2]),
        // Long steps: the fused kernel while the ring is in one piece, the decode
        // kernel's merged pieces once it has wrapped.
        (20, vec![30, 1, 25]),
    ] {
        each_isa(|isa| {
            let config = DecodeConfig {
                isa: Some(isa),
                threads: Some(2),
            };
            let mut cache =
                LayerCache::<bf16>::windowed(CacheShape::new(b, hkv, e).with_value_dim(ev), window)
                    .unwrap();
            let got = decode_all(&mut cache, &q, &k, &v, &steps, &config);
            let opts = AttentionOptions {
                causal: Some(Causal::BottomRight),
                window: Some((window - 1, 0)),
                ..Default::default()
            };
            let what = format!("bf16 ring, window {window}, steps {steps:?}, {isa}");
            check(q.view(), k16.view(), v16.view(), &opts, &got, &what);
            assert!(cache.retained() <= cache.capacity(), "{what}");
        });
    }
}

#[test]
fn appending_bf16_or_f32_steps_stores_the_same_bits() {
    let mut rng = Rng::new(9);
    let k = rng.array((1, 2, 5, 8));
    let v = rng.array((1, 2, 5, 3));
    let mut from_f32 = LayerCache::<bf16>::new(CacheShape::new(1, 2, 8).with_value_dim(3));
    from_f32.append(k.view(), v.view()).unwrap();
    let mut from_bf16 = LayerCache::<bf16>::new(CacheShape::new(1, 2, 8).with_value_dim(3));
    let (kb, vb) = (k.mapv(bf16::from_f32), v.mapv(bf16::from_f32));
    from_bf16.append(kb.view(), vb.view()).unwrap();
    assert_eq!(
        from_f32.keys_values().unwrap(),
        from_bf16.keys_values().unwrap()
    );
    // An f32 cache takes bf16 steps exactly.
    let mut wide = LayerCache::<f32>::new(CacheShape::new(1, 2, 8).with_value_dim(3));
    wide.append(kb.view(), vb.view()).unwrap();
    assert_eq!(wide.keys_values().unwrap().0, round_to_bf16(k.view()));
    // Bad appends name the shapes, as for f32.
    let err = from_f32
        .append(kb.slice(s![.., .., .., ..4]), vb.view())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "append: k [1, 2, 5, 4] does not fit the cache's [B, Hkv, T, E] = [1, 2, T, 8]"
    );
}
