//! all-MiniLM-L6-v2 and all-mpnet-base-v2 with their dense layers in bf16
//! (`SentenceEncoder::load_with(dir, Precision::Bf16)`) against the same models in
//! f32: the bar is a cosine similarity of at least 0.999 between the two
//! embeddings of every sentence. The models come from `tests/model_support`; these
//! tests fail (they do not skip) when a model is missing.
#![cfg(feature = "tokenizers")]

use attend::attention::Precision;
use attend::models::SentenceEncoder;

mod model_support;

use model_support::{RealModel, MINILM, MPNET};

/// A fixed set of sentences: short and long, punctuation, numbers, a question,
/// words outside the vocabulary.
const SENTENCES: [&str; 8] = [
    "A cat sat on the mat.",
    "Dogs bark.",
    "The animal didn't cross the street because it was too tired.",
    "What is the capital of France?",
    "In 1969, Apollo 11 landed on the Moon and two astronauts walked on its surface for about 2.5 hours.",
    "Quantum chromodynamics describes the strong interaction between quarks and gluons.",
    "zxqv blorptastic frumious bandersnatch",
    "I love this restaurant; the food is great, the service slow, and the prices fair.",
];

fn cosine(a: ndarray::ArrayView1<'_, f32>, b: ndarray::ArrayView1<'_, f32>) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let norm =
        |v: ndarray::ArrayView1<'_, f32>| v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

fn bf16_against_f32(model: &RealModel) {
    let f32_encoder = model.load();
    let bf16_encoder =
        SentenceEncoder::load_with(model.dir(), Precision::Bf16).expect("the model loads in bf16");
    assert_eq!(bf16_encoder.model.precision, Precision::Bf16);
    let want = f32_encoder.embed(&SENTENCES).unwrap().vectors;
    let got = bf16_encoder.embed(&SENTENCES).unwrap().vectors;
    let mut worst = 1.0f64;
    for (i, text) in SENTENCES.iter().enumerate() {
        let c = cosine(got.row(i), want.row(i));
        assert!(c >= 0.999, "{}: {text:?}: cosine {c}", model.cache_name);
        worst = worst.min(c);
    }
    // The bf16 path really ran: rounding the weights and inputs to 8 significant
    // bits moves the embeddings far more than f32 rounding would (about 1e-7).
    assert!(
        worst < 0.999_999,
        "{}: cosine {worst}: bf16 not used?",
        model.cache_name
    );
    eprintln!("{}: worst cosine bf16 vs f32 {worst:.6}", model.cache_name);

    // The same bits whatever the thread count. (Not whatever the batch: the
    // attention of a padded batch differs from a lone sentence's in the last f32
    // bits, and rounding the next layer's input to bf16 can turn such a
    // difference into one of a bf16 ulp; the dense products alone are
    // batch-invariant, nn::matmul's tests.)
    let one_thread = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap()
        .install(|| bf16_encoder.embed(&SENTENCES).unwrap().vectors);
    assert_eq!(one_thread, got);
}

#[test]
fn minilm_in_bf16_is_within_cosine_0_999_of_f32() {
    bf16_against_f32(&MINILM);
}

#[test]
fn mpnet_in_bf16_is_within_cosine_0_999_of_f32() {
    bf16_against_f32(&MPNET);
}

#[test]
fn bf16_dense_layers_take_at_most_half_the_f32_layers_bytes() {
    let dir = MINILM.dir();
    let f32_model = attend::models::BertModel::load_with(&dir, Precision::F32).unwrap();
    let bf16_model = attend::models::BertModel::load_with(&dir, Precision::Bf16).unwrap();
    let bytes = |m: &attend::models::BertModel| -> usize {
        m.layers
            .iter()
            .map(|l| {
                let a = &l.attention;
                [
                    &a.q_proj,
                    &a.k_proj,
                    &a.v_proj,
                    a.out_proj.as_ref().unwrap(),
                    &l.intermediate,
                    &l.output,
                ]
                .iter()
                .map(|x| x.bytes())
                .sum::<usize>()
            })
            .sum()
    };
    let (f, b) = (bytes(&f32_model), bytes(&bf16_model));
    eprintln!("dense layers: f32 {f} bytes, bf16 {b} bytes");
    // bf16: 2 bytes a weight (+ f32 biases); f32: 4 bytes a weight, and on
    // AVX2 as many again for the packed copy.
    assert!(b * 2 <= f + f / 50, "bf16 {b} bytes against f32 {f}");
}
