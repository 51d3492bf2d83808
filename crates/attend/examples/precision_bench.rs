//! Times a sentence encoder in one precision on a fixed batch of 32 sentences
//! (tokenise, encode, pool) and measures the memory its loading took;
//! `scripts/bench/precision` runs it for f32 and bf16 in alternating processes and
//! prints the ratios.
//!
//! ```text
//! cargo run --release -p attend --example precision_bench -- MODEL_DIR f32|bf16|int8 REPS
//! ```
//!
//! Prints one JSON object: the instruction set the kernels ran on, the resident
//! memory the load added (`VmRSS` after minus before, MiB), and the median times
//! (ms) of the whole `embed` and of the encoder's matrix products and attention.

use std::time::{Duration, Instant};

use attend::attention::Precision;
use attend::kernels::Isa;
use attend::models::{SentenceEncoder, Timings};

use attend::timing::median;

/// A fixed batch of 32 sentences of 4 to 35 words.
fn sentences() -> Vec<String> {
    const WORDS: [&str; 24] = [
        "the", "cat", "sat", "on", "a", "mat", "while", "rain", "fell", "over", "quiet", "city",
        "streets", "and", "people", "walked", "home", "after", "long", "days", "of", "work",
        "music", "played",
    ];
    (0..32)
        .map(|i| {
            let len = 4 + (i * 7) % 32;
            let words: Vec<&str> = (0..len)
                .map(|j| WORDS[(i * 5 + j * 11) % WORDS.len()])
                .collect();
            words.join(" ") + "."
        })
        .collect()
}

/// The process's resident memory (`VmRSS`), in MiB.
fn rss_mib() -> Result<f64, Box<dyn std::error::Error>> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .ok_or("no VmRSS in /proc/self/status")?;
    let kib: f64 = line
        .split_whitespace()
        .nth(1)
        .ok_or("VmRSS without a value")?
        .parse()?;
    Ok(kib / 1024.0)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // As the attend command runs the encoders.
    attend::memory::keep_freed_memory();
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        return Err("usage: precision_bench MODEL_DIR f32|bf16|int8 REPS".into());
    }
    let precision = match args[2].as_str() {
        "f32" => Precision::F32,
        "bf16" => Precision::Bf16,
        "int8" => Precision::Int8,
        other => return Err(format!("precision {other:?}: expected f32, bf16 or int8").into()),
    };
    let reps: usize = args[3].parse()?;
    let before = rss_mib()?;
    let encoder = SentenceEncoder::load_with(&args[1], precision)?;
    let loaded = rss_mib()? - before;
    let texts = sentences();
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    let batch = encoder.token_batch(&texts)?;
    for _ in 0..2 {
        std::hint::black_box(encoder.embed(&texts)?);
    }
    let (mut embed, mut matmul, mut attention) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..reps {
        let t0 = Instant::now();
        std::hint::black_box(encoder.embed(&texts)?);
        embed.push(ms(t0.elapsed()));
        let mut timings = Timings::default();
        std::hint::black_box(encoder.model.forward_timed(&batch, &mut timings)?);
        matmul.push(ms(timings.matmul));
        attention.push(ms(timings.attention));
    }
    let out = serde_json::json!({
        "precision": args[2],
        "isa": Isa::detect().name(),
        "threads": rayon::current_num_threads(),
        "tokens": batch.lengths.iter().sum::<usize>(),
        "load_rss_mib": loaded,
        "embed_ms": median(embed),
        "matmul_ms": median(matmul),
        "attention_ms": median(attention),
    });
    println!("{out}");
    Ok(())
}
