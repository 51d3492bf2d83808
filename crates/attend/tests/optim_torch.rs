//! SGD and AdamW equal `torch.optim` for four steps (`tests/data/optim.json`, written
//! by `scripts/golden/golden_optim.py`), and reject bad hyper-parameters.

use attend::grad::LinearGrads;
use attend::nn::Linear;
use attend::optim::{AdamW, Optimizer, Sgd};
use ndarray::Array2;
use serde_json::Value;

const GOLDEN: &str = include_str!("data/optim.json");

fn matrix(v: &Value) -> Array2<f32> {
    let data: Vec<f32> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    Array2::from_shape_vec((3, 4), data).unwrap()
}

#[test]
fn optimisers_match_torch_optim() {
    let golden: Value = serde_json::from_str(GOLDEN).unwrap();
    let grads: Vec<Array2<f32>> = golden["grads"]
        .as_array()
        .unwrap()
        .iter()
        .map(matrix)
        .collect();
    for case in golden["cases"].as_array().unwrap() {
        let o = &case["options"];
        let f = |k: &str, d: f64| o.get(k).and_then(Value::as_f64).unwrap_or(d);
        let mut layer = Linear::new(matrix(&golden["param"]), None).unwrap();
        let mut sgd;
        let mut adamw;
        let opt: &mut dyn FnMut(&mut Linear, &LinearGrads) = if case["optimizer"] == "sgd" {
            sgd = Sgd::new(f("lr", 0.0))
                .unwrap()
                .momentum(f("momentum", 0.0))
                .unwrap()
                .dampening(f("dampening", 0.0))
                .unwrap()
                .weight_decay(f("weight_decay", 0.0))
                .unwrap()
                .nesterov(o.get("nesterov").and_then(Value::as_bool).unwrap_or(false));
            &mut move |p, g| sgd.step(p, g).unwrap()
        } else {
            let betas = o
                .get("betas")
                .map(|b| (b[0].as_f64().unwrap(), b[1].as_f64().unwrap()))
                .unwrap_or((0.9, 0.999));
            adamw = AdamW::new(f("lr", 0.0))
                .unwrap()
                .betas(betas.0, betas.1)
                .unwrap()
                .eps(f("eps", 1e-8))
                .unwrap()
                .weight_decay(f("weight_decay", 0.01))
                .unwrap();
            &mut move |p, g| adamw.step(p, g).unwrap()
        };
        for (step, (g, expect)) in grads
            .iter()
            .zip(case["steps"].as_array().unwrap())
            .enumerate()
        {
            opt(
                &mut layer,
                &LinearGrads {
                    weight: g.clone(),
                    bias: None,
                },
            );
            let expect = matrix(expect);
            for (&a, &b) in layer.weight.iter().zip(expect.iter()) {
                assert!(
                    (a - b).abs() <= 1e-6 * (1.0 + b.abs()),
                    "{} {o} step {step}: {a} vs torch {b}",
                    case["optimizer"]
                );
            }
        }
    }
}

#[test]
fn bad_learning_rates_and_hyper_parameters_are_errors() {
    for lr in [0.0, -1e-3, f64::NAN, f64::INFINITY] {
        let msg = Sgd::new(lr).unwrap_err().to_string();
        assert!(msg.contains("learning rate"), "{msg}");
        let msg = AdamW::new(lr).unwrap_err().to_string();
        assert!(msg.contains("learning rate"), "{msg}");
    }
    assert!(Sgd::new(0.1)
        .unwrap()
        .momentum(1.5)
        .unwrap_err()
        .to_string()
        .contains("momentum"));
    assert!(AdamW::new(0.1)
        .unwrap()
        .betas(0.9, 1.0)
        .unwrap_err()
        .to_string()
        .contains("beta2"));
}

#[test]
fn a_gradient_of_the_wrong_shape_is_an_error() {
    let mut layer = Linear::new(Array2::zeros((3, 4)), None).unwrap();
    let g = LinearGrads {
        weight: Array2::zeros((4, 3)),
        bias: None,
    };
    let msg = AdamW::new(0.1)
        .unwrap()
        .step(&mut layer, &g)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("weight") && msg.contains("[4, 3]") && msg.contains("[3, 4]"),
        "{msg}"
    );
}
