//! `nn.Linear`: `y = x Wᵀ + b`.

use ndarray::{Array, Array1, Array2, ArrayView, Axis, Dimension, Ix2};

use crate::{Error, Result};

/// A dense layer with PyTorch's `[out, in]` weight orientation.
#[derive(Clone, Debug, PartialEq)]
pub struct Linear {
    /// `[out, in]`.
    pub weight: Array2<f32>,
    /// `[out]`, if the layer has a bias.
    pub bias: Option<Array1<f32>>,
}

impl Linear {
    /// A layer from its weight `[out, in]` and optional bias `[out]`.
    pub fn new(weight: Array2<f32>, bias: Option<Array1<f32>>) -> Result<Self> {
        if let Some(b) = &bias {
            if b.len() != weight.nrows() {
                return Err(Error::shape(format!(
                    "bias of length {} does not match weight {:?} (needs {})",
                    b.len(),
                    weight.shape(),
                    weight.nrows()
                )));
            }
        }
        Ok(Linear { weight, bias })
    }

    /// Input width.
    pub fn in_features(&self) -> usize {
        self.weight.ncols()
    }

    /// Output width.
    pub fn out_features(&self) -> usize {
        self.weight.nrows()
    }

    /// Applies the layer to the last axis of `x` (any number of leading axes).
    pub fn forward<D: Dimension>(&self, x: ArrayView<'_, f32, D>) -> Result<Array<f32, D>> {
        let width = x.shape().last().copied().unwrap_or(0);
        if x.ndim() == 0 || width != self.in_features() {
            return Err(Error::shape(format!(
                "input of shape {:?} does not fit a Linear layer with weight {:?} (last axis must be {})",
                x.shape(),
                self.weight.shape(),
                self.in_features()
            )));
        }
        let rows = x.len() / width.max(1);
        let flat = x
            .as_standard_layout()
            .into_owned()
            .into_shape_with_order((rows, width))
            .expect("standard layout reshapes");
        let y = self.forward_rows(flat.view());
        let mut shape = x.raw_dim();
        shape[x.ndim() - 1] = self.out_features();
        // ndarray may hand back a column-major product; reshaping needs row-major.
        let y = y.as_standard_layout().into_owned();
        Ok(y.into_shape_with_order(shape).expect("same element count"))
    }

    fn forward_rows(&self, x: ArrayView<'_, f32, Ix2>) -> Array2<f32> {
        let mut y = x.dot(&self.weight.t());
        if let Some(b) = &self.bias {
            y += &b.view().insert_axis(Axis(0));
        }
        y
    }
}
