//! `attend view` end to end: outputs, and one-line errors with exit code 2.

use std::path::PathBuf;
use std::process::Command;

fn attend(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_attend"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn example() -> String {
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/examples/notebook004.json"
    )
    .to_string()
}

fn tmp(name: &str) -> String {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name).display().to_string()
}

#[test]
fn view_prints_writes_pictures_and_pages() {
    let (code, out, _) = attend(&["view", "--input-json", &example(), "--head", "1"]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with("layer 0, head 1:\n") && !out.contains('\x1b'),
        "{out}"
    );
    let (code, out, _) = attend(&["view", "--input-json", &example(), "--color", "truecolor"]);
    assert_eq!(code, 0);
    assert_eq!(out.matches("layer 0, head").count(), 3);
    assert!(out.contains("\x1b[48;2;"));
    let (png, html) = (tmp("view.png"), tmp("view.html"));
    let (code, _, err) = attend(&[
        "view",
        "--input-json",
        &example(),
        "--heatmap",
        &png,
        "--html",
        &html,
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(std::fs::read(&png).unwrap().starts_with(b"\x89PNG"));
    assert!(std::fs::read_to_string(&html)
        .unwrap()
        .contains("attend-data"));
}

#[test]
fn view_bad_input_is_one_line_and_exit_2() {
    let cases: [(&[&str], &str); 5] = [
        (
            &["--heatmap", "/tmp/x.gif"],
            "unknown picture extension '.gif'",
        ),
        (
            &["--heatmap", "/nonexistent-attend/x.svg"],
            "/nonexistent-attend/x.svg: ",
        ),
        (
            &["--layer", "3", "--heatmap", "/tmp/x.svg"],
            "layer 3 is out of range",
        ),
        (
            &["--head", "9"],
            "head 9 is out of range: the maps have 3 head(s)",
        ),
        (
            &["--html", "/nonexistent-attend/v.html"],
            "/nonexistent-attend/v.html: ",
        ),
    ];
    for (extra, want) in cases {
        let mut args = vec!["view", "--input-json"];
        let ex = example();
        args.push(&ex);
        args.extend_from_slice(extra);
        let (code, _, err) = attend(&args);
        assert_eq!(code, 2, "{extra:?}: {err}");
        assert!(
            err.starts_with("error: ") && err.contains(want),
            "{extra:?}: {err}"
        );
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
    let (code, _, err) = attend(&["view", "--input-json", "/nonexistent-attend/m.json"]);
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent-attend/m.json"), "{err}");
}
