//! `attend sdpa --dtype bf16` and `attend bench --dtype bf16` end to end: the
//! float32 files rounded to bf16 as PyTorch rounds (to nearest, ties to even), the
//! library's bf16 attention on them, the bf16 results written widened to float32;
//! and one-line errors for bad values.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use attend::attention::{
    attention_backward_with, attention_with, AttentionOptions, BackwardConfig, Causal, Config,
    Exec, Saved,
};
use attend::element::{bf16, from_f32, round_to_bf16, to_f32};
use attend::io::npy;
use attend::kernels::Isa;
use ndarray::{Array4, ArrayD, Ix4, IxDyn};

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("attend-sdpa-bf16-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Values with more than bf16's 8 significant bits, so that rounding matters.
fn arr(shape: &[usize], seed: f32) -> ArrayD<f32> {
    let mut i = 0.0f32;
    ArrayD::from_shape_simple_fn(IxDyn(shape), || {
        i += 1.0;
        (i * 0.731 + seed).sin() * 1.37
    })
}

fn save(d: &Path, name: &str, a: &ArrayD<f32>) -> String {
    let p = d.join(name);
    npy::write_f32(&p, a.view()).unwrap();
    p.to_str().unwrap().to_string()
}

fn attend(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attend"))
        .args(args)
        .output()
        .unwrap()
}

/// Runs `attend` expecting failure: exit code 2 and one line on stderr containing
/// `needle`.
fn fails(args: &[&str], needle: &str) {
    let out = attend(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains(needle), "{err:?} lacks {needle:?}");
}

fn rank4(a: ArrayD<f32>) -> Array4<f32> {
    a.into_dimensionality::<Ix4>().unwrap()
}

fn is_bf16(a: &ArrayD<f32>) -> bool {
    a.iter().all(|&x| bf16::from_f32(x).to_f32() == x)
}

#[test]
fn sdpa_bf16_is_the_library_on_the_rounded_inputs() {
    let d = dir("ok");
    let (q, k, v) = (
        arr(&[2, 4, 5, 8], 0.1),
        arr(&[2, 2, 7, 8], 0.2),
        arr(&[2, 2, 7, 3], 0.3),
    );
    let bias = arr(&[5, 7], 0.4);
    let dout = arr(&[2, 4, 5, 3], 0.5);
    let paths: Vec<String> = [("q", &q), ("k", &k), ("v", &v), ("m", &bias), ("do", &dout)]
        .iter()
        .map(|(n, a)| save(&d, &format!("{n}.npy"), a))
        .collect();
    let outs: Vec<PathBuf> = ["o", "lse", "dq", "dk", "dv"]
        .iter()
        .map(|n| d.join(format!("{n}.npy")))
        .collect();
    let o: Vec<&str> = outs.iter().map(|p| p.to_str().unwrap()).collect();
    let run = attend(&[
        "sdpa",
        "--dtype",
        "bf16",
        "--q",
        &paths[0],
        "--k",
        &paths[1],
        "--v",
        &paths[2],
        "--mask",
        &paths[3],
        "--causal",
        "bottom-right",
        "--threads",
        "2",
        "--out",
        o[0],
        "--lse",
        o[1],
        "--dout",
        &paths[4],
        "--dq",
        o[2],
        "--dk",
        o[3],
        "--dv",
        o[4],
    ]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );

    // The library on the same inputs rounded here, on one thread: the bits must
    // agree (the kernels' result does not depend on the thread count).
    let bias_r = round_to_bf16(bias.view());
    let opts = AttentionOptions {
        causal: Some(Causal::BottomRight),
        bias: Some(bias_r.view()),
        ..Default::default()
    };
    let [qb, kb, vb] = [&q, &k, &v].map(|a| from_f32::<bf16, _>(rank4(a.clone()).view()));
    let one = Config {
        exec: Exec {
            threads: Some(1),
            ..Default::default()
        },
        ..Default::default()
    };
    let (want, lse) = attention_with(qb.view(), kb.view(), vb.view(), &opts, &one).unwrap();
    let want = to_f32(want.view());
    let got = npy::read_f32(&outs[0]).unwrap();
    assert!(is_bf16(&got), "the output holds values bf16 cannot");
    assert_eq!(got, want.clone().into_dyn());
    assert_eq!(npy::read_f32(&outs[1]).unwrap(), lse.clone().into_dyn());

    // Gradients: the f32 backward of the bf16 values, rounded to bf16.
    let [qw, kw, vw] = [&qb, &kb, &vb].map(|a| to_f32(a.view()));
    let dout_r = round_to_bf16(rank4(dout).view());
    let g = attention_backward_with(
        qw.view(),
        kw.view(),
        vw.view(),
        Saved::new(want.view(), lse.view()),
        dout_r.view(),
        &opts,
        &BackwardConfig::default(),
    )
    .unwrap();
    for (path, grad) in outs[2..].iter().zip([g.dq, g.dk, g.dv]) {
        let got = npy::read_f32(path).unwrap();
        assert!(is_bf16(&got), "{} holds values bf16 cannot", path.display());
        assert_eq!(
            got,
            round_to_bf16(grad.view()).into_dyn(),
            "{}",
            path.display()
        );
    }
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn sdpa_bf16_rounds_ties_to_even() {
    // One key: the weight is 1 and the output is v itself, rounded to bf16. bf16
    // has 7 stored fraction bits, so 1 + 2⁻⁸ lies halfway between 1 and 1 + 2⁻⁷
    // and goes to 1 (even), 1 + 3·2⁻⁸ halfway between 1 + 2⁻⁷ and 1 + 2⁻⁶ and goes
    // to 1 + 2⁻⁶ (even); just above a tie goes up.
    let d = dir("ties");
    let h = 2f32.powi(-8);
    let v = ArrayD::from_shape_vec(
        IxDyn(&[1, 1, 1, 4]),
        vec![1.0 + h, 1.0 + 3.0 * h, -(1.0 + h), 1.0 + h + 2f32.powi(-20)],
    )
    .unwrap();
    let q = ArrayD::from_elem(IxDyn(&[1, 1, 1, 4]), 0.3f32);
    let (qp, vp) = (save(&d, "q.npy", &q), save(&d, "v.npy", &v));
    let op = d.join("o.npy");
    let run = attend(&[
        "sdpa",
        "--dtype",
        "bf16",
        "--q",
        &qp,
        "--k",
        &qp,
        "--v",
        &vp,
        "--out",
        op.to_str().unwrap(),
    ]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let got = npy::read_f32(&op).unwrap();
    let want = [1.0, 1.0 + 4.0 * h, -1.0, 1.0 + 2.0 * h];
    assert_eq!(got.iter().copied().collect::<Vec<_>>(), want);
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn sdpa_dtype_f32_is_the_default() {
    let d = dir("f32");
    let (q, k, v) = (
        save(&d, "q.npy", &arr(&[1, 2, 5, 8], 0.1)),
        save(&d, "k.npy", &arr(&[1, 2, 6, 8], 0.2)),
        save(&d, "v.npy", &arr(&[1, 2, 6, 4], 0.3)),
    );
    let outs: Vec<String> = ["plain", "f32", "bf16"]
        .iter()
        .map(|n| d.join(format!("{n}.npy")).to_str().unwrap().to_string())
        .collect();
    for (out, dtype) in outs.iter().zip([None, Some("float32"), Some("bfloat16")]) {
        let mut args = vec!["sdpa", "--q", &q, "--k", &k, "--v", &v, "--out", out];
        args.extend(dtype.iter().flat_map(|t| ["--dtype", t]));
        let run = attend(&args);
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
    }
    let [plain, f32_, bf16_] = [0, 1, 2].map(|i| npy::read_f32(Path::new(&outs[i])).unwrap());
    assert_eq!(plain, f32_);
    assert!(!is_bf16(&plain), "the f32 run was rounded");
    assert_ne!(plain, bf16_);
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn bad_dtype_is_one_line_listing_the_choices() {
    let d = dir("bad");
    let q = save(&d, "q.npy", &arr(&[1, 1, 2, 4], 0.1));
    let out = d.join("o.npy");
    let sdpa = [
        "sdpa",
        "--q",
        &q,
        "--k",
        &q,
        "--v",
        &q,
        "--out",
        out.to_str().unwrap(),
    ];
    for bad in ["f16", "bfloat", ""] {
        let mut args = sdpa.to_vec();
        args.extend(["--dtype", bad]);
        fails(&args, "expected f32 (float32) or bf16 (bfloat16)");
        fails(&["bench", "--dtype", bad], "--dtype");
    }
    assert!(!out.exists());
    std::fs::remove_dir_all(&d).ok();
}

fn bench_json(extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["bench", "--heads", "2", "--seq", "96", "--head-dim", "32"];
    args.extend(["--threads", "1", "--min-runs", "2", "--min-time", "0"]);
    args.extend(extra);
    let out = attend(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(String::from_utf8(out.stdout).unwrap().trim()).unwrap()
}

#[test]
fn bench_bf16_names_its_dtype_and_instruction_set() {
    let j = bench_json(&["--dtype", "bf16", "--causal"]);
    assert_eq!(j["dtype"], "bf16");
    assert_eq!(j["isa"], Isa::detect().name());
    assert!(j["gflops"].as_f64().unwrap() > 0.0);
    assert_eq!(bench_json(&[])["dtype"], "f32");
    // Forward + backward on bf16 tensors, as the Python binding computes them.
    let j = bench_json(&["--dtype", "bf16", "--backward"]);
    assert_eq!(j["dtype"], "bf16");
    assert_eq!(j["backward"], true);
    for isa in Isa::available() {
        let j = bench_json(&["--dtype", "bf16", "--isa", isa.name(), "--mask", "additive"]);
        assert_eq!(j["isa"], isa.name());
    }
    let out = attend(&[
        "bench", "--dtype", "bf16", "--seq", "64", "--format", "text",
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with(&format!("attend {} bf16 ", Isa::detect().name())),
        "{text}"
    );
    assert_eq!(
        text.contains("no vdpbf16ps"),
        !Isa::detect().has_bf16_products(),
        "{text}"
    );
}

#[test]
fn bench_isa_takes_every_name_and_refuses_the_rest() {
    for isa in Isa::ALL.into_iter().filter(|i| !i.is_available()) {
        fails(
            &["bench", "--isa", isa.name(), "--seq", "16"],
            &format!("--isa {} is not available on this CPU", isa.name()),
        );
    }
    fails(
        &["bench", "--isa", "sse2"],
        "expected one of portable, avx2, avx2vnni, avx512, avx512bf16, amx",
    );
}
