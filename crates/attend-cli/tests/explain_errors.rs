//! Bad input to `attend explain`: each case must give exit code 2 and a single
//! line on stderr that names the culprit, never a panic.

use std::process::Command;

const X: &str = "[[1.16,0.23],[0.57,1.36],[4.41,-2.16]]";

/// (what is wrong, arguments, words the message must contain)
fn cases() -> Vec<(&'static str, Vec<&'static str>, Vec<&'static str>)> {
    vec![
        (
            "malformed JSON",
            vec!["--input", "[[1,2],[3"],
            vec!["--input", "not valid JSON"],
        ),
        (
            "ragged JSON",
            vec!["--input", "[[1,2],[3]]"],
            vec!["--input", "ragged", "[2, 2]"],
        ),
        (
            "non-numeric JSON",
            vec!["--input", "[[1,\"a\"]]"],
            vec!["--input", "not numeric"],
        ),
        (
            "rank-1 input",
            vec!["--input", "[1,2]"],
            vec!["--input", "[T, d_in]", "[2]"],
        ),
        (
            "weight width that does not match the input",
            vec![
                "--input",
                X,
                "--wq",
                "[[1,2,3]]",
                "--wk",
                "[[1,2,3]]",
                "--wv",
                "[[1,2,3]]",
            ],
            vec!["--wq", "[1, 3]", "d_in = 2"],
        ),
        (
            "query and key widths that differ",
            vec![
                "--input",
                X,
                "--wq",
                "[[1,2,3],[1,1,1]]",
                "--wk",
                "[[1,2],[1,1]]",
                "--wv",
                "[[1],[2]]",
            ],
            vec!["w_q [3, 2]", "w_k [2, 2]"],
        ),
        (
            "heads not dividing the width",
            vec!["--input", X, "--d-out", "3", "--heads", "2"],
            vec!["--d-out", "3", "--heads 2"],
        ),
        (
            "token id not below the vocabulary size",
            vec!["--tokens", "1,5", "--vocab-size", "5", "--embed-dim", "4"],
            vec!["--tokens", "id 5", "--vocab-size 5"],
        ),
        (
            "padding idx out of range",
            vec![
                "--tokens",
                "1,2",
                "--vocab-size",
                "5",
                "--embed-dim",
                "4",
                "--padding-idx",
                "7",
            ],
            vec!["padding_idx 7", "5"],
        ),
        (
            "empty input",
            vec!["--input", "[]"],
            vec!["--input", "empty"],
        ),
        (
            "empty rows",
            vec!["--input", "[[]]"],
            vec!["--input", "empty", "[1, 0]"],
        ),
        (
            "NaN in the input",
            vec!["--input", "[[NaN,1.0]]"],
            vec!["--input", "NaN"],
        ),
        (
            "a value beyond float32",
            vec!["--input", "[[1e39,1]]"],
            vec!["--input", "finite float32"],
        ),
        (
            "two inputs",
            vec!["--input", X, "--sentence", "hi", "--embed-dim", "2"],
            vec!["--input", "--sentence"],
        ),
        (
            "--d-out with --d-k",
            vec!["--input", X, "--d-out", "2", "--d-k", "2"],
            vec!["--d-out", "--d-k"],
        ),
        (
            "--init with given weights",
            vec![
                "--input",
                X,
                "--init",
                "linear",
                "--wq",
                "[[1],[1]]",
                "--wk",
                "[[1],[1]]",
                "--wv",
                "[[1],[1]]",
            ],
            vec!["--init", "--wq"],
        ),
        (
            "--mask-padding without tokens",
            vec!["--input", X, "--mask-padding"],
            vec!["--padding-idx"],
        ),
        (
            "ragged token rows",
            vec!["--tokens", "1,2;3", "--vocab-size", "5", "--embed-dim", "4"],
            vec!["--tokens", "row 1"],
        ),
        (
            "zero heads",
            vec!["--input", X, "--heads", "0"],
            vec!["--heads"],
        ),
        (
            "a seed that is not an integer",
            vec!["--input", X, "--seed", "abc"],
            vec!["--seed", "abc"],
        ),
        (
            "a seed beyond 2^64",
            vec!["--input", X, "--seed", "18446744073709551616"],
            vec!["--seed"],
        ),
        (
            "torch-mha with other widths",
            vec!["--input", X, "--init", "torch-mha", "--d-out", "4"],
            vec!["torch-mha", "d_in 2"],
        ),
        (
            "bias on torch.rand weights",
            vec!["--input", X, "--init", "uniform-in-out", "--bias"],
            vec!["--bias"],
        ),
        ("no input at all", vec!["--seed", "1"], vec!["--input"]),
        (
            "an unknown picture extension",
            vec!["--input", X, "--heatmap", "weights.bmp"],
            vec!["weights.bmp", "svg"],
        ),
        (
            "an unwritable picture path",
            vec!["--input", X, "--heatmap", "/nonexistent/dir/w.svg"],
            vec!["/nonexistent/dir/w.svg"],
        ),
        (
            "a window that is not LEFT,RIGHT",
            vec!["--input", X, "--window", "1"],
            vec!["--window", "LEFT,RIGHT"],
        ),
        (
            "--html with --format",
            vec!["--input", X, "--format", "json", "--html", "page.html"],
            vec!["--format", "--html"],
        ),
        (
            "--html into a directory that does not exist",
            vec!["--input", X, "--html", "/nonexistent-dir/page.html"],
            vec!["/nonexistent-dir/page.html", "does not exist"],
        ),
    ]
}

#[test]
fn bad_input_gives_one_line_and_exit_code_2() {
    for (what, args, words) in cases() {
        let out = Command::new(env!("CARGO_BIN_EXE_attend"))
            .arg("explain")
            .args(&args)
            .output()
            .expect("runs attend");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{what}: exit code; stderr: {stderr}"
        );
        assert_eq!(
            stderr.trim_end().lines().count(),
            1,
            "{what}: one line, got {stderr:?}"
        );
        assert!(stderr.starts_with("error: "), "{what}: {stderr}");
        assert!(!stderr.contains("panicked"), "{what}: {stderr}");
        for w in words {
            assert!(
                stderr.contains(w),
                "{what}: message should name {w:?}: {stderr}"
            );
        }
        assert!(out.stdout.is_empty(), "{what}: nothing on stdout");
    }
}
