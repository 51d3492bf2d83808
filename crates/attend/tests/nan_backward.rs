//! docs/design.md's NaN rule on the backward, the same on the f64 reference and the
//! fused kernel on every instruction set, at every size: a NaN in `q`, `k`, `v`, the
//! additive mask or `dout` reaches exactly the gradients the rule names
//! (`nan_support::backward`), a row that sees no key gets a zero `dq`, a key no row
//! sees zero `dk` and `dv`, and a key a row does not see never carries a NaN into
//! that row's gradients or out of them into its own.
//!
//! The finite entries are held to the clean problem's accuracy: each kernel's error
//! against the reference on the same inputs without the NaNs (which the entries a NaN
//! does not reach do not depend on), twice over plus four f32 ulps of the largest
//! gradient; `fused_backward.rs` holds that error to docs/design.md's rule.

mod kernel_support;
mod nan_support;

use attend::attention::{
    attention_backward_with, attention_with, AttentionGrads, BackwardConfig, BackwardKernel,
    Config, Exec, Kernel, Problem, Saved,
};
use attend::kernels::Isa;
use kernel_support::Rng;
use nan_support::{assert_pattern, key_lengths, poison, MaskArrays, Masks, Poison, LENGTHS};
use ndarray::Array4;

/// Each backward kernel on each instruction set (the reference once).
fn configs() -> Vec<BackwardConfig> {
    let mut out = vec![BackwardConfig {
        kernel: BackwardKernel::Reference,
        ..Default::default()
    }];
    for isa in Isa::available() {
        out.push(BackwardConfig {
            kernel: BackwardKernel::Fused,
            exec: Exec {
                isa: Some(isa),
                threads: Some(2),
            },
            ..Default::default()
        });
    }
    out
}

/// The gradients of `config` for `q`, `k`, `v`, `dout`, given the forward the f64
/// reference saves (its output and log-sum-exp rounded to f32).
fn grads(
    [q, k, v, dout]: [&Array4<f32>; 4],
    masks: &MaskArrays,
    config: &BackwardConfig,
) -> AttentionGrads {
    let opts = masks.options();
    let reference = Config {
        kernel: Kernel::Reference,
        ..Default::default()
    };
    let forward = attention_with(q.view(), k.view(), v.view(), &opts, &reference).unwrap();
    let saved = Saved::from(&forward);
    attention_backward_with(
        q.view(),
        k.view(),
        v.view(),
        saved,
        dout.view(),
        &opts,
        config,
    )
    .unwrap()
}

/// The largest difference between `a` and `b` where both are finite.
fn max_err(a: &Array4<f32>, b: &Array4<f32>) -> f64 {
    a.iter()
        .zip(b)
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .map(|(&x, &y)| (x as f64 - y as f64).abs())
        .fold(0.0, f64::max)
}

#[test]
fn the_rule_holds_on_the_backward_at_every_size_on_every_kernel() {
    let mut n = 0;
    for l in LENGTHS {
        for s in key_lengths(l, 150) {
            for masks in Masks::ALL {
                let which_all = [
                    Poison::Query,
                    Poison::Key,
                    Poison::Values,
                    Poison::Bias,
                    Poison::Dout,
                ];
                for which in which_all {
                    if which == Poison::Bias && masks != Masks::AdditiveCausal {
                        continue;
                    }
                    n += 1;
                    let mut rng = Rng::new(n);
                    let q = rng.array((1, 2, l, 20));
                    let k = rng.array((1, 2, s, 20));
                    let v = rng.array((1, 2, s, 24));
                    let dout = rng.array((1, 2, l, 24));
                    let clean_masks = MaskArrays::new(masks, l, s);
                    let (mut qn, mut kn, mut vn, mut dn) =
                        (q.clone(), k.clone(), v.clone(), dout.clone());
                    let mut nan_masks = MaskArrays::new(masks, l, s);
                    poison(
                        which,
                        (&mut qn, &mut kn, &mut vn),
                        nan_masks.bias.as_mut(),
                        Some(&mut dn),
                    );
                    let opts = nan_masks.options();
                    let p = Problem::new(qn.view(), kn.view(), vn.view(), &opts).unwrap();
                    let want = nan_support::backward(&p, dn.view());
                    let configs = configs();
                    let reference = grads([&qn, &kn, &vn, &dn], &nan_masks, &configs[0]);
                    let reference_clean = grads([&q, &k, &v, &dout], &clean_masks, &configs[0]);
                    for config in &configs {
                        let what = format!("L {l} S {s} {masks:?} {which:?} {config:?}");
                        let got = grads([&qn, &kn, &vn, &dn], &nan_masks, config);
                        let clean = grads([&q, &k, &v, &dout], &clean_masks, config);
                        let named = [
                            ("dq", &got.dq, &reference.dq, &clean.dq, &reference_clean.dq),
                            ("dk", &got.dk, &reference.dk, &clean.dk, &reference_clean.dk),
                            ("dv", &got.dv, &reference.dv, &clean.dv, &reference_clean.dv),
                        ];
                        for ((name, g, r, c, rc), w) in named.into_iter().zip(&want) {
                            assert_pattern(g, w, &format!("{what} {name}"));
                            let scale = rc.iter().fold(0.0f64, |m, &x| m.max(x.abs() as f64));
                            let tol = 2.0 * max_err(c, rc) + 4.0 * f32::EPSILON as f64 * scale;
                            let err = max_err(g, r);
                            assert!(err <= tol, "{what} {name}: error {err:e} > {tol:e}");
                        }
                    }
                }
            }
        }
    }
}
