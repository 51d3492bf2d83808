//! The hostile inputs of issue 13, as regression tests: each must end within
//! seconds under a 4 GB address-space limit with exit code 2 and one line on
//! stderr naming the flag or file (or with a correct result), and never with a
//! Rust panic or backtrace.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ndarray::Dimension;

const X: &str = "[[1.16,0.23],[0.57,1.36],[4.41,-2.16]]";
const EYE: &str = "[[1,0],[0,1]]";

/// Runs `attend args` with `ulimit -v 4000000`, killing it after `limit`; returns
/// (exit code, stdout, stderr).
fn attend_limited(args: &[&str], dir: &Path) -> (i32, String, String) {
    let limit = Duration::from_secs(60);
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 4000000 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_attend"))
        .args(args)
        .current_dir(dir)
        .env("RUST_BACKTRACE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            child.kill().unwrap();
            panic!("attend {args:?} still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("attend-hostile-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// An f32 `.npy` file of `shape` with values from a fixed sequence.
fn npy(dir: &Path, name: &str, shape: &[usize]) -> String {
    let a = ndarray::ArrayD::from_shape_fn(ndarray::IxDyn(shape), |i| {
        let k: usize = i.slice().iter().fold(0, |a, &x| a * 7 + x);
        ((k * 37) % 11) as f32 * 0.2 - 1.0
    });
    let path = dir.join(name);
    attend::io::npy::write_f32(&path, a.view()).unwrap();
    path.display().to_string()
}

/// The refusals: (what, arguments, words the one line must contain).
fn refusals(dir: &Path) -> Vec<(&'static str, Vec<String>, Vec<&'static str>)> {
    let long_sentence = "word ".repeat(20_000);
    let q = npy(dir, "q.npy", &[1, 1, 4, 8]);
    let bad_shape = dir.join("bad.npy");
    let header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1,, 2, 4, 8), }";
    let mut f = b"\x93NUMPY\x01\x00".to_vec();
    f.extend_from_slice(&(header.len() as u16).to_le_bytes());
    f.extend_from_slice(header.as_bytes());
    f.extend_from_slice(&[0; 256]);
    std::fs::write(&bad_shape, f).unwrap();
    let overlap = dir.join("overlap.safetensors");
    let header = r#"{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}"#;
    let mut f = (header.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(header.as_bytes());
    f.extend_from_slice(&[0; 12]);
    std::fs::write(&overlap, f).unwrap();
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    vec![
        (
            "no subcommand",
            vec![],
            vec!["subcommand", "explain", "bench"],
        ),
        (
            "zero runs",
            s(&["bench", "--min-runs", "0", "--min-time", "0"]),
            vec!["--min-runs"],
        ),
        (
            "NaN seconds",
            s(&["bench", "--decode", "--min-time", "NaN"]),
            vec!["--min-time"],
        ),
        (
            "infinite seconds",
            s(&["bench", "--min-time", "inf"]),
            vec!["--min-time"],
        ),
        (
            "huge sequence",
            s(&["bench", "--seq", "1000000000000000000"]),
            vec!["--seq", "would need"],
        ),
        (
            "huge decode cache",
            s(&["bench", "--decode", "--kv-len", "1000000000000"]),
            vec!["--kv-len", "would need"],
        ),
        (
            "huge thread count",
            s(&["bench", "--threads", "100000"]),
            vec!["--threads"],
        ),
        (
            "huge sdpa thread count",
            s(&[
                "sdpa",
                "--q",
                &q,
                "--k",
                &q,
                "--v",
                &q,
                "--out",
                "o.npy",
                "--threads",
                "100000",
            ]),
            vec!["--threads"],
        ),
        (
            "wrapping embedding size",
            s(&[
                "explain",
                "--tokens",
                "0",
                "--vocab-size",
                "4294967296",
                "--embed-dim",
                "4294967296",
            ]),
            vec!["--vocab-size", "would need"],
        ),
        (
            "huge width",
            s(&["explain", "--input", X, "--d-out", "1000000000"]),
            vec!["--d-out", "would need"],
        ),
        (
            "huge sentence",
            vec![
                "explain".into(),
                "--sentence".into(),
                long_sentence,
                "--embed-dim".into(),
                "4".into(),
            ],
            vec!["length", "would need"],
        ),
        (
            "endless skip",
            s(&["explain", "--input", X, "--skip-draws", "1000000000000"]),
            vec!["--skip-draws"],
        ),
        (
            "endless training",
            s(&["train", "--steps", "18446744073709551615"]),
            vec!["--steps"],
        ),
        (
            "long training",
            s(&["train", "--steps", "100000000000"]),
            vec!["--steps"],
        ),
        (
            "huge training batch",
            s(&["train", "--batch", "100000000000", "--steps", "1"]),
            vec!["--batch", "would need"],
        ),
        (
            "NaN scale",
            s(&["explain", "--input", X, "--scale", "NaN"]),
            vec!["--scale"],
        ),
        (
            "--causal with a model",
            s(&["explain", "--model", "m", "text", "--causal"]),
            vec!["--model", "--causal"],
        ),
        (
            "--seed with a model",
            s(&["view", "--model", "m", "text", "--seed", "3"]),
            vec!["--model", "--seed"],
        ),
        (
            "--heads with a model",
            s(&["explain", "--model", "m", "text", "--heads", "2"]),
            vec!["--model", "--heads"],
        ),
        (
            "--d-out with given weights",
            s(&[
                "explain", "--input", X, "--wq", EYE, "--wk", EYE, "--wv", EYE, "--d-out", "4",
            ]),
            vec!["--wq", "--d-out"],
        ),
        (
            "--out-proj with given weights",
            s(&[
                "explain",
                "--input",
                X,
                "--wq",
                EYE,
                "--wk",
                EYE,
                "--wv",
                EYE,
                "--out-proj",
            ]),
            vec!["--wq", "--out-proj"],
        ),
        (
            "--causal with a trained model",
            s(&[
                "explain",
                "--trained",
                "w.safetensors",
                "--digits",
                "12",
                "--causal",
            ]),
            vec!["--trained", "--causal"],
        ),
        (
            "one file for two outputs",
            s(&[
                "sdpa",
                "--q",
                &q,
                "--k",
                &q,
                "--v",
                &q,
                "--out",
                "same.npy",
                "--dout",
                &q,
                "--dq",
                "./same.npy",
                "--dk",
                "dk.npy",
                "--dv",
                "dv.npy",
            ]),
            vec!["--out", "--dq", "same.npy"],
        ),
        (
            "one file for weights and curve",
            s(&["train", "--weights", "x", "--curve", "x"]),
            vec!["--curve", "--weights"],
        ),
        (
            "npy shape with an empty element",
            s(&[
                "sdpa", "--q", "bad.npy", "--k", &q, "--v", &q, "--out", "o.npy",
            ]),
            vec!["bad.npy", "shape"],
        ),
        (
            "overlapping safetensors",
            s(&[
                "explain",
                "--trained",
                "overlap.safetensors",
                "--digits",
                "12",
            ]),
            vec!["overlap.safetensors", "overlap"],
        ),
        // Issue 47: endless streams end at their first bytes or at a bound, and
        // flags that would be ignored are refused.
        (
            "endless corpus line",
            vec![
                "embed".into(),
                "--model".into(),
                common::model_dir().display().to_string(),
                "--input".into(),
                "/dev/zero".into(),
                "--output".into(),
                "z.npy".into(),
            ],
            vec!["/dev/zero", "line 1", "newline"],
        ),
        (
            "endless attention-maps JSON",
            s(&["view", "--input-json", "/dev/zero"]),
            vec!["/dev/zero", "JSON"],
        ),
        (
            "random bytes as .npy",
            s(&[
                "sdpa",
                "--q",
                "/dev/urandom",
                "--k",
                &q,
                "--v",
                &q,
                "--out",
                "o.npy",
            ]),
            vec!["/dev/urandom", "magic"],
        ),
        (
            "a loss curve that is not SVG",
            s(&["train", "--steps", "1", "--curve", "c.jpg"]),
            vec!["--curve", "c.jpg", "svg"],
        ),
        (
            "a query length for decoding",
            s(&["bench", "--decode", "--seq", "5"]),
            vec!["--seq", "--decode"],
        ),
    ]
}

#[test]
fn every_hostile_case_is_one_line_and_exit_2() {
    let dir = scratch("refusals");
    for (what, args, words) in refusals(&dir) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, _, err) = attend_limited(&args, &dir);
        let shown: String = err.chars().take(300).collect();
        assert_eq!(code, 2, "{what}: exit {code}, stderr {shown}");
        assert_eq!(err.trim_end().lines().count(), 1, "{what}: {shown}");
        assert!(
            !err.contains("panicked") && !err.contains("backtrace"),
            "{what}: {shown}"
        );
        for w in words {
            assert!(err.contains(w), "{what}: {shown:?} does not name {w:?}");
        }
    }
    // Nothing was written by any refused command.
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !["q.npy", "bad.npy", "overlap.safetensors"].contains(&n.as_str()))
        .collect();
    assert!(left.is_empty(), "refused commands left {left:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A window as wide as usize allows is no window at all: the same output as none
/// (it used to wrap to a negative width in i64 and give zeros).
#[test]
fn a_widest_window_equals_no_window() {
    let dir = scratch("window");
    let q = npy(&dir, "q.npy", &[1, 2, 5, 4]);
    let k = npy(&dir, "k.npy", &[1, 2, 7, 4]);
    let v = npy(&dir, "v.npy", &[1, 2, 7, 3]);
    let dout = npy(&dir, "dout.npy", &[1, 2, 5, 3]);
    for (name, window) in [
        ("plain", None),
        ("wide", Some("18446744073709551615,18446744073709551615")),
    ] {
        let files: Vec<String> = ["out", "dq", "dk", "dv"]
            .iter()
            .map(|f| format!("{name}-{f}.npy"))
            .collect();
        let mut args = vec!["sdpa", "--q", &q, "--k", &k, "--v", &v, "--dout", &dout];
        for (flag, file) in ["--out", "--dq", "--dk", "--dv"].iter().zip(&files) {
            args.extend([*flag, file.as_str()]);
        }
        if let Some(w) = window {
            args.extend(["--window", w]);
        }
        let (code, _, err) = attend_limited(&args, &dir);
        assert_eq!(code, 0, "{err}");
    }
    // Outputs and gradients alike (the gradients were zeros).
    for f in ["out", "dq", "dk", "dv"] {
        let read =
            |name: &str| attend::io::npy::read_f32(dir.join(format!("{name}-{f}.npy"))).unwrap();
        let (plain, wide) = (read("plain"), read("wide"));
        assert!(plain.iter().any(|&x| x != 0.0), "{f}");
        assert_eq!(plain, wide, "{f}");
    }
    // A right side of usize::MAX with left 0 keeps exactly the keys from the diagonal on.
    let (code, _, err) = attend_limited(
        &[
            "sdpa",
            "--q",
            &q,
            "--k",
            &k,
            "--v",
            &v,
            "--out",
            "right.npy",
            "--window",
            "0,18446744073709551615",
        ],
        &dir,
    );
    assert_eq!(code, 0, "{err}");
    let right = attend::io::npy::read_f32(dir.join("right.npy")).unwrap();
    assert!(right.iter().all(|x| x.is_finite()) && right.iter().any(|&x| x != 0.0));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A picture of a sentence far longer than any line draws, with its title cut
/// short, within the address-space limit.
#[test]
fn a_long_title_draws_a_bounded_png() {
    let dir = scratch("title");
    let title = "a very long sentence ".repeat(400);
    let maps = format!(
        r#"{{"title": "{title}", "query_tokens": ["a", "b"], "layers": [[[[0.5, 0.5], [1, 0]]]]}}"#
    );
    std::fs::write(dir.join("maps.json"), maps).unwrap();
    let (code, _, err) = attend_limited(
        &["view", "--input-json", "maps.json", "--heatmap", "h.png"],
        &dir,
    );
    assert_eq!(code, 0, "{err}");
    let png = std::fs::read(dir.join("h.png")).unwrap();
    assert!(png.len() < 200_000, "{} bytes", png.len());
    std::fs::remove_dir_all(&dir).unwrap();
}
