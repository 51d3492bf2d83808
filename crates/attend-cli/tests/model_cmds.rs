//! `attend embed` and `attend attention` on all-MiniLM-L6-v2 (fetched by
//! scripts/fetch-model into $ATTEND_MODEL_DIR or ~/.cache/attend/all-minilm-l6-v2;
//! these tests fail when it is missing).

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

mod common;
use common::model_dir;

fn attend(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_attend"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn embed_json_matches_sentence_transformers() {
    let dir = model_dir();
    let reference: Value = serde_json::from_str(include_str!(
        "../../attend/tests/data/minilm-reference.json"
    ))
    .unwrap();
    let (code, out, err) = attend(&[
        "embed",
        "--model",
        dir.to_str().unwrap(),
        "--format",
        "json",
        "Hello world.",
        "",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(err.trim(), "warning: text 1 is empty: it is encoded as [CLS] [SEP] alone, as sentence-transformers does");
    let doc: Value = serde_json::from_str(&out).unwrap();
    let rows = doc["embeddings"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for (row, want) in rows.iter().zip([0, 5]) {
        let want = reference["embed"]["embeddings"][want].as_array().unwrap();
        assert_eq!(row.as_array().unwrap().len(), 384);
        for (g, w) in row.as_array().unwrap().iter().zip(want) {
            assert!((g.as_f64().unwrap() - w.as_f64().unwrap()).abs() <= 1e-5);
        }
    }
    let (code, out, _) = attend(&["embed", "--model", dir.to_str().unwrap(), "a b", "c"]);
    assert_eq!(code, 0);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0].split(' ').count(), 384);
}

#[test]
fn attention_prints_one_head() {
    let dir = model_dir();
    let reference: Value = serde_json::from_str(include_str!(
        "../../attend/tests/data/minilm-reference.json"
    ))
    .unwrap();
    let case = &reference["attention"][0];
    let text = case["text"].as_str().unwrap();
    let (code, out, err) = attend(&[
        "attention",
        "--model",
        dir.to_str().unwrap(),
        "--layer",
        "4",
        "--head",
        "11",
        "--format",
        "json",
        text,
    ]);
    assert_eq!(code, 0, "{err}");
    let doc: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["tokens"], case["tokens"]);
    let want = &case["weights"][4][11];
    for (g, w) in doc["weights"]
        .as_array()
        .unwrap()
        .iter()
        .zip(want.as_array().unwrap())
    {
        for (g, w) in g.as_array().unwrap().iter().zip(w.as_array().unwrap()) {
            assert!((g.as_f64().unwrap() - w.as_f64().unwrap()).abs() <= 1e-5);
        }
    }
    let (code, out, _) = attend(&[
        "attention",
        "--model",
        dir.to_str().unwrap(),
        "--layer",
        "0",
        "--head",
        "0",
        text,
    ]);
    assert_eq!(code, 0);
    assert!(out.lines().nth(2).unwrap().starts_with("[CLS]"), "{out}");
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let dir = model_dir();
    let d = dir.to_str().unwrap();
    for (args, want) in [
        (vec!["attention", "--model", d, "--layer", "6", "--head", "0", "x"], "error: layer 6 is out of range: the model has 6 layers (0 to 5)"),
        (vec!["attention", "--model", d, "--layer", "0", "--head", "12", "x"], "error: head 12 is out of range: each layer has 12 heads (0 to 11)"),
        (vec!["embed", "--model", "/nonexistent/model", "x"], "error: /nonexistent/model: model directory not found (scripts/fetch-model fetches all-MiniLM-L6-v2)"),
    ] {
        let (code, out, err) = attend(&args);
        assert_eq!(code, 2, "{args:?}");
        assert!(out.is_empty());
        assert_eq!(err.trim_end(), want);
    }
}

#[test]
fn all_heads_feed_the_html_view() {
    let dir = model_dir();
    let (code, out, err) = attend(&[
        "attention",
        "--model",
        dir.to_str().unwrap(),
        "--all",
        "Hello world.",
    ]);
    assert_eq!(code, 0, "{err}");
    let doc: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["query_tokens"].as_array().unwrap().len(), 5);
    let layers = doc["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 6);
    assert_eq!(layers[0].as_array().unwrap().len(), 12);
    let tmp = std::env::temp_dir().join(format!("attend-all-heads-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let json = tmp.join("maps.json");
    std::fs::write(&json, &out).unwrap();
    let html = tmp.join("view.html");
    let (code, _, err) = attend(&[
        "view",
        "--input-json",
        json.to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(std::fs::read_to_string(&html).unwrap().contains("[CLS]"));
    std::fs::remove_dir_all(&tmp).ok();
    let (code, _, err) = attend(&["attention", "--model", dir.to_str().unwrap(), "x"]);
    assert_eq!(code, 2);
    assert!(err.contains("--layer"), "{err}");
}

#[test]
fn explain_walks_through_a_real_head_and_matches_transformers() {
    let dir = model_dir();
    let reference: Value = serde_json::from_str(include_str!(
        "../../attend/tests/data/minilm-reference.json"
    ))
    .unwrap();
    let case = &reference["attention"][0];
    let text = case["text"].as_str().unwrap();
    let d = dir.to_str().unwrap();
    let (code, out, err) = attend(&[
        "explain", "--model", d, "--layer", "4", "--head", "11", "--format", "json", text,
    ]);
    assert_eq!(code, 0, "{err}");
    let doc: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["tokens"], case["tokens"]);
    for key in ["x", "q", "k", "v", "scores", "scaled", "weights", "context"] {
        assert!(doc[key].is_array(), "explain --model JSON lacks {key}");
    }
    // transformers' eager attention for layer 4, head 11: within 1e-5.
    let want = &case["weights"][4][11];
    for (g, w) in doc["weights"]
        .as_array()
        .unwrap()
        .iter()
        .zip(want.as_array().unwrap())
    {
        for (g, w) in g.as_array().unwrap().iter().zip(w.as_array().unwrap()) {
            let (g, w) = (g.as_f64().unwrap(), w.as_f64().unwrap());
            assert!((g - w).abs() <= 1e-5, "weight {g} vs transformers {w}");
        }
    }
    let (code, out, err) = attend(&[
        "explain", "--model", d, "--layer", "4", "--head", "11", text,
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("Step 13. weights = softmax(scaled)") && out.contains("[CLS]"),
        "{out}"
    );

    for (args, want) in [
        (vec!["explain", "--model", d, "--layer", "0", "x"], "--head"),
        (
            vec!["explain", "--model", d, "--layer", "9", "--head", "0", "x"],
            "layer 9 is out of range",
        ),
        (
            vec!["explain", "--model", d, "--input", "[[1]]", "x"],
            "--input",
        ),
        (
            vec![
                "explain",
                "--model",
                "/nonexistent/model",
                "--layer",
                "0",
                "--head",
                "0",
                "x",
            ],
            "/nonexistent/model",
        ),
    ] {
        let (code, out, err) = attend(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(
            out.is_empty() && err.lines().count() == 1 && err.contains(want),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn view_draws_a_real_model_directly() {
    let dir = model_dir();
    let tmp = std::env::temp_dir().join(format!("attend-view-model-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let (html, png) = (tmp.join("view.html"), tmp.join("layer.png"));
    let (code, _, err) = attend(&[
        "view",
        "--model",
        dir.to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
        "--heatmap",
        png.to_str().unwrap(),
        "--layer",
        "5",
        "The cat sat on the mat.",
    ]);
    assert_eq!(code, 0, "{err}");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("[CLS]") && page.contains("mat"));
    assert!(std::fs::read(&png).unwrap().starts_with(b"\x89PNG"));
    std::fs::remove_dir_all(&tmp).ok();
}

/// A copy of the model directory in a scratch folder, with `config.json` and the
/// bytes of `model.safetensors` passed through `edit`.
fn edited_model(
    name: &str,
    config: impl Fn(String) -> String,
    weights: impl FnOnce(&mut Vec<u8>),
) -> PathBuf {
    let src = model_dir();
    let dir = std::env::temp_dir().join(format!(
        "attend-hostile-model-{name}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    for file in std::fs::read_dir(&src).unwrap() {
        let path = file.unwrap().path();
        let name = path.file_name().unwrap().to_owned();
        match name.to_str().unwrap() {
            "config.json" => {
                let text = std::fs::read_to_string(&path).unwrap();
                std::fs::write(dir.join(&name), config(text)).unwrap();
            }
            "model.safetensors" => {}
            _ if path.is_file() => {
                std::fs::copy(&path, dir.join(&name)).unwrap();
            }
            _ => {
                // 1_Pooling/: the sentence-transformers pooling config.
                std::fs::create_dir_all(dir.join(&name)).unwrap();
                for f in std::fs::read_dir(&path).unwrap() {
                    let f = f.unwrap().path();
                    std::fs::copy(&f, dir.join(&name).join(f.file_name().unwrap())).unwrap();
                }
            }
        }
    }
    let mut bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    weights(&mut bytes);
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
    dir
}

/// Hostile model files and flags (issue 13): one line naming the file and the
/// tensor or field, exit 2, and no picture left behind by a failed command.
#[test]
fn hostile_models_are_refused_by_name() {
    let dir = model_dir();
    let d = dir.to_str().unwrap();
    let tmp = std::env::temp_dir().join(format!("attend-hostile-pic-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let pic = tmp.join("h.svg");
    let (code, _, err) = attend(&[
        "attention",
        "--model",
        d,
        "--layer",
        "0",
        "--head",
        "12",
        "--heatmap",
        pic.to_str().unwrap(),
        "x",
    ]);
    assert_eq!(
        (code, err.trim_end()),
        (
            2,
            "error: head 12 is out of range: each layer has 12 heads (0 to 11)"
        )
    );
    assert_eq!(
        std::fs::read_dir(&tmp).unwrap().count(),
        0,
        "a failed command left a file"
    );
    std::fs::remove_dir_all(&tmp).unwrap();

    // A NaN in the first query weight of layer 0.
    let tensor = "encoder.layer.0.attention.self.query.weight";
    let nan = edited_model(
        "nan",
        |c| c,
        |bytes| {
            let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
            let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
            let entry = header
                .get(tensor)
                .or_else(|| header.get(format!("bert.{tensor}").as_str()))
                .unwrap();
            let begin = entry["data_offsets"][0].as_u64().unwrap() as usize;
            bytes[8 + n + begin..8 + n + begin + 4].copy_from_slice(&f32::NAN.to_le_bytes());
        },
    );
    let eps = edited_model("eps", |c| c.replace("1e-12", "1e300"), |_| {});
    let layers = edited_model(
        "layers",
        |c| {
            c.replace(
                "\"num_hidden_layers\": 6",
                "\"num_hidden_layers\": 1000000000",
            )
        },
        |_| {},
    );
    for (model, want) in [
        (&nan, vec!["model.safetensors", tensor, "NaN"]),
        (&eps, vec!["config.json", "layer_norm_eps"]),
        (&layers, vec!["model.safetensors", "encoder.layer.6."]),
    ] {
        let (code, out, err) = attend(&["embed", "--model", model.to_str().unwrap(), "x"]);
        assert_eq!(code, 2, "{err}");
        assert!(out.is_empty());
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        for w in want {
            assert!(err.contains(w), "{err:?} does not name {w:?}");
        }
        std::fs::remove_dir_all(model).unwrap();
    }
}

/// Rows of `{"embeddings": [[...], ...]}` or of `{"embedding": [...]}` lines.
fn vectors(text: &str) -> Vec<Vec<f64>> {
    let row = |v: &Value| -> Vec<f64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    match serde_json::from_str::<Value>(text) {
        Ok(doc) => doc["embeddings"]
            .as_array()
            .unwrap()
            .iter()
            .map(row)
            .collect(),
        Err(_) => text
            .lines()
            .map(|l| row(&serde_json::from_str::<Value>(l).unwrap()["embedding"]))
            .collect(),
    }
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

#[test]
fn embed_precision_bf16_is_within_cosine_0_999_of_f32_in_both_modes() {
    let dir = model_dir();
    let d = dir.to_str().unwrap();
    let texts = [
        "A cat sat on the mat.",
        "What is the capital of France?",
        "Dogs bark loudly at night.",
    ];
    let run = |precision: &str| {
        let mut args = vec![
            "embed",
            "--model",
            d,
            "--format",
            "json",
            "--precision",
            precision,
        ];
        args.extend(texts);
        let (code, out, err) = attend(&args);
        assert_eq!(code, 0, "{err}");
        vectors(&out)
    };
    let (f32_rows, bf16_rows) = (run("f32"), run("bf16"));
    let tmp = std::env::temp_dir().join(format!("attend-bf16-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let (input, output) = (tmp.join("corpus.txt"), tmp.join("out.jsonl"));
    std::fs::write(&input, texts.join("\n") + "\n").unwrap();
    let (code, _, err) = attend(&[
        "embed",
        "--model",
        d,
        "--precision",
        "bf16",
        "--input",
        input.to_str().unwrap(),
        "--output",
        output.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let corpus_rows = vectors(&std::fs::read_to_string(&output).unwrap());
    std::fs::remove_dir_all(&tmp).unwrap();
    assert_eq!(corpus_rows.len(), texts.len());
    for i in 0..texts.len() {
        for (what, rows) in [("sentences", &bf16_rows), ("--input", &corpus_rows)] {
            let c = cosine(&rows[i], &f32_rows[i]);
            assert!(c >= 0.999, "{what} text {i}: cosine {c}");
            // bf16 really ran: its rounding moves the vector by far more than f32's.
            assert!(c < 0.999_999_9, "{what} text {i}: cosine {c}");
        }
    }
}

/// `--precision bf16` says that it runs at f32's speed exactly where the
/// instruction set multiplies bf16 neither with its own products nor on AMX
/// tiles: AVX2 always, and this CPU's best level if it is such a one.
#[test]
fn the_bf16_note_appears_only_where_bf16_is_widened() {
    let dir = model_dir();
    let note = "note: --precision bf16 on";
    let run = |max_isa: Option<&str>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_attend"));
        command.args([
            "embed",
            "--model",
            dir.to_str().unwrap(),
            "--precision",
            "bf16",
            "a cat",
        ]);
        if let Some(isa) = max_isa {
            command.env("ATTEND_MAX_ISA", isa);
        }
        let out = command.output().unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stderr).unwrap()
    };
    let best = attend::kernels::Isa::detect();
    let widened = !best.has_bf16_products() && !best.has_bf16_tiles();
    assert_eq!(run(None).contains(note), widened, "{best}");
    if best != attend::kernels::Isa::Portable {
        let err = run(Some("avx2"));
        assert!(err.contains(&format!("{note} avx2")), "{err}");
    }
}

#[test]
fn a_bad_precision_is_refused_naming_the_flag() {
    let (code, out, err) = attend(&["embed", "--precision", "fp8", "x"]);
    assert_eq!(code, 2);
    assert!(out.is_empty());
    assert_eq!(
        err.trim_end(),
        "error: invalid value 'fp8' for '--precision <PRECISION>' [possible values: f32, bf16, int8]"
    );
}
