//! Times the encoders' dense layers alone: an inference `Linear` (weights packed at
//! load) on the shapes of all-MiniLM-L6-v2 and all-mpnet-base-v2, f32, bf16 and
//! int8 (narrowed: weights of ±63 on a CPU without VNNI, as the encoders' attention
//! output and feed-forward up projection), for several token counts;
//! `scripts/bench/dense` runs it beside the CPU's peaks and prints each product's
//! share of them.
//!
//! ```text
//! cargo run --release -p attend --example dense_bench -- [REPS] [f32|bf16|int8]
//! ```
//!
//! Prints one JSON object per line: precision, `m`, `k`, `n`, the median time in
//! microseconds and GFLOP/s (`2·m·k·n` per product).

use std::time::Instant;

use attend::nn::Linear;
use attend::problem::Precision;
use ndarray::Array2;

use attend::timing::median;

/// `(k, n)` of every product in one layer of each model: attention's Q/K/V (one
/// product of three times the width), its output, the feed-forward up and down.
const SHAPES: [(usize, usize); 8] = [
    (384, 1152),
    (384, 384),
    (384, 1536),
    (1536, 384),
    (768, 2304),
    (768, 768),
    (768, 3072),
    (3072, 768),
];

/// Token counts: one short text, a sentence, a batch of short ones, a long batch.
const ROWS: [usize; 5] = [8, 64, 256, 1024, 4096];

/// A deterministic matrix of numbers in [-1, 1).
fn filled(rows: usize, cols: usize, seed: usize) -> Array2<f32> {
    Array2::from_shape_fn((rows, cols), |(i, j)| {
        ((i * 131 + j * 31 + seed * 17) % 97) as f32 / 48.5 - 1.0
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let reps: usize = match args.first() {
        Some(r) => r.parse()?,
        None => 15,
    };
    let precisions = match args.get(1) {
        None => Precision::ALL.to_vec(),
        Some(name) => vec![Precision::from_name(name)?],
    };
    for precision in precisions {
        for &(k, n) in &SHAPES {
            let layer = Linear::new(filled(n, k, 1), Some(filled(1, n, 2).row(0).to_owned()))?;
            // int8 narrowed as the encoders' attention output and feed-forward up
            // projection are: the same layer where the CPU has VNNI, weights of
            // ±63 and `vpmaddubsw` where it has not (docs/int8.md).
            let layer = match precision {
                Precision::Int8 => layer.for_inference_int8_narrowed(0),
                other => layer.for_inference_with(other),
            };
            for &m in &ROWS {
                let x = filled(m, k, 3);
                let flops = 2.0 * (m * k * n) as f64;
                // About 0.2 s of work per measurement, at least `reps` calls.
                let calls = ((2e10 / flops) as usize).clamp(1, 200);
                layer.forward(x.view())?;
                let times: Vec<f64> = (0..reps)
                    .map(|_| {
                        let t = Instant::now();
                        for _ in 0..calls {
                            std::hint::black_box(layer.forward(x.view()).expect("shapes fit"));
                        }
                        t.elapsed().as_secs_f64() / calls as f64
                    })
                    .collect();
                let t = median(times);
                println!(
                    "{{\"precision\": \"{precision:?}\", \"m\": {m}, \"k\": {k}, \"n\": {n}, \"us\": {:.1}, \"gflops\": {:.1}}}",
                    t * 1e6,
                    flops / t / 1e9
                );
            }
        }
    }
    Ok(())
}
