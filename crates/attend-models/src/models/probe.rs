//! What the encoder's forwards do besides computing: a [`Probe`] sees each step
//! of a layer ([`BertModel`](super::BertModel)'s one layer forward) finish and
//! runs its attention, so the fast forward (fused attention on packed rows,
//! timed or not) and the traced forward (the reference kernel on the padded
//! batch, keeping every intermediate) are the same loop with different probes.
//! Probes are generic parameters, so the untimed forward's stopwatch, `()`,
//! compiles to nothing.

use std::time::{Duration, Instant};

use ndarray::Array2;

use attend_core::nn::MultiHeadAttention;
use attend_core::Result;

/// The kinds of work [`Timings`] tells apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Work {
    /// A dense layer.
    Matmul,
    /// An attention call.
    Attention,
    /// Anything else.
    Other,
}

/// What a layer forward asks of the forward running it.
pub(crate) trait Probe {
    /// A step of kind `work` has just finished.
    fn done(&mut self, work: Work);

    /// A layer's `attention` over the stacked projections `qkv [n, 3d]` of the
    /// forward's rows, as rows `[n, d]` of the heads' contexts side by side (the
    /// output projection's input).
    fn attention(
        &mut self,
        attention: &MultiHeadAttention,
        qkv: &Array2<f32>,
    ) -> Result<Array2<f32>>;
}

/// Where a fast forward's time goes: `()` keeps none, [`Stopwatch`] keeps
/// [`Timings`].
pub(crate) trait Watch {
    /// A step of kind `work` has just finished.
    fn lap(&mut self, work: Work);
}

impl Watch for () {
    #[inline(always)]
    fn lap(&mut self, _: Work) {}
}

/// Time spent in each kind of work by [`BertModel::forward_timed`](super::BertModel::forward_timed), accumulated.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Timings {
    /// Dense layers (`Linear`): Q/K/V, output projection, feed-forward (its
    /// activation included: it is applied inside the product).
    pub matmul: Duration,
    /// The `attention` call (scores, softmax, weighted sum).
    pub attention: Duration,
    /// Everything else: embeddings, LayerNorms, residuals, packing and unpacking.
    pub other: Duration,
}

/// Charges the time since the last step (or since it was made) to each step's
/// kind of work.
pub(crate) struct Stopwatch {
    last: Instant,
    /// The time charged so far.
    pub(crate) spent: Timings,
}

impl Stopwatch {
    /// A stopwatch started now.
    pub(crate) fn new() -> Self {
        Stopwatch {
            last: Instant::now(),
            spent: Timings::default(),
        }
    }
}

impl Watch for Stopwatch {
    fn lap(&mut self, work: Work) {
        let now = Instant::now();
        let into = match work {
            Work::Matmul => &mut self.spent.matmul,
            Work::Attention => &mut self.spent.attention,
            Work::Other => &mut self.spent.other,
        };
        *into += now - self.last;
        self.last = now;
    }
}
