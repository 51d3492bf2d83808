//! The additive mask's gradient (`BackwardConfig::bias_grad`, for learned masks):
//! the fused backward's against the f64 reference's `dS`, summed over the axes the
//! mask was broadcast along, on every instruction set, with causality and a
//! boolean mask hiding some pairs (whose gradient is 0).

mod kernel_support;

use attend::attention::{
    attention_backward_with, attention_with, AttentionOptions, BackwardConfig, BackwardKernel,
    Causal, Config, Exec, Kernel, Saved,
};
use attend::kernels::Isa;
use kernel_support::Rng;
use ndarray::{Array2, ArrayD, IxDyn};

/// Each entry of `dS` is `P ∘ (dP − D)`: `dP` and `D` sums of `Ev` rounded
/// products, `P` from a score of `E` products and the saved log-sum-exp, then
/// summed over at most `B · H` broadcast copies; f32's worst-case bound of those
/// sums is `(E + Ev + B·H + 8) · ε` of the largest entry's size (8 for the
/// exponential, the log-sum-exp and the products of the formula).
#[test]
fn the_masks_gradient_is_the_references_ds_summed_over_its_broadcast_axes() {
    let (b, h, l, s, e, ev) = (2, 3, 37, 70, 16, 8);
    let mut rng = Rng::new(47);
    let q = rng.array((b, h, l, e));
    let k = rng.array((b, h, s, e));
    let v = rng.array((b, h, s, ev));
    let dout = rng.array((b, h, l, ev));
    let keep = Array2::from_shape_fn((l, s), |(i, j)| (i * 7 + j) % 11 != 0);
    for (shape, causal) in [
        (vec![l, s], None),
        (vec![b, 1, 1, s], Some(Causal::TopLeft)),
        (vec![b, h, l, s], Some(Causal::BottomRight)),
    ] {
        let bias = ArrayD::from_shape_fn(IxDyn(&shape), |_| rng.normal());
        let opts = AttentionOptions {
            bias: Some(bias.view()),
            mask: Some(keep.view().into_dyn()),
            causal,
            ..Default::default()
        };
        let reference = Config {
            kernel: Kernel::Reference,
            ..Default::default()
        };
        let forward = attention_with(q.view(), k.view(), v.view(), &opts, &reference).unwrap();
        let dbias = |kernel, isa| {
            let config = BackwardConfig {
                kernel,
                exec: Exec {
                    isa: Some(isa),
                    threads: Some(2),
                },
                bias_grad: true,
                ..Default::default()
            };
            let saved = Saved::from(&forward);
            let (q, k, v) = (q.view(), k.view(), v.view());
            let g = attention_backward_with(q, k, v, saved, dout.view(), &opts, &config).unwrap();
            g.dbias.expect("asked for")
        };
        let want = dbias(BackwardKernel::Reference, Isa::Portable);
        assert_eq!(want.shape(), &shape[..]);
        let size = want.iter().fold(0.0f32, |m, x| m.max(x.abs())) as f64;
        assert!(size > 0.0);
        let tol = (e + ev + b * h + 8) as f64 * f32::EPSILON as f64 * size;
        for isa in Isa::available() {
            let got = dbias(BackwardKernel::Fused, isa);
            assert_eq!(got.shape(), &shape[..]);
            let diff = |(&a, &w): (&f32, &f32)| match (a as f64 - w as f64).abs() {
                d if d.is_nan() => f64::INFINITY,
                d => d,
            };
            let err = got.iter().zip(&want).map(diff).fold(0.0f64, f64::max);
            assert!(
                err <= tol,
                "{} {shape:?}: error {err:e} > {tol:e}",
                isa.name()
            );
            if shape == [l, s] {
                // Hidden pairs (the boolean mask) get no gradient.
                for ((i, j), &kept) in keep.indexed_iter() {
                    assert!(kept || got[[i, j]] == 0.0, "hidden ({i}, {j})");
                }
            }
        }
    }
}

#[test]
fn no_gradient_is_made_unless_asked_for() {
    let mut rng = Rng::new(48);
    let q = rng.array((1, 2, 5, 8));
    let bias = Array2::from_shape_fn((5, 5), |(i, j)| (i + j) as f32 * 0.1);
    let opts = AttentionOptions {
        bias: Some(bias.view().into_dyn()),
        ..Default::default()
    };
    let forward = attention_with(q.view(), q.view(), q.view(), &opts, &Config::default()).unwrap();
    let g = attention_backward_with(
        q.view(),
        q.view(),
        q.view(),
        Saved::from(&forward),
        q.view(),
        &opts,
        &BackwardConfig::default(),
    )
    .unwrap();
    assert!(g.dbias.is_none());
}
