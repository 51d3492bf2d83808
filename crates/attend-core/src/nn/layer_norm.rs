//! `nn.LayerNorm` over the last axis.

use ndarray::{Array1, ArrayViewMut2, Axis};
use rayon::prelude::*;

use crate::isa::multiversion;
use crate::{Error, Result};

/// Layer normalisation over the last axis: `(x − mean) / √(var + eps) · weight + bias`,
/// with the biased variance, as `torch.nn.LayerNorm` computes it.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerNorm {
    /// `[d]` scale (γ).
    pub weight: Array1<f32>,
    /// `[d]` shift (β).
    pub bias: Array1<f32>,
    /// Added to the variance.
    pub eps: f32,
}

impl LayerNorm {
    /// A layer from its scale and shift, which must have the same length.
    pub fn new(weight: Array1<f32>, bias: Array1<f32>, eps: f32) -> Result<Self> {
        if weight.len() != bias.len() {
            return Err(Error::shape(format!(
                "LayerNorm weight of length {} and bias of length {} differ",
                weight.len(),
                bias.len()
            )));
        }
        if eps.is_nan() || eps < 0.0 {
            return Err(Error::value(format!(
                "LayerNorm eps must be ≥ 0, got {eps}"
            )));
        }
        Ok(LayerNorm { weight, bias, eps })
    }

    /// Width of the normalised axis.
    pub fn dim(&self) -> usize {
        self.weight.len()
    }

    /// Normalises every row of `x [rows, d]` in place, after adding `residual`
    /// (same shape) if one is given: `x ← LayerNorm(x + residual)`.
    pub fn forward_inplace(
        &self,
        mut x: ArrayViewMut2<'_, f32>,
        residual: Option<ndarray::ArrayView2<'_, f32>>,
    ) -> Result<()> {
        if x.ncols() != self.dim() {
            return Err(Error::shape(format!(
                "input {:?} does not fit a LayerNorm of width {}",
                x.shape(),
                self.dim()
            )));
        }
        if let Some(r) = &residual {
            if r.shape() != x.shape() {
                return Err(Error::shape(format!(
                    "residual {:?} does not match input {:?}",
                    r.shape(),
                    x.shape()
                )));
            }
        }
        let run = |mut row: ndarray::ArrayViewMut1<'_, f32>,
                   res: Option<ndarray::ArrayView1<'_, f32>>| {
            if let Some(r) = res {
                row += &r;
            }
            match row.as_slice_mut() {
                Some(s) => self.normalise(s),
                None => {
                    let mut tmp = row.to_vec();
                    self.normalise(&mut tmp);
                    row.assign(&ndarray::ArrayView1::from(&tmp[..]));
                }
            }
        };
        let parallel = x.len() >= 1 << 16;
        match residual {
            Some(r) if parallel => x
                .axis_iter_mut(Axis(0))
                .into_par_iter()
                .zip(r.axis_iter(Axis(0)).into_par_iter())
                .for_each(|(row, res)| run(row, Some(res))),
            Some(r) => x
                .axis_iter_mut(Axis(0))
                .zip(r.axis_iter(Axis(0)))
                .for_each(|(row, res)| run(row, Some(res))),
            None if parallel => x
                .axis_iter_mut(Axis(0))
                .into_par_iter()
                .for_each(|row| run(row, None)),
            None => x.axis_iter_mut(Axis(0)).for_each(|row| run(row, None)),
        }
        Ok(())
    }

    /// `row ← LayerNorm(row + residual)` for one row of the layer's width, as
    /// [`forward_inplace`](Self::forward_inplace) computes each row.
    pub(crate) fn add_and_normalise(&self, row: &mut [f32], residual: &[f32]) {
        for (v, r) in row.iter_mut().zip(residual) {
            *v += r;
        }
        self.normalise(row);
    }

    /// Normalises one row of the layer's width in place.
    fn normalise(&self, row: &mut [f32]) {
        let (w, b) = (
            self.weight.as_slice().expect("owned 1-D is contiguous"),
            self.bias.as_slice().expect("owned 1-D is contiguous"),
        );
        normalise_row(row, w, b, self.eps);
    }
}

/// Sum of a slice in 16 independent lanes (so it vectorises), then the lanes.
#[inline(always)]
fn lane_sum(xs: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0.0f32; 16];
    let chunks = xs.chunks_exact(16);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..16 {
            acc[i] += f(c[i]);
        }
    }
    let mut total = 0.0f32;
    for t in tail {
        total += f(*t);
    }
    acc.iter().sum::<f32>() + total
}

multiversion! {
    fn normalise_row(x: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
        let n = x.len() as f32;
        let mean = lane_sum(x, |v| v) / n;
        let var = lane_sum(x, |v| (v - mean) * (v - mean)) / n;
        let rstd = 1.0 / (var + eps).sqrt();
        for ((v, &wi), &bi) in x.iter_mut().zip(w).zip(b) {
            *v = (*v - mean) * rstd * wi + bi;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array, Array2};

    #[test]
    fn matches_f64_layer_norm() {
        let x = Array2::from_shape_fn((5, 37), |(i, j)| {
            ((i * 37 + j) % 17) as f32 * 0.3 - 2.0 + i as f32
        });
        let r = Array2::from_shape_fn((5, 37), |(i, j)| (i as f32 - j as f32) / 40.0);
        let w = Array::from_shape_fn(37, |i| 1.0 + i as f32 / 50.0);
        let b = Array::from_shape_fn(37, |i| i as f32 / 100.0 - 0.1);
        let ln = LayerNorm::new(w.clone(), b.clone(), 1e-12).unwrap();
        let mut y = x.clone();
        ln.forward_inplace(y.view_mut(), Some(r.view())).unwrap();
        for i in 0..5 {
            let row: Vec<f64> = (0..37)
                .map(|j| x[[i, j]] as f64 + r[[i, j]] as f64)
                .collect();
            let mean = row.iter().sum::<f64>() / 37.0;
            let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 37.0;
            for j in 0..37 {
                let want = (row[j] - mean) / (var + 1e-12).sqrt() * w[j] as f64 + b[j] as f64;
                assert!((y[[i, j]] as f64 - want).abs() < 1e-5, "{i},{j}");
            }
        }
    }

    #[test]
    fn shape_errors() {
        let ln = LayerNorm::new(Array::ones(4), Array::zeros(4), 1e-5).unwrap();
        assert!(ln
            .forward_inplace(Array2::zeros((2, 3)).view_mut(), None)
            .is_err());
        assert!(LayerNorm::new(Array::ones(4), Array::zeros(3), 1e-5).is_err());
    }
}
