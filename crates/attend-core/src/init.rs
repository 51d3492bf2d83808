//! Parameter initialisation as `torch.nn.init` and PyTorch's modules perform it.
//!
//! Each function draws from a [`TorchGenerator`] in exactly the order PyTorch does, so
//! after the same seed and the same sequence of module constructions the weights are
//! bit-identical to PyTorch's (`docs/torch-rng.md`, §6–§7). Bounds are computed
//! in f64 with the same operations as PyTorch's Python code, then rounded to f32 by
//! the uniform kernel.

use ndarray::{Array1, Array2, Axis, Ix1, Ix2};

use crate::rng::TorchGenerator;
use crate::{Error, Result};

/// The bound of `kaiming_uniform_(w, a)` on a weight with `fan_in` inputs, in f64
/// (leaky-ReLU gain, fan-in mode; §6.1).
///
/// Computed as PyTorch does: `gain = sqrt(2 / (1 + a²))`, `std = gain / sqrt(fan_in)`,
/// `bound = sqrt(3) · std`. `nn.Linear` uses `a = sqrt(5)`, for which the bound is
/// `1/sqrt(fan_in)` up to rounding. `fan_in = 0` gives infinity; callers draw nothing
/// for an empty weight.
pub fn kaiming_uniform_bound(fan_in: usize, a: f64) -> f64 {
    let gain = (2.0 / (1.0 + a * a)).sqrt();
    let std = gain / (fan_in as f64).sqrt();
    3.0f64.sqrt() * std
}

/// `kaiming_uniform_(w, a)` on a fresh `[fan_out, fan_in]` weight.
///
/// An empty weight consumes no draws (PyTorch skips it with a warning).
pub fn kaiming_uniform(
    gen: &mut TorchGenerator,
    fan_out: usize,
    fan_in: usize,
    a: f64,
) -> Array2<f32> {
    if fan_out == 0 || fan_in == 0 {
        return Array2::zeros((fan_out, fan_in));
    }
    let bound = kaiming_uniform_bound(fan_in, a);
    into_2d(gen.uniform(&[fan_out, fan_in], -bound, bound))
}

/// The default initialisation of `nn.Linear(in_features, out_features, bias)`.
///
/// Returns the weight in PyTorch's `[out, in]` orientation and the bias if asked for.
/// The weight is `kaiming_uniform_(a = sqrt(5))` (`in·out` draws, row-major), then the
/// bias is uniform in `±1/sqrt(in)` (`out` draws). With `in_features = 0` the weight
/// draws nothing and the bias still consumes `out` draws, all giving +0 (§6).
pub fn linear(
    gen: &mut TorchGenerator,
    in_features: usize,
    out_features: usize,
    bias: bool,
) -> (Array2<f32>, Option<Array1<f32>>) {
    let weight = kaiming_uniform(gen, out_features, in_features, 5.0f64.sqrt());
    let bias = bias.then(|| {
        // PyTorch's bound is the integer 0 when there are no inputs, so both ends are +0
        // (a float -0.0 lower end would make the uniform clamp return -0).
        let (lo, hi) = if in_features == 0 {
            (0.0, 0.0)
        } else {
            let b = 1.0 / (in_features as f64).sqrt();
            (-b, b)
        };
        into_1d(gen.uniform(&[out_features], lo, hi))
    });
    (weight, bias)
}

/// The default initialisation of `nn.Embedding(num, dim, padding_idx)`.
///
/// The `[num, dim]` weight is standard normal (§5: the scalar path with its cache when
/// `num·dim < 16`, the batched path otherwise); then the padding row, if any, is set
/// to +0. Its draws are consumed all the same (§7).
///
/// A negative `padding_idx` counts from the end, as in PyTorch. One outside
/// `-num..num` is an [`Error::Value`], and nothing is drawn.
pub fn embedding(
    gen: &mut TorchGenerator,
    num: usize,
    dim: usize,
    padding_idx: Option<i64>,
) -> Result<Array2<f32>> {
    // Validate before drawing: PyTorch rejects the index before initialising.
    let padding_row = padding_idx
        .map(|idx| normalise_padding_idx(idx, num))
        .transpose()?;
    let mut weight = into_2d(gen.normal(&[num, dim], 0.0, 1.0));
    if let Some(row) = padding_row {
        weight.index_axis_mut(Axis(0), row).fill(0.0);
    }
    Ok(weight)
}

/// `xavier_uniform_(w, gain)` on a fresh `[fan_out, fan_in]` weight.
///
/// The bound is [`xavier_uniform_bound`], then the weight is uniform in `±bound`
/// (`fan_out·fan_in` draws, row-major). An empty weight draws nothing (§6.2).
pub fn xavier_uniform(
    gen: &mut TorchGenerator,
    fan_out: usize,
    fan_in: usize,
    gain: f64,
) -> Array2<f32> {
    if fan_out == 0 || fan_in == 0 {
        return Array2::zeros((fan_out, fan_in));
    }
    let bound = xavier_uniform_bound(fan_in, fan_out, gain);
    into_2d(gen.uniform(&[fan_out, fan_in], -bound, bound))
}

/// The bound of `xavier_uniform_(w, gain)`: `gain · sqrt(6 / (fan_in + fan_out))`, in f64.
///
/// It is evaluated in PyTorch's order, `sqrt(3) · (gain · sqrt(2 / (fan_in + fan_out)))`,
/// which can differ from the one-line formula in the last f64 bit (never, in our
/// checks, after rounding to f32).
pub fn xavier_uniform_bound(fan_in: usize, fan_out: usize, gain: f64) -> f64 {
    let std = gain * (2.0 / (fan_in + fan_out) as f64).sqrt();
    3.0f64.sqrt() * std
}

/// Maps a possibly negative `padding_idx` to a row of a table with `num` rows.
fn normalise_padding_idx(idx: i64, num: usize) -> Result<usize> {
    let n = num as i64;
    let row = if idx < 0 { idx + n } else { idx };
    if (0..n).contains(&row) {
        Ok(row as usize)
    } else {
        Err(Error::value(format!(
            "padding_idx {idx} is out of range for an embedding with num = {num} rows \
             (expected -{num} <= padding_idx < {num})"
        )))
    }
}

/// The generator's dynamic-rank array as the matrix it was asked for.
fn into_2d(a: ndarray::ArrayD<f32>) -> Array2<f32> {
    a.into_dimensionality::<Ix2>()
        .expect("generator returns the requested 2-d shape")
}

/// The generator's dynamic-rank array as the vector it was asked for.
fn into_1d(a: ndarray::ArrayD<f32>) -> Array1<f32> {
    a.into_dimensionality::<Ix1>()
        .expect("generator returns the requested 1-d shape")
}

#[cfg(test)]
// Expected values are written as docs/torch-rng.md's §10 table prints them (8 digits).
#[allow(clippy::excessive_precision)]
mod tests {
    use super::*;

    /// True when `a` and `b` will give the same next draw, i.e. have consumed the
    /// same number of draws from the same seed.
    fn same_position(a: &TorchGenerator, b: &TorchGenerator) -> bool {
        a.clone().random_u32() == b.clone().random_u32()
            && a.clone().random_u64() == b.clone().random_u64()
    }

    fn after_draws(seed: u64, draws: u64) -> TorchGenerator {
        let mut gen = TorchGenerator::new(seed);
        gen.skip(draws);
        gen
    }

    #[test]
    fn linear_bound_is_one_over_sqrt_in_in_f32() {
        let a = 5.0f64.sqrt();
        for fan_in in 1..5000 {
            let bound = kaiming_uniform_bound(fan_in, a) as f32;
            assert_eq!(bound, (1.0 / (fan_in as f64).sqrt()) as f32, "in={fan_in}");
        }
    }

    #[test]
    fn linear_spec_vectors() {
        let mut gen = TorchGenerator::new(42);
        let (w, b) = linear(&mut gen, 2, 2, false);
        assert!(b.is_none());
        assert_eq!(
            w.iter().copied().collect::<Vec<_>>(),
            [0.54061037, 0.58690423, -0.16565566, 0.64955628]
        );
        let mut gen = TorchGenerator::new(0);
        let (w, b) = linear(&mut gen, 3, 5, true);
        assert_eq!(w.shape(), &[5, 3]);
        assert_eq!(
            w.iter().take(4).copied().collect::<Vec<_>>(),
            [-0.0043225177, 0.30971584, -0.47518533, -0.4248946]
        );
        assert_eq!(
            b.unwrap().to_vec(),
            [
                0.021387115,
                0.22824688,
                0.34642333,
                -0.39140946,
                -0.25141457
            ]
        );
        assert!(same_position(&gen, &after_draws(0, 15 + 5)));
    }

    #[test]
    fn linear_with_no_inputs() {
        let mut gen = TorchGenerator::new(3);
        let (w, b) = linear(&mut gen, 0, 4, true);
        assert_eq!(w.shape(), &[4, 0]);
        let b = b.unwrap();
        assert!(
            b.iter().all(|v| v.to_bits() == 0),
            "bias must be all +0: {b}"
        );
        assert!(same_position(&gen, &after_draws(3, 4)));
    }

    #[test]
    fn embedding_spec_vectors() {
        let mut gen = TorchGenerator::new(2);
        let w = embedding(&mut gen, 5, 4, Some(0)).unwrap();
        assert!(w.row(0).iter().all(|v| v.to_bits() == 0));
        assert_eq!(
            w.row(1).to_vec(),
            [0.029916182, -0.049838036, 1.0650779, 0.88603669]
        );
        let mut gen = TorchGenerator::new(0);
        let w = embedding(&mut gen, 3, 3, None).unwrap();
        assert_eq!(
            w.iter().copied().collect::<Vec<_>>(),
            [
                1.5409961,
                -0.2934289,
                -2.1787894,
                0.56843126,
                -1.0845224,
                -1.3985955,
                0.40334684,
                0.83802634,
                -0.71925759
            ]
        );
    }

    #[test]
    fn embedding_negative_padding_idx_counts_from_end() {
        let mut gen = TorchGenerator::new(1);
        let w = embedding(&mut gen, 4, 4, Some(-1)).unwrap();
        assert!(w.row(3).iter().all(|v| v.to_bits() == 0));
        assert!(w.row(2).iter().any(|&v| v != 0.0));
    }

    #[test]
    fn embedding_rejects_out_of_range_padding_idx_without_drawing() {
        for idx in [5, 6, -6] {
            let mut gen = TorchGenerator::new(1);
            let err = embedding(&mut gen, 5, 4, Some(idx)).unwrap_err();
            assert!(matches!(err, Error::Value(_)));
            let msg = err.to_string();
            assert!(
                msg.contains("padding_idx") && msg.contains(&idx.to_string()),
                "{msg}"
            );
            assert!(msg.contains("num = 5"), "{msg}");
            assert!(same_position(&gen, &TorchGenerator::new(1)));
        }
    }

    #[test]
    fn xavier_bound_and_draws() {
        let bound = xavier_uniform_bound(3, 5, 1.0);
        assert!((bound - (6.0f64 / 8.0).sqrt()).abs() < 1e-15);
        for gain in [1.0, 0.5, 2.0f64.sqrt(), 5.0 / 3.0] {
            for fan_in in 1..200 {
                for fan_out in [1, 7, 64, 513] {
                    let ours = xavier_uniform_bound(fan_in, fan_out, gain) as f32;
                    let simple = (gain * (6.0 / (fan_in + fan_out) as f64).sqrt()) as f32;
                    assert_eq!(ours, simple, "gain={gain} in={fan_in} out={fan_out}");
                }
            }
        }

        let mut gen = TorchGenerator::new(9);
        let w = xavier_uniform(&mut gen, 5, 3, 1.0);
        assert_eq!(w.shape(), &[5, 3]);
        assert!(same_position(&gen, &after_draws(9, 15)));
        // Same draws as uniform_(-bound, bound) on a [5, 3] tensor.
        let expected = TorchGenerator::new(9).uniform(&[5, 3], -bound, bound);
        assert_eq!(w.into_dyn(), expected);
        let bound = bound as f32;
        assert!(expected.iter().all(|v| (-bound..bound).contains(v)));

        let mut gen = TorchGenerator::new(9);
        assert_eq!(xavier_uniform(&mut gen, 0, 3, 1.0).shape(), &[0, 3]);
        assert!(same_position(&gen, &TorchGenerator::new(9)));
    }
}
