//! Times start-up: loading a sentence-transformers checkpoint (weights read,
//! checked and packed for this CPU; tokenizer parsed) and the first embedding of
//! a short text after it; `scripts/bench/startup` runs it.
//!
//! ```text
//! cargo run --release -p attend --example startup_bench -- MODEL_DIR [ROUNDS]
//! ```
//!
//! Prints one JSON object per precision: the median load and first-embedding
//! times in milliseconds over the rounds.

use std::time::Instant;

use attend::models::SentenceEncoder;
use attend::problem::Precision;

use attend::timing::median;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dir) = args.first() else {
        return Err("usage: startup_bench MODEL_DIR [ROUNDS]".into());
    };
    let rounds: usize = match args.get(1) {
        Some(r) => r.parse()?,
        None => 9,
    };
    for precision in [Precision::F32, Precision::Bf16] {
        let (mut load, mut first) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            let t = Instant::now();
            let encoder = SentenceEncoder::load_with(dir, precision)?;
            let loaded = t.elapsed();
            std::hint::black_box(encoder.embed(&["A short query."])?);
            load.push(loaded.as_secs_f64() * 1e3);
            first.push((t.elapsed() - loaded).as_secs_f64() * 1e3);
        }
        println!(
            "{{\"precision\": \"{precision:?}\", \"threads\": {}, \"load_ms\": {:.1}, \"first_embed_ms\": {:.2}}}",
            rayon::current_num_threads(),
            median(load),
            median(first)
        );
    }
    Ok(())
}
