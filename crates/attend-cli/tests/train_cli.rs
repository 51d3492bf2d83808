//! `attend train`: a short run learns, writes its files; bad flags are one-line
//! errors with exit code 2.

use std::process::Command;

fn attend(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_attend"))
        .args(args)
        .output()
        .expect("runs attend")
}

#[test]
fn bad_learning_rate_and_dropout_are_clear_errors() {
    for (flag, value, needle) in [
        ("--lr", "0", "--lr must be a positive"),
        ("--lr", "-0.1", "--lr must be a positive"),
        ("--lr", "NaN", "--lr must be a positive"),
        ("--dropout", "1", "--dropout must be in [0, 1)"),
        ("--dropout", "-0.5", "--dropout must be in [0, 1)"),
    ] {
        let out = attend(&["train", flag, value, "--quiet"]);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(needle) && err.lines().count() == 1,
            "{flag} {value}: {err}"
        );
    }
}

#[test]
fn a_short_run_writes_weights_and_curve() {
    let dir = std::env::temp_dir().join(format!("attend-train-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (w, c) = (dir.join("w.safetensors"), dir.join("loss.svg"));
    let out = attend(&[
        "train",
        "--len",
        "4",
        "--steps",
        "200",
        "--quiet",
        "--weights",
        w.to_str().unwrap(),
        "--curve",
        c.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let accuracy: f64 = text
        .split("held-out accuracy: ")
        .nth(1)
        .and_then(|rest| rest.split('%').next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no accuracy in {text}"));
    assert!(
        accuracy >= 95.0,
        "held-out accuracy {accuracy}% < 95%: {text}"
    );
    let model = attend::train::load(&w).unwrap();
    assert_eq!(model.len(), 4);
    assert!(std::fs::read_to_string(&c).unwrap().starts_with("<svg"));

    // explain loads the weights and shows the learned attention: to reverse, the
    // query at position i looks mostly at key T - 1 - i, in at least one head.
    let out = attend(&[
        "explain",
        "--trained",
        w.to_str().unwrap(),
        "--digits",
        "3141",
        "--format",
        "json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let weights: Vec<Vec<Vec<Vec<f64>>>> = serde_json::from_value(json["weights"].clone()).unwrap();
    let reverses = |head: &Vec<Vec<f64>>| {
        head.iter().enumerate().all(|(i, row)| {
            let argmax = (0..row.len())
                .max_by(|&a, &b| row[a].total_cmp(&row[b]))
                .unwrap();
            argmax == row.len() - 1 - i
        })
    };
    assert!(
        weights[0].iter().any(reverses),
        "no head attends in reverse: {:?}",
        weights[0]
    );
    std::fs::remove_dir_all(&dir).ok();
}
