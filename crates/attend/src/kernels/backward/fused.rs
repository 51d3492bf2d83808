//! The fused attention backward (placeholder: delegates to the reference).

use ndarray::{ArrayView3, ArrayView4};

use super::{reference, AttentionGrads, Dropout};
use crate::attention::{Problem, SoftmaxAxis};

/// Whether the fused backward handles `p` (softmax over keys).
pub fn supports(p: &Problem<'_>) -> bool {
    p.softmax_axis == SoftmaxAxis::Keys
}

/// Runs the fused backward on a validated problem.
pub(crate) fn run(
    p: &Problem<'_>,
    _out: ArrayView4<'_, f32>,
    _lse: ArrayView3<'_, f32>,
    dout: ArrayView4<'_, f32>,
    dropout: Option<&Dropout>,
) -> AttentionGrads {
    let g = reference::backward(
        p,
        p.q.mapv(f64::from).view(),
        p.k.mapv(f64::from).view(),
        p.v.mapv(f64::from).view(),
        dout.mapv(f64::from).view(),
        dropout,
    );
    AttentionGrads {
        dq: g.dq.mapv(|x| x as f32),
        dk: g.dk.mapv(|x| x as f32),
        dv: g.dv.mapv(|x| x as f32),
    }
}
