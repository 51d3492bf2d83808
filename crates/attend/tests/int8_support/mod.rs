//! The int8 encoders' accuracy check, shared by `int8_encoders.rs` (the best
//! instruction set of the CPU) and `int8_encoders_avx2.rs` (capped at AVX2, whose
//! weights are quantized to ±63 instead of ±127: docs/int8.md).

use attend::attention::Precision;
use attend::models::SentenceEncoder;

use crate::model_support::RealModel;

/// Texts of several lengths and kinds: an instruction, a number-heavy line, a
/// list, a long sentence, a fragment, a question, non-English words.
const TEXTS: [&str; 8] = [
    "Preheat the oven to 220 degrees and roast the peppers until their skins blister.",
    "Invoice 4471 was paid on 3 March, 12 days late, with a 1.5% penalty.",
    "apples, pears, quinces, medlars",
    "Although the committee had argued for months about the bridge's colour, nobody had checked whether the river was navigable at all.",
    "left at the second roundabout",
    "Why does the moon look larger near the horizon?",
    "Der Zug nach München fährt um halb acht.",
    "The defendant's lawyer objected, and the judge sustained the objection.",
];

fn cosine(a: ndarray::ArrayView1<'_, f32>, b: ndarray::ArrayView1<'_, f32>) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let norm =
        |v: ndarray::ArrayView1<'_, f32>| v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

/// Holds `model` in int8 to issue 49's cosines of its f32 embeddings on [`TEXTS`],
/// and to the same bits on one thread as on the pool's.
pub fn int8_against_f32(model: &RealModel) {
    let f32_encoder = model.load();
    let int8_encoder =
        SentenceEncoder::load_with(model.dir(), Precision::Int8).expect("the model loads in int8");
    assert_eq!(int8_encoder.model.precision, Precision::Int8);
    let want = f32_encoder.embed(&TEXTS).unwrap().vectors;
    let got = int8_encoder.embed(&TEXTS).unwrap().vectors;
    let cosines: Vec<f64> = (0..TEXTS.len())
        .map(|i| cosine(got.row(i), want.row(i)))
        .collect();
    let mean = cosines.iter().sum::<f64>() / cosines.len() as f64;
    let worst = cosines.iter().copied().fold(1.0, f64::min);
    eprintln!(
        "{}: cosine int8 vs f32: worst {worst:.5}, mean {mean:.5}",
        model.cache_name
    );
    for (text, c) in TEXTS.iter().zip(&cosines) {
        assert!(*c >= 0.99, "{}: {text:?}: cosine {c}", model.cache_name);
    }
    assert!(mean >= 0.998, "{}: mean cosine {mean}", model.cache_name);
    // The int8 path really ran: 8-bit inputs and weights move the embeddings far
    // more than f32 rounding would (about 1e-7).
    assert!(
        worst < 0.99999,
        "{}: cosine {worst}: int8 not used?",
        model.cache_name
    );
    // The same bits whatever the thread count: the i32 sums are exact.
    let one_thread = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap()
        .install(|| int8_encoder.embed(&TEXTS).unwrap().vectors);
    assert_eq!(one_thread, got);
}
