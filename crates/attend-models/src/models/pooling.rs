//! Sentence-transformers' pooling: one vector per sequence from its token vectors.

use ndarray::{s, Array2, ArrayView2, Axis};

use attend_core::{Error, Result};

/// How a sentence embedding is made from the token vectors
/// (sentence-transformers' `Pooling` module).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// Mean over the real tokens.
    Mean,
    /// The first token (`[CLS]`).
    Cls,
    /// Element-wise maximum over the real tokens.
    Max,
    /// Sum over the real tokens divided by √(count).
    MeanSqrtLen,
    /// Mean over the real tokens weighted by position, 1 for the first token.
    WeightedMean,
    /// The last real token (decoder-style embedding models).
    LastToken,
}

impl Pooling {
    /// The mode of a sentence-transformers `pooling_mode` name.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "cls" => Pooling::Cls,
            "max" => Pooling::Max,
            "mean" => Pooling::Mean,
            "mean_sqrt_len_tokens" => Pooling::MeanSqrtLen,
            "weightedmean" => Pooling::WeightedMean,
            "lasttoken" => Pooling::LastToken,
            _ => return None,
        })
    }
}

/// Pools `hidden [B, T, d]` over the first `lengths[b]` tokens of each sequence,
/// then L2-normalises each row if `normalize` (as `torch.nn.functional.normalize`,
/// dividing by `max(‖x‖, 1e-12)`).
pub fn pool(
    hidden: ndarray::ArrayView3<'_, f32>,
    lengths: &[usize],
    pooling: Pooling,
    normalize: bool,
) -> Result<Array2<f32>> {
    let (b, t, d) = hidden.dim();
    if lengths.len() != b || lengths.iter().any(|&l| l > t) {
        return Err(Error::shape(format!(
            "lengths {lengths:?} do not fit hidden states {:?}",
            hidden.shape()
        )));
    }
    let mut out = Array2::zeros((b, d));
    for (bi, &len) in lengths.iter().enumerate() {
        let tokens: ArrayView2<'_, f32> = hidden.slice(s![bi, ..len, ..]);
        let mut row = out.row_mut(bi);
        match pooling {
            Pooling::Cls => {
                if len > 0 {
                    row.assign(&tokens.row(0));
                }
            }
            Pooling::LastToken => {
                if len > 0 {
                    row.assign(&tokens.row(len - 1));
                }
            }
            Pooling::WeightedMean => {
                for (i, token) in tokens.rows().into_iter().enumerate() {
                    row.scaled_add((i + 1) as f32, &token);
                }
                let total = (len * (len + 1) / 2) as f32;
                row /= total.max(1e-9);
            }
            Pooling::Max => {
                if len > 0 {
                    row.assign(&tokens.fold_axis(Axis(0), f32::NEG_INFINITY, |a, &x| a.max(x)));
                }
            }
            Pooling::Mean | Pooling::MeanSqrtLen => {
                let sum = tokens.sum_axis(Axis(0));
                let n = (len as f32).max(1e-9);
                let div = if pooling == Pooling::Mean {
                    n
                } else {
                    n.sqrt()
                };
                row.assign(&(sum / div));
            }
        }
        if normalize {
            let norm = row.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
            row /= norm;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array3;

    #[test]
    fn pooling_modes() {
        let h = Array3::from_shape_fn((2, 3, 2), |(b, t, d)| (b * 6 + t * 2 + d) as f32);
        let mean = pool(h.view(), &[2, 3], Pooling::Mean, false).unwrap();
        assert_eq!(mean.row(0).to_vec(), [1.0, 2.0]);
        let cls = pool(h.view(), &[2, 3], Pooling::Cls, false).unwrap();
        assert_eq!(cls.row(1).to_vec(), [6.0, 7.0]);
        let max = pool(h.view(), &[2, 3], Pooling::Max, false).unwrap();
        assert_eq!(max.row(0).to_vec(), [2.0, 3.0]);
        let last = pool(h.view(), &[2, 3], Pooling::LastToken, false).unwrap();
        assert_eq!(last.row(0).to_vec(), [2.0, 3.0]);
        assert_eq!(last.row(1).to_vec(), [10.0, 11.0]);
        // Tokens [0, 1], [2, 3] weighted 1 and 2: (0 + 4) / 3, (1 + 6) / 3.
        let weighted = pool(h.view(), &[2, 3], Pooling::WeightedMean, false).unwrap();
        assert_eq!(weighted.row(0).to_vec(), [4.0 / 3.0, 7.0 / 3.0]);
        let norm = pool(h.view(), &[2, 3], Pooling::Mean, true).unwrap();
        assert!((norm.row(1).dot(&norm.row(1)) - 1.0).abs() < 1e-6);
        assert!(pool(h.view(), &[4, 1], Pooling::Mean, false).is_err());
    }
}
