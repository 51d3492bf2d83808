//! Dropout on the attention weights: a counter-based mask that the forward and the
//! backward recompute from the seed and the score's index.

use crate::{Error, Result};

/// Dropout on the attention weights, as in training: each weight is zeroed with
/// probability `p` and the kept ones are scaled by `1/(1 − p)`.
///
/// The keep/drop decision of weight `(b, h, i, j)` is a hash of `seed` and the
/// index (a counter-based generator, like FlashAttention's Philox), so the backward
/// pass recomputes the same mask without storing it and the result does not depend
/// on the thread count. The masks are not PyTorch's bits, only its semantics. Use a
/// new seed for every training step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dropout {
    p: f32,
    seed: u64,
    /// Drop when the 24-bit uniform draw is below this.
    threshold: u32,
    scale: f32,
}

impl Dropout {
    /// Dropout with probability `p ∈ [0, 1)` and a seed.
    pub fn new(p: f32, seed: u64) -> Result<Self> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::value(format!(
                "dropout probability must be in [0, 1), got {p}"
            )));
        }
        Ok(Dropout {
            p,
            seed,
            threshold: (p as f64 * (1u64 << 24) as f64).round() as u32,
            scale: 1.0 / (1.0 - p),
        })
    }

    /// The drop probability.
    pub fn p(&self) -> f32 {
        self.p
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// `0` if weight `(b, h, i, j)` is dropped, else `1/(1 − p)`.
    #[inline]
    pub fn factor(&self, b: usize, h: usize, i: usize, j: usize) -> f32 {
        self.factor_in_row(self.row(b, h, i), j)
    }

    /// The hash of a row `(b, h, i)` of weights, for [`factor_in_row`](Self::factor_in_row):
    /// a kernel that walks a row hashes its prefix once.
    #[inline]
    pub fn row(&self, b: usize, h: usize, i: usize) -> u64 {
        let mut x = self.seed ^ 0x9E37_79B9_7F4A_7C15;
        for part in [b, h, i] {
            x = splitmix(x ^ part as u64);
        }
        x
    }

    /// [`factor`](Self::factor) of weight `j` of the row hashed by [`row`](Self::row).
    #[inline]
    pub fn factor_in_row(&self, row: u64, j: usize) -> f32 {
        if self.threshold == 0 {
            return 1.0;
        }
        if ((splitmix(row ^ j as u64) >> 40) as u32) < self.threshold {
            0.0
        } else {
            self.scale
        }
    }
}

/// One round of SplitMix64's output function.
#[inline]
fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
