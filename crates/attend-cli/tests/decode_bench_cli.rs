//! `attend bench --decode` prints one JSON record with the decode speed and the
//! machine's read bandwidth measured in the same run (values are not checked:
//! speed claims come from benchmark runs, not tests).

use std::process::Command;

fn attend(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_attend"))
        .args(args)
        .output()
        .expect("runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn decode_bench_prints_one_json_record() {
    let (ok, out, err) = attend(&[
        "bench",
        "--decode",
        "--heads",
        "4",
        "--kv-heads",
        "2",
        "--kv-len",
        "300",
        "--head-dim",
        "16",
        "--min-time",
        "0.01",
        "--format",
        "json",
    ]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1, "{out}");
    let j: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(j["what"], "decode");
    assert_eq!(
        (j["heads"].as_u64(), j["kv_heads"].as_u64()),
        (Some(4), Some(2))
    );
    assert_eq!(
        (j["q_len"].as_u64(), j["kv_len"].as_u64()),
        (Some(1), Some(300))
    );
    for key in ["ms", "gbps", "read_gbps", "fraction_of_read"] {
        assert!(j[key].as_f64().is_some_and(|x| x > 0.0), "{key}: {out}");
    }
}

#[test]
fn decode_bench_rejects_bad_flags_in_one_line() {
    let (ok, _, err) = attend(&["bench", "--decode", "--heads", "3", "--kv-heads", "2"]);
    assert!(!ok);
    assert_eq!(
        err.trim(),
        "error: --heads (3) must be a positive multiple of --kv-heads (2)"
    );
    let (ok, _, err) = attend(&["bench", "--decode", "--backward"]);
    assert!(!ok);
    assert_eq!(err.lines().count(), 1, "{err}");
}
