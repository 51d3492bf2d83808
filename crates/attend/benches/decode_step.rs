//! One decoding step (one query token against a 1,024-key cache, 8 heads of 64)
//! through the public API, as a generation loop or the Python binding calls it:
//! with a thread count on every call, and on the caller's pool for comparison.
//! The difference is the per-call cost of getting the threads.

use attend::decode::{decode_attention, DecodeConfig};
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use ndarray::Array4;

fn decode_step(c: &mut Criterion) {
    let (h, s, d) = (8, 1024, 64);
    let fill = |i: usize| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5;
    let mut n = 0;
    let mut next = move |_| {
        n += 1;
        fill(n)
    };
    let q = Array4::from_shape_fn((1, h, 1, d), &mut next);
    let k = Array4::from_shape_fn((1, h, s, d), &mut next);
    let v = Array4::from_shape_fn((1, h, s, d), &mut next);
    let opts = Default::default();
    let mut group = c.benchmark_group("decode_step_s1024");
    let per_call = DecodeConfig {
        threads: Some(2),
        ..Default::default()
    };
    group.bench_function("threads_per_call", |bch| {
        bch.iter(|| {
            black_box(decode_attention(
                q.view(),
                k.view(),
                v.view(),
                &opts,
                &per_call,
            ))
        })
    });
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .expect("two threads");
    let current = DecodeConfig::default();
    group.bench_function("callers_pool", |bch| {
        pool.install(|| {
            bch.iter(|| {
                black_box(decode_attention(
                    q.view(),
                    k.view(),
                    v.view(),
                    &opts,
                    &current,
                ))
            })
        })
    });
    group.finish();
}

criterion_group!(benches, decode_step);
criterion_main!(benches);
