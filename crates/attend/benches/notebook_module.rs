//! Forward pass of notebook 000's module: three tokens of width 2, three bias-free
//! `nn.Linear(2, 2)` from seed 42. PyTorch 2.15 takes about 27 µs for it here.

use attend::attention::AttentionOptions;
use attend::nn::initialisers::{initialise, AttentionSpec, QkvLayout, WeightInit};
use attend::rng::TorchGenerator;
use criterion::{criterion_group, criterion_main, Criterion};
use ndarray::array;

fn notebook_000(c: &mut Criterion) {
    let spec = AttentionSpec {
        d_in: 2,
        d_k: 2,
        d_v: 2,
        heads: 1,
        bias: false,
        out_proj: false,
        init: WeightInit::Linear,
        layout: QkvLayout::Separate,
    };
    let module = initialise(&spec, &mut TorchGenerator::new(42)).unwrap();
    let x = array![[[1.16f32, 0.23], [0.57, 1.36], [4.41, -2.16]]];
    let opts = AttentionOptions::default();
    c.bench_function("notebook_000_forward", |b| {
        b.iter(|| {
            module
                .forward(std::hint::black_box(x.view()), &opts)
                .unwrap()
        })
    });
}

criterion_group!(benches, notebook_000);
criterion_main!(benches);
