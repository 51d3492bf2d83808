//! Every case of the PyTorch golden file (`tests/data/seeds.json`, recorded with real
//! PyTorch 2.15 on CPU in float32; its `generated_by` names the versions) reproduced
//! through `attend explain --format json`:
//! weights and inputs bit-exact, everything derived from them within
//! 1e-5 absolute + 1e-5 relative (float32 op-order rounding).
//!
//! The file is kept byte for byte as it was recorded: its `generated_by.script`
//! (`tools/gen_golden.py`) names the recorder's tool, which is not part of this
//! repository. Nothing here needs it: each case holds its exact argument list and
//! the values to compare.

use std::process::Command;

use serde_json::Value;

const GOLDEN: &str = include_str!("data/seeds.json");

/// Arrays drawn straight from the generator (or given), which must match bit for bit.
const EXACT: &[&str] = &["x", "w_q", "w_k", "w_v", "b_q", "b_k", "b_v", "w_o", "b_o"];

fn explain_json(args: &[String]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_attend"))
        .arg("explain")
        .args(args)
        .args(["--format", "json"])
        .output()
        .expect("runs attend");
    assert!(
        out.status.success(),
        "attend explain {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("explain prints JSON")
}

/// Flattens nested arrays, keeping nulls (masked scores) as None.
fn flatten(v: &Value, shape: &mut Vec<usize>, depth: usize, out: &mut Vec<Option<f64>>) {
    match v {
        Value::Array(items) => {
            if shape.len() == depth {
                shape.push(items.len());
            }
            for item in items {
                flatten(item, shape, depth + 1, out);
            }
        }
        Value::Null => out.push(None),
        other => out.push(Some(other.as_f64().expect("number"))),
    }
}

#[test]
fn every_golden_case_matches_pytorch() {
    let golden: Value = serde_json::from_str(GOLDEN).unwrap();
    let cases = golden["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 10, "the golden file has ten cases");
    let mut checked = 0;
    for case in cases {
        let id = case["id"].as_str().unwrap();
        let args: Vec<String> = case["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect();
        let ours = explain_json(&args);
        for (name, expect) in case["expect"].as_object().unwrap() {
            let want_shape: Vec<usize> = serde_json::from_value(expect["shape"].clone()).unwrap();
            let want: Vec<Option<f64>> = expect["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(Value::as_f64)
                .collect();
            let value = ours
                .get(name)
                .unwrap_or_else(|| panic!("{id}: no '{name}' in output"));
            let (mut shape, mut got) = (Vec::new(), Vec::new());
            flatten(value, &mut shape, 0, &mut got);
            assert_eq!(shape, want_shape, "{id}: shape of {name}");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                match (g, w) {
                    (None, None) => {}
                    (Some(g), Some(w)) if EXACT.contains(&name.as_str()) => {
                        assert_eq!(*g as f32, *w as f32, "{id}: {name}[{i}] must be bit-exact");
                    }
                    (Some(g), Some(w)) => assert!(
                        (g - w).abs() <= 1e-5 + 1e-5 * w.abs(),
                        "{id}: {name}[{i}] = {g}, PyTorch {w}"
                    ),
                    _ => {
                        panic!("{id}: {name}[{i}] masked in one and not the other: {g:?} vs {w:?}")
                    }
                }
                checked += 1;
            }
        }
    }
    assert!(checked > 3000, "checked {checked} values");
}
