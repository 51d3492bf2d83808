//! Gradients equal PyTorch's (`tests/data/grads.json`, recorded with real PyTorch 2.15
//! on CPU in float32) within 1e-5: two modules built from `attend explain`
//! arguments (loss = sum(output ∘ dout)) and two raw attention calls.

use attend::attention::{attention_backward_with, BackwardConfig, BackwardKernel, Exec, Saved};
use attend::attention::{attention_with_lse, AttentionOptions, Causal};
use attend::experiment::{self, Experiment, ExperimentSpec, Named};
use attend::nn::initialisers::WeightInit;
use ndarray::{Array2, Array3, Array4, ArrayD, IxDyn};
use serde_json::Value;

const GOLDEN: &str = include_str!("data/grads.json");
const TOL: f64 = 1e-5;

fn tensor(v: &Value) -> ArrayD<f32> {
    let shape: Vec<usize> = v["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    let data: Vec<f32> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    ArrayD::from_shape_vec(IxDyn(&shape), data).unwrap()
}

fn assert_close(case: &str, name: &str, ours: &ArrayD<f32>, expect: &ArrayD<f32>) {
    assert_eq!(ours.shape(), expect.shape(), "{case}: {name} shape");
    for (i, (&a, &b)) in ours.iter().zip(expect.iter()).enumerate() {
        assert!(
            (a as f64 - b as f64).abs() <= TOL,
            "{case}: {name}[{i}] = {a}, PyTorch {b}"
        );
    }
}

fn case<'a>(golden: &'a Value, id: &str) -> &'a Value {
    golden["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id)
        .unwrap()
}

/// The few `attend explain` flags the golden module cases use.
fn experiment_from_args(args: &[String]) -> Experiment {
    let flag = |name: &str| {
        let i = args
            .iter()
            .position(|a| a == name)
            .unwrap_or_else(|| panic!("{name}"));
        args[i + 1].as_str()
    };
    let x: Value = serde_json::from_str(flag("--input")).unwrap();
    let rows = |v: &Value| -> Vec<Vec<f32>> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|r| {
                r.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap() as f32)
                    .collect()
            })
            .collect()
    };
    let batches: Vec<Vec<Vec<f32>>> = if x[0][0].is_array() {
        x.as_array().unwrap().iter().map(rows).collect()
    } else {
        vec![rows(&x)]
    };
    let (b, t, d) = (batches.len(), batches[0].len(), batches[0][0].len());
    let x = Array3::from_shape_vec((b, t, d), batches.into_iter().flatten().flatten().collect())
        .unwrap();
    let heads = args
        .iter()
        .position(|a| a == "--heads")
        .map_or(1, |i| args[i + 1].parse().unwrap());
    ExperimentSpec {
        input: Some(x.into_dyn()),
        seed: Some(flag("--seed").parse().unwrap()),
        init: WeightInit::parse("--init", flag("--init")).unwrap(),
        d_out: Some(flag("--d-out").parse().unwrap()),
        heads,
        ..ExperimentSpec::default()
    }
    .build()
    .unwrap()
}

fn module_case(id: &str) {
    let golden: Value = serde_json::from_str(GOLDEN).unwrap();
    let c = case(&golden, id);
    let args: Vec<String> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    let ex = experiment::run(&experiment_from_args(&args)).unwrap();
    let padding: Option<Array2<bool>> = c.get("key_padding").map(|kp| {
        let rows: Vec<Vec<bool>> = kp["mask_attend"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                r.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| !x.as_bool().unwrap())
                    .collect()
            })
            .collect();
        Array2::from_shape_vec((rows.len(), rows[0].len()), rows.concat()).unwrap()
    });
    let opts = AttentionOptions {
        key_padding: padding.as_ref().map(|p| p.view()),
        ..Default::default()
    };
    let (y, cache) = ex.module.forward_train(ex.x.view(), &opts).unwrap();
    let expect = &c["expect"];
    let dout = tensor(&c["dout"])
        .into_shape_with_order(y.raw_dim())
        .unwrap();
    let squeeze =
        |a: ArrayD<f32>, like: &Value| a.into_shape_with_order(tensor(like).raw_dim()).unwrap();
    assert_close(
        id,
        "output",
        &squeeze(y.into_dyn(), &expect["output"]),
        &tensor(&expect["output"]),
    );
    let (dx, g) = ex.module.backward(&cache, dout.view()).unwrap();
    assert_close(
        id,
        "d_x",
        &squeeze(dx.into_dyn(), &expect["d_x"]),
        &tensor(&expect["d_x"]),
    );
    let mut checked = 1;
    let linears = [("q", &g.q_proj), ("k", &g.k_proj), ("v", &g.v_proj)];
    for (n, lg) in linears
        .into_iter()
        .chain(g.out_proj.as_ref().map(|o| ("o", o)))
    {
        assert_close(
            id,
            &format!("d_w_{n}"),
            &lg.weight.clone().into_dyn(),
            &tensor(&expect[format!("d_w_{n}")]),
        );
        checked += 1;
        if let Some(b) = &lg.bias {
            assert_close(
                id,
                &format!("d_b_{n}"),
                &b.clone().into_dyn(),
                &tensor(&expect[format!("d_b_{n}")]),
            );
            checked += 1;
        }
    }
    assert_eq!(
        checked,
        expect.as_object().unwrap().len() - 1,
        "{id}: every expected gradient checked"
    );
}

#[test]
fn notebook_000_module_gradients_match_pytorch() {
    module_case("notebook-000-module");
}

#[test]
fn torch_mha_with_key_padding_gradients_match_pytorch() {
    module_case("torch-mha-8x2-key-padding");
}

fn sdpa_case(id: &str, causal: Option<Causal>) {
    let golden: Value = serde_json::from_str(GOLDEN).unwrap();
    let c = case(&golden, id);
    let four = |v: &Value| -> Array4<f32> { tensor(v).into_dimensionality().unwrap() };
    let (q, k, v, dout) = (
        four(&c["inputs"]["q"]),
        four(&c["inputs"]["k"]),
        four(&c["inputs"]["v"]),
        four(&c["inputs"]["dout"]),
    );
    let opts = AttentionOptions {
        causal,
        ..Default::default()
    };
    let (out, lse) = attention_with_lse(q.view(), k.view(), v.view(), &opts).unwrap();
    assert_close(
        id,
        "out",
        &out.clone().into_dyn(),
        &tensor(&c["expect"]["out"]),
    );
    for kernel in [BackwardKernel::Reference, BackwardKernel::Fused] {
        for threads in [1, 2] {
            let config = BackwardConfig {
                kernel,
                exec: Exec {
                    isa: None,
                    threads: Some(threads),
                },
                dropout: None,
                bias_grad: false,
            };
            let g = attention_backward_with(
                q.view(),
                k.view(),
                v.view(),
                Saved::new(out.view(), lse.view()),
                dout.view(),
                &opts,
                &config,
            )
            .unwrap();
            let what = format!("{id} ({kernel:?}, {threads} threads)");
            assert_close(&what, "dq", &g.dq.into_dyn(), &tensor(&c["expect"]["dq"]));
            assert_close(&what, "dk", &g.dk.into_dyn(), &tensor(&c["expect"]["dk"]));
            assert_close(&what, "dv", &g.dv.into_dyn(), &tensor(&c["expect"]["dv"]));
        }
    }
}

#[test]
fn sdpa_causal_gradients_match_pytorch() {
    sdpa_case("sdpa-causal-L5-S7", Some(Causal::TopLeft));
}

#[test]
fn sdpa_grouped_query_gradients_match_pytorch() {
    sdpa_case("sdpa-gqa-4-2", None);
}
