//! Attention over key shards, merged by log-sum-exp, equals attention over all
//! the keys; bad shard lists are clear errors.

mod kernel_support;

use attend::attention::{AttentionOptions, Causal};
use attend::decode::{attention_partial, attention_partial_at, merge_partials, Partial};
use kernel_support::{check, Rng};
use ndarray::{s, Array3, Array4};

/// Cut points splitting `len` keys into `n` non-empty-ish random shards.
fn cuts(rng: &mut Rng, len: usize, n: usize) -> Vec<usize> {
    let mut c: Vec<usize> = (1..n).map(|_| rng.below(len + 1)).collect();
    c.push(0);
    c.push(len);
    c.sort_unstable();
    c
}

#[test]
fn two_to_eight_shards_equal_full_attention() {
    let mut rng = Rng::new(42);
    for (n_shards, (b, h, hkv, l, len, e)) in (2..=8).zip([
        (1, 4, 4, 1, 50, 16),
        (2, 8, 2, 1, 1000, 64),
        (1, 6, 3, 4, 333, 24),
        (1, 2, 1, 16, 129, 128),
        (2, 4, 2, 2, 700, 8),
        (1, 1, 1, 1, 17, 3),
        (1, 8, 1, 3, 2048, 32),
    ]) {
        let q = rng.array((b, h, l, e));
        let k = rng.array((b, hkv, len, e));
        let v = rng.array((b, hkv, len, e + 3));
        let c = cuts(&mut rng, len, n_shards);
        for causal in [None, Some(Causal::BottomRight), Some(Causal::TopLeft)] {
            let opts = AttentionOptions {
                causal,
                ..Default::default()
            };
            let parts: Vec<Partial> = c
                .windows(2)
                .map(|w| {
                    let (k, v) = (
                        k.slice(s![.., .., w[0]..w[1], ..]),
                        v.slice(s![.., .., w[0]..w[1], ..]),
                    );
                    if causal.is_none() {
                        attention_partial(q.view(), k, v, &opts).unwrap()
                    } else {
                        attention_partial_at(q.view(), k, v, &opts, w[0], len).unwrap()
                    }
                })
                .collect();
            let merged = merge_partials(&parts).unwrap();
            let what = format!("{n_shards} shards at {c:?}, causal {causal:?}");
            check(
                q.view(),
                k.view(),
                v.view(),
                &opts,
                &(merged.output.clone(), merged.lse.clone()),
                &what,
            );
            // A fixed order gives the same bits.
            assert_eq!(merged, merge_partials(&parts).unwrap(), "{what}");
        }
    }
}

#[test]
fn a_shard_with_nothing_visible_weighs_nothing() {
    let mut rng = Rng::new(3);
    let q = rng.array((1, 2, 1, 8));
    let k = rng.array((1, 2, 20, 8));
    let v = rng.array((1, 2, 20, 8));
    // A window of 4 keys at the end: the first shard sees nothing.
    let opts = AttentionOptions {
        causal: Some(Causal::BottomRight),
        window: Some((3, 0)),
        ..Default::default()
    };
    let a = attention_partial_at(
        q.view(),
        k.slice(s![.., .., ..10, ..]),
        v.slice(s![.., .., ..10, ..]),
        &opts,
        0,
        20,
    )
    .unwrap();
    assert!(a.lse.iter().all(|&x| x == f32::NEG_INFINITY));
    assert!(a.output.iter().all(|&x| x == 0.0));
    let b = attention_partial_at(
        q.view(),
        k.slice(s![.., .., 10.., ..]),
        v.slice(s![.., .., 10.., ..]),
        &opts,
        10,
        20,
    )
    .unwrap();
    let merged = merge_partials(&[a.clone(), b]).unwrap();
    check(
        q.view(),
        k.view(),
        v.view(),
        &opts,
        &(merged.output, merged.lse),
        "window",
    );
    // Only empty shards: zeros and −∞.
    let m = merge_partials(&[a.clone(), a]).unwrap();
    assert!(m.lse.iter().all(|&x| x == f32::NEG_INFINITY));
    assert!(m.output.iter().all(|&x| x == 0.0));
}

#[test]
fn bad_shard_lists_are_clear_errors() {
    let err = merge_partials(&[]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "merge_partials: the list of partial results is empty"
    );
    let part = |h: usize, ev: usize| Partial {
        output: Array4::zeros((1, h, 1, ev)),
        lse: Array3::zeros((1, h, 1)),
    };
    let err = merge_partials(&[part(2, 4), part(3, 4)]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "merge_partials: part 1 has output shape [1, 3, 1, 4] but part 0 has [1, 2, 1, 4]"
    );
    let err = merge_partials(&[part(2, 4), part(2, 5)]).unwrap_err();
    assert!(
        err.to_string()
            .contains("part 1 has output shape [1, 2, 1, 5]"),
        "{err}"
    );
    let mut bad = part(2, 4);
    bad.lse = Array3::zeros((1, 2, 2));
    let err = merge_partials(&[part(2, 4), bad]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "merge_partials: part 1 has lse shape [1, 2, 2] but its output [1, 2, 1, 4] needs [1, 2, 1]"
    );
    assert!(!err.to_string().contains('\n'));
    let q = Array4::<f32>::zeros((1, 2, 1, 4));
    let k = Array4::<f32>::zeros((1, 2, 5, 4));
    let err =
        attention_partial_at(q.view(), k.view(), k.view(), &Default::default(), 8, 10).unwrap_err();
    assert_eq!(
        err.to_string(),
        "shard of 5 keys at start 8 does not fit in a sequence of total 10 keys (k [1, 2, 5, 4])"
    );
}
