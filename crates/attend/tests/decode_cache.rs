//! Incremental decoding through the key/value cache equals full causal attention
//! (docs/design.md's error rule), with and without a sliding window, at the kernel and
//! at the module level; bad appends are clear errors.

mod kernel_support;

use attend::attention::{AttentionOptions, Causal, Problem};
use attend::decode::{DecodeConfig, Isa};
use attend::kv_cache::{CacheShape, KvCache, LayerCache};
use attend::nn::{merge_heads, Linear, MultiHeadAttention};
use kernel_support::{check, naive_f32, Rng};
use ndarray::{s, Array3, Array4};

/// Decodes `q`'s positions chunk by chunk (sizes from `steps`, cycled) through a
/// cache and returns the outputs and log-sum-exps of every position.
fn decode_all(
    cache: &mut LayerCache,
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
        let len = steps[n % steps.len()].min(t - at);
        let r = at..at + len;
        cache
            .append(
                k.slice(s![.., .., r.clone(), ..]),
                v.slice(s![.., .., r.clone(), ..]),
            )
            .unwrap();
        let (o, l) = cache
            .attend(q.slice(s![.., .., r.clone(), ..]), None, config)
            .unwrap();
        out.slice_mut(s![.., .., r.clone(), ..]).assign(&o);
        lse.slice_mut(s![.., .., r]).assign(&l);
        at += len;
        n += 1;
    }
    (out, lse)
}

#[test]
fn steps_of_one_token_equal_full_causal_attention() {
    let mut rng = Rng::new(1);
    let (b, h, hkv, t, e, ev) = (2, 4, 2, 256, 32, 24);
    let q = rng.array((b, h, t, e));
    let k = rng.array((b, hkv, t, e));
    let v = rng.array((b, hkv, t, ev));
    let opts = AttentionOptions {
        causal: Some(Causal::BottomRight),
        ..Default::default()
    };
    // On every instruction set, so the portable fallback is held to the same rule.
    for isa in Isa::available() {
        let config = DecodeConfig {
            isa: Some(isa),
            threads: None,
        };
        let mut cache = LayerCache::new(CacheShape::new(b, hkv, e).with_value_dim(ev));
        let got = decode_all(&mut cache, &q, &k, &v, &[1], &config);
        let what = format!("256 steps of 1 on {}", isa.name());
        check(q.view(), k.view(), v.view(), &opts, &got, &what);
        assert_eq!(cache.len(), t);
        // Capacity doubles: never more than twice what is needed.
        let cap = cache.capacity();
        assert!(cap >= t && cap <= 2 * t, "{cap}");
    }
}

#[test]
fn chunks_of_several_tokens_equal_full_causal_attention() {
    let mut rng = Rng::new(2);
    let (b, h, hkv, t, e, ev) = (1, 6, 3, 260, 40, 40);
    let q = rng.array((b, h, t, e));
    let k = rng.array((b, hkv, t, e));
    let v = rng.array((b, hkv, t, ev));
    let mut cache = LayerCache::new(CacheShape::new(b, hkv, e).with_value_dim(ev));
    // A 40-token prefill first (the fused kernel's path), then short steps (of 1-3
    // queries, the decode kernel's; of 7-16 over this f32 cache, the fused
    // kernel's) and another long one.
    let steps = [40, 7, 1, 16, 3, 1, 1, 12, 17];
    let got = decode_all(&mut cache, &q, &k, &v, &steps, &DecodeConfig::default());
    let opts = AttentionOptions {
        causal: Some(Causal::BottomRight),
        ..Default::default()
    };
    check(q.view(), k.view(), v.view(), &opts, &got, "mixed chunks");
}

#[test]
fn sliding_window_ring_equals_windowed_full_attention() {
    let mut rng = Rng::new(3);
    let (b, h, hkv, t, e, ev) = (1, 4, 1, 150, 16, 20);
    let q = rng.array((b, h, t, e));
    let k = rng.array((b, hkv, t, e));
    let v = rng.array((b, hkv, t, ev));
    for (window, steps) in [
        (1, vec![1]),
        (20, vec![1]),
        (20, vec![3, 1, 6, 2]),
        (64, vec![5]),
        // Long steps: the fused kernel while the ring is in one piece, the decode
        // kernel's merged pieces once it has wrapped.
        (20, vec![30, 1, 25]),
    ] {
        let mut cache =
            LayerCache::windowed(CacheShape::new(b, hkv, e).with_value_dim(ev), window).unwrap();
        let config = DecodeConfig {
            isa: Some(Isa::Portable),
            threads: Some(2),
        };
        let got = decode_all(&mut cache, &q, &k, &v, &steps, &config);
        let opts = AttentionOptions {
            causal: Some(Causal::BottomRight),
            window: Some((window - 1, 0)),
            ..Default::default()
        };
        let what = format!("window {window}, steps {steps:?}");
        check(q.view(), k.view(), v.view(), &opts, &got, &what);
        let most = steps.iter().max().unwrap();
        assert!(
            cache.capacity() <= window - 1 + most,
            "{what}: capacity {}",
            cache.capacity()
        );
        assert!(cache.retained() <= cache.capacity());
        assert!(cache.keys_values().is_err());
    }
    // Queries whose keys a window has already dropped are refused, not wrong.
    let mut cache =
        LayerCache::<f32>::windowed(CacheShape::new(b, hkv, e).with_value_dim(ev), 4).unwrap();
    for p in 0..10 {
        cache
            .append(
                k.slice(s![.., .., p..p + 1, ..]),
                v.slice(s![.., .., p..p + 1, ..]),
            )
            .unwrap();
    }
    let err = cache
        .attend(
            q.slice(s![.., .., 7..10, ..]),
            None,
            &DecodeConfig::default(),
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "attend: q [1, 4, 3, 16] has 3 queries, but the window of 4 keeps only the last 4 positions; attend right after appending them"
    );
}

fn linear(rng: &mut Rng, out: usize, inp: usize, bias: bool) -> Linear {
    let mut w = rng.array((out, inp));
    w.mapv_inplace(|x| x * 0.3);
    Linear::new(w, bias.then(|| rng.array(out))).unwrap()
}

#[test]
fn module_decoding_equals_the_full_causal_forward() {
    let mut rng = Rng::new(4);
    let (d, heads, kv_heads, dh, t, batch) = (32, 4, 2, 8, 64, 2);
    let mha = MultiHeadAttention::new(
        linear(&mut rng, heads * dh, d, true),
        linear(&mut rng, kv_heads * dh, d, false),
        linear(&mut rng, kv_heads * dh, d, true),
        Some(linear(&mut rng, d, heads * dh, true)),
        heads,
        kv_heads,
    )
    .unwrap();
    let x = rng.array((batch, t, d));
    let opts = AttentionOptions {
        causal: Some(Causal::BottomRight),
        ..Default::default()
    };
    let want = mha.forward(x.view(), &opts).unwrap();
    // The yardstick: the naive f32 attention on the same projections.
    let (q, k, v) = mha.project(x.view()).unwrap();
    let naive = naive_f32(&Problem::new(q.view(), k.view(), v.view(), &opts).unwrap()).0;
    let naive = mha
        .out_proj
        .as_ref()
        .unwrap()
        .forward(merge_heads(naive.view()).view())
        .unwrap();

    let mut cache = KvCache::new(1, CacheShape::new(batch, kv_heads, dh));
    let mut got = Array3::zeros((batch, t, d));
    let mut at = 0;
    for (n, len) in [1, 1, 3, 1, 5].iter().cycle().enumerate() {
        if at == t {
            break;
        }
        let len = (*len).min(t - at);
        let layer = cache.layer_mut(0).unwrap();
        let y = mha
            .forward_cached(
                x.slice(s![.., at..at + len, ..]),
                layer,
                &DecodeConfig::default(),
            )
            .unwrap();
        got.slice_mut(s![.., at..at + len, ..]).assign(&y);
        at += len;
        assert!(n < t);
    }
    let err = |a: &Array3<f32>| {
        a.iter()
            .zip(want.iter())
            .map(|(x, y)| (x - y).abs() as f64)
            // A NaN is an infinite error (`f64::max` would drop it).
            .fold(
                0.0,
                |m, d| if d.is_nan() { f64::INFINITY } else { m.max(d) },
            )
    };
    let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs() as f64));
    let floor = 16.0 * f32::EPSILON as f64 * scale;
    assert!(
        err(&got) <= 2.0 * err(&naive) + floor,
        "module decode error {:e} > 2 × naive {:e} + {floor:e}",
        err(&got),
        err(&naive)
    );
    assert_eq!(cache.layer(0).unwrap().len(), t);
}

#[test]
fn windowed_module_cache_and_clear() {
    let mut rng = Rng::new(5);
    let mha = MultiHeadAttention::new(
        linear(&mut rng, 16, 8, false),
        linear(&mut rng, 16, 8, false),
        linear(&mut rng, 16, 8, false),
        None,
        2,
        2,
    )
    .unwrap();
    let mut cache = mha.new_cache(1, Some(4)).unwrap();
    let x = rng.array((1, 10, 8));
    for i in 0..10 {
        mha.forward_cached(
            x.slice(s![.., i..i + 1, ..]),
            &mut cache,
            &DecodeConfig::default(),
        )
        .unwrap();
    }
    assert_eq!((cache.len(), cache.retained()), (10, 4));
    cache.clear();
    assert!(cache.is_empty());
    let err = mha
        .forward_cached(
            rng.array((2, 1, 8)).view(),
            &mut cache,
            &DecodeConfig::default(),
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "forward_cached: input x [2, 1, 8] has batch 2 but the cache holds 1 sequences"
    );
}

#[test]
fn bad_appends_and_queries_are_clear_errors() {
    let mut cache = LayerCache::<f32>::new(CacheShape::new(1, 2, 8).with_value_dim(4));
    let k = Array4::<f32>::zeros((1, 3, 1, 8));
    let v = Array4::<f32>::zeros((1, 2, 1, 4));
    let err = cache.append(k.view(), v.view()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "append: k [1, 3, 1, 8] does not fit the cache's [B, Hkv, T, E] = [1, 2, T, 8]"
    );
    let k = Array4::<f32>::zeros((1, 2, 1, 9));
    let err = cache.append(k.view(), v.view()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "append: k [1, 2, 1, 9] does not fit the cache's [B, Hkv, T, E] = [1, 2, T, 8]"
    );
    let k = Array4::<f32>::zeros((1, 2, 1, 8));
    let v5 = Array4::<f32>::zeros((1, 2, 1, 5));
    let err = cache.append(k.view(), v5.view()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "append: v [1, 2, 1, 5] does not fit the cache's [B, Hkv, T, Ev] = [1, 2, T, 4]"
    );
    let v2 = Array4::<f32>::zeros((1, 2, 2, 4));
    let err = cache.append(k.view(), v2.view()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "append: k [1, 2, 1, 8] and v [1, 2, 2, 4] hold different numbers of positions"
    );
    assert!(cache.is_empty(), "failed appends leave the cache unchanged");
    cache.append(k.view(), v.view()).unwrap();
    let q = Array4::<f32>::zeros((1, 2, 2, 8));
    let err = cache
        .attend(q.view(), None, &DecodeConfig::default())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "attend: q [1, 2, 2, 8] has 2 queries but the cache holds only 1 positions; append their keys first"
    );
    let q = Array4::<f32>::zeros((1, 3, 1, 8));
    let err = cache
        .attend(q.view(), None, &DecodeConfig::default())
        .unwrap_err();
    assert!(err.to_string().contains("multiple"), "{err}");
    assert!(LayerCache::<f32>::windowed(CacheShape::new(1, 1, 1), 0).is_err());
    let err = KvCache::<f32>::new(2, CacheShape::new(1, 1, 1))
        .layer(2)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "layer 2 out of range: the cache has 2 layers"
    );
}
