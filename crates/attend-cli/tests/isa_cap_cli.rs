//! `ATTEND_MAX_ISA` through the command line: the path it names runs (and is
//! reported), and a name that is no instruction set stops the command with one
//! line naming the variable.

use std::process::Command;

fn bench_with_cap(cap: &str) -> std::process::Output {
    let args = ["bench", "--seq", "16", "--heads", "1", "--min-runs", "1"];
    Command::new(env!("CARGO_BIN_EXE_attend"))
        .args(args)
        .args(["--min-time", "0"])
        .env("ATTEND_MAX_ISA", cap)
        .output()
        .unwrap()
}

#[test]
fn the_capped_path_runs_and_is_reported() {
    let out = bench_with_cap("portable");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = String::from_utf8(out.stdout).unwrap();
    assert!(report.contains(r#""isa":"portable""#), "{report}");
}

#[test]
fn an_unknown_cap_is_refused_in_one_line() {
    let out = bench_with_cap("avx9000");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("ATTEND_MAX_ISA") && err.contains("avx9000"),
        "{err}"
    );
}
