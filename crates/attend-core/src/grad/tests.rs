//! Finite-difference checks of every gradient, in f64.
//!
//! Step and tolerance: with a loss of size O(1) whose third derivative is O(1–10)
//! on these small, O(1) inputs, a central difference with step h errs by about
//! h²/6 · |L'''| (truncation) plus ε|L|/h (rounding, ε = 2.2e-16). h = 1e-5 balances
//! them near (3ε)^(1/3) and leaves an expected error of order 1e-10. We accept
//! |analytic − numeric| ≤ 1e-7 · (1 + |analytic|): three orders of magnitude above
//! the expected error, yet a wrong gradient (a missing term, a transposed block, a
//! wrong scale or mask) is off by O(|gradient|) and fails by orders of magnitude.

use ndarray::{Array, Array1, Array2, Array3, Array4, ArrayD, Dimension};

use super::attention::{self, Weights};
use super::{embedding, linear};
use crate::attention::Dropout;
use crate::attention::{AttentionOptions, Causal, SoftmaxAxis};
use crate::nn::initialisers::{self, AttentionSpec, QkvLayout, WeightInit};
use crate::nn::{Linear, MultiHeadAttention};
use crate::rng::TorchGenerator;

const H: f64 = 1e-5;
const TOL: f64 = 1e-7;

fn randn<D: Dimension>(gen: &mut TorchGenerator, shape: D) -> Array<f64, D> {
    let a = gen.normal(shape.slice(), 0.0, 1.0).mapv(f64::from);
    a.into_shape_with_order(shape).unwrap()
}

/// Compares `analytic` with central differences of `loss` over every element of `x`.
fn check<D: Dimension>(
    what: &str,
    x: &mut Array<f64, D>,
    analytic: &Array<f64, D>,
    loss: &mut dyn FnMut(&Array<f64, D>) -> f64,
) {
    assert_eq!(x.shape(), analytic.shape(), "{what}: gradient shape");
    for idx in 0..x.len() {
        let orig = x.as_slice_mut().unwrap()[idx];
        x.as_slice_mut().unwrap()[idx] = orig + H;
        let up = loss(x);
        x.as_slice_mut().unwrap()[idx] = orig - H;
        let down = loss(x);
        x.as_slice_mut().unwrap()[idx] = orig;
        let numeric = (up - down) / (2.0 * H);
        let a = analytic.as_slice().unwrap()[idx];
        assert!(
            (a - numeric).abs() <= TOL * (1.0 + a.abs()),
            "{what}[{idx}]: analytic {a}, numeric {numeric}"
        );
    }
}

fn dot<D: Dimension>(a: &Array<f64, D>, b: &Array<f64, D>) -> f64 {
    (a * b).sum()
}

#[test]
fn linear_gradients() {
    let mut gen = TorchGenerator::new(1);
    for bias in [false, true] {
        let mut w: Array2<f64> = randn(&mut gen, ndarray::Ix2(3, 4));
        let mut b: Array1<f64> = randn(&mut gen, ndarray::Ix1(3));
        let mut x: Array2<f64> = randn(&mut gen, ndarray::Ix2(5, 4));
        let dy: Array2<f64> = randn(&mut gen, ndarray::Ix2(5, 3));
        let bias_view = |b: &Array1<f64>| bias.then(|| b.clone());
        let (dx, g) = linear::backward(w.view(), bias, x.view(), dy.view());
        let (w0, b0, x0) = (w.clone(), b.clone(), x.clone());
        check("linear dx", &mut x, &dx, &mut |x| {
            dot(
                &linear::forward(
                    w0.view(),
                    bias_view(&b0).as_ref().map(|b| b.view()),
                    x.view(),
                ),
                &dy,
            )
        });
        check("linear dw", &mut w, &g.weight, &mut |w| {
            dot(
                &linear::forward(
                    w.view(),
                    bias_view(&b0).as_ref().map(|b| b.view()),
                    x0.view(),
                ),
                &dy,
            )
        });
        if bias {
            check("linear db", &mut b, g.bias.as_ref().unwrap(), &mut |b| {
                dot(&linear::forward(w0.view(), Some(b.view()), x0.view()), &dy)
            });
        }
    }
}

#[test]
fn embedding_gradient_skips_the_padding_row() {
    let mut gen = TorchGenerator::new(2);
    let mut table: Array2<f64> = randn(&mut gen, ndarray::Ix2(5, 3));
    let ids = Array2::from_shape_vec((2, 4), vec![1, 0, 3, 1, 4, 4, 0, 2]).unwrap();
    let dy: Array3<f64> = randn(&mut gen, ndarray::Ix3(2, 4, 3));
    let g = embedding::backward(5, Some(0), ids.view(), dy.view());
    assert!(g.weight.row(0).iter().all(|&x| x == 0.0), "padding row");
    // Without the padding rule the gradient is the plain derivative of the lookup.
    let g_all = embedding::backward(5, None, ids.view(), dy.view());
    check("embedding dweight", &mut table, &g_all.weight, &mut |t| {
        let mut s = 0.0;
        for ((b, i), &id) in ids.indexed_iter() {
            for c in 0..3 {
                s += t[[id, c]] * dy[[b, i, c]];
            }
        }
        s
    });
    let mut expect = g_all.weight.clone();
    expect.row_mut(0).fill(0.0);
    assert_eq!(g.weight, expect);
}

/// The module's f32 weights as owned f64 arrays, in the order q, k, v, o.
struct Owned {
    w: Vec<(Array2<f64>, Option<Array1<f64>>)>,
    heads: usize,
    kv_heads: usize,
}

impl Owned {
    fn from(m: &MultiHeadAttention) -> Owned {
        let conv = |l: &Linear| {
            (
                l.weight.mapv(f64::from),
                l.bias.as_ref().map(|b| b.mapv(f64::from)),
            )
        };
        let mut w = vec![conv(&m.q_proj), conv(&m.k_proj), conv(&m.v_proj)];
        w.extend(m.out_proj.as_ref().map(conv));
        Owned {
            w,
            heads: m.heads,
            kv_heads: m.kv_heads,
        }
    }

    fn view(&self) -> Weights<'_, f64> {
        let v = |i: usize| (self.w[i].0.view(), self.w[i].1.as_ref().map(|b| b.view()));
        Weights {
            q: v(0),
            k: v(1),
            v: v(2),
            o: (self.w.len() == 4).then(|| v(3)),
            heads: self.heads,
            kv_heads: self.kv_heads,
        }
    }
}

/// Finite differences of every parameter and of the input of a module.
fn check_module(
    what: &str,
    m: &MultiHeadAttention,
    x: &Array3<f64>,
    opts: &AttentionOptions<'_>,
    dropout: Option<Dropout>,
) {
    let mut owned = Owned::from(m);
    let (y, cache) = attention::forward(&owned.view(), x.view(), opts, dropout).unwrap();
    let mut gen = TorchGenerator::new(7);
    let dy: Array3<f64> = randn(&mut gen, y.raw_dim());
    let (dx, grads) = attention::backward(&owned.view(), &cache, dy.view()).unwrap();
    let loss_at = |o: &Owned, x: &Array3<f64>| {
        let (y, _) = attention::forward(&o.view(), x.view(), opts, dropout).unwrap();
        dot(&y, &dy)
    };
    let mut x = x.clone();
    check(&format!("{what}: dx"), &mut x, &dx, &mut |x| {
        loss_at(&owned, x)
    });
    let mut named = vec![
        ("q_proj", &grads.q_proj),
        ("k_proj", &grads.k_proj),
        ("v_proj", &grads.v_proj),
    ];
    named.extend(grads.out_proj.as_ref().map(|g| ("out_proj", g)));
    for (i, (name, g)) in named.into_iter().enumerate() {
        let mut w = owned.w[i].0.clone();
        check(
            &format!("{what}: {name}.weight"),
            &mut w,
            &g.weight,
            &mut |w| {
                let saved = std::mem::replace(&mut owned.w[i].0, w.clone());
                let l = loss_at(&owned, &x);
                owned.w[i].0 = saved;
                l
            },
        );
        assert_eq!(
            owned.w[i].1.is_some(),
            g.bias.is_some(),
            "{what}: {name} bias presence"
        );
        if let Some(mut b) = owned.w[i].1.clone() {
            check(
                &format!("{what}: {name}.bias"),
                &mut b,
                g.bias.as_ref().unwrap(),
                &mut |b| {
                    let saved = owned.w[i].1.replace(b.clone());
                    let l = loss_at(&owned, &x);
                    owned.w[i].1 = saved;
                    l
                },
            );
        }
    }
}

fn spec(init: WeightInit, layout: QkvLayout, bias: bool, out_proj: bool) -> AttentionSpec {
    AttentionSpec {
        d_in: 4,
        d_k: 4,
        d_v: 4,
        heads: 2,
        bias,
        out_proj,
        init,
        layout,
    }
}

#[test]
fn module_gradients_for_every_initialiser_and_layout() {
    let mut gen = TorchGenerator::new(3);
    let x: Array3<f64> = randn(&mut gen, ndarray::Ix3(2, 3, 4)).mapv(|v| v * 0.5);
    let layouts = [
        QkvLayout::Separate,
        QkvLayout::Fused,
        QkvLayout::FusedInterleaved,
        QkvLayout::PerHead,
    ];
    for layout in layouts {
        for (init, bias, out) in [
            (WeightInit::Linear, true, true),
            (WeightInit::Linear, false, false),
            (WeightInit::UniformInOut, false, false),
            (WeightInit::UniformOutIn, false, true),
        ] {
            let m = initialisers::initialise(&spec(init, layout, bias, out), &mut gen).unwrap();
            check_module(
                &format!("{init:?}/{layout:?}"),
                &m,
                &x,
                &AttentionOptions::default(),
                None,
            );
        }
    }
    let m = initialisers::initialise(
        &spec(WeightInit::TorchMha, QkvLayout::Fused, true, true),
        &mut gen,
    )
    .unwrap();
    check_module("torch-mha", &m, &x, &AttentionOptions::default(), None);
}

#[test]
fn module_gradients_under_masks_softmax_axes_gqa_and_dropout() {
    let mut gen = TorchGenerator::new(4);
    let x: Array3<f64> = randn(&mut gen, ndarray::Ix3(2, 5, 4)).mapv(|v| v * 0.5);
    let m = initialisers::initialise(
        &spec(WeightInit::Linear, QkvLayout::Separate, true, true),
        &mut gen,
    )
    .unwrap();
    let padding = Array2::from_shape_fn((2, 5), |(b, j)| b == 0 && j >= 3);
    let bias: ArrayD<f32> = gen.normal(&[1, 2, 5, 5], 0.0, 1.0);
    let mask = Array4::from_shape_fn((1, 1, 5, 5), |(_, _, i, j)| (i + j) % 3 != 1).into_dyn();
    let cases: Vec<(&str, AttentionOptions<'_>)> = vec![
        (
            "causal",
            AttentionOptions {
                causal: Some(Causal::TopLeft),
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
            "bias + window",
            AttentionOptions {
                bias: Some(bias.view()),
                window: Some((1, 1)),
                ..Default::default()
            },
        ),
        // Row 2 of this mask with causal keeps only key 0; rows whose keys are all
        // masked get zero gradients.
        (
            "bool mask + causal",
            AttentionOptions {
                mask: Some(mask.view()),
                causal: Some(Causal::BottomRight),
                ..Default::default()
            },
        ),
        (
            "softmax over queries",
            AttentionOptions {
                softmax_axis: SoftmaxAxis::Queries,
                ..Default::default()
            },
        ),
        (
            "scale",
            AttentionOptions {
                scale: Some(0.3),
                ..Default::default()
            },
        ),
    ];
    for (name, opts) in &cases {
        check_module(name, &m, &x, opts, None);
    }
    check_module(
        "dropout",
        &m,
        &x,
        &AttentionOptions::default(),
        Some(Dropout::new(0.3, 9).unwrap()),
    );
    // Grouped-query: 2 query heads share 1 key/value head.
    let lin = |o: usize, i: usize, gen: &mut TorchGenerator| {
        let (w, b) = crate::init::linear(gen, i, o, true);
        Linear::new(w, b).unwrap()
    };
    // out_proj takes the merged width 2 heads · 3.
    let gqa = MultiHeadAttention::new(
        lin(4, 4, &mut gen),
        lin(2, 4, &mut gen),
        lin(3, 4, &mut gen),
        Some(lin(4, 6, &mut gen)),
        2,
        1,
    )
    .unwrap();
    check_module("gqa", &gqa, &x, &cases[0].1, None);
}

#[test]
fn fully_masked_rows_give_zero_gradients_not_nan() {
    let mut gen = TorchGenerator::new(5);
    let x: Array3<f64> = randn(&mut gen, ndarray::Ix3(1, 3, 4));
    let m = initialisers::initialise(
        &spec(WeightInit::Linear, QkvLayout::Separate, false, false),
        &mut gen,
    )
    .unwrap();
    let mask = Array4::from_shape_fn((1, 1, 3, 3), |(_, _, i, _)| i != 1).into_dyn();
    let opts = AttentionOptions {
        mask: Some(mask.view()),
        ..Default::default()
    };
    let owned = Owned::from(&m);
    let (y, cache) = attention::forward(&owned.view(), x.view(), &opts, None).unwrap();
    assert!(y.slice(ndarray::s![0, 1, ..]).iter().all(|&v| v == 0.0));
    let dy = Array3::<f64>::ones(y.raw_dim());
    let (dx, g) = attention::backward(&owned.view(), &cache, dy.view()).unwrap();
    assert!(dx
        .iter()
        .chain(g.q_proj.weight.iter())
        .all(|v| v.is_finite()));
    check_module("fully masked row", &m, &x, &opts, None);
}

#[test]
fn f32_module_gradients_agree_with_f64() {
    let mut gen = TorchGenerator::new(6);
    let m = initialisers::initialise(
        &spec(WeightInit::Linear, QkvLayout::Separate, true, true),
        &mut gen,
    )
    .unwrap();
    let x32: Array3<f32> = gen
        .normal(&[2, 3, 4], 0.0, 1.0)
        .into_dimensionality()
        .unwrap();
    let opts = AttentionOptions {
        causal: Some(Causal::TopLeft),
        ..Default::default()
    };
    let (y, cache) = m.forward_train(x32.view(), &opts).unwrap();
    let dy = Array3::<f32>::from_shape_fn(y.raw_dim(), |(b, t, c)| {
        (b + 2 * t) as f32 * 0.1 - c as f32 * 0.2
    });
    let (dx, g) = m.backward(&cache, dy.view()).unwrap();
    let owned = Owned::from(&m);
    let (_, c64) =
        attention::forward(&owned.view(), x32.mapv(f64::from).view(), &opts, None).unwrap();
    let (dx64, g64) = attention::backward(&owned.view(), &c64, dy.mapv(f64::from).view()).unwrap();
    let close = |a: &ndarray::ArrayViewD<'_, f32>, b: &ndarray::ArrayViewD<'_, f64>| {
        a.iter()
            .zip(b.iter())
            .all(|(&a, &b)| (a as f64 - b).abs() <= 1e-5 * (1.0 + b.abs()))
    };
    assert!(close(&dx.view().into_dyn(), &dx64.view().into_dyn()));
    assert!(close(
        &g.out_proj.unwrap().weight.view().into_dyn(),
        &g64.out_proj.unwrap().weight.view().into_dyn()
    ));
    assert!(close(
        &g.k_proj.weight.view().into_dyn(),
        &g64.k_proj.weight.view().into_dyn()
    ));
}
