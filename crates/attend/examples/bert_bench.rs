//! Times all-MiniLM-L6-v2 on given texts; `scripts/bench/bert` runs it next to
//! PyTorch in the same run and prints the ratios.
//!
//! ```text
//! cargo run --release -p attend --example bert_bench -- MODEL_DIR TEXTS.json REPS
//! ```
//!
//! `TEXTS.json` is a JSON list of strings, embedded as one batch. Prints one JSON
//! object: medians in milliseconds of the whole `embed` (tokenise, forward, pool) and
//! of the forward pass alone, and the forward's median breakdown.

use std::time::{Duration, Instant};

use attend::models::{SentenceEncoder, Timings};

use attend::timing::median;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // As the attend command runs the encoders.
    attend::memory::keep_freed_memory();
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        return Err("usage: bert_bench MODEL_DIR TEXTS.json REPS".into());
    }
    let enc = SentenceEncoder::load(&args[1])?;
    let texts: Vec<String> = serde_json::from_str(&std::fs::read_to_string(&args[2])?)?;
    let reps: usize = args[3].parse()?;
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    for _ in 0..3 {
        enc.embed(&refs)?;
    }
    let (mut total, mut forward, mut tokenize) = (Vec::new(), Vec::new(), Vec::new());
    let mut parts: Vec<Timings> = Vec::new();
    let mut tokens = 0;
    for _ in 0..reps {
        let t0 = Instant::now();
        let batch = enc.token_batch(&refs)?;
        let t1 = Instant::now();
        let mut timings = Timings::default();
        let hidden = enc.model.forward_timed(&batch, &mut timings)?;
        let t2 = Instant::now();
        let v = enc.pool(hidden.view(), &batch.lengths)?;
        let t3 = Instant::now();
        std::hint::black_box(v);
        tokens = batch.lengths.iter().sum::<usize>();
        tokenize.push(ms(t1 - t0));
        forward.push(ms(t2 - t1));
        total.push(ms(t3 - t0));
        parts.push(timings);
    }
    let part = |f: fn(&Timings) -> Duration| median(parts.iter().map(|t| ms(f(t))));
    let out = serde_json::json!({
        "threads": rayon::current_num_threads(),
        "texts": texts.len(),
        "tokens": tokens,
        "embed_ms": median(total),
        "tokenize_ms": median(tokenize),
        "forward_ms": median(forward),
        "breakdown_ms": {
            "matmul": part(|t| t.matmul),
            "attention": part(|t| t.attention),
            "other": part(|t| t.other),
        },
    });
    println!("{out}");
    Ok(())
}
