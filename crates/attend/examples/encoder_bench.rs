//! Times the encoder alone (no tokenising, no pooling) on given token ids;
//! `scripts/bench/ort` runs it next to ONNX Runtime on the same ids and prints the
//! ratios.
//!
//! ```text
//! cargo run --release -p attend --example encoder_bench -- MODEL_DIR IDS.json REPS [OUT.npy]
//! ```
//!
//! `ATTEND_PRECISION=bf16` (or `int8`) loads the dense layers in that precision
//! instead of f32, as `attend embed --precision` does.
//!
//! `IDS.json` is `{"ids": [[...], ...], "lengths": [...]}`: a right-padded batch of
//! token ids (token type 0) and each sequence's real length. Prints one JSON object:
//! the median forward time in milliseconds and its median breakdown. With `OUT.npy`,
//! also writes the last hidden state `[B, T, d]` (padding positions are zero) for
//! the script to compare with transformers and ONNX Runtime.
//!
//! The calling thread is one of the thread pool's `RAYON_NUM_THREADS` threads.

use std::time::{Duration, Instant};

use attend::attention::Precision;
use attend::models::{SentenceEncoder, Timings, TokenBatch};
use ndarray::Array2;

use attend::timing::median;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[derive(serde::Deserialize)]
struct Ids {
    ids: Vec<Vec<u32>>,
    lengths: Vec<usize>,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // As the attend command runs the encoders.
    attend::memory::keep_freed_memory();
    let args: Vec<String> = std::env::args().collect();
    if !(4..=5).contains(&args.len()) {
        return Err("usage: encoder_bench MODEL_DIR IDS.json REPS [OUT.npy]".into());
    }
    // The main thread is one of the pool's threads (RAYON_NUM_THREADS in all), as
    // ONNX Runtime's caller is one of its intra-op threads: no hand-over per call.
    rayon::ThreadPoolBuilder::new()
        .use_current_thread()
        .build_global()?;
    let precision = match std::env::var("ATTEND_PRECISION") {
        Ok(name) => Precision::from_name(&name)?,
        Err(_) => Precision::F32,
    };
    let model = SentenceEncoder::load_with(&args[1], precision)?.model;
    let given: Ids = serde_json::from_str(&std::fs::read_to_string(&args[2])?)?;
    let reps: usize = args[3].parse()?;
    let t = given.ids.first().map_or(0, Vec::len);
    if given.ids.iter().any(|row| row.len() != t) || given.lengths.len() != given.ids.len() {
        return Err(format!(
            "{}: ids must be a rectangular [B, T] list with B lengths",
            args[2]
        )
        .into());
    }
    let flat: Vec<u32> = given.ids.concat();
    let ids = Array2::from_shape_vec((given.ids.len(), t), flat)?;
    let batch = TokenBatch {
        type_ids: Array2::zeros(ids.dim()),
        ids,
        lengths: given.lengths,
    };
    let hidden = model.forward(&batch)?;
    if let Some(out) = args.get(4) {
        attend::io::npy::write_f32(out, hidden.view().into_dyn())?;
    }
    for _ in 0..2 {
        std::hint::black_box(model.forward(&batch)?);
    }
    let mut forward = Vec::with_capacity(reps);
    let mut parts: Vec<Timings> = Vec::with_capacity(reps);
    for _ in 0..reps {
        let mut timings = Timings::default();
        let t0 = Instant::now();
        std::hint::black_box(model.forward_timed(&batch, &mut timings)?);
        forward.push(ms(t0.elapsed()));
        parts.push(timings);
    }
    let part = |f: fn(&Timings) -> Duration| median(parts.iter().map(|t| ms(f(t))));
    let out = serde_json::json!({
        "threads": rayon::current_num_threads(),
        "precision": precision.name(),
        "tokens": batch.lengths.iter().sum::<usize>(),
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
