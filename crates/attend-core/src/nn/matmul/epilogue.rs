//! What a product does to its output rows while they are still in cache: nothing,
//! an activation (a feed-forward layer's first half), or the residual added and a
//! LayerNorm applied (a post-norm encoder's sub-layer output).

use ndarray::{ArrayView2, ArrayViewMut2};

use crate::nn::{Activation, LayerNorm};

/// The step after `x · wᵀ + bias`, on each block of the output.
#[derive(Clone, Copy)]
pub(crate) enum Epilogue<'a> {
    /// The product as it is.
    None,
    /// `act(y)`, element by element: any block of the output.
    Act(Activation),
    /// `LayerNorm(y + residual)` row by row: only on whole rows, so blocks must
    /// span every panel. `residual` is `[m, n]`, row-major (a slice rather than
    /// an array view, whose lifetime could not shrink to the product's).
    ResidualNorm {
        residual: &'a [f32],
        norm: &'a LayerNorm,
    },
}

impl Epilogue<'_> {
    /// Whether the blocks must hold whole rows.
    pub(crate) fn whole_rows(&self) -> bool {
        matches!(self, Epilogue::ResidualNorm { .. })
    }

    /// Applies the step to `columns` of `rows` of the `[m, n]` output at `out`.
    ///
    /// # Safety
    /// `out` must point to a live `[m, n]` row-major output that no other thread
    /// reads or writes in these rows and columns; `rows` and `columns` must lie
    /// inside it, and `columns` must be `0..n` for [`Epilogue::ResidualNorm`].
    pub(crate) unsafe fn apply(
        &self,
        out: *mut f32,
        n: usize,
        rows: std::ops::Range<usize>,
        columns: std::ops::Range<usize>,
    ) {
        if matches!(self, Epilogue::None) {
            return;
        }
        for r in rows {
            // SAFETY: the caller's guarantees: row `r`'s columns are ours alone.
            let row = unsafe {
                std::slice::from_raw_parts_mut(out.add(r * n + columns.start), columns.len())
            };
            match self {
                Epilogue::None => {}
                Epilogue::Act(act) => act.apply_serial(row),
                Epilogue::ResidualNorm { residual, norm } => {
                    debug_assert_eq!(columns, 0..n, "a LayerNorm needs whole rows");
                    norm.add_and_normalise(row, &residual[r * n..(r + 1) * n]);
                }
            }
        }
    }

    /// Applies the step to every row of `y`, in parallel for large outputs.
    pub(crate) fn apply_all(&self, mut y: ArrayViewMut2<'_, f32>) {
        match self {
            Epilogue::None => {}
            Epilogue::Act(act) => act.apply(y.as_slice_mut().expect("fresh arrays are contiguous")),
            Epilogue::ResidualNorm { residual, norm } => {
                let residual = ArrayView2::from_shape(y.raw_dim(), residual)
                    .expect("the residual has the output's shape");
                norm.forward_inplace(y, Some(residual))
                    .expect("the LayerNorm has the output's width")
            }
        }
    }
}
