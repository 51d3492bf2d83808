//! `attend sdpa` end to end: a good run, and every kind of bad input giving a
//! one-line error with exit code 2.

use std::path::{Path, PathBuf};
use std::process::Command;

use attend::attention::{attention_with_lse, AttentionOptions, Causal};
use attend::io::npy;
use ndarray::{ArrayD, IxDyn};

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("attend-sdpa-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn arr(shape: &[usize], seed: f32) -> ArrayD<f32> {
    let mut i = 0.0f32;
    ArrayD::from_shape_simple_fn(IxDyn(shape), || {
        i += 1.0;
        (i * 0.731 + seed).sin()
    })
}

fn save(d: &Path, name: &str, a: &ArrayD<f32>) -> String {
    let p = d.join(name);
    npy::write_f32(&p, a.view()).unwrap();
    p.to_str().unwrap().to_string()
}

fn attend(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_attend"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `attend sdpa` expecting failure; checks the one-line error and exit code 2.
fn fails(args: &[&str], needle: &str) {
    let (code, err) = attend(args);
    assert_eq!(code, 2, "{args:?}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains(needle), "{err:?} lacks {needle:?}");
}

#[test]
fn sdpa_matches_the_library_with_gqa_mask_and_lse() {
    let d = dir("ok");
    let (q, k, v) = (
        arr(&[1, 4, 5, 8], 0.1),
        arr(&[1, 2, 7, 8], 0.2),
        arr(&[1, 2, 7, 3], 0.3),
    );
    let mask = ArrayD::from_shape_fn(IxDyn(&[5, 7]), |i| (i[0] + i[1]) % 3 != 0);
    let (qp, kp, vp) = (
        save(&d, "q.npy", &q),
        save(&d, "k.npy", &k),
        save(&d, "v.npy", &v),
    );
    // A boolean mask file, written through numpy's layout by hand.
    let header = "{'descr': '|b1', 'fortran_order': False, 'shape': (5, 7), }";
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend(mask.iter().map(|&b| b as u8));
    let mp = d.join("m.npy");
    std::fs::write(&mp, bytes).unwrap();
    let (op, lp) = (d.join("o.npy"), d.join("lse.npy"));
    let (code, err) = attend(&[
        "sdpa",
        "--q",
        &qp,
        "--k",
        &kp,
        "--v",
        &vp,
        "--mask",
        mp.to_str().unwrap(),
        "--causal",
        "bottom-right",
        "--window",
        "3,0",
        "--scale",
        "0.5",
        "--out",
        op.to_str().unwrap(),
        "--lse",
        lp.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let opts = AttentionOptions {
        scale: Some(0.5),
        causal: Some(Causal::BottomRight),
        window: Some((3, 0)),
        mask: Some(mask.view()),
        ..Default::default()
    };
    let q4 = q.into_dimensionality().unwrap();
    let k4 = k.into_dimensionality().unwrap();
    let v4 = v.into_dimensionality().unwrap();
    let (o, l) = attention_with_lse(q4.view(), k4.view(), v4.view(), &opts).unwrap();
    assert_eq!(npy::read_f32(&op).unwrap(), o.into_dyn());
    assert_eq!(npy::read_f32(&lp).unwrap(), l.into_dyn());
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn sdpa_bad_inputs_give_one_line_errors() {
    let d = dir("bad");
    let q = save(&d, "q.npy", &arr(&[1, 4, 5, 8], 0.1));
    let k = save(&d, "k.npy", &arr(&[1, 2, 7, 8], 0.2));
    let v = save(&d, "v.npy", &arr(&[1, 2, 7, 3], 0.3));
    let k_wide = save(&d, "kw.npy", &arr(&[1, 2, 7, 9], 0.2));
    let k3 = save(&d, "k3.npy", &arr(&[1, 3, 7, 8], 0.2));
    let rank3 = save(&d, "r3.npy", &arr(&[4, 5, 8], 0.1));
    let bad_mask = save(&d, "bm.npy", &arr(&[5, 6], 0.0));
    let f64_file = d.join("f64.npy");
    let header = "{'descr': '<f8', 'fortran_order': False, 'shape': (1, 1, 1, 1), }";
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&1.0f64.to_le_bytes());
    std::fs::write(&f64_file, bytes).unwrap();
    let f64_file = f64_file.to_str().unwrap();
    let out = d.join("o.npy");
    let out = out.to_str().unwrap();
    let base = |q: &'static str, qv: &str, k: &str, v: &str| -> Vec<String> {
        let _ = q;
        ["sdpa", "--q", qv, "--k", k, "--v", v, "--out", out]
            .iter()
            .map(|s| s.to_string())
            .collect()
    };
    let run = |extra: &[&str], qv: &str, kv: &str, vv: &str, needle: &str| {
        let mut a = base("q", qv, kv, vv);
        a.extend(extra.iter().map(|s| s.to_string()));
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        fails(&a, needle);
    };
    run(&[], &q, &k_wide, &v, "widths differ");
    run(&[], &rank3, &k, &v, "4-D");
    run(&[], &q, f64_file, &v, "dtype");
    run(&["--mask", &bad_mask], &q, &k, &v, "does not broadcast");
    run(&["--window", "-1,2"], &q, &k, &v, "--window");
    run(&["--window=3,-2"], &q, &k, &v, "--window");
    run(
        &[],
        &q,
        &k3,
        &save(&d, "v3.npy", &arr(&[1, 3, 7, 3], 0.3)),
        "multiple",
    );
    run(
        &[],
        &q,
        &d.join("missing.npy").to_string_lossy(),
        &v,
        "missing.npy",
    );
    run(&["--causal", "diagonal"], &q, &k, &v, "--causal");
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn bench_prints_one_json_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_attend"))
        .args([
            "bench",
            "--heads",
            "2",
            "--kv-heads",
            "1",
            "--seq",
            "64",
            "--head-dim",
            "16",
            "--causal",
            "--threads",
            "1",
            "--min-runs",
            "2",
            "--min-time",
            "0",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let j: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert!(j["ms"].as_f64().unwrap() > 0.0);
    assert!(j["gflops"].as_f64().unwrap() > 0.0);
    assert_eq!(j["kv_heads"], 1);
}

#[test]
fn bench_times_each_mask_kind_and_names_it() {
    for mask in ["bool", "additive"] {
        let out = Command::new(env!("CARGO_BIN_EXE_attend"))
            .args(["bench", "--heads", "2", "--seq", "80", "--head-dim", "16"])
            .args(["--mask", mask, "--min-runs", "1", "--min-time", "0"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{mask}");
        let j: serde_json::Value =
            serde_json::from_str(String::from_utf8(out.stdout).unwrap().trim()).unwrap();
        assert_eq!(j["mask"], mask);
        assert!(j["ms"].as_f64().unwrap() > 0.0);
    }
    let out = Command::new(env!("CARGO_BIN_EXE_attend"))
        .args(["bench", "--mask", "diagonal"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        err.trim_end(),
        "error: invalid value 'diagonal' for '--mask <MASK>' [possible values: bool, additive]"
    );
}

#[test]
fn bench_refuses_empty_shapes() {
    for flag in [
        "--seq",
        "--heads",
        "--kv-heads",
        "--kv-len",
        "--head-dim",
        "--batch",
        "--threads",
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_attend"))
            .args(["bench", flag, "0"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} 0: {err}");
        let err = err.trim_end();
        assert!(
            err.starts_with(&format!("error: invalid value '0' for '{flag} <"))
                && (err.ends_with("must be at least 1, got 0")
                    || err.ends_with("must be between 1 and 1024, got 0")),
            "{err}"
        );
    }
}
