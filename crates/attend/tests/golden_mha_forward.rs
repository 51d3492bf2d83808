//! The forward outputs in the gradient golden file (`tests/data/grads.json`, recorded
//! with real PyTorch 2.15 on CPU in float32): they check `nn.MultiheadAttention`'s
//! initialisation order (out_proj, then xavier_uniform_ on in_proj, biases zeroed)
//! and key padding through the module, against PyTorch.

use attend::attention::AttentionOptions;
use attend::nn::initialisers::{initialise, AttentionSpec, QkvLayout, WeightInit};
use attend::rng::TorchGenerator;
use ndarray::{Array2, Array3};
use serde_json::Value;

const GOLDEN: &str = include_str!("data/grads.json");

fn case(id: &str) -> Value {
    let golden: Value = serde_json::from_str(GOLDEN).unwrap();
    golden["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id)
        .unwrap()
        .clone()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

#[test]
fn torch_mha_with_key_padding_matches_pytorch() {
    let c = case("torch-mha-8x2-key-padding");
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(
        &args[2..],
        [
            "--seed",
            "11",
            "--init",
            "torch-mha",
            "--d-out",
            "8",
            "--heads",
            "2"
        ]
    );
    let x: Vec<Vec<Vec<f32>>> = serde_json::from_str(args[1]).unwrap();
    let x = Array3::from_shape_vec((2, 5, 8), x.concat().concat()).unwrap();
    let spec = AttentionSpec {
        d_in: 8,
        d_k: 8,
        d_v: 8,
        heads: 2,
        bias: true,
        out_proj: true,
        init: WeightInit::TorchMha,
        layout: QkvLayout::Fused,
    };
    let module = initialise(&spec, &mut TorchGenerator::new(11)).unwrap();
    let attend: Vec<Vec<bool>> =
        serde_json::from_value(c["key_padding"]["mask_attend"].clone()).unwrap();
    let padding =
        Array2::from_shape_vec((2, 5), attend.concat().iter().map(|a| !a).collect()).unwrap();
    let opts = AttentionOptions {
        key_padding: Some(padding.view()),
        ..Default::default()
    };
    let out = module.forward(x.view(), &opts).unwrap();
    let want = floats(&c["expect"]["output"]["data"]);
    assert_eq!(out.len(), want.len());
    // f32 op-order rounding only: 1e-5 absolute + 1e-5 relative, as for the notebooks.
    for (i, (g, w)) in out.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 + 1e-5 * w.abs(),
            "output[{i}] = {g}, PyTorch {w}"
        );
    }
}
