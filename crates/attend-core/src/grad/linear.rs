//! Gradients of [`Linear`].

use ndarray::{Array, Array1, Array2, ArrayView, ArrayView1, ArrayView2, Axis, Dimension, IxDyn};

use super::Scalar;
use crate::nn::Linear;
use crate::{Error, Result};

/// What [`Linear::backward`] needs from the forward pass: the input, as rows.
#[derive(Clone, Debug)]
pub struct LinearCache<T = f32> {
    /// The input flattened to `[rows, in]`.
    pub(crate) x: Array2<T>,
    /// The output's shape.
    pub(crate) out_shape: IxDyn,
}

/// Gradients of a [`Linear`] layer, named like its parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct LinearGrads<T = f32> {
    /// `∂loss/∂weight`, `[out, in]`.
    pub weight: Array2<T>,
    /// `∂loss/∂bias`, `[out]`, if the layer has a bias.
    pub bias: Option<Array1<T>>,
}

impl Linear {
    /// [`forward`](Linear::forward), also returning what [`backward`](Linear::backward)
    /// needs.
    pub fn forward_train<D: Dimension>(
        &self,
        x: ArrayView<'_, f32, D>,
    ) -> Result<(Array<f32, D>, LinearCache)> {
        let y = self.forward(x.view())?;
        let width = self.in_features();
        let rows = x.len() / width.max(1);
        let x2 = x
            .as_standard_layout()
            .into_owned()
            .into_shape_with_order((rows, width))
            .expect("standard layout reshapes");
        let cache = LinearCache {
            x: x2,
            out_shape: y.raw_dim().into_dyn(),
        };
        Ok((y, cache))
    }

    /// Gradients given `dy = ∂loss/∂y`: returns `∂loss/∂x` (shaped like `x`) and the
    /// parameters' gradients.
    pub fn backward<D: Dimension>(
        &self,
        cache: &LinearCache,
        dy: ArrayView<'_, f32, D>,
    ) -> Result<(Array<f32, D>, LinearGrads)> {
        if dy.shape() != cache.out_shape.slice() {
            return Err(Error::shape(format!(
                "dy of shape {:?} must have the forward output's shape {:?}",
                dy.shape(),
                cache.out_shape.slice()
            )));
        }
        let rows = cache.x.nrows();
        let dy2 = dy
            .as_standard_layout()
            .into_owned()
            .into_shape_with_order((rows, self.out_features()))
            .expect("checked shape");
        let (dx2, grads) = backward(
            self.weight.view(),
            self.bias.is_some(),
            cache.x.view(),
            dy2.view(),
        );
        let mut shape = dy.raw_dim();
        let last = shape.ndim() - 1;
        shape[last] = self.in_features();
        Ok((dx2.into_shape_with_order(shape).expect("same count"), grads))
    }
}

/// `y = x wᵀ + b` on rows.
pub(crate) fn forward<T: Scalar>(
    w: ArrayView2<'_, T>,
    b: Option<ArrayView1<'_, T>>,
    x: ArrayView2<'_, T>,
) -> Array2<T> {
    let mut y = x.dot(&w.t());
    if let Some(b) = b {
        y += &b.insert_axis(Axis(0));
    }
    y.as_standard_layout().into_owned()
}

/// `dx = dy w`, `dw = dyᵀ x`, `db = Σ_rows dy`.
pub(crate) fn backward<T: Scalar>(
    w: ArrayView2<'_, T>,
    has_bias: bool,
    x: ArrayView2<'_, T>,
    dy: ArrayView2<'_, T>,
) -> (Array2<T>, LinearGrads<T>) {
    let dx = dy.dot(&w).as_standard_layout().into_owned();
    let weight = dy.t().dot(&x).as_standard_layout().into_owned();
    let bias = has_bias.then(|| dy.sum_axis(Axis(0)));
    (dx, LinearGrads { weight, bias })
}
