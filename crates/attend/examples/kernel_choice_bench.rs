//! Times the decode kernel against the fused kernel on few queries, the choice
//! `Kernel::Auto` makes (`attention::auto_decodes`): f32 and bf16, heads of 32
//! and 64, 1 to 16 queries against 16 to 4,096 keys, on a pool of
//! `RAYON_NUM_THREADS` threads (default 2).
//!
//! ```text
//! cargo run --release -p attend --example kernel_choice_bench
//! ```
//!
//! Prints one JSON object per line: the shape, each kernel's median time in
//! microseconds, and which one `Kernel::Auto` picks.

use attend::attention::{attention_with, auto_decodes, AttentionOptions, Config, Kernel};
use attend::element::{bf16, Dtype, Element};
use ndarray::Array4;
use std::time::Instant;

use attend::timing::median;

/// The median time of `kernel` on `q` against `k` (also the values), in µs.
fn time<T: Element>(q: &Array4<T>, k: &Array4<T>, kernel: Kernel) -> f64 {
    let config = Config {
        kernel,
        ..Default::default()
    };
    let opts = AttentionOptions::default();
    let calls = (200_000 / (k.dim().2 + 50)).max(20);
    let times: Vec<f64> = (0..calls)
        .map(|_| {
            let start = Instant::now();
            let out = attention_with(q.view(), k.view(), k.view(), &opts, &config);
            std::hint::black_box(out.expect("a valid problem"));
            start.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    median(times)
}

fn row<T: Element>(heads: usize, e: usize, lq: usize, lk: usize) {
    let q = Array4::from_shape_fn((1, heads, lq, e), |(_, h, i, j)| {
        T::from_f32(((h + i * 7 + j * 3) % 17) as f32 / 17.0 - 0.5)
    });
    let k = Array4::from_shape_fn((1, heads, lk, e), |(_, h, i, j)| {
        T::from_f32(((h + i * 5 + j * 3) % 13) as f32 / 13.0 - 0.5)
    });
    let (decode, fused) = (time(&q, &k, Kernel::Decode), time(&q, &k, Kernel::Fused));
    let dtype = if T::DTYPE == Dtype::F32 {
        "f32"
    } else {
        "bf16"
    };
    let auto = if auto_decodes(T::DTYPE, lq, lk) {
        "decode"
    } else {
        "fused"
    };
    println!(
        "{{\"dtype\": \"{dtype}\", \"heads\": {heads}, \"e\": {e}, \"queries\": {lq}, \"keys\": {lk}, \
         \"decode_us\": {decode:.1}, \"fused_us\": {fused:.1}, \"auto\": \"{auto}\"}}"
    );
}

fn main() {
    let threads =
        std::env::var("RAYON_NUM_THREADS").map_or(2, |t| t.parse().expect("a thread count"));
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a pool");
    pool.install(|| {
        for (heads, e) in [(12, 32), (8, 64)] {
            for lk in [16, 64, 512, 4096] {
                for lq in [1, 2, 3, 4, 8, 12, 16] {
                    if lq <= lk {
                        row::<f32>(heads, e, lq, lk);
                        row::<bf16>(heads, e, lq, lk);
                    }
                }
            }
        }
    });
}
