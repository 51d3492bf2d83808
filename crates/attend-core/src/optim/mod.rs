//! Optimisers with `torch.optim`'s formulas: [`Sgd`] (with momentum, dampening,
//! Nesterov and L2 weight decay) and [`AdamW`] (decoupled weight decay).
//!
//! An optimiser updates any [`Parameters`] (every module, and any struct of modules
//! that lists its tensors) from the gradient struct of the same module:
//! `opt.step(&mut module, &grads)`. Like `torch.optim`, its state (momentum buffers,
//! moments, step counts) belongs to each parameter tensor by identity, so one
//! optimiser can step several modules in turn.

mod adamw;
mod sgd;

pub use adamw::AdamW;
pub use sgd::Sgd;

use ndarray::{ArrayViewD, ArrayViewMutD};

use crate::grad::{EmbeddingGrads, LinearGrads, MultiHeadAttentionGrads};
use crate::nn::{Embedding, Linear, MultiHeadAttention};
use crate::{Error, Result};

/// The visitor [`Parameters::visit`] calls: `(name, parameter, gradient)`.
pub type Visitor<'f> =
    dyn FnMut(&str, ArrayViewMutD<'_, f32>, ArrayViewD<'_, f32>) -> Result<()> + 'f;

/// Something with trainable tensors and a gradient struct that mirrors them.
pub trait Parameters {
    /// The gradient struct, with the same field names as the parameters.
    type Grads;

    /// Calls `f(name, parameter, gradient)` for every tensor, always in the same
    /// order. Errors if `grads` does not fit (an optional part present in one and
    /// not the other).
    fn visit(&mut self, grads: &Self::Grads, f: &mut Visitor<'_>) -> Result<()>;
}

/// An optimiser: updates parameters in place from their gradients.
pub trait Optimizer {
    /// One update of every tensor of `params`.
    fn step<P: Parameters>(&mut self, params: &mut P, grads: &P::Grads) -> Result<()>;
}

impl Parameters for Linear {
    type Grads = LinearGrads;
    fn visit(&mut self, grads: &LinearGrads, f: &mut Visitor<'_>) -> Result<()> {
        f(
            "weight",
            self.weight.view_mut().into_dyn(),
            grads.weight.view().into_dyn(),
        )?;
        match (&mut self.bias, &grads.bias) {
            (Some(b), Some(g)) => f("bias", b.view_mut().into_dyn(), g.view().into_dyn()),
            (None, None) => Ok(()),
            _ => Err(Error::value(
                "bias: the layer and its gradients disagree on having a bias",
            )),
        }
    }
}

impl Parameters for Embedding {
    type Grads = EmbeddingGrads;
    fn visit(&mut self, grads: &EmbeddingGrads, f: &mut Visitor<'_>) -> Result<()> {
        f(
            "weight",
            self.weight.view_mut().into_dyn(),
            grads.weight.view().into_dyn(),
        )
    }
}

impl Parameters for MultiHeadAttention {
    type Grads = MultiHeadAttentionGrads;
    fn visit(&mut self, grads: &MultiHeadAttentionGrads, f: &mut Visitor<'_>) -> Result<()> {
        prefixed("q_proj", &mut self.q_proj, &grads.q_proj, f)?;
        prefixed("k_proj", &mut self.k_proj, &grads.k_proj, f)?;
        prefixed("v_proj", &mut self.v_proj, &grads.v_proj, f)?;
        match (&mut self.out_proj, &grads.out_proj) {
            (Some(o), Some(g)) => prefixed("out_proj", o, g, f),
            (None, None) => Ok(()),
            _ => Err(Error::value(
                "out_proj: the module and its gradients disagree on having an output projection",
            )),
        }
    }
}

/// Visits `module`'s tensors with names `prefix.name`.
pub fn prefixed<P: Parameters>(
    prefix: &str,
    module: &mut P,
    grads: &P::Grads,
    f: &mut Visitor<'_>,
) -> Result<()> {
    module.visit(grads, &mut |name, p, g| {
        f(&format!("{prefix}.{name}"), p, g)
    })
}

/// Checks a learning rate: finite and positive.
pub(crate) fn check_lr(lr: f64) -> Result<()> {
    if lr.is_nan() || lr <= 0.0 || !lr.is_finite() {
        return Err(Error::value(format!(
            "learning rate must be a positive finite number, got {lr}"
        )));
    }
    Ok(())
}

/// Checks a hyper-parameter lies in `[lo, hi)`.
pub(crate) fn check_range(name: &str, x: f64, lo: f64, hi: f64) -> Result<()> {
    if !(lo..hi).contains(&x) {
        return Err(Error::value(format!(
            "{name} must be in [{lo}, {hi}), got {x}"
        )));
    }
    Ok(())
}

/// Checks that a gradient has its parameter's shape.
pub(crate) fn check_pair(
    name: &str,
    p: &ArrayViewMutD<'_, f32>,
    g: &ArrayViewD<'_, f32>,
) -> Result<()> {
    if p.shape() != g.shape() {
        return Err(Error::shape(format!(
            "gradient of {name} has shape {:?} but the parameter has {:?}",
            g.shape(),
            p.shape()
        )));
    }
    Ok(())
}

/// The identity of a parameter tensor: its address and length.
pub(crate) fn key(p: &ArrayViewMutD<'_, f32>) -> (usize, usize) {
    (p.as_ptr() as usize, p.len())
}
