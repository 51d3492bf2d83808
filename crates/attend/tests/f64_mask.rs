//! A float64 additive mask of float64 tensors (`AttentionOptions::bias_f64`): the
//! f64 reference, which float64 tensors run on (`grad::Scalar for f64`), adds it in
//! f64, forward and backward. Given only its rounding to f32 (`bias`), each score
//! moves by up to half an f32 ulp of its mask term, 6·10⁻⁸ of it: far beyond f64's
//! own rounding, which is what the results are held to here.

use attend::attention::AttentionOptions;
use attend::grad::Scalar;
use attend::rng::TorchGenerator;
use ndarray::{Array2, Array4, ArrayD, Ix4};

fn randn(gen: &mut TorchGenerator, shape: [usize; 4]) -> Array4<f64> {
    gen.normal(&shape, 0.0, 1.0)
        .into_dimensionality::<Ix4>()
        .unwrap()
        .mapv(f64::from)
}

/// The textbook attention of one head in f64 with the mask `m` `[L, S]` added to
/// the scaled scores: the output `[L, Ev]` and the scores' gradient `dS` `[L, S]`
/// for the output gradient `dout`.
fn textbook(
    q: &Array2<f64>,
    k: &Array2<f64>,
    v: &Array2<f64>,
    m: &Array2<f64>,
    dout: &Array2<f64>,
) -> (Array2<f64>, Array2<f64>) {
    let scale = 1.0 / (q.ncols() as f64).sqrt();
    let s = q.dot(&k.t()) * scale + m;
    let mut p = s.clone();
    for mut row in p.rows_mut() {
        let max = row.fold(f64::NEG_INFINITY, |a, &b| a.max(b));
        row.mapv_inplace(|x| (x - max).exp());
        let sum = row.sum();
        row.mapv_inplace(|x| x / sum);
    }
    let out = p.dot(v);
    let dp = dout.dot(&v.t());
    let mut ds = &p * &dp;
    for (mut row, prow) in ds.rows_mut().into_iter().zip(p.rows()) {
        let d = row.sum();
        row.zip_mut_with(&prow, |x, &pr| *x -= pr * d);
    }
    (out, ds)
}

fn max_err(a: &ArrayD<f64>, b: &ArrayD<f64>) -> f64 {
    a.iter().zip(b).fold(0.0, |m, (x, y)| m.max((x - y).abs()))
}

#[test]
fn a_float64_mask_is_added_in_float64() {
    let (l, s, e, ev) = (5, 9, 16, 8);
    let mut gen = TorchGenerator::new(47);
    let q = randn(&mut gen, [1, 1, l, e]);
    let k = randn(&mut gen, [1, 1, s, e]);
    let v = randn(&mut gen, [1, 1, s, ev]);
    let dout = randn(&mut gen, [1, 1, l, ev]);
    // Mask terms of a few units that f32 does not hold (a third of an odd number).
    let mask = randn(&mut gen, [1, 1, l, s]).mapv(|x| (3.0 * x).round() / 3.0 + 1.0 / 3.0);
    let mask = mask.into_shape_with_order((l, s)).unwrap();
    let rounded = mask.mapv(|x| x as f32);
    let two = |a: &Array4<f64>| a.slice(ndarray::s![0, 0, .., ..]).to_owned();
    let (want_out, want_ds) = textbook(&two(&q), &two(&k), &two(&v), &mask, &two(&dout));
    // f64's rounding: a few ulps of each sum's terms (E products in a score, S
    // weights in an output or a row of dS), of sizes up to 10 (scores, values).
    let tol = |size: f64| 4.0 * (e + s) as f64 * f64::EPSILON * size.max(1.0) * 10.0;
    let run = |bias_f64: Option<&Array2<f64>>| {
        let opts = AttentionOptions {
            bias: Some(rounded.view().into_dyn()),
            bias_f64: bias_f64.map(|m| m.view().into_dyn()),
            ..Default::default()
        };
        let (out, lse, residual) =
            <f64 as Scalar>::attention_forward(q.view(), k.view(), v.view(), &opts, None).unwrap();
        let saved = attend::attention::Saved::new(out.view(), lse.view())
            .with_lse_residual(residual.view());
        let (_, _, _, dmask) = <f64 as Scalar>::attention_backward(
            q.view(),
            k.view(),
            v.view(),
            saved,
            dout.view(),
            &opts,
            None,
            true,
        )
        .unwrap();
        let out = out.into_shape_with_order((l, ev)).unwrap().into_dyn();
        (out, dmask.expect("asked for"))
    };
    let (want_out, want_ds) = (want_out.into_dyn(), want_ds.into_dyn());
    let (out, ds) = run(Some(&mask));
    let (out_tol, ds_tol) = (tol(max_abs(&want_out)), tol(max_abs(&want_ds)));
    assert!(
        max_err(&out, &want_out) <= out_tol,
        "output error {}",
        max_err(&out, &want_out)
    );
    assert!(
        max_err(&ds, &want_ds) <= ds_tol,
        "mask gradient error {}",
        max_err(&ds, &want_ds)
    );
    // The same call with the mask's f32 rounding alone misses by far more.
    let (out, ds) = run(None);
    assert!(max_err(&out, &want_out) > 100.0 * out_tol);
    assert!(max_err(&ds, &want_ds) > 100.0 * ds_tol);
}

fn max_abs(a: &ArrayD<f64>) -> f64 {
    a.iter().fold(0.0, |m, x| m.max(x.abs()))
}

#[test]
fn a_float64_mask_needs_its_float32_rounding_of_the_same_shape() {
    let q = Array4::<f64>::zeros((1, 1, 2, 4));
    let exact = Array2::<f64>::zeros((2, 2));
    let other = Array2::<f32>::zeros((1, 2));
    for bias in [None, Some(other.view().into_dyn())] {
        let opts = AttentionOptions {
            bias,
            bias_f64: Some(exact.view().into_dyn()),
            ..Default::default()
        };
        let err = <f64 as Scalar>::attention_forward(q.view(), q.view(), q.view(), &opts, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("bias_f64 of shape [2, 2] needs bias"), "{err}");
    }
}
