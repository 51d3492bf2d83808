//! The backward on bf16 tensors: on every instruction set, the f32 fused backward
//! on the bf16 numbers widened (exact), each gradient rounded to bf16 once
//! (docs/design.md, "Precision"), read in place from bf16 tensors of any layout;
//! and against the f64 reference on the same numbers, each gradient within the f32
//! backward's own error plus the one rounding to bf16 (half an ulp: with 8
//! significant bits, at most 2⁻⁸ of its size).

mod kernel_support;

use attend::attention::{
    attention_backward_with, attention_with_lse_parts, AttentionGrads, AttentionOptions,
    BackwardConfig, BackwardKernel, Causal, Config, Exec, Kernel, Saved,
};
use attend::element::bf16;
use attend::kernels::Isa;
use kernel_support::Rng;
use ndarray::{Array2, Array4, ArrayD, ArrayView4, IxDyn};

fn exec(isa: Isa) -> Exec {
    Exec {
        isa: Some(isa),
        threads: Some(2),
    }
}

fn backward_config(kernel: BackwardKernel, isa: Isa) -> BackwardConfig {
    BackwardConfig {
        kernel,
        exec: exec(isa),
        bias_grad: true,
        ..Default::default()
    }
}

fn widened(a: ArrayView4<'_, bf16>) -> Array4<f32> {
    a.mapv(bf16::to_f32)
}

/// The inputs of one case: `q`, `k`, `v` and `dout` as bf16 tensors.
struct Case {
    q: Array4<bf16>,
    k: Array4<bf16>,
    v: Array4<bf16>,
    dout: Array4<bf16>,
}

impl Case {
    fn new(seed: u64, [b, h, hkv, l, s, e, ev]: [usize; 7]) -> Self {
        let mut rng = Rng::new(seed);
        let mut draw = |dims| rng.array(dims).mapv(bf16::from_f32);
        Case {
            q: draw((b, h, l, e)),
            k: draw((b, hkv, s, e)),
            v: draw((b, hkv, s, ev)),
            dout: draw((b, h, l, ev)),
        }
    }
}

/// Checks the bf16 backward of `case` (keys read through `k`, any view of
/// `case.k`'s numbers) on `isa` against the f32 backward of the widened numbers,
/// bit for bit, and against the f64 reference.
fn check<'a>(
    case: &'a Case,
    k: ArrayView4<'a, bf16>,
    opts: &AttentionOptions<'_>,
    isa: Isa,
    what: &str,
) {
    let (q, v, dout) = (case.q.view(), case.v.view(), case.dout.view());
    let config = Config {
        kernel: Kernel::Fused,
        exec: exec(isa),
    };
    let forward = attention_with_lse_parts(q, k, v, opts, &config).unwrap();
    let got = attention_backward_with(
        q,
        k,
        v,
        Saved::from(&forward),
        dout,
        opts,
        &backward_config(BackwardKernel::Fused, isa),
    )
    .unwrap();
    let [qf, kf, vf, doutf] = [q, k, v, dout].map(widened);
    let outf = widened(forward.0.view());
    let (lse, residual) = (forward.1.value.view(), forward.1.residual.view());
    let f32_grads = |kernel| -> AttentionGrads {
        attention_backward_with(
            qf.view(),
            kf.view(),
            vf.view(),
            Saved::new(outf.view(), lse).with_lse_residual(residual),
            doutf.view(),
            opts,
            &backward_config(kernel, isa),
        )
        .unwrap()
    };
    let want = f32_grads(BackwardKernel::Fused);
    let reference = f32_grads(BackwardKernel::Reference);
    let named = |g: &AttentionGrads<bf16>| {
        [
            ("dq", g.dq.clone()),
            ("dk", g.dk.clone()),
            ("dv", g.dv.clone()),
        ]
    };
    for ((name, g), (w, r)) in named(&got).into_iter().zip([
        (&want.dq, &reference.dq),
        (&want.dk, &reference.dk),
        (&want.dv, &reference.dv),
    ]) {
        for ((&g, &w), &r) in g.iter().zip(w).zip(r) {
            assert_eq!(
                g.to_bits(),
                bf16::from_f32(w).to_bits(),
                "{what} {isa} {name}: {g} is not the f32 gradient {w} rounded"
            );
            let bound = (w - r).abs() + w.abs() / 256.0;
            assert!(
                (g.to_f32() - r).abs() <= bound,
                "{what} {isa} {name}: {g} against the reference's {r} (bound {bound})"
            );
        }
    }
    assert_eq!(got.dbias, want.dbias, "{what} {isa}: the mask's gradient");
}

#[test]
fn bf16_gradients_are_the_f32_backwards_on_the_widened_numbers_rounded_once() {
    let shapes = [
        [1, 2, 2, 1, 1, 8, 8],
        [2, 4, 2, 70, 130, 40, 24],
        [1, 2, 1, 150, 90, 64, 64],
        [1, 1, 1, 65, 200, 16, 33],
    ];
    let mut checked = 0;
    for (n, shape) in shapes.into_iter().enumerate() {
        let [b, _, _, l, s, ..] = shape;
        let case = Case::new(n as u64 + 3, shape);
        let mut rng = Rng::new(40 + n as u64);
        let padding = Array2::from_shape_fn((b, s), |(bi, j)| (j * 7 + bi) % 5 == 3);
        let mask = ArrayD::from_shape_fn(IxDyn(&[b, 1, l, s]), |_| rng.below(6) != 0);
        let bias = ArrayD::from_shape_fn(IxDyn(&[l, s]), |_| rng.normal() * 2.0);
        let cases = [
            ("none", AttentionOptions::default()),
            (
                "causal bottom-right",
                AttentionOptions {
                    causal: Some(Causal::BottomRight),
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
                "bool mask",
                AttentionOptions {
                    mask: Some(mask.view()),
                    ..Default::default()
                },
            ),
            (
                "bias + scale",
                AttentionOptions {
                    bias: Some(bias.view()),
                    scale: Some(0.3),
                    ..Default::default()
                },
            ),
        ];
        // The keys again in a `[B, S, H, E]` buffer, read through its strides.
        let k_bshe = case
            .k
            .view()
            .permuted_axes([0, 2, 1, 3])
            .as_standard_layout()
            .into_owned();
        let strided = k_bshe.view().permuted_axes([0, 2, 1, 3]);
        for (name, opts) in &cases {
            for isa in Isa::available() {
                let what = format!("{shape:?} {name}");
                check(&case, case.k.view(), opts, isa, &what);
                check(&case, strided, opts, isa, &format!("{what} strided keys"));
                checked += 2;
            }
        }
    }
    assert_eq!(checked, 4 * 5 * 2 * Isa::available().len());
}
