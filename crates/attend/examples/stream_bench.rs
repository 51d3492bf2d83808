//! One short text through the encoder against the machine's read bandwidth: a
//! query embedded alone is bound by streaming the dense layers' weights, so its
//! forward is compared with reading a buffer of the same bytes on the same
//! threads, measured in the same run; `scripts/bench/stream` runs it.
//!
//! ```text
//! cargo run --release -p attend --example stream_bench -- MODEL_DIR [REPS]
//! ```
//!
//! Prints one JSON object per precision: the bytes of weights one forward reads,
//! the median forward time (tokens already made), the median time to read as many
//! bytes, both as GB/s, and the forward's share of the read bandwidth.

use attend::memory::LargePageArray;
use attend::models::SentenceEncoder;
use attend::problem::Precision;
use rayon::prelude::*;

use attend::timing::median_seconds;

/// Median seconds of `reps` calls of `f`.
fn time(reps: usize, mut f: impl FnMut()) -> f64 {
    let timed = median_seconds(reps, 0.0, || {
        f();
        Ok::<(), std::convert::Infallible>(())
    });
    timed.unwrap_or_else(|never| match never {})
}

/// The sum of `data`, read by the pool's threads in blocks (16 lanes each, so
/// that the compiler vectorises it): the read stream the bandwidth is measured on.
fn read_all(data: &[f32]) -> f32 {
    data.par_chunks(1 << 16)
        .map(|block| {
            let mut lanes = [0.0f32; 16];
            for c in block.chunks_exact(16) {
                for (l, v) in lanes.iter_mut().zip(c) {
                    *l += v;
                }
            }
            lanes.iter().sum::<f32>()
        })
        .sum()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // As the attend command runs the encoders.
    attend::memory::keep_freed_memory();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dir) = args.first() else {
        return Err("usage: stream_bench MODEL_DIR [REPS]".into());
    };
    let reps: usize = match args.get(1) {
        Some(r) => r.parse()?,
        None => 200,
    };
    for precision in [Precision::F32, Precision::Bf16, Precision::Int8] {
        let encoder = SentenceEncoder::load_with(dir, precision)?;
        let batch = encoder.token_batch(&["A short query."])?;
        let element = match precision {
            Precision::F32 => 4,
            Precision::Bf16 => 2,
            Precision::Int8 => 1,
        };
        // The products of one forward read each packed weight once.
        let bytes: usize = encoder
            .model
            .layers
            .iter()
            .flat_map(|l| {
                let out = l.attention.out_proj.as_ref().expect("encoders project");
                [&l.qkv, out, &l.intermediate, &l.output]
            })
            .map(|l| l.in_features() * l.out_features() * element)
            .sum();
        let forward = rayon::scope(|_| {
            time(reps, || {
                std::hint::black_box(encoder.model.forward(&batch).expect("a valid batch"));
            })
        });
        // On huge pages as the packed weights are, so that both streams read the
        // same kind of pages.
        let buffer = LargePageArray::from_fn(bytes / 4, |i| (i % 7) as f32);
        let read = rayon::scope(|_| {
            time(reps, || {
                std::hint::black_box(read_all(&buffer));
            })
        });
        let gbs = |s: f64| bytes as f64 / s / 1e9;
        println!(
            "{{\"precision\": \"{precision:?}\", \"threads\": {}, \"tokens\": {}, \"weight_mb\": {:.1}, \"forward_ms\": {:.3}, \"read_ms\": {:.3}, \"forward_gbs\": {:.1}, \"read_gbs\": {:.1}, \"share\": {:.2}}}",
            rayon::current_num_threads(),
            batch.lengths.iter().sum::<usize>(),
            bytes as f64 / 1e6,
            forward * 1e3,
            read * 1e3,
            gbs(forward),
            gbs(read),
            read / forward
        );
    }
    Ok(())
}
