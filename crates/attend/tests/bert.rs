//! all-MiniLM-L6-v2 against PyTorch (sentence-transformers and transformers'
//! eager attention), from reference values made by scripts/golden/gen-bert-reference.py.
//!
//! The model is read from `$ATTEND_MODEL_DIR` or `~/.cache/attend/all-minilm-l6-v2`;
//! `scripts/fetch-model` puts it there. These tests fail (they do not skip) when it
//! is missing.
#![cfg(feature = "tokenizers")]

use std::path::PathBuf;
use std::sync::OnceLock;

use attend::models::{BertConfig, BertModel, SentenceEncoder};
use ndarray::{s, Array2, Array3, Array4};
use serde_json::Value;

mod model_support;

use model_support::{max_abs_diff, MINILM};

fn model_dir() -> PathBuf {
    MINILM.dir()
}

fn encoder() -> &'static SentenceEncoder {
    static ENC: OnceLock<SentenceEncoder> = OnceLock::new();
    ENC.get_or_init(|| MINILM.load())
}

fn reference() -> &'static Value {
    static REF: OnceLock<Value> = OnceLock::new();
    REF.get_or_init(|| {
        let text = include_str!("data/minilm-reference.json");
        serde_json::from_str(text).expect("reference JSON parses")
    })
}

fn floats(v: &Value) -> Vec<f32> {
    fn walk(v: &Value, out: &mut Vec<f32>) {
        match v {
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            x => out.push(x.as_f64().expect("a number") as f32),
        }
    }
    let mut out = Vec::new();
    walk(v, &mut out);
    out
}

fn texts(key: &str) -> Vec<String> {
    reference()[key]["texts"]
        .as_array()
        .unwrap_or_else(|| reference()[key].as_array().expect("list"))
        .iter()
        .map(|t| {
            t.as_str()
                .map(str::to_string)
                .unwrap_or_else(|| t["text"].as_str().unwrap().to_string())
        })
        .collect()
}

#[test]
fn tokens_match_the_hf_tokenizer() {
    let enc = encoder();
    let texts = texts("embed");
    for (text, want) in texts
        .iter()
        .zip(reference()["embed"]["tokenized"].as_array().unwrap())
    {
        let got = enc.tokenizer.encode(text).unwrap();
        let want_ids: Vec<u32> = want["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(got.ids, want_ids, "ids of {text:?}");
        let want_tokens: Vec<&str> = want["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap())
            .collect();
        assert_eq!(got.tokens, want_tokens, "tokens of {text:?}");
    }
}

#[test]
fn embeddings_match_sentence_transformers() {
    let enc = encoder();
    let texts = texts("embed");
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let out = enc.embed(&refs).unwrap();
    let want = Array2::from_shape_vec(
        out.vectors.dim(),
        floats(&reference()["embed"]["embeddings"]),
    )
    .unwrap();
    let worst = max_abs_diff(out.vectors.iter().copied(), want.iter().copied());
    eprintln!(
        "embeddings: max abs diff {worst:e} over {} texts",
        texts.len()
    );
    for (i, text) in texts.iter().enumerate() {
        let (g, w) = (out.vectors.row(i), want.row(i));
        let diff = max_abs_diff(g.iter().copied(), w.iter().copied());
        let cos = g.dot(&w) / (g.dot(&g).sqrt() * w.dot(&w).sqrt());
        assert!(diff <= 1e-5, "text {i} {text:?}: max abs diff {diff:e}");
        assert!(cos >= 0.99999, "text {i}: cosine {cos}");
    }
    // The empty text and the over-long one are both remarked on.
    assert_eq!(out.warnings.len(), 2, "{:?}", out.warnings);
    assert!(
        out.warnings[0].contains("text 5 is empty"),
        "{}",
        out.warnings[0]
    );
    assert!(
        out.warnings[1].starts_with("text 6 (")
            && out.warnings[1].contains("truncated to 256 tokens"),
        "{}",
        out.warnings[1]
    );
}

#[test]
fn every_attention_head_matches_transformers_eager() {
    let enc = encoder();
    for case in reference()["attention"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let trace = enc.trace(text).unwrap();
        let want_tokens: Vec<&str> = case["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap())
            .collect();
        assert_eq!(trace.tokens, want_tokens);
        let t = want_tokens.len();
        let (layers, heads) = (trace.layers(), trace.heads());
        assert_eq!((layers, heads), (6, 12));
        let want = Array4::from_shape_vec((layers, heads, t, t), floats(&case["weights"])).unwrap();
        let mut worst = 0.0f32;
        for l in 0..layers {
            for h in 0..heads {
                let got = trace.weights(l, h).unwrap();
                let diff = max_abs_diff(
                    got.iter().copied(),
                    want.slice(s![l, h, .., ..]).iter().copied(),
                );
                assert!(
                    diff <= 1e-5,
                    "{text:?} layer {l} head {h}: max abs diff {diff:e}"
                );
                worst = worst.max(diff);
            }
        }
        // The fast path (packed rows, `attention`) gives the same last hidden state.
        let want_h = Array2::from_shape_vec((t, 384), floats(&case["last_hidden_state"])).unwrap();
        let batch = enc.token_batch(&[text]).unwrap();
        let fast = enc.model.forward(&batch).unwrap();
        let traced = &trace.trace.hidden;
        let d_fast = max_abs_diff(fast.iter().copied(), want_h.iter().copied());
        let d_trace = max_abs_diff(traced.iter().copied(), want_h.iter().copied());
        assert!(
            d_fast <= 1e-4 && d_trace <= 1e-4,
            "{text:?}: hidden diff fast {d_fast:e}, traced {d_trace:e}"
        );
        eprintln!("{text:?}: worst attention diff {worst:e}, hidden diff {d_fast:e}");
    }
}

#[test]
fn head_trace_is_consistent() {
    let enc = encoder();
    let trace = enc.trace("Attention is all you need.").unwrap();
    let h = trace.head(3, 7).unwrap();
    let t = trace.tokens.len();
    assert_eq!(h.q.dim(), (t, 32));
    assert_eq!(h.weights.dim(), (t, t));
    // scaled = scores / √32 and rows of weights sum to one.
    let diff = max_abs_diff(
        h.scaled.iter().copied(),
        h.scores.iter().map(|x| x / 32f32.sqrt()),
    );
    assert!(diff < 1e-5);
    for row in h.weights.rows() {
        assert!((row.sum() - 1.0).abs() < 1e-5);
    }
    // q = input · W_qᵀ + b for head 7.
    let wq = &enc.model.layers[3].attention.q_proj;
    let q = wq.forward(h.input.view()).unwrap();
    let diff = max_abs_diff(
        q.slice(s![.., 7 * 32..8 * 32]).iter().copied(),
        h.q.iter().copied(),
    );
    assert!(diff < 1e-5);
    let err = trace.head(6, 0).unwrap_err().to_string();
    assert_eq!(
        err,
        "layer 6 is out of range: the model has 6 layers (0 to 5)"
    );
    let err = trace.head(0, 12).unwrap_err().to_string();
    assert_eq!(
        err,
        "head 12 is out of range: each layer has 12 heads (0 to 11)"
    );
}

#[test]
fn a_batch_with_padding_equals_one_by_one() {
    let enc = encoder();
    let texts = [
        "Short.",
        "A somewhat longer sentence with a few more words in it.",
        "",
        "Medium length text here, okay?",
    ];
    let batched = enc.embed(&texts).unwrap().vectors;
    for (i, text) in texts.iter().enumerate() {
        let alone = enc.embed(&[text]).unwrap().vectors;
        let diff = max_abs_diff(batched.row(i).iter().copied(), alone.row(0).iter().copied());
        assert!(diff <= 1e-6, "text {i}: {diff:e}");
    }
    // The traced (padded, reference) path agrees too, padding positions aside.
    let batch = enc.token_batch(&texts).unwrap();
    let traced = enc.model.trace(&batch).unwrap();
    for (i, text) in texts.iter().enumerate() {
        let one = enc.trace(text).unwrap();
        let n = batch.lengths[i];
        for l in 0..6 {
            let a = traced.attention[l]
                .attention
                .weights
                .slice(s![i, .., ..n, ..n])
                .to_owned();
            let b = one.trace.attention[l]
                .attention
                .weights
                .slice(s![0, .., .., ..])
                .to_owned();
            assert!(max_abs_diff(a.iter().copied(), b.iter().copied()) <= 1e-6);
            let masked = traced.attention[l]
                .attention
                .weights
                .slice(s![i, .., ..n, n..])
                .to_owned();
            assert!(
                masked.iter().all(|&w| w == 0.0),
                "padding keys get no weight"
            );
        }
        let fast: Array3<f32> = enc.model.forward(&batch).unwrap();
        let diff = max_abs_diff(
            fast.slice(s![i, ..n, ..]).iter().copied(),
            traced.hidden.slice(s![i, ..n, ..]).iter().copied(),
        );
        assert!(diff <= 1e-5, "{diff:e}");
    }
}

/// A scratch copy of the model directory whose files a test may spoil.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("attend-bert-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for f in ["config.json", "tokenizer.json"] {
            std::fs::copy(model_dir().join(f), dir.join(f)).unwrap();
        }
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

#[test]
fn missing_model_directory_is_a_clear_error() {
    let err = SentenceEncoder::load("/nonexistent/minilm")
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("/nonexistent/minilm: model directory not found"),
        "{err}"
    );
    let err = BertModel::load("/nonexistent/minilm")
        .unwrap_err()
        .to_string();
    assert!(err.contains("model directory not found"), "{err}");
}

#[test]
fn truncated_safetensors_is_a_clear_error() {
    encoder();
    let scratch = Scratch::new("truncated");
    let bytes = std::fs::read(model_dir().join("model.safetensors")).unwrap();
    std::fs::write(
        scratch.0.join("model.safetensors"),
        &bytes[..bytes.len() / 2],
    )
    .unwrap();
    let err = SentenceEncoder::load(&scratch.0).unwrap_err().to_string();
    assert!(
        err.contains("not a valid safetensors file") && err.contains("truncated"),
        "{err}"
    );
    assert!(!err.contains('\n'));
    std::fs::write(scratch.0.join("model.safetensors"), &bytes[..4]).unwrap();
    let err = SentenceEncoder::load(&scratch.0).unwrap_err().to_string();
    assert!(
        err.contains("fewer than the 8 of the header length"),
        "{err}"
    );
}

#[test]
fn bad_configs_are_clear_errors() {
    encoder();
    let scratch = Scratch::new("config");
    let config = std::fs::read_to_string(model_dir().join("config.json")).unwrap();
    std::fs::hard_link(
        model_dir().join("model.safetensors"),
        scratch.0.join("model.safetensors"),
    )
    .or_else(|_| {
        std::fs::copy(
            model_dir().join("model.safetensors"),
            scratch.0.join("model.safetensors"),
        )
        .map(|_| ())
    })
    .unwrap();
    let path = scratch.0.join("config.json");
    std::fs::write(&path, config.replace("\"gelu\"", "\"quick_gelu\"")).unwrap();
    let err = SentenceEncoder::load(&scratch.0).unwrap_err().to_string();
    assert!(err.ends_with("config.json: hidden_act \"quick_gelu\" is not supported (supported: gelu, gelu_new, gelu_pytorch_tanh, relu, silu, swish)"), "{err}");
    std::fs::write(&path, config.replace("\"num_hidden_layers\": 6,", "")).unwrap();
    let err = SentenceEncoder::load(&scratch.0).unwrap_err().to_string();
    assert!(
        err.ends_with("config.json: missing field \"num_hidden_layers\""),
        "{err}"
    );
    // A config that disagrees with the weights names the tensor.
    std::fs::write(
        &path,
        config.replace("\"intermediate_size\": 1536", "\"intermediate_size\": 1000"),
    )
    .unwrap();
    let err = SentenceEncoder::load(&scratch.0).unwrap_err().to_string();
    assert!(
        err.contains("intermediate.dense.weight has shape [1536, 384], expected [1000, 384]"),
        "{err}"
    );
    let c = BertConfig::from_file(model_dir().join("config.json")).unwrap();
    assert_eq!(c.num_hidden_layers, 6);
}

#[test]
fn empty_and_overlong_texts_warn_and_work() {
    let enc = encoder();
    let out = enc.embed(&[""]).unwrap();
    assert_eq!(out.vectors.dim(), (1, 384));
    assert!((out.vectors.row(0).dot(&out.vectors.row(0)) - 1.0).abs() < 1e-5);
    assert_eq!(out.warnings.len(), 1);
    let long = "word ".repeat(1000);
    let out = enc.embed(&[&long]).unwrap();
    assert_eq!(out.warnings, [format!("text 0 (\"{}…\") has 1002 tokens, more than the maximum of 256: truncated to 256 tokens", &long[..40])]);
    let trace = enc.trace(&long).unwrap();
    assert_eq!(trace.tokens.len(), 256);
    assert_eq!(trace.tokens.last().unwrap(), "[SEP]");
    assert!(enc.embed(&[]).unwrap().vectors.is_empty());
}

#[test]
fn same_bits_whatever_the_thread_count() {
    let enc = encoder();
    let texts = [
        "A first sentence about cats.",
        "Second one, longer than the first, about dogs and rivers.",
        "Third.",
    ];
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| enc.embed(&texts).unwrap().vectors)
    };
    let one = run(1);
    assert_eq!(run(2), one);
}
