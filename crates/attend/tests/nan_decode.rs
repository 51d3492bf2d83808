//! docs/design.md's NaN rule on the decoding paths: the KV cache's `attend` (the
//! decode kernel for up to 16 queries, the fused kernel for a longer prefill) with
//! f32 and bf16 caches, decoding under a sliding window, and key shards merged by
//! log-sum-exp. The NaNs sit in cached keys and values that bottom-right causality
//! or the window hides from some of the queries (in the same block of keys as keys
//! they see), and in a query; `nan_support::forward` says which entries they reach.

mod kernel_support;
mod nan_support;

use attend::attention::{AttentionOptions, Causal, Exec, Problem};
use attend::decode::{attention_partial_at, decode_attention, merge_partials, Partial};
use attend::element::{bf16, round_to_bf16, Element};
use attend::kernels::Isa;
use attend::kv_cache::{CacheShape, LayerCache};
use kernel_support::{check, Rng};
use nan_support::{assert_pattern, LENGTHS};
use ndarray::{s, Array4};

/// Keys in the cache (or the shards) for `l` queries.
fn keys_for(l: usize) -> usize {
    300.max(l)
}

/// q `[1, 2, L, 20]`, k `[1, 2, S, 20]`, v `[1, 2, S, 24]` with case `which`'s NaN:
/// 0 a key, 1 two values, 2 a query, each in head 0. The key and the first value
/// are at key `at`, the second value at the last key.
fn inputs(seed: u64, l: usize, s: usize, which: usize, at: usize) -> [Array4<f32>; 3] {
    let mut rng = Rng::new(seed);
    let mut q = rng.array((1, 2, l, 20));
    let mut k = rng.array((1, 2, s, 20));
    let mut v = rng.array((1, 2, s, 24));
    match which {
        0 => k[[0, 0, at, 5]] = f32::NAN,
        1 => {
            v[[0, 0, at, 2]] = f32::NAN;
            v[[0, 0, s - 1, 5]] = f32::NAN;
        }
        _ => q[[0, 0, l / 2, 3]] = f32::NAN,
    }
    [q, k, v]
}

fn exec(isa: Isa) -> Exec {
    Exec {
        isa: Some(isa),
        threads: Some(2),
    }
}

/// Checks `got` against the rule and, on its finite entries, docs/design.md's error
/// rule, for attention of `q` over `k`, `v` (the numbers the kernel computed on).
fn check_rule(
    [q, k, v]: [&Array4<f32>; 3],
    opts: &AttentionOptions<'_>,
    got: &(Array4<f32>, ndarray::Array3<f32>),
    what: &str,
) {
    let p = Problem::new(q.view(), k.view(), v.view(), opts).unwrap();
    let (want_out, want_lse) = nan_support::forward(&p);
    assert_pattern(&got.0, &want_out, &format!("{what} output"));
    assert_pattern(&got.1, &want_lse, &format!("{what} lse"));
    check(q.view(), k.view(), v.view(), opts, got, what);
}

/// The last `l` positions' attention through a cache of `T` filled in two appends
/// (a prompt, then the `l` new positions), against the rule on the cache's numbers.
fn through_cache<T: Element>([q, k, v]: [&Array4<f32>; 3], isa: Isa, what: &str) {
    let (l, s) = (q.dim().2, k.dim().2);
    let mut cache = LayerCache::<T>::new(CacheShape::new(1, 2, 20).with_value_dim(24));
    let cut = s - l;
    cache
        .append(
            k.slice(s![.., .., ..cut, ..]),
            v.slice(s![.., .., ..cut, ..]),
        )
        .unwrap();
    cache
        .append(
            k.slice(s![.., .., cut.., ..]),
            v.slice(s![.., .., cut.., ..]),
        )
        .unwrap();
    let got = cache.attend(q.view(), None, &exec(isa)).unwrap();
    // The cache's numbers: bf16 caches hold k and v rounded (NaN stays NaN).
    let stored = |a: &Array4<f32>| a.mapv(|x| T::from_f32(x).to_f32());
    let (k, v) = (stored(k), stored(v));
    let opts = AttentionOptions {
        causal: Some(Causal::BottomRight),
        ..Default::default()
    };
    check_rule([q, &k, &v], &opts, &got, what);
}

#[test]
fn the_kv_cache_obeys_the_rule_at_every_size_f32_and_bf16() {
    for l in LENGTHS {
        let s = keys_for(l);
        // Bottom-right: query i sees keys up to s − l + i, so the queries before
        // l/2 do not see key `at`.
        let at = s - l + l / 2;
        for which in 0..3 {
            let [q, k, v] = inputs((l * 3 + which) as u64, l, s, which, at);
            for isa in Isa::available() {
                let what = format!("cache L {l} S {s} case {which} {isa}");
                through_cache::<f32>([&q, &k, &v], isa, &format!("f32 {what}"));
                through_cache::<bf16>([&q, &k, &v], isa, &format!("bf16 {what}"));
            }
        }
    }
}

#[test]
fn decoding_under_a_window_obeys_the_rule_f32_and_bf16_caches() {
    let w = 40;
    for l in [1, 4, 16] {
        let s = keys_for(l);
        // The window keeps keys s − l + i − (w − 1) ..= s − l + i for query i: key
        // `at` falls out of it for the later queries.
        let at = s - l - w + 1 + l / 2;
        for which in 0..3 {
            let [q, k, v] = inputs((l * 5 + which) as u64, l, s, which, at);
            let opts = AttentionOptions {
                causal: Some(Causal::BottomRight),
                window: Some((w - 1, 0)),
                ..Default::default()
            };
            for isa in Isa::available() {
                let what = format!("window L {l} S {s} case {which} {isa}");
                let got =
                    decode_attention(q.view(), k.view(), v.view(), &opts, &exec(isa)).unwrap();
                check_rule([&q, &k, &v], &opts, &got, &format!("f32 {what}"));
                let [k16, v16] = [&k, &v].map(|a| a.mapv(bf16::from_f32));
                let got =
                    decode_attention(q.view(), k16.view(), v16.view(), &opts, &exec(isa)).unwrap();
                let [k, v] = [&k, &v].map(|a| round_to_bf16(a.view()));
                check_rule([&q, &k, &v], &opts, &got, &format!("bf16 {what}"));
            }
        }
    }
}

#[test]
fn merged_key_shards_obey_the_rule() {
    for l in [1, 4, 16] {
        let s = keys_for(l);
        let at = s - l + l / 2;
        for which in 0..3 {
            let [q, k, v] = inputs((l * 7 + which) as u64, l, s, which, at);
            let opts = AttentionOptions {
                causal: Some(Causal::BottomRight),
                ..Default::default()
            };
            // Two shards, the NaNs in the second.
            let cut = s / 2;
            let parts: Vec<Partial> = [(0, cut), (cut, s)]
                .into_iter()
                .map(|(a, b)| {
                    let (ks, vs) = (k.slice(s![.., .., a..b, ..]), v.slice(s![.., .., a..b, ..]));
                    attention_partial_at(q.view(), ks, vs, &opts, a, s).unwrap()
                })
                .collect();
            let merged = merge_partials(&parts).unwrap();
            let got = (merged.output, merged.lse);
            check_rule(
                [&q, &k, &v],
                &opts,
                &got,
                &format!("shards L {l} case {which}"),
            );
        }
    }
}
