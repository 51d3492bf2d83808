//! Bit-exact comparison with real PyTorch 2.15 (CPU, AVX2 normal path).
//!
//! `tests/data/torch_rng.json` (schema `torch-rng-golden/1`) holds cases of calls that
//! run in order after one `torch.manual_seed`. Every output value is compared by its
//! binary32 bit pattern. `docs/torch-rng.md` §10 describes the file and what it covers.

use attend::init;
use attend::rng::TorchGenerator;
use serde_json::Value;

const GOLDEN: &str = include_str!("data/torch_rng.json");

/// One named output of a call, flattened row-major.
struct Output {
    name: &'static str,
    shape: Vec<usize>,
    values: Vec<f32>,
}

impl Output {
    fn new(name: &'static str, shape: &[usize], values: impl IntoIterator<Item = f32>) -> Self {
        Output {
            name,
            shape: shape.to_vec(),
            values: values.into_iter().collect(),
        }
    }
}

fn usize_of(v: &Value) -> usize {
    v.as_u64().expect("non-negative integer") as usize
}

fn shape_of(v: &Value) -> Vec<usize> {
    v.as_array()
        .expect("shape array")
        .iter()
        .map(usize_of)
        .collect()
}

/// Runs one call of a case on `gen` and returns its outputs in the golden file's order.
fn run_call(gen: &mut TorchGenerator, call: &Value) -> Vec<Output> {
    let op = call["op"].as_str().expect("op");
    let f64_of = |key: &str| call[key].as_f64().expect(key);
    match op {
        // nn.Parameter(torch.rand(..)) draws exactly as torch.rand.
        "rand" | "parameter_rand" => {
            let shape = shape_of(&call["shape"]);
            vec![Output::new("out", &shape, gen.rand(&shape))]
        }
        "randn" => {
            let shape = shape_of(&call["shape"]);
            vec![Output::new("out", &shape, gen.normal(&shape, 0.0, 1.0))]
        }
        "uniform_" => {
            let shape = shape_of(&call["shape"]);
            let out = gen.uniform(&shape, f64_of("from"), f64_of("to"));
            vec![Output::new("out", &shape, out)]
        }
        "normal_" => {
            let shape = shape_of(&call["shape"]);
            let out = gen.normal(&shape, f64_of("mean"), f64_of("std"));
            vec![Output::new("out", &shape, out)]
        }
        "linear" => {
            let (inp, out) = (usize_of(&call["in"]), usize_of(&call["out"]));
            let bias = call["bias"].as_bool().expect("bias");
            let (w, b) = init::linear(gen, inp, out, bias);
            let mut outputs = vec![Output::new("weight", w.shape(), w.iter().copied())];
            if let Some(b) = b {
                outputs.push(Output::new("bias", b.shape(), b.iter().copied()));
            }
            outputs
        }
        "embedding" => {
            let (num, dim) = (usize_of(&call["num"]), usize_of(&call["dim"]));
            let padding_idx = call.get("padding_idx").and_then(Value::as_i64);
            let w = init::embedding(gen, num, dim, padding_idx).expect("valid embedding");
            vec![Output::new("weight", w.shape(), w.iter().copied())]
        }
        other => panic!("unknown op {other}"),
    }
}

#[test]
fn every_golden_value_is_bit_exact() {
    let golden: Value = serde_json::from_str(GOLDEN).expect("golden JSON parses");
    assert_eq!(golden["schema"], "torch-rng-golden/1");

    let mut ops_seen = std::collections::BTreeSet::new();
    let mut checked = 0usize;
    let mut mismatches = Vec::new();
    let cases = golden["cases"].as_array().expect("cases");
    for case in cases {
        let id = case["id"].as_str().expect("id");
        // `seed` may be negative or >= 2^63; `seed_u64` is it modulo 2^64.
        let seed = case["seed_u64"].as_u64().expect("seed_u64");
        if let Some(s) = case["seed"].as_i64() {
            assert_eq!(s as u64, seed, "{id}: seed_u64 is seed mod 2^64");
        }
        let mut gen = TorchGenerator::new(seed);
        for (c, call) in case["calls"].as_array().expect("calls").iter().enumerate() {
            ops_seen.insert(call["op"].as_str().unwrap().to_string());
            let ours = run_call(&mut gen, call);
            let theirs = call["outputs"].as_array().expect("outputs");
            assert_eq!(ours.len(), theirs.len(), "{id} call {c}: number of outputs");
            for (o, t) in ours.iter().zip(theirs) {
                let tag = format!("{id} call {c} ({}) {}", call["op"], o.name);
                assert_eq!(t["name"], o.name, "{tag}: output name");
                assert_eq!(o.shape, shape_of(&t["shape"]), "{tag}: shape");
                let hex = t["hex"].as_array().expect("hex");
                assert_eq!(o.values.len(), hex.len(), "{tag}: value count");
                for (i, (v, h)) in o.values.iter().zip(hex).enumerate() {
                    let want = h.as_str().expect("hex string");
                    let got = format!("{:08x}", v.to_bits());
                    if got != want {
                        mismatches.push(format!("{tag}[{i}]: got {got} ({v:e}), want {want}"));
                    }
                    checked += 1;
                }
            }
        }
    }

    assert!(
        mismatches.is_empty(),
        "{} of {checked} values differ:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
    let all_ops = [
        "embedding",
        "linear",
        "normal_",
        "parameter_rand",
        "rand",
        "randn",
        "uniform_",
    ];
    assert_eq!(
        ops_seen.iter().map(String::as_str).collect::<Vec<_>>(),
        all_ops
    );
    assert_eq!(cases.len(), 18);
    assert_eq!(checked, 1878, "every golden value was compared");
    println!("{checked} values over {} cases bit-exact", cases.len());
}
