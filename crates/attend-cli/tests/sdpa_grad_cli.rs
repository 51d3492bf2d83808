//! `attend sdpa --dout --dq --dk --dv`: PyTorch's golden gradients from the outside
//! (`tests/data/grads.json`), and a one-line error for a `--dout` of the wrong shape.

use std::path::{Path, PathBuf};
use std::process::Command;

use attend::io::npy;
use ndarray::{ArrayD, IxDyn};
use serde_json::Value;

const GOLDEN: &str = include_str!("../../attend/tests/data/grads.json");

fn tensor(v: &Value) -> ArrayD<f32> {
    let shape: Vec<usize> = v["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    let data = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    ArrayD::from_shape_vec(IxDyn(&shape), data).unwrap()
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("attend-sdpa-grad-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn save(d: &Path, name: &str, a: &ArrayD<f32>) -> String {
    let p = d.join(name);
    npy::write_f32(&p, a.view()).unwrap();
    p.to_str().unwrap().to_owned()
}

fn attend(args: &[String]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_attend"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn sdpa_writes_pytorchs_gradients() {
    let golden: Value = serde_json::from_str(GOLDEN).unwrap();
    for (id, causal) in [
        ("sdpa-causal-L5-S7", Some("top-left")),
        ("sdpa-gqa-4-2", None),
    ] {
        let c = golden["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id)
            .unwrap();
        let d = dir(id);
        let mut args: Vec<String> = vec!["sdpa".into()];
        for name in ["q", "k", "v", "dout"] {
            args.push(format!("--{name}"));
            args.push(save(
                &d,
                &format!("{name}.npy"),
                &tensor(&c["inputs"][name]),
            ));
        }
        if let Some(c) = causal {
            args.extend(["--causal".into(), c.into()]);
        }
        for name in ["out", "dq", "dk", "dv"] {
            args.push(format!("--{name}"));
            args.push(
                d.join(format!("{name}_ours.npy"))
                    .to_str()
                    .unwrap()
                    .to_owned(),
            );
        }
        let out = attend(&args);
        assert!(
            out.status.success(),
            "{id}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for name in ["out", "dq", "dk", "dv"] {
            let ours = npy::read_f32(d.join(format!("{name}_ours.npy"))).unwrap();
            let expect = tensor(&c["expect"][name]);
            assert_eq!(ours.shape(), expect.shape(), "{id} {name}");
            for (a, b) in ours.iter().zip(expect.iter()) {
                assert!((a - b).abs() <= 1e-5, "{id} {name}: {a} vs PyTorch {b}");
            }
        }
        std::fs::remove_dir_all(&d).ok();
    }
}

#[test]
fn a_dout_of_the_wrong_shape_is_a_one_line_error() {
    let d = dir("bad");
    let a = |shape: &[usize]| ArrayD::from_elem(IxDyn(shape), 0.5f32);
    let mut args: Vec<String> = vec!["sdpa".into()];
    for (name, shape) in [
        ("q", [1, 2, 3, 4]),
        ("k", [1, 2, 5, 4]),
        ("v", [1, 2, 5, 4]),
        ("dout", [1, 2, 3, 5]),
    ] {
        args.push(format!("--{name}"));
        args.push(save(&d, &format!("{name}.npy"), &a(&shape)));
    }
    for name in ["out", "dq", "dk", "dv"] {
        args.push(format!("--{name}"));
        args.push(d.join(format!("{name}.npy")).to_str().unwrap().to_owned());
    }
    let out = attend(&args);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--dout")
            && err.contains("[1, 2, 3, 5]")
            && err.contains("[1, 2, 3, 4]")
            && err.lines().count() == 1,
        "{err}"
    );
    std::fs::remove_dir_all(&d).ok();
}
