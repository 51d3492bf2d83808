//! all-mpnet-base-v2 without Python: the checkpoint loads as MPNet, the fused path
//! (its relative-position bias broadcast over a padded batch) agrees with the traced
//! reference path and with each text alone, and the bias is where the traced scores
//! say. Parity with sentence-transformers and transformers is checked in
//! crates/attend-py/tests/test_families.py.
//!
//! The model is read from `$ATTEND_MPNET_DIR` or `~/.cache/attend/all-mpnet-base-v2`;
//! `scripts/fetch-model mpnet` puts it there. These tests fail (they do not skip)
//! when it is missing.
#![cfg(feature = "tokenizers")]

use std::sync::OnceLock;

use attend::models::{Family, SentenceEncoder};
use ndarray::s;

mod model_support;

use model_support::{max_abs_diff, MPNET};

fn encoder() -> &'static SentenceEncoder {
    static ENC: OnceLock<SentenceEncoder> = OnceLock::new();
    ENC.get_or_init(|| MPNET.load())
}

const TEXTS: [&str; 4] = [
    "Short.",
    "A somewhat longer sentence with a few more words in it, to pad the others.",
    "",
    "Medium length text here, okay?",
];

#[test]
fn loads_as_mpnet_with_its_modules() {
    let enc = encoder();
    let c = &enc.model.config;
    assert_eq!(c.family, Family::MpNet);
    assert_eq!((c.num_hidden_layers, c.num_attention_heads), (12, 12));
    assert!(enc.model.embeddings.token_type.is_none());
    assert_eq!(
        enc.model.relative_attention_bias.as_ref().map(|t| t.dim()),
        Some((32, 12))
    );
    // sentence_bert_config.json's 384, mean pooling, then Normalize.
    assert_eq!(enc.tokenizer.max_len(), 384);
    assert_eq!(enc.dimension(), 768);
    assert!(enc.normalizes());
    let trace = enc.trace("Hello world.").unwrap();
    assert_eq!(trace.tokens.first().map(String::as_str), Some("<s>"));
    assert_eq!(trace.tokens.last().map(String::as_str), Some("</s>"));
}

#[test]
fn a_padded_batch_equals_each_text_alone() {
    let enc = encoder();
    let batched = enc.embed(&TEXTS).unwrap();
    assert_eq!(batched.warnings.len(), 1, "{:?}", batched.warnings);
    assert!(batched.warnings[0].contains("encoded as <s> </s> alone"));
    for (i, text) in TEXTS.iter().enumerate() {
        let alone = enc.embed(&[text]).unwrap().vectors;
        let diff = max_abs_diff(
            batched.vectors.row(i).iter().copied(),
            alone.row(0).iter().copied(),
        );
        // Unit vectors; float32 reassociation in the matrix products only.
        assert!(diff <= 1e-6, "text {i}: {diff:e}");
    }
}

#[test]
fn the_fused_path_equals_the_traced_path() {
    let enc = encoder();
    let batch = enc.token_batch(&TEXTS).unwrap();
    let fast = enc.model.forward(&batch).unwrap();
    let traced = enc.model.trace(&batch).unwrap();
    for (i, &n) in batch.lengths.iter().enumerate() {
        let a = fast.slice(s![i, ..n, ..]);
        let b = traced.hidden.slice(s![i, ..n, ..]);
        let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let diff = max_abs_diff(a.iter().copied(), b.iter().copied());
        // Two f32 paths through 12 layers; hidden states reach ~|10|.
        assert!(
            diff <= 1e-5 * scale.max(1.0),
            "text {i}: {diff:e} (max {scale})"
        );
    }
}

#[test]
fn every_layer_adds_the_same_position_bias() {
    let enc = encoder();
    let trace = enc
        .trace("The animal didn't cross the street because it was too tired.")
        .unwrap();
    let table = enc.model.relative_attention_bias.as_ref().unwrap();
    let t = trace.tokens.len();
    for layer in [0, 5, 11] {
        let head = trace.head(layer, 4).unwrap();
        let bias = head.position_bias.expect("MPNet heads carry their bias");
        // Keys right after and right before a query: buckets 17 and 1.
        assert_eq!(bias[[0, 1]], table[[17, 4]]);
        assert_eq!(bias[[1, 0]], table[[1, 4]]);
        assert_eq!(bias[[3, 3]], table[[0, 4]]);
        let want = head.scores.mapv(|x| x / 8.0) + &bias;
        let diff = max_abs_diff(head.scaled.iter().copied(), want.iter().copied());
        assert!(diff <= 1e-5, "layer {layer}: {diff:e}");
        assert_eq!(head.weights.dim(), (t, t));
    }
}

#[test]
fn same_bits_whatever_the_thread_count() {
    let enc = encoder();
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| enc.embed(&TEXTS).unwrap().vectors)
    };
    let one = run(1);
    assert_eq!(run(2), one);
}
