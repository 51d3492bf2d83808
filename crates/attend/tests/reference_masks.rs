//! Mask semantics of the attention API, checked on small cases against formulas
//! written out in the test (not against another kernel).

use attend::attention::{attention_with_lse, AttentionOptions, Causal, SoftmaxAxis};
use ndarray::{Array, Array2, Array4, ArrayD, IxDyn};

/// Deterministic, varied inputs without a random generator.
fn filled(shape: (usize, usize, usize, usize), salt: f32) -> Array4<f32> {
    Array::from_shape_fn(shape, |(b, h, i, e)| {
        ((b * 7 + h * 5 + i * 3 + e) as f32 * 0.37 + salt).sin()
    })
}

/// Which keys each query may see, read off the output weights: a key is visible
/// iff its weight is positive (all scores here are finite, so visible weights are > 0).
fn visible(opts: &AttentionOptions<'_>, l: usize, s: usize) -> Vec<Vec<bool>> {
    let q = filled((1, 1, l, 4), 0.1);
    let k = filled((1, 1, s, 4), 0.2);
    // One-hot values: output column j is exactly the weight of key j.
    let v = Array::from_shape_fn((1, 1, s, s), |(_, _, j, c)| (j == c) as u8 as f32);
    let (out, lse) = attention_with_lse(q.view(), k.view(), v.view(), opts).unwrap();
    (0..l)
        .map(|i| {
            let row: Vec<bool> = (0..s).map(|j| out[[0, 0, i, j]] > 0.0).collect();
            if !row.iter().any(|&x| x) {
                assert_eq!(
                    lse[[0, 0, i]],
                    f32::NEG_INFINITY,
                    "fully masked row {i} has lse -inf"
                );
            }
            row
        })
        .collect()
}

fn pattern(l: usize, s: usize, keep: impl Fn(usize, usize) -> bool) -> Vec<Vec<bool>> {
    (0..l)
        .map(|i| (0..s).map(|j| keep(i, j)).collect())
        .collect()
}

#[test]
fn causal_alignments_with_queries_and_keys_of_different_lengths() {
    // (L, S): top-left sees j <= i; bottom-right sees j <= i + S - L, so with more
    // queries than keys the first L - S rows see nothing.
    for (l, s) in [(3, 5), (5, 3), (4, 4)] {
        let top = AttentionOptions {
            causal: Some(Causal::TopLeft),
            ..Default::default()
        };
        assert_eq!(
            visible(&top, l, s),
            pattern(l, s, |i, j| j <= i),
            "top-left {l}x{s}"
        );
        let bottom = AttentionOptions {
            causal: Some(Causal::BottomRight),
            ..Default::default()
        };
        assert_eq!(
            visible(&bottom, l, s),
            pattern(l, s, |i, j| j + l <= i + s),
            "bottom-right {l}x{s}"
        );
    }
}

#[test]
fn sliding_window_around_the_diagonal() {
    let (l, s) = (6, 6);
    let window = AttentionOptions {
        window: Some((2, 1)),
        ..Default::default()
    };
    assert_eq!(
        visible(&window, l, s),
        pattern(l, s, |i, j| j + 2 >= i && j <= i + 1)
    );
    let causal_window = AttentionOptions {
        window: Some((1, 3)),
        causal: Some(Causal::TopLeft),
        ..Default::default()
    };
    assert_eq!(
        visible(&causal_window, l, s),
        pattern(l, s, |i, j| j + 1 >= i && j <= i)
    );
}

#[test]
fn fully_masked_rows_give_zero_output_and_minus_infinite_lse() {
    let (l, s) = (3, 4);
    let mut keep = Array2::from_elem((l, s), true);
    keep.row_mut(1).fill(false);
    let mask = keep.into_dyn();
    let opts = AttentionOptions {
        mask: Some(mask.view()),
        ..Default::default()
    };
    let q = filled((2, 2, l, 4), 0.3);
    let k = filled((2, 2, s, 4), 0.4);
    let v = filled((2, 2, s, 5), 0.5);
    let (out, lse) = attention_with_lse(q.view(), k.view(), v.view(), &opts).unwrap();
    for b in 0..2 {
        for h in 0..2 {
            assert!(out
                .slice(ndarray::s![b, h, 1, ..])
                .iter()
                .all(|&x| x == 0.0));
            assert_eq!(lse[[b, h, 1]], f32::NEG_INFINITY);
            assert!(out
                .slice(ndarray::s![b, h, 0, ..])
                .iter()
                .all(|x| x.is_finite()));
        }
    }
}

#[test]
fn key_padding_masks_keys_of_its_batch_row_only() {
    let padding =
        Array2::from_shape_vec((2, 3), vec![false, false, true, true, true, true]).unwrap();
    let opts = AttentionOptions {
        key_padding: Some(padding.view()),
        ..Default::default()
    };
    let q = filled((2, 1, 2, 4), 0.3);
    let k = filled((2, 1, 3, 4), 0.4);
    let v = Array::from_shape_fn((2, 1, 3, 3), |(_, _, j, c)| (j == c) as u8 as f32);
    let (out, _) = attention_with_lse(q.view(), k.view(), v.view(), &opts).unwrap();
    for i in 0..2 {
        assert!(out[[0, 0, i, 0]] > 0.0 && out[[0, 0, i, 1]] > 0.0 && out[[0, 0, i, 2]] == 0.0);
        assert!(out
            .slice(ndarray::s![1, 0, i, ..])
            .iter()
            .all(|&x| x == 0.0));
    }
}

#[test]
fn boolean_and_additive_masks_combine() {
    // One query, three keys with q·k = [0, 0, 0] (q = 0): scores are all 0, so the
    // weights come from the masks alone. Key 1 is masked out, key 0 gets +ln 3:
    // weights ∝ [3, 0, 1] = [0.75, 0, 0.25].
    let q = Array4::<f32>::zeros((1, 1, 1, 2));
    let k = filled((1, 1, 3, 2), 0.1);
    let v = Array::from_shape_fn((1, 1, 3, 3), |(_, _, j, c)| (j == c) as u8 as f32);
    let keep = ArrayD::from_shape_vec(IxDyn(&[3]), vec![true, false, true]).unwrap();
    let bias = ArrayD::from_shape_vec(IxDyn(&[1, 3]), vec![3f32.ln(), 5.0, 0.0]).unwrap();
    let opts = AttentionOptions {
        mask: Some(keep.view()),
        bias: Some(bias.view()),
        ..Default::default()
    };
    let (out, lse) = attention_with_lse(q.view(), k.view(), v.view(), &opts).unwrap();
    let w: Vec<f32> = out.iter().copied().collect();
    assert!(
        (w[0] - 0.75).abs() < 1e-7 && w[1] == 0.0 && (w[2] - 0.25).abs() < 1e-7,
        "{w:?}"
    );
    assert!((lse[[0, 0, 0]] - 4f32.ln()).abs() < 1e-6);
}

#[test]
fn softmax_over_queries_normalises_columns() {
    let q = filled((1, 1, 4, 3), 0.2);
    let k = filled((1, 1, 5, 3), 0.7);
    let v = Array::from_shape_fn((1, 1, 5, 5), |(_, _, j, c)| (j == c) as u8 as f32);
    let opts = AttentionOptions {
        softmax_axis: SoftmaxAxis::Queries,
        ..Default::default()
    };
    let (out, _) = attention_with_lse(q.view(), k.view(), v.view(), &opts).unwrap();
    for j in 0..5 {
        let col: f32 = (0..4).map(|i| out[[0, 0, i, j]]).sum();
        assert!((col - 1.0).abs() < 1e-6, "column {j} sums to {col}");
    }
}

#[test]
fn grouped_query_heads_share_their_kv_head() {
    let q = filled((1, 4, 3, 4), 0.2);
    let k = filled((1, 2, 5, 4), 0.7);
    let v = filled((1, 2, 5, 3), 0.9);
    let opts = AttentionOptions::default();
    let (grouped, _) = attention_with_lse(q.view(), k.view(), v.view(), &opts).unwrap();
    // The same computation with every kv head copied for its two query heads.
    let repeat = |a: &Array4<f32>| {
        let heads: Vec<_> = (0..4)
            .map(|h| a.slice(ndarray::s![.., h / 2..h / 2 + 1, .., ..]))
            .collect();
        ndarray::concatenate(ndarray::Axis(1), &heads).unwrap()
    };
    let (full, _) =
        attention_with_lse(q.view(), repeat(&k).view(), repeat(&v).view(), &opts).unwrap();
    assert_eq!(grouped, full);
}

#[test]
fn shapes_that_do_not_fit_are_errors() {
    let q = filled((1, 4, 3, 4), 0.2);
    let k = filled((1, 3, 5, 4), 0.7);
    let v = filled((1, 3, 5, 4), 0.9);
    let err = attention_with_lse(q.view(), k.view(), v.view(), &Default::default()).unwrap_err();
    assert!(err.to_string().contains("multiple"), "{err}");
    let mask = ArrayD::from_elem(IxDyn(&[2, 5]), true);
    let k = filled((1, 4, 5, 4), 0.7);
    let opts = AttentionOptions {
        mask: Some(mask.view()),
        ..Default::default()
    };
    let err = attention_with_lse(q.view(), k.view(), k.view(), &opts).unwrap_err();
    assert!(
        err.to_string().contains("[2, 5]") && err.to_string().contains("[1, 4, 3, 5]"),
        "{err}"
    );
}
