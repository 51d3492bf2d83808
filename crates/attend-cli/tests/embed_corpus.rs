//! `attend embed --input ... --output ...` on all-MiniLM-L6-v2 (fetched by
//! scripts/fetch-model; these tests fail when it is missing): the corpus comes back
//! in input order and equal to one padded batch of all of it, bad lines are named
//! by number, and a failed run leaves the output as it was.
//!
//! The tolerance. Embedding in length-sorted batches changes only the padding each
//! text sees, and padded keys are masked, so batched and one-batch vectors are two
//! float32 evaluations of the same exact values that differ in rounding alone.
//! docs/design.md's rule bounds each evaluation's error by twice that of a naive
//! float32 implementation plus the float32 rounding floor. The naive error is
//! measured, not assumed: attend's distance from sentence-transformers' float32
//! (PyTorch eager) vectors on the reference texts, D. So the two evaluations may
//! differ by 2·D plus the floor, 4 ulps of the largest |entry|.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use attend::models::SentenceEncoder;
use ndarray::Array2;
use serde_json::Value;

mod common;
use common::model_dir;

fn encoder() -> &'static SentenceEncoder {
    static ENC: OnceLock<SentenceEncoder> = OnceLock::new();
    ENC.get_or_init(|| SentenceEncoder::load(model_dir()).unwrap())
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("attend-corpus-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `attend embed` with `args` (the model added), `stdin` piped in.
fn attend(args: &[&str], stdin: &[u8]) -> (i32, String) {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_attend"))
        .arg("embed")
        .arg("--model")
        .arg(model_dir())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// `n` texts of 1 to 60 words from a fixed generator: lengths vary so that the
/// length sort reorders them and batches pad differently from one big batch.
fn corpus(n: usize) -> Vec<String> {
    const WORDS: [&str; 16] = [
        "attention",
        "the",
        "cat",
        "sat",
        "on",
        "a",
        "mat",
        "while",
        "encoders",
        "embed",
        "every",
        "sentence",
        "quickly",
        "bank",
        "river",
        "rates",
    ];
    let mut state = 0x2545_f491_u64;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as usize
    };
    (0..n)
        .map(|i| {
            let words = 1 + next() % 60;
            let body: Vec<&str> = (0..words).map(|_| WORDS[next() % WORDS.len()]).collect();
            format!("{i}: {}.", body.join(" "))
        })
        .collect()
}

fn max_abs_diff(a: impl IntoIterator<Item = f32>, b: impl IntoIterator<Item = f32>) -> f32 {
    a.into_iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        // A NaN is an infinite difference (`f32::max` would drop it).
        .fold(
            0.0,
            |m, d| if d.is_nan() { f32::INFINITY } else { m.max(d) },
        )
}

/// 2·D + 4 ulps of `scale` (see the module's doc comment).
fn tolerance(scale: f32) -> f32 {
    let reference: Value = serde_json::from_str(include_str!(
        "../../attend/tests/data/minilm-reference.json"
    ))
    .unwrap();
    let texts: Vec<&str> = reference["embed"]["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let ours = encoder().embed(&texts).unwrap().vectors;
    let theirs = reference["embed"]["embeddings"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| row.as_array().unwrap().iter())
        .map(|x| x.as_f64().unwrap() as f32);
    let d = max_abs_diff(ours.iter().copied(), theirs);
    2.0 * d + 4.0 * f32::EPSILON * scale
}

fn read_npy(path: &Path) -> Array2<f32> {
    attend::io::npy::read_f32(path)
        .unwrap()
        .into_dimensionality()
        .unwrap()
}

/// Checks `got` against one padded batch of all `texts`: within the tolerance, and
/// each row nearest its own text's vector (a shuffled order could not pass).
fn assert_one_batch_equal(got: &Array2<f32>, texts: &[String]) {
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let want = encoder().embed(&refs).unwrap().vectors;
    assert_eq!(got.dim(), want.dim());
    let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let tol = tolerance(scale);
    let worst = max_abs_diff(got.iter().copied(), want.iter().copied());
    eprintln!("batched vs one batch: max abs diff {worst:e}, tolerance {tol:e}");
    assert!(worst <= tol, "max abs diff {worst:e} > {tol:e}");
    for (i, row) in got.rows().into_iter().enumerate() {
        let nearest = (0..want.nrows())
            .min_by(|&a, &b| {
                let da = max_abs_diff(row.iter().copied(), want.row(a).iter().copied());
                let db = max_abs_diff(row.iter().copied(), want.row(b).iter().copied());
                da.total_cmp(&db)
            })
            .unwrap();
        assert_eq!(nearest, i, "row {i} is text {nearest}'s vector");
    }
}

#[test]
fn lines_come_back_in_order_and_equal_one_batch() {
    let dir = scratch("order");
    let texts = corpus(45);
    let input = dir.join("in.txt");
    std::fs::write(&input, texts.join("\n") + "\n").unwrap();
    let out = dir.join("out.npy");
    // Three chunks (16, 16, 13) of batches of 4, each in its own length order.
    let (code, err) = attend(
        &[
            "--input",
            input.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
            "--batch-size",
            "4",
            "--chunk-size",
            "16",
        ],
        b"",
    );
    assert_eq!((code, err.as_str()), (0, ""));
    assert_one_batch_equal(&read_npy(&out), &texts);
    // Standard input, one chunk: the same rows, the row count patched in just the same.
    let again = dir.join("again.npy");
    let (code, err) = attend(
        &["--input", "-", "--output", again.to_str().unwrap()],
        (texts.join("\n") + "\n").as_bytes(),
    );
    assert_eq!((code, err.as_str()), (0, ""));
    assert_one_batch_equal(&read_npy(&again), &texts);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn jsonl_keeps_each_record_and_adds_its_vector() {
    let dir = scratch("jsonl");
    let texts = corpus(20);
    let lines: Vec<String> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            format!(
                "{{\"id\": {i}, \"body\": {}, \"tag\": \"x\"}}",
                Value::from(t.as_str())
            )
        })
        .collect();
    let input = dir.join("in.jsonl");
    std::fs::write(&input, lines.join("\n")).unwrap(); // no final newline
    let out = dir.join("out.jsonl");
    let (code, err) = attend(
        &[
            "--input",
            input.to_str().unwrap(),
            "--field",
            "body",
            "--output",
            out.to_str().unwrap(),
            "--batch-size",
            "3",
            "--chunk-size",
            "7",
        ],
        b"",
    );
    assert_eq!((code, err.as_str()), (0, ""));
    let written = std::fs::read_to_string(&out).unwrap();
    let mut got = Vec::new();
    for (i, line) in written.lines().enumerate() {
        let v: Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["id"], i, "{line:.80}");
        assert_eq!(v["body"], texts[i].as_str());
        assert_eq!(v["tag"], "x");
        got.extend(
            v["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32),
        );
    }
    let got = Array2::from_shape_vec((texts.len(), 384), got).unwrap();
    assert_one_batch_equal(&got, &texts);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_bad_line_is_named_and_leaves_the_output_as_it_was() {
    let dir = scratch("bad");
    let good = corpus(12);
    let lines = |bad: &[u8]| {
        let mut bytes = Vec::new();
        for t in &good {
            bytes.extend_from_slice(t.as_bytes());
            bytes.push(b'\n');
        }
        bytes.extend_from_slice(bad);
        bytes.extend_from_slice(b"\nafter\n");
        bytes
    };
    let jsonl = |bad: &str| {
        let mut s: String = good
            .iter()
            .map(|t| format!("{{\"text\": {}}}\n", Value::from(t.as_str())))
            .collect();
        s.push_str(bad);
        s.push('\n');
        s.into_bytes()
    };
    // Line 13 is bad; chunks of 4 mean three chunks were already embedded and written.
    let cases: Vec<(Vec<u8>, bool, String)> = vec![
        (
            lines(b""),
            false,
            "line 13 is empty: every line must hold a text".into(),
        ),
        (
            lines(b"caf\xe9"),
            false,
            "line 13 is not valid UTF-8 (bad byte at column 4)".into(),
        ),
        (
            jsonl("{\"text\": \"x\""),
            true,
            "line 13 is not valid JSON: EOF while parsing an object at line 1 column 12".into(),
        ),
        (
            jsonl("{\"title\": \"x\"}"),
            true,
            "line 13 has no \"text\" field".into(),
        ),
        (
            jsonl("{\"text\": null}"),
            true,
            "line 13 has a null in its \"text\" field, not a string".into(),
        ),
    ];
    for (ext, previous) in [
        ("npy", "an earlier run's vectors"),
        ("jsonl", "{\"kept\": true}\n"),
    ] {
        for (input, is_jsonl, message) in &cases {
            let path = dir.join("in.txt");
            std::fs::write(&path, input).unwrap();
            let out = dir.join(format!("out.{ext}"));
            std::fs::write(&out, previous).unwrap();
            let mut args = vec![
                "--input",
                path.to_str().unwrap(),
                "--output",
                out.to_str().unwrap(),
                "--chunk-size",
                "4",
            ];
            if *is_jsonl {
                args.extend(["--field", "text"]);
            }
            let (code, err) = attend(&args, b"");
            assert_eq!(code, 2, "{err}");
            assert_eq!(err, format!("error: {}: {message}\n", path.display()));
            assert_eq!(std::fs::read_to_string(&out).unwrap(), previous);
            let mut names: Vec<String> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            assert_eq!(
                names,
                ["in.txt".to_string(), format!("out.{ext}")],
                "no temporary file left"
            );
            std::fs::remove_file(&out).unwrap();
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn flags_that_do_not_fit_are_refused_in_one_line() {
    let dir = scratch("flags");
    let input = dir.join("in.txt");
    std::fs::write(&input, "a\n").unwrap();
    let input = input.to_str().unwrap();
    let bin = dir.join("out.bin");
    let cases: [(&[&str], String); 4] = [
        (
            &["--input", input, "--output", bin.to_str().unwrap()],
            format!("error: --output {}: the extension says neither .npy nor .jsonl; name one or pass --format npy|jsonl\n", bin.display()),
        ),
        (
            &["--input", input, "--output", bin.to_str().unwrap(), "--format", "json"],
            "error: --format json is for sentences; --output takes npy or jsonl\n".into(),
        ),
        (
            &["--input", input, "--output", bin.to_str().unwrap(), "--format", "npy", "--batch-size", "0"],
            "error: --batch-size must be at least 1\n".into(),
        ),
        (
            &["--format", "npy", "a sentence"],
            "error: --format npy is for --output (sentences may go to a file too); printed sentences are text or json\n".into(),
        ),
    ];
    for (args, want) in cases {
        let (code, err) = attend(args, b"");
        assert_eq!((code, err), (2, want));
    }
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        1,
        "nothing written"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn truncated_texts_are_counted_with_the_first_line() {
    let dir = scratch("long");
    let long = "word ".repeat(300);
    let input = format!("short one\n{long}\nshort two\n{long}\n");
    let out = dir.join("out.npy");
    let (code, err) = attend(
        &["--input", "-", "--output", out.to_str().unwrap()],
        input.as_bytes(),
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        err,
        "warning: 2 text(s) longer than the model's maximum of 256 tokens were truncated, as sentence-transformers does (the first: line 2, 302 tokens)\n"
    );
    assert_eq!(read_npy(&out).dim(), (4, 384));
    std::fs::remove_dir_all(&dir).unwrap();
}
