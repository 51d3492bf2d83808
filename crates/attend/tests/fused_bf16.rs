//! The bf16 fused forward against the f64 reference on the same bf16 numbers,
//! with docs/design.md's rule for bf16 (`kernel_support::check_bf16`): every mask
//! kind, grouped-query heads, odd widths and tiles, strided views, fully masked
//! rows, every instruction set of this CPU, and the same bits for 1 and 2 threads.

mod kernel_support;

use attend::attention::{
    attention_with, AttentionOptions, Causal, Config, Exec, Kernel, Precision,
};
use attend::element::{bf16, round_to_bf16};
use attend::kernels::Isa;
use kernel_support::{check_bf16, Rng};
use ndarray::{Array2, Array3, Array4, ArrayD, ArrayView4, IxDyn};

fn config(kernel: Kernel, isa: Isa, threads: usize) -> Config {
    Config {
        kernel,
        exec: Exec {
            isa: Some(isa),
            threads: Some(threads),
        },
    }
}

/// Random bf16 tensors `[b, h, l, e]`, `[b, hkv, s, e]`, `[b, hkv, s, ev]`.
fn qkv(seed: u64, shape: [usize; 7]) -> [Array4<bf16>; 3] {
    let [b, h, hkv, l, s, e, ev] = shape;
    let mut rng = Rng::new(seed);
    [(b, h, l, e), (b, hkv, s, e), (b, hkv, s, ev)].map(|dims| rng.array(dims).mapv(bf16::from_f32))
}

fn widened(a: &Array4<bf16>) -> Array4<f32> {
    a.mapv(bf16::to_f32)
}

fn same_bits(a: &Array4<bf16>, b: &Array4<bf16>) -> bool {
    a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Runs the fused bf16 kernel on every instruction set with 1 and 2 threads,
/// checks that the threads agree bit for bit, and judges the result.
fn run_and_check(
    q: ArrayView4<'_, bf16>,
    k: ArrayView4<'_, bf16>,
    v: ArrayView4<'_, bf16>,
    opts: &AttentionOptions<'_>,
    what: &str,
) {
    let [qf, kf, vf] = [q.view(), k.view(), v.view()].map(|a| a.mapv(bf16::to_f32));
    for isa in Isa::available() {
        let one = attention_with(q, k, v, opts, &config(Kernel::Fused, isa, 1)).unwrap();
        let two = attention_with(q, k, v, opts, &config(Kernel::Fused, isa, 2)).unwrap();
        assert!(same_bits(&one.0, &two.0), "{what} {isa}: 1 vs 2 threads");
        assert_eq!(
            one.1.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            two.1.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "{what} {isa}: 1 vs 2 threads (lse)"
        );
        let got = (widened(&one.0), one.1);
        check_bf16(
            qf.view(),
            kf.view(),
            vf.view(),
            opts,
            &got,
            &format!("{what} {isa}"),
        );
    }
}

/// Says plainly which bf16 product path these tests exercised on this CPU: every
/// test here runs on each instruction set `Isa::available()` lists; only
/// `avx512bf16` multiplies with `vdpbf16ps`, and only `amx` with `tdpbf16ps` (for
/// head widths of whole 32-element steps).
#[test]
fn report_which_bf16_paths_ran() {
    let isas = Isa::available();
    let names: Vec<&str> = isas.iter().map(|i| i.name()).collect();
    eprintln!("bf16 forward exercised on: {}", names.join(", "));
    if !isas.contains(&Isa::Avx512Bf16) {
        eprintln!(
            "vdpbf16ps path NOT exercised: this CPU lacks AVX512-BF16 (bf16 inputs were \
             widened for the f32 kernel instead)"
        );
    }
    if !isas.contains(&Isa::Amx) {
        eprintln!("tdpbf16ps path NOT exercised: this CPU (or its OS) gives no AMX tiles");
    }
    // A CPU that has the instructions must not skip their path.
    #[cfg(target_arch = "x86_64")]
    {
        let has = ["avx512f", "avx512vl", "avx512bw", "avx512dq", "avx512bf16"];
        let cpu = std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512dq")
            && std::arch::is_x86_feature_detected!("avx512bf16");
        assert_eq!(
            isas.contains(&Isa::Avx512Bf16),
            cpu,
            "avx512bf16 listed iff the CPU has {}",
            has.join(", ")
        );
    }
}

/// Where the instruction set has no bf16 products (and on AMX, a head width the
/// tiles do not take, here 40), the bf16 forward is the f32 fused kernel on the
/// inputs widened, its output rounded to bf16 once
/// (docs/design.md, "Precision"): the same bits and log-sum-exp, masks and strided
/// views included.
#[test]
fn without_bf16_products_the_forward_is_the_f32_kernel_on_the_widened_inputs() {
    let [q, k, v] = qkv(71, [1, 4, 2, 70, 150, 40, 24]);
    let bias = ArrayD::from_shape_fn(IxDyn(&[70, 150]), |i| (i[0] + 3 * i[1]) as f32 % 7.0 - 3.0);
    let opts = AttentionOptions {
        causal: Some(Causal::BottomRight),
        bias: Some(bias.view()),
        ..Default::default()
    };
    let [qf, kf, vf] = [&q, &k, &v].map(widened);
    // The keys again in a `[B, T, H, D]` buffer.
    let kt = k
        .view()
        .permuted_axes([0, 2, 1, 3])
        .as_standard_layout()
        .into_owned();
    for isa in Isa::available()
        .into_iter()
        .filter(|i| !i.has_bf16_products())
    {
        let cfg = config(Kernel::Fused, isa, 2);
        let (out, lse) = attention_with(q.view(), k.view(), v.view(), &opts, &cfg).unwrap();
        let (want, want_lse) =
            attention_with(qf.view(), kf.view(), vf.view(), &opts, &cfg).unwrap();
        assert!(same_bits(&out, &want.mapv(bf16::from_f32)), "{isa}");
        assert_eq!(lse, want_lse, "{isa}");
        // Read through other strides: the same numbers, the same result.
        let strided = kt.view().permuted_axes([0, 2, 1, 3]);
        let (out, _) = attention_with(q.view(), strided, v.view(), &opts, &cfg).unwrap();
        assert!(same_bits(&out, &want.mapv(bf16::from_f32)), "{isa} strided");
    }
}

#[test]
fn shapes_widths_and_grouped_heads() {
    let shapes = [
        [1, 2, 2, 1, 1, 8, 8],
        [1, 4, 2, 37, 53, 64, 64],
        [2, 4, 1, 70, 129, 33, 17],
        [1, 8, 2, 16, 300, 128, 128],
        [1, 1, 1, 200, 64, 1, 5],
        [1, 2, 2, 65, 65, 2, 3],
    ];
    for (n, shape) in shapes.into_iter().enumerate() {
        let [q, k, v] = qkv(n as u64 + 1, shape);
        run_and_check(
            q.view(),
            k.view(),
            v.view(),
            &Default::default(),
            &format!("{shape:?}"),
        );
    }
}

#[test]
fn every_mask_kind() {
    // A head width of 40 runs on vectors everywhere; 64 on AMX's tiles, where the
    // CPU has them.
    for e in [40, 64] {
        masks_on_width(e);
    }
}

fn masks_on_width(e: usize) {
    let [b, h, l, s] = [2, 4, 90, 150];
    let [q, k, v] = qkv(11, [b, h, 2, l, s, e, 24]);
    let mut rng = Rng::new(12);
    let mask = ArrayD::from_shape_fn(IxDyn(&[b, 1, l, s]), |_| rng.below(6) != 0);
    let bias = ArrayD::from_shape_fn(IxDyn(&[l, s]), |_| rng.normal() * 2.0);
    let padding = Array2::from_shape_fn((b, s), |(bb, j)| j >= s - 20 * (bb + 1));
    let cases = [
        (
            "causal top-left",
            AttentionOptions {
                causal: Some(Causal::TopLeft),
                ..Default::default()
            },
        ),
        (
            "causal bottom-right",
            AttentionOptions {
                causal: Some(Causal::BottomRight),
                ..Default::default()
            },
        ),
        (
            "window",
            AttentionOptions {
                window: Some((30, 5)),
                ..Default::default()
            },
        ),
        (
            "bool mask",
            AttentionOptions {
                mask: Some(mask.view()),
                ..Default::default()
            },
        ),
        (
            "bias",
            AttentionOptions {
                bias: Some(bias.view()),
                ..Default::default()
            },
        ),
        (
            "key padding",
            AttentionOptions {
                key_padding: Some(padding.view()),
                ..Default::default()
            },
        ),
        (
            "all at once, scale 0.3",
            AttentionOptions {
                causal: Some(Causal::BottomRight),
                window: Some((60, 0)),
                mask: Some(mask.view()),
                bias: Some(bias.view()),
                key_padding: Some(padding.view()),
                scale: Some(0.3),
                ..Default::default()
            },
        ),
    ];
    for (what, opts) in cases {
        run_and_check(
            q.view(),
            k.view(),
            v.view(),
            &opts,
            &format!("{what}, E {e}"),
        );
    }
}

/// Units of 64 queries in a banded problem: a short prompt against a long cache
/// under bottom-right causality masks few scores (docs/fused-forward.md).
#[test]
fn wide_units_across_a_band() {
    let [q, k, v] = qkv(13, [1, 2, 2, 90, 1000, 64, 40]);
    let opts = AttentionOptions {
        causal: Some(Causal::BottomRight),
        ..Default::default()
    };
    run_and_check(
        q.view(),
        k.view(),
        v.view(),
        &opts,
        "bottom-right, 90 × 1000",
    );
}

#[test]
fn fully_masked_rows_are_zero() {
    let [q, k, v] = qkv(21, [1, 2, 2, 20, 30, 16, 8]);
    let mut mask = ArrayD::from_elem(IxDyn(&[20, 30]), true);
    for j in 0..30 {
        mask[[3, j]] = false;
        mask[[17, j]] = false;
    }
    let opts = AttentionOptions {
        mask: Some(mask.view()),
        ..Default::default()
    };
    run_and_check(q.view(), k.view(), v.view(), &opts, "masked rows");
    let (out, lse) =
        attention_with(q.view(), k.view(), v.view(), &opts, &Config::default()).unwrap();
    for h in 0..2 {
        for i in [3, 17] {
            assert_eq!(lse[[0, h, i]], f32::NEG_INFINITY);
            assert!(out
                .slice(ndarray::s![0, h, i, ..])
                .iter()
                .all(|x| x.to_f32() == 0.0));
        }
    }
}

/// A `[B, T, H, D]` buffer seen as `[B, H, T, D]`.
fn perm(a: &Array4<bf16>) -> ArrayView4<'_, bf16> {
    a.view().permuted_axes([0, 2, 1, 3])
}

/// A `[B, H, D, T]` buffer seen as `[B, H, T, D]`: rows not contiguous.
fn cols(a: &Array4<bf16>) -> ArrayView4<'_, bf16> {
    a.view().permuted_axes([0, 1, 3, 2])
}

#[test]
fn strided_views() {
    // `[B, T, H, D]` buffers seen as `[B, H, T, D]`, keys and values whose rows are
    // not contiguous (the kernel copies those), and queries whose rows are not.
    let mut rng = Rng::new(31);
    let q = rng.array((1, 50, 4, 32)).mapv(bf16::from_f32);
    let k = rng.array((1, 70, 2, 32)).mapv(bf16::from_f32);
    let v = rng.array((1, 70, 2, 24)).mapv(bf16::from_f32);
    run_and_check(
        perm(&q),
        perm(&k),
        perm(&v),
        &Default::default(),
        "permuted",
    );
    let kt = rng.array((1, 2, 32, 70)).mapv(bf16::from_f32);
    let vt = rng.array((1, 2, 24, 70)).mapv(bf16::from_f32);
    run_and_check(
        perm(&q),
        cols(&kt),
        cols(&vt),
        &Default::default(),
        "column-major k, v",
    );
    // Queries whose rows are not contiguous (packed element by element).
    let qt = rng.array((1, 4, 32, 50)).mapv(bf16::from_f32);
    run_and_check(
        cols(&qt),
        perm(&k),
        perm(&v),
        &Default::default(),
        "column-major q",
    );
}

#[test]
fn huge_scores_keep_their_exponent() {
    // bf16 has f32's exponent range: scores near 1e4 must not overflow the softmax
    // (on vectors with E = 16, on AMX's tiles with 32).
    for e in [16, 32] {
        let [q, k, v] = qkv(41, [1, 2, 2, 40, 80, e, 16]);
        let q = q.mapv(|x| bf16::from_f32(x.to_f32() * 300.0));
        run_and_check(
            q.view(),
            k.view(),
            v.view(),
            &Default::default(),
            &format!("huge scores, E {e}"),
        );
    }
}

/// AMX's tiles (where the CPU has them) take head widths of whole 32-element
/// steps and sum blocks of 32 keys, value columns and queries: keys that end a
/// block anywhere (1, 31, 33, 129, 300), value widths that end a block of columns
/// anywhere (1, 17, 33, 64), units of one, two and four vectors of queries, three
/// steps (E = 96), grouped heads; and a value that is not finite, which the tiles
/// leave to the vectors (a zero weight past a tile's last key would meet it).
#[test]
fn tile_blocks_end_anywhere() {
    let shapes = [
        [1, 2, 2, 1, 1, 32, 1],
        [1, 2, 1, 15, 31, 32, 17],
        [2, 4, 2, 17, 33, 64, 33],
        [1, 4, 4, 40, 129, 96, 64],
        [1, 2, 1, 100, 300, 64, 40],
    ];
    for (n, shape) in shapes.into_iter().enumerate() {
        let [q, k, v] = qkv(n as u64 + 61, shape);
        let what = format!("{shape:?}");
        run_and_check(q.view(), k.view(), v.view(), &Default::default(), &what);
        let mut v = v;
        let last = shape[4] - 1;
        v[[0, 0, last, 0]] = bf16::INFINITY;
        run_and_check(
            q.view(),
            k.view(),
            v.view(),
            &Default::default(),
            &format!("{what}, inf"),
        );
    }
}

/// Values are multiplied in pairs of adjacent keys, so a block of queries whose band
/// of keys starts or ends on an odd key must not pair in the key beyond its edge: a
/// zero weight times a NaN value is NaN. (Inside a band, a NaN value reaches the
/// rows that give its key a zero weight, as in the f32 kernel and in PyTorch's
/// `softmax(scores) @ v`; beyond it, it must not.)
#[test]
fn a_nan_value_beyond_a_bands_odd_edge_stays_out() {
    // (what, options, key length, NaN key, rows that see it, rows whose band of
    // keys ends or starts next to it)
    let cases = [
        (
            // Queries 64..128 see keys 61.. (an odd start); 60..64 see key 60.
            "window (3, 0), odd first key",
            AttentionOptions {
                window: Some((3, 0)),
                ..Default::default()
            },
            128,
            60,
            60..64,
            64..128,
        ),
        (
            // Queries 0..64 see keys up to 64 (an odd end, 65, inside the keys);
            // key 65 is seen by queries 64.. only.
            "causal bottom-right, odd last key",
            AttentionOptions {
                causal: Some(Causal::BottomRight),
                ..Default::default()
            },
            129,
            65,
            64..128,
            0..64,
        ),
    ];
    // A head width of 16 runs on vectors; 32 would run on AMX's tiles, which take
    // no call with a value that is not finite: it must run on vectors too.
    for (what, opts, s, nan_key, seeing, beyond, e) in cases
        .into_iter()
        .flat_map(|c| [16, 32].map(|e| (c.0, c.1.clone(), c.2, c.3, c.4.clone(), c.5.clone(), e)))
    {
        let [q, k, mut v] = qkv(51, [1, 2, 2, 128, s, e, 24]);
        v.slice_mut(ndarray::s![.., .., nan_key, ..])
            .fill(bf16::NAN);
        for isa in Isa::available() {
            let config = config(Kernel::Fused, isa, 2);
            let (out, _) = attention_with(q.view(), k.view(), v.view(), &opts, &config).unwrap();
            for h in 0..2 {
                let row = |i: usize| out.slice(ndarray::s![0, h, i, ..]).to_vec();
                for i in seeing.clone() {
                    assert!(
                        row(i).iter().all(|x| x.is_nan()),
                        "{what} E {e} {isa}: row {i}"
                    );
                }
                for i in beyond.clone() {
                    assert!(
                        row(i).iter().all(|x| x.is_finite()),
                        "{what} E {e} {isa}: row {i}"
                    );
                }
            }
        }
    }
}

#[test]
fn bf16_precision_on_f32_tensors_is_the_bf16_computation() {
    let mut rng = Rng::new(51);
    let [q, k, v]: [Array4<f32>; 3] = [
        rng.array((1, 4, 40, 24)),
        rng.array((1, 2, 90, 24)),
        rng.array((1, 2, 90, 20)),
    ];
    let opts = AttentionOptions {
        causal: Some(Causal::TopLeft),
        ..Default::default()
    };
    let bf16_opts = AttentionOptions {
        precision: Precision::Bf16,
        ..opts.clone()
    };
    for kernel in [Kernel::Fused, Kernel::Reference] {
        let cfg = Config {
            kernel,
            ..Default::default()
        };
        let (out, lse): (Array4<f32>, Array3<f32>) =
            attention_with(q.view(), k.view(), v.view(), &bf16_opts, &cfg).unwrap();
        let [qb, kb, vb] = [&q, &k, &v].map(|a| a.mapv(bf16::from_f32));
        let (want, want_lse) =
            attention_with(qb.view(), kb.view(), vb.view(), &opts, &cfg).unwrap();
        assert!(
            out.iter()
                .zip(&want)
                .all(|(x, y)| x.to_bits() == y.to_f32().to_bits()),
            "{kernel:?}: Precision::Bf16 differs from bf16 tensors"
        );
        assert_eq!(lse, want_lse, "{kernel:?}");
        // And it is a bf16 result: every output is a bf16 number.
        assert_eq!(out, round_to_bf16(out.view()), "{kernel:?}");
    }
}

#[test]
fn reference_kernel_on_bf16_is_the_widened_reference_rounded() {
    let [q, k, v] = qkv(61, [1, 2, 1, 12, 20, 8, 8]);
    let cfg = Config {
        kernel: Kernel::Reference,
        ..Default::default()
    };
    let (out, _) = attention_with(q.view(), k.view(), v.view(), &Default::default(), &cfg).unwrap();
    let [qf, kf, vf] = [&q, &k, &v].map(widened);
    let (want, _) =
        attention_with(qf.view(), kf.view(), vf.view(), &Default::default(), &cfg).unwrap();
    assert_eq!(out, want.mapv(bf16::from_f32));
}

/// The bf16 kernel makes a tile's weights against the running maximum from the
/// tiles before it, raised to the largest score of the tile's first register
/// block (4 keys in units of 64 queries), and keeps them unless a score passes that
/// maximum by more than 8 (base 2; docs/bf16.md). Keys scaled by 256 (exact in
/// bf16) from the second tile on, or in the first tile after its first block, pass
/// it by hundreds, so far that weights made against it would overflow f32: those
/// tiles' weights must be made again against their own maximum. Keys scaled by 1/16
/// fall below it, so their weights are small and kept. With the first keys padded
/// out, the first block has no score to raise the maximum with.
#[test]
fn early_weights_redone_where_later_keys_score_higher() {
    let cases = [
        ((128, 300), 256.0, "keys x256 from the second tile"),
        ((128, 300), 1.0 / 16.0, "keys /16 from the second tile"),
        ((4, 128), 256.0, "keys x256 after the first block"),
    ];
    for ((from, to), factor, what) in cases {
        let [q, mut k, v] = qkv(31, [1, 2, 2, 70, 300, 64, 32]);
        k.slice_mut(ndarray::s![.., .., from..to, ..])
            .mapv_inplace(|x| bf16::from_f32(x.to_f32() * factor));
        run_and_check(q.view(), k.view(), v.view(), &Default::default(), what);
    }
    let [q, k, v] = qkv(32, [1, 2, 2, 70, 300, 64, 32]);
    let padding = Array2::from_shape_fn((1, 300), |(_, j)| j < 8);
    let opts = AttentionOptions {
        key_padding: Some(padding.view()),
        ..Default::default()
    };
    run_and_check(q.view(), k.view(), v.view(), &opts, "first 8 keys padded");
}

/// The finite bf16 numbers (every bit pattern but the infinities and NaNs) that
/// `isa`'s kernels keep exactly: all of them where the f32 kernel reads them
/// widened; the normal ones and zeros where `vdpbf16ps`, which flushes subnormals,
/// multiplies them.
fn finite_bf16(isa: Isa) -> Vec<bf16> {
    (0..=u16::MAX)
        .map(bf16::from_bits)
        .filter(|x| {
            x.is_finite() && (!isa.has_bf16_products() || x.is_normal() || x.to_f32() == 0.0)
        })
        .collect()
}

/// `a` with `fill` after each element along the last axis: `a` again as the view
/// of every second column, with strides.
fn between(a: &Array4<bf16>, fill: bf16) -> Array4<bf16> {
    let (b, h, l, e) = a.dim();
    Array4::from_shape_fn((b, h, l, 2 * e), |(b, h, i, c)| {
        if c % 2 == 0 {
            a[[b, h, i, c / 2]]
        } else {
            fill
        }
    })
}

/// Every finite bf16 number as a query, a key and a value element, in problems
/// whose results are those numbers exactly: each head has one key, so its weight
/// is 1 and a query's output is the value row, and its log-sum-exp the score, here
/// `1 · x` plus zeros (scale 1). Without bf16 products the kernels read bf16
/// tensors in place and widen each number as they load it (the fused forward in its
/// query packing and its key and value broadcasts, in rows read in place and
/// through strides); widening is a shift, exact, so a widening that drops, moves or
/// rounds a bit changes some number here, where a tolerance would hide it.
#[test]
fn every_finite_bf16_number_is_read_exactly() {
    const E: usize = 40;
    let exact = AttentionOptions {
        scale: Some(1.0),
        ..Default::default()
    };
    for isa in Isa::available() {
        let xs = finite_bf16(isa);
        let n = xs.len();
        let x = |p: usize| xs.get(p).copied().unwrap_or(bf16::ZERO);
        let one = bf16::from_f32(1.0);

        // Queries: 70 a head (a unit's edge), each `x` at one column (columns two
        // apart in the strided view, packed element by element).
        let (l, heads) = (70, n.div_ceil(70));
        let q = Array4::from_shape_fn((1, heads, l, E), |(_, h, i, c)| {
            let p = h * l + i;
            if c == p % E {
                x(p)
            } else {
                bf16::ZERO
            }
        });
        let q2 = between(&q, one);
        let k = Array4::from_elem((1, heads, 1, E), one);
        let v = Array4::from_elem((1, heads, 1, 1), one);
        for (what, q) in [
            ("rows", q.view()),
            ("strided", q2.slice(ndarray::s![.., .., .., ..;2])),
        ] {
            let cfg = config(Kernel::Fused, isa, 2);
            let (_, lse) = attention_with(q, k.view(), v.view(), &exact, &cfg).unwrap();
            for p in 0..n {
                let got = lse[[0, p / l, p % l]];
                assert!(
                    got == x(p).to_f32(),
                    "{isa} queries ({what}): {:?} gave {got}",
                    x(p)
                );
            }
        }

        // Keys: one a head, `x` at column `h % E`, against a query of ones.
        let k = Array4::from_shape_fn(
            (1, n, 1, E),
            |(_, h, _, c)| {
                if c == h % E {
                    x(h)
                } else {
                    bf16::ZERO
                }
            },
        );
        let k2 = between(&k, one);
        let q = Array4::from_elem((1, n, 1, E), one);
        let v = Array4::from_elem((1, n, 1, 1), one);
        for kernel in [Kernel::Fused, Kernel::Decode] {
            for (what, k) in [
                ("rows", k.view()),
                ("strided", k2.slice(ndarray::s![.., .., .., ..;2])),
            ] {
                let cfg = config(kernel, isa, 2);
                let (_, lse) = attention_with(q.view(), k, v.view(), &exact, &cfg).unwrap();
                for h in 0..n {
                    let got = lse[[0, h, 0]];
                    assert!(
                        got == x(h).to_f32(),
                        "{isa} {kernel:?} keys ({what}): {:?} gave {got}",
                        x(h)
                    );
                }
            }
        }

        // Values: `E` a row, one row a head; the output is the row.
        let heads = n.div_ceil(E);
        let v = Array4::from_shape_fn((1, heads, 1, E), |(_, h, _, c)| x(h * E + c));
        let v2 = between(&v, bf16::NAN);
        let q = Array4::from_elem((1, heads, 1, E), one);
        let k = Array4::from_elem((1, heads, 1, E), bf16::ZERO);
        for kernel in [Kernel::Fused, Kernel::Decode] {
            for (what, v) in [
                ("rows", v.view()),
                ("strided", v2.slice(ndarray::s![.., .., .., ..;2])),
            ] {
                let cfg = config(kernel, isa, 2);
                let (out, _) = attention_with(q.view(), k.view(), v, &exact, &cfg).unwrap();
                // Equal as numbers: bit for bit but for −0, which the weighted
                // sum (from +0) makes +0.
                let wrong = out.iter().zip(&v).find(|(a, b)| a.to_f32() != b.to_f32());
                assert!(
                    wrong.is_none(),
                    "{isa} {kernel:?} values ({what}): {wrong:?}"
                );
            }
        }
    }
}
